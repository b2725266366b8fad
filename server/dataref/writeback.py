"""Early writeback: a large file starts reaching the disk while it is still being written.

The store makes every artifact durable (fsync) before its row is committed. Done only at the
end, that fsync waits for the whole file: about 45 ms for 100 MB here, added to every large
fetch. ``Writeback`` flushes what has been written so far in a background ``fdatasync``
once every ``every`` bytes (one flush at a time), so the final fsync, which still covers the
whole file and its metadata, waits only for the tail. Nothing changes for durability: the
file is durable when ``durable()`` returns, not before.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import BinaryIO

WRITEBACK_BYTES = 16 << 20


class Writeback:
    """Use as a context manager around writing ``f``, and write through it: every ``write``
    calls ``progress()`` (Arrow's IPC writer writes a whole column buffer per call, so a
    flush can start in the middle of a batch); ``durable()`` at the end. Leaving the block
    always waits for the flush in flight, so no background ``fdatasync`` outlives the file's
    descriptor."""

    def __init__(self, f: BinaryIO, every: int = WRITEBACK_BYTES) -> None:
        self.f, self.every = f, every
        self.flushed = 0
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None

    def __enter__(self) -> Writeback:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._wait()

    # -- the file-like side, for writers ----------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.f.closed

    def write(self, data: bytes) -> int:
        written = self.f.write(data)
        self.progress()
        return written

    def tell(self) -> int:
        return self.f.tell()

    def flush(self) -> None:
        self.f.flush()

    # -- flushing --------------------------------------------------------------------------

    def progress(self) -> None:
        """Start a background flush when ``every`` new bytes were written and none runs."""
        if self._thread is not None and self._thread.is_alive():
            return
        position = self.f.tell()
        if position - self.flushed < self.every:
            return
        self.f.flush()
        self.flushed = position
        self._thread = threading.Thread(target=self._sync, name="dataref-writeback", daemon=True)
        self._thread.start()

    def _sync(self) -> None:
        try:
            os.fdatasync(self.f.fileno())
        except OSError as exc:  # reported by durable(), in the writer's thread
            self._error = exc

    def _wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def durable(self) -> None:
        """Flush and fsync the whole file (waiting for the flush in flight first)."""
        self._wait()
        self.f.flush()
        os.fsync(self.f.fileno())
        if self._error is not None:
            raise self._error
