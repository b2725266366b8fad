"""The exposure ledger: an append-only record of what every tool reply sent to the model.

One row per tool reply: when, whose, which tool and notebook, the dataRefs it read and
created, the sources they come from, and the sizes of what reached the client (the whole
reply, and its parts: sample rows, ``result``, stdout, error text, images). It never holds a
value of the data: only counts, byte sizes, refs, tool and source names. Audit events
(authentication failures, refusals by owner, grant or budget) are kept next to it.

Durability matches the store: WAL with ``synchronous=FULL``, and the row is committed before
the reply leaves the server, so a reply a client received is in the ledger even when the
server is SIGKILLed right after. Rows are never updated or deleted: triggers refuse it.

``LedgerStorage`` is the small interface the rest of the code uses, so the ledger can move to
another state engine (PostgreSQL) without its callers changing; ``SQLiteLedger`` is the one
implementation today.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

LEDGER_FILE = "ledger.sqlite"
# Space set aside for the ledger: freed when the disk fills, so replies that write nothing
# else (reads, listings) are still recorded, and sent, on a full disk.
RESERVE_FILE = "reserve.bin"
RESERVE_BYTES = 512 * 1024
RESERVE_RETRY_SECONDS = 60.0


def is_full(exc: BaseException) -> bool:
    """Is this the ledger's database failing for lack of disk space?"""
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    ts           REAL NOT NULL,
    owner        TEXT NOT NULL,
    tool         TEXT NOT NULL,
    notebook     TEXT,
    request_id   TEXT,
    ok           INTEGER NOT NULL,
    refused      TEXT,
    bytes        INTEGER NOT NULL,
    sample_rows  INTEGER NOT NULL,
    sample_bytes INTEGER NOT NULL,
    result_bytes INTEGER NOT NULL,
    stdout_bytes INTEGER NOT NULL,
    error_bytes  INTEGER NOT NULL,
    image_count  INTEGER NOT NULL,
    image_bytes  INTEGER NOT NULL,
    charts       INTEGER NOT NULL,
    exports      INTEGER NOT NULL,
    latency_ms   REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS replies_owner ON replies(owner, ts);
CREATE INDEX IF NOT EXISTS replies_notebook ON replies(owner, notebook, tool);
CREATE TABLE IF NOT EXISTS reply_sources (
    reply  INTEGER NOT NULL REFERENCES replies(id),
    source TEXT NOT NULL,
    PRIMARY KEY (reply, source)
);
CREATE INDEX IF NOT EXISTS reply_sources_source ON reply_sources(source);
CREATE TABLE IF NOT EXISTS reply_refs (
    reply INTEGER NOT NULL REFERENCES replies(id),
    ref   TEXT NOT NULL,
    role  TEXT NOT NULL CHECK (role IN ('read', 'created')),
    PRIMARY KEY (reply, ref, role)
);
CREATE INDEX IF NOT EXISTS reply_refs_ref ON reply_refs(ref, role);
CREATE TABLE IF NOT EXISTS audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    ts     REAL NOT NULL,
    event  TEXT NOT NULL,
    owner  TEXT,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_ts ON audit(ts);
"""

_APPEND_ONLY = ("replies", "reply_sources", "reply_refs", "audit")


def _append_only_triggers() -> str:
    return "\n".join(
        f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op} BEFORE {op.upper()} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;"
        for table in _APPEND_ONLY
        for op in ("update", "delete")
    )


@dataclass(frozen=True)
class Sizes:
    """What of one reply reached the client, in UTF-8 bytes of its JSON encoding.

    ``bytes`` is the whole reply as serialized for the client. The parts are one copy each:
    a reply carries its JSON twice (as text and as structured content), so the parts add up
    to less than ``bytes``.
    """

    bytes: int = 0
    sample_rows: int = 0
    sample_bytes: int = 0
    result_bytes: int = 0
    stdout_bytes: int = 0
    error_bytes: int = 0
    image_count: int = 0
    image_bytes: int = 0  # base64 characters of the images, as sent


@dataclass(frozen=True)
class Entry:
    """One tool reply. Nothing here is a value of the data."""

    ts: float
    owner: str
    tool: str
    sizes: Sizes
    ok: bool = True
    notebook: str | None = None
    request_id: str | None = None
    refused: str | None = None  # "budget" | "access" | "auth": a refusal, with its kind
    sources: tuple[str, ...] = ()
    refs_read: tuple[str, ...] = ()
    refs_created: tuple[str, ...] = ()
    charts: int = 0  # charts made (stored), whether or not their image was sent
    exports: int = 0  # files written for a person
    latency_ms: float = 0.0


@dataclass(frozen=True)
class Query:
    """A report's filter: any of owner, source and a start time (epoch seconds)."""

    owner: str | None = None
    source: str | None = None
    since: float | None = None


@dataclass
class Totals:
    calls: int = 0
    errors: int = 0
    refused: int = 0
    charts: int = 0
    exports: int = 0
    sizes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIZE_FIELDS, 0))


SIZE_FIELDS = tuple(Sizes.__dataclass_fields__)
NO_SOURCE = "-"  # the source of replies that touched no source (list_artifacts, ...)


class LedgerStorage(Protocol):
    """What the server and the reports need of a ledger, whatever engine keeps it."""

    def append(self, entry: Entry) -> int: ...

    def audit(self, ts: float, event: str, owner: str | None, detail: dict[str, Any]) -> None: ...

    def ref_sources(self, owner: str, refs: Iterable[str]) -> dict[str, set[str]]: ...

    def notebook_sources(self, owner: str, notebook: str) -> set[str]: ...

    def spent(self, owner: str, source: str, since: float) -> int: ...

    def totals(self, query: Query) -> dict[tuple[str, str], Totals]: ...

    def spent_by(self, since: float) -> dict[tuple[str, str], int]: ...

    def bytes_by_source(self) -> dict[str, int]: ...

    def audit_events(self, since: float | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class SQLiteLedger:
    """The ledger in ``<dir>/ledger.sqlite``; ``read_only`` for reports beside a live server."""

    def __init__(self, directory: Path, *, read_only: bool = False) -> None:
        self.path = Path(directory) / LEDGER_FILE
        self._lock = threading.Lock()
        if read_only:
            self._db = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, check_same_thread=False
            )
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.parent.chmod(0o700)
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # A short WAL, reused after each checkpoint: it never grows into the space a full
            # disk's reserve was kept for (the default lets it reach about 4 MB).
            self._db.execute("PRAGMA wal_autocheckpoint=32")
            self._db.executescript(_SCHEMA + _append_only_triggers())
        self._db.execute("PRAGMA busy_timeout=10000")
        self.reserve = self.path.parent / RESERVE_FILE
        self._reserve_tried = 0.0
        if not read_only and not self.reserve.exists():
            self._refill_reserve()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writing -----------------------------------------------------------------------

    def append(self, entry: Entry) -> int:
        """Commit one reply (durably: it returns after the WAL is synced). On a full disk the
        reserve is given up once so the ledger keeps recording; when even that is used up,
        the error propagates (the caller then does not send the reply)."""
        try:
            reply = self._insert(entry)
        except sqlite3.OperationalError as exc:
            if not (is_full(exc) and self._release_reserve()):
                raise
            reply = self._insert(entry)
        if not self.reserve.exists():
            self._refill_reserve()
        return reply

    def _release_reserve(self) -> bool:
        try:
            self.reserve.unlink()
        except FileNotFoundError:
            return False
        self._reserve_tried = time.monotonic()
        return True

    def _refill_reserve(self) -> None:
        """Set the reserve aside again (at most once a minute while the disk stays full)."""
        now = time.monotonic()
        if self._reserve_tried and now - self._reserve_tried < RESERVE_RETRY_SECONDS:
            return
        self._reserve_tried = now
        part = self.reserve.with_suffix(".part")
        try:
            with open(part, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, self.reserve)
        except OSError:
            part.unlink(missing_ok=True)

    def _insert(self, entry: Entry) -> int:
        s = entry.sizes
        row = (
            entry.ts, entry.owner, entry.tool, entry.notebook, entry.request_id,
            int(entry.ok), entry.refused, s.bytes, s.sample_rows, s.sample_bytes,
            s.result_bytes, s.stdout_bytes, s.error_bytes, s.image_count, s.image_bytes,
            entry.charts, entry.exports, entry.latency_ms,
        )  # fmt: skip
        refs = [(r, "read") for r in dict.fromkeys(entry.refs_read)]
        refs += [(r, "created") for r in dict.fromkeys(entry.refs_created)]
        with self._lock, self._db:
            cur = self._db.execute(
                "INSERT INTO replies (ts, owner, tool, notebook, request_id, ok, refused, bytes, "
                "sample_rows, sample_bytes, result_bytes, stdout_bytes, error_bytes, image_count, "
                "image_bytes, charts, exports, latency_ms) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                row,
            )
            reply = int(cur.lastrowid or 0)
            self._db.executemany(
                "INSERT INTO reply_sources VALUES (?, ?)",
                [(reply, s) for s in sorted(set(entry.sources))],
            )
            self._db.executemany(
                "INSERT INTO reply_refs VALUES (?, ?, ?)", [(reply, r, k) for r, k in refs]
            )
        return reply

    def audit(self, ts: float, event: str, owner: str | None, detail: dict[str, Any]) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO audit (ts, event, owner, detail) VALUES (?, ?, ?, ?)",
                (ts, event, owner, json.dumps(detail, sort_keys=True, default=str)),
            )

    # -- lineage -----------------------------------------------------------------------

    def ref_sources(self, owner: str, refs: Iterable[str]) -> dict[str, set[str]]:
        """{ref: sources} for the refs this owner's replies created (others are absent)."""
        found: dict[str, set[str]] = {}
        with self._lock:
            for ref in dict.fromkeys(refs):
                rows = self._db.execute(
                    "SELECT s.source FROM reply_refs rr JOIN replies r ON r.id = rr.reply "
                    "LEFT JOIN reply_sources s ON s.reply = r.id "
                    "WHERE rr.ref = ? AND rr.role = 'created' AND r.owner = ?",
                    (ref, owner),
                ).fetchall()
                if rows:
                    found[ref] = {src for (src,) in rows if src is not None}
        return found

    def notebook_sources(self, owner: str, notebook: str) -> set[str]:
        """Sources bound into the notebook's kernel since its last reset: its variables may
        hold their data, so every later run_python there counts against them."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT s.source FROM replies r JOIN reply_sources s ON s.reply = r.id "
                "WHERE r.owner = ? AND r.notebook = ? AND r.tool = 'run_python' "
                "AND r.refused IS NULL AND r.id > (SELECT COALESCE(MAX(id), 0) FROM replies "
                "WHERE owner = ? AND notebook = ? AND tool = 'reset_kernel' AND ok = 1)",
                (owner, notebook, owner, notebook),
            ).fetchall()
        return {src for (src,) in rows}

    # -- reading -----------------------------------------------------------------------

    def spent(self, owner: str, source: str, since: float) -> int:
        with self._lock:
            (total,) = self._db.execute(
                "SELECT COALESCE(SUM(r.bytes), 0) FROM replies r "
                "JOIN reply_sources s ON s.reply = r.id "
                "WHERE r.owner = ? AND s.source = ? AND r.ts >= ?",
                (owner, source, since),
            ).fetchone()
        return int(total)

    def spent_by(self, since: float) -> dict[tuple[str, str], int]:
        """{(source, owner): bytes} since a time: what budgets are checked against."""
        with self._lock:
            rows = self._db.execute(
                "SELECT s.source, r.owner, SUM(r.bytes) FROM replies r "
                "JOIN reply_sources s ON s.reply = r.id WHERE r.ts >= ? "
                "GROUP BY s.source, r.owner",
                (since,),
            ).fetchall()
        return {(src, owner): int(n) for src, owner, n in rows}

    def totals(self, query: Query) -> dict[tuple[str, str], Totals]:
        """{(source, owner): Totals}; a reply that touched no source is under NO_SOURCE."""
        where, params = ["1 = 1"], []
        if query.owner is not None:
            where.append("r.owner = ?")
            params.append(query.owner)
        if query.since is not None:
            where.append("r.ts >= ?")
            params.append(query.since)
        source = f"COALESCE(s.source, '{NO_SOURCE}')"
        if query.source is not None:
            where.append(f"{source} = ?")
            params.append(query.source)
        sums = ", ".join(f"SUM(r.{f})" for f in SIZE_FIELDS)
        sql = (
            f"SELECT {source}, r.owner, COUNT(*), SUM(1 - r.ok), "
            f"SUM(r.refused IS NOT NULL), SUM(r.charts), SUM(r.exports), {sums} "
            "FROM replies r LEFT JOIN reply_sources s ON s.reply = r.id "
            f"WHERE {' AND '.join(where)} GROUP BY 1, 2 ORDER BY 1, 2"
        )
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        out: dict[tuple[str, str], Totals] = {}
        for src, owner, calls, errors, refused, charts, exports, *sizes in rows:
            out[(src, owner)] = Totals(
                calls, errors, refused, charts, exports, dict(zip(SIZE_FIELDS, sizes, strict=True))
            )
        return out

    def bytes_by_source(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT COALESCE(s.source, '{NO_SOURCE}'), SUM(r.bytes) FROM replies r "
                "LEFT JOIN reply_sources s ON s.reply = r.id GROUP BY 1"
            ).fetchall()
        return {src: int(n) for src, n in rows}

    def audit_events(self, since: float | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT ts, event, owner, detail FROM audit WHERE ts >= ? ORDER BY id",
                (since or 0.0,),
            ).fetchall()
        return [
            {"ts": ts, "event": event, "owner": owner, **json.loads(detail)}
            for ts, event, owner, detail in rows
        ]
