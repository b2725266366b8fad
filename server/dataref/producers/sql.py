"""fetch_sql: one read-only SELECT on a configured source, whatever its dialect.

Every source takes the same path: the owner must be granted the source (an unknown source,
a source not granted and, for PostgreSQL, an owner with no database role all read alike);
the text passes ``sqlcheck`` for the source's dialect; then the source's own module runs it
under its own read-only rules and streams Arrow batches, which the store writes under its
byte cap while ``rows.capped`` holds the row cap.
"""

from __future__ import annotations

from ..config import SourceSettings
from ..errors import AccessDenied, InvalidRequest
from . import ProducerContext, producer
from .rows import Batches


class SourceUnavailable(AccessDenied, InvalidRequest):
    """Unknown source and source not granted: one class, one message, so they look alike."""


def granted(source: SourceSettings, owner: str) -> bool:
    if "*" not in source.owners and owner not in source.owners:
        return False
    return source.kind != "postgres" or source.role_for(owner) is not None


def permitted_sources(ctx: ProducerContext) -> dict[str, SourceSettings]:
    """The sources ``ctx.owner`` may query, by name."""
    return {
        name: s for name, s in sorted(ctx.settings.all_sources().items()) if granted(s, ctx.owner)
    }


def resolve_source(ctx: ProducerContext, source: str | None) -> tuple[str, SourceSettings]:
    """The source to query; unknown and not granted are refused with the same words."""
    sources = ctx.settings.all_sources()
    permitted = sorted(permitted_sources(ctx))
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


def run_query(ctx: ProducerContext, name: str, source: SourceSettings, sql: str) -> Batches:
    """Run already-checked ``sql`` on ``source`` under its own rules."""
    if source.kind == "postgres":
        from .postgres import run_postgres

        return run_postgres(source, ctx.owner, sql)
    if source.kind == "duckdb":
        from .duckdb_source import run_duckdb

        return run_duckdb(source, sql)
    from .sqlite_source import run_sqlite

    return run_sqlite(ctx.settings, name, source, ctx.owner, sql)


@producer
def fetch_sql(ctx: ProducerContext, query: str, source: str | None = None) -> Batches:
    """One read-only SELECT/WITH on a SQLite, PostgreSQL or DuckDB source, in its dialect.
    list_sources shows your sources and tables; source defaults to "demo".
    Row cap and statement timeout apply; aggregate in SQL when you can."""
    from .sqlcheck import check_select  # sqlglot (9 MiB) loads with the first query

    name, settings = resolve_source(ctx, source)
    ctx.use_source(name)
    sql = check_select(query, settings.kind or "sqlite")
    if settings.sensitive:
        ctx.sensitive = True
    return run_query(ctx, name, settings, sql)
