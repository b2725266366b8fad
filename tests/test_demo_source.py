"""The demo system of record: deterministic data, the article's answer, grants, dates."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest

from dataref.config import Settings
from dataref.errors import AccessDenied, InvalidRequest
from dataref.producers import ProducerContext, load_producers, registry
from dataref.producers.demo import (
    DEMO_ROWS,
    REGIONS,
    ensure_demo_database,
    generate_sales,
    sync_grants,
)

# The sha256 of every sales row, in order. Pinned so a change of data (or an RNG that differs
# on some machine) is noticed; update it only together with DATA_VERSION.
SALES_SHA256 = "edf934686c10010baf4081770a66c678ec14e9129e1302f4f15d945c1a07af2c"
# The article's answer on the demo data: the five lines whose revenue fell most from Q3 to Q4.
ARTICLE_TOP5 = {
    "Tent 06": -51235.55,
    "Swim Short 06": -49140.24,
    "Tent 09": -47008.56,
    "Cooler Bag 11": -42042.13,
    "Sun Hat 03": -32976.47,
}


def sales_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with closing(sqlite3.connect(path)) as conn:
        for row in conn.execute("SELECT * FROM sales ORDER BY rowid"):
            digest.update(repr(row).encode())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def built_db(tmp_path_factory) -> Path:
    return ensure_demo_database(tmp_path_factory.mktemp("demo") / "sales.sqlite")


def make_settings(tmp_path: Path, built_db: Path, **overrides) -> Settings:
    """Settings whose demo database is a copy of the module's (building once is enough)."""
    settings = Settings(state_dir=tmp_path, **overrides)
    settings.demo_db_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built_db, settings.demo_db_path)
    load_producers(settings)
    return settings


def fetch(settings: Settings, owner: str = "bob", **arguments) -> pd.DataFrame:
    ctx = ProducerContext(owner=owner, settings=settings)
    return registry.get("fetch_sales").run(ctx, arguments)


@pytest.fixture
def settings(tmp_path, built_db) -> Settings:
    return make_settings(tmp_path, built_db)


@pytest.fixture(scope="module")
def year(tmp_path_factory, built_db) -> pd.DataFrame:
    return fetch(make_settings(tmp_path_factory.mktemp("state"), built_db), since="2025-01-01")


def test_two_fresh_builds_hold_identical_data(tmp_path, built_db):
    again = ensure_demo_database(tmp_path / "again" / "sales.sqlite")
    assert sales_hash(again) == sales_hash(built_db)


def test_the_demo_data_is_the_same_on_every_machine(built_db):
    assert sales_hash(built_db) == SALES_SHA256


def test_a_complete_database_is_left_alone(built_db):
    before, mtime = built_db.read_bytes(), built_db.stat().st_mtime_ns
    started = time.perf_counter()
    ensure_demo_database(built_db)
    assert time.perf_counter() - started < 0.1
    assert built_db.read_bytes() == before and built_db.stat().st_mtime_ns == mtime
    assert not [p for p in built_db.parent.iterdir() if p.name != built_db.name]


def test_a_broken_or_outdated_database_is_rebuilt(tmp_path, built_db):
    path = tmp_path / "sales.sqlite"
    path.write_bytes(b"not a database")
    ensure_demo_database(path)
    assert sales_hash(path) == sales_hash(built_db)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 0")
    ensure_demo_database(path)
    assert sales_hash(path) == sales_hash(built_db)


def test_a_year_of_sales_has_the_promised_shape(year):
    assert len(year) == DEMO_ROWS
    assert year["line"].nunique() == 300
    assert sorted(year["region"].unique()) == sorted(REGIONS)
    assert year["date"].min() == pd.Timestamp("2025-01-01")
    assert year["date"].max() == pd.Timestamp("2025-12-31")
    assert year["date"].dt.year.eq(2025).all()
    assert 0 < year["price"].isna().sum() < len(year) * 0.005
    assert year["revenue"].isna().equals(year["price"].isna())
    priced = year.dropna(subset=["price"])
    assert ((priced["units"] * priced["price"]).round(2) - priced["revenue"]).abs().max() < 0.006


def test_the_date_column_is_datetime64_and_rows_are_ordered(year):
    assert str(year["date"].dtype).startswith("datetime64")
    assert list(year.columns) == ["date", "line", "region", "units", "price", "revenue"]
    ordered = year.sort_values(["date", "line", "region"], kind="stable")
    assert ordered.index.equals(year.index)


def test_sales_peak_in_q4_and_on_weekends(year):
    by_quarter = year.groupby(year["date"].dt.quarter)["revenue"].sum()
    assert by_quarter.idxmax() == 4
    stores = year[year["region"] != "Online"]
    by_weekday = stores.groupby(stores["date"].dt.day_of_week).size()
    assert by_weekday.idxmax() == 5  # Saturday


def test_the_article_code_runs_verbatim_and_gives_a_stable_answer(year):
    sales, outputs = year, {}
    q = sales.assign(q=sales.date.dt.to_period("Q"))
    pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")
    delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()
    outputs["qoq"] = delta.rename("delta").reset_index()
    result = delta.head(5).round(2).to_dict()

    assert result == ARTICLE_TOP5
    assert all(v < 0 for v in result.values())
    # Well separated from the sixth, so the ranking cannot flip on rounding.
    assert delta.iloc[5] - delta.iloc[4] > 1000
    assert list(outputs["qoq"].columns) == ["line", "delta"]
    assert len(outputs["qoq"]) == 300 and outputs["qoq"]["delta"].notna().all()
    assert (delta > 0).any(), "some lines grow from Q3 to Q4"


def test_since_and_until_bound_the_dates_inclusively(settings):
    q1 = fetch(settings, since="2025-01-01", until="2025-03-31")
    assert q1["date"].min() == pd.Timestamp("2025-01-01")
    assert q1["date"].max() == pd.Timestamp("2025-03-31")
    day = fetch(settings, since="2025-12-24", until="2025-12-24")
    assert day["date"].nunique() == 1 and len(day) > 0


def test_a_region_filter_returns_only_that_region_in_any_case(settings):
    south = fetch(settings, since="2025-06-01", region="south")
    assert set(south["region"]) == {"South"}


def test_an_unknown_region_is_refused_with_the_list_of_regions(settings):
    with pytest.raises(InvalidRequest, match="Online"):
        fetch(settings, since="2025-01-01", region="Mars")


@pytest.mark.parametrize("bad", ["2025/01/01", "01-02-2025", "2025-02-30", "yesterday", ""])
def test_a_bad_date_is_refused_with_the_expected_format(settings, bad):
    with pytest.raises(InvalidRequest, match="YYYY-MM-DD"):
        fetch(settings, since=bad)
    with pytest.raises(InvalidRequest, match="YYYY-MM-DD"):
        fetch(settings, since="2025-01-01", until=bad)


def test_until_before_since_is_refused(settings):
    with pytest.raises(InvalidRequest, match="before"):
        fetch(settings, since="2025-06-01", until="2025-05-01")


def test_grants_restrict_the_rows_an_owner_sees(tmp_path, built_db):
    settings = make_settings(tmp_path, built_db, demo={"grants": {"alice": ["North", "South"]}})
    alice = fetch(settings, owner="alice", since="2025-01-01")
    assert set(alice["region"]) == {"North", "South"}
    bob = fetch(settings, owner="bob", since="2025-01-01")
    assert set(bob["region"]) == set(REGIONS)


def test_a_region_not_granted_is_refused_naming_only_the_granted_ones(tmp_path, built_db):
    settings = make_settings(tmp_path, built_db, demo={"grants": {"alice": ["North", "South"]}})
    for asked in ("East", "Atlantis"):  # not granted and unknown read the same
        with pytest.raises(AccessDenied) as refused:
            fetch(settings, owner="alice", since="2025-01-01", region=asked)
        message = str(refused.value)
        assert "North" in message and "South" in message
        assert not any(r in message for r in ("West", "Central", "Online"))


def test_an_owner_granted_no_existing_region_sees_nothing_and_is_told_why(tmp_path, built_db):
    settings = make_settings(tmp_path, built_db, demo={"grants": {"eve": ["Nowhere"]}})
    with pytest.raises(AccessDenied, match="operator"):
        fetch(settings, owner="eve", since="2025-01-01")


def test_the_grants_table_mirrors_the_settings_without_touching_sales(tmp_path, built_db):
    settings = make_settings(tmp_path, built_db, demo={"grants": {"alice": ["North"]}})
    fetch(settings, owner="alice", since="2025-12-01")
    with closing(sqlite3.connect(settings.demo_db_path)) as conn:
        assert conn.execute("SELECT owner, region FROM grants").fetchall() == [("alice", "North")]
    sync_grants(settings.demo_db_path, {})
    with closing(sqlite3.connect(settings.demo_db_path)) as conn:
        assert conn.execute("SELECT count(*) FROM grants").fetchone() == (0,)
    assert sales_hash(settings.demo_db_path) == sales_hash(built_db)


def test_a_sensitive_demo_source_marks_the_call_sensitive(tmp_path, built_db):
    settings = make_settings(tmp_path, built_db, demo={"sensitive": True})
    ctx = ProducerContext(owner="bob", settings=settings)
    registry.get("fetch_sales").run(ctx, {"since": "2025-12-01"})
    assert ctx.sensitive


def test_the_tool_description_is_short_and_names_columns_and_regions():
    description = registry.get("fetch_sales").description
    assert len(description.splitlines()) <= 3
    for word in ("date", "revenue", "YYYY-MM-DD", "inclusive", "Online"):
        assert word in description


def test_generate_sales_is_deterministic_sorted_and_sized():
    first, second = generate_sales(20_000, seed=7), generate_sales(20_000, seed=7)
    pd.testing.assert_frame_equal(first, second)
    assert len(first) == 20_000
    assert first.sort_values(["date", "line", "region"], kind="stable").index.equals(first.index)
    assert not generate_sales(20_000, seed=8).equals(first)
