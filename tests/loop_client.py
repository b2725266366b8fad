"""One MCP client kept open on its own event loop, callable from synchronous code.

Hypothesis drives synchronous test functions, and opening a client (which runs the server's
lifespan) for every example would be slow. ``LoopClient`` runs an event loop in a thread,
enters the client there once, and lets each example call a tool with a plain function call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

from fastmcp import Client
from mcp.types import CallToolResult


class LoopClient:
    def __init__(self, target: Any, **client_kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = Client(target, **client_kwargs)
        self.run(self._client.__aenter__(), timeout=120)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def call(self, tool: str, arguments: dict[str, Any], timeout: float = 60) -> CallToolResult:
        """A tool call whose tool errors come back as results (``is_error``), not exceptions."""
        return self.run(
            self._client.call_tool(tool, arguments, raise_on_error=False), timeout=timeout
        )

    def list_tools(self) -> list[Any]:
        return self.run(self._client.list_tools())

    def close(self) -> None:
        try:
            self.run(self._client.__aexit__(None, None, None), timeout=120)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> LoopClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def error_text(result: CallToolResult) -> str:
    """All text of a result's content blocks."""
    return "\n".join(getattr(block, "text", "") or "" for block in result.content)
