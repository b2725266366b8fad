"""DuckDB sources: the files of one directory, and nothing else, through an MCP client."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from dataref.app import create_app
from dataref.config import Settings, SourceSettings
from dataref.errors import InvalidRequest
from dataref.producers.demo import REGIONS, generate_sales
from dataref.producers.duckdb_source import run_duckdb

from .conftest import make_settings


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    sales = generate_sales(10_000)
    table = pa.Table.from_pandas(sales, preserve_index=False)
    table = table.set_column(0, "date", table["date"].cast(pa.date32()))
    pq.write_table(table, root / "sales.parquet")
    (root / "regions.csv").write_text("name,manager\nNorth,Ann\nSouth,Ben\nOnline,Cy\n")
    (root / "events.jsonl").write_text('{"kind": "open", "n": 1}\n{"kind": "close", "n": 2}\n')
    outside = root.parent / "outside.csv"
    outside.write_text("secret\nhunter2\n")
    return root


LAKE_FILES = ["events.jsonl", "regions.csv", "sales.parquet"]


def settings_for(tmp_path: Path, lake: Path, **source) -> Settings:
    lake_source = SourceSettings(kind="duckdb", path=lake, **source)
    return make_settings(tmp_path / "state", owner="alice", sources={"lake": lake_source})


async def call(settings: Settings, tool: str, **arguments) -> dict:
    async with Client(create_app(settings, "memory", kernels=False)) as client:
        return (await client.call_tool(tool, arguments)).structured_content


async def fetch(settings: Settings, query: str) -> pd.DataFrame:
    ref = (await call(settings, "fetch_sql", query=query, source="lake"))["dataRef"]
    with pa.memory_map(str(settings.state_dir / "store" / "blobs" / f"{ref}.arrow")) as f:
        return pa.ipc.open_file(f).read_all().to_pandas()


async def test_parquet_csv_and_json_files_are_tables_named_after_them(tmp_path, lake):
    settings = settings_for(tmp_path, lake)
    joined = await fetch(
        settings,
        "SELECT s.region, r.manager, count(*) AS n FROM sales s JOIN regions r "
        "ON r.name = s.region GROUP BY ALL ORDER BY 1",
    )
    assert joined["region"].tolist() == ["North", "Online", "South"]
    assert joined["manager"].tolist() == ["Ann", "Cy", "Ben"]
    events = await fetch(settings, "SELECT kind, n FROM events ORDER BY n")
    assert events["kind"].tolist() == ["open", "close"]
    by_path = await fetch(
        settings, f"SELECT count(*) AS n FROM read_parquet('{lake}/sales.parquet')"
    )
    assert by_path["n"].tolist() == [10_000]


async def test_dates_arrive_as_datetimes_so_to_period_works(tmp_path, lake):
    frame = await fetch(settings_for(tmp_path, lake), "SELECT date, revenue FROM sales LIMIT 5")
    assert str(frame["date"].dtype).startswith("datetime64")
    assert frame["date"].dt.to_period("Q").astype(str).iloc[0] == "2025Q1"


OUTSIDE = {
    "a file outside the directory": "SELECT * FROM read_csv('{outside}')",
    "a file outside by a relative climb": "SELECT * FROM read_csv('{lake}/../outside.csv')",
    "/etc/passwd": "SELECT * FROM read_csv('/etc/passwd')",
    "/etc/passwd as text": "SELECT * FROM read_text('/etc/passwd')",
    "http": "SELECT * FROM read_parquet('http://example.com/x.parquet')",
    "https csv": "SELECT * FROM 'https://example.com/x.csv'",
    "glob outside": "SELECT * FROM glob('/etc/*')",
}


@pytest.mark.parametrize("query", OUTSIDE.values(), ids=OUTSIDE.keys())
async def test_files_outside_the_directory_and_the_network_are_refused(tmp_path, lake, query):
    query = query.format(outside=lake.parent / "outside.csv", lake=lake)
    with pytest.raises(ToolError, match="only the files of its own directory") as refused:
        await call(settings_for(tmp_path, lake), "fetch_sql", query=query, source="lake")
    assert "hunter2" not in str(refused.value) and "root:" not in str(refused.value)


REFUSED = {
    "install httpfs": "INSTALL httpfs",
    "load httpfs": "LOAD httpfs",
    "attach": "ATTACH '{lake}/other.duckdb' AS other",
    "copy into the lake": "COPY (SELECT 1) TO '{lake}/out.csv'",
    "create": "CREATE TABLE t AS SELECT 1",
    "set": "SET enable_external_access = true",
    "pragma": "PRAGMA version",
    "query()": "SELECT * FROM query('SELECT 1')",
    "getenv": "SELECT getenv('HOME')",
    "stacked": "SELECT 1; SELECT 2",
}


@pytest.mark.parametrize("query", REFUSED.values(), ids=REFUSED.keys())
async def test_statements_that_leave_the_lake_are_refused(tmp_path, lake, query):
    with pytest.raises(ToolError, match=r"fetch_sql runs one read-only SELECT.* - "):
        await call(
            settings_for(tmp_path, lake), "fetch_sql", query=query.format(lake=lake), source="lake"
        )
    assert sorted(p.name for p in lake.iterdir()) == LAKE_FILES


# Inside its own directory DuckDB can write (COPY/ATTACH there are stopped by the text check
# only; the README asks operators to mount the lake read-only); everything else it refuses.
@pytest.mark.parametrize(
    "query",
    ["INSTALL httpfs", "LOAD httpfs", "COPY (SELECT 1) TO '{lake}/../copied.csv'",
     "SET enable_external_access = true", "SET lock_configuration = false",
     "ATTACH '{lake}/../new.duckdb' AS x", "SELECT * FROM read_text('/etc/passwd')"],
)  # fmt: skip
def test_duckdb_refuses_them_too_without_the_text_check(lake, query):
    source = SourceSettings(kind="duckdb", path=lake)
    with pytest.raises(InvalidRequest, match=r"refused|locked|disabled"):
        run_duckdb(source, query.format(lake=lake)).read_all()
    assert not (lake.parent / "copied.csv").exists() and not (lake.parent / "new.duckdb").exists()


async def test_a_long_query_is_interrupted_at_the_timeout(tmp_path, lake):
    settings = settings_for(tmp_path, lake, timeout_seconds=0.5)
    forever = "SELECT count(*) FROM range(1000000000000) a"
    with pytest.raises(ToolError, match=r"longer than 0\.5s"):
        await call(settings, "fetch_sql", query=forever, source="lake")


async def test_list_sources_shows_the_files_as_tables_without_values(tmp_path, lake):
    listing = await call(settings_for(tmp_path, lake), "list_sources")
    source = next(s for s in listing["sources"] if s["name"] == "lake")
    assert source["dialect"] == "duckdb"
    assert set(source["tables"]) == {"sales", "regions", "events"}
    assert source["tables"]["sales"]["rows"] == 10_000
    assert source["tables"]["sales"]["columns"]["date"] == "date"
    assert "Ann" not in json.dumps(listing)


async def test_duckdb_and_polars_are_in_the_kernels_analysis_stack(tmp_path, lake):
    settings = settings_for(tmp_path, lake)
    async with Client(create_app(settings, "memory")) as client:
        fetched = await client.call_tool(
            "fetch_sql", {"query": "SELECT region, revenue FROM sales", "source": "lake"}
        )
        ran = await client.call_tool(
            "run_python",
            {
                "code": "import duckdb, polars as pl\n"
                "top = duckdb.sql('SELECT region, sum(revenue) AS r FROM sales GROUP BY 1 "
                "ORDER BY 2 DESC').df()\n"
                "result = {'top': top.region.iloc[0], 'rows': pl.from_pandas(sales).height}",
                "inputs": {"sales": fetched.structured_content["dataRef"]},
            },
        )
    out = ran.structured_content
    assert out["ok"], out
    assert out["result"]["rows"] == 10_000 and out["result"]["top"] in REGIONS
