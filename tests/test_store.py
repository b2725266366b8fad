"""The artifact store: owners apart, TTL, caps, quota, lineage, atomic writes, restarts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pandas as pd
import pyarrow as pa
import pytest

from dataref.config import StoreSettings
from dataref.errors import LimitExceeded, NotFound
from dataref.store import ArtifactStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path, clock) -> ArtifactStore:
    s = ArtifactStore(tmp_path / "store", StoreSettings(ttl_seconds=60), clock=clock)
    yield s
    s.close()


FRAME = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", None]})


def test_a_stored_frame_reads_back_equal(store):
    art = store.put_frame("alice", FRAME, lineage={"tool": "t"})
    assert art.rows == 3
    pd.testing.assert_frame_equal(store.read_frame("alice", art.ref), FRAME, check_dtype=False)


def test_refs_are_random_and_long_enough(store):
    refs = {store.put_frame("alice", FRAME, lineage={}).ref for _ in range(20)}
    assert len(refs) == 20
    for ref in refs:
        assert ref.startswith("data_")
        # token_urlsafe(16) -> 22 chars of base64 = 128 bits
        assert len(ref) - len("data_") >= 16


def test_foreign_ref_looks_like_a_missing_one(store):
    ref = store.put_frame("alice", FRAME, lineage={}).ref
    with pytest.raises(NotFound) as foreign:
        store.get("bob", ref)
    missing = "data_" + "A" * 22
    with pytest.raises(NotFound) as never:
        store.get("bob", missing)
    assert str(foreign.value).replace(ref, "REF") == str(never.value).replace(missing, "REF")
    assert "fetch the data again" in str(foreign.value)


def test_expired_ref_fails_with_a_recovery_hint_and_is_swept(store, clock):
    art = store.put_frame("alice", FRAME, lineage={})
    clock.now += 61
    with pytest.raises(NotFound, match="fetch the data again"):
        store.read_frame("alice", art.ref)
    assert store.sweep() == 1
    assert not art.path.exists()


def test_byte_cap_error_says_size_cap_and_narrow_the_query(tmp_path):
    s = ArtifactStore(tmp_path / "s", StoreSettings(artifact_max_bytes=10_000))
    big = pd.DataFrame({"x": range(100_000)})
    with pytest.raises(LimitExceeded) as err:
        s.put_frame("alice", big, lineage={})
    msg = str(err.value)
    assert "size cap" in msg and "narrow the query" in msg and "KB" in msg
    assert list(s.blobs.iterdir()) == [] and list(s.tmp.iterdir()) == []


def test_owner_quota_counts_only_that_owner(tmp_path):
    one = pd.DataFrame({"x": range(1000)})
    size = ArtifactStore(tmp_path / "probe", StoreSettings()).put_frame("p", one, lineage={}).bytes
    s = ArtifactStore(tmp_path / "s", StoreSettings(owner_quota_bytes=int(size * 2.5)))
    s.put_frame("alice", one, lineage={})
    s.put_frame("alice", one, lineage={})
    with pytest.raises(LimitExceeded, match="quota") as err:
        s.put_frame("alice", one, lineage={})
    assert "narrow the query" in str(err.value)
    s.put_frame("bob", one, lineage={})  # bob has his own quota


def test_lineage_is_recorded(store):
    parent = store.put_frame(
        "alice", FRAME, lineage={"tool": "fetch_sales", "args": {"since": "2025-01-01"}}
    )
    child = store.put_frame(
        "alice", FRAME, lineage={"tool": "run_python", "parents": [parent.ref], "cell": "c1"}
    )
    again = store.get("alice", child.ref)
    assert again.lineage == {"tool": "run_python", "parents": [parent.ref], "cell": "c1"}
    assert store.get("alice", parent.ref).lineage["args"] == {"since": "2025-01-01"}


def test_an_artifact_survives_a_restart(tmp_path):
    s = ArtifactStore(tmp_path / "s", StoreSettings())
    ref = s.put_frame("alice", FRAME, lineage={}).ref
    s.close()
    again = ArtifactStore(tmp_path / "s", StoreSettings())
    assert again.read_frame("alice", ref).shape == (3, 2)


def test_an_artifact_survives_sigkill_of_the_writer(tmp_path):
    code = textwrap.dedent(
        f"""
        import os, signal, pandas as pd
        from dataref.store import ArtifactStore
        from dataref.config import StoreSettings
        s = ArtifactStore({str(tmp_path / "s")!r}, StoreSettings())
        ref = s.put_frame("alice", pd.DataFrame({{"x": [1, 2]}}), lineage={{}}).ref
        print(ref, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == -9
    ref = out.stdout.strip()
    assert ArtifactStore(tmp_path / "s", StoreSettings()).read_frame("alice", ref).x.tolist() == [
        1,
        2,
    ]


def test_a_write_killed_midway_leaves_nothing_visible(tmp_path):
    """SIGKILL while the IPC file is being written: after reopening, no row, no file."""
    code = textwrap.dedent(
        f"""
        import os, signal, pyarrow as pa, pandas as pd
        from dataref import store as st
        from dataref.config import StoreSettings
        s = st.ArtifactStore({str(tmp_path / "s")!r}, StoreSettings())
        original = s._write_file
        def dying(part, write):
            original(part, write)  # the file is complete in tmp/ ...
            os.kill(os.getpid(), signal.SIGKILL)  # ... but the row is never committed
        s._write_file = dying
        s.put_frame("alice", pd.DataFrame({{"x": range(10)}}), lineage={{}})
        """
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    assert any((tmp_path / "s" / "tmp").iterdir())
    again = ArtifactStore(tmp_path / "s", StoreSettings())
    assert again.list("alice") == []
    assert list(again.tmp.iterdir()) == [] and list(again.blobs.iterdir()) == []


def test_an_orphan_blob_without_a_row_is_removed_on_open(tmp_path):
    s = ArtifactStore(tmp_path / "s", StoreSettings())
    (s.blobs / "data_orphan.arrow").write_bytes(b"partial")
    s.close()
    again = ArtifactStore(tmp_path / "s", StoreSettings())
    assert not (again.blobs / "data_orphan.arrow").exists()


def test_link_into_exposes_the_same_file_without_copying(store, tmp_path):
    art = store.put_frame("alice", FRAME, lineage={})
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    linked = store.link_into("alice", art.ref, inputs)
    assert os.stat(linked).st_ino == os.stat(art.path).st_ino
    with pytest.raises(NotFound):
        store.link_into("bob", art.ref, inputs)


def test_a_frame_is_one_batch_so_a_kernel_maps_its_numeric_columns_without_copying(store):
    art = store.put_frame("alice", pd.DataFrame({"n": range(3_000_000), "s": "x"}), lineage={})
    with pa.memory_map(str(art.path)) as source:
        reader = pa.ipc.open_file(source)
        assert reader.num_record_batches == 1
        frame = reader.read_all().to_pandas(split_blocks=True)
    assert not frame["n"].to_numpy().flags.writeable  # a view of the mapped file
    assert frame["n"].iloc[-1] == 2_999_999


def test_a_table_of_chunks_is_written_as_its_chunks_never_joined(store):
    chunked = pa.table({"n": pa.chunked_array([pa.array(range(1000))] * 3)})
    art = store.put_table("alice", chunked, lineage={})
    with pa.memory_map(str(art.path)) as source:
        reader = pa.ipc.open_file(source)
        assert reader.num_record_batches == 3
        assert reader.read_all().equals(chunked)


def test_charts_are_stored_as_bytes_with_their_own_prefix(store):
    art = store.put_bytes(
        "alice", b"\x89PNG...", kind="chart", media_type="image/png", suffix=".png", lineage={}
    )
    assert art.ref.startswith("chart_")
    assert store.read_bytes("alice", art.ref) == b"\x89PNG..."
    with pytest.raises(NotFound):
        store.read_table("alice", art.ref)


def test_a_meaningful_index_is_kept_as_a_column(store):
    frame = pd.DataFrame({"v": [1, 2]}, index=pd.Index(["a", "b"], name="key"))
    table = store.read_table("alice", store.put_frame("alice", frame, lineage={}).ref)
    assert table.column_names == ["key", "v"]
    assert isinstance(table, pa.Table)
