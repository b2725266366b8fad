"""Seed-style baseline: the article's minimal MCP server, kept small and honest.

An in-memory store (a dict of DataFrames); ``fetch_*`` return a dataRef and a small shape;
``run_python`` writes its inputs to parquet in a fresh temp dir and runs the code in a fresh
``python`` subprocess (``seed_runner.py``) per call; ``render_chart`` draws a stored table.
No sandbox, no notebook, no limits: what a first working version looks like.

Run: ``python -m tests.benchmarks.seed_server`` (stdio).
"""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.types import Image

from .data import demo_sales, load_sales, read_arrow, wide_path

RUNNER = Path(__file__).with_name("seed_runner.py")
mcp = FastMCP("seed-baseline")
STORE: dict[str, pd.DataFrame] = {}


def _put(frame: pd.DataFrame, sample: int = 0) -> dict[str, Any]:
    """Store a frame; its shape as the article shows it (a sample only for fetches)."""
    ref = f"data_{secrets.token_urlsafe(12)}"
    STORE[ref] = frame
    shape = {
        "dataRef": ref,
        "rows": len(frame),
        "columns": {c: str(t) for c, t in frame.dtypes.items()},
    }
    if sample:
        shape["sample"] = json.loads(
            frame.head(sample).to_json(orient="records", date_format="iso")
        )
    return shape


def _get(ref: str) -> pd.DataFrame:
    if ref not in STORE:
        raise ToolError(f"unknown dataRef {ref}")
    return STORE[ref]


@mcp.tool
def fetch_sales(since: str, until: str | None = None, region: str | None = None) -> dict[str, Any]:
    """Sales rows since an ISO date; returns a dataRef and the shape."""
    return _put(demo_sales(since, until, region), sample=5)


@mcp.tool
def fetch_big(rows: int) -> dict[str, Any]:
    """Benchmark only: `rows` generated sales rows."""
    return _put(load_sales(rows), sample=5)


@mcp.tool
def fetch_wide(rows: int, cols: int = 10) -> dict[str, Any]:
    """Benchmark only: a numeric table of rows x cols."""
    return _put(read_arrow(wide_path(rows, cols)).to_pandas(), sample=5)


@mcp.tool
def run_python(code: str, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """Run pandas code; inputs {name: dataRef} arrive as DataFrames; set `result`,
    put DataFrames in outputs[name]."""
    with tempfile.TemporaryDirectory(prefix="seed-") as tmp:
        work = Path(tmp)
        (work / "in").mkdir()
        for name, ref in (inputs or {}).items():
            _get(ref).to_parquet(work / "in" / f"{name}.parquet")
        (work / "code.py").write_text(code)
        proc = subprocess.run(
            [sys.executable, str(RUNNER), str(work)], capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            return {"ok": False, "result": None, "stdout": "", "error": proc.stderr[-2000:]}
        report = json.loads((work / "result.json").read_text())
        outputs = {
            path.stem: _put(pd.read_parquet(path)) for path in sorted((work / "out").glob("*"))
        }
    return {"ok": report["error"] is None, **report, "outputs": outputs}


@mcp.tool
def render_chart(dataRef: str, x: str, y: str, kind: str = "bar") -> list[Any]:
    """Draw a stored table as a PNG chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = _get(dataRef)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    frame.plot(x=x, y=y, kind=kind, ax=ax, legend=False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    chart_ref = f"chart_{secrets.token_urlsafe(12)}"
    return [Image(data=buffer.getvalue(), format="png"), json.dumps({"chartRef": chart_ref})]


if __name__ == "__main__":
    mcp.run(show_banner=False)
