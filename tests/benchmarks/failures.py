"""Workloads that failed in a run: the report lists them, ``make bench`` exits non-zero."""

from __future__ import annotations

from typing import Any


def errors(results: dict[str, Any]) -> list[str]:
    """Every workload that failed, as 'where: what'."""
    found = [
        f"{name} @ {scale}: {part['error']}"
        for name, scales in results.get("servers", {}).items()
        for scale, part in scales.items()
        if "error" in part
    ]
    if (results.get("multi_owner") or {}).get("error"):
        found.append(f"8 owners over HTTP: {results['multi_owner']['error']}")
    if (results.get("sql_sources") or {}).get("error"):
        found.append(f"SQL sources: {results['sql_sources']['error']}")
    if (results.get("profile") or {}).get("error"):
        found.append(f"profile of warm calls: {results['profile']['error']}")
    return found
