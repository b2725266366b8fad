"""Three replicas behind HAProxy on one PostgreSQL state and a shared blob directory.

Real programs throughout: Debian's PostgreSQL and HAProxy, three ``dataref serve --http``
processes with real sandboxed kernels, real MCP clients over HTTP through the balancer
(round-robin, so consecutive calls of one notebook land on different replicas).

Kernels here are each replica's own (no kernel gateway in this deployment): a notebook's
variables live in the replica that ran its last call, so the sessions below pass data from
call to call by dataRef, as agents do, and the transcript notes each change of kernel.
tests/test_replicas_gateway.py runs the same deployment with its kernels on a Kernel Gateway,
where variables follow the notebook from replica to replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import nbformat
import pyarrow as pa
import pytest
from fastmcp import Client
from nbclient import NotebookClient

from dataref.walkthrough import QOQ_CODE, WORST_CODE
from tests.kernel_support import require_bwrap
from tests.replica_cluster import Cluster

OWNERS = [f"owner{i}" for i in range(8)]
TOKENS = {"tok-alice": "alice", **{f"tok-{o}": o for o in OWNERS}}
CALLS_PER_OWNER = 25


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    require_bwrap()
    c = Cluster(3, TOKENS).start()
    try:
        yield c
    finally:
        c.stop()


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    return result.structured_content


def local_result(cluster: Cluster, code: str, **refs: str) -> Any:
    """What the code gives run here on the stored artifacts: the exact expected answer."""
    import pandas as pd

    shared = cluster.root / "shared" / "artifacts"
    namespace: dict[str, Any] = {"pd": pd, "outputs": {}}
    for name, ref in refs.items():
        with pa.memory_map(str(shared / f"{ref}.arrow")) as f:
            namespace[name] = pa.ipc.open_file(f).read_all().to_pandas()
    exec(code, namespace)
    return json.loads(json.dumps(namespace["result"], default=str))


def download(cluster: Cluster, url: str, token: str) -> httpx2.Response:
    path = url.split("/download/", 1)[1]
    return httpx2.get(
        f"{cluster.url}/download/{path}", headers={"authorization": f"Bearer {token}"}
    )


async def article_session(cluster: Cluster, alice: Client) -> tuple[dict, dict, dict]:
    """The article's fetch, QoQ, worst line and chart through the balancer, each result
    checked against the same code run here; returns (sales, qoq, worst)."""
    sales = await call(alice, "fetch_sales", {"since": "2025-01-01"})
    qoq = await call(alice, "run_python", {"code": QOQ_CODE, "inputs": {"sales": sales["dataRef"]}})
    assert qoq["ok"], qoq
    assert qoq["result"] == local_result(cluster, QOQ_CODE, sales=sales["dataRef"])
    qoq_ref = qoq["outputs"]["qoq"]["dataRef"]
    worst = await call(alice, "run_python", {"code": WORST_CODE, "inputs": {"qoq": qoq_ref}})
    assert worst["ok"] and worst["result"] == local_result(cluster, WORST_CODE, qoq=qoq_ref)
    chart = await call(alice, "render_chart", {"dataRef": qoq_ref, "x": "line", "y": "delta"})
    assert download(cluster, chart["url"], "tok-alice").content.startswith(b"\x89PNG")
    return sales, qoq, worst


STEP = """\
# step {k}
outputs["t"] = t.assign(n=t.n + {k})
result = int(outputs["t"].n.sum())
"""


async def test_the_article_and_a_20_call_chain_are_exact_across_replicas(cluster):
    before = cluster.requests_per_replica()
    async with Client(f"{cluster.url}/mcp", auth="tok-alice") as alice:
        _, qoq, worst = await article_session(cluster, alice)
        start = "import pandas as pd\noutputs['t'] = pd.DataFrame({'n': range(10)})\nresult = 45"
        step = await call(alice, "run_python", {"code": start})
        for k in range(1, 20):
            ref = step["outputs"]["t"]["dataRef"]
            step = await call(alice, "run_python", {"code": STEP.format(k=k), "inputs": {"t": ref}})
            assert step["ok"] and step["result"] == 45 + 10 * k * (k + 1) // 2
        exported = await call(alice, "export_notebook", {})
        text = download(cluster, exported["url"], "tok-alice").text
    spread = {
        name: count - before.get(name, 0) for name, count in cluster.requests_per_replica().items()
    }
    assert len(spread) == 3 and min(spread.values()) >= 5, spread  # every replica answered
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    tools = [c.metadata["dataref"].get("tool") for c in nb.cells if c.metadata.get("dataref")]
    assert [t for t in tools if t not in (None, "restart")] == (
        ["fetch_sales", "run_python", "run_python", "render_chart"] + ["run_python"] * 20
    )
    env = {"DATAREF_STATE_DIR": str(cluster.replicas[0].state_dir), "DATAREF_OWNER": "alice"}
    await asyncio.to_thread(
        NotebookClient(nb, kernel_name="python3", timeout=180).execute, env={**env_base(), **env}
    )
    shown = [
        json.loads(o.data["text/plain"])
        for c in nb.cells
        if c.cell_type == "code" and c.metadata["dataref"].get("tool") == "run_python"
        for o in c.outputs
        if o.output_type == "execute_result"
    ]
    assert shown[0] == qoq["result"] and shown[1] == worst["result"]
    assert shown[-1] == 45 + 10 * 19 * 20 // 2


def env_base() -> dict[str, str]:
    import os

    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}


class Run:
    """What the load below saw: every call's owner, timing and outcome."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float, float, bool]] = []
        self.refs: dict[str, list[str]] = {o: [] for o in OWNERS}
        self.links: dict[str, list[str]] = {o: [] for o in OWNERS}
        self.done = 0
        self.errors: list[str] = []


async def owner_session(cluster: Cluster, owner: str, run: Run) -> None:
    token = f"tok-{owner}"
    ref: str | None = None
    client: Client | None = None
    for i in range(CALLS_PER_OWNER):
        started = time.monotonic()
        try:
            if client is None:  # a host reconnects after a failed call, as an agent's does
                client = await Client(f"{cluster.url}/mcp", auth=token, timeout=180).__aenter__()
            out = await owner_call(client, i, ref, run, owner)
            if "outputs" in out:
                assert out["ok"] and out["result"] == i, out
                ref = out["outputs"]["t"]["dataRef"]
                run.refs[owner].append(ref)
            ok = True
        except Exception as exc:
            ok = False
            run.errors.append(f"{owner} call {i}: {exc!r}"[:300])
            client = await close_quietly(client)
        run.calls.append((owner, i, started, time.monotonic(), ok))
        run.done += 1
    await close_quietly(client)


async def owner_call(client: Client, i: int, ref: str | None, run: Run, owner: str) -> Any:
    if ref is None:
        make = "import pandas as pd\noutputs['t'] = pd.DataFrame({'n': range(5)})"
        return await call(client, "run_python", {"code": f"# call {i}\n{make}\nresult = {i}"})
    if i % 8 == 4:
        out = await call(client, "export_csv", {"dataRef": ref})
        run.links[owner].append(out["url"])
        return out
    code = f"# call {i}\noutputs['t'] = t.assign(n=t.n + 1)\nresult = {i}"
    return await call(client, "run_python", {"code": code, "inputs": {"t": ref}})


async def close_quietly(client: Client | None) -> None:
    if client is not None:
        with contextlib.suppress(Exception):
            await client.__aexit__(None, None, None)


async def test_8_owners_x_25_calls_with_a_replica_sigkilled_midway(cluster):
    run = Run()
    tasks = [asyncio.create_task(owner_session(cluster, o, run)) for o in OWNERS]
    while run.done < 70:
        await asyncio.sleep(0.05)
    victim = cluster.replicas[1]
    kill_started = time.monotonic()  # a call may fail while kill() waits for the process to go
    await asyncio.to_thread(victim.kill)
    killed_at = time.monotonic()
    await asyncio.gather(*tasks)
    failed = [c for c in run.calls if not c[4]]
    after = [c for c in run.calls if c[2] > killed_at]
    assert len(after) > 50 and all(c[4] for c in after), run.errors  # every later call succeeds
    in_flight = [c for c in failed if c[2] <= killed_at and c[3] >= kill_started]
    assert in_flight == failed, run.errors  # only calls in flight during the kill fail
    assert len(failed) <= len(OWNERS)
    # Nothing acknowledged is lost: artifacts, links and cells in call order, on the others.
    for owner in OWNERS:
        token = f"tok-{owner}"
        async with Client(f"{cluster.url}/mcp", auth=token) as client:
            listed = {a["ref"] for a in (await call(client, "list_artifacts", {}))["artifacts"]}
            assert set(run.refs[owner]) <= listed
            exported = await call(client, "export_notebook", {})
        for url in run.links[owner]:
            assert download(cluster, url, token).status_code == 200
        nb = nbformat.reads(download(cluster, exported["url"], token).text, as_version=4)
        numbers = [
            int(c.source.split("# call ", 1)[1].split("\n", 1)[0])
            for c in nb.cells
            if c.cell_type == "code" and "# call " in c.source
        ]
        succeeded = [i for o, i, _, _, ok in run.calls if o == owner and ok and i % 8 != 4]
        assert numbers == sorted(numbers) and set(succeeded) <= set(numbers), (owner, numbers)


SLOW = "import time\nstarted = time.time()\ntime.sleep(0.3)\nresult = [started, time.time()]"


async def test_concurrent_calls_on_one_notebook_run_one_at_a_time_across_replicas(cluster):
    async def one(i: int) -> dict[str, Any]:
        async with Client(f"{cluster.url}/mcp", auth="tok-alice", timeout=120) as client:
            return await call(client, "run_python", {"code": f"# slow {i}\n{SLOW}"})

    before = cluster.requests_per_replica()
    outs = await asyncio.gather(*(one(i) for i in range(6)))
    after = cluster.requests_per_replica()
    assert sum(1 for r in after if after[r] > before.get(r, 0)) >= 2  # several replicas answered
    assert all(o["ok"] for o in outs), outs
    spans = sorted(tuple(o["result"]) for o in outs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end  # never two at once on one notebook, whichever replica
    async with Client(f"{cluster.url}/mcp", auth="tok-alice") as alice:
        exported = await call(alice, "export_notebook", {})
    nb = nbformat.reads(download(cluster, exported["url"], "tok-alice").text, as_version=4)
    slow = [c.source for c in nb.cells if c.cell_type == "code" and "# slow " in c.source]
    recorded = [int(src.split("# slow ", 1)[1].split("\n", 1)[0]) for src in slow]
    ran = sorted(range(6), key=lambda i: outs[i]["result"][0])
    assert recorded == ran  # cells in the order the calls ran


async def test_a_person_signed_in_through_one_replica_sees_every_call_on_every_replica(cluster):
    """The page's sessions and what calls showed are shared state, like the transcript."""
    async with Client(f"{cluster.url}/mcp", auth="tok-alice") as alice:
        handle = (await call(alice, "run_python", {"code": "result = 6 * 7"}))["notebook"]
        await call(alice, "run_python", {"code": "print('from another replica')"})
    before = cluster.requests_per_replica()
    served: dict[str, int] = {}
    with httpx2.Client(base_url=cluster.url) as browser:
        signin = browser.post("/signin", data={"token": "tok-alice"}, follow_redirects=False)
        assert signin.status_code == 303, signin.text
        # Round robin, until every replica in rotation has served the page (an earlier test
        # SIGKILLed one; on a loaded machine one may also miss a readiness check for a while).
        alive = {n for n, status in cluster.server_status().items() if status.startswith("UP")}
        assert len(alive) >= 2, cluster.server_status()
        deadline = time.monotonic() + 90
        while not alive <= set(served):
            assert time.monotonic() < deadline, served
            page = browser.get(f"/notebooks/{handle}")
            assert page.status_code == 200, page.text
            assert '<span class="label">result</span><pre>42</pre>' in page.text
            assert "from another replica" in page.text
            now = cluster.requests_per_replica()
            served = {n: c - before.get(n, 0) for n, c in now.items() if c > before.get(n, 0)}
