"""The foundation through real MCP clients: in-memory, stdio (official SDK), real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx2
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from dataref.app import create_app

from .conftest import DATAREF, HttpServer, child_env, make_settings

NEVER_ISSUED = "data_AAAAAAAAAAAAAAAAAAAAAA"


@pytest.fixture
async def client(settings):
    async with Client(create_app(settings, "memory", kernels=False)) as c:
        yield c


async def test_the_tools_of_the_contract_are_listed_with_annotations(client):
    tools = {t.name: t for t in await client.list_tools()}
    for name in (
        "fetch_sales",
        "fetch_sql",
        "run_python",
        "describe_data",
        "list_artifacts",
        "reset_kernel",
    ):
        assert name in tools
    assert tools["describe_data"].annotations.read_only_hint is True
    assert "notebook" in tools["fetch_sales"].input_schema["properties"]
    assert "since" in tools["fetch_sales"].input_schema["required"]


async def test_the_instructions_teach_the_workflow(client):
    text = client.instructions or ""
    assert "run_python" in text and "dataRef" in text and "raw rows" in text


async def test_fetch_sales_returns_a_compact_description(client):
    result = await client.call_tool("fetch_sales", {"since": "2025-01-01"})
    desc = result.structured_content
    assert desc["dataRef"].startswith("data_")
    assert 40_000 <= desc["rows"] <= 60_000
    assert desc["columns"]["date"].startswith("datetime64")
    assert set(desc["columns"]) == {"date", "line", "region", "units", "price", "revenue"}
    assert 0 < len(desc["sample"]) <= 5
    assert set(desc.get("nulls", {})) <= {"price", "revenue"}
    wire = json.dumps(desc, separators=(",", ":"))
    assert len(wire) < 1200, wire


async def test_describe_data_and_list_artifacts_see_the_fetched_table(client):
    ref = (await client.call_tool("fetch_sales", {"since": "2025-10-01"})).structured_content[
        "dataRef"
    ]
    stats = (await client.call_tool("describe_data", {"dataRef": ref})).structured_content
    assert stats["columns"]["units"]["min"] >= 1
    assert {"mean", "std", "p50"} <= set(stats["columns"]["revenue"])
    assert "top" in stats["columns"]["region"]
    listing = (await client.call_tool("list_artifacts", {})).structured_content["artifacts"]
    assert [a["ref"] for a in listing] == [ref]
    assert listing[0]["origin"] == "fetch_sales" and "expires" in listing[0]


async def test_a_sensitive_source_gives_no_sample_and_no_top_values(tmp_path):
    settings = make_settings(tmp_path, demo={"sensitive": True})
    async with Client(create_app(settings, "memory", kernels=False)) as c:
        desc = (await c.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
        assert desc["sample"] == [] and desc["rows"] > 0
        stats = (
            await c.call_tool("describe_data", {"dataRef": desc["dataRef"]})
        ).structured_content
        assert "top" not in stats["columns"]["line"]


async def test_tool_errors_name_the_way_to_recover(client):
    cases = [
        ("describe_data", {"dataRef": NEVER_ISSUED}, "fetch the data again"),
        ("fetch_sales", {"since": "yesterday"}, "YYYY-MM-DD"),
        ("fetch_sql", {"query": "DELETE FROM sales"}, "SELECT"),
        ("fetch_sales", {"since": "2025-01-01", "notebook": "nb_nope"}, "omit `notebook`"),
    ]
    for tool, args, hint in cases:
        with pytest.raises(ToolError) as err:
            await client.call_tool(tool, args)
        assert hint in str(err.value), (tool, str(err.value))


async def test_internal_errors_are_masked(settings, monkeypatch):
    mcp = create_app(settings, "memory", kernels=False)
    from dataref import workspace

    def boom(self, owner, ref):
        raise RuntimeError("secret /srv/path password=hunter2")

    monkeypatch.setattr(workspace.Workspace, "describe_data", boom)
    async with Client(mcp) as c:
        with pytest.raises(ToolError) as err:
            await c.call_tool("describe_data", {"dataRef": NEVER_ISSUED})
    assert "hunter2" not in str(err.value) and "/srv" not in str(err.value)


async def test_region_grants_restrict_what_an_owner_fetches(tmp_path):
    settings = make_settings(tmp_path, owner="bob", demo={"grants": {"bob": ["North"]}})
    async with Client(create_app(settings, "memory", kernels=False)) as c:
        desc = (await c.call_tool("fetch_sales", {"since": "2025-01-01"})).structured_content
        assert all(row["region"] == "North" for row in desc["sample"])
        stats = (
            await c.call_tool("describe_data", {"dataRef": desc["dataRef"]})
        ).structured_content
        assert stats["columns"]["region"]["unique"] == 1
        with pytest.raises(ToolError, match="North"):
            await c.call_tool("fetch_sales", {"since": "2025-01-01", "region": "South"})


# -- stdio, with the official MCP SDK client spawning the console script ---------------


async def test_the_console_script_serves_stdio_to_the_official_sdk_client(tmp_path):
    params = StdioServerParameters(
        command=DATAREF, args=["serve"], env=child_env(tmp_path, DATAREF_OWNER="carol")
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.server_info.name == "dataref"
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"fetch_sales", "run_python"} <= names
        res = await session.call_tool("fetch_sales", {"since": "2025-12-01"})
        assert not res.is_error
        assert res.structured_content["rows"] > 1000


def _stdio_call(state_dir, tool: str, args: dict) -> dict:
    """One call through a fresh `dataref serve` process, returning structured content."""
    code = (
        "import asyncio, json, sys\n"
        "from fastmcp import Client\n"
        "from fastmcp.client.transports import StdioTransport\n"
        "async def main():\n"
        f"    t = StdioTransport({DATAREF!r}, ['serve'], env={child_env(state_dir)!r})\n"
        "    async with Client(t) as c:\n"
        f"        r = await c.call_tool({tool!r}, {args!r}, raise_on_error=False)\n"
        "        print(json.dumps(r.structured_content or {'error': r.content[0].text}))\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_artifact_outlives_a_sigkilled_server(tmp_path):
    env = child_env(tmp_path)
    server = subprocess.Popen(
        [DATAREF, "serve"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        ref = _first_ref_via_raw_stdio(server)
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
    listing = _stdio_call(tmp_path, "describe_data", {"dataRef": ref})
    assert listing["rows"] > 1000


def _first_ref_via_raw_stdio(server: subprocess.Popen) -> str:
    """Speak the handshake-era protocol by hand, so the server is never shut down cleanly."""

    def send(msg: dict) -> None:
        server.stdin.write((json.dumps(msg) + "\n").encode())
        server.stdin.flush()

    def receive(msg_id: int) -> dict:
        while True:
            line = server.stdout.readline()
            assert line, "server closed stdout"
            msg = json.loads(line)
            if msg.get("id") == msg_id:
                return msg

    send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        }
    )
    receive(1)
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send(
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "fetch_sales", "arguments": {"since": "2025-11-01"}},
        }
    )
    reply = receive(2)
    return reply["result"]["structuredContent"]["dataRef"]


# -- real HTTP with bearer tokens -------------------------------------------------------


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    server = HttpServer(tmp_path_factory.mktemp("http"), {"tok-alice": "alice", "tok-bob": "bob"})
    yield server
    server.stop()


async def test_two_tokens_are_two_owners_and_a_foreign_ref_looks_never_issued(http_server):
    async with Client(f"{http_server.url}/mcp", auth="tok-alice") as alice:
        ref = (await alice.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content[
            "dataRef"
        ]
        assert (await alice.call_tool("describe_data", {"dataRef": ref})).structured_content
    async with Client(f"{http_server.url}/mcp", auth="tok-bob") as bob:
        foreign = await bob.call_tool("describe_data", {"dataRef": ref}, raise_on_error=False)
        never = await bob.call_tool(
            "describe_data", {"dataRef": NEVER_ISSUED}, raise_on_error=False
        )
        assert foreign.is_error and never.is_error
        assert foreign.content[0].text.replace(ref, "R") == never.content[0].text.replace(
            NEVER_ISSUED, "R"
        )
        listing = (await bob.call_tool("list_artifacts", {})).structured_content
        assert listing["artifacts"] == []


def test_no_token_or_a_bad_token_gets_401(http_server):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"accept": "application/json, text/event-stream"}
    assert httpx2.post(f"{http_server.url}/mcp", json=body, headers=headers).status_code == 401
    bad = {**headers, "authorization": "Bearer nope"}
    assert httpx2.post(f"{http_server.url}/mcp", json=body, headers=bad).status_code == 401


def test_http_without_any_auth_configured_refuses_to_start(tmp_path):
    out = subprocess.run(
        [DATAREF, "serve", "--http", "--port", "0"],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "authentication" in out.stderr


async def test_without_a_sandbox_the_server_serves_data_and_run_python_says_why(
    settings, monkeypatch
):
    monkeypatch.setattr("dataref.kernels.check.BWRAP", "/nonexistent/bwrap")
    async with Client(create_app(settings, "memory")) as c:
        desc = (await c.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
        assert desc["rows"] > 0
        with pytest.raises(ToolError) as err:
            await c.call_tool("run_python", {"code": "result = 1"})
    text = str(err.value)
    assert "bubblewrap" in text and "dataref doctor" in text and "unavailable" in text


async def test_the_tool_definitions_stay_under_6_kb(client):
    tools = await client.list_tools()
    wire = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    size = len(json.dumps({"tools": wire}, separators=(",", ":")))
    assert size <= 6 * 1024, size
    for tool in wire:
        assert tool["description"], tool["name"]


async def test_every_tool_is_documented_in_the_readme(client):
    from .conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    for tool in await client.list_tools():
        assert f"`{tool.name}`" in readme, tool.name


async def test_drop_artifact_frees_quota_and_the_ref_is_then_unknown(client):
    ref = (await client.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content[
        "dataRef"
    ]
    dropped = (await client.call_tool("drop_artifact", {"dataRef": ref})).structured_content
    assert dropped["dropped"] == ref and dropped["freed_bytes"] > 0
    with pytest.raises(ToolError, match="fetch the data again"):
        await client.call_tool("describe_data", {"dataRef": ref})
    with pytest.raises(ToolError, match="fetch the data again"):
        await client.call_tool("drop_artifact", {"dataRef": ref})
