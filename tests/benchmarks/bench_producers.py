"""Producer plugin for the benchmarks: big generated tables, fetched through dataref.

Loaded with ``DATAREF_PRODUCERS__PLUGINS='["tests.benchmarks.bench_producers"]'`` (the child
needs the repo root on PYTHONPATH). The tables come from the shared cache of ``data.py``,
so fetching measures what dataref does with a result (store, describe, transcript), not how
fast numpy generates rows.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from dataref.errors import InvalidRequest
from dataref.producers import ProducerContext, producer
from dataref.producers.demo import DEMO_SEED

from .data import CACHE_ENV, read_arrow, sales_path, wide_path

MAX_ROWS = 20_000_000


def _cache(ctx: ProducerContext) -> Path | None:
    """The shared cache when the harness names one, else a cache under the state dir."""
    return None if os.environ.get(CACHE_ENV) else ctx.settings.state_dir / "bench-cache"


@producer
def fetch_big(ctx: ProducerContext, rows: int) -> pd.DataFrame:
    """Benchmark only: `rows` generated sales rows (date, line, region, units, price, revenue)."""
    if not 1 <= rows <= MAX_ROWS:
        raise InvalidRequest(f"rows must be 1..{MAX_ROWS}")
    return read_arrow(sales_path(rows, DEMO_SEED, _cache(ctx))).to_pandas()


@producer
def fetch_wide(ctx: ProducerContext, rows: int, cols: int = 10) -> pd.DataFrame:
    """Benchmark only: a numeric table of `rows` x `cols` (float64 and two int64 columns)."""
    if not 1 <= rows <= MAX_ROWS or not 3 <= cols <= 100:
        raise InvalidRequest(f"rows must be 1..{MAX_ROWS}, cols 3..100")
    return read_arrow(wide_path(rows, cols, _cache(ctx))).to_pandas()
