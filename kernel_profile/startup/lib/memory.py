"""The kernel keeps the memory its code freed while it works, and gives it back when idle.

Why: a page a process touches for the first time costs a page fault and zeroing, and on a
virtual machine often a fault in the host too: on the benchmark machine, touching 400 MB of
fresh memory takes 0.1-1 s, reusing it a tenth of that. pandas on millions of rows allocates
and frees hundreds of MB per call (40 MB per column of 5M int64), and glibc hands every
block over 32 MB back to the system on free() (mmap/munmap), so every call of an agent's
session faulted all of it in again.

How: the sandbox starts the kernel with ``GLIBC_TUNABLES`` (``MALLOC_TUNABLES`` in
dataref.kernels.bwrap) that serve every allocation from the heap and never trim it on
free(), so the next call reuses the pages, and with ``ARROW_DEFAULT_MEMORY_POOL=system``,
which sends Arrow's allocations (a column with nulls converted for pandas, say) to that same
heap: Arrow's default pool, mimalloc, hands freed pages back within milliseconds. This
module's thread calls ``malloc_trim(0)`` once the kernel has been idle for ``IDLE_SECONDS``,
so a kernel left alone returns what it no longer uses. Peak memory is unchanged (the same
allocations, reused); a kernel's footprint stays bounded by its RLIMIT_AS, which the
server's memory budget already reserves in full.

Loaded by 00-dataref.py by path (like convert.py).
"""

import contextlib
import ctypes
import threading
import time

IDLE_SECONDS = 60.0


class IdleRelease:
    """Calls ``release`` once after the kernel has been idle ``after_s`` seconds."""

    def __init__(self, release, after_s=IDLE_SECONDS):
        self._release = release
        self._after = after_s
        self._due = None
        self._cv = threading.Condition()
        thread = threading.Thread(target=self._run, name="dataref-idle-release", daemon=True)
        thread.start()

    def busy(self, *_):
        """A cell starts: nothing is released while it runs."""
        with self._cv:
            self._due = None

    def idle(self, *_):
        """A cell ended: release after ``after_s`` unless another starts first."""
        with self._cv:
            self._due = time.monotonic() + self._after
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while self._due is None or self._due > time.monotonic():
                    left = None if self._due is None else self._due - time.monotonic()
                    self._cv.wait(left)
                self._due = None
            # never let the thread die: the next idle period tries again
            with contextlib.suppress(Exception):
                self._release()


def glibc_trim():
    """``malloc_trim(0)`` of the C library, or None where there is none (not glibc)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


def install(shell, pa, after_s=IDLE_SECONDS):
    """Register the idle release on the shell's cell events; returns it (None without glibc)."""
    trim = glibc_trim()
    if trim is None:
        return None

    def release():
        trim()
        pa.default_memory_pool().release_unused()

    releaser = IdleRelease(release, after_s)
    shell.events.register("pre_run_cell", releaser.busy)
    shell.events.register("post_run_cell", releaser.idle)
    return releaser
