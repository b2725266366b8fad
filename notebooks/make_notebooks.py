"""Regenerate the example notebooks from real sessions against the demo source.

    .venv/bin/python notebooks/make_notebooks.py

Each notebook is recorded by a real MCP session: ``dataref serve`` started over stdio with a
fresh temporary state dir, driven by ``fastmcp.Client`` (the same machinery as ``dataref
demo``), then read back through the ``dataref://notebooks/{handle}`` resource. Only markdown
is added afterwards: the header, and for the teaching tour one explanation per step.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import nbformat
from nbformat.v4 import new_markdown_cell

from dataref.walkthrough import Session, article, server_transport

HERE = Path(__file__).resolve().parent


async def record(steps: Callable[[Session], Awaitable[dict]]) -> nbformat.NotebookNode:
    """Run ``steps`` against a fresh server; the exported notebook of its default notebook."""
    from fastmcp import Client

    state = Path(tempfile.mkdtemp(prefix="dataref-notebooks-"))
    try:
        transport = server_transport(None, state, state / "server.log")
        async with Client(transport) as client:
            session = Session(client, echo=False)
            handle = (await steps(session))["notebook"]
            text = (await client.read_resource(f"dataref://notebooks/{handle}"))[0].text
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return nbformat.reads(text, as_version=4)


FAMILIES = """\
family = sales.line.str.rsplit(" ", n=1).str[0]
by_family = sales.groupby(family).revenue.sum().sort_values(ascending=False)
outputs["families"] = by_family.round(2).rename_axis("family").rename("revenue")
result = {"families": len(by_family), "top3": by_family.head(3).round(2).to_dict()}
"""

PARETO = """\
families["share"] = (families.revenue / families.revenue.sum()).round(4)
families["cumulative"] = families.share.cumsum().round(4)
outputs["pareto"] = families
result = {"families_for_80_percent": int((families.cumulative < 0.8).sum()) + 1}
"""


async def tour(s: Session) -> dict:
    """Fetch, compute, chain, chart: which product families made Q4?"""
    sales = (await s.call("fetch_sales", {"since": "2025-10-01"}, "fetch")).structured_content
    fam = await s.call("run_python", {"code": FAMILIES, "inputs": {"sales": sales["dataRef"]}}, "")
    ref = fam.structured_content["outputs"]["families"]["dataRef"]
    pareto = await s.call("run_python", {"code": PARETO, "inputs": {"families": ref}}, "")
    chart = {"dataRef": pareto.structured_content["outputs"]["pareto"]["dataRef"], "x": "family"}
    chart.update(y="revenue", kind="bar", title="Q4 2025 revenue by product family")
    await s.call("render_chart", chart, "")
    return {"notebook": pareto.structured_content["notebook"]}


QOQ_HEADER = """\
# Quarter over quarter, by reference

The session of the article *Pass references, not rows*, recorded by `dataref demo`: an agent \
fetched a year of sales (48,210 rows), computed the quarter-over-quarter change of every \
product line with pandas in the server's sandboxed kernel, ranked the worst lines and drew a \
chart. About 2 KB reached the agent's transcript. Run this notebook from the top to fetch \
the same data again (from the demo source, as you) and recompute the same answers."""

TOUR_NOTES = {
    "intro": """\
# A tour of dataref: fetch, compute, chain, chart

This notebook was recorded from a real MCP session against dataref's demo sales source, \
then annotated. The question: **which product families made the fourth quarter?** \
The agent never saw the rows. It saw *references* (`dataRef`s) and *shapes*, and sent \
pandas code to run where the data is. Each code cell below is one of its tool calls; run \
them from the top and you recompute exactly what it got.""",
    "setup": """\
`dataref.replay` (imported as `dr`) is what makes the notebook run outside the server: \
`dr.fetch_sales` runs the same query as you, `dr.output` and `dr.show` do what the server \
did with a call's outputs and `result`, and `dr.chart` draws a chart like `render_chart`.""",
    "fetch_sales": """\
## 1. Fetch: a reference, not rows

`fetch_sales(since="2025-10-01")` stored the quarter's sales on the server and returned a \
`dataRef` with the data's shape: row count, column types, null counts, a 5-row sample. \
A few hundred bytes, however many rows there are. Here it runs the query again.""",
    "run_python:1": """\
## 2. Compute: pandas where the data is

The agent called `run_python` with `inputs={"sales": <dataRef>}`: the server bound the \
artifact as the DataFrame `sales` in a sandboxed kernel and ran this code. Only `result` \
(small JSON) went back; the DataFrame put in `outputs["families"]` became a **new** \
artifact, with a new `dataRef`. `dr.show(result)` shows what the agent received.""",
    "run_python:2": """\
## 3. Chain: one call's output is the next one's input

The next call took `inputs={"families": <the new dataRef>}`. Nothing travelled through the \
model: the reference did. (Here, `families` is the variable the previous cell bound with \
`dr.output`, which gives the table exactly as the server stored it.)""",
    "render_chart": """\
## 4. Chart: a picture of a reference

`render_chart` drew the `pareto` artifact on the server and returned a PNG for the person, \
plus a `chartRef`. The code below draws the same chart with the same drawing code.""",
    "end": """\
## What to try next

* Change the question: replace `since="2025-10-01"` with another date, or add \
`region="Online"`, and run all cells again.
* Export your own session: ask your agent to call `export_notebook`, or run \
`dataref export default --out my-session.ipynb`.""",
}


def annotate_tour(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    cells, runs = [], 0
    for cell in nb.cells:
        record = cell.metadata.get("dataref", {})
        key = record.get("tool") or record.get("role")
        if key == "run_python":
            runs += 1
            key = f"run_python:{runs}"
        if key == "intro":
            cells.append(new_markdown_cell(TOUR_NOTES["intro"]))
            continue  # the generic transcript intro is replaced by the tour's
        if key in TOUR_NOTES:
            cells.append(new_markdown_cell(TOUR_NOTES[key]))
        cells.append(cell)
    nb.cells = [*cells, new_markdown_cell(TOUR_NOTES["end"])]
    return nb


def write(nb: nbformat.NotebookNode, name: str) -> None:
    nbformat.validate(nb)
    path = HERE / name
    nbformat.write(nb, path)
    print(f"wrote {path} ({len(nb.cells)} cells)")


def main() -> int:
    qoq = asyncio.run(record(article))
    qoq.cells.insert(0, new_markdown_cell(QOQ_HEADER))
    write(qoq, "quarter-over-quarter.ipynb")
    write(annotate_tour(asyncio.run(record(tour))), "teaching-tour.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
