"""Browser sessions of the page: a bearer token exchanged once for an HttpOnly cookie.

A browser cannot send ``Authorization: Bearer`` by itself, so ``POST /signin`` checks the
token with the server's own verifier (static tokens or JWT) and stores a session: a random id
in an HttpOnly, SameSite=Strict cookie, and server-side (hashed) the owner, a CSRF token and
an expiry. Sessions live in SQLite under the state dir, so sign-out revokes them for every
server process sharing it. The CSRF token goes into every form that changes something and is
checked against the session's, in constant time.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

COOKIE = "dataref_session"
SESSION_BYTES = 32

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id_hash TEXT PRIMARY KEY,
    owner   TEXT NOT NULL,
    csrf    TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_expires ON sessions(expires);
"""


@dataclass(frozen=True)
class Session:
    owner: str
    csrf: str
    expires: float

    def csrf_ok(self, sent: object) -> bool:
        return isinstance(sent, str) and hmac.compare_digest(sent.encode(), self.csrf.encode())


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    def __init__(self, root: Path, ttl_seconds: float) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.ttl = ttl_seconds
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.root / "sessions.sqlite", timeout=10)
        try:
            with db:
                yield db
        finally:
            db.close()

    def create(self, owner: str) -> str:
        """A new session for ``owner``; returns the cookie value (never stored as such)."""
        session_id = secrets.token_urlsafe(SESSION_BYTES)
        now = time.time()
        with self._db() as db:
            db.execute("DELETE FROM sessions WHERE expires <= ?", (now,))
            db.execute(
                "INSERT INTO sessions VALUES (?,?,?,?,?)",
                (_hash(session_id), owner, secrets.token_urlsafe(24), now, now + self.ttl),
            )
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        if not session_id or len(session_id) > 100:
            return None
        with self._db() as db:
            row = db.execute(
                "SELECT owner, csrf, expires FROM sessions WHERE id_hash = ? AND expires > ?",
                (_hash(session_id), time.time()),
            ).fetchone()
        return Session(*row) if row else None

    def end(self, session_id: str | None) -> None:
        if session_id:
            with self._db() as db:
                db.execute("DELETE FROM sessions WHERE id_hash = ?", (_hash(session_id),))
