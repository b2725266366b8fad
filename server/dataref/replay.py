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

import json
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa

from .artifact import frame_to_table
from .config import Settings, load_settings, local_user
from .errors import InvalidRequest, NotFound

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
    from .producers import Batches, ProducerContext

    settings, owner = _settings()
    producer = _registry().get(producer_name)
    arguments = producer.explicit(arguments)  # as the server records and runs them
    result = producer.run(ProducerContext(owner=owner, settings=settings), arguments)
    if isinstance(result, Batches):  # a SQL source: the same rows and types the store kept
        return result.read_all().to_pandas()
    return frame_to_table(result).to_pandas()


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
    table = pa.Table.from_pandas(_convert().normalise(value), preserve_index=False)
    return table.to_pandas()


def _convert() -> Any:
    """The kernel profile's conversion rules (``kernel_profile/startup/lib/convert.py``)."""
    if "convert" not in _state:
        import importlib.util

        from .kernels.sandbox import profile_startup_dir

        path = profile_startup_dir() / "lib" / "convert.py"
        spec = importlib.util.spec_from_file_location("_dataref_convert", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        _state["convert"] = module
    return _state["convert"]


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
    return Shown(json.loads(json.dumps(_convert().to_json(value))))


# -- charts -------------------------------------------------------------------------------


def chart(
    frame: pd.DataFrame, x: str, y: str | None = None, kind: str = "bar", title: str | None = None
) -> Any:
    """The chart ``render_chart`` drew: same drawing code, same size; displays inline."""
    from IPython.display import Image

    from .charts import render_png

    columns = [c for c in dict.fromkeys((x, y)) if c]
    png, _notes = render_png(frame[columns], x, y, kind, title, _settings()[0].charts)
    return Image(data=png)
