"""Notebook handles and their transcripts: every call becomes a cell of an nbformat notebook.

A notebook handle (``nb_<random>``) is owner-scoped like a dataRef: one kernel plus one
transcript. Each call appends its cells to the notebook's journal (``journal.py``: one
durable insert, whatever the notebook's length), so a transcript survives a crash and keeps
growing after a restart. The nbformat v4 file is materialised from the journal on export, at
shutdown, and at the next start after a crash.

A cell's metadata (``metadata.dataref``) is the record of its call: the tool, its arguments
or code, the dataRefs it read and made, its status and timing; never rows, samples or
results. Code is derived from these records (``cells.SourceWriter``) whenever the notebook
is read or materialised, so the variable names stay consistent across the whole notebook.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .cells import SourceWriter, not_run_markdown
from .errors import NotFound
from .files import remove_stale_parts, write_atomic
from .journal import Journal

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
    """Owns notebook handles (SQLite), their journals of cells and their notebook files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        remove_stale_parts(self.root)  # rewrites a crash interrupted: never visible
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.root / "notebooks.sqlite", check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # A commit is in the WAL before the call is answered, so a crash of the server (SIGKILL,
        # OOM) loses no acknowledged cell; the WAL is synced at checkpoints, not per call (an
        # fsync per call costs more than the rest of the call on a busy disk).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(
            """CREATE TABLE IF NOT EXISTS notebooks (
                   handle TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL,
                   is_default INTEGER NOT NULL DEFAULT 0);
               CREATE UNIQUE INDEX IF NOT EXISTS one_default
                   ON notebooks(owner) WHERE is_default = 1;"""
        )
        self._journal = Journal(self._db)
        # Notebooks this process has written to: the first call after a restart gets a note,
        # because the server's kernels (and their variables) did not survive it.
        self._touched: set[str] = set()
        self._owners: dict[str, str] = {}  # handle -> owner, once checked (never changes)
        self._defaults: dict[str, str] = {}  # owner -> default handle, once known
        # handle -> the notebook built from its journal so far (grown, never rebuilt)
        self._books: dict[str, nbformat.NotebookNode] = {}
        # Called with a handle after each append (the page's live feed listens here).
        self.listeners: list[Callable[[str], None]] = []
        self._recover()

    def close(self) -> None:
        """Materialise the notebook files that fell behind their journal, then close."""
        with self._lock:
            try:
                for handle in self._journal.behind():
                    self._materialise(handle)
            finally:
                self._db.close()

    def _recover(self) -> None:
        """Journal the notebooks written before the journal existed (their file is their
        record), and write the files a crash left behind their journal."""
        with self._lock:
            legacy = self._db.execute(
                "SELECT handle FROM notebooks WHERE handle NOT IN (SELECT handle FROM cells)"
            ).fetchall()
            for (handle,) in legacy:
                path = self._path(handle)
                if path.is_file():
                    cells = nbformat.read(path, as_version=4).cells
                    self._journal.mark_materialised(handle, self._journal.append(handle, cells))
            for handle in self._journal.behind():
                self._materialise(handle)

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
        if self._owners.get(handle) == owner:
            return handle
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM notebooks WHERE handle = ? AND owner = ?", (handle, owner)
            ).fetchone()
        if row is None:
            raise unknown_notebook(str(handle))
        self._owners[handle] = owner
        return handle

    def default(self, owner: str, *, create: bool = True) -> str:
        """The owner's default notebook, created on first use (or NotFound if not ``create``)."""
        if owner in self._defaults:
            return self._defaults[owner]
        handle = self._default(owner, create)
        self._defaults[owner], self._owners[handle] = handle, owner
        return handle

    def _default(self, owner: str, create: bool) -> str:
        with self._lock, self._db:
            row = self._db.execute(
                "SELECT handle FROM notebooks WHERE owner = ? AND is_default = 1", (owner,)
            ).fetchone()
            if row:
                return row[0]
            if not create:
                raise NotFound(f"{owner!r} has no default notebook yet - no call was recorded")
            return self._create(owner, is_default=True)

    def new(self, owner: str) -> str:
        with self._lock, self._db:
            return self._create(owner, is_default=False)

    def _create(self, owner: str, *, is_default: bool) -> str:
        handle = f"nb_{secrets.token_urlsafe(HANDLE_BYTES)}"
        self._db.execute(
            "INSERT INTO notebooks VALUES (?,?,?,?)", (handle, owner, time.time(), int(is_default))
        )
        intro = new_markdown_cell(INTRO, metadata={"dataref": {"role": "intro"}})
        setup = new_code_cell(SETUP, metadata={"dataref": {"role": "setup"}})
        self._journal.append(handle, [intro, setup])  # commits the notebook's row too
        self._touched.add(handle)
        self._owners[handle] = owner
        return handle

    def handles(self, owner: str) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT handle FROM notebooks WHERE owner = ? ORDER BY created", (owner,)
            ).fetchall()
        return [r[0] for r in rows]

    # -- cells -----------------------------------------------------------------

    def read(self, owner: str, handle: str) -> nbformat.NotebookNode:
        """A copy of the notebook as recorded so far (callers may change it freely)."""
        with self._lock:
            self.resolve(owner, handle)
            return copy.deepcopy(self._notebook(handle))

    def _notebook(self, handle: str) -> nbformat.NotebookNode:
        """The notebook built from the journal: only cells added since the last build are
        read; code sources are derived from all records again (they depend on each other)."""
        nb = self._books.get(handle)
        if nb is None:
            nb = self._books[handle] = new_notebook(metadata=_notebook_metadata(handle))
        added = self._journal.read(handle, len(nb.cells))
        if added:
            nb.cells.extend(nbformat.from_dict(cell) for cell in added)
            refresh_sources(nb)
        return nb

    def append(self, owner: str, handle: str, *cells: nbformat.NotebookNode) -> int:
        """Journal cells (durably, one insert whatever the notebook's length); returns the
        notebook's length. Sources are derived when the notebook is read or materialised."""
        with self._lock:
            self.resolve(owner, handle)
            added = list(cells)
            if handle not in self._touched:
                self._touched.add(handle)
                if self._journal.has_calls(handle):
                    added.insert(0, _restart_note())
            length = self._journal.append(handle, added)
        for listener in list(self.listeners):
            with contextlib.suppress(Exception):  # a listener never fails a call
                listener(handle)
        return length

    def materialise(self, owner: str, handle: str) -> Path:
        """Write the notebook file of ``handle`` from its journal; returns its path."""
        with self._lock:
            self.resolve(owner, handle)
            return self._materialise(handle)

    def _path(self, handle: str) -> Path:
        return self.root / f"{handle}.ipynb"

    def _materialise(self, handle: str) -> Path:
        """Atomic rewrite: a crash leaves the previous complete file (and the journal)."""
        nb = self._notebook(handle)
        path = self._path(handle)
        # Compact JSON (the C encoder) and no re-validation of the whole notebook: cells are
        # built only with nbformat's constructors, and exports validate.
        write_atomic(path, json.dumps(nb, sort_keys=True, ensure_ascii=False) + "\n")
        self._journal.mark_materialised(handle, len(nb.cells))
        return path


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
    text = "*The server restarted here: the kernel's variables were cleared, artifacts kept.*"
    return new_markdown_cell(text, metadata={"dataref": _record("restart")})


def record_reset(transcripts: Transcripts, owner: str, handle: str) -> None:
    """A note: in the session the kernel restarted here (replay carries on in one kernel)."""
    text = "*The kernel was reset here: variables were cleared, artifacts kept.*"
    rec = _record("reset_kernel")
    transcripts.append(owner, handle, new_markdown_cell(text, metadata={"dataref": rec}))
