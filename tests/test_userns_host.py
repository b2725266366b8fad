"""Host detection for the sandbox modes (doctor): sysctls, AppArmor, cgroup v2 delegation,
Landlock, and the memory budget's arithmetic. No kernel is started here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dataref.config import KernelSettings
from dataref.errors import LimitExceeded
from dataref.kernels import cgroups, hostcheck, landlock
from dataref.kernels.budget import MemoryBudget, kernel_footprint

GiB = 1 << 30
HYBRID = (
    "35 25 0:30 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
    "36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n"
    "37 35 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
)


def _fake_sysctls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **values: int) -> None:
    for name, value in values.items():
        path = tmp_path / "sys" / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    monkeypatch.setattr(hostcheck, "_SYSCTL", tmp_path / "sys")
    monkeypatch.setattr("os.geteuid", lambda: 1000)


def test_disabled_user_namespaces_are_reported_with_the_sysctl_that_fixes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_sysctls(
        tmp_path, monkeypatch, user__max_user_namespaces=0, kernel__unprivileged_userns_clone=0
    )
    problems = " ".join(hostcheck.missing_for_userns())
    assert "sysctl -w user.max_user_namespaces=15000" in problems
    assert "sysctl -w kernel.unprivileged_userns_clone=1" in problems


def test_ubuntus_apparmor_restriction_names_the_bwrap_profile_and_the_sysctl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_sysctls(tmp_path, monkeypatch, kernel__apparmor_restrict_unprivileged_userns=1)
    monkeypatch.setattr(hostcheck, "APPARMOR_PROFILE", tmp_path / "no-such-profile")
    problems = " ".join(hostcheck.missing_for_userns())
    assert "bwrap-userns-restrict" in problems
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in problems
    profile = tmp_path / "bwrap-userns-restrict"
    profile.write_text("profile bwrap {}\n")
    monkeypatch.setattr(hostcheck, "APPARMOR_PROFILE", profile)
    assert hostcheck.missing_for_userns() == []


def test_a_hybrid_cgroup_host_without_v2_controllers_is_reported_as_not_delegated() -> None:
    found = cgroups.detect_delegation(HYBRID, "12:memory:/\n0::/user.slice\n")
    assert found.path is None and "no memory/pids controller" in found.why
    assert "Delegate=yes" in found.fix
    assert cgroups.detect_delegation("", "0::/\n").why.startswith("cgroup v2 is not mounted")


def test_a_delegated_cgroup_v2_with_memory_and_pids_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = tmp_path / "cgroup"
    mine = mount / "user.slice" / "app.scope"
    mine.mkdir(parents=True)
    (mine / "cgroup.controllers").write_text("cpu memory pids\n")
    (mine / "cgroup.procs").write_text("")
    mountinfo = f"30 25 0:26 / {mount} rw - cgroup2 cgroup2 rw\n"
    found = cgroups.detect_delegation(mountinfo, "0::/user.slice/app.scope\n")
    assert found.path == mine
    (mine / "cgroup.controllers").write_text("cpu\n")
    assert cgroups.detect_delegation(mountinfo, "0::/user.slice/app.scope\n").path is None


def test_landlock_is_detected_here_and_the_ruleset_grows_with_the_abi() -> None:
    version, why = landlock.abi()
    assert version >= 1, why  # this project's hosts have Landlock (Linux 5.13+)
    assert landlock.handled_fs(1) & landlock.MAKE_SYM
    assert not landlock.handled_fs(1) & landlock.REFER
    assert (
        landlock.handled_fs(5) & landlock.IOCTL_DEV and landlock.handled_fs(3) & landlock.TRUNCATE
    )


def test_the_memory_budget_counts_every_tmpfs_and_refuses_with_a_way_out() -> None:
    k = KernelSettings(memory_budget_bytes=10 * GiB)
    assert kernel_footprint(k) == k.memory_bytes + k.tmp_bytes + k.shm_bytes + k.work_bytes
    budget = MemoryBudget(k)
    assert budget.capacity == 10 * GiB // kernel_footprint(k)
    for i in range(budget.capacity):
        budget.reserve(f"k{i}")
    with pytest.raises(LimitExceeded, match="reset_kernel"):
        budget.reserve("one-more")
    budget.release("k0")
    budget.reserve("one-more")


def test_with_a_delegated_cgroup_each_userns_kernel_starts_in_its_own_limited_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files the kernel's cgroup gets, on a stand-in tree (this host has no cgroup v2
    controllers to delegate, so the limits themselves are not exercised here)."""
    from dataref.config import Settings
    from dataref.kernels.sandbox import KernelBox, detect_runtime
    from dataref.kernels.userns import userns_argv

    delegated = tmp_path / "cg" / "user.slice" / "app.scope"
    delegated.mkdir(parents=True)
    groups = cgroups.KernelCgroups(delegated)
    monkeypatch.setattr("dataref.kernels.userns.kernel_cgroups", lambda: groups)
    settings = Settings(state_dir=tmp_path / "state")
    box = KernelBox(
        kernel_id="k1", root=tmp_path / "state" / "kernels" / "k1", uid=None, mode="userns"
    )
    box.create()
    argv = userns_argv(box, detect_runtime(), settings, tmp_path / "seccomp.bpf", ["python"])
    mine = delegated / "dataref-kernels" / "k1"
    assert argv[4:8] == ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(mine)]
    assert argv[8] == "/usr/bin/bwrap"
    assert (mine / "memory.max").read_text() == str(kernel_footprint(settings.kernels))
    assert (mine / "pids.max").read_text() == str(settings.kernels.max_processes)
    assert (delegated / "dataref-server" / "cgroup.procs").read_text() == str(os.getpid())
    assert (delegated / "cgroup.subtree_control").read_text() == "+memory +pids"
    for name in ("memory.max", "pids.max"):
        (mine / name).unlink()
    groups.remove("k1")
    assert not mine.exists()
