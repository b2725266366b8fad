"""The server's shared state behind one seam: which database, which blob store, which locks.

Embedded default (one machine, no extra services): SQLite files under the state dir (the
artifact index in ``store/meta.sqlite``, notebooks in ``notebooks/``, download links in
``exports/links.sqlite``, the page's sessions and what calls showed in ``page/page.sqlite``),
bytes in the state dir, ``flock`` locks. Several processes on one machine (``--workers``)
share it safely. Replicas on several machines set ``state.url`` to
PostgreSQL (one database for all four, advisory locks) and ``store.blobs`` to a
shared directory or S3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import Settings
from .blobs import BlobStore, open_blobs
from .db import Database, PostgresDatabase, SQLiteDatabase
from .locks import FileLocks, Leadership, NotebookLocks, PgLocks
from .migrations import migrate

__all__ = ["Database", "State", "open_state"]


@dataclass
class State:
    artifacts_db: Database
    notebooks_db: Database
    links_db: Database
    page_db: Database
    artifact_blobs: BlobStore
    export_blobs: BlobStore
    notebook_locks: NotebookLocks
    leadership: Leadership
    shared: bool  # True when other machines may share it (PostgreSQL)

    def ping(self) -> None:
        """Raises when the database or the blob store cannot be reached (readiness)."""
        for db in {id(d): d for d in self.databases()}.values():
            db.ping()
        self.artifact_blobs.ping()
        self.export_blobs.ping()

    def databases(self) -> list[Database]:
        return [self.artifacts_db, self.notebooks_db, self.links_db, self.page_db]

    def close(self) -> None:
        self.leadership.release()
        for db in {id(d): d for d in self.databases()}.values():
            db.close()


def sqlite_db(path: Path, component: str, *, synchronous: str = "FULL") -> SQLiteDatabase:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = SQLiteDatabase(path, synchronous=synchronous)
    migrate(db, component)
    return db


def open_state(settings: Settings) -> State:
    root = settings.state_dir
    store = settings.store
    blob_args = {
        "endpoint": store.s3_endpoint,
        "region": store.s3_region,
        "access_key": store.s3_access_key,
        "secret_key": store.s3_secret_key,
    }
    base = store.blobs.rstrip("/") if store.blobs else None
    artifact_blobs = open_blobs(
        base and f"{base}/artifacts",
        root / "store" / "blobs",
        root / "cache" / "artifacts",
        **blob_args,
    )
    export_blobs = open_blobs(
        base and f"{base}/exports", root / "exports", root / "cache" / "exports", **blob_args
    )
    url = settings.state.url
    if url is None:
        dbs: list[Database] = [
            sqlite_db(root / "store" / "meta.sqlite", "artifacts"),
            sqlite_db(root / "notebooks" / "notebooks.sqlite", "notebooks"),
            sqlite_db(root / "exports" / "links.sqlite", "links"),
            # Sessions and what calls showed are the page's copies: a crash of the machine
            # may lose the last ones, never a call, so no fsync per commit.
            sqlite_db(root / "page" / "page.sqlite", "page", synchronous="NORMAL"),
        ]
        file_locks = FileLocks(root / "locks")
        locks: FileLocks | PgLocks = file_locks
    else:
        pg = PostgresDatabase(url, pool_size=settings.state.pool_size)
        for component in ("artifacts", "notebooks", "links", "page"):
            migrate(pg, component)
        dbs = [pg, pg, pg, pg]
        locks = PgLocks(url)
    return State(
        artifacts_db=dbs[0],
        notebooks_db=dbs[1],
        links_db=dbs[2],
        page_db=dbs[3],
        artifact_blobs=artifact_blobs,
        export_blobs=export_blobs,
        notebook_locks=NotebookLocks(locks, timeout=settings.state.lock_timeout_seconds),
        leadership=Leadership(locks),
        shared=url is not None,
    )
