"""Notebook handles and their transcripts: every call becomes a cell of an nbformat notebook.

A notebook handle (``nb_<random>``) is owner-scoped like a dataRef: one kernel plus one
transcript. Each transcript is an nbformat v4 file, rewritten atomically after every call,
so it survives a restart and keeps growing afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .errors import NotFound

HANDLE_BYTES = 16


def unknown_notebook(handle: str) -> NotFound:
    shown = handle if len(handle) <= 40 else handle[:37] + "..."
    return NotFound(
        f"unknown notebook {shown!r} - omit `notebook` to use your default one, "
        "or use a handle returned by an earlier call"
    )


class Transcripts:
    """Owns notebook handles (SQLite) and their notebook files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.root / "notebooks.sqlite", check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(
            """CREATE TABLE IF NOT EXISTS notebooks (
                   handle TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL,
                   is_default INTEGER NOT NULL DEFAULT 0);
               CREATE UNIQUE INDEX IF NOT EXISTS one_default
                   ON notebooks(owner) WHERE is_default = 1;"""
        )
        self._counters: dict[str, int] = {}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- handles ---------------------------------------------------------------

    def resolve(self, owner: str, handle: str | None) -> str:
        """The owner's notebook ``handle``, or their default one (created on first use)."""
        if handle is None or handle == "":
            return self.default(owner)
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM notebooks WHERE handle = ? AND owner = ?", (handle, owner)
            ).fetchone()
        if row is None:
            raise unknown_notebook(str(handle))
        return handle

    def default(self, owner: str) -> str:
        with self._lock, self._db:
            row = self._db.execute(
                "SELECT handle FROM notebooks WHERE owner = ? AND is_default = 1", (owner,)
            ).fetchone()
            if row:
                return row[0]
            return self._create(owner, is_default=True)

    def new(self, owner: str) -> str:
        with self._lock, self._db:
            return self._create(owner, is_default=False)

    def _create(self, owner: str, *, is_default: bool) -> str:
        handle = f"nb_{secrets.token_urlsafe(HANDLE_BYTES)}"
        self._db.execute(
            "INSERT INTO notebooks VALUES (?,?,?,?)", (handle, owner, time.time(), int(is_default))
        )
        nb = new_notebook(metadata=_notebook_metadata(handle))
        nb.cells.append(new_markdown_cell(_INTRO))
        nb.cells.append(code_cell(_SETUP, role="setup"))
        self._write(handle, nb)
        return handle

    def handles(self, owner: str) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT handle FROM notebooks WHERE owner = ? ORDER BY created", (owner,)
            ).fetchall()
        return [r[0] for r in rows]

    # -- cells -----------------------------------------------------------------

    def read(self, owner: str, handle: str) -> nbformat.NotebookNode:
        self.resolve(owner, handle)
        return nbformat.read(self._path(handle), as_version=4)

    def append(self, owner: str, handle: str, cell: nbformat.NotebookNode) -> int:
        """Append a cell and persist; returns the cell's index in the notebook."""
        with self._lock:
            nb = self.read(owner, handle)
            nb.cells.append(cell)
            self._write(handle, nb)
            return len(nb.cells) - 1

    def next_cell_id(self, owner: str, handle: str) -> str:
        with self._lock:
            n = len(self.read(owner, handle).cells)
        return f"c{n:04d}"

    def _path(self, handle: str) -> Path:
        return self.root / f"{handle}.ipynb"

    def _write(self, handle: str, nb: nbformat.NotebookNode) -> None:
        """Atomic rewrite: a crash leaves the previous complete notebook."""
        path = self._path(handle)
        part = path.with_suffix(f".{secrets.token_hex(4)}.part")
        try:
            with open(part, "w", encoding="utf-8") as f:
                nbformat.write(nb, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()


_INTRO = (
    "# dataref transcript\n\n"
    "Recorded by a dataref session: each code cell is one tool call. The notebook holds no "
    "data; run it top to bottom with dataref installed to fetch the same data again and "
    "recompute the same results."
)


_SETUP = "import dataref.replay as dr\n\noutputs = {}"


def _notebook_metadata(handle: str) -> dict[str, Any]:
    return {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "dataref": {"notebook": handle},
    }


def code_cell(source: str, **metadata: Any) -> nbformat.NotebookNode:
    """A code cell carrying dataref metadata (refs, timings, the tool call; never data)."""
    return new_code_cell(
        source=source, metadata={"dataref": json.loads(json.dumps(metadata, default=str))}
    )


def variable_for(nb: nbformat.NotebookNode, ref: str) -> str | None:
    """The notebook variable that holds ``ref``, if an earlier cell made it."""
    return nb.metadata.get("dataref", {}).get("variables", {}).get(ref)


def fresh_variable(nb: nbformat.NotebookNode, base: str) -> str:
    """``base`` or ``base_2``, ``base_3``... whichever no earlier cell bound."""
    taken = set(nb.metadata.get("dataref", {}).get("variables", {}).values())
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _call_source(function: str, arguments: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return f"{function}({args})"


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
    """``sales = dr.fetch_sales(since='2025-01-01')``: re-runs the producer on replay."""
    with transcripts._lock:
        nb = transcripts.read(owner, handle)
        base = tool.removeprefix("fetch_") or "data"
        var = fresh_variable(nb, base if base.isidentifier() else "data")
        source = f"{var} = dr.{_call_source(tool, arguments)}\n{var}.shape"
        nb.cells.append(
            code_cell(
                source,
                tool=tool,
                arguments=arguments,
                refs={var: ref},
                elapsed_s=round(elapsed_s, 4),
            )
        )
        nb.metadata.setdefault("dataref", {}).setdefault("variables", {})[ref] = var
        transcripts._write(handle, nb)


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
    with transcripts._lock:
        nb = transcripts.read(owner, handle)
        lines = []
        for name, ref in inputs.items():
            var = variable_for(nb, ref)
            if var is None:
                lines.append(f"{name} = dr.artifact({ref!r})  # made outside this notebook")
            elif var != name:
                lines.append(f"{name} = {var}")
        body = "\n".join([*lines, "result = None", code.rstrip()])
        outputs = {name: d["dataRef"] for name, d in response.get("outputs", {}).items()}
        variables = nb.metadata.setdefault("dataref", {}).setdefault("variables", {})
        tail = []
        for name, ref in outputs.items():
            var = fresh_variable(nb, name)
            tail.append(f"{var} = outputs[{name!r}]")
            variables[ref] = var
        source = "\n".join([body, *tail, "result"])
        nb.cells.append(
            code_cell(
                source,
                tool="run_python",
                inputs=inputs,
                outputs=outputs,
                ok=bool(response.get("ok")),
                expected_result=response.get("result"),
                elapsed_s=round(elapsed_s, 4),
            )
        )
        transcripts._write(handle, nb)


def record_reset(transcripts: Transcripts, owner: str, handle: str) -> None:
    transcripts.append(
        owner,
        handle,
        new_markdown_cell("*The kernel was reset here: variables were cleared, artifacts kept.*"),
    )
