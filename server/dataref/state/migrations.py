"""Schema migrations for both engines: numbered SQL steps per component, applied in order once.

Each database records what it has applied in ``schema_migrations``. Steps run inside one
write transaction (SQLite) or under an advisory lock (PostgreSQL), so replicas starting at
the same time apply each step exactly once. The first step of every component uses
``IF NOT EXISTS``, so a state dir made before migrations existed is adopted as it is.
"""

from __future__ import annotations

from .db import Database

_REAL = {"sqlite": "REAL", "postgresql": "DOUBLE PRECISION"}
_INT = {"sqlite": "INTEGER", "postgresql": "BIGINT"}
_SERIAL = {
    "sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "postgresql": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
}

# component -> steps; {real}/{int}/{serial} become each dialect's types.
STEPS: dict[str, list[str]] = {
    "artifacts": [
        """CREATE TABLE IF NOT EXISTS artifacts (
            ref TEXT PRIMARY KEY, owner TEXT NOT NULL, kind TEXT NOT NULL,
            media_type TEXT NOT NULL, file TEXT NOT NULL, rows {int}, bytes {int} NOT NULL,
            created {real} NOT NULL, expires {real} NOT NULL, sensitive INTEGER NOT NULL,
            lineage TEXT NOT NULL, extra TEXT NOT NULL DEFAULT '{{}}');
        CREATE INDEX IF NOT EXISTS artifacts_owner ON artifacts(owner, expires)""",
    ],
    "notebooks": [
        """CREATE TABLE IF NOT EXISTS notebooks (
            handle TEXT PRIMARY KEY, owner TEXT NOT NULL, created {real} NOT NULL,
            is_default INTEGER NOT NULL DEFAULT 0);
        CREATE UNIQUE INDEX IF NOT EXISTS one_default ON notebooks(owner) WHERE is_default = 1""",
        # kernel: what the notebook's variables live in (the kernel map; see transcript.py);
        # doc/version: the notebook itself when the engine holds it (PostgreSQL).
        """ALTER TABLE notebooks ADD COLUMN kernel TEXT;
        ALTER TABLE notebooks ADD COLUMN doc TEXT;
        ALTER TABLE notebooks ADD COLUMN version {int} NOT NULL DEFAULT 0""",
        # The journal of cells (state/journal.py), the source of truth of every transcript;
        # materialised: how many of them the notebook's document (file or doc) holds.
        """CREATE TABLE cells (
            handle TEXT NOT NULL, seq {int} NOT NULL, cell TEXT NOT NULL,
            PRIMARY KEY (handle, seq));
        ALTER TABLE notebooks ADD COLUMN materialised {int} NOT NULL DEFAULT 0""",
        # Kernels every replica can reach (state/kernel_map.py): the notebook -> kernel map
        # (handle set), the warm spares a replica started (holder set) and the replicas alive.
        """CREATE TABLE kernels (
            id TEXT PRIMARY KEY, handle TEXT UNIQUE, holder TEXT, last_used {real} NOT NULL);
        CREATE TABLE replicas (id TEXT PRIMARY KEY, seen {real} NOT NULL)""",
    ],
    "links": [
        """CREATE TABLE IF NOT EXISTS links (
            token TEXT PRIMARY KEY, owner TEXT NOT NULL, kind TEXT NOT NULL,
            target TEXT NOT NULL, media_type TEXT NOT NULL, filename TEXT NOT NULL,
            created {real} NOT NULL, expires {real} NOT NULL);
        CREATE INDEX IF NOT EXISTS links_expires ON links(expires)""",
    ],
    # The page's browser sessions (web/sessions.py) and what each call showed (shown.py):
    # in the shared database too, so any replica serves a signed-in person the whole page.
    "page": [
        """CREATE TABLE IF NOT EXISTS sessions (
            id_hash TEXT PRIMARY KEY, owner TEXT NOT NULL, csrf TEXT NOT NULL,
            created {real} NOT NULL, expires {real} NOT NULL);
        CREATE INDEX IF NOT EXISTS sessions_expires ON sessions(expires);
        CREATE TABLE IF NOT EXISTS shown (
            seq {serial}, owner TEXT NOT NULL, handle TEXT NOT NULL,
            code_hash TEXT NOT NULL, at {real} NOT NULL, body TEXT NOT NULL);
        CREATE INDEX IF NOT EXISTS shown_notebook ON shown(owner, handle, seq)""",
    ],
}


def migrate(db: Database, component: str) -> int:
    """Apply the component's pending steps; returns the schema version now in place."""
    steps = STEPS[component]
    with db.tx(write=True, lock="dataref:migrations") as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(component TEXT NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (component, version))"
        )
        done = {
            v
            for (v,) in cur.execute(
                "SELECT version FROM schema_migrations WHERE component = ?", (component,)
            ).fetchall()
        }
        for version, step in enumerate(steps, start=1):
            if version in done:
                continue
            sql = step.format(
                real=_REAL[db.dialect], int=_INT[db.dialect], serial=_SERIAL[db.dialect]
            )
            for statement in filter(str.strip, sql.split(";")):
                cur.execute(statement)
            cur.execute(
                "INSERT INTO schema_migrations (component, version) VALUES (?, ?)",
                (component, version),
            )
    return len(steps)
