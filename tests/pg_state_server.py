"""A real PostgreSQL server for the shared-state tests: Debian's binaries, a temp data dir.

    server = PgServer.start()          # initdb + pg_ctl start, as an unprivileged account
    server.create_database()           # a fresh database; its postgresql:// URL
    server.stop()                      # pg_ctl stop + remove the temp dir

It listens on a Unix socket in its temp dir (and on 127.0.0.1 when ``tcp=True``). A missing
PostgreSQL is an error, not a skip: ``make test`` installs the ``postgresql`` package.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

SUPERUSER = "postgres"


def pg_bindir() -> Path:
    """Directory of initdb/pg_ctl: Debian keeps them under /usr/lib/postgresql/<version>/bin."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if versions:
        return versions[-1].parent
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise RuntimeError("PostgreSQL is not installed - `make test` installs it (postgresql)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    root: Path
    port: int
    password: str
    account: str | None  # the OS account the server runs as (None: ourselves)

    @classmethod
    def start(cls, *, tcp: bool = False) -> PgServer:
        account = "postgres" if os.getuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="dataref-pgstate-"))
        server = cls(root=root, port=free_port(), password=secrets.token_hex(16), account=account)
        try:
            server._initdb(tcp)
            server._run("pg_ctl", "-D", str(root / "data"), "-l", str(root / "log"), "-w",
                        "-t", "60", "start")  # fmt: skip
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    def _initdb(self, tcp: bool) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if self.account:
            entry = pwd.getpwnam(self.account)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o755)
        data = str(self.root / "data")
        self._run("initdb", "-D", data, "-U", SUPERUSER, "--pwfile", str(pwfile),
                  "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8")  # fmt: skip
        pwfile.unlink()
        listen = "127.0.0.1" if tcp else ""
        with (self.root / "data" / "postgresql.conf").open("a") as f:
            f.write(
                f"listen_addresses = '{listen}'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\nfsync = off\n"
                "shared_buffers = 64MB\nmax_connections = 150\n"
            )

    def _run(self, tool: str, *args: str) -> None:
        command = [str(pg_bindir() / tool), *args]
        if self.account:
            command = ["runuser", "-u", self.account, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.root)
        if done.returncode != 0:
            log = self.root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed: {done.stderr[-2000:]}{tail}")

    def url(self, db: str = "postgres") -> str:
        host = quote(str(self.root), safe="")
        return f"postgresql://{SUPERUSER}:{self.password}@/{db}?host={host}&port={self.port}"

    def create_database(self) -> str:
        import psycopg

        name = f"state_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def halt(self) -> None:
        """Stop the server at once (its data stays until ``stop``)."""
        if (self.root / "data" / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        try:
            self.halt()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_server(*, tcp: bool = False) -> Iterator[PgServer]:
    server = PgServer.start(tcp=tcp)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_state_server() -> Iterator[PgServer]:
    with running_server() as server:
        yield server


@pytest.fixture
def pg_url(pg_state_server: PgServer) -> str:
    """A fresh, empty database of the session's PostgreSQL server."""
    return pg_state_server.create_database()
