"""The FastMCP server: thin tools over the Workspace core.

Each tool resolves the caller's owner, calls the core, and returns compact JSON. The one
place where our exceptions become MCP tool errors is ``tool_errors``; every other exception
is an internal error whose details are masked (``mask_error_details=True``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.tools import FunctionTool
from mcp.types import ToolAnnotations
from pydantic import Field

from . import __version__
from .auth import OwnerResolver, Transport, build_auth
from .config import Settings
from .errors import DatarefError
from .producers import Producer
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
CREATES_FROM_SOURCE = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=True)

ToolFunction = Callable[..., Awaitable[Any]]

NotebookArg = Annotated[
    str | None, Field(description="Notebook handle (nb_...); omit for your default notebook.")
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


class App:
    """Holds what the tools need; the workspace exists while the lifespan runs."""

    def __init__(self, settings: Settings, transport: Transport, *, kernels: bool = True) -> None:
        self.settings = settings
        self.kernels = kernels
        self.owners = OwnerResolver(settings, transport)
        self._workspace: Workspace | None = None

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
    )
    # Producers are built before the lifespan runs, from the same registry the workspace uses.
    from .producers import load_producers

    for producer in load_producers(settings):
        mcp.add_tool(producer_tool(app, producer))
    register_core_tools(mcp, app)
    return mcp


def producer_tool(app: App, producer: Producer) -> FunctionTool:
    """An MCP tool for a producer: its own parameters plus ``notebook``."""

    async def call(**arguments: Any) -> dict[str, Any]:
        notebook = arguments.pop("notebook", None)
        owner = app.owners.current()
        return await asyncio.to_thread(app.ws.produce, owner, producer.name, arguments, notebook)

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
    return FunctionTool.from_function(
        tool_errors(call),
        name=producer.name,
        description=producer.description,
        annotations=CREATES_FROM_SOURCE,
    )


def register_core_tools(mcp: FastMCP, app: App) -> None:
    @mcp.tool(annotations=CREATES)
    @tool_errors
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
        from .compute import run_python as compute

        owner = app.owners.current()

        async def progress(elapsed: float) -> None:
            if ctx is not None:
                await ctx.report_progress(elapsed, None, f"running for {elapsed:.0f}s")

        return await compute(
            app.ws,
            owner,
            code=code,
            inputs=inputs or {},
            notebook=notebook,
            timeout_s=timeout_s,
            on_progress=progress,
        )

    @mcp.tool(annotations=CREATES)
    @tool_errors
    async def reset_kernel(notebook: NotebookArg = None) -> dict[str, Any]:
        """Restart the notebook's kernel: variables are cleared, artifacts stay."""
        from .compute import reset_kernel as reset

        return await reset(app.ws, app.owners.current(), notebook)

    @mcp.tool(annotations=READ_ONLY)
    @tool_errors
    async def describe_data(dataRef: DataRefArg) -> dict[str, Any]:
        """Per-column stats of an artifact: count, nulls, unique, min/max/mean/std/quartiles."""
        return await asyncio.to_thread(app.ws.describe_data, app.owners.current(), dataRef)

    @mcp.tool(annotations=READ_ONLY)
    @tool_errors
    async def list_artifacts() -> dict[str, Any]:
        """Your live artifacts: ref, rows, origin, created, expires."""
        return await asyncio.to_thread(app.ws.list_artifacts, app.owners.current())
