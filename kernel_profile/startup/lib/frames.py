"""How a stored table becomes the agent's DataFrame, copying only what pandas must own.

pandas holds a float column's missing values as NaN, Arrow as nulls (a validity bitmap
beside the values). ``to_pandas`` therefore copies every float column that has nulls, to
write NaN into the null slots: 40 MB of fresh memory per column of 5M rows, in every kernel
that binds it, and fresh memory is the dear part of a big input (see memory.py).

But the slot under a null usually holds NaN already: pyarrow puts it there when it reads a
frame (so every output of a kernel, and every producer that builds a frame, stores NaN under
its nulls). Such a column, read without its bitmap, is exactly what ``to_pandas`` would have
made, and pandas can take its buffer as it is: a read-only view of the mapped file, like the
columns without nulls. A column where any null hides another value (0 from a database
driver, say) keeps its bitmap and is converted as before, so the frame is always the same.

Loaded by 00-dataref.py by path (like convert.py).
"""

import pyarrow as pa
import pyarrow.compute as pc

FLOATS = (pa.float32(), pa.float64())
NUMPY_FLOATS = ("float32", "float64")


def nulls_as_nan(table):
    """``table`` with every float column whose nulls all hold NaN read without its bitmap."""
    extension = _extension_columns(table.schema)
    for index, field in enumerate(table.schema):
        column = table.column(index)
        if field.type not in FLOATS or column.null_count == 0 or field.name in extension:
            continue
        chunks = [_without_bitmap(chunk) for chunk in column.chunks]
        if all(chunk is not None for chunk in chunks):
            table = table.set_column(index, field, pa.chunked_array(chunks, field.type))
    return table


def _extension_columns(schema):
    """Columns a frame stored with a pandas dtype of its own (``Float64``, ``double[pyarrow]``):
    ``to_pandas`` rebuilds those with pandas' missing-value marker from the bitmap, so it stays."""
    columns = (schema.pandas_metadata or {}).get("columns", [])
    return {c.get("field_name") for c in columns if c.get("numpy_type") not in NUMPY_FLOATS}


def _without_bitmap(chunk):
    """The chunk's values with no bitmap, or None when a null hides a value that is not NaN."""
    if chunk.null_count == 0:
        return chunk
    values = pa.Array.from_buffers(
        chunk.type, len(chunk), [None, chunk.buffers()[1]], offset=chunk.offset
    )
    hidden = pc.filter(values, pc.is_null(chunk))  # reads only the slots under the nulls
    return values if pc.all(pc.is_nan(hidden)).as_py() else None
