"""What a cell leaves, collected after it runs (even when it fails): the DataFrames in
``outputs`` as Arrow files, open figures as PNGs, ``result`` as JSON, and the manifest that
lists them. Runs as the kernel's uid: the server checks every file and number itself.

Loaded by 00-dataref.py by path (like convert.py).
"""

import json
import os
import re

import matplotlib.pyplot as plt
import pandas as pd
import pyarrow as pa
import pyarrow.ipc

TOKEN = re.compile(r"[A-Za-z0-9_\-]{1,64}\Z")
OUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
HARD_RESULT_CAP = 1 << 20  # the server caps lower; this only bounds the iopub message
MAX_FIGURES = 20


class Collector:
    def __init__(self, ns, out_root, convert):
        self.ns = ns
        self.out_root = out_root
        self.convert = convert  # lib/convert.py

    def begin(self):
        """Forget the previous cell's result, outputs and figures."""
        self.ns.pop("result", None)
        self.ns["outputs"] = {}
        plt.close("all")

    def manifest(self, cell_id, max_result_bytes=None):
        """Write outputs and figures of this cell and convert ``result``: the manifest."""
        if not isinstance(cell_id, str) or not TOKEN.match(cell_id):
            raise ValueError(f"bad cell id {cell_id!r}")
        cap = min(int(max_result_bytes or HARD_RESULT_CAP), HARD_RESULT_CAP)
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
        outs = self.ns.get("outputs")
        if not isinstance(outs, dict) or outs or plt.get_fignums():
            # the cell's directory only when there is something to write in it
            cell_dir = os.path.join(self.out_root, cell_id)
            try:
                os.makedirs(cell_dir, exist_ok=True)
            except OSError as exc:
                manifest["errors"].append(f"outputs: cannot write {cell_dir} ({exc.strerror})")
                cell_dir = None
            if cell_dir is not None:
                self.outputs(cell_dir, manifest)
                figures(cell_dir, manifest)
        self.result(manifest, cap)
        return manifest

    def outputs(self, cell_dir, manifest):
        outs = self.ns.get("outputs")
        if not isinstance(outs, dict):
            manifest["errors"].append("outputs: `outputs` must stay a dict - nothing stored")
            return
        for name, value in list(outs.items()):
            if not isinstance(name, str) or not OUT_NAME.match(name):
                manifest["errors"].append(
                    f"outputs[{name!r}]: names must be identifiers of <= 64 characters"
                )
                continue
            try:
                manifest["output_info"][name] = self.write_output(cell_dir, name, value)
                manifest["outputs"].append(name)
            except Exception as exc:  # one bad output must not lose the others
                manifest["errors"].append(f"outputs[{name!r}]: {exc}")

    def write_output(self, cell_dir, name, value):
        if isinstance(value, pd.Series):
            value = value.to_frame(name=value.name if value.name is not None else name)
        if not isinstance(value, pd.DataFrame):
            raise TypeError(
                f"is a {type(value).__name__}; only DataFrames (or Series) can be outputs"
                " - wrap it, e.g. pd.DataFrame(...), or return small values in `result`"
            )
        try:
            table = pa.Table.from_pandas(self.convert.normalise(value), preserve_index=False)
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

    def result(self, manifest, max_bytes):
        if "result" not in self.ns:
            return
        manifest["has_result"] = True
        try:
            text = json.dumps(
                self.convert.to_json(self.ns["result"], "result"),
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


def figures(cell_dir, manifest):
    """Save the open figures as PNGs (at most 1600 px a side) and close them all."""
    for n, num in enumerate(plt.get_fignums(), 1):
        fig = plt.figure(num)
        if n > MAX_FIGURES:
            manifest["errors"].append(f"figures: only the first {MAX_FIGURES} are kept")
            break
        try:
            width, height = fig.get_size_inches()
            dpi = min(100.0, 1600.0 / max(width, height, 0.1))
            name = f"figure_{n}.png"
            fig.savefig(os.path.join(cell_dir, name), dpi=dpi, format="png")
            manifest["figures"].append(name)
        except Exception as exc:
            manifest["errors"].append(f"figure {n}: {str(exc)[:200]}")
    plt.close("all")
