"""ArtifactStore: the single owner of artifact bytes and metadata.

Tables are Arrow IPC files (memory-mappable, so kernels read them without copying); charts
are PNG files. Metadata lives in the state database (SQLite by default, PostgreSQL for
replicas; see ``state``) and bytes in a blob store (the state dir, a shared directory or S3).
A write is visible only once its metadata row is committed, and the row is committed only
after the file is complete and in place, so a crash mid-write leaves at most an orphan file,
which the next open (one machine) or the leader's sweep (shared state) deletes.

Every read names an owner. A ref that is missing, expired or owned by someone else raises
the same ``NotFound``: a foreign ref is indistinguishable from one that never existed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from .artifact import REF_PATTERN, Artifact, frame_to_table, new_ref
from .config import StoreSettings
from .errors import LimitExceeded, human_bytes, unknown_ref
from .files import part_name, remove_stale_parts, storage_error
from .state import sqlite_db
from .state.blobs import BlobStore, FileBlobs
from .state.db import Cursor, Database
from .writeback import Writeback

# Shared blobs may be mid-commit on another replica: only orphans older than this go.
SHARED_ORPHAN_GRACE_S = 3600.0


class ArtifactStore:
    """``db``/``blob_store`` default to SQLite and a directory under ``root`` (one machine)."""

    def __init__(
        self,
        root: Path,
        settings: StoreSettings,
        clock: Callable[[], float] = time.time,
        *,
        db: Database | None = None,
        blob_store: BlobStore | None = None,
        shared: bool = False,
    ) -> None:
        self.root = Path(root)
        self.settings = settings
        self.clock = clock
        self.tmp = self.root / "tmp"
        for d in (self.root, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        # Only the server reads the store; kernels see hard links in their own inputs dir.
        os.chmod(self.root, 0o700)
        self.blob_store = blob_store or FileBlobs(self.root / "blobs")
        self.blobs = getattr(self.blob_store, "root", self.root / "blobs")
        self._own_db = db is None
        self._db = db or sqlite_db(self.root / "meta.sqlite", "artifacts")
        self.shared = shared
        remove_stale_parts(self.tmp)
        if not shared:
            self.remove_orphans()  # shared: the leader's sweep does it, with a grace period

    def close(self) -> None:
        if self._own_db:
            self._db.close()

    # -- writing ---------------------------------------------------------------

    def put_frame(
        self, owner: str, frame: pd.DataFrame, *, lineage: dict[str, Any], sensitive: bool = False
    ) -> Artifact:
        return self.put_table(owner, frame_to_table(frame), lineage=lineage, sensitive=sensitive)

    def put_table(
        self, owner: str, table: pa.Table, *, lineage: dict[str, Any], sensitive: bool = False
    ) -> Artifact:
        # Refuse before writing when the in-memory size already tells the cap is exceeded.
        self._check_cap(table.nbytes)

        def write(f: Writeback) -> None:
            # A batch per run of whole chunks, never a join (that would copy the table here):
            # a DataFrame's columns are one chunk each, so its file is one batch, and a
            # kernel binds its numeric columns as views of the mapped file instead of
            # joining a column's pieces into fresh memory.
            with pa.ipc.new_file(f, table.schema) as writer:
                for batch in table.to_batches():
                    writer.write_batch(batch)

        return self._commit(
            owner,
            write,
            kind="table",
            media_type="application/vnd.apache.arrow.file",
            suffix=".arrow",
            rows=table.num_rows,
            lineage=lineage,
            sensitive=sensitive,
        )

    def put_batches(
        self,
        owner: str,
        schema: pa.Schema,
        batches: Iterable[pa.RecordBatch],
        *,
        lineage: dict[str, Any],
        sensitive: bool = False,
    ) -> Artifact:
        """Stream ``batches`` into one table artifact, refusing it as soon as it passes the cap.

        Only one batch is held at a time; an oversized or failed stream leaves no file behind.
        """
        rows = 0

        def write(f: Writeback) -> None:
            nonlocal rows
            with pa.ipc.new_file(f, schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    self._check_cap(f.tell())

        return self._commit(
            owner,
            write,
            kind="table",
            media_type="application/vnd.apache.arrow.file",
            suffix=".arrow",
            rows=lambda: rows,
            lineage=lineage,
            sensitive=sensitive,
        )

    def put_bytes(
        self,
        owner: str,
        data: bytes,
        *,
        kind: str,
        media_type: str,
        suffix: str,
        lineage: dict[str, Any],
        sensitive: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> Artifact:
        self._check_cap(len(data))
        return self._commit(
            owner,
            lambda f: f.write(data),
            kind=kind,
            media_type=media_type,
            suffix=suffix,
            rows=None,
            lineage=lineage,
            sensitive=sensitive,
            extra=extra,
            prefix=kind,
        )

    def _check_cap(self, size: int) -> None:
        cap = self.settings.artifact_max_bytes
        if size > cap:
            raise LimitExceeded(
                f"artifact exceeds size cap ({human_bytes(size)} > {human_bytes(cap)}) - "
                "narrow the query (fewer rows or columns) or aggregate first"
            )

    def _commit(
        self,
        owner: str,
        write: Callable[[Writeback], Any],
        *,
        kind: str,
        media_type: str,
        suffix: str,
        rows: int | Callable[[], int] | None,
        lineage: dict[str, Any],
        sensitive: bool,
        extra: dict[str, Any] | None = None,
        prefix: str = "data",
    ) -> Artifact:
        ref = new_ref("chart" if prefix == "chart" else "data")
        part = self.tmp / part_name(ref)
        try:
            size = self._write_file(part, write)
            self._check_cap(size)
            now = self.clock()
            art = Artifact(
                ref=ref,
                owner=owner,
                kind=kind,
                media_type=media_type,
                file=f"{ref}{suffix}",
                rows=rows() if callable(rows) else rows,
                bytes=size,
                created=now,
                expires=now + self.settings.ttl_seconds,
                sensitive=sensitive,
                lineage=lineage,
                extra=extra or {},
                blobs=self.blob_store,
            )
            # The owner's quota lock (the write lock on SQLite) is taken before the blob is put
            # in place, so the check and the insert are one step for every replica, and an
            # orphan sweep on another server never sees the file without its row.
            with self._db.tx(write=True, lock=f"dataref:quota:{owner}") as cur:
                self._check_quota(cur, owner, size)
                self.blob_store.put(art.file, part)
                self._insert(cur, art)
            return art
        except OSError as exc:
            raise storage_error(exc) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()

    def _write_file(self, part: Path, write: Callable[[Writeback], Any]) -> int:
        with open(part, "wb") as f, Writeback(f) as out:
            write(out)
            out.durable()
        # World-readable inside a 0700 store: only hard links in a kernel's inputs dir expose it.
        os.chmod(part, 0o644)
        return part.stat().st_size

    def _check_quota(self, cur: Cursor, owner: str, size: int) -> None:
        (used,) = cur.execute(
            "SELECT COALESCE(SUM(bytes), 0) FROM artifacts WHERE owner = ? AND expires > ?",
            (owner, self.clock()),
        ).fetchone()
        quota = self.settings.owner_quota_bytes
        if used + size > quota:
            raise LimitExceeded(
                f"owner quota exceeded ({human_bytes(used)} used + {human_bytes(size)} new > "
                f"{human_bytes(quota)}) - narrow the query, or drop_artifact the ones you "
                "no longer need"
            )

    def _insert(self, cur: Cursor, art: Artifact) -> None:
        cur.execute(
            "INSERT INTO artifacts (ref, owner, kind, media_type, file, rows, bytes, created, "
            "expires, sensitive, lineage, extra) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                art.ref,
                art.owner,
                art.kind,
                art.media_type,
                art.file,
                art.rows,
                art.bytes,
                art.created,
                art.expires,
                int(art.sensitive),
                json.dumps(art.lineage, default=str),
                json.dumps(art.extra, default=str),
            ),
        )

    # -- reading ---------------------------------------------------------------

    def get(self, owner: str, ref: str, *, kind: str | None = None) -> Artifact:
        """The live artifact ``ref`` of ``owner``; anything else is the one NotFound."""
        if not isinstance(ref, str) or not REF_PATTERN.fullmatch(ref):
            raise unknown_ref(ascii(ref)[1:-1] if isinstance(ref, str) else str(ref))
        with self._db.tx() as cur:
            row = cur.execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE ref = ? AND owner = ? AND expires > ?",
                (ref, owner, self.clock()),
            ).fetchone()
        if row is None or (kind is not None and row[2] != kind):
            raise unknown_ref(ref)
        art = self._row_to_artifact(row)
        if isinstance(self.blob_store, FileBlobs) and not self.blob_store.exists(art.file):
            raise unknown_ref(ref)
        return art

    def read_table(self, owner: str, ref: str) -> pa.Table:
        art = self.get(owner, ref, kind="table")
        with pa.memory_map(str(art.path)) as source:
            return pa.ipc.open_file(source).read_all()

    def read_frame(self, owner: str, ref: str) -> pd.DataFrame:
        return self.read_table(owner, ref).to_pandas()

    def read_bytes(self, owner: str, ref: str) -> bytes:
        return self.get(owner, ref).path.read_bytes()

    def link_into(self, owner: str, ref: str, directory: Path) -> Path:
        """Expose a table to a kernel: hard link (no copy) into its read-only inputs dir."""
        art = self.get(owner, ref, kind="table")
        dest = Path(directory) / f"{ref}.arrow"
        if dest.exists():
            return dest
        try:
            os.link(art.path, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise storage_error(exc) from exc
            import shutil  # a different filesystem: copying is the only way

            shutil.copyfile(art.path, dest)
            os.chmod(dest, 0o644)
        return dest

    def list(self, owner: str) -> list[Artifact]:
        with self._db.tx() as cur:
            rows = cur.execute(
                f"SELECT {_COLUMNS} FROM artifacts WHERE owner = ? AND expires > ? "
                "ORDER BY created",
                (owner, self.clock()),
            ).fetchall()
        return [self._row_to_artifact(r) for r in rows]

    def owner_of(self, ref: str) -> str | None:
        """Whose live artifact ``ref`` is: for audit events only, never for a client."""
        if not isinstance(ref, str) or not REF_PATTERN.fullmatch(ref):
            return None
        with self._db.tx() as cur:
            row = cur.execute(
                "SELECT owner FROM artifacts WHERE ref = ? AND expires > ?", (ref, self.clock())
            ).fetchone()
        return row[0] if row else None

    def total_bytes(self) -> int:
        """Bytes of every live artifact and chart, all owners (the metrics gauge)."""
        with self._db.tx() as cur:
            (total,) = cur.execute(
                "SELECT COALESCE(SUM(bytes), 0) FROM artifacts WHERE expires > ?", (self.clock(),)
            ).fetchone()
        return int(total)

    def drop(self, owner: str, ref: str) -> Artifact:
        art = self.get(owner, ref)
        with self._db.tx(write=True) as cur:
            cur.execute("DELETE FROM artifacts WHERE ref = ?", (art.ref,))
        self.blob_store.delete(art.file)
        return art

    def _row_to_artifact(self, row: tuple[Any, ...]) -> Artifact:
        return Artifact(
            ref=row[0],
            owner=row[1],
            kind=row[2],
            media_type=row[3],
            file=row[4],
            rows=row[5],
            bytes=row[6],
            created=row[7],
            expires=row[8],
            sensitive=bool(row[9]),
            lineage=json.loads(row[10]),
            extra=json.loads(row[11]),
            blobs=self.blob_store,
        )

    # -- upkeep ----------------------------------------------------------------

    def sweep(self) -> int:
        """Delete expired artifacts (row first, so a reader never sees a row without a file)."""
        with self._db.tx(write=True) as cur:
            expired = cur.execute(
                "SELECT ref, file FROM artifacts WHERE expires <= ?", (self.clock(),)
            ).fetchall()
            for ref, _ in expired:
                cur.execute("DELETE FROM artifacts WHERE ref = ?", (ref,))
        for _, name in expired:
            self.blob_store.delete(name)
        if self.shared:
            self.remove_orphans(older_than=SHARED_ORPHAN_GRACE_S)
        return len(expired)

    def remove_orphans(self, older_than: float = 0.0) -> int:
        """Blobs without a committed row are writes a crash interrupted: never visible, delete.

        On one machine the write lock held while listing excludes every commit in flight; on
        shared state a commit may be between its upload and its row, so only old ones go."""
        with self._db.tx(write=True) as cur:
            candidates = self.blob_store.keys_older_than("", older_than)
            if not candidates:
                return 0
            known = {name for (name,) in cur.execute("SELECT file FROM artifacts").fetchall()}
            orphans = [key for key in candidates if key not in known]
            for key in orphans:
                self.blob_store.delete(key)
        return len(orphans)


_COLUMNS = (
    "ref, owner, kind, media_type, file, rows, bytes, created, expires, sensitive, lineage, extra"
)
