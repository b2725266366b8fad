"""Sandboxed IPython kernels: one per (owner, notebook), started from a warm pool.

pool.py     KernelPool: assignment, warm spares, caps, idle reaper
kernel.py   NotebookKernel: one kernel process, restarted in place when it dies
session.py  executing one cell: outputs, errors, timeout -> interrupt -> restart
manager.py  the jupyter_client KernelManager that launches inside the sandbox
sandbox.py  directories, uids and the bubblewrap command line
seccomp.py  the seccomp filter bwrap loads
check.py    check_sandbox(), behind `dataref doctor`
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
