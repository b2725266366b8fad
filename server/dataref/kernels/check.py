"""``dataref doctor``: which sandbox mode this server would use, does it work here, and if
not, every missing piece with the command that fixes it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Settings
from .budget import MemoryBudget
from .bwrap import BWRAP, PRLIMIT, SETPRIV, bwrap_argv
from .cgroups import detect_delegation, kernel_cgroups
from .hostcheck import missing_for_userns
from .sandbox import (
    SOCKET_PATH_MAX,
    UID_INSIDE,
    KernelBox,
    detect_runtime,
    profile_startup_dir,
    resolve_mode,
)
from .seccomp import build_filter, supported_arch
from .uids import UidAllocator
from .userns import landlock_abi

INSTALL_BWRAP = (
    "install it: `sudo apt-get install bubblewrap` (Debian/Ubuntu) or "
    "`sudo dnf install bubblewrap` (Fedora)"
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


def missing_for(mode: str, kernels_dir: Path | None = None) -> list[str]:
    """What ``mode`` ('uid' or 'userns') lacks on this host, each with its fix."""
    problems = []
    if not os.path.isfile(BWRAP):
        problems.append(f"bubblewrap ({BWRAP}) is not installed - {INSTALL_BWRAP}")
    if not os.path.isfile(PRLIMIT) or (mode == "uid" and not os.path.isfile(SETPRIV)):
        problems.append("util-linux is missing - `sudo apt-get install util-linux`")
    if not supported_arch():
        problems.append("no seccomp filter for this CPU architecture (x86_64 and aarch64 only)")
    if mode == "uid" and os.geteuid() != 0:
        problems.append(
            "kernels.sandbox = 'uid' gives every kernel its own host uid, which needs a server "
            "running as root - run as root, or set kernels.sandbox = 'auto' (user namespaces)"
        )
    if mode == "userns":
        problems += missing_for_userns()
    return problems


def missing_for_priv_mode() -> list[str]:
    return missing_for("uid")


def check_sandbox(settings: Settings) -> SandboxReport:
    mode = resolve_mode(settings)
    report = SandboxReport(ok=True, mode=mode)
    _check_runtime(settings, report)
    if mode == "unsandboxed":
        report.details.append(
            "WARNING: kernels run UNSANDBOXED as this user (kernels.sandbox = 'unsandboxed'): "
            "agent code has network and file access; for trusted single-user development only"
        )
        auto = "uid" if os.geteuid() == 0 else "userns"
        missing = missing_for(auto)
        report.details.append(
            f"the {auto} sandbox would need: " + "; ".join(missing)
            if missing
            else f"the {auto} sandbox is available here: set kernels.sandbox = 'auto'"
        )
        return report
    report.problems += missing_for(mode, settings.state_dir / "kernels")
    if not report.problems:
        _trial_run(settings, mode, report)
    if mode == "userns":
        _defence_in_depth(report)
    report.details.append(MemoryBudget(settings.kernels).describe())
    report.ok = not report.problems
    return report


def _defence_in_depth(report: SandboxReport) -> None:
    version, why = landlock_abi()
    report.details.append(
        f"Landlock: used (ABI {version}) - no path outside the sandbox's own is readable, none "
        "outside /sandbox, /tmp and /dev/shm writable, no symlinks"
        if version
        else f"Landlock: unavailable ({why}) - kernels rely on the namespaces and seccomp alone"
    )
    delegation = detect_delegation()
    report.details.append(
        f"cgroup v2: delegated at {delegation.path} - each kernel gets memory.max and pids.max"
        if delegation.path is not None
        else f"cgroup v2 delegation: none ({delegation.why}) - fallback: RLIMIT_NPROC per user "
        "namespace and RLIMIT_AS per process, with the memory budget; to add cgroup limits run "
        f"the server in a delegated scope: {delegation.fix}"
    )


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
        f"limits: memory {k.memory_bytes >> 20} MiB, {k.max_processes} processes, files "
        f"{k.max_file_bytes >> 20} MiB, /sandbox {k.work_bytes >> 20} MiB, cpu {k.cpu_seconds} s"
    )


def _trial_run(settings: Settings, mode: str, report: SandboxReport) -> None:
    """Start a real sandbox with the pool's exact flags and run a probe in it."""
    runtime = detect_runtime()
    scratch = Path(tempfile.mkdtemp(prefix="dataref-doctor-"))
    os.chmod(scratch, 0o711)
    k = settings.kernels
    try:
        uid = UidAllocator(k.uid_base, k.uid_count).allocate() if mode == "uid" else None
        box = KernelBox(kernel_id="doctor", root=scratch / "kernels" / "doctor", uid=uid, mode=mode)
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
        if mode == "userns" and (cgroups := kernel_cgroups()):
            cgroups.remove("doctor")
    _judge_probe(proc, box.uid_inside, elapsed, mode, report)


def _judge_probe(
    proc: subprocess.CompletedProcess[str],
    uid: int,
    elapsed: float,
    mode: str,
    report: SandboxReport,
) -> None:
    out, err = proc.stdout, proc.stderr.strip()[-500:]
    if proc.returncode != 0:
        report.problems.append(
            f"bwrap could not start a sandbox (exit {proc.returncode}): {err}{_hint(err, mode)}"
        )
        return
    if "NETWORK" in out:
        report.problems.append("the sandbox reached the network: --unshare-net is not effective")
    if f"uid {uid}" not in out:
        report.problems.append(f"the probe did not run as uid {uid}: {out.strip()[:200]}")
    if not report.problems:
        who = f"uid {uid}" if mode == "uid" else f"uid {UID_INSIDE} of its own user namespace"
        report.details.append(
            f"{mode} sandbox works: a probe ran as {who} without network in {elapsed:.2f} s"
        )


def _hint(err: str, mode: str) -> str:
    lowered = err.lower()
    if "uid map" in lowered or "user namespace" in lowered:
        return (
            " - user namespaces are refused for bwrap: on Ubuntu 23.10+ load the bwrap AppArmor "
            "profile (`sudo apparmor_parser -r /etc/apparmor.d/bwrap-userns-restrict`) or "
            "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; in a container, "
            "allow user namespaces (e.g. docker run --security-opt seccomp=unconfined)"
        )
    if "namespace" in lowered or "permission" in lowered:
        return (
            " - the host forbids namespaces here (e.g. Docker's default seccomp profile or "
            "missing CAP_SYS_ADMIN): run the container with --privileged, or use a VM"
        )
    return ""
