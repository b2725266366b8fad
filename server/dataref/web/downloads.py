"""Downloads from the page go through the same owner-checked links the export tools make.

Each click publishes a link for the session's owner (``export_data``, ``export_notebook`` or a
chart link) and the page serves the file behind it with ``open_download``, which checks the
owner and expiry again; the link then expires and is swept like any other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..consumers import chart_link, export_data
from ..notebook_export import export_for_owner

if TYPE_CHECKING:
    from ..workspace import Workspace

_BASE = "page:"  # a base URL is what makes the core publish a link instead of a path


def _token(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def artifact_link(ws: Workspace, owner: str, ref: str, fmt: str) -> str:
    """A download token for a table as CSV/Parquet, or a chart as PNG."""
    if fmt == "png":
        return _token(chart_link(ws, ws.store.get(owner, ref, kind="chart"), _BASE)["url"])
    return _token(export_data(ws, owner, data_ref=ref, fmt=fmt, base_url=_BASE)["url"])


def notebook_link(ws: Workspace, owner: str, handle: str) -> str:
    """A download token for the notebook's data-free .ipynb."""
    handle = ws.transcripts.resolve(owner, handle)
    ttl = ws.settings.server.download_ttl_seconds
    info = export_for_owner(ws.transcripts, ws.downloads, owner, handle, _BASE, ttl)
    return _token(info["url"])
