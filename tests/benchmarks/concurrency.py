"""Many owners at once: ONE dataref HTTP server, static tokens for 8 owners, 8 clients.

Each owner is an agent making one call at a time (calls of one notebook are serialised by
its kernel anyway); the 8 owners run concurrently via asyncio.gather. The same server gives
the first call of a new notebook (each owner's first call, with a warm spare waiting).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from .clients import Meter, free_port, http_client, http_dataref
from .memory import cpu_seconds, wait_workers_idle
from .workloads import TRIVIAL_CODE, check

CONFIG = """\
state_dir = "{state}"

[auth]
tokens = {{ {tokens} }}

[kernels]
warm_spares = 1
max_total = {max_total}
# small kernels for a trivial workload: the memory budget (75% of RAM by default) must admit
# one per owner plus the spare without overcommit
memory_bytes = 1073741824
work_bytes = 134217728
"""


def write_config(path: Path, state: Path, owners: int) -> list[str]:
    tokens = [f"bench-token-{i}" for i in range(owners)]
    pairs = ", ".join(f'"{tok}" = "owner{i}"' for i, tok in enumerate(tokens))
    path.write_text(CONFIG.format(state=state, tokens=pairs, max_total=owners + 4))
    return tokens


async def owner_loop(meter: Meter, calls: int) -> list[tuple[float, bool]]:
    out = []
    for _ in range(calls):
        try:
            record = await meter.call("run_python", {"code": TRIVIAL_CODE})
            out.append((record.seconds, record.ok))
        except Exception:  # a transport failure counts as an error, the loop goes on
            out.append((float("nan"), False))
    return out


async def _trivial(meter: Meter) -> float:
    return check(await meter.call("run_python", {"code": TRIVIAL_CODE})).seconds


async def first_calls(meters: list[Meter], server_pid: int) -> list[float]:
    """Each owner's first call (a new notebook) once the warm spare is idle again."""
    samples = []
    for i, meter in enumerate(meters):
        # i kernels are assigned, plus the spare the pool keeps started.
        await asyncio.to_thread(wait_workers_idle, server_pid, i + 1)
        samples.append(await _trivial(meter))
    return samples


async def multi_owner(work: Path, owners: int = 8, calls: int = 25) -> dict[str, Any]:
    config = work / "multi-owner.toml"
    # One more owner than measured: its first call warms the server's own code paths (lazy
    # imports), so the owners' first calls measure a new notebook, not a new server.
    tokens = write_config(config, work / "state-http", owners + 1)
    port = free_port()
    log_file = work / "dataref-http.log"
    async with http_dataref(config, port, log_file) as sampler, AsyncExitStack() as stack:
        meters = [Meter(await stack.enter_async_context(http_client(port, t))) for t in tokens]
        first = (await first_calls(meters, sampler.root))[1:]
        meters = meters[1:]
        single = [(await _trivial(meters[0])) for _ in range(calls)]
        cpu_before, own_before = cpu_seconds(sampler.root), time.process_time()
        started = time.perf_counter()
        per_owner = await asyncio.gather(*(owner_loop(m, calls) for m in meters))
        wall = time.perf_counter() - started
        cpu_after, own_cpu = cpu_seconds(sampler.root), time.process_time() - own_before
    flat = [s for loop in per_owner for s in loop]
    return {
        # CPU seconds per call: the server, its kernels, and this process (the 8 clients).
        "cpu_per_call": [(b - a) / len(flat) for a, b in zip(cpu_before, cpu_after, strict=True)]
        + [own_cpu / len(flat)],
        "first_call": first,
        "single": single,
        "concurrent": [s for s, ok in flat if ok],
        "errors": sum(1 for _, ok in flat if not ok),
        "calls": len(flat),
        "wall_s": wall,
        "memory": sampler.peaks().__dict__,
    }
