"""An artifact's record, how its ref is minted, and how a DataFrame becomes its Arrow table.

The store (``store.py``) owns the bytes and the rows; this is the value it hands out.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from .errors import InvalidRequest, unknown_ref

REF_BYTES = 16  # 128 random bits; SPEC asks for at least 96
# What a ref we minted looks like; anything else is unknown without asking the database
# (which also keeps lone surrogates and NUL bytes away from SQLite).
REF_PATTERN = re.compile(r"(data|chart)_[A-Za-z0-9_-]{16,64}")


def new_ref(prefix: str = "data") -> str:
    return f"{prefix}_{secrets.token_urlsafe(REF_BYTES)}"


@dataclass(frozen=True)
class Artifact:
    ref: str
    owner: str
    kind: str  # "table" | "chart"
    media_type: str
    file: str  # the blob's key
    rows: int | None
    bytes: int
    created: float
    expires: float
    sensitive: bool
    lineage: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    blobs: Any = field(default=None, repr=False, compare=False)

    @property
    def path(self) -> Path:
        """A local file with the bytes (on S3: the replica's cached copy, fetched once)."""
        try:
            return self.blobs.local_path(self.file)
        except FileNotFoundError:
            raise unknown_ref(self.ref) from None

    def summary(self) -> dict[str, Any]:
        """The compact listing entry (list_artifacts)."""
        out: dict[str, Any] = {"ref": self.ref, "kind": self.kind}
        if self.rows is not None:
            out["rows"] = self.rows
        out["origin"] = self.lineage.get("tool")
        out["created"] = _iso(self.created)
        out["expires"] = _iso(self.expires)
        return out


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def frame_to_table(frame: pd.DataFrame) -> pa.Table:
    """Arrow table of a DataFrame; a meaningful index becomes columns so nothing is lost."""
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.name is not None:
        frame = frame.reset_index()
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise InvalidRequest(
            f"cannot store this DataFrame ({type(exc).__name__}: {str(exc)[:200]}) - "
            "convert mixed-type object columns with .astype(str) first"
        ) from exc
