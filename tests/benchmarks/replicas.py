"""``python -m tests.benchmarks.replicas``: 8 owners x 25 calls through HAProxy, 1/2/3 replicas.

Each owner is an agent making one ``run_python`` call at a time on its default notebook; the
8 owners run at once. The deployment is the real one of tests/replica_cluster.py: PostgreSQL
state, a shared blob directory, N ``dataref serve --http`` replicas, HAProxy round-robin.
Reported per N: calls/s, p50/p95 latency, errors, and CPU seconds per call of the replicas,
their kernels, and PostgreSQL + HAProxy, with the CPU bound (cores / CPU per call) beside it.
Every replica count is measured in the same run, so the ratios compare like with like.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from fastmcp import Client

from tests.replica_cluster import Cluster

OWNERS = 8
CALLS = 25
CODE = "result = 1"
RESULTS = Path(__file__).with_name("results") / "replicas.md"


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


def split_cpu(cluster: Cluster) -> dict[str, float]:
    """CPU so far of the replicas themselves, their kernels, and PostgreSQL + HAProxy."""
    servers = kernels = 0.0
    for replica in cluster.replicas:
        if replica.proc is None:
            continue
        own = psutil.Process(replica.proc.pid).cpu_times()
        servers += own.user + own.system
        kernels += tree_cpu([replica.proc.pid]) - (own.user + own.system)
    others = 0.0
    if cluster.pg is not None:  # this cluster's postmaster and its backends
        pid_file = cluster.pg.root / "data" / "postmaster.pid"
        others += tree_cpu([int(pid_file.read_text().split()[0])])
    if cluster.haproxy is not None:
        others += tree_cpu([cluster.haproxy.pid])
    return {
        "server": servers,
        "kernel": kernels,
        "pg+haproxy": others,
        "clients": time.process_time(),  # the 8 MCP clients (this process)
    }


async def owner(url: str, token: str, latencies: list[float], errors: list[str]) -> None:
    async with Client(f"{url}/mcp", auth=token, timeout=120) as client:
        await client.call_tool("run_python", {"code": CODE})  # its notebook's kernel, started
        for _ in range(CALLS):
            started = time.perf_counter()
            try:
                out = (await client.call_tool("run_python", {"code": CODE})).structured_content
                if not out.get("ok"):
                    errors.append(str(out.get("error"))[:200])
            except Exception as exc:  # counted, and the owner goes on
                errors.append(repr(exc)[:200])
                continue
            latencies.append(time.perf_counter() - started)


async def measure(replicas: int) -> dict[str, Any]:
    tokens = {f"tok-{i}": f"owner{i}" for i in range(OWNERS)}
    cluster = await asyncio.to_thread(lambda: Cluster(replicas, tokens).start())
    try:
        latencies: list[float] = []
        errors: list[str] = []
        # warm-up: every owner's kernel on every replica (round-robin spreads the calls)
        await asyncio.gather(*(owner_warmup(cluster.url, t, replicas) for t in tokens))
        before = split_cpu(cluster)
        started = time.perf_counter()
        await asyncio.gather(*(owner(cluster.url, t, latencies, errors) for t in tokens))
        wall = time.perf_counter() - started
        after = split_cpu(cluster)
    finally:
        await asyncio.to_thread(cluster.stop)
    calls = OWNERS * CALLS
    cpu = {k: (after[k] - before[k]) / calls for k in after}
    # the CPU of the warm-up call each owner makes inside ``owner`` is counted too: 8 of 208
    return {
        "replicas": replicas,
        "calls_per_s": calls / wall,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p95_ms": 1000 * statistics.quantiles(latencies, n=20)[18] if latencies else float("nan"),
        "errors": len(errors),
        "cpu_per_call_ms": {k: 1000 * v for k, v in cpu.items()},
        # the machine's cores over the CPU one call costs (clients included: same machine)
        "bound_calls_per_s": (os.cpu_count() or 1) / max(sum(cpu.values()), 1e-9),
    }


async def owner_warmup(url: str, token: str, replicas: int) -> None:
    async with Client(f"{url}/mcp", auth=token, timeout=120) as client:
        for _ in range(replicas * 3):
            await client.call_tool("run_python", {"code": CODE})


def table(rows: list[dict[str, Any]]) -> str:
    base = rows[0]["calls_per_s"]
    lines = [
        f"8 owners x {CALLS} `run_python` calls at once through HAProxy "
        f"({os.cpu_count()} cores; PostgreSQL state; one run of `make bench`).",
        "",
        "| replicas | calls/s | vs 1 | p50 ms | p95 ms | errors | CPU ms/call server | kernel "
        "| pg+haproxy | clients | CPU bound calls/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cpu_per_call_ms"]
        lines.append(
            f"| {r['replicas']} | {r['calls_per_s']:.1f} | {r['calls_per_s'] / base:.2f}x "
            f"| {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['errors']} | {c['server']:.1f} "
            f"| {c['kernel']:.1f} | {c['pg+haproxy']:.1f} | {c['clients']:.1f} "
            f"| {r['bound_calls_per_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    rows = [asyncio.run(measure(n)) for n in (1, 2, 3)]
    text = table(rows)
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("# Replicas behind a load balancer\n\n" + text)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
