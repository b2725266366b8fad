"""How the server drives a cell (see 00-dataref.py): the header line, binding before the code
runs, collecting after it, and the manifest's way back (the execute reply, or a display_data).

Loaded by 00-dataref.py by path (like convert.py).
"""

import ast
import json

from IPython.core.error import InputRejected
from IPython.display import publish_display_data

MIME = "application/vnd.dataref.collect+json"
HEADER_PREFIX = "# dataref:"


class DatarefInputError(InputRejected):
    """An input could not be bound; the cell does not run."""


class Manifest:
    """What ``__dataref_manifest__()`` returns: the execute reply's user expression carries it
    (as ``MIME``), so a successful cell needs no extra message."""

    def __init__(self, manifest):
        self.manifest = manifest

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {MIME: self.manifest}

    def __repr__(self):
        return "<dataref manifest>"


def parse_header(raw):
    first = raw.split("\n", 1)[0]
    if not first.startswith(HEADER_PREFIX):
        return None
    try:
        header = json.loads(first[len(HEADER_PREFIX) :])
    except ValueError:
        return None
    return header if isinstance(header, dict) else None


def strip_header(lines):
    """An input transformer: the header never reaches the compiler (line numbers stay)."""
    if lines and lines[0].startswith(HEADER_PREFIX):
        return lines[1:]
    return lines


def format_user_obj(format_any):
    """The reply's manifest as its bundle directly: the display formatter would run its ten
    formatters on it first (about half a millisecond of every call)."""

    def format_user_obj(obj):
        if type(obj) is Manifest:
            return {"status": "ok", "data": {MIME: obj.manifest}, "metadata": {}}
        return format_any(obj)

    return format_user_obj


class Cells:
    """The state of the cell being run, between IPython's pre- and post-run events."""

    def __init__(self, inputs, collector):
        self.inputs = inputs  # lib/inputs.py
        self.collector = collector  # lib/collect.py
        self.cell = None
        self.bind_error = None
        self.max_result_bytes = None
        self.reply_manifest = False
        self.manifest = None

    def pre_run_cell(self, info):
        header = parse_header(info.raw_cell or "")
        self.cell, self.bind_error = None, None
        if header is None:
            return
        self.cell = header.get("cell")
        self.max_result_bytes = header.get("max_result_bytes")
        self.reply_manifest = header.get("reply") is True
        self.manifest = None
        self.collector.begin()
        for name, ref in (header.get("bind") or {}).items():
            try:
                self.inputs.bind(name, ref)
            except Exception as exc:
                self.bind_error = f"input {name!r} could not be loaded: {exc}"
                return
        self.inputs.release()

    def post_run_cell(self, result):
        cell, self.cell = self.cell, None
        if cell is None:
            return
        self.inputs.release()  # views the code just dropped free their input now
        manifest = self.collector.manifest(cell, self.max_result_bytes)
        if result.success and self.reply_manifest:
            self.manifest = manifest  # the reply's user expression takes it
        else:  # a failed cell's reply carries no user expressions: publish it
            publish_display_data({MIME: manifest})

    def take_manifest(self):
        manifest, self.manifest = self.manifest, None
        return Manifest(manifest)

    def collect(self, cell_id, max_result_bytes=None):
        """Collect this cell and publish the manifest as a display_data message."""
        publish_display_data({MIME: self.collector.manifest(cell_id, max_result_bytes)})


class RejectOnBindError(ast.NodeTransformer):
    """Stops the cell before it runs when an input could not be bound."""

    def __init__(self, cells):
        self.cells = cells

    def visit(self, node):
        if self.cells.bind_error:
            raise DatarefInputError(self.cells.bind_error)
        return node


def install(shell, inputs, collector):
    """Hook the protocol into IPython and give the agent's namespace its four entry points."""
    cells = Cells(inputs, collector)
    shell.input_transformers_cleanup.insert(0, strip_header)
    shell.ast_transformers.append(RejectOnBindError(cells))
    shell.events.register("pre_run_cell", cells.pre_run_cell)
    shell.events.register("post_run_cell", cells.post_run_cell)
    ns = shell.user_ns
    ns["__dataref_begin__"] = collector.begin
    ns["__dataref_bind__"] = inputs.bind
    ns["__dataref_collect__"] = cells.collect
    ns["__dataref_manifest__"] = cells.take_manifest
    if hasattr(shell, "_format_user_obj"):  # IPython's formatter of user expressions
        shell._format_user_obj = format_user_obj(shell._format_user_obj)
