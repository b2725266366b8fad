"""The exposure ledger against what real MCP clients received: totals, lineage, no values,
budgets, audit events, and SIGKILL."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import time
from collections import Counter, defaultdict
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from dataref.app import create_app
from dataref.ledger import NO_SOURCE, Entry, Query, Sizes, SQLiteLedger
from dataref.walkthrough import Session, article

from .conftest import DATAREF, child_env, make_settings
from .raw_stdio import RawStdioServer

ENVELOPE_META = "io.modelcontextprotocol/serverInfo"
MARK = "QZX"  # every planted value carries it: the ledger file must never contain it
NEVER_ISSUED = "data_AAAAAAAAAAAAAAAAAAAAAA"


def received_bytes(result: Any) -> int:
    """Client side: the tool's reply as received, less the protocol's per-result envelope."""
    meta = {k: v for k, v in (result.meta or {}).items() if k != ENVELOPE_META}
    bare = result.model_copy(update={"meta": meta or None})
    dumped = bare.model_dump_json(by_alias=True, exclude_none=True, exclude={"result_type"})
    return len(dumped.encode())


def sample_rows(result: Any) -> int:
    body = result.structured_content or {}
    rows = len(body.get("sample", [])) if "dataRef" in body else 0
    return rows + sum(len(d.get("sample", [])) for d in (body.get("outputs") or {}).values())


class Measured:
    """A fastmcp Client that remembers every reply's size and the sources it expects."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.sources: list[set[str]] = []
        self.bytes: list[int] = []
        self.samples: list[int] = []
        self.replies: list[Any] = []
        self.next_sources: set[str] | None = None

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], raise_on_error: bool = False
    ) -> Any:
        result = await self.client.call_tool_mcp(tool, arguments)
        self.replies.append(result)
        self.bytes.append(received_bytes(result))
        self.samples.append(sample_rows(result))
        self.sources.append(self.next_sources if self.next_sources is not None else set())
        return result

    async def expect(self, sources: set[str], tool: str, arguments: dict[str, Any]) -> Any:
        self.next_sources = sources
        try:
            return await self.call_tool(tool, arguments)
        finally:
            self.next_sources = None

    async def read(self, sources: set[str], uri: str) -> Any:
        """A resource read: the host may hand its contents to the model too."""
        result = await self.client.read_resource_mcp(uri)
        self.replies.append(result)
        self.bytes.append(received_bytes(result))
        self.samples.append(len(json.loads(result.contents[0].text).get("sample", [])) if
                            uri.startswith("dataref://artifacts/") else 0)  # fmt: skip
        self.sources.append(sources)
        return result

    def per_source(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for size, sources in zip(self.bytes, self.sources, strict=True):
            for source in sources or {NO_SOURCE}:
                totals[source] += size
        return dict(totals)


def make_hr(path: Path) -> Path:
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE staff (name TEXT, email TEXT, dept TEXT, salary REAL)")
        conn.executemany(
            "INSERT INTO staff VALUES (?, ?, ?, ?)",
            [
                (f"{MARK}name{i:03d}", f"{MARK}mail{i:03d}@corp", f"{MARK}dept{i % 4}", 50000 + i)
                for i in range(200)
            ],
        )
    return path


def ledger_bytes(state: Path) -> bytes:
    root = state / "ledger"
    return b"".join(p.read_bytes() for p in sorted(root.iterdir()) if p.is_file())


def sample_strings(replies: list[Any]) -> set[str]:
    """Every string value of every sample row the client received."""
    found: set[str] = set()

    def walk(desc: dict[str, Any]) -> None:
        for row in desc.get("sample", []):
            found.update(v for v in row.values() if isinstance(v, str) and len(v) >= 4)

    for r in replies:
        body = getattr(r, "structured_content", None) or {}
        if not hasattr(r, "structured_content"):  # a resource read
            body = json.loads(r.contents[0].text) if getattr(r.contents[0], "text", None) else {}
        if "dataRef" in body:
            walk(body)
        for desc in (body.get("outputs") or {}).values():
            walk(desc)
    return found


JOIN_CODE = f"""\
by_dept = staff.groupby("dept").salary.mean().reset_index()
by_dept["top_line"] = qoq.sort_values("delta").line.iloc[0]
outputs["joined"] = by_dept
print("{MARK}stdout", len(by_dept))
result = {{"depts": len(by_dept), "first": by_dept.dept.iloc[0]}}
"""


async def test_the_ledger_totals_equal_the_bytes_the_client_received_per_source(tmp_path):
    """The article's session, a sensitive source, a chained analysis over both, failing calls,
    kernel state carrying a source, and a reset: per source, the ledger's bytes equal the sum
    the client received; the ledger file holds none of the values the client saw."""
    hr = make_hr(tmp_path / "hr.sqlite")
    state = tmp_path / "state"
    settings = make_settings(state, sources={"hr": {"path": str(hr), "sensitive": True}})
    async with Client(create_app(settings, "memory")) as client:
        m = Measured(client)
        m.next_sources = {"demo"}
        done = await article(Session(m, echo=False))  # type: ignore[arg-type]
        m.sources[-1] = set()  # export_notebook: no data of a source
        qoq_ref = m.replies[1].structured_content["outputs"]["qoq"]["dataRef"]
        sales_ref = m.replies[0].structured_content["dataRef"]
        await m.read({"demo"}, f"dataref://artifacts/{sales_ref}")
        await m.read({"demo"}, f"dataref://charts/{done['chart'].structured_content['chartRef']}")
        staff = await m.expect(
            {"hr"}, "fetch_sql", {"source": "hr", "query": "SELECT * FROM staff"}
        )
        assert not staff.structured_content.get("sample")  # sensitive: no sample rows
        inputs = {"staff": staff.structured_content["dataRef"], "qoq": qoq_ref}
        joined = await m.expect({"hr", "demo"}, "run_python", {"code": JOIN_CODE, "inputs": inputs})
        joined_ref = joined.structured_content["outputs"]["joined"]["dataRef"]
        # lineage: a fresh notebook, only the joined artifact, still counts against both
        chained = await m.expect(
            {"hr", "demo"}, "run_python",
            {"code": "result = len(j)", "inputs": {"j": joined_ref}, "notebook": "new"},
        )  # fmt: skip
        assert chained.structured_content["result"] == 4
        # kernel state: no inputs, but the default notebook's variables hold both sources
        failed = await m.expect(
            {"hr", "demo"}, "run_python", {"code": f"raise ValueError('{MARK}err' + staff.name[0])"}
        )
        assert failed.structured_content["ok"] is False
        bad_sql = await m.expect(
            {"hr"}, "fetch_sql", {"source": "hr", "query": "SELECT nope FROM staff"}
        )
        assert bad_sql.is_error
        missing = await m.expect(set(), "describe_data", {"dataRef": NEVER_ISSUED})
        assert missing.is_error
        await m.expect({"hr", "demo"}, "export_data", {"dataRef": joined_ref})
        await m.expect({"hr", "demo"}, "describe_data", {"dataRef": joined_ref})
        await m.expect(set(), "reset_kernel", {})
        await m.expect(set(), "run_python", {"code": "result = 1"})  # the reset cleared it
        await m.expect(set(), "list_artifacts", {})
        assert done["notebook"]

    ledger = SQLiteLedger(state / "ledger", read_only=True)
    try:
        rows = ledger.totals(Query())
    finally:
        ledger.close()
    got: dict[str, int] = defaultdict(int)
    calls: Counter[str] = Counter()
    samples: dict[str, int] = defaultdict(int)
    for (source, _owner), t in rows.items():
        got[source] += t.sizes["bytes"]
        calls[source] += t.calls
        samples[source] += t.sizes["sample_rows"]
    assert dict(got) == m.per_source()
    assert calls == Counter(s for srcs in m.sources for s in (srcs or {NO_SOURCE}))
    demo_samples = sum(n for n, s in zip(m.samples, m.sources, strict=True) if "demo" in s)
    assert samples["demo"] == demo_samples > 0
    assert samples["hr"] == 0  # sensitive: descriptions carry no sample
    exports = sum(t.exports for (src, _), t in rows.items() if src == "hr")
    charts = sum(t.sizes["image_count"] for (src, _), t in rows.items() if src == "demo")
    assert exports == 1 and charts >= 1

    stored = ledger_bytes(state)
    values = sample_strings(m.replies) | {f"{MARK}stdout", f"{MARK}err", f"{MARK}name", MARK}
    result_value = joined.structured_content["result"]["first"]
    values.add(result_value)
    leaked = sorted(v for v in values if v.encode() in stored)
    assert leaked == [], f"values of the data in the ledger file: {leaked[:5]}"
    assert len(values) > 5


async def test_a_spent_budget_refuses_cleanly_and_the_check_exits_non_zero(tmp_path):
    state = tmp_path / "state"
    settings = make_settings(state, demo={"model_bytes_per_day": 1500}, kernels={"warm_spares": 0})
    async with Client(create_app(settings, "memory", kernels=False)) as client:
        first = await client.call_tool_mcp(
            "fetch_sales", {"since": "2025-06-01", "region": "North"}
        )
        assert not first.is_error
        ref = first.structured_content["dataRef"]
        second = await client.call_tool_mcp("fetch_sales", {"since": "2025-01-01"})
        if not second.is_error:  # the first reply alone may not have spent 1500 bytes
            second = await client.call_tool_mcp("fetch_sales", {"since": "2025-01-01"})
        assert second.is_error
        text = second.content[0].text
        assert "budget of source 'demo' is spent" in text
        assert "resets at" in text and "[demo] model_bytes_per_day" in text
        # by lineage too: describing the artifact would send the source's data
        described = await client.call_tool_mcp("describe_data", {"dataRef": ref})
        assert described.is_error and "budget" in described.content[0].text
        # a file for a person is still allowed; so are listings
        exported = await client.call_tool_mcp("export_data", {"dataRef": ref})
        assert not exported.is_error, exported.content[0].text
        assert not (await client.call_tool_mcp("list_artifacts", {})).is_error

    env = child_env(state, DATAREF_DEMO__MODEL_BYTES_PER_DAY="1500")
    check = subprocess.run(
        [DATAREF, "exposure", "--check", "--json"], env=env, capture_output=True, text=True
    )
    assert check.returncode == 1, check.stderr
    spent = json.loads(check.stdout)["budgets_spent"]
    assert spent[0]["source"] == "demo" and spent[0]["spent"] >= 1500
    relaxed = child_env(state, DATAREF_DEMO__MODEL_BYTES_PER_DAY="100000000")
    ok = subprocess.run([DATAREF, "exposure", "--check"], env=relaxed, capture_output=True)
    assert ok.returncode == 0
    ledger = SQLiteLedger(state / "ledger", read_only=True)
    try:
        events = ledger.audit_events()
    finally:
        ledger.close()
    refused = [e for e in events if e["event"] == "refused"]
    assert {e["kind"] for e in refused} == {"budget"} and len(refused) >= 2


def test_the_exposure_command_filters_and_prints_a_table(tmp_path):
    state = tmp_path / "state"
    ledger = SQLiteLedger(state / "ledger")
    now = time.time()
    try:
        for owner, source, size in [("ann", "demo", 100), ("ann", "hr", 40), ("bob", "demo", 7)]:
            ledger.append(Entry(now, owner, "fetch_sql", Sizes(bytes=size, sample_rows=2),
                                sources=(source,)))  # fmt: skip
        ledger.append(
            Entry(now - 86400 * 10, "ann", "fetch_sql", Sizes(bytes=1), sources=("demo",))
        )
    finally:
        ledger.close()
    env = child_env(state)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DATAREF, "exposure", *args], env=env, capture_output=True, text=True)

    rows = json.loads(run("--json").stdout)["rows"]
    assert {(r["source"], r["owner"], r["bytes"]) for r in rows} == {
        ("demo", "ann", 101), ("hr", "ann", 40), ("demo", "bob", 7)
    }  # fmt: skip
    since = time.strftime("%Y-%m-%d", time.gmtime(now - 86400))
    rows = json.loads(run("--json", "--owner", "ann", "--source", "demo", "--since", since).stdout)
    assert [(r["calls"], r["bytes"], r["sample_rows"]) for r in rows["rows"]] == [(1, 100, 2)]
    table = run("--owner", "bob")
    assert table.returncode == 0 and "bob" in table.stdout and "ann" not in table.stdout
    assert run("--since", "yesterday").returncode == 2


def test_the_ledger_refuses_updates_and_deletes(tmp_path):
    ledger = SQLiteLedger(tmp_path)
    ledger.append(Entry(time.time(), "ann", "fetch_sales", Sizes(bytes=10), sources=("demo",)))
    ledger.audit(time.time(), "refused", "ann", {"kind": "budget"})
    ledger.close()
    with closing(sqlite3.connect(tmp_path / "ledger.sqlite")) as db:
        for sql in ("UPDATE replies SET bytes = 0", "DELETE FROM replies",
                    "DELETE FROM reply_sources", "UPDATE audit SET event = 'x'"):  # fmt: skip
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                db.execute(sql)


async def test_refusals_by_grant_and_foreign_refs_are_audit_events(tmp_path):
    state = tmp_path / "state"
    grants = {"grants": {"bob": ["North"]}}
    alice = make_settings(state, owner="alice", demo=grants)
    async with Client(create_app(alice, "memory", kernels=False)) as client:
        ref = (
            await client.call_tool_mcp("fetch_sales", {"since": "2025-01-01"})
        ).structured_content["dataRef"]
    bob = make_settings(state, owner="bob", demo=grants)
    async with Client(create_app(bob, "memory", kernels=False)) as client:
        denied = await client.call_tool_mcp(
            "fetch_sales", {"since": "2025-01-01", "region": "South"}
        )
        foreign = await client.call_tool_mcp("describe_data", {"dataRef": ref})
        missing = await client.call_tool_mcp("describe_data", {"dataRef": NEVER_ISSUED})
    assert denied.is_error and foreign.is_error and missing.is_error
    # the client cannot tell a foreign ref from a missing one; the audit trail can
    assert foreign.content[0].text.replace(ref, "X") == missing.content[0].text.replace(
        NEVER_ISSUED, "X"
    )
    ledger = SQLiteLedger(state / "ledger", read_only=True)
    try:
        events = [e for e in ledger.audit_events() if e["event"] == "refused"]
        totals = ledger.totals(Query(owner="bob"))
    finally:
        ledger.close()
    assert [(e["owner"], e["tool"], e["kind"]) for e in events] == [
        ("bob", "fetch_sales", "access"),
        ("bob", "describe_data", "access"),
    ]
    assert all(e["request_id"] for e in events)
    assert sum(t.refused for t in totals.values()) == 2
    # alice's artifact read by bob is attributed nothing of alice's: bob's rows have no source
    assert set(src for src, _ in totals) == {NO_SOURCE}


# -- SIGKILL: every acknowledged reply is in the ledger ----------------------------------

KILL_ROUNDS = 4


class RawReplies(RawStdioServer):
    """Keeps each reply's raw line: the bytes the client really received."""

    def __init__(self, state_dir: Path, **env: str) -> None:
        self.raw: dict[int, bytes] = {}
        super().__init__(state_dir, **env)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and isinstance(msg.get("id"), int):
                with self._cond:
                    self.raw[msg["id"]] = line
                    self._replies[msg["id"]] = msg
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()


def result_bytes(line: bytes) -> int:
    """The bytes of the JSON-RPC ``result`` value as it came over the pipe."""
    start = line.index(b'"result":') + len(b'"result":')
    body = line.rstrip(b"\r\n")
    assert body.endswith(b"}")
    return len(body[start:-1])


def workload(rng: random.Random, refs: list[str]) -> tuple[str, dict[str, Any]]:
    pick = rng.random()
    if refs and pick < 0.4:
        return "describe_data", {"dataRef": rng.choice(refs)}
    if pick < 0.8:
        day = rng.randint(1, 28)
        month = rng.randint(1, 12)
        return "fetch_sales", {"since": f"2025-{month:02d}-{day:02d}", "region": "North"}
    return "list_artifacts", {}


def test_every_reply_a_client_received_before_a_sigkill_is_in_the_ledger(tmp_path):
    state = tmp_path / "state"
    rng = random.Random()
    acked: Counter[tuple[str, int]] = Counter()  # (tool, bytes received)
    refs: list[str] = []
    for _ in range(KILL_ROUNDS):
        server = RawReplies(state)
        pending: dict[int, str] = {}
        before = sum(acked.values())
        try:
            kill_at = time.monotonic() + 120
            while time.monotonic() < kill_at:
                while len(pending) < 3:
                    tool, arguments = workload(rng, refs)
                    pending[server.send_call(tool, arguments)] = tool
                time.sleep(0.005)
                harvest(server, pending, acked, refs)
                if sum(acked.values()) >= before + 2 and kill_at > time.monotonic() + 2:
                    kill_at = time.monotonic() + rng.uniform(0, 0.8)  # then kill mid-flight
        finally:
            server.kill()
        harvest(server, pending, acked, refs)
    with closing(
        sqlite3.connect(f"file:{state / 'ledger' / 'ledger.sqlite'}?mode=ro", uri=True)
    ) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        recorded = Counter(db.execute("SELECT tool, bytes FROM replies").fetchall())
    missing = acked - recorded
    assert not missing, f"acknowledged replies missing from the ledger: {missing}"
    assert sum(acked.values()) >= 2 * KILL_ROUNDS
    print(f"\n{KILL_ROUNDS} SIGKILLs, {sum(acked.values())} acknowledged replies all recorded")


def harvest(server: RawReplies, pending: dict[int, str], acked: Counter, refs: list[str]) -> None:
    for msg_id in list(pending):
        reply = server.reply(msg_id)
        if reply is None:
            continue
        tool = pending.pop(msg_id)
        acked[(tool, result_bytes(server.raw[msg_id]))] += 1
        body = reply.get("result", {}).get("structuredContent") or {}
        if tool == "fetch_sales" and "dataRef" in body:
            refs.append(body["dataRef"])
