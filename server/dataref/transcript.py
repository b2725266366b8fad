"""Notebook handles and their transcripts: every call becomes a cell of an nbformat notebook.

A notebook handle (``nb_<random>``) is owner-scoped like a dataRef: one kernel plus one
transcript. Each call appends its cells to the notebook's journal (``state.journal``: one
insert in the shared state, whatever the notebook's length), so a transcript survives a crash
and keeps growing afterwards, whichever replica records the next call. The nbformat v4
document (a file by default, a row on PostgreSQL) is materialised from the journal on export,
at shutdown and at the next start after a crash.

A cell's metadata (``metadata.dataref``) is the record of its call: the tool, its arguments
or code, the dataRefs it read and made, its status and timing; never rows, samples or
results. Code is derived from these records (``cells.SourceWriter``) whenever the notebook
is read or materialised, so the variable names stay consistent across the whole notebook.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell

from .cells import SourceWriter, not_run_markdown
from .errors import NotFound
from .files import remove_stale_parts
from .state import sqlite_db
from .state.db import Cursor, Database
from .state.journal import Journal

HANDLE_BYTES = 16
_HANDLE = re.compile(r"nb_[A-Za-z0-9_-]{1,64}")
FAILED_TAG = "raises-exception"  # nbclient and JupyterLab run on past a tagged cell's error


def unknown_notebook(handle: str) -> NotFound:
    shown = handle if len(handle) <= 40 else handle[:37] + "..."
    return NotFound(
        f"unknown notebook {shown!r} - omit `notebook` to use your default one, "
        "or use a handle returned by an earlier call"
    )


class Transcripts:
    """Owns notebook handles (the state database), their journals and their documents.

    ``kernel`` names what this process's kernels are (see ``append``); by default a fresh
    value per instance: a new server process has new kernels."""

    def __init__(
        self,
        root: Path,
        *,
        db: Database | None = None,
        kernel: str | None = None,
        shared_kernels: bool = False,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        remove_stale_parts(self.root)  # rewrites a crash interrupted: never visible
        self._own_db = db is None
        self._db = db or sqlite_db(self.root / "notebooks.sqlite", "notebooks")
        self.journal = Journal(self.root, self._db, refresh_sources, _notebook_metadata)
        # Kernels every replica reaches (a gateway): the kernel map says where a notebook's
        # variables are (None here); else this process's own kernels are.
        self.kernel: str | None = None
        if not shared_kernels:
            self.kernel = kernel or f"server:{secrets.token_hex(8)}"
        # Called with a handle after each write (the page's live feed listens here).
        self.listeners: list[Callable[[str], None]] = []
        # Notebooks stored as documents before the journal are taken in; documents a crash
        # left behind their journal are written again.
        self.journal.take_in()
        self._materialise_behind()

    def close(self) -> None:
        """Materialise the documents that fell behind their journal, then close."""
        try:
            self._materialise_behind()
        finally:
            if self._own_db:
                self._db.close()

    def _materialise_behind(self) -> None:
        for handle in self.journal.behind():
            self.journal.materialise(handle)

    # -- handles ---------------------------------------------------------------

    def resolve(self, owner: str, handle: str | None) -> str:
        """The owner's notebook ``handle``, their default one (created on first use) when
        omitted, or a fresh one for ``"new"``."""
        if handle is None or handle == "":
            return self.default(owner)
        if handle == "new":
            return self.new(owner)
        if not isinstance(handle, str) or not _HANDLE.fullmatch(handle):
            raise unknown_notebook(repr(handle)[1:-1])  # not even shaped like a handle
        with self._db.tx() as cur:
            row = cur.execute(
                "SELECT 1 FROM notebooks WHERE handle = ? AND owner = ?", (handle, owner)
            ).fetchone()
        if row is None:
            raise unknown_notebook(str(handle))
        return handle

    def default(self, owner: str, *, create: bool = True) -> str:
        """The owner's default notebook, created on first use (or NotFound if not ``create``)."""
        query = "SELECT handle FROM notebooks WHERE owner = ? AND is_default = 1"
        with self._db.tx() as cur:
            row = cur.execute(query, (owner,)).fetchone()
        if row:
            return row[0]
        if not create:
            raise NotFound(f"{owner!r} has no default notebook yet - no call was recorded")
        # Two servers may get here at once: the owner's lock makes the second find the first's.
        with self._db.tx(write=True, lock=f"dataref:default:{owner}") as cur:
            row = cur.execute(query, (owner,)).fetchone()
            if row:
                return row[0]
            handle = self._create(cur, owner, is_default=True)
        self._notify(handle)
        return handle

    def new(self, owner: str) -> str:
        with self._db.tx(write=True) as cur:
            handle = self._create(cur, owner, is_default=False)
        self._notify(handle)
        return handle

    def _create(self, cur: Cursor, owner: str, *, is_default: bool) -> str:
        handle = f"nb_{secrets.token_urlsafe(HANDLE_BYTES)}"
        cur.execute(
            "INSERT INTO notebooks (handle, owner, created, is_default, kernel) VALUES (?,?,?,?,?)",
            (handle, owner, time.time(), int(is_default), self.kernel),
        )
        intro = new_markdown_cell(INTRO, metadata={"dataref": {"role": "intro"}})
        setup = new_code_cell(SETUP, metadata={"dataref": {"role": "setup"}})
        self.journal.insert(cur, handle, 0, [intro, setup])  # in the notebook's transaction
        return handle

    def handles(self, owner: str) -> list[str]:
        with self._db.tx() as cur:
            rows = cur.execute(
                "SELECT handle FROM notebooks WHERE owner = ? ORDER BY created", (owner,)
            ).fetchall()
        return [r[0] for r in rows]

    # -- cells -----------------------------------------------------------------

    def read(self, owner: str, handle: str) -> nbformat.NotebookNode:
        """A copy of the notebook as journalled, by any process (callers may change it)."""
        self.resolve(owner, handle)
        return copy.deepcopy(self.journal.notebook(handle))

    def append(self, owner: str, handle: str, *cells: nbformat.NotebookNode) -> int:
        """Journal cells (one insert, committed on return); returns the notebook's length.
        Sources are derived when the notebook is read or materialised.

        The notebook's variables live in one kernel; when the last call was recorded by
        another kernel context (a restarted server, or a replica with kernels of its own),
        a note says the variables were cleared there."""
        self.resolve(owner, handle)
        length = self.journal.append(handle, self.kernel, cells, _restart_note)
        self._notify(handle)  # once it is stored
        return length

    def materialise(self, owner: str, handle: str) -> nbformat.NotebookNode:
        """Write the notebook's document from its journal; returns a copy of the notebook.
        (The file is ``self.journal.path(handle)`` on SQLite, the row's ``doc`` otherwise.)"""
        self.resolve(owner, handle)
        return copy.deepcopy(self.journal.materialise(handle))

    def _notify(self, handle: str) -> None:
        for listener in list(self.listeners):
            with contextlib.suppress(Exception):  # a listener never fails a call
                listener(handle)


INTRO = """\
# dataref transcript

Each code cell below is one tool call of a dataref session, recorded as it happened. The \
notebook holds no data: run it from the top, with dataref installed and access to the same \
sources, and it fetches the data again and recomputes the same results.

- `dr.fetch_...(...)` runs the same query again, as you.
- A `run_python` cell is the agent's code, after the lines (if any) that bind its inputs. \
`dr.output(outputs, "x")` gives an output as the server stored it, and `dr.show(result)` \
displays the answer the agent received.
- `dr.chart(...)` draws a chart as `render_chart` drew it."""

SETUP = "import dataref.replay as dr\n\noutputs = {}"


def _notebook_metadata(handle: str) -> dict[str, Any]:
    return {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "dataref": {"notebook": handle},
    }


def refresh_sources(nb: nbformat.NotebookNode) -> None:
    """Write every recorded code cell's source from the records of all cells."""
    records = [c.metadata.get("dataref", {}) for c in nb.cells]
    writer = SourceWriter([r for r in records if r.get("tool")])
    failed_tail: str | None = None
    for cell, rec in zip(nb.cells, records, strict=True):
        tool = rec.get("tool")
        if rec.get("role") == "setup":
            cell.source = writer.setup()
        elif rec.get("role") == "outputs":  # the outputs of the failed call just before
            cell.source = failed_tail or "pass"
        elif tool == "run_python" and cell.cell_type == "markdown":
            writer.not_run(rec)
        elif tool == "run_python":
            cell.source, failed_tail = writer.run_python(rec)
        elif tool == "render_chart":
            cell.source = writer.chart(rec)
        elif tool in ("reset_kernel", "restart"):
            writer.reset()
        elif tool and rec.get("ref"):
            cell.source = writer.producer(rec)


def _record(tool: str, elapsed_s: float | None = None, **fields: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"tool": tool, **fields}
    rec["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if elapsed_s is not None:
        rec["elapsed_s"] = round(elapsed_s, 4)
    return rec


def record_producer(
    transcripts: Transcripts,
    owner: str,
    handle: str,
    *,
    tool: str,
    arguments: dict[str, Any],
    ref: str,
    elapsed_s: float,
) -> None:
    """``sales = dr.fetch_sales(since="2025-01-01")``: re-runs the producer on replay."""
    rec = _record(tool, elapsed_s, arguments=dict(arguments), ref=ref)
    transcripts.append(owner, handle, new_code_cell("", metadata={"dataref": rec}))


_EXCEPTION_NAME = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def call_status(response: dict[str, Any]) -> tuple[str, str | None]:
    """("ok" | "error" | "timeout" | "died", exception class name): never the message, which
    may quote the data."""
    if response.get("ok") or not response.get("error"):
        return "ok", None
    error = str(response["error"])
    if error.startswith("the kernel died"):
        return "died", None
    if error.startswith("timed out"):
        return "timeout", None
    last = error.strip().splitlines()[-1] if error.strip() else ""
    match = _EXCEPTION_NAME.match(last)
    return "error", (match.group(1) if match else None)


def record_run_python(
    transcripts: Transcripts,
    owner: str,
    handle: str,
    *,
    code: str,
    inputs: dict[str, str],
    response: dict[str, Any],
    elapsed_s: float,
) -> None:
    """The agent's code, after lines binding its inputs, before a display of ``result``."""
    status, error_name = call_status(response)
    outputs = {name: d["dataRef"] for name, d in (response.get("outputs") or {}).items()}
    rec = _record(
        "run_python", elapsed_s, code=code, inputs=dict(inputs), outputs=outputs, status=status
    )
    if error_name:
        rec["error_name"] = error_name
    if status == "died" or (status == "timeout" and "restarted" in str(response.get("error"))):
        rec["kernel_lost"] = True
    if status in ("timeout", "died"):  # running it again would hang or kill the kernel
        cells = [new_markdown_cell(not_run_markdown(rec), metadata={"dataref": rec})]
    elif status == "error":
        cells = [new_code_cell("", metadata={"dataref": rec, "tags": [FAILED_TAG]})]
        if outputs:  # the kernel stores outputs even when the code fails
            cells.append(new_code_cell("", metadata={"dataref": {"role": "outputs"}}))
    else:
        cells = [new_code_cell("", metadata={"dataref": rec})]
    transcripts.append(owner, handle, *cells)


def record_chart(
    transcripts: Transcripts,
    owner: str,
    handle: str,
    *,
    data_ref: str,
    x: str,
    y: str | None,
    kind: str,
    title: str | None,
    chart_ref: str,
) -> None:
    """``dr.chart(qoq, x="line", y="delta", kind="bar")``: the chart drawn the same way."""
    rec = _record(
        "render_chart", dataRef=data_ref, x=x, y=y, kind=kind, title=title, chartRef=chart_ref
    )
    transcripts.append(owner, handle, new_code_cell("", metadata={"dataref": rec}))


def _restart_note() -> nbformat.NotebookNode:
    text = (
        "*The server restarted here (or another server without this kernel answered): the "
        "kernel's variables were cleared, artifacts kept.*"
    )
    return new_markdown_cell(text, metadata={"dataref": _record("restart")})


def record_reset(transcripts: Transcripts, owner: str, handle: str) -> None:
    """A note: in the session the kernel restarted here (replay carries on in one kernel)."""
    text = "*The kernel was reset here: variables were cleared, artifacts kept.*"
    rec = _record("reset_kernel")
    transcripts.append(owner, handle, new_markdown_cell(text, metadata={"dataref": rec}))
