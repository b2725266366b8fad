"""A small seccomp BPF filter, assembled here (no libseccomp binding needed).

bubblewrap loads it with ``--seccomp FD`` just before it execs the kernel. It exists because
in priv mode (bwrap as root, no user namespace) the kernel could otherwise create nested user
namespaces and, inside them, mount and unshare at will. It also refuses syscalls an analysis
kernel never needs and that have a history of kernel exploits (bpf, userfaultfd, io_uring,
keyctl, perf_event_open, ptrace...). Everything else is allowed: AF_INET and AF_NETLINK sockets
must keep working (ipykernel and libzmq need them; the network namespace has only ``lo``).
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]  (little endian on both arches)
_NR, _ARCH, _ARG0_LO = 0, 4, 16

# BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NS_FLAGS = 0x7E020000
_CLONE_NEWTIME = 0x00000080  # for clone() this bit is part of the exit signal, so unshare only

# Refused with EPERM. Numbers: x86_64 from asm/unistd_64.h; aarch64 from asm-generic/unistd.h.
_DENIED = {
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "syslog": (103, 116),
    "vhangup": (153, 58),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}
_ARCHES = {
    # machine: (AUDIT_ARCH_*, column in _DENIED, clone, clone3, unshare, x32 bit or 0)
    "x86_64": (0xC000003E, 0, 56, 435, 272, 0x40000000),
    "aarch64": (0xC00000B7, 1, 220, 435, 97, 0),
}


def supported_arch(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in _ARCHES


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """The filter for this machine as the array of ``struct sock_filter`` bwrap expects."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(f"no seccomp filter for architecture {machine!r}")
    audit_arch, column, nr_clone, nr_clone3, nr_unshare, x32 = _ARCHES[machine]
    eperm = _RET_ERRNO | errno.EPERM
    head = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, audit_arch, jt=1, jf=0),
        _insn(_RET_K, _RET_KILL_PROCESS),  # a foreign ABI (i386, arm32) is never legitimate
        _insn(_LD_W_ABS, _NR),
    ]
    if x32:  # the x32 ABI aliases every syscall with this bit set
        head += [_insn(_JGE_K, x32, jt=0, jf=1), _insn(_RET_K, eperm)]
    checks = [(nr, "deny") for nr in sorted({nrs[column] for nrs in _DENIED.values()})]
    checks += [(nr_clone, "clone"), (nr_unshare, "unshare"), (nr_clone3, "enosys")]
    # BPF only jumps forward: head | one JEQ per check | the targets below
    labels: dict[str, int] = {}
    targets: list[tuple[int, int, int, int]] = []
    for label, block in (
        ("allow", [_insn(_RET_K, _RET_ALLOW)]),
        ("deny", [_insn(_RET_K, eperm)]),
        ("enosys", [_insn(_RET_K, _RET_ERRNO | errno.ENOSYS)]),  # glibc falls back to clone()
        ("clone", _flags_check(_CLONE_NS_FLAGS, eperm)),
        ("unshare", _flags_check(_CLONE_NS_FLAGS | _CLONE_NEWTIME, eperm)),
    ):
        labels[label] = len(targets)
        targets += block
    first_target = len(head) + len(checks)
    body = []
    for i, (nr, kind) in enumerate(checks):
        offset = first_target + labels[kind] - (len(head) + i) - 1
        if offset > 255:
            raise AssertionError("seccomp filter too long for 8-bit jumps")
        body.append(_insn(_JEQ_K, nr, jt=offset, jf=0))
    # falling through the last check lands on "allow", the first target
    program = [*head, *body, *targets]
    return b"".join(struct.pack("<HBBI", *insn) for insn in program)


def _flags_check(mask: int, deny: int) -> list[tuple[int, int, int, int]]:
    """clone(flags, ...) / unshare(flags): refuse when any namespace flag is set."""
    return [
        _insn(_LD_W_ABS, _ARG0_LO),
        _insn(_JSET_K, mask, jt=1, jf=0),
        _insn(_RET_K, _RET_ALLOW),
        _insn(_RET_K, deny),
    ]
