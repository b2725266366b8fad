"""Artifact and export bytes on S3 and on a shared directory, as replicas use them.

S3 here is moto's server mode: an S3-API *emulator* from PyPI, started as its own process on
127.0.0.1 by these tests (no AWS account is involved). pyarrow's S3FileSystem talks to it
over HTTP exactly as it would to S3. Each "replica" below has its own state dir and local
cache and shares the PostgreSQL state (the SQLite engine is one machine's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pandas as pd
import pytest

from dataref.errors import NotFound
from tests.pg_state_server import free_port
from tests.state_support import FRAME, Replica, settings_for

BUCKET = "dataref-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    moto = str(Path(sys.executable).parent / "moto_server")
    proc = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                httpx2.get(url, timeout=1)
                break
            except httpx2.HTTPError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("the S3 emulator (moto_server) did not start") from None
                time.sleep(0.2)
        httpx2.put(f"{url}/{BUCKET}", timeout=5).raise_for_status()  # create the bucket
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def s3_replica(state_dir: Path, pg_url: str, endpoint: str) -> Replica:
    return Replica(
        settings_for(
            state_dir,
            pg_url,
            f"s3://{BUCKET}/run{os.getpid()}",
            s3_endpoint=endpoint,
            s3_region="us-east-1",
            s3_access_key="emulator",
            s3_secret_key="emulator",
        )
    )


def test_artifacts_on_s3_are_read_by_another_replica_through_its_cache(
    tmp_path, pg_url, s3_endpoint
):
    a = s3_replica(tmp_path / "a", pg_url, s3_endpoint)
    b = s3_replica(tmp_path / "b", pg_url, s3_endpoint)
    try:
        art = a.store.put_frame("alice", FRAME, lineage={})
        assert not (tmp_path / "b" / "cache" / "artifacts" / art.file).exists()
        assert b.store.read_frame("alice", art.ref).equals(FRAME)
        cached = tmp_path / "b" / "cache" / "artifacts" / art.file
        assert cached.is_file()  # fetched once, then memory-mapped and hard-linked locally
        inputs = tmp_path / "inputs"
        inputs.mkdir()
        linked = b.store.link_into("alice", art.ref, inputs)
        assert os.stat(linked).st_ino == os.stat(cached).st_ino
        assert b.state.artifact_blobs.exists(art.file)
        b.store.drop("alice", art.ref)
        assert not a.state.artifact_blobs.exists(art.file)
        with pytest.raises(NotFound):
            a.store.read_frame("alice", art.ref)
        a.state.ping()
    finally:
        a.close()
        b.close()


def test_export_files_on_s3_download_from_any_replica(tmp_path, pg_url, s3_endpoint):
    a = s3_replica(tmp_path / "a", pg_url, s3_endpoint)
    b = s3_replica(tmp_path / "b", pg_url, s3_endpoint)
    try:
        link = a.downloads.publish(
            "alice", name="x.csv", media_type="text/csv", filename="x.csv", ttl=60,
            write=lambda p: FRAME.to_csv(p, index=False),
        )  # fmt: skip
        path = b.downloads.file_of(b.downloads.lookup(link.token, "alice"))
        assert pd.read_csv(path).equals(FRAME)
    finally:
        a.close()
        b.close()


def test_an_unreachable_s3_makes_the_state_not_ready(tmp_path, pg_url):
    replica = s3_replica(tmp_path / "a", pg_url, f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(OSError):
            replica.state.ping()
    finally:
        replica.close()


def test_a_shared_directory_serves_every_replica(tmp_path, pg_url):
    shared = (tmp_path / "shared").as_uri()
    a = Replica(settings_for(tmp_path / "a", pg_url, shared))
    b = Replica(settings_for(tmp_path / "b", pg_url, shared))
    try:
        art = a.store.put_frame("alice", FRAME, lineage={})
        assert (tmp_path / "shared" / "artifacts" / art.file).is_file()
        assert b.store.read_frame("alice", art.ref).equals(FRAME)
        link = b.downloads.publish(
            "alice", name="y.csv", media_type="text/csv", filename="y.csv", ttl=60,
            write=lambda p: p.write_text("y\n"),
        )  # fmt: skip
        assert a.downloads.file_of(a.downloads.lookup(link.token, "alice")).read_text() == "y\n"
    finally:
        a.close()
        b.close()
