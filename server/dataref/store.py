"""ArtifactStore: the single owner of artifact bytes and metadata.

Tables are Arrow IPC files (memory-mappable, so kernels read them without copying); charts
are PNG files. Metadata lives in SQLite. A write is visible only once its metadata row is
committed, and the row is committed only after the file is complete and renamed into place,
so a crash mid-write leaves at most an orphan file that the next open deletes.

Every read names an owner. A ref that is missing, expired or owned by someone else raises
the same ``NotFound``: a foreign ref is indistinguishable from one that never existed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from .config import StoreSettings
from .errors import InvalidRequest, LimitExceeded, human_bytes, unknown_ref
from .files import fsync_dir, part_name, remove_stale_parts, storage_error

REF_BYTES = 16  # 128 random bits; SPEC asks for at least 96
# What a ref we minted looks like; anything else is unknown without asking the database
# (which also keeps lone surrogates and NUL bytes away from SQLite).
REF_PATTERN = re.compile(r"(data|chart)_[A-Za-z0-9_-]{16,64}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    ref        TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    kind       TEXT NOT NULL,
    media_type TEXT NOT NULL,
    file       TEXT NOT NULL,
    rows       INTEGER,
    bytes      INTEGER NOT NULL,
    created    REAL NOT NULL,
    expires    REAL NOT NULL,
    sensitive  INTEGER NOT NULL,
    lineage    TEXT NOT NULL,
    extra      TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS artifacts_owner ON artifacts(owner, expires);
"""


def new_ref(prefix: str = "data") -> str:
    return f"{prefix}_{secrets.token_urlsafe(REF_BYTES)}"


@dataclass(frozen=True)
class Artifact:
    ref: str
    owner: str
    kind: str  # "table" | "chart"
    media_type: str
    path: Path
    rows: int | None
    bytes: int
    created: float
    expires: float
    sensitive: bool
    lineage: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The compact listing entry (list_artifacts)."""
        out: dict[str, Any] = {"ref": self.ref, "kind": self.kind}
        if self.rows is not None:
            out["rows"] = self.rows
        out["origin"] = self.lineage.get("tool")
        out["created"] = _iso(self.created)
        out["expires"] = _iso(self.expires)
        return out


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def frame_to_table(frame: pd.DataFrame) -> pa.Table:
    """Arrow table of a DataFrame; a meaningful index becomes columns so nothing is lost."""
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.name is not None:
        frame = frame.reset_index()
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise InvalidRequest(
            f"cannot store this DataFrame ({type(exc).__name__}: {str(exc)[:200]}) - "
            "convert mixed-type object columns with .astype(str) first"
        ) from exc


class ArtifactStore:
    def __init__(
        self, root: Path, settings: StoreSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = Path(root)
        self.settings = settings
        self.clock = clock
        self.blobs = self.root / "blobs"
        self.tmp = self.root / "tmp"
        for d in (self.root, self.blobs, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        # Only the server reads the store; kernels see hard links in their own inputs dir.
        os.chmod(self.root, 0o700)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.root / "meta.sqlite", check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._remove_orphans()

    def close(self) -> None:
        with self._lock:
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

        def write(f: Any) -> None:
            with pa.ipc.new_file(f, table.schema) as writer:
                writer.write_table(table, max_chunksize=1 << 20)

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

        def write(f: Any) -> None:
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
        write: Callable[[Any], Any],
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
            final = self.blobs / f"{ref}{suffix}"
            now = self.clock()
            art = Artifact(
                ref=ref,
                owner=owner,
                kind=kind,
                media_type=media_type,
                path=final,
                rows=rows() if callable(rows) else rows,
                bytes=size,
                created=now,
                expires=now + self.settings.ttl_seconds,
                sensitive=sensitive,
                lineage=lineage,
                extra=extra or {},
            )
            with self._lock, self._db:
                # The write lock is taken before the rename, so another server opening this
                # store (its orphan sweep takes the same lock) never sees the file without its row.
                self._db.execute("BEGIN IMMEDIATE")
                self._check_quota(owner, size)
                os.replace(part, final)
                self._insert(art)
            fsync_dir(self.blobs)
            return art
        except OSError as exc:
            raise storage_error(exc) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()

    def _write_file(self, part: Path, write: Callable[[Any], Any]) -> int:
        with open(part, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # World-readable inside a 0700 store: only hard links in a kernel's inputs dir expose it.
        os.chmod(part, 0o644)
        return part.stat().st_size

    def _check_quota(self, owner: str, size: int) -> None:
        (used,) = self._db.execute(
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

    def _insert(self, art: Artifact) -> None:
        self._db.execute(
            "INSERT INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                art.ref,
                art.owner,
                art.kind,
                art.media_type,
                art.path.name,
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
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM artifacts WHERE ref = ? AND owner = ? AND expires > ?",
                (ref, owner, self.clock()),
            ).fetchone()
        if row is None or (kind is not None and row[2] != kind):
            raise unknown_ref(ref)
        art = self._row_to_artifact(row)
        if not art.path.is_file():
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
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM artifacts WHERE owner = ? AND expires > ? ORDER BY created",
                (owner, self.clock()),
            ).fetchall()
        return [self._row_to_artifact(r) for r in rows]

    def owner_of(self, ref: str) -> str | None:
        """Whose live artifact ``ref`` is: for audit events only, never for a client."""
        if not isinstance(ref, str) or not REF_PATTERN.fullmatch(ref):
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT owner FROM artifacts WHERE ref = ? AND expires > ?", (ref, self.clock())
            ).fetchone()
        return row[0] if row else None

    def total_bytes(self) -> int:
        """Bytes of every live artifact and chart, all owners (the metrics gauge)."""
        with self._lock:
            (total,) = self._db.execute(
                "SELECT COALESCE(SUM(bytes), 0) FROM artifacts WHERE expires > ?", (self.clock(),)
            ).fetchone()
        return int(total)

    def drop(self, owner: str, ref: str) -> Artifact:
        art = self.get(owner, ref)
        with self._lock, self._db:
            self._db.execute("DELETE FROM artifacts WHERE ref = ?", (art.ref,))
        with contextlib.suppress(FileNotFoundError):
            art.path.unlink()
        return art

    def _row_to_artifact(self, row: tuple[Any, ...]) -> Artifact:
        return Artifact(
            ref=row[0],
            owner=row[1],
            kind=row[2],
            media_type=row[3],
            path=self.blobs / row[4],
            rows=row[5],
            bytes=row[6],
            created=row[7],
            expires=row[8],
            sensitive=bool(row[9]),
            lineage=json.loads(row[10]),
            extra=json.loads(row[11]),
        )

    # -- upkeep ----------------------------------------------------------------

    def sweep(self) -> int:
        """Delete expired artifacts (row first, so a reader never sees a row without a file)."""
        with self._lock, self._db:
            expired = self._db.execute(
                "SELECT ref, file FROM artifacts WHERE expires <= ?", (self.clock(),)
            ).fetchall()
            self._db.executemany("DELETE FROM artifacts WHERE ref = ?", [(r,) for r, _ in expired])
        for _, name in expired:
            with contextlib.suppress(FileNotFoundError):
                (self.blobs / name).unlink()
        return len(expired)

    def _remove_orphans(self) -> None:
        """Files without a committed row are writes a crash interrupted: never visible, delete."""
        remove_stale_parts(self.tmp)
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")  # no other server commits while we look
            known = {name for (name,) in self._db.execute("SELECT file FROM artifacts")}
            for blob in self.blobs.iterdir():
                if blob.name not in known:
                    with contextlib.suppress(FileNotFoundError):
                        blob.unlink()
