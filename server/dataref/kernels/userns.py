"""userns mode: the sandbox for a server that runs as an ordinary user (no privilege at all).

    sh (reopens the seccomp BPF) -> [sh: enter the kernel's cgroup, when delegated]
      -> bwrap --unshare-user --disable-userns (+ net, pid, ipc, uts, cgroup), no capabilities
      -> prlimit (memory, CPU, processes, file size, open files; RLIMIT_NPROC counts per user
         namespace, so a fork bomb in one kernel cannot starve the user's other processes)
      -> python -I landlock.py (where the Linux kernel has Landlock) -> ipykernel

What the kernel sees is the same as in uid mode (``bwrap.view_args``): the runtime and the
venv read-only, /sandbox, /tmp and /dev/shm as sized tmpfs, its inputs read-only, its run dir.
Nothing of the user's home is bound except the venv (and this package's startup profile and
Landlock launcher, read-only) when they live there. Inside, the kernel is uid 1000 of its own
namespace, which maps to the server's uid: file ownership cannot separate them, the mount
namespace, Landlock, seccomp and the PID namespace do.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from ..config import Settings
from . import landlock
from .budget import kernel_footprint
from .bwrap import BWRAP, limits_argv, namespace_args, view_args
from .cgroups import kernel_cgroups
from .sandbox import SANDBOX, UID_INSIDE, VENV_INSIDE, KernelBox, Runtime

LANDLOCK_INSIDE = "/opt/dataref/landlock.py"
log = logging.getLogger(__name__)


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
) -> list[str]:
    args = ["/bin/sh", "-c", 'exec "$@" 9< "$0"', str(seccomp_file), *_cgroup_enter(box, settings)]
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


def _cgroup_enter(box: KernelBox, settings: Settings) -> list[str]:
    """With a delegated cgroup v2, the kernel starts in a cgroup of its own; without one (or if
    it cannot be set up) the rlimits and the pool's memory budget are the limits."""
    cgroups = kernel_cgroups()
    if cgroups is None:
        return []
    k = settings.kernels
    try:
        return cgroups.enter_argv(
            cgroups.create(box.kernel_id, kernel_footprint(k), k.max_processes)
        )
    except OSError as exc:
        log.warning("kernel %s: no cgroup (%s); rlimits only", box.kernel_id, exc)
        return []


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
