"""run_python: stage inputs, execute the agent's code, collect outputs and a small result.

One call is one execute request. Its first line is a header the kernel profile strips before
the code compiles (so tracebacks keep the agent's line numbers): it names the cell and the
inputs to bind. After the code runs, even when it fails, the profile writes ``outputs`` as
Arrow files, saves open figures as PNGs, serialises ``result`` and publishes a manifest.
Everything the kernel writes is untrusted: sizes are checked here, files are opened without
following links, and the manifest's numbers are never believed over the files themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import keyword
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from .consumers import MAX_KERNEL_FIGURE_BYTES, store_kernel_figure
from .describe import describe
from .errors import ComputeError, DatarefError, InvalidRequest, LimitExceeded, human_bytes
from .transcript import record_reset, record_run_python
from .workspace import Workspace

HEADER_PREFIX = "# dataref:"
COLLECT_MIME = "application/vnd.dataref.collect+json"
# The user expression that returns a successful cell's manifest in its execute reply (no
# display message); a failed cell's reply has no user expressions, so its manifest comes as
# a display_data, as does every manifest of a kernel profile that does not know "reply".
MANIFEST_EXPRESSIONS = {"manifest": "__dataref_manifest__()"}
RESERVED_NAMES = frozenset({"outputs", "result", "dr", "In", "Out", "get_ipython", "exit", "quit"})
MAX_CODE_BYTES = 512 * 1024
MAX_TRACEBACK_CHARS = 1500
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

ProgressCallback = Callable[[float], Awaitable[None]]


class KernelFiles:
    """Reads what a kernel wrote for one cell through its backend (a file opened without
    following links, or bytes sent over the kernel's channel): untrusted, and size-checked."""

    def __init__(self, kernel: Any, cell_id: str) -> None:
        self.kernel = kernel
        self.cell_id = cell_id

    def read_bytes(self, filename: str, max_bytes: int) -> bytes | None:
        try:
            return self.kernel.read_output(self.cell_id, filename, max_bytes)
        except (OSError, ValueError, DatarefError):
            return None

    def read_table(self, filename: str, max_bytes: int) -> pa.Table:
        try:
            data = self.kernel.read_output(self.cell_id, filename, max_bytes)
        except ValueError as exc:
            if "too large" in str(exc):
                raise LimitExceeded(
                    f"it exceeds the artifact size cap ({human_bytes(max_bytes)}) - keep fewer "
                    "rows or columns, or aggregate first"
                ) from None
            raise
        return pa.ipc.open_file(pa.BufferReader(data)).read_all()


def validate_inputs(ws: Workspace, owner: str, inputs: dict[str, str]) -> dict[str, bool]:
    """Check names and refs; returns {ref: sensitive} for the refs."""
    if not isinstance(inputs, dict):
        raise InvalidRequest('inputs must be an object {"name": "data_..."}')
    sensitive: dict[str, bool] = {}
    for name, ref in inputs.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise InvalidRequest(f"input name {name!r} must be a Python identifier")
        if name in RESERVED_NAMES or name.startswith("_"):
            raise InvalidRequest(
                f"input name {name!r} is reserved - choose another name "
                f"(not {sorted(RESERVED_NAMES)} and not starting with '_')"
            )
        art = ws.store.get(owner, ref, kind="table")
        sensitive[art.ref] = art.sensitive
    return sensitive


def clamp_timeout(ws: Workspace, timeout_s: float | None) -> float:
    limits = ws.settings.compute
    if timeout_s is None:
        return limits.default_timeout_seconds
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise InvalidRequest("timeout_s must be a positive number of seconds")
    return min(float(timeout_s), limits.max_timeout_seconds)


async def run_python(
    ws: Workspace,
    owner: str,
    *,
    code: str,
    inputs: dict[str, str],
    notebook: str | None,
    timeout_s: float | None,
    on_progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    if not isinstance(code, str) or not code.strip():
        raise InvalidRequest("code is empty - pass the Python to run")
    try:
        size = len(code.encode())
    except UnicodeEncodeError:  # lone surrogates: no kernel could run it
        raise InvalidRequest(
            "code is not valid Unicode text - remove the stray characters"
        ) from None
    if size > MAX_CODE_BYTES:
        raise InvalidRequest(f"code is larger than {human_bytes(MAX_CODE_BYTES)} - send less code")
    # State look-ups in a thread (on PostgreSQL each is a round trip the loop must not wait
    # on), both in one hop.
    ref_sensitive, handle = await asyncio.to_thread(_look_up, ws, owner, inputs, notebook)
    timeout = clamp_timeout(ws, timeout_s)
    if ws.pool is None:
        raise ComputeError(
            "run_python is unavailable on this server - "
            + (ws.kernel_problem or "kernels are not running")
            + " (ask the operator; fetch, describe, chart and export still work)"
        )
    async with ws.notebook_lock(handle):  # one call at a time per notebook, on any server
        kernel = await ws.pool.kernel(owner, handle)
        call = CellCall(owner, handle, "", code, inputs, any(ref_sensitive.values()), 0.0)
        return await _execute(ws, kernel, call, timeout, on_progress)


def _look_up(
    ws: Workspace, owner: str, inputs: dict[str, str], notebook: str | None
) -> tuple[dict[str, bool], str]:
    return validate_inputs(ws, owner, inputs), ws.transcripts.resolve(owner, notebook)


async def _execute(
    ws: Workspace,
    kernel: Any,
    call: CellCall,
    timeout: float,
    on_progress: ProgressCallback | None,
) -> dict[str, Any]:
    owner, inputs = call.owner, call.inputs
    async with kernel.lock:  # one call at a time per notebook, recorded in the same order
        cell_id = f"cell{time.time_ns():x}"
        if inputs:  # a call without inputs makes a single thread hop, after the reply
            await kernel.stage(ws.store, owner, sorted(set(inputs.values())))
        header = HEADER_PREFIX + json.dumps(
            {"cell": cell_id, "bind": inputs, "reply": True}, separators=(",", ":")
        )
        started = time.perf_counter()
        execution = await kernel.execute(
            header + "\n" + call.code,
            timeout_s=timeout,
            on_progress=on_progress,
            user_expressions=MANIFEST_EXPRESSIONS,
        )
        elapsed = time.perf_counter() - started
        call = replace(call, cell_id=cell_id, elapsed_s=elapsed)
        return await asyncio.to_thread(_finish, ws, kernel, execution, call)


@dataclass(frozen=True)
class CellCall:
    owner: str
    handle: str
    cell_id: str
    code: str
    inputs: dict[str, str]
    sensitive: bool
    elapsed_s: float


def _finish(ws: Workspace, kernel: Any, execution: Any, call: CellCall) -> dict[str, Any]:
    """Collect outputs, clean the kernel's output dir, record the cell (one thread hop)."""
    manifest = _manifest(execution)
    try:
        response = collect(ws, kernel, execution, call, manifest)
    finally:
        if manifest is None or manifest.get("outputs") or manifest.get("figures"):
            kernel.remove_outputs(call.cell_id)  # the kernel writes the dir only for these
    response["notebook"] = call.handle
    # Before the transcript: its write wakes the page, which then finds what the call showed.
    ws.shown.add(call.owner, call.handle, call.code, response)
    record_run_python(
        ws.transcripts,
        call.owner,
        call.handle,
        code=call.code,
        inputs=call.inputs,
        response=response,
        elapsed_s=call.elapsed_s,
    )
    return response


def collect(
    ws: Workspace, kernel: Any, execution: Any, call: CellCall, manifest: dict[str, Any] | None
) -> dict[str, Any]:
    """Turn an ExecutionResult into the compact response; store outputs and figures."""
    response: dict[str, Any] = {"ok": execution.status == "ok", "result": None}
    notes: list[str] = []
    response["stdout"] = truncate_stream(
        execution.stdout, execution.stderr, ws.settings.compute.stdout_max_bytes
    )
    response["error"] = describe_failure(execution)
    if manifest is not None:
        response["result"] = _result(manifest, ws.settings.compute.result_max_bytes, notes)
        files = KernelFiles(kernel, call.cell_id)
        response["outputs"] = _store_outputs(ws, call, files, manifest, notes)
        charts = _store_figures(ws, call, files, manifest)
        if charts:
            response["charts"] = charts
        notes.extend(str(e) for e in manifest.get("errors", [])[:5])
    else:
        response["outputs"] = {}
    if notes:
        response["notes"] = notes
    return response


def _manifest(execution: Any) -> dict[str, Any] | None:
    """The cell's manifest: from the execute reply's user expression, else a display."""
    reply = (getattr(execution, "user_expressions", None) or {}).get("manifest")
    if isinstance(reply, dict) and reply.get("status") == "ok":
        data = (reply.get("data") or {}).get(COLLECT_MIME)
        if isinstance(data, dict):
            return data
    for bundle in reversed(execution.displays):
        data = bundle.get(COLLECT_MIME)
        if isinstance(data, dict):
            return data
        if isinstance(data, str):
            with contextlib.suppress(ValueError):
                return json.loads(data)
    return None


def _result(manifest: dict[str, Any], cap: int, notes: list[str]) -> Any:
    text = manifest.get("result")
    if text is None:
        if manifest.get("result_error"):
            notes.append(f"result: {str(manifest['result_error'])[:300]}")
        return None
    if not isinstance(text, str):
        return None
    size = len(text.encode())
    if size > cap:
        notes.append(
            f"result withheld: {human_bytes(size)} of JSON > {human_bytes(cap)} cap - return fewer "
            "items (e.g. .head(10), rounding) or put the table in outputs['name']"
        )
        return None
    try:
        return json.loads(text)
    except ValueError:
        notes.append("result could not be decoded as JSON - set result to plain values")
        return None


def _lineage(call: CellCall) -> dict[str, Any]:
    return {
        "tool": "run_python",
        "notebook": call.handle,
        "cell": call.cell_id,
        "parents": sorted(set(call.inputs.values())),
    }


def _store_outputs(
    ws: Workspace, call: CellCall, files: KernelFiles, manifest: dict[str, Any], notes: list[str]
) -> dict[str, Any]:
    described: dict[str, Any] = {}
    names = manifest.get("outputs", [])
    for name in names if isinstance(names, list) else []:
        if not isinstance(name, str) or not name.isidentifier():
            continue
        try:
            table = files.read_table(f"{name}.arrow", ws.settings.store.artifact_max_bytes)
            lineage = {**_lineage(call), "output": name}
            art = ws.store.put_table(call.owner, table, lineage=lineage, sensitive=call.sensitive)
        except DatarefError as exc:  # over a cap, not storable, or the disk is full
            notes.append(f"outputs[{name!r}] not stored: {exc}")
            continue
        except Exception:  # an unreadable or forged file: say so, keep the rest
            notes.append(f"outputs[{name!r}] not stored: the kernel wrote an unreadable table")
            continue
        described[name] = describe(
            art.ref,
            table,
            sample_rows=ws.settings.describe.output_sample_rows,
            sensitive=call.sensitive,
        )
    return described


def _store_figures(
    ws: Workspace, call: CellCall, files: KernelFiles, manifest: dict[str, Any]
) -> list[dict[str, Any]]:
    charts = []
    figures = manifest.get("figures", [])
    for name in figures if isinstance(figures, list) else []:
        if isinstance(name, str) and re.fullmatch(r"figure_\d+\.png", name):
            data = files.read_bytes(name, MAX_KERNEL_FIGURE_BYTES)
            if not data:
                continue
            chart = store_kernel_figure(ws, call.owner, data, name, _lineage(call), call.sensitive)
            if chart is not None:
                charts.append(chart)
    return charts


def truncate_stream(stdout: str, stderr: str, cap: int) -> str:
    text = stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
    data = text.encode()
    if len(data) <= cap:
        return text
    kept = data[:cap].decode(errors="ignore")
    return (
        f"{kept}\n[output truncated: {human_bytes(len(data) - cap)} of {human_bytes(len(data))} cut"
        " - print less, e.g. df.head() or a summary]"
    )


def describe_failure(execution: Any) -> str | None:
    if execution.status == "ok":
        return None
    if execution.status == "died":
        return (
            "the kernel died (crash, os._exit or out of memory) and was replaced - its variables "
            "are gone, your artifacts are kept; re-bind inputs and re-run what you need"
        )
    if execution.status == "timeout":
        lost = getattr(execution, "restarted", False)
        state = (
            "the kernel was restarted - its variables are gone, your artifacts are kept"
            if lost
            else "the kernel was interrupted; variables are kept"
        )
        return f"timed out - {state}; make the code faster or pass a larger timeout_s"
    return trim_traceback(execution.error or {})


def trim_traceback(error: dict[str, Any]) -> str:
    """Only the agent's own frames ("Cell In[..]") and the exception line."""
    lines = [ANSI.sub("", str(x)) for x in error.get("traceback", [])]
    own = [frame.strip("\n") for frame in lines if frame.lstrip().startswith("Cell In[")]
    last = f"{error.get('ename', 'Error')}: {error.get('evalue', '')}".rstrip(": ")
    text = "\n".join([*own[-3:], last])
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "…" + text[-MAX_TRACEBACK_CHARS:]
    return text


async def reset_kernel(ws: Workspace, owner: str, notebook: str | None) -> dict[str, Any]:
    handle = await asyncio.to_thread(ws.transcripts.resolve, owner, notebook)
    async with ws.notebook_lock(handle):
        if ws.pool is not None:
            await ws.pool.reset(owner, handle)
        await asyncio.to_thread(record_reset, ws.transcripts, owner, handle)
    return {"ok": True, "notebook": handle, "note": "variables cleared; artifacts kept"}
