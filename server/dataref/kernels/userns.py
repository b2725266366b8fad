"""userns mode: the sandbox for a server that runs as an ordinary user (no privilege at all).

    sh (reopens the seccomp BPF) -> [sh: enter the kernel's cgroup, when delegated]
      -> bwrap --unshare-user --disable-userns (+ net, pid, ipc, uts, cgroup), no capabilities
      -> prlimit (memory, CPU, processes, file size, open files; RLIMIT_NPROC counts per user
         namespace, so a fork bomb in one kernel cannot starve the user's other processes)
      -> python -I landlock.py (where the Linux kernel has Landlock) -> ipykernel

What the kernel sees is the same as in uid mode (``sandbox.view_args``): the runtime and the
venv read-only, /sandbox, /tmp and /dev/shm as sized tmpfs, its inputs read-only, its run dir.
Nothing of the user's home is bound except the venv (and this package's startup profile and
Landlock launcher, read-only) when they live there. Inside, the kernel is uid 1000 of its own
namespace, which maps to the server's uid: file ownership cannot separate them, the mount
namespace, Landlock, seccomp and the PID namespace do.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ..config import Settings
from . import landlock
from .sandbox import (
    BWRAP,
    SANDBOX,
    UID_INSIDE,
    VENV_INSIDE,
    KernelBox,
    Runtime,
    limits_argv,
    namespace_args,
    view_args,
)

LANDLOCK_INSIDE = "/opt/dataref/landlock.py"


@functools.cache
def landlock_abi() -> tuple[int, str]:
    """(ABI, why not) of this machine's Landlock, probed once per process."""
    return landlock.abi()


def landlock_source() -> Path:
    return Path(landlock.__file__).resolve()


def userns_argv(
    box: KernelBox,
    runtime: Runtime,
    settings: Settings,
    seccomp_file: Path,
    inner: list[str],
    cgroup_enter: list[str] | None = None,
) -> list[str]:
    args = ["/bin/sh", "-c", 'exec "$@" 9< "$0"', str(seccomp_file), *(cgroup_enter or [])]
    args += [BWRAP, "--unshare-user", "--disable-userns"]
    args += ["--uid", str(UID_INSIDE), "--gid", str(UID_INSIDE), "--cap-drop", "ALL"]
    args += namespace_args()
    use_landlock = landlock_abi()[0] > 0
    extra = {str(landlock_source()): LANDLOCK_INSIDE} if use_landlock else {}
    args += view_args(box, runtime, settings, extra_ro=extra)
    args += ["--", *limits_argv(settings)]
    if use_landlock:
        args += landlock_argv(box, runtime)
    return args + inner


WRITABLE_INSIDE = (SANDBOX, "/tmp", "/dev/shm")


def landlock_argv(box: KernelBox, runtime: Runtime) -> list[str]:
    """The launcher and its rules: read the runtime, write the private tmpfs, sockets only in
    the run dir. No symlinks anywhere, so the kernel cannot plant one for the server."""
    read = ["/usr", "/etc", "/opt", "/proc", str(runtime.base_prefix)]
    write = list(WRITABLE_INSIDE)
    python = f"{VENV_INSIDE}/bin/python" if runtime.venv is not None else runtime.python_inside
    return [
        python,
        "-I",
        LANDLOCK_INSIDE,
        ":".join(read),
        ":".join(write),
        box.run_inside,
        "/dev",
        "--",
    ]
