"""Host uids for kernels, and the host's processes by uid.

Each kernel runs as its own unprivileged host uid: RLIMIT_NPROC counts every process of a uid,
so a shared uid would let one kernel starve another.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path


class UidAllocator:
    """Hands out host uids from ``uid_base`` .. ``uid_base + uid_count - 1``, one per kernel.

    A uid that names a host account or still owns a process (a kernel of a crashed server) is
    skipped: RLIMIT_NPROC counts every process of the uid, and sharing it would let kernels
    starve each other.
    """

    def __init__(self, base: int, count: int) -> None:
        self.base, self.count = base, count
        self.in_use: set[int] = set()

    def allocate(self) -> int:
        busy = _uids_with_processes()
        for uid in range(self.base, self.base + self.count):
            if uid in self.in_use or uid in busy or _is_account(uid):
                continue
            self.in_use.add(uid)
            return uid
        raise OSError(
            f"no free kernel uid in {self.base}..{self.base + self.count - 1} - raise "
            "kernels.uid_count or stop kernels"
        )

    def release(self, uid: int | None) -> None:
        if uid is not None:
            self.in_use.discard(uid)


def _is_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _uids_with_processes() -> set[int]:
    return {uid for _, uid in processes()}


def processes() -> list[tuple[int, int]]:
    """(pid, real uid) of every process on the host."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"{entry.path}/status") as status,
        ):
            for line in status:
                if line.startswith("Uid:"):
                    found.append((int(entry.name), int(line.split()[1])))
                    break
    return found


def is_socket_of(path: Path, uid: int | None) -> bool:
    """A real socket (not a symlink planted by the kernel), created by the kernel's uid."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(info.st_mode) and (uid is None or info.st_uid == uid)
