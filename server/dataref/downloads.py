"""Download links: unguessable tokens that map to one owner's file or chart, until they expire.

The index is a small SQLite table under ``state_dir/exports`` next to the export files, which
live in one directory per owner (named by a hash, so owner names never become paths). A link
is either an export file written here, or a chart artifact read through the store at download
time (so the store's owner and TTL checks apply again). The HTTP route checks the bearer token
itself: custom routes are not behind the MCP auth layer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import NotFound
from .files import part_name

TOKEN_BYTES = 24  # 192 random bits in every URL
# Module-level so tests can move time forward (monkeypatch downloads.clock).
clock = time.time

_SCHEMA = """
CREATE TABLE IF NOT EXISTS links (
    token      TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    kind       TEXT NOT NULL,   -- 'export' (a file here) | 'chart' (a chartRef in the store)
    target     TEXT NOT NULL,   -- file name in the owner's dir, or the chartRef
    media_type TEXT NOT NULL,
    filename   TEXT NOT NULL,   -- the name the person's browser saves it as
    created    REAL NOT NULL,
    expires    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS links_expires ON links(expires);
"""


class LinkExpired(NotFound):
    """The owner's own link, past its time: worth a different answer than 'unknown'."""


@dataclass(frozen=True)
class Link:
    token: str
    owner: str
    kind: str
    target: str
    media_type: str
    filename: str
    created: float
    expires: float


def unknown_link() -> NotFound:
    return NotFound("unknown download link")


class Downloads:
    """The link index. Connections are per call: cheap, and nothing to close at shutdown."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.root / "links.sqlite", timeout=10)
        try:
            with db:
                yield db
        finally:
            db.close()

    def owner_dir(self, owner: str) -> Path:
        path = self.root / self._digest(owner)
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def add(
        self, owner: str, *, kind: str, target: str, media_type: str, filename: str, ttl: float
    ) -> Link:
        now = clock()
        link = Link(
            token=secrets.token_urlsafe(TOKEN_BYTES),
            owner=owner,
            kind=kind,
            target=target,
            media_type=media_type,
            filename=filename,
            created=now,
            expires=now + ttl,
        )
        with self._db() as db:
            db.execute(
                "INSERT INTO links VALUES (?,?,?,?,?,?,?,?)",
                (
                    link.token,
                    link.owner,
                    link.kind,
                    link.target,
                    link.media_type,
                    link.filename,
                    link.created,
                    link.expires,
                ),
            )
        return link

    def publish(
        self,
        owner: str,
        *,
        name: str,
        media_type: str,
        filename: str,
        ttl: float,
        write: Callable[[Path], object],
    ) -> Link:
        """Write an export file for ``owner`` (``write(path)``) and link it: the file is in
        place, under ``name``, only once its link exists (a crash leaves a stray the sweep
        removes)."""
        directory = self.owner_dir(owner)
        part = directory / part_name(name)
        try:
            write(part)
            link = self.add(
                owner,
                kind="export",
                target=name,
                media_type=media_type,
                filename=filename,
                ttl=ttl,
            )
            os.replace(part, directory / name)
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
        return link

    def lookup(self, token: str, owner: str) -> Link:
        """The owner's live link; another owner's link is as unknown as a made-up one."""
        with self._db() as db:
            row = db.execute(
                "SELECT * FROM links WHERE token = ? AND owner = ?", (token, owner)
            ).fetchone()
        if row is None:
            raise unknown_link()
        link = Link(*row)
        if link.expires <= clock():
            raise LinkExpired(f"the link expired - call {_recall(link.kind)} again")
        return link

    def file_of(self, link: Link) -> Path:
        """The export file of a link, which must still exist inside the owner's directory."""
        path = self.owner_dir(link.owner) / link.target
        if link.kind != "export" or path.name != link.target or not path.is_file():
            raise unknown_link()
        return path

    def sweep(self, grace: float) -> int:
        """Delete expired links and their files, and stray files older than ``grace``."""
        now = clock()
        with self._db() as db:
            expired = db.execute(
                "SELECT owner, kind, target FROM links WHERE expires <= ?", (now,)
            ).fetchall()
            db.execute("DELETE FROM links WHERE expires <= ?", (now,))
            live = {
                (self._digest(o), t)
                for o, t in db.execute("SELECT owner, target FROM links WHERE kind = 'export'")
            }
        for owner, kind, target in expired:
            if kind == "export":
                with contextlib.suppress(FileNotFoundError):
                    (self.owner_dir(owner) / target).unlink()
        self._remove_strays(live, now - grace)
        return len(expired)

    def _remove_strays(self, live: set[tuple[str, str]], older_than: float) -> None:
        """Files no live link names (a crash between write and index): old enough, delete."""
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for path in sub.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if (sub.name, path.name) not in live and path.stat().st_mtime < older_than:
                        path.unlink()

    @staticmethod
    def _digest(owner: str) -> str:
        return hashlib.sha256(owner.encode()).hexdigest()[:32]


def _recall(kind: str) -> str:
    return "render_chart" if kind == "chart" else "export_data"
