"""The kernel backend seam: what the pool and NotebookKernel need from "a kernel process".

Two backends implement it: ``local.py`` (sandboxed ipykernels on this machine, driven over
ipc) and ``gwkernel.py`` (kernels on a Jupyter Kernel Gateway or Enterprise Gateway, driven
over its REST + WebSocket API). Everything above (pool, NotebookKernel, session, compute) is
written against these protocols only: caps, warm spares, reaping, timeouts, crash detection,
progress and the transcript behave the same on both.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ..store import ArtifactStore


class Channels(Protocol):
    """A connected kernel: requests go out, every reply and iopub message lands in ``queue``
    as ``(channel, msg)`` with ``msg`` in jupyter_client's dict form."""

    queue: asyncio.Queue[tuple[str, dict[str, Any]]]

    async def execute(
        self, code: str, *, store_history: bool, user_expressions: dict[str, str] | None = None
    ) -> str:
        """Send an execute_request (its reply carries the ``user_expressions``); returns its
        msg_id."""

    def drain(self) -> None:
        """Forget queued messages of earlier cells."""

    async def close(self) -> None: ...


class KernelProcess(Protocol):
    """One kernel process of one backend, restartable in place (variables are then lost)."""

    kernel_id: str
    uid: int | None  # the host uid it runs as, where the server knows it (local only)

    @property
    def channels(self) -> Channels | None: ...

    async def start(self) -> None:
        """Start the process and connect (``channels`` is set afterwards)."""

    async def restart(self) -> None:
        """A fresh process in the same place; reconnects ``channels``."""

    async def shutdown(self) -> None:
        """Stop the process and free everything it held. Called once."""

    async def is_alive(self) -> bool:
        """Cheap: polled every ~0.1 s while a cell runs."""

    async def interrupt(self) -> None: ...

    def log_tail(self) -> str:
        """The end of the kernel's stderr (for the operator's log), or ''."""

    async def stage(self, store: ArtifactStore, owner: str, refs: list[str]) -> None:
        """Make the tables ``refs`` loadable by the profile's ``bind`` in this kernel."""

    def read_output(self, cell_id: str, filename: str, max_bytes: int) -> bytes:
        """A file the profile wrote for ``cell_id`` (untrusted). Raises ValueError naming
        'too large' or 'not a regular file', or OSError. Called from a worker thread."""

    def remove_outputs(self, cell_id: str) -> None:
        """Forget what the profile wrote for ``cell_id``. Called from a worker thread."""


class KernelBackend(Protocol):
    """Makes KernelProcesses; owns what they share (uids, the seccomp filter, an HTTP client)."""

    name: str

    async def start(self) -> None:
        """Check the backend can work at all; raises ComputeError naming the operator's fix."""

    def new_process(self, owner: str | None) -> KernelProcess:
        """A process not started yet. ``owner`` is None for a warm spare."""

    async def close(self) -> None: ...
