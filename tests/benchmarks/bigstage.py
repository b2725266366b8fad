"""``python -m tests.benchmarks.bigstage``: only the 5M-row staging workload, interleaved.

Each round runs the article's session on a 5M-row table through a real dataref server (the
QoQ call binds the freshly fetched input: "staged"), the same QoQ call again on the input
now bound ("bound"), then the in-process floor in this process (``inproc_qoq``: memory-map
+ ``to_pandas`` + the QoQ code, first run and again). Rounds alternate so that all of them
see the same load on a shared machine; medians are printed. Writes nothing in the tree.

``--bench`` instead runs exactly what ``make bench`` runs on dataref at 5M rows (three article
sessions, the bind-memory probe, the bound QoQ calls alternating with the in-process runs)
and prints the two 5M targets as the report computes them.

``--held`` runs the in-process floor as a notebook does it, in child processes of its own:
each round loads a fresh copy of the table and runs the code while the previous round's
variables are still alive (as the agent's ``q`` keeps the previous input alive in a kernel),
once with the default allocator and once with the kernel's (``MALLOC_TUNABLES``, Arrow on the
system heap).

``--spans`` also hooks the kernel's cell events (a call of its own, before the rounds) and
prints where a staged call's time goes: server before the kernel sees the cell, binding,
the code, collecting (the output artifact), and server after the reply.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataref.walkthrough import QOQ_CODE

from . import clients
from .clients import Meter, dataref_spec, stdio_server
from .data import cache_dir, sales_path
from .memory import wait_workers_idle
from .workloads import SCALES, article_session, check, inproc_qoq

ROWS = 5_000_000

# Timestamps (the kernel's perf_counter, the same clock as this process's on Linux) and
# page-fault counts at the edges of every cell: before and after the profile's pre_run_cell
# (which binds the inputs), before and after its post_run_cell (which writes the outputs).
SPAN_HOOKS = """\
import resource as _r, time as _t
_sg_spans, _sg_cur = [], {}
def _sg_mark(key):
    _sg_cur[key] = (_t.perf_counter(), _r.getrusage(_r.RUSAGE_SELF).ru_minflt, _t.process_time())
def _sg_a(info):
    _sg_cur.clear(); _sg_cur["cell"] = (info.raw_cell or "").split("\\n", 1)[0]; _sg_mark("pre0")
def _sg_b(info): _sg_mark("pre1")
def _sg_c(result): _sg_mark("post0")
def _sg_d(result): _sg_mark("post1"); _sg_spans.append(dict(_sg_cur))
_sg_ev = get_ipython().events.callbacks
_sg_ev["pre_run_cell"].insert(0, _sg_a); _sg_ev["pre_run_cell"].append(_sg_b)
_sg_ev["post_run_cell"].insert(0, _sg_c); _sg_ev["post_run_cell"].append(_sg_d)
result = 1
"""
TAKE_SPANS = "result, _sg_spans[:] = list(_sg_spans), []"


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms" if values else "-"


def span_rows(spans: list[dict[str, Any]], ref: str, call: tuple[float, float]) -> dict[str, float]:
    """One staged call's phases (seconds) and the kernel's page faults while binding/running."""
    spans = [s for s in spans if ref in s.get("cell", "")]
    if not spans:
        return {}
    s = spans[0]
    start, end = call
    return {
        "server before the kernel": s["pre0"][0] - start,
        "bind (pre_run_cell)": s["pre1"][0] - s["pre0"][0],
        "code": s["post0"][0] - s["pre1"][0],
        "collect (post_run_cell)": s["post1"][0] - s["post0"][0],
        "server after the kernel": end - s["post1"][0],
        "cpu bind": s["pre1"][2] - s["pre0"][2],
        "cpu code": s["post0"][2] - s["pre1"][2],
        "faults bind (k)": (s["pre1"][1] - s["pre0"][1]) / 1e6,
        "faults code (k)": (s["post0"][1] - s["pre1"][1]) / 1e6,
    }


async def timed_session(meter: Meter, tools: set[str]) -> tuple[Any, tuple[float, float]]:
    """An article session; the QoQ call's start and end on this process's clock."""
    run = await article_session(meter, SCALES[2], tools)
    qoq = run.steps["qoq"]
    # The QoQ step's own start: the record holds its duration; its end is the chain's start.
    end = time.perf_counter() - sum(
        run.steps[k].seconds for k in ("chain", "chart") if k in run.steps
    )
    return run, (end - qoq.seconds, end)


@dataclass
class Variant:
    """One dataref server of the comparison (``env``: extra server environment)."""

    name: str
    meter: Meter
    spans: bool
    out: dict[str, list[Any]] = field(
        default_factory=lambda: {"staged": [], "bound": [], "spans": []}
    )


async def one_round(v: Variant, tools: set[str]) -> None:
    if v.spans:
        check(await v.meter.call("run_python", {"code": TAKE_SPANS}))
    run, window = await timed_session(v.meter, tools)
    v.out["staged"].append(run.steps["qoq"].seconds)
    ref = run.steps["fetch"].data["dataRef"]
    if v.spans:
        taken = check(await v.meter.call("run_python", {"code": TAKE_SPANS})).data["result"]
        v.out["spans"].append(span_rows(taken, ref, window))
    args = {"code": QOQ_CODE, "inputs": {"sales": ref}}
    v.out["bound"].append(check(await v.meter.call("run_python", args)).seconds)
    line = f"  {v.name}: staged {v.out['staged'][-1] * 1000:.0f} ms, bound "
    line += f"{v.out['bound'][-1] * 1000:.0f} ms"
    if v.spans and v.out["spans"][-1]:
        line += "; " + ", ".join(f"{k} {x * 1000:.0f}" for k, x in v.out["spans"][-1].items())
    print(line, flush=True)


async def rounds(variants: list[Variant], path: Path, reps: int) -> dict[str, Any]:
    tools = {t.name for t in await variants[0].meter.client.list_tools()}
    for v in variants:
        if v.spans:
            check(await v.meter.call("run_python", {"code": SPAN_HOOKS}))
    inproc: dict[str, list[float]] = {"load": [], "first": [], "again": []}
    for rep in range(reps):
        print(f"round {rep + 1}", flush=True)
        for v in variants:
            await one_round(v, tools)
        for key, values in (await asyncio.to_thread(inproc_qoq, path, 1)).items():
            inproc[key] += values
        print(
            f"  in-process: first {inproc['first'][-1] * 1000:.0f} ms, again "
            f"{inproc['again'][-1] * 1000:.0f} ms (load {inproc['load'][-1] * 1000:.0f} ms)",
            flush=True,
        )
    return {"inproc": inproc, **{v.name: v.out for v in variants}}


def summary(out: dict[str, Any]) -> str:
    inproc = out["inproc"]
    first, again = statistics.median(inproc["first"]), statistics.median(inproc["again"])
    lines = [
        f"in-process: first run {median_ms(inproc['first'])} (load {median_ms(inproc['load'])}),"
        f" again {median_ms(inproc['again'])}"
    ]
    for name, v in out.items():
        if name == "inproc":
            continue
        staged, bound = statistics.median(v["staged"]), statistics.median(v["bound"])
        lines.append(
            f"{name}: staged call {median_ms(v['staged'])} = {staged / first:.2f}x the first run;"
            f" bound call {median_ms(v['bound'])} = {bound / again:.2f}x the run again"
        )
        spans = [s for s in v["spans"] if s]
        if spans:
            lines.append(
                "  "
                + ", ".join(
                    f"{k} {statistics.median(s[k] for s in spans) * 1000:.0f}" for k in spans[0]
                )
            )
    return "\n".join(lines)


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``name`` or ``name:KEY=VALUE,KEY=VALUE``: a server and its extra environment."""
    name, _, rest = text.partition(":")
    env = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, env


async def main_async(
    reps: int, spans: bool, keep: bool, variants: list[tuple[str, dict[str, str]]]
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="dataref-bigstage-"))
    cache = cache_dir()
    path = sales_path(ROWS)
    try:
        async with contextlib.AsyncExitStack() as stack:
            running: list[Variant] = []
            seen: set[int] = set()
            find = clients.children_matching  # each server is found among the new processes
            stack.callback(setattr, clients, "children_matching", find)
            clients.children_matching = lambda parent, marker: [
                p for p in find(parent, marker) if p not in seen
            ]
            for name, env in variants:
                spec = dataref_spec(work / f"state-{name}", cache, plugins=True)
                spec.env.update(env)
                server = stdio_server(spec, work / f"{name}.log")
                meter, sampler = await stack.enter_async_context(server)
                seen.add(sampler.root)
                await asyncio.to_thread(wait_workers_idle, sampler.root, 1)
                running.append(Variant(name, meter, spans))
            return await rounds(running, path, reps)
    finally:
        if keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


async def bench_5m(keep: bool) -> str:
    """The 5M part of ``make bench`` for dataref alone, and its two targets."""
    from .fmt import View
    from .runner import bench_server
    from .targets import bind_memory, compute_5m

    work = Path(tempfile.mkdtemp(prefix="dataref-bigstage-"))
    try:
        cache = cache_dir()
        sales_path(ROWS)
        result = await bench_server("dataref", SCALES[2], work, cache)
    finally:
        if keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    view = View({"servers": {"dataref": {"5M": result}}})
    steps = result["session"]["step_seconds"]
    lines = [
        f"{name} call of each session{why}: {', '.join(f'{x * 1000:.0f} ms' for x in steps[name])}"
        for name, why in (("fetch", ""), ("qoq", " (it stages the input)"))
    ]
    for verdict in (compute_5m(view), bind_memory(view)):
        lines.append(f"{verdict.target}: {verdict.measured} ({verdict.passed})")
    return "\n".join(lines)


def held_child(path: Path, reps: int) -> list[dict[str, float]]:
    """Rounds of: a fresh copy of ``path`` loaded as a kernel loads it, then the QoQ code,
    with the previous round's namespace alive until this one has run."""
    import pyarrow as pa

    previous: dict[str, Any] = {}
    out = []
    for rep in range(reps):
        copy = path.with_name(f".held-{rep}-{path.name}")
        shutil.copyfile(path, copy)  # a new file, as a fetch writes a new artifact
        try:
            started = time.perf_counter()
            frame = (
                pa.ipc.open_file(pa.memory_map(str(copy))).read_all().to_pandas(split_blocks=True)
            )
            loaded = time.perf_counter()
            namespace: dict[str, Any] = {"sales": frame, "outputs": {}}
            exec(QOQ_CODE, namespace)
            out.append({"load": loaded - started, "first": time.perf_counter() - loaded})
            previous, frame = namespace, None  # the previous round's variables go only now
        finally:
            copy.unlink()
    del previous
    return out


def held(reps: int) -> str:
    import os
    import subprocess
    import sys

    from dataref.kernels.bwrap import MALLOC_TUNABLES

    path = sales_path(ROWS)
    kernel_env = {"GLIBC_TUNABLES": MALLOC_TUNABLES, "ARROW_DEFAULT_MEMORY_POOL": "system"}
    lines = []
    for name, extra in (("default allocator", {}), ("kernel's allocator", kernel_env)):
        argv = [sys.executable, "-m", "tests.benchmarks.bigstage", "--held-child", str(path)]
        run = subprocess.run(
            [*argv, "--reps", str(reps)], env={**os.environ, **extra},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rounds = json.loads(run.stdout)
        firsts = ", ".join(f"{r['first'] * 1000:.0f}" for r in rounds)
        loads = ", ".join(f"{r['load'] * 1000:.0f}" for r in rounds)
        lines.append(f"{name}: first runs {firsts} ms (loads {loads} ms)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bigstage", description=__doc__
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--spans", action="store_true", help="where a staged call's time goes")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (server logs)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME[:KEY=VALUE,...]: a server (with extra environment); several alternate",
    )
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--bench", action="store_true", help="the 5M part of `make bench`")
    parser.add_argument("--held", action="store_true", help="in-process, previous round alive")
    parser.add_argument("--held-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.held_child:
        print(json.dumps(held_child(args.held_child, args.reps)))
        return 0
    if args.held:
        print(held(args.reps))
        return 0
    if args.bench:
        print(asyncio.run(bench_5m(args.keep)))
        return 0
    variants = [parse_variant(v) for v in args.variant] or [("dataref", {})]
    out = asyncio.run(main_async(args.reps, args.spans, args.keep, variants))
    print(summary(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
