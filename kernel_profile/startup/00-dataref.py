"""dataref kernel runtime: runs once at IPython startup, inside the sandbox.

What the agent's code sees: ``outputs`` (a dict; DataFrames put there become artifacts),
``result`` (set it to a small JSON-like value), and its inputs bound as DataFrames.

The server drives a cell in one of two ways:
* a first line ``# dataref:{"cell": "<id>", "bind": {"name": "<ref>"}}``: the line is stripped
  before the code compiles (tracebacks keep the agent's line numbers), the inputs are bound
  before the code runs and everything is collected after it, even when it fails;
* or explicit calls: ``__dataref_begin__()``, ``__dataref_bind__(name, ref)``, the code,
  then ``__dataref_collect__(cell_id)``.
Collecting makes a manifest (mime type ``MIME`` of lib/protocol.py). With ``"reply": true`` in
the header, a cell that succeeds hands it to the user expression ``__dataref_manifest__()`` of
its execute request, so it comes back in the execute reply; otherwise (a failed cell's reply
carries no user expressions, or an explicit ``__dataref_collect__``) it is published as a
display_data.
Everything here runs as the kernel's uid: the server treats the manifest and the files as
untrusted input.
"""

import matplotlib

matplotlib.use("Agg")  # no display; before lib/collect.py loads pyplot (figures become PNGs)

outputs = {}


def _dataref_load(startup_dir, name):
    """lib/<name>.py next to this file, by path (convert.py is shared with dataref.replay):
    never importable (or replaceable) through sys.path."""
    import importlib.util
    import os

    path = os.path.join(startup_dir, "lib", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_dataref_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dataref_install(load):  # in a function: no helpers are left in the agent's namespace
    """Each part is a module of lib/, loaded by path: inputs (binding stored tables),
    collect (outputs, figures, result: the manifest), protocol (the header and the manifest's
    way back), memory (the kept heap) and transfer (tables over the kernel's channel)."""
    import os

    import pyarrow
    from IPython import get_ipython

    shell = get_ipython()
    startup = shell.profile_dir.startup_dir
    out_root = os.environ.get("DATAREF_OUTPUT_DIR", "/sandbox/.dataref/out")
    inputs = load(startup, "inputs").Inputs(
        shell.user_ns,
        os.environ.get("DATAREF_INPUTS_DIR", "/sandbox/inputs"),
        load(startup, "frames"),
    )
    collector = load(startup, "collect").Collector(
        shell.user_ns, out_root, load(startup, "convert")
    )
    load(startup, "memory").install(shell, pyarrow)
    load(startup, "transfer").install(shell, inputs.staged, out_root)
    load(startup, "protocol").install(shell, inputs, collector)


_dataref_install(_dataref_load)
# The kernel starts with python -P (its cwd is not on sys.path, so nothing planted in /sandbox
# runs at startup); the agent's own modules in /sandbox stay importable, after the packages.
__import__("sys").path.append("")
del _dataref_install, _dataref_load, matplotlib
