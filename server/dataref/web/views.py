"""The page's routes. Read-only apart from sign-out, dropping an artifact, resetting a kernel.

Every route checks the session cookie itself (custom routes are not behind the MCP auth
layer); every POST also needs the session's CSRF token and a same-origin request. Anything
of another owner answers exactly like something missing: the same 404 page.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..errors import DatarefError, NotFound
from . import lineage, render
from .page import Page
from .sessions import COOKIE, Session

Handler = Callable[[Request], Awaitable[Response]]
ASSETS = {"page.js": "text/javascript", "page.css": "text/css", "favicon.svg": "image/svg+xml"}
DOWNLOADS = {"csv", "parquet", "png"}


def routes(page: Page) -> list[Route]:
    """(path, methods, handler) of every page route, for FastMCP or a plain Starlette app."""
    signed = _signed_in_only(page)
    return [
        Route("/", _home(page), methods=["GET"]),
        Route("/signin", _signin(page), methods=["POST"]),
        Route("/signout", signed(_signout(page), post=True), methods=["POST"]),
        Route("/notebooks/default", signed(_default_notebook(page)), methods=["GET"]),
        Route("/notebooks/{handle}", signed(_notebook(page)), methods=["GET"]),
        Route("/notebooks/{handle}/events", signed(_events(page)), methods=["GET"]),
        Route("/notebooks/{handle}/notebook.ipynb", signed(_ipynb(page)), methods=["GET"]),
        Route("/notebooks/{handle}/reset", signed(_reset(page), post=True), methods=["POST"]),
        Route("/artifacts", signed(_artifacts(page)), methods=["GET"]),
        Route("/artifacts/{ref}/image", signed(_image(page)), methods=["GET"]),
        Route("/artifacts/{ref}/download/{fmt}", signed(_download(page)), methods=["GET"]),
        Route("/artifacts/{ref}/drop", signed(_drop(page), post=True), methods=["POST"]),
        Route("/assets/{name}", _asset, methods=["GET"]),
    ]


SessionHandler = Callable[[Request, Session], Awaitable[Response]]


def _handle(request: Request) -> str:
    """The notebook handle in the path; "new" or "" (which the core would create) are not."""
    handle = request.path_params["handle"]
    if not handle.startswith("nb_"):
        raise NotFound("unknown notebook")
    return handle


def _signed_in_only(page: Page) -> Callable[..., Handler]:
    def wrap(handler: SessionHandler, *, post: bool = False) -> Handler:
        async def checked(request: Request) -> Response:
            session = page.session(request)
            if session is None:
                if request.method == "GET" and not request.url.path.endswith("/events"):
                    return page.redirect("/")
                return page.refused("sign in first", 401)
            if post:
                form = await request.form()
                if not page.same_origin(request) or not session.csrf_ok(form.get("csrf")):
                    return page.refused("this form is stale or came from elsewhere - reload")
            try:
                return await handler(request, session)
            except NotFound:
                return page.not_found(session)
            except DatarefError as exc:
                return page.refused(str(exc), 409, session)

        return checked

    return wrap


def _home(page: Page) -> Handler:
    async def home(request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None and page.mode == "view":  # the URL `dataref view` printed
            owner = await page.check_token(token)
            if owner is None:
                return page.refused("wrong token - open the URL `dataref view` printed", 401)
            return page.signed_in(page.redirect("/"), request, owner)
        session = page.session(request)
        if session is None:
            status = 401 if page.mode == "view" else 200
            return page.html("signin.html", status, session=None, error=None)
        try:
            ws = page.workspace()
        except DatarefError as exc:  # the server is starting or stopping
            return page.refused(str(exc), 503, session)
        notebooks = await asyncio.to_thread(render.notebook_list, ws, session.owner)
        return page.html("home.html", session=session, notebooks=notebooks)

    return home


def _signin(page: Page) -> Handler:
    async def signin(request: Request) -> Response:
        if not page.same_origin(request):
            return page.refused("sign in from this server's own page")
        form = await request.form()
        token = form.get("token")
        owner = await page.check_token(token) if isinstance(token, str) and token else None
        if owner is None:
            error = "that token is not valid here"
            return page.html("signin.html", 401, session=None, error=error)
        return page.signed_in(page.redirect("/"), request, owner)

    return signin


def _signout(page: Page) -> SessionHandler:
    async def signout(request: Request, session: Session) -> Response:
        page.sessions.end(request.cookies.get(COOKIE))
        response = page.redirect("/")
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    return signout


def _default_notebook(page: Page) -> SessionHandler:
    async def default(request: Request, session: Session) -> Response:
        ws = page.workspace()
        handle = await asyncio.to_thread(ws.transcripts.default, session.owner)
        return page.redirect(f"/notebooks/{handle}")

    return default


def _notebook(page: Page) -> SessionHandler:
    async def notebook(request: Request, session: Session) -> Response:
        ws, handle = page.workspace(), _handle(request)
        cells = await asyncio.to_thread(render.notebook_cells, ws, session.owner, handle)
        html = [page.render_cell(c) for c in cells]
        can_reset = ws.pool is not None
        return page.html(
            "notebook.html", session=session, handle=handle, cells=html, can_reset=can_reset
        )

    return notebook


def _events(page: Page) -> SessionHandler:
    async def events(request: Request, session: Session) -> Response:
        from sse_starlette import EventSourceResponse

        from .live import cell_events

        ws, handle = page.workspace(), _handle(request)
        await asyncio.to_thread(ws.transcripts.resolve, session.owner, handle)  # 404 first
        stream = cell_events(page.changes, page.workspace, session.owner, handle, page.render_cell)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return EventSourceResponse(stream, ping=15, headers=headers)

    return events


def _reset(page: Page) -> SessionHandler:
    async def reset(request: Request, session: Session) -> Response:
        from ..compute import reset_kernel

        ws, handle = page.workspace(), _handle(request)
        await asyncio.to_thread(ws.transcripts.resolve, session.owner, handle)  # 404 first
        if ws.pool is None:
            raise DatarefError("the kernel runs in another process - reset it from the agent")
        await reset_kernel(ws, session.owner, handle)
        return page.redirect(f"/notebooks/{handle}")

    return reset


def _artifacts(page: Page) -> SessionHandler:
    async def artifacts(request: Request, session: Session) -> Response:
        ws = page.workspace()
        arts = await asyncio.to_thread(render.artifact_list, ws, session.owner)
        graph = lineage.build(arts)
        return page.html("artifacts.html", session=session, artifacts=arts, graph=graph)

    return artifacts


def _drop(page: Page) -> SessionHandler:
    async def drop(request: Request, session: Session) -> Response:
        ws = page.workspace()
        await asyncio.to_thread(ws.drop_artifact, session.owner, request.path_params["ref"])
        return page.redirect("/artifacts")

    return drop


def _image(page: Page) -> SessionHandler:
    async def image(request: Request, session: Session) -> Response:
        ws, ref = page.workspace(), request.path_params["ref"]
        art = await asyncio.to_thread(ws.store.get, session.owner, ref, kind="chart")
        headers = {"Cache-Control": "private, max-age=3600", "X-Content-Type-Options": "nosniff"}
        return FileResponse(art.path, media_type="image/png", headers=headers)

    return image


def _download(page: Page) -> SessionHandler:
    async def download(request: Request, session: Session) -> Response:
        from .downloads import artifact_link

        fmt = request.path_params["fmt"]
        if fmt not in DOWNLOADS:
            raise NotFound("unknown format")
        ws, ref = page.workspace(), request.path_params["ref"]
        token = await asyncio.to_thread(artifact_link, ws, session.owner, ref, fmt)
        return await _serve_link(page, session, token)

    return download


def _ipynb(page: Page) -> SessionHandler:
    async def ipynb(request: Request, session: Session) -> Response:
        from .downloads import notebook_link

        ws, handle = page.workspace(), _handle(request)
        token = await asyncio.to_thread(notebook_link, ws, session.owner, handle)
        return await _serve_link(page, session, token)

    return ipynb


async def _serve_link(page: Page, session: Session, token: str) -> Response:
    """The file behind a download link, looked up as the session's owner."""
    from ..consumers import open_download

    path, link = await asyncio.to_thread(open_download, page.workspace(), session.owner, token)
    return FileResponse(
        path,
        media_type=link.media_type,
        filename=link.filename,
        content_disposition_type="inline" if link.kind == "chart" else "attachment",
        headers={"Cache-Control": "private, no-store", "X-Content-Type-Options": "nosniff"},
    )


async def _asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS:
        return PlainTextResponse("not found", status_code=404)
    body = (resources.files("dataref.web") / "static" / name).read_bytes()
    return Response(body, media_type=ASSETS[name], headers={"Cache-Control": "max-age=300"})
