"""PostgreSQL sources: each query runs as the owner's own database role, read-only.

The server connects as a login role that may read no table itself; for each query it opens
a ``READ ONLY`` transaction with a ``statement_timeout`` (enforced, and cancelled, by the
server) and ``SET LOCAL ROLE`` to the role mapped from the owner, so the database's grants
and row-level security policies choose the rows. Rows arrive through ADBC's PostgreSQL
driver (binary COPY into Arrow, measured faster than psycopg's COPY) and stream batch by
batch into the store.

A database error reaches the agent as its first ``ERROR:`` line only: never the
connection string, a password, a host name or a socket path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import adbc_driver_postgresql.dbapi as adbc_pg
import pyarrow as pa

from ..config import SourceSettings
from ..errors import DatarefError, InvalidRequest, LimitExceeded
from .rows import Batches, capped, normalise
from .sqlcheck import REWRITE

SCHEMA_HINT = "list_sources shows your tables; or SELECT * FROM information_schema.columns"
ERROR_LINE = re.compile(r"ERROR:\s+(.*)")
CONNECT_TIMEOUT = 10


class QueryTimeout(LimitExceeded):
    pass


def conninfo(source: SourceSettings) -> str:
    """libpq's URL or keyword form of the source, with the password (never logged) and a
    connect timeout added."""
    url = source.url or ""
    extra = {} if "connect_timeout" in url else {"connect_timeout": str(CONNECT_TIMEOUT)}
    password = source.password()
    if password is not None:
        extra["password"] = password
    if url.startswith(("postgresql://", "postgres://")):
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in extra.items())
        return f"{url}{'&' if '?' in url else '?'}{query}" if query else url
    for key, value in extra.items():
        escaped = value.replace("\\", "\\\\").replace("'", "\\'")
        url += f" {key}='{escaped}'"
    return url


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def connect(source: SourceSettings) -> adbc_pg.Connection:
    try:
        return adbc_pg.connect(conninfo(source), autocommit=True)
    except Exception:
        raise DatarefError(
            "this source cannot be reached right now - try again later, or ask the operator "
            "to run `dataref doctor`"
        ) from None


def begin_as_owner(cursor: Any, source: SourceSettings, owner: str) -> None:
    """A read-only transaction under the statement timeout, as ``owner``'s database role."""
    role = source.role_for(owner)
    if role is None:  # resolve_source refuses unmapped owners before this
        raise DatarefError("no database role for this owner")
    timeout_ms = max(1, int(source.timeout_seconds * 1000))
    cursor.execute("BEGIN TRANSACTION READ ONLY")
    cursor.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
    cursor.execute(f"SET LOCAL lock_timeout = {timeout_ms}")
    cursor.execute(f"SET LOCAL ROLE {quote_ident(role)}")


def run_postgres(source: SourceSettings, owner: str, sql: str) -> Batches:
    """Start ``sql`` as ``owner``'s role; batches stream as the caller reads them."""
    conn = connect(source)
    cursor = conn.cursor()

    def release() -> None:
        try:
            cursor.close()
        finally:
            conn.close()

    try:
        begin_as_owner(cursor, source, owner)
        cursor.execute(sql)
        reader = cursor.fetch_record_batch()
    except Exception as exc:
        release()
        raise translate(exc, source) from None
    target, convert = normalise(reader.schema)
    return Batches(target, capped(_read(reader, source), convert, source.row_cap, release))


def _read(reader: pa.RecordBatchReader, source: SourceSettings) -> Iterator[pa.RecordBatch]:
    try:
        yield from reader
    except Exception as exc:
        raise translate(exc, source) from None


def translate(exc: Exception, source: SourceSettings) -> Exception:
    """The agent's view of a database error: the ERROR line and a way forward, nothing else."""
    state = getattr(exc, "sqlstate", None) or ""
    match = ERROR_LINE.search(str(exc))
    message = match.group(1).strip()[:300] if match else ""
    if state == "57014" or "statement timeout" in message:
        return QueryTimeout(
            f"query ran longer than {source.timeout_seconds:g}s and was cancelled on the "
            "server - add a WHERE or LIMIT, or aggregate less"
        )
    if state == "25006" or "read-only transaction" in message:
        return InvalidRequest(f"{REWRITE}; the database refused a write ({message})")
    if state == "42501" or message.startswith(("permission denied", "must be superuser")):
        return InvalidRequest(
            f"PostgreSQL refused: {message} - your database role is not allowed this; {SCHEMA_HINT}"
        )
    if not message:
        return DatarefError("the query failed on the source - try again, or simplify it")
    return InvalidRequest(f"PostgreSQL rejected the query: {message} - fix it; {SCHEMA_HINT}")
