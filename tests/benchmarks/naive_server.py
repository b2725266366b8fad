"""The naive pattern: the fetch tool returns the rows themselves, as JSON.

Whatever the model then computes, it computes by reading these rows: the transcript pays for
every row, and the "compute" is the model's own (not measured here; only the bytes count).

Run: ``python -m tests.benchmarks.naive_server`` (stdio).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from fastmcp import FastMCP

from .data import demo_sales, load_sales

mcp = FastMCP("naive-rows")


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts: ISO dates, NaN as null."""
    out = frame.assign(date=frame["date"].dt.strftime("%Y-%m-%d"))
    out = out.astype(object).where(out.notna(), None)
    return out.to_dict(orient="records")


def rows_json_bytes(frame: pd.DataFrame, chunk: int = 200_000) -> int:
    """Exact size of the compact JSON of ``{"rows": records(frame)}``, computed in chunks so
    5M rows need not sit in memory as one string (a list's JSON is its items joined by ',')."""
    total, parts = len('{"rows":[]}'), 0
    for start in range(0, len(frame), chunk):
        items = records(frame.iloc[start : start + chunk])
        total += len(json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode()) - 2
        parts += 1
    return total + max(parts - 1, 0)  # the commas between chunks


@mcp.tool
def fetch_sales(since: str, until: str | None = None, region: str | None = None) -> dict[str, Any]:
    """Sales rows since an ISO date, returned in full."""
    return {"rows": records(demo_sales(since, until, region))}


@mcp.tool
def fetch_big(rows: int) -> dict[str, Any]:
    """Benchmark only: `rows` generated sales rows, returned in full."""
    return {"rows": records(load_sales(rows))}


if __name__ == "__main__":
    mcp.run(show_banner=False)
