"""Drawing charts from a table: matplotlib's object API (no pyplot state), PNG within a bound.

Everything here is pure: a DataFrame and a few names in, PNG bytes and notes out. It runs in
worker threads concurrently, which is why it builds ``Figure`` + ``FigureCanvasAgg`` itself
instead of touching pyplot's global figure manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import dates as mdates
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from .config import ChartSettings
from .errors import InvalidRequest
from .png import figure_png

KINDS = ("bar", "line", "scatter", "hist", "area")
# Drawing more points than this adds ink, time and PNG bytes, not information.
MAX_SCATTER_POINTS = 20_000
MAX_LINE_POINTS = 20_000
MAX_HIST_BINS = 60
LABEL_CHARS = 32
POSITIVE, NEGATIVE = "#4C72B0", "#C44E52"

# Titles and labels come from agents and data: '$' must print as '$', not start TeX math
# (which raises on unbalanced input). Set once, at import: this process draws nothing else.
matplotlib.rcParams["text.parse_math"] = False


@dataclass
class Prepared:
    """The frame to draw (already aggregated/sampled) and what the person should know."""

    x: pd.Series
    y: pd.Series | None
    x_kind: str  # "datetime" | "numeric" | "category" | "ordinal" (periods on bars)
    notes: list[str] = field(default_factory=list)


def column_kind(col: pd.Series) -> str:
    if pd.api.types.is_datetime64_any_dtype(col.dtype) or isinstance(col.dtype, pd.PeriodDtype):
        return "datetime"
    if pd.api.types.is_numeric_dtype(col.dtype):  # bool included: True/False count as 1/0
        return "numeric"
    first = col.dropna().head(1)
    if len(first) and hasattr(first.iloc[0], "isoformat") and not isinstance(first.iloc[0], str):
        return "datetime"  # datetime.date objects (Arrow date32)
    return "category"


def check_request(
    columns: dict[str, str], x: str, y: str | None, kind: str
) -> tuple[str | None, list[str]]:
    """Validate names before reading any data; returns (y to use, notes)."""
    check_kind(kind)
    notes: list[str] = []
    _check_column(columns, x, "x")
    if kind == "hist":
        if y:
            notes.append(f"hist draws the distribution of x; y={y!r} was ignored")
        return None, notes
    if y is None or y == "":
        if kind == "bar":
            return None, ["no y given: bars count rows per x"]
        raise InvalidRequest(f"{kind} charts need y (a numeric column); columns: {_names(columns)}")
    _check_column(columns, y, "y")
    return y, notes


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InvalidRequest(f"unknown chart kind {kind!r}; kinds are: {', '.join(KINDS)}")


def _check_column(columns: dict[str, str], name: str, role: str) -> None:
    if name not in columns:
        raise InvalidRequest(
            f"{role}={name!r} is not a column of this dataRef; columns: {_names(columns)}"
        )


def _names(columns: dict[str, str]) -> str:
    names = list(columns)
    shown = ", ".join(repr(n) for n in names[:40])
    return shown + (f" ... ({len(names)} in all)" if len(names) > 40 else "")


# -- preparing the data ----------------------------------------------------------


def prepare(frame: pd.DataFrame, x: str, y: str | None, kind: str, max_categories: int) -> Prepared:
    """Clean, aggregate and cut the data to what is drawn; every cut becomes a note."""
    if len(frame) == 0:
        raise InvalidRequest("this dataRef has no rows - nothing to chart")
    xs = _as_plottable(frame[x], kind)
    # Periods on bars are labels ("2025Q3") that keep their time order.
    periods = isinstance(frame[x].dtype, pd.PeriodDtype) and kind == "bar"
    x_kind = "ordinal" if periods else column_kind(xs)
    ys = None if y is None else _numeric_y(frame[y], y, kind)
    data = pd.DataFrame({"x": xs, "y": ys if ys is not None else 1.0})
    notes: list[str] = []
    keep = data["x"].notna() & data["y"].notna()
    if not keep.all():
        notes.append(f"{int((~keep).sum()):,} rows with empty x or y left out")
        data = data[keep]
    if len(data) == 0:
        raise InvalidRequest("every row has an empty x or y - nothing to chart")
    if kind == "scatter" and x_kind == "category":
        raise InvalidRequest(
            f"scatter needs a numeric or date x; {x!r} holds text - use kind='bar' for categories"
        )
    if kind == "hist" and x_kind == "category":
        raise InvalidRequest(
            f"hist needs a numeric or date x; {x!r} holds text - use kind='bar' without y "
            "to count rows per category"
        )
    shaper = {"bar": _bar_data, "line": _line_data, "area": _line_data, "scatter": _point_data}
    if kind in shaper:  # hist counts every row: binning a million values is cheap
        data = shaper[kind](data, x_kind, x, y, max_categories, notes)
    return Prepared(
        x=data["x"], y=None if kind == "hist" else data["y"], x_kind=x_kind, notes=notes
    )


def _as_plottable(col: pd.Series, kind: str) -> pd.Series:
    if isinstance(col.dtype, pd.PeriodDtype):
        # Quarters read best as labels on bars, as time everywhere else.
        return col.astype(str) if kind == "bar" else col.dt.to_timestamp()
    if column_kind(col) == "datetime" and not pd.api.types.is_datetime64_any_dtype(col.dtype):
        return pd.to_datetime(col, errors="coerce")
    if pd.api.types.is_bool_dtype(col.dtype):
        return col.astype(float)
    return col


def _numeric_y(col: pd.Series, name: str, kind: str) -> pd.Series:
    if pd.api.types.is_bool_dtype(col.dtype):
        return col.astype(float)
    if not pd.api.types.is_numeric_dtype(col.dtype):
        raise InvalidRequest(
            f"y={name!r} is not numeric ({col.dtype}) - {kind} charts need a numeric y; "
            "convert it in run_python first, or use it as x"
        )
    return col.astype(float)


def _bar_data(
    data: pd.DataFrame, x_kind: str, x: str, y: str | None, top: int, notes: list[str]
) -> pd.DataFrame:
    rows = len(data)
    data = data.groupby("x", sort=False, dropna=True)["y"].sum().reset_index()
    if y is not None and len(data) < rows:
        notes.append(f"{y} summed per {x} ({rows:,} rows -> {len(data):,} bars)")
    if len(data) > top and x_kind in ("datetime", "ordinal"):  # holes in time would mislead
        notes.append(f"the last {top} of {len(data):,} {x} values")
        data = data.sort_values("x").tail(top)
    elif len(data) > top:
        measure = f"|{y}|" if y is not None else "row count"
        notes.append(f"top {top} of {len(data):,} {x} values by {measure}")
        data = data.loc[data["y"].abs().sort_values(ascending=False).index[:top]]
    # Categories read best ranked by value; time and numbers keep their own order.
    return data.sort_values("y" if x_kind == "category" else "x", ascending=x_kind != "category")


def _line_data(
    data: pd.DataFrame, x_kind: str, x: str, y: str | None, top: int, notes: list[str]
) -> pd.DataFrame:
    rows = len(data)
    # Time and numbers in order; labels in the order they first appear.
    data = data.groupby("x", sort=x_kind != "category")["y"].sum().reset_index()
    if len(data) < rows:
        notes.append(f"{y} summed per {x} ({rows:,} rows -> {len(data):,} points)")
    if len(data) > MAX_LINE_POINTS:
        step = -(-len(data) // MAX_LINE_POINTS)
        notes.append(f"every {step}th of {len(data):,} points drawn")
        data = data.iloc[::step]
    return data


def _point_data(
    data: pd.DataFrame, x_kind: str, x: str, y: str | None, top: int, notes: list[str]
) -> pd.DataFrame:
    if len(data) > MAX_SCATTER_POINTS:
        notes.append(f"a random {MAX_SCATTER_POINTS:,} of {len(data):,} rows drawn")
        data = data.sample(MAX_SCATTER_POINTS, random_state=0)  # same picture on every call
    return data


# -- drawing ---------------------------------------------------------------------


def draw(
    prep: Prepared, x: str, y: str | None, kind: str, title: str | None, settings: ChartSettings
) -> Figure:
    """A Figure sized for 100 dpi; a lower savefig dpi scales the whole picture down."""
    size = (settings.width_px / 100, settings.height_px / 100)
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.add_subplot()
    if kind == "bar":
        horizontal = _draw_bar(ax, prep)
        value_axis = ax.xaxis if horizontal else ax.yaxis
        value_label, cat_label = (y or "rows"), x
        ax.set_xlabel(value_label if horizontal else cat_label)
        ax.set_ylabel(cat_label if horizontal else value_label)
    else:
        _draw_xy(ax, prep, kind)
        value_axis = ax.yaxis
        ax.set_xlabel(x)
        ax.set_ylabel("rows" if kind == "hist" else (y or ""))
        if prep.x_kind == "numeric":
            ax.xaxis.set_major_formatter(FuncFormatter(_thousands))
    value_axis.set_major_formatter(FuncFormatter(_thousands))
    ax.grid(True, axis="y" if value_axis is ax.yaxis else "x", color="0.9")
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.suptitle(_cut(title or default_title(x, y, kind), 90), fontsize=12, fontweight="bold")
    if prep.notes:
        ax.set_title(_cut("; ".join(prep.notes), 130), fontsize=8, color="0.35", loc="left")
    return fig


def default_title(x: str, y: str | None, kind: str) -> str:
    if kind == "hist":
        return f"Distribution of {x}"
    return f"{y} by {x}" if y else f"Rows by {x}"


def _draw_bar(ax: Any, prep: Prepared) -> bool:
    """Bars; horizontal when there are many or long labels. Returns True if horizontal."""
    assert prep.y is not None
    values = prep.y.to_numpy()
    colors = [NEGATIVE if v < 0 else POSITIVE for v in values]
    if prep.x_kind == "datetime":
        labels = [_date_label(v) for v in prep.x]
    else:
        labels = [_label(v) for v in prep.x]
    longest = max((len(s) for s in labels), default=0)
    horizontal = prep.x_kind == "category" and (len(labels) > 12 or longest > 10)
    positions = np.arange(len(labels))
    size = max(5.0, min(9.0, 260 / max(len(labels), 1)))
    if horizontal:
        # Largest at the top: barh draws the first row at the bottom.
        ax.barh(positions, values[::-1], color=colors[::-1], height=0.75)
        ax.set_yticks(positions, labels[::-1], fontsize=size)
        ax.margins(y=0.01)
        if (values < 0).any():
            ax.axvline(0, color="0.3", linewidth=0.8)
    else:
        ax.bar(positions, values, color=colors, width=0.75)
        rotate = len(labels) > 8 or longest > 6
        ax.set_xticks(
            positions,
            labels,
            fontsize=size,
            rotation=45 if rotate else 0,
            ha="right" if rotate else "center",
            rotation_mode="anchor",
        )
        if (values < 0).any():
            ax.axhline(0, color="0.3", linewidth=0.8)
    return horizontal


def _label_positions(ax: Any, xs: pd.Series) -> pd.Series:
    """Line/area over text labels: positions 0..n-1, with at most ~20 labels shown."""
    labels = [_label(v) for v in xs]
    positions = pd.Series(np.arange(len(labels)), dtype=float)
    step = max(1, -(-len(labels) // 20))
    ticks = positions.to_numpy()[::step]
    ax.set_xticks(ticks, labels[::step], rotation=45, ha="right", rotation_mode="anchor")
    ax.tick_params(axis="x", labelsize=8)
    return positions


def _draw_xy(ax: Any, prep: Prepared, kind: str) -> None:
    xs = _label_positions(ax, prep.x) if prep.x_kind == "category" else prep.x
    if kind == "hist":
        values = mdates.date2num(xs) if prep.x_kind == "datetime" else xs.to_numpy(float)
        edges = np.histogram_bin_edges(values, bins="auto")
        bins = min(len(edges) - 1, MAX_HIST_BINS)
        ax.hist(values, bins=max(bins, 1), color=POSITIVE, edgecolor="white", linewidth=0.5)
    elif kind == "scatter":
        dense = len(xs) > 2000  # small, faint dots where they overlap
        style = {"s": 4, "alpha": 0.35} if dense else {"s": 14, "alpha": 0.8}
        ax.scatter(xs, prep.y, color=POSITIVE, linewidths=0, **style)
    else:
        ax.plot(xs, prep.y, color=POSITIVE, linewidth=1.4)
        if kind == "area":
            ax.fill_between(xs, prep.y, 0, color=POSITIVE, alpha=0.3, linewidth=0)
    if prep.x_kind == "datetime":
        if kind == "hist":
            ax.xaxis_date()
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    elif prep.x_kind == "numeric":
        ax.xaxis.set_major_locator(MaxNLocator(nbins=10))


def _thousands(value: float, _pos: Any = None) -> str:
    """Tick labels with thousands separators: 1,250,000 / 0.25 / -3,400."""
    if abs(value - round(value)) < 1e-9 * max(1.0, abs(value)):
        return f"{round(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.4g}"


def _label(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"{int(value)}"
    return clean_text(str(value), LABEL_CHARS) or ""


def _date_label(value: Any) -> str:
    stamp = pd.Timestamp(value)
    return stamp.date().isoformat() if stamp == stamp.normalize() else stamp.isoformat(sep=" ")


def clean_text(text: str | None, limit: int = 200) -> str | None:
    """Agent-given text fit to draw and store: no lone surrogates, no control characters."""
    if text is None:
        return None
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return _cut(text, limit) or None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_png(
    frame: pd.DataFrame,
    x: str,
    y: str | None,
    kind: str,
    title: str | None,
    settings: ChartSettings,
) -> tuple[bytes, list[str]]:
    """Draw ``frame`` (which holds at least x and y) and return (png, notes)."""
    prep = prepare(frame, x, y, kind, settings.max_categories)
    fig = draw(prep, x, y, kind, title, settings)
    return figure_png(fig, settings), prep.notes
