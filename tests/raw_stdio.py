"""A `dataref serve` subprocess spoken to by hand over stdio (handshake era).

A real client would shut the server down cleanly; the fault tests need to SIGKILL it in the
middle of a call, so they speak JSON-RPC themselves: requests can be pipelined, replies are
collected by a reader thread, and the process can be killed at any moment.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .conftest import DATAREF, child_env


class RawStdioServer:
    def __init__(self, state_dir: Path, **env: str) -> None:
        self.proc = subprocess.Popen(
            [DATAREF, "serve"],
            env=child_env(state_dir, **env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._ids = itertools.count(1)
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._handshake()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and isinstance(msg.get("id"), int):
                with self._cond:
                    self._replies[msg["id"]] = msg
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def _handshake(self) -> None:
        init = self.request(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "faults", "version": "0"},
            },
        )
        self.wait(init, timeout=120)
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def request(self, method: str, params: dict[str, Any]) -> int:
        """Send a request without waiting; returns its id."""
        msg_id = next(self._ids)
        self._send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return msg_id

    def send_call(self, tool: str, arguments: dict[str, Any]) -> int:
        return self.request("tools/call", {"name": tool, "arguments": arguments})

    def reply(self, msg_id: int) -> dict[str, Any] | None:
        with self._cond:
            return self._replies.get(msg_id)

    def wait(self, msg_id: int, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"no reply to request {msg_id}")
                self._cond.wait(min(left, 0.5))
            return self._replies[msg_id]

    def call(self, tool: str, arguments: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        """The tool's result object ({content, structuredContent?, isError})."""
        reply = self.wait(self.send_call(tool, arguments), timeout)
        assert "result" in reply, reply
        return reply["result"]

    def kill(self) -> None:
        """SIGKILL: no shutdown code of the server runs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)

    def stop(self) -> None:
        """A clean stop: stdin closed, as a host does when it quits."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=10)
