"""The floor: a plain local ipykernel driven by jupyter_client, no MCP, no sandbox.

It uses the IPC (Unix socket) transport, as dataref's kernels do.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager


class RawKernel:
    """A started local kernel; ``round_trips(n)`` times ``execute_interactive("pass")``."""

    def __init__(self) -> None:
        self.rundir = tempfile.mkdtemp(prefix="bench-raw-")
        started = time.perf_counter()
        self.km = KernelManager(
            kernel_name="python3", transport="ipc", ip=str(Path(self.rundir) / "k")
        )
        self.km.connection_file = str(Path(self.rundir) / "conn.json")
        self.km.start_kernel()
        self.kc: Any = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=120)
            self.kc.execute_interactive("pass", timeout=60)
        except BaseException:
            self.close()
            raise
        self.cold_start = time.perf_counter() - started

    def round_trips(self, n: int) -> list[float]:
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.kc.execute_interactive("pass", timeout=60)
            samples.append(time.perf_counter() - t0)
        return samples

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        shutil.rmtree(self.rundir, ignore_errors=True)


def raw_kernel_round_trips(calls: int = 200, warmup: int = 20) -> dict[str, list[float]]:
    """Seconds of ``kc.execute_interactive("pass")``, plus the cold start (launch -> first
    reply) of the same kernel for reference."""
    kernel = RawKernel()
    try:
        kernel.round_trips(warmup)
        return {"round_trip": kernel.round_trips(calls), "cold_start": [kernel.cold_start]}
    finally:
        kernel.close()
