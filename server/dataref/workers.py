"""``dataref serve --http --workers N``: N server processes answering on one socket.

The parent binds the socket once and forks N workers that all accept on it (the kernel
spreads connections among them); it restarts a worker that dies and passes SIGTERM/SIGINT
on. Every worker is a whole server: its own event loop, kernels and sweeper. What they share
is the state (SQLite with file locks under the state dir on one machine, or PostgreSQL), so
any worker can answer any call; MCP runs stateless so no call needs the worker of the last.

Kernel uids are split between workers (``kernels.uid_base``/``uid_count``), so two workers
never hand the same uid to two kernels. A notebook's kernel lives in the worker that started
it: a call answered by another worker gets a kernel of its own, and the transcript notes
that variables were cleared there. A kernel gateway (``kernels.gateway_url``) shares kernels.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from typing import Any

from .config import Settings

RESTART_BACKOFF_S = 1.0


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def worker_settings(settings: Settings, index: int, workers: int) -> Settings:
    """The worker's settings: its own slice of kernel uids."""
    k = settings.kernels
    share = k.uid_count // workers
    if share < 1:
        raise ValueError(f"kernels.uid_count ({k.uid_count}) is smaller than --workers ({workers})")
    kernels = k.model_copy(update={"uid_base": k.uid_base + index * share, "uid_count": share})
    return settings.model_copy(update={"kernels": kernels})


def run_worker(settings: Settings, sock: socket.socket) -> None:
    from .app import create_app

    mcp = create_app(settings, "http")
    mcp.run(
        transport="http",
        path="/mcp",
        show_banner=False,
        host=sock.getsockname()[0],
        port=sock.getsockname()[1],
        sockets=[sock],
        stateless_http=True,
        host_origin_protection="auto",
    )


def serve_workers(settings: Settings, host: str, port: int, workers: int) -> int:
    sock = bind(host, port)
    children: dict[int, int] = {}  # pid -> worker index
    stopping = False

    def spawn(index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 0
            try:
                run_worker(worker_settings(settings, index, workers), sock)
            except BaseException as exc:  # the worker's last word, then exit
                print(f"dataref: worker {index} stopped: {exc!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        children[pid] = index

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for index in range(workers):
        spawn(index)
    print(f"dataref: {workers} workers on http://{host}:{port}/mcp", file=sys.stderr)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        index = children.pop(pid, None)
        if index is not None and not stopping:
            print(f"dataref: worker {index} exited ({status}); restarting it", file=sys.stderr)
            time.sleep(RESTART_BACKOFF_S)
            spawn(index)
    sock.close()
    return 0
