"""The data-free export of a transcript: what a person opens in JupyterLab and runs again.

The export is rebuilt cell by cell with nbformat's constructors from the stored transcript:
sources, cell ids, tags and the call records (minus the code, which is the source). Nothing
else survives: no outputs, no execution counts, no attachments, no other metadata. It is
validated before anyone sees it.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from . import __version__
from .config import Settings
from .downloads import Downloads
from .files import write_atomic
from .state import open_state
from .transcript import Transcripts

MEDIA_TYPE = "application/x-ipynb+json"


def export_notebook(transcripts: Transcripts, owner: str, handle: str) -> nbformat.NotebookNode:
    """The owner's notebook ``handle``, data-free and valid (nbformat.validate)."""
    stored = transcripts.materialise(owner, handle)  # the document catches up, too
    nb = new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
            "dataref": {
                "notebook": handle,
                "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "dataref_version": __version__,
            },
        }
    )
    for cell in stored.cells:
        nb.cells.append(_clean_cell(cell))
    nbformat.validate(nb)
    return nb


def _clean_cell(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    record = {k: v for k, v in cell.metadata.get("dataref", {}).items() if k != "code"}
    metadata: dict[str, Any] = {"dataref": record} if record else {}
    if cell.metadata.get("tags"):
        metadata["tags"] = list(cell.metadata["tags"])
    ids = {"id": cell["id"]} if cell.get("id") else {}
    if cell.cell_type == "code":
        return new_code_cell(cell.source, metadata=metadata, **ids)
    return new_markdown_cell(cell.source, metadata=metadata, **ids)


def notebook_json(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb)


def write_notebook(nb: nbformat.NotebookNode, path: Path) -> Path:
    """Write atomically (a reader never sees half a notebook); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, notebook_json(nb), durable=False)
    return path


def export_for_owner(
    transcripts: Transcripts,
    downloads: Downloads,
    owner: str,
    handle: str,
    base_url: str | None = None,
    ttl: float = 3600,
) -> dict[str, Any]:
    """The export tool: ``{path, cells, notebook}`` locally, ``{url, ...}`` over HTTP.

    Locally the file goes next to the transcripts (stable: one file per handle). Over HTTP it
    becomes a download link of the same kind as ``export_data``'s, valid for the owner only.
    """
    nb = export_notebook(transcripts, owner, handle)
    info: dict[str, Any] = {"notebook": handle, "cells": len(nb.cells)}
    if base_url is None:
        path = write_notebook(nb, transcripts.root / "exports" / f"{handle}.ipynb")
        return {"path": str(path), **info}
    from .consumers import download_url

    link = downloads.publish(
        owner,
        name=f"{handle}-{secrets.token_hex(4)}.ipynb",
        media_type=MEDIA_TYPE,
        filename=f"{handle}.ipynb",
        ttl=ttl,
        write=lambda path: path.write_text(notebook_json(nb), encoding="utf-8"),
    )
    return {"url": download_url(base_url, link), **info}


def cli_export(settings: Settings, notebook: str, out: str | None, owner: str | None) -> int:
    """``dataref export NOTEBOOK [--out FILE] [--owner NAME]``: no server needed."""
    import sys

    from .config import local_user
    from .errors import DatarefError

    owner = owner or settings.owner or local_user()
    local = settings.state.url is None
    if local and not (settings.state_dir / "notebooks" / "notebooks.sqlite").is_file():
        print(f"dataref: no notebooks under {settings.state_dir}", file=sys.stderr)
        return 1
    state = None if local else open_state(settings)
    db = None if state is None else state.notebooks_db
    transcripts = Transcripts(settings.state_dir / "notebooks", db=db)
    try:
        if notebook in ("", "default"):
            handle = transcripts.default(owner, create=False)
        else:
            handle = transcripts.resolve(owner, notebook)
        nb = export_notebook(transcripts, owner, handle)
    except DatarefError as exc:
        print(f"dataref: {exc}", file=sys.stderr)
        return 1
    finally:
        transcripts.close()
        if state is not None:
            state.close()
    if out == "-":
        sys.stdout.write(notebook_json(nb))
        return 0
    path = write_notebook(nb, Path(out or f"{handle}.ipynb"))
    print(f"wrote {path} ({len(nb.cells)} cells, no data)")
    return 0
