"""``python -m tests.benchmarks [--quick]``: run the benchmarks, print the table, write the report.

The full run (the default) writes BENCHMARKS.md and the plots in tests/benchmarks/results/;
``--quick`` runs only the 50k-row workloads and writes nothing in the tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .data import REPO_ROOT
from .failures import errors
from .runner import SERVERS, log, run_all

RESULTS = Path(__file__).with_name("results")
LAST = REPO_ROOT / ".state" / "bench-last.json"  # every run's numbers, for re-rendering


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only the 50k-row workloads")
    parser.add_argument(
        "--only", default=",".join(SERVERS), help="servers to run (default: all three)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir (server logs)")
    parser.add_argument(
        "--from-json", type=Path, help="render the report from a saved results.json, run nothing"
    )
    return parser.parse_args(argv)


def run(quick: bool, servers: list[str], keep: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="dataref-bench-"))
    try:
        return asyncio.run(run_all(work, quick, servers))
    finally:
        if keep:
            log(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    servers = [s for s in args.only.split(",") if s]
    if unknown := set(servers) - set(SERVERS):
        print(f"unknown servers: {sorted(unknown)}", file=sys.stderr)
        return 2
    from .report import machine_info, render_report, render_table

    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        results = run(args.quick, servers, args.keep)
        results["machine"] = machine_info()
        LAST.parent.mkdir(exist_ok=True)
        LAST.write_text(json.dumps(results, indent=1, default=str))
    print(render_table(results))
    status = 1 if errors(results) else 0  # the failures are listed in the table
    if results["quick"] or list(results["servers"]) != list(SERVERS):
        log(f"partial run: BENCHMARKS.md and the plots are left alone; numbers in {LAST}")
        return status
    from .plots import write_plots

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_plots(results, RESULTS)
    (REPO_ROOT / "BENCHMARKS.md").write_text(render_report(results))
    log("wrote BENCHMARKS.md and tests/benchmarks/results/")
    return status


if __name__ == "__main__":
    sys.exit(main())
