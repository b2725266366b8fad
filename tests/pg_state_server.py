"""PostgreSQL for the shared-state tests, on the sources tests' server (tests/pg_server.py).

    url = create_database(server)      # a fresh database; its postgresql:// URL (superuser)
    halt(server)                       # stop it at once (readiness tests)

The ``pg_url`` fixture gives each test a fresh database of the session's ``pg_server``.
"""

from __future__ import annotations

import secrets
import socket
from urllib.parse import quote

import pytest

from tests.pg_server import SUPERUSER, PgServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def superuser_url(server: PgServer, db: str = "postgres") -> str:
    host = quote(str(server.root), safe="")
    return f"postgresql://{SUPERUSER}:{server.password}@/{db}?host={host}&port={server.port}"


def create_database(server: PgServer) -> str:
    import psycopg

    name = f"state_{secrets.token_hex(6)}"
    with psycopg.connect(superuser_url(server), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return superuser_url(server, name)


def halt(server: PgServer) -> None:
    """Stop the server at once (its temp dir stays until ``server.stop()``, which then only
    cleans up and says pg_ctl found no server)."""
    server._run("pg_ctl", "-D", str(server.root / "data"), "-m", "immediate", "-w", "stop")


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh, empty database of the session's PostgreSQL server."""
    return create_database(pg_server)
