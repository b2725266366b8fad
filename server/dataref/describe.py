"""The shape of a table, never its content (beyond a few sample rows).

``describe`` gives the Description every producer and run_python output returns;
``describe_columns`` gives the per-column statistics of the ``describe_data`` tool.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

MAX_SAMPLE_TEXT = 48  # longer strings in samples are cut: samples show shape, not content


def describe(ref: str, table: pa.Table, *, sample_rows: int, sensitive: bool) -> dict[str, Any]:
    """The Description of SPEC.md: dataRef, rows, columns, nulls (non-zero only), sample."""
    head = table.slice(0, max(sample_rows, 1)).to_pandas()
    nulls = {
        name: table.column(name).null_count
        for name in table.column_names
        if table.column(name).null_count
    }
    out: dict[str, Any] = {
        "dataRef": ref,
        "rows": table.num_rows,
        "columns": {str(name): dtype_name(dtype) for name, dtype in head.dtypes.items()},
    }
    if nulls:
        out["nulls"] = nulls
    out["sample"] = [] if sensitive or sample_rows == 0 else sample_records(head.head(sample_rows))
    return out


def dtype_name(dtype: Any) -> str:
    name = str(dtype)
    return "str" if name in ("string", "object", "str") else name


def sample_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {str(k): json_scalar(v) for k, v in row.items()} for row in frame.to_dict(orient="records")
    ]


def json_scalar(value: Any) -> Any:
    """A compact JSON value: dates without midnight times, no NaN, short strings."""
    if value is None or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        if value == value.normalize():
            return value.date().isoformat()
        return value.isoformat()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return round(value, 6)
    if isinstance(value, str) and len(value) > MAX_SAMPLE_TEXT:
        return value[: MAX_SAMPLE_TEXT - 1] + "…"
    if isinstance(value, (int, bool, str)):
        return value
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    text = str(value)
    return text if len(text) <= MAX_SAMPLE_TEXT else text[: MAX_SAMPLE_TEXT - 1] + "…"


def describe_columns(table: pa.Table, *, sensitive: bool, top: int = 5) -> dict[str, Any]:
    """Per-column count, nulls, unique, and min/max/mean/std/quantiles or top values."""
    frame = table.to_pandas()
    columns: dict[str, Any] = {}
    for name in frame.columns:
        columns[str(name)] = _column_stats(frame[name], sensitive=sensitive, top=top)
    return {"rows": len(frame), "columns": columns}


def _column_stats(col: pd.Series, *, sensitive: bool, top: int) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "dtype": dtype_name(col.dtype),
        "count": int(col.count()),
        "nulls": int(col.isna().sum()),
    }
    with contextlib.suppress(TypeError):  # unhashable values have no unique count
        stats["unique"] = int(col.nunique(dropna=True))
    if pd.api.types.is_bool_dtype(col.dtype):
        stats["true"] = int(col.sum())
    elif pd.api.types.is_numeric_dtype(col.dtype):
        clean = col.dropna()
        if len(clean):
            quantiles = clean.quantile([0.25, 0.5, 0.75])
            stats.update(
                min=json_scalar(clean.min()),
                max=json_scalar(clean.max()),
                mean=json_scalar(clean.mean()),
                std=json_scalar(clean.std()),
                p25=json_scalar(quantiles.iloc[0]),
                p50=json_scalar(quantiles.iloc[1]),
                p75=json_scalar(quantiles.iloc[2]),
            )
    elif pd.api.types.is_datetime64_any_dtype(col.dtype):
        clean = col.dropna()
        if len(clean):
            stats.update(min=json_scalar(clean.min()), max=json_scalar(clean.max()))
    elif not sensitive:
        counts = col.value_counts().head(top)
        stats["top"] = {str(json_scalar(k)): int(v) for k, v in counts.items()}
    return stats
