"""The live feed of a notebook: server-sent events, one per cell that is new or changed.

Two ways to learn that a notebook changed, both cheap: the transcript calls its listeners after
every write in this process (``Changes`` wakes the waiting streams at once), and every
``POLL_SECONDS`` a stream re-reads the notebook through ``Transcripts.read``, which notices
writes made by another process (a stdio server whose state ``dataref view`` shows). A stream
sends only cells whose HTML differs from what it sent before, and ends after
``STREAM_SECONDS``; the browser's EventSource reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..workspace import Workspace

POLL_SECONDS = 0.25
STREAM_SECONDS = 300
RETRY_MS = 500


class Changes:
    """In-process pub/sub of notebook writes: transcripts publish, streams wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._attached: set[int] = set()

    def attach(self, ws: Workspace) -> None:
        """Listen to this workspace's transcripts (once per Transcripts object)."""
        with self._lock:
            if id(ws.transcripts) in self._attached:
                return
            self._attached.add(id(ws.transcripts))
        ws.transcripts.listeners.append(self.publish)

    def publish(self, handle: str) -> None:
        """Called from any thread after a notebook was written."""
        with self._lock:
            waiters = list(self._waiters.get(handle, ()))
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def subscribe(self, handle: str) -> tuple[asyncio.AbstractEventLoop, asyncio.Event]:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.setdefault(handle, set()).add(waiter)
        return waiter

    def unsubscribe(self, handle: str, waiter: Any) -> None:
        with self._lock:
            self._waiters.get(handle, set()).discard(waiter)
            if not self._waiters.get(handle):
                self._waiters.pop(handle, None)


def _look(
    ws: Workspace, owner: str, handle: str, seen: str
) -> tuple[str, list[dict[str, Any]] | None]:
    """(the notebook's fingerprint, its cells if it differs from ``seen``)."""
    from .render import cells_of

    nb = ws.transcripts.read(owner, handle)
    mark = fingerprint(nb)
    return mark, (cells_of(ws, owner, handle, nb) if mark != seen else None)


def fingerprint(nb: Any) -> str:
    text = json.dumps(nb.cells, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


async def cell_events(
    changes: Changes,
    workspace: Callable[[], Workspace],
    owner: str,
    handle: str,
    render: Callable[[dict[str, Any]], str],
) -> AsyncIterator[dict[str, Any]]:
    """SSE events ``cell`` ({index, version, html}) for each new or changed cell."""
    waiter = changes.subscribe(handle)
    sent: dict[int, str] = {}
    seen = ""
    try:
        yield {"retry": RETRY_MS, "event": "ready", "data": "{}"}
        ends = time.monotonic() + STREAM_SECONDS
        while time.monotonic() < ends:
            waiter[1].clear()  # before looking: a write from now on wakes the wait below
            seen, cells = await asyncio.to_thread(_look, workspace(), owner, handle, seen)
            for cell in cells or []:
                if sent.get(cell["index"]) != cell["version"]:
                    sent[cell["index"]] = cell["version"]
                    data = {
                        "index": cell["index"],
                        "version": cell["version"],
                        "html": render(cell),
                    }
                    yield {"event": "cell", "data": json.dumps(data)}
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter[1].wait(), POLL_SECONDS)
    finally:
        changes.unsubscribe(handle, waiter)
