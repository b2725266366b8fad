"""One small database seam, two engines: SQLite files (the embedded default) or PostgreSQL.

Callers write portable SQL with ``?`` placeholders and run it inside ``tx()``: a transaction
that commits on success and rolls back on any exception, so nothing is half-visible. A
``write`` transaction on SQLite takes the database's write lock up front (BEGIN IMMEDIATE);
on PostgreSQL ``lock`` names an advisory key held until the transaction ends, which is how
checks such as a quota stay atomic across server processes.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Database(Protocol):
    dialect: str  # "sqlite" | "postgresql"

    def tx(
        self, *, write: bool = False, lock: str | None = None
    ) -> contextlib.AbstractContextManager[Cursor]: ...
    def ping(self) -> None: ...
    def close(self) -> None: ...


class SQLiteDatabase:
    """One SQLite file; one connection shared by the threads of this process."""

    dialect = "sqlite"

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        # autocommit mode: transactions are opened explicitly in tx()
        self._db = sqlite3.connect(
            self.path, check_same_thread=False, timeout=30, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._depth = 0

    @contextlib.contextmanager
    def tx(self, *, write: bool = False, lock: str | None = None) -> Iterator[Cursor]:
        # ``lock`` needs nothing here: a write transaction already excludes other writers.
        with self._lock:
            if self._depth:  # nested: part of the enclosing transaction
                self._depth += 1
                try:
                    yield self._db.cursor()
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE" if write or lock else "BEGIN")
            self._depth = 1
            try:
                yield self._db.cursor()
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._depth = 0

    def ping(self) -> None:
        with self._lock:
            self._db.execute("SELECT 1").fetchone()

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _PgCursor:
    """psycopg's cursor with ``?`` placeholders (no statement here has a literal ``?``)."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _PgCursor:
        self._cursor.execute(sql.replace("?", "%s"), tuple(params))
        return self

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()


class PostgresDatabase:
    """PostgreSQL through a psycopg 3 connection pool, shared by every table of the state."""

    dialect = "postgresql"

    def __init__(self, url: str, *, pool_size: int = 10, timeout: float = 30) -> None:
        from psycopg_pool import ConnectionPool

        self.url = url
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            timeout=timeout,
            open=True,
            check=ConnectionPool.check_connection,
            name="dataref-state",
        )

    @contextlib.contextmanager
    def tx(self, *, write: bool = False, lock: str | None = None) -> Iterator[Cursor]:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            if lock is not None:
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
            yield _PgCursor(cur)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection in autocommit mode (session-level advisory locks)."""
        with self.pool.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                conn.autocommit = False

    def ping(self) -> None:
        with self.tx() as cur:
            cur.execute("SELECT 1").fetchone()

    def close(self) -> None:
        self.pool.close()
