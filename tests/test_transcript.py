"""Every call becomes a cell; the export is data-free and replays to the same results.

A corpus of sessions is driven through a real MCP client (in memory, against the real app
and sandboxed kernels). Each session's exported notebook must validate, hold none of the
values of the session's artifacts, and re-execute with nbclient in a fresh plain kernel to
the very ``result`` each call returned.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import pytest
from fastmcp import Client
from fastmcp.utilities.tests import asgi_server
from nbclient import NotebookClient

from dataref.app import create_app
from dataref.config import Settings
from dataref.store import ArtifactStore
from dataref.walkthrough import QOQ_CODE, WORST_CODE
from tests.conftest import BACKENDS, backend_settings, make_settings
from tests.kernel_support import require_bwrap


@dataclass
class Recorded:
    settings: Settings
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    notebook: Path | None = None  # the exported file
    resource: str | None = None  # the same notebook, read as an MCP resource
    client: Any = None

    async def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        result = await self.client.call_tool(tool, args)
        self.calls.append((tool, args, result.structured_content))
        if tool == "export_notebook":
            self.notebook = Path(result.structured_content["path"])
        return result.structured_content

    async def restart(self) -> None:
        """Close the server (lifespan, kernels) and open a new one on the same state dir."""
        await self.client.__aexit__(None, None, None)
        self.client = Client(create_app(self.settings))
        await self.client.__aenter__()


async def article(s: Recorded) -> None:
    sales = await s.call("fetch_sales", {"since": "2025-01-01"})
    qoq = await s.call("run_python", {"code": QOQ_CODE, "inputs": {"sales": sales["dataRef"]}})
    qoq_ref = qoq["outputs"]["qoq"]["dataRef"]
    await s.call("run_python", {"code": WORST_CODE, "inputs": {"qoq": qoq_ref}})
    await s.call("render_chart", {"dataRef": qoq_ref, "x": "line", "y": "delta", "kind": "bar"})
    s.resource = (await s.client.read_resource(f"dataref://notebooks/{qoq['notebook']}"))[0].text
    await s.call("export_notebook", {})


H1_BY_LINE = (
    "SELECT line, COUNT(*) AS orders_h1, ROUND(SUM(revenue), 2) AS revenue_h1 "
    "FROM sales WHERE date < '2025-07-01' GROUP BY line"
)
CLEAN = """\
df = df.dropna(subset=["price"])
df["month"] = df.date.dt.month
outputs["clean"] = df
result = {"rows": len(df), "months": sorted(df.month.unique().tolist())}
"""
AGGREGATE = """\
by_line = clean.groupby("line").agg(orders_h2=("units", "size"), revenue_h2=("revenue", "sum"))
outputs["by_line"] = by_line
result = {"lines": len(by_line), "revenue": round(by_line.revenue_h2.sum(), 2)}
"""
JOIN_RANK = """\
joined = h2.merge(h1, on="line")
joined["growth"] = (joined.revenue_h2 / joined.revenue_h1 - 1).round(4)
ranked = joined.sort_values("growth", ascending=False).reset_index(drop=True)
ranked["rank"] = ranked.index + 1
outputs["ranked"] = ranked
result = ranked.head(5)[["rank", "growth"]].to_dict("records")
"""


async def chain(s: Recorded) -> None:
    """Clean, aggregate, join with a SQL fetch, rank; one dataRef bound under two names."""
    sales = await s.call("fetch_sales", {"since": "2025-07-01"})
    h1 = await s.call("fetch_sql", {"query": H1_BY_LINE})
    clean = await s.call("run_python", {"code": CLEAN, "inputs": {"df": sales["dataRef"]}})
    clean_ref = clean["outputs"]["clean"]["dataRef"]
    agg = await s.call("run_python", {"code": AGGREGATE, "inputs": {"clean": clean_ref}})
    inputs = {"h2": agg["outputs"]["by_line"]["dataRef"], "h1": h1["dataRef"]}
    ranked = await s.call("run_python", {"code": JOIN_RANK, "inputs": inputs})
    nulls = "result = [int(sales.price.isna().sum()), len(sales.columns)]"
    await s.call("run_python", {"code": nulls, "inputs": {"sales": sales["dataRef"]}})
    args = {"dataRef": ranked["outputs"]["ranked"]["dataRef"], "x": "line", "y": "growth"}
    await s.call("render_chart", {**args, "kind": "bar", "title": "H2 vs H1 revenue growth"})
    await s.call("export_notebook", {})


BROKEN = """\
by_region = sales.groupby("region").revenue.sum()
outputs["by_region"] = by_region
top = sales.groupby("line").revnue.sum()
result = top.nlargest(3).round(2).to_dict()
"""
FIXED = """\
top = sales.groupby("line").revenue.sum()
result = top.nlargest(3).round(2).to_dict()
"""


async def failed_then_fixed(s: Recorded) -> None:
    sales = await s.call("fetch_sales", {"since": "2025-01-01", "until": "2025-06-30"})
    inputs = {"sales": sales["dataRef"]}
    broken = await s.call("run_python", {"code": BROKEN, "inputs": inputs})
    assert not broken["ok"] and "AttributeError" in broken["error"]
    await s.call("run_python", {"code": FIXED, "inputs": inputs})
    ranked = "result = regions.sort_values('revenue').index.tolist()"
    regions = {"regions": broken["outputs"]["by_region"]["dataRef"]}
    await s.call("run_python", {"code": ranked, "inputs": regions})
    await s.call("export_notebook", {})


async def with_reset(s: Recorded) -> None:
    sales = await s.call("fetch_sales", {"since": "2025-10-01"})
    inputs = {"sales": sales["dataRef"]}
    monthly = (
        'sales["month"] = sales.date.dt.month\n'
        'result = sales.groupby("month").revenue.sum().round(2).to_dict()'
    )
    await s.call("run_python", {"code": monthly, "inputs": inputs})
    await s.call("reset_kernel", {})
    await s.call("run_python", {"code": "result = sorted(sales.columns)", "inputs": inputs})
    await s.call("export_notebook", {})


async def across_a_restart(s: Recorded) -> None:
    sales = await s.call("fetch_sales", {"since": "2025-01-01", "region": "North"})
    qoq = await s.call("run_python", {"code": QOQ_CODE, "inputs": {"sales": sales["dataRef"]}})
    await s.call("export_notebook", {})
    s.before_restart = nbformat.read(s.notebook, as_version=4)  # type: ignore[attr-defined]
    await s.restart()
    rising = 'result = qoq.nlargest(3, "delta").round(2).to_dict("records")'
    inputs = {"qoq": qoq["outputs"]["qoq"]["dataRef"]}
    await s.call("run_python", {"code": rising, "inputs": inputs})
    await s.call("export_notebook", {})


SESSIONS = {
    "article": article,
    "chain": chain,
    "failed-then-fixed": failed_then_fixed,
    "reset": with_reset,
    "restart": across_a_restart,
}


@pytest.fixture(scope="module", params=BACKENDS)
def recorded(request, tmp_path_factory) -> dict[str, Recorded]:
    """The sessions, recorded on local kernels and on kernels of each gateway."""
    require_bwrap()
    state = tmp_path_factory.mktemp("transcripts")

    async def record_all() -> dict[str, Recorded]:
        done = {}
        for name, session in SESSIONS.items():
            owner = f"owner-{name}"
            rec = Recorded(backend_settings(request, state, request.param, owner=owner))
            rec.client = Client(create_app(rec.settings))
            await rec.client.__aenter__()
            try:
                await session(rec)
            finally:
                await rec.client.__aexit__(None, None, None)
            done[name] = rec
        return done

    return asyncio.run(record_all())


_replayed: dict[str, nbformat.NotebookNode] = {}


def replay(rec: Recorded) -> nbformat.NotebookNode:
    """The exported notebook, executed top to bottom in a fresh plain python3 kernel."""
    key = str(rec.notebook)
    if key not in _replayed:
        nb = nbformat.read(rec.notebook, as_version=4)
        env = {**os.environ, "DATAREF_STATE_DIR": str(rec.settings.state_dir)}
        env["DATAREF_OWNER"] = rec.settings.owner
        NotebookClient(nb, kernel_name="python3", timeout=180).execute(env=env)
        _replayed[key] = nb
    return _replayed[key]


def artifact_values(rec: Recorded) -> tuple[set[str], set[float]]:
    """Strings, dates and distinctive floats of every artifact the session made."""
    refs = [r["dataRef"] for t, _, r in rec.calls if t.startswith("fetch_")]
    refs += [
        o["dataRef"] for t, _, r in rec.calls if t == "run_python" for o in r["outputs"].values()
    ]
    store = ArtifactStore(rec.settings.state_dir / "store", rec.settings.store)
    strings: set[str] = set()
    floats: set[float] = set()
    try:
        for ref in refs:
            frame = store.read_frame(rec.settings.owner, ref)
            for _, col in frame.items():
                values = col.dropna()
                if pd.api.types.is_datetime64_any_dtype(col):
                    strings |= set(values.dt.strftime("%Y-%m-%d"))
                elif pd.api.types.is_float_dtype(col):
                    floats |= {v for v in values if abs(v) >= 100 and v != round(v)}
                elif not pd.api.types.is_numeric_dtype(col):
                    strings |= {str(v) for v in values}
    finally:
        store.close()
    return strings, floats


@pytest.mark.parametrize("name", SESSIONS)
def test_the_exported_notebook_validates_and_holds_no_outputs(recorded, name):
    nb = nbformat.read(recorded[name].notebook, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert code[0].source.startswith("import dataref.replay as dr")
    calls = [t for t, _, _ in recorded[name].calls if t not in ("export_notebook", "reset_kernel")]
    recorded_tools = [
        c.metadata["dataref"]["tool"] for c in code if "tool" in c.metadata["dataref"]
    ]
    assert recorded_tools == calls  # one cell per call, in order


@pytest.mark.parametrize("name", SESSIONS)
def test_no_value_of_any_artifact_reaches_the_notebook(recorded, name):
    rec = recorded[name]
    text = rec.notebook.read_text()
    strings, floats = artifact_values(rec)
    assert len(strings) > 5 and len(floats) > 5  # the check has something to find
    asked = json.dumps([args for _, args, _ in rec.calls], ensure_ascii=False)
    leaked = [
        s
        for s in strings
        if s not in asked and re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text)
    ]
    assert leaked == []
    numbers = {float(n) for n in re.findall(r"-?\d+\.\d+", text)}
    assert numbers & floats == set()


@pytest.mark.parametrize("name", SESSIONS)
def test_a_replay_from_the_top_gives_every_result_the_agent_got(recorded, name):
    rec = recorded[name]
    nb = replay(rec)
    cells = [c for c in nb.cells if c.cell_type == "code" and c.metadata["dataref"].get("tool")]
    calls = [(t, r) for t, _, r in rec.calls if t not in ("export_notebook", "reset_kernel")]
    assert len(cells) == len(calls)
    compared = 0
    for cell, (tool, response) in zip(cells, calls, strict=True):
        shown = [o for o in cell.outputs if o.output_type == "execute_result"]
        if tool.startswith("fetch_"):
            assert shown[-1].data["text/plain"] == str((response["rows"], len(response["columns"])))
        elif tool == "run_python" and response["ok"]:
            assert all(o.output_type != "error" for o in cell.outputs), cell.source
            if response["result"] is None:
                assert shown == []
            else:
                assert json.loads(shown[-1].data["text/plain"]) == response["result"]
                compared += 1
    assert compared >= 2


def test_a_replayed_chart_is_the_chart_render_chart_drew(recorded):
    rec = recorded["article"]
    nb = replay(rec)
    (chart,) = [c for c in nb.cells if c.metadata.get("dataref", {}).get("tool") == "render_chart"]
    assert chart.source == 'dr.chart(qoq, x="line", y="delta", kind="bar")'
    drawn = base64.b64decode(chart.outputs[-1].data["image/png"])
    (info,) = [r for t, _, r in rec.calls if t == "render_chart"]
    assert drawn == Path(info["path"]).read_bytes()


def test_a_failed_cell_stays_visible_without_stopping_the_run(recorded):
    nb = replay(recorded["failed-then-fixed"])
    failed = [c for c in nb.cells if "raises-exception" in c.metadata.get("tags", [])]
    assert len(failed) == 1
    assert [o.ename for o in failed[0].outputs if o.output_type == "error"] == ["AttributeError"]
    assert failed[0].source.startswith("# In the session this call raised AttributeError.")


def test_a_notebook_survives_a_server_restart_and_keeps_growing(recorded):
    rec = recorded["restart"]
    before = rec.before_restart  # type: ignore[attr-defined]
    after = nbformat.read(rec.notebook, as_version=4)
    assert [c.id for c in after.cells[: len(before.cells)]] == [c.id for c in before.cells]
    notes = [c.source for c in after.cells[len(before.cells) :] if c.cell_type == "markdown"]
    assert len(notes) == 1 and "server restarted" in notes[0]
    assert after.cells[-1].source.startswith('result = qoq.nlargest(3, "delta")')
    assert after.cells[2].source.startswith("sales = dr.fetch_sales(")  # names kept


def test_the_notebook_resource_serves_the_same_data_free_export(recorded):
    rec = recorded["article"]
    served = nbformat.reads(rec.resource, as_version=4)
    nbformat.validate(served)
    exported = nbformat.read(rec.notebook, as_version=4)
    assert [c.source for c in served.cells] == [c.source for c in exported.cells]


async def test_export_over_http_is_a_download_link_for_its_owner_only(tmp_path):
    tokens = {"tok-alice": "alice", "tok-bob": "bob"}
    mcp = create_app(make_settings(tmp_path, auth={"tokens": tokens}), "http", kernels=False)
    async with asgi_server(mcp) as srv:
        async with srv.client(auth="tok-alice") as alice:
            await alice.call_tool("fetch_sales", {"since": "2025-12-30"})
            info = (await alice.call_tool("export_notebook", {})).structured_content
        assert info["url"].startswith("http://127.0.0.1/download/") and "path" not in info
        async with srv.http_client() as http:
            mine = await http.get(info["url"], headers={"authorization": "Bearer tok-alice"})
            theirs = await http.get(info["url"], headers={"authorization": "Bearer tok-bob"})
        assert mine.status_code == 200 and theirs.status_code == 404
        nb = nbformat.reads(mine.text, as_version=4)
        nbformat.validate(nb)
        assert nb.cells[-1].source == 'sales = dr.fetch_sales(since="2025-12-30")\nsales.shape'
        async with srv.client(auth="tok-bob") as bob:
            with pytest.raises(Exception, match="unknown notebook"):
                await bob.read_resource(f"dataref://notebooks/{info['notebook']}")
