"""``dataref doctor`` for SQL sources: each reachable, and a PostgreSQL login that reads nothing.

For PostgreSQL the login role must own no table privilege of its own (NOINHERIT, membership
only), so that every row an owner gets is chosen by that owner's role. Doctor connects as
the login, lists any table it could read itself (a problem), and checks it may switch to
each mapped role. Passwords are never printed.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable

from ..config import Settings, SourceSettings

LOGIN_READABLE = """
SELECT n.nspname || '.' || c.relname FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'v', 'm', 'p', 'f')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
  AND has_table_privilege(c.oid, 'SELECT')
ORDER BY 1
"""


def check_sources(settings: Settings, say: Callable[[str], None] = print) -> bool:
    """Print one line per check; True when every source is fine."""
    ok = True
    for name, source in sorted(settings.all_sources().items()):
        try:
            problems = _check(settings, name, source, say)
        except Exception as exc:
            problems = [f"cannot be reached: {_redact(str(exc), source)}"]
        for problem in problems:
            say(f"  PROBLEM: source {name}: {problem}")
        ok = ok and not problems
    return ok


def _redact(text: str, source: SourceSettings) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "unknown error"
    password = source.password() if source.kind == "postgres" else None
    return line.replace(password, "***") if password else line


def _check(settings: Settings, name: str, source: SourceSettings, say) -> list[str]:
    if source.kind == "postgres":
        return _check_postgres(name, source, say)
    if source.kind == "duckdb":
        from .duckdb_source import open_lake, table_files

        open_lake(source).close()
        assert source.path is not None
        say(f"  ok: source {name} (duckdb): {len(table_files(source.path))} files readable")
        return []
    from .sqlite_source import database_of

    path, _ = database_of(settings, name, source, settings.owner or "")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        (tables,) = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    say(f"  ok: source {name} (sqlite): opens read-only, {tables} schema entries")
    return []


def _check_postgres(name: str, source: SourceSettings, say) -> list[str]:
    from .postgres import connect, quote_ident

    problems: list[str] = []
    conn = connect(source)
    try:
        with conn.cursor() as cursor:
            cursor.execute("BEGIN TRANSACTION READ ONLY")
            cursor.execute("SELECT current_user")
            (login,) = cursor.fetchone()
            cursor.execute(LOGIN_READABLE)
            readable = [t for (t,) in cursor.fetchall()]
            if readable:
                problems.append(
                    f"the login role {login} can read {len(readable)} table(s) itself (e.g. "
                    f"{readable[0]}) - revoke them and make it NOINHERIT"
                )
            for role in sorted(set(source.roles.values())):
                try:
                    cursor.execute(f"SET LOCAL ROLE {quote_ident(role)}")
                except Exception:
                    problems.append(f"the login cannot SET ROLE {role} - GRANT {role} TO {login}")
                    break
            cursor.execute("ROLLBACK")
    finally:
        conn.close()
    if not problems:
        say(f"  ok: source {name} (postgres): reachable; login {login} reads no table itself")
    return problems
