"""``python -m tests.benchmarks.bench_ledger``: what recording every reply costs per call.

The same in-memory server with and without the exposure middleware (measure, attribute,
budget check, a durable ledger append with ``synchronous=FULL``), alternating rounds so both
see the same machine load. Prints a table with the median per-call latency and the ratio.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastmcp import Client

from dataref.app import create_app
from dataref.config import load_settings
from dataref.edge import ExposureMiddleware

CALLS = 100
ROUNDS = 3


def server(state: Path, ledger: bool) -> Any:
    mcp = create_app(load_settings(state_dir=state), "memory", kernels=False)
    if not ledger:
        mcp.middleware[:] = [m for m in mcp.middleware if not isinstance(m, ExposureMiddleware)]
    return mcp


async def per_call(mcp: Any, tool: str, args: dict[str, Any]) -> list[float]:
    times = []
    async with Client(mcp) as client:
        await client.call_tool_mcp(tool, args)  # warm
        for _ in range(CALLS):
            started = time.perf_counter()
            await client.call_tool_mcp(tool, args)
            times.append(time.perf_counter() - started)
    return times


async def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="dataref-bench-ledger-"))
    cases = {
        "list_artifacts": {},
        "fetch_sales (North, December)": {"since": "2025-12-01", "region": "North"},
    }
    print("| call | without ledger (ms) | with ledger (ms) | ratio |\n|---|---|---|---|")
    for label, args in cases.items():
        tool = label.split()[0]
        runs: dict[bool, list[float]] = {False: [], True: []}
        for i in range(ROUNDS):
            for ledger in (False, True):
                runs[ledger] += await per_call(server(work / f"{i}-{ledger}", ledger), tool, args)
        off, on = (statistics.median(runs[k]) * 1000 for k in (False, True))
        print(f"| {label} | {off:.2f} | {on:.2f} | {on / off:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
