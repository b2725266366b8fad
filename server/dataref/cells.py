"""From recorded tool calls to notebook code: variable names, binding lines, cell sources.

Pure functions over the records a transcript keeps in its cells' metadata. Sources are
re-derived from all the records whenever a call is added, because a good variable name depends
on the whole session: the variable that holds a dataRef must never be one the agent's code
reassigns, nor an input name used for another dataRef, or a later cell would bind the wrong
frame. Deriving them again each time keeps every cell consistent with every other.

The rules mirror the kernel (``kernel_profile/startup/00-dataref.py``): an input name still
bound to the same dataRef, and not reassigned since, is kept as is (in-place changes
included); otherwise it gets a fresh shallow copy of the stored frame.
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import keyword
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

# Names the notebook itself uses, plus what the kernel predefines.
RESERVED = frozenset(
    {"dr", "dataref_replay", "outputs", "result", "In", "Out", "get_ipython", "exit", "quit"}
)
_BUILTINS = frozenset(dir(builtins))
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


# -- Python source of values and calls -------------------------------------------------


def py_literal(value: Any) -> str:
    """Python source for a JSON-like value; strings in double quotes, as people write them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid Python literal
    if isinstance(value, float) and value != value:
        return 'float("nan")'
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return f'float("{value}")'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return repr(value)  # int, float, bool, None


def call_source(function: str, arguments: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={py_literal(v)}" for k, v in arguments.items())
    return f"{function}({args})"


# -- what the agent's code does with names ---------------------------------------------


def _parse(code: str) -> tuple[ast.Module | None, bool]:
    """(the code's AST or None, whether IPython syntax had to be translated first)."""
    try:
        return ast.parse(code), False
    except SyntaxError:
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(code)), True
    except Exception:  # unparsable even for IPython: the callers assume the worst
        return None, True


@functools.lru_cache(maxsize=4096)
def assigned_names(code: str) -> frozenset[str]:
    """Every name the code may bind or delete, at any depth (deliberately over-inclusive).

    Cached: every recorded call re-derives all cell sources, so each cell's code is asked
    about again on every later call of the notebook.
    """
    return frozenset(_assigned_names(code))


def _assigned_names(code: str) -> set[str]:
    tree, ipython = _parse(code)
    if tree is None or code.lstrip().startswith("%%"):
        return set(_IDENTIFIER.findall(code))
    names: set[str] = set()
    if ipython:  # magics run code given as text (%time x = 1): count all their names
        for line in code.splitlines():
            if line.lstrip().startswith(("%", "!")):
                names.update(_IDENTIFIER.findall(line))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names


def mentions(code: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", code) is not None


def sets_result_at_top_level(code: str) -> bool:
    """True when a top-level statement assigns ``result``: then it is set whenever the code
    completes, and no ``result = None`` is needed before it."""
    tree, _ = _parse(code)
    if tree is None:
        return False
    for stmt in tree.body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        if any(isinstance(t, ast.Name) and t.id == "result" for t in targets):
            return True
    return False


def reads_outputs(code: str) -> bool:
    """True unless every use of ``outputs`` is ``outputs[...] = ...``: code that reads the dict
    must see it empty, as the kernel clears it before each call."""
    if not mentions(code, "outputs"):
        return False
    tree, _ = _parse(code)
    if tree is None:
        return True
    stored = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del))
    }
    return any(
        isinstance(node, ast.Name) and node.id == "outputs" and id(node) not in stored
        for node in ast.walk(tree)
    )


# -- variable names of dataRefs --------------------------------------------------------


def _producer_base(record: dict[str, Any]) -> str:
    base = str(record.get("tool", "")).removeprefix("fetch_")
    return "data" if base in ("", "sql") or not base.isidentifier() else base


def kernel_lost(record: dict[str, Any]) -> bool:
    """Did the session's kernel lose its variables here (reset, restart, crash)?"""
    return record.get("tool") in ("reset_kernel", "restart") or bool(record.get("kernel_lost"))


def plan_variables(records: Iterable[dict[str, Any]]) -> dict[str, str]:
    """{dataRef: variable} for every dataRef the notebook creates.

    A dataRef bound under one input name only gets that name (then no binding lines are
    needed). Otherwise (several names, or bound again after the kernel lost its variables,
    when the kernel gives a fresh frame) it gets a name no input uses: that variable stays
    pristine, and each binding is a shallow copy of it, as in the kernel.
    """
    created: list[tuple[str, str, str]] = []  # (ref, base name, suffix), in creation order
    bound_as: dict[str, set[str]] = defaultdict(set)  # ref -> input names
    refs_of_name: dict[str, set[str]] = defaultdict(set)  # input name -> refs
    assigned: set[str] = set()
    epochs: dict[str, set[int]] = defaultdict(set)  # ref -> kernel lifetimes it was bound in
    epoch = 0
    for rec in records:
        if rec.get("tool") == "run_python":
            for name, ref in rec.get("inputs", {}).items():
                bound_as[ref].add(name)
                refs_of_name[name].add(ref)
                epochs[ref].add(epoch)
            assigned |= assigned_names(rec.get("code", ""))
            # A call not run again on replay (timeout, crash): its outputs count as made
            # elsewhere.
            if rec.get("status") not in ("timeout", "died"):
                outputs = rec.get("outputs", {}).items()
                created.extend((ref, name, "output") for name, ref in outputs)
        elif rec.get("ref"):
            created.append((rec["ref"], _producer_base(rec), "data"))
        epoch += kernel_lost(rec)
    # Bound in two kernel lifetimes: the second kernel got a fresh frame, whatever the first
    # did to its own, so the variable must stay pristine.
    pristine = {ref for ref, seen in epochs.items() if len(seen) > 1}
    taken = set(RESERVED | _BUILTINS)
    names: dict[str, str] = {}
    for ref, base, suffix in created:
        inputs = bound_as.get(ref, set())
        own = next(iter(inputs)) if len(inputs) == 1 and ref not in pristine else None
        if own is not None and refs_of_name[own] != {ref}:
            own = None  # the name also holds other dataRefs at other times

        def usable(name: str, own: str | None = own) -> bool:
            if not name.isidentifier() or keyword.iskeyword(name) or name in taken:
                return False
            return name not in assigned and (name not in refs_of_name or name == own)

        # e.g. sales, then sales_data (when the agent reassigns `sales`), then sales_2...
        candidates = [base, f"{base}_{suffix}", *(f"{base}_{i}" for i in range(2, 999))]
        names[ref] = next(c for c in [*([own] if own else []), *candidates] if usable(c))
        taken.add(names[ref])
    return names


# -- sources ---------------------------------------------------------------------------


class SourceWriter:
    """Writes the sources of a notebook's cells in order, tracking what each name holds."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.names = plan_variables(records)
        # The module's name in the notebook: `dr`, unless the agent's code uses that name.
        codes = (r.get("code", "") for r in records if r.get("tool") == "run_python")
        self.dr = "dataref_replay" if any("dr" in assigned_names(c) for c in codes) else "dr"
        # input name -> dataRef it holds, untouched since it was bound (the kernel's rule)
        self.current: dict[str, str] = {}

    def setup(self) -> str:
        return f"import dataref.replay as {self.dr}\n\noutputs = {{}}"

    def producer(self, rec: dict[str, Any]) -> str:
        var = self.names[rec["ref"]]
        self.current[var] = rec["ref"]
        arguments = _in_signature_order(rec["tool"], rec.get("arguments", {}))
        return f"{var} = {self.dr}.{call_source(rec['tool'], arguments)}\n{var}.shape"

    def run_python(self, rec: dict[str, Any]) -> tuple[str, str | None]:
        """(the cell's source, the source binding its outputs when the call failed)."""
        code = rec.get("code", "").rstrip()
        lines = self._bindings(rec.get("inputs", {}))
        if mentions(code, "result") and not sets_result_at_top_level(code):
            lines.append("result = None")
        if reads_outputs(code):
            lines.append("outputs = {}")
        for name in assigned_names(code):
            self.current.pop(name, None)
        tail = self._output_bindings(rec.get("outputs", {}))
        if rec.get("status", "ok") != "ok":
            note = f"# In the session this call raised {rec.get('error_name') or 'an error'}."
            source = "\n".join([note, *lines, code])
            return source, ("\n".join(tail) if tail else None)
        if mentions(code, "result"):
            tail.append(f"{self.dr}.show(result)")
        return "\n".join([*lines, code, *tail]), None

    def not_run(self, rec: dict[str, Any]) -> None:
        """A call kept as markdown (timed out or killed its kernel): only what it changed."""
        for name in assigned_names(rec.get("code", "")):
            self.current.pop(name, None)
        if kernel_lost(rec):
            self.current.clear()

    def reset(self) -> None:
        self.current.clear()

    def chart(self, rec: dict[str, Any]) -> str:
        frame = self._frame(rec["dataRef"])
        arguments = {k: rec[k] for k in ("x", "y", "kind", "title") if rec.get(k) is not None}
        args = ", ".join([frame, *(f"{k}={py_literal(v)}" for k, v in arguments.items())])
        return f"{self.dr}.chart({args})"

    def _frame(self, ref: str) -> str:
        var = self.names.get(ref)
        return var if var is not None else f"{self.dr}.artifact({py_literal(ref)})"

    def _bindings(self, inputs: dict[str, str]) -> list[str]:
        lines = []
        for name, ref in inputs.items():
            if self.current.get(name) == ref:
                continue  # still the frame bound earlier: the kernel keeps it too
            var = self.names.get(ref)
            if var is None:
                lines.append(f"{name} = {self._frame(ref)}  # made outside this notebook")
            elif var != name:
                lines.append(f"{name} = {var}.copy(deep=False)")
            self.current[name] = ref
        return lines

    def _output_bindings(self, outputs: dict[str, str]) -> list[str]:
        tail = []
        for name, ref in outputs.items():
            var = self.names[ref]
            tail.append(f"{var} = {self.dr}.output(outputs, {py_literal(name)})")
            self.current[var] = ref
        return tail


def _in_signature_order(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments in the producer's own order (the stored JSON sorts keys)."""
    from .producers import registry

    if tool not in registry:
        return arguments
    order = [p.name for p in registry.get(tool).parameters]
    rank = {name: i for i, name in enumerate(order)}
    return {k: arguments[k] for k in sorted(arguments, key=lambda k: rank.get(k, len(order)))}


def not_run_markdown(rec: dict[str, Any]) -> str:
    """A call that must not run again (it timed out or killed its kernel), shown as text."""
    why = {
        "timeout": "timed out in the session (the kernel was interrupted)",
        "died": "killed its kernel in the session (its variables were lost)",
    }.get(rec.get("status", ""), "failed in the session")
    fence = "````" if "```" in rec.get("code", "") else "```"
    inputs = ", ".join(f"`{k}`" for k in rec.get("inputs", {}))
    given = f" Inputs: {inputs}." if inputs else ""
    return (
        f"**Not re-run:** this `run_python` call {why}.{given}\n\n"
        f"{fence}python\n{rec.get('code', '').rstrip()}\n{fence}"
    )
