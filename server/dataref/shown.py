"""What each run_python call showed the agent, kept for the owner's page.

The transcript is data-free by design (its records never hold results), but the person
watching the page should see what the agent saw: the small ``result``, stdout, the error,
the notes, the outputs it made and the figures it drew. This sidecar keeps exactly that,
one row per call, next to the transcript in the state dir; only the page reads it, and only
for the owner of the call. Exports never include it.

Rows are matched to transcript cells by order within a notebook and by a hash of the code
(calls on one notebook are serialised by its kernel lock, so the orders agree).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS shown (
    owner     TEXT NOT NULL,
    handle    TEXT NOT NULL,
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    code_hash TEXT NOT NULL,
    at        REAL NOT NULL,
    body      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS shown_notebook ON shown(owner, handle, seq);
"""


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
    """The sidecar index. Connections are per call, so another process may read it too.

    Nothing is created until the first call is kept: a server that never runs code (or a
    ``dataref view``) adds no file to the state dir.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / "shown.sqlite"
        self._ready = False  # the file is in WAL mode and has its table

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        # Every run_python call adds a row: WAL without a per-commit fsync keeps that off the
        # call's time (a crash of the server can lose only the page's copy, never the call).
        db.execute("PRAGMA synchronous=NORMAL")
        try:
            with db:
                yield db
        finally:
            db.close()

    def add(self, owner: str, handle: str, code: str, response: dict[str, Any]) -> None:
        """Keep what a call showed; a failure here loses only the page's copy, never the call."""
        body = json.dumps(shown_body(response), default=str, ensure_ascii=False)
        with contextlib.suppress(sqlite3.Error, OSError):
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self._db() as db:
                if not self._ready:
                    db.execute("PRAGMA journal_mode=WAL")
                    db.executescript(_SCHEMA)
                    self._ready = True
                db.execute(
                    "INSERT INTO shown (owner, handle, code_hash, at, body) VALUES (?,?,?,?,?)",
                    (owner, handle, code_hash(code), time.time(), body),
                )

    def of_notebook(self, owner: str, handle: str) -> list[tuple[str, dict[str, Any]]]:
        """(code hash, body) of each call on the owner's notebook, oldest first."""
        if not self.path.is_file():
            return []
        try:
            with self._db() as db:
                rows = db.execute(
                    "SELECT code_hash, body FROM shown WHERE owner = ? AND handle = ? ORDER BY seq",
                    (owner, handle),
                ).fetchall()
        except sqlite3.OperationalError:  # created by another process a moment ago
            return []
        return [(h, json.loads(b)) for h, b in rows]
