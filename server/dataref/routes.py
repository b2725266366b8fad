"""The HTTP and content edges of the tools: download links, images, owned resource reads.

Custom routes are not behind the MCP auth layer, so ``serve_download`` checks the bearer
token and the link's owner itself.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import DatarefError

if TYPE_CHECKING:
    from .app import App

MAX_FIGURE_IMAGES = 4  # run_python figures shown as images; the rest are listed by chartRef


def download_base(app: App) -> str | None:
    """Base URL of download links over HTTP (public_url wins); None elsewhere: paths then."""
    from fastmcp.server.dependencies import get_http_request

    if app.owners.transport != "http":
        return None
    if app.settings.server.public_url:
        return app.settings.server.public_url
    try:
        return str(get_http_request().base_url)
    except RuntimeError:
        return None


def chart_result(info: dict[str, Any], images: list[tuple[str, bytes]]) -> Any:
    """The JSON (structured and as text), then each chart's image and resource link."""
    from fastmcp.tools import ToolResult
    from mcp.types import ImageContent, ResourceLink, TextContent

    content: list[Any] = [TextContent(type="text", text=json.dumps(info, separators=(",", ":")))]
    for ref, png in images:
        data = base64.b64encode(png).decode()
        content.append(ImageContent(type="image", data=data, mime_type="image/png"))
        content.append(
            ResourceLink(
                type="resource_link", uri=f"dataref://charts/{ref}", name=ref, mime_type="image/png"
            )
        )
    return ToolResult(content=content, structured_content=info)


async def with_figures(app: App, owner: str, response: dict[str, Any]) -> Any:
    """run_python's response as is, or with the figures the code drew as images."""
    from .consumers import kernel_charts

    if not response.get("charts"):
        return response
    images = await asyncio.to_thread(
        kernel_charts, app.ws, owner, response["charts"], download_base(app), MAX_FIGURE_IMAGES
    )
    if len(response["charts"]) > len(images):
        response.setdefault("notes", []).append(
            f"images of the first {len(images)} of {len(response['charts'])} figures shown"
        )
    return chart_result(response, images)


async def read_owned(app: App, read: Callable[..., Any], ref: str) -> Any:
    """A resource read as the caller; a foreign ref reads exactly like a missing one."""
    from fastmcp.exceptions import ResourceError

    try:
        return await asyncio.to_thread(read, app.ws, app.owners.current(), ref)
    except DatarefError as exc:
        # Expected (a stale or foreign ref): no traceback in the log, which costs ~90 ms.
        raise ResourceError(str(exc), log_level=logging.DEBUG) from None


async def serve_download(app: App, request: Any) -> Any:
    """GET /download/<token>. Custom routes are not behind the MCP auth layer: check here."""
    from fastmcp.server.dependencies import get_access_token
    from starlette.responses import FileResponse, PlainTextResponse

    from .auth import owner_of_token
    from .consumers import open_download
    from .downloads import LinkExpired

    access = get_access_token()
    if access is None:
        return PlainTextResponse(
            "send Authorization: Bearer <token>",
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    token = request.path_params["token"]
    try:
        path, link = await asyncio.to_thread(open_download, app.ws, owner_of_token(access), token)
    except LinkExpired as exc:
        return PlainTextResponse(str(exc), status_code=410)
    except DatarefError:
        return PlainTextResponse("unknown download link", status_code=404)
    return FileResponse(
        path,
        media_type=link.media_type,
        filename=link.filename,
        content_disposition_type="inline" if link.kind == "chart" else "attachment",
        headers={"Cache-Control": "private, no-store", "X-Content-Type-Options": "nosniff"},
    )
