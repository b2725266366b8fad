"""fetch_sql: one read-only SELECT on a configured SQLite source.

Three layers, each enough on its own to stop a write, so one mistake is not a breach:
1. a tokenizer-level check that the text is a single SELECT/WITH statement;
2. the file opened read-only (``mode=ro``) plus ``PRAGMA query_only``;
3. an authorizer that allows only reading tables and calling (safe) functions.
Then the source's own limits: a statement timeout (progress handler) and a row cap.

Demo grants hold here too: an owner restricted to some regions queries a private in-memory
copy holding only those rows, so no SQL trick can reach the others.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from ..config import SourceSettings
from ..errors import AccessDenied, DatarefError, InvalidRequest, LimitExceeded
from . import ProducerContext, producer
from .demo import allowed_regions, prepare_demo

FETCH_BATCH = 10_000
# The progress handler runs every this many SQLite VM instructions (well under a ms).
PROGRESS_STEPS = 10_000
REWRITE = "fetch_sql runs one read-only SELECT (or WITH ... SELECT) statement"
WRITE_WORDS = frozenset(
    {
        "INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER",
        "REINDEX", "ANALYZE", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT",
    }
)  # fmt: skip
FORBIDDEN_WORDS = {
    "ATTACH": "other database files cannot be attached - query the tables of this source",
    "DETACH": "other database files cannot be attached - query the tables of this source",
    "PRAGMA": "pragmas are refused - read the schema with SELECT name, sql FROM sqlite_master",
    "VACUUM": "VACUUM rewrites the database - it is never needed to read it",
    "LOAD_EXTENSION": "extensions cannot be loaded - use the built-in SQL functions",
}
ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile"})
QUOTE_CLOSERS = {"'": "'", '"': '"', "`": "`", "[": "]"}


class SourceUnavailable(AccessDenied, InvalidRequest):
    """Unknown source and source not granted: one class, one message, so they look alike."""


class QueryTimeout(LimitExceeded):
    pass


def _tokens(query: str) -> Iterator[tuple[str, int]]:
    """(token, start) for each word, quoted literal, ';' and other symbol of ``query``.

    Comments and whitespace are skipped; a quoted literal or name comes back whole, so a
    keyword inside a string or a comment never counts.
    """
    i, n = 0, len(query)
    while i < n:
        ch, start = query[i], i
        if ch.isspace():
            i += 1
        elif query.startswith("--", i):
            end = query.find("\n", i)
            i = n if end < 0 else end + 1
        elif query.startswith("/*", i):
            end = query.find("*/", i + 2)
            i = n if end < 0 else end + 2  # SQLite ends an open comment at end of input
        elif ch in QUOTE_CLOSERS:
            i = _skip_quoted(query, i, QUOTE_CLOSERS[ch])
            yield query[start:i], start
        elif ch.isalpha() or ch == "_":
            while i < n and (query[i].isalnum() or query[i] in "_$"):
                i += 1
            yield query[start:i], start
        else:
            i += 1
            yield ch, start


def _skip_quoted(query: str, i: int, closer: str) -> int:
    """Index just after the literal or quoted name starting at ``i`` ('' escapes ')."""
    j = i + 1
    while True:
        end = query.find(closer, j)
        if end < 0:
            raise InvalidRequest(
                f"{REWRITE}; it has an unterminated {query[i]}...{closer} - close the quote"
            )
        if closer != "]" and query.startswith(closer * 2, end):
            j = end + 2
            continue
        return end + 1


def _is_word(token: str) -> bool:
    return token[0].isalpha() or token[0] == "_"


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: SQLite cannot take them
        return True
    return False


def check_select(query: str) -> str:
    """``query`` without its trailing ';' if it is one SELECT/WITH statement; else refuse."""
    if isinstance(query, str) and ("\x00" in query or _unencodable(query)):
        raise InvalidRequest(
            f"{REWRITE}; it contains a NUL byte or text that is not valid Unicode - remove it"
        )
    tokens = list(_tokens(query)) if isinstance(query, str) else []
    if not tokens or all(t == ";" for t, _ in tokens):
        raise InvalidRequest(f"{REWRITE}; the query is empty - write a SELECT")
    first_semicolon = next((k for k, (t, _) in enumerate(tokens) if t == ";"), len(tokens))
    if any(t != ";" for t, _ in tokens[first_semicolon:]):
        raise InvalidRequest(
            f"{REWRITE}; it holds more than one statement - send them as separate fetch_sql "
            "calls, or combine them with WITH or a subquery"
        )
    statement = tokens[:first_semicolon]
    for k, (token, _) in enumerate(statement):
        word = token.upper()
        if not _is_word(token):
            continue
        if word in FORBIDDEN_WORDS:
            raise InvalidRequest(f"{REWRITE}; {FORBIDDEN_WORDS[word]}")
        # replace(x, a, b) is a string function; REPLACE INTO is a write.
        is_call = k + 1 < len(statement) and statement[k + 1][0] == "("
        if word in WRITE_WORDS and not (word == "REPLACE" and is_call):
            raise InvalidRequest(
                f"{REWRITE}; {word} changes the database and is refused - rewrite it as a "
                f'SELECT that reads the rows you need (if {token} is a column, quote it: "{token}")'
            )
    if statement[0][0].upper() not in ("SELECT", "WITH"):
        raise InvalidRequest(
            f"{REWRITE}; this one starts with {statement[0][0]!r} - rewrite it to start with "
            "SELECT or WITH"
        )
    # Up to the end of the last token: a trailing ';' or comment would leak into column names.
    last, last_start = statement[-1]
    body = query[: last_start + len(last)]
    if not sqlite3.complete_statement(body + "\n;"):
        raise InvalidRequest(f"{REWRITE}; it is incomplete - check its quotes and comments")
    return body


def resolve_source(ctx: ProducerContext, source: str | None) -> tuple[str, SourceSettings]:
    """The source to query; unknown and not granted are refused with the same words."""
    sources = ctx.settings.all_sources()
    permitted = sorted(
        name for name, s in sources.items() if "*" in s.owners or ctx.owner in s.owners
    )
    if source is None:
        only = next(iter(sources)) if len(sources) == 1 else None
        default = "demo" if "demo" in sources else only
        if default in permitted:
            source = default
        elif len(permitted) == 1:
            source = permitted[0]
        elif not permitted:  # never name a source the owner may not use
            raise SourceUnavailable("no SQL source is available to you - ask the operator")
        else:
            raise InvalidRequest(f"name a source: source is one of {', '.join(permitted)}")
    if source not in permitted:
        listed = ", ".join(permitted) if permitted else "none"
        raise SourceUnavailable(f"unknown source {source!r}; sources you may query: {listed}")
    return source, sources[source]


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, _src: str | None):
    if action not in ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _open_file(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise DatarefError(
            f"the database of this source is missing ({path.name}) - ask the operator to fix "
            "the [sources] configuration"
        )
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def _open_restricted_demo(path: Path, owner: str, regions: list[str]) -> sqlite3.Connection:
    """An in-memory copy of the demo tables holding only what ``owner`` may see."""
    conn = sqlite3.connect(":memory:", uri=True)  # uri: ATTACH takes mode=ro
    conn.execute("ATTACH DATABASE ? AS src", (f"{path.resolve().as_uri()}?mode=ro",))
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
    conn.execute("DETACH DATABASE src")
    return conn


def open_source(ctx: ProducerContext, name: str, settings: SourceSettings) -> sqlite3.Connection:
    """A connection that can only read: read-only file, query_only, and the authorizer."""
    if name == "demo" and ctx.settings.demo.enabled and "demo" not in ctx.settings.sources:
        path = prepare_demo(ctx.settings)
        regions = allowed_regions(ctx.settings, ctx.owner)
        if regions is not None:
            conn = _open_restricted_demo(path, ctx.owner, regions)
        else:
            conn = _open_file(path)
    else:
        conn = _open_file(settings.path)
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorize)
    return conn


def run_select(conn: sqlite3.Connection, sql: str, row_cap: int, timeout: float) -> pd.DataFrame:
    """Run ``sql`` under a statement timeout and a row cap; SQLite's errors become hints."""
    deadline = time.monotonic() + timeout
    timed_out = False

    def progress() -> int:
        nonlocal timed_out
        timed_out = time.monotonic() > deadline
        return 1 if timed_out else 0  # nonzero makes SQLite interrupt the statement

    conn.set_progress_handler(progress, PROGRESS_STEPS)
    rows: list[tuple] = []
    try:
        cursor = conn.execute(sql)
        columns = [d[0] for d in cursor.description or ()]
        while batch := cursor.fetchmany(FETCH_BATCH):
            rows.extend(batch)
            if len(rows) > row_cap:
                raise LimitExceeded(
                    f"query returned more than {row_cap:,} rows - narrow the query (WHERE) or "
                    "aggregate in SQL (GROUP BY)"
                )
    except sqlite3.Error as exc:
        if timed_out:
            raise QueryTimeout(
                f"query ran longer than {timeout:g}s - add a WHERE or LIMIT, or aggregate less"
            ) from None
        raise _sqlite_error(exc) from None
    finally:
        conn.set_progress_handler(None, 0)
    return _frame(rows, columns)


def _sqlite_error(exc: sqlite3.Error) -> InvalidRequest:
    message = str(exc)
    if "not authorized" in message:
        return InvalidRequest(
            f"{REWRITE}; it may only read tables and call built-in functions (SQLite said: "
            f"{message}) - to see the schema: SELECT name, sql FROM sqlite_master"
        )
    return InvalidRequest(
        f"SQLite rejected the query: {message} - fix it; list the tables with "
        "SELECT name, sql FROM sqlite_master"
    )


def _frame(rows: list[tuple], columns: list[str]) -> pd.DataFrame:
    duplicates = sorted({c for c in columns if columns.count(c) > 1})
    if duplicates:
        raise InvalidRequest(
            f"the query returns more than one column named {duplicates[0]!r} - give each "
            "column a distinct name with AS"
        )
    return pd.DataFrame.from_records(rows, columns=columns)


@producer
def fetch_sql(ctx: ProducerContext, query: str, source: str | None = None) -> pd.DataFrame:
    """Run one read-only SQLite SELECT (or WITH ... SELECT) on a configured source.
    source defaults to "demo" (tables sales, regions); schema: SELECT name, sql FROM sqlite_master.
    Row cap and statement timeout apply; aggregate in SQL when you can."""
    sql = check_select(query)
    name, settings = resolve_source(ctx, source)
    ctx.use_source(name)
    if settings.sensitive:
        ctx.sensitive = True
    conn = open_source(ctx, name, settings)
    try:
        return run_select(conn, sql, settings.row_cap, settings.timeout_seconds)
    finally:
        conn.close()
