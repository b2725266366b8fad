"""Rows a SQL source streams into the store: Arrow record batches, typed by one rule set.

Type rules (the same for every source, so a column means the same thing wherever it came from):

* ``DATE`` becomes a timestamp (midnight), so pandas sees ``datetime64`` and ``.dt`` works;
  ``TIMESTAMP`` stays a timestamp, ``TIMESTAMPTZ`` a UTC timestamp.
* ``NUMERIC``/``DECIMAL`` become float64 (exact to 15 significant digits); for exact wider
  values cast to text in SQL (``amount::text``).
* JSON and UUID become text; other database-specific types keep their Arrow storage type.
* NULLs stay NULLs (NaN/NaT/None in pandas), never a placeholder value.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidRequest, LimitExceeded

TIMESTAMP = pa.timestamp("us")


@dataclass
class Batches:
    """A producer's streamed result: the schema and its batches; ``close`` frees the source."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.batches

    def close(self) -> None:
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()

    def read_all(self) -> pa.Table:
        try:
            return pa.Table.from_batches(list(self.batches), schema=self.schema)
        finally:
            self.close()


def check_names(schema: pa.Schema) -> None:
    names = schema.names
    duplicates = sorted({c for c in names if names.count(c) > 1})
    if duplicates:
        raise InvalidRequest(
            f"the query returns more than one column named {duplicates[0]!r} - give each "
            "column a distinct name with AS"
        )


def _uuid_text(array: pa.Array) -> pa.Array:
    storage = getattr(array, "storage", array)
    return pa.array(
        [None if b is None else str(uuid.UUID(bytes=b)) for b in storage.to_pylist()], pa.string()
    )


Converter = Callable[[pa.Array], pa.Array]


def _rule(field: pa.Field) -> tuple[pa.DataType, Converter] | None:
    """The target type of ``field`` and how to convert an array to it (None: keep as is)."""
    t = field.type
    if pa.types.is_date(t):
        return TIMESTAMP, lambda a: a.cast(TIMESTAMP)
    if pa.types.is_decimal(t):
        return pa.float64(), lambda a: a.cast(pa.float64())
    if isinstance(t, pa.BaseExtensionType):
        name = t.extension_name
        if name == "arrow.uuid":
            return pa.string(), _uuid_text
        storage = t.storage_type
        if getattr(t, "type_name", None) == "numeric" and pa.types.is_string(storage):
            return pa.float64(), lambda a: _numeric(a.storage)
        return storage, lambda a: a.storage
    return None


def _numeric(text: pa.Array) -> pa.Array:
    # PostgreSQL spells infinities 'Infinity'; Arrow parses 'inf'.
    fixed = pc.replace_substring(text, "Infinity", "inf")
    return fixed.cast(pa.float64())


def normalise(schema: pa.Schema) -> tuple[pa.Schema, Callable[[pa.RecordBatch], pa.RecordBatch]]:
    """The stored schema for a source's ``schema`` and the per-batch conversion to it."""
    check_names(schema)
    rules = [_rule(f) for f in schema]
    target = pa.schema(
        [
            pa.field(f.name, r[0] if r else f.type, nullable=True)
            for f, r in zip(schema, rules, strict=True)
        ]
    )

    def convert(batch: pa.RecordBatch) -> pa.RecordBatch:
        columns = [r[1](col) if r else col for col, r in zip(batch.columns, rules, strict=True)]
        return pa.RecordBatch.from_arrays(columns, schema=target)

    return target, convert


def capped(
    batches: Iterator[pa.RecordBatch],
    convert: Callable[[pa.RecordBatch], pa.RecordBatch],
    row_cap: int,
    release: Callable[[], None],
) -> Iterator[pa.RecordBatch]:
    """Converted batches, refused past ``row_cap`` rows; ``release`` runs however it ends."""
    rows = 0
    try:
        for batch in batches:
            rows += batch.num_rows
            if rows > row_cap:
                raise LimitExceeded(
                    f"query returned more than {row_cap:,} rows - narrow the query (WHERE) or "
                    "aggregate in SQL (GROUP BY)"
                )
            if batch.num_rows:
                yield convert(batch)
    finally:
        release()
