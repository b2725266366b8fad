"""Three replicas behind HAProxy with their kernels on a real Jupyter Kernel Gateway.

Every replica reaches every notebook's kernel (the kernel map in the shared PostgreSQL state),
so a chained analysis keeps its Python VARIABLES while round-robin spreads its calls over
all replicas, a replica SIGKILLed mid-run takes no variables with it, the leader stops the
spare kernels the dead replica left on the gateway, and stopping the replicas one by one
leaves the notebooks' kernels serving until the last one stops: then nothing is left.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import nbformat
import psycopg
import pytest
from fastmcp import Client
from nbclient import NotebookClient

from tests.kernel_support import require_bwrap
from tests.replica_cluster import Cluster
from tests.test_replicas import article_session, call, download, env_base

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
CHAIN = 20


@pytest.fixture(scope="module")
def kg(gateways):
    return gateways.get("kg")


@pytest.fixture(scope="module")
def cluster(kg) -> Iterator[Cluster]:
    require_bwrap()
    env = {
        "DATAREF_KERNELS__GATEWAY_URL": kg.url,
        "DATAREF_KERNELS__GATEWAY_TOKEN": kg.token,
        "DATAREF_KERNELS__IDLE_TIMEOUT_SECONDS": "600",
    }
    c = Cluster(3, TOKENS, extra_env=env).start()
    try:
        yield c
    finally:
        c.stop()


def gateway_kernels(kg) -> set[str]:
    response = httpx.get(
        f"{kg.url}/api/kernels", headers={"Authorization": f"token {kg.token}"}, timeout=10
    )
    response.raise_for_status()
    return {k["id"] for k in response.json()}


def listed(cluster: Cluster) -> dict[str, str | None]:
    """The deployment's kernels in the shared state: gateway id -> notebook (None: a spare)."""
    with psycopg.connect(cluster.state_url) as conn:
        return dict(conn.execute("SELECT id, handle FROM kernels").fetchall())


def holders(cluster: Cluster) -> dict[str, tuple[str | None, str | None]]:
    """gateway id -> (notebook, the replica holding it as a spare)."""
    with psycopg.connect(cluster.state_url) as conn:
        rows = conn.execute("SELECT id, handle, holder FROM kernels").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


async def every_replica_has_a_spare(cluster: Cluster) -> dict[str, tuple[str | None, str | None]]:
    deadline = time.monotonic() + 60
    while True:
        rows = holders(cluster)
        if len({holder for handle, holder in rows.values() if handle is None}) == 3:
            return rows
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.2)


def heartbeats(cluster: Cluster) -> dict[str, float]:
    with psycopg.connect(cluster.state_url) as conn:
        return dict(conn.execute("SELECT id, seen FROM replicas").fetchall())


def step(k: int) -> str:
    return f"# step {k}\ntotal += {k}\nseen.append({k})\nresult = [total, len(seen)]"


async def test_the_article_and_a_chain_on_variables_are_exact_across_replicas_and_replay(cluster):
    before = cluster.requests_per_replica()
    async with Client(f"{cluster.url}/mcp", auth="tok-alice") as alice:
        # the article's session first: exact results, a chart by reference
        sales, qoq, worst = await article_session(cluster, alice)
        code = "total = 0\nseen = []\nbig = sales.revenue.max()\nresult = [total, len(seen)]"
        out = await call(alice, "run_python", {"code": code, "inputs": {"sales": sales["dataRef"]}})
        assert out["ok"] and out["result"] == [0, 0], out
        for k in range(1, CHAIN):
            out = await call(alice, "run_python", {"code": step(k)})
            assert out["ok"] and out["result"] == [k * (k + 1) // 2, k], out
        out = await call(alice, "run_python", {"code": "result = float(big)"})
        assert out["ok"], out  # a variable bound from an input, many calls (and replicas) ago
        exported = await call(alice, "export_notebook", {})
        text = download(cluster, exported["url"], "tok-alice").text
    spread = {r: n - before.get(r, 0) for r, n in cluster.requests_per_replica().items()}
    assert len(spread) == 3 and min(spread.values()) >= 5, spread  # every replica answered
    nb = nbformat.reads(text, as_version=4)
    tools = [c.metadata["dataref"].get("tool") for c in nb.cells if c.metadata.get("dataref")]
    assert "restart" not in tools  # one kernel all along: no "variables cleared" note
    env = {"DATAREF_STATE_DIR": str(cluster.replicas[0].state_dir), "DATAREF_OWNER": "alice"}
    await asyncio.to_thread(
        NotebookClient(nb, kernel_name="python3", timeout=180).execute, env={**env_base(), **env}
    )
    shown = [
        o.data["text/plain"]
        for c in nb.cells
        if c.cell_type == "code" and c.metadata["dataref"].get("tool") == "run_python"
        for o in c.outputs
        if o.output_type == "execute_result"
    ]
    last = CHAIN - 1
    assert shown[-2].replace(" ", "").replace("\n", "") == f"[{last * CHAIN // 2},{last}]"
    assert json.loads(shown[0]) == qoq["result"] and json.loads(shown[1]) == worst["result"]


async def test_variables_survive_a_replica_sigkilled_mid_run_and_its_spare_is_stopped(cluster, kg):
    victim = cluster.replicas[2]
    ok: list[int] = []
    failed: list[int] = []
    killed_at = 0.0
    async with Client(f"{cluster.url}/mcp", auth="tok-bob", timeout=120) as bob:
        first = await call(bob, "run_python", {"code": "state = {}\nresult = 0"})
        handle = first["notebook"]
        for k in range(1, 25):
            if k == 8:
                kernels_before = await every_replica_has_a_spare(cluster)
                await asyncio.to_thread(victim.kill)
                killed_at = time.monotonic()
            code = f"state[{k}] = {k} * {k}\nresult = sorted(state)"
            try:
                out = await call(bob, "run_python", {"code": code, "notebook": handle})
            except Exception:
                assert killed_at and time.monotonic() - killed_at < 30  # the call in flight
                failed.append(k)
                continue
            assert out["ok"], out
            ok.append(k)
            assert set(ok) <= set(out["result"]) <= set(ok) | set(failed)
    assert len(failed) <= 1 and ok[-1] == 24
    kernels = listed(cluster)
    assert handle in kernels.values()  # its kernel lives on, on the gateway

    # The dead replica's spare is an orphan: the leader stops it once its heartbeat is old.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        dead = [r for r, seen in heartbeats(cluster).items() if seen < time.time() - 20]
        orphans = [k for k, (h, holder) in kernels_before.items() if holder in dead]
        if dead and not set(orphans) & (set(listed(cluster)) | gateway_kernels(kg)):
            break
        await asyncio.sleep(1)
    else:
        raise AssertionError(f"the dead replica's spares were not stopped: {listed(cluster)}")
    assert len(dead) == 1 and orphans  # it had its warm spare


async def test_stopping_the_replicas_one_by_one_leaves_nothing_running_at_the_end(cluster, kg):
    mapped = {k for k, h in listed(cluster).items() if h is not None}
    assert mapped and mapped <= gateway_kernels(kg)
    alive = [r for r in cluster.replicas if r.proc is not None and r.proc.poll() is None]
    for replica in alive[:-1]:
        replica.stop()
        assert mapped <= gateway_kernels(kg)  # the others still serve these notebooks
    alive[-1].stop()
    logs = "\n".join(
        line
        for r in cluster.replicas
        for line in r.log.read_text().splitlines()
        if "tool_call" not in line
    )
    assert not set(listed(cluster)) & gateway_kernels(kg), logs[-6000:]
    assert listed(cluster) == {}
