"""The seed baseline's per-call runner: a fresh Python process for every run_python call.

``python seed_runner.py WORKDIR``: reads ``WORKDIR/in/<name>.parquet`` as DataFrames, runs
``WORKDIR/code.py`` with them, writes ``WORKDIR/out/<name>.parquet`` for each DataFrame in
``outputs`` and ``WORKDIR/result.json`` with ``result``, ``stdout`` and ``error``.
"""

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path

import pandas as pd

STDOUT_MAX = 2000


def main(work: Path) -> None:
    namespace = {"pd": pd, "outputs": {}}
    for path in sorted((work / "in").glob("*.parquet")):
        namespace[path.stem] = pd.read_parquet(path)
    code = (work / "code.py").read_text()
    buffer, error = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, "<agent code>", "exec"), namespace)
    except Exception:
        error = traceback.format_exc(limit=-2)
    out = work / "out"
    out.mkdir()
    for name, frame in namespace["outputs"].items():
        frame.to_parquet(out / f"{name}.parquet")
    report = {"result": namespace.get("result"), "stdout": buffer.getvalue()[-STDOUT_MAX:]}
    report["error"] = error
    (work / "result.json").write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
