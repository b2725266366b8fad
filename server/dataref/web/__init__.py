"""The page for people: the owner's notebooks growing live, artifacts and their lineage.

``mount`` adds the routes to the HTTP server; ``dataref view`` serves the same routes over a
stdio server's state dir (``standalone``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .page import Page, TokenCheck

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from ..config import Settings
    from ..workspace import Workspace

__all__ = ["Page", "mount", "server_token_check"]


def server_token_check(settings: Settings) -> TokenCheck:
    """Sign-in over HTTP: a token the server's own verifier accepts (static or JWT)."""
    from ..auth import build_auth, owner_of_token

    verifier = build_auth(settings)

    async def check(token: str) -> str | None:
        if verifier is None or len(token) > 8192:
            return None
        access = await verifier.verify_token(token)
        return owner_of_token(access) if access is not None else None

    return check


def mount(mcp: FastMCP, settings: Settings, workspace: Callable[[], Workspace]) -> Page:
    """Add the page's routes to the HTTP server."""
    from .views import routes

    page = Page(settings, workspace, server_token_check(settings))
    for route in routes(page):
        mcp.custom_route(route.path, methods=sorted(route.methods or []))(route.endpoint)
    return page
