"""The FastMCP server: thin tools over the Workspace core.

Each tool resolves the caller's owner, calls the core, and returns compact JSON. The one
place where our exceptions become MCP tool errors is ``tool_errors``; every other exception
is an internal error whose details are masked (``mask_error_details=True``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.tools import FunctionTool
from mcp.types import ToolAnnotations
from pydantic import Field

from . import __version__, compute
from .auth import OwnerResolver, Transport, build_auth
from .config import Settings
from .edge import ExposureMiddleware, register_operations_routes
from .errors import DatarefError
from .metrics import Metrics
from .producers import Producer
from .routes import chart_result, download_base, read_owned, serve_download, with_figures
from .workspace import Workspace

INSTRUCTIONS = """\
dataref keeps data on the server; you work with references (dataRef) and shapes.
Workflow: 1) fetch_* stores data and returns {dataRef, rows, columns, nulls, sample}.
2) run_python(code, inputs={"name": dataRef}) runs pandas on it in a stateful sandboxed
kernel; each input is a DataFrame named by its key; put DataFrames in outputs["x"] to get
new dataRefs; set `result` to a small JSON answer. 3) Chart or export by dataRef.
Never ask for raw rows or print whole tables: compute the answer in run_python.
Variables persist per notebook (default one if omitted). Errors say how to recover."""

READ_ONLY = ToolAnnotations(readOnlyHint=True, idempotentHint=True, openWorldHint=False)
CREATES = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)
DESTROYS = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True)
CREATES_FROM_SOURCE = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=True)

ToolFunction = Callable[..., Awaitable[Any]]

NotebookArg = Annotated[
    str | None,
    Field(description='Notebook handle nb_...; omitted: your default one; "new": a fresh one.'),
]
DataRefArg = Annotated[str, Field(description="A dataRef returned by an earlier call.")]


def tool_errors(fn: ToolFunction) -> ToolFunction:
    """Our errors carry recovery hints meant for the agent: pass exactly those through.

    FastMCP masks every other exception (``mask_error_details``) before middleware could see
    it, so the mapping wraps each tool function; this is the one place it happens.
    """

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except DatarefError as exc:
            raise ToolError(str(exc)) from None

    return wrapper  # type: ignore[return-value]


def tool(mcp: FastMCP, annotations: ToolAnnotations) -> Callable[[ToolFunction], ToolFunction]:
    """Register a tool: errors mapped, and a schema as small as it can be.

    Hosts resend tools/list on every turn, so bytes there cost on every turn too.
    """

    def register(fn: ToolFunction) -> ToolFunction:
        mcp.add_tool(function_tool(fn, name=fn.__name__, annotations=annotations))
        return fn

    return register


class CompactTool(FunctionTool):
    """A tool whose listing leaves out FastMCP's empty ``_meta.fastmcp.tags``."""

    def get_meta(self) -> dict[str, Any]:
        meta = super().get_meta()
        if meta.get("fastmcp") == {"tags": []}:
            del meta["fastmcp"]
        return meta


def function_tool(
    fn: ToolFunction, *, name: str, annotations: ToolAnnotations, description: str | None = None
) -> FunctionTool:
    made = CompactTool.from_function(
        tool_errors(fn),
        name=name,
        description=description,
        annotations=annotations,
        # Every tool returns a JSON object; a schema saying only that adds bytes, not meaning.
        output_schema=None,
    )
    compact_schema(made.parameters)
    return made


def compact_schema(schema: dict[str, Any]) -> None:
    """``anyOf: [T, null], default: null`` -> ``T``: the property is optional already."""
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf")
        if prop.get("default", ...) is None and isinstance(options, list) and len(options) == 2:
            kept = [o for o in options if o.get("type") != "null"]
            if len(kept) == 1:
                del prop["anyOf"], prop["default"]
                prop.update(kept[0])


class App:
    """Holds what the tools need; the workspace exists while the lifespan runs."""

    def __init__(self, settings: Settings, transport: Transport, *, kernels: bool = True) -> None:
        self.settings = settings
        self.kernels = kernels
        self.owners = OwnerResolver(settings, transport)
        self._workspace: Workspace | None = None
        self.metrics = Metrics()
        self.metrics.watch(self.workspace_or_none)

    def workspace_or_none(self) -> Workspace | None:
        return self._workspace

    @property
    def ws(self) -> Workspace:
        if self._workspace is None:
            raise DatarefError("the server is starting or stopping - try again in a moment")
        return self._workspace

    @asynccontextmanager
    async def lifespan(self, server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        workspace = Workspace(self.settings)
        try:
            await workspace.start(kernels=self.kernels)
            self._workspace = workspace
            yield {"workspace": workspace}
        finally:
            self._workspace = None
            await workspace.close()


def create_app(
    settings: Settings, transport: Transport = "stdio", *, kernels: bool = True
) -> FastMCP:
    """The server. ``kernels=False`` is for tests of the tools that never compute."""
    app = App(settings, transport, kernels=kernels)
    mcp = FastMCP(
        "dataref",
        instructions=INSTRUCTIONS,
        version=__version__,
        auth=build_auth(settings) if transport == "http" else None,
        lifespan=app.lifespan,
        mask_error_details=True,
        # Every tool reply passes here: measured, budgeted, recorded in the exposure ledger.
        middleware=[ExposureMiddleware(app)],
    )
    # Producers are built before the lifespan runs, from the same registry the workspace uses.
    from .producers import load_producers

    for producer in load_producers(settings):
        mcp.add_tool(producer_tool(app, producer))
    register_core_tools(mcp, app)
    register_transcript_tools(mcp, app)
    register_consumer_tools(mcp, app)
    if transport == "http" and settings.page.enabled:
        from .web import mount

        mount(mcp, settings, lambda: app.ws)
    register_operations_routes(mcp, app)
    if transport == "http":
        from .health import register_health_routes

        register_health_routes(mcp, app)
    return mcp


def producer_tool(app: App, producer: Producer) -> FunctionTool:
    """An MCP tool for a producer: its own parameters plus ``notebook``."""

    async def call(**arguments: Any) -> dict[str, Any]:
        notebook = arguments.pop("notebook", None)
        owner, ws = app.owners.current(), app.ws
        handle = await asyncio.to_thread(ws.transcripts.resolve, owner, notebook)
        async with ws.notebook_lock(handle):  # cells in call order, whichever server answers
            return await asyncio.to_thread(ws.produce, owner, producer.name, arguments, handle)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in producer.parameters]
    params.append(
        inspect.Parameter(
            "notebook", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=NotebookArg
        )
    )
    call.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    # pydantic reads type hints from __annotations__, not from the signature
    call.__annotations__ = {p.name: p.annotation for p in params} | {"return": dict[str, Any]}
    call.__name__ = producer.name
    return function_tool(
        call, name=producer.name, description=producer.description, annotations=CREATES_FROM_SOURCE
    )


def register_core_tools(mcp: FastMCP, app: App) -> None:
    @tool(mcp, CREATES)
    async def run_python(
        code: Annotated[
            str, Field(description="Python; set `result`, put DataFrames in outputs[name].")
        ],
        inputs: Annotated[
            dict[str, str] | None, Field(description="{variable name: dataRef}")
        ] = None,
        notebook: NotebookArg = None,
        timeout_s: Annotated[float | None, Field(gt=0, description="Seconds; default 120.")] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Run pandas code in a stateful sandbox; inputs arrive as DataFrames. Returns
        {ok, result, stdout, error, outputs: {name: Description}, notebook}."""
        owner = app.owners.current()

        async def progress(elapsed: float) -> None:
            if ctx is not None:
                await ctx.report_progress(elapsed, None, f"running for {elapsed:.0f}s")

        response = await compute.run_python(
            app.ws,
            owner,
            code=code,
            inputs=inputs or {},
            notebook=notebook,
            timeout_s=timeout_s,
            on_progress=progress,
        )
        return await with_figures(app, owner, response)

    @tool(mcp, CREATES)
    async def reset_kernel(notebook: NotebookArg = None) -> dict[str, Any]:
        """Restart the notebook's kernel: variables are cleared, artifacts stay."""
        return await compute.reset_kernel(app.ws, app.owners.current(), notebook)

    @tool(mcp, READ_ONLY)
    async def describe_data(dataRef: DataRefArg) -> dict[str, Any]:
        """Per-column stats of an artifact: count, nulls, unique, min/max/mean/std/quartiles."""
        return await asyncio.to_thread(app.ws.describe_data, app.owners.current(), dataRef)

    @tool(mcp, DESTROYS)
    async def drop_artifact(dataRef: DataRefArg) -> dict[str, Any]:
        """Delete one of your artifacts or charts to free quota."""
        return await asyncio.to_thread(app.ws.drop_artifact, app.owners.current(), dataRef)

    @tool(mcp, READ_ONLY)
    async def list_sources() -> dict[str, Any]:
        """Your fetch_sql sources: dialect, tables, columns, types, row estimates."""
        from .producers.discovery import list_sources as discover

        return await asyncio.to_thread(discover, app.settings, app.owners.current())

    @tool(mcp, READ_ONLY)
    async def list_artifacts() -> dict[str, Any]:
        """Your live artifacts: ref, rows, origin, created, expires."""
        return await asyncio.to_thread(app.ws.list_artifacts, app.owners.current())


# -- consumers: charts, exports, download links, resources -----------------------------
#
# Resource links: charts get one (dataref://charts/<ref>, ~120 bytes) next to their image, so
# a host can fetch or keep the full-size PNG without the model asking; the image itself is
# the bounded copy. Descriptions (producers, run_python outputs) get none: the link would only
# repeat the dataRef already in the JSON, on every later turn. Exports get none either: their
# file is not an MCP resource, the url/path in the JSON is what a person opens.

ChartKind = Literal["bar", "line", "scatter", "hist", "area"]


def register_consumer_tools(mcp: FastMCP, app: App) -> None:
    """render_chart, export_data/export_csv, the /download route, artifact+chart resources."""
    from starlette.requests import Request
    from starlette.responses import Response

    from . import consumers

    @tool(mcp, CREATES)
    async def render_chart(
        dataRef: DataRefArg,
        x: str,
        y: Annotated[
            str | None, Field(description="Numeric column; bar without y counts rows.")
        ] = None,
        kind: Annotated[ChartKind, Field(description="hist: distribution of x.")] = "bar",
        title: str | None = None,
        notebook: NotebookArg = None,
    ) -> dict[str, Any]:
        """Chart an artifact: a PNG plus {chartRef, url|path, bytes, note?}."""
        owner, base = app.owners.current(), download_base(app)
        chart = await asyncio.to_thread(
            consumers.render_chart,
            app.ws,
            owner,
            data_ref=dataRef,
            x=x,
            y=y,
            kind=kind,
            title=title,
            notebook=notebook,
            base_url=base,
        )
        images = [] if chart.sensitive else [(chart.info["chartRef"], chart.png)]
        return chart_result(chart.info, images)

    @tool(mcp, CREATES)
    async def export_data(
        dataRef: DataRefArg, format: Literal["csv", "parquet"] = "csv"
    ) -> dict[str, Any]:
        """Write an artifact to a file for a person: {url|path, rows, bytes, format, expires}."""
        owner, base = app.owners.current(), download_base(app)
        return await asyncio.to_thread(
            consumers.export_data, app.ws, owner, data_ref=dataRef, fmt=format, base_url=base
        )

    @tool(mcp, CREATES)
    async def export_csv(dataRef: DataRefArg) -> dict[str, Any]:
        """export_data as CSV."""
        owner, base = app.owners.current(), download_base(app)
        return await asyncio.to_thread(
            consumers.export_data, app.ws, owner, data_ref=dataRef, fmt="csv", base_url=base
        )

    @mcp.custom_route("/download/{token}", methods=["GET"])
    async def download(request: Request) -> Response:
        return await serve_download(app, request)

    @mcp.resource("dataref://artifacts/{ref}", mime_type="application/json")
    async def artifact(ref: str) -> str:
        """The Description (shape) of one of your artifacts."""
        desc = await read_owned(app, consumers.artifact_description, ref)
        return json.dumps(desc, separators=(",", ":"))

    @mcp.resource("dataref://charts/{ref}", mime_type="image/png")
    async def chart(ref: str) -> bytes:
        """One of your charts, as PNG."""
        return await read_owned(app, consumers.chart_png, ref)


# -- transcripts: the notebook of a handle, exported data-free --------------------------


def register_transcript_tools(mcp: FastMCP, app: App) -> None:
    """export_notebook and the dataref://notebooks/{handle} resource."""
    from . import notebook_export as nbx

    @tool(mcp, CREATES)
    async def export_notebook(notebook: NotebookArg = None) -> dict[str, Any]:
        """Export the notebook as a data-free .ipynb (one cell per call, no rows) that a
        person runs again in JupyterLab: {path or url, cells, notebook}."""
        owner = app.owners.current()
        handle = await asyncio.to_thread(app.ws.transcripts.resolve, owner, notebook)
        return await asyncio.to_thread(
            nbx.export_for_owner,
            app.ws.transcripts,
            app.ws.downloads,
            owner,
            handle,
            download_base(app),
            app.settings.server.download_ttl_seconds,
        )

    def exported_json(ws: Workspace, owner: str, handle: str) -> str:
        return nbx.notebook_json(nbx.export_notebook(ws.transcripts, owner, handle))

    @mcp.resource("dataref://notebooks/{handle}", mime_type=nbx.MEDIA_TYPE)
    async def notebook_resource(handle: str) -> str:
        """One of your notebooks, exported data-free (.ipynb JSON)."""
        return await read_owned(app, exported_json, handle)
