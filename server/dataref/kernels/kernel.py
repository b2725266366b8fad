"""NotebookKernel: one sandboxed kernel, bound to one (owner, notebook) for its whole life."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..config import Settings
from ..errors import ComputeError
from .manager import SandboxedKernelManager
from .sandbox import KernelBox
from .session import CellTimers, ExecutionResult, KernelChannels, ProgressCallback, execute_cell
from .uids import processes

log = logging.getLogger(__name__)


class NotebookKernel:
    """A kernel process (restarted in place when it dies) and its directories.

    ``lock`` is for the caller (compute): hold it across staging inputs, executing and
    collecting, so calls on one notebook run one at a time, in order (asyncio.Lock is FIFO).
    ``execute`` additionally serialises itself, so two cells never interleave even without it.
    """

    def __init__(
        self,
        box: KernelBox,
        manager: SandboxedKernelManager,
        settings: Settings,
        on_closed: Callable[[NotebookKernel], None] | None = None,
    ) -> None:
        self.kernel_id = box.kernel_id
        self.box = box
        self.owner: str | None = None  # set once, when the pool assigns it
        self.notebook: str | None = None
        self.from_spare = False
        self.lock = asyncio.Lock()
        self.inputs_dir: Path = box.inputs
        self.outputs_dir: Path = box.outputs
        self.uid = box.uid
        self.settings = settings
        self.start_seconds = 0.0
        self.restarts = 0
        self.last_used = time.monotonic()
        self._km = manager
        self._channels: KernelChannels | None = None
        self._exec_lock = asyncio.Lock()
        self._restarting: asyncio.Task[None] | None = None
        self._state_lost = False  # died while idle: the next result says variables are gone
        self._closed = False
        self._broken: str | None = None
        self._shutdown_task: asyncio.Future[None] | None = None
        self._on_closed = on_closed

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        began = time.perf_counter()
        await self._km.start_kernel()
        await self._connect()
        self.start_seconds = time.perf_counter() - began

    async def _connect(self) -> None:
        client = self._km.client()
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            timeout = self.settings.kernels.startup_timeout_seconds
            await client.wait_for_ready(timeout=timeout)
        except BaseException:
            client.stop_channels()
            raise
        self._channels = KernelChannels(client)

    async def _disconnect(self) -> None:
        channels, self._channels = self._channels, None
        if channels is not None:
            await channels.close()

    async def restart(self) -> None:
        """A fresh process in the same sandbox (same uid and /sandbox); variables are lost."""
        await self._disconnect()
        self.restarts += 1
        try:
            await self._km.restart_kernel(now=True)
            await self._connect()
        except Exception as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            log.warning("kernel %s could not restart: %s", self.kernel_id, self._broken)

    def _restart_soon(self) -> None:
        if self._restarting is None or self._restarting.done():
            self._restarting = asyncio.create_task(self.restart())

    async def shutdown(self) -> None:
        """Stop the process, remove the directories. Safe to call again and concurrently;
        cancelling a caller does not interrupt the shutdown itself."""
        self._closed = True
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._shutdown_task)

    async def _shutdown(self) -> None:
        if self._restarting is not None and not self._restarting.done():
            self._restarting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._restarting
        await self._disconnect()
        try:
            if self._km.has_kernel:
                await self._km.shutdown_kernel(now=True)
            else:
                await self._km.cleanup_resources()
        except Exception:
            log.warning("kernel %s did not shut down cleanly", self.kernel_id, exc_info=True)
        await self._kill_leftovers()
        await asyncio.to_thread(self.box.remove)
        if self._on_closed is not None:
            self._on_closed(self)

    async def _kill_leftovers(self) -> None:
        """Wait until no process of the kernel's uid is left (the sandbox's processes die a
        moment after bwrap); SIGKILL any that linger. The uid is then free for reuse."""
        if self.uid is None:
            return
        for _ in range(100):
            pids = [p for p, uid in await asyncio.to_thread(processes) if uid == self.uid]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.05)
        log.warning("kernel %s: processes of uid %s outlived it", self.kernel_id, self.uid)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        """A call holds the kernel (the caller's lock or a running cell)."""
        return self.lock.locked() or self._exec_lock.locked()

    @property
    def usable(self) -> bool:
        return not self._closed and self._broken is None

    async def is_alive(self) -> bool:
        return not self._closed and await self._km.is_alive()

    def log_tail(self) -> str:
        return self._km.log_tail()

    # -- execution ------------------------------------------------------------------------

    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        on_progress: ProgressCallback | None = None,
        store_history: bool = True,
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
            assert self._channels is not None
            result, must_restart = await execute_cell(
                self._channels,
                code,
                timers=timers,
                is_alive=self.is_alive,
                interrupt=self._km.interrupt_kernel,
                on_progress=on_progress,
                store_history=store_history,
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
        if not self._closed and self._broken is None and not await self._km.is_alive():
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

    # -- untrusted outputs ----------------------------------------------------------------

    def open_output(self, cell_id: str, filename: str, max_bytes: int) -> BinaryIO:
        """Open a file the kernel wrote under ``outputs_dir/cell_id`` without following links.

        The kernel owns ``outputs_dir`` and may have made ``cell_id`` or the file a symlink
        (to a host path the root server could read): every component is opened with
        O_NOFOLLOW relative to the previous one, and the result must be a regular file no
        larger than ``max_bytes``.
        """
        for part in (cell_id, filename):
            if not part or "/" in part or part in (".", ".."):
                raise ValueError(f"bad output path component {part!r}")
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        top = os.open(self.outputs_dir, flags | os.O_DIRECTORY)
        try:
            cell = os.open(cell_id, flags | os.O_DIRECTORY, dir_fd=top)
        finally:
            os.close(top)
        try:
            fd = os.open(filename, flags | os.O_NONBLOCK, dir_fd=cell)
        finally:
            os.close(cell)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            os.close(fd)
            kind = "not a regular file" if not stat.S_ISREG(info.st_mode) else "too large"
            raise ValueError(f"output {filename!r} is {kind}")
        return os.fdopen(fd, "rb")

    def remove_outputs(self, cell_id: str) -> None:
        """Delete ``outputs_dir/cell_id`` (never following a symlink the kernel planted)."""
        if not cell_id or "/" in cell_id or cell_id in (".", ".."):
            return
        top = os.open(self.outputs_dir, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY)
        try:
            info = os.stat(cell_id, dir_fd=top, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(cell_id, dir_fd=top, ignore_errors=True)
            else:
                os.unlink(cell_id, dir_fd=top)
        except FileNotFoundError:
            pass
        finally:
            os.close(top)
