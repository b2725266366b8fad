"""The local backend: sandboxed ipykernels on this machine (bwrap, one uid each), over ipc.

Inputs are hard links into the kernel's read-only inputs dir; outputs are files the kernel
wrote in its own outputs dir, opened without following links.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import stat
from pathlib import Path
from typing import Any, BinaryIO

from jupyter_client.asynchronous import AsyncKernelClient

from ..config import Settings
from ..errors import ComputeError, LimitExceeded
from ..store import ArtifactStore
from . import sandbox
from .budget import MemoryBudget
from .manager import SandboxedKernelManager
from .sandbox import KernelBox, detect_runtime
from .seccomp import build_filter
from .session import KernelChannels
from .uids import UidAllocator, processes

log = logging.getLogger(__name__)


class LocalBackend:
    name = "local"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.mode = sandbox.resolve_mode(settings)
        self.sandboxed = self.mode != "unsandboxed"
        self.budget = MemoryBudget(settings.kernels)
        self.root: Path = settings.state_dir / "kernels"
        self.seccomp_file = self.root / "seccomp.bpf"
        self.runtime = detect_runtime()
        k = settings.kernels
        self.uids = UidAllocator(k.uid_base, k.uid_count)

    async def start(self) -> None:
        if self.sandboxed:
            _require_sandbox(self.mode, self.root)
        else:
            log.warning("kernels run UNSANDBOXED (kernels.sandbox = 'unsandboxed')")
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        await asyncio.to_thread(sandbox.remove_stale_boxes, self.root)
        if self.sandboxed:  # written whole, then renamed: a starting kernel never reads half
            write_seccomp(self.seccomp_file)
        sandbox.profile_startup_dir()  # fail now, not at the first call

    def new_process(self, owner: str | None) -> LocalProcess:
        kernel_id = secrets.token_hex(5)  # short: ipc socket paths are limited to 107 bytes
        self.budget.reserve(kernel_id)
        try:
            uid = self.uids.allocate() if self.mode == "uid" else None
        except OSError as exc:
            self.budget.release(kernel_id)
            raise LimitExceeded(f"{exc}") from exc
        box = KernelBox(kernel_id=kernel_id, root=self.root / kernel_id, uid=uid, mode=self.mode)
        manager = SandboxedKernelManager(
            box=box,
            runtime=self.runtime,
            settings=self.settings,
            seccomp_file=self.seccomp_file if self.sandboxed else None,
        )
        return LocalProcess(box, manager, self)

    async def close(self) -> None:
        return None


def write_seccomp(path: Path) -> None:
    partial = path.parent / f".seccomp.{secrets.token_hex(4)}"
    partial.write_bytes(build_filter())
    os.chmod(partial, 0o644)
    os.replace(partial, path)


class LocalProcess:
    """A SandboxedKernelManager, its KernelBox, and the channels of its client."""

    def __init__(self, box: KernelBox, manager: SandboxedKernelManager, backend: LocalBackend):
        self.kernel_id = box.kernel_id
        self.box = box
        self.uid = box.uid
        self._km = manager
        self._backend = backend
        self._channels: KernelChannels | None = None

    @property
    def channels(self) -> KernelChannels | None:
        return self._channels

    @property
    def inputs_dir(self) -> Path:
        return self.box.inputs

    @property
    def outputs_dir(self) -> Path:
        return self.box.outputs

    async def start(self) -> None:
        self.box.create()  # a few mkdir/chown: not in a thread, which a cancel could not stop
        await self._km.start_kernel()
        await self._connect()

    async def _connect(self) -> None:
        client: AsyncKernelClient = self._km.client()
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            timeout = self._backend.settings.kernels.startup_timeout_seconds
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
        await self._disconnect()
        await self._km.restart_kernel(now=True)
        await self._connect()

    async def shutdown(self) -> None:
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
        self._backend.uids.release(self.uid)
        self._backend.budget.release(self.kernel_id)

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

    async def is_alive(self) -> bool:
        return await self._km.is_alive()

    async def interrupt(self) -> None:
        await self._km.interrupt_kernel()

    def log_tail(self) -> str:
        return self._km.log_tail()

    # -- data in and out ------------------------------------------------------------------

    async def stage(self, store: ArtifactStore, owner: str, refs: list[str]) -> None:
        def link() -> None:
            for ref in refs:
                store.link_into(owner, ref, self.box.inputs)

        await asyncio.to_thread(link)

    def read_output(self, cell_id: str, filename: str, max_bytes: int) -> bytes:
        with self.open_output(cell_id, filename, max_bytes) as f:
            return f.read(max_bytes + 1)[:max_bytes]

    def open_output(self, cell_id: str, filename: str, max_bytes: int) -> BinaryIO:
        """Open a file the kernel wrote under ``outputs_dir/cell_id`` without following links.

        The kernel owns ``outputs_dir`` and may have made ``cell_id`` or the file a symlink
        (to a host path the root server could read): every component is opened with
        O_NOFOLLOW relative to the previous one, and the result must be a regular file no
        larger than ``max_bytes``.
        """
        check_names(cell_id, filename)
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
        try:
            top = os.open(self.outputs_dir, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY)
        except FileNotFoundError:  # the sandbox (its tmpfs) went away with a dead process
            return
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


def check_names(*parts: Any) -> None:
    for part in parts:
        if not isinstance(part, str) or not part or "/" in part or part in (".", ".."):
            raise ValueError(f"bad output path component {part!r}")


def _require_sandbox(mode: str, kernels_dir: Path) -> None:
    """Refuse to start kernels without the sandbox (unless configured 'unsandboxed')."""
    from .check import missing_for

    missing = missing_for(mode, kernels_dir)
    if missing:
        raise ComputeError(
            "cannot start sandboxed kernels: "
            + "; ".join(missing)
            + ". Run `dataref doctor` for details. Only for trusted single-user development: "
            "set kernels.sandbox = 'unsandboxed' (DATAREF_KERNELS__SANDBOX=unsandboxed)."
        )
