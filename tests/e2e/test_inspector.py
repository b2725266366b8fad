"""The MCP Inspector CLI (2.12.0) lists and calls every tool, over stdio and over HTTP.

Tools come from the Inspector's own tools/list, so a tool added later is called too: tools
of the contract with arguments that must succeed, any other one with arguments made from its
schema (it may answer with a tool error, never crash).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ..conftest import DATAREF, HttpServer
from .conftest import OWNER, TOKEN
from .node import Run, inspector

REF = "<ref>"
CONTRACT: dict[str, dict[str, Any]] = {
    "fetch_sales": {"since": "2025-12-01"},
    "fetch_sql": {"query": "SELECT region, sum(revenue) AS revenue FROM sales GROUP BY region"},
    "run_python": {"code": "result = int(s.units.sum())", "inputs": {"s": REF}},
    "describe_data": {"dataRef": REF},
    "render_chart": {"dataRef": REF, "x": "region", "y": "revenue", "kind": "bar"},
    "export_data": {"dataRef": REF, "format": "parquet"},
    "export_csv": {"dataRef": REF},
    "list_artifacts": {},
    "export_notebook": {},
    "reset_kernel": {},
    "drop_artifact": {"dataRef": REF},
}
OK, TOOL_ERROR, AUTH_REQUIRED = 0, 5, 3  # the Inspector CLI's exit codes


def arguments_for(tool: dict[str, Any], ref: str) -> dict[str, Any]:
    """The contract's arguments, or the required ones of an unknown tool's schema."""
    if tool["name"] in CONTRACT:
        args = CONTRACT[tool["name"]]
    else:
        schema = tool.get("inputSchema", {})
        props = schema.get("properties", {})
        args = {n: REF if "ref" in n.lower() else "x" for n in schema.get("required", [])}
        args = {n: v for n, v in args.items() if props.get(n, {}).get("type") in ("string", None)}
    return _fill(args, ref)


def _fill(value: Any, ref: str) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, ref) for k, v in value.items()}
    return ref if value == REF else value


def check(tool: str, run: Run) -> None:
    """A contract tool must succeed; any other may fail as a tool error, never otherwise."""
    detail = f"{tool}: exit {run.code}\n{run.stdout[-1500:]}\n{run.stderr[-1500:]}"
    if tool not in CONTRACT:
        assert run.code in (OK, TOOL_ERROR), detail
        return
    assert run.code == OK, detail
    result = run.json()["result"]
    assert result.get("isError") is False, detail
    structured = result.get("structuredContent") or {}
    if tool.startswith("fetch_"):
        assert structured["dataRef"].startswith("data_") and structured["rows"] > 0
    if tool == "run_python":
        assert structured["ok"] is True and structured["result"] > 0, detail
    if tool == "render_chart":
        assert any(block["type"] == "image" for block in result["content"]), detail
    if tool == "drop_artifact":
        assert structured["freed_bytes"] > 0, detail
    if tool == "describe_data":
        assert "revenue" in structured["columns"]


def list_tools(target: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    listed = inspector([*target, "--method", "tools/list"], env)
    assert listed.code == OK, listed.stderr[-2000:]
    tools = listed.json()["result"]["tools"]
    assert set(CONTRACT) - {"export_csv"} <= {t["name"] for t in tools}
    for tool in tools:
        assert tool["description"] and tool["inputSchema"]["type"] == "object"
    return tools


def call_all(
    target: list[str], env: dict[str, str], tools: list[dict[str, Any]], workers: int
) -> list[str]:
    """fetch_sales first (its ref is the others' input), then every tool; returns the names."""
    first = inspector(
        [
            *target,
            "--method",
            "tools/call",
            "--tool-name",
            "fetch_sales",
            "--tool-args-json",
            '{"since": "2025-12-01"}',
        ],
        env,
    )
    check("fetch_sales", first)
    ref = first.json()["result"]["structuredContent"]["dataRef"]

    def one(tool: dict[str, Any]) -> str:
        import json

        args = json.dumps(arguments_for(tool, ref))
        run = inspector(
            [
                *target,
                "--method",
                "tools/call",
                "--tool-name",
                tool["name"],
                "--tool-args-json",
                args,
            ],
            env,
        )
        check(tool["name"], run)
        return tool["name"]

    # Last, one at a time: run with the others, reset_kernel would stop run_python's kernel
    # mid-call and drop_artifact would delete the ref the others read.
    last = ("reset_kernel", "drop_artifact")
    parallel = [t for t in tools if t["name"] not in ("fetch_sales", *last)]
    with ThreadPoolExecutor(workers) as pool:
        called = ["fetch_sales", *pool.map(one, parallel)]
    return called + [one(t) for name in last for t in tools if t["name"] == name]


# -- stdio: the Inspector launches `dataref serve` itself ---------------------------------


def stdio_target(state_dir: Path) -> list[str]:
    env = {
        "DATAREF_STATE_DIR": str(state_dir),
        "DATAREF_OWNER": OWNER,
        "DATAREF_KERNELS__WARM_SPARES": "0",
    }
    return [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")] + [DATAREF, "serve"]


def test_the_inspector_lists_and_calls_every_tool_over_stdio(node_env, tmp_path) -> None:
    target = stdio_target(tmp_path / "state")
    tools = list_tools(target, node_env)
    called = call_all(target, node_env, tools, workers=2)
    assert sorted(called) == sorted(t["name"] for t in tools)
    print(f"\nstdio: listed and called {len(called)} tools: {', '.join(sorted(called))}")


# -- HTTP with a bearer token, in both protocol eras ------------------------------------


@pytest.mark.parametrize("era", ["legacy", "modern"])  # 2025-11-25 handshake, 2026-07-28
def test_the_inspector_lists_and_calls_every_tool_over_http_with_a_bearer_token(
    node_env, http_server: HttpServer, era: str
) -> None:
    target = [
        "--protocol-era",
        era,
        f"{http_server.url}/mcp",
        "--header",
        f"Authorization: Bearer {TOKEN}",
    ]
    tools = list_tools(target, node_env)
    called = call_all(target, node_env, tools, workers=4)
    assert sorted(called) == sorted(t["name"] for t in tools)
    print(f"\nhttp ({era}): listed and called {len(called)} tools")


def test_the_inspector_is_refused_without_a_token_and_with_a_bad_one(
    node_env, http_server: HttpServer
) -> None:
    url = f"{http_server.url}/mcp"
    none = inspector(["--stored-auth-only", url, "--method", "tools/list"], node_env)
    bad = inspector(
        [url, "--header", "Authorization: Bearer nope", "--method", "tools/list"], node_env
    )
    assert none.code == AUTH_REQUIRED, none.stderr[-1000:]
    assert bad.code == AUTH_REQUIRED, bad.stderr[-1000:]
    assert "fetch_sales" not in none.stdout + bad.stdout
