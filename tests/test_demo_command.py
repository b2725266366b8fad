"""`dataref demo`: the article's session through a real MCP client over stdio."""

from __future__ import annotations

import json
import subprocess

import nbformat
import pytest

from tests.conftest import DATAREF, child_env
from tests.kernel_support import require_bwrap


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[dict, str]:
    require_bwrap()
    tmp = tmp_path_factory.mktemp("demo")
    env = child_env(tmp / "unused")  # the demo makes its own temporary state dir
    del env["DATAREF_STATE_DIR"]
    proc = subprocess.run(
        [DATAREF, "demo", "--out", str(tmp / "out"), "--json"],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def test_the_fetch_and_the_quarter_over_quarter_call_cost_at_most_2_kb(demo):
    summary, _ = demo
    tools = [c["tool"] for c in summary["calls"]]
    assert tools == ["fetch_sales", "run_python", "run_python", "render_chart", "export_notebook"]
    assert summary["rows"] > 40_000
    assert 0 < summary["fetch_and_qoq_bytes"] <= 2048
    assert summary["total_json_bytes"] == sum(c["json_bytes"] for c in summary["calls"])
    assert summary["calls"][3]["image_bytes"] > 1000  # the chart reaches the model as an image


def test_the_demo_writes_the_data_free_notebook_and_the_chart(demo):
    summary, _ = demo
    nb = nbformat.read(summary["notebook"], as_version=4)
    nbformat.validate(nb)
    assert nb.cells[2].source.startswith('sales = dr.fetch_sales(since="2025-01-01")')
    with open(summary["chart"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
