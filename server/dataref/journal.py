"""The append-only journal of notebook cells: the source of truth of every transcript.

One row per cell, ``cells(handle, seq, cell)``, in the transcript index's SQLite database
(WAL, ``synchronous=NORMAL``): recording a call is one small insert, whatever the notebook's
length, and a cell whose call was acknowledged survives a crash of the server (SIGKILL, OOM);
a power cut can lose the cells since the last WAL checkpoint, never the journal's consistency.
Notebook files are materialised from the journal (``Transcripts.materialise``); the journal
is never rewritten. A state engine other than SQLite needs the same append-only table.

``materialised(handle, seq)`` remembers how many cells the notebook file holds, so a start
after a crash writes the files that fell behind.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS cells (
    handle TEXT NOT NULL, seq INTEGER NOT NULL, cell TEXT NOT NULL,
    PRIMARY KEY (handle, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS materialised (
    handle TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
"""


class Journal:
    """Cells by notebook handle, in order. The caller serialises access (one lock)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._db.executescript(SCHEMA)

    def append(self, handle: str, cells: Iterable[dict[str, Any]]) -> int:
        """Add ``cells`` after the notebook's last one, in one transaction (committed, hence
        durable, when this returns); returns the notebook's new length."""
        with self._db:
            count = self.count(handle)
            rows = [
                (handle, count + i, json.dumps(cell, ensure_ascii=False, sort_keys=True))
                for i, cell in enumerate(cells)
            ]
            self._db.executemany("INSERT INTO cells VALUES (?,?,?)", rows)
        return count + len(rows)

    def count(self, handle: str) -> int:
        row = self._db.execute(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM cells WHERE handle = ?", (handle,)
        ).fetchone()
        return int(row[0])

    def read(self, handle: str, start: int = 0) -> list[dict[str, Any]]:
        """The cells from position ``start`` on."""
        rows = self._db.execute(
            "SELECT cell FROM cells WHERE handle = ? AND seq >= ? ORDER BY seq", (handle, start)
        ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def has_calls(self, handle: str) -> bool:
        """Whether any cell records a tool call (not only the intro and setup)."""
        row = self._db.execute(
            "SELECT 1 FROM cells WHERE handle = ? "
            "AND json_extract(cell, '$.metadata.dataref.tool') IS NOT NULL LIMIT 1",
            (handle,),
        ).fetchone()
        return row is not None

    def mark_materialised(self, handle: str, seq: int) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO materialised VALUES (?, ?) "
                "ON CONFLICT(handle) DO UPDATE SET seq = excluded.seq",
                (handle, seq),
            )

    def behind(self) -> list[str]:
        """Handles whose notebook file holds fewer cells than the journal."""
        rows = self._db.execute(
            """SELECT c.handle FROM (SELECT handle, MAX(seq) + 1 AS n FROM cells GROUP BY handle) c
               LEFT JOIN materialised m ON m.handle = c.handle
               WHERE m.seq IS NULL OR m.seq != c.n"""
        ).fetchall()
        return [r[0] for r in rows]
