"""The page's context: who signs in how, its sessions, templates, and the common responses.

The same routes serve two hosts: ``dataref serve --http`` (sign-in with any bearer token the
server accepts: static tokens or JWTs through the configured verifier) and ``dataref view``
(sign-in with the one token it printed; the owner is the local one, as for a stdio server).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..config import Settings
from .live import Changes
from .sessions import COOKIE, Session, Sessions

if TYPE_CHECKING:
    from ..workspace import Workspace

TokenCheck = Callable[[str], Awaitable[str | None]]  # a token -> its owner, or None

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make form POSTs send Origin: null
    "Cache-Control": "no-store",
}


def templates_dir() -> str:
    return str(resources.files("dataref.web") / "templates")


class Page:
    def __init__(
        self,
        settings: Settings,
        workspace: Callable[[], Workspace],
        check_token: TokenCheck,
        *,
        mode: str = "server",
    ) -> None:
        self.settings = settings
        self._workspace = workspace
        self.check_token = check_token
        self.mode = mode  # "server" | "view"
        self._sessions: Sessions | None = None
        self.changes = Changes()
        self.env = Environment(
            loader=FileSystemLoader(templates_dir()),
            autoescape=select_autoescape(["html", "svg"], default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )

    @property
    def sessions(self) -> Sessions:
        """In the state's page database, so every replica knows every session."""
        if self._sessions is None:
            db = self._workspace().state.page_db
            self._sessions = Sessions(db, self.settings.page.session_ttl_seconds)
        return self._sessions

    def workspace(self) -> Workspace:
        ws = self._workspace()
        self.changes.attach(ws)
        return ws

    # -- sessions --------------------------------------------------------------

    def session(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def signed_in(self, response: Response, request: Request, owner: str) -> Response:
        secure = request.url.scheme == "https"
        response.set_cookie(
            COOKIE,
            self.sessions.create(owner),
            max_age=int(self.sessions.ttl),
            path="/",
            httponly=True,
            samesite="strict",
            secure=secure,
        )
        return response

    def same_origin(self, request: Request) -> bool:
        """A state-changing request from another site is refused whatever it carries."""
        origin = request.headers.get("origin")
        if origin is None or origin == "null":
            return origin is None
        public = self.settings.server.public_url  # behind a TLS proxy: the public origin
        if public and origin == "/".join(public.split("/")[:3]):
            return True
        return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"

    # -- responses -------------------------------------------------------------

    def html(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        body = self.env.get_template(template).render(mode=self.mode, **context)
        return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)

    def render_cell(self, cell: dict[str, Any]) -> str:
        return self.env.get_template("cell.html").render(cell=cell)

    def not_found(self, session: Session | None) -> HTMLResponse:
        """The one answer for missing, expired and foreign things."""
        return self.html(
            "message.html", 404, session=session, title="Not found",
            text="There is nothing here - it may have expired or been dropped.",
        )  # fmt: skip

    def refused(self, text: str, status: int = 403, session: Session | None = None) -> HTMLResponse:
        return self.html("message.html", status, session=session, title="Refused", text=text)

    def redirect(self, url: str) -> RedirectResponse:
        return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)
