"""``python -m tests.benchmarks.compare BEFORE AFTER [--again AGAIN]``: what changed between runs.

BEFORE, AFTER and AGAIN are BENCHMARKS.md files, or ``git:REV`` for the one committed at REV.
Every dataref figure of the report's "Figures" tables is compared (times, bytes, memory: lower
is better). With ``--again`` (a second run of the same code as AFTER) each figure also gets its
run-to-run noise, |AGAIN / AFTER - 1|, and a figure counts as worse only when it grew by more
than that noise (and by more than 5%, below which nothing here is measurable).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from .data import REPO_ROOT

UNITS = {
    "ms": 1e-3, "s": 1.0, "µs": 1e-6,
    "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3,
}  # fmt: skip
QUANTITY = re.compile(r"^([\d,]+(?:\.\d+)?)\s*(µs|ms|s|B|KB|MB|GB|KiB|MiB|GiB)\b")
FLOOR = 0.05  # growth below 5% is not told apart from nothing


def read_report(spec: str) -> str:
    if spec.startswith("git:"):
        return subprocess.run(
            ["git", "show", f"{spec[4:]}:BENCHMARKS.md"],
            cwd=REPO_ROOT, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    return Path(spec).read_text()


def quantity(cell: str) -> float | None:
    match = QUANTITY.match(cell.strip())
    if match is None:
        return None
    return float(match.group(1).replace(",", "")) * UNITS[match.group(2)]


def figures(report: str) -> dict[str, float]:
    """{"table / row / column": value} for the dataref columns of the Figures tables."""
    found: dict[str, float] = {}
    section = report.split("## Figures", 1)[-1].split("\n## ", 1)[0]
    for block in section.split("\n### ")[1:]:
        title, *lines = block.splitlines()
        rows = [line.strip().strip("|").split("|") for line in lines if line.startswith("|")]
        if len(rows) < 3:
            continue
        header = [h.strip() for h in rows[0]]
        wanted = [i for i, h in enumerate(header) if "dataref" in h or h in ("p50", "p95")]
        for row in rows[2:]:
            for i in wanted:
                value = quantity(row[i]) if i < len(row) else None
                if value is not None:
                    found[f"{title.strip()} / {row[0].strip()} / {header[i]}"] = value
    return found


def show(value: float, key: str) -> str:
    if any(word in key for word in ("memory", "Bytes", "RSS", "bytes")):
        return f"{value / 1024**2:,.1f} MiB" if value > 1e5 else f"{value:,.0f} B"
    return f"{value * 1e3:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def compare(before: dict[str, float], after: dict[str, float], again: dict[str, float]) -> str:
    lines = [
        "| figure | before | after | after ÷ before | noise | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for key in [k for k in after if k in before]:
        ratio = after[key] / before[key] if before[key] else float("inf")
        noise = abs(again[key] / after[key] - 1) if key in again and after[key] else None
        margin = max(FLOOR, noise or 0.0)
        verdict = "worse" if ratio > 1 + margin else "better" if ratio < 1 - margin else "same"
        noise_text = "–" if noise is None else f"{noise:.0%}"
        lines.append(
            f"| {key} | {show(before[key], key)} | {show(after[key], key)} | {ratio:.2f}× "
            f"| {noise_text} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.compare", description=__doc__)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--again", help="a second run of the same code as AFTER (noise)")
    args = parser.parse_args(argv)
    again = figures(read_report(args.again)) if args.again else {}
    print(compare(figures(read_report(args.before)), figures(read_report(args.after)), again))
    return 0


if __name__ == "__main__":
    sys.exit(main())
