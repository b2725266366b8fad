"""export_data and download links: files go from the store to a person, never to the model."""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pandas as pd
import pyarrow as pa
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from dataref import consumers, downloads
from dataref.app import create_app
from dataref.config import local_user
from dataref.errors import InvalidRequest

from .conftest import HttpServer, free_port, make_settings

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
RESULT_KEYS = {"rows", "bytes", "format", "expires"}


def stored_frame(state_dir: Path, ref: str) -> pd.DataFrame:
    """The artifact exactly as the store holds it (read from its Arrow file, not via MCP)."""
    with pa.memory_map(str(state_dir / "store" / "blobs" / f"{ref}.arrow")) as f:
        return pa.ipc.open_file(f).read_all().to_pandas()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    state = tmp_path_factory.mktemp("exports-http")
    srv = HttpServer(state, TOKENS)
    srv.state_dir = state
    yield srv
    srv.stop()


async def fetch(url: str, token: str, since: str = "2025-11-01") -> str:
    async with Client(f"{url}/mcp", auth=token) as client:
        result = await client.call_tool("fetch_sales", {"since": since})
    return result.structured_content["dataRef"]


async def export(url: str, token: str, ref: str, fmt: str = "csv", tool: str = "export_data"):
    args = {"dataRef": ref} if tool == "export_csv" else {"dataRef": ref, "format": fmt}
    async with Client(f"{url}/mcp", auth=token) as client:
        return (await client.call_tool(tool, args)).structured_content


# -- over real HTTP (uvicorn in a subprocess, static bearer tokens) ----------------------


async def test_a_csv_export_downloads_with_the_owners_token_and_round_trips(server):
    ref = await fetch(server.url, "tok-alice")
    info = await export(server.url, "tok-alice", ref, "csv")
    assert set(info) == RESULT_KEYS | {"url"} and info["format"] == "csv"
    assert info["url"].startswith(f"{server.url}/download/")
    token = info["url"].rsplit("/", 1)[1]
    assert len(token) >= 22  # >= 128 random bits, url-safe base64
    reply = httpx2.get(info["url"], headers=bearer("tok-alice"))
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/csv")
    assert f'filename="{ref}.csv"' in reply.headers["content-disposition"]
    assert len(reply.content) == info["bytes"]
    expected = stored_frame(server.state_dir, ref)
    got = pd.read_csv(io.BytesIO(reply.content), parse_dates=["date"])
    assert info["rows"] == len(expected) == len(got)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert b"2025-11-01," in reply.content  # dates a spreadsheet reads, not nanoseconds


async def test_a_parquet_export_round_trips_exactly(server):
    ref = await fetch(server.url, "tok-alice", since="2025-12-01")
    info = await export(server.url, "tok-alice", ref, "parquet")
    reply = httpx2.get(info["url"], headers=bearer("tok-alice"))
    assert reply.status_code == 200
    got = pd.read_parquet(io.BytesIO(reply.content))
    pd.testing.assert_frame_equal(got, stored_frame(server.state_dir, ref))


async def test_export_csv_is_an_alias_of_export_data_as_csv(server):
    ref = await fetch(server.url, "tok-bob", since="2025-12-15")
    info = await export(server.url, "tok-bob", ref, tool="export_csv")
    assert info["format"] == "csv"
    assert httpx2.get(info["url"], headers=bearer("tok-bob")).status_code == 200


async def test_another_owner_gets_404_and_no_token_gets_401(server):
    ref = await fetch(server.url, "tok-alice", since="2025-12-20")
    url = (await export(server.url, "tok-alice", ref))["url"]
    foreign = httpx2.get(url, headers=bearer("tok-bob"))
    made_up = httpx2.get(f"{server.url}/download/{'A' * 32}", headers=bearer("tok-bob"))
    assert foreign.status_code == made_up.status_code == 404
    assert foreign.text == made_up.text  # someone else's link looks like no link at all
    anonymous = httpx2.get(url)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert httpx2.get(url, headers=bearer("tok-nobody")).status_code == 401


async def test_another_owner_cannot_export_my_ref(server):
    ref = await fetch(server.url, "tok-alice", since="2025-12-28")
    async with Client(f"{server.url}/mcp", auth="tok-bob") as bob:
        with pytest.raises(ToolError, match="unknown or expired dataRef"):
            await bob.call_tool("export_data", {"dataRef": ref, "format": "csv"})


@contextlib.contextmanager
def uvicorn_thread(mcp) -> Iterator[str]:
    """The app on real uvicorn in a thread of this process, so a test can move the clock."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(mcp.http_app(path="/mcp"), host="127.0.0.1", port=port)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


async def test_an_expired_link_is_refused_with_the_way_to_recover(tmp_path, monkeypatch):
    settings = make_settings(tmp_path, auth={"tokens": TOKENS})
    with uvicorn_thread(create_app(settings, "http", kernels=False)) as url:
        ref = await fetch(url, "tok-alice", since="2025-12-30")
        link = (await export(url, "tok-alice", ref))["url"]
        async with httpx2.AsyncClient() as http:
            assert (await http.get(link, headers=bearer("tok-alice"))).status_code == 200
            later = time.time() + settings.server.download_ttl_seconds + 1
            monkeypatch.setattr(downloads, "clock", lambda: later)
            reply = await http.get(link, headers=bearer("tok-alice"))
            assert reply.status_code == 410
            assert "the link expired - call export_data again" in reply.text
            assert (await http.get(link, headers=bearer("tok-bob"))).status_code == 404


# -- stdio-like (in-memory): a local path, never the rows ---------------------------------


@pytest.fixture
async def local(settings):
    mcp = create_app(settings, "memory", kernels=False)
    async with Client(mcp) as client:
        yield client, mcp._lifespan_result["workspace"]


async def test_off_http_an_export_is_a_local_path_and_never_the_rows(local):
    client, _ = local
    desc = (await client.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
    result = await client.call_tool("export_data", {"dataRef": desc["dataRef"]})
    info = result.structured_content
    assert set(info) == RESULT_KEYS | {"path"}
    path = Path(info["path"])
    assert path.is_file() and path.stat().st_size == info["bytes"]
    assert len(pd.read_csv(path)) == info["rows"] == desc["rows"]
    assert len(result.content[0].text) < 300  # the answer is where the file is, not what is in it


async def test_a_bad_format_lists_the_formats(local):
    client, ws = local
    ref = ws.store.put_frame(local_user(), pd.DataFrame({"a": [1]}), lineage={}).ref
    with pytest.raises(ToolError, match=r"csv.*parquet"):
        await client.call_tool("export_data", {"dataRef": ref, "format": "xlsx"})
    with pytest.raises(InvalidRequest, match="formats are: csv, parquet"):
        consumers.export_data(ws, local_user(), data_ref=ref, fmt="xlsx")


async def test_categories_export_as_text_and_nested_columns_need_parquet(local):
    _, ws = local
    owner = local_user()
    cats = pd.DataFrame({"region": pd.Categorical(["North", "South", "North"]), "n": [1, 2, 3]})
    ref = ws.store.put_frame(owner, cats, lineage={}).ref
    path = consumers.export_data(ws, owner, data_ref=ref, fmt="csv")["path"]
    assert pd.read_csv(path)["region"].tolist() == ["North", "South", "North"]
    nested = pd.DataFrame({"tags": [["a", "b"], ["c"]]})
    ref = ws.store.put_frame(owner, nested, lineage={}).ref
    with pytest.raises(InvalidRequest, match="export as parquet"):
        consumers.export_data(ws, owner, data_ref=ref, fmt="csv")
    path = consumers.export_data(ws, owner, data_ref=ref, fmt="parquet")["path"]
    assert pd.read_parquet(path)["tags"].map(list).tolist() == [["a", "b"], ["c"]]


async def test_the_sweeper_deletes_expired_exports_and_their_links(local, monkeypatch):
    _, ws = local
    owner = local_user()
    ref = ws.store.put_frame(owner, pd.DataFrame({"a": range(10)}), lineage={}).ref
    path = Path(consumers.export_data(ws, owner, data_ref=ref, fmt="csv")["path"])
    stray = path.with_name("stray.csv")
    stray.write_text("left by a crash\n")
    os.utime(stray, (time.time() - 7200, time.time() - 7200))
    assert ws.sweep_exports() == 0 and path.exists()
    later = time.time() + ws.settings.server.download_ttl_seconds + 1
    monkeypatch.setattr(downloads, "clock", lambda: later)
    assert ws.sweep_exports() == 1
    assert not path.exists() and not stray.exists()
