"""How outputs and ``result`` are made storable: one copy, used by the kernel and by replay.

The kernel's startup code loads this file by path (IPython runs only the ``*.py`` files at
the top of the startup directory, not this ``lib/``), and ``dataref.replay`` loads the same
file, so an exported notebook shows exactly what the server stored and returned.
"""

import datetime as dt
import decimal
import json
import math

import numpy as np
import pandas as pd

TABLES = (pd.DataFrame, pd.Series, pd.Index, np.ndarray)


def normalise(frame):
    """What Arrow can store without losing information the agent meant to keep."""
    index = frame.index
    positional = index.name is None and not isinstance(index, pd.MultiIndex)
    if positional and (pd.api.types.is_integer_dtype(index.dtype) or len(index) == 0):
        frame = frame.reset_index(drop=True)  # leftover row numbers, e.g. after a filter
    else:
        frame = frame.reset_index()  # a labelled index (groupby keys, dates): keep it
    columns = frame.columns
    if isinstance(columns, pd.MultiIndex):
        names = ["_".join(str(p) for p in key if str(p) != "") for key in columns]
    else:
        names = [str(c) for c in columns]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate column names {dupes} - rename them")
    frame = frame.copy(deep=False)
    frame.columns = names
    return frame


def key_text(key, where):
    key = to_json(key, where)
    if isinstance(key, str):
        return key
    return json.dumps(key)  # 1 -> "1", None -> "null", True -> "true"


def to_json(value, where="result", depth=0, seen=frozenset()):
    """A JSON-ready copy of ``value``; TypeError names the offending part."""
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
        return value.isoformat()  # pd.Timestamp is a datetime
    if isinstance(value, (dt.timedelta, np.timedelta64, pd.Period, pd.Interval)):
        return str(pd.Timedelta(value)) if isinstance(value, np.timedelta64) else str(value)
    if isinstance(value, TABLES):
        raise TypeError(
            f"{where} is a {type(value).__name__}: put tables in outputs['name'] = df, or"
            " make it small and plain with .to_dict() / .tolist()"
        )
    return _container(value, where, depth, seen)


def _container(value, where, depth, seen):
    if depth > 50 or id(value) in seen:
        raise TypeError(f"{where} is nested too deeply or refers to itself")
    seen = seen | {id(value)}
    if isinstance(value, dict):
        return {
            key_text(k, where): to_json(v, f"{where}[{k!r}]", depth + 1, seen)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [to_json(v, f"{where}[{i}]", depth + 1, seen) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [to_json(v, f"{where} item", depth + 1, seen) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, np.generic):  # np.str_, np.complex...: their Python value
        return to_json(value.item(), where, depth + 1, seen)
    raise TypeError(
        f"{where} is a {type(value).__name__}, which is not JSON - use numbers, strings,"
        " lists and dicts (str(x) works for most objects)"
    )
