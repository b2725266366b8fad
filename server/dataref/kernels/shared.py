"""Kernels every replica reaches (a gateway's): the pool's side of the shared kernel map.

A notebook's variables live in one gateway kernel, named by the kernel map in the shared
state (``state/kernel_map.py``), whichever replica serves the call:

- a call finds the kernel the map names and uses its own connection to it, or ATTACHES
  (a new WebSocket to the running kernel; the kernel says which tables it already holds);
- a notebook without one takes a spare (or starts a kernel) and ``claim``s it; the loser of
  a race attaches to the winner's kernel and shuts its own down;
- a mapped kernel the gateway no longer has is forgotten and replaced (the transcript notes
  that the variables were cleared there, as the map's value changed).

Lifecycle: every kernel a replica starts is listed at once (a spare of that replica), so
nothing it starts goes unseen. A replica stopping while another is alive DETACHES the mapped
kernels (they serve on) and shuts its spares down; the last replica to stop shuts every
listed kernel down, so a single server leaves nothing running. Replicas heartbeat every
round; the leader (one replica at a time) shuts down kernels idle for
``kernels.idle_timeout_seconds`` by their last use in the shared state (never one a call
holds: it takes the notebook's lock first) and the spares of replicas that died (orphans).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from ..errors import ComputeError
from ..state.kernel_map import KernelMap
from .gwkernel import KernelGone
from .kernel import NotebookKernel

if TYPE_CHECKING:
    from ..state import State
    from .pool import KernelPool

log = logging.getLogger(__name__)

Key = tuple[str, str]
HEARTBEAT_SECONDS = 5.0
TOUCH_SECONDS = 30.0  # last use is written at most this often per kernel
VERIFY_AFTER_SECONDS = 1.0  # a kernel idle here for longer is looked up at the gateway


def gateway_id(kernel: NotebookKernel) -> str | None:
    return getattr(kernel.process, "gateway_id", None)


class SharedKernels:
    def __init__(self, pool: KernelPool, state: State) -> None:
        self.pool = pool
        self.backend: Any = pool.backend
        self.map = KernelMap(state.notebooks_db)
        self.state = state
        self.replica = secrets.token_hex(8)
        self.mapped: dict[Key, str] = {}  # the gateway id each cached kernel was mapped as
        self._touched: dict[str, float] = {}

    async def _db(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    # -- calls ------------------------------------------------------------------------------

    async def current(self, key: Key, cached: NotebookKernel | None) -> NotebookKernel | None:
        """``cached`` if the map still names it and it is connected, else None (it is then
        detached here: the kernel itself stays for whoever the map names)."""
        if cached is None:
            return None  # attach() looks the map up
        row = await self._db(self.map.get, key[1])
        now_id, was = gateway_id(cached), self.mapped.get(key)
        renewed = row is not None and row.kernel == was and now_id not in (None, was)
        # the gateway gave the kernel a new id when it restarted a dead one
        if renewed and await self._db(self.map.replace, key[1], was, now_id):
            self.mapped[key] = now_id
            row = await self._db(self.map.get, key[1])
        if row is not None and row.kernel == now_id and cached.usable and cached.restarting:
            return cached  # restarting in place after a timeout or crash: the call waits
        if row is not None and row.kernel == now_id and cached.usable and await cached.is_alive():
            if await self._still_there(cached):
                await self._touch(row.kernel, row.last_used)
                return cached
            await self._db(self.map.forget, row.kernel)  # gone: the next kernel replaces it
        self.pool._forget(cached)
        self.mapped.pop(key, None)
        if now_id not in (None, was):  # a kernel the gateway started in place of a dead one
            await cached.shutdown()  # that lost its notebook meanwhile: nobody else has it
        else:
            await cached.detach()
        return None

    async def _still_there(self, kernel: NotebookKernel) -> bool:
        """A kernel idle here for a while is asked for at the gateway (culled, deleted, or
        the gateway restarted: its WebSocket may stay open and silent)."""
        if time.monotonic() - kernel.last_used < VERIFY_AFTER_SECONDS:
            return True
        try:
            return await kernel.process.exists()  # type: ignore[attr-defined]
        except ComputeError:
            return True  # the gateway does not answer: the call says so itself

    async def _touch(self, kernel: str, last_used: float) -> None:
        now = time.time()
        every = min(TOUCH_SECONDS, self.pool.settings.kernels.idle_timeout_seconds / 4)
        if now - max(last_used, self._touched.get(kernel, 0.0)) > every:
            self._touched[kernel] = now
            await self._db(self.map.touch, kernel)

    async def attach(self, key: Key) -> NotebookKernel | None:
        """The notebook's mapped kernel, connected from here; None when it has none (or the
        gateway lost it: then the map forgets it)."""
        row = await self._db(self.map.get, key[1])
        if row is None:
            return None
        settings = self.pool.settings
        process = self.backend.attach(row.kernel)
        kernel = NotebookKernel(process, settings, on_closed=self.pool._closed_callback)
        self.pool._all.add(kernel)
        try:
            await asyncio.wait_for(kernel.start(), settings.kernels.startup_timeout_seconds)
        except KernelGone:
            log.info("the kernel of notebook %s is gone from the gateway; replacing it", key[1])
            await kernel.detach()
            await self._db(self.map.forget, row.kernel)
            return None
        except BaseException:
            await kernel.detach()
            raise
        self.mapped[key] = row.kernel
        await self._touch(row.kernel, row.last_used)
        return kernel

    async def started(self, kernel: NotebookKernel) -> None:
        """Every kernel this replica starts is listed at once, as its spare."""
        kid = gateway_id(kernel)
        if kid is not None:
            await self._db(self.map.add_spare, kid, self.replica)

    async def claim(self, key: Key, kernel: NotebookKernel) -> NotebookKernel:
        """Map the notebook to ``kernel``; if another replica won, use the winner's."""
        kid = gateway_id(kernel)
        assert kid is not None
        winner = await self._db(self.map.claim, key[1], kid)
        if winner == kid:
            self.mapped[key] = kid
            return kernel
        log.info("notebook %s already has kernel %s; shutting %s down", key[1], winner, kid)
        await kernel.shutdown()
        attached = await self.attach(key)
        if attached is None:
            raise ComputeError("the notebook's kernel changed meanwhile - try again")
        return attached

    async def reset(self, key: Key, cached: NotebookKernel | None) -> None:
        """Shut the notebook's kernel down, wherever it was started."""
        self.mapped.pop(key, None)
        kid = await self._db(self.map.reset, key[1])
        if cached is not None:
            await cached.shutdown()
        if kid is not None and (cached is None or gateway_id(cached) != kid):
            await self.backend.delete(kid)

    def closed(self, kernel: NotebookKernel) -> None:
        """A kernel shut down here (not detached) leaves the list."""
        kid = gateway_id(kernel)
        if kid is not None and not kernel.detached:
            with contextlib.suppress(RuntimeError):  # no loop any more: close() cleans up
                done = asyncio.get_running_loop().run_in_executor(None, self.map.forget, kid)
                done.add_done_callback(_log_failure)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._db(self.map.heartbeat, self.replica)

    async def close(self, kernels: list[NotebookKernel], spares: set[NotebookKernel]) -> None:
        """Detach the mapped kernels if another replica is alive; else shut everything down."""
        try:
            others = await self._db(self.map.leave, self.replica)
        except Exception:
            log.warning("the kernel map is unreachable; detaching the kernels", exc_info=True)
            others = True
        keep = [k for k in kernels if others and k not in spares and k.notebook is not None]
        drop = [k for k in kernels if k not in keep]
        log.info(
            "stopping: %s; detaching %d kernels, shutting %d down",
            "other replicas serve on" if others else "the last replica",
            len(keep),
            len(drop),
        )
        await asyncio.gather(*(k.detach() for k in keep), return_exceptions=True)
        await asyncio.gather(*(k.shutdown() for k in drop), return_exceptions=True)
        with contextlib.suppress(Exception):
            gone = [gateway_id(k) for k in drop]
            listed = await self._db(self.map.everything) if not others else gone
            for kid in listed:
                if kid is None:
                    continue
                if kid not in gone:
                    await self.backend.delete(kid)
                await self._db(self.map.forget, kid)

    async def run_forever(self) -> None:
        """Heartbeat; every round, detach what this replica left idle and, when leading,
        reap idle and orphaned kernels for the whole deployment."""
        idle = self.pool.settings.kernels.idle_timeout_seconds
        every = min(60.0, max(idle / 4, 0.5))
        last_round = time.monotonic()
        while True:
            await asyncio.sleep(min(HEARTBEAT_SECONDS, every))
            with contextlib.suppress(Exception):
                await self._db(self.map.heartbeat, self.replica)
            if time.monotonic() - last_round < every:
                continue
            last_round = time.monotonic()
            try:
                await self._detach_idle(idle)
                if await self._db(self.state.leadership.is_leader):
                    await self.reap(idle)
            except Exception:
                log.warning("reaping shared kernels failed", exc_info=True)

    async def _detach_idle(self, idle: float) -> None:
        now = time.monotonic()
        for key, kernel in list(self.pool._kernels.items()):
            if not kernel.busy and now - kernel.last_used > idle:
                self.pool._forget(kernel)
                self.mapped.pop(key, None)
                await kernel.detach()

    async def reap(self, idle: float) -> int:
        """Shut down kernels idle for ``idle`` seconds and the spares of dead replicas."""
        stopped = 0
        for kid, handle in await self._db(self.map.idle, time.time() - idle):
            key = f"notebook:{handle}"
            locks = self.state.notebook_locks
            held = await self._db(locks.locks.try_acquire, key) if locks.free_here(key) else None
            if held is None:
                continue  # a call holds it (or waits for it): not idle after all
            try:
                log.info("stopping idle shared kernel %s of notebook %s", kid, handle)
                await self.backend.delete(kid)
                await self._db(self.map.forget, kid)
                stopped += 1
            finally:
                await self._db(held.release)
        spares = {gateway_id(k) for k in self.pool._spares}
        for kid in await self._db(self.map.orphans):
            if kid not in spares:
                log.info("stopping orphaned kernel %s (its replica is gone)", kid)
                await self.backend.delete(kid)
                await self._db(self.map.forget, kid)
                stopped += 1
        return stopped


def _log_failure(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("the kernel map could not forget a kernel: %r", done.exception())
