"""The floor: a plain local ipykernel driven by jupyter_client, no MCP, no sandbox.

It uses the IPC (Unix socket) transport, as dataref's kernels do.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from jupyter_client.manager import KernelManager


def raw_kernel_round_trips(calls: int = 200, warmup: int = 20) -> dict[str, list[float]]:
    """Seconds of ``kc.execute_interactive("pass")``, plus the cold start (launch -> first
    reply) of the same kernel for reference."""
    rundir = tempfile.mkdtemp(prefix="bench-raw-")
    started = time.perf_counter()
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(rundir) / "k"))
    km.connection_file = str(Path(rundir) / "conn.json")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        kc.execute_interactive("pass", timeout=60)
        cold = time.perf_counter() - started
        for _ in range(warmup):
            kc.execute_interactive("pass", timeout=60)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            kc.execute_interactive("pass", timeout=60)
            samples.append(time.perf_counter() - t0)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        import shutil

        shutil.rmtree(rundir, ignore_errors=True)
    return {"round_trip": samples, "cold_start": [cold]}
