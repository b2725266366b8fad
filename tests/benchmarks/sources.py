"""SQL sources: fetch_sql of 1M rows x 10 columns into an artifact, against the same query
fetched in-process to Arrow with the same ADBC driver, for PostgreSQL and SQLite.

The server's memory during each fetch is the peak of the summed RSS of the server and its
children (the SQLite worker included) above what they held just before the call, sampled
every 5 ms; it is compared with the Arrow size of the result.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import adbc_driver_postgresql.dbapi as adbc_pg
import adbc_driver_sqlite.dbapi as adbc_sqlite

from tests.pg_server import running_server

from .clients import VENV_BIN, ServerSpec, dataref_env, stdio_server

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024

ROWS = 1_000_000
REPS = 3
QUERY = "SELECT * FROM wide"
WIDE = f"""
CREATE TABLE wide AS
SELECT g AS id, g % 1000 AS k, (g * 0.37)::float8 AS x, (g * 1.5)::float8 AS y,
       'item-' || (g % 5000) AS label, 'r' || (g % 7) AS region,
       date '2025-01-01' + (g % 365) AS day, timestamp '2025-01-01' + g * interval '1 second' AS at,
       (g % 2 = 0) AS flag, (g % 97)::bigint AS n
FROM generate_series(1, {ROWS}) g;
CREATE ROLE bench_login LOGIN NOINHERIT PASSWORD 'bench';
CREATE ROLE bench_reader NOLOGIN;
GRANT bench_reader TO bench_login;
GRANT SELECT ON wide TO bench_reader;
"""


def parent_of(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2 :].split()[1])  # the name may hold spaces and ')'


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0


class TreeRss:
    """Peak summed RSS of ``root`` and its descendants while the block runs.

    The sampler shares the 2 cores with the fetch it measures, so it must stay cheap: a
    sample lists /proc and reads the parent of new pids only (pids seen before keep their
    parent), then the RSS of the tree's pids (about 0.1 ms, where re-reading every pid's
    parent took about 3 ms of CPU per 5 ms sample and slowed the measured fetch).
    """

    def __init__(self, root: int, interval: float = 0.005) -> None:
        self.root, self.interval = root, interval
        self.peak = self.before = 0
        self._parents: dict[int, int | None] = {}
        self._stop = threading.Event()

    def tree(self) -> list[int]:
        pids = {int(e) for e in os.listdir("/proc") if e.isdigit()}
        for gone in self._parents.keys() - pids:
            del self._parents[gone]
        for new in pids - self._parents.keys():
            self._parents[new] = parent_of(new)
        children: dict[int, list[int]] = {}
        for pid, ppid in self._parents.items():
            children.setdefault(ppid or 0, []).append(pid)
        found, todo = [self.root], [self.root]
        while todo:
            kids = children.get(todo.pop(), [])
            found += kids
            todo += kids
        return found

    def total(self) -> int:
        return sum(rss_kib(p) for p in self.tree())

    def __enter__(self) -> TreeRss:
        self.before = self.peak = self.total()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.total())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.total())

    @property
    def growth_bytes(self) -> int:
        return (self.peak - self.before) * 1024


def in_process(connect: Any, target: str) -> tuple[float, int]:
    """Seconds and Arrow bytes of QUERY fetched whole into Arrow in this process."""
    started = time.perf_counter()
    with connect(target) as conn, conn.cursor() as cursor:
        cursor.execute(QUERY)
        table = cursor.fetch_arrow_table()
    return time.perf_counter() - started, table.nbytes


def build_sqlite(pg_conninfo: str, path: Path) -> None:
    with adbc_pg.connect(pg_conninfo) as conn, conn.cursor() as cursor:
        cursor.execute(QUERY)
        table = cursor.fetch_arrow_table()
    with adbc_sqlite.connect(str(path)) as conn, conn.cursor() as cursor:
        cursor.adbc_ingest("wide", table, mode="create")
        conn.commit()


async def sql_sources(work: Path, cache: Path, log: Any) -> dict[str, Any]:
    with running_server() as pg:
        log("sql sources: loading 1M x 10 into PostgreSQL and SQLite")
        pg.psql("CREATE DATABASE bench")
        pg.psql(WIDE, db="bench")
        lite = work / "wide.sqlite"
        await asyncio.to_thread(build_sqlite, pg.conninfo(db="bench"), lite)
        sources = {
            "pg": {"url": pg.url("bench_login", "bench"), "password_env": "BENCH_PG_PASSWORD",
                   "roles": {"*": "bench_reader"}, "timeout_seconds": 120},
            "lite": {"path": str(lite), "timeout_seconds": 120},
        }  # fmt: skip
        env = dataref_env(work / "state-sources", cache, plugins=False)
        env |= {"DATAREF_SOURCES": json.dumps(sources), "BENCH_PG_PASSWORD": "bench",
                "DATAREF_KERNELS__WARM_SPARES": "0", "DATAREF_DEMO__ENABLED": "false"}  # fmt: skip
        spec = ServerSpec("dataref", str(VENV_BIN / "dataref"), ["serve"], env, "dataref serve")
        baselines = {
            "pg": (adbc_pg.connect, pg.conninfo(db="bench")),
            "lite": (adbc_sqlite.connect, f"file:{lite}?mode=ro"),
        }
        out: dict[str, Any] = {}
        async with stdio_server(spec, work / "dataref-sources.log") as (meter, sampler):
            for name, (connect, target) in baselines.items():
                out[name] = await _measure(meter, sampler.root, name, connect, target, log)
        return out


async def _measure(meter: Any, root: int, name: str, connect: Any, target: str, log: Any):
    served, inproc, growth, arrow_bytes = [], [], [], 0
    await meter.call("fetch_sql", {"query": "SELECT 1 AS warm", "source": name})
    for rep in range(REPS):
        seconds, arrow_bytes = await asyncio.to_thread(in_process, connect, target)
        inproc.append(seconds)
        with TreeRss(root) as rss:
            record = await meter.call("fetch_sql", {"query": QUERY, "source": name})
        if not record.ok:
            raise RuntimeError(f"fetch_sql on {name} failed: {record.error}")
        served.append(record.seconds)
        growth.append(rss.growth_bytes)
        await meter.call("drop_artifact", {"dataRef": record.data["dataRef"]})
        log(f"sql sources: {name} rep {rep + 1}: served {record.seconds:.2f}s, in-process "
            f"{seconds:.2f}s, memory +{rss.growth_bytes / 2**20:.0f} MiB")  # fmt: skip
    return {
        "rows": ROWS, "served_s": served, "inproc_s": inproc,
        "memory_growth_bytes": growth, "arrow_bytes": arrow_bytes,
    }  # fmt: skip


if __name__ == "__main__":  # python -m tests.benchmarks.sources: this workload alone
    import sys
    import tempfile

    from .data import cache_dir

    def say(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="dataref-bench-") as tmp:
        print(json.dumps(asyncio.run(sql_sources(Path(tmp), cache_dir(), say)), indent=1))
