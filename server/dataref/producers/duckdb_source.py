"""DuckDB sources: Parquet, CSV and JSON files of one directory, queried with DuckDB's SQL.

Each query gets a fresh in-memory DuckDB whose every file in the directory is a view named
after the file (``sales.parquet`` -> ``sales``). Before the agent's SQL runs, the database is
shut off from everything else by DuckDB's own settings, then locked:
``allowed_directories`` = the source's directory, ``enable_external_access = false`` (no other
file, no network), no extension installed or loaded (auto-install and auto-load off, community
extensions off), no spill directory, and ``lock_configuration = true`` so SQL cannot undo it.
A statement past the timeout is interrupted.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa

from ..config import SourceSettings
from ..errors import DatarefError, InvalidRequest, LimitExceeded
from .rows import Batches, capped, normalise

READERS = {
    ".parquet": "read_parquet",
    ".csv": "read_csv",
    ".tsv": "read_csv",
    ".json": "read_json",
    ".jsonl": "read_json",
    ".ndjson": "read_json",
}
BATCH_ROWS = 65_536
HINT = "list_sources shows this source's tables (one per file)"


class QueryTimeout(LimitExceeded):
    pass


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def table_files(root: Path) -> dict[str, Path]:
    """{view name: file} for the readable files directly in ``root`` (first of a name wins)."""
    tables: dict[str, Path] = {}
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_file() and path.suffix.lower() in READERS:
            name = re.sub(r"\W+", "_", path.stem).strip("_").lower() or "file"
            tables.setdefault(name, path)
    return tables


def open_lake(source: SourceSettings) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that sees the files of the source's directory and nothing else."""
    assert source.path is not None
    root = source.path.resolve()
    if not root.is_dir():
        raise DatarefError(
            "the directory of this source is missing - ask the operator to fix the [sources] "
            "configuration"
        )
    conn = duckdb.connect(
        ":memory:",
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "threads": 2,
        },
    )
    try:
        conn.execute(f"SET allowed_directories = [{literal(str(root) + '/')}]")
        conn.execute("SET temp_directory = ''")
        for name, path in table_files(root).items():
            reader = READERS[path.suffix.lower()]
            conn.execute(f'CREATE VIEW "{name}" AS SELECT * FROM {reader}({literal(str(path))})')
        conn.execute("SET enable_external_access = false")
        conn.execute("SET lock_configuration = true")
    except BaseException:
        conn.close()
        raise
    return conn


def run_duckdb(source: SourceSettings, sql: str) -> Batches:
    """Start ``sql`` on the lake; batches stream as the caller reads them."""
    try:
        conn = open_lake(source)
    except duckdb.Error as exc:
        raise InvalidRequest(
            f"a file of this source cannot be read ({_clean(exc, source)}) - ask the operator"
        ) from None
    fired = threading.Event()

    def interrupt() -> None:
        fired.set()
        conn.interrupt()

    timer = threading.Timer(source.timeout_seconds, interrupt)
    timer.start()

    def release() -> None:
        timer.cancel()
        conn.close()

    try:
        reader = conn.sql(sql).to_arrow_reader(BATCH_ROWS)
    except Exception as exc:
        error = translate(exc, source, fired)
        release()
        raise error from None
    target, convert = normalise(reader.schema)
    return Batches(target, capped(_read(reader, source, fired), convert, source.row_cap, release))


def _read(
    reader: pa.RecordBatchReader, source: SourceSettings, fired: threading.Event
) -> Iterator[pa.RecordBatch]:
    try:
        yield from reader
    except Exception as exc:
        raise translate(exc, source, fired) from None


def _clean(exc: Exception, source: SourceSettings) -> str:
    """DuckDB's message, first line, with the source's directory left out."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    root = str(source.path.resolve()) if source.path else ""
    return message.replace(root + "/", "").replace(root, ".")[:300]


def translate(exc: Exception, source: SourceSettings, fired: threading.Event) -> Exception:
    message = _clean(exc, source)
    if fired.is_set() or isinstance(exc, duckdb.InterruptException):
        return QueryTimeout(
            f"query ran longer than {source.timeout_seconds:g}s - add a WHERE or LIMIT, or "
            "aggregate less"
        )
    if isinstance(exc, duckdb.PermissionException):
        return InvalidRequest(
            f"DuckDB refused: {message} - this source reads only the files of its own "
            f"directory, never other paths or the network; {HINT}"
        )
    return InvalidRequest(f"DuckDB rejected the query: {message} - fix it; {HINT}")
