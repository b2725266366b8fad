"""fetch_sql: one read-only SELECT, nothing else, under the source's rules and limits."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest

from dataref.config import Settings, SourceSettings
from dataref.errors import AccessDenied, InvalidRequest, LimitExceeded
from dataref.producers import ProducerContext, load_producers, registry
from dataref.producers.demo import ensure_demo_database
from dataref.producers.sqlcheck import check_select
from dataref.producers.sqlite_source import run_sqlite

REFUSED = {
    "insert": "INSERT INTO sales VALUES ('2025-01-01', 'x', 'North', 1, 1.0, 1.0)",
    "update": "UPDATE sales SET units = 0",
    "delete": "DELETE FROM sales",
    "replace": "REPLACE INTO regions VALUES ('Mars')",
    "drop": "DROP TABLE sales",
    "create": "CREATE TABLE t AS SELECT * FROM sales",
    "alter": "ALTER TABLE sales ADD COLUMN x",
    "attach": "ATTACH DATABASE '/tmp/x.db' AS x",
    "detach": "DETACH DATABASE main",
    "pragma write": "PRAGMA query_only=OFF",
    "pragma read": "PRAGMA table_info(sales)",
    "vacuum": "VACUUM",
    "vacuum into": "VACUUM INTO '/tmp/copy.db'",
    "stacked": "SELECT 1; DELETE FROM sales",
    "stacked after a comment": "SELECT 1 /* ; */; DROP TABLE sales",
    "comment hides a newline": "SELECT 1 -- harmless\n; DELETE FROM sales",
    "comment hides the start": "/* SELECT */ DELETE FROM sales",
    "with then delete": "WITH x AS (SELECT 1) DELETE FROM sales",
    "load_extension": "SELECT load_extension('/tmp/evil.so')",
    "pragma function": "SELECT * FROM pragma_table_info('sales')",
    "transaction": "BEGIN; SELECT 1",
    "not a select": "EXPLAIN SELECT 1",
    "empty": "  -- nothing\n",
    "unterminated string": "SELECT 'abc",
}


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built_db(tmp_path_factory) -> Path:
    return ensure_demo_database(tmp_path_factory.mktemp("demo") / "sales.sqlite")


@pytest.fixture
def settings(tmp_path, built_db) -> Settings:
    """The demo, a sensitive 'hr' source only carol may read, and sources with tight limits."""
    hr = tmp_path / "hr.sqlite"
    with closing(sqlite3.connect(hr)) as conn:
        conn.execute("CREATE TABLE staff (name TEXT, salary REAL)")
        conn.execute("INSERT INTO staff VALUES ('Ann', 61000), ('Ben', 58000)")
        conn.commit()
    settings = Settings(
        state_dir=tmp_path / "state",
        sources={
            "hr": SourceSettings(path=hr, sensitive=True, owners=["carol"]),
            "capped": SourceSettings(path=built_db, row_cap=100),
            "slow": SourceSettings(path=built_db, timeout_seconds=0.3),
        },
        demo={"grants": {"alice": ["North"]}},
    )
    settings.demo_db_path.parent.mkdir(parents=True)
    shutil.copyfile(built_db, settings.demo_db_path)
    load_producers(settings)
    return settings


def sql(settings: Settings, query: str, owner: str = "bob", **arguments) -> pd.DataFrame:
    ctx = ProducerContext(owner=owner, settings=settings)
    return registry.get("fetch_sql").run(ctx, {"query": query, **arguments}).read_all().to_pandas()


def unchecked(settings: Settings, query: str, source: str = "demo", owner: str = "bob"):
    """Run ``query`` on a SQLite source without the text check: the connection's own layers."""
    src = settings.all_sources()[source]
    return run_sqlite(settings, source, src, owner, query).read_all()


def test_a_select_on_the_demo_source_returns_what_sqlite_gives(settings):
    frame = sql(settings, "SELECT region, count(*) AS n FROM sales GROUP BY region ORDER BY 1;")
    assert list(frame.columns) == ["region", "n"]
    assert len(frame) == 6 and frame["n"].sum() == 48_210
    dates = sql(settings, "SELECT date FROM sales LIMIT 1")
    assert dates["date"].iloc[0] == "2025-01-01"  # declared TEXT stays text: no guessing


def test_a_with_query_and_a_recursive_cte_are_allowed(settings):
    frame = sql(
        settings,
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5) "
        "SELECT x FROM n",
    )
    assert frame["x"].tolist() == [1, 2, 3, 4, 5]


def test_keywords_inside_strings_comments_and_the_replace_function_are_fine(settings):
    frame = sql(
        settings,
        "SELECT replace(line, 'Tent', 'T') AS l, 'DELETE; DROP' AS s -- ; UPDATE\n"
        "FROM sales WHERE line = 'Tent 06' /* ; INSERT */ LIMIT 2 ;",
    )
    assert frame["l"].tolist() == ["T 06", "T 06"] and frame["s"].iloc[0] == "DELETE; DROP"


@pytest.mark.parametrize("query", REFUSED.values(), ids=REFUSED.keys())
def test_anything_but_one_read_only_select_is_refused(settings, query):
    with pytest.raises(InvalidRequest, match="fetch_sql runs one read-only SELECT"):
        sql(settings, query)


def test_a_refusal_says_how_to_rewrite_the_query(settings):
    with pytest.raises(InvalidRequest, match="rewrite it as a SELECT"):
        sql(settings, "DELETE FROM sales")
    with pytest.raises(InvalidRequest, match="separate fetch_sql calls"):
        sql(settings, "SELECT 1; SELECT 2")
    with pytest.raises(InvalidRequest, match="sqlite_master"):
        sql(settings, "PRAGMA table_info(sales)")


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM sales",
        "PRAGMA query_only=OFF",
        "ATTACH DATABASE ':memory:' AS x",
        "SELECT load_extension('/tmp/evil.so')",
        "CREATE TEMP TABLE t (x)",
    ],
)
def test_the_connection_refuses_writes_even_without_the_text_check(settings, query):
    with pytest.raises(InvalidRequest):
        unchecked(settings, query)


def test_the_source_files_are_byte_identical_after_every_attempt(settings):
    sql(settings, "SELECT 1")  # builds the demo database and writes its grants once
    files = [settings.demo_db_path, settings.sources["hr"].path]
    before = [file_hash(p) for p in files]
    for query in REFUSED.values():
        for owner in ("bob", "alice", "carol"):
            with pytest.raises(InvalidRequest):
                sql(settings, query, owner=owner)
    for name in ("demo", "hr"):
        for query in ("DELETE FROM sales", "DROP TABLE staff", "PRAGMA user_version = 7"):
            with pytest.raises(InvalidRequest):
                unchecked(settings, query, source=name)
    assert [file_hash(p) for p in files] == before
    assert sorted(p.name for p in settings.demo_db_path.parent.iterdir()) == ["sales.sqlite"]


def test_more_rows_than_the_cap_are_refused_with_a_hint(settings):
    assert len(sql(settings, "SELECT * FROM sales LIMIT 100", source="capped")) == 100
    with pytest.raises(LimitExceeded, match="more than 100 rows - narrow the query"):
        sql(settings, "SELECT * FROM sales LIMIT 101", source="capped")


def test_a_query_that_runs_forever_is_stopped_by_the_timeout(settings):
    forever = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    )
    with pytest.raises(LimitExceeded, match=r"longer than 0.3s - add a WHERE or LIMIT"):
        sql(settings, forever, source="slow")


def test_a_source_the_owner_is_not_granted_reads_like_an_unknown_one(settings):
    with pytest.raises(AccessDenied) as denied:
        sql(settings, "SELECT * FROM staff", source="hr")
    with pytest.raises(InvalidRequest) as unknown:
        sql(settings, "SELECT * FROM staff", source="hq")
    assert type(denied.value) is type(unknown.value)
    assert str(denied.value).replace("'hr'", "'X'") == str(unknown.value).replace("'hq'", "'X'")
    assert "hr" not in str(unknown.value).replace("'hq'", "")  # only permitted sources listed


def test_a_sensitive_source_marks_the_call_sensitive(settings):
    ctx = ProducerContext(owner="carol", settings=settings)
    frame = registry.get("fetch_sql").run(ctx, {"query": "SELECT * FROM staff", "source": "hr"})
    assert frame.read_all().num_rows == 2 and ctx.sensitive
    plain = ProducerContext(owner="carol", settings=settings)
    registry.get("fetch_sql").run(plain, {"query": "SELECT 1"}).close()
    assert not plain.sensitive


def test_demo_grants_hold_in_sql_too(settings):
    seen = sql(settings, "SELECT DISTINCT region FROM sales", owner="alice")
    assert seen["region"].tolist() == ["North"]
    for sneaky in (
        "SELECT DISTINCT region FROM main.sales",
        "WITH sales AS (SELECT * FROM main.sales) SELECT DISTINCT region FROM sales",
        "SELECT name AS region FROM regions",
        "SELECT region FROM grants",
    ):
        assert set(sql(settings, sneaky, owner="alice")["region"]) <= {"North"}
    with pytest.raises(InvalidRequest):
        sql(settings, "SELECT * FROM src.sales", owner="alice")


def test_the_default_source_is_demo_else_the_only_one(tmp_path, settings):
    assert sql(settings, "SELECT count(*) AS n FROM sales")["n"].iloc[0] == 48_210
    only = Settings(
        state_dir=tmp_path / "only",
        demo={"enabled": False},
        sources={"hr": settings.sources["hr"]},
    )
    assert len(sql(only, "SELECT * FROM staff", owner="carol")) == 2
    several = Settings(
        state_dir=tmp_path / "several", demo={"enabled": False}, sources=settings.sources
    )
    with pytest.raises(InvalidRequest, match="name a source"):
        sql(several, "SELECT 1", owner="carol")


def test_duplicate_column_names_are_refused_with_a_hint(settings):
    with pytest.raises(InvalidRequest, match="distinct name with AS"):
        sql(settings, "SELECT units, units FROM sales LIMIT 1")


def test_sql_errors_come_back_with_a_way_to_see_the_schema(settings):
    with pytest.raises(InvalidRequest, match=r"no such table.*sqlite_master"):
        sql(settings, "SELECT * FROM orders")


def test_check_select_strips_the_trailing_semicolon_and_comment():
    assert check_select("SELECT 1 ; -- done\n") == "SELECT 1"
    assert check_select("WITH a AS (SELECT 1) SELECT * FROM a") == (
        "WITH a AS (SELECT 1) SELECT * FROM a"
    )


def test_the_tool_description_is_short():
    assert len(registry.get("fetch_sql").description.splitlines()) <= 3


def test_an_owner_with_no_source_is_told_so_without_naming_any(tmp_path, settings):
    only_hr = Settings(
        state_dir=tmp_path / "hr-only",
        demo={"enabled": False},
        sources={"hr": settings.sources["hr"]},
    )
    with pytest.raises(AccessDenied) as denied:
        sql(only_hr, "SELECT 1", owner="bob")
    assert "hr" not in str(denied.value)


def test_columns_declared_as_dates_arrive_as_datetimes(tmp_path):
    db = tmp_path / "typed.sqlite"
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE t (d DATE, at DATETIME, ts TIMESTAMP, txt TEXT, n REAL)")
        conn.execute(
            "INSERT INTO t VALUES ('2025-02-03', '2025-02-03 04:05:06', '2025-02-03T04:05:06', "
            "'2025-02-03', NULL), (NULL, NULL, NULL, NULL, 1.5)"
        )
        conn.commit()
    settings = Settings(state_dir=tmp_path / "s", demo={"enabled": False},
                        sources={"typed": SourceSettings(path=db)})  # fmt: skip
    load_producers(settings)
    frame = sql(settings, "SELECT d, at, ts, max(d) AS latest, txt, n FROM t GROUP BY rowid")
    for column in ("d", "at", "ts", "latest"):
        assert str(frame[column].dtype).startswith("datetime64"), column
    assert frame["txt"].iloc[0] == "2025-02-03"  # declared TEXT stays text
    assert frame["d"].dt.to_period("Q").astype(str).iloc[0] == "2025Q1"
    assert frame["d"].isna().iloc[1] and frame["n"].isna().iloc[0]  # NULLs stay NULLs
    with pytest.raises(InvalidRequest, match=r"declared as a date.*CAST\(d AS TEXT\)"):
        with closing(sqlite3.connect(db)) as conn:
            conn.execute("INSERT INTO t (d) VALUES ('not a date')")
            conn.commit()
        sql(settings, "SELECT d FROM t")
    assert sql(settings, "SELECT CAST(d AS TEXT) AS d FROM t")["d"].tolist()[-1] == "not a date"


def test_a_query_stopped_mid_stream_is_refused_never_returned_short(tmp_path, built_db):
    """Batches already streamed when the timer kills the child do not pass for a result."""
    endless = SourceSettings(path=built_db, timeout_seconds=0.5, row_cap=10**9)
    settings = Settings(state_dir=tmp_path / "s", demo={"enabled": False},
                        sources={"endless": endless})  # fmt: skip
    many = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n LIMIT 500000000) "
        "SELECT x, x * 2 AS y FROM n"
    )
    batches = run_sqlite(settings, "endless", endless, "bob", many)
    seen = 0
    with pytest.raises(LimitExceeded, match=r"longer than 0.5s - add a WHERE or LIMIT"):
        for batch in batches:
            seen += batch.num_rows
    batches.close()
    assert seen > 0  # the stream had started: the refusal came mid-stream


def test_a_bad_date_after_many_batches_refuses_the_whole_result(tmp_path):
    db = tmp_path / "late.sqlite"
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE t (d DATE)")
        conn.executemany("INSERT INTO t VALUES (?)", [("2025-01-01",)] * 200_000)
        conn.execute("INSERT INTO t VALUES ('not a date')")
        conn.commit()
    settings = Settings(state_dir=tmp_path / "s", demo={"enabled": False},
                        sources={"late": SourceSettings(path=db)})  # fmt: skip
    batches = run_sqlite(settings, "late", settings.sources["late"], "bob", "SELECT d FROM t")
    seen = 0
    with pytest.raises(InvalidRequest, match=r"declared as a date.*CAST\(d AS TEXT\)"):
        for batch in batches:
            seen += batch.num_rows
    batches.close()
    assert seen >= 65_536  # earlier batches had arrived before the refusal
