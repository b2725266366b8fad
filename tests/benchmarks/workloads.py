"""The workloads, each a function of a connected ``Meter`` (or of nothing, for in-process ones).

Every server gets the same calls; a server that lacks a tool (the naive one has no compute)
simply does not run that step.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataref.walkthrough import QOQ_CODE

from .clients import CallRecord, Meter
from .data import read_arrow

# QOQ_CODE: the article's quarter-over-quarter code, verbatim (shared with `dataref demo`).
# The chained call: works on the previous call's output, by reference.
CHAIN_CODE = """\
worst = qoq.nsmallest(10, "delta")
outputs["worst"] = worst
result = {"lines_down": int((qoq.delta < 0).sum()), "worst10": round(float(worst.delta.sum()), 2)}
"""
TRIVIAL_CODE = "result = 1"


@dataclass(frozen=True)
class Scale:
    label: str
    rows: int  # nominal; the demo source's real count is measured
    fetch_tool: str
    fetch_args: dict[str, Any]


SCALES = (
    Scale("50k", 48_210, "fetch_sales", {"since": "2025-01-01"}),
    Scale("1M", 1_000_000, "fetch_big", {"rows": 1_000_000}),
    Scale("5M", 5_000_000, "fetch_big", {"rows": 5_000_000}),
)


class WorkloadError(RuntimeError):
    pass


def check(record: CallRecord) -> CallRecord:
    if not record.ok:
        raise WorkloadError(f"{record.tool} failed: {record.error}")
    return record


@dataclass
class SessionRun:
    seconds: float
    rows: int
    steps: dict[str, CallRecord] = field(default_factory=dict)

    def step_bytes(self) -> dict[str, int]:
        return {name: rec.bytes for name, rec in self.steps.items()}


async def article_session(meter: Meter, scale: Scale, tools: set[str]) -> SessionRun:
    """fetch -> QoQ top five -> a chained call -> a chart; steps the server lacks are skipped."""
    started = time.perf_counter()
    run = SessionRun(0.0, 0)
    fetch = check(await meter.call(scale.fetch_tool, scale.fetch_args))
    run.steps["fetch"] = fetch
    if "run_python" in tools:
        ref = fetch.data["dataRef"]
        run.rows = int(fetch.data["rows"])
        qoq = check(await meter.call("run_python", {"code": QOQ_CODE, "inputs": {"sales": ref}}))
        qoq_ref = qoq.data["outputs"]["qoq"]["dataRef"]
        run.steps["qoq"] = qoq
        chain_inputs = {"qoq": qoq_ref}
        run.steps["chain"] = check(
            await meter.call("run_python", {"code": CHAIN_CODE, "inputs": chain_inputs})
        )
        if "render_chart" in tools:
            chart = {"dataRef": qoq_ref, "x": "line", "y": "delta", "kind": "bar"}
            run.steps["chart"] = check(await meter.call("render_chart", chart))
    else:
        run.rows = len(fetch.data["rows"])
    run.seconds = time.perf_counter() - started
    return run


async def trivial_calls(meter: Meter, n: int, warmup: int = 3) -> list[float]:
    """``run_python("result = 1")`` n times: the per-call overhead."""
    for _ in range(warmup):
        check(await meter.call("run_python", {"code": TRIVIAL_CODE}))
    return [check(await meter.call("run_python", {"code": TRIVIAL_CODE})).seconds for _ in range(n)]


async def staging(meter: Meter, rows: int, cols: int, reps: int) -> dict[str, list[float]]:
    """A call that binds a fresh rows x cols artifact vs a trivial call on the same kernel.

    Each rep fetches a new artifact (same content, new ref), so the input is staged every
    time rather than found already bound."""
    out: dict[str, list[float]] = {"with_input": [], "trivial": []}
    await trivial_calls(meter, 0, warmup=2)
    for _ in range(reps):
        fetched = check(await meter.call("fetch_wide", {"rows": rows, "cols": cols}))
        code = "result = len(wide)"
        args = {"code": code, "inputs": {"wide": fetched.data["dataRef"]}}
        out["with_input"].append(check(await meter.call("run_python", args)).seconds)
        out["trivial"].append(check(await meter.call("run_python", {"code": TRIVIAL_CODE})).seconds)
    return out


def inproc_mmap_reads(path: Path, reps: int, **options: Any) -> list[float]:
    """The in-process floor of staging: an Arrow memory-map read + ``to_pandas(**options)``
    in this process (the kernel binds with ``split_blocks=True``: no copy)."""
    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        frame = read_arrow(path).to_pandas(**options)
        samples.append(time.perf_counter() - started)
        del frame
    return samples


async def compare_qoq(meter: Meter, ref: str, path: Path, reps: int) -> dict[str, Any]:
    """The QoQ call on an input already bound in the kernel, alternating with the same code
    in this process, so that both see the same load on a shared machine."""
    args = {"code": QOQ_CODE, "inputs": {"sales": ref}}
    bound: list[float] = []
    inproc: dict[str, list[float]] = {"load": [], "first": [], "again": []}
    for _ in range(reps):
        bound.append(check(await meter.call("run_python", args)).seconds)
        for key, values in (await asyncio.to_thread(inproc_qoq, path, 1)).items():
            inproc[key] += values
    return {"bound": bound, "inproc": inproc}


def inproc_qoq(path: Path, reps: int) -> dict[str, list[float]]:
    """The same pandas code in this process. Each rep loads the table as a kernel does
    (memory-map + to_pandas), then runs the code twice: the first run pays what a
    fresh frame costs on first touch (page faults, lazy conversions), the second does not."""
    out: dict[str, list[float]] = {"load": [], "first": [], "again": []}
    for _ in range(reps):
        started = time.perf_counter()
        frame = read_arrow(path).to_pandas(split_blocks=True)  # as the kernel loads it
        out["load"].append(time.perf_counter() - started)
        for key in ("first", "again"):
            namespace: dict[str, Any] = {"sales": frame, "outputs": {}}
            started = time.perf_counter()
            exec(QOQ_CODE, namespace)
            out[key].append(time.perf_counter() - started)
        del frame, namespace
        gc.collect()  # free this rep's frames before the next rep
    return out


async def long_notebook(
    meter: Meter, calls: int, settle: Callable[[], Awaitable[Any]] | None = None
) -> tuple[list[float], str]:
    """``run_python("result = 1")`` ``calls`` times in a fresh notebook: does a call get slower
    as the notebook grows? (Each call adds a cell.) ``settle`` runs after the first call,
    which takes the warm spare: it waits for the replacement spare to be up and idle, so
    the early calls do not share the CPU with a kernel start."""
    first = check(await meter.call("run_python", {"code": TRIVIAL_CODE, "notebook": "new"}))
    if settle is not None:
        await settle()
    args = {"code": TRIVIAL_CODE, "notebook": first.data["notebook"]}
    times = [first.seconds] + [
        check(await meter.call("run_python", args)).seconds for _ in range(calls - 1)
    ]
    return times, first.data["notebook"]


async def long_beside_short(
    meter: Meter,
    long_handle: str,
    settle: Callable[[], Awaitable[Any]],
    rounds: int = 40,
    short_cells: int = 10,
) -> dict[str, list[float]]:
    """Calls on the long notebook and on a new ``short_cells``-cell one, alternating, so both
    see the same load: a burst on the machine during the long run's last calls cannot pass
    for the notebook's length (the windows of 20 calls are a fifth of a second each)."""
    first = check(await meter.call("run_python", {"code": TRIVIAL_CODE, "notebook": "new"}))
    await settle()
    short = {"code": TRIVIAL_CODE, "notebook": first.data["notebook"]}
    for _ in range(short_cells - 1):
        check(await meter.call("run_python", short))
    long = {"code": TRIVIAL_CODE, "notebook": long_handle}
    out: dict[str, list[float]] = {"long": [], "short": []}
    for _ in range(rounds):
        out["long"].append(check(await meter.call("run_python", long)).seconds)
        out["short"].append(check(await meter.call("run_python", short)).seconds)
    return out


# What a kernel reports about itself: peak and current RSS (KiB) and, given a ref, the size
# of that staged input's Arrow file.
_KERNEL_MEMORY = """\
import os as _os
_status = dict(line.split(":", 1) for line in open("/proc/self/status"))
result = {k: int(_status[k].split()[0]) for k in ("VmHWM", "VmRSS")}
if REF:
    _dir = _os.environ.get("DATAREF_INPUTS_DIR", "/sandbox/inputs")
    result["arrow_bytes"] = _os.path.getsize(_os.path.join(_dir, REF + ".arrow"))
"""


async def bind_memory(meter: Meter, ref: str) -> dict[str, Any]:
    """A fresh kernel's peak RSS before and after binding ``ref`` (nothing else runs)."""
    idle = {"code": _KERNEL_MEMORY.replace("REF", '""'), "notebook": "new"}
    before = check(await meter.call("run_python", idle))
    code = _KERNEL_MEMORY.replace("REF", repr(ref))
    args = {"code": code, "inputs": {"sales": ref}, "notebook": before.data["notebook"]}
    bound = check(await meter.call("run_python", args))
    return {"before": before.data["result"], "bound": bound.data["result"]}


async def side_by_side(meter: Meter, rounds: int = 15, per_round: int = 10) -> dict[str, Any]:
    """A warm dataref call and its two floors, interleaved in rounds so that all three see
    the same load: ``run_python("result = 1")``, a no-kernel MCP call (``list_artifacts``)
    and a raw jupyter_client round trip on a plain local kernel."""
    from .rawkernel import RawKernel

    raw = await asyncio.to_thread(RawKernel)
    out: dict[str, list[float]] = {"dataref": [], "mcp": [], "raw": []}
    try:
        await asyncio.to_thread(raw.round_trips, 20)
        await trivial_calls(meter, 0)
        for _ in range(rounds):
            out["dataref"] += await trivial_calls(meter, per_round, warmup=0)
            out["mcp"] += [(await meter.call("list_artifacts")).seconds for _ in range(per_round)]
            out["raw"] += await asyncio.to_thread(raw.round_trips, per_round)
    finally:
        await asyncio.to_thread(raw.close)
    return out
