"""A small client of the Jupyter Kernel Gateway / Enterprise Gateway API (httpx + websockets).

REST for the kernel's life (``/api/kernels``...), one WebSocket per kernel for its channels,
speaking the legacy protocol both gateways serve: JSON text frames with a ``channel`` key, and
binary frames (``!I nbufs, !I offsets..., json, buffers``) for messages that carry buffers.
jupyter_server's own gateway client only works inside a Jupyter Server, hence this one.

Two pitfalls measured on both gateways: a 40 ms Nagle/delayed-ACK stall per request (the
client re-arms TCP_QUICKACK on every read), and a 10 MiB cap on inbound WebSocket messages
(callers chunk at 4 MiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from ..errors import ComputeError, LimitExceeded

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 4 << 20  # a buffer per message; the gateways refuse messages over 10 MiB
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


class GatewayUnavailable(ComputeError):
    """The gateway cannot be used; the message names the operator's fix."""


class QuickAckConnection(ClientConnection):
    """Acknowledge every read at once: no 40 ms delayed-ACK stall against a Nagle sender."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if _QUICKACK is not None:
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


class GatewayClient:
    """REST calls to one gateway; errors become GatewayUnavailable naming the fix."""

    def __init__(self, url: str, token: str | None, *, launch_timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.token = token
        headers = {"Authorization": f"token {token}"} if token else {}
        timeout = httpx.Timeout(10.0, read=launch_timeout_s + 30)  # EG's POST waits for launch
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = await self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            log.error("kernel gateway %s: %s %s failed: %r", self.url, method, path, exc)
            raise GatewayUnavailable(
                "kernels are unavailable: the kernel gateway does not answer - the operator "
                "should start it or correct kernels.gateway_url (fetch, describe, chart and "
                "export still work)"
            ) from exc
        if response.status_code in (401, 403):
            log.error(
                "kernel gateway %s refused %s %s: %s %s",
                self.url,
                method,
                path,
                response.status_code,
                response.text[:300],
            )
            raise refusal(response)
        return response

    async def check(self, kernel_name: str) -> None:
        """The gateway answers, accepts the token and has the kernelspec."""
        response = await self.request("GET", "/api/kernelspecs")
        specs = response.json().get("kernelspecs", {}) if response.status_code == 200 else {}
        if kernel_name not in specs:
            log.error(
                "kernel gateway %s has no kernelspec %r (status %s, has %s)",
                self.url,
                kernel_name,
                response.status_code,
                sorted(specs),
            )
            raise GatewayUnavailable(
                f"kernels are unavailable: the kernel gateway has no {kernel_name!r} kernel - "
                "the operator should run `dataref kernelspec install` on the gateway host (or "
                "set kernels.gateway_kernel)"
            )

    async def start_kernel(self, name: str, env: dict[str, str]) -> str:
        body = {"name": name, "env": env}
        response = await self.request("POST", "/api/kernels", json=body)
        if response.status_code >= 500:  # once more: a gateway's transient failure
            await asyncio.sleep(0.5)
            response = await self.request("POST", "/api/kernels", json=body)
        if response.status_code not in (200, 201):
            log.error(
                "kernel gateway %s: starting a kernel gave %s %s",
                self.url,
                response.status_code,
                response.text[:500],
            )
            await self.check(name)  # a missing kernelspec gets its own fix
            raise ComputeError("the kernel gateway could not start a kernel - try again")
        return str(response.json()["id"])

    async def kernel_post(self, kernel_id: str, action: str) -> int:
        response = await self.request("POST", f"/api/kernels/{kernel_id}/{action}")
        return response.status_code

    async def delete_kernel(self, kernel_id: str) -> None:
        await self.request("DELETE", f"/api/kernels/{kernel_id}")

    async def channels(self, kernel_id: str) -> GatewayChannels:
        ws_url = self.url.replace("http", "ws", 1)
        uri = f"{ws_url}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
        try:
            ws = await connect(
                uri,
                additional_headers=headers,
                max_size=None,
                compression=None,
                write_limit=4 * MAX_FRAME_BYTES,  # the next chunk queues while one is sent
                create_connection=QuickAckConnection,
                open_timeout=30,
                ping_interval=20,
                ping_timeout=60,
            )
        except (OSError, TimeoutError, ConnectionClosed, Exception) as exc:
            log.error("kernel gateway %s: channels of %s: %r", self.url, kernel_id, exc)
            raise GatewayUnavailable(
                "kernels are unavailable: the kernel gateway refused the kernel's channels - "
                "the operator should check the gateway's log"
            ) from exc
        return GatewayChannels(ws)


def refusal(response: httpx.Response) -> ComputeError:
    """A 401/403 in the agent's words: a full gateway, an owner it does not admit, or a token
    it refuses (the gateway's own reason goes to the log only)."""
    reason = response.text.lower()
    if response.status_code == 403 and ("maximum" in reason or "limit" in reason):
        return LimitExceeded(
            "the kernel gateway refused another kernel (its per-user or total limit) - "
            "reset_kernel a notebook you no longer need, or try again later"
        )
    if response.status_code == 403 and "authorized" in reason:
        return GatewayUnavailable(
            "kernels are unavailable to this owner: the kernel gateway does not admit it - the "
            "operator should add it to the gateway's authorized users (EG_AUTHORIZED_USERS)"
        )
    return GatewayUnavailable(
        "kernels are unavailable: the kernel gateway refused the server's token - the operator "
        "should set kernels.gateway_token to the gateway's auth token"
    )


class GatewayChannels:
    """One kernel's WebSocket: outgoing requests, and a reader routing what comes back.

    Messages whose parent is a pending ``request`` go to that request's queue (comm replies);
    everything else goes to ``queue`` as (channel, msg). A status "restarting"/"dead" (the
    gateway saw the process die) or a closed socket marks the kernel dead.
    """

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.session = uuid.uuid4().hex
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.dead = False
        self._waiters: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}
        self._reader = asyncio.create_task(self._read())

    def _message(self, msg_type: str, content: dict[str, Any], channel: str) -> dict[str, Any]:
        header = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": msg_type,
            "username": "dataref",
            "session": self.session,
            "date": datetime.now(UTC).isoformat(),
            "version": "5.3",
        }
        return {
            "header": header,
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": channel,
            "buffers": [],
        }

    async def send(
        self, msg_type: str, content: dict[str, Any], buffers: list[Any] | None = None
    ) -> str:
        msg = self._message(msg_type, content, "shell")
        await self._send_prepared(msg, buffers)
        return msg["header"]["msg_id"]

    async def execute(
        self, code: str, *, store_history: bool, user_expressions: dict[str, str] | None = None
    ) -> str:
        content = {
            "code": code,
            "silent": False,
            "store_history": store_history,
            "user_expressions": user_expressions or {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        return await self.send("execute_request", content)

    @contextlib.asynccontextmanager
    async def request(
        self, msg_type: str, content: dict[str, Any], buffers: list[Any] | None = None
    ) -> AsyncIterator[asyncio.Queue[dict[str, Any] | None]]:
        """Send one message; yields the queue of messages parented to it (None: closed)."""
        msg = self._message(msg_type, content, "shell")
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        msg_id = msg["header"]["msg_id"]
        self._waiters[msg_id] = queue
        try:
            await self._send_prepared(msg, buffers)
            yield queue
        finally:
            self._waiters.pop(msg_id, None)

    async def _send_prepared(self, msg: dict[str, Any], buffers: list[Any] | None) -> None:
        if not buffers:
            await self.ws.send(json.dumps(msg))
            return
        msg.pop("buffers", None)
        parts = [json.dumps(msg).encode(), *buffers]
        offsets, at = [], 4 * (len(parts) + 1)
        for part in parts:
            offsets.append(at)
            at += len(part)
        await self.ws.send(
            b"".join([struct.pack(f"!{len(parts) + 1}I", len(parts), *offsets), *parts])
        )

    def drain(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                msg = _decode(frame)
                if msg is not None:
                    self._route(msg)
        except ConnectionClosed:
            pass
        except Exception:
            log.warning("kernel gateway channel reader failed", exc_info=True)
        finally:
            self.dead = True
            for queue in self._waiters.values():
                queue.put_nowait(None)

    def _route(self, msg: dict[str, Any]) -> None:
        msg_type = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
        content = msg.get("content") or {}
        if msg_type == "status" and content.get("execution_state") in ("restarting", "dead"):
            self.dead = True
            for queue in self._waiters.values():
                queue.put_nowait(None)
        parent_header = msg.get("parent_header") or {}
        if parent_header.get("session") not in (None, "", self.session):
            return  # another replica's traffic on a shared kernel (its outputs, its comm)
        parent = parent_header.get("msg_id")
        waiter = self._waiters.get(parent) if parent else None
        if waiter is not None:
            waiter.put_nowait(msg)
        else:
            self.queue.put_nowait((str(msg.get("channel", "iopub")), msg))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        with contextlib.suppress(Exception):
            await self.ws.close()


def _decode(frame: str | bytes) -> dict[str, Any] | None:
    try:
        if isinstance(frame, str):
            return json.loads(frame)
        view = memoryview(frame)
        nbufs = struct.unpack("!I", view[:4])[0]
        offsets = list(struct.unpack(f"!{nbufs}I", view[4 : 4 * (nbufs + 1)]))
        ends = [*offsets[1:], len(view)]
        parts = [view[a:b] for a, b in zip(offsets, ends, strict=True)]
        msg = json.loads(bytes(parts[0]))
        msg["buffers"] = parts[1:]
        return msg
    except (ValueError, struct.error, IndexError):
        log.debug("undecodable frame from the kernel gateway")
        return None
