"""Property-based fuzzing of every tool through a real MCP client.

Tools are discovered with ``list_tools``, so a tool added later is fuzzed without touching
this file. Each example is one call with arguments drawn from ``tests/hostile.py``. The
properties, for every call:

- it ends in a result or a tool error, never an exception in the client (the server is alive);
- a tool error has a message, and it is not the masked internal error (an unexpected
  exception is a bug: the agent gets no way to recover);
- no text leaks a traceback, a source location or a server path;
- another owner's data never appears, and a call naming another owner's ref or notebook
  fails exactly like one naming a ref that was never issued;
- the server keeps serving: ``list_artifacts`` works every tenth call and at the end.

Where the cases come from (about 3,000 per run; the counts go to test-output/fuzz.json):
random calls on an in-memory server without kernels (fast); every fixed hostile value of
``tests/hostile.py`` tried once on every parameter of every tool (the corpus, so a listed
value is never left to chance); random calls over real HTTP with bearer tokens, and malformed
JSON-RPC bodies; resource URIs; and a few ``run_python`` calls with kernels, where ``inputs``,
``notebook`` and ``timeout_s`` are hostile and the code is not (the sandbox has its own tests).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pandas as pd
import pytest
from fastmcp.exceptions import McpError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.types import CallToolResult

from dataref.app import create_app
from dataref.config import Settings
from dataref.store import ArtifactStore
from dataref.transcript import Transcripts

from .conftest import HttpServer, make_settings
from .hostile import SAFE_TEXT, Pools, arguments_for, corpus, hostile_text, leaks
from .kernel_support import require_bwrap
from .loop_client import LoopClient, error_text

OWNER = "fuzzer"
FOREIGN_OWNER = "mallory"
SECRET = "MALLORY-SECRET-7f3a9c"  # a value only the other owner's artifact holds
TOOL_EXAMPLES = 1200
HTTP_EXAMPLES = 200
RESOURCE_EXAMPLES = 300
KERNEL_EXAMPLES = 40
MASKED = re.compile(r"Error calling tool '[^']*'\.?")
VALIDATION = re.compile(r"\d+ validation errors? for call\[")  # refused before any ref is read
RESULTS = Path(__file__).resolve().parents[1] / "test-output" / "fuzz.json"

FUZZ = settings(
    deadline=None,
    derandomize=False,
    database=None,
    print_blob=True,  # a failure prints the @reproduce_failure line that replays it
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Target:
    client: LoopClient
    settings: Settings
    pools: Pools
    tools: dict[str, dict[str, Any]]
    calls: Counter[str] = field(default_factory=Counter)
    url: str = ""  # the /mcp endpoint when served over HTTP


def seed_foreign_owner(settings: Settings) -> tuple[list[str], list[str]]:
    """Another owner's table, chart and notebook, written where the server will find them."""
    store = ArtifactStore(settings.state_dir / "store", settings.store)
    transcripts = Transcripts(settings.state_dir / "notebooks")
    try:
        frame = pd.DataFrame({"secret": [SECRET] * 3, "units": [1, 2, 3]})
        table = store.put_frame(FOREIGN_OWNER, frame, lineage={"tool": "fetch_sql"})
        chart = store.put_bytes(
            FOREIGN_OWNER,
            b"\x89PNG\r\n\x1a\n" + SECRET.encode(),
            kind="chart",
            media_type="image/png",
            suffix=".png",
            lineage={"tool": "render_chart"},
        )
        notebook = transcripts.default(FOREIGN_OWNER)
        own_notebook = transcripts.default(OWNER)
    finally:
        store.close()
        transcripts.close()
    return [table.ref, chart.ref], [notebook, own_notebook]


def start_target(
    state_dir: Path,
    *,
    with_kernels: bool = False,
    connect: Callable[[Settings], LoopClient] | None = None,
    **overrides: Any,
) -> Target:
    """Seed another owner's objects, connect (in memory unless ``connect``), fetch one table."""
    settings = make_settings(state_dir, owner=OWNER, **overrides)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    foreign_refs, (foreign_nb, own_nb) = seed_foreign_owner(settings)
    if connect is None:
        client = LoopClient(create_app(settings, "memory", kernels=with_kernels))
    else:
        client = connect(settings)
    tools = {t.name: t.input_schema for t in client.list_tools()}
    fetched = client.call("fetch_sales", {"since": "2025-12-30"})
    assert not fetched.is_error, error_text(fetched)
    pools = Pools(
        own_refs=[fetched.structured_content["dataRef"]],
        foreign_refs=foreign_refs,
        own_notebooks=[own_nb],
        foreign_notebooks=[foreign_nb],
    )
    return Target(client, settings, pools, tools)


@pytest.fixture(scope="module", autouse=True)
def quiet_server_logs() -> Iterator[None]:
    """FastMCP logs every tool and resource error with a rendered traceback (~90 ms each)."""
    logger = logging.getLogger("fastmcp")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.fixture(scope="module")
def ram_dir(tmp_path_factory) -> Iterator[Path]:
    """State in RAM where possible: durability is the fault tests' subject, fsyncs cost time."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path_factory.mktemp("fuzz")
        return
    base = Path(tempfile.mkdtemp(prefix="dataref-fuzz-", dir=shm))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def target(ram_dir: Path, request: pytest.FixtureRequest) -> Iterator[Target]:
    """A fresh server per test: a transcript thousands of cells long would slow every call."""
    t = start_target(ram_dir / request.node.name / "state")
    yield t
    t.client.close()


# -- the properties ---------------------------------------------------------------------


def all_text(result: CallToolResult) -> str:
    structured = json.dumps(result.structured_content or {}, default=str)
    return error_text(result) + "\n" + structured


def names_foreign(arguments: Any, foreign: set[str], key: str = "") -> bool:
    """Whether a ref-like argument (dataRef, notebook, an input) names a foreign object."""
    if isinstance(arguments, dict):
        return any(
            names_foreign(v, foreign, k if key != "inputs" else "inputs")
            for k, v in arguments.items()
        )
    if isinstance(arguments, str):
        lowered = key.lower()
        return arguments in foreign and ("ref" in lowered or lowered in ("notebook", "inputs"))
    return False


def replace_foreign(arguments: Any, foreign: set[str]) -> Any:
    """The same arguments with each foreign ref replaced by a never-issued one of equal length."""
    if isinstance(arguments, dict):
        return {k: replace_foreign(v, foreign) for k, v in arguments.items()}
    if isinstance(arguments, list):
        return [replace_foreign(v, foreign) for v in arguments]
    if isinstance(arguments, str) and arguments in foreign:
        prefix, _, rest = arguments.partition("_")
        return f"{prefix}_{'A' * len(rest)}"
    return arguments


def normalise(text: str, foreign: set[str]) -> str:
    """Refs (whole, or cut short inside an echoed argument) replaced by one placeholder."""
    for value in foreign:
        text = text.replace(value, "REF")
    return re.sub(r"[A-Za-z0-9_-]{12,}", "REF", text)


def check_call(t: Target, tool: str, arguments: dict[str, Any], timeout: float = 60) -> None:
    result = t.client.call(tool, arguments, timeout=timeout)  # an exception here fails the test
    t.calls[tool] += 1
    text = all_text(result)
    assert SECRET not in text, f"{tool} leaked another owner's data"
    if result.is_error:
        message = error_text(result).strip()
        assert message, f"{tool} failed without a message"
        assert not MASKED.fullmatch(message), (
            f"{tool}{arguments!r:.300} raised an internal error (masked) instead of a tool "
            "error that says how to recover"
        )
        found = leaks(message, [str(t.settings.state_dir)])
        assert not found, f"{tool} error leaks {found}: {message[:500]}"
    else:
        assert "Traceback (most recent call last)" not in text
        assert not names_foreign(arguments, t.pools.foreign), (
            f"{tool} accepted another owner's ref or notebook: {arguments!r:.300}"
        )
    validation = VALIDATION.match(error_text(result)) is not None
    if result.is_error and not validation and names_foreign(arguments, t.pools.foreign):
        twin = t.client.call(tool, replace_foreign(arguments, t.pools.foreign), timeout=timeout)
        assert twin.is_error
        mine = normalise(error_text(result), t.pools.foreign)
        never = normalise(error_text(twin), t.pools.foreign)
        assert mine == never, f"a foreign ref is distinguishable:\n{mine}\n---\n{never}"


def check_still_serving(t: Target) -> None:
    listing = t.client.call("list_artifacts", {})
    assert not listing.is_error, error_text(listing)
    refs = {a["ref"] for a in listing.structured_content["artifacts"]}
    assert not refs & set(t.pools.foreign_refs)


def record(name: str, count: int) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[name] = count
    RESULTS.write_text(json.dumps(data, indent=1))
    print(f"\n{name}: {count} fuzz cases")


# -- the tests --------------------------------------------------------------------------


def test_every_tool_survives_thousands_of_hostile_calls(target: Target) -> None:
    names = sorted(target.tools)
    noncompute = [n for n in names if n not in ("run_python",)]

    @settings(FUZZ, max_examples=TOOL_EXAMPLES)
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        # run_python is fuzzed here too: without kernels it still validates every argument.
        tool = data.draw(st.sampled_from(names), label="tool")
        arguments = data.draw(arguments_for(target.tools[tool], target.pools), label="args")
        check_call(target, tool, arguments)
        if sum(target.calls.values()) % 10 == 0:
            check_still_serving(target)

    prop()
    check_still_serving(target)
    total = sum(target.calls.values())
    record("tools_without_kernels", total)
    assert total >= TOOL_EXAMPLES
    missed = [n for n in noncompute if target.calls[n] < 20]
    assert not missed, f"tools barely fuzzed: {missed}"


def test_every_listed_hostile_value_is_tried_on_every_parameter_of_every_tool(
    target: Target,
) -> None:
    before = sum(target.calls.values())
    failures: list[str] = []
    for tool, schema in sorted(target.tools.items()):
        for arguments in corpus(schema, target.pools):
            try:
                check_call(target, tool, arguments)
            except AssertionError as exc:  # collected: one run names every broken case
                failures.append(str(exc).splitlines()[0][:400])
        check_still_serving(target)
    record("corpus", sum(target.calls.values()) - before)
    assert not failures, f"{len(failures)} failing calls:\n" + "\n".join(failures)


def test_resource_templates_survive_hostile_uris(target: Target) -> None:
    templates = target.client.run(target.client._client.list_resource_templates())
    assert templates, "the server lists no resource templates (artifacts, charts, notebooks)"
    uris = [t.uri_template for t in templates]
    count = 0

    @settings(FUZZ, max_examples=RESOURCE_EXAMPLES)
    @given(st.sampled_from(uris), hostile_text(target.pools) | SAFE_TEXT)
    def prop(template: str, value: str) -> None:
        nonlocal count
        filler = value.replace("%", "%25")
        uri = re.sub(r"\{[^}]*\}", lambda _: filler, template)
        count += 1
        try:
            contents = target.client.run(target.client._client.read_resource(uri))
        except McpError as exc:
            message = str(exc)
            assert not leaks(message, [str(target.settings.state_dir)]), message
            assert "Error reading resource" not in message or "'" in message
            return
        except Exception as exc:  # the client refused the URI itself: not the server's concern
            if "Invalid" in type(exc).__name__ or isinstance(exc, ValueError):
                return
            raise
        text = json.dumps([c.model_dump(mode="json") for c in contents], default=str)
        assert SECRET not in text and "Traceback" not in text
        assert not any(ref in uri for ref in target.pools.foreign_refs), uri
        check_still_serving(target)

    prop()
    record("resources", count)


# -- the same over real HTTP, with bearer tokens: the owners are the tokens' subjects --------


@pytest.fixture(scope="module")
def http_target(ram_dir: Path) -> Iterator[Target]:
    servers: list[HttpServer] = []

    def connect(settings: Settings) -> LoopClient:
        tokens = {"tok-fuzzer": OWNER, "tok-mallory": FOREIGN_OWNER}
        servers.append(HttpServer(settings.state_dir, tokens))
        return LoopClient(f"{servers[0].url}/mcp", auth="tok-fuzzer")

    t = start_target(ram_dir / "http" / "state", connect=connect)
    t.url = f"{servers[0].url}/mcp"
    yield t
    t.client.close()
    servers[0].stop()


def test_every_tool_survives_hostile_calls_over_http(http_target: Target) -> None:
    names = sorted(http_target.tools)

    @settings(FUZZ, max_examples=HTTP_EXAMPLES)
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        tool = data.draw(st.sampled_from(names), label="tool")
        arguments = data.draw(arguments_for(http_target.tools[tool], http_target.pools))
        check_call(http_target, tool, arguments)

    prop()
    check_still_serving(http_target)
    record("tools_over_http", sum(http_target.calls.values()))


def test_malformed_and_deeply_nested_json_get_protocol_errors_and_the_server_keeps_serving(
    http_target: Target,
) -> None:
    url = http_target.url
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "authorization": "Bearer tok-fuzzer",
        "mcp-protocol-version": "2025-11-25",
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    opened = httpx2.post(url, json=init, headers=headers, timeout=30)
    assert opened.status_code == 200
    if "mcp-session-id" in opened.headers:
        headers["mcp-session-id"] = opened.headers["mcp-session-id"]
    call = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
    bodies = [
        call % ("describe_data", '{"dataRef":' + "[" * 100_000 + "]" * 100_000 + "}"),
        call % ("describe_data", r'{"dataRef":"\ud800"}'),  # a lone surrogate
        call % ("fetch_sql", r'{"query":"SELECT 1 AS \"\u0000\""}'),
        call % ("list_artifacts", '{"x":' + "1" * 100_000 + "}"),
        "{",
        "[]",
        '{"jsonrpc":"2.0","id":8,"method":"tools/call"}',
        '{"jsonrpc":"2.0","id":9,"method":"no/such/method","params":{}}',
        "A" * 5_000_000,
    ]
    for body in [b.encode() for b in bodies] + [b"\xff\xfe\x00", b""]:
        response = httpx2.post(url, content=body, headers=headers, timeout=60)
        assert response.status_code < 500, (body[:80], response.status_code)
        assert not leaks(response.text, [str(http_target.settings.state_dir)]), response.text
        assert SECRET not in response.text
    check_still_serving(http_target)


# -- run_python with kernels: hostile inputs and timeouts, harmless code -------------------


@pytest.fixture(scope="module")
def kernel_target(tmp_path_factory) -> Iterator[Target]:
    require_bwrap()
    t = start_target(
        tmp_path_factory.mktemp("fuzzk") / "state",
        with_kernels=True,
        compute={"max_timeout_seconds": 5},
        kernels={"warm_spares": 0, "max_per_owner": 2},
    )
    yield t
    t.client.close()


CODE = st.sampled_from(
    [
        "result = 1",
        "result = sorted(k for k in globals() if not k.startswith('_'))[:5]",
        "result = {n: len(v) for n, v in globals().items() if hasattr(v, 'shape')}",
        "result = None",
    ]
)


def test_run_python_survives_hostile_inputs_and_timeouts(kernel_target: Target) -> None:
    t = kernel_target
    schema = t.tools["run_python"]
    # Hostile inputs, notebook and timeout_s, all optional; the code itself is harmless.
    hostile = {k: v for k, v in schema["properties"].items() if k != "code"}
    hostile_args = arguments_for({"properties": hostile}, t.pools)

    @settings(FUZZ, max_examples=KERNEL_EXAMPLES)
    @given(CODE, hostile_args)
    def prop(code: str, arguments: dict[str, Any]) -> None:
        check_call(t, "run_python", {"code": code, **arguments}, timeout=120)
        check_still_serving(t)

    prop()
    # and the kernel still computes afterwards
    ok = t.client.call(
        "run_python",
        {"code": "result = int(s.units.sum())", "inputs": {"s": t.pools.own_refs[0]}},
        timeout=120,
    )
    assert not ok.is_error and ok.structured_content["ok"], error_text(ok)
    assert ok.structured_content["result"] > 0
    record("run_python_with_kernels", t.calls["run_python"])
