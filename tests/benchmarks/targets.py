"""The targets of the benchmark issue, judged on one run. A miss says why, from numbers
measured in the same run (nothing here is a canned excuse)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .fmt import KB, View, median, ms, p95, ratio, size, times

SESSION_CAP = 2 * KB
TOOLS_CAP = 6 * KB


@dataclass
class Verdict:
    target: str
    measured: str
    passed: bool | None  # None: not measured in this run
    why: str = ""

    @property
    def mark(self) -> str:
        return {True: "met", False: "**MISSED**", None: "not measured"}[self.passed]


def _at_most(r: float | None, bound: float) -> bool | None:
    return None if r is None else r <= bound


def _transcript_cost(v: View) -> str:
    d = v.get("diagnostics") or {}
    if "transcript_append_first10" not in d:
        return ""
    return (
        f"Recording one call in a transcript (one insert into its journal of cells), "
        f"measured in-process with dataref's own `record_run_python`, takes "
        f"{ms(d['transcript_append_first10'])} over a notebook's first 10 calls and "
        f"{ms(d['transcript_append_last10'])} by its {d['transcript_cells']}th (an fsync of a "
        f"40 KB file on this disk: {ms(median(d.get('fsync')))})."
    )


def _per_call_evidence(v: View) -> str:
    """Where a warm call's time goes: transport, CPU per process, growth with the notebook."""
    calls = v.srv("dataref", "50k", "per_call") or []
    cpu = v.srv("dataref", "50k", "per_call_cpu") or [None, None]
    floor = median(v.srv("dataref", "50k", "mcp_floor"))
    cells = v.srv("dataref", "50k", "notebook_cells")
    return (
        f"A no-kernel MCP call (`list_artifacts`) takes {ms(floor)}, so the transport is not "
        f"the cost. Per call the server process used {ms(cpu[0])} of CPU and the kernel "
        f"{ms(cpu[1])}; median {ms(median(calls[:10]))} over calls 1–10 and "
        f"{ms(median(calls[-10:]))} over calls 41–50 (the notebook had {cells} cells at the "
        f"end). " + _transcript_cost(v)
    )


def per_call_vs_seed(v: View) -> Verdict:
    d = median(v.srv("dataref", "50k", "per_call"))
    s = median(v.srv("seed", "50k", "per_call"))
    r = ratio(s, d)
    why = (
        f"the seed-style call is a fresh `python` importing pandas ({ms(s)}); dataref's warm "
        f"call takes {ms(d)}, {times(r)} less; 50× would need ≤ {ms(s / 50 if s else None)}. "
        + _per_call_evidence(v)
    )
    return Verdict(
        "warm per-call overhead ≥ 50× lower than the seed-style baseline",
        f"dataref {ms(d)} vs seed-style {ms(s)}: {times(r)} lower",
        None if r is None else r >= 50,
        why,
    )


def per_call_vs_raw(v: View) -> Verdict:
    d = median(v.srv("dataref", "50k", "per_call"))
    raw = median(v.get("raw", "round_trip"))
    r = ratio(d, raw)
    why = f"the raw round trip is {ms(raw)}. " + _per_call_evidence(v)
    return Verdict(
        "warm per-call overhead ≤ 2× the raw jupyter_client round trip",
        f'dataref {ms(d)} vs raw `execute_interactive("pass")` {ms(raw)}: {times(r)}',
        _at_most(r, 2),
        why,
    )


def per_call_vs_floor(v: View) -> Verdict:
    """dataref's warm call against its two unavoidable parts, measured interleaved."""
    sbs = v.srv("dataref", "50k", "side_by_side") or {}
    d, raw, mcp = (median(sbs.get(k)) for k in ("dataref", "raw", "mcp"))
    floor = None if raw is None or mcp is None else raw + mcp
    r = ratio(d, floor)
    return Verdict(
        "warm per-call overhead ≤ 1.3× (raw kernel round trip + no-kernel MCP call)",
        f"interleaved, {len(sbs.get('dataref') or [])} of each: dataref {ms(d)} vs raw "
        f"{ms(raw)} + MCP {ms(mcp)} = {ms(floor)}: {times(r)}",
        _at_most(r, 1.3),
        _per_call_evidence(v),
    )


def long_notebook(v: View) -> Verdict:
    """Judged on the interleaved calls (same load for both notebooks); the windows of the long
    run itself are figures in the latency table."""
    pair = v.srv("dataref", "50k", "long_beside_short") or {}
    calls = v.srv("dataref", "50k", "long_notebook") or []
    long, short = median(pair.get("long") or None), median(pair.get("short") or None)
    r = ratio(long, short)
    return Verdict(
        f"per-call overhead at the {len(calls):,}th call of a notebook ≤ 1.1× the 10th",
        f"interleaved, {len(pair.get('long') or [])} of each: a call on the "
        f"{len(calls):,}-cell notebook {ms(long)} vs on a 10-cell one {ms(short)}: {times(r)}",
        _at_most(r, 1.1),
        "the later calls of one notebook took longer. " + _transcript_cost(v),
    )


def bind_memory(v: View) -> Verdict:
    m = v.srv("dataref", "5M", "bind_memory") or {}
    before, bound = m.get("before") or {}, m.get("bound") or {}
    arrow = bound.get("arrow_bytes")
    added = (bound["VmHWM"] - before["VmHWM"]) * 1024 if bound and before else None
    peak = bound["VmHWM"] * 1024 if bound else None
    r = ratio(added, arrow)
    return Verdict(
        "kernel peak RSS for a bound 5M-row input ≤ 1.2× the Arrow size",
        f"binding added {size(added)} to a fresh kernel's peak RSS (idle "
        f"{size(before.get('VmHWM', 0) * 1024 or None)}, bound {size(peak)}); Arrow file "
        f"{size(arrow)}: {times(r)}",
        _at_most(r, 1.2),
        "binding copied more than the Arrow data into the kernel",
    )


def session_bytes(v: View) -> Verdict:
    d = v.srv("dataref", "50k", "session", "bytes")
    steps = v.srv("dataref", "50k", "session", "step_bytes") or {}
    s, n = v.srv("seed", "50k", "session", "bytes"), v.srv("naive", "50k", "session", "bytes")
    parts = ", ".join(f"{k} {size(b)}" for k, b in steps.items() if k != "chart")
    return Verdict(
        "the article's session (fetch + QoQ + chain) ≤ 2 KB to the transcript",
        f"dataref {size(d)}; seed-style {size(s)}; naive {size(n)}",
        None if d is None else d <= SESSION_CAP,
        f"per call: {parts}",
    )


def tools_list(v: View) -> Verdict:
    n = v.srv("dataref", "50k", "tools_list_bytes")
    per_tool = v.srv("dataref", "50k", "tools_list_per_tool") or {}
    biggest = sorted(per_tool.items(), key=lambda kv: -kv[1])
    listing = ", ".join(f"`{name}` {size(b)}" for name, b in biggest)
    return Verdict(
        "`tools/list` ≤ 6 KB",
        f"{size(n)} for {len(per_tool)} tools",
        None if n is None else n <= TOOLS_CAP,
        f"{size(n - TOOLS_CAP) if n else '–'} over; per tool (description + JSON schemas): "
        f"{listing}",
    )


def each(seconds: list[float] | None) -> str:
    """Every value, in order: the first-touch outliers a median leaves out stay visible."""
    return " / ".join(ms(x) for x in seconds or []) or "–"


def compute_5m(v: View) -> Verdict:
    sessions = v.srv("dataref", "5M", "session", "step_seconds", "qoq")
    first = median(sessions)
    warm = median(v.srv("dataref", "5M", "qoq", "bound"))
    inproc = v.srv("dataref", "5M", "qoq", "inproc") or {}
    in_first, in_again = median(inproc.get("first")), median(inproc.get("again"))
    r, r_warm = ratio(first, in_first), ratio(warm, in_again)
    passed = None if r is None or r_warm is None else r <= 1.5 and r_warm <= 1.5
    why = (
        f"with the input staged in the call dataref takes {times(r)} the in-process first run "
        f"on a freshly loaded frame ({ms(first)} vs {ms(in_first)}); with the input already "
        f"bound, {times(r_warm)} the in-process second run ({ms(warm)} vs {ms(in_again)}). "
        f"Both dataref calls also carry the fixed cost of a call "
        f"({ms(median(v.srv('dataref', '50k', 'per_call')))} for a trivial one) and store "
        "the `qoq` output as a new artifact. The sessions' QoQ calls run in one kernel: the "
        "first touches memory the kernel never had, the later ones reuse what the earlier "
        "calls freed"
    )
    return Verdict(
        "at 5M rows, the call that stages a fresh input ≤ 1.5× the in-process first run "
        "(and with the input bound ≤ 1.5× the second run)",
        f"staged in the call: {ms(first)} (sessions: {each(sessions)}) vs in-process first "
        f"run {ms(in_first)} (runs: {each(inproc.get('first'))}): {times(r)}; the first touch "
        f"of memory a process never had is dear on both sides; input bound: {ms(warm)} vs "
        f"{ms(in_again)} ({times(r_warm)})",
        passed,
        why,
    )


def concurrency(v: View) -> Verdict:
    target = "8 owners × 25 concurrent calls: 0 errors, p95 ≤ 5× the single-call p50"
    mo = v.get("multi_owner")
    if not mo:
        return Verdict(target, "–", None)
    if "error" in mo:
        return Verdict(target, "the workload failed", False, mo["error"])
    single, conc = median(mo["single"]), p95(mo["concurrent"])
    r = ratio(conc, single)
    server_cpu, kernel_cpu, client_cpu = mo["cpu_per_call"]
    calls, wall, cores = mo["calls"], mo["wall_s"], v.get("machine", "cores") or 1
    used = {"server": server_cpu, "kernels": kernel_cpu, "clients": client_cpu}
    spent = ", ".join(f"{k} {x * calls:.1f} s" for k, x in used.items())
    share = sum(used.values()) * calls / (wall * cores)
    rate = calls / wall
    why = (
        f"{mo['errors']} errors. The 8 owners together got {rate:.0f} calls/s, so with 8 "
        f"calls in flight each waits about 8 / {rate:.0f} = {ms(8 / rate)} (Little's law) "
        f"where a lone call takes {ms(single)}. CPU over the concurrent phase: {spent} "
        f"({share:.0%} of {cores} cores for {wall:.1f} s); the rest of the machine was busy "
        f"too (load average {v.get('machine', 'load_end'):.1f} at the end). Every owner's "
        f"calls go through the one server process, {ms(server_cpu)} of its CPU per call. "
        + _transcript_cost(v)
    )
    return Verdict(
        target,
        f"{mo['errors']} errors in {mo['calls']} calls; p95 {ms(conc)} = {times(r)} the "
        f"single-call p50 ({ms(single)})",
        mo["errors"] == 0 and r is not None and r <= 5,
        why,
    )


def first_call(v: View) -> Verdict:
    first = v.get("multi_owner", "first_call")
    return Verdict(
        "first call of a new notebook (warm spare) ≤ 150 ms (compute issue)",
        f"p50 {ms(median(first))}, p95 {ms(p95(first))}",
        _at_most(median(first), 0.150),
        "a warm spare was not ready: the call paid a kernel start",
    )


def staging(v: View) -> Verdict:
    """What binding a fresh 1M × 10 input adds to a call, against doing the same in-process."""
    d = v.srv("dataref", "1M", "staging") or {}
    added = None
    if d.get("with_input") and d.get("trivial"):
        added = median(d["with_input"]) - median(d["trivial"])
    floor = median(v.get("in_process", "mmap_read"))
    split = median(v.get("in_process", "mmap_read_split"))
    r = ratio(added, floor)
    zero_copy = (
        f"; the kernel binds without copying, which in-process takes {ms(split)}"
        if split is not None
        else ""
    )
    return Verdict(
        "staging a 1M × 10 artifact ≤ 1.5× an in-process memory-map read (compute issue)",
        f"added to a call: {ms(added)} (call with the fresh input minus a trivial call) vs "
        f"in-process mmap + to_pandas {ms(floor)}: {times(r)}{zero_copy}",
        _at_most(r, 1.5),
        "the kernel's bind (hard link, memory-map, to_pandas) plus loading it across the "
        "sandbox costs more than the same read in one process",
    )


def sql_source(name: str, label: str) -> Callable[[View], Verdict]:
    """fetch_sql of 1M × 10 into an artifact vs the same query to Arrow in-process."""

    def check(v: View) -> Verdict:
        d = v.get("sql_sources", name) or {}
        r = ratio(median(d.get("served_s")), median(d.get("inproc_s")))
        return Verdict(
            f"fetch_sql 1M × 10 from {label} ≤ 1.3× the same query to Arrow in-process "
            "(same ADBC driver) (sources issue)",
            f"{ms(median(d.get('served_s')))} through MCP into an artifact vs "
            f"{ms(median(d.get('inproc_s')))} in-process: {times(r)}",
            _at_most(r, 1.3),
            "the MCP call, the text check and the store's write add more than 30% to the fetch",
        )

    return check


def sql_source_memory(name: str, label: str) -> Callable[[View], Verdict]:
    """The server's memory during the fetch against the result's Arrow size."""

    def check(v: View) -> Verdict:
        d = v.get("sql_sources", name) or {}
        grown = max(d.get("memory_growth_bytes") or [0]) or None
        r = ratio(grown, d.get("arrow_bytes"))
        return Verdict(
            f"server memory during a 1M × 10 {label} fetch ≤ 2× its Arrow size (sources issue)",
            f"peak RSS growth {size(grown)} (server and its children) vs Arrow "
            f"{size(d.get('arrow_bytes'))}: {times(r)}",
            _at_most(r, 2.0),
            "more than one copy of the result was held at once while it streamed",
        )

    return check


def user_mode(v: View) -> Verdict:
    """userns mode (an ordinary account's server) against uid mode (root's), same run."""
    modes = v.get("sandbox_modes") or {}
    uid, userns = modes.get("uid") or {}, modes.get("userns") or {}
    first = ratio(median(userns.get("first_call")), median(uid.get("first_call")))
    warm = ratio(median(userns.get("per_call")), median(uid.get("per_call")))
    passed = None if first is None or warm is None else first <= 1.2 and warm <= 1.2
    return Verdict(
        "userns mode ≤ 1.2× uid mode: first call of a new notebook and warm per-call (issue 10)",
        f"first call {ms(median(userns.get('first_call')))} vs "
        f"{ms(median(uid.get('first_call')))} ({times(first)}); warm call "
        f"{ms(median(userns.get('per_call')))} vs {ms(median(uid.get('per_call')))} "
        f"({times(warm)})",
        passed,
        modes.get("error", "")
        or f"both servers ran at once from the same venv (Python {uid.get('python', '?')}), "
        "their calls interleaved; each first call waits until both servers' spares are "
        "started and idle. A warm call crosses the same sandbox in both modes (Landlock adds "
        "path checks to file opens only); a new notebook takes a warm spare in both",
    )


def verdicts(v: View) -> list[Verdict]:
    checks = (
        per_call_vs_seed,
        per_call_vs_raw,
        per_call_vs_floor,
        long_notebook,
        session_bytes,
        tools_list,
        compute_5m,
        bind_memory,
        first_call,
        staging,
        user_mode,
    )
    sources = (
        sql_source("pg", "PostgreSQL"),
        sql_source_memory("pg", "PostgreSQL"),
        sql_source("lite", "SQLite"),
        sql_source_memory("lite", "SQLite"),
    )
    return [check(v) for check in checks] + [concurrency(v)] + [check(v) for check in sources]
