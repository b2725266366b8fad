"""The edge every tool reply passes: measured, attributed, budgeted, recorded, counted, logged.

``ExposureMiddleware`` wraps each ``tools/call`` (and each ``resources/read`` of an artifact,
chart or notebook, recorded as tool ``resource:<kind>``). Before the tool runs it works out the
sources the call touches (dataRefs in the arguments, through lineage; for ``run_python`` the
sources already bound into the notebook's kernel) and refuses when one of their daily budgets
is spent. After, it builds the reply exactly as the client will receive it, measures it,
appends it to the ledger (durably, before the reply is sent), then counts it in the metrics
and logs one JSON line. If the ledger cannot record a reply, the reply is not sent: the call
fails closed with a clear error.

``AuthAuditMiddleware`` (ASGI, HTTP only) turns every 401/403 into an audit event.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastmcp.exceptions import (
    DisabledError,
    FastMCPError,
    NotFoundError,
    ResourceError,
    ToolError,
)
from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp.types import CallToolResult

from .errors import AccessDenied, DatarefError, NotFound
from .exposure import TOUCHED, BudgetSpent
from .ledger import Entry, Sizes, is_full
from .logs import REQUEST_ID, audit, log_event, new_request_id
from .measure import created_refs, error_reply, measure, measure_resource, refs_in, reply_of

if TYPE_CHECKING:
    from .app import App
    from .workspace import Workspace

# Tools that return data of a source: these refuse once its budget is spent. Producers too.
DATA_TOOLS = frozenset({"run_python", "describe_data", "render_chart"})
EXPORT_TOOLS = frozenset({"export_data", "export_csv"})
DATA_RESOURCES = frozenset({"resource:artifacts", "resource:charts"})
# Tools whose call is a cell of a notebook (the default one when the argument is omitted).
NOTEBOOK_TOOLS = frozenset({"run_python", "reset_kernel", "render_chart", "export_notebook"})
# Names recorded as given only when they look like ours: hostile input never reaches SQLite.
HANDLE = re.compile(r"nb_[A-Za-z0-9_-]{1,64}")
NAME = re.compile(r"[A-Za-z0-9_:.-]{1,64}")


def safe_name(name: Any) -> str:
    return name if isinstance(name, str) and NAME.fullmatch(name) else "(invalid name)"


@dataclass
class Scope:
    """What a call touches, known before it runs; completed from the reply."""

    owner: str
    tool: str
    notebook: str | None = None
    refs_read: list[str] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)


def scope_of(ws: Workspace, owner: str, tool: str, args: dict[str, Any]) -> Scope:
    scope = Scope(owner, tool, refs_read=list(dict.fromkeys(refs_in(args))))
    handle = args.get("notebook")
    if handle is None and (tool in NOTEBOOK_TOOLS or tool in ws.producers):
        try:
            scope.notebook = ws.transcripts.default(owner, create=False)
        except DatarefError:
            scope.notebook = None
    elif isinstance(handle, str) and HANDLE.fullmatch(handle):
        scope.notebook = handle  # a foreign handle has no ledger rows of this owner
    scope.sources = ws.exposure.sources_of(owner, scope.refs_read)
    if tool == "run_python":
        scope.sources |= ws.exposure.notebook_sources(owner, scope.notebook)
    return scope


def reads_state(ws: Workspace, tool: str, args: dict[str, Any], budgeted: bool) -> bool:
    """Whether admitting the call reads the ledger or the transcripts (``scope_of``'s look-ups
    and the budget check): only then is it worth a thread hop (0.2 ms here)."""
    if budgeted or tool == "run_python" or refs_in(args):
        return True
    return args.get("notebook") is None and (tool in NOTEBOOK_TOOLS or tool in ws.producers)


def admit(
    ws: Workspace, owner: str, tool: str, args: dict[str, Any], *, budgeted: bool
) -> tuple[Scope, BudgetSpent | None]:
    """The call's scope and, when it is ``budgeted`` (it returns data), the budget refusal
    if one of its sources is spent (returned, not raised: the refusal is recorded too).
    One thread hop for both look-ups."""
    scope = scope_of(ws, owner, tool, args)
    if budgeted:
        try:
            ws.exposure.check(owner, scope.sources)
        except BudgetSpent as exc:
            return scope, exc
    return scope, None


def refusal_kind(exc: BaseException) -> str | None:
    """The kind of refusal an error is: budget, access (grant) or not_found (maybe foreign)."""
    cause: BaseException | None = exc
    for _ in range(4):
        if cause is None:
            return None
        if isinstance(cause, BudgetSpent):
            return "budget"
        if isinstance(cause, AccessDenied):
            return "access"
        if isinstance(cause, NotFound):
            return "not_found"
        cause = cause.__context__
    return None


class ExposureMiddleware(Middleware):
    def __init__(self, app: App) -> None:
        self.app = app

    async def on_call_tool(self, context: MiddlewareContext, call_next: Callable[..., Any]) -> Any:
        ws = self.app.workspace_or_none()
        if ws is None:
            return await call_next(context)
        REQUEST_ID.set(new_request_id())
        TOUCHED.set(touched := set())
        started = time.perf_counter()
        name = safe_name(context.message.name)
        args = dict(context.message.arguments or {})
        owner = self.app.owners.current()
        budgeted = name in DATA_TOOLS or name in ws.producers
        admission = self._admission(ws, owner, name, args, budgeted)
        spent = (await admission)[1] if budgeted and ws.exposure.has_budgets() else None
        failure: BaseException | None = None
        result: Any = None
        try:
            if spent is not None:
                raise spent
            result = await call_next(context)
            reply = reply_of(result)
        except BaseException as exc:
            failure, reply = self._failed(exc, context.message.name, admission)
        scope = (await admission)[0]
        scope.sources |= touched
        body = reply.structured_content if isinstance(reply.structured_content, dict) else {}
        sizes = measure(reply, name)
        await self._record(ws, scope, sizes, body, failure, time.perf_counter() - started)
        if failure is not None:
            raise failure
        return result

    def _admission(
        self, ws: Workspace, owner: str, name: str, args: dict[str, Any], budgeted: bool
    ) -> asyncio.Future[tuple[Scope, BudgetSpent | None]]:
        """The call's admission: made at once when it reads no state, else in a thread. Unless
        a budget could refuse the call, that thread runs alongside the call (0.2 ms less per
        call): the scope is needed only to record the reply."""
        if reads_state(ws, name, args, budgeted):
            job = asyncio.to_thread(admit, ws, owner, name, args, budgeted=budgeted)
            return asyncio.ensure_future(job)
        done = asyncio.get_running_loop().create_future()
        done.set_result(admit(ws, owner, name, args, budgeted=False))
        return done

    @staticmethod
    def _failed(
        exc: BaseException, tool: Any, admission: asyncio.Future[Any]
    ) -> tuple[BaseException, CallToolResult]:
        """The failure to record and the reply it stands for; others propagate unrecorded."""
        if isinstance(exc, BudgetSpent):
            failure = ToolError(str(exc))
            failure.__context__ = exc
            return failure, error_reply(str(exc))
        if isinstance(exc, FastMCPError):
            return exc, error_reply(str(exc))
        if isinstance(exc, (NotFoundError, DisabledError)):
            return exc, error_reply(f"Unknown tool: {tool!r}")
        admission.cancel()  # nobody awaits it now
        raise exc

    async def on_read_resource(
        self, context: MiddlewareContext, call_next: Callable[..., Any]
    ) -> Any:
        ws = self.app.workspace_or_none()
        uri = str(context.message.uri)
        if ws is None or not uri.startswith("dataref://"):
            return await call_next(context)
        REQUEST_ID.set(new_request_id())
        started = time.perf_counter()
        kind = safe_name(uri.removeprefix("dataref://").split("/", 1)[0])
        owner = self.app.owners.current()
        target = uri.rsplit("/", 1)[-1]
        args = {"ref": target} if kind != "notebooks" else {"notebook": target}
        tool = f"resource:{kind}"
        budgeted = tool in DATA_RESOURCES
        scope, spent = await asyncio.to_thread(admit, ws, owner, tool, args, budgeted=budgeted)
        failure: BaseException | None = None
        result: Any = None
        try:
            if spent is not None:
                raise spent
            result = await call_next(context)
            sizes, body = measure_resource(result.to_mcp_result(uri))
        except BudgetSpent as exc:
            failure = ResourceError(str(exc))
            failure.__context__ = exc
        except (FastMCPError, NotFoundError, DisabledError) as exc:
            failure = exc
        if failure is not None:  # a JSON-RPC error: its message is what the client gets
            text = len(str(failure).encode())
            sizes, body = Sizes(bytes=text, error_bytes=text), {}
        await self._record(ws, scope, sizes, body, failure, time.perf_counter() - started)
        if failure is not None:
            raise failure
        return result

    async def _record(
        self,
        ws: Workspace,
        scope: Scope,
        sizes: Sizes,
        body: dict[str, Any],
        failure: BaseException | None,
        seconds: float,
    ) -> None:
        created = [r for r in created_refs(body) if r not in scope.refs_read]
        notebook = body.get("notebook") if isinstance(body.get("notebook"), str) else None
        refused = refusal_kind(failure) if failure is not None else None
        if refused == "not_found":
            refused = "access" if self._foreign(ws, scope) else None
        entry = Entry(
            ts=time.time(),
            owner=scope.owner,
            tool=scope.tool,
            sizes=sizes,
            ok=failure is None,
            notebook=notebook or scope.notebook,
            request_id=REQUEST_ID.get(),
            refused=refused,
            sources=tuple(sorted(scope.sources)),
            refs_read=tuple(scope.refs_read),
            refs_created=tuple(created),
            charts=sum(1 for r in created if r.startswith("chart_")),
            exports=int(scope.tool in EXPORT_TOOLS and failure is None),
            latency_ms=seconds * 1000,
        )
        try:
            await asyncio.to_thread(ws.ledger.append, entry)
        except Exception as exc:
            log_event("ledger_write_failed", logging.ERROR, tool=scope.tool, error=repr(exc))
            why = "the server's disk is full" if is_full(exc) else "the server could not write"
            raise ToolError(
                f"{why} - this reply could not be recorded in the exposure ledger, so it is not "
                "sent; try again later, or ask the operator to free space in the state dir"
            ) from None
        self._observe(ws, scope, entry, seconds)

    def _observe(self, ws: Workspace, scope: Scope, entry: Entry, seconds: float) -> None:
        """Metrics, the tool_call log line, and an audit event for a refusal."""
        size = entry.sizes.bytes
        self.app.metrics.observe(scope.tool, ok=entry.ok, seconds=seconds, size=size)
        log_event(
            "tool_call", tool=scope.tool, owner=scope.owner, ok=entry.ok, bytes=size,
            sources=list(entry.sources), ms=round(entry.latency_ms, 1), refused=entry.refused,
        )  # fmt: skip
        if entry.refused is not None:
            self.app.metrics.refusals.labels(entry.refused).inc()
            why = "budget spent" if entry.refused == "budget" else "not granted or not the owner"
            audit(
                ws.ledger, "refused", scope.owner, tool=scope.tool, kind=entry.refused,
                reason=why, sources=list(entry.sources), error_bytes=entry.sizes.error_bytes,
            )  # fmt: skip

    def _foreign(self, ws: Workspace, scope: Scope) -> bool:
        """Did the call name a ref that exists but is someone else's? (operators only)"""
        return any(ws.store.owner_of(r) not in (None, scope.owner) for r in scope.refs_read)


class AuthAuditMiddleware:
    """ASGI: every 401/403 the HTTP server answers becomes an ``auth_failure`` audit event."""

    def __init__(self, asgi: Any, app: App) -> None:
        self.asgi = asgi
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.asgi(scope, receive, send)
            return

        async def watch(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start" and message.get("status") in (401, 403):
                self.auth_failure(scope, int(message["status"]))
            await send(message)

        await self.asgi(scope, receive, watch)

    def auth_failure(self, scope: dict[str, Any], status: int) -> None:
        headers = dict(scope.get("headers") or [])
        reason = "invalid_token" if headers.get(b"authorization") else "missing_token"
        self.app.metrics.auth_failures.labels(reason).inc()
        ws = self.app.workspace_or_none()
        client = scope.get("client")
        audit(
            ws.ledger if ws is not None else None, "auth_failure", None, path=scope.get("path"),
            status=status, reason=reason, client=client[0] if client else None,
        )  # fmt: skip


async def metrics_response(app: App, request: Any) -> Any:
    """GET /metrics: 404 unless [metrics] token is set; then only with that bearer token."""
    import secrets

    from starlette.responses import PlainTextResponse, Response

    from .metrics import CONTENT_TYPE

    token = app.settings.metrics.token
    if not token:
        return PlainTextResponse("metrics are off - set [metrics] token", status_code=404)
    sent = request.headers.get("authorization", "")
    if not secrets.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        return PlainTextResponse(
            "send Authorization: Bearer <metrics token>",
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    body = await asyncio.to_thread(app.metrics.render)
    return Response(body, media_type=CONTENT_TYPE)


# -- operations: /metrics, and the HTTP middleware that audits authentication failures ----


def register_operations_routes(mcp: Any, app: App) -> None:
    """GET /metrics (Prometheus text), behind its own bearer token ([metrics] token)."""
    from starlette.requests import Request
    from starlette.responses import Response

    @mcp.custom_route("/metrics", methods=["GET"])
    async def metrics(request: Request) -> Response:
        return await metrics_response(app, request)


def http_middleware(mcp: Any) -> list[Any]:
    """ASGI middleware of ``dataref serve --http``: every 401/403 becomes an audit event."""
    from starlette.middleware import Middleware as ASGIMiddleware

    edge = next(m for m in mcp.middleware if isinstance(m, ExposureMiddleware))
    return [ASGIMiddleware(AuthAuditMiddleware, app=edge.app)]
