"""Where a warm call's time goes in the server: py-spy samples the dataref server process
(every thread) while the client makes warm ``run_python("result = 1")`` calls.

``python -m tests.benchmarks.profile [--calls 200]`` prints the top entries; ``make bench``
runs it after the other workloads and keeps the top entries with its results.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .clients import VENV_BIN, dataref_spec, stdio_server
from .data import cache_dir
from .memory import wait_workers_idle
from .workloads import TRIVIAL_CODE, check

RATE_HZ = 1000
TOP = 15


async def profile_calls(work: Path, calls: int = 200) -> dict[str, Any]:
    """Profile ``calls`` warm calls; returns the top entries by own and by total time."""
    spec = dataref_spec(work / "state-profile", cache_dir(), plugins=False)
    raw = work / "profile.txt"
    async with stdio_server(spec, work / "dataref-profile.log") as (meter, sampler):
        await asyncio.to_thread(wait_workers_idle, sampler.root, 1)
        for _ in range(20):  # warm: the kernel, the notebook, the server's first-call paths
            check(await meter.call("run_python", {"code": TRIVIAL_CODE}))
        argv = [str(VENV_BIN / "py-spy"), "record", "--pid", str(sampler.root), "--rate",
                str(RATE_HZ), "--format", "raw", "--threads", "--gil", "--nonblocking"]  # fmt: skip
        spy = subprocess.Popen(
            [*argv, "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        await asyncio.sleep(1.0)  # py-spy attaches
        started = time.perf_counter()
        for _ in range(calls):
            check(await meter.call("run_python", {"code": TRIVIAL_CODE}))
        seconds = time.perf_counter() - started
        spy.send_signal(2)  # SIGINT: py-spy writes what it sampled and exits
        _, err = await asyncio.to_thread(spy.communicate, timeout=60)
    if not raw.is_file():
        raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-300:]}")
    return {"calls": calls, "seconds": seconds, **top_entries(raw.read_text())}


def _frame(entry: str) -> str:
    """``func (path/to/module.py:line)`` -> ``module.py:func``."""
    name, _, where = entry.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    if "dataref" in parts[:-1]:  # this project's own modules, named as packages
        return "/".join(parts[len(parts) - parts[::-1].index("dataref") - 1 :]) + f":{name}"
    return f"{parts[-1]}:{name}"


def top_entries(collapsed: str, top: int = TOP) -> dict[str, Any]:
    """Own and total samples per function from py-spy's collapsed stacks, idle excluded."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")[1:]]  # the first is the thread
        if not frames:  # py-spy leaves idle threads out (no --idle)
            continue
        n = int(count)
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    ours = collections.Counter({k: v for k, v in total.items() if k.startswith("dataref/")})
    return {
        "busy_samples": samples,
        "rate_hz": RATE_HZ,
        "own": own.most_common(top),
        "total": total.most_common(top),
        "dataref": ours.most_common(top),
    }


def render(profile: dict[str, Any]) -> str:
    ms_per_call = 1000 / profile["rate_hz"] / profile["calls"]
    lines = [
        f"{profile['calls']} calls in {profile['seconds']:.2f} s; server busy "
        f"{profile['busy_samples'] * ms_per_call:.2f} ms per call (holding the GIL; sampled at "
        f"{profile['rate_hz']} Hz)",
        "",
        "| own ms/call | function |",
        "|---|---|",
    ]
    lines += [f"| {n * ms_per_call:.3f} | `{name}` |" for name, n in profile["own"]]
    lines += ["", "| total ms/call | dataref's own function (with what it calls) |", "|---|---|"]
    lines += [f"| {n * ms_per_call:.3f} | `{name}` |" for name, n in profile["dataref"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.profile")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dataref-profile-"))
    try:
        profile = asyncio.run(profile_calls(work, args.calls))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(profile, indent=1))
    print(render(profile))


if __name__ == "__main__":
    main()
