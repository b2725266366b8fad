"""A notebook exported from a real session, run in JupyterLab in headless Chromium.

The session is the article's: fetch_sales, the quarter-over-quarter run_python, a chart,
export_notebook. A person then opens the exported .ipynb in JupyterLab, picks Run -> Run All
Cells, and must see the very answers the agent got. The screenshot is kept in test-output/.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client

from dataref.app import create_app
from dataref.walkthrough import QOQ_CODE

from ..conftest import free_port, make_settings
from .conftest import NODE_BIN
from .node import HERE

QOQ = QOQ_CODE  # the article's code, verbatim
WORST = """\
falling = qoq[qoq.delta < 0]
result = {"lines_down": int(len(falling)), "total_drop": round(float(falling.delta.sum()), 2)}
"""
JUPYTER = str(Path(sys.executable).parent / "jupyter")


async def record_session(state_dir: Path) -> tuple[Path, list[Any]]:
    """The article's session through MCP; the exported notebook and the results the agent got."""
    settings = make_settings(state_dir, owner="analyst")
    async with Client(create_app(settings, "memory")) as client:
        sales = (await client.call_tool("fetch_sales", {"since": "2025-01-01"})).data
        first = await client.call_tool(
            "run_python", {"code": QOQ, "inputs": {"sales": sales["dataRef"]}}
        )
        assert first.structured_content["ok"], first.structured_content
        qoq = first.structured_content["outputs"]["qoq"]["dataRef"]
        second = await client.call_tool("run_python", {"code": WORST, "inputs": {"qoq": qoq}})
        assert second.structured_content["ok"], second.structured_content
        chart = await client.call_tool(
            "render_chart", {"dataRef": qoq, "x": "line", "y": "delta", "kind": "bar"}
        )
        assert not chart.is_error
        exported = (await client.call_tool("export_notebook", {})).structured_content
    expected = [first.structured_content["result"], second.structured_content["result"]]
    return Path(exported["path"]), expected


def write_setting(home: Path, plugin: str, values: dict[str, Any]) -> None:
    """A user setting of a JupyterLab plugin, e.g. notebook-extension/tracker."""
    path = home / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values))


class JupyterLab:
    """`jupyter lab` on 127.0.0.1 with a token, its config and state in a temp dir."""

    def __init__(self, root: Path, home: Path, env: dict[str, str]) -> None:
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        for name in ("config", "runtime", "settings", "workspaces"):
            (home / name).mkdir(parents=True, exist_ok=True)
        # No news fetches (the network is closed), and every cell rendered in the page.
        write_setting(home, "apputils-extension/notification", {"fetchNews": "false"})
        write_setting(home, "notebook-extension/tracker", {"windowingMode": "none"})
        lab_env = {
            **env,
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        }
        self.log = (home / "lab.log").open("wb")
        self.proc = subprocess.Popen(
            [
                JUPYTER, "lab", "--no-browser", "--allow-root",
                "--ip=127.0.0.1", f"--port={self.port}",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={root}",
                "--LabApp.news_url=",
            ],
            env=lab_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self._wait(home / "lab.log")

    def _wait(self, log: Path) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {log.read_text()[-3000:]}")
            try:
                status = httpx2.get(f"{self.url}/api/status?token={self.token}", timeout=2)
                if status.status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"jupyter lab did not start: {log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[tuple[JupyterLab, str, list[Any]]]:
    import asyncio

    base = tmp_path_factory.mktemp("lab")
    exported, expected = asyncio.run(record_session(base / "session-state"))
    root = base / "root"
    root.mkdir()
    shutil.copy(exported, root / "session.ipynb")
    # The person re-running it: their own state dir, the same (demo) source, as themselves.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    env |= {"DATAREF_STATE_DIR": str(base / "reader-state"), "DATAREF_OWNER": "reader"}
    server = JupyterLab(root, base / "jupyter", env)
    yield server, "session.ipynb", expected
    server.stop()


def shown_value(text: str) -> Any:
    """The JSON that `dr.show(result)` displays (the last output of a run_python cell)."""
    return json.loads(text)


def test_the_exported_notebook_run_in_jupyterlab_shows_the_agents_results(
    lab: tuple[JupyterLab, str, list[Any]], node_env, chromium: Path, output_dir: Path
) -> None:
    server, notebook, expected = lab
    screenshot = output_dir / "jupyterlab.png"
    started = time.monotonic()
    done = subprocess.run(
        [
            str(NODE_BIN / "node"), str(HERE / "run_notebook.mjs"),
            server.url, server.token, notebook, str(screenshot), "240000",
        ],
        env={**node_env, "CHROMIUM": str(chromium)},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    cells = json.loads(done.stdout.strip().splitlines()[-1])["cells"]
    took = time.monotonic() - started

    assert cells and all(c["prompt"].strip().startswith("[") for c in cells)
    assert not [c["source"][:80] for c in cells if c["error"]], "a cell raised"
    answers = [c for c in cells if "result =" in c["source"]]
    assert len(answers) == len(expected)
    for cell, want in zip(answers, expected, strict=True):
        got = shown_value(cell["outputs"][-1])
        assert got == pytest.approx(want), (cell["source"][:200], got, want)
    charts = [c for c in cells if c["source"].startswith("dr.chart(")]
    assert charts and all(c["images"] >= 1 for c in charts), "the chart is not drawn"
    assert screenshot.stat().st_size > 10_000
    print(f"\nJupyterLab ran {len(cells)} cells in Chromium in {took:.1f}s; results match")
