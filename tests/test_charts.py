"""render_chart and run_python figures: small PNGs of stored data, owner-scoped, with notes."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pandas as pd
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tests import asgi_server
from PIL import Image

from dataref import consumers
from dataref.app import create_app
from dataref.charts import KINDS
from dataref.config import local_user
from dataref.errors import InvalidRequest, NotFound

from .conftest import BACKENDS, backend_settings, make_settings
from .kernel_support import require_bwrap

NEVER_ISSUED = "chart_AAAAAAAAAAAAAAAAAAAAAA"


def workspace(mcp):
    """The running Workspace (the lifespan's result): tests put frames in the store directly."""
    return mcp._lifespan_result["workspace"]


def qoq_frame(n: int = 300) -> pd.DataFrame:
    """Like the article's `qoq` output: one delta per product line, many of them negative."""
    rng = np.random.default_rng(7)
    lines = [f"Family {i // 15:02d} Model {i % 15:02d}" for i in range(n)]
    return pd.DataFrame({"line": lines, "delta": rng.normal(-5000, 80000, n).round(2)})


def daily_frame() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    dates = pd.date_range("2025-01-01", "2025-12-31", freq="D")
    return pd.DataFrame({"date": dates, "revenue": rng.gamma(2.0, 40000.0, len(dates))})


@pytest.fixture
async def app(settings):
    mcp = create_app(settings, "memory", kernels=False)
    async with Client(mcp) as client:
        yield client, workspace(mcp), settings


def put(ws, frame: pd.DataFrame, owner: str | None = None) -> str:
    owner = owner or ws.settings.owner or local_user()  # the in-memory owner by default
    return ws.store.put_frame(owner, frame, lineage={"tool": "test"}).ref


def png_of(result) -> bytes:
    images = [b for b in result.content if b.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    return base64.b64decode(images[0].data)


def decoded(png: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(png))
    img.load()
    return img


async def chart(client, **args):
    return await client.call_tool("render_chart", args)


async def test_a_bar_chart_of_the_qoq_table_is_a_small_png_of_the_top_lines(app):
    client, ws, settings = app
    ref = put(ws, qoq_frame())
    result = await chart(client, dataRef=ref, x="line", y="delta", kind="bar")
    info = result.structured_content
    png = png_of(result)
    assert len(png) <= settings.charts.max_png_bytes == 64 * 1024
    assert info["bytes"] == len(png)
    img = decoded(png)
    assert (img.width, img.height) == (settings.charts.width_px, settings.charts.height_px)
    assert "top 30 of 300" in info["note"]
    assert info["chartRef"].startswith("chart_") and set(info) == {
        "chartRef",
        "path",
        "bytes",
        "note",
    }
    # The image shown is the stored chart, also readable as a resource.
    stored = await client.read_resource(f"dataref://charts/{info['chartRef']}")
    assert base64.b64decode(stored[0].blob) == png
    links = [b for b in result.content if b.type == "resource_link"]
    assert [str(link.uri) for link in links] == [f"dataref://charts/{info['chartRef']}"]


async def test_a_line_chart_puts_dates_on_x(app):
    client, ws, settings = app
    ref = put(ws, daily_frame())
    result = await chart(client, dataRef=ref, x="date", y="revenue", kind="line")
    png = png_of(result)
    assert len(png) <= settings.charts.max_png_bytes
    assert decoded(png).width == settings.charts.width_px
    assert "note" not in result.structured_content  # nothing was cut


async def test_a_line_chart_sums_repeated_x_values_and_says_so(app):
    client, ws, _ = app
    frame = pd.concat([daily_frame(), daily_frame()])
    result = await chart(client, dataRef=put(ws, frame), x="date", y="revenue", kind="line")
    assert "summed per date" in result.structured_content["note"]


async def test_a_scatter_of_a_million_rows_is_drawn_from_a_sample_and_says_so(app):
    client, ws, settings = app
    rng = np.random.default_rng(3)
    big = pd.DataFrame({"a": rng.normal(size=1_000_000), "b": rng.normal(size=1_000_000)})
    result = await chart(client, dataRef=put(ws, big), x="a", y="b", kind="scatter")
    assert "20,000 of 1,000,000" in result.structured_content["note"]
    assert len(png_of(result)) <= settings.charts.max_png_bytes


async def test_a_histogram_takes_x_only_and_ignores_y_with_a_note(app):
    client, ws, settings = app
    ref = put(ws, daily_frame())
    plain = await chart(client, dataRef=ref, x="revenue", kind="hist")
    assert "note" not in plain.structured_content
    assert len(png_of(plain)) <= settings.charts.max_png_bytes
    with_y = await chart(client, dataRef=ref, x="revenue", y="date", kind="hist")
    assert "ignored" in with_y.structured_content["note"]


async def test_an_area_chart_over_dates(app):
    client, ws, settings = app
    result = await chart(client, dataRef=put(ws, daily_frame()), x="date", y="revenue", kind="area")
    assert len(png_of(result)) <= settings.charts.max_png_bytes


async def test_a_bar_chart_without_y_counts_rows_per_category(app):
    client, ws, _ = app
    frame = pd.DataFrame({"region": ["North", "South", "North", "East"]})
    result = await chart(client, dataRef=put(ws, frame), x="region")
    assert "count rows" in result.structured_content["note"]
    decoded(png_of(result))


async def test_the_demo_sales_chart_by_line_sums_and_keeps_the_top_categories(app):
    client, _, settings = app
    ref = (await client.call_tool("fetch_sales", {"since": "2025-10-01"})).structured_content[
        "dataRef"
    ]
    result = await chart(client, dataRef=ref, x="line", y="revenue", kind="bar", title="Q4")
    note = result.structured_content["note"]
    assert "revenue summed per line" in note and "top 30 of 300" in note
    assert len(png_of(result)) <= settings.charts.max_png_bytes


async def test_a_bad_column_lists_the_valid_columns(app):
    client, ws, _ = app
    ref = put(ws, qoq_frame())
    with pytest.raises(ToolError) as err:
        await chart(client, dataRef=ref, x="lines", y="delta", kind="bar")
    assert "'lines'" in str(err.value) and "'line', 'delta'" in str(err.value)
    with pytest.raises(ToolError, match="columns: 'line', 'delta'"):
        await chart(client, dataRef=ref, x="line", y="Delta", kind="bar")


async def test_a_bad_kind_lists_the_kinds(app):
    client, ws, _ = app
    ref = put(ws, qoq_frame())
    with pytest.raises(ToolError) as err:
        await chart(client, dataRef=ref, x="line", y="delta", kind="pie")
    for kind in KINDS:
        assert kind in str(err.value)
    # The core refuses it the same way, for callers that skip the schema.
    with pytest.raises(InvalidRequest, match="kinds are: bar, line, scatter, hist, area"):
        consumers.render_chart(ws, "anyone", data_ref=ref, x="line", y="delta", kind="pie")


async def test_a_text_y_is_refused_with_the_reason(app):
    client, ws, _ = app
    frame = pd.DataFrame({"line": ["a", "b"], "region": ["x", "y"]})
    with pytest.raises(ToolError, match=r"'region' is not numeric.*need a numeric y"):
        await chart(client, dataRef=put(ws, frame), x="line", y="region", kind="line")


async def test_an_unknown_dataref_says_how_to_recover(app):
    client, _, _ = app
    with pytest.raises(ToolError, match="fetch the data again"):
        await chart(client, dataRef="data_AAAAAAAAAAAAAAAAAAAAAA", x="a", y="b", kind="bar")


def test_a_chart_that_renders_too_large_is_palette_reduced_under_the_bound(tmp_path):
    from dataref import charts
    from dataref.config import ChartSettings

    rng = np.random.default_rng(5)
    noisy = pd.DataFrame({"t": np.arange(20_000.0), "v": rng.normal(size=20_000).cumsum()})
    tight = ChartSettings(max_png_bytes=16 * 1024, width_px=1600, height_px=900)
    png, _ = charts.render_png(noisy, "t", "v", "line", None, tight)
    assert len(png) <= 16 * 1024
    decoded(png)


def test_an_oversized_kernel_figure_is_shrunk_for_the_agent():
    from dataref.png import shrink_png

    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 255, (900, 1600, 3), dtype=np.uint8))
    buf = io.BytesIO()
    noise.save(buf, format="PNG")
    assert buf.tell() > 1_000_000
    small = shrink_png(buf.getvalue(), 64 * 1024)
    assert len(small) <= 64 * 1024
    assert decoded(small).width < 1600


# -- owners, over the real HTTP app ----------------------------------------------------


async def test_a_chart_is_owner_scoped_through_the_resource_and_the_download(tmp_path):
    settings = make_settings(tmp_path, auth={"tokens": {"tok-alice": "alice", "tok-bob": "bob"}})
    mcp = create_app(settings, "http", kernels=False)
    async with asgi_server(mcp) as srv:
        ref = put(workspace(mcp), qoq_frame(), owner="alice")
        async with srv.client(auth="tok-alice") as alice:
            info = (await chart(alice, dataRef=ref, x="line", y="delta")).structured_content
            own = await alice.read_resource(f"dataref://charts/{info['chartRef']}")
            assert base64.b64decode(own[0].blob).startswith(b"\x89PNG")
        assert info["url"].startswith("http://127.0.0.1/download/") and "path" not in info
        async with srv.http_client() as http:
            mine = await http.get(info["url"], headers={"authorization": "Bearer tok-alice"})
            assert mine.status_code == 200 and mine.headers["content-type"] == "image/png"
            theirs = await http.get(info["url"], headers={"authorization": "Bearer tok-bob"})
            assert theirs.status_code == 404
        async with srv.client(auth="tok-bob") as bob:
            errors = []
            for uri_ref in (info["chartRef"], NEVER_ISSUED):
                with pytest.raises(Exception) as err:
                    await bob.read_resource(f"dataref://charts/{uri_ref}")
                errors.append(str(err.value).replace(uri_ref, "R"))
            assert errors[0] == errors[1] and "unknown or expired" in errors[0]
            with pytest.raises(Exception, match="unknown or expired"):
                await bob.read_resource(f"dataref://artifacts/{ref}")


async def test_the_artifact_resource_gives_the_description_and_hides_other_owners(app):
    client, ws, _ = app
    ref = put(ws, qoq_frame())
    desc = json.loads((await client.read_resource(f"dataref://artifacts/{ref}"))[0].text)
    assert desc["dataRef"] == ref and desc["rows"] == 300
    assert set(desc["columns"]) == {"line", "delta"}
    with pytest.raises(NotFound):
        consumers.artifact_description(ws, "someone-else", ref)


# -- figures drawn inside run_python ------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_figures_drawn_in_run_python_come_back_as_bounded_images_never_as_text(
    request, tmp_path, backend
):
    require_bwrap()
    settings = backend_settings(request, tmp_path, backend)
    code = (
        "import numpy as np, matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [3, 1, 2]); plt.show()\n"
        "fig, ax = plt.subplots(figsize=(16, 10), dpi=150)\n"
        "rng = np.random.default_rng(0)\n"
        "ax.scatter(rng.random(40000), rng.random(40000), c=rng.random(40000))\n"
        "result = 'drawn'\n"
    )
    async with Client(create_app(settings, "memory")) as client:
        plain = await client.call_tool("run_python", {"code": "result = 1"})
        assert [b.type for b in plain.content] == ["text"] and "charts" not in plain.data
        drawn = await client.call_tool("run_python", {"code": code})
    response = drawn.structured_content
    assert response["result"] == "drawn" and len(response["charts"]) == 2
    assert "iVBOR" not in response["stdout"] and "image/png" not in response["stdout"]
    images = [base64.b64decode(b.data) for b in drawn.content if b.type == "image"]
    assert len(images) == 2
    assert all(len(png) <= settings.charts.max_png_bytes for png in images)
    big = response["charts"][1]
    assert big["bytes"] > settings.charts.max_png_bytes  # the stored original stays full size
    assert decoded(images[1]).width < 2400


async def test_charts_drawn_at_the_same_time_are_the_same_as_drawn_one_by_one(app):
    client, ws, _ = app
    qoq, daily = put(ws, qoq_frame()), put(ws, daily_frame())
    calls = [
        {"dataRef": qoq, "x": "line", "y": "delta", "kind": "bar"},
        {"dataRef": daily, "x": "date", "y": "revenue", "kind": "line"},
        {"dataRef": daily, "x": "revenue", "kind": "hist"},
        {"dataRef": daily, "x": "date", "y": "revenue", "kind": "area", "title": "Daily"},
    ] * 2
    one_by_one = [png_of(await client.call_tool("render_chart", c)) for c in calls]
    together = await asyncio.gather(*(client.call_tool("render_chart", c) for c in calls))
    assert [png_of(r) for r in together] == one_by_one


async def test_a_chart_of_sensitive_data_reaches_the_person_but_not_the_model(tmp_path):
    from fastmcp import Client

    from dataref.app import create_app

    from .conftest import make_settings

    settings = make_settings(tmp_path, demo={"sensitive": True})
    async with Client(create_app(settings, "memory", kernels=False)) as c:
        ref = (await c.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
        result = await c.call_tool(
            "render_chart", {"dataRef": ref["dataRef"], "x": "region", "y": "revenue"}
        )
    assert not [b for b in result.content if b.type == "image"]
    info = result.structured_content
    assert info["chartRef"].startswith("chart_") and "path" in info
    assert "not sent to the model" in info["note"]
