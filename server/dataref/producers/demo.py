"""The demo system of record: a year of sales in SQLite, built once, deterministically.

The data is synthetic but shaped like a retailer's: 20 product families x 15 models (300
lines), 6 regions, seasonal families (summer, winter, spring/autumn, all year), a Q4 holiday
peak (Black Friday, Cyber Monday, the weeks before Christmas), weekday patterns that differ
between stores and Online, and per-line trends so quarter-over-quarter changes differ.

Determinism: the weights use only + - * / (exactly rounded in IEEE 754 on every machine) and
the RNG draws are uniform floats and bounded integers, so the rows are the same everywhere.

Grants: ``settings.demo.grants`` is the authority; the ``grants`` table mirrors it (rewritten
when it differs) so a person browsing the database sees the same rules the producers apply.
"""

from __future__ import annotations

import os
import re
import sqlite3
import tempfile
import threading
from contextlib import closing
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import Settings
from ..errors import AccessDenied, InvalidRequest
from . import ProducerContext, producer

DEMO_ROWS = 48_210
# Chosen among seeds for a well-separated top five of the article (Q4 - Q3 drops by line)
# and at least two sales of every line in every quarter.
DEMO_SEED = 2135
# Bump when the generator changes: databases with another user_version are rebuilt.
DATA_VERSION = 1
YEAR_START = np.datetime64("2025-01-01")
DAYS = 365

# Alphabetical, so rows generated in cell order are already sorted by date, line, region.
REGIONS = ("Central", "East", "North", "Online", "South", "West")
REGION_SHARE = np.array([0.12, 0.17, 0.18, 0.17, 0.20, 0.16])
# Mon..Sun. Stores peak on Saturday; Online is busiest early in the week.
STORE_WEEKDAY = np.array([0.80, 0.85, 0.90, 1.00, 1.20, 1.45, 1.10])
ONLINE_WEEKDAY = np.array([1.10, 1.05, 1.00, 1.00, 0.95, 0.90, 1.05])

# (family, season, lowest price, highest price, max units per draw)
FAMILIES = (
    ("Backpack", "all", 39, 149, 2),
    ("Beach Towel", "summer", 12, 35, 4),
    ("Cooler Bag", "summer", 25, 90, 2),
    ("Down Jacket", "winter", 120, 380, 1),
    ("Fleece", "shoulder", 35, 95, 2),
    ("Headlamp", "all", 15, 60, 3),
    ("Hiking Pole", "shoulder", 30, 110, 2),
    ("Rain Jacket", "shoulder", 60, 220, 1),
    ("Running Tee", "all", 18, 45, 4),
    ("Sandal", "summer", 25, 80, 2),
    ("Ski Glove", "winter", 25, 90, 3),
    ("Snow Boot", "winter", 80, 240, 1),
    ("Sock Pack", "all", 9, 24, 6),
    ("Sun Hat", "summer", 15, 45, 3),
    ("Swim Short", "summer", 20, 55, 3),
    ("Tent", "summer", 90, 320, 1),
    ("Thermal Base", "winter", 30, 85, 3),
    ("Trail Shoe", "shoulder", 80, 190, 1),
    ("Water Bottle", "all", 10, 40, 5),
    ("Yoga Mat", "all", 20, 70, 3),
)
MODELS_PER_FAMILY = 15
SEASONS = ("all", "summer", "winter", "shoulder")
# Summer lines sell more in the South, winter lines in the North (columns follow REGIONS).
REGION_AFFINITY = {
    "summer": np.array([1.0, 1.0, 0.75, 1.0, 1.3, 1.1]),
    "winter": np.array([1.05, 1.0, 1.35, 1.0, 0.65, 0.9]),
}
NULL_PRICE_RATE = 0.001
ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

SCHEMA = """
CREATE TABLE sales (date TEXT NOT NULL, line TEXT NOT NULL, region TEXT NOT NULL,
                    units INTEGER NOT NULL, price REAL, revenue REAL);
CREATE INDEX sales_date ON sales (date);
CREATE INDEX sales_region_date ON sales (region, date);
CREATE TABLE regions (name TEXT PRIMARY KEY);
CREATE TABLE grants (owner TEXT NOT NULL, region TEXT NOT NULL, PRIMARY KEY (owner, region));
"""

_build_lock = threading.Lock()


def line_names() -> list[str]:
    """'Backpack 01' .. 'Yoga Mat 15': sorted, so line codes order like the names."""
    return [f"{f[0]} {m:02d}" for f in FAMILIES for m in range(1, MODELS_PER_FAMILY + 1)]


def _bump(day: np.ndarray, center: float, width: float) -> np.ndarray:
    """A smooth quartic bump (1 at center, 0 beyond width), circular over the year."""
    dist = np.abs(day - center)
    dist = np.minimum(dist, DAYS - dist)
    x = np.minimum(dist / width, 1.0)
    return (1.0 - x * x) ** 2


def _day_factor(day: np.ndarray) -> np.ndarray:
    """All lines: January sales, a summer lift, the holiday season, Christmas Day closed."""
    f = 1.0 + 0.25 * _bump(day, 6, 14) + 0.15 * _bump(day, 190, 60)
    f = f + 0.9 * _bump(day, 345, 30) + 1.6 * _bump(day, 331, 4)  # December; Black Friday
    f[358] = 0.15  # 25 December
    f[359] = f[359] + 0.8  # Boxing Day sales
    return f


def _season_factor(day: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "all": np.ones_like(day),
        "summer": 0.25 + 1.6 * _bump(day, 190, 80),
        "winter": 0.25 + 1.5 * _bump(day, 355, 75),
        "shoulder": 0.35 + 0.9 * _bump(day, 105, 45) + 0.9 * _bump(day, 285, 45),
    }


def _line_traits(rng: np.random.Generator, n_lines: int) -> tuple[np.ndarray, np.ndarray]:
    """Popularity (long tail) and yearly trend slope of each line."""
    u = rng.random((3, n_lines))
    popularity = 0.5 + 3.0 * u[0] * u[1] * u[2]
    kind = rng.random(n_lines)
    slope = -0.6 + 1.2 * rng.random(n_lines)  # most lines drift a little
    # About 7% are being phased out and 7% are breakout hits.
    slope = np.where(kind < 0.07, -2.6 + 0.4 * rng.random(n_lines), slope)
    slope = np.where(kind > 0.93, 1.2 + 0.6 * rng.random(n_lines), slope)
    return popularity, slope


def _cell_weights(rng: np.random.Generator) -> np.ndarray:
    """Weight of every (day, line, region) cell, flattened in that order."""
    day = np.arange(DAYS, dtype=np.float64)
    weekday = (np.arange(DAYS) + 2) % 7  # 2025-01-01 was a Wednesday (Mon = 0)
    n_lines = len(FAMILIES) * MODELS_PER_FAMILY
    popularity, slope = _line_traits(rng, n_lines)
    t = (day - 182.0) / 364.0  # -0.5 .. 0.5 over the year
    trend = np.maximum(1.0 + slope[None, :] * t[:, None], 0.12)  # (day, line)
    seasons = _season_factor(day)
    family_season = [f[1] for f in FAMILIES for _ in range(MODELS_PER_FAMILY)]
    season = np.stack([seasons[s] for s in family_season], axis=1)  # (day, line)
    affinity = np.stack(
        [REGION_AFFINITY.get(s, np.ones(len(REGIONS))) for s in family_season]
    )  # (line, region)
    wd = np.stack([STORE_WEEKDAY[weekday]] * len(REGIONS), axis=1)
    wd[:, REGIONS.index("Online")] = ONLINE_WEEKDAY[weekday]
    wd[334, REGIONS.index("Online")] += 2.0  # Cyber Monday, 1 December
    day_line = _day_factor(day)[:, None] * popularity[None, :] * trend * season
    w = day_line[:, :, None] * affinity[None, :, :] * (wd * REGION_SHARE)[:, None, :]
    return w.ravel()


def _prices(rng: np.random.Generator, day: np.ndarray, line: np.ndarray) -> np.ndarray:
    """List price per line ending in .99, with promotions (more of them in Q4)."""
    n_lines = len(FAMILIES) * MODELS_PER_FAMILY
    lo = np.repeat([f[2] for f in FAMILIES], MODELS_PER_FAMILY).astype(np.float64)
    hi = np.repeat([f[3] for f in FAMILIES], MODELS_PER_FAMILY).astype(np.float64)
    list_price = np.floor(lo + (hi - lo) * rng.random(n_lines)) + 0.99
    promo_rate = np.where(day >= 326, 0.30, 0.08)  # from 23 November
    promo = rng.random(len(day)) < promo_rate
    discount = np.where(promo, 0.1 * rng.integers(1, 4, len(day)), 0.0)
    price = np.round(list_price[line] * (1.0 - discount), 2)
    price[rng.random(len(day)) < NULL_PRICE_RATE] = np.nan
    return price


def generate_sales(rows: int = DEMO_ROWS, seed: int = DEMO_SEED) -> pd.DataFrame:
    """``rows`` order lines of 2025, sorted by date, line, region; same rows for same args."""
    rng = np.random.default_rng(seed)
    weights = _cell_weights(rng)
    cdf = np.cumsum(weights)
    # Sorted draws make the lookup cache-friendly and the rows come out in cell order.
    draws = np.sort(rng.random(rows)) * cdf[-1]
    cells = np.minimum(np.searchsorted(cdf, draws, side="right"), len(cdf) - 1)
    per_day = len(weights) // DAYS
    day, rest = np.divmod(cells, per_day)
    line, region = np.divmod(rest, len(REGIONS))
    max_units = np.repeat([f[4] for f in FAMILIES], MODELS_PER_FAMILY)[line]
    # Sum of two draws: mostly small orders, occasionally larger ones.
    units = 1 + rng.integers(0, 3 * max_units, rows) + rng.integers(0, max_units + 1, rows)
    price = _prices(rng, day, line)
    revenue = np.round(units * price, 2)
    return pd.DataFrame(
        {
            "date": (YEAR_START + day.astype("timedelta64[D]")).astype("datetime64[ns]"),
            # Arrow's take: 10x faster than building millions of str objects.
            "line": pd.array(line_names(), dtype="str").take(line),
            "region": pd.array(list(REGIONS), dtype="str").take(region),
            "units": units.astype(np.int64),
            "price": price,
            "revenue": revenue,
        }
    )


def _is_complete(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with closing(_connect_ro(path)) as conn:
            return conn.execute("PRAGMA user_version").fetchone()[0] == DATA_VERSION
    except sqlite3.Error:
        return False


def _connect_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def _write_database(path: Path) -> None:
    frame = generate_sales(DEMO_ROWS, DEMO_SEED)
    dates = np.datetime_as_string(frame["date"].to_numpy(), unit="D").tolist()
    price = [None if p != p else p for p in frame["price"].tolist()]  # NaN -> NULL
    revenue = [None if r != r else r for r in frame["revenue"].tolist()]
    rows = zip(
        dates, frame["line"].tolist(), frame["region"].tolist(), frame["units"].tolist(),
        price, revenue, strict=True,
    )  # fmt: skip
    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO sales VALUES (?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO regions VALUES (?)", [(r,) for r in REGIONS])
        # Written last: a database with this version is complete.
        conn.execute(f"PRAGMA user_version = {DATA_VERSION}")
        conn.commit()
    finally:
        conn.close()


def ensure_demo_database(path: Path) -> Path:
    """Build the demo database at ``path`` unless a complete one is there already.

    Built in a temp file in the same directory and renamed into place, so readers never see
    a half-written database and two processes building at once both end up with a good one.
    """
    path = Path(path)
    if _is_complete(path):
        return path
    with _build_lock:
        if _is_complete(path):
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".sales-", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            Path(tmp).unlink()  # sqlite3 wants to create the file itself
            _write_database(Path(tmp))
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    return path


def sync_grants(path: Path, grants: dict[str, list[str]]) -> None:
    """Make the ``grants`` table say what ``grants`` says; sales rows are never touched."""
    wanted = sorted({(o, r) for o, regions in grants.items() for r in regions})
    with closing(_connect_ro(path)) as conn:
        current = conn.execute("SELECT owner, region FROM grants ORDER BY 1, 2").fetchall()
    if current == wanted:
        return  # the common case: no write, the file stays byte-identical
    conn = sqlite3.connect(path)
    try:
        with conn:  # one transaction
            conn.execute("DELETE FROM grants")
            conn.executemany("INSERT INTO grants VALUES (?, ?)", wanted)
    finally:
        conn.close()


def prepare_demo(settings: Settings) -> Path:
    """The demo database of these settings, built if needed, its grants table up to date."""
    path = ensure_demo_database(settings.demo_db_path)
    sync_grants(path, settings.demo.grants)
    return path


def allowed_regions(settings: Settings, owner: str) -> list[str] | None:
    """The regions ``owner`` may see, or None for all of them (owners without grants)."""
    granted = settings.demo.grants.get(owner)
    if granted is None:
        return None
    return [r for r in REGIONS if r in set(granted)]


def parse_iso_date(value: str, name: str) -> date:
    if isinstance(value, str) and ISO_DATE.match(value.strip()):
        try:
            return date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise InvalidRequest(
        f"{name} must be an ISO date YYYY-MM-DD such as '2025-01-01'; got {value!r}"
    )


def _regions_for(ctx: ProducerContext, region: str | None) -> list[str] | None:
    """The region filter of the query (None: no filter), refusing what is not granted."""
    allowed = allowed_regions(ctx.settings, ctx.owner)
    if allowed is not None and not allowed:
        raise AccessDenied(
            "you are not granted any region of the demo sales source - ask the operator "
            "to add you to [demo.grants]"
        )
    if region is None:
        return allowed
    visible = allowed if allowed is not None else list(REGIONS)
    match = [r for r in visible if r.lower() == str(region).strip().lower()]
    if match:
        return match
    if allowed is not None:  # same answer for unknown and not granted: reveal nothing
        raise AccessDenied(
            f"region {region!r} is not available to you; you may ask for: {', '.join(allowed)} "
            "(or omit region to get all of them)"
        )
    raise InvalidRequest(f"unknown region {region!r}; regions are: {', '.join(REGIONS)}")


@producer
def fetch_sales(
    ctx: ProducerContext, since: str, until: str | None = None, region: str | None = None
) -> pd.DataFrame:
    """Demo sales of 2025, one row per order line: date, line, region, units, price, revenue.
    since/until are ISO dates YYYY-MM-DD (until inclusive, default: the latest).
    region: North, South, East, West, Central or Online (default: all you may see)."""
    start = parse_iso_date(since, "since")
    end = parse_iso_date(until, "until") if until is not None else None
    if end is not None and end < start:
        raise InvalidRequest(f"until ({end}) is before since ({start}) - swap them")
    regions = _regions_for(ctx, region)
    ctx.use_source("demo")
    if ctx.settings.demo.sensitive:
        ctx.sensitive = True
    sql = "SELECT date, line, region, units, price, revenue FROM sales WHERE date >= ?"
    params: list[str] = [start.isoformat()]
    if end is not None:
        sql += " AND date <= ?"
        params.append(end.isoformat())
    if regions is not None:
        sql += f" AND region IN ({', '.join('?' * len(regions))})"
        params.extend(regions)
    sql += " ORDER BY date, line, region"
    conn = _connect_ro(prepare_demo(ctx.settings))
    try:
        rows = conn.execute(sql, params).fetchall()
    finally:
        conn.close()
    return _sales_frame(rows)


def _sales_frame(rows: list[tuple]) -> pd.DataFrame:
    columns = ["date", "line", "region", "units", "price", "revenue"]
    frame = pd.DataFrame.from_records(rows, columns=columns)
    frame["date"] = pd.to_datetime(frame["date"], format="%Y-%m-%d")
    return frame.astype(
        {
            "date": "datetime64[ns]",
            "line": "str",
            "region": "str",
            "units": "int64",
            "price": "float64",
            "revenue": "float64",
        }
    )
