"""Consumers: charts and exports by reference, straight from the store to a person."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .workspace import Workspace

MAX_KERNEL_FIGURE_BYTES = 2 * 1024 * 1024


def store_kernel_figure(
    ws: Workspace, owner: str, path: Path, lineage: dict[str, Any], sensitive: bool
) -> dict[str, Any] | None:
    """Store a PNG a kernel saved (untrusted: no links, bounded size) as a chart artifact."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_KERNEL_FIGURE_BYTES:
            return None
        data = os.read(fd, info.st_size)
    finally:
        os.close(fd)
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    art = ws.store.put_bytes(
        owner,
        data,
        kind="chart",
        media_type="image/png",
        suffix=".png",
        lineage={**lineage, "figure": path.name},
        sensitive=sensitive,
    )
    return {"chartRef": art.ref, "bytes": art.bytes}
