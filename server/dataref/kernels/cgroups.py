"""cgroup v2 delegation: can this (unprivileged) server give kernels cgroup limits?

A delegated cgroup is a cgroup v2 directory the server's user owns, with the ``memory`` and
``pids`` controllers available (a systemd user scope started with ``Delegate=yes``, or a
subtree an administrator chowned). Without one, the fallback is RLIMIT_NPROC (counted per user
namespace, so per kernel), RLIMIT_AS per process and the pool's memory budget.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

NEEDED = ("memory", "pids")
FIX = "`systemd-run --user --scope -p Delegate=yes dataref serve` (cgroup v2 with systemd)"


@dataclass(frozen=True)
class Delegation:
    path: Path | None  # the delegated cgroup, or None
    why: str = ""
    fix: str = FIX


def cgroup2_mount(mountinfo: str) -> Path | None:
    """Where cgroup v2 is mounted (``/sys/fs/cgroup``, or ``.../unified`` on hybrid hosts)."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def detect_delegation(mountinfo: str | None = None, proc_cgroup: str | None = None) -> Delegation:
    mountinfo = mountinfo if mountinfo is not None else _read("/proc/self/mountinfo")
    proc_cgroup = proc_cgroup if proc_cgroup is not None else _read("/proc/self/cgroup")
    mount = cgroup2_mount(mountinfo)
    if mount is None:
        return Delegation(None, "cgroup v2 is not mounted (cgroup v1 only)")
    path = own_cgroup(proc_cgroup)
    if path is None:
        return Delegation(None, "this process has no cgroup v2 membership")
    cgroup = mount / path.lstrip("/")
    available = _read(str(cgroup / "cgroup.controllers")).split()
    missing = [name for name in NEEDED if name not in available]
    if missing:
        return Delegation(
            None,
            f"cgroup v2 at {mount} offers no {'/'.join(missing)} controller here "
            "(a v1/v2 hybrid, or the controllers are not delegated)",
        )
    if not os.access(cgroup, os.W_OK) or not os.access(cgroup / "cgroup.procs", os.W_OK):
        return Delegation(None, f"{cgroup} is not writable by this user (not delegated)")
    return Delegation(cgroup)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


class KernelCgroups:
    """Per-kernel cgroups in a delegated cgroup v2: ``memory.max`` (the kernel's footprint:
    tmpfs pages are charged too) and ``pids.max``, so a fork bomb or a memory hog meets the
    kernel's own cgroup. Layout under the delegated cgroup D::

        D/dataref-server/    the server moves here (a cgroup that holds processes cannot
                             hand controllers to its children)
        D/dataref-kernels/<kernel_id>/   one per kernel; its launcher enters it before bwrap
    """

    def __init__(self, delegated: Path) -> None:
        self.root = delegated
        self.kernels = delegated / "dataref-kernels"
        self._prepared = False

    def prepare(self) -> None:
        if self._prepared:
            return
        server = self.root / "dataref-server"
        server.mkdir(exist_ok=True)
        (server / "cgroup.procs").write_text(str(os.getpid()))
        (self.root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in NEEDED))
        self.kernels.mkdir(exist_ok=True)
        (self.kernels / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in NEEDED))
        self._prepared = True

    def create(self, kernel_id: str, memory_bytes: int, pids: int) -> Path:
        """The kernel's cgroup (kept across restarts of the same kernel)."""
        self.prepare()
        path = self.kernels / kernel_id
        path.mkdir(exist_ok=True)
        (path / "memory.max").write_text(str(memory_bytes))
        (path / "pids.max").write_text(str(pids))
        return path

    def enter_argv(self, path: Path) -> list[str]:
        """A launcher prefix: every process bwrap forks starts inside the cgroup."""
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(path)]

    def remove(self, kernel_id: str) -> None:
        with contextlib.suppress(OSError):  # EBUSY while a process lingers: left for later
            (self.kernels / kernel_id).rmdir()


_delegated: dict[str, KernelCgroups | None] = {}


def kernel_cgroups() -> KernelCgroups | None:
    """This server's KernelCgroups when a delegated cgroup v2 exists, probed once."""
    if "found" not in _delegated:
        delegation = detect_delegation()
        _delegated["found"] = KernelCgroups(delegation.path) if delegation.path else None
    return _delegated["found"]
