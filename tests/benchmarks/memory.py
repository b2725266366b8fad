"""Peak memory (VmHWM) of a server process and everything it started, read from /proc.

Kernels run under bwrap (bwrap -> bwrap -> python), so they are found by walking the process
tree down from the server pid. VmHWM is the peak RSS over a process's life; a background
thread samples it every ``interval`` seconds and keeps the last value seen per pid, so a
process that exits between samples loses at most its last ``interval`` of growth.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_MARKERS = ("ipykernel", "seed_runner")


def _stat_ppid(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    return int(text[text.rfind(")") + 2 :].split()[1])


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        ppid = _stat_ppid(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def children_matching(parent: int, marker: str) -> list[int]:
    """Direct children of ``parent`` whose command line contains ``marker``."""
    return [p for p in _all_pids() if _stat_ppid(p) == parent and marker in cmdline(p)]


def argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def cmdline(pid: int) -> str:
    return " ".join(argv(pid))


def is_worker(pid: int) -> bool:
    """A kernel or seed runner: a python whose own arguments name it (not the bwrap wrapper,
    whose argv also contains 'ipykernel')."""
    args = argv(pid)
    if not args or "python" not in os.path.basename(args[0]):
        return False
    return any(m in a for a in args[1:4] for m in KERNEL_MARKERS)


def vm_hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class MemoryPeaks:
    server_mib: float = 0.0
    kernel_max_mib: float = 0.0  # the largest single kernel (or seed runner) process
    kernels_seen: int = 0


@dataclass
class PeakSampler:
    """Samples the tree under ``root`` until ``stop()``; ``peaks()`` summarises it."""

    root: int
    interval: float = 0.1
    _hwm: dict[int, tuple[bool, int]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> PeakSampler:
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-sampler")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        for pid in [self.root, *descendants(self.root)]:
            hwm = vm_hwm_kib(pid)
            if hwm is None:
                continue
            known = self._hwm.get(pid)
            is_kernel = known[0] if known else is_worker(pid)
            self._hwm[pid] = (is_kernel, max(hwm, known[1] if known else 0))

    def stop(self) -> MemoryPeaks:
        self.sample()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peaks()

    def peaks(self) -> MemoryPeaks:
        kernels = [kib for pid, (k, kib) in self._hwm.items() if k and pid != self.root]
        server = self._hwm.get(self.root, (False, 0))[1]
        return MemoryPeaks(
            server_mib=server / 1024,
            kernel_max_mib=max(kernels, default=0) / 1024,
            kernels_seen=len(kernels),
        )


def cpu_ticks(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def workers(root: int) -> list[int]:
    return [pid for pid in descendants(root) if is_worker(pid)]


def wait_workers_idle(root: int, count: int, timeout: float = 120, quiet: float = 0.4) -> bool:
    """Wait until ``root`` has at least ``count`` kernels and none used CPU for ``quiet``
    seconds: a started spare kernel sits idle. (The pool's readiness is not visible over MCP.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = workers(root)
        before = {pid: cpu_ticks(pid) for pid in pids}
        time.sleep(quiet)
        if len(pids) >= count and all(cpu_ticks(pid) == t for pid, t in before.items()):
            return True
    return False


def cpu_seconds(root: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by ``root`` itself and by its kernels."""
    tick = os.sysconf("SC_CLK_TCK")
    own = cpu_ticks(root) or 0
    kernels = sum(cpu_ticks(pid) or 0 for pid in workers(root))
    return own / tick, kernels / tick
