"""Shared fixtures: settings on a temp state dir, and MCP clients of the real server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import pytest

from dataref.config import Settings, load_settings

# PostgreSQL: one server per session (pg_server); pg_url is a fresh database of it.
pytest_plugins = ["tests.pg_server", "tests.pg_state_server"]

ROOT = Path(__file__).resolve().parents[1]
DATAREF = str(Path(sys.executable).parent / "dataref")


def make_settings(state_dir: Path, **overrides) -> Settings:
    overrides.setdefault("kernels", {"warm_spares": 0})
    return load_settings(state_dir=state_dir, **overrides)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return make_settings(tmp_path / "state")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """A minimal environment for a server subprocess: nothing of ours leaks by accident."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "DATAREF_STATE_DIR": str(state_dir),
        "DATAREF_KERNELS__WARM_SPARES": "0",
    }
    env.update(extra)
    return env


class HttpServer:
    def __init__(self, state_dir: Path, tokens: dict[str, str], **env: str) -> None:
        import json

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A file, not a pipe: the server logs a JSON line per call, and a full pipe would block it.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (read after stop; freed with self)
        self.proc = subprocess.Popen(
            [DATAREF, "serve", "--http", "--port", str(self.port)],
            env=child_env(state_dir, DATAREF_AUTH__TOKENS=json.dumps(tokens), **env),
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.stderr_text()[-2000:]}")
            try:
                httpx2.get(f"{self.url}/mcp", timeout=1)
                return
            except httpx2.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def stderr_text(self) -> str:
        """What the server wrote on stderr so far (its JSON log lines)."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- kernels on a Jupyter gateway ----------------------------------------------------------------

# The backends the kernel test sets run against: local sandboxed kernels, and the same
# kernelspec launched by a real Kernel Gateway and a real Enterprise Gateway.
BACKENDS = ("local", "kg", "eg")
GATEWAY_OWNER = "analyst"  # Enterprise Gateway refuses root, the local user in CI


@pytest.fixture(scope="session")
def gateways(tmp_path_factory):
    """Started on first use, stopped at the end of the session; missing gateways FAIL."""
    from .gateways.servers import GatewaySet

    started = GatewaySet(tmp_path_factory.mktemp("gateways"))
    yield started
    started.stop_all()


def backend_settings(request, state_dir: Path, backend: str, **overrides) -> Settings:
    """make_settings for ``backend``: a gateway's url and token, and an owner it accepts."""
    if backend != "local":
        gateway = request.getfixturevalue("gateways").get(backend)
        overrides["kernels"] = gateway.kernels_settings(**overrides.get("kernels", {}))
        overrides.setdefault("owner", GATEWAY_OWNER)
    return make_settings(state_dir, **overrides)
