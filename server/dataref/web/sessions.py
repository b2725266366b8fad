"""Browser sessions of the page: a bearer token exchanged once for an HttpOnly cookie.

A browser cannot send ``Authorization: Bearer`` by itself, so ``POST /signin`` checks the
token with the server's own verifier (static tokens or JWT) and stores a session: a random id
in an HttpOnly, SameSite=Strict cookie, and server-side (hashed) the owner, a CSRF token and
an expiry. Sessions live in the state's page database (SQLite under the state dir, or the
shared PostgreSQL of replicas), so a session made on one replica is valid on every other, and
sign-out revokes it for every server process sharing the state. The CSRF token goes into
every form that changes something and is checked against the session's, in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from ..state import Database

COOKIE = "dataref_session"
SESSION_BYTES = 32


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
    def __init__(self, db: Database, ttl_seconds: float) -> None:
        self.db = db
        self.ttl = ttl_seconds

    def create(self, owner: str) -> str:
        """A new session for ``owner``; returns the cookie value (never stored as such)."""
        session_id = secrets.token_urlsafe(SESSION_BYTES)
        now = time.time()
        with self.db.tx(write=True) as cur:
            cur.execute("DELETE FROM sessions WHERE expires <= ?", (now,))
            cur.execute(
                "INSERT INTO sessions (id_hash, owner, csrf, created, expires) VALUES (?,?,?,?,?)",
                (_hash(session_id), owner, secrets.token_urlsafe(24), now, now + self.ttl),
            )
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        if not session_id or len(session_id) > 100:
            return None
        with self.db.tx() as cur:
            row = cur.execute(
                "SELECT owner, csrf, expires FROM sessions WHERE id_hash = ? AND expires > ?",
                (_hash(session_id), time.time()),
            ).fetchone()
        return Session(*row) if row else None

    def end(self, session_id: str | None) -> None:
        if session_id:
            with self.db.tx(write=True) as cur:
                cur.execute("DELETE FROM sessions WHERE id_hash = ?", (_hash(session_id),))
