"""The ``dataref`` kernelspec: the local backend's sandbox, launched by a Jupyter gateway.

``dataref kernelspec install [--user | --prefix DIR]`` writes a kernelspec whose argv runs
``python -m dataref.kernels.kernelspec -f {connection_file}`` (this module's ``launch``):

1. a KernelBox and a host uid of its own (uids are claimed with lock files, so the launchers
   of one gateway host never share one), the seccomp filter;
2. the kernel starts through ``bwrap.bwrap_argv`` with the same profile and limits as a local
   kernel, bound to ipc sockets in its private run dir: the kernel has no network at all;
3. this launcher, outside the sandbox, binds the TCP ports the gateway chose and relays each
   channel to the kernel's sockets (zmq proxies; messages stay signed end to end);
4. when the kernel exits (or the gateway stops the launcher) the sandbox, its processes and its
   directories go. SIGKILL of the launcher kills the sandbox too (bwrap --die-with-parent);
   its directories are then removed by the next launch.

The launcher reads its settings like the server (DATAREF_* env from kernel.json, or a TOML
file via ``--config``/DATAREF_CONFIG): limits, uid range and state dir.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..config import Settings, load_settings
from .bwrap import bwrap_argv, ipykernel_argv
from .sandbox import KernelBox, detect_runtime, remove_stale_boxes
from .uids import _is_account, is_socket_of, processes

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
_LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def install(
    *,
    user: bool,
    prefix: str | None,
    name: str = "dataref",
    config: str | None = None,
    uid_base: int | None = None,
    state_dir: str | None = None,
) -> str:
    """Write the kernelspec; returns the directory it was installed to."""
    from jupyter_client.kernelspec import KernelSpecManager

    argv = [sys.executable, "-m", "dataref.kernels.kernelspec", "-f", "{connection_file}"]
    if config:
        argv[4:4] = ["--config", str(Path(config).resolve())]
    env = {} if uid_base is None else {"DATAREF_KERNELS__UID_BASE": str(uid_base)}
    if state_dir is not None:
        env["DATAREF_STATE_DIR"] = str(Path(state_dir).resolve())
    spec = {
        "argv": argv,
        "display_name": "dataref (sandboxed)",
        "language": "python",
        "interrupt_mode": "message",  # SIGINT through bwrap would end the sandbox, not the cell
        "env": env,
        "metadata": {"debugger": False},
    }
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kernel.json").write_text(json.dumps(spec, indent=1))
        return KernelSpecManager().install_kernel_spec(
            tmp, kernel_name=name, user=user, prefix=prefix, replace=True
        )


# -- the launcher ---------------------------------------------------------------------------


def claim_uid(settings: Settings, locks: Path) -> tuple[int, int]:
    """A free uid and the fd of its held lock file (released when this process exits)."""
    k = settings.kernels
    locks.mkdir(mode=0o700, parents=True, exist_ok=True)
    busy = {uid for _, uid in processes()}
    for uid in range(k.uid_base, k.uid_base + k.uid_count):
        if uid in busy or _is_account(uid):
            continue
        fd = os.open(locks / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return uid, fd
    raise OSError(f"no free kernel uid in {k.uid_base}..{k.uid_base + k.uid_count - 1}")


def kernel_connection(outer: dict, box: KernelBox) -> dict:
    """The kernel's own connection info: ipc sockets in its run dir, the gateway's key."""
    return {
        "transport": "ipc",
        "ip": str(box.ipc_base),
        **{f"{name}_port": n for n, name in enumerate(CHANNELS, 1)},
        "key": outer["key"],
        "signature_scheme": outer.get("signature_scheme", "hmac-sha256"),
        "kernel_name": outer.get("kernel_name", ""),
    }


def relay(ctx: object, outer: dict, inner: dict) -> list[threading.Thread]:
    """Bind the gateway's TCP ports; forward every channel to the kernel's ipc socket."""
    import zmq

    assert isinstance(ctx, zmq.Context)
    kinds = {
        "shell": (zmq.ROUTER, zmq.DEALER),
        "control": (zmq.ROUTER, zmq.DEALER),
        "stdin": (zmq.ROUTER, zmq.DEALER),
        "hb": (zmq.ROUTER, zmq.DEALER),
        "iopub": (zmq.XPUB, zmq.XSUB),
    }
    threads = []
    for name, (front_kind, back_kind) in kinds.items():
        front, back = ctx.socket(front_kind), ctx.socket(back_kind)
        front.linger = back.linger = 0
        front.bind(f"{outer.get('transport', 'tcp')}://{outer['ip']}:{outer[name + '_port']}")
        back.connect(f"ipc://{inner['ip']}-{inner[name + '_port']}")
        thread = threading.Thread(target=_proxy, args=(front, back), daemon=True, name=name)
        thread.start()
        threads.append(thread)
    return threads


def _proxy(front: object, back: object) -> None:
    import zmq

    with contextlib.suppress(zmq.ZMQError):
        zmq.proxy(front, back)


def launch(connection_file: str, settings: Settings) -> int:
    import zmq

    from .local import write_seccomp

    outer = json.loads(Path(connection_file).read_text())
    root = settings.state_dir / "gateway-kernels"
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    uid, lock_fd = claim_uid(settings, settings.state_dir / "gateway-uids")
    kernel_id = secrets.token_hex(5)
    box = KernelBox(kernel_id=kernel_id, root=root / kernel_id, uid=uid)
    seccomp = root / "seccomp.bpf"
    runtime = detect_runtime()
    with _launching(root):  # launchers run concurrently: no sweep while a box is half made
        remove_stale_boxes(root)
        write_seccomp(seccomp)
        box.create()
    inner = kernel_connection(outer, box)
    box.connection_file.write_text(json.dumps(inner))
    os.chown(box.connection_file, 0, uid)
    os.chmod(box.connection_file, 0o640)
    os.chown(box.run, 0, uid)
    os.chmod(box.run, 0o770)  # the kernel creates its sockets; locked once they exist
    inner_argv = ipykernel_argv(runtime.python_inside, str(box.connection_file))
    argv = bwrap_argv(box, runtime, settings, seccomp, inner_argv)
    kernel = subprocess.Popen(
        argv, env=dict(_LAUNCHER_ENV), cwd=box.root, stdout=subprocess.DEVNULL
    )
    _forward_signals(kernel)
    _die_with_gateway()
    try:
        if not _lock_run_dir(box, inner, kernel, settings.kernels.startup_timeout_seconds):
            return kernel.wait() or 1
        ctx = zmq.Context()
        relay(ctx, outer, inner)
        return kernel.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            kernel.kill()
        _kill_uid(uid)
        box.remove()
        os.close(lock_fd)


@contextlib.contextmanager
def _launching(root: Path) -> Iterator[None]:
    fd = os.open(root / ".launch.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _lock_run_dir(box: KernelBox, inner: dict, kernel: subprocess.Popen, timeout: float) -> bool:
    """Once the kernel's sockets exist, it may no longer swap them for symlinks."""
    paths = [Path(f"{inner['ip']}-{inner[name + '_port']}") for name in CHANNELS]
    deadline = time.monotonic() + timeout
    while not all(is_socket_of(p, box.uid) for p in paths):
        if kernel.poll() is not None or time.monotonic() > deadline:
            print("dataref kernel: the sandboxed kernel did not start", file=sys.stderr)
            return False
        time.sleep(0.02)
    os.chmod(box.run, 0o750)
    expected = {p.name for p in paths} | {"conn.json"}
    for entry in os.scandir(box.run):
        if entry.name not in expected:
            os.unlink(entry.path)
    return all(is_socket_of(p, box.uid) for p in paths)


def _die_with_gateway() -> None:
    """SIGTERM when the gateway that started this launcher dies (it may be SIGKILLed without
    stopping its kernels): the handler below then ends the sandbox and cleans up."""
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def _forward_signals(kernel: subprocess.Popen) -> None:
    """SIGTERM from the gateway ends the kernel; SIGINT is ignored (interrupts are messages)."""

    def terminate(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            kernel.kill()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _kill_uid(uid: int) -> None:
    for _ in range(100):
        pids = [p for p, u in processes() if u == uid]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataref.kernels.kernelspec")
    parser.add_argument("-f", dest="connection_file", required=True)
    parser.add_argument("--config")
    args = parser.parse_args(argv)
    settings = load_settings(args.config)
    if os.geteuid() != 0 or settings.kernels.sandbox == "unsandboxed":
        print(
            "dataref kernel: the gateway must run the kernelspec as root (priv mode: one uid "
            "per kernel, as the local backend); kernels.sandbox must be 'bwrap'",
            file=sys.stderr,
        )
        return 1
    return launch(args.connection_file, settings)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: the relay threads hold zmq sockets a clean exit would wait on
