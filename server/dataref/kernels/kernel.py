"""NotebookKernel: one sandboxed kernel, bound to one (owner, notebook) for its whole life."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ..config import Settings
from ..errors import ComputeError
from ..store import ArtifactStore
from .backend import KernelProcess
from .session import CellTimers, ExecutionResult, ProgressCallback, execute_cell

log = logging.getLogger(__name__)


class NotebookKernel:
    """A kernel process of some backend (restarted in place when it dies).

    ``lock`` is for the caller (compute): hold it across staging inputs, executing and
    collecting, so calls on one notebook run one at a time, in order (asyncio.Lock is FIFO).
    ``execute`` additionally serialises itself, so two cells never interleave even without it.
    """

    def __init__(
        self,
        process: KernelProcess,
        settings: Settings,
        on_closed: Callable[[NotebookKernel], None] | None = None,
    ) -> None:
        self.kernel_id = process.kernel_id
        self.process = process
        self.owner: str | None = None  # set once, when the pool assigns it
        self.notebook: str | None = None
        self.from_spare = False
        self.lock = asyncio.Lock()
        self.uid = process.uid
        self.settings = settings
        self.start_seconds = 0.0
        self.restarts = 0
        self.last_used = time.monotonic()
        self._exec_lock = asyncio.Lock()
        self._restarting: asyncio.Task[None] | None = None
        self._state_lost = False  # died while idle: the next result says variables are gone
        self._closed = False
        self._broken: str | None = None
        self._shutdown_task: asyncio.Future[None] | None = None
        self._on_closed = on_closed
        self.detached = False  # closed by ``detach``: the process runs on for other replicas

    # Local-backend conveniences (its directories), for tests and diagnostics only.
    @property
    def box(self) -> Any:
        return self.process.box  # type: ignore[attr-defined]

    @property
    def inputs_dir(self) -> Path:
        return self.process.inputs_dir  # type: ignore[attr-defined]

    @property
    def outputs_dir(self) -> Path:
        return self.process.outputs_dir  # type: ignore[attr-defined]

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        began = time.perf_counter()
        await self.process.start()
        self.start_seconds = time.perf_counter() - began

    async def restart(self) -> None:
        """A fresh process in the same place (same sandbox); variables are lost."""
        self.restarts += 1
        try:
            await self.process.restart()
        except Exception as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            log.warning("kernel %s could not restart: %s", self.kernel_id, self._broken)

    def _restart_soon(self) -> None:
        if self._restarting is None or self._restarting.done():
            self._restarting = asyncio.create_task(self.restart())

    async def shutdown(self) -> None:
        """Stop the process, free what it held. Safe to call again and concurrently;
        cancelling a caller does not interrupt the shutdown itself."""
        self._closed = True
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._shutdown_task)

    async def detach(self) -> None:
        """Let go of a kernel other replicas serve (a backend whose kernels they all reach):
        disconnect and forget it here, leave the process running."""
        if self._shutdown_task is None:
            self.detached = True
        await self.shutdown()

    async def _shutdown(self) -> None:
        if self._restarting is not None and not self._restarting.done():
            self._restarting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._restarting
        try:
            if self.detached:
                await self.process.detach()  # type: ignore[attr-defined]
            else:
                await self.process.shutdown()
        except Exception:
            log.warning("kernel %s did not shut down cleanly", self.kernel_id, exc_info=True)
        if self._on_closed is not None:
            self._on_closed(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def restarting(self) -> bool:
        """A restart this object asked for is under way (the next call waits for it)."""
        return self._restarting is not None and not self._restarting.done()

    @property
    def busy(self) -> bool:
        """A call holds the kernel (the caller's lock or a running cell)."""
        return self.lock.locked() or self._exec_lock.locked()

    @property
    def usable(self) -> bool:
        return not self._closed and self._broken is None

    async def is_alive(self) -> bool:
        return not self._closed and await self.process.is_alive()

    def log_tail(self) -> str:
        return self.process.log_tail()

    # -- execution ------------------------------------------------------------------------

    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        on_progress: ProgressCallback | None = None,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
    ) -> ExecutionResult:
        """Run one cell. Never hangs: see ``session.execute_cell``.

        After status "died", or "timeout" with ``restarted``, a fresh process is started in
        the background; the next call waits for it.
        """
        async with self._exec_lock:
            await self._ready()
            self.last_used = time.monotonic()
            lost, self._state_lost = self._state_lost, False
            compute = self.settings.compute
            timers = CellTimers(
                timeout_s=timeout_s,
                grace_s=compute.interrupt_grace_seconds,
                progress_interval_s=compute.progress_interval_seconds,
            )
            channels = self.process.channels
            assert channels is not None
            result, must_restart = await execute_cell(
                channels,
                code,
                timers=timers,
                is_alive=self.is_alive,
                interrupt=self.process.interrupt,
                on_progress=on_progress,
                store_history=store_history,
                user_expressions=user_expressions,
            )
            result.restarted = result.restarted or lost
            if must_restart and not self._closed:
                self._restart_soon()
            self.last_used = time.monotonic()
            return result

    async def _ready(self) -> None:
        """Wait for a pending restart; restart a process that died while idle."""
        if self._restarting is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._restarting)
        if not self._closed and self._broken is None and not await self.process.is_alive():
            self._state_lost = True
            await self.restart()
        if self._closed:
            raise ComputeError(
                "this notebook's kernel was stopped (reset, or idle too long) - call run_python "
                "again for a fresh one; your artifacts are kept"
            )
        if self._broken is not None:
            raise ComputeError(
                f"the kernel could not be restarted ({self._broken}) - call reset_kernel "
                "for a fresh one; your artifacts are kept"
            )

    # -- data in and out (untrusted outputs) ----------------------------------------------

    async def stage(self, store: ArtifactStore, owner: str, refs: list[str]) -> None:
        """Make the tables ``refs`` loadable in this kernel (before the cell that binds them)."""
        await self._ready()
        await self.process.stage(store, owner, refs)

    def read_output(self, cell_id: str, filename: str, max_bytes: int) -> bytes:
        """What the kernel wrote as ``filename`` for ``cell_id``; at most ``max_bytes``, else
        ValueError('... too large'). Untrusted. Called from a worker thread."""
        return self.process.read_output(cell_id, filename, max_bytes)

    def open_output(self, cell_id: str, filename: str, max_bytes: int) -> BinaryIO:
        """The local backend's file itself (tests of the profile)."""
        return self.process.open_output(cell_id, filename, max_bytes)  # type: ignore[attr-defined]

    def remove_outputs(self, cell_id: str) -> None:
        self.process.remove_outputs(cell_id)
