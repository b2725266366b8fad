"""The bubblewrap command line of a sandboxed kernel and the kernel's environment.

What a kernel sees is the same in both modes (``view_args``); ``bwrap_argv`` wraps it in the
uid mode's identity change (``setpriv``) or hands it to ``userns.userns_argv``; either way
``prlimit`` sets the limits before ipykernel starts. The directories and identities these
lines refer to are ``sandbox.KernelBox``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import Settings
from .sandbox import INPUTS_INSIDE, SANDBOX, VENV_INSIDE, KernelBox, Runtime, profile_startup_dir

# Freed memory stays in the kernel for its next call (no mmap'd blocks, no trim on free), and
# the profile's lib/memory.py trims it once the kernel is idle: fresh pages cost a fault (on a
# VM often a host fault too), reused ones do not.
MALLOC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=18446744073709551615"
OUTPUTS_INSIDE = "/sandbox/.dataref/out"
STARTUP_INSIDE = "/tmp/.ipython/profile_default/startup"
BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
PRLIMIT = "/usr/bin/prlimit"


def _parents(path: Path) -> list[str]:
    """/a/b/c -> ['/a', '/a/b']: created 0755 inside, else bwrap makes them 0700 root."""
    return [str(p) for p in reversed(path.parents) if str(p) != "/"]


def _dirs(paths: list[str], mode: str = "0755") -> list[str]:
    args: list[str] = []
    for path in paths:
        args += ["--perms", mode, "--dir", path]
    return args


def kernel_env(box: KernelBox, runtime: Runtime) -> dict[str, str]:
    """The kernel's whole environment: nothing of the server's (bwrap --clearenv)."""
    if box.sandboxed:
        home, tmp, inputs, outputs = SANDBOX, "/tmp", INPUTS_INSIDE, OUTPUTS_INSIDE
        bin_dir = runtime.bin_inside
    else:
        home, tmp = str(box.work), str(box.root / "tmp")
        inputs, outputs = str(box.inputs), str(box.outputs)
        bin_dir = str(Path(sys.executable).parent)
    return {
        "HOME": home,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "TMPDIR": tmp,
        # Every config/startup location points at the private tmpfs, fresh on each start, so
        # nothing the agent writes to /sandbox runs when the kernel (re)starts.
        "IPYTHONDIR": f"{tmp}/.ipython",
        "JUPYTER_CONFIG_DIR": f"{tmp}/.jupyter",
        "JUPYTER_DATA_DIR": f"{tmp}/.jupyter/data",
        "JUPYTER_RUNTIME_DIR": f"{tmp}/.jupyter/runtime",
        "JUPYTER_PLATFORM_DIRS": "1",
        "MPLCONFIGDIR": f"{tmp}/.mpl",
        "MPLBACKEND": "Agg",
        "XDG_CACHE_HOME": f"{tmp}/.cache",
        "XDG_CONFIG_HOME": f"{tmp}/.config",
        "PYTHONNOUSERSITE": "1",
        "PYTHONSAFEPATH": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        # RLIMIT_AS counts address space: glibc reserves 64 MiB per malloc arena
        "MALLOC_ARENA_MAX": "2",
        "GLIBC_TUNABLES": MALLOC_TUNABLES,
        "ARROW_DEFAULT_MEMORY_POOL": "system",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "DATAREF_INPUTS_DIR": inputs,
        "DATAREF_OUTPUT_DIR": outputs,
    }


def ipykernel_argv(python: str, connection_file: str) -> list[str]:
    # -P: the cwd (/sandbox, agent-writable) is not put on sys.path, so a planted
    # pandas.py or ipykernel_launcher.py cannot run at the next start.
    return [
        python,
        "-P",
        "-m",
        "ipykernel_launcher",
        "-f",
        connection_file,
        "--HistoryManager.hist_file=:memory:",
    ]


def limits_argv(settings: Settings) -> list[str]:
    k = settings.kernels
    return [
        PRLIMIT,
        f"--as={k.memory_bytes}",
        f"--cpu={k.cpu_seconds}",
        f"--nproc={k.max_processes}",
        f"--fsize={k.max_file_bytes}",
        f"--nofile={k.max_open_files}",
        "--core=0",
        "--",
    ]


def bwrap_argv(
    box: KernelBox, runtime: Runtime, settings: Settings, seccomp_file: Path, inner: list[str]
) -> list[str]:
    """The whole launch command of a sandboxed kernel, in its mode (see the module docstring)."""
    if box.mode == "userns":
        from .userns import userns_argv

        return userns_argv(box, runtime, settings, seccomp_file, inner)
    assert box.uid is not None
    args = ["/bin/sh", "-c", 'exec "$@" 9< "$0"', str(seccomp_file), BWRAP]
    args += namespace_args() + view_args(box, runtime, settings)
    uid = str(box.uid)
    args += ["--", SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    args += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return args + limits_argv(settings) + inner


def namespace_args() -> list[str]:
    args = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    return [
        *args,
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
    ]


def view_args(
    box: KernelBox, runtime: Runtime, settings: Settings, extra_ro: dict[str, str] | None = None
) -> list[str]:
    """What the kernel sees (the same in both modes), its environment and the seccomp fd."""
    k = settings.kernels
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64"):
        args += ["--symlink", f"usr/{name}", f"/{name}"]
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in ("passwd", "group", "hosts"):
        args += ["--ro-bind", str(box.etc / name), f"/etc/{name}"]
    for name in ("ld.so.cache", "localtime", "fonts"):
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    if not runtime.base_prefix.is_relative_to("/usr"):
        args += _dirs(_parents(runtime.base_prefix))
        args += ["--ro-bind", str(runtime.base_prefix), str(runtime.base_prefix)]
    args += ["--perms", "0755", "--dir", "/opt"]
    if runtime.venv is not None:
        args += ["--ro-bind", str(runtime.venv), VENV_INSIDE]
    for source, target in (extra_ro or {}).items():
        args += [*_dirs([str(Path(target).parent)]), "--ro-bind", source, target]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(k.shm_bytes), "--tmpfs", "/dev/shm"]
    args += ["--remount-ro", "/dev"]
    args += ["--perms", "1777", "--size", str(k.tmp_bytes), "--tmpfs", "/tmp"]
    args += _dirs(["/tmp/.ipython", "/tmp/.ipython/profile_default"], "1777")
    args += ["--ro-bind", str(profile_startup_dir()), STARTUP_INSIDE]
    # /sandbox: a sized tmpfs, so a disk filler meets its own limit; .dataref is made before
    # the kernel runs (root's in uid mode, so the sticky /sandbox keeps the kernel from
    # renaming it), out/ is where the kernel writes outputs for the server.
    args += ["--perms", "1777", "--size", str(k.work_bytes), "--tmpfs", SANDBOX]
    args += _dirs([f"{SANDBOX}/.dataref"]) + _dirs([OUTPUTS_INSIDE], "1777")
    args += ["--ro-bind", str(box.inputs), INPUTS_INSIDE]
    args += _dirs(_parents(Path(box.run_inside)))
    args += ["--bind", str(box.run), box.run_inside]
    args += ["--remount-ro", "/", "--seccomp", "9", "--chdir", SANDBOX, "--clearenv"]
    for key, value in kernel_env(box, runtime).items():
        args += ["--setenv", key, value]
    return args
