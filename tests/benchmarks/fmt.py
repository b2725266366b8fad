"""Formatting and reading helpers shared by the table, the targets and the report."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

KB = 1024
MB = KB * KB


def median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def p95(values: list[float] | None) -> float | None:
    """Nearest-rank 95th percentile (the maximum when there are fewer than 20 values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, -(-95 * len(ordered) // 100)) - 1]  # ceil(0.95 n)


def ms(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "–"
    return f"{seconds * 1000:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"


def size(n: float | None) -> str:
    if n is None:
        return "–"
    if n < 10 * KB:
        return f"{n:,.0f} B"
    return f"{n / KB:,.1f} KB" if n < MB else f"{n / MB:,.1f} MB"


def mib(n: float | None) -> str:
    return "–" if not n else f"{n:,.0f} MiB"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or not positive (a ratio would mislead)."""
    if a is None or b is None or not a > 0 or not b > 0:
        return None
    return a / b


def times(r: float | None) -> str:
    if r is None:
        return "–"
    return f"{r:,.1f}×" if r < 100 else f"{r:,.0f}×"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def stat_cells(values: list[float] | None) -> list[str]:
    """[median, p95] of a list of seconds."""
    return [ms(median(values)), ms(p95(values))]


@dataclass
class View:
    """Read-only access to a results dict; a missing part reads as None."""

    r: dict[str, Any]

    def get(self, *path: str) -> Any:
        node: Any = self.r
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def srv(self, name: str, scale: str, *path: str) -> Any:
        return self.get("servers", name, scale, *path)

    @property
    def scales(self) -> list[str]:
        return self.get("scales") or []
