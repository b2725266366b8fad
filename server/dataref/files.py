"""Files that appear whole or not at all: temporary names, stale leftovers, full disks.

A writer writes ``<stem>.<pid>-<random>.part`` next to the final file, fsyncs it and renames
it into place. After a crash the ``.part`` stays behind; the next start deletes those of
writers that are gone (a second live server on the same state dir keeps its own).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from pathlib import Path

from .errors import StorageError


def write_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with ``text``: a reader (or a crash) sees the old or the new file."""
    part = path.parent / part_name(path.name)
    try:
        with open(part, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(part, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()


def part_name(stem: str) -> str:
    """A temporary file's name, carrying the writer's pid so a restart knows what is stale."""
    return f"{stem}.{os.getpid()}-{secrets.token_hex(4)}.part"


def remove_stale_parts(directory: Path) -> None:
    """Delete .part files whose writer is gone (a crash); a live server's writes stay."""
    for part in directory.glob("*.part"):
        match = re.search(r"\.(\d+)-[0-9a-f]+\.part$", part.name)
        if match and int(match.group(1)) != os.getpid() and _alive(int(match.group(1))):
            continue
        part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def storage_error(exc: OSError) -> StorageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(
            "the server's disk is full - drop_artifact the ones you no longer need, "
            "or ask the operator to free space; nothing was stored"
        )
    return StorageError(f"the artifact store could not write ({exc.strerror}) - try again")
