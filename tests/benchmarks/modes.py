"""Both sandbox modes through `dataref serve` over stdio: uid mode (this root process's server)
beside userns mode (the same server run as an ordinary account, from a venv it owns).

Measured per mode: the first call of a new notebook (a warm spare is ready) and the warm
per-call time of a trivial ``run_python``. The account and its venv come from
``tests/usermode/run.sh setup`` (what ``make test-user`` uses).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from .data import REPO_ROOT

ACCOUNT = os.environ.get("DATAREF_TEST_USER", "dataref-user")
FIRST_CALLS = 5
WARM_CALLS = 40
SPARE_WAIT_S = 6.0  # after each new notebook: the pool starts the next spare


def _server(mode: str, state: Path) -> StdioTransport:
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "DATAREF_STATE_DIR": str(state),
        "DATAREF_KERNELS__WARM_SPARES": "1",
        "DATAREF_OWNER": "bench",
    }
    if mode == "uid":
        return StdioTransport(str(REPO_ROOT / ".venv" / "bin" / "dataref"), ["serve"], env=env)
    home = pwd.getpwnam(ACCOUNT).pw_dir
    env["HOME"] = home
    command = ["-u", ACCOUNT, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    command.append(f"{home}/dataref/.venv/bin/dataref")
    return StdioTransport("runuser", [*command, "serve"], env={"PATH": "/usr/sbin:/usr/bin"})


async def _call(client: Client, notebook: str) -> tuple[float, str]:
    started = time.perf_counter()
    result = await client.call_tool("run_python", {"code": "result = 1", "notebook": notebook})
    seconds = time.perf_counter() - started
    data = result.structured_content or {}
    if not data.get("ok"):
        raise RuntimeError(f"run_python failed: {data}")
    return seconds, data["notebook"]


async def measure(mode: str, state: Path) -> dict[str, Any]:
    async with Client(_server(mode, state), timeout=300) as client:
        await asyncio.sleep(SPARE_WAIT_S)  # the first spare
        first = []
        handle = ""
        for _ in range(FIRST_CALLS):
            if handle:  # frees its kernel: the memory budget admits a handful at once
                await client.call_tool("reset_kernel", {"notebook": handle})
            seconds, handle = await _call(client, "new")
            first.append(seconds)
            await asyncio.sleep(SPARE_WAIT_S)
        for _ in range(5):
            await _call(client, handle)
        warm = [(await _call(client, handle))[0] for _ in range(WARM_CALLS)]
    return {"first_call": first, "per_call": warm}


def prepare_account() -> None:
    subprocess.run(["bash", str(REPO_ROOT / "tests" / "usermode" / "run.sh"), "setup"], check=True)


async def sandbox_modes(work: Path) -> dict[str, Any]:
    """{'uid': {...}, 'userns': {...}} or {'error': ...} when not run as root."""
    if os.geteuid() != 0:
        return {"error": "run as root: the userns column runs the server as another account"}
    await asyncio.to_thread(prepare_account)
    out: dict[str, Any] = {}
    for mode in ("uid", "userns"):
        state = work / f"modes-{mode}"
        state.mkdir(parents=True)
        if mode == "userns":
            account = pwd.getpwnam(ACCOUNT)
            os.chown(state, account.pw_uid, account.pw_gid)
            os.chmod(work, 0o711)
        out[mode] = await measure(mode, state)
        out[mode]["p50_first"] = statistics.median(out[mode]["first_call"])
        out[mode]["p50_per_call"] = statistics.median(out[mode]["per_call"])
    return out
