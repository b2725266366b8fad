"""Transcript cells, export and replay without a server or kernels: the pieces, one by one.

The end-to-end corpus (real MCP sessions, replayed with nbclient) is in test_transcript.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import nbformat
import numpy as np
import pandas as pd
import pytest

import dataref.replay as dr
from dataref import cli
from dataref.cells import assigned_names, plan_variables, py_literal
from dataref.errors import NotFound
from dataref.notebook_export import export_notebook, notebook_json
from dataref.store import ArtifactStore
from dataref.transcript import (
    Transcripts,
    record_chart,
    record_producer,
    record_reset,
    record_run_python,
)

OWNER = "alice"


@pytest.fixture
def transcripts(tmp_path):
    t = Transcripts(tmp_path / "notebooks")
    yield t
    t.close()


def ok(outputs: dict[str, str] | None = None, result=None) -> dict:
    described = {name: {"dataRef": ref, "rows": 1} for name, ref in (outputs or {}).items()}
    return {"ok": True, "result": result, "error": None, "outputs": described}


def fetch(t: Transcripts, handle: str, ref: str, **arguments) -> None:
    args = arguments or {"since": "2025-01-01"}
    record_producer(t, OWNER, handle, tool="fetch_sales", arguments=args, ref=ref, elapsed_s=0.1)


def run(t: Transcripts, handle: str, code: str, inputs: dict, response: dict | None = None):
    response = response or ok()
    record_run_python(t, OWNER, handle, code=code, inputs=inputs, response=response, elapsed_s=0.2)


def sources(t: Transcripts, handle: str) -> list[str]:
    return [c.source for c in t.read(OWNER, handle).cells[2:]]  # after intro and setup


ARTICLE = (
    'q = sales.assign(q=sales.date.dt.to_period("Q"))\n'
    'pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")\n'
    "delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()\n"
    'outputs["qoq"] = delta.rename("delta").reset_index()\n'
    "result = delta.head(5).round(2).to_dict()\n"
)


def test_the_articles_session_reads_like_the_article(transcripts):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S")
    run(transcripts, h, ARTICLE, {"sales": "data_S"}, ok({"qoq": "data_Q"}))
    record_chart(
        transcripts,
        OWNER,
        h,
        data_ref="data_Q",
        x="line",
        y="delta",
        kind="bar",
        title=None,
        chart_ref="chart_C",
    )
    fetch_cell, qoq_cell, chart_cell = sources(transcripts, h)
    assert fetch_cell == 'sales = dr.fetch_sales(since="2025-01-01")\nsales.shape'
    assert qoq_cell == ARTICLE + 'qoq = dr.output(outputs, "qoq")\ndr.show(result)'
    assert chart_cell == 'dr.chart(qoq, x="line", y="delta", kind="bar")'
    nb = transcripts.read(OWNER, h)
    nbformat.validate(nb)
    assert nb.cells[1].source.startswith("import dataref.replay as dr")


def test_an_input_the_agent_reassigns_is_bound_again_from_a_pristine_variable(transcripts):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S")
    run(transcripts, h, "sales = sales.dropna()\nresult = len(sales)", {"sales": "data_S"})
    run(transcripts, h, "result = len(sales)", {"sales": "data_S"})
    first, clean, again = sources(transcripts, h)
    assert first.startswith("sales_data = dr.fetch_sales(")
    assert clean.startswith("sales = sales_data.copy(deep=False)\nsales = sales.dropna()")
    assert again.startswith("sales = sales_data.copy(deep=False)\nresult = len(sales)")


def test_an_input_still_bound_to_its_dataref_is_kept_as_the_kernel_keeps_it(transcripts):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S")
    run(transcripts, h, 'df["m"] = df.date.dt.month', {"df": "data_S"})
    run(transcripts, h, "result = sorted(df.columns)", {"df": "data_S"})
    run(transcripts, h, "result = sorted(sales.columns)", {"sales": "data_S"})
    first, mutate, keep, other = sources(transcripts, h)
    assert first.startswith("sales_data = dr.fetch_sales(")  # two names: kept pristine
    assert mutate.startswith("df = sales_data.copy(deep=False)\n")
    assert keep.startswith("result = sorted(df.columns)")  # the same (changed) frame
    assert other.startswith("sales = sales_data.copy(deep=False)\n")  # a fresh one


def test_after_a_reset_inputs_are_bound_again_fresh(transcripts):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S")
    run(transcripts, h, 'sales["m"] = 1', {"sales": "data_S"})
    record_reset(transcripts, OWNER, h)
    run(transcripts, h, "result = sorted(sales.columns)", {"sales": "data_S"})
    cells = transcripts.read(OWNER, h).cells[2:]
    assert cells[2].cell_type == "markdown" and "reset" in cells[2].source
    assert cells[3].source.startswith("sales = sales_data.copy(deep=False)\n")


def test_a_failed_call_is_tagged_so_a_run_continues_and_its_outputs_stay_bound(transcripts):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S")
    failed = {
        "ok": False,
        "result": None,
        "error": "Cell In[2], line 2\nAttributeError: 'DataFrame' has no attribute 'Tent 06'",
        "outputs": {"part": {"dataRef": "data_P"}},
    }
    run(transcripts, h, 'outputs["part"] = sales.head()\nsales.revnue', {"sales": "data_S"}, failed)
    run(transcripts, h, "result = len(part)", {"part": "data_P"})
    cells = transcripts.read(OWNER, h).cells[2:]
    assert cells[1].metadata["tags"] == ["raises-exception"]
    assert cells[1].source.startswith("# In the session this call raised AttributeError.\n")
    assert "dr.show" not in cells[1].source
    assert cells[2].source == 'part = dr.output(outputs, "part")'
    assert cells[3].source == "result = len(part)\ndr.show(result)"
    assert "Tent 06" not in json.dumps(transcripts.read(OWNER, h))  # messages may hold data


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        ("the kernel died (crash, os._exit or out of memory) and was replaced", True),
        ("timed out - the kernel was interrupted; variables are kept", False),
    ],
)
def test_a_call_that_timed_out_or_killed_its_kernel_is_kept_as_text(transcripts, error, lost):
    h = transcripts.default(OWNER)
    response = {"ok": False, "result": None, "error": error, "outputs": {}}
    run(transcripts, h, "while True:\n    pass", {}, response)
    cell = transcripts.read(OWNER, h).cells[2]
    assert cell.cell_type == "markdown" and "```python\nwhile True:" in cell.source
    assert cell.metadata["dataref"].get("kernel_lost", False) is lost


def test_cell_metadata_keeps_the_call_refs_and_timing_but_no_data(transcripts):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S", since="2025-01-01", region="North")
    run(transcripts, h, "result = 1", {"sales": "data_S"}, ok(result={"x": 123.45}))
    producer, call = (c.metadata["dataref"] for c in transcripts.read(OWNER, h).cells[2:])
    assert set(producer) == {"tool", "arguments", "ref", "elapsed_s", "at"}
    assert producer["arguments"] == {"since": "2025-01-01", "region": "North"}
    assert set(call) == {"tool", "code", "inputs", "outputs", "status", "elapsed_s", "at"}
    assert "123.45" not in json.dumps(transcripts.read(OWNER, h))


def test_a_transcript_survives_a_restart_keeps_growing_and_notes_it(tmp_path):
    first = Transcripts(tmp_path / "nb")
    h = first.default(OWNER)
    fetch(first, h, "data_S")
    first.close()
    second = Transcripts(tmp_path / "nb")
    assert second.default(OWNER) == h
    run(second, h, "result = len(sales)", {"sales": "data_S"})
    run(second, h, "result = 2", {})
    cells = second.read(OWNER, h).cells
    assert [c.cell_type for c in cells[2:]] == ["code", "markdown", "code", "code"]
    assert "server restarted" in cells[3].source
    second.close()


def test_notebooks_of_other_owners_are_not_found(transcripts):
    h = transcripts.default(OWNER)
    with pytest.raises(NotFound, match="omit `notebook`"):
        transcripts.resolve("bob", h)
    with pytest.raises(NotFound):
        export_notebook(transcripts, "bob", h)


def test_the_export_drops_outputs_counts_and_attachments_even_if_the_journal_has_them(
    transcripts,
):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S")
    leaky = nbformat.v4.new_code_cell("print(1)", metadata={"scrolled": True}, execution_count=7)
    leaky.outputs.append(nbformat.v4.new_output("stream", name="stdout", text="Tent 06 1234.56"))
    note = nbformat.v4.new_markdown_cell("note", attachments={"x.png": {"image/png": "aGVsbG8="}})
    transcripts.append(OWNER, h, leaky, note)
    stored = transcripts.read(OWNER, h)
    assert "Tent 06" in json.dumps(stored)  # the planted leak really is in the record
    exported = export_notebook(transcripts, OWNER, h)
    nbformat.validate(exported)
    text = notebook_json(exported)
    assert "Tent 06" not in text and "attachments" not in text and "scrolled" not in text
    assert all(c.get("execution_count") is None for c in exported.cells)
    assert all(not c.get("outputs") for c in exported.cells)
    assert [c.id for c in exported.cells] == [c.id for c in stored.cells]


# -- names and literals ------------------------------------------------------------------


def test_arguments_are_written_as_python_literals():
    assert py_literal("it's") == '"it\'s"'
    assert py_literal('say "hi"\n') == '"say \\"hi\\"\\n"'
    assert py_literal({"a": [1, 2.5, None, True, "é"]}) == '{"a": [1, 2.5, None, True, "é"]}'
    assert eval(py_literal({"k": ["x\\y", -0.0, 10**20]})) == {"k": ["x\\y", -0.0, 10**20]}


def test_every_kind_of_binding_counts_as_an_assignment():
    code = (
        "import numpy as np\nfrom os import path\nimport a.b\n"
        "def f(): pass\nclass C: pass\nfor i, j in x: pass\n"
        "with open(p) as fh: pass\ntry: pass\nexcept E as err: pass\n"
        "(w := 1)\ndel gone\ny += 1\n"
    )
    assert {"np", "path", "a", "f", "C", "i", "j", "fh", "err", "w", "gone", "y"} <= (
        assigned_names(code)
    )
    assert "df" in assigned_names("%time df = load()\ndf.head()")  # IPython syntax
    assert {"broken", "sales"} <= assigned_names("broken = (\nsales")  # unparsable: assume all


def test_producer_arguments_keep_the_producers_order(transcripts):
    import dataref.producers.demo  # noqa: F401  (registers fetch_sales)

    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S", region="North", since="2025-01-01")
    assert sources(transcripts, h)[0].startswith(
        'sales = dr.fetch_sales(since="2025-01-01", region="North")'
    )


def test_agent_code_that_uses_the_name_dr_gets_the_module_under_another_name(transcripts):
    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S")
    run(transcripts, h, "dr = sales.dropna()\nresult = len(dr)", {"sales": "data_S"})
    cells = transcripts.read(OWNER, h).cells
    assert cells[1].source.startswith("import dataref.replay as dataref_replay\n")
    assert cells[2].source.startswith("sales = dataref_replay.fetch_sales(")
    assert cells[3].source.endswith("dataref_replay.show(result)")


def test_a_variable_never_shadows_a_builtin_or_an_input_of_another_dataref():
    records = [
        {"tool": "fetch_list", "ref": "data_L"},
        {"tool": "fetch_sales", "ref": "data_S"},
        {"tool": "run_python", "code": "", "inputs": {"sales": "data_X"}, "outputs": {}},
    ]
    names = plan_variables(records)
    assert names["data_L"] == "list_data"
    assert names["data_S"] == "sales_data"


# -- replay --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replay_settings(tmp_path_factory):
    from tests.conftest import make_settings

    settings = make_settings(tmp_path_factory.mktemp("replay"), owner=OWNER)
    dr.configure(settings)
    yield settings
    dr._state.clear()


def test_replayed_producers_return_the_frame_the_kernel_saw(replay_settings):
    frame = dr.fetch_sales(since="2025-12-01", until="2025-12-07")
    store = ArtifactStore(replay_settings.state_dir / "store", replay_settings.store)
    try:
        from dataref.producers import ProducerContext
        from dataref.producers.demo import fetch_sales

        ctx = ProducerContext(owner=OWNER, settings=replay_settings)
        raw = fetch_sales(ctx, since="2025-12-01", until="2025-12-07")
        art = store.put_frame(OWNER, raw, lineage={})
        pd.testing.assert_frame_equal(frame, store.read_frame(OWNER, art.ref))
    finally:
        store.close()
    assert dr.fetch_sales.__doc__.startswith("Demo sales")


def test_replay_knows_every_registered_producer_and_nothing_else(replay_settings):
    assert {"fetch_sales", "fetch_sql", "chart", "output"} <= set(dir(dr))
    frame = dr.fetch_sql(query="SELECT COUNT(*) AS n FROM sales")
    assert list(frame.columns) == ["n"]
    with pytest.raises(AttributeError, match="producers here"):
        dr.fetch_nothing  # noqa: B018


def test_replay_refuses_dataRefs_made_outside_the_notebook(replay_settings):
    with pytest.raises(NotFound, match="made outside this notebook"):
        dr.artifact("data_abc")


def test_outputs_come_back_as_the_server_stores_them():
    by_line = pd.Series([1.5, 2.5], index=pd.Index(["a", "b"], name="line"))
    assert list(dr.output({"s": by_line}, "s").columns) == ["line", "s"]
    assert list(dr.output({"s": by_line.rename("rev")}, "s").columns) == ["line", "rev"]
    filtered = pd.DataFrame({"x": [1, 2, 3]}).iloc[[2, 0]]
    assert dr.output({"f": filtered}, "f").index.tolist() == [0, 1]
    wide = pd.DataFrame([[1, 2]], columns=pd.MultiIndex.from_tuples([("a", "x"), ("a", "")]))
    assert list(dr.output({"w": wide}, "w").columns) == ["a_x", "a"]


def test_show_displays_the_json_the_agent_received():
    value = {
        1: np.float64(2.5),
        "when": pd.Timestamp("2025-01-02"),
        "n": np.int64(3),
        "q": pd.Period("2025Q1"),
        "s": {2, 1},
        "nan": float("nan"),
        "d": dt.date(2025, 1, 1),
    }
    shown = json.loads(repr(dr.show(value)))
    assert shown == {
        "1": 2.5,
        "when": "2025-01-02T00:00:00",
        "n": 3,
        "q": "2025Q1",
        "s": [1, 2],
        "nan": None,
        "d": "2025-01-01",
    }
    assert dr.show(None) is None


def test_the_export_command_writes_a_handles_notebook(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DATAREF_STATE_DIR", str(tmp_path / "state"))
    t = Transcripts(tmp_path / "state" / "notebooks")
    h = t.default(OWNER)
    fetch(t, h, "data_S")
    t.close()
    out = tmp_path / "out.ipynb"
    assert cli.main(["export", h, "--out", str(out), "--owner", OWNER]) == 0
    assert "(3 cells, no data)" in capsys.readouterr().out
    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)
    assert nb.cells[2].source.startswith("sales = dr.fetch_sales(")
    assert cli.main(["export", "default", "--out", str(out), "--owner", OWNER]) == 0
    assert cli.main(["export", h, "--out", str(out), "--owner", "bob"]) == 1
    assert "unknown notebook" in capsys.readouterr().err


def test_a_recorded_transcript_replays_in_a_plain_kernel(replay_settings, transcripts):
    """No server involved: producer cells, a chained call and a chart run in nbclient."""
    from nbclient import NotebookClient

    h = transcripts.default(OWNER)
    fetch(transcripts, h, "data_S", since="2025-12-01")
    code = 'outputs["by_region"] = sales.groupby("region").revenue.sum()\nresult = len(sales)'
    run(transcripts, h, code, {"sales": "data_S"}, ok({"by_region": "data_R"}))
    run(transcripts, h, "result = sorted(by_region.columns)", {"by_region": "data_R"})
    record_chart(
        transcripts,
        OWNER,
        h,
        data_ref="data_R",
        x="region",
        y="revenue",
        kind="bar",
        title=None,
        chart_ref="chart_C",
    )
    nb = export_notebook(transcripts, OWNER, h)
    env = {
        **os.environ,
        "DATAREF_STATE_DIR": str(replay_settings.state_dir),
        "DATAREF_OWNER": OWNER,
    }
    NotebookClient(nb, kernel_name="python3", timeout=120).execute(env=env)
    shown = [c.outputs[-1]["data"] for c in nb.cells if c.cell_type == "code" and c.outputs]
    assert shown[0]["text/plain"].startswith("(")  # the producer cell shows the shape
    assert json.loads(shown[2]["text/plain"]) == ["region", "revenue"]
    assert "image/png" in shown[3]
