"""run_python through a real MCP client: the article's session, caps, faults, owners."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator

import pandas as pd
import psutil
import pytest
import pytest_asyncio
from fastmcp import Client
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tests import asgi_server

from dataref.app import create_app
from dataref.artifact import frame_to_table
from dataref.kernels.uids import processes
from dataref.producers import ProducerContext, registry
from dataref.walkthrough import QOQ_CODE

from .conftest import BACKENDS, backend_settings, make_settings
from .kernel_support import require_bwrap

pytestmark = pytest.mark.asyncio(loop_scope="module")

QOQ = QOQ_CODE  # the article's code, verbatim


@pytest.fixture(scope="module", params=BACKENDS)
def settings(request, tmp_path_factory):
    """Every test of this set runs on local kernels and on kernels of each gateway."""
    require_bwrap()
    return backend_settings(
        request,
        tmp_path_factory.mktemp("compute"),
        request.param,
        kernels={"warm_spares": 1, "uid_base": 63000, "uid_count": 50},
        compute={"interrupt_grace_seconds": 1, "progress_interval_seconds": 0.3},
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(settings) -> AsyncIterator[Client]:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Client(create_app(settings, "memory"), progress_handler=on_progress) as c:
        c.progress_seen = progress
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sales_ref(client) -> str:
    desc = (await client.call_tool("fetch_sales", {"since": "2025-01-01"})).structured_content
    return desc["dataRef"]


async def call(client: Client, code: str, **kwargs) -> dict:
    result = await client.call_tool("run_python", {"code": code, **kwargs})
    return result.structured_content


def local_sales(settings) -> pd.DataFrame:
    """The same rows, computed outside the server, as the kernel sees them (via Arrow)."""
    ctx = ProducerContext(owner=settings.owner or "x", settings=settings)
    frame = registry.get("fetch_sales").run(ctx, {"since": "2025-01-01"})
    return frame_to_table(frame).to_pandas()


async def test_the_articles_session_matches_pandas_outside_the_server(client, sales_ref, settings):
    first = await call(client, QOQ, inputs={"sales": sales_ref})
    assert first["ok"] and first["error"] is None
    sales = local_sales(settings)
    q = sales.assign(q=sales.date.dt.to_period("Q"))
    pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")
    delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()
    assert first["result"] == delta.head(5).round(2).to_dict()
    qoq = first["outputs"]["qoq"]
    assert qoq["rows"] == len(delta) and qoq["columns"] == {"line": "str", "delta": "float64"}
    assert len(qoq["sample"]) <= 3
    assert first["notebook"].startswith("nb_")
    wire = len(json.dumps(first, separators=(",", ":")))
    assert wire < 1500

    chained = await call(
        client,
        "worst = qoq.nsmallest(3, 'delta')\nresult = {'worst': worst.line.tolist(), "
        "'total_drop': round(float(qoq[qoq.delta < 0].delta.sum()), 2)}",
        inputs={"qoq": qoq["dataRef"]},
    )
    assert chained["ok"]
    assert chained["result"]["worst"] == delta.head(3).index.tolist()
    assert chained["result"]["total_drop"] == round(float(delta[delta < 0].sum()), 2)


async def test_variables_persist_in_a_notebook(client):
    await call(client, "counter = 41")
    assert (await call(client, "counter += 1\nresult = counter"))["result"] == 42


async def test_an_input_already_bound_to_the_same_ref_is_not_reloaded(client, sales_ref):
    await call(client, "sales.attrs['marker'] = 'kept'", inputs={"sales": sales_ref})
    again = await call(client, "result = sales.attrs.get('marker')", inputs={"sales": sales_ref})
    assert again["result"] == "kept"


async def test_printing_a_megabyte_is_truncated_with_a_note(client):
    out = await call(client, "print('x' * 1_000_000)")
    assert out["ok"]
    assert len(out["stdout"]) < 2300
    assert "truncated" in out["stdout"] and "print less" in out["stdout"]


async def test_a_million_element_result_is_withheld_with_its_size_and_a_hint(client):
    out = await call(client, "result = list(range(1_000_000))")
    assert out["result"] is None
    note = " ".join([*out.get("notes", []), out.get("error") or ""])
    assert "cap" in note and ("outputs" in note or "fewer" in note)
    assert len(json.dumps(out)) < 2000


async def test_a_dataframe_as_result_gets_an_error_pointing_to_outputs(client, sales_ref):
    out = await call(client, "result = sales.head()", inputs={"sales": sales_ref})
    assert out["result"] is None
    assert "outputs" in json.dumps(out)
    assert len(json.dumps(out)) < 2000


async def test_numpy_and_pandas_scalars_become_json(client):
    out = await call(
        client,
        "import numpy as np, pandas as pd\n"
        "result = {'i': np.int64(3), 'f': np.float32(0.5), 'nan': float('nan'), "
        "'t': pd.Timestamp('2025-03-01'), 'b': np.bool_(True)}",
    )
    assert out["result"] == {"i": 3, "f": 0.5, "nan": None, "t": "2025-03-01", "b": True} or (
        out["result"]["t"].startswith("2025-03-01")
    )


async def test_bad_input_names_and_unknown_refs_are_refused_with_a_hint(client, sales_ref):
    for name, hint in [("2x", "identifier"), ("outputs", "reserved"), ("class", "identifier")]:
        with pytest.raises(ToolError, match=hint):
            await call(client, "pass", inputs={name: sales_ref})
    with pytest.raises(ToolError, match="fetch the data again"):
        await call(client, "pass", inputs={"s": "data_AAAAAAAAAAAAAAAAAAAAAA"})


async def test_a_traceback_shows_only_the_agents_frames(client):
    out = await call(
        client, "import pandas as pd\n\ndef f():\n    return pd.DataFrame()['nope']\nf()"
    )
    assert not out["ok"]
    assert "KeyError" in out["error"] and "Cell In[" in out["error"]
    assert "site-packages" not in out["error"]


async def test_an_infinite_loop_times_out_and_the_next_call_works(client):
    started = time.monotonic()
    out = await call(client, "while True: pass", timeout_s=2)
    assert time.monotonic() - started < 8
    assert not out["ok"] and "timed out" in out["error"]
    assert (await call(client, "result = 'alive'"))["result"] == "alive"


@pytest.mark.parametrize(
    "crash", ["import os; os._exit(1)", "import ctypes; ctypes.string_at(0)"], ids=["exit", "segv"]
)
async def test_a_crash_says_variables_are_gone_and_artifacts_are_kept(client, sales_ref, crash):
    await call(client, "doomed = 1")
    started = time.monotonic()
    out = await call(client, crash)
    assert time.monotonic() - started < 10
    assert not out["ok"] and "variables" in out["error"] and "artifacts" in out["error"]
    after = await call(
        client, "result = [len(sales), 'doomed' in dir()]", inputs={"sales": sales_ref}
    )
    assert after["result"][0] > 40_000 and after["result"][1] is False


async def test_a_kernel_killed_from_outside_is_reported_cleanly(client, sales_ref):
    uid = (await call(client, "import os\nkept = 1\nresult = os.getuid()"))["result"]
    running = asyncio.ensure_future(call(client, "import time\ntime.sleep(60)", timeout_s=120))
    await asyncio.sleep(1.5)
    assert not running.done()
    started = time.monotonic()
    if os.geteuid() == 0:  # uid mode (or a gateway's): the kernel's own host uid
        victims = [pid for pid, owner in processes() if owner == uid]
    else:  # userns mode: uid 1000 inside is this user outside; its kernels are our children
        victims = [
            p.pid
            for p in psutil.Process().children(recursive=True)
            if "ipykernel" in " ".join(p.cmdline()) and "python" in p.cmdline()[0]
        ]
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    out = await asyncio.wait_for(running, 30)
    assert time.monotonic() - started < 15
    assert not out["ok"] and "variables are gone" in out["error"]
    assert "artifacts are kept" in out["error"]
    after = await call(client, "result = ['kept' in dir(), len(s)]", inputs={"s": sales_ref})
    assert after["result"][0] is False and after["result"][1] > 40_000


async def test_a_long_call_sends_progress_notifications(client):
    client.progress_seen.clear()
    out = await call(client, "import time; time.sleep(1.5); result = 1")
    assert out["result"] == 1
    assert len(client.progress_seen) >= 2


async def test_reset_kernel_clears_variables_but_keeps_artifacts(client, sales_ref):
    await call(client, "keep_me = 1")
    reset = (await client.call_tool("reset_kernel", {})).structured_content
    assert reset["ok"]
    out = await call(client, "result = ['keep_me' in dir(), len(s)]", inputs={"s": sales_ref})
    assert out["result"][0] is False and out["result"][1] > 40_000


async def test_a_new_notebook_has_its_own_kernel(client):
    await call(client, "mine = 'default'")
    other = await call(client, "result = 'mine' in dir()", notebook="new")
    assert other["notebook"] != (await call(client, "pass"))["notebook"]
    assert other["result"] is False
    with pytest.raises(ToolError, match="omit `notebook`"):
        await call(client, "pass", notebook="nb_doesnotexist")


async def test_an_output_of_a_sensitive_input_is_sensitive(tmp_path):
    require_bwrap()
    settings = make_settings(
        tmp_path, demo={"sensitive": True}, kernels={"uid_base": 63100, "uid_count": 20}
    )
    async with Client(create_app(settings, "memory")) as c:
        ref = (await c.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
        out = await call(c, "outputs['top'] = s.head(10)", inputs={"s": ref["dataRef"]})
        assert out["outputs"]["top"]["rows"] == 10 and out["outputs"]["top"]["sample"] == []


async def test_two_owners_run_concurrently_and_cannot_use_each_others_refs(tmp_path):
    require_bwrap()
    settings = make_settings(
        tmp_path,
        auth={"tokens": {"tok-a": "alice", "tok-b": "bob"}},
        kernels={"warm_spares": 2, "uid_base": 63200, "uid_count": 20},
    )
    async with (
        asgi_server(create_app(settings, "http")) as server,
        server.client(auth="tok-a") as alice,
        server.client(auth="tok-b") as bob,
    ):
        ref = (await alice.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
        await asyncio.gather(call(alice, "pass"), call(bob, "pass"))  # warm both kernels
        started = time.monotonic()
        a, b = await asyncio.gather(
            call(alice, "import time; time.sleep(1.5); result = 'a'"),
            call(bob, "import time; time.sleep(1.5); result = 'b'"),
        )
        assert (a["result"], b["result"]) == ("a", "b")
        assert time.monotonic() - started < 2.9
        with pytest.raises(ToolError, match="fetch the data again"):
            await call(bob, "pass", inputs={"s": ref["dataRef"]})
