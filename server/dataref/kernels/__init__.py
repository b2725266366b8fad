"""IPython kernels: one per (owner, notebook), started from a warm pool, on a backend.

pool.py       KernelPool: assignment, warm spares, caps, idle reaper
kernel.py     NotebookKernel: one kernel, restarted in place when it dies
session.py    executing one cell: outputs, errors, timeout -> interrupt -> restart
backend.py    the seam: KernelBackend / KernelProcess, what the pool needs of a backend
local.py      the local backend: sandboxed ipykernels on this machine
gwkernel.py   the gateway backend: kernels on Kernel Gateway / Enterprise Gateway
gateway.py    the gateway's REST + WebSocket client
kernelspec.py the `dataref` kernelspec a gateway launches (the local sandbox, relayed)
manager.py    the jupyter_client KernelManager that launches inside the sandbox
sandbox.py    a kernel's directories, identity and mode
bwrap.py      the bubblewrap command line (uid mode) and the kernel's environment
userns.py     the command line of userns mode (a server that is not root)
landlock.py   the Landlock launcher (ctypes, run inside the sandbox before ipykernel)
seccomp.py    the seccomp filter bwrap loads
budget.py     the memory budget: no overcommit of kernel limits
cgroups.py    cgroup v2 delegation: detection, a cgroup per userns kernel
uids.py       host uids for uid mode, host processes
hostcheck.py  what a host must allow for userns mode
check.py      check_sandbox(), behind `dataref doctor`
"""

from .check import SandboxReport, check_sandbox
from .kernel import NotebookKernel
from .pool import KernelPool
from .session import COLLECT_MIME, ExecutionResult

__all__ = [
    "COLLECT_MIME",
    "ExecutionResult",
    "KernelPool",
    "NotebookKernel",
    "SandboxReport",
    "check_sandbox",
]
