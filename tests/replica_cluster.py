"""A real replica deployment on 127.0.0.1: PostgreSQL, N dataref replicas, HAProxy in front.

Each replica is a ``dataref serve --http`` process with a state dir of its own (as if on its
own machine) sharing the PostgreSQL state (``state.url``) and a shared blob directory
(``store.blobs``); each has its own kernel uids. HAProxy (Debian's package) balances
round-robin over the replicas that answer ``/readyz``, and its stats socket tells how many
requests each replica answered. Used by tests/test_replicas.py and the benchmarks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

from tests.pg_server import PgServer
from tests.pg_state_server import create_database, free_port

DATAREF = str(Path(sys.executable).parent / "dataref")


def haproxy_binary() -> str:
    found = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise RuntimeError("HAProxy is not installed - `make test` installs it (haproxy)")
    return found


class Replica:
    def __init__(self, index: int, root: Path, env: dict[str, str]) -> None:
        self.index = index
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = root / f"replica{index}"
        self.log = root / f"replica{index}.log"
        self.env = {
            **env,
            "DATAREF_STATE_DIR": str(self.state_dir),
            "DATAREF_KERNELS__UID_BASE": str(62000 + 100 * index),
            "DATAREF_KERNELS__UID_COUNT": "100",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [DATAREF, "serve", "--http", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=log,
            )

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.index} exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx2.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"replica {self.index} not ready: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


HAPROXY_CONFIG = """\
global
    maxconn 1024
    stats socket {socket} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout check 10s
    timeout client 600s
    timeout server 600s
    retries 3
    option redispatch 1
frontend mcp
    bind 127.0.0.1:{port}
    default_backend dataref
backend dataref
    balance roundrobin
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    default-server inter 1s fall 3 rise 2
{servers}
"""


class Cluster:
    """PostgreSQL + replicas + HAProxy; ``url`` is the load balancer's."""

    def __init__(self, replicas: int, tokens: dict[str, str], *, blobs: str | None = None,
                 extra_env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.root = Path(tempfile.mkdtemp(prefix="dataref-cluster-"))
        os.chmod(self.root, 0o755)
        self.pg: PgServer | None = None
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.tokens = tokens
        self.blobs = blobs or (self.root / "shared").as_uri()
        self.count = replicas
        self.extra_env = extra_env or {}
        self.replicas: list[Replica] = []
        self.state_url = ""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> Cluster:
        try:
            self.pg = PgServer.start()
            self.state_url = create_database(self.pg)
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": os.environ.get("HOME", "/root"),
                "DATAREF_STATE__URL": self.state_url,
                "DATAREF_STATE__POOL_SIZE": "6",  # x3 replicas: within max_connections
                "DATAREF_STORE__BLOBS": self.blobs,
                "DATAREF_AUTH__TOKENS": json.dumps(self.tokens),
                "DATAREF_KERNELS__WARM_SPARES": "1",
                "DATAREF_KERNELS__MAX_TOTAL": "32",
                "DATAREF_KERNELS__MAX_PER_OWNER": "4",
                # 8 owners' kernels per replica fit the memory budget with these limits
                "DATAREF_KERNELS__MEMORY_BYTES": str(768 << 20),
                "DATAREF_KERNELS__WORK_BYTES": str(128 << 20),
                **self.extra_env,
            }
            self.replicas = [Replica(i, self.root, env) for i in range(self.count)]
            for replica in self.replicas:
                replica.start()
            for replica in self.replicas:
                replica.wait_ready()
            self._start_haproxy()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_haproxy(self) -> None:
        servers = "\n".join(
            f"    server r{r.index} 127.0.0.1:{r.port} check" for r in self.replicas
        )
        config = self.root / "haproxy.cfg"
        config.write_text(
            HAPROXY_CONFIG.format(socket=self.stats_socket, port=self.port, servers=servers)
        )
        self.haproxy = subprocess.Popen(
            [haproxy_binary(), "-db", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "haproxy.log", "ab"),  # noqa: SIM115 - lives with the proxy
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                ready = httpx2.get(f"{self.url}/readyz", timeout=2).status_code == 200
                if ready and all(v == "UP" for v in self.server_status().values()):
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("HAProxy did not come up: " + (self.root / "haproxy.log").read_text())

    @property
    def stats_socket(self) -> Path:
        return self.root / "haproxy.sock"

    def _stats(self) -> list[dict[str, str]]:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.stats_socket))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]

    def requests_per_replica(self) -> dict[str, int]:
        """HTTP requests HAProxy sent to each replica so far (its stats socket)."""
        return {
            row["svname"]: int(row["stot"] or 0)
            for row in self._stats()
            if row.get("pxname") == "dataref" and row["svname"].startswith("r")
        }

    def server_status(self) -> dict[str, str]:
        return {
            row["svname"]: row["status"]
            for row in self._stats()
            if row.get("pxname") == "dataref" and row["svname"].startswith("r")
        }

    def stop(self) -> None:
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.terminate()
            self.haproxy.wait(timeout=10)
        for replica in self.replicas:
            replica.stop()
        if self.pg is not None:
            self.pg.stop()
        shutil.rmtree(self.root, ignore_errors=True)
