"""lib/frames.py: a float column whose nulls hold NaN is handed to pandas as it is stored,
and the frame is always the one ``to_pandas`` makes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

LIB = Path(__file__).resolve().parents[1] / "kernel_profile" / "startup" / "lib" / "frames.py"


@pytest.fixture(scope="module")
def frames() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_frames_lib", LIB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hiding(values: list[float], valid: list[bool]) -> pa.Array:
    """A float array whose null slots hold ``values`` (what a database driver may leave)."""
    bitmap = pa.array(valid).buffers()[1]
    data = pa.array(values, pa.float64()).buffers()[1]
    return pa.Array.from_buffers(
        pa.float64(), len(values), [bitmap, data], null_count=valid.count(False)
    )


def same_frame(frames: ModuleType, table: pa.Table) -> pa.Table:
    read = frames.nulls_as_nan(table)
    pd.testing.assert_frame_equal(
        read.to_pandas(split_blocks=True), table.to_pandas(split_blocks=True)
    )
    return read


def test_a_frames_float_nulls_are_read_without_their_bitmap(frames: ModuleType) -> None:
    frame = pd.DataFrame(
        {
            "price": [1.5, np.nan, 2.0, np.nan],
            "small": pd.Series([np.nan, 1.0, 2.0, 3.0], dtype="float32"),
            "units": [1, 2, 3, 4],
            "line": ["a", None, "b", "c"],
        }
    )
    table = pa.Table.from_pandas(frame, preserve_index=False)
    read = same_frame(frames, table)
    assert [read.column(c).null_count for c in read.column_names] == [0, 0, 0, 1]
    assert read.column("price").chunk(0).buffers()[1].address == (
        table.column("price").chunk(0).buffers()[1].address  # the same buffer, not a copy
    )
    assert read.schema.metadata == table.schema.metadata


def test_a_null_over_any_other_value_keeps_its_bitmap(frames: ModuleType) -> None:
    table = pa.table(
        {
            "zero": hiding([1.0, 0.0, 3.0], [True, False, True]),
            "mixed": hiding([np.nan, 7.0, 1.0], [False, False, True]),
            "listed": pa.array([1.0, None, 3.0]),  # pyarrow writes 0 under a null of a list
        }
    )
    read = same_frame(frames, table)
    assert [read.column(c).null_count for c in read.column_names] == [1, 2, 1]


def test_slices_and_chunks_read_the_same(frames: ModuleType) -> None:
    nan_under = pa.Table.from_pandas(pd.DataFrame({"v": [np.nan, 1.0, np.nan, 2.0, 3.0]}))
    zero_under = pa.table({"v": hiding([0.0, 1.0, 0.0], [False, True, False])})
    for table in (nan_under.slice(1, 3), nan_under.slice(3), pa.concat_tables([nan_under] * 3)):
        assert same_frame(frames, table).column("v").null_count == 0
    mixed = pa.concat_tables([nan_under, zero_under])
    assert same_frame(frames, mixed).column("v").null_count == mixed.column("v").null_count


def test_a_column_stored_with_a_pandas_dtype_of_its_own_keeps_its_bitmap(
    frames: ModuleType,
) -> None:
    frame = pd.DataFrame(
        {
            "masked": pd.array([1.5, None, 2.0], dtype="Float64"),
            "arrow": pd.array([1.5, None, 2.0], dtype="double[pyarrow]"),
            "plain": [1.5, np.nan, 2.0],
        }
    )
    table = pa.Table.from_pandas(frame, preserve_index=False)
    nan_under = hiding([1.5, np.nan, 2.0], [True, False, True])
    for index in (0, 1):  # NaN under their nulls too: it would read as a value, not as missing
        table = table.set_column(index, table.field(index), pa.chunked_array([nan_under]))
    read = same_frame(frames, table)
    assert [read.column(c).null_count for c in read.column_names] == [1, 1, 0]
