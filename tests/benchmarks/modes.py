"""Both sandbox modes through `dataref serve` over stdio: uid mode (the server run by root)
beside userns mode (the same server run as an ordinary account). Both run the account's copy
of the checkout and its venv, so the interpreter and the code are the same.

Measured per mode: the first call of a new notebook (a warm spare is ready) and the warm
per-call time of a trivial ``run_python``. Each first call waits until both servers are quiet
(their spares started and idle): a first call takes a spare, and the replacement's start (a
second or so of a core) must not land on the other mode's first call. The account and its
venv come from ``tests/usermode/run.sh setup`` (what ``make test-user`` uses).
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
from .memory import children_matching, cmdline, wait_workers_idle

ACCOUNT = os.environ.get("DATAREF_TEST_USER", "dataref-user")
FIRST_CALLS = 8
WARM_CALLS = 40
SPARE_WAIT_S = 30.0  # at most, for a server's spare to be started and idle


def _server(mode: str, state: Path) -> StdioTransport:
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "DATAREF_STATE_DIR": str(state),
        "DATAREF_KERNELS__WARM_SPARES": "1",
        "DATAREF_OWNER": "bench",
    }
    home = pwd.getpwnam(ACCOUNT).pw_dir
    dataref = f"{home}/dataref/.venv/bin/dataref"  # one interpreter and venv for both modes
    if mode == "uid":
        return StdioTransport(dataref, ["serve"], env=env)
    env["HOME"] = home
    command = ["-u", ACCOUNT, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    command.append(dataref)
    return StdioTransport("runuser", [*command, "serve"], env={"PATH": "/usr/sbin:/usr/bin"})


async def _call(client: Client, notebook: str, code: str = "result = 1") -> tuple[float, Any]:
    started = time.perf_counter()
    result = await client.call_tool("run_python", {"code": code, "notebook": notebook})
    seconds = time.perf_counter() - started
    data = result.structured_content or {}
    if not data.get("ok"):
        raise RuntimeError(f"run_python failed: {data}")
    return seconds, data


async def _first_call(client: Client, previous: str) -> tuple[float, str]:
    if previous:  # frees its kernel: the memory budget admits a handful at once
        await client.call_tool("reset_kernel", {"notebook": previous})
    seconds, data = await _call(client, "new")
    return seconds, data["notebook"]


async def measure(states: dict[str, Path]) -> dict[str, Any]:
    """Both servers at once, their calls interleaved: load on the machine hits both alike."""
    modes = list(states)
    out: dict[str, Any] = {m: {"first_call": [], "per_call": []} for m in modes}
    async with (
        Client(_server(modes[0], states[modes[0]]), timeout=300) as a,
        Client(_server(modes[1], states[modes[1]]), timeout=300) as b,
    ):
        clients = dict(zip(modes, (a, b), strict=True))
        roots = _server_pids()
        for mode in modes:  # the first spares
            await asyncio.to_thread(wait_workers_idle, roots[mode], 1, SPARE_WAIT_S)
        handles = dict.fromkeys(modes, "")
        for _ in range(FIRST_CALLS):
            for mode, client in clients.items():
                seconds, handles[mode] = await _first_call(client, handles[mode])
                out[mode]["first_call"].append(seconds)
                # the notebook's kernel and the replacement spare, started and idle
                await asyncio.to_thread(wait_workers_idle, roots[mode], 2, SPARE_WAIT_S)
        for mode, client in clients.items():
            _, data = await _call(client, handles[mode], "import sys; result = sys.version")
            out[mode]["python"] = data["result"].split()[0]
            for _ in range(5):
                await _call(client, handles[mode])
        for _ in range(WARM_CALLS):
            for mode, client in clients.items():
                out[mode]["per_call"].append((await _call(client, handles[mode]))[0])
    return out


def _server_pids() -> dict[str, int]:
    """This process's two servers: userns is the one started through runuser."""
    pids = {
        "userns" if cmdline(pid).startswith("runuser") else "uid": pid
        for pid in children_matching(os.getpid(), "dataref serve")
    }
    if set(pids) != {"uid", "userns"}:
        raise RuntimeError(f"expected a uid and a userns server, found {pids}")
    return pids


def prepare_account() -> None:
    subprocess.run(["bash", str(REPO_ROOT / "tests" / "usermode" / "run.sh"), "setup"], check=True)


async def sandbox_modes(work: Path) -> dict[str, Any]:
    """{'uid': {...}, 'userns': {...}} or {'error': ...} when not run as root."""
    if os.geteuid() != 0:
        return {"error": "run as root: the userns column runs the server as another account"}
    await asyncio.to_thread(prepare_account)
    states = {}
    for mode in ("uid", "userns"):
        states[mode] = work / f"modes-{mode}"
        states[mode].mkdir(parents=True)
    account = pwd.getpwnam(ACCOUNT)
    os.chown(states["userns"], account.pw_uid, account.pw_gid)
    os.chmod(work, 0o711)
    out = await measure(states)
    for numbers in out.values():
        numbers["p50_first"] = statistics.median(numbers["first_call"])
        numbers["p50_per_call"] = statistics.median(numbers["per_call"])
    return out
