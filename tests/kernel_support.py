"""Helpers shared by the kernel test modules (sandbox, kernels, profile)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dataref.config import KernelSettings, Settings
from dataref.kernels import COLLECT_MIME, ExecutionResult, KernelPool, NotebookKernel
from dataref.kernels.budget import kernel_footprint


def require_bwrap(mode: str = "auto") -> None:
    """The sandbox tests must FAIL, not skip, where their mode cannot start: as root they
    test uid mode, as an ordinary user userns mode (tests/usermode/run.sh)."""
    from dataref.kernels.check import missing_for

    if shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin") is None:
        pytest.fail("bubblewrap is not installed: apt-get install bubblewrap (these tests need it)")
    if mode == "auto":
        mode = "uid" if os.geteuid() == 0 else "userns"
    missing = missing_for(mode)
    if missing:
        pytest.fail(f"the {mode} sandbox cannot start here: " + "; ".join(missing))


def kernel_settings(state_dir: Path, **kernels: Any) -> Settings:
    """Test settings. The memory budget is sized for the caps under test (max_total plus the
    spares), so tests of the caps see the caps on any machine; the budget has its own tests."""
    compute = kernels.pop("compute", {})
    kernels = {"warm_spares": 0, "max_per_owner": 8, "max_total": 16, **kernels}
    if "memory_budget_bytes" not in kernels:
        each = KernelSettings(**kernels)
        kernels["memory_budget_bytes"] = kernel_footprint(each) * (
            each.max_total + each.warm_spares + 1
        )
    return Settings(
        state_dir=state_dir,
        kernels=kernels,
        compute={"interrupt_grace_seconds": 2, **compute},
    )


async def started_pool(config: Settings) -> KernelPool:
    pool = KernelPool(config)
    await pool.start()
    return pool


async def run(kernel: NotebookKernel, code: str, timeout: float = 30) -> ExecutionResult:
    return await kernel.execute(code, timeout_s=timeout)


async def ok(kernel: NotebookKernel, code: str, timeout: float = 30) -> str:
    """Run code that must succeed; returns its stdout."""
    result = await run(kernel, code, timeout)
    assert result.status == "ok", (result.status, result.error, result.stderr)
    return result.stdout


async def probe(kernel: NotebookKernel, code: str) -> Any:
    """Run code that assigns ``out``; returns ``out`` (printed as JSON)."""
    stdout = await ok(kernel, code + "\nimport json as _j\nprint(_j.dumps(out, default=str))")
    return json.loads(stdout.strip().splitlines()[-1])


def manifest(result: ExecutionResult) -> dict[str, Any]:
    found = [d[COLLECT_MIME] for d in result.displays if COLLECT_MIME in d]
    assert len(found) == 1, result
    return found[0]


def stage(kernel: NotebookKernel, ref: str, table: pa.Table) -> None:
    """What the store does: an Arrow IPC file, world-readable, in the kernel's inputs dir."""
    path = kernel.inputs_dir / f"{ref}.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.chmod(path, 0o644)


def header(cell: str, bind: dict[str, str] | None = None) -> str:
    return "# dataref:" + json.dumps({"cell": cell, "bind": bind or {}})


def kernel_processes(under: Path) -> list[int]:
    """Host pids of the kernels whose directories lie under ``under`` (a kernel's box root,
    or a pool's kernels dir): their command lines name their run dirs, in both modes."""
    found = []
    needle = str(under).encode() + b"/"
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"{entry.path}/cmdline", "rb") as cmdline:
                if needle in cmdline.read():
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
