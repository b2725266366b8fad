"""Kernels on a Jupyter gateway: what only the gateway backend has (the shared behaviour is
tested by test_compute, test_transcript and test_charts on every backend).

A gateway that is down or refuses the token, owners the gateway refuses, and tables moved over
the kernel's channel in chunks under the gateway's 10 MiB message limit, both ways.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from dataref.app import create_app

from .conftest import backend_settings, free_port, make_settings
from .kernel_support import require_bwrap

pytestmark = pytest.mark.asyncio


async def call(client: Client, code: str, **kwargs) -> dict:
    return (await client.call_tool("run_python", {"code": code, **kwargs})).structured_content


async def still_serves_the_rest(client: Client) -> None:
    """fetch, describe, chart and export work without kernels."""
    ref = (await client.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
    ref = ref["dataRef"]
    assert not (await client.call_tool("describe_data", {"dataRef": ref})).is_error
    chart = {"dataRef": ref, "x": "line", "y": "revenue", "kind": "bar"}
    assert not (await client.call_tool("render_chart", chart)).is_error
    export = {"dataRef": ref, "format": "csv"}
    assert not (await client.call_tool("export_data", export)).is_error


async def test_a_gateway_that_is_down_names_the_operators_fix_and_the_rest_keeps_working(
    tmp_path,
):
    url = f"http://127.0.0.1:{free_port()}"
    settings = make_settings(tmp_path, kernels={"gateway_url": url, "gateway_token": "t"})
    async with Client(create_app(settings, "memory")) as client:
        with pytest.raises(ToolError, match=r"gateway does not answer.*kernels.gateway_url"):
            await client.call_tool("run_python", {"code": "result = 1"})
        await still_serves_the_rest(client)


async def test_a_refused_token_names_kernels_gateway_token(request, tmp_path):
    settings = backend_settings(request, tmp_path, "kg", kernels={"gateway_token": "wrong"})
    async with Client(create_app(settings, "memory")) as client:
        with pytest.raises(ToolError, match=r"refused the server's token.*kernels.gateway_token"):
            await client.call_tool("run_python", {"code": "result = 1"})
        await still_serves_the_rest(client)


async def test_a_gateway_without_the_kernelspec_names_the_install_command(request, tmp_path):
    settings = backend_settings(request, tmp_path, "kg", kernels={"gateway_kernel": "absent"})
    async with Client(create_app(settings, "memory")) as client:
        with pytest.raises(ToolError, match="dataref kernelspec install"):
            await client.call_tool("run_python", {"code": "result = 1"})


async def test_the_owner_is_the_kernel_username_the_gateway_checks(request, tmp_path):
    """Enterprise Gateway admits only EG_AUTHORIZED_USERS: an owner outside it is refused,
    which shows KERNEL_USERNAME is the owner (the agent can set no KERNEL_* value)."""
    settings = backend_settings(request, tmp_path, "eg", owner="mallory")
    async with Client(create_app(settings, "memory")) as client:
        with pytest.raises(ToolError, match="EG_AUTHORIZED_USERS"):
            await client.call_tool("run_python", {"code": "result = 1"})


@pytest.mark.parametrize("backend", ["kg", "eg"])
async def test_a_table_larger_than_the_message_limit_round_trips_exactly(
    request, tmp_path, backend
):
    require_bwrap()
    settings = backend_settings(request, tmp_path, backend, store={"artifact_max_bytes": 64 << 20})
    make = (
        "import numpy as np, pandas as pd\n"
        "rng = np.random.default_rng(7)\n"
        "big = pd.DataFrame({f'c{i}': rng.random(300_000) for i in range(8)})\n"
        "big['label'] = rng.choice(['north', 'south', 'east'], len(big))\n"
    )
    scope: dict = {}
    exec(make, scope)  # the same frame, made here
    frame = scope["big"]
    check = "result = [float(t.c3.sum()), t.label.value_counts().to_dict(), t.shape[0]]"
    async with Client(create_app(settings, "memory")) as client:
        made = await call(client, make + "outputs['big'] = big\nresult = 'made'")
        assert made["ok"], made
        ref = made["outputs"]["big"]["dataRef"]
        assert made["outputs"]["big"]["rows"] == 300_000
        # into a fresh kernel: more than one 10 MiB message, so it travels in chunks
        seen = await call(client, check, inputs={"t": ref}, notebook="new")
        assert seen["ok"], seen
        again = await call(client, check, inputs={"t": ref}, notebook=seen["notebook"])
    assert seen["result"][0] == float(frame.c3.sum())
    assert seen["result"][1] == frame.label.value_counts().to_dict()
    assert seen["result"][2] == len(frame)
    assert again["result"] == seen["result"]  # already staged: not sent again


async def test_an_output_over_the_artifact_cap_is_refused_as_for_local_kernels(request, tmp_path):
    require_bwrap()
    settings = backend_settings(request, tmp_path, "kg", store={"artifact_max_bytes": 1 << 20})
    code = "import numpy as np\noutputs['big'] = pd.DataFrame({'x': np.arange(400_000)})"
    async with Client(create_app(settings, "memory")) as client:
        out = await call(client, "import pandas as pd\n" + code)
    assert out["outputs"] == {}
    assert any("exceeds the artifact size cap" in note for note in out["notes"]), out


async def test_caps_and_idle_reaping_hold_for_gateway_kernels(request, tmp_path):
    """The pool's caps and reaper are above the seam: a reaped kernel is gone from the
    gateway too, and the owner's next call gets a fresh one."""
    import asyncio

    import httpx

    from dataref.errors import LimitExceeded
    from dataref.kernels import KernelPool

    settings = backend_settings(
        request, tmp_path, "kg", kernels={"max_per_owner": 1, "idle_timeout_seconds": 1}
    )
    gateway = request.getfixturevalue("gateways").get("kg")
    pool = KernelPool(settings)
    await pool.start()
    try:
        kernel = await pool.kernel("analyst", "nb1")
        assert (await kernel.execute("x = 1", timeout_s=30)).status == "ok"
        with pytest.raises(LimitExceeded, match="reset_kernel"):
            await pool.kernel("analyst", "nb2")
        url = f"{gateway.url}/api/kernels/{kernel.process.gateway_id}"
        headers = {"Authorization": f"token {gateway.token}"}
        async with httpx.AsyncClient(headers=headers) as http:
            assert (await http.get(url)).status_code == 200
            for _ in range(150):  # reaped after ~1.5 s, then deleted on the gateway
                if kernel.closed and (await http.get(url)).status_code == 404:
                    break
                await asyncio.sleep(0.1)
            assert kernel.closed and pool.live() == []
            assert (await http.get(url)).status_code == 404
        fresh = await pool.kernel("analyst", "nb2")
        assert (await fresh.execute("result = 1", timeout_s=30)).status == "ok"
    finally:
        await pool.close()


async def test_a_gateway_killed_outright_leaves_no_kernel_process_behind(tmp_path):
    """The kernelspec's launcher dies with its gateway and takes the sandbox with it."""
    import asyncio
    import shutil
    import tempfile

    import psutil

    from dataref.errors import ComputeError
    from dataref.kernels import KernelPool

    from .gateways.servers import start_gateway

    require_bwrap()
    short = Path(tempfile.mkdtemp(prefix="gwk"))  # ipc socket paths are limited to 107 bytes
    request_cleanup = [lambda: shutil.rmtree(short, ignore_errors=True)]
    gateway = start_gateway("kg", short, uid_base=66000)
    settings = make_settings(
        tmp_path / "state",
        owner="analyst",
        kernels={"warm_spares": 0, "gateway_url": gateway.url, "gateway_token": gateway.token},
    )
    pool = KernelPool(settings)
    await pool.start()
    try:
        kernel = await pool.kernel("analyst", "nb1")
        assert (await kernel.execute("x = 1", timeout_s=30)).status == "ok"
        children = psutil.Process(gateway.process.pid).children(recursive=True)
        assert any(c.uids().real >= 66000 for c in children)  # the sandboxed kernel
        gateway.process.kill()
        gateway.process.wait()
        for _ in range(100):
            alive = [c for c in children if c.is_running() and c.status() != "zombie"]
            if not alive:
                break
            await asyncio.sleep(0.1)
        assert alive == []
        with pytest.raises(ComputeError, match="gateway does not answer"):
            await kernel.execute("x", timeout_s=5)  # the kernel is gone, and so is the gateway
    finally:
        await pool.close()
        gateway.stop()
        for cleanup in request_cleanup:
            cleanup()
