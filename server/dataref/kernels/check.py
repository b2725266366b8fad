"""``dataref doctor``: does the kernel sandbox work on this machine, and if not, why not."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Settings
from .sandbox import (
    BWRAP,
    PRLIMIT,
    SETPRIV,
    SOCKET_PATH_MAX,
    KernelBox,
    bwrap_argv,
    detect_runtime,
    profile_startup_dir,
)
from .seccomp import build_filter, supported_arch
from .uids import UidAllocator

_INSTALL_BWRAP = (
    "install it: `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
)
_PROBE = (
    "import os, socket, ipykernel, pandas, pyarrow\n"
    "s = socket.socket()\n"
    "s.settimeout(2)\n"
    "try:\n    s.connect(('1.1.1.1', 443)); print('NETWORK')\n"
    "except OSError:\n    pass\n"
    "print('uid', os.getuid())\n"
)


@dataclass
class SandboxReport:
    ok: bool
    mode: str
    problems: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def missing_for_priv_mode() -> list[str]:
    """What priv mode (root server, bwrap, setpriv, prlimit, seccomp) lacks here."""
    problems = []
    if not os.path.isfile(BWRAP):
        problems.append(f"bubblewrap ({BWRAP}) is not installed - {_INSTALL_BWRAP}")
    for tool in (SETPRIV, PRLIMIT):
        if not os.path.isfile(tool):
            problems.append(f"{tool} is missing - install util-linux: `apt-get install util-linux`")
    if os.geteuid() != 0:
        problems.append(
            "the server is not running as root: the sandbox gives every kernel its own "
            "unprivileged uid, which needs root (bwrap without a user namespace, then setpriv) - "
            "run the server as root, e.g. in its own container or VM"
        )
    if not supported_arch():
        problems.append("no seccomp filter for this CPU architecture (x86_64 and aarch64 only)")
    return problems


def check_sandbox(settings: Settings) -> SandboxReport:
    mode = settings.kernels.sandbox
    report = SandboxReport(ok=True, mode=mode)
    _check_runtime(settings, report)
    if mode == "unsandboxed":
        report.details.append(
            "WARNING: kernels run UNSANDBOXED as this user (kernels.sandbox = 'unsandboxed'): "
            "agent code has network and file access; for trusted single-user development only"
        )
        missing = missing_for_priv_mode()
        report.details.append(
            "the bwrap sandbox would need: " + "; ".join(missing)
            if missing
            else "the bwrap sandbox is available here: set kernels.sandbox = 'bwrap'"
        )
        return report
    report.problems += missing_for_priv_mode()
    if not report.problems:
        _trial_run(settings, report)
    _userns_hint(report)
    report.ok = not report.problems
    return report


def _check_runtime(settings: Settings, report: SandboxReport) -> None:
    runtime = detect_runtime()
    report.details.append(
        f"kernel Python: {runtime.base_prefix}"
        + (f" (venv {runtime.venv})" if runtime.venv else "")
    )
    try:
        report.details.append(f"kernel profile: {profile_startup_dir()}")
    except FileNotFoundError as exc:
        report.problems.append(str(exc))
    probe = settings.state_dir / "kernels" / ("x" * 10) / "run" / "k-5"
    if len(str(probe)) > SOCKET_PATH_MAX:
        report.problems.append(
            f"state_dir {settings.state_dir} is too deep for the kernels' Unix sockets - "
            "choose a shorter state_dir (DATAREF_STATE_DIR)"
        )
    k = settings.kernels
    if k.sandbox == "unsandboxed":
        return
    report.details.append(
        f"kernel uids {k.uid_base}..{k.uid_base + k.uid_count - 1}; limits: memory "
        f"{k.memory_bytes >> 20} MiB, {k.max_processes} processes, files {k.max_file_bytes >> 20}"
        f" MiB, cpu {k.cpu_seconds} s"
    )


def _trial_run(settings: Settings, report: SandboxReport) -> None:
    """Start a real sandbox with the pool's exact flags and run a probe in it."""
    runtime = detect_runtime()
    scratch = Path(tempfile.mkdtemp(prefix="dataref-doctor-"))
    uids = UidAllocator(settings.kernels.uid_base, settings.kernels.uid_count)
    try:
        box = KernelBox(
            kernel_id="doctor", root=scratch / "kernels" / "doctor", uid=uids.allocate()
        )
        box.create()
        seccomp = scratch / "seccomp.bpf"
        seccomp.write_bytes(build_filter())
        inner = [runtime.python_inside, "-P", "-c", _PROBE]
        argv = bwrap_argv(box, runtime, settings, seccomp, inner)
        started = time.perf_counter()
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"}
        )
        elapsed = time.perf_counter() - started
    except (OSError, subprocess.SubprocessError) as exc:
        report.problems.append(f"could not run the sandbox probe: {exc}")
        return
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _judge_probe(proc, box.uid, elapsed, report)


def _judge_probe(
    proc: subprocess.CompletedProcess[str], uid: int | None, elapsed: float, report: SandboxReport
) -> None:
    out, err = proc.stdout, proc.stderr.strip()[-500:]
    if proc.returncode != 0:
        hint = ""
        if "namespace" in err.lower() or "permission" in err.lower():
            hint = (
                " - the host forbids namespaces here (e.g. Docker's default seccomp profile or "
                "missing CAP_SYS_ADMIN): run the container with --privileged, or use a VM"
            )
        report.problems.append(
            f"bwrap could not start a sandbox (exit {proc.returncode}): {err}{hint}"
        )
        return
    if "NETWORK" in out:
        report.problems.append("the sandbox reached the network: --unshare-net is not effective")
    if f"uid {uid}" not in out:
        report.problems.append(f"the probe did not run as uid {uid}: {out.strip()[:200]}")
    if not report.problems:
        report.details.append(
            f"bwrap sandbox works: probe ran as uid {uid} without network in {elapsed:.2f} s"
        )


def _userns_hint(report: SandboxReport) -> None:
    try:
        count = int(Path("/proc/sys/user/max_user_namespaces").read_text())
    except (OSError, ValueError):
        count = 0
    report.details.append(
        f"unprivileged user namespaces: {'available' if count > 0 else 'not available'}"
        " (not needed in priv mode; dataref's sandbox runs the server as root)"
    )
