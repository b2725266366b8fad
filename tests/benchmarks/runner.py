"""Runs every workload against every server and returns the raw numbers (a JSON-able dict)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dataref.config import load_settings
from dataref.producers.demo import DEMO_ROWS, ensure_demo_database

from .clients import Meter, ServerSpec, comparator_spec, dataref_spec, stdio_server
from .concurrency import multi_owner
from .data import cache_dir, load_sales, sales_path, wide_path
from .diagnostics import server_side
from .memory import PeakSampler, cpu_seconds, wait_workers_idle, workers
from .modes import sandbox_modes
from .naive_server import rows_json_bytes
from .profile import profile_calls
from .rawkernel import raw_kernel_round_trips
from .sources import sql_sources
from .workloads import (
    SCALES,
    Scale,
    SessionRun,
    article_session,
    bind_memory,
    compare_qoq,
    inproc_mmap_reads,
    long_beside_short,
    long_notebook,
    side_by_side,
    staging,
    trivial_calls,
)

SERVERS = ("dataref", "seed", "naive")
SESSION_REPS = {"50k": 5, "1M": 3, "5M": 3}
TRIVIAL_CALLS = 50
LONG_NOTEBOOK_CALLS = 1000
PROFILE_CALLS = 200
STAGING = {"rows": 1_000_000, "cols": 10, "reps": 8}
COMPUTE_REPS = 5


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def session_summary(runs: list[SessionRun]) -> dict[str, Any]:
    last = runs[-1]
    text_steps = [s for s in ("fetch", "qoq", "chain") if s in last.steps]
    return {
        "seconds": [r.seconds for r in runs],
        "rows": last.rows,
        "step_bytes": last.step_bytes(),
        "step_seconds": {k: [r.steps[k].seconds for r in runs] for k in last.steps},
        "bytes": sum(last.steps[s].bytes for s in text_steps),
        "chart_image_bytes": last.steps["chart"].image_bytes if "chart" in last.steps else None,
        "result": last.steps["qoq"].data.get("result") if "qoq" in last.steps else None,
    }


def naive_bytes(rows: int, cache: Path) -> int:
    """The naive fetch's JSON size for a big table, computed (not sent), cached by row count."""
    memo = cache / f"naive-bytes-{rows}.json"
    if memo.is_file():
        return int(json.loads(memo.read_text())["bytes"])
    size = rows_json_bytes(load_sales(rows))
    memo.write_text(json.dumps({"rows": rows, "bytes": size}))
    return size


def spec_for(name: str, scale: Scale, work: Path, cache: Path) -> ServerSpec:
    if name == "dataref":
        state = work / f"state-{scale.label}"
        # The demo database is built on first use; build it now, as setup, not in a session.
        ensure_demo_database(load_settings(state_dir=state).demo_db_path)
        return dataref_spec(state, cache, plugins=scale.label != "50k")
    return comparator_spec(name, cache)


async def extras(
    name: str, scale: Scale, meter: Meter, sampler: PeakSampler, runs: list[SessionRun]
) -> dict[str, Any]:
    """The workloads that run on one server after its sessions."""
    out: dict[str, Any] = {}
    if name == "naive":
        return out
    if scale.label == "50k":
        log(f"{name}: {TRIVIAL_CALLS} trivial calls")
        cpu_before = cpu_seconds(sampler.root)
        out["per_call"] = await trivial_calls(meter, TRIVIAL_CALLS)
        cpu_after = cpu_seconds(sampler.root)
        # CPU per call of the server and of its kernels (seed: its runners are gone by now).
        out["per_call_cpu"] = [
            (b - a) / TRIVIAL_CALLS for a, b in zip(cpu_before, cpu_after, strict=True)
        ]
        if name == "dataref":  # the MCP round trip of a tool that does no kernel work
            out["mcp_floor"] = [(await meter.call("list_artifacts")).seconds for _ in range(30)]
            log("dataref: trivial calls, no-kernel calls and raw round trips, interleaved")
            out["side_by_side"] = await side_by_side(meter)
            log(f"dataref: {LONG_NOTEBOOK_CALLS} trivial calls in one new notebook")
            kernels = len(workers(sampler.root)) + 1  # the spare taken is replaced

            async def settle() -> None:
                await asyncio.to_thread(wait_workers_idle, sampler.root, kernels)

            out["long_notebook"], handle = await long_notebook(meter, LONG_NOTEBOOK_CALLS, settle)
            log("dataref: the long notebook beside a 10-cell one, calls alternating")
            kernels += 1  # the short notebook takes the spare, which is replaced again
            out["long_beside_short"] = await long_beside_short(meter, handle, settle)
    if scale.label == "1M":
        log(f"{name}: staging a 1M x 10 artifact")
        out["staging"] = await staging(meter, STAGING["rows"], STAGING["cols"], STAGING["reps"])
    if scale.label == "5M" and name == "dataref":
        ref = runs[-1].steps["fetch"].data["dataRef"]
        log("dataref: a fresh kernel's memory before and after binding the 5M input")
        out["bind_memory"] = await bind_memory(meter, ref)
        log("dataref: QoQ on the bound 5M input, alternating with in-process pandas")
        out["qoq"] = await compare_qoq(meter, ref, sales_path(5_000_000), COMPUTE_REPS)
    return out


async def bench_server(name: str, scale: Scale, work: Path, cache: Path) -> dict[str, Any]:
    spec = spec_for(name, scale, work, cache)
    log(f"{name} @ {scale.label}: start")
    async with stdio_server(spec, work / f"{name}-{scale.label}.log") as (meter, sampler):
        tools = {t.name for t in await meter.client.list_tools()}
        out: dict[str, Any] = {"tools": sorted(tools)}
        if scale.label == "50k":
            out["tools_list_bytes"], out["tools_list_per_tool"] = await meter.tools_json_bytes()
        if name == "dataref":  # sessions start on a running server: its warm spare is up
            await asyncio.to_thread(wait_workers_idle, sampler.root, 1)
        runs = []
        for rep in range(SESSION_REPS[scale.label]):
            runs.append(await article_session(meter, scale, tools))
            log(f"{name} @ {scale.label}: session {rep + 1} {runs[-1].seconds:.2f}s")
        out["session"] = session_summary(runs)
        out.update(await extras(name, scale, meter, sampler, runs))
    out["memory"] = sampler.peaks().__dict__
    if name == "dataref":
        out["notebook_cells"] = notebook_cells(work / f"state-{scale.label}")
    return out


def notebook_cells(state: Path) -> int:
    """Cells in the largest transcript the server wrote (each call adds one)."""
    counts = [len(json.loads(p.read_text())["cells"]) for p in state.glob("notebooks/*.ipynb")]
    return max(counts, default=0)


async def bench_scales(
    scales: list[Scale], servers: list[str], work: Path, cache: Path
) -> dict[str, Any]:
    results: dict[str, Any] = {name: {} for name in servers}
    for scale in scales:
        for name in servers:
            if name == "naive" and scale.label != "50k":
                # Sending 1M+ rows as JSON through MCP is what nobody can afford: size only.
                log(f"naive @ {scale.label}: computing the JSON size")
                results[name][scale.label] = {
                    "session": {
                        "bytes": naive_bytes(scale.rows, cache),
                        "rows": scale.rows,
                        "computed": True,
                    }
                }
                continue
            try:
                results[name][scale.label] = await bench_server(name, scale, work, cache)
            except Exception as exc:  # keep the other measurements; the report names it
                log(f"{name} @ {scale.label}: FAILED: {exc}")
                results[name][scale.label] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    return results


def in_process(scales: list[Scale]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if any(s.label == "1M" for s in scales):
        wide = wide_path(STAGING["rows"], STAGING["cols"])
        out["mmap_read"] = inproc_mmap_reads(wide, STAGING["reps"])
        out["mmap_read_split"] = inproc_mmap_reads(wide, STAGING["reps"], split_blocks=True)
    return out


def prepare_cache(scales: list[Scale]) -> Path:
    """Generate the tables once (cached across runs) so no server pays for numpy."""
    cache = cache_dir()
    for scale in scales:
        log(f"cache: sales {scale.rows} rows")
        sales_path(DEMO_ROWS if scale.label == "50k" else scale.rows)
    if any(s.label == "1M" for s in scales):
        wide_path(STAGING["rows"], STAGING["cols"])
    return cache


async def run_all(work: Path, quick: bool, servers: list[str]) -> dict[str, Any]:
    scales = [s for s in SCALES if not quick or s.label == "50k"]
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    cache = prepare_cache(scales)
    log("raw jupyter_client round trips")
    raw = await asyncio.to_thread(raw_kernel_round_trips)
    by_server = await bench_scales(scales, servers, work, cache)
    multi = None
    if "dataref" in servers:
        log("8 owners x 25 calls over HTTP")
        try:
            multi = await multi_owner(work)
        except Exception as exc:
            log(f"8 owners: FAILED: {exc}")
            multi = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    sources = None
    if "dataref" in servers and not quick:
        log("SQL sources: 1M x 10 from PostgreSQL and SQLite")
        try:
            sources = await sql_sources(work, cache, log)
        except Exception as exc:
            log(f"SQL sources: FAILED: {exc}")
            sources = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    modes = None
    if "dataref" in servers and not quick:
        log("sandbox modes: uid (root) beside userns (an ordinary account), over stdio")
        try:
            modes = await sandbox_modes(work)
        except Exception as exc:
            log(f"sandbox modes: FAILED: {exc}")
            modes = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    profile = None
    if "dataref" in servers:
        log(f"py-spy on the server during {PROFILE_CALLS} warm calls")
        try:
            profile = await profile_calls(work, PROFILE_CALLS)
        except Exception as exc:
            log(f"profile: FAILED: {exc}")
            profile = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    inproc = await asyncio.to_thread(in_process, scales)
    diagnostics = await asyncio.to_thread(server_side, work) if "dataref" in servers else {}
    return {
        "quick": quick,
        "scales": [s.label for s in scales],
        "raw": raw,
        "servers": by_server,
        "multi_owner": multi,
        "sql_sources": sources,
        "sandbox_modes": modes,
        "profile": profile,
        "in_process": inproc,
        "diagnostics": diagnostics,
        "duration_s": time.perf_counter() - started,
        "load_start": load_start,
    }
