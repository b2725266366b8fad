"""Fixtures of the end-to-end tests: the Node tools from .node/, a dataref HTTP server.

These tests must fail, not skip, when what they drive is missing: `make test-e2e` runs
tests/e2e/setup.sh first, and a missing tool means that setup is broken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import HttpServer

ROOT = Path(__file__).resolve().parents[2]
NODE_BIN = ROOT / ".node" / "node_modules" / ".bin"
OUTPUT = ROOT / "test-output"
TOKEN = "tok-e2e"
OWNER = "e2e"


def require(path: Path | None, what: str) -> Path:
    if path is None or not path.exists():
        pytest.fail(f"{what} is missing - run `bash tests/e2e/setup.sh` (make test-e2e does)")
    return path


@pytest.fixture(scope="session")
def node_env() -> dict[str, str]:
    """The environment the Node tools run in: Node 22 from .node/ first on PATH."""
    for name in ("node", "mcp-inspector", "conformance"):
        require(NODE_BIN / name, name)
    version = subprocess.run(
        [str(NODE_BIN / "node"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert version.startswith("v22."), f"Node 22 expected in .node/, found {version}"
    return {**os.environ, "PATH": f"{NODE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@pytest.fixture(scope="session")
def chromium() -> Path:
    return require(Path(shutil.which("chromium") or "/usr/bin/chromium"), "Debian chromium")


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT.mkdir(exist_ok=True)
    return OUTPUT


@pytest.fixture(scope="session")
def http_server(tmp_path_factory) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path_factory.mktemp("e2e-http"), {TOKEN: OWNER, "tok-other": "other"})
    yield server
    server.stop()
