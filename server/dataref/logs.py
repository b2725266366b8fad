"""Structured logs: one JSON object per line on stderr, each with the call's request id.

Every tool call logs one ``tool_call`` line (tool, owner, ok, bytes sent, sources, ms). Audit
events (``auth_failure``, ``refused``) are logged at WARNING and also appended to the ledger's
``audit`` table, so they outlive log rotation. Nothing logged is a value of the data: error
texts are not logged (they can quote values from a traceback), only their size.
"""

from __future__ import annotations

import contextvars
import json
import logging
import secrets
import sys
import time
from typing import Any

from .config import Settings
from .ledger import LedgerStorage

LOGGER = "dataref"
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def new_request_id() -> str:
    return secrets.token_hex(8)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "event", "request_id", ...fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            line["request_id"] = request_id
        if not record.name.startswith(LOGGER):
            line["logger"] = record.name
        line.update(getattr(record, "fields", {}))
        if record.exc_info and record.levelno >= logging.ERROR:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


# The libraries' loggers get the same JSON lines (uvicorn is told not to configure its own).
FOREIGN_LOGGERS = ("fastmcp", "mcp", "uvicorn", "uvicorn.error", "uvicorn.access")


def configure_logging(settings: Settings) -> None:
    """JSON lines on stderr for every logger of the server (stdout is MCP's channel on stdio)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in (LOGGER, *FOREIGN_LOGGERS):
        logger = logging.getLogger(name)
        for old in logger.handlers[:]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
        if name == LOGGER:
            logger.setLevel(settings.logs.level)


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    logging.getLogger(LOGGER).log(level, event, extra={"fields": fields})


def audit(ledger: LedgerStorage | None, event: str, owner: str | None, **detail: Any) -> None:
    """An audit event: a WARNING log line, and a row in the ledger when there is one."""
    request_id = REQUEST_ID.get()
    if request_id:
        detail.setdefault("request_id", request_id)
    log_event(event, logging.WARNING, audit=True, owner=owner, **detail)
    if ledger is not None:
        try:
            ledger.audit(time.time(), event, owner, detail)
        except Exception:  # the ledger closing under a late request must not fail it
            logging.getLogger(LOGGER).exception("audit event not recorded")
