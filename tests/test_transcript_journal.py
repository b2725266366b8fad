"""The journal behind every transcript, on the state seam: one insert per call, the notebook's
document materialised from it (on export, at shutdown, after a crash), notebooks stored as
documents taken in, and no acknowledged cell lost to SIGKILL."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from dataref.notebook_export import export_notebook
from dataref.transcript import Transcripts, record_run_python
from tests.state_support import Replica, settings_for

from .faults import notebook_problems, notebook_text
from .raw_stdio import RawStdioServer

OWNER = "alice"
OK = {"ok": True, "result": 1, "error": None, "outputs": {}}


@pytest.fixture(params=["sqlite", "postgresql"])
def state_url(request) -> str | None:
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else None


def first_lines(nb) -> list[str]:
    return [c.source.split("\n")[0] for c in nb.cells[2:]]  # after intro and setup


def run(t: Transcripts, handle: str, code: str) -> None:
    record_run_python(t, OWNER, handle, code=code, inputs={}, response=OK, elapsed_s=0.01)


def journal_rows(root: Path) -> int:
    with sqlite3.connect(root / "notebooks.sqlite") as db:
        return db.execute("SELECT count(*) FROM cells").fetchone()[0]


def test_a_call_is_one_insert_into_the_journal_and_no_document_rewrite(tmp_path):
    t = Transcripts(tmp_path / "nb")
    h = t.default(OWNER)
    run(t, h, "result = 'warm'")  # the first call records this process's kernel
    path = tmp_path / "nb" / f"{h}.ipynb"
    statements: list[str] = []
    t._db._db.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    for i in range(5):
        run(t, h, f"result = {i}")
    t._db._db.set_trace_callback(None)  # type: ignore[attr-defined]
    writes = [s for s in statements if s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]
    assert len(writes) == 5 and all(s.startswith("INSERT INTO cells") for s in writes)
    assert not path.exists()  # nothing but the journal was written
    assert journal_rows(tmp_path / "nb") == 2 + 6  # intro, setup, one cell per call
    assert first_lines(t.read(OWNER, h))[1:] == [f"result = {i}" for i in range(5)]
    t.close()  # shutdown materialises
    on_disk = nbformat.read(path, as_version=4)
    nbformat.validate(on_disk)
    assert first_lines(on_disk)[1:] == [f"result = {i}" for i in range(5)]


def test_export_materialises_the_notebook_document_from_the_journal(tmp_path):
    t = Transcripts(tmp_path / "nb")
    h = t.default(OWNER)
    run(t, h, "result = 'first'")
    t.materialise(OWNER, h)
    path = t.journal.path(h)
    run(t, h, "result = 'second'")
    assert "second" not in path.read_text()  # the document lags until materialised
    assert "second" in t.read(OWNER, h).cells[-1].source  # reads always see the journal
    exported = export_notebook(t, OWNER, h)
    assert "second" in exported.cells[-1].source
    assert "second" in path.read_text()  # the export brought the document up to date
    assert t.journal.behind() == []
    t.close()


def test_reading_a_growing_notebook_builds_only_the_new_cells(tmp_path):
    t = Transcripts(tmp_path / "nb")
    h = t.default(OWNER)
    run(t, h, "x = 1\nresult = x")
    first = t.read(OWNER, h)
    run(t, h, "result = x + 1")
    second = t.read(OWNER, h)
    assert [c.id for c in second.cells[: len(first.cells)]] == [c.id for c in first.cells]
    assert len(second.cells) == len(first.cells) + 1
    t.close()


def test_another_process_appends_are_read_at_once(tmp_path, state_url):
    a = Replica(settings_for(tmp_path / "a", state_url, None))
    b_dir = tmp_path / ("a" if state_url is None else "b")
    b = Replica(settings_for(b_dir, state_url, None))
    h = a.transcripts.default(OWNER)
    assert len(a.transcripts.read(OWNER, h).cells) == 2  # cached by the reader
    run(b.transcripts, h, "result = 'from b'")
    assert first_lines(a.transcripts.read(OWNER, h))[-1] == "result = 'from b'"
    a.close()
    b.close()


def test_a_notebook_stored_as_a_document_is_taken_into_the_journal(tmp_path, state_url):
    replica = Replica(settings_for(tmp_path / "a", state_url, None))
    t = replica.transcripts
    h = t.default(OWNER)
    run(t, h, "result = 'from the old document'")
    t.materialise(OWNER, h)
    with replica.state.notebooks_db.tx(write=True) as cur:  # as the document-only version left it
        cur.execute("DELETE FROM cells")
        cur.execute("UPDATE notebooks SET materialised = 0")
    replica.close()
    replica = Replica(settings_for(tmp_path / "a", state_url, None))  # a new server process
    t = replica.transcripts
    with replica.state.notebooks_db.tx() as cur:
        assert cur.execute("SELECT count(*) FROM cells").fetchone()[0] == 3
    assert t.journal.take_in() == 0  # once only
    run(t, h, "result = 'after the upgrade'")
    lines = first_lines(t.read(OWNER, h))
    assert lines[0] == "result = 'from the old document'" and lines[-1].endswith("upgrade'")
    assert "server restarted" in lines[-2]
    assert len(t.read(OWNER, h).cells) == 5
    replica.close()


def test_a_start_after_a_crash_writes_the_documents_that_fell_behind(tmp_path, state_url):
    replica = Replica(settings_for(tmp_path / "a", state_url, None))
    h = replica.transcripts.default(OWNER)
    run(replica.transcripts, h, "result = 'before the crash'")
    replica.close()  # no Transcripts.close: as a killed server leaves it
    replica = Replica(settings_for(tmp_path / "a", state_url, None))
    assert replica.transcripts.journal.behind() == []
    with replica.state.notebooks_db.tx() as cur:
        doc = cur.execute("SELECT doc FROM notebooks WHERE handle = ?", (h,)).fetchone()[0]
    if state_url is None:
        doc = replica.transcripts.journal.path(h).read_text()
    stored = nbformat.reads(doc, as_version=4)
    nbformat.validate(stored)
    assert first_lines(stored) == ["result = 'before the crash'"]
    replica.close()


APPENDER = """
import sys
from pathlib import Path
from dataref.transcript import Transcripts, record_run_python
t = Transcripts(Path(sys.argv[1]))
h = t.default("alice")
print(h, flush=True)
ok = {"ok": True, "result": 1, "error": None, "outputs": {}}
i = 0
while True:
    code = f"result = '{sys.argv[2]}-{i}'"
    record_run_python(t, "alice", h, code=code, inputs={}, response=ok, elapsed_s=0)
    print(code, flush=True)  # acknowledged: the append returned
    i += 1
"""


def test_sigkill_mid_append_loses_no_acknowledged_cell(tmp_path):
    root = tmp_path / "nb"
    acked: list[str] = []
    handle = None
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(root), str(round_)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        handle = proc.stdout.readline().strip()
        deadline = time.monotonic() + random.uniform(0.3, 0.8)
        while time.monotonic() < deadline:
            line = proc.stdout.readline().strip()
            if line.startswith("result = "):
                acked.append(line)
        proc.kill()  # SIGKILL, wherever the appender is: often inside an append
        proc.wait()
    assert len(acked) >= 3
    t = Transcripts(root)  # a start after a crash materialises the documents that fell behind
    text = (root / f"{handle}.ipynb").read_text()
    nbformat.validate(nbformat.reads(text, as_version=4))
    on_disk = {c["source"] for c in json.loads(text)["cells"]}
    read = {c.source for c in t.read(OWNER, handle).cells}
    assert on_disk == read
    lines = set(first_lines(t.read(OWNER, handle)))
    missing = [code for code in acked if code not in lines]
    assert missing == [], f"acknowledged then lost: {missing[:5]}"
    assert sum("server restarted" in s for s in read) >= 1  # each restart is noted
    t.close()


def test_sigkill_during_run_python_calls_loses_no_acknowledged_cell(tmp_path: Path) -> None:
    """The real server, its kernel and the per-call path: every call a reply came back for
    is in the notebook after the restart."""
    state = tmp_path / "state"
    acked: set[str] = set()
    handle: str | None = None
    for _round in range(2):
        server = RawStdioServer(state)
        try:
            if handle is None:
                first = server.call("run_python", {"code": "result = 'warm'"}, timeout=120)
                handle = first["structuredContent"]["notebook"]
            pending: dict[int, str] = {}
            kill_at = time.monotonic() + random.uniform(0.5, 1.5)
            n = 0
            while time.monotonic() < kill_at:
                while len(pending) < 3:
                    token = f"t{_round}_{n}"
                    n += 1
                    args = {"code": f"result = {token!r}", "notebook": handle}
                    pending[server.send_call("run_python", args)] = token
                for msg_id, token in list(pending.items()):
                    reply = server.reply(msg_id)
                    if reply is not None:
                        del pending[msg_id]
                        assert reply["result"]["structuredContent"]["result"] == token
                        acked.add(token)
                time.sleep(0.002)
        finally:
            server.kill()
    server = RawStdioServer(state)
    try:
        assert notebook_problems(state) == []
        text = notebook_text(state)  # materialised by the start after the crash
        missing = sorted(t for t in acked if repr(t) not in text)
        assert missing == [], f"acknowledged then lost: {missing[:5]}"
        exported = server.call("export_notebook", {"notebook": handle})
        assert exported["structuredContent"]["cells"] >= len(acked)
    finally:
        server.stop()
    assert len(acked) >= 3


async def test_a_server_shutdown_materialises_its_notebooks(tmp_path):
    from dataref.workspace import Workspace

    ws = Workspace(settings_for(tmp_path / "state", None))
    h = ws.transcripts.default(OWNER)
    run(ws.transcripts, h, "result = 'before the shutdown'")
    path = ws.transcripts.journal.path(h)
    assert not path.exists()
    await ws.close()
    assert first_lines(nbformat.read(path, as_version=4)) == ["result = 'before the shutdown'"]
