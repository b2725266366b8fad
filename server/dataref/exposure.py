"""Exposure: which sources a call touches, daily budgets per source and owner, and reports.

Attribution (what a reply counts against):

- a producer's reply counts against the source it read (``ProducerContext.use_source``; a
  producer that names none counts under its own tool name);
- any other reply counts against the sources of every dataRef in its arguments, through
  lineage: an artifact made by ``run_python`` or a chart carries the sources of the call that
  made it, so a chain of analyses still counts against the source it started from;
- ``run_python`` also counts against every source bound into that notebook's kernel since its
  last ``reset_kernel``: its variables may still hold that data;
- a reply that touches several sources counts in full against each of them (it is not
  split): per-source totals can add up to more than the bytes sent, never to less.

Budgets: ``[sources.NAME] model_bytes_per_day`` (``[demo] model_bytes_per_day`` for the demo
table) caps the bytes of replies counted against that source, per owner, per UTC day. Once an
owner has spent it, the tools that return data of the source (producers, run_python,
describe_data, render_chart) refuse until midnight UTC; exports, listings and notebook
export still work, since they send no data of the source to the model.
"""

from __future__ import annotations

import contextvars
import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .config import Settings
from .errors import LimitExceeded, human_bytes
from .ledger import NO_SOURCE, LedgerStorage, Query, Totals

if TYPE_CHECKING:
    from .store import ArtifactStore

# The sources a call's producer named, collected while it runs (the edge sets a fresh set).
TOUCHED: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("touched", default=None)

LINEAGE_DEPTH = 32  # how far back an artifact unknown to the ledger is followed in the store


class BudgetSpent(LimitExceeded):
    """An owner's daily budget of a source is spent: the tool refuses, saying until when."""


def day_start(now: float) -> float:
    """Midnight UTC of the day of ``now``: budgets count from there."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp()


def budget_of(settings: Settings, source: str) -> int | None:
    """The daily byte budget of a source per owner, or None when it has none."""
    if source in settings.sources:
        return settings.sources[source].model_bytes_per_day
    if source == "demo" and settings.demo.enabled:
        return settings.demo.model_bytes_per_day
    return None


def budget_setting(settings: Settings, source: str) -> str:
    return (
        "[demo] model_bytes_per_day"
        if source not in settings.sources
        else (f"[sources.{source}] model_bytes_per_day")
    )


class Exposure:
    """Attribution and budgets over one ledger (and the store, for pre-ledger artifacts)."""

    def __init__(
        self, settings: Settings, ledger: LedgerStorage, store: ArtifactStore | None = None
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.store = store

    def has_budgets(self) -> bool:
        """Whether any source has a daily budget: only then can a call be refused up front."""
        sources = self.settings.sources.values()
        demo = self.settings.demo
        return any(s.model_bytes_per_day is not None for s in sources) or (
            demo.enabled and demo.model_bytes_per_day is not None
        )

    # -- attribution ---------------------------------------------------------------------

    def sources_of(self, owner: str, refs: Iterable[str]) -> set[str]:
        refs = list(dict.fromkeys(refs))
        known = self.ledger.ref_sources(owner, refs)
        sources = set().union(*known.values()) if known else set()
        for ref in refs:
            if ref not in known:
                sources |= self._store_lineage(owner, ref, LINEAGE_DEPTH)
        return sources

    def _store_lineage(self, owner: str, ref: str, depth: int) -> set[str]:
        """Sources from the store's lineage: artifacts made before the ledger existed."""
        from .errors import NotFound

        if self.store is None or depth <= 0:
            return set()
        try:
            lineage = self.store.get(owner, ref).lineage
        except NotFound:
            return set()  # a foreign or missing ref touches nothing of this owner
        if lineage.get("source"):
            return {str(lineage["source"])}
        found: set[str] = set()
        for parent in lineage.get("parents", []):
            found |= self._store_lineage(owner, str(parent), depth - 1)
        return found

    def notebook_sources(self, owner: str, notebook: str | None) -> set[str]:
        return self.ledger.notebook_sources(owner, notebook) if notebook else set()

    # -- budgets -------------------------------------------------------------------------

    def touch(self, owner: str, source: str) -> None:
        """A producer reads ``source``: attribute the call to it, refuse if its budget is spent."""
        touched = TOUCHED.get()
        if touched is not None:
            touched.add(source)
        self.check(owner, [source])

    def check(self, owner: str, sources: Iterable[str], now: float | None = None) -> None:
        import time

        now = time.time() if now is None else now
        for source in sorted(set(sources)):
            budget = budget_of(self.settings, source)
            if budget is None:
                continue
            spent = self.ledger.spent(owner, source, day_start(now))
            if spent >= budget:
                raise BudgetSpent(budget_message(self.settings, source, spent, budget, now))


def budget_message(settings: Settings, source: str, spent: int, budget: int, now: float) -> str:
    resets = day_start(now) + 86400
    left = int(resets - now)
    when = dt.datetime.fromtimestamp(resets, dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
    return (
        f"today's budget of source {source!r} is spent: {human_bytes(spent)} of its data went "
        f"to the model today, the budget is {human_bytes(budget)} a day; it resets at {when} "
        f"(in {left // 3600}h{left % 3600 // 60:02d}m). Until then export_data still works "
        f"(a file for a person); ask the operator to raise {budget_setting(settings, source)} "
        "if the work needs more"
    )


# -- reports -----------------------------------------------------------------------------


def report(ledger: LedgerStorage, query: Query) -> list[dict[str, Any]]:
    """One row per (source, owner): calls, sample rows and bytes that reached the model."""
    rows = []
    for (source, owner), t in ledger.totals(query).items():
        rows.append({"source": source, "owner": owner, **_totals_dict(t)})
    return rows


def _totals_dict(t: Totals) -> dict[str, Any]:
    return {
        "calls": t.calls,
        "errors": t.errors,
        "refused": t.refused,
        "bytes": t.sizes["bytes"],
        "sample_rows": t.sizes["sample_rows"],
        "sample_bytes": t.sizes["sample_bytes"],
        "result_bytes": t.sizes["result_bytes"],
        "stdout_bytes": t.sizes["stdout_bytes"],
        "error_bytes": t.sizes["error_bytes"],
        "charts_sent": t.sizes["image_count"],
        "image_bytes": t.sizes["image_bytes"],
        "charts_made": t.charts,
        "exports": t.exports,
    }


def violations(settings: Settings, ledger: LedgerStorage, now: float) -> list[dict[str, Any]]:
    """Budgets spent today, per (source, owner): what ``dataref exposure --check`` fails on."""
    found = []
    for (source, owner), spent in sorted(ledger.spent_by(day_start(now)).items()):
        budget = budget_of(settings, source) if source != NO_SOURCE else None
        if budget is not None and spent >= budget:
            found.append({"source": source, "owner": owner, "spent": spent, "budget": budget})
    return found


# -- the command line: dataref exposure ----------------------------------------------------

COLUMNS = (
    ("source", "source"), ("owner", "owner"), ("calls", "calls"), ("errors", "errors"),
    ("refused", "refused"), ("sample_rows", "sample rows"), ("bytes", "bytes"),
    ("sample_bytes", "sample B"), ("result_bytes", "result B"), ("stdout_bytes", "stdout B"),
    ("error_bytes", "error B"), ("charts_sent", "charts sent"), ("exports", "exports"),
)  # fmt: skip


def parse_since(value: str | None) -> float | None:
    """An ISO date or date-time (UTC unless it says otherwise) as epoch seconds."""
    if value is None:
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since must be an ISO date such as 2026-01-31; got {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def cli_exposure(settings: Settings, args: Any) -> int:
    """``dataref exposure``: 0, or 1 with --check when a budget is spent, 2 on bad input."""
    import json
    import sys
    import time

    from .ledger import LEDGER_FILE, SQLiteLedger

    try:
        query = Query(owner=args.owner, source=args.source, since=parse_since(args.since))
    except ValueError as exc:
        print(f"dataref exposure: {exc}", file=sys.stderr)
        return 2
    directory = settings.state_dir / "ledger"
    if not (directory / LEDGER_FILE).is_file():
        print(f"dataref exposure: no ledger yet in {directory} (no tool call was answered)",
              file=sys.stderr)  # fmt: skip
        rows: list[dict[str, Any]] = []
        spent: list[dict[str, Any]] = []
    else:
        ledger = SQLiteLedger(directory, read_only=True)
        try:
            rows = report(ledger, query)
            spent = violations(settings, ledger, time.time()) if args.check else []
        finally:
            ledger.close()
    if args.json:
        out: dict[str, Any] = {"rows": rows}
        if args.check:
            out["budgets_spent"] = spent
        print(json.dumps(out, indent=2))
    else:
        print_table(rows)
        for v in spent:
            print(f"BUDGET SPENT: source {v['source']!r}, owner {v['owner']!r}: "
                  f"{v['spent']:,} of {v['budget']:,} bytes today (UTC)")  # fmt: skip
    return 1 if spent else 0


def print_table(rows: list[dict[str, Any]]) -> None:
    cells = [[title for _, title in COLUMNS]]
    cells += [
        [f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k, _ in COLUMNS] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    for row in cells:
        print(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if not rows:
        print("(no replies recorded for this filter)")
