"""The append-only journal of notebook cells behind every transcript, on either engine.

One row per cell, ``cells(handle, seq, cell)``, in the notebooks' database (SQLite or
PostgreSQL): recording a call is one insert, whatever the notebook's length, committed before
the call is answered, so a crash (SIGKILL, OOM) loses no acknowledged cell. Appends run in a
write transaction that holds the notebook (SQLite's write lock, or the notebook's row
``FOR UPDATE`` on PostgreSQL), so cells keep call order across processes and replicas.

The nbformat document is materialised from the journal, never the other way round: the
``<handle>.ipynb`` file next to ``notebooks.sqlite`` (SQLite), or the ``doc`` column of the
notebook's row (PostgreSQL). ``notebooks.materialised`` counts the cells it holds, so the
documents that fell behind (a crash) are found and written again. A notebook stored as a
document before the journal existed is taken into it once (``take_in``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_notebook

from ..files import write_atomic
from .db import Cursor, Database


def dumps(nb: nbformat.NotebookNode) -> str:
    # Compact JSON (the C encoder) and no re-validation of the whole notebook on every write:
    # cells are built only with nbformat's constructors, and exports validate.
    return json.dumps(nb, sort_keys=True, ensure_ascii=False) + "\n"


class Journal:
    """Cells by notebook, in order, plus the materialised documents.

    ``refresh`` re-derives a notebook's code sources after cells were added; ``metadata``
    gives a fresh notebook's metadata (both from ``transcript.py``)."""

    def __init__(
        self,
        root: Path,
        db: Database,
        refresh: Callable[[nbformat.NotebookNode], None],
        metadata: Callable[[str], dict[str, Any]],
    ) -> None:
        self.root = Path(root)
        self.db = db
        self._refresh = refresh
        self._metadata = metadata
        self._for_update = " FOR UPDATE" if db.dialect == "postgresql" else ""
        self._mutex = threading.RLock()
        # handle -> the notebook built from its journal so far (grown, never rebuilt)
        self._books: dict[str, nbformat.NotebookNode] = {}

    def path(self, handle: str) -> Path:
        return self.root / f"{handle}.ipynb"

    # -- writes ----------------------------------------------------------------

    def insert(self, cur: Cursor, handle: str, start: int, cells: Sequence[Any]) -> int:
        """One INSERT of ``cells`` at positions ``start``...; returns the new length."""
        if cells:
            values = ",".join("(?,?,?)" for _ in cells)
            params: list[Any] = []
            for i, cell in enumerate(cells):
                params += [handle, start + i, json.dumps(cell, ensure_ascii=False, sort_keys=True)]
            cur.execute(f"INSERT INTO cells (handle, seq, cell) VALUES {values}", params)
        return start + len(cells)

    def append(
        self, handle: str, kernel: str | None, cells: Sequence[Any], note: Callable[[], Any]
    ) -> int:
        """Add ``cells`` after the notebook's last one (committed when this returns); returns
        the notebook's new length. When the last call was recorded by another kernel context
        and the notebook has calls, ``note()`` goes first (the variables were cleared).

        ``kernel`` None: the notebook's kernel is the one the kernel map names now (kernels
        every replica reaches, ``kernel_map.py``); no mapped kernel leaves the context as it
        was, and a context cleared by a reset (NULL) needs no note."""
        with self.db.tx(write=True) as cur:
            (before,) = cur.execute(
                f"SELECT kernel FROM notebooks WHERE handle = ?{self._for_update}", (handle,)
            ).fetchone()
            count = self._count(cur, handle)
            added = list(cells)
            mapped = kernel is None
            if mapped:
                row = cur.execute("SELECT id FROM kernels WHERE handle = ?", (handle,)).fetchone()
                kernel = None if row is None else f"gw:{row[0]}"
            if kernel is not None and before != kernel:
                # more than the intro and setup: calls were recorded
                if count > 2 and not (mapped and before is None):
                    added.insert(0, note())
                cur.execute("UPDATE notebooks SET kernel = ? WHERE handle = ?", (kernel, handle))
            return self.insert(cur, handle, count, added)

    def _count(self, cur: Cursor, handle: str) -> int:
        row = cur.execute(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM cells WHERE handle = ?", (handle,)
        ).fetchone()
        return int(row[0])

    # -- reads -----------------------------------------------------------------

    def notebook(self, handle: str) -> nbformat.NotebookNode:
        """The notebook as journalled (shared: callers copy it): only the cells added since
        the last build are read; every source is derived again (they depend on each other)."""
        with self._mutex:
            nb = self._books.get(handle)
            if nb is None:
                nb = self._books[handle] = new_notebook(metadata=self._metadata(handle))
            with self.db.tx() as cur:
                rows = cur.execute(
                    "SELECT cell FROM cells WHERE handle = ? AND seq >= ? ORDER BY seq",
                    (handle, len(nb.cells)),
                ).fetchall()
            if rows:
                nb.cells.extend(nbformat.from_dict(json.loads(r[0])) for r in rows)
                self._refresh(nb)
            return nb

    # -- documents -------------------------------------------------------------

    def materialise(self, handle: str) -> nbformat.NotebookNode:
        """Write the notebook's document from its journal (a crash leaves the previous one)."""
        # The mutex before the transaction, as in ``notebook`` (one order: no deadlock).
        with self._mutex, self.db.tx(write=True) as cur:
            cur.execute(f"SELECT 1 FROM notebooks WHERE handle = ?{self._for_update}", (handle,))
            nb = self.notebook(handle)
            text = dumps(nb)
            if self.db.dialect == "sqlite":
                write_atomic(self.path(handle), text)
                cur.execute(
                    "UPDATE notebooks SET materialised = ? WHERE handle = ?",
                    (len(nb.cells), handle),
                )
            else:
                cur.execute(
                    "UPDATE notebooks SET doc = ?, materialised = ? WHERE handle = ?",
                    (text, len(nb.cells), handle),
                )
            return nb

    def behind(self) -> list[str]:
        """Notebooks whose document holds fewer cells than their journal."""
        with self.db.tx() as cur:
            rows = cur.execute(
                """SELECT n.handle FROM notebooks n JOIN
                       (SELECT handle, MAX(seq) + 1 AS c FROM cells GROUP BY handle) j
                       ON j.handle = n.handle
                   WHERE n.materialised != j.c"""
            ).fetchall()
        return [r[0] for r in rows]

    def take_in(self) -> int:
        """Journal the notebooks stored only as documents (before the journal existed);
        returns how many. Each is taken under its row lock, so replicas take it in once."""
        query = (
            "SELECT handle FROM notebooks n "
            "WHERE NOT EXISTS (SELECT 1 FROM cells c WHERE c.handle = n.handle)"
        )
        with self.db.tx() as cur:
            legacy = [r[0] for r in cur.execute(query).fetchall()]
        taken = 0
        for handle in legacy:
            with self.db.tx(write=True) as cur:
                (doc,) = cur.execute(
                    f"SELECT doc FROM notebooks WHERE handle = ?{self._for_update}", (handle,)
                ).fetchone()
                if self._count(cur, handle):
                    continue  # another process took it in meanwhile
                if self.db.dialect == "sqlite":
                    path = self.path(handle)
                    doc = path.read_text(encoding="utf-8") if path.is_file() else None
                if doc is None:
                    continue
                cells = nbformat.reads(doc, as_version=4).cells
                count = self.insert(cur, handle, 0, cells)
                cur.execute(
                    "UPDATE notebooks SET materialised = ? WHERE handle = ?", (count, handle)
                )
                taken += 1
        return taken
