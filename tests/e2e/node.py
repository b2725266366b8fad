"""Running the Node tools (MCP Inspector CLI, conformance suite, auth proxy) from tests."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .conftest import NODE_BIN

HERE = Path(__file__).resolve().parent


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout.strip().splitlines()[-1])


def inspector(args: list[str], env: dict[str, str], timeout: float = 120) -> Run:
    """``mcp-inspector --cli -q --format json ARGS``: one request, one JSON line."""
    cmd = [str(NODE_BIN / "mcp-inspector"), "--cli", "-q", "--format", "json", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return Run(done.returncode, done.stdout, done.stderr)


class AuthProxy:
    """tests/e2e/auth_proxy.mjs in front of ``target``, adding ``Authorization: auth``."""

    def __init__(self, target: str, auth: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(NODE_BIN / "node"), str(HERE / "auth_proxy.mjs")],
            env={**env, "TARGET": target, "AUTH": auth, "LISTEN_PORT": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"the auth proxy did not start: {line}{self.proc.stderr.read()}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
