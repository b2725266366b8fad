"""jupyter_client integration: a KernelManager that launches ipykernel inside the sandbox.

The stock LocalProvisioner and channels are used unchanged; this class only decides the
command line, the launch environment, and guards the run dir (pitfall 6 of the recipe): the
kernel's uid may write there only while its sockets are being created.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from jupyter_client.ioloop import AsyncIOLoopKernelManager
from jupyter_client.kernelspec import KernelSpec

from ..config import Settings
from .bwrap import bwrap_argv, ipykernel_argv, kernel_env
from .cgroups import kernel_cgroups
from .sandbox import KernelBox, Runtime
from .uids import is_socket_of

# bwrap and sh get only this; the kernel's own environment is set inside (--clearenv)
_LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class SandboxedKernelManager(AsyncIOLoopKernelManager):
    """One kernel process (restartable in place) for one KernelBox."""

    def __init__(
        self,
        *,
        box: KernelBox,
        runtime: Runtime,
        settings: Settings,
        seccomp_file: Path | None,
        **kwargs: Any,
    ) -> None:
        # autorestart off: the session notices a death itself, at once, and the pool decides
        super().__init__(transport="ipc", ip=str(box.ipc_base), autorestart=False, **kwargs)
        self.box = box
        self.runtime = runtime
        self.settings = settings
        self.seccomp_file = seccomp_file
        self.connection_file = str(box.connection_file)
        self.shutdown_wait_time = 1.0
        # message mode: SIGINT through bwrap would kill the sandbox, not interrupt the cell
        self._kernel_spec = KernelSpec(
            argv=["python"],
            language="python",
            display_name="dataref",
            interrupt_mode="message",
            env={},
        )
        self._log: IO[bytes] | None = None

    # -- command line and launch --------------------------------------------------------------

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        box = self.box
        if not box.sandboxed:
            return ipykernel_argv(sys.executable, str(box.connection_file))
        assert self.seccomp_file is not None
        inner = ipykernel_argv(self.runtime.python_inside, f"{box.run_inside}/conn.json")
        return bwrap_argv(box, self.runtime, self.settings, self.seccomp_file, inner)

    def write_connection_file(self, **kwargs: Any) -> None:
        super().write_connection_file(**kwargs)
        if self.box.run_inside != str(self.box.run):  # the kernel's sockets, as it sees them
            info = json.loads(Path(self.connection_file).read_text())
            info["ip"] = f"{self.box.run_inside}/{self.box.ipc_base.name}"
            Path(self.connection_file).write_text(json.dumps(info))
        if self.box.uid is not None:  # written 0600 by root: let the kernel's group read it
            os.chown(self.connection_file, 0, self.box.uid)
            os.chmod(self.connection_file, 0o640)

    def _launch_env(self) -> dict[str, str]:
        if self.box.sandboxed:
            return dict(_LAUNCHER_ENV)
        env = kernel_env(self.box, self.runtime)
        return env

    def _log_file(self) -> IO[bytes]:
        if self._log is None or self._log.closed:
            self._log = open(self.box.log, "ab", buffering=0)  # noqa: SIM115 (lives with the box)
        return self._log

    async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
        self._unlock_run_dir()
        kw.setdefault("env", self._launch_env())
        kw.setdefault("cwd", str(self.box.work if not self.box.sandboxed else self.box.root))
        # Never the server's stdout: over stdio that is the MCP stream.
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", self._log_file())
        if not self.box.sandboxed:
            _prepare_unsandboxed(self.box)
        return await super()._async_pre_start_kernel(**kw)

    async def _async_post_start_kernel(self, **kw: Any) -> None:
        await super()._async_post_start_kernel(**kw)
        if self.box.sandboxed:
            await self._lock_run_dir()
            self.box.point_view_at(self._sandbox_init_pid())

    def _sandbox_init_pid(self) -> int:
        """bwrap's child: pid 1 of the kernel's namespaces, whose root is the sandbox's."""
        pid = self.provisioner.pid if self.provisioner is not None else None  # type: ignore[attr-defined]
        if pid is None:
            raise RuntimeError("the kernel has no process")
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if len(children) != 1:
            raise RuntimeError(f"bwrap has {len(children)} children, expected its init")
        return int(children[0])

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._log is not None:
            self._log.close()
        if not restart and self.box.mode == "userns" and (cgroups := kernel_cgroups()):
            cgroups.remove(self.box.kernel_id)

    # -- the run dir guard (recipe pitfall 6) -------------------------------------------------

    def _socket_paths(self) -> list[Path]:
        ports = (self.shell_port, self.iopub_port, self.stdin_port, self.control_port, self.hb_port)
        return [Path(f"{self.ip}-{port}") for port in ports]

    def _unlock_run_dir(self) -> None:
        """Before each (re)start: drop stale sockets, let the kernel's group create new ones."""
        run = self.box.run
        for entry in os.scandir(run):
            if entry.name != "conn.json":
                os.unlink(entry.path)  # stale sockets or anything planted: never followed
        if self.box.uid is not None:
            os.chown(run, 0, self.box.uid)
            os.chmod(run, 0o770)
        else:  # userns: the kernel is the server's uid; Landlock keeps it to creating sockets
            os.chmod(run, 0o700)

    @property
    def _socket_owner(self) -> int:
        return self.box.uid if self.box.uid is not None else os.getuid()

    async def _lock_run_dir(self) -> None:
        """Once the 5 sockets exist, the kernel may no longer swap them for symlinks."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.kernels.startup_timeout_seconds
        paths = self._socket_paths()
        while not all(is_socket_of(p, self._socket_owner) for p in paths):
            if not await self.is_alive():
                raise RuntimeError("the kernel exited while starting")
            if loop.time() > deadline:
                raise TimeoutError("the kernel did not create its sockets in time")
            await asyncio.sleep(0.02)
        os.chmod(self.box.run, 0o750 if self.box.uid is not None else 0o700)
        expected = {p.name for p in paths} | {"conn.json"}
        for entry in os.scandir(self.box.run):
            if entry.name not in expected:
                os.unlink(entry.path)
        if not all(is_socket_of(p, self._socket_owner) for p in paths):
            raise RuntimeError("the kernel's sockets were replaced while starting")

    def log_tail(self, limit: int = 2000) -> str:
        """The end of the kernel's stderr, for error messages to the operator."""
        try:
            data = self.box.log.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace").strip()


def _prepare_unsandboxed(box: KernelBox) -> None:
    """The same profile without a sandbox: a fresh private tmp dir per start (like the tmpfs
    inside the sandbox) whose IPYTHONDIR's startup is the package's."""
    import shutil

    from .sandbox import profile_startup_dir

    tmp = box.root / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    profile = tmp / ".ipython" / "profile_default"
    profile.mkdir(parents=True, mode=0o700)
    (profile / "startup").symlink_to(profile_startup_dir(), target_is_directory=True)
