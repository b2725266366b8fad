"""Faults from outside: SIGKILL mid-write, a full disk, the TTL sweep under load, a killed kernel.

Each test injects the fault into a real server and then checks what a user would rely on:
every reply the client got stays true after a restart, nothing half-written is visible,
errors say what happened, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastmcp import Client

from dataref.app import create_app

from .conftest import make_settings
from .faults import notebook_problems, notebook_text, store_problems
from .raw_stdio import RawStdioServer

KILL_ROUNDS = 4
IN_FLIGHT = 4  # requests kept outstanding while the server is killed
EXPIRED = "unknown or expired"
FULL = "disk is full"


# -- SIGKILL during artifact and notebook writes ----------------------------------------


def workload(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """Calls that write artifacts and notebook cells (and now and then a whole notebook)."""
    pick = rng.random()
    if pick < 0.5:
        month = rng.randint(9, 12)
        query = f"SELECT * FROM sales WHERE date >= '2025-{month:02d}-{rng.randint(1, 28):02d}'"
        return "fetch_sql", {"query": query}
    if pick < 0.75:
        return "fetch_sales", {"since": f"2025-12-{rng.randint(1, 28):02d}"}
    if pick < 0.9:
        return "fetch_sql", {
            "query": "SELECT region, count(*) AS n FROM sales GROUP BY region",
            "notebook": "new",
        }
    return "reset_kernel", {}  # a notebook-only write


def harvest(server: RawStdioServer, pending: dict[int, str], acked: dict[str, int]) -> None:
    """Move answered requests out of ``pending``; remember every ref a reply carried."""
    for msg_id in list(pending):
        reply = server.reply(msg_id)
        if reply is None:
            continue
        del pending[msg_id]
        result = reply.get("result", {})
        assert not result.get("isError"), result
        content = result.get("structuredContent") or {}
        if "dataRef" in content:
            acked[content["dataRef"]] = content["rows"]


def verify_committed(server: RawStdioServer, acked: dict[str, int]) -> None:
    ids = {ref: server.send_call("describe_data", {"dataRef": ref}) for ref in acked}
    for ref, msg_id in ids.items():
        result = server.wait(msg_id)["result"]
        assert not result.get("isError"), f"{ref} was acknowledged, then lost: {result}"
        stats = result["structuredContent"]
        assert stats["dataRef"] == ref


def test_sigkill_during_writes_loses_nothing_acknowledged_and_leaves_nothing_half_written(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    rng = random.Random()
    acked: dict[str, int] = {}
    interrupted = 0
    for _ in range(KILL_ROUNDS):
        server = RawStdioServer(state)
        try:
            # The restart cleaned up after the last kill, and kept everything acknowledged.
            assert store_problems(state) == []
            assert notebook_problems(state) == []
            verify_committed(server, acked)
            text = notebook_text(state)
            assert all(ref in text for ref in acked), "an acknowledged call lost its cell"
            pending: dict[int, str] = {}
            # The kill lands a random moment after this round's first reply, so a slow start
            # on a loaded machine never kills a server that has not answered anything yet.
            kill_at, known = None, len(acked)
            give_up = time.monotonic() + 120
            while kill_at is None or time.monotonic() < kill_at:
                while len(pending) < IN_FLIGHT:
                    tool, arguments = workload(rng)
                    pending[server.send_call(tool, arguments)] = tool
                harvest(server, pending, acked)
                if kill_at is None and len(acked) > known:
                    kill_at = time.monotonic() + rng.uniform(0.1, 0.8)
                assert time.monotonic() < give_up, "the server answered nothing in 2 minutes"
                time.sleep(0.002)
        finally:
            server.kill()
        harvest(server, pending, acked)  # replies written before the kill count as acknowledged
        interrupted += bool(pending)
    server = RawStdioServer(state)
    try:
        assert store_problems(state) == []
        assert notebook_problems(state) == []
        verify_committed(server, acked)
        assert all(ref in notebook_text(state) for ref in acked)
        assert server.call("list_artifacts", {})["structuredContent"]["artifacts"]
    finally:
        server.stop()
    print(f"\n{KILL_ROUNDS} SIGKILLs ({interrupted} with calls in flight), {len(acked)} refs kept")
    assert interrupted >= KILL_ROUNDS - 1, "the kills should land while calls are running"
    assert len(acked) >= KILL_ROUNDS


def test_leftovers_of_writes_a_crash_interrupted_are_gone_after_the_restart(
    tmp_path: Path,
) -> None:
    """What a SIGKILL mid-write leaves, planted where each write would leave it (the random
    kills above land inside a write only now and then)."""
    state = tmp_path / "state"
    server = RawStdioServer(state)
    try:
        ref = server.call("fetch_sales", {"since": "2025-12-20"})["structuredContent"]["dataRef"]
    finally:
        server.stop()
    notebook = next((state / "notebooks").glob("nb_*.ipynb"))
    planted = [
        state / "store" / "tmp" / "data_interrupted.part",  # an artifact being written
        state / "store" / "blobs" / "data_uncommitted.arrow",  # renamed, row not committed
        notebook.with_suffix(".0badc0de.part"),  # a notebook being rewritten
    ]
    for path in planted:
        path.write_bytes(b"half")
    server = RawStdioServer(state)
    try:
        assert not server.call("describe_data", {"dataRef": ref}).get("isError")
        assert [p.name for p in planted if p.exists()] == []
        assert store_problems(state) == [] and notebook_problems(state) == []
    finally:
        server.stop()


# -- a full disk ------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: the state dir runs out of space after a few artifacts."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs and needs root: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def random_source(path: Path, rows: int = 120_000) -> Path:
    """A SQLite source of incompressible rows, outside the small disk."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (i INTEGER, s TEXT, f REAL)")
    db.executemany(
        "INSERT INTO t VALUES (?, ?, ?)",
        ((i, os.urandom(12).hex(), random.random()) for i in range(rows)),
    )
    db.commit()
    db.close()
    return path


async def test_a_full_disk_gives_clear_errors_corrupts_nothing_and_recovers(
    tiny_disk: Path, tmp_path: Path
) -> None:
    state = tiny_disk / "state"
    settings = make_settings(
        state,
        owner="filler",
        demo={"enabled": False},
        sources={"rand": {"path": str(random_source(tmp_path / "rand.sqlite"))}},
    )
    query = {"query": "SELECT * FROM t LIMIT 10000"}  # about 0.5 MB as Arrow
    outcomes: Counter[str] = Counter()
    async with Client(create_app(settings, "memory", kernels=False)) as client:
        filler = tiny_disk / "filler.bin"
        filler.write_bytes(b"\0" * (5 << 20))  # what the operator frees later
        refs: list[str] = []
        error = ""
        for _ in range(20):
            result = await client.call_tool("fetch_sql", query, raise_on_error=False)
            if result.is_error:
                error = result.content[0].text
                break
            refs.append(result.structured_content["dataRef"])
        assert refs, "the disk was full before the first artifact"
        assert FULL in error, f"not a clear disk-full error: {error!r}"
        outcomes["fetch_sql"] += 1

        # Every writer says the same, nothing it half-wrote is visible, and reads still work.
        writers = [
            ("fetch_sql", query),
            ("export_data", {"dataRef": refs[0], "format": "csv"}),
            ("render_chart", {"dataRef": refs[0], "x": "i", "y": "f", "kind": "scatter"}),
            ("reset_kernel", {}),
            ("fetch_sql", {**query, "notebook": "new"}),
        ]
        for tool, arguments in writers:
            result = await client.call_tool(tool, arguments, raise_on_error=False)
            if result.is_error:
                text = result.content[0].text
                assert FULL in text, f"{tool} on a full disk: {text!r}"
                outcomes[tool] += 1
        for ref in refs:
            described = await client.call_tool("describe_data", {"dataRef": ref})
            assert described.structured_content["columns"]["i"]["count"] == 10000
        listing = await client.call_tool("list_artifacts", {})
        assert {a["ref"] for a in listing.structured_content["artifacts"]} >= set(refs)
        assert store_problems(state) == []
        assert notebook_problems(state) == []

        # The operator frees space: the same server writes again.
        filler.unlink()
        for tool, arguments in writers:
            result = await client.call_tool(tool, arguments, raise_on_error=False)
            assert not result.is_error, f"{tool} after space was freed: {result.content}"
    assert store_problems(state) == []
    assert notebook_problems(state) == []
    print(f"\nfull disk after {len(refs)} artifacts; clean errors: {dict(outcomes)}")


# -- the TTL sweep running during heavy use ---------------------------------------------


async def test_the_ttl_sweep_during_heavy_use_gives_only_results_or_the_expired_error(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path / "state", owner="busy", store={"ttl_seconds": 1, "sweep_interval_seconds": 1}
    )
    seen: Counter[str] = Counter()
    refs: list[str] = []
    stop = time.monotonic() + 6

    async def fetcher(client: Client) -> None:
        while time.monotonic() < stop:
            since = f"2025-12-{random.randint(20, 30):02d}"
            result = await client.call_tool("fetch_sales", {"since": since}, raise_on_error=False)
            # Even a fresh ref can expire between the commit and the Description.
            classify("fetch_sales", result)
            if not result.is_error:
                refs.append(result.structured_content["dataRef"])

    async def reader(client: Client, tool: str, extra: dict[str, Any]) -> None:
        while time.monotonic() < stop:
            if not refs:
                await asyncio.sleep(0.01)
                continue
            ref = random.choice(refs[-20:])
            result = await client.call_tool(tool, {"dataRef": ref, **extra}, raise_on_error=False)
            classify(tool, result)

    def classify(tool: str, result: Any) -> None:
        if not result.is_error:
            seen[f"{tool} ok"] += 1
            return
        text = result.content[0].text
        assert EXPIRED in text, f"{tool} during a sweep: {text!r}"
        seen[f"{tool} expired"] += 1

    async with Client(create_app(settings, "memory", kernels=False)) as client:
        await asyncio.gather(
            fetcher(client),
            fetcher(client),
            reader(client, "describe_data", {}),
            reader(client, "describe_data", {}),
            reader(client, "export_data", {"format": "parquet"}),
            reader(client, "render_chart", {"x": "region", "y": "revenue"}),
        )
        assert not (await client.call_tool("list_artifacts", {})).is_error
    print(f"\nTTL sweep race: {dict(seen)}")
    assert seen["describe_data ok"] > 0
    assert sum(v for k, v in seen.items() if k.endswith("expired")) > 0, "no call met the sweep"


# -- a kernel killed from outside during a call ------------------------------------------

KERNEL_UIDS = range(64000, 64100)  # this test's own uids: it kills only its own kernels


def kernel_pids(uids: range) -> list[int]:
    """Host pids of this test's ipykernel processes (descendants of this process, in either
    sandbox mode; in uid mode also running as one of ``uids``)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error, TypeError):
            argv = proc.cmdline()
            if "ipykernel" not in " ".join(argv) or "python" not in os.path.basename(argv[0]):
                continue  # bwrap's own processes name ipykernel in their argv too
            if os.geteuid() != 0 or proc.uids().real in uids:
                found.append(proc.pid)
    return found


async def test_a_kernel_killed_from_outside_fails_the_call_promptly_and_the_next_call_works(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path / "state",
        owner="victim",
        kernels={
            "warm_spares": 0,
            "uid_base": KERNEL_UIDS.start,
            "uid_count": len(KERNEL_UIDS),
        },
    )
    async with Client(create_app(settings, "memory", kernels=True)) as client:
        sales = (await client.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
        first = await client.call_tool(
            "run_python",
            {
                "code": "kept = 41\noutputs['units'] = s[['units']]\nresult = kept",
                "inputs": {"s": sales["dataRef"]},
            },
        )
        assert first.structured_content["ok"], first.structured_content
        output_ref = first.structured_content["outputs"]["units"]["dataRef"]
        [pid] = kernel_pids(KERNEL_UIDS)

        call = asyncio.ensure_future(
            client.call_tool(
                "run_python",
                {"code": "import time\ntime.sleep(60)", "timeout_s": 120},
                raise_on_error=False,
            )
        )
        await asyncio.sleep(1.5)
        assert not call.done()
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        result = await asyncio.wait_for(call, timeout=30)
        took = time.monotonic() - started
        assert took < 15, f"the call took {took:.1f}s to notice the dead kernel"
        answer = result.structured_content
        assert answer is not None and answer["ok"] is False, result.content
        assert "variables are gone" in answer["error"] and "artifacts are kept" in answer["error"]

        after = await client.call_tool(
            "run_python", {"code": "result = [2 + 2, 'kept' in globals()]"}
        )
        assert after.structured_content["result"] == [4, False]
        assert not (await client.call_tool("describe_data", {"dataRef": output_ref})).is_error
        assert kernel_pids(KERNEL_UIDS) and pid not in kernel_pids(KERNEL_UIDS)
    print(f"\nkilled kernel pid {pid}: the call returned after {took:.1f}s")
    deadline = time.monotonic() + 10
    while kernel_pids(KERNEL_UIDS) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert kernel_pids(KERNEL_UIDS) == [], "a kernel outlived its server"
