"""``dataref demo``: the article's session, run through a real MCP client over stdio.

It starts ``dataref serve`` as a subprocess (a temporary state dir unless one is given),
makes the calls an agent would make, and prints, for each call, the bytes of the tool result
that reached the client: that is what an agent's transcript pays for. It writes the exported
notebook and the chart next to each other, so a person can open and re-run them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QOQ_CODE = """\
q = sales.assign(q=sales.date.dt.to_period("Q"))
pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")
delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()
outputs["qoq"] = delta.rename("delta").reset_index()
result = delta.head(5).round(2).to_dict()
"""

WORST_CODE = """\
falling = qoq[qoq.delta < 0]
worst = falling.nsmallest(10, "delta").reset_index(drop=True)
worst["share_of_drop"] = (worst.delta / falling.delta.sum()).round(3)
outputs["worst10"] = worst
result = {
    "lines_down": len(falling),
    "total_drop": round(falling.delta.sum(), 2),
    "worst10_share": round(worst.delta.sum() / falling.delta.sum(), 3),
}
"""


@dataclass
class Call:
    label: str
    tool: str
    json_bytes: int  # UTF-8 bytes of the JSON text the client received
    image_bytes: int = 0
    lines: list[str] = field(default_factory=list)


@dataclass
class Session:
    """Drives one MCP client; remembers what every call cost."""

    client: Any
    calls: list[Call] = field(default_factory=list)
    echo: bool = True

    async def call(self, tool: str, arguments: dict[str, Any], label: str) -> Any:
        result = await self.client.call_tool(tool, arguments, raise_on_error=False)
        texts = [b.text for b in result.content if getattr(b, "type", "") == "text"]
        if result.is_error:
            raise RuntimeError(f"{tool} failed: {' '.join(texts)[:500]}")
        images = [b.data for b in result.content if getattr(b, "type", "") == "image"]
        call = Call(
            label=label,
            tool=tool,
            json_bytes=sum(len(t.encode()) for t in texts),
            image_bytes=sum(len(base64.b64decode(d)) for d in images),
        )
        self.calls.append(call)
        if self.echo:
            print(f"{len(self.calls)}. {label}", flush=True)
        return result

    def note(self, text: str) -> None:
        """A line under the last call, with its byte count on the first one."""
        call = self.calls[-1]
        if self.echo:
            size = "" if call.lines else f"{call.json_bytes:>6,} B"
            print(f"   {text:<70}{size}".rstrip(), flush=True)
        call.lines.append(text)


def server_transport(config: str | None, state_dir: Path, log_file: Path) -> Any:
    """``dataref serve`` over stdio, with our DATAREF_* settings and this state dir."""
    from fastmcp.client.transports import StdioTransport

    env = {k: v for k, v in os.environ.items() if k.startswith("DATAREF_")}
    env["DATAREF_STATE_DIR"] = str(state_dir)
    for name in ("PATH", "HOME", "LANG", "USER", "LOGNAME"):
        if name in os.environ:
            env[name] = os.environ[name]
    args = ["-m", "dataref.cli", *(["--config", config] if config else []), "serve"]
    return StdioTransport(sys.executable, args, env=env, log_file=log_file, keep_alive=False)


def _short(value: Any, limit: int = 62) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 4] + " ...}"


async def article(session: Session) -> dict[str, Any]:
    """fetch -> quarter-over-quarter -> chained ranking -> chart -> export."""
    fetched = await session.call(
        "fetch_sales", {"since": "2025-01-01"}, 'fetch_sales(since="2025-01-01")'
    )
    sales = fetched.structured_content
    session.note(f"{sales['rows']:,} rows stay on the server; the agent gets their shape")
    qoq_call = await session.call(
        "run_python",
        {"code": QOQ_CODE, "inputs": {"sales": sales["dataRef"]}},
        'run_python(inputs={"sales": ...}): quarter-over-quarter change by line',
    )
    qoq = qoq_call.structured_content
    session.note(f"result {_short(qoq['result'])}")
    session.note(f"outputs: qoq, {qoq['outputs']['qoq']['rows']} rows (a new dataRef)")
    worst = await session.call(
        "run_python",
        {"code": WORST_CODE, "inputs": {"qoq": qoq["outputs"]["qoq"]["dataRef"]}},
        'run_python(inputs={"qoq": ...}): the worst lines, share of the drop',
    )
    session.note(f"result {_short(worst.structured_content['result'])}")
    args = {"dataRef": qoq["outputs"]["qoq"]["dataRef"], "x": "line", "y": "delta", "kind": "bar"}
    chart = await session.call(
        "render_chart", args, 'render_chart(qoq, x="line", y="delta", kind="bar")'
    )
    session.note(f"a {session.calls[-1].image_bytes / 1024:.0f} KB PNG (an image to the model)")
    exported = await session.call("export_notebook", {}, "export_notebook()")
    session.note(f"{exported.structured_content['cells']} cells, no data")
    return {
        "rows": sales["rows"],
        "notebook": qoq["notebook"],
        "chart": chart,
    }


async def _write_outputs(client: Any, done: dict[str, Any], out: Path) -> dict[str, str]:
    """The exported notebook (read as an MCP resource) and the chart PNG, into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    contents = await client.read_resource(f"dataref://notebooks/{done['notebook']}")
    notebook = out / "quarter-over-quarter.ipynb"
    notebook.write_text(contents[0].text, encoding="utf-8")
    chart = out / "qoq-chart.png"
    info = done["chart"].structured_content
    if info.get("path") and Path(info["path"]).is_file():
        shutil.copyfile(info["path"], chart)  # the full-size PNG the person gets
    else:
        image = next(b for b in done["chart"].content if getattr(b, "type", "") == "image")
        chart.write_bytes(base64.b64decode(image.data))
    return {"notebook": str(notebook), "chart": str(chart)}


async def _demo(config: str | None, out: Path, state_dir: Path, echo: bool) -> dict[str, Any]:
    from fastmcp import Client

    log = state_dir / "demo-server.log"
    async with Client(server_transport(config, state_dir, log)) as client:
        session = Session(client, echo=echo)
        done = await article(session)
        files = await _write_outputs(client, done, out)
    calls = session.calls
    return {
        "calls": [
            {"tool": c.tool, "json_bytes": c.json_bytes, "image_bytes": c.image_bytes}
            for c in calls
        ],
        "total_json_bytes": sum(c.json_bytes for c in calls),
        "fetch_and_qoq_bytes": calls[0].json_bytes + calls[1].json_bytes,
        "rows": done["rows"],
        **files,
    }


def run_demo(config: str | None, out: str, state_dir: str | None, *, as_json: bool) -> int:
    """The ``dataref demo`` command; 0 on success."""
    temporary = state_dir is None
    state = Path(state_dir or tempfile.mkdtemp(prefix="dataref-demo-"))
    state.mkdir(parents=True, exist_ok=True)
    if not as_json:
        print("dataref demo: the article's session on the demo sales source, via MCP (stdio)\n")
    try:
        summary = asyncio.run(_demo(config, Path(out), state, echo=not as_json))
    except Exception as exc:
        log = state / "demo-server.log"
        tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
        print(f"dataref demo failed: {exc}\n{tail}", file=sys.stderr)
        return 1
    finally:
        if temporary:
            shutil.rmtree(state, ignore_errors=True)
    if as_json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"\n{summary['total_json_bytes']:,} bytes of JSON reached the transcript in all "
        f"(plus one chart image);\nfetch + quarter-over-quarter: "
        f"{summary['fetch_and_qoq_bytes']:,} bytes for {summary['rows']:,} rows.\n"
        f"\nwrote {summary['notebook']} (data-free: run it again in JupyterLab)"
        f"\n      {summary['chart']}"
    )
    return 0
