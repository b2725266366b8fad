"""Prometheus metrics of one server (prometheus_client, a registry of its own).

Counted at the edge, as each reply leaves: calls, errors and latency per tool, refusals and
authentication failures by kind. Read at scrape time: kernels (assigned, starting, spare),
bytes of live artifacts in the store, and bytes of replies per source from the ledger.

Labels are tool names, source names (operator configuration) and fixed kinds: never an
owner, a ref or a value, so a scrape reveals no user's activity by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "dataref_tool_calls", "Tool calls answered.", ["tool"], registry=self.registry
        )
        self.errors = Counter(
            "dataref_tool_errors", "Tool calls answered with an error.", ["tool"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "dataref_tool_latency_seconds", "Time from call to reply.", ["tool"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.reply_bytes = Counter(
            "dataref_tool_reply_bytes", "Bytes of tool replies sent to clients.", ["tool"],
            registry=self.registry,
        )  # fmt: skip
        self.refusals = Counter(
            "dataref_refusals", "Calls refused: by owner or grant (access) or budget.", ["kind"],
            registry=self.registry,
        )  # fmt: skip
        self.auth_failures = Counter(
            "dataref_auth_failures", "HTTP requests refused for a missing or bad token.",
            ["reason"], registry=self.registry,
        )  # fmt: skip

    def observe(self, tool: str, *, ok: bool, seconds: float, size: int) -> None:
        self.calls.labels(tool).inc()
        if not ok:
            self.errors.labels(tool).inc()
        self.latency.labels(tool).observe(seconds)
        self.reply_bytes.labels(tool).inc(size)

    def watch(self, workspace: Callable[[], Any]) -> None:
        """Scrape-time gauges of the workspace (None while the server starts or stops)."""
        self.registry.register(WorkspaceCollector(workspace))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WorkspaceCollector(Collector):
    def __init__(self, workspace: Callable[[], Any]) -> None:
        self.workspace = workspace

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time only

    def collect(self) -> Iterator[Metric]:
        ws = self.workspace()
        if ws is None:
            return
        kernels = GaugeMetricFamily("dataref_kernels", "Kernels by state.", labels=["state"])
        counts = ws.pool.counts() if ws.pool is not None else {}
        for state in ("assigned", "starting", "spare"):
            kernels.add_metric([state], counts.get(state, 0))
        yield kernels
        store = GaugeMetricFamily("dataref_store_bytes", "Bytes of live artifacts and charts.")
        store.add_metric([], ws.store.total_bytes())
        yield store
        ledger = CounterMetricFamily(
            "dataref_ledger_reply_bytes",
            "Bytes of tool replies counted against each source (exposure ledger, all time).",
            labels=["source"],
        )
        for source, size in sorted(ws.ledger.bytes_by_source().items()):
            ledger.add_metric([source], size)
        yield ledger
