"""What an exported notebook imports (``import dataref.replay as dr``) to run again.

* ``dr.fetch_sales(...)``, ``dr.fetch_sql(...)`` and every registered producer run the
  producer directly: no MCP server, no artifact store. They read the configured sources
  (``load_settings()``: ``DATAREF_CONFIG``, ``DATAREF_*``) as the person running the notebook
  (``settings.owner`` or the local user, as ``dataref serve`` over stdio), so the source's
  rules apply to them, not to whoever recorded the session.
* Frames come back as the session's kernel saw them: through Arrow, as the store keeps them.
* ``dr.output``, ``dr.show`` and ``dr.chart`` do what the server did with a call's outputs,
  its ``result`` and ``render_chart``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from .config import Settings, load_settings, local_user
from .errors import InvalidRequest, NotFound
from .store import frame_to_table

_state: dict[str, Any] = {}


def configure(settings: Settings | None = None, owner: str | None = None) -> None:
    """Use these settings (default: ``load_settings()``) and owner from now on."""
    settings = settings or load_settings()
    _state.clear()
    _state.update(settings=settings, owner=owner or settings.owner or local_user())


def _settings() -> tuple[Settings, str]:
    if "settings" not in _state:
        configure()
    return _state["settings"], _state["owner"]


def _registry() -> Any:
    if "registry" not in _state:  # loading scans entry points: once per configuration
        from .producers import load_producers

        _state["registry"] = load_producers(_settings()[0])
    return _state["registry"]


def fetch(producer_name: str, **arguments: Any) -> pd.DataFrame:
    """Run a producer as the current person; the frame as the session's kernel saw it."""
    from .producers import ProducerContext

    settings, owner = _settings()
    producer = _registry().get(producer_name)
    arguments = {k: v for k, v in arguments.items() if v is not None}  # as the server does
    frame = producer.run(ProducerContext(owner=owner, settings=settings), arguments)
    return frame_to_table(frame).to_pandas()


def __getattr__(name: str) -> Callable[..., pd.DataFrame]:
    """``dr.fetch_sales`` and friends: one function per registered producer."""
    if name.startswith("_"):
        raise AttributeError(name)
    registry = _registry()
    if name not in registry:
        raise AttributeError(
            f"dataref.replay has no {name!r}; producers here: {[p.name for p in registry]}"
        )
    producer = registry.get(name)

    def run(**arguments: Any) -> pd.DataFrame:
        return fetch(name, **arguments)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = producer.description
    return run


def __dir__() -> list[str]:
    return sorted([*globals(), *(p.name for p in _registry())])


def artifact(ref: str) -> pd.DataFrame:
    """A dataRef the notebook did not make itself: replay cannot make it again."""
    raise NotFound(
        f"{ref} was made outside this notebook (by another notebook or an earlier session), "
        "so it cannot be fetched again here - add the call that made it, or replay that "
        "notebook first and bind its variable instead"
    )


# -- outputs: what the kernel stores -------------------------------------------------


def output(outputs: dict[str, Any], name: str) -> pd.DataFrame:
    """``outputs[name]`` as the server stored it, so later cells see what the agent's saw."""
    value = outputs[name]
    if isinstance(value, pd.Series):
        value = value.to_frame(name=value.name if value.name is not None else name)
    if not isinstance(value, pd.DataFrame):
        raise InvalidRequest(f"outputs[{name!r}] is a {type(value).__name__}, not a DataFrame")
    table = pa.Table.from_pandas(_normalise(value), preserve_index=False)
    return table.to_pandas()


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """The kernel's rule: leftover row numbers go, a labelled index becomes columns."""
    index = frame.index
    positional = index.name is None and not isinstance(index, pd.MultiIndex)
    if positional and (pd.api.types.is_integer_dtype(index.dtype) or len(index) == 0):
        frame = frame.reset_index(drop=True)
    else:
        frame = frame.reset_index()
    if isinstance(frame.columns, pd.MultiIndex):
        names = ["_".join(str(p) for p in key if str(p) != "") for key in frame.columns]
    else:
        names = [str(c) for c in frame.columns]
    frame = frame.copy(deep=False)
    frame.columns = names
    return frame


# -- result: the JSON the agent received ------------------------------------------------


class Shown:
    """Displays a result as the JSON text the agent received."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        text = json.dumps(self.value, ensure_ascii=False)
        return json.dumps(self.value, ensure_ascii=False, indent=2) if len(text) > 100 else text


def show(value: Any) -> Shown | None:
    """``result`` as the server returned it (numpy, pandas and dates made plain JSON)."""
    if value is None:
        return None
    return Shown(json.loads(json.dumps(jsonable(value))))


_TABLES = (pd.DataFrame, pd.Series, pd.Index, np.ndarray)


def jsonable(value: Any, depth: int = 0) -> Any:
    """The kernel's conversion of ``result`` to JSON (``kernel_profile``), value for value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (float, np.floating, decimal.Decimal)):
        number = float(value)
        return number if math.isfinite(number) else None
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.datetime64):
        stamp = pd.Timestamp(value)
        return None if stamp is pd.NaT else stamp.isoformat()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, np.timedelta64):
        return str(pd.Timedelta(value))
    if isinstance(value, (dt.timedelta, pd.Period, pd.Interval)):
        return str(value)
    if isinstance(value, _TABLES) or depth > 50:
        raise TypeError(f"result holds a {type(value).__name__}, which the server does not return")
    if isinstance(value, dict):
        return {_key(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [jsonable(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, np.generic):
        return jsonable(value.item(), depth + 1)
    raise TypeError(f"result holds a {type(value).__name__}, which is not JSON")


def _key(key: Any) -> str:
    key = jsonable(key)
    return key if isinstance(key, str) else json.dumps(key)


# -- charts -------------------------------------------------------------------------------


def chart(
    frame: pd.DataFrame, x: str, y: str | None = None, kind: str = "bar", title: str | None = None
) -> Any:
    """The chart ``render_chart`` drew: same drawing code, same size; displays inline."""
    from IPython.display import Image

    columns = [c for c in dict.fromkeys((x, y)) if c]
    frame = frame[columns]
    try:
        from .consumers import draw_chart  # type: ignore[attr-defined]
    except ImportError:
        draw_chart = None
    if draw_chart is not None:
        drawn = draw_chart(frame, x, y, kind, title)
        return Image(data=drawn) if isinstance(drawn, bytes) else drawn
    try:
        from .charts import render_png
    except ImportError:
        return _fallback_chart(frame, x, y, kind, title)
    png, _notes = render_png(frame, x, y, kind, title, _settings()[0].charts)
    return Image(data=png)


def _fallback_chart(
    frame: pd.DataFrame, x: str, y: str | None, kind: str, title: str | None
) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    if kind == "hist" or y is None:
        ax.hist(frame[x].dropna(), bins=30)
    else:
        plot = {"bar": ax.bar, "line": ax.plot, "scatter": ax.scatter, "area": ax.fill_between}
        plot[kind](frame[x].astype(str) if kind == "bar" else frame[x], frame[y])
    ax.set_title(title or (f"{y} by {x}" if y else x))
    return fig
