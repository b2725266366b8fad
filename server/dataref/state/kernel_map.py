"""Which kernel a notebook's variables live in: the ``kernel`` column of ``notebooks``.

Values name a kernel context: ``server:<random>`` for the kernels of one server process (they
die with it), or a kernel backend's own id for a kernel every replica can reach (a gateway
kernel). ``Transcripts.append`` compares the writer's value with the recorded one to note
where variables were cleared. A pool whose kernels outlive a replica uses ``claim``: a
compare-and-set, so when two replicas race to start a notebook's kernel exactly one mapping
wins and the loser attaches to the winner's kernel (or shuts its own down).
"""

from __future__ import annotations

from .db import Database


class KernelMap:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, handle: str) -> str | None:
        with self.db.tx() as cur:
            row = cur.execute("SELECT kernel FROM notebooks WHERE handle = ?", (handle,)).fetchone()
        return None if row is None else row[0]

    def claim(self, handle: str, kernel: str, *, replacing: str | None) -> bool:
        """Map ``handle`` to ``kernel`` if it still maps to ``replacing``; True if it did."""
        with self.db.tx(write=True) as cur:
            if replacing is None:
                cur.execute(
                    "UPDATE notebooks SET kernel = ? WHERE handle = ? AND kernel IS NULL",
                    (kernel, handle),
                )
            else:
                cur.execute(
                    "UPDATE notebooks SET kernel = ? WHERE handle = ? AND kernel = ?",
                    (kernel, handle, replacing),
                )
            row = cur.execute("SELECT kernel FROM notebooks WHERE handle = ?", (handle,)).fetchone()
        return row is not None and row[0] == kernel

    def forget(self, handle: str, kernel: str) -> None:
        """The kernel is gone (reset, reaped, dead): unmap it, unless already replaced."""
        with self.db.tx(write=True) as cur:
            cur.execute(
                "UPDATE notebooks SET kernel = NULL WHERE handle = ? AND kernel = ?",
                (handle, kernel),
            )
