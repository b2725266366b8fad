"""A real PostgreSQL server for tests: Debian's binaries, a temp data dir, a Unix socket.

    server = PgServer.start()          # initdb + pg_ctl start, as an unprivileged account
    server.dsn("postgres")             # superuser conninfo (socket dir, port, password)
    server.psql("SELECT 1")            # run SQL as the superuser through psql
    server.stop()                      # pg_ctl stop + remove the temp dir

The ``pg_server`` fixture (session scope) hands one such server to every test that asks;
``pytest_plugins = ["tests.pg_server"]`` in conftest makes it visible. A missing PostgreSQL
is an error, not a skip: ``make test`` installs the ``postgresql`` package.
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

import pytest

SUPERUSER = "postgres"


def pg_bindir() -> Path:
    """Directory of initdb/pg_ctl: Debian keeps them under /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed - `make test` installs it (postgresql)")
    return versions[-1].parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    root: Path  # temp dir holding data/ and the socket
    port: int
    password: str  # the superuser's
    account: str | None  # the OS account the server runs as (None: ourselves)

    @property
    def socket_dir(self) -> Path:
        return self.root

    @classmethod
    def start(cls) -> PgServer:
        account = "postgres" if os.getuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="dataref-pg-"))
        server = cls(root=root, port=_free_port(), password=secrets.token_hex(16), account=account)
        try:
            server._initdb()
            server._run("pg_ctl", "-D", str(root / "data"), "-l", str(root / "log"), "-w",
                        "-t", "60", "start")  # fmt: skip
        except BaseException:
            server._cleanup()
            raise
        return server

    def _initdb(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if self.account:
            entry = pwd.getpwnam(self.account)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o755)
        data, auth = str(self.root / "data"), "--auth=scram-sha-256"
        self._run("initdb", "-D", data, "-U", SUPERUSER, "--pwfile", str(pwfile), auth,
                  "-E", "UTF8", "--locale=C.UTF-8")  # fmt: skip
        pwfile.unlink()
        conf = self.root / "data" / "postgresql.conf"
        # No autovacuum: the tests load static tables and ANALYZE them themselves, and an
        # auto-analyze of a table a setup transaction has just GRANTed on waits for that
        # transaction's catalog row while holding the lock the setup's own ANALYZE needs next
        # ("deadlock detected", seen once in CI).
        with conf.open("a") as f:
            f.write(
                f"listen_addresses = ''\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\nfsync = off\n"
                "shared_buffers = 64MB\nmax_connections = 40\nautovacuum = off\n"
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

    def conninfo(self, user: str = SUPERUSER, password: str | None = None, db: str = "postgres"):
        """libpq keyword conninfo for ``user`` over the Unix socket."""
        pw = self.password if user == SUPERUSER and password is None else password
        parts = [f"host={self.root}", f"port={self.port}", f"user={user}", f"dbname={db}"]
        if pw is not None:
            parts.append(f"password={pw}")
        return " ".join(parts)

    def url(self, user: str, db: str = "postgres") -> str:
        """postgresql:// URL for ``user`` (no password) over the Unix socket."""
        return f"postgresql://{user}@/{db}?host={self.root}&port={self.port}"

    def psql(self, sql: str, *, user: str = SUPERUSER, password: str | None = None,
             db: str = "postgres") -> list[list[str]]:  # fmt: skip
        """Rows of ``sql`` run through psql (unaligned, tab-separated, no headers)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PGCONNECT_TIMEOUT": "10"}
        done = subprocess.run(
            [
                str(pg_bindir() / "psql"),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-At",
                "-F",
                "\t",
                "-d",
                self.conninfo(user, password, db),
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()[-2000:]}")
        return [line.split("\t") for line in done.stdout.splitlines()]

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_server() -> Iterator[PgServer]:
    server = PgServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    with running_server() as server:
        yield server
