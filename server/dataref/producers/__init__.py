"""The @producer registry: functions that return a DataFrame become fetch tools.

A producer author writes only the query::

    from dataref.producers import producer, ProducerContext

    @producer
    def fetch_orders(ctx: ProducerContext, since: str, status: str | None = None) -> pd.DataFrame:
        \"\"\"Orders placed since an ISO date.\"\"\"
        ...

The framework adds the rest: the MCP tool (with an optional ``notebook`` argument), storing
the frame as an artifact, its lineage, its Description and its transcript cell. Built-ins
(``demo``, ``sql``) register exactly like third-party modules: through the entry-point group
``dataref.producers`` or the ``producers.plugins`` setting.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pandas as pd

from ..config import Settings
from ..errors import DatarefError, InvalidRequest
from .rows import Batches

ENTRY_POINT_GROUP = "dataref.producers"


@dataclass
class ProducerContext:
    """What a producer may know about the call: who asks, and the settings."""

    owner: str
    settings: Settings
    # A producer sets this when its rows come from a sensitive source: no samples then.
    sensitive: bool = False
    # The source the rows come from (use_source); the exposure ledger counts against it.
    source: str | None = None
    # Set by the workspace: checks the source's budget; raises when it is spent.
    guard: Callable[[str, str], None] | None = None

    def use_source(self, name: str) -> None:
        """Name the source the rows come from, before reading it: its daily budget is
        checked (a spent one refuses the call) and the artifact's lineage records it."""
        self.source = name
        if self.guard is not None:
            self.guard(self.owner, name)


@dataclass(frozen=True)
class Producer:
    name: str
    func: Callable[..., pd.DataFrame]
    description: str
    sensitive: bool = False
    module: str = ""  # where it was defined: a server serves only the modules it loaded
    # The parameters the agent passes (the function's signature without ctx).
    parameters: tuple[inspect.Parameter, ...] = ()

    def explicit(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments that differ from the defaults: what the call really asked for."""
        defaults = {p.name: p.default for p in self.parameters}
        return {
            k: v
            for k, v in arguments.items()
            if v is not None
            and not (
                k in defaults and defaults[k] is not inspect.Parameter.empty and defaults[k] == v
            )
        }

    def run(self, ctx: ProducerContext, arguments: dict[str, Any]) -> pd.DataFrame | Batches:
        """Call the producer; a wrong return type is a bug of the producer, not the agent.

        A producer returns a DataFrame, or ``Batches`` that the store writes as they stream.
        """
        known = {p.name for p in self.parameters}
        unknown = sorted(set(arguments) - known)
        if unknown:
            raise InvalidRequest(
                f"{self.name} has no argument {unknown[0]!r}; its arguments are {sorted(known)}"
            )
        if self.sensitive:
            ctx.sensitive = True
        frame = self.func(ctx, **arguments)
        if not isinstance(frame, pd.DataFrame | Batches):
            raise TypeError(
                f"producer {self.name} returned {type(frame).__name__}, not a DataFrame"
            )
        return frame


class ProducerRegistry:
    def __init__(self) -> None:
        self._producers: dict[str, Producer] = {}

    def add(self, producer: Producer) -> None:
        self._producers[producer.name] = producer

    def get(self, name: str) -> Producer:
        try:
            return self._producers[name]
        except KeyError:
            raise InvalidRequest(
                f"no producer named {name!r}; available: {sorted(self._producers)}"
            ) from None

    def __iter__(self) -> Iterator[Producer]:
        return iter(sorted(self._producers.values(), key=lambda p: p.name))

    def __contains__(self, name: object) -> bool:
        return name in self._producers


registry = ProducerRegistry()

RESERVED_ARGUMENTS = frozenset({"notebook", "ctx"})


def producer(
    func: Callable[..., pd.DataFrame] | None = None,
    *,
    name: str | None = None,
    sensitive: bool = False,
    into: ProducerRegistry | None = None,
) -> Any:
    """Register ``func(ctx, **arguments) -> DataFrame`` as a producer tool."""

    def register(fn: Callable[..., pd.DataFrame]) -> Callable[..., pd.DataFrame]:
        params = list(inspect.signature(fn, eval_str=True).parameters.values())
        if not params or params[0].name != "ctx":
            raise TypeError(f"producer {fn.__name__} must take ctx: ProducerContext first")
        clashes = RESERVED_ARGUMENTS & {p.name for p in params[1:]}
        if clashes:
            raise TypeError(f"producer {fn.__name__} may not define {sorted(clashes)}")
        (into or registry).add(
            Producer(
                name=name or fn.__name__,
                func=fn,
                description=inspect.cleandoc(fn.__doc__ or fn.__name__),
                sensitive=sensitive,
                module=fn.__module__,
                parameters=tuple(params[1:]),
            )
        )
        return fn

    return register(func) if func is not None else register


def load_producers(settings: Settings) -> ProducerRegistry:
    """The producers of the built-ins, entry points and ``settings.producers.plugins``.

    Importing a module registers its producers in the process-wide registry; the registry
    returned holds only those of the modules this configuration names, so two servers in one
    process (tests, embedding) do not see each other's plugins.
    """
    modules = {"dataref.producers.demo", "dataref.producers.sql"}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()
        modules.add(ep.module)
    for module in modules | set(settings.producers.plugins):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise DatarefError(f"producer plugin {module!r} could not be imported: {exc}") from exc
    modules |= set(settings.producers.plugins)
    selected = ProducerRegistry()
    for item in registry:
        if item.module in modules:
            selected.add(item)
    return selected
