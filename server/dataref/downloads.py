"""Download links: unguessable tokens that map to one owner's file or chart, until they expire.

The index is a table of the state database (a small SQLite file under ``state_dir/exports``
by default, PostgreSQL for replicas); export files live in the export blob store (that
directory by default, a shared one or S3 for replicas), one folder per owner (named by a
hash, so owner names never become paths). A link
is either an export file written here, or a chart artifact read through the store at download
time (so the store's owner and TTL checks apply again). The HTTP route checks the bearer token
itself: custom routes are not behind the MCP auth layer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import NotFound
from .files import part_name
from .state import sqlite_db
from .state.blobs import BlobStore, FileBlobs
from .state.db import Database

TOKEN_BYTES = 24  # 192 random bits in every URL
# Module-level so tests can move time forward (monkeypatch downloads.clock).
clock = time.time


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
    """The link index and the export files. ``db``/``blobs`` default to SQLite and files
    under ``root`` (one machine)."""

    def __init__(
        self, root: Path, *, db: Database | None = None, blobs: BlobStore | None = None
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self._own_db = db is None
        self._db = db or sqlite_db(self.root / "links.sqlite", "links")
        self.blobs = blobs or FileBlobs(self.root)

    def close(self) -> None:
        if self._own_db:
            self._db.close()

    def owner_dir(self, owner: str) -> Path:
        """Where this owner's export files are written before they are put in place."""
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
        with self._db.tx(write=True) as cur:
            cur.execute(
                "INSERT INTO links (token, owner, kind, target, media_type, filename, created, "
                "expires) VALUES (?,?,?,?,?,?,?,?)",
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
            self.blobs.put(f"{self._digest(owner)}/{name}", part)
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
        return link

    def lookup(self, token: str, owner: str) -> Link:
        """The owner's live link; another owner's link is as unknown as a made-up one."""
        with self._db.tx() as cur:
            row = cur.execute(
                "SELECT token, owner, kind, target, media_type, filename, created, expires "
                "FROM links WHERE token = ? AND owner = ?",
                (token, owner),
            ).fetchone()
        if row is None:
            raise unknown_link()
        link = Link(*row)
        if link.expires <= clock():
            raise LinkExpired(f"the link expired - call {_recall(link.kind)} again")
        return link

    def file_of(self, link: Link) -> Path:
        """The export file of a link, which must still exist inside the owner's directory."""
        if link.kind != "export" or "/" in link.target or link.target in ("", ".", ".."):
            raise unknown_link()
        try:
            path = self.blobs.local_path(f"{self._digest(link.owner)}/{link.target}")
        except FileNotFoundError:
            raise unknown_link() from None
        if not path.is_file():
            raise unknown_link()
        return path

    def sweep(self, grace: float) -> int:
        """Delete expired links and their files, and stray files older than ``grace``."""
        now = clock()
        with self._db.tx(write=True) as cur:
            expired = cur.execute(
                "SELECT owner, kind, target FROM links WHERE expires <= ?", (now,)
            ).fetchall()
            cur.execute("DELETE FROM links WHERE expires <= ?", (now,))
            live = {
                f"{self._digest(o)}/{t}"
                for o, t in cur.execute(
                    "SELECT owner, target FROM links WHERE kind = 'export'"
                ).fetchall()
            }
        for owner, kind, target in expired:
            if kind == "export":
                self.blobs.delete(f"{self._digest(owner)}/{target}")
        # Files no live link names (a crash between write and index): old enough, delete.
        for key in self.blobs.keys_older_than("", grace):
            if "/" in key and key not in live:
                self.blobs.delete(key)
        return len(expired)

    @staticmethod
    def _digest(owner: str) -> str:
        return hashlib.sha256(owner.encode()).hexdigest()[:32]


def _recall(kind: str) -> str:
    return "render_chart" if kind == "chart" else "export_data"
