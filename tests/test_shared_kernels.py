"""Kernels on a gateway shared by several servers through the kernel map (kernels/shared.py).

Two servers (two pools, or two whole apps) on one state and one real Kernel Gateway: a
notebook has one kernel whichever server takes the call, its variables are there for both,
a kernel the gateway lost is replaced (and the transcript says the variables were cleared),
the leader reaps idle and orphaned kernels, and the last server to stop leaves nothing
running while an earlier one only lets go.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastmcp import Client

from dataref.app import create_app
from dataref.kernels import KernelPool
from dataref.state import open_state
from dataref.state.kernel_map import KernelMap
from dataref.transcript import Transcripts

from .conftest import GATEWAY_OWNER, backend_settings
from .kernel_support import require_bwrap

pytestmark = pytest.mark.asyncio


def gateway_kernels(settings) -> set[str]:
    k = settings.kernels
    headers = {"Authorization": f"token {k.gateway_token}"}
    response = httpx.get(f"{k.gateway_url}/api/kernels", headers=headers, timeout=10)
    response.raise_for_status()
    return {kernel["id"] for kernel in response.json()}


def notebook(state_dir, state) -> str:
    return Transcripts(state_dir / "notebooks", db=state.notebooks_db, shared_kernels=True).new(
        GATEWAY_OWNER
    )


async def run(kernel, code: str):
    return await kernel.execute(code, timeout_s=60)


async def test_two_pools_racing_for_one_notebook_share_one_gateway_kernel_and_its_variables(
    request, tmp_path
):
    require_bwrap()
    settings = backend_settings(request, tmp_path, "kg", kernels={"warm_spares": 0})
    before = gateway_kernels(settings)
    states = [open_state(settings), open_state(settings)]
    pools = [KernelPool(settings, state=state) for state in states]
    try:
        handle = notebook(tmp_path, states[0])
        for pool in pools:
            await pool.start()
        a, b = await asyncio.gather(*(p.kernel(GATEWAY_OWNER, handle) for p in pools))
        assert a.process.gateway_id == b.process.gateway_id  # one kernel won the race
        assert gateway_kernels(settings) - before == {a.process.gateway_id}  # the loser's went
        assert (await run(a, "x = 41")).status == "ok"
        assert (await run(b, "print(x + 1)")).stdout.strip() == "42"

        await pools[0].close()  # another server is alive: it only lets go of the kernel
        assert a.process.gateway_id in gateway_kernels(settings)
        again = await pools[1].kernel(GATEWAY_OWNER, handle)
        assert again is b and (await run(b, "print(x)")).stdout.strip() == "41"
        await pools[1].close()  # the last one: nothing is left running
        assert gateway_kernels(settings) == before
        assert KernelMap(states[1].notebooks_db).everything() == []
    finally:
        for pool, state in zip(pools, states, strict=True):
            await pool.close()
            state.close()


async def test_the_leader_stops_idle_kernels_and_the_spares_of_a_dead_server(request, tmp_path):
    require_bwrap()
    settings = backend_settings(request, tmp_path, "kg", kernels={"warm_spares": 0})
    state = open_state(settings)
    pool = KernelPool(settings, state=state)
    kernel_map = KernelMap(state.notebooks_db)
    try:
        handle = notebook(tmp_path, state)
        await pool.start()
        kernel = await pool.kernel(GATEWAY_OWNER, handle)
        mapped = kernel.process.gateway_id
        orphan = await pool.backend.client.start_kernel("dataref", {"KERNEL_USERNAME": "dataref"})
        kernel_map.add_spare(orphan, "a-server-that-died")
        assert {mapped, orphan} <= gateway_kernels(settings)

        assert await pool.shared.reap(idle=3600) == 1  # the orphan only: the other is in use
        assert orphan not in gateway_kernels(settings) and mapped in gateway_kernels(settings)
        async with state.notebook_locks.hold(f"notebook:{handle}"):  # a call holds it
            assert await pool.shared.reap(idle=0) == 0
        assert await pool.shared.reap(idle=0) == 1
        assert mapped not in gateway_kernels(settings) and kernel_map.get(handle) is None

        fresh = await pool.kernel(GATEWAY_OWNER, handle)  # the next call gets a new kernel
        assert fresh.process.gateway_id not in (None, mapped)
        assert (await run(fresh, "print(1)")).stdout.strip() == "1"
    finally:
        await pool.close()
        state.close()


async def call(client: Client, code: str, notebook: str | None = None) -> dict:
    args = {"code": code, **({"notebook": notebook} if notebook else {})}
    return (await client.call_tool("run_python", args)).structured_content


async def test_variables_follow_the_notebook_from_server_to_server_until_the_kernel_is_lost(
    request, tmp_path
):
    """Two whole servers on one state: a chain of calls alternating between them keeps its
    variables; when the gateway loses the kernel the next call gets a fresh one and the
    transcript notes the variables were cleared there (once)."""
    require_bwrap()
    settings = backend_settings(request, tmp_path, "kg", kernels={"warm_spares": 0})
    async with (
        Client(create_app(settings, "memory")) as one,
        Client(create_app(settings, "memory")) as two,
    ):
        first = await call(one, "import pandas as pd\ntotal = 1\nresult = total")
        handle = first["notebook"]
        for i, client in enumerate([two, one, two, one], start=2):
            out = await call(client, f"total += {i}\nresult = total", handle)
            assert out["ok"], out
        assert out["result"] == 1 + 2 + 3 + 4 + 5

        state = open_state(settings)
        try:
            mapped = KernelMap(state.notebooks_db).get(handle)
        finally:
            state.close()
        assert mapped is not None
        k = settings.kernels
        httpx.delete(
            f"{k.gateway_url}/api/kernels/{mapped.kernel}",
            headers={"Authorization": f"token {k.gateway_token}"},
        ).raise_for_status()
        await asyncio.sleep(1.5)  # a kernel idle a while is looked up before it is used again
        lost = await call(two, "result = 'total' in globals()", handle)
        assert lost["ok"] and lost["result"] is False, lost
        after = await call(one, "total = 7\nresult = total", handle)
        assert after["result"] == 7
        export = await one.call_tool("export_notebook", {"notebook": handle})
        assert not export.is_error
    state = open_state(settings)
    try:
        nb = Transcripts(tmp_path / "notebooks", db=state.notebooks_db).read(GATEWAY_OWNER, handle)
    finally:
        state.close()
    notes = [c.source for c in nb.cells if c.cell_type == "markdown" and "restarted" in c.source]
    assert len(notes) == 1, notes
