"""Locks that hold across server processes: one call at a time per notebook, one leader.

Two kinds, one per engine, both released by the operating system when their holder dies:

- ``FileLocks`` (SQLite, one machine): ``flock`` on a file per key under ``state_dir/locks``.
  The lock belongs to an open file, so a killed worker's locks go with its file descriptors.
- ``PgLocks`` (PostgreSQL, any number of machines): session-level advisory locks on a
  connection of the process's own (not the query pool's); a replica that dies closes its
  connections and PostgreSQL releases its locks.

Waiting is a poll of a non-blocking try (20 ms to 200 ms apart) so a waiting call holds no
thread; within one process an asyncio lock per key keeps waiting calls in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..errors import ComputeError

T = TypeVar("T")


class LockTimeout(ComputeError):
    """Another call held the lock for longer than we were willing to wait."""


class Held(Protocol):
    def release(self) -> None: ...


class Locks(Protocol):
    # True when try_acquire and release never wait (a local file and a non-blocking flock):
    # then they run on the event loop, not in a worker thread.
    inline: bool

    def try_acquire(self, key: str) -> Held | None: ...


class _FileHeld:
    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


class FileLocks:
    inline = True  # open(2) of a file in the state dir and flock(LOCK_NB): tens of microseconds

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def try_acquire(self, key: str) -> _FileHeld | None:
        name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock"
        fd = os.open(self.root / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return _FileHeld(fd)


class _PgHeld:
    def __init__(self, locks: PgLocks, conn: Any, key: str, *, own: bool) -> None:
        self.locks, self.conn, self.key, self.own = locks, conn, key, own

    def release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            with self.locks.mutex:
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self.key,))
        except Exception:
            conn.close()  # a broken connection: its locks are gone server-side already
        if self.own:
            conn.close()


class PgLocks:
    """Session-level advisory locks. The notebook locks of this process share one connection
    of their own (a session holds many locks; the asyncio lock per key in NotebookLocks keeps
    one holder per key in this process), so held locks never take connections from the
    query pool. ``dedicated`` locks (leadership) get a connection each."""

    inline = False  # a round trip to the database: in a worker thread

    def __init__(self, url: str) -> None:
        self.url = url
        self.mutex = threading.Lock()
        self._conn: Any = None

    def _shared(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True)
        return self._conn

    def try_acquire(self, key: str, *, dedicated: bool = False) -> _PgHeld | None:
        import psycopg

        if dedicated:
            conn = psycopg.connect(self.url, autocommit=True)
            got = _try(conn, key)
        else:
            with self.mutex:
                conn = self._shared()
                got = _try(conn, key)
        if not got:
            if dedicated:
                conn.close()
            return None
        return _PgHeld(self, conn, key, own=dedicated)

    def close(self) -> None:
        with self.mutex:
            if self._conn is not None:
                self._conn.close()


def _try(conn: Any, key: str) -> bool:
    try:
        (got,) = conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)
        ).fetchone()
    except Exception:
        conn.close()
        raise
    return bool(got)


class NotebookLocks:
    """``async with locks.hold(key)``: one holder across every process sharing the state."""

    def __init__(self, locks: Locks, *, timeout: float) -> None:
        self.locks = locks
        self.timeout = timeout
        self._local: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        local = self._local.get(key)
        if local is None:
            local = self._local[key] = asyncio.Lock()
        async with local:  # this process's calls queue here, in arrival order
            held = await self._acquire(key)
            try:
                yield
            finally:
                await self._run(held.release)

    def free_here(self, key: str) -> bool:
        """No call of this process holds or waits for ``key`` (a session-level PostgreSQL lock
        is re-entrant, so its own holder must be asked here before trying it)."""
        local = self._local.get(key)
        return local is None or not local.locked()

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        """``call`` on the loop when the locks never wait (``inline``), else in a thread."""
        return call(*args) if self.locks.inline else await asyncio.to_thread(call, *args)

    async def _acquire(self, key: str) -> Held:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        delay = 0.02
        while True:
            held = await self._run(self.locks.try_acquire, key)
            if held is not None:
                return held
            if loop.time() >= deadline:
                raise LockTimeout(
                    "another call on this notebook is still running - wait for it to finish, "
                    'or use notebook="new" to work in parallel'
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.2)


class Leadership:
    """Whether this process is the one that sweeps (TTL, strays) right now.

    The first process to take the leader lock keeps it until it dies; the others ask again
    on every round, so one of them takes over within a round of the leader's death.
    """

    KEY = "dataref:leader"

    def __init__(self, locks: Any) -> None:
        self.locks = locks
        self._held: Any = None
        self._mutex = threading.Lock()  # asked from worker threads by several sweepers

    def is_leader(self) -> bool:
        with self._mutex:
            return self._is_leader()

    def _is_leader(self) -> bool:
        if self._held is not None and not self._alive():
            self._held = None
        if self._held is None:
            if isinstance(self.locks, PgLocks):
                self._held = self.locks.try_acquire(self.KEY, dedicated=True)
            else:
                self._held = self.locks.try_acquire(self.KEY)
        return self._held is not None

    def _alive(self) -> bool:
        conn = getattr(self._held, "conn", None)
        if conn is None:
            return isinstance(self._held, _FileHeld) and self._held.fd is not None
        try:
            conn.execute("SELECT 1")
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()
            return False
        return True

    def release(self) -> None:
        with self._mutex:
            if self._held is not None:
                self._held.release()
                self._held = None
        if isinstance(self.locks, PgLocks):
            self.locks.close()
