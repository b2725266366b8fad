"""Load: many owners and notebooks at once over real HTTP with static tokens.

What must hold under load: the kernel caps (``kernels.max_per_owner``, ``kernels.max_total``)
give clean LimitExceeded errors and never a hang; kernels do not leak (the kernel uids' process
count returns to its baseline after a reset, a shutdown, even a SIGKILL of the server); the
server's memory stays bounded; owners stay isolated while they all work at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastmcp import Client

from dataref.config import KernelSettings
from dataref.kernels.budget import kernel_footprint

from .conftest import HttpServer

UIDS = range(64500, 64550)  # these tests' own kernel uids: counts are not disturbed by others
MAX_PER_OWNER = 2
MAX_TOTAL = 4
OWNERS = [f"owner{i}" for i in range(12)]
TOKENS = {f"tok-{owner}": owner for owner in OWNERS}
CALL_BOUND_S = 120  # any call slower than this counts as a hang
RSS_BOUND = 1536 * 1024 * 1024
PER_KERNEL = "cap is 2"
SERVER_WIDE = "maximum of 4 kernels"


def kernel_pids() -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "uids", "cmdline"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if proc.info["uids"].real in UIDS and "ipykernel" in " ".join(proc.info["cmdline"]):
                found.append(proc.info["pid"])
    return found


def wait_for_no_kernels(timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := kernel_pids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


class Sampler:
    """Samples the server's RSS and the number of kernel processes in the background."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak_rss = 0
        self.peak_kernels = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(psutil.Error):
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
            self.peak_kernels = max(self.peak_kernels, len(kernel_pids()))

    def rss(self) -> int:
        return self.process.memory_info().rss

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServer]:
    assert kernel_pids() == [], "kernels of these uids were running before the test"
    srv = HttpServer(
        tmp_path / "state",
        TOKENS,
        DATAREF_KERNELS__MAX_PER_OWNER=str(MAX_PER_OWNER),
        DATAREF_KERNELS__MAX_TOTAL=str(MAX_TOTAL),
        DATAREF_KERNELS__UID_BASE=str(UIDS.start),
        DATAREF_KERNELS__UID_COUNT=str(len(UIDS)),
        # the memory budget fits exactly the cap: these tests see the cap on any machine
        DATAREF_KERNELS__MEMORY_BUDGET_BYTES=str(MAX_TOTAL * kernel_footprint(KernelSettings())),
    )
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            srv.stop()
        if srv.proc.poll() is None:
            srv.proc.kill()


async def call(url: str, owner: str, tool: str, arguments: dict[str, Any]) -> Any:
    """One call by ``owner`` in its own client; a hang fails the test."""
    async with Client(f"{url}/mcp", auth=f"tok-{owner}") as client:
        return await asyncio.wait_for(
            client.call_tool(tool, arguments, raise_on_error=False), CALL_BOUND_S
        )


def text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


async def test_kernel_caps_hold_under_concurrent_owners_and_no_kernel_outlives_the_server(
    server: HttpServer,
) -> None:
    sampler = Sampler(server.proc.pid)
    new_kernel = {"code": "import os\nresult = os.getuid()", "notebook": "new"}
    try:
        # One owner asks for three kernels at once: two start, the third is refused cleanly.
        first = await asyncio.gather(
            *(call(server.url, "owner0", "run_python", new_kernel) for _ in range(3))
        )
        started = [r for r in first if not r.is_error]
        refused = [text(r) for r in first if r.is_error]
        assert len(started) == MAX_PER_OWNER, refused
        assert len(refused) == 1 and PER_KERNEL in refused[0], refused
        uids = {r.structured_content["result"] for r in started}
        assert len(uids) == MAX_PER_OWNER and uids <= set(UIDS), "one uid per kernel"

        # Three more owners ask for two each: the server-wide cap refuses what exceeds it.
        burst = await asyncio.gather(
            *(
                call(server.url, owner, "run_python", new_kernel)
                for owner in OWNERS[1:4]
                for _ in range(2)
            )
        )
        ok = [r for r in burst if not r.is_error]
        refused = [text(r) for r in burst if r.is_error]
        assert len(ok) == MAX_TOTAL - MAX_PER_OWNER, refused
        assert refused and all(SERVER_WIDE in t or PER_KERNEL in t for t in refused), refused
        assert len(kernel_pids()) == MAX_TOTAL

        # A reset frees its slot: another owner starts a kernel, and nothing leaked.
        notebook = started[0].structured_content["notebook"]
        reset = await call(server.url, "owner0", "reset_kernel", {"notebook": notebook})
        assert not reset.is_error, text(reset)
        later = await call(server.url, "owner5", "run_python", new_kernel)
        assert not later.is_error and later.structured_content["ok"], text(later)
        assert len(kernel_pids()) == MAX_TOTAL
    finally:
        sampler.stop()
    assert sampler.peak_kernels <= MAX_TOTAL + 1  # + one being replaced at the reset
    server.stop()
    assert wait_for_no_kernels() == [], "kernels outlived a clean shutdown"
    print(f"\npeak kernels {sampler.peak_kernels}, peak server RSS {sampler.peak_rss >> 20} MiB")
    assert sampler.peak_rss < RSS_BOUND


async def test_many_owners_at_once_stay_isolated_and_the_server_memory_stays_bounded(
    server: HttpServer,
) -> None:
    sampler = Sampler(server.proc.pid)

    async def session(owner: str, round_: int) -> list[str]:
        refs = []
        async with Client(f"{server.url}/mcp", auth=f"tok-{owner}") as client:
            for day in range(1, 6):
                since = f"2025-12-{day + 5 * round_:02d}"
                got = await asyncio.wait_for(
                    client.call_tool("fetch_sales", {"since": since}), CALL_BOUND_S
                )
                refs.append(got.structured_content["dataRef"])
                await client.call_tool("describe_data", {"dataRef": refs[-1]})
            listing = await client.call_tool("list_artifacts", {})
            mine = {a["ref"] for a in listing.structured_content["artifacts"]}
            assert set(refs) <= mine
            return sorted(mine)

    try:
        rss = []
        for round_ in range(3):
            listings = await asyncio.gather(*(session(owner, round_) for owner in OWNERS))
            rss.append(sampler.rss())
            seen: set[str] = set()
            for refs in listings:
                assert not seen & set(refs), "two owners see the same ref"
                seen |= set(refs)
        # Owners cannot reach each other's refs even while all are busy.
        stranger = await call(server.url, OWNERS[1], "describe_data", {"dataRef": listings[0][0]})
        assert stranger.is_error and "unknown or expired" in text(stranger)
    finally:
        sampler.stop()
    calls = len(OWNERS) * 3 * 11
    print(
        f"\n{calls} calls by {len(OWNERS)} owners; server RSS per round {[r >> 20 for r in rss]}"
        f" MiB, peak {sampler.peak_rss >> 20} MiB"
    )
    assert sampler.peak_rss < RSS_BOUND
    assert rss[-1] - rss[0] < 200 * 1024 * 1024, "memory grows round after round"


async def test_kernels_die_with_a_sigkilled_server(server: HttpServer) -> None:
    a, b = await asyncio.gather(
        call(server.url, "owner7", "run_python", {"code": "result = 1", "notebook": "new"}),
        call(server.url, "owner8", "run_python", {"code": "result = 2", "notebook": "new"}),
    )
    assert not a.is_error and not b.is_error
    assert len(kernel_pids()) == 2
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    assert wait_for_no_kernels() == [], "kernels outlived a SIGKILLed server"
