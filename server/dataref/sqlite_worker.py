"""The child process that runs one SQLite query and streams it back as Arrow IPC batches.

Two pipes join it to the server: a control pipe (``READY`` first, then ``END`` with the row
count, or ``ERROR`` with SQLite's message) and a data pipe carrying the result as one Arrow
IPC stream, written batch by batch straight from the driver's buffers and read by the server
without a copy through Python. The data pipe is closed before the last control message, so
the server knows the stream is over; a stream is complete only when ``END`` follows it with
the same row count.

A query runs in a process of its own (forked from a forkserver that has already imported
this module) because SQLite through ADBC cannot be interrupted: a statement that runs past
the timeout is stopped by killing its process, not left burning a server thread.

In the child, three layers each stop a write on their own:
1. the text check (``sqlcheck``) already ran in the server;
2. the statement is prepared (and stopped before its first step) on a read-only connection
   under an authorizer that allows only reading tables and calling safe functions;
3. ADBC runs it on a read-only (``mode=ro``) connection with ``PRAGMA query_only``.

Columns declared ``DATE``, ``DATETIME`` or ``TIMESTAMP`` (found by sqlglot's type annotation
of the query against the declared schema) arrive as timestamps.
"""

from __future__ import annotations

import contextlib
import sqlite3
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa

# Imported by the forkserver before it forks (see producers/sqlite_source); the server itself
# never needs them, so they are imported where used. This module lives outside
# dataref.producers so that the forkserver does not import pandas for nothing.
# The low-level driver only: ADBC's DB-API layer would add pandas (about 100 MiB) to the
# forkserver and so to every child's resident pages.
PRELOAD = (
    "adbc_driver_manager",
    "adbc_driver_sqlite",
    "sqlglot.dialects.sqlite",
    "sqlglot.optimizer.qualify",
    "sqlglot.optimizer.annotate_types",
)
BATCH_ROWS = 65_536
DATE_TYPES = {"DATE", "DATETIME", "TIMESTAMP"}
ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile"})
TIMESTAMP = pa.timestamp("us")

# Control messages: READY first, alone (the statement timeout starts from here); then END
# followed by the row count sent, or ERROR followed by (message, denied).
READY, ERROR, END = b"R", b"E", b"Z"
PIPE_BYTES = 1 << 20  # the data pipe's buffer (Linux's default 64 KiB costs a switch per 64 KiB)


class QueryError(Exception):
    """SQLite refused or failed the query; the message is SQLite's own (no paths in it)."""

    def __init__(self, message: str, *, denied: bool = False) -> None:
        super().__init__(message)
        self.denied = denied


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, _src: str | None):
    if action not in ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def restricted_copy(source: Path, target: Path, owner: str, regions: list[str]) -> Path:
    """A copy of the demo tables holding only the rows ``owner`` may see."""
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("ATTACH DATABASE ? AS src", (f"{source.resolve().as_uri()}?mode=ro",))
        marks = ", ".join("?" * len(regions))
        conn.execute(
            f"CREATE TABLE sales AS SELECT * FROM src.sales WHERE region IN ({marks})", regions
        )
        conn.execute(
            f"CREATE TABLE regions AS SELECT * FROM src.regions WHERE name IN ({marks})", regions
        )
        conn.execute("CREATE TABLE grants AS SELECT * FROM src.grants WHERE owner = ?", (owner,))
        conn.execute("CREATE INDEX sales_date ON sales (date)")
        conn.commit()
    return target


def _declared_schema(conn: sqlite3.Connection) -> dict[str, dict[str, str]]:
    tables = [
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
        )
    ]
    return {
        t: {
            row[1]: (row[2] or "TEXT")
            for row in conn.execute("SELECT * FROM pragma_table_info(?)", (t,))
        }
        for t in tables
    }


def date_columns(sql: str, schema: dict[str, dict[str, str]]) -> set[str]:
    """Output columns of ``sql`` whose type is a declared DATE/DATETIME/TIMESTAMP."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify

    try:
        tree = qualify(
            sqlglot.parse_one(sql, dialect="sqlite"),
            schema=schema,
            dialect="sqlite",
            validate_qualify_columns=False,  # rowid and friends are not in the schema
        )
        tree = annotate_types(tree, schema=schema, dialect="sqlite")
    except Exception:  # sqlglot cannot follow this query: its columns keep SQLite's types
        return set()
    selects = tree.selects if isinstance(tree, exp.Query) else []
    return {
        s.alias_or_name for s in selects if s.type is not None and s.type.this.name in DATE_TYPES
    }


def check_and_type(path: Path, sql: str) -> set[str]:
    """Prepare ``sql`` under the authorizer (never run it); the columns to read as dates."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        schema = _declared_schema(conn)
    # A connection of its own: one that already used pragma_table_info would not ask again.
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        conn.execute("PRAGMA query_only = ON")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # schema loaded first
        conn.set_authorizer(_authorize)
        # Prepared (the authorizer sees every table and function) but stopped before its
        # first step: the progress handler interrupts at once.
        conn.set_progress_handler(lambda: 1, 1)
        try:
            conn.execute(sql)
        except sqlite3.OperationalError as exc:
            if str(exc) != "interrupted":
                raise QueryError(str(exc), denied="not authorized" in str(exc)) from None
        except sqlite3.Error as exc:
            raise QueryError(str(exc), denied="not authorized" in str(exc)) from None
    return date_columns(sql, schema)


def _as_dates(batch: pa.RecordBatch, dates: set[str]) -> pa.RecordBatch:
    if not dates:
        return batch
    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if field.name in dates and pa.types.is_string(field.type):
            try:
                column = column.cast(TIMESTAMP)
            except pa.ArrowInvalid:
                raise QueryError(
                    f"column {field.name!r} is declared as a date but holds values that are "
                    f"not ISO dates - select CAST({field.name} AS TEXT) to fetch it as text"
                ) from None
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def adbc_message(exc: Exception) -> str:
    """SQLite's words from an ADBC error: no driver prefix, no echo of the query."""
    text = str(exc).split("\nquery:", 1)[0].strip().splitlines()[0] if str(exc).strip() else ""
    text = text.split("] ", 1)[-1]
    for prefix in ("Failed to prepare query: ", "Failed to execute query: "):
        text = text.removeprefix(prefix)
    return text[:500] or type(exc).__name__


def serve(job: dict[str, Any], out: Connection, data: Connection) -> None:
    """Entry point of the child: run ``job``, stream the result to ``data``, report on ``out``."""
    out.send_bytes(READY)
    try:
        path = Path(job["path"])
        if job.get("regions") is not None:
            path = restricted_copy(path, Path(job["tmpdir"]) / "view.sqlite", job["owner"],
                                   job["regions"])  # fmt: skip
        dates = check_and_type(path, job["sql"])
        rows = _stream(path, job["sql"], dates, data)
        data.close()
        out.send_bytes(END)
        out.send(rows)
    except QueryError as exc:
        data.close()
        out.send_bytes(ERROR)
        out.send((str(exc), exc.denied))
    except Exception as exc:  # SQLite's message through ADBC: keep the part after the code
        data.close()
        out.send_bytes(ERROR)
        out.send((adbc_message(exc), False))
    finally:
        out.close()


def _stream(path: Path, sql: str, dates: set[str], data: Connection) -> int:
    """Run ``sql`` and write its rows to ``data`` as one Arrow IPC stream; the row count."""
    # ADBC's low-level API: its DB-API layer would import polars and pandas in every child.
    import adbc_driver_manager as adbc
    import adbc_driver_sqlite

    database = adbc_driver_sqlite.connect(f"{path.resolve().as_uri()}?mode=ro")
    conn = adbc.AdbcConnection(database)
    statement = adbc.AdbcStatement(conn)
    rows = 0
    try:
        statement.set_sql_query("PRAGMA query_only = ON")
        statement.execute_update()
        statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
        statement.set_sql_query(sql)
        handle, _ = statement.execute_query()
        with pa.RecordBatchReader._import_from_c(handle.address) as reader:
            schema = pa.schema(
                [
                    pa.field(
                        f.name,
                        TIMESTAMP if f.name in dates and pa.types.is_string(f.type) else f.type,
                    )
                    for f in reader.schema
                ]
            )
            # Buffered: a write to a pipe may be partial, BufferedWriter finishes it.
            with (
                open(data.fileno(), "wb", closefd=False) as sink,
                pa.ipc.new_stream(sink, schema) as writer,
            ):
                for batch in reader:
                    writer.write_batch(_as_dates(batch, dates))
                    rows += batch.num_rows
    finally:
        statement.close()
        conn.close()
        database.close()
    return rows
