"""/metrics, JSON logs and audit events of a real `dataref serve --http`."""

from __future__ import annotations

import json
import subprocess

import httpx2
from fastmcp import Client
from prometheus_client.parser import text_string_to_metric_families

from dataref.ledger import SQLiteLedger

from .conftest import DATAREF, HttpServer, child_env

SCRAPE = "scrape-secret-1"
NEVER_ISSUED = "data_AAAAAAAAAAAAAAAAAAAAAA"


def scrape(url: str) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """The text, and {(sample name, labels): value} parsed by prometheus_client's parser."""
    response = httpx2.get(f"{url}/metrics", headers={"Authorization": f"Bearer {SCRAPE}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    values = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return response.text, values


def value(values: dict, name: str, **labels: str) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_parse_and_move_and_logs_and_audit_events_are_written(tmp_path):
    state = tmp_path / "state"
    server = HttpServer(state, {"tok-ann": "ann"}, DATAREF_METRICS__TOKEN=SCRAPE)
    try:
        url = server.url
        _, before = scrape(url)
        async with Client(f"{url}/mcp", auth="tok-ann") as client:
            fetched = await client.call_tool_mcp("fetch_sales", {"since": "2025-11-01"})
            ref = fetched.structured_content["dataRef"]
            await client.call_tool_mcp("describe_data", {"dataRef": ref})
            await client.call_tool_mcp("describe_data", {"dataRef": NEVER_ISSUED})
        for headers in ({}, {"Authorization": "Bearer tok-ann"}):  # an MCP token is not enough
            assert httpx2.get(f"{url}/metrics", headers=headers).status_code == 401
        bad = httpx2.post(
            f"{url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Authorization": "Bearer forged", "Accept": "application/json"},
        )
        assert bad.status_code == 401
        text, after = scrape(url)
        # the report reads the ledger beside the live server
        report = subprocess.run(
            [DATAREF, "exposure", "--json", "--source", "demo"],
            env=child_env(state), capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows = json.loads(report.stdout)["rows"]
        assert [(r["owner"], r["calls"]) for r in rows] == [("ann", 2)]  # fetch, describe
        assert rows[0]["bytes"] == value(after, "dataref_ledger_reply_bytes_total", source="demo")
    finally:
        server.stop()
    assert value(after, "dataref_tool_calls_total", tool="fetch_sales") == 1 + value(
        before, "dataref_tool_calls_total", tool="fetch_sales"
    )
    assert value(after, "dataref_tool_calls_total", tool="describe_data") == 2
    assert value(after, "dataref_tool_errors_total", tool="describe_data") == 1
    assert value(after, "dataref_tool_latency_seconds_count", tool="describe_data") == 2
    assert value(after, "dataref_tool_reply_bytes_total", tool="fetch_sales") > 500
    assert value(after, "dataref_ledger_reply_bytes_total", source="demo") > 500
    assert value(after, "dataref_store_bytes") > 0
    assert ("dataref_kernels", (("state", "assigned"),)) in after
    assert (
        value(after, "dataref_auth_failures_total", reason="invalid_token") == 2
    )  # /metrics, /mcp
    assert value(after, "dataref_auth_failures_total", reason="missing_token") >= 1
    assert "ann" not in text  # no owner in any label

    lines = [json.loads(line) for line in server.stderr_text().splitlines() if line]
    calls = [line for line in lines if line["event"] == "tool_call"]
    assert [c["tool"] for c in calls] == ["fetch_sales", "describe_data", "describe_data"]
    assert len({c["request_id"] for c in calls}) == 3
    assert all(c["owner"] == "ann" and c["bytes"] > 0 for c in calls)
    failures = [line for line in lines if line["event"] == "auth_failure"]
    assert {f["reason"] for f in failures} >= {"invalid_token", "missing_token"}
    assert all(f["level"] == "warning" and f["audit"] for f in failures)
    ledger = SQLiteLedger(state / "ledger", read_only=True)
    try:
        audited = [e for e in ledger.audit_events() if e["event"] == "auth_failure"]
    finally:
        ledger.close()
    assert {(e["path"], e["reason"]) for e in audited} >= {
        ("/mcp", "invalid_token"),
        ("/metrics", "missing_token"),
        ("/metrics", "invalid_token"),
    }
    assert "forged" not in json.dumps(audited)  # a presented token is never recorded


def test_metrics_are_off_without_a_metrics_token(tmp_path):
    server = HttpServer(tmp_path / "state", {"tok-ann": "ann"})
    try:
        response = httpx2.get(f"{server.url}/metrics", headers={"Authorization": "Bearer tok-ann"})
    finally:
        server.stop()
    assert response.status_code == 404 and "[metrics] token" in response.text
