"""The benchmark tables, generated once and cached as Arrow IPC files.

Every server in the benchmark (dataref, the seed-style baseline, the naive one) serves the
same rows: dataref's demo generator ``generate_sales(rows, seed)``. The cache directory is
shared by the harness and the servers it spawns (``DATAREF_BENCH_CACHE``), so the 5M-row
table is generated once per machine, not once per run or per server.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dataref.producers.demo import DEMO_ROWS, DEMO_SEED, generate_sales

CACHE_ENV = "DATAREF_BENCH_CACHE"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO_ROOT / ".state" / "bench-cache"
# Bump when a generator changes: old cache files are then ignored.
CACHE_VERSION = 2  # 2: one record batch, as the store writes a frame


def cache_dir(default: Path | None = None) -> Path:
    path = Path(os.environ.get(CACHE_ENV) or default or DEFAULT_CACHE)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_atomic(path: Path, table: pa.Table) -> None:
    """Write to a temp file and rename: concurrent servers never read half a file."""
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_arrow(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def sales_path(rows: int, seed: int = DEMO_SEED, directory: Path | None = None) -> Path:
    """The cached sales table of ``rows`` rows (generated on first use)."""
    path = cache_dir(directory) / f"sales-v{CACHE_VERSION}-{rows}-{seed}.arrow"
    if not path.is_file():
        frame = generate_sales(rows, seed)
        _write_atomic(path, pa.Table.from_pandas(frame, preserve_index=False))
    return path


def load_sales(rows: int, seed: int = DEMO_SEED, directory: Path | None = None) -> pd.DataFrame:
    return read_arrow(sales_path(rows, seed, directory)).to_pandas()


def demo_sales(since: str, until: str | None = None, region: str | None = None) -> pd.DataFrame:
    """The rows dataref's demo ``fetch_sales`` returns (same generator, same seed)."""
    frame = load_sales(DEMO_ROWS, DEMO_SEED)
    keep = frame["date"] >= pd.Timestamp(since)
    if until is not None:
        keep &= frame["date"] <= pd.Timestamp(until)
    if region is not None:
        keep &= frame["region"].str.lower() == region.strip().lower()
    return frame[keep].reset_index(drop=True)


def wide_path(rows: int, cols: int = 10, directory: Path | None = None) -> Path:
    """A numeric table: ``cols - 2`` float64 columns and 2 int64 columns (sandbox.md §3)."""
    path = cache_dir(directory) / f"wide-v{CACHE_VERSION}-{rows}x{cols}.arrow"
    if not path.is_file():
        rng = np.random.default_rng(7)
        data = {f"f{i}": rng.random(rows) for i in range(cols - 2)}
        data.update({f"i{i}": rng.integers(0, 1_000_000, rows) for i in range(2)})
        _write_atomic(path, pa.table(data))
    return path
