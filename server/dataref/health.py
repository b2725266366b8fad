"""``/healthz`` (liveness) and ``/readyz`` (readiness) for load balancers and Kubernetes.

Liveness says only that the process answers HTTP. Readiness says this replica can serve a
call now: its lifespan has started, and the state database and the blob store answer (the
kernel gateway too, when one is configured). Neither needs a token, and neither says more
than which part is not ready: details stay in the server's log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from .app import App

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 5.0


async def readiness(app: App) -> dict[str, str]:
    """{part: "ok" | "unavailable"}; every part "ok" means ready."""
    ws = app._workspace
    if ws is None:
        return {"server": "starting"}
    parts: dict[str, str] = {}
    checks: dict[str, Any] = {"state": ws.state.ping}
    gateway = getattr(ws.pool, "ping", None)  # a gateway backend says whether it answers
    if gateway is not None:
        checks["kernels"] = gateway
    for name, check in checks.items():
        try:
            result = await asyncio.wait_for(asyncio.to_thread(check), CHECK_TIMEOUT_S)
            if asyncio.iscoroutine(result):
                await asyncio.wait_for(result, CHECK_TIMEOUT_S)
            parts[name] = "ok"
        except Exception as exc:
            log.warning("readiness: %s is not available: %r", name, exc)
            parts[name] = "unavailable"
    return parts


def register_health_routes(mcp: FastMCP, app: App) -> None:
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    headers = {"Cache-Control": "no-store"}

    @mcp.custom_route("/healthz", methods=["GET", "HEAD"])
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers=headers)

    @mcp.custom_route("/readyz", methods=["GET", "HEAD"])
    async def readyz(request: Request) -> Response:
        parts = await readiness(app)
        ready = all(v == "ok" for v in parts.values())
        body = {"status": "ready" if ready else "not ready", **parts}
        return JSONResponse(body, status_code=200 if ready else 503, headers=headers)
