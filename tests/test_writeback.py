"""Early writeback: a growing file is flushed in the background; durable() still fsyncs all."""

from __future__ import annotations

import os
import threading

import pytest

from dataref import writeback
from dataref.writeback import Writeback


def test_a_growing_file_is_flushed_in_the_background_and_complete_at_the_end(tmp_path, monkeypatch):
    synced: list[tuple[str, int]] = []
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def fdatasync(fd: int) -> None:
        synced.append((threading.current_thread().name, os.fstat(fd).st_size))
        real_fdatasync(fd)

    def fsync(fd: int) -> None:
        synced.append(("fsync", os.fstat(fd).st_size))
        real_fsync(fd)

    monkeypatch.setattr(writeback.os, "fdatasync", fdatasync)
    monkeypatch.setattr(writeback.os, "fsync", fsync)
    path = tmp_path / "grow.bin"
    with open(path, "wb") as f, Writeback(f, every=1000) as flush:
        for _ in range(10):
            f.write(b"x" * 600)
            flush.progress()
        flush.durable()
    assert path.stat().st_size == 6000
    background = [size for name, size in synced if name == "dataref-writeback"]
    assert background and all(0 < size < 6000 for size in background)
    assert synced[-1] == ("fsync", 6000)  # the last word is a full fsync of the whole file


def test_a_failed_background_flush_is_reported_by_durable(tmp_path, monkeypatch):
    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(writeback.os, "fdatasync", broken)
    with open(tmp_path / "bad.bin", "wb") as f, Writeback(f, every=10) as flush:
        f.write(b"y" * 100)
        flush.progress()
        with pytest.raises(OSError, match="Input/output error"):
            flush.durable()


def test_leaving_the_block_on_an_error_waits_for_the_flush_in_flight(tmp_path, monkeypatch):
    release = threading.Event()
    done: list[bool] = []

    def slow(fd: int) -> None:
        release.wait(5)
        done.append(True)

    monkeypatch.setattr(writeback.os, "fdatasync", slow)
    with (
        pytest.raises(RuntimeError),
        open(tmp_path / "c.bin", "wb") as f,
        Writeback(f, every=10) as flush,
    ):
        f.write(b"z" * 100)
        flush.progress()
        threading.Timer(0.1, release.set).start()
        raise RuntimeError("the writer gave up")
    assert done == [True]  # the descriptor was still open while fdatasync ran
