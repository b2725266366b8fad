"""The exception tree. Every message tells the agent how to recover.

    DatarefError
    ├── NotFound          unknown, expired or foreign reference (indistinguishable on purpose)
    ├── LimitExceeded     byte cap, quota, row cap, result cap, kernel caps
    ├── InvalidRequest    bad arguments: names, columns, kinds, SQL that is not a single SELECT
    ├── AccessDenied      a source or region the owner is not granted
    ├── ComputeError      the kernel died, timed out or could not start
    └── StorageError      the disk is full or the state dir is unusable

The app maps these (and only these) to MCP tool errors; anything else is an internal error
whose details are masked.
"""

from __future__ import annotations


class DatarefError(Exception):
    """Base class: ``str(error)`` is the message the agent sees."""


class NotFound(DatarefError):
    pass


class LimitExceeded(DatarefError):
    pass


class InvalidRequest(DatarefError):
    pass


class AccessDenied(DatarefError):
    pass


class ComputeError(DatarefError):
    pass


class StorageError(DatarefError):
    pass


def unknown_ref(ref: str) -> NotFound:
    """The one message for a ref that is missing, expired or someone else's."""
    shown = ref if len(ref) <= 40 else ref[:37] + "..."
    return NotFound(
        f"unknown or expired dataRef {shown!r} - fetch the data again "
        "(list_artifacts shows your live refs)"
    )


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB'; sizes in errors the agent reads."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1024
        if n < 1024 or unit == "TB":
            break
    return f"{n:.1f} {unit}"
