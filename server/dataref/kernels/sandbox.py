"""How a kernel is sandboxed: its directories and its identity (the bubblewrap command line
that uses them is ``bwrap.py``).

Two modes (``kernels.sandbox``; "auto" picks by the server's uid):

uid     the server is root; ``bwrap`` runs without a user namespace and execs ``setpriv`` to a
        real unprivileged host uid, one per kernel (so RLIMIT_NPROC is per kernel and one
        kernel cannot starve another), then ``prlimit`` sets the limits, then ipykernel starts.
userns  the server is an ordinary user; ``bwrap --unshare-user`` gives each kernel its own
        user namespace (RLIMIT_NPROC counts per namespace, so kernels cannot starve each other
        either), then ``prlimit``, then the Landlock launcher (``landlock.py``) where the Linux
        kernel has Landlock, then ipykernel. Details in ``userns.py``.

In both, a seccomp filter (``seccomp.py``) stops nested namespaces, and ``/sandbox`` is a
sized tmpfs inside the sandbox (``kernels.work_bytes``): a kernel fills its own space, never
the disk of the store. The server reads outputs through ``view``, a symlink to the sandbox's
root (``/proc/<bwrap's init>/root``), renewed at every (re)start.

Per kernel, under ``state_dir/kernels/<kernel_id>/``:

    run/      root:U 0770 while starting, 0750 once the 5 ipc sockets exist (bound at the
              same absolute path inside, so the connection file is valid on both sides)
    view      -> /proc/<pid>/root: the sandbox's root; outputs are read at
              view/sandbox/.dataref/out/ (untrusted contents; .dataref is root's in uid mode)
    work/     unsandboxed mode only: the kernel's working dir on the host
    inputs/   root 0755, read-only at /sandbox/inputs; the server hard-links artifacts here
    etc/      passwd, group, hosts for the sandbox
    kernel.log  the kernel's stderr (bwrap and startup errors)

"unsandboxed" mode runs ipykernel as the server's own user with the same layout and profile
(its outputs in work/.dataref/out/).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.resources
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Settings

SANDBOX = "/sandbox"
INPUTS_INSIDE = "/sandbox/inputs"
VENV_INSIDE = "/opt/venv"
SOCKET_PATH_MAX = 107  # sockaddr_un.sun_path, minus the NUL
UID_INSIDE = 1000
RUN_INSIDE = "/run/dataref"  # the kernel's uid inside its user namespace (userns mode)


def resolve_mode(settings: Settings) -> str:
    """'uid', 'userns' or 'unsandboxed': what ``kernels.sandbox`` means for this server."""
    mode = settings.kernels.sandbox
    if mode == "auto":
        return "uid" if os.geteuid() == 0 else "userns"
    return "uid" if mode == "bwrap" else mode


@dataclass(frozen=True)
class Runtime:
    """The Python the kernels run: the server's own interpreter and its venv, read-only."""

    base_prefix: Path  # the Python install; bound at the same path (its RUNPATH is baked in)
    venv: Path | None  # bound at /opt/venv when the server runs from a venv

    @property
    def python_inside(self) -> str:
        if self.venv is not None:
            return f"{VENV_INSIDE}/bin/python"
        return sys.executable

    @property
    def bin_inside(self) -> str:
        return str(Path(self.python_inside).parent)


def detect_runtime() -> Runtime:
    venv = Path(sys.prefix) if sys.prefix != sys.base_prefix else None
    return Runtime(base_prefix=Path(sys.base_prefix), venv=venv)


def profile_startup_dir() -> Path:
    """The read-only startup directory of the kernel profile, wherever dataref is installed."""
    startup = Path(str(importlib.resources.files("dataref.kernel_profile") / "startup"))
    if not (startup / "00-dataref.py").is_file():
        raise FileNotFoundError(
            f"the kernel profile is missing ({startup}) - reinstall dataref from a wheel or a "
            "source checkout (a zipped install cannot be bound into the sandbox)"
        )
    return startup


@dataclass
class KernelBox:
    """One kernel's directories and identity on the host."""

    kernel_id: str
    root: Path
    uid: int | None  # the host uid in uid mode; None otherwise (the server's own uid)
    mode: str = "uid"  # "uid", "userns" or "unsandboxed"
    _lock_fd: int | None = field(default=None, repr=False)

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def view(self) -> Path:
        return self.root / "view"

    @property
    def outputs(self) -> Path:
        if not self.sandboxed:
            return self.work / ".dataref" / "out"
        return self.view / SANDBOX.lstrip("/") / ".dataref" / "out"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def log(self) -> Path:
        return self.root / "kernel.log"

    @property
    def connection_file(self) -> Path:
        return self.run / "conn.json"

    @property
    def ipc_base(self) -> Path:
        return self.run / "k"

    @property
    def run_inside(self) -> str:
        """Where the run dir is bound inside: its host path in uid mode; in userns mode a fixed
        path, so it never lies inside a writable tmpfs (Landlock guards it by path)."""
        return RUN_INSIDE if self.mode == "userns" else str(self.run)

    @property
    def sandboxed(self) -> bool:
        return self.mode != "unsandboxed"

    @property
    def uid_inside(self) -> int:
        return self.uid if self.uid is not None else UID_INSIDE

    def point_view_at(self, pid: int) -> None:
        """After each (re)start: ``view`` -> the root of the sandbox whose init is ``pid``."""
        partial = self.root / f".view.{pid}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        os.symlink(f"/proc/{pid}/root", partial)
        os.replace(partial, self.view)

    def create(self) -> None:
        """Make the directories with the owners and modes the module docstring lists."""
        self.root.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.root.mkdir(mode=0o711)
        # Held while the kernel lives: another server on the same state_dir sees it is in use.
        self._lock_fd = os.open(self.root / "lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        longest = len(f"{self.ipc_base}-5")
        if longest > SOCKET_PATH_MAX:
            raise OSError(
                f"state_dir is too deep for Unix sockets ({longest} > {SOCKET_PATH_MAX} "
                "characters) - set a shorter state_dir"
            )
        for path in (self.run, self.inputs, self.etc):
            path.mkdir(mode=0o700)
        os.chmod(self.inputs, 0o755)
        if not self.sandboxed:
            self.work.mkdir(mode=0o700)
            (self.work / "inputs").mkdir(mode=0o755)  # where inputs/ is linked
            self.outputs.parent.mkdir(mode=0o755)
            self.outputs.mkdir(mode=0o700)
            return
        inside = self.uid_inside
        _write(self.etc / "passwd", _passwd(inside))
        _write(self.etc / "group", _group(inside))
        _write(self.etc / "hosts", "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n")
        os.chmod(self.etc, 0o755)
        if self.uid is not None:  # uid mode: root owns everything but the socket dir's group
            _own(self.run, 0, self.uid, 0o750)
            _own(self.inputs, 0, 0, 0o755)
            _own(self.etc, 0, 0, 0o755)

    def remove(self) -> None:
        # rmtree works on file descriptors and never follows the kernel's symlinks
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def remove_stale_boxes(kernels_dir: Path, min_age_s: float = 60.0) -> int:
    """Delete kernel dirs no live server holds (their kernels died with their server).

    A dir whose lock is held belongs to a running server sharing this state_dir; a dir without
    a lock file younger than ``min_age_s`` may be one being created right now.
    """
    removed = 0
    for entry in os.scandir(kernels_dir):
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(os.path.join(entry.path, "lock"), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
            fd = None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            if fd is not None:
                os.close(fd)
    return removed


def _own(path: Path, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o644)


def _passwd(uid: int) -> str:
    return (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{uid}:{uid}:dataref kernel:{SANDBOX}:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )


def _group(uid: int) -> str:
    return f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n"
