"""No overcommit: a kernel starts only while the sum of kernel memory limits fits a budget.

A kernel's footprint is everything it may hold in RAM: its address-space limit
(``kernels.memory_bytes``) plus its three tmpfs (``tmp_bytes``, ``shm_bytes``, ``work_bytes``;
tmpfs pages are memory). Warm spares count: they are running kernels. The budget is
``kernels.memory_budget_bytes``, by default 75% of the machine's RAM.
"""

from __future__ import annotations

from ..config import KernelSettings
from ..errors import LimitExceeded

DEFAULT_SHARE = 0.75
GiB = 1 << 30


def machine_memory() -> int:
    """MemTotal of this machine, in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def kernel_footprint(k: KernelSettings) -> int:
    return k.memory_bytes + k.tmp_bytes + k.shm_bytes + k.work_bytes


def budget_bytes(k: KernelSettings) -> int:
    if k.memory_budget_bytes is not None:
        return k.memory_budget_bytes
    return int(machine_memory() * DEFAULT_SHARE)


class MemoryBudget:
    """Reservations of whole kernel footprints, by kernel id."""

    def __init__(self, k: KernelSettings) -> None:
        self.each = kernel_footprint(k)
        self.limit = budget_bytes(k)
        self.held: set[str] = set()

    @property
    def capacity(self) -> int:
        """How many kernels fit at once."""
        return self.limit // self.each

    def has_room(self) -> bool:
        return len(self.held) < self.capacity

    def reserve(self, kernel_id: str) -> None:
        if not self.has_room():
            raise LimitExceeded(
                f"the server's kernel memory budget is in use ({len(self.held)} kernels of up to "
                f"{self.each / GiB:.1f} GiB each fill {self.limit / GiB:.1f} GiB) - try again in "
                "a few minutes, or reset_kernel a notebook you no longer need"
            )
        self.held.add(kernel_id)

    def release(self, kernel_id: str) -> None:
        self.held.discard(kernel_id)

    def describe(self) -> str:
        return (
            f"memory budget {self.limit / GiB:.1f} GiB, {self.each / GiB:.2f} GiB per kernel "
            f"(memory + /tmp + /dev/shm + /sandbox): at most {self.capacity} kernels at once"
        )
