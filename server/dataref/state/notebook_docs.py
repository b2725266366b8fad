"""Where a notebook's document lives, and how one process at a time changes it.

- ``FileDocs`` (SQLite engine): one ``<handle>.ipynb`` per notebook next to ``notebooks.sqlite``,
  rewritten atomically; an ``flock`` per notebook makes read-modify-write safe across the
  processes of one machine (``--workers``).
- ``DbDocs`` (PostgreSQL): the document in the ``notebooks`` row, changed under
  ``SELECT ... FOR UPDATE`` in one transaction, so replicas on any machine append in turn and
  a replica that dies mid-change leaves the previous document.

Both keep the last document they read or wrote (by file identity or row version), so an
append does not parse the whole notebook again unless another process changed it.
The ``kernel`` column next to each notebook says what its variables live in (see
``Transcripts.append``): ``edit`` reports whether the writer's differs, and records it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import nbformat

from ..files import write_atomic
from .db import Cursor, Database


class NotebookDocs(Protocol):
    def create(self, cur: Cursor, handle: str, nb: nbformat.NotebookNode) -> None: ...
    def read(self, handle: str) -> nbformat.NotebookNode: ...
    def edit(
        self, handle: str, kernel: str
    ) -> contextlib.AbstractContextManager[tuple[nbformat.NotebookNode, bool]]: ...


def dumps(nb: nbformat.NotebookNode) -> str:
    # Compact JSON (the C encoder) and no re-validation of the whole notebook on every call:
    # cells are built only with nbformat's constructors, and exports validate.
    return json.dumps(nb, sort_keys=True, ensure_ascii=False) + "\n"


class FileDocs:
    def __init__(self, root: Path, db: Database) -> None:
        self.root = Path(root)
        self.db = db
        self.locks = self.root / ".locks"
        self.locks.mkdir(mode=0o700, exist_ok=True)
        self._mutex = threading.RLock()
        # handle -> (file identity when we last wrote or read it, the notebook)
        self._cache: dict[str, tuple[tuple[int, int], nbformat.NotebookNode]] = {}

    def path(self, handle: str) -> Path:
        return self.root / f"{handle}.ipynb"

    def create(self, cur: Cursor, handle: str, nb: nbformat.NotebookNode) -> None:
        self._write(handle, nb)

    def read(self, handle: str) -> nbformat.NotebookNode:
        with self._mutex:
            path = self.path(handle)
            identity = _identity(path)
            cached = self._cache.get(handle)
            if cached is not None and cached[0] == identity:
                return cached[1]
            nb = nbformat.read(path, as_version=4)
            self._cache[handle] = (identity, nb)
            return nb

    @contextlib.contextmanager
    def edit(self, handle: str, kernel: str) -> Iterator[tuple[nbformat.NotebookNode, bool]]:
        with self._mutex, self._flock(handle):
            with self.db.tx() as cur:
                row = cur.execute(
                    "SELECT kernel FROM notebooks WHERE handle = ?", (handle,)
                ).fetchone()
            nb = self.read(handle)  # changed in place; _write drops it on failure
            try:
                yield nb, (row[0] if row else None) != kernel
            except BaseException:
                self._cache.pop(handle, None)
                raise
            self._write(handle, nb)
            if row is None or row[0] != kernel:
                with self.db.tx(write=True) as cur:
                    cur.execute(
                        "UPDATE notebooks SET kernel = ? WHERE handle = ?", (kernel, handle)
                    )

    @contextlib.contextmanager
    def _flock(self, handle: str) -> Iterator[None]:
        fd = os.open(self.locks / handle, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, handle: str, nb: nbformat.NotebookNode) -> None:
        """Atomic rewrite: a crash leaves the previous complete notebook."""
        path = self.path(handle)
        try:
            write_atomic(path, dumps(nb))
            self._cache[handle] = (_identity(path), nb)
        except BaseException:
            self._cache.pop(handle, None)  # the file still holds the previous notebook
            raise


def _identity(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_mtime_ns, info.st_size


class DbDocs:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._mutex = threading.RLock()
        self._cache: dict[str, tuple[int, nbformat.NotebookNode]] = {}

    def create(self, cur: Cursor, handle: str, nb: nbformat.NotebookNode) -> None:
        cur.execute(
            "UPDATE notebooks SET doc = ?, version = 1 WHERE handle = ?", (dumps(nb), handle)
        )
        self._cache[handle] = (1, nb)

    def read(self, handle: str) -> nbformat.NotebookNode:
        with self.db.tx() as cur:
            row = cur.execute(
                "SELECT version FROM notebooks WHERE handle = ?", (handle,)
            ).fetchone()
            return self._parse(cur, handle, row[0])

    def _parse(self, cur: Cursor, handle: str, version: int) -> nbformat.NotebookNode:
        with self._mutex:
            cached = self._cache.get(handle)
            if cached is not None and cached[0] == version:
                return cached[1]
        (doc,) = cur.execute("SELECT doc FROM notebooks WHERE handle = ?", (handle,)).fetchone()
        nb = nbformat.reads(doc, as_version=4)
        with self._mutex:
            self._cache[handle] = (version, nb)
        return nb

    @contextlib.contextmanager
    def edit(self, handle: str, kernel: str) -> Iterator[tuple[nbformat.NotebookNode, bool]]:
        with self.db.tx(write=True) as cur:
            version, before = cur.execute(
                "SELECT version, kernel FROM notebooks WHERE handle = ? FOR UPDATE", (handle,)
            ).fetchone()
            nb = self._parse(cur, handle, version)
            try:
                yield nb, before != kernel
                cur.execute(
                    "UPDATE notebooks SET doc = ?, version = ?, kernel = ? WHERE handle = ?",
                    (dumps(nb), version + 1, kernel, handle),
                )
            except BaseException:
                with self._mutex:
                    self._cache.pop(handle, None)
                raise
            with self._mutex:
                self._cache[handle] = (version + 1, nb)


def docs_for(root: Path, db: Database) -> Any:
    return FileDocs(root, db) if db.dialect == "sqlite" else DbDocs(db)
