"""In-process measurements that explain the MCP numbers: what the server does on every call
besides talking to the kernel. They use dataref's own transcript API, on this machine's disk."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from .fmt import median


def fsync_seconds(directory: Path, reps: int = 20, size: int = 40_000) -> list[float]:
    """Write + fsync a small file (a transcript's size) in ``directory``."""
    samples = []
    path = directory / ".bench-fsync"
    for _ in range(reps):
        started = time.perf_counter()
        with open(path, "wb") as f:
            f.write(b"x" * size)
            f.flush()
            os.fsync(f.fileno())
        samples.append(time.perf_counter() - started)
    path.unlink(missing_ok=True)
    return samples


def transcript_appends(cells: int = 1000) -> list[float]:
    """Seconds to record one trivial run_python call, for notebooks of 1..``cells`` calls."""
    from dataref.transcript import Transcripts, record_run_python

    samples = []
    with tempfile.TemporaryDirectory(prefix="bench-transcript-") as tmp:
        transcripts = Transcripts(Path(tmp))
        try:
            handle = transcripts.default("bench")
            response = {"ok": True, "result": 1, "stdout": "", "error": None, "outputs": {}}
            for _ in range(cells):
                started = time.perf_counter()
                record_run_python(
                    transcripts, "bench", handle, code="result = 1", inputs={},
                    response={**response, "notebook": handle}, elapsed_s=0.01,
                )  # fmt: skip
                samples.append(time.perf_counter() - started)
        finally:
            transcripts.close()
    return samples


def server_side(state_parent: Path) -> dict[str, Any]:
    """Both measurements; a failure (an API that changed) leaves them out, not the run."""
    out: dict[str, Any] = {"fsync": fsync_seconds(state_parent)}
    try:
        appends = transcript_appends()
        out["transcript_append_first10"] = median(appends[:10])
        out["transcript_append_last10"] = median(appends[-10:])
        out["transcript_cells"] = len(appends)
    except Exception as exc:  # diagnostics only: report, do not fail the benchmark
        out["transcript_error"] = f"{type(exc).__name__}: {exc}"
    return out
