"""The state seam on both engines: SQLite files and a real PostgreSQL server.

Several "servers" here are several State objects or several OS processes sharing one state:
what a replica commits another sees, quotas hold across them, one call at a time holds a
notebook, one leader sweeps, and a process killed while holding a lock loses it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell

from dataref.errors import LimitExceeded, NotFound
from dataref.state.migrations import STEPS
from tests.state_support import FRAME, Replica, settings_for


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request) -> str:
    return request.param


@pytest.fixture
def state_url(engine, request) -> str | None:
    return request.getfixturevalue("pg_url") if engine == "postgresql" else None


@contextlib.contextmanager
def two_replicas(
    tmp_path: Path, url: str | None, blobs: str | None = None
) -> Iterator[tuple[Replica, Replica]]:
    # SQLite is one machine: both share the state dir. PostgreSQL: each has its own.
    first = tmp_path / "a"
    second = first if url is None else tmp_path / "b"
    if blobs is None and url is not None:
        blobs = (tmp_path / "shared").as_uri()
    a, b = Replica(settings_for(first, url, blobs)), Replica(settings_for(second, url, blobs))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_migrations_are_applied_once_and_recorded(tmp_path, state_url):
    with two_replicas(tmp_path, state_url) as (a, _b):  # _b: a second opening applies nothing
        rows = set()
        for db in a.state.databases():  # four SQLite files, or one PostgreSQL database
            with db.tx() as cur:
                rows |= {
                    tuple(r) for r in cur.execute("SELECT * FROM schema_migrations").fetchall()
                }
        expected = {("artifacts", 1), ("links", 1), ("page", 1)}
        expected |= {("notebooks", v) for v in (1, 2, 3, 4)}
        assert rows == expected
        assert len(STEPS["notebooks"]) == 4
        a.state.ping()


def test_what_one_replica_commits_the_other_reads(tmp_path, state_url):
    with two_replicas(tmp_path, state_url) as (a, b):
        art = a.store.put_frame("alice", FRAME, lineage={"tool": "t"})
        assert b.store.read_frame("alice", art.ref).equals(FRAME)
        assert [x.ref for x in b.store.list("alice")] == [art.ref]
        with pytest.raises(NotFound):
            b.store.get("bob", art.ref)  # a foreign ref is a missing one, on every replica
        handle = a.transcripts.default("alice")
        assert b.transcripts.default("alice") == handle
        a.transcripts.append(
            "alice", handle, new_code_cell("", metadata={"dataref": {"tool": "x", "ref": "r"}})
        )
        b.transcripts.append(
            "alice", handle, new_code_cell("", metadata={"dataref": {"tool": "y", "ref": "r"}})
        )
        tools = [
            c.metadata["dataref"].get("tool") for c in a.transcripts.read("alice", handle).cells
        ]
        # b has other kernels than a: a note says the variables were cleared there
        assert tools == [None, None, "x", "restart", "y"]
        link = a.downloads.publish(
            "alice", name="e.csv", media_type="text/csv", filename="e.csv", ttl=60,
            write=lambda p: p.write_text("x\n1\n"),
        )  # fmt: skip
        found = b.downloads.lookup(link.token, "alice")
        assert b.downloads.file_of(found).read_text() == "x\n1\n"
        with pytest.raises(NotFound):
            b.downloads.lookup(link.token, "bob")
        dropped = b.store.drop("alice", art.ref)
        assert dropped.ref == art.ref
        with pytest.raises(NotFound):
            a.store.get("alice", art.ref)


# -- across processes ----------------------------------------------------------------------


def _put_one(state_dir: str, url: str | None, blobs: str | None, quota: int, queue) -> None:
    replica = Replica(settings_for(Path(state_dir), url, blobs, owner_quota_bytes=quota))
    try:
        replica.store.put_frame("alice", FRAME, lineage={})
        queue.put("stored")
    except LimitExceeded:
        queue.put("refused")
    finally:
        replica.close()


def _processes(target, args_list):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, queue)) for args in args_list]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def test_a_page_session_and_what_a_call_showed_are_seen_by_every_replica(tmp_path, state_url):
    from dataref.shown import Shown
    from dataref.web.sessions import Sessions

    with two_replicas(tmp_path, state_url) as (a, b):
        on_a, on_b = Sessions(a.state.page_db, 60), Sessions(b.state.page_db, 60)
        cookie = on_a.create("alice")
        assert on_b.get(cookie).owner == "alice"  # signed in on one, known on the other
        on_b.end(cookie)
        assert on_a.get(cookie) is None  # signed out on one, out everywhere
        Shown(a.state.page_db).add("alice", "nb", "x = 1", {"ok": True, "result": 1})
        Shown(b.state.page_db).add("alice", "nb", "x", {"ok": True, "result": 2})
        seen = Shown(b.state.page_db).of_notebook("alice", "nb")
        assert [body["result"] for _, body in seen] == [1, 2]
        assert Shown(a.state.page_db).of_notebook("bob", "nb") == []


def test_the_owner_quota_holds_across_processes_writing_at_once(tmp_path, state_url):
    probe = Replica(settings_for(tmp_path / "probe", None))
    size = probe.store.put_frame("p", FRAME, lineage={}).bytes
    probe.close()
    blobs = (tmp_path / "shared").as_uri()
    args = [
        (str(tmp_path / (f"r{i}" if state_url else "one")), state_url, blobs, int(size * 3.5))
        for i in range(6)
    ]
    results = _processes(_put_one, args)
    assert sorted(results) == ["refused"] * 3 + ["stored"] * 3


def _append_many(state_dir: str, url: str | None, handle: str, who: str, queue) -> None:
    replica = Replica(settings_for(Path(state_dir), url, None))
    try:
        for i in range(15):
            rec = {"tool": "fetch_x", "ref": f"{who}-{i}"}
            replica.transcripts.append(
                "alice", handle, new_code_cell("", metadata={"dataref": rec})
            )
        queue.put("done")
    finally:
        replica.close()


def test_appends_from_several_processes_keep_every_cell_in_each_ones_order(tmp_path, state_url):
    main = Replica(settings_for(tmp_path / "main", state_url, None))
    handle = main.transcripts.default("alice")
    dirs = [str(tmp_path / ("main" if state_url is None else f"r{i}")) for i in range(4)]
    assert _processes(_append_many, [(d, state_url, handle, f"w{i}") for i, d in enumerate(dirs)])
    cells = main.transcripts.read("alice", handle).cells
    refs = [c.metadata["dataref"]["ref"] for c in cells if c.metadata["dataref"].get("ref")]
    assert len(refs) == 60
    for i in range(4):
        mine = [r for r in refs if r.startswith(f"w{i}-")]
        assert mine == [f"w{i}-{n}" for n in range(15)]
    main.close()


def _hold_lock_then_die(state_dir: str, url: str | None, queue) -> None:
    import asyncio

    replica = Replica(settings_for(Path(state_dir), url, None))

    async def hold() -> None:
        async with replica.state.notebook_locks.hold("notebook:nb_x"):
            assert replica.state.leadership.is_leader()
            queue.put("holding")
            await asyncio.sleep(600)

    asyncio.run(hold())


async def test_a_lock_admits_one_holder_and_dies_with_a_killed_holder(tmp_path, state_url):
    import asyncio

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_hold_lock_then_die, args=(str(tmp_path / "a"), state_url, queue))
    child.start()
    assert await asyncio.to_thread(queue.get, True, 120) == "holding"
    other = Replica(settings_for(tmp_path / ("a" if state_url is None else "b"), state_url, None))
    try:
        locks = other.state.notebook_locks
        assert locks.locks.try_acquire("notebook:nb_x") is None  # held by the child
        assert not other.state.leadership.is_leader()  # the child leads
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        started = time.monotonic()
        async with locks.hold("notebook:nb_x"):
            waited = time.monotonic() - started
        assert waited < 10
        assert other.state.leadership.is_leader()  # took over from the dead leader
    finally:
        other.close()


async def test_calls_on_one_notebook_wait_their_turn_in_one_process(tmp_path, state_url):
    import asyncio

    replica = Replica(settings_for(tmp_path / "a", state_url, None))
    order: list[str] = []

    async def call(name: str) -> None:
        async with replica.state.notebook_locks.hold("notebook:nb_y"):
            order.append(f"{name}+")
            await asyncio.sleep(0.05)
            order.append(f"{name}-")

    try:
        await asyncio.gather(*(call(n) for n in "abcd"))
        assert order == ["a+", "a-", "b+", "b-", "c+", "c-", "d+", "d-"]
    finally:
        replica.close()


def test_the_default_notebook_is_made_once_when_replicas_race(tmp_path, state_url):
    from concurrent.futures import ThreadPoolExecutor

    replicas = [
        Replica(settings_for(tmp_path / ("one" if state_url is None else f"r{i}"), state_url, None))
        for i in range(4)
    ]
    try:
        with ThreadPoolExecutor(8) as pool:
            handles = list(pool.map(lambda r: r.transcripts.default("carol"), replicas * 2))
        assert len(set(handles)) == 1
    finally:
        for r in replicas:
            r.close()


def test_shared_blobs_orphans_go_only_after_their_grace(tmp_path, pg_url):
    with two_replicas(tmp_path, pg_url) as (a, b):
        orphan = a.store.blob_store.root / "data_orphan.arrow"
        orphan.write_bytes(b"a write another replica has not committed yet")
        a.store.sweep()
        assert orphan.exists()  # young: may be a commit in flight elsewhere
        old = time.time() - 7200
        os.utime(orphan, (old, old))
        live = a.store.put_frame("alice", FRAME, lineage={})
        os.utime(a.store.blob_store.root / live.file, (old, old))
        b.store.sweep()
        assert not orphan.exists()
        assert a.store.read_frame("alice", live.ref).equals(FRAME)


def test_the_kernel_map_gives_a_notebook_to_one_kernel_when_replicas_race(tmp_path, state_url):
    from concurrent.futures import ThreadPoolExecutor

    from dataref.state.kernel_map import KernelMap

    with two_replicas(tmp_path, state_url) as (a, b):
        handle = a.transcripts.new("alice")
        maps = [KernelMap(a.state.notebooks_db), KernelMap(b.state.notebooks_db)]
        assert maps[0].get(handle) is None  # no shared kernel until one is claimed
        for i in range(8):
            maps[i % 2].add_spare(f"k{i}", holder=f"replica{i % 2}")
        with ThreadPoolExecutor(8) as pool:
            won = list(pool.map(lambda i: maps[i % 2].claim(handle, f"k{i}"), range(8)))
        assert len(set(won)) == 1  # every claimant was told the one winner
        winner = won[0]
        assert maps[1].get(handle).kernel == winner
        assert maps[0].replace(handle, "k-other", "k-new") is False  # a stale replace
        assert maps[0].replace(handle, winner, "k-renewed")
        maps[1].forget("k-other")  # a stale forget changes nothing
        assert maps[0].get(handle).kernel == "k-renewed"
        assert maps[1].reset(handle) == "k-renewed"
        assert maps[0].get(handle) is None
        assert maps[0].claim(handle, "k-new") == "k-new"


def test_spares_of_a_replica_without_heartbeat_are_orphans(tmp_path, state_url):
    from dataref.state.kernel_map import KernelMap

    with two_replicas(tmp_path, state_url) as (a, b):
        kernel_map = KernelMap(a.state.notebooks_db)
        kernel_map.heartbeat("alive")
        kernel_map.add_spare("mine", holder="alive")
        kernel_map.add_spare("theirs", holder="dead")
        assert kernel_map.orphans() == ["theirs"]
        assert KernelMap(b.state.notebooks_db).leave("other") is True  # "alive" still is
        assert kernel_map.leave("alive") is False  # the last one
