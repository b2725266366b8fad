"""Measuring a reply as the client receives it: its JSON size and the size of its parts.

Nothing here keeps a value: samples, results and texts are measured and dropped.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.types import CallToolResult, ReadResourceResult, TextContent

from .artifact import REF_PATTERN
from .ledger import Sizes

REF_KEYS = ("dataRef", "chartRef")


def refs_in(value: Any, depth: int = 3) -> list[str]:
    """The dataRefs/chartRefs among the (nested) string values of ``value``."""
    if isinstance(value, str):
        return [value] if REF_PATTERN.fullmatch(value) else []
    found: list[str] = []
    if depth > 0 and isinstance(value, dict):
        for item in value.values():
            found += refs_in(item, depth - 1)
    elif depth > 0 and isinstance(value, list):
        for item in value:
            found += refs_in(item, depth - 1)
    return found


def created_refs(structured: Any, depth: int = 4) -> list[str]:
    """Refs a reply names under dataRef/chartRef keys (a Description, outputs, charts)."""
    found: list[str] = []
    if depth <= 0:
        return found
    if isinstance(structured, dict):
        for key, item in structured.items():
            if key in REF_KEYS and isinstance(item, str) and REF_PATTERN.fullmatch(item):
                found.append(item)
            elif isinstance(item, (dict, list)):
                found += created_refs(item, depth - 1)
    elif isinstance(structured, list):
        for item in structured:
            found += created_refs(item, depth - 1)
    return found


def reply_of(result: Any) -> CallToolResult:
    """The CallToolResult FastMCP sends for a ToolResult (as its wire handler builds it)."""
    made = result.to_mcp_result()
    if isinstance(made, CallToolResult):
        return made
    if isinstance(made, tuple):
        content, structured = made
        return CallToolResult(content=content, structured_content=structured)
    return CallToolResult(content=made)


def error_reply(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def _samples(value: Any, depth: int = 4) -> tuple[int, int]:
    """(rows, bytes) of every Description sample in a reply."""
    rows = size = 0
    if depth <= 0:
        return rows, size
    if isinstance(value, dict):
        sample = value.get("sample")
        if isinstance(sample, list) and "dataRef" in value:
            rows, size = len(sample), _json_size(sample)
        for key, item in value.items():
            if key != "sample" and isinstance(item, (dict, list)):
                r, s = _samples(item, depth - 1)
                rows, size = rows + r, size + s
    elif isinstance(value, list):
        for item in value:
            r, s = _samples(item, depth - 1)
            rows, size = rows + r, size + s
    return rows, size


# Added by the protocol layer to every result of a 2026-era session: no data, not counted.
ENVELOPE_META = "io.modelcontextprotocol/serverInfo"


def reply_json(reply: CallToolResult | ReadResourceResult) -> bytes:
    """The tool's reply as JSON on the wire (content, structuredContent, isError, the tool's
    own _meta), without the protocol's per-result envelope (resultType, serverInfo stamp)."""
    meta = {k: v for k, v in (reply.meta or {}).items() if k != ENVELOPE_META}
    bare = reply.model_copy(update={"meta": meta or None})
    try:
        return bare.model_dump_json(
            by_alias=True, exclude_none=True, exclude={"result_type"}
        ).encode()
    except ValueError:  # text no UTF-8 can carry (a lone surrogate echoed back): escaped
        dumped = bare.model_dump(by_alias=True, exclude_none=True, exclude={"result_type"})
        return json.dumps(dumped, separators=(",", ":"), default=str).encode()


def measure(reply: CallToolResult, tool: str) -> Sizes:
    """The reply's size as the client receives it (its JSON), and the size of its parts."""
    total = len(reply_json(reply))
    images = [b for b in reply.content if getattr(b, "type", "") == "image"]
    image_bytes = sum(len(b.data) for b in images)
    if reply.is_error:
        texts = [b.text for b in reply.content if getattr(b, "type", "") == "text"]
        error = sum(len(t.encode()) for t in texts)
        return Sizes(bytes=total, error_bytes=error)
    body = reply.structured_content if isinstance(reply.structured_content, dict) else {}
    rows, sample = _samples(body)
    result = stdout = error = 0
    if tool == "run_python":
        result = _json_size(body["result"]) if body.get("result") is not None else 0
        stdout = len(str(body.get("stdout") or "").encode())
        error = len(str(body.get("error") or "").encode())
    return Sizes(
        bytes=total,
        sample_rows=rows,
        sample_bytes=sample,
        result_bytes=result,
        stdout_bytes=stdout,
        error_bytes=error,
        image_count=len(images),
        image_bytes=image_bytes,
    )


def measure_resource(read: ReadResourceResult) -> tuple[Sizes, dict[str, Any]]:
    """A resource read: a Description (JSON text, with its sample) or a chart (PNG blob)."""
    total = len(reply_json(read))
    rows = sample = images = image_bytes = 0
    body: dict[str, Any] = {}
    for item in read.contents:
        blob = getattr(item, "blob", None)
        if blob is not None and (item.mime_type or "").startswith("image/"):
            images, image_bytes = images + 1, image_bytes + len(blob)
        text = getattr(item, "text", None)
        if text is not None and item.mime_type == "application/json":
            try:
                parsed = json.loads(text)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                body = parsed
                rows, sample = _samples(parsed)
    sizes = Sizes(
        bytes=total, sample_rows=rows, sample_bytes=sample, image_count=images,
        image_bytes=image_bytes,
    )  # fmt: skip
    return sizes, body
