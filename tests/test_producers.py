"""The @producer registry: plugins become tools with notebook, lineage and Descriptions."""

from __future__ import annotations

import pandas as pd
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from dataref.app import create_app
from dataref.producers import ProducerRegistry, producer

from .conftest import make_settings


@pytest.fixture
async def client(tmp_path):
    settings = make_settings(
        tmp_path, owner="dana", producers={"plugins": ["tests.plugin_producers"]}
    )
    mcp = create_app(settings, "memory", kernels=False)
    async with Client(mcp) as c:
        c.workspace_settings = settings
        yield c


async def test_a_plugin_producer_becomes_a_tool_with_a_notebook_argument(client):
    tools = {t.name: t for t in await client.list_tools()}
    schema = tools["fetch_squares"].input_schema
    assert set(schema["properties"]) == {"n", "label", "notebook"}
    assert schema["required"] == ["n"]
    assert "ctx" not in schema["properties"]
    assert tools["fetch_squares"].description.startswith("The first n squares")


async def test_a_plugin_call_stores_the_frame_with_lineage(client):
    desc = (await client.call_tool("fetch_squares", {"n": 4})).structured_content
    assert desc["rows"] == 4 and desc["sample"][3] == {"i": 3, "sq": 9, "owner": "dana"}
    from dataref.store import ArtifactStore

    store = ArtifactStore(
        client.workspace_settings.state_dir / "store", client.workspace_settings.store
    )
    art = store.get("dana", desc["dataRef"])
    assert art.lineage["tool"] == "fetch_squares"
    assert art.lineage["args"] == {"n": 4}
    assert art.lineage["notebook"].startswith("nb_")


async def test_a_sensitive_producer_returns_no_sample(client):
    desc = (await client.call_tool("fetch_secrets", {})).structured_content
    assert desc["rows"] == 3 and desc["sample"] == []


async def test_wrong_argument_types_are_refused_by_the_schema(client):
    with pytest.raises(ToolError):
        await client.call_tool("fetch_squares", {"n": "many"})


def test_a_producer_must_take_ctx_first_and_not_define_notebook():
    registry = ProducerRegistry()
    with pytest.raises(TypeError, match="ctx"):

        @producer(into=registry)
        def bad(n: int) -> pd.DataFrame:
            return pd.DataFrame()

    with pytest.raises(TypeError, match="notebook"):

        @producer(into=registry)
        def worse(ctx, notebook: str) -> pd.DataFrame:
            return pd.DataFrame()
