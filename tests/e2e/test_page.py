"""The page for people, in headless Chromium, against real servers.

A person signs in with a token and watches their default notebook while an MCP client runs
the article's session over HTTP: each cell, and the chart's image, must appear within a second
of the call's reply. The lineage view must draw fetch -> QoQ -> chart; another owner's cookie
gets 404s; a POST without the CSRF token is refused. Screenshots go to test-output/.

``dataref view`` over a stdio server's state dir serves the same page, refuses requests
without its token, and follows the stdio server's calls live; ``dataref lab`` opens JupyterLab
on the exported notebook.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client

from dataref.walkthrough import Session, article

from ..conftest import DATAREF, HttpServer, child_env, free_port
from .conftest import NODE_BIN
from .node import HERE

TOKEN, OTHER = "tok-page", "tok-page-other"
WITHIN_MS = 1000


class TimedSession(Session):
    """The walkthrough's session, noting when each reply reached the client (ms, wall clock)."""

    replies: list[tuple[str, float]]

    async def call(self, tool: str, arguments: dict[str, Any], label: str) -> Any:
        result = await super().call(tool, arguments, label)
        self.replies.append((tool, time.time() * 1000))
        return result


class Browser:
    """tests/e2e/watch_page.mjs: Chromium on the page, its reports read as they come."""

    def __init__(self, base: str, token: str, out: Path, env: dict[str, str], chromium: Path):
        self.proc = subprocess.Popen(
            [str(NODE_BIN / "node"), str(HERE / "watch_page.mjs"), base, token, str(out)],
            env={**env, "CHROMIUM": str(chromium)},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def wait(self, event: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = self.events.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    error = self.proc.stderr.read() if self.proc.stderr else ""
                    raise RuntimeError(f"the browser script exited: {error}") from None
                continue
            self.seen.append(got)
            if got["event"] == event:
                return got
        raise TimeoutError(f"no {event!r} from the browser; saw {self.seen}")

    def drain(self) -> None:
        while not self.events.empty():
            self.seen.append(self.events.get())

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[HttpServer]:
    state = tmp_path_factory.mktemp("page-http")
    server = HttpServer(state, {TOKEN: "viewer", OTHER: "someone-else"})
    yield server
    server.stop()


async def run_article(url: str) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    async with Client(f"{url}/mcp", auth=TOKEN) as client:
        session = TimedSession(client, echo=False)
        session.replies = []
        done = await article(session)
    return done, session.replies


def first_seen(events: list[dict[str, Any]], kind: str) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["event"] == kind and e["index"] not in out:
            out[e["index"]] = e
    return out


@contextlib.contextmanager
def signed_in_client(url: str, token: str) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=url, timeout=30) as client:
        assert client.post("/signin", data={"token": token}).status_code == 303
        yield client


def test_a_person_watches_the_article_session_live_and_sees_its_lineage(
    server, node_env, chromium, output_dir
):
    browser = Browser(server.url, TOKEN, output_dir, node_env, chromium)
    try:
        browser.wait("ready")
        done, replies = asyncio.run(run_article(server.url))
        browser.wait("image", timeout=10)
        time.sleep(1.5)  # anything late would arrive now, and fail the timing below
        browser.drain()
        cells, images = first_seen(browser.seen, "cell"), first_seen(browser.seen, "image")
        calls = [(tool, at) for tool, at in replies if tool != "export_notebook"]
        assert [cells[i]["tool"] for i in sorted(cells)] == [tool for tool, _ in calls]
        for (tool, replied), index in zip(calls, sorted(cells), strict=True):
            late = cells[index]["t"] - replied
            assert late <= WITHIN_MS, f"{tool} cell appeared {late:.0f} ms after its reply"
            print(f"\n{tool}: the cell appeared {late:+.0f} ms from the reply", end="")
        chart_index = max(cells)
        assert cells[chart_index]["tool"] == "render_chart"
        assert images[chart_index]["t"] - calls[-1][1] <= WITHIN_MS
        assert images[chart_index]["width"] > 100
        qoq_cell = cells[min(cells) + 1]
        assert qoq_cell["tool"] == "run_python" and qoq_cell["result"], "the result is not shown"
        assert not [e for e in browser.seen if e["event"] == "pageerror"]

        browser.send("shot")
        browser.wait("shot")
        check_lineage(browser, server.url, done["chart"].structured_content["chartRef"])
        check_another_owner(server.url, done["notebook"])
        browser.send(f"nocsrf /notebooks/{done['notebook']}/reset")
        assert browser.wait("nocsrf")["status"] == 403
        assert (output_dir / "page-notebook.png").stat().st_size > 20_000
        assert (output_dir / "page-lineage.png").stat().st_size > 10_000
    finally:
        browser.stop()


def check_lineage(browser: Browser, url: str, chart: str) -> None:
    """fetch_sales -> sales -> run_python cell -> qoq -> render_chart -> the chart."""
    browser.send("lineage")
    edges = {tuple(e) for e in browser.wait("lineage")["edges"]}
    into = {target: source for source, target in edges}
    chart_call = into[chart]
    qoq = into[chart_call]
    cell = into[qoq]
    sales = [s for s, t in edges if t == cell]
    assert chart_call == f"call:{chart}" and cell.startswith("cell:")
    assert len(sales) == 1 and into[sales[0]] == f"call:{sales[0]}"
    with signed_in_client(url, TOKEN) as client:
        table = client.get("/artifacts").text
    assert re.search(rf"<b>qoq</b> <code>{qoq}</code>", table)


def check_another_owner(url: str, notebook: str) -> None:
    with signed_in_client(url, TOKEN) as owner:
        page = owner.get("/artifacts").text
        refs = re.findall(r'data-ref="((?:data|chart)_[^"]+)"', page)
        assert owner.get(f"/notebooks/{notebook}").status_code == 200
    with signed_in_client(url, OTHER) as other:
        missing = other.get(f"/notebooks/nb_{'x' * 22}")
        assert missing.status_code == 404
        foreign = other.get(f"/notebooks/{notebook}")
        assert (foreign.status_code, foreign.text) == (404, missing.text)
        for ref in refs:
            for path in (f"/artifacts/{ref}/image", f"/artifacts/{ref}/download/csv"):
                response = other.get(path)
                assert (response.status_code, response.text) == (404, missing.text), path
        assert not re.findall(r"(?:data|chart)_[A-Za-z0-9_-]{16,}", other.get("/artifacts").text)


# -- dataref view and dataref lab, over a stdio server's state dir ------------------------


class Process:
    """A dataref subcommand whose first stdout lines we read (the view's URL)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [DATAREF, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def url(self, pattern: str, timeout: float = 60) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                break
            found = re.search(pattern, line)
            if found:
                return found.group(0)
        raise RuntimeError("no URL printed")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stdio_client(env: dict[str, str]) -> Client:
    from fastmcp.client.transports import StdioTransport

    transport = StdioTransport(sys.executable, ["-m", "dataref.cli", "serve"], env=env)
    return Client(transport)


def sse_cells(url: str, cookies: Any, found: queue.Queue[tuple[int, float]]) -> None:
    """Read the notebook's event stream; put (index, ms) of every cell event."""
    timeout = httpx2.Timeout(30, read=60)
    with (
        contextlib.suppress(httpx2.HTTPError),  # the view stops at the end of the test
        httpx2.Client(cookies=cookies, timeout=timeout) as client,
        client.stream("GET", url) as response,
    ):
        event = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "cell":
                found.put((json.loads(line[5:])["index"], time.time() * 1000))


def test_dataref_view_serves_a_stdio_servers_notebook_live_and_wants_its_token(tmp_path):
    state = tmp_path / "state"
    env = child_env(state, DATAREF_OWNER="local-person")
    view = None

    async def session() -> None:
        nonlocal view
        async with stdio_client(env) as client:
            await client.call_tool("fetch_sales", {"since": "2025-10-01"})
            view = Process(["view", "--state-dir", str(state)], env)
            url = view.url(r"http://127\.0\.0\.1:\d+/\?token=\S+")
            base = url.split("/?")[0]
            with httpx2.Client(base_url=base, timeout=60) as stranger:  # a loaded CI machine
                assert stranger.get("/").status_code == 401
                assert stranger.get("/?token=nope").status_code == 401
                assert stranger.get("/notebooks/default").status_code == 303  # to sign-in
            with httpx2.Client(base_url=base, follow_redirects=True, timeout=60) as person:
                home = person.get(url)
                assert home.status_code == 200 and "/notebooks/nb_" in home.text
                handle = re.search(r"/notebooks/(nb_[A-Za-z0-9_-]+)", home.text).group(1)
                page = person.get(f"/notebooks/{handle}").text
                assert 'data-tool="fetch_sales"' in page
                found: queue.Queue[tuple[int, float]] = queue.Queue()
                events = f"{base}/notebooks/{handle}/events"
                reader = threading.Thread(
                    target=sse_cells, args=(events, person.cookies, found), daemon=True
                )
                reader.start()
                first = [found.get(timeout=30) for _ in range(3)]  # intro, setup, fetch
                assert [i for i, _ in first] == [0, 1, 2]
                await client.call_tool("fetch_sales", {"since": "2025-12-01", "region": "North"})
                replied = time.time() * 1000
                index, at = found.get(timeout=5)
                assert index == 3 and at - replied <= WITHIN_MS, (index, at - replied)

    try:
        asyncio.run(session())
    finally:
        if view is not None:
            view.stop()


def test_dataref_lab_opens_jupyterlab_on_the_exported_notebook(tmp_path):
    state, root, home = tmp_path / "state", tmp_path / "lab", tmp_path / "jupyter"
    root.mkdir()
    env = child_env(state, DATAREF_OWNER="local-person")

    async def record() -> None:
        async with stdio_client(env) as client:
            await client.call_tool("fetch_sales", {"since": "2025-10-01"})

    asyncio.run(record())
    port, token = free_port(), secrets.token_hex(16)
    lab_env = {**env, **{f"JUPYTER_{k}_DIR": str(home / k.lower()) for k in ("CONFIG", "RUNTIME")}}
    lab_env["JUPYTERLAB_SETTINGS_DIR"] = str(home / "settings")
    lab_env["JUPYTERLAB_WORKSPACES_DIR"] = str(home / "workspaces")
    lab_env["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    lab = Process(
        [
            "lab", "--state-dir", str(state), "--dir", str(root), "--",
            "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
            f"--IdentityProvider.token={token}", "--LabApp.news_url=",
        ],
        lab_env,
    )  # fmt: skip
    try:
        exported = next(root.glob("nb_*.ipynb"), None) or _wait_for_file(root)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                got = httpx2.get(
                    f"http://127.0.0.1:{port}/api/contents/{exported.name}?token={token}", timeout=2
                )
                if got.status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            assert lab.proc.poll() is None, "dataref lab exited"
            time.sleep(0.5)
        else:
            raise AssertionError("JupyterLab did not serve the exported notebook")
        cells = got.json()["content"]["cells"]
        assert any("dr.fetch_sales(" in c["source"] for c in cells)
        assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code")
    finally:
        lab.stop()
    with contextlib.suppress(httpx2.HTTPError):  # stopping `dataref lab` stopped JupyterLab
        httpx2.get(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
        raise AssertionError("JupyterLab outlived `dataref lab`")


def _wait_for_file(root: Path) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = next(root.glob("nb_*.ipynb"), None)
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError("dataref lab wrote no notebook")
