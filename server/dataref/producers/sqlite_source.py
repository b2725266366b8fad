"""SQLite sources: the query runs in a child process and streams back as Arrow batches.

The child (``sqlite_worker``) is forked from a forkserver that already imported pyarrow,
ADBC and sqlglot, so a query costs a fork, not an interpreter start. The rows come back as
an Arrow IPC stream on a pipe of their own, which Arrow reads (no Python copy) one batch at
a time. The server enforces the row cap and the statement timeout (a timer kills the child
at the deadline), and kills the child on either, or when the store refuses the artifact: a
runaway statement never outlives its call. A stream counts as complete only when the child
then reports ``END`` with the same number of rows, so a child that died between two batches
can never pass for a shorter result.

As with any multiprocessing code, a script that runs SQLite queries in-process (a replayed
notebook run as ``python script.py``) must guard its entry point with
``if __name__ == "__main__":``: the forkserver imports the parent's main module.

Demo grants hold here too: an owner restricted to some regions queries a private copy
holding only those rows, so no SQL trick can reach the others.
"""

from __future__ import annotations

import contextlib
import fcntl
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
    data_in, data_out = multiprocessing.Pipe(duplex=False)
    with contextlib.suppress(OSError):  # over the owner's pipe allowance: the default size
        fcntl.fcntl(data_out.fileno(), fcntl.F_SETPIPE_SZ, sqlite_worker.PIPE_BYTES)
    process = _forkserver().Process(
        target=sqlite_worker.serve, args=(job, sender, data_out), daemon=True
    )
    try:
        process.start()
    except BaseException:
        receiver.close()
        data_in.close()
        raise
    finally:
        sender.close()
        data_out.close()
    stream = _Stream(process, receiver, data_in, tmpdir, source.timeout_seconds)
    try:
        stream.started()
        reader = stream.open()
    except BaseException:
        stream.release()
        raise
    target, convert = normalise(reader.schema)
    return Batches(target, capped(stream.batches(reader), convert, source.row_cap, stream.release))


class _Stream:
    """The server's end of one child: its control and data pipes, its deadline, its end."""

    def __init__(
        self, process: Any, control: Connection, data: Connection, tmpdir: str | None,
        timeout: float,
    ) -> None:  # fmt: skip
        self.process, self.control, self.data, self.tmpdir = process, control, data, tmpdir
        self.timeout = timeout
        self.deadline = time.monotonic() + STARTUP_SECONDS + timeout
        self.expired = threading.Event()
        self.source: pa.NativeFile | None = None
        self.timer: threading.Timer | None = None
        self.rows = 0

    def started(self) -> None:
        """Wait for the child (the first one waits for the forkserver's imports), then the
        statement timeout starts: at the deadline the timer kills the child."""
        if not self.control.poll(STARTUP_SECONDS):
            raise DatarefError("the query process did not start - try again in a moment")
        if self.control.recv_bytes() != sqlite_worker.READY:
            raise DatarefError("the query process answered out of order - try again")
        self.deadline = time.monotonic() + self.timeout
        self.timer = threading.Timer(self.timeout, self._expire)
        self.timer.daemon = True
        self.timer.start()

    def _expire(self) -> None:
        self.expired.set()
        with contextlib.suppress(Exception):
            self.process.kill()

    def open(self) -> pa.RecordBatchReader:
        """The result's reader, once its schema arrived (else the child's error)."""
        try:
            # Buffered: its read(n) returns n bytes unless the stream ended, as Arrow expects;
            # a large read goes straight into the bytes Arrow then uses without a copy.
            pipe = open(self.data.fileno(), "rb", closefd=False)  # noqa: SIM115 (closed in release)
            self.source = pa.PythonFile(pipe, mode="r")
            return pa.ipc.open_stream(self.source)
        except (pa.ArrowException, OSError):
            raise self._failure() from None

    def batches(self, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowException, OSError):
                raise self._failure() from None
            self.rows += batch.num_rows
            yield batch
        tag, payload = self._report()
        if tag != sqlite_worker.END or payload != self.rows:
            raise self._failure(tag, payload)

    def _report(self) -> tuple[bytes | None, Any]:
        """The child's last word: (END, rows) or (ERROR, (message, denied)); (None, None)
        when it died or ran out of time first."""
        try:
            if not self.control.poll(max(0.0, self.deadline - time.monotonic())):
                return None, None
            tag = self.control.recv_bytes()
            if tag == sqlite_worker.END:
                return tag, self.control.recv()
            if tag == sqlite_worker.ERROR:
                return tag, self.control.recv()
        except (EOFError, OSError):
            pass
        return None, None

    def _failure(self, tag: bytes | None = None, payload: Any = None) -> Exception:
        """Why the stream stopped short, in the agent's words."""
        if tag is None:
            tag, payload = self._report()
        if tag == sqlite_worker.ERROR:
            return _sqlite_error(*payload)
        if self.expired.is_set() or time.monotonic() >= self.deadline:
            return QueryTimeout(
                f"query ran longer than {self.timeout:g}s - add a WHERE or LIMIT, or aggregate less"
            )
        return DatarefError(
            "the query stopped unexpectedly (out of memory?) - narrow it and try again"
        )

    def release(self) -> None:
        try:
            if self.timer is not None:
                self.timer.cancel()
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=10)
            self.control.close()
            self.data.close()
            if self.source is not None:
                self.source.close()
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
