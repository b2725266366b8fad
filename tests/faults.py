"""Checks of what a server left on disk: the store's files against its rows, the notebooks.

They read the state directory directly (SQLite read-only), never through the server, so
they see exactly what a restarted server would find.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import nbformat
import pyarrow as pa


def store_problems(state_dir: Path) -> list[str]:
    """Committed rows without a complete file, files without a row, leftovers of writes."""
    root = state_dir / "store"
    problems: list[str] = []
    db = sqlite3.connect(f"file:{root / 'meta.sqlite'}?mode=ro", uri=True)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            problems.append(f"meta.sqlite: {integrity}")
        rows = db.execute("SELECT ref, file, rows, bytes, kind FROM artifacts").fetchall()
    finally:
        db.close()
    for ref, name, n_rows, n_bytes, kind in rows:
        path = root / "blobs" / name
        if not path.is_file():
            problems.append(f"{ref}: committed, but its file is missing")
            continue
        if path.stat().st_size != n_bytes:
            problems.append(f"{ref}: {path.stat().st_size} bytes on disk, {n_bytes} committed")
            continue
        if kind == "table":
            try:
                with pa.memory_map(str(path)) as source:
                    table = pa.ipc.open_file(source).read_all()
            except (pa.ArrowException, OSError) as exc:
                problems.append(f"{ref}: unreadable Arrow file ({exc})")
                continue
            if table.num_rows != n_rows:
                problems.append(f"{ref}: {table.num_rows} rows on disk, {n_rows} committed")
    known = {name for _, name, *_ in rows}
    problems += [f"orphan blob {p.name}" for p in (root / "blobs").iterdir() if p.name not in known]
    problems += [f"leftover partial write {p.name}" for p in (root / "tmp").iterdir()]
    return problems


def notebook_problems(state_dir: Path) -> list[str]:
    """Notebook files that do not parse or validate, and leftovers of interrupted writes."""
    root = state_dir / "notebooks"
    problems: list[str] = []
    if not root.is_dir():
        return problems
    for path in sorted(root.glob("*.ipynb")):
        try:
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
        except Exception as exc:
            problems.append(f"{path.name}: {type(exc).__name__}: {str(exc)[:200]}")
    problems += [f"leftover partial notebook {p.name}" for p in root.glob("*.part")]
    return problems


def notebook_text(state_dir: Path) -> str:
    """All notebook files as one text: to find the refs their cells recorded."""
    root = state_dir / "notebooks"
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(root.glob("*.ipynb")))
