"""KernelPool: one kernel per (owner, notebook), warm spares, caps, and an idle reaper.

A spare is started with no owner; the first notebook that needs a kernel takes it and it is
bound to that (owner, notebook) until it is reset, reaped or the server stops. A kernel is
never handed back to the spares, so it is never reused by another owner. Spares do not count
toward ``max_total``: that cap is on kernels bound to notebooks.

With a backend whose kernels every replica reaches (a gateway) and the shared state, the
notebook -> kernel map decides which kernel a notebook uses (``shared.py``); the caps count
the kernels this replica is connected to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ..config import Settings
from ..errors import ComputeError, DatarefError, LimitExceeded
from .backend import KernelBackend
from .kernel import NotebookKernel

if TYPE_CHECKING:
    from ..state import State
    from .shared import SharedKernels

log = logging.getLogger(__name__)

Key = tuple[str, str]


class KernelPool:
    def __init__(
        self,
        settings: Settings,
        backend: KernelBackend | None = None,
        *,
        state: State | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend or make_backend(settings)
        self.shared: SharedKernels | None = None
        if state is not None and getattr(self.backend, "shared", False):
            from .shared import SharedKernels

            self.shared = SharedKernels(self, state)
        self._kernels: dict[Key, NotebookKernel] = {}
        self._starting: dict[Key, asyncio.Future[NotebookKernel]] = {}
        self._spares: list[NotebookKernel] = []
        self._all: set[NotebookKernel] = set()  # every kernel with a process, for close()
        self._tasks: set[asyncio.Task[object]] = set()
        self._refill_lock = asyncio.Lock()
        self._closed = False
        self._started = False

    # -- start / close --------------------------------------------------------------------

    async def start(self) -> None:
        await self.backend.start()
        if self.shared is not None:
            await self.shared.start()  # the heartbeat before any spare is listed
        self._started = True
        self._spawn(self._refill())
        self._spawn(self._reap_forever() if self.shared is None else self.shared.run_forever())

    async def close(self) -> None:
        """Shut every kernel down; nothing is left running (shared kernels: see shared.py)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        kernels = list(self._all)
        if self.shared is not None:
            await self.shared.close(kernels, set(self._spares))
        else:
            await asyncio.gather(*(k.shutdown() for k in kernels), return_exceptions=True)
        self._kernels.clear()
        self._spares.clear()
        await self.backend.close()

    def _spawn(self, coro: object) -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the interface the app uses ---------------------------------------------------------

    async def kernel(self, owner: str, notebook: str) -> NotebookKernel:
        """The notebook's kernel: its live one, a warm spare, or a newly started one."""
        if self._closed or not self._started:
            state = "shutting down" if self._closed else "not started"
            raise ComputeError(f"the kernel pool is {state} - try again once the server is up")
        key = (owner, notebook)
        existing = self._kernels.get(key)
        if self.shared is not None:
            existing = await self.shared.current(key, existing)
        if existing is not None:
            if existing.usable:
                existing.last_used = time.monotonic()
                return existing
            self._forget(existing)
            self._spawn(existing.shutdown())
        pending = self._starting.get(key)
        if pending is None:
            self._check_caps(owner)
            pending = asyncio.get_running_loop().create_future()
            self._starting[key] = pending
            self._spawn(self._assign(key, pending))
        return await asyncio.shield(pending)

    async def reset(self, owner: str, notebook: str) -> None:
        """Shut the notebook's kernel down; the next ``kernel()`` gives a fresh one."""
        key = (owner, notebook)
        pending = self._starting.get(key)
        if pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(pending)
        kernel = self._kernels.pop(key, None)
        if self.shared is not None:
            await self.shared.reset(key, kernel)
        elif kernel is not None:
            await kernel.shutdown()

    def live(self) -> list[tuple[str, str]]:
        return list(self._kernels)

    def counts(self) -> dict[str, int]:
        """Kernels by state, for the metrics gauge."""
        return {
            "assigned": len(self._kernels),
            "starting": len(self._starting),
            "spare": len(self._spares),
        }

    async def wait_for_spares(self, timeout: float = 60.0) -> int:
        """Wait until the warm spares are started (tests, and a server that wants them first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        want = self.settings.kernels.warm_spares
        while len(self._spares) < want and loop.time() < deadline and not self._closed:
            await asyncio.sleep(0.05)
        return len(self._spares)

    # -- internals ----------------------------------------------------------------------------

    def _check_caps(self, owner: str) -> None:
        k = self.settings.kernels
        keys = [*self._kernels, *self._starting]
        mine = sum(1 for key in keys if key[0] == owner)
        if mine >= k.max_per_owner:
            raise LimitExceeded(
                f"you already have {mine} live kernels (the cap is {k.max_per_owner}) - call "
                "reset_kernel on a notebook you no longer need, or keep working in an existing "
                "notebook; idle kernels are also stopped after "
                f"{int(k.idle_timeout_seconds // 60)} min"
            )
        if len(keys) >= k.max_total:
            raise LimitExceeded(
                f"the server is running its maximum of {k.max_total} kernels - try again in a "
                "few minutes, or reset_kernel a notebook you no longer need"
            )

    async def _assign(self, key: Key, pending: asyncio.Future[NotebookKernel]) -> None:
        try:
            kernel = await self.shared.attach(key) if self.shared is not None else None
            if kernel is None:
                kernel = await self._take_spare() or await self._start_kernel(key[0])
                if self.shared is not None:
                    kernel = await self.shared.claim(key, kernel)
            kernel.owner, kernel.notebook = key
            kernel.last_used = time.monotonic()
            if self._closed:
                await (kernel.detach() if self.shared is not None else kernel.shutdown())
                raise ComputeError("the server is shutting down")
            self._kernels[key] = kernel
            pending.set_result(kernel)
        except BaseException as exc:
            if not pending.done():
                pending.set_exception(
                    exc if isinstance(exc, Exception) else ComputeError("kernel start cancelled")
                )
                pending.exception()  # retrieved here so an unawaited future logs nothing
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._starting.pop(key, None)
            if not self._closed:
                self._spawn(self._refill())

    async def _take_spare(self) -> NotebookKernel | None:
        while self._spares:
            spare = self._spares.pop(0)
            if spare.usable and await spare.is_alive():
                spare.from_spare = True
                return spare
            self._spawn(spare.shutdown())
        return None

    async def _refill(self) -> None:
        async with self._refill_lock:
            want = self.settings.kernels.warm_spares
            while not self._closed and len(self._spares) < want:
                try:
                    spare = await self._start_kernel()
                except Exception:
                    log.warning("a warm spare kernel could not start", exc_info=True)
                    return
                if self._closed:
                    await spare.shutdown()
                    return
                self._spares.append(spare)

    async def _start_kernel(self, owner: str | None = None) -> NotebookKernel:
        process = self.backend.new_process(owner)
        kernel = NotebookKernel(process, self.settings, on_closed=self._closed_callback)
        self._all.add(kernel)
        try:
            await asyncio.wait_for(kernel.start(), self.settings.kernels.startup_timeout_seconds)
        except BaseException as exc:
            tail = kernel.log_tail()
            await kernel.shutdown()
            if isinstance(exc, asyncio.CancelledError):
                raise
            # The details (paths, the kernel's log) are for the operator, not the agent.
            log.error(
                "kernel %s did not start: %r; kernel log: %s", kernel.kernel_id, exc, tail[-2000:]
            )
            if isinstance(exc, DatarefError):  # the backend's own words for the operator's fix
                raise
            raise ComputeError(
                "a kernel could not start - try again; if it keeps failing, the operator "
                "should run `dataref doctor` and read the server log"
            ) from exc
        if self.shared is not None:
            await self.shared.started(kernel)
        return kernel

    def _closed_callback(self, kernel: NotebookKernel) -> None:
        self._all.discard(kernel)
        self._forget(kernel)
        if self.shared is not None:
            self.shared.closed(kernel)

    def _forget(self, kernel: NotebookKernel) -> None:
        if kernel.owner is not None and kernel.notebook is not None:
            key = (kernel.owner, kernel.notebook)
            if self._kernels.get(key) is kernel:
                del self._kernels[key]
        if kernel in self._spares:
            self._spares.remove(kernel)

    async def _reap_forever(self) -> None:
        idle = self.settings.kernels.idle_timeout_seconds
        while True:
            await asyncio.sleep(min(60.0, max(idle / 4, 0.5)))
            now = time.monotonic()
            for kernel in list(self._kernels.values()):
                if not kernel.busy and now - kernel.last_used > idle:
                    log.info("stopping idle kernel of %s/%s", kernel.owner, kernel.notebook)
                    self._forget(kernel)
                    await kernel.shutdown()


def make_backend(settings: Settings) -> KernelBackend:
    """Kernels on a gateway when ``kernels.gateway_url`` is set, else on this machine."""
    if settings.kernels.gateway_url:
        from .gwkernel import GatewayBackend

        return GatewayBackend(settings)
    from .local import LocalBackend

    return LocalBackend(settings)
