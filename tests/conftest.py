"""Shared fixtures: settings on a temp state dir, and MCP clients of the real server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from dataref.config import Settings, load_settings

# A real PostgreSQL server (session scope) for the tests that ask for `pg_server`.
pytest_plugins = ["tests.pg_server"]

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
        self.proc = subprocess.Popen(
            [DATAREF, "serve", "--http", "--port", str(self.port)],
            env=child_env(state_dir, DATAREF_AUTH__TOKENS=json.dumps(tokens), **env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                httpx2.get(f"{self.url}/mcp", timeout=1)
                return
            except httpx2.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
