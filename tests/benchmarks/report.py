"""The table (printed) and BENCHMARKS.md (written), made from the raw numbers of one run."""

from __future__ import annotations

import os
import platform
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .failures import errors
from .fmt import View, median, mib, ms, p95, ratio, size, stat_cells, table, times

SERVERS = ("dataref", "seed", "naive")


def machine_info() -> dict[str, Any]:
    """What the run ran on, read at run time."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kib = next(int(ln.split()[1]) for ln in meminfo if ln.startswith("MemTotal:"))
    packages = ("fastmcp", "mcp", "pandas", "pyarrow", "ipykernel")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_end": os.getloadavg()[0],
        "versions": {p: version(p) for p in packages},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


# -- latency -------------------------------------------------------------------------------


def _versus(d: list[float] | None, s: list[float] | None) -> str:
    r = ratio(median(s), median(d))
    if r is None:
        return "–"
    return (
        f"{times(r)} faster than seed-style" if r >= 1 else f"{times(1 / r)} slower than seed-style"
    )


def call_rows(v: View) -> list[list[str]]:
    raw, cold = v.get("raw", "round_trip"), v.get("raw", "cold_start")
    d_call, s_call = v.srv("dataref", "50k", "per_call"), v.srv("seed", "50k", "per_call")
    first = v.get("multi_owner", "first_call")
    vs_raw = times(ratio(median(d_call), median(raw)))
    return [
        ['per-call overhead: `run_python("result = 1")`', *stat_cells(d_call),
         *stat_cells(s_call), f"raw kernel {ms(median(raw))} / {ms(p95(raw))}",
         f"{_versus(d_call, s_call)}; {vs_raw} the raw round trip"],
        ["MCP round trip of a no-kernel tool (`list_artifacts`)",
         *stat_cells(v.srv("dataref", "50k", "mcp_floor")), "–", "–", "", ""],
        ["first call of a new notebook (warm spare)", *stat_cells(first), *stat_cells(s_call),
         f"raw kernel cold start {ms(median(cold))}", _versus(first, s_call)],
        *side_by_side_rows(v),
        *long_notebook_rows(v),
    ]  # fmt: skip


def side_by_side_rows(v: View) -> list[list[str]]:
    sbs = v.srv("dataref", "50k", "side_by_side") or {}
    if not sbs.get("dataref"):
        return []
    floor = median(sbs["raw"]) + median(sbs["mcp"])
    return [
        ['interleaved: `run_python("result = 1")`', *stat_cells(sbs["dataref"]), "–", "–",
         f"raw kernel {ms(median(sbs['raw']))} + MCP {ms(median(sbs['mcp']))}",
         f"{times(ratio(median(sbs['dataref']), floor))} the sum"],
    ]  # fmt: skip


def long_notebook_rows(v: View) -> list[list[str]]:
    calls = v.srv("dataref", "50k", "long_notebook") or []
    if len(calls) < 40:
        return []
    early, late = calls[1:21], calls[-20:]
    pair = v.srv("dataref", "50k", "long_beside_short") or {}
    rows = [
        ["one notebook: calls 2–21", *stat_cells(early), "–", "–", "", ""],
        [f"one notebook: calls {len(calls) - 19}–{len(calls)}", *stat_cells(late), "–", "–",
         "", f"{times(ratio(median(late), median(early)))} calls 2–21"],
    ]  # fmt: skip
    if pair.get("long") and pair.get("short"):
        ratio_text = f"{times(ratio(median(pair['long']), median(pair['short'])))} the 10-cell one"
        rows += [
            ["interleaved: a call on a 10-cell notebook", *stat_cells(pair["short"]),
             "–", "–", "", ""],
            [f"interleaved: a call on the {len(calls):,}-cell notebook", *stat_cells(pair["long"]),
             "–", "–", "", ratio_text],
        ]  # fmt: skip
    return rows


def profile_section(v: View) -> str:
    from .profile import render

    profile = v.get("profile")
    if not profile or "error" in profile:
        return "Not measured in this run."
    return render(profile)


def session_rows(v: View) -> list[list[str]]:
    rows = []
    for scale in v.scales:
        d = v.srv("dataref", scale, "session", "seconds")
        s = v.srv("seed", scale, "session", "seconds")
        n = v.srv("naive", scale, "session", "seconds")
        naive = f"naive fetch {ms(median(n))}" if n else "naive: not sent"
        rows.append([f"article session, {scale} rows", *stat_cells(d), *stat_cells(s), naive,
                     _versus(d, s)])  # fmt: skip
    return rows


def staging_rows(v: View) -> list[list[str]]:
    d, s = v.srv("dataref", "1M", "staging"), v.srv("seed", "1M", "staging")
    if not d:
        return []
    mm = v.get("in_process", "mmap_read")
    rows = []
    for label, key in (("call with a fresh 1M × 10 input", "with_input"),
                       ("trivial call, same kernel", "trivial")):  # fmt: skip
        other = f"in-process mmap + to_pandas {ms(median(mm))}" if key == "with_input" else ""
        rows.append([f"staging: {label}", *stat_cells(d[key]), *stat_cells((s or {}).get(key)),
                     other, _versus(d[key], (s or {}).get(key))])  # fmt: skip
    return rows


def source_rows(v: View) -> list[list[str]]:
    """fetch_sql of 1M × 10 per source, against the same query in-process with ADBC."""
    rows = []
    for name, label in (("pg", "PostgreSQL"), ("lite", "SQLite")):
        d = v.get("sql_sources", name)
        if not d:
            continue
        rows.append([f"fetch_sql 1M × 10 from {label}", *stat_cells(d["served_s"]), "", "",
                     f"in-process ADBC to Arrow {ms(median(d['inproc_s']))}",
                     times(ratio(median(d["served_s"]), median(d["inproc_s"])))])  # fmt: skip
    return rows


def compute_rows(v: View) -> list[list[str]]:
    first = v.srv("dataref", "5M", "session", "step_seconds", "qoq")
    if not first:
        return []
    warm = v.srv("dataref", "5M", "qoq", "bound")
    inproc = v.srv("dataref", "5M", "qoq", "inproc") or {}
    seed = v.srv("seed", "5M", "session", "step_seconds", "qoq")
    in_first, in_again = inproc.get("first"), inproc.get("again")
    return [
        ["5M rows: QoQ on the fetched artifact (the call stages it)", *stat_cells(first),
         *stat_cells(seed), f"in-process, first run on the loaded frame {ms(median(in_first))} "
         f"(load {ms(median(inproc.get('load')))})",
         f"{times(ratio(median(first), median(in_first)))} the in-process time"],
        ["5M rows: the same call, input already bound", *stat_cells(warm), "–", "–",
         f"in-process, run again {ms(median(in_again))}",
         f"{times(ratio(median(warm), median(in_again)))} the in-process time"],
    ]  # fmt: skip


# -- bytes, memory, growth, owners ---------------------------------------------------------


def bytes_rows(v: View) -> list[list[str]]:
    rows = []
    for scale in v.scales:
        d, s, n = (v.srv(x, scale, "session", "bytes") for x in SERVERS)
        note = " (computed)" if v.srv("naive", scale, "session", "computed") else ""
        less = f"{times(ratio(n, d))} less than naive" if d and n else ""
        rows.append(
            [f"session {scale}: fetch + QoQ + chain", size(d), size(s), size(n) + note, less]
        )
    d_steps = v.srv("dataref", "50k", "session", "step_bytes") or {}
    s_steps = v.srv("seed", "50k", "session", "step_bytes") or {}
    naive_fetch = size(v.srv("naive", "50k", "session", "bytes"))
    for step in ("fetch", "qoq", "chain", "chart"):
        n = naive_fetch if step == "fetch" else "–"
        rows.append(
            [f"one call at 50k: {step}", size(d_steps.get(step)), size(s_steps.get(step)), n, ""]
        )
    images = [size(v.srv(x, "50k", "session", "chart_image_bytes")) for x in SERVERS[:2]]
    rows.append(["chart PNG, base64 (counted apart)", *images, "–", ""])
    tools = [v.srv(x, "50k", "tools_list_bytes") for x in SERVERS]
    rows.append(["`tools/list` JSON", *[size(x) for x in tools], ""])
    return rows


def memory_rows(v: View) -> list[list[str]]:
    rows = []
    for scale in v.scales:
        cells = []
        for name in ("dataref", "seed"):
            m = v.srv(name, scale, "memory") or {}
            cells += [mib(m.get("server_mib")), mib(m.get("kernel_max_mib"))]
        naive = (v.srv("naive", scale, "memory") or {}).get("server_mib")
        rows.append([f"{scale} rows", *cells, mib(naive)])
    m = v.get("multi_owner", "memory") or {}
    rows.append(["HTTP, 9 owners, trivial calls", mib(m.get("server_mib")),
                 mib(m.get("kernel_max_mib")), "–", "–", "–"])  # fmt: skip
    return rows


def growth_rows(v: View) -> list[list[str]]:
    """Each figure at every size, and its factor from the smallest to the largest table."""
    if len(v.scales) < 2:
        return []
    lo, hi = v.scales[0], v.scales[-1]
    figures = [
        ("session time (median)", "dataref", ("session", "seconds"), ms),
        ("session time (median)", "seed", ("session", "seconds"), ms),
        ("bytes to the transcript", "dataref", ("session", "bytes"), size),
        ("bytes to the transcript", "seed", ("session", "bytes"), size),
        ("bytes to the transcript", "naive", ("session", "bytes"), size),
        ("server peak RSS", "dataref", ("memory", "server_mib"), mib),
        ("server peak RSS", "seed", ("memory", "server_mib"), mib),
        ("kernel / runner peak RSS", "dataref", ("memory", "kernel_max_mib"), mib),
        ("kernel / runner peak RSS", "seed", ("memory", "kernel_max_mib"), mib),
    ]
    rows = []
    for label, name, path, fmt in figures:
        values = [v.srv(name, scale, *path) for scale in v.scales]
        values = [median(x) if isinstance(x, list) else x for x in values]
        factor = times(ratio(values[-1], values[0]))
        rows.append([f"{label}: {name}", *[fmt(x) for x in values], f"{factor} ({lo} → {hi})"])
    return rows


def owner_rows(v: View) -> list[list[str]]:
    mo = v.get("multi_owner")
    if not mo or "error" in mo:
        return []
    single, conc = mo["single"], mo["concurrent"]
    server_cpu, kernel_cpu, client_cpu = mo["cpu_per_call"]
    return [
        ["one owner alone, sequential calls", *stat_cells(single), "", ""],
        [f"8 owners at once, {mo['calls']} calls in {mo['wall_s']:.1f} s", *stat_cells(conc),
         str(mo["errors"]), f"p95 = {times(ratio(p95(conc), median(single)))} single p50; "
         f"CPU per call: server {ms(server_cpu)}, kernel {ms(kernel_cpu)}, "
         f"clients {ms(client_cpu)}"],
    ]  # fmt: skip


def render_table(results: dict[str, Any]) -> str:
    v = View(results)
    latency = call_rows(v) + session_rows(v) + staging_rows(v) + source_rows(v) + compute_rows(v)
    head = ["", "dataref p50", "dataref p95", "seed-style p50", "seed-style p95", "floor / other",
            "ratio"]  # fmt: skip
    parts = ["### Latency (median / p95)", table(head, latency)]
    parts += ["### Bytes that reach the transcript",
              table(["", "dataref", "seed-style", "naive", ""], bytes_rows(v))]  # fmt: skip
    mem_head = [
        "",
        "dataref server",
        "dataref kernel",
        "seed server",
        "seed runner",
        "naive server",
    ]
    parts += ["### Peak memory (VmHWM)", table(mem_head, memory_rows(v))]
    if growth := growth_rows(v):
        parts += [f"### Growth from {v.scales[0]} to {v.scales[-1]} rows",
                  table(["", *v.scales, "growth"], growth)]  # fmt: skip
    if owners := owner_rows(v):
        parts += ["### 8 owners × 25 calls, one HTTP server",
                  table(["", "p50", "p95", "errors", ""], owners)]  # fmt: skip
    if failed := errors(results):
        parts += ["### Failed workloads", "\n".join(f"* {line}" for line in failed)]
    return "\n\n".join(parts)


def render_report(results: dict[str, Any]) -> str:
    from .report_template import TEMPLATE
    from .runner import SESSION_REPS
    from .targets import verdicts

    v, m = View(results), results["machine"]
    found = verdicts(v)
    rows = [[x.target, x.measured, x.mark] for x in found]
    misses = [f"* **Missed: {x.target}.** Why: {x.why}" for x in found if x.passed is False]
    return TEMPLATE.format(
        date=m["date"],
        duration=f"{results['duration_s'] / 60:.1f} min",
        cpu=m["cpu"], cores=m["cores"], ram=m["ram_gib"], kernel=m["kernel"],
        python=m["python"], load_start=results.get("load_start", 0.0), load=m["load_end"],
        targets=table(["target", "measured", "result"], rows),
        misses="\n".join(misses) or "Every target is met.",
        table=render_table(results),
        profile=profile_section(v),
        reps=", ".join(f"{k}: {n}×" for k, n in SESSION_REPS.items()),
        **m["versions"],
    )  # fmt: skip
