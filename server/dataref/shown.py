"""What each run_python call showed the agent, kept for the owner's page.

The transcript is data-free by design (its records never hold results), but the person
watching the page should see what the agent saw: the small ``result``, stdout, the error,
the notes, the outputs it made and the figures it drew. This sidecar keeps exactly that,
one row per call, in the state's page database (``page/page.sqlite``, or the shared PostgreSQL
of replicas, so the page on any replica shows every call); only the page reads it, and only
for the owner of the call. Exports never include it.

Rows are matched to transcript cells by order within a notebook and by a hash of the code
(calls on one notebook are serialised by its kernel lock, so the orders agree).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from .state import Database

log = logging.getLogger(__name__)


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def shown_body(response: dict[str, Any]) -> dict[str, Any]:
    """The parts of a run_python response a person sees (all already bounded by compute)."""
    outputs = {
        name: {"dataRef": d.get("dataRef"), "rows": d.get("rows"), "columns": d.get("columns")}
        for name, d in (response.get("outputs") or {}).items()
        if isinstance(d, dict)
    }
    return {
        "ok": bool(response.get("ok")),
        "result": response.get("result"),
        "stdout": response.get("stdout") or "",
        "error": response.get("error"),
        "notes": list(response.get("notes") or []),
        "outputs": outputs,
        "charts": [c["chartRef"] for c in response.get("charts") or [] if "chartRef" in c],
    }


class Shown:
    """The sidecar index (the ``shown`` table of the state's page database)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, owner: str, handle: str, code: str, response: dict[str, Any]) -> None:
        """Keep what a call showed; a failure here loses only the page's copy, never the call."""
        body = json.dumps(shown_body(response), default=str, ensure_ascii=False)
        try:
            with self.db.tx(write=True) as cur:
                cur.execute(
                    "INSERT INTO shown (owner, handle, code_hash, at, body) VALUES (?,?,?,?,?)",
                    (owner, handle, code_hash(code), time.time(), body),
                )
        except Exception:  # the database's own errors, whichever engine
            log.warning("what a call showed could not be kept for the page", exc_info=True)

    def of_notebook(self, owner: str, handle: str) -> list[tuple[str, dict[str, Any]]]:
        """(code hash, body) of each call on the owner's notebook, oldest first."""
        with self.db.tx() as cur:
            rows = cur.execute(
                "SELECT code_hash, body FROM shown WHERE owner = ? AND handle = ? ORDER BY seq",
                (owner, handle),
            ).fetchall()
        return [(h, json.loads(b)) for h, b in rows]
