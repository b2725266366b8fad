"""list_sources: the sources an owner may query, with a compact schema and no row values.

Each source is read the way its queries are: PostgreSQL as the owner's own role (so the
listing holds only the tables that role may read), DuckDB through the same locked-down
lake, SQLite read-only. Row counts are estimates (PostgreSQL's statistics, SQLite's max
rowid, Parquet metadata) and are left out where they could tell an owner how many rows a
policy hides from them (tables under row-level security, a restricted demo copy).

The listing is bounded: past ``LISTING_MAX_BYTES`` of JSON, the last tables lose their
columns and then whole tables are left out, with a note saying how to see the rest.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from ..config import Settings, SourceSettings
from ..errors import DatarefError
from . import ProducerContext
from .sql import permitted_sources

LISTING_MAX_BYTES = 8192
Tables = dict[str, dict[str, Any]]

PG_TABLES = """
SELECT CASE WHEN n.nspname = 'public' THEN c.relname ELSE n.nspname || '.' || c.relname END,
       CASE WHEN c.relrowsecurity OR c.reltuples < 0 THEN NULL ELSE c.reltuples::bigint END,
       a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relkind IN ('r', 'v', 'm', 'p', 'f')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
  AND has_table_privilege(c.oid, 'SELECT')
ORDER BY 1, a.attnum
"""


def list_sources(settings: Settings, owner: str) -> dict[str, Any]:
    """{"sources": [...]} for ``owner``: name, dialect and tables of each granted source."""
    ctx = ProducerContext(owner=owner, settings=settings)
    listing = []
    for name, source in permitted_sources(ctx).items():
        entry: dict[str, Any] = {"name": name, "dialect": source.kind}
        if source.sensitive:
            entry["sensitive"] = True
        try:
            entry["tables"] = _tables(settings, name, source, owner)
        except Exception:  # one unreachable source must not hide the others
            entry["error"] = "unreachable right now - try again later"
        listing.append(entry)
    return bound({"sources": listing})


def _tables(settings: Settings, name: str, source: SourceSettings, owner: str) -> Tables:
    if source.kind == "postgres":
        return _postgres_tables(source, owner)
    if source.kind == "duckdb":
        return _duckdb_tables(source)
    return _sqlite_tables(settings, name, source, owner)


def _add(tables: Tables, table: str, rows: int | None, column: str, kind: str) -> None:
    entry = tables.setdefault(table, {"rows": rows, "columns": {}})
    entry["columns"][column] = kind.lower()


def _postgres_tables(source: SourceSettings, owner: str) -> Tables:
    from .postgres import begin_as_owner, connect

    conn = connect(source)
    try:
        with conn.cursor() as cursor:
            begin_as_owner(cursor, source, owner)
            cursor.execute(PG_TABLES)
            rows = cursor.fetchall()
            cursor.execute("ROLLBACK")
    finally:
        conn.close()
    tables: Tables = {}
    for table, estimate, column, kind in rows:
        _add(tables, table, estimate, column, kind)
    return tables


def _duckdb_tables(source: SourceSettings) -> Tables:
    from .duckdb_source import open_lake, table_files

    assert source.path is not None
    files = table_files(source.path.resolve())
    conn = open_lake(source)
    tables: Tables = {}
    try:
        for table, path in files.items():
            rows = None
            if path.suffix.lower() == ".parquet":
                (rows,) = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
            for column, kind, *_ in conn.execute(f'DESCRIBE "{table}"').fetchall():
                _add(tables, table, rows, column, kind)
    finally:
        conn.close()
    return tables


def _sqlite_tables(settings: Settings, name: str, source: SourceSettings, owner: str) -> Tables:
    from .sqlite_source import database_of

    path, regions = database_of(settings, name, source, owner)
    if not path.is_file():
        raise DatarefError("missing")
    tables: Tables = {}
    uri = f"{path.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        names = conn.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()
        for table, kind in names:
            rows = None
            if kind == "table" and regions is None:
                with contextlib.suppress(sqlite3.Error):  # WITHOUT ROWID tables have none
                    (rows,) = conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()
            for _cid, column, declared, *_ in conn.execute(
                "SELECT * FROM pragma_table_info(?)", (table,)
            ):
                _add(tables, table, rows, column, declared or "any")
    return tables


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def bound(listing: dict[str, Any], limit: int = LISTING_MAX_BYTES) -> dict[str, Any]:
    """``listing`` cut to ``limit`` bytes of JSON: columns go first, then whole tables."""
    entries = [(s, t) for s in listing["sources"] for t in list(s.get("tables", {}))]
    for source, table in reversed(entries):
        if _size(listing) <= limit:
            return listing
        source["tables"][table] = {"rows": source["tables"][table]["rows"], "columns": "..."}
    for source, table in reversed(entries):
        if _size(listing) <= limit:
            break
        del source["tables"][table]
        source["more"] = "tables left out - SELECT * FROM information_schema.tables"
    return listing
