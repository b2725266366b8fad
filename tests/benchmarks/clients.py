"""Starting the three servers and calling them through a real MCP client.

Every tool result is measured the same way: wall time around ``call_tool`` and the bytes a
model would read. Those bytes are the compact JSON of the structured result when there is
one, else the text blocks; images are counted apart (a chart is for the person, and hosts
handle images differently).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from .data import CACHE_ENV, REPO_ROOT
from .memory import PeakSampler, children_matching

VENV_BIN = REPO_ROOT / ".venv" / "bin"
PLUGIN = "tests.benchmarks.bench_producers"
GiB = 1024**3
CALL_TIMEOUT_S = 900
# Tools the servers carry only for the benchmark: not part of any tools/list size.
BENCH_ONLY_TOOLS = frozenset({"fetch_big", "fetch_wide"})


@dataclass
class CallRecord:
    tool: str
    seconds: float
    bytes: int
    image_bytes: int
    ok: bool
    data: Any = None
    error: str = ""


def measure_result(result: Any) -> tuple[int, int, Any]:
    """(model-visible bytes, image bytes, parsed data) of a CallToolResult."""
    images = sum(len(b.data) for b in result.content if getattr(b, "type", "") == "image")
    texts = [b.text for b in result.content if getattr(b, "type", "") == "text"]
    if result.structured_content is not None:
        data = result.structured_content
        return _json_size(data), images, data
    data = None
    for text in texts:
        try:
            data = json.loads(text)
        except ValueError:
            continue
    return sum(len(t.encode()) for t in texts), images, data


@dataclass
class Meter:
    """A connected client that records every call it makes."""

    client: Client
    calls: list[CallRecord] = field(default_factory=list)

    async def call(self, tool: str, args: dict[str, Any] | None = None) -> CallRecord:
        started = time.perf_counter()
        result = await self.client.call_tool(
            tool, args or {}, raise_on_error=False, timeout=CALL_TIMEOUT_S
        )
        seconds = time.perf_counter() - started
        size, images, data = measure_result(result)
        ok = not result.is_error and not (isinstance(data, dict) and data.get("ok") is False)
        error = "" if ok else str(data if data is not None else result.content)[:500]
        record = CallRecord(tool, seconds, size, images, ok, data, error)
        self.calls.append(record)
        return record

    async def tools_json_bytes(self) -> tuple[int, dict[str, int]]:
        """Size of the ``tools/list`` result as compact wire JSON, and of each tool in it
        (without the benchmark-only tools)."""
        tools = [t for t in await self.client.list_tools() if t.name not in BENCH_ONLY_TOOLS]
        dumped = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
        per_tool = {t["name"]: _json_size(t) for t in dumped}
        return _json_size({"tools": dumped}), per_tool


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@dataclass
class ServerSpec:
    name: str
    command: str
    args: list[str]
    env: dict[str, str]
    marker: str  # a command-line substring that finds the spawned process


def dataref_env(state_dir: Path, cache: Path, *, plugins: bool) -> dict[str, str]:
    """What the sanitized stdio child needs: state, owner, the cache, and room for 5M rows."""
    env = {
        "DATAREF_STATE_DIR": str(state_dir),
        "DATAREF_OWNER": "bench",
        CACHE_ENV: str(cache),
        "PYTHONPATH": str(REPO_ROOT),
        # A 5M-row sales table is ~330 MB of Arrow: above the 256 MiB default artifact cap.
        "DATAREF_STORE__ARTIFACT_MAX_BYTES": str(1 * GiB),
        "DATAREF_STORE__OWNER_QUOTA_BYTES": str(16 * GiB),
    }
    if plugins:
        env["DATAREF_PRODUCERS__PLUGINS"] = json.dumps([PLUGIN])
    return env


def dataref_spec(state_dir: Path, cache: Path, *, plugins: bool) -> ServerSpec:
    env = dataref_env(state_dir, cache, plugins=plugins)
    return ServerSpec("dataref", str(VENV_BIN / "dataref"), ["serve"], env, "dataref serve")


def comparator_spec(name: str, cache: Path) -> ServerSpec:
    module = {"seed": "tests.benchmarks.seed_server", "naive": "tests.benchmarks.naive_server"}
    env = {CACHE_ENV: str(cache), "PYTHONPATH": str(REPO_ROOT)}
    return ServerSpec(name, str(VENV_BIN / "python"), ["-m", module[name]], env, module[name])


@asynccontextmanager
async def stdio_server(spec: ServerSpec, log: Path) -> AsyncIterator[tuple[Meter, PeakSampler]]:
    """Spawn ``spec`` over stdio, connect, and sample its memory until the block ends."""
    transport = StdioTransport(
        spec.command, spec.args, env=spec.env, cwd=str(REPO_ROOT), keep_alive=False, log_file=log
    )
    async with Client(transport, timeout=CALL_TIMEOUT_S, init_timeout=120) as client:
        pids = children_matching(os.getpid(), spec.marker)
        if len(pids) != 1:
            raise RuntimeError(f"expected one {spec.name} server process, found {pids}")
        sampler = PeakSampler(pids[0]).start()
        try:
            yield Meter(client), sampler
        finally:
            sampler.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@asynccontextmanager
async def http_dataref(config: Path, port: int, log: Path) -> AsyncIterator[PeakSampler]:
    """``dataref serve --http`` in a subprocess, ready to accept connections."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [
        str(VENV_BIN / "dataref"),
        "--config",
        str(config),
        "serve",
        "--http",
        "--port",
        str(port),
    ]
    with open(log, "ab") as err:
        proc = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=err, stderr=err)
    sampler = PeakSampler(proc.pid).start()
    try:
        await _wait_for_port(port, proc)
        yield sampler
    finally:
        sampler.stop()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dataref serve --http exited with {proc.returncode}")
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"dataref serve --http did not listen on {port} within {timeout}s")


def http_client(port: int, token: str) -> Client:
    return Client(f"http://127.0.0.1:{port}/mcp", auth=token, timeout=CALL_TIMEOUT_S)
