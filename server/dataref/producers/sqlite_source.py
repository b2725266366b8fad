"""SQLite sources: the query runs in a child process and streams back as Arrow batches.

The child (``sqlite_worker``) is forked from a forkserver that already imported pyarrow,
ADBC and sqlglot, so a query costs a fork, not an interpreter start. The server reads one
batch at a time, enforces the row cap and the statement timeout, and on either (or when the
store refuses the artifact) kills the child: a runaway statement never outlives its call.

As with any multiprocessing code, a script that runs SQLite queries in-process (a replayed
notebook run as ``python script.py``) must guard its entry point with
``if __name__ == "__main__":``: the forkserver imports the parent's main module.

Demo grants hold here too: an owner restricted to some regions queries a private copy
holding only those rows, so no SQL trick can reach the others.
"""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import sqlite_worker
from ..config import Settings, SourceSettings
from ..errors import DatarefError, InvalidRequest, LimitExceeded
from .demo import allowed_regions, prepare_demo
from .rows import Batches, capped, normalise
from .sqlcheck import REWRITE

SCHEMA_HINT = "SELECT name, sql FROM sqlite_master"
STARTUP_SECONDS = 120
_lock = threading.Lock()
_context: Any = None


class QueryTimeout(LimitExceeded):
    pass


def _forkserver() -> Any:
    global _context
    with _lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["dataref.sqlite_worker", *sqlite_worker.PRELOAD])
            _context = context
        return _context


def database_of(settings: Settings, name: str, source: SourceSettings, owner: str):
    """(file, regions): the file to query and, for a restricted demo owner, their regions."""
    if name == "demo" and settings.demo.enabled and "demo" not in settings.sources:
        return prepare_demo(settings), allowed_regions(settings, owner)
    assert source.path is not None
    return source.path, None


def run_sqlite(
    settings: Settings, name: str, source: SourceSettings, owner: str, sql: str
) -> Batches:
    """Start ``sql`` on the source; the batches stream as the caller reads them."""
    path, regions = database_of(settings, name, source, owner)
    if not Path(path).is_file():
        raise DatarefError(
            f"the database of this source is missing ({Path(path).name}) - ask the operator to "
            "fix the [sources] configuration"
        )
    tmpdir = tempfile.mkdtemp(prefix="dataref-sqlite-") if regions is not None else None
    job = {"path": str(path), "sql": sql, "owner": owner, "regions": regions, "tmpdir": tmpdir}
    receiver, sender = multiprocessing.Pipe(duplex=False)
    process = _forkserver().Process(target=sqlite_worker.serve, args=(job, sender), daemon=True)
    process.start()
    sender.close()
    stream = _Stream(process, receiver, tmpdir, source.timeout_seconds)
    try:
        stream.started()
        schema = stream.schema()
    except BaseException:
        stream.release()
        raise
    target, convert = normalise(schema)
    return Batches(target, capped(stream.batches(schema), convert, source.row_cap, stream.release))


class _Stream:
    """The server's end of one child: messages under a deadline, and the child's end."""

    def __init__(self, process: Any, receiver: Connection, tmpdir: str | None, timeout: float):
        self.process, self.receiver, self.tmpdir = process, receiver, tmpdir
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def started(self) -> None:
        """Wait for the child (the first one waits for the forkserver's imports), then the
        statement timeout starts."""
        if not self.receiver.poll(STARTUP_SECONDS):
            raise DatarefError("the query process did not start - try again in a moment")
        if self.receiver.recv_bytes() != sqlite_worker.READY:
            raise DatarefError("the query process answered out of order - try again")
        self.deadline = time.monotonic() + self.timeout

    def _recv(self) -> bytes:
        if not self.receiver.poll(max(0.0, self.deadline - time.monotonic())):
            raise QueryTimeout(
                f"query ran longer than {self.timeout:g}s - add a WHERE or LIMIT, or aggregate less"
            )
        try:
            return self.receiver.recv_bytes()
        except EOFError:
            raise DatarefError(
                "the query stopped unexpectedly (out of memory?) - narrow it and try again"
            ) from None

    def _message(self) -> tuple[bytes, Any]:
        tag = self._recv()
        if tag == sqlite_worker.ERROR:
            message, denied = self.receiver.recv()
            raise _sqlite_error(message, denied)
        if tag == sqlite_worker.END:
            return tag, None
        return tag, self._recv()

    def schema(self) -> pa.Schema:
        tag, payload = self._message()
        if tag != sqlite_worker.SCHEMA:
            raise DatarefError("the query process answered out of order - try again")
        return pa.ipc.read_schema(pa.py_buffer(payload))

    def batches(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        while True:
            tag, payload = self._message()
            if tag == sqlite_worker.END:
                return
            yield pa.ipc.read_record_batch(pa.py_buffer(payload), schema)

    def release(self) -> None:
        try:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=10)
            self.receiver.close()
        finally:
            if self.tmpdir:
                shutil.rmtree(self.tmpdir, ignore_errors=True)


def _sqlite_error(message: str, denied: bool) -> InvalidRequest:
    if denied:
        return InvalidRequest(
            f"{REWRITE}; it may only read tables and call built-in functions (SQLite said: "
            f"{message}) - to see the schema: {SCHEMA_HINT}"
        )
    if message.startswith("column "):  # our own date-column message
        return InvalidRequest(message)
    return InvalidRequest(
        f"SQLite rejected the query: {message} - fix it; list the tables with {SCHEMA_HINT}"
    )
