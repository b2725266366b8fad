"""A kernel keeps the memory its code freed for its next call and gives it back when idle
(kernel_profile/startup/lib/memory.py and the sandbox's GLIBC_TUNABLES), in a real kernel."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest
import pytest_asyncio

from dataref.kernels import KernelPool, NotebookKernel

from .kernel_support import kernel_settings, probe, require_bwrap

LIB = Path(__file__).resolve().parents[1] / "kernel_profile" / "startup" / "lib" / "memory.py"

RSS = "_rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20\n"


def load_lib() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_memory_lib", LIB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def kernel(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NotebookKernel]:
    require_bwrap()
    pool = KernelPool(kernel_settings(tmp_path_factory.mktemp("mem"), uid_base=62600))
    await pool.start()
    try:
        yield await pool.kernel("pat", "nb")
    finally:
        await pool.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_memory_freed_by_a_call_stays_for_the_next_and_can_be_given_back(
    kernel: NotebookKernel,
) -> None:
    out = await probe(
        kernel,
        RSS + "import numpy as _np\n_a = _np.ones(25_000_000)\n_held = _rss()\ndel _a\n"
        "out = {'held': _held, 'freed': _rss()}",
    )
    assert out["held"] - out["freed"] < 50, out  # 200 MB freed, still the kernel's to reuse
    out = await probe(
        kernel,
        RSS + "import ctypes as _c\n_before = _rss()\n_c.CDLL(None).malloc_trim(0)\n"
        "out = {'before': _before, 'after': _rss()}",
    )
    assert out["before"] - out["after"] > 150, out  # what the idle release does


@pytest.mark.asyncio(loop_scope="module")
async def test_arrow_allocates_from_the_same_kept_heap(kernel: NotebookKernel) -> None:
    # Arrow's own pool (mimalloc) hands freed memory back within milliseconds, so converting
    # a column with nulls (copied to fill NaN) would touch fresh pages on every call.
    out = await probe(
        kernel,
        RSS + "import pyarrow as _pa\n_col = _pa.array([None] + [1.5] * 25_000_000)\n"
        "_s = _col.to_pandas()\n_held = _rss()\ndel _s\n"
        "out = {'pool': _pa.default_memory_pool().backend_name, 'held': _held, 'freed': _rss()}",
    )
    assert out["pool"] == "system", out
    assert out["held"] - out["freed"] < 50, out  # the 200 MB column's pages stay to reuse


@pytest.mark.asyncio(loop_scope="module")
async def test_the_kernel_runs_the_idle_release(kernel: NotebookKernel) -> None:
    names = await probe(kernel, "import threading as _t\nout = [t.name for t in _t.enumerate()]")
    assert "dataref-idle-release" in names


def test_the_release_waits_for_the_kernel_to_be_idle_and_runs_once_per_idle_period() -> None:
    lib = load_lib()
    calls: list[float] = []
    done = threading.Event()

    def release() -> None:
        calls.append(time.monotonic())
        done.set()

    releaser = lib.IdleRelease(release, after_s=0.2)
    releaser.busy()
    time.sleep(0.4)
    assert calls == []  # nothing before a cell has ended
    releaser.idle()
    releaser.busy()  # the next cell starts in time: no release
    time.sleep(0.4)
    assert calls == []
    ended = time.monotonic()
    releaser.idle()
    assert done.wait(5)
    assert calls[0] - ended >= 0.19
    time.sleep(0.4)
    assert len(calls) == 1  # once per idle period, not every after_s


def test_the_release_survives_a_failing_release_and_glibc_trim_is_found() -> None:
    lib = load_lib()
    attempts: list[int] = []

    def release() -> None:
        attempts.append(1)
        raise RuntimeError("boom")

    releaser = lib.IdleRelease(release, after_s=0.05)
    for _ in range(2):
        releaser.idle()
        time.sleep(0.3)
    assert len(attempts) == 2
    assert lib.glibc_trim() is not None  # the kernels run on glibc, as this test does
