"""The page for people: sign-in for a cookie, CSRF on every change, nothing of another owner.

The HTTP server's own app (``create_app(..., "http")``) through Starlette's TestClient; the
state is made beforehand through a second Workspace on the same state dir, as another server
process would. The live feed is driven directly (TestClient buffers whole responses).
"""

from __future__ import annotations

import asyncio
import io
import re
import time
from pathlib import Path

import nbformat
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from dataref import consumers
from dataref.app import create_app
from dataref.transcript import Transcripts, record_run_python
from dataref.web.live import Changes, cell_events
from dataref.web.sessions import COOKIE
from dataref.web.standalone import lab_command, view_app
from dataref.workspace import Workspace

from .conftest import make_settings

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
SHOWN_CODE = 'print("hi <b>")\nresult = {"answer": 42}'


def populate(settings) -> dict[str, str]:
    """alice: fetch -> chart and a run_python cell (recorded as compute records it); bob: fetch."""
    ws = Workspace(settings)
    try:
        sales = ws.produce("alice", "fetch_sales", {"since": "2025-10-01"}, None)
        chart = consumers.render_chart(
            ws, "alice", data_ref=sales["dataRef"], x="region", y="revenue", kind="bar"
        )
        handle = ws.transcripts.default("alice")
        response = {"ok": True, "result": {"answer": 42}, "stdout": "hi <b>\n", "error": None}
        ws.shown.add("alice", handle, SHOWN_CODE, {**response, "outputs": {}})
        record_run_python(
            ws.transcripts, "alice", handle, code=SHOWN_CODE, inputs={},
            response={**response, "outputs": {}}, elapsed_s=0.1,
        )  # fmt: skip
        bob = ws.produce("bob", "fetch_sales", {"since": "2025-12-01"}, None)
        return {
            "sales": sales["dataRef"],
            "chart": chart.info["chartRef"],
            "notebook": handle,
            "bob_sales": bob["dataRef"],
            "bob_notebook": ws.transcripts.default("bob"),
        }
    finally:
        asyncio.run(ws.close())


@pytest.fixture
def state(tmp_path):
    settings = make_settings(tmp_path / "state", auth={"tokens": TOKENS})
    return settings, populate(settings)


@pytest.fixture
def server(state):
    settings, refs = state
    app = create_app(settings, "http", kernels=False).http_app(path="/mcp")
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        yield client, refs


def sign_in(client: TestClient, token: str) -> str:
    """Sign in; returns the CSRF token of the new session (the cookie stays in the client)."""
    response = client.post("/signin", data={"token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return csrf_of(client)


def csrf_of(client: TestClient) -> str:
    page = client.get("/").text
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def as_other(client: TestClient, token: str) -> TestClient:
    other = TestClient(client.app, base_url=str(client.base_url))
    sign_in(other, token)
    return other


def test_the_sign_in_page_is_served_without_a_session(server):
    client, _ = server
    page = client.get("/")
    assert page.status_code == 200
    assert 'action="/signin"' in page.text and 'name="token"' in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_a_valid_token_is_exchanged_for_an_httponly_strict_cookie(server):
    client, refs = server
    response = client.post("/signin", data={"token": "tok-alice"}, follow_redirects=False)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "tok-alice" not in cookie
    home = client.get("/")
    assert refs["notebook"] in home.text and refs["bob_notebook"] not in home.text


def test_a_wrong_token_is_refused_without_a_cookie(server):
    client, _ = server
    response = client.post("/signin", data={"token": "tok-nobody"}, follow_redirects=False)
    assert response.status_code == 401
    assert "set-cookie" not in response.headers
    assert "not valid" in response.text


def test_pages_without_a_session_send_the_browser_to_sign_in(server):
    client, refs = server
    pages = (f"/notebooks/{refs['notebook']}", "/artifacts", f"/artifacts/{refs['chart']}/image")
    for path in pages:
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/"
    assert client.get(f"/notebooks/{refs['notebook']}/events").status_code == 401
    assert client.post(f"/artifacts/{refs['sales']}/drop", data={}).status_code == 401


def test_a_notebook_shows_its_cells_what_the_call_showed_and_the_chart(server):
    client, refs = server
    sign_in(client, "tok-alice")
    page = client.get(f"/notebooks/{refs['notebook']}")
    assert page.status_code == 200
    tools = re.findall(r'data-tool="([^"]+)"', page.text)
    assert tools == ["intro", "setup", "fetch_sales", "render_chart", "run_python"]
    assert f'src="/artifacts/{refs["chart"]}/image"' in page.text
    assert "&#34;answer&#34;: 42" in page.text or "&quot;answer&quot;: 42" in page.text
    assert "hi &lt;b&gt;" in page.text and "<b>\n" not in page.text  # escaped, not markup
    image = client.get(f"/artifacts/{refs['chart']}/image")
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")


def not_found_pages(
    client: TestClient, refs: dict[str, str], csrf: str
) -> list[tuple[str, int, str]]:
    """(what, status, body) of every page route aimed at alice's notebook and artifacts."""
    nb, sales, chart = refs["notebook"], refs["sales"], refs["chart"]
    gets = [
        f"/notebooks/{nb}", f"/notebooks/{nb}/events", f"/notebooks/{nb}/notebook.ipynb",
        f"/artifacts/{chart}/image", f"/artifacts/{sales}/download/csv",
        f"/artifacts/{chart}/download/png",
    ]  # fmt: skip
    out = [(p, *_status_body(client.get(p))) for p in gets]
    for path in (f"/artifacts/{sales}/drop", f"/notebooks/{nb}/reset"):
        out.append((path, *_status_body(client.post(path, data={"csrf": csrf}))))
    return out


def _status_body(response) -> tuple[int, str]:
    return response.status_code, response.text


def test_another_owners_notebook_and_artifacts_are_404_identical_to_missing_ones(server):
    client, refs = server
    bob = as_other(client, "tok-bob")
    csrf = csrf_of(bob)
    missing = {
        "notebook": "nb_" + "x" * 22, "sales": "data_" + "x" * 22, "chart": "chart_" + "x" * 22,
    }  # fmt: skip
    foreign = not_found_pages(bob, refs, csrf)
    absent = not_found_pages(bob, missing, csrf)
    assert [s for _, s, _ in foreign] == [404] * len(foreign), foreign
    assert [body for *_, body in foreign] == [body for *_, body in absent]
    sign_in(client, "tok-alice")  # still there for alice
    assert client.get(f"/artifacts/{refs['sales']}/download/csv").status_code == 200


def test_a_notebook_url_never_creates_a_notebook(server):
    client, _ = server
    csrf = sign_in(client, "tok-bob")
    before = client.get("/").text.count("/notebooks/nb_")
    for path in ("/notebooks/new", "/notebooks/new/events", "/notebooks/new/notebook.ipynb"):
        assert client.get(path).status_code == 404, path
    assert client.post("/notebooks/new/reset", data={"csrf": csrf}).status_code == 404
    assert client.get("/").text.count("/notebooks/nb_") == before


def test_a_state_changing_request_without_the_csrf_token_is_refused(server):
    client, refs = server
    csrf = sign_in(client, "tok-alice")
    drop = f"/artifacts/{refs['sales']}/drop"
    assert client.post(drop, data={}).status_code == 403
    assert client.post(drop, data={"csrf": "forged"}).status_code == 403
    bob_csrf = csrf_of(as_other(client, "tok-bob"))
    assert client.post(drop, data={"csrf": bob_csrf}).status_code == 403  # another session's
    assert client.post("/signout", data={}).status_code == 403
    assert client.get(f"/artifacts/{refs['sales']}/download/csv").status_code == 200  # kept
    dropped = client.post(drop, data={"csrf": csrf}, follow_redirects=False)
    assert dropped.status_code == 303
    assert client.get(f"/artifacts/{refs['sales']}/download/csv").status_code == 404


def test_a_cross_site_post_is_refused_even_with_the_csrf_token(server):
    client, refs = server
    csrf = sign_in(client, "tok-alice")
    evil = {"origin": "http://evil.example"}
    drop = f"/artifacts/{refs['sales']}/drop"
    assert client.post(drop, data={"csrf": csrf}, headers=evil).status_code == 403
    signin = client.post("/signin", data={"token": "tok-bob"}, headers=evil)
    assert signin.status_code == 403


def test_sign_out_ends_the_session_on_the_server(server):
    client, _ = server
    csrf = sign_in(client, "tok-alice")
    stolen = client.cookies[COOKIE]
    out = client.post("/signout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303 and f'{COOKIE}=""' in out.headers["set-cookie"]
    replay = TestClient(client.app, base_url=str(client.base_url), cookies={COOKIE: stolen})
    assert replay.get("/artifacts", follow_redirects=False).status_code == 303


def test_downloads_are_served_through_owner_checked_links(server, state):
    client, refs = server
    sign_in(client, "tok-alice")
    csv = client.get(f"/artifacts/{refs['sales']}/download/csv")
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    assert csv.text.startswith('"date","line","region","units","price","revenue"')
    assert "attachment" in csv.headers["content-disposition"]
    parquet = client.get(f"/artifacts/{refs['sales']}/download/parquet")
    assert pq.read_table(io.BytesIO(parquet.content)).num_rows == csv.text.count("\n") - 1
    png = client.get(f"/artifacts/{refs['chart']}/download/png")
    assert png.content.startswith(b"\x89PNG")
    ipynb = nbformat.reads(client.get(f"/notebooks/{refs['notebook']}/notebook.ipynb").text, 4)
    nbformat.validate(ipynb)
    assert all(not c.get("outputs") for c in ipynb.cells)
    assert "answer" not in nbformat.writes(ipynb).split('"source"')[0]  # no result kept
    links = Path(state[0].state_dir) / "exports" / "links.sqlite"
    assert links.is_file()  # the same link index the export tools use


def test_the_lineage_graph_draws_fetch_then_chart(server):
    client, refs = server
    sign_in(client, "tok-alice")
    page = client.get("/artifacts").text
    edges = set(re.findall(r'data-source="([^"]+)" data-target="([^"]+)"', page))
    call = f"call:{refs['chart']}"
    assert (f"call:{refs['sales']}", refs["sales"]) in edges
    assert (refs["sales"], call) in edges and (call, refs["chart"]) in edges
    assert refs["bob_sales"] not in page
    assert re.search(r"[\d,]+ rows × 6 columns", page)


async def test_a_cell_written_by_another_process_reaches_the_feed_within_a_second(state):
    settings, refs = state
    ws = Workspace(settings)  # the page's workspace
    writer = Transcripts(settings.state_dir / "notebooks")  # a stdio server's, elsewhere
    try:
        events = cell_events(Changes(), lambda: ws, "alice", refs["notebook"], lambda c: str(c))
        assert (await anext(events))["event"] == "ready"
        first = [await anext(events) for _ in range(5)]
        assert [e["event"] for e in first] == ["cell"] * 5
        started = time.monotonic()
        writer.append("alice", refs["notebook"], nbformat.v4.new_markdown_cell("later"))
        # A restarted writer notes the restart first: cells 5 (the note) and 6 ("later").
        arrived = [await asyncio.wait_for(anext(events), 2) for _ in range(2)]
        assert time.monotonic() - started < 1.0
        assert '"index": 6' in arrived[1]["data"] and "later" in arrived[1]["data"]
        await events.aclose()
    finally:
        writer.close()
        await ws.close()


async def test_an_append_in_this_process_wakes_the_feed_at_once(state):
    settings, refs = state
    ws, changes = Workspace(settings), Changes()
    changes.attach(ws)
    try:
        events = cell_events(changes, lambda: ws, "alice", refs["notebook"], lambda c: str(c))
        for _ in range(6):
            await anext(events)
        started = time.monotonic()
        await asyncio.to_thread(
            ws.transcripts.append, "alice", refs["notebook"], nbformat.v4.new_markdown_cell("now")
        )
        await asyncio.wait_for(anext(events), 2)
        assert time.monotonic() - started < 0.2  # woken, not polled
        await events.aclose()
    finally:
        await ws.close()


def test_a_jwt_from_the_configured_issuer_signs_in_as_its_subject(tmp_path):
    from fastmcp.server.auth.providers.jwt import RSAKeyPair

    keys, issuer, audience = RSAKeyPair.generate(), "https://issuer.example", "dataref"
    auth = {"public_key": keys.public_key, "issuer": issuer, "audience": audience}
    settings = make_settings(tmp_path / "state", auth=auth)
    app = create_app(settings, "http", kernels=False).http_app(path="/mcp")
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        wrong = keys.create_token(subject="carol", issuer=issuer, audience="other")
        assert client.post("/signin", data={"token": wrong}).status_code == 401
        sign_in(client, keys.create_token(subject="carol", issuer=issuer, audience=audience))
        assert '<span class="who">carol</span>' in client.get("/").text


def test_dataref_view_refuses_requests_without_its_token(state):
    settings, refs = state
    settings = settings.model_copy(update={"owner": "alice"})
    with TestClient(view_app(settings, "view-token"), base_url="http://127.0.0.1:9") as client:
        assert client.get("/").status_code == 401
        assert client.get("/?token=wrong").status_code == 401
        page = f"/notebooks/{refs['notebook']}"
        assert client.get(page, follow_redirects=False).status_code == 303
        assert client.post("/signin", data={"token": "tok-alice"}).status_code == 401
        entered = client.get("/?token=view-token", follow_redirects=False)
        assert entered.status_code == 303 and entered.headers["location"] == "/"
        assert client.get(page).status_code == 200
        assert client.get(f"/notebooks/{refs['bob_notebook']}").status_code == 404
    with TestClient(view_app(settings, "t"), base_url="http://evil.example") as client:
        assert client.get("/?token=t").status_code == 400  # a foreign Host: DNS rebinding


def test_dataref_lab_exports_the_notebook_and_opens_jupyterlab_on_it(state, tmp_path):
    settings, refs = state
    settings = settings.model_copy(update={"owner": "alice"})
    path, argv = lab_command(settings, None, tmp_path, ["--no-browser"])
    assert path == tmp_path / f"{refs['notebook']}.ipynb"
    nbformat.validate(nbformat.read(path, 4))
    assert Path(argv[0]).name == "jupyter" and argv[1] == "lab"
    assert argv[-2:] == ["--no-browser", path.name]


def test_what_a_call_showed_is_never_attached_to_another_cell(tmp_path):
    from dataref.web.render import notebook_cells

    ws = Workspace(make_settings(tmp_path / "state"))
    try:
        handle = ws.transcripts.default("alice")
        ok = {"ok": True, "error": None, "outputs": {}, "stdout": ""}
        for code, kept in (("a = 1", False), ("result = 2", True)):
            if kept:  # the first call's row is missing (say the disk was full then)
                ws.shown.add("alice", handle, code, {**ok, "result": 2})
            record_run_python(
                ws.transcripts, "alice", handle, code=code, inputs={}, response=ok, elapsed_s=0
            )
        cells = [c for c in notebook_cells(ws, "alice", handle) if c["tool"] == "run_python"]
        assert "shown" not in cells[0]
        assert cells[1]["shown"]["result"] == "2"
        assert ws.shown.of_notebook("bob", handle) == []
    finally:
        asyncio.run(ws.close())
