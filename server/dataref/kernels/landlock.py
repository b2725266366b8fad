"""Landlock, through ctypes: the kernel's second wall, applied before ipykernel starts.

Run as a script inside the sandbox (stdlib only, so it needs nothing but the kernel's Python)::

    python -I landlock.py RO_PATHS RW_PATHS SOCK_PATHS -- argv...

Each PATHS is a ``:``-separated list. The ruleset allows reading (and executing) the RO paths,
reading and writing the RW paths (no symlinks, devices or executing what was written), and in
the SOCK paths only reading and creating sockets (the run dir: the kernel can bind its ipc
sockets but never remove, rename or replace them). Abstract Unix sockets and signals are scoped
to the sandbox (ABI 6). Then ``no_new_privs`` and ``execv(argv)``: the rules bind every thread
and child of the kernel. Even an escape from the mount namespace finds nothing else readable.

The server imports ``abi()`` to report whether Landlock is available (``dataref doctor``).
When it is not (Linux < 5.13, or disabled), the launcher is not used and the sandbox rests on
the namespaces, seccomp and the run-dir checks alone.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

_SYS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 16, 32, 64, 128
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 256, 512, 1024, 2048, 4096
REFER, TRUNCATE, IOCTL_DEV = 8192, 16384, 32768
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2

_FS_BY_ABI = {1: (1 << 13) - 1, 2: REFER, 3: TRUNCATE, 5: IOCTL_DEV}
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (
    READ_FILE
    | READ_DIR
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | REFER
    | TRUNCATE
)
SOCKETS = READ_FILE | READ_DIR | MAKE_SOCK
DEVICES = READ_FILE | READ_DIR | WRITE_FILE | IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> tuple[int, str]:
    """(ABI version, why not) - version 0 means Landlock cannot be used here."""
    numbers = _SYS.get(platform.machine())
    if numbers is None:
        return 0, f"no Landlock syscall numbers for {platform.machine()}"
    version = _libc().syscall(numbers[0], None, 0, _CREATE_RULESET_VERSION)
    if version > 0:
        return int(version), ""
    err = ctypes.get_errno()
    if err == 38:  # ENOSYS
        return 0, "this Linux kernel has no Landlock (needs 5.13 or later)"
    if err == 95:  # EOPNOTSUPP
        return 0, "Landlock is built in but disabled (add 'landlock' to the lsm= boot parameter)"
    return 0, f"Landlock probe failed: {os.strerror(err)}"


def handled_fs(version: int) -> int:
    mask = 0
    for since, bits in _FS_BY_ABI.items():
        if version >= since:
            mask |= bits
    return mask


def restrict(ro: list[str], rw: list[str], sockets: list[str], devices: list[str]) -> int:
    """Apply the ruleset to this process (and what it execs); returns the ABI used."""
    version, why = abi()
    if version == 0:
        raise OSError(why)
    libc = _libc()
    create, add_rule, restrict_self = _SYS[platform.machine()]
    handled = handled_fs(version)
    attr = _RulesetAttr(handled, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    size = 24 if version >= 6 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for paths, access in ((ro, READ), (rw, WRITE), (sockets, SOCKETS), (devices, DEVICES)):
            for path in paths:
                _add(libc, add_rule, ruleset, path, access & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(restrict_self, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return version


def _add(libc: ctypes.CDLL, add_rule: int, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # an optional bind (e.g. /etc/fonts) that is not there
    try:
        if not os.path.isdir(path):  # files take file rights only
            access &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
        rule = _PathBeneath(access, fd)
        if libc.syscall(add_rule, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def main(args: list[str]) -> None:
    split = args.index("--")
    ro, rw, sockets, devices = (part.split(":") if part else [] for part in args[:split])
    argv = args[split + 1 :]
    restrict(ro, rw, sockets, devices)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
