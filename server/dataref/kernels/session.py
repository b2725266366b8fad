"""Execute one cell on a kernel and collect what it produced.

The call never hangs: a timeout interrupts the kernel (a message on the control channel),
waits ``grace`` seconds for it to come back, and then asks for a restart; a kernel process
that exits (os._exit, segfault, SIGKILL, OOM) ends the call within a poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from jupyter_client.asynchronous import AsyncKernelClient

from .backend import Channels

log = logging.getLogger(__name__)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STREAM_KEEP_CHARS = 1 << 20  # per stream, in server memory; the agent sees far less
DISPLAYS_KEEP = 50
DISPLAYS_KEEP_BYTES = 16 << 20
POLL_SECONDS = 0.1  # how often the kernel process is checked while a cell runs
REPLY_TO_IDLE_SECONDS = 2.0  # after the reply, how long to wait for the trailing outputs
PROGRESS_CALLBACK_SECONDS = 2.0
COLLECT_MIME = "application/vnd.dataref.collect+json"

Status = Literal["ok", "error", "timeout", "died"]
ProgressCallback = Callable[[float], Awaitable[None]]


@dataclass
class ExecutionResult:
    status: Status
    stdout: str = ""
    stderr: str = ""
    error: dict[str, Any] | None = None  # {"ename", "evalue", "traceback": [...]}, ANSI-free
    displays: list[dict[str, Any]] = field(default_factory=list)  # mime bundles, in order
    elapsed_s: float = 0.0
    restarted: bool = False  # the kernel was (or is being) restarted: its variables are gone
    execution_count: int | None = None
    truncated_chars: int = 0  # stdout/stderr characters dropped beyond STREAM_KEEP_CHARS
    dropped_displays: int = 0
    user_expressions: dict[str, Any] = field(default_factory=dict)  # from the execute reply


class KernelChannels:
    """A started client plus two reader tasks feeding one queue.

    Reading in long-lived tasks means a cell's wait can time out and poll the process
    without ever cancelling a half-received zmq message.
    """

    def __init__(self, client: AsyncKernelClient) -> None:
        self.client = client
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._readers = [
            asyncio.create_task(self._read("iopub", client.get_iopub_msg)),
            asyncio.create_task(self._read("shell", client.get_shell_msg)),
        ]

    async def _read(self, channel: str, get: Callable[..., Awaitable[dict[str, Any]]]) -> None:
        while True:
            try:
                msg = await get()
            except asyncio.CancelledError:
                raise
            except Exception:  # a malformed message or a closed socket
                log.debug("kernel %s channel read failed", channel, exc_info=True)
                await asyncio.sleep(POLL_SECONDS)
                continue
            self.queue.put_nowait((channel, msg))

    async def execute(
        self, code: str, *, store_history: bool, user_expressions: dict[str, str] | None = None
    ) -> str:
        return self.client.execute(
            code,
            store_history=store_history,
            allow_stdin=False,
            stop_on_error=False,
            user_expressions=user_expressions,
        )

    def drain(self) -> None:
        """Forget messages of earlier cells."""
        while not self.queue.empty():
            self.queue.get_nowait()

    async def close(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.client.stop_channels()


class _Collector:
    """Accumulates one cell's iopub messages, bounded in memory."""

    def __init__(self) -> None:
        self.streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.kept = {"stdout": 0, "stderr": 0}
        self.truncated = 0
        self.error: dict[str, Any] | None = None
        self.displays: list[dict[str, Any]] = []
        self.display_ids: dict[str, int] = {}
        self.display_bytes = 0
        self.dropped_displays = 0
        self.idle = False
        self.clear_pending = False

    def handle(self, msg: dict[str, Any]) -> None:
        kind, content = msg.get("msg_type") or msg["header"]["msg_type"], msg.get("content", {})
        if kind not in ("status", "execute_input") and self.clear_pending:
            self._clear()
        if kind == "status":
            self.idle = self.idle or content.get("execution_state") == "idle"
        elif kind == "stream":
            self._stream(content.get("name", "stdout"), str(content.get("text", "")))
        elif kind == "error":
            self.error = {
                "ename": str(content.get("ename", "")),
                "evalue": ANSI.sub("", str(content.get("evalue", ""))),
                "traceback": [ANSI.sub("", str(t)) for t in content.get("traceback", [])],
            }
        elif kind in ("display_data", "execute_result"):
            self._display(content)
        elif kind == "update_display_data":
            self._update_display(content)
        elif kind == "clear_output":
            if content.get("wait"):
                self.clear_pending = True
            else:
                self._clear()

    def _stream(self, name: str, text: str) -> None:
        name = name if name in self.streams else "stdout"
        room = STREAM_KEEP_CHARS - self.kept[name]
        if len(text) > room:
            self.truncated += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        if text:
            self.streams[name].append(text)
            self.kept[name] += len(text)

    def _display(self, content: dict[str, Any]) -> None:
        data = content.get("data")
        if not isinstance(data, dict):
            return
        size = sum(len(v) if isinstance(v, str) else 256 for v in data.values())
        too_many = len(self.displays) >= DISPLAYS_KEEP or self.display_bytes + size > (
            DISPLAYS_KEEP_BYTES
        )
        if too_many and COLLECT_MIME not in data:  # the manifest is never dropped
            self.dropped_displays += 1
            return
        display_id = (content.get("transient") or {}).get("display_id")
        if display_id:
            self.display_ids[str(display_id)] = len(self.displays)
        self.displays.append(data)
        self.display_bytes += size

    def _update_display(self, content: dict[str, Any]) -> None:
        display_id = (content.get("transient") or {}).get("display_id")
        index = self.display_ids.get(str(display_id))
        if index is not None and isinstance(content.get("data"), dict):
            self.displays[index] = content["data"]

    def _clear(self) -> None:
        self.clear_pending = False
        self.streams = {"stdout": [], "stderr": []}
        self.kept = {"stdout": 0, "stderr": 0}
        manifests = [d for d in self.displays if COLLECT_MIME in d]
        self.displays, self.display_ids = manifests, {}

    def result(
        self, status: Status, elapsed: float, reply: dict[str, Any] | None
    ) -> ExecutionResult:
        error = self.error
        if status == "error" and error is None and reply is not None:
            aborted = reply.get("status") == "aborted"
            error = {
                "ename": "ExecutionAborted" if aborted else str(reply.get("ename", "Error")),
                "evalue": ANSI.sub("", str(reply.get("evalue", ""))),
                "traceback": [ANSI.sub("", str(t)) for t in reply.get("traceback", [])],
            }
        return ExecutionResult(
            status=status,
            stdout="".join(self.streams["stdout"]),
            stderr="".join(self.streams["stderr"]),
            error=error,
            displays=self.displays,
            elapsed_s=round(elapsed, 3),
            execution_count=(reply or {}).get("execution_count"),
            truncated_chars=self.truncated,
            dropped_displays=self.dropped_displays,
            user_expressions=_user_expressions(reply),
        )


def _user_expressions(reply: dict[str, Any] | None) -> dict[str, Any]:
    found = (reply or {}).get("user_expressions")
    return found if isinstance(found, dict) else {}


@dataclass
class CellTimers:
    timeout_s: float
    grace_s: float
    progress_interval_s: float


async def execute_cell(
    channels: Channels,
    code: str,
    *,
    timers: CellTimers,
    is_alive: Callable[[], Awaitable[bool]],
    interrupt: Callable[[], Awaitable[None]],
    on_progress: ProgressCallback | None = None,
    store_history: bool = True,
    user_expressions: dict[str, str] | None = None,
) -> tuple[ExecutionResult, bool]:
    """Run ``code``; returns the result and whether the kernel must be restarted."""
    loop = asyncio.get_running_loop()
    channels.drain()
    msg_id = await channels.execute(
        code, store_history=store_history, user_expressions=user_expressions
    )
    collector = _Collector()
    start = loop.time()
    deadline = start + timers.timeout_s
    next_progress = start + timers.progress_interval_s
    interrupted_at: float | None = None
    reply: dict[str, Any] | None = None
    reply_at = 0.0
    checked_at = start  # the process is polled at most every POLL_SECONDS, not per message
    while True:
        now = loop.time()
        if on_progress is not None and now >= next_progress:
            next_progress = now + timers.progress_interval_s
            await _report_progress(on_progress, now - start)
        if interrupted_at is None and reply is None and now >= deadline:
            interrupted_at = now
            await _interrupt(interrupt)
        if reply is not None and (collector.idle or now >= reply_at + REPLY_TO_IDLE_SECONDS):
            status = "timeout" if interrupted_at is not None else _reply_status(reply)
            return collector.result(status, now - start, reply), False
        if interrupted_at is not None and now >= interrupted_at + timers.grace_s:
            # the kernel did not come back from the interrupt: it must be restarted
            return _finish(collector, "timeout", now - start, reply, restarted=True), True
        if now >= checked_at + POLL_SECONDS:
            checked_at = now
            if not await is_alive():
                return _finish(collector, "died", now - start, reply, restarted=True), True
        try:  # a message already queued is taken without a timer and a task
            channel, msg = channels.queue.get_nowait()
        except asyncio.QueueEmpty:
            try:
                channel, msg = await asyncio.wait_for(channels.queue.get(), POLL_SECONDS)
            except TimeoutError:  # quiet for a poll interval: is the process still there?
                checked_at = min(checked_at, now - POLL_SECONDS)
                continue
        if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
            continue  # a late message of an earlier (interrupted) cell
        if channel == "shell":
            reply, reply_at = msg.get("content", {}), loop.time()
        else:
            collector.handle(msg)


def _reply_status(reply: dict[str, Any]) -> Status:
    return "ok" if reply.get("status") == "ok" else "error"


def _finish(
    collector: _Collector,
    status: Status,
    elapsed: float,
    reply: dict[str, Any] | None,
    *,
    restarted: bool,
) -> ExecutionResult:
    result = collector.result(status, elapsed, reply)
    result.restarted = restarted
    return result


async def _interrupt(interrupt: Callable[[], Awaitable[None]]) -> None:
    try:
        await interrupt()
    except Exception:  # the grace period, then a restart, still ends the call
        log.warning("interrupting a kernel failed", exc_info=True)


async def _report_progress(on_progress: ProgressCallback, elapsed: float) -> None:
    try:  # bounded: a stuck client must not stall the cell's timeout handling
        await asyncio.wait_for(on_progress(round(elapsed, 1)), PROGRESS_CALLBACK_SECONDS)
    except Exception:  # a client that went away must not break the cell
        log.debug("progress callback failed", exc_info=True)
