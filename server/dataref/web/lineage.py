"""The lineage graph of an owner's artifacts, laid out for an SVG drawn on the server.

Nodes are the calls (a producer, a run_python cell, a chart) and the artifacts they made;
edges run from each input artifact to the call that read it, and from the call to what it
made: fetch -> sales -> run_python -> qoq -> render_chart -> chart. Columns are the longest
path from a source, so every edge points to the right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NODE_W, NODE_H = 156, 46
COL_GAP, ROW_GAP, MARGIN = 34, 16, 10
SUB_CHARS = 24


@dataclass
class Node:
    id: str
    kind: str  # "call" | "table" | "chart" | "gone"
    label: str
    sub: str = ""
    ref: str | None = None
    tool: str | None = None
    parents: list[str] = field(default_factory=list)
    x: int = 0
    y: int = 0


def _short(text: str) -> str:
    return text if len(text) <= SUB_CHARS else text[: SUB_CHARS - 1] + "…"


def _call_of(art: dict[str, Any]) -> tuple[str, str, str]:
    """(node id, label, sub-label) of the call that made an artifact."""
    tool = str(art.get("origin") or "unknown")
    args = art.get("args") or {}
    if tool == "run_python" and art.get("cell"):
        return f"cell:{art['cell']}", "run_python", "a notebook cell"
    if tool == "render_chart":
        sub = f"{args.get('kind', '')} of {args.get('y') or 'count'} by {args.get('x', '')}"
    else:
        sub = ", ".join(f"{k}={v}" for k, v in args.items()) or "producer"
    return f"call:{art['ref']}", tool, _short(sub)


def _name_of(art: dict[str, Any]) -> str:
    """The variable the notebook gives it: the output name, the producer's base, or chart."""
    if art.get("output"):
        return str(art["output"])
    if art["kind"] == "chart":
        return "chart"
    base = str(art.get("origin") or "").removeprefix("fetch_")
    return base if base.isidentifier() and base != "sql" else "data"


def build(artifacts: list[dict[str, Any]]) -> dict[str, Any]:
    """``artifacts``: dicts with ref, kind, rows, origin, output, cell, parents."""
    nodes: dict[str, Node] = {}
    live = {a["ref"] for a in artifacts}
    for art in artifacts:
        call_id, label, sub = _call_of(art)
        call = nodes.setdefault(call_id, Node(call_id, "call", label, sub, tool=label))
        for parent in art.get("parents") or []:
            if parent not in live and parent not in nodes:
                nodes[parent] = Node(parent, "gone", "expired or dropped", _short(parent), parent)
            if parent not in call.parents:
                call.parents.append(parent)
        rows = f"{art['rows']:,} rows · " if art.get("rows") is not None else ""
        nodes[art["ref"]] = Node(
            art["ref"], art["kind"], _name_of(art), _short(rows + art["ref"]), art["ref"],
            tool=label, parents=[call_id],
        )  # fmt: skip
    _layout(nodes)
    width = max((n.x for n in nodes.values()), default=0) + NODE_W + 2 * MARGIN
    height = max((n.y for n in nodes.values()), default=0) + NODE_H + 2 * MARGIN
    edges = [
        {"source": p, "target": n.id, "d": _curve(nodes[p], n)}
        for n in nodes.values()
        for p in n.parents
        if p in nodes
    ]
    return {
        "width": width, "height": height, "node_w": NODE_W, "node_h": NODE_H,
        "nodes": list(nodes.values()), "edges": edges,
    }  # fmt: skip


def _layout(nodes: dict[str, Node]) -> None:
    depth: dict[str, int] = {}

    def depth_of(node_id: str, seen: frozenset[str] = frozenset()) -> int:
        if node_id in depth:
            return depth[node_id]
        parents = [p for p in nodes[node_id].parents if p in nodes and p not in seen]
        d = 1 + max((depth_of(p, seen | {node_id}) for p in parents), default=-1)
        depth[node_id] = d
        return d

    rows: dict[int, int] = {}
    for node_id, node in nodes.items():
        column = depth_of(node_id)
        row = rows.get(column, 0)
        rows[column] = row + 1
        node.x = MARGIN + column * (NODE_W + COL_GAP)
        node.y = MARGIN + row * (NODE_H + ROW_GAP)


def _curve(a: Node, b: Node) -> str:
    x1, y1 = a.x + NODE_W, a.y + NODE_H // 2
    x2, y2 = b.x, b.y + NODE_H // 2
    mid = (x1 + x2) // 2
    return f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2 - 6},{y2}"
