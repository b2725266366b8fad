"""dataref kernel runtime: runs once at IPython startup, inside the sandbox.

What the agent's code sees: ``outputs`` (a dict; DataFrames put there become artifacts),
``result`` (set it to a small JSON-like value), and its inputs bound as DataFrames.

The server drives a cell in one of two ways:
* a first line ``# dataref:{"cell": "<id>", "bind": {"name": "<ref>"}}``: the line is stripped
  before the code compiles (tracebacks keep the agent's line numbers), the inputs are bound
  before the code runs and everything is collected after it, even when it fails;
* or explicit calls: ``__dataref_begin__()``, ``__dataref_bind__(name, ref)``, the code,
  then ``__dataref_collect__(cell_id)``.
Collecting makes a manifest (mime type ``COLLECT_MIME``). With ``"reply": true`` in the header,
a cell that succeeds hands it to the user expression ``__dataref_manifest__()`` of its execute
request, so it comes back in the execute reply; otherwise (a failed cell's reply carries no
user expressions, or an explicit ``__dataref_collect__``) it is published as a display_data.
Everything here runs as the kernel's uid: the server treats the manifest and the files as
untrusted input.
"""

import matplotlib

matplotlib.use("Agg")  # no display; figures are saved as PNGs by the collector

import matplotlib.pyplot  # loaded now, so a warm kernel pays nothing later
import numpy
import pandas
import pyarrow
import pyarrow.ipc

outputs = {}


def _dataref_load_convert(startup_dir, name="convert"):
    """lib/<name>.py next to this file, by path: shared with dataref.replay, and never
    importable (or replaceable) through sys.path."""
    import importlib.util
    import os

    path = os.path.join(startup_dir, "lib", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_dataref_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dataref_install(pd, pa, plt, load_convert):  # a closure: no helpers in the agent's namespace
    import ast
    import json
    import os
    import re
    import weakref

    from IPython import get_ipython
    from IPython.core.error import InputRejected
    from IPython.display import publish_display_data

    shell = get_ipython()
    ns = shell.user_ns
    convert = load_convert(shell.profile_dir.startup_dir)
    frames = load_convert(shell.profile_dir.startup_dir, "frames")
    inputs_dir = os.environ.get("DATAREF_INPUTS_DIR", "/sandbox/inputs")
    out_root = os.environ.get("DATAREF_OUTPUT_DIR", "/sandbox/.dataref/out")
    mime = "application/vnd.dataref.collect+json"
    header_prefix = "# dataref:"
    token = re.compile(r"[A-Za-z0-9_\-]{1,64}\Z")
    out_name = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
    hard_result_cap = 1 << 20  # the server caps lower; this only bounds the iopub message
    max_figures = 20
    bound = {}  # name -> (ref, pristine frame, weakref to the frame the agent got)
    staged = {}  # ref -> pyarrow.Buffer: tables sent over the kernel's channel (lib/transfer.py)
    pinned = {}  # ref -> its pristine frame, while any frame made from it lives (see load)
    state = {"cell": None, "bind_error": None, "manifest": None, "reply_manifest": False}

    class DatarefInputError(InputRejected):
        """An input could not be bound; the cell does not run."""

    # -- inputs ---------------------------------------------------------------------------

    def load(source):
        """The input as a DataFrame without copying it: memory-mapped (or the buffer a gateway
        kernel received), one block per column (``split_blocks``), so numeric columns without
        nulls of a one-batch file (the store writes a frame as one batch) stay read-only views
        of the mapping and strings stay Arrow-backed; a float column with nulls is a view too
        when NaN already sits under its nulls (lib/frames.py), any other column with nulls is
        copied (NaN fills them), and a file of several batches (a streamed SQL result) has each
        numeric column joined once into one array. Same dtypes and values as a plain
        ``to_pandas()``, but binding 5M rows of the benchmark's table adds a quarter of its
        Arrow size to the kernel, not twice it. The agent only ever gets shallow copies of this
        pristine frame, and it stays alive (``pinned``) as long as any frame sharing its data
        does, so pandas' copy-on-write always sees a reference and copies a column before the
        agent's code writes to it: writes never hit the read-only mapping, even in a frame kept
        after its name was bound to something else."""
        if isinstance(source, pa.Buffer):
            source = pa.BufferReader(source)
        table = frames.nulls_as_nan(pa.ipc.open_file(source).read_all())
        return table.to_pandas(split_blocks=True)

    def bind(name, ref):
        """Bind input ``ref`` as DataFrame ``name``; a name already bound to ref is kept."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"input name {name!r} must be a Python identifier")
        if not isinstance(ref, str) or not token.match(ref):
            raise ValueError(f"bad dataRef {ref!r}")
        known = bound.get(name)
        if known is not None and known[0] == ref and ns.get(name) is known[2]():
            return
        path = os.path.join(inputs_dir, ref + ".arrow")
        source = staged.get(ref)
        if source is None and not os.path.isfile(path):
            raise FileNotFoundError(f"input {name!r} ({ref}) is not staged in this kernel")
        pristine = pinned.get(ref)
        if pristine is None:
            pristine = pinned[ref] = load(pa.memory_map(path) if source is None else source)
        frame = pristine.copy(deep=False)
        bound[name] = (ref, pristine, weakref.ref(frame))
        ns[name] = frame

    def release():
        """Unpin the inputs no name is bound to and no frame of the agent shares data with
        (their mappings then close): a kernel's memory and address space follow what the
        agent's code still uses, not every input it ever bound."""
        current = {entry[0] for entry in bound.values()}
        for ref in [r for r in pinned if r not in current]:
            try:
                shared = any(b.refs.has_reference() for b in pinned[ref]._mgr.blocks)
            except AttributeError:  # another pandas: keep it pinned, never risk a write
                continue
            if not shared:
                del pinned[ref]

    def begin():
        """Forget the previous cell's result, outputs and figures."""
        ns.pop("result", None)
        ns["outputs"] = {}
        plt.close("all")

    # -- outputs --------------------------------------------------------------------------

    def write_output(cell_dir, name, value):
        if isinstance(value, pd.Series):
            value = value.to_frame(name=value.name if value.name is not None else name)
        if not isinstance(value, pd.DataFrame):
            raise TypeError(
                f"is a {type(value).__name__}; only DataFrames (or Series) can be outputs"
                " - wrap it, e.g. pd.DataFrame(...), or return small values in `result`"
            )
        try:
            table = pa.Table.from_pandas(convert.normalise(value), preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise TypeError(
                f"cannot be stored as a table ({str(exc)[:200]}) - convert mixed or"
                " object columns first, e.g. .astype(str)"
            ) from None
        path = os.path.join(cell_dir, name + ".arrow")
        with pa.OSFile(path + ".tmp", "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        os.replace(path + ".tmp", path)
        return {
            "file": name + ".arrow",
            "rows": table.num_rows,
            "columns": table.num_columns,
            "bytes": os.path.getsize(path),
        }

    def collect_outputs(cell_dir, manifest):
        outs = ns.get("outputs")
        if not isinstance(outs, dict):
            manifest["errors"].append("outputs: `outputs` must stay a dict - nothing stored")
            return
        for name, value in list(outs.items()):
            if not isinstance(name, str) or not out_name.match(name):
                manifest["errors"].append(
                    f"outputs[{name!r}]: names must be identifiers of <= 64 characters"
                )
                continue
            try:
                manifest["output_info"][name] = write_output(cell_dir, name, value)
                manifest["outputs"].append(name)
            except Exception as exc:  # one bad output must not lose the others
                manifest["errors"].append(f"outputs[{name!r}]: {exc}")

    def collect_figures(cell_dir, manifest):
        for n, num in enumerate(plt.get_fignums(), 1):
            fig = plt.figure(num)
            if n > max_figures:
                manifest["errors"].append(f"figures: only the first {max_figures} are kept")
                break
            try:
                width, height = fig.get_size_inches()
                dpi = min(100.0, 1600.0 / max(width, height, 0.1))  # at most 1600 px a side
                name = f"figure_{n}.png"
                fig.savefig(os.path.join(cell_dir, name), dpi=dpi, format="png")
                manifest["figures"].append(name)
            except Exception as exc:
                manifest["errors"].append(f"figure {n}: {str(exc)[:200]}")
        plt.close("all")

    # -- result ---------------------------------------------------------------------------

    def collect_result(manifest, max_bytes):
        if "result" not in ns:
            return
        manifest["has_result"] = True
        try:
            text = json.dumps(
                convert.to_json(ns["result"], "result"),
                ensure_ascii=False,
                separators=(",", ":"),
                allow_nan=False,
            )
        except (TypeError, ValueError) as exc:
            manifest["result_error"] = str(exc)
            return
        size = len(text.encode())
        manifest["result_bytes"] = size
        if size > max_bytes:
            manifest["result_error"] = (
                f"result is {size} bytes of JSON, over the {max_bytes} byte cap - return less"
                " (e.g. .head(10), rounding) or put the table in outputs['name']"
            )
        else:
            manifest["result"] = text

    def build_manifest(cell_id, max_result_bytes=None):
        """Write outputs and figures of this cell and convert ``result``: the manifest."""
        if not isinstance(cell_id, str) or not token.match(cell_id):
            raise ValueError(f"bad cell id {cell_id!r}")
        cap = min(int(max_result_bytes or hard_result_cap), hard_result_cap)
        manifest = {
            "cell": cell_id,
            "has_result": False,
            "result": None,
            "result_bytes": 0,
            "result_error": None,
            "outputs": [],
            "output_info": {},
            "figures": [],
            "errors": [],
        }
        outs = ns.get("outputs")
        if not isinstance(outs, dict) or outs or plt.get_fignums():
            # the cell's directory only when there is something to write in it
            cell_dir = os.path.join(out_root, cell_id)
            try:
                os.makedirs(cell_dir, exist_ok=True)
            except OSError as exc:
                manifest["errors"].append(f"outputs: cannot write {cell_dir} ({exc.strerror})")
                cell_dir = None
            if cell_dir is not None:
                collect_outputs(cell_dir, manifest)
                collect_figures(cell_dir, manifest)
        collect_result(manifest, cap)
        return manifest

    def collect(cell_id, max_result_bytes=None):
        """Collect this cell and publish the manifest as a display_data message."""
        publish_display_data({mime: build_manifest(cell_id, max_result_bytes)})

    class Manifest:
        """What ``__dataref_manifest__()`` returns: the execute reply's user expression
        carries it (as ``mime``), so a successful cell needs no extra message."""

        def __init__(self, manifest):
            self.manifest = manifest

        def _repr_mimebundle_(self, include=None, exclude=None):
            return {mime: self.manifest}

        def __repr__(self):
            return "<dataref manifest>"

    def take_manifest():
        manifest, state["manifest"] = state.get("manifest"), None
        return Manifest(manifest)

    def format_user_obj(format_any):
        """The reply's manifest as its bundle directly: the display formatter would run its
        ten formatters on it first (about half a millisecond of every call)."""

        def format_user_obj(obj):
            if type(obj) is Manifest:
                return {"status": "ok", "data": {mime: obj.manifest}, "metadata": {}}
            return format_any(obj)

        return format_user_obj

    # -- the header protocol --------------------------------------------------------------

    def parse_header(raw):
        first = raw.split("\n", 1)[0]
        if not first.startswith(header_prefix):
            return None
        try:
            header = json.loads(first[len(header_prefix) :])
        except ValueError:
            return None
        return header if isinstance(header, dict) else None

    def strip_header(lines):
        if lines and lines[0].startswith(header_prefix):
            return lines[1:]
        return lines

    def pre_run_cell(info):
        header = parse_header(info.raw_cell or "")
        state["cell"], state["bind_error"] = None, None
        if header is None:
            return
        state["cell"] = header.get("cell")
        state["max_result_bytes"] = header.get("max_result_bytes")
        state["reply_manifest"] = header.get("reply") is True
        state["manifest"] = None
        begin()
        for name, ref in (header.get("bind") or {}).items():
            try:
                bind(name, ref)
            except Exception as exc:
                state["bind_error"] = f"input {name!r} could not be loaded: {exc}"
                return
        release()

    def post_run_cell(result):
        cell, state["cell"] = state["cell"], None
        if cell is None:
            return
        release()  # views the code just dropped free their input now, not a cell later
        manifest = build_manifest(cell, state.get("max_result_bytes"))
        if result.success and state.get("reply_manifest"):
            state["manifest"] = manifest  # the reply's user expression takes it
        else:  # a failed cell's reply carries no user expressions: publish it
            publish_display_data({mime: manifest})

    class RejectOnBindError(ast.NodeTransformer):
        def visit(self, node):
            if state["bind_error"]:
                raise DatarefInputError(state["bind_error"])
            return node

    load_convert(shell.profile_dir.startup_dir, "memory").install(shell, pa)
    transfer = load_convert(shell.profile_dir.startup_dir, "transfer")
    transfer.install(shell, staged, out_root, __import__("numpy"), pa)
    shell.input_transformers_cleanup.insert(0, strip_header)
    shell.ast_transformers.append(RejectOnBindError())
    shell.events.register("pre_run_cell", pre_run_cell)
    shell.events.register("post_run_cell", post_run_cell)
    ns["__dataref_begin__"] = begin
    ns["__dataref_bind__"] = bind
    ns["__dataref_collect__"] = collect
    ns["__dataref_manifest__"] = take_manifest
    if hasattr(shell, "_format_user_obj"):  # IPython's formatter of user expressions
        shell._format_user_obj = format_user_obj(shell._format_user_obj)


_dataref_install(pandas, pyarrow, matplotlib.pyplot, _dataref_load_convert)
# The kernel starts with python -P (its cwd is not on sys.path, so nothing planted in /sandbox
# runs at startup); the agent's own modules in /sandbox stay importable, after the packages.
__import__("sys").path.append("")
del _dataref_install, _dataref_load_convert, matplotlib, numpy, pandas, pyarrow
