"""``python -m tests.benchmarks.gateways``: kernels on a Jupyter gateway against local kernels.

1. Staging a fresh 1M x 10 artifact (5 int64 + 5 float64 columns, ~76 MiB of Arrow) into a
   kernel, and binding it as a DataFrame, on a local kernel (hard link + memory map) and on
   Kernel Gateway / Enterprise Gateway kernels (binary comm buffers in 4 MiB chunks), against
   the in-process Arrow read of the same file. Target: gateway staging <= 0.5 s.
2. Warm per-call overhead of ``run_python`` (``result = 1``) through a real MCP client on each
   backend. Target: a gateway <= 2x the local backend.

The gateways are the real programs (tests/gateways/setup.sh installs them); writes
tests/benchmarks/results/gateways.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from fastmcp import Client

from dataref.app import create_app
from dataref.compute import HEADER_PREFIX
from dataref.config import Settings
from dataref.kernels import KernelPool
from dataref.store import ArtifactStore

from ..gateways.servers import GatewaySet
from .fmt import ms

RESULTS = Path(__file__).with_name("results")
ROWS, REPS, CALLS = 1_000_000, 3, 40
OWNER = "analyst"
BACKENDS = ("local", "kg", "eg")


def table() -> pa.Table:
    rng = np.random.default_rng(1)
    cols = {f"i{n}": rng.integers(0, 1 << 40, ROWS) for n in range(5)}
    cols |= {f"f{n}": rng.random(ROWS) for n in range(5)}
    return pa.table(cols)


def settings_for(backend: str, work: Path, gateways: GatewaySet) -> Settings:
    kernels: dict[str, Any] = {"warm_spares": 0, "uid_base": 64700, "uid_count": 50}
    if backend != "local":
        gateway = gateways.get(backend)
        kernels |= {"gateway_url": gateway.url, "gateway_token": gateway.token}
    return Settings(state_dir=work / backend, owner=OWNER, kernels=kernels)


def in_process(path: Path) -> dict[str, float]:
    """The baseline: the same file read by Arrow in this process (memory map, and a copy)."""
    mapped, copied = [], []
    for _ in range(REPS):
        began = time.perf_counter()
        pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        mapped.append(time.perf_counter() - began)
        began = time.perf_counter()
        with pa.OSFile(str(path)) as f:
            pa.ipc.open_file(pa.py_buffer(f.read())).read_all()
        copied.append(time.perf_counter() - began)
    return {"mapped": statistics.median(mapped), "copied": statistics.median(copied)}


async def staging(all_settings: dict[str, Settings], data: pa.Table) -> dict[str, Any]:
    """Per backend, median over fresh artifacts: stage alone, and stage + bind + a trivial
    cell. The backends take turns, so the machine's load falls on all of them alike."""
    stores = {b: ArtifactStore(s.state_dir / "store", s.store) for b, s in all_settings.items()}
    pools = {b: KernelPool(s) for b, s in all_settings.items()}
    found: dict[str, dict[str, list[float]]] = {b: {"stage": [], "bind": []} for b in pools}
    try:
        kernels = {}
        for backend, pool in pools.items():
            await pool.start()
            kernels[backend] = await pool.kernel(OWNER, "bench")
            await kernels[backend].execute("x = 1", timeout_s=60)
        for n in range(REPS):
            for backend, kernel in kernels.items():
                store = stores[backend]
                ref = store.put_table(OWNER, data, lineage={}).ref
                began = time.perf_counter()
                await kernel.stage(store, OWNER, [ref])
                staged = time.perf_counter()
                header = HEADER_PREFIX + json.dumps({"cell": f"b{n}", "bind": {f"t{n}": ref}})
                result = await kernel.execute(f"{header}\nresult = len(t{n})", timeout_s=120)
                done = time.perf_counter()
                assert result.status == "ok", result.error
                found[backend]["stage"].append(staged - began)
                found[backend]["bind"].append(done - began)
    finally:
        for pool in pools.values():
            await pool.close()
        for store in stores.values():
            store.close()
    return {b: {k: statistics.median(v) for k, v in f.items()} for b, f in found.items()}


async def per_call(all_settings: dict[str, Settings]) -> dict[str, Any]:
    """Warm run_python calls through in-memory MCP clients, the backends taking turns."""
    times: dict[str, list[float]] = {b: [] for b in all_settings}
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            b: await stack.enter_async_context(Client(create_app(s, "memory")))
            for b, s in all_settings.items()
        }
        for n in range(CALLS + 5):
            for backend, client in clients.items():
                began = time.perf_counter()
                out = await client.call_tool("run_python", {"code": "result = 1"})
                if n >= 5:  # the first calls start the kernels
                    times[backend].append(time.perf_counter() - began)
                assert out.structured_content["result"] == 1
    found = {}
    for backend, values in times.items():
        values.sort()
        found[backend] = {
            "p50": statistics.median(values),
            "p95": values[int(0.95 * len(values)) - 1],
        }
    return found


async def run(work: Path) -> dict[str, Any]:
    data = table()
    gateways = GatewaySet(work / "gateways")
    results: dict[str, Any] = {"rows": ROWS}
    try:
        all_settings = {b: settings_for(b, work, gateways) for b in BACKENDS}
        stage = await staging(all_settings, data)
        calls = await per_call(all_settings)
        results["backends"] = {b: stage[b] | calls[b] for b in BACKENDS}
        store = ArtifactStore(work / "base", Settings(state_dir=work / "base").store)
        art = store.put_table(OWNER, data, lineage={})
        results["bytes"] = art.bytes
        results["in_process"] = in_process(Path(art.path))
        store.close()
    finally:
        gateways.stop_all()
    return results


def render(results: dict[str, Any]) -> str:
    b, base = results["backends"], results["in_process"]
    local = b["local"]
    lines = [
        "# Kernels on a Jupyter gateway",
        "",
        f"A fresh {results['rows']:,} x 10 artifact ({results['bytes'] / 2**20:.1f} MiB of Arrow) "
        "staged into a warm kernel, median of 3; `run_python` warm per-call time through an "
        f"in-memory MCP client, {CALLS} calls. In-process Arrow read of the same file: "
        f"{ms(base['mapped'])} memory-mapped, {ms(base['copied'])} read into memory. "
        "The backends take turns, so the machine's load falls on all alike.",
        "",
        "| backend | stage | stage + bind + cell | vs in-process read | per call p50 | p95 "
        "| per call vs local |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("local", "local kernel"),
        ("kg", "Kernel Gateway"),
        ("eg", "Enterprise Gateway"),
    ):
        r = b[name]
        lines.append(
            f"| {label} | {ms(r['stage'])} | {ms(r['bind'])} | "
            f"{r['stage'] / base['copied']:.1f}x | {ms(r['p50'])} | {ms(r['p95'])} | "
            f"{r['p50'] / local['p50']:.2f}x |"
        )
    worst_stage = max(b["kg"]["stage"], b["eg"]["stage"])
    worst_ratio = max(b["kg"]["p50"], b["eg"]["p50"]) / local["p50"]
    lines += [
        "",
        f"Targets: gateway staging <= 0.5 s: {ms(worst_stage)} "
        f"({'met' if worst_stage <= 0.5 else 'NOT met'}); gateway per-call <= 2x local: "
        f"{worst_ratio:.2f}x ({'met' if worst_ratio <= 2 else 'NOT met'}).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="dataref-gwbench-"))
    try:
        results = asyncio.run(run(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = render(results)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gateways.md").write_text(text)
    (RESULTS / "gateways.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
