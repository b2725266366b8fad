"""The text check every SQL source shares: one read-only SELECT/WITH statement, parsed by sqlglot.

This is the first of several layers (each source then opens read-only, as a role or under an
authorizer that refuses writes), so one gap here is not a breach. The check refuses:

* more than one statement, and anything whose root is not a query (writes, DDL, ``PRAGMA``,
  ``ATTACH``, ``COPY``, ``DO``, ``SET``, ``INSTALL``/``LOAD``, ``EXPLAIN``, transactions...);
* writes hidden inside a query (PostgreSQL's data-modifying ``WITH``, ``SELECT ... INTO``,
  ``FOR UPDATE``);
* per dialect, functions that reach beyond the source's tables: files, the network, server
  settings (``set_config`` could switch the role), other sessions, or SQL text run at run time.

It returns the caller's own text (without a trailing ';' or comment): the database runs
exactly what the agent wrote, never a re-rendering of it.
"""

from __future__ import annotations

from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from ..errors import InvalidRequest

Dialect = Literal["sqlite", "postgres", "duckdb"]
REWRITE = "fetch_sql runs one read-only SELECT (or WITH ... SELECT) statement"
WRITE_WORDS = frozenset(
    {
        "INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE", "UPSERT", "CREATE", "DROP", "ALTER",
        "TRUNCATE", "GRANT", "REVOKE", "REINDEX", "ANALYZE", "BEGIN", "START", "COMMIT",
        "ROLLBACK", "SAVEPOINT", "RELEASE", "END", "ABORT", "CLUSTER", "REFRESH", "LOCK",
        "COMMENT", "SECURITY", "IMPORT", "EXPORT", "CHECKPOINT", "CALL", "EXECUTE", "PREPARE",
        "DEALLOCATE", "DISCARD", "LISTEN", "NOTIFY", "UNLISTEN", "DECLARE", "FETCH", "MOVE",
        "CLOSE", "REASSIGN",
    }
)  # fmt: skip
SCHEMA_HINT = {
    "sqlite": "SELECT name, sql FROM sqlite_master",
    "postgres": "list_sources, or SELECT * FROM information_schema.columns",
    "duckdb": "list_sources, or SELECT * FROM information_schema.columns",
}
FORBIDDEN_WORDS = {
    "ATTACH": "other databases cannot be attached - query the tables of this source",
    "DETACH": "other databases cannot be attached - query the tables of this source",
    "PRAGMA": "pragmas are refused - read the schema with {schema}",
    "VACUUM": "VACUUM rewrites the database - it is never needed to read it",
    "COPY": "COPY reads or writes files - select the rows instead",
    "DO": "DO runs procedural code - write the logic as a SELECT",
    "SET": "settings are fixed by the source - leave them out",
    "RESET": "settings are fixed by the source - leave them out",
    "SHOW": "settings are fixed by the source; to see the schema use {schema}",
    "INSTALL": "extensions cannot be installed - use the built-in functions",
    "LOAD": "extensions cannot be loaded - use the built-in functions",
    "LOAD_EXTENSION": "extensions cannot be loaded - use the built-in SQL functions",
    "USE": "the database is fixed by the source - qualify names instead",
    "EXPLAIN": "EXPLAIN is not a query - run the SELECT itself (add LIMIT to try it)",
}
# Nodes that mean a write or a side effect wherever they appear in the tree.
WRITES = (
    exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Create, exp.Drop, exp.Alter,
    exp.TruncateTable, exp.Copy, exp.Command, exp.Transaction, exp.Commit, exp.Rollback,
    exp.Set, exp.Pragma, exp.Into, exp.Lock, exp.Use, exp.LoadData, exp.Grant,
)  # fmt: skip
QUERIES = (exp.Select, exp.SetOperation, exp.Subquery)
# Functions that reach past the tables: files, network, settings, other sessions, SQL text.
DENIED: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "sqlite": (
        frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"}),
        ("pragma_",),
    ),
    "postgres": (
        frozenset(
            {
                "set_config",
                "pg_terminate_backend",
                "pg_cancel_backend",
                "pg_reload_conf",
                "pg_rotate_logfile",
                "pg_promote",
                "pg_switch_wal",
                "pg_notify",
                "pg_stat_file",
                "pg_export_snapshot",
                "pg_import_system_collations",
                "txid_current",
                "pg_current_xact_id",
                "nextval",
                "setval",
                "query_to_xml",
                "query_to_xmlschema",
                "query_to_xml_and_xmlschema",
                "current_setting",
            }
        ),
        (
            "pg_read_",
            "pg_ls_",
            "pg_file_",
            "lo_",
            "dblink",
            "cursor_to_",
            "table_to_",
            "schema_to_",
            "database_to_",
            "pg_advisory",
            "pg_try_advisory",
            "pg_logical_",
            "pg_replication_",
            "pg_create_",
            "pg_drop_",
            "pg_backup_",
            "pg_wal_",
        ),
    ),
    "duckdb": (
        frozenset(
            {
                "query",
                "query_table",
                "getenv",
                "install",
                "load",
                "current_setting",
                "duckdb_secrets",
                "which_secret",
                "load_extension",
            }
        ),
        (),
    ),
}


def check_select(query: str, dialect: Dialect = "sqlite") -> str:
    """``query`` without its trailing ';' if it is one read-only SELECT/WITH; else refuse."""
    if not isinstance(query, str) or "\x00" in query or _unencodable(query):
        raise InvalidRequest(
            f"{REWRITE}; it contains a NUL byte or text that is not valid Unicode - remove it"
        )
    statement = _one_statement(query, dialect)
    _check_first_word(statement[0], dialect)
    body = query[: statement[-1].end + 1]
    try:
        tree = sqlglot.parse_one(body, dialect=dialect)
    except (ParseError, TokenError) as exc:
        reason = str(exc).splitlines()[0][:160]
        raise InvalidRequest(
            f"{REWRITE}; it could not be read as {dialect} SQL ({reason}) - check the syntax "
            "near that point"
        ) from None
    _check_tree(tree, dialect)
    return body


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no database takes them
        return True
    return False


def _one_statement(query: str, dialect: Dialect) -> list[Token]:
    try:
        tokens = sqlglot.Dialect.get_or_raise(dialect).tokenize(query)
    except TokenError:
        raise InvalidRequest(
            f"{REWRITE}; it has an unterminated quote or comment - close it"
        ) from None
    if not tokens or all(t.token_type == TokenType.SEMICOLON for t in tokens):
        raise InvalidRequest(f"{REWRITE}; the query is empty - write a SELECT")
    first = next(
        (k for k, t in enumerate(tokens) if t.token_type == TokenType.SEMICOLON), len(tokens)
    )
    if first == 0 or any(t.token_type != TokenType.SEMICOLON for t in tokens[first:]):
        raise InvalidRequest(
            f"{REWRITE}; it holds more than one statement - send them as separate fetch_sql "
            "calls, or combine them with WITH or a subquery"
        )
    return tokens[:first]


def _check_first_word(token: Token, dialect: Dialect) -> None:
    word = token.text.upper()
    if word in FORBIDDEN_WORDS:
        hint = FORBIDDEN_WORDS[word].format(schema=SCHEMA_HINT[dialect])
        raise InvalidRequest(f"{REWRITE}; {hint}")
    if word in WRITE_WORDS:
        raise _write_refused(word)
    if word not in ("SELECT", "WITH", "("):
        raise InvalidRequest(
            f"{REWRITE}; this one starts with {token.text!r} - rewrite it to start with "
            "SELECT or WITH"
        )


def _write_refused(word: str) -> InvalidRequest:
    return InvalidRequest(
        f"{REWRITE}; {word} changes the database and is refused - rewrite it as a "
        f"SELECT that reads the rows you need"
    )


def _check_tree(tree: exp.Expression | None, dialect: Dialect) -> None:
    if not isinstance(tree, QUERIES):
        raise InvalidRequest(
            f"{REWRITE}; this statement is not a query - rewrite it to start with SELECT or WITH"
        )
    names, prefixes = DENIED[dialect]
    for node in tree.walk():
        if isinstance(node, WRITES):
            word = node.key.upper() if not isinstance(node, exp.Command) else str(node.this)
            if isinstance(node, exp.Into):
                word = "SELECT ... INTO"
            elif isinstance(node, exp.Lock):
                word = "FOR UPDATE/SHARE"
            raise _write_refused(word)
        if isinstance(node, exp.Func):
            name = _function_name(node)
            if name in names or name.startswith(prefixes):
                raise InvalidRequest(
                    f"{REWRITE}; {name}() reaches outside the tables of this source (files, "
                    "network, settings or other sessions) and is refused - compute what you "
                    "need with ordinary SQL functions"
                )


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return node.sql_name().lower()
