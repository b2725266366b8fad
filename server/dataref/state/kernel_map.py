"""Which kernel a notebook's variables live in, for kernels every replica can reach.

The ``kernels`` table lists the gateway kernels this deployment started: a row with a
``handle`` maps that notebook to the kernel (at most one kernel per notebook: the column is
unique), a row with a ``holder`` is a warm spare of that replica. ``replicas`` holds a
heartbeat per live replica, so the leader can tell a dead replica's spares (orphans) from a
live one's. ``claim`` is a compare-and-set under the notebook's lock in the database: when two
replicas race to start a notebook's kernel exactly one mapping wins and the loser attaches to
the winner's kernel.

Local kernels (one server process's own) are not listed here: their notebooks' ``kernel``
column names the process's ``server:<random>`` context (see ``Journal.append``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .db import Database

ALIVE_SECONDS = 20.0  # a replica whose heartbeat is older is taken for dead


@dataclass(frozen=True)
class Mapped:
    kernel: str  # the gateway's kernel id
    last_used: float


class KernelMap:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- the map ---------------------------------------------------------------------------

    def get(self, handle: str) -> Mapped | None:
        with self.db.tx() as cur:
            row = cur.execute(
                "SELECT id, last_used FROM kernels WHERE handle = ?", (handle,)
            ).fetchone()
        return None if row is None else Mapped(row[0], float(row[1]))

    def claim(self, handle: str, kernel: str) -> str:
        """Map ``handle`` to ``kernel`` unless it already maps to one; returns the kernel it
        maps to now (``kernel`` itself when this claim won)."""
        with self.db.tx(write=True, lock=f"dataref:kernel-map:{handle}") as cur:
            row = cur.execute("SELECT id FROM kernels WHERE handle = ?", (handle,)).fetchone()
            if row is not None:
                return str(row[0])
            cur.execute("DELETE FROM kernels WHERE id = ?", (kernel,))  # a spare's row
            cur.execute(
                "INSERT INTO kernels (id, handle, holder, last_used) VALUES (?, ?, NULL, ?)",
                (kernel, handle, time.time()),
            )
        return kernel

    def replace(self, handle: str, old: str, new: str) -> bool:
        """The notebook's kernel ``old`` became ``new`` (the gateway started a new one in its
        place); False when the notebook no longer maps to ``old``."""
        with self.db.tx(write=True) as cur:
            cur.execute(
                "UPDATE kernels SET id = ?, last_used = ? WHERE handle = ? AND id = ?",
                (new, time.time(), handle, old),
            )
            row = cur.execute("SELECT id FROM kernels WHERE handle = ?", (handle,)).fetchone()
        return row is not None and row[0] == new

    def touch(self, kernel: str) -> None:
        with self.db.tx(write=True) as cur:
            cur.execute("UPDATE kernels SET last_used = ? WHERE id = ?", (time.time(), kernel))

    def forget(self, kernel: str) -> None:
        """The kernel is gone (reset, reaped, dead, or a spare shut down)."""
        with self.db.tx(write=True) as cur:
            cur.execute("DELETE FROM kernels WHERE id = ?", (kernel,))

    def reset(self, handle: str) -> str | None:
        """Unmap the notebook and note that no kernel holds its variables (so the next
        kernel's first call is no "variables were cleared" surprise: the reset said so).
        Returns the kernel it mapped to."""
        with self.db.tx(write=True) as cur:
            row = cur.execute("SELECT id FROM kernels WHERE handle = ?", (handle,)).fetchone()
            cur.execute("DELETE FROM kernels WHERE handle = ?", (handle,))
            cur.execute("UPDATE notebooks SET kernel = NULL WHERE handle = ?", (handle,))
        return None if row is None else str(row[0])

    # -- spares and replicas -----------------------------------------------------------------

    def add_spare(self, kernel: str, holder: str) -> None:
        with self.db.tx(write=True) as cur:
            cur.execute(
                "INSERT INTO kernels (id, handle, holder, last_used) VALUES (?, NULL, ?, ?)",
                (kernel, holder, time.time()),
            )

    def heartbeat(self, replica: str) -> None:
        with self.db.tx(write=True, lock="dataref:replicas") as cur:
            cur.execute("DELETE FROM replicas WHERE id = ?", (replica,))
            cur.execute("INSERT INTO replicas (id, seen) VALUES (?, ?)", (replica, time.time()))

    def leave(self, replica: str) -> bool:
        """This replica stops; True when another replica is still alive."""
        with self.db.tx(write=True, lock="dataref:replicas") as cur:
            cur.execute("DELETE FROM replicas WHERE id = ?", (replica,))
            row = cur.execute(
                "SELECT COUNT(*) FROM replicas WHERE seen > ?", (time.time() - ALIVE_SECONDS,)
            ).fetchone()
        return int(row[0]) > 0

    def idle(self, before: float) -> list[tuple[str, str]]:
        """(kernel, handle) of mapped kernels last used before ``before``."""
        with self.db.tx() as cur:
            rows = cur.execute(
                "SELECT id, handle FROM kernels WHERE handle IS NOT NULL AND last_used < ?",
                (before,),
            ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def orphans(self) -> list[str]:
        """Spares whose replica is dead (no heartbeat for ALIVE_SECONDS)."""
        alive = time.time() - ALIVE_SECONDS
        with self.db.tx() as cur:
            rows = cur.execute(
                "SELECT id FROM kernels WHERE handle IS NULL AND (holder IS NULL OR holder NOT IN "
                "(SELECT id FROM replicas WHERE seen > ?))",
                (alive,),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def everything(self) -> list[str]:
        with self.db.tx() as cur:
            return [str(r[0]) for r in cur.execute("SELECT id FROM kernels").fetchall()]
