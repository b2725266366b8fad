"""cgroup v2 delegation: can this (unprivileged) server give kernels cgroup limits?

A delegated cgroup is a cgroup v2 directory the server's user owns, with the ``memory`` and
``pids`` controllers available (a systemd user scope started with ``Delegate=yes``, or a
subtree an administrator chowned). Without one, the fallback is RLIMIT_NPROC (counted per user
namespace, so per kernel), RLIMIT_AS per process and the pool's memory budget.
"""

from __future__ import annotations

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
