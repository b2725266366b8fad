"""``serve --http --workers N`` on the SQLite state, and the health endpoints.

Real processes: the forked workers share one port and the state dir's SQLite files through
file locks; a SIGKILLed worker is replaced and no acknowledged artifact is lost. ``/readyz``
turns 503 when the PostgreSQL state goes away, while ``/healthz`` (liveness) stays 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import psutil
import pytest
from fastmcp import Client

from tests.conftest import DATAREF, child_env, free_port
from tests.pg_server import PgServer
from tests.pg_state_server import create_database, halt

TOKENS = {f"tok-w{i}": f"w{i}" for i in range(4)}


class Served:
    def __init__(self, state_dir: Path, *args: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [DATAREF, "serve", "--http", "--port", str(self.port), *args],
            env=child_env(state_dir, DATAREF_AUTH__TOKENS=json.dumps(TOKENS), **env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 90
        while self.status("/readyz") != 200:
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("the server did not become ready")
            time.sleep(0.2)

    def status(self, path: str) -> int | None:
        try:
            return httpx2.get(f"{self.url}{path}", timeout=5).status_code
        except httpx2.HTTPError:
            return None

    def workers(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def two_workers(tmp_path) -> Iterator[Served]:
    served = Served(tmp_path / "state", "--workers", "2")
    try:
        yield served
    finally:
        served.stop()


async def fetch_many(url: str, owner: str, n: int) -> list[str]:
    async with Client(f"{url}/mcp", auth=f"tok-{owner}") as client:
        refs = []
        for i in range(n):
            out = await client.call_tool("fetch_sales", {"since": f"2025-12-{10 + i:02d}"})
            refs.append(out.structured_content["dataRef"])
        return refs


async def listed(url: str, owner: str) -> set[str]:
    async with Client(f"{url}/mcp", auth=f"tok-{owner}") as client:
        out = (await client.call_tool("list_artifacts", {})).structured_content
        return {a["ref"] for a in out["artifacts"]}


async def test_workers_share_one_port_and_the_state_and_a_killed_one_is_replaced(two_workers):
    assert len(two_workers.workers()) == 2
    owners = list(TOKENS.values())
    first = await asyncio.gather(*(fetch_many(two_workers.url, o, 5) for o in owners))
    victim = two_workers.workers()[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    second = await asyncio.gather(*(fetch_many(two_workers.url, o, 3) for o in owners))
    for owner, a, b in zip(owners, first, second, strict=True):
        assert set(a) | set(b) == await listed(two_workers.url, owner)
    deadline = time.time() + 60
    while len(two_workers.workers()) != 2 and time.time() < deadline:
        await asyncio.sleep(0.2)
    assert len(two_workers.workers()) == 2 and victim.pid not in {
        p.pid for p in two_workers.workers()
    }
    pids = [p.pid for p in two_workers.workers()]
    two_workers.stop()
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids
    )


def test_readyz_turns_503_when_the_state_database_goes_and_healthz_stays_200(tmp_path):
    pg = PgServer.start()
    try:
        served = Served(tmp_path / "state", DATAREF_STATE__URL=create_database(pg))
        try:
            assert served.status("/healthz") == 200
            halt(pg)
            response = httpx2.get(f"{served.url}/readyz", timeout=30)
            assert response.status_code == 503
            assert response.json()["state"] == "unavailable"
            assert "postgres" not in response.text.lower()  # no details to the network
            assert served.status("/healthz") == 200
        finally:
            served.stop()
    finally:
        with contextlib.suppress(RuntimeError):  # halted already: pg_ctl finds no server
            pg.stop()


def test_workers_need_http(tmp_path):
    done = subprocess.run(
        [DATAREF, "serve", "--workers", "2"],
        env=child_env(tmp_path / "state"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--workers N needs --http" in done.stderr
