"""The gateway backend: kernels on a Jupyter Kernel Gateway or Enterprise Gateway.

The gateway launches the ``dataref`` kernelspec (``kernelspec.py``: the same profile in the same
sandbox as local kernels). This server keeps the pool, the caps, the notebooks and the store;
tables go to the kernel, and output files come back, over the kernel's own channel (the
"dataref.transfer" comm, binary buffers of at most 4 MiB), so a kernel needs no route to
anything. ``KERNEL_USERNAME`` is the owner; no other value of the kernel's environment is sent.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import secrets
import uuid
from typing import Any

from ..config import Settings
from ..errors import ComputeError
from ..store import ArtifactStore
from .gateway import MAX_FRAME_BYTES, GatewayChannels, GatewayClient, GatewayUnavailable

log = logging.getLogger(__name__)

TARGET = "dataref.transfer"
SPARE_USERNAME = "dataref"  # KERNEL_USERNAME of a warm spare, which has no owner yet
BRIDGE_TIMEOUT_S = 300.0


class KernelGone(ComputeError):
    """The gateway no longer has the kernel (deleted, culled, or the gateway restarted)."""


class GatewayBackend:
    name = "gateway"
    shared = True  # every replica reaches every kernel: the pool uses the kernel map

    def __init__(self, settings: Settings) -> None:
        k = settings.kernels
        assert k.gateway_url is not None
        self.settings = settings
        self.kernel_name = k.gateway_kernel
        self.client = GatewayClient(
            k.gateway_url, k.gateway_token, launch_timeout_s=k.startup_timeout_seconds
        )

    async def start(self) -> None:
        """Checked now for the operator's log; a gateway that is down does not stop the
        server: every kernel start says what to fix, and works once the gateway is back."""
        try:
            await self.client.check(self.kernel_name)
        except GatewayUnavailable as exc:
            log.error("kernel gateway not usable yet: %s", exc)

    def new_process(self, owner: str | None) -> GatewayProcess:
        return GatewayProcess(self, owner)

    def attach(self, gateway_id: str) -> GatewayProcess:
        """A process for a kernel already running on the gateway (started by any replica);
        ``start()`` connects to it, or raises KernelGone."""
        process = GatewayProcess(self, None)
        process.gateway_id = gateway_id
        process.attaching = True
        return process

    async def delete(self, gateway_id: str) -> None:
        """Shut a kernel down by its gateway id (one this replica is not connected to)."""
        try:
            await self.client.delete_kernel(gateway_id)
        except ComputeError:
            log.warning("kernel %s could not be deleted on the gateway", gateway_id)

    async def close(self) -> None:
        await self.client.close()


class GatewayProcess:
    """A kernel on the gateway. Restarting keeps the gateway's kernel id when it can."""

    uid = None

    def __init__(self, backend: GatewayBackend, owner: str | None) -> None:
        self.kernel_id = secrets.token_hex(5)
        self.gateway_id: str | None = None
        self._backend = backend
        self._client = backend.client
        # Only the server decides the kernel's KERNEL_* values; the agent sets none.
        self._env = {"KERNEL_USERNAME": owner or SPARE_USERNAME}
        self._channels: GatewayChannels | None = None
        self._comm_id = ""
        self._staged: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.attaching = False  # start() connects to the running kernel ``gateway_id``

    @property
    def channels(self) -> GatewayChannels | None:
        return self._channels

    async def exists(self) -> bool:
        """The gateway still has this kernel (one GET)."""
        if self.gateway_id is None:
            return False
        response = await self._client.request("GET", f"/api/kernels/{self.gateway_id}")
        return response.status_code != 404

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.attaching and self.gateway_id is not None:
            if not await self.exists():
                raise KernelGone(f"kernel {self.gateway_id} is gone from the gateway")
            await self._connect()
            await self._learn_staged()
            return
        self.gateway_id = await self._client.start_kernel(self._backend.kernel_name, self._env)
        await self._connect()

    async def _learn_staged(self) -> None:
        """Attached to a kernel another replica fed: the kernel says which tables it holds
        (it is the source of truth; a profile that cannot say gets them sent again)."""
        try:
            reply = await self._call({"op": "staged"}, timeout=30)
        except ComputeError:
            return
        refs = reply.get("refs")
        if isinstance(refs, list):
            self._staged = {r for r in refs if isinstance(r, str)}

    async def detach(self) -> None:
        """Disconnect and leave the kernel running (other replicas serve its notebook)."""
        await self._disconnect()

    async def _connect(self) -> None:
        assert self.gateway_id is not None
        self._channels = await self._client.channels(self.gateway_id)
        self._staged = set()
        self._comm_id = uuid.uuid4().hex
        await self._channels.send(
            "comm_open", {"comm_id": self._comm_id, "target_name": TARGET, "data": {}}
        )

    async def _disconnect(self) -> None:
        channels, self._channels = self._channels, None
        if channels is not None:
            await channels.close()

    async def restart(self) -> None:
        await self._disconnect()
        status = 404
        if self.gateway_id is not None:
            status = await self._client.kernel_post(self.gateway_id, "restart")
        if status >= 300:  # deleted behind our back, culled, or its restart failed: a new one
            log.warning(
                "gateway kernel %s: restart gave %s, starting a new one", self.gateway_id, status
            )
            old, self.gateway_id = self.gateway_id, None
            if old is not None and status != 404:
                await self._client.delete_kernel(old)
            self.gateway_id = await self._client.start_kernel(self._backend.kernel_name, self._env)
        await self._connect()

    async def shutdown(self) -> None:
        await self._disconnect()
        if self.gateway_id is not None:
            try:
                await self._client.delete_kernel(self.gateway_id)
            except ComputeError:
                log.warning("kernel %s could not be deleted on the gateway", self.gateway_id)

    async def is_alive(self) -> bool:
        return self._channels is not None and not self._channels.dead

    async def interrupt(self) -> None:
        if self.gateway_id is not None:
            await self._client.kernel_post(self.gateway_id, "interrupt")

    def log_tail(self) -> str:
        return ""  # the kernel's stderr is in the gateway's log

    # -- data in --------------------------------------------------------------------------

    async def stage(self, store: ArtifactStore, owner: str, refs: list[str]) -> None:
        missing = [ref for ref in refs if ref not in self._staged]
        if not missing:
            return
        channels = self._require_channels()
        for ref in missing:
            art = store.get(owner, ref, kind="table")
            with open(art.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                view = memoryview(m)
                try:
                    await self._send_file(channels, ref, view)
                finally:
                    view.release()
        reply = await self._call({"op": "commit", "refs": missing}, timeout=60)
        if reply.get("error") or not reply.get("ok"):
            log.warning("staging into kernel %s failed: %s", self.gateway_id, reply)
            raise ComputeError(
                "an input could not be sent to the kernel (it may be out of memory) - try "
                "again, or reset_kernel for a fresh one; your artifacts are kept"
            )
        self._staged.update(missing)

    async def _send_file(self, channels: GatewayChannels, ref: str, view: memoryview) -> None:
        total = len(view)
        for offset in range(0, max(total, 1), MAX_FRAME_BYTES):
            chunk = view[offset : offset + MAX_FRAME_BYTES]
            data = {"op": "put", "ref": ref, "offset": offset, "total": total}
            await channels.send("comm_msg", {"comm_id": self._comm_id, "data": data}, [chunk])

    # -- data out (called from worker threads) --------------------------------------------

    def read_output(self, cell_id: str, filename: str, max_bytes: int) -> bytes:
        data = {
            "op": "read",
            "cell": cell_id,
            "file": filename,
            "max": max_bytes,
            "chunk": MAX_FRAME_BYTES,
        }
        return self._bridge(self._read(data, filename, max_bytes))

    def remove_outputs(self, cell_id: str) -> None:
        """Nothing to send: the profile deletes earlier cells' files when the next cell starts
        (lib/transfer.py), which saves a round trip per call."""

    def _bridge(self, coro: Any) -> Any:
        assert self._loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError("read_output is called from a worker thread, not the loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(BRIDGE_TIMEOUT_S)

    async def _read(self, data: dict[str, Any], filename: str, max_bytes: int) -> bytes:
        channels = self._require_channels()
        parts: list[memoryview] = []
        received = 0
        content = {"comm_id": self._comm_id, "data": data}
        async with channels.request("comm_msg", content) as queue:
            async for reply in _comm_replies(queue, timeout=120):
                if "error" in reply:
                    raise _output_error(filename, str(reply["error"]))
                if reply.get("size", 0) > max_bytes:
                    raise ValueError(f"output {filename!r} is too large")
                if "offset" in reply and reply["buffers"]:
                    received += sum(len(b) for b in reply["buffers"])
                    if received > max_bytes:  # the kernel's own numbers are not believed
                        raise ValueError(f"output {filename!r} is too large")
                    parts.extend(reply["buffers"])
                if "done" in reply:
                    return b"".join(parts)
        raise OSError(f"output {filename!r}: the kernel stopped answering")

    async def _call(self, data: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        channels = self._require_channels()
        content = {"comm_id": self._comm_id, "data": data}
        async with channels.request("comm_msg", content) as queue:
            async for reply in _comm_replies(queue, timeout=timeout):
                return reply
        raise ComputeError("the kernel stopped answering - try again")

    def _require_channels(self) -> GatewayChannels:
        if self._channels is None or self._channels.dead:
            raise ComputeError("the kernel is not connected - try again")
        return self._channels


async def _comm_replies(queue: asyncio.Queue[dict[str, Any] | None], *, timeout: float) -> Any:
    """The comm_msg replies to one request, until the kernel is idle again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            msg = await asyncio.wait_for(queue.get(), max(deadline - loop.time(), 0.001))
        except TimeoutError:
            return
        if msg is None:
            return
        kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
        content = msg.get("content") or {}
        if kind == "comm_msg":
            yield {**(content.get("data") or {}), "buffers": msg.get("buffers") or []}
        elif kind == "status" and content.get("execution_state") == "idle":
            return


def _output_error(filename: str, error: str) -> Exception:
    if error == "missing":
        return FileNotFoundError(f"output {filename!r} is missing")
    if error in ("too large", "not a regular file"):
        return ValueError(f"output {filename!r} is {error}")
    return OSError(f"output {filename!r}: {error[:200]}")


def check_gateway(settings: Settings) -> str | None:
    """For `dataref doctor`: None when the gateway answers, takes the token and has the
    kernelspec; else what the operator should fix."""

    async def run() -> str | None:
        k = settings.kernels
        assert k.gateway_url is not None
        client = GatewayClient(k.gateway_url, k.gateway_token, launch_timeout_s=10)
        try:
            await client.check(k.gateway_kernel)
        except GatewayUnavailable as exc:
            return str(exc)
        finally:
            await client.close()
        return None

    return asyncio.run(run())
