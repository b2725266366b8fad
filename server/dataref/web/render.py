"""What the page shows: a notebook's cells and an owner's artifacts, as plain dicts.

Pure reads through the core's public methods (``Transcripts.read``, ``ArtifactStore.get`` and
``list``, ``Shown.of_notebook``), so the templates never touch the state themselves.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..errors import NotFound

if TYPE_CHECKING:
    import nbformat

    from ..workspace import Workspace

RESULT_SHOWN_CHARS = 4000


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def notebook_cells(ws: Workspace, owner: str, handle: str) -> list[dict[str, Any]]:
    """Every cell of the owner's notebook (NotFound for another's, as for a missing one)."""
    nb = ws.transcripts.read(owner, handle)
    return cells_of(ws, owner, handle, nb)


def cells_of(
    ws: Workspace, owner: str, handle: str, nb: nbformat.NotebookNode
) -> list[dict[str, Any]]:
    shown = iter(ws.shown.of_notebook(owner, handle))
    pending = next(shown, None)
    cells = []
    for index, cell in enumerate(nb.cells):
        rec = cell.metadata.get("dataref", {})
        view = _cell(ws, owner, index, cell, rec)
        if rec.get("tool") == "run_python" and pending is not None:
            from ..shown import code_hash

            if pending[0] == code_hash(str(rec.get("code", ""))):
                view["shown"] = _shown(pending[1])
                pending = next(shown, None)
        view["version"] = _version(view)
        cells.append(view)
    return cells


def _version(view: dict[str, Any]) -> str:
    """A short digest of what a cell shows: the browser replaces a cell only when it changes."""
    import hashlib

    text = json.dumps(view, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _cell(
    ws: Workspace, owner: str, index: int, cell: nbformat.NotebookNode, rec: dict[str, Any]
) -> dict[str, Any]:
    tool = rec.get("tool") or rec.get("role") or "note"
    view: dict[str, Any] = {
        "index": index,
        "tool": tool,
        "kind": cell.cell_type,
        "source": cell.source,
        "status": rec.get("status", "ok"),
        "error_name": rec.get("error_name"),
        "at": rec.get("at"),
        "elapsed": rec.get("elapsed_s"),
        "refs": [],
        "charts": [],
    }
    if rec.get("ref"):  # a producer's artifact
        view["refs"].append(_ref_summary(ws, owner, rec["ref"]))
    for name, ref in (rec.get("outputs") or {}).items():
        view["refs"].append({**_ref_summary(ws, owner, ref), "name": name})
    if rec.get("chartRef"):
        view["charts"].append(_ref_summary(ws, owner, rec["chartRef"]))
    return view


def _ref_summary(ws: Workspace, owner: str, ref: str) -> dict[str, Any]:
    try:
        art = ws.store.get(owner, ref)
    except NotFound:
        return {"ref": ref, "live": False}
    return {"ref": ref, "live": True, "rows": art.rows, "kind": art.kind}


def _shown(body: dict[str, Any]) -> dict[str, Any]:
    result = body.get("result")
    text = None
    if result is not None:
        text = json.dumps(result, indent=2, ensure_ascii=False, default=str)
        if len(text) > RESULT_SHOWN_CHARS:
            text = text[:RESULT_SHOWN_CHARS] + "\n…"
    return {
        "result": text,
        "stdout": body.get("stdout") or "",
        "error": body.get("error"),
        "notes": body.get("notes") or [],
        "charts": list(body.get("charts") or []),
    }


def notebook_list(ws: Workspace, owner: str) -> list[dict[str, Any]]:
    out = []
    for handle in ws.transcripts.handles(owner):
        nb = ws.transcripts.read(owner, handle)
        calls = [c for c in nb.cells if c.metadata.get("dataref", {}).get("tool")]
        last = next((c.metadata["dataref"].get("at") for c in reversed(calls)), None)
        out.append({"handle": handle, "calls": len(calls), "last": last})
    return out


def _columns(path: Any) -> int | None:
    """Columns of a stored table, from its Arrow schema alone (memory-mapped, no rows read)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            return len(pa.ipc.open_file(source).schema)
    except (OSError, pa.ArrowException):
        return None


def artifact_list(ws: Workspace, owner: str) -> list[dict[str, Any]]:
    out = []
    for art in ws.store.list(owner):
        lineage = art.lineage
        out.append(
            {
                "ref": art.ref,
                "kind": art.kind,
                "rows": art.rows,
                "bytes": art.bytes,
                "origin": lineage.get("tool"),
                "output": lineage.get("output"),
                "cell": lineage.get("cell"),
                "args": lineage.get("args") if isinstance(lineage.get("args"), dict) else {},
                "columns": _columns(art.path) if art.kind == "table" else None,
                "notebook": lineage.get("notebook"),
                "parents": list(lineage.get("parents") or []),
                "created": _iso(art.created),
                "expires": _iso(art.expires),
                "sensitive": art.sensitive,
            }
        )
    return out
