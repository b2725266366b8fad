"""What a host must allow for userns mode, each missing piece with the command that fixes it."""

from __future__ import annotations

import os
from pathlib import Path

from .sandbox import detect_runtime

_SYSCTL = Path("/proc/sys")
APPARMOR_PROFILE = Path("/etc/apparmor.d/bwrap-userns-restrict")


def _sysctl(name: str) -> int | None:
    try:
        return int((_SYSCTL / name.replace(".", "/")).read_text())
    except (OSError, ValueError):
        return None


def missing_for_userns() -> list[str]:
    problems = []
    if os.geteuid() == 0:
        problems.append(
            "kernels.sandbox = 'userns' is for a server running as an ordinary user; as root "
            "use 'auto' or 'uid' (one host uid per kernel)"
        )
    if _sysctl("user.max_user_namespaces") == 0:
        problems.append(
            "user namespaces are disabled (user.max_user_namespaces = 0) - "
            "`sudo sysctl -w user.max_user_namespaces=15000` (and in /etc/sysctl.d/ to keep it)"
        )
    if _sysctl("kernel.unprivileged_userns_clone") == 0:
        problems.append(
            "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0) - "
            "`sudo sysctl -w kernel.unprivileged_userns_clone=1`"
        )
    if _sysctl("kernel.apparmor_restrict_unprivileged_userns") == 1 and not (
        APPARMOR_PROFILE.is_file()
    ):
        problems.append(
            "AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns = 1) and bwrap has no profile - "
            "install Ubuntu's: `sudo apt-get install apparmor-profiles && sudo cp "
            "/usr/share/apparmor/extra-profiles/bwrap-userns-restrict /etc/apparmor.d/ && "
            "sudo apparmor_parser -r /etc/apparmor.d/bwrap-userns-restrict`, or allow them all: "
            "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
        )
    runtime = detect_runtime()
    for path in filter(None, (runtime.base_prefix, runtime.venv)):
        if not os.access(path, os.R_OK | os.X_OK):
            problems.append(
                f"the kernel Python {path} is not readable by this user - build the venv from "
                "a system Python: `/usr/bin/python3 -m venv .venv` (needs python3-venv)"
            )
    return problems
