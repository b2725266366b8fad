"""The kernel profile (kernel_profile/startup/00-dataref.py), exercised in a real kernel:
binding inputs, collecting outputs, figures and ``result``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pandas as pd
import pyarrow as pa
import pytest
import pytest_asyncio

from dataref.kernels import ExecutionResult, KernelPool, NotebookKernel

from .kernel_support import header, kernel_settings, manifest, ok, require_bwrap, run, stage

pytestmark = pytest.mark.asyncio(loop_scope="module")

SALES = pa.table(
    {"line": ["A", "B", "A", "C"], "units": [1, 2, 3, 4], "price": [1.5, 2.0, 1.5, 9.0]}
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kernel(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NotebookKernel]:
    require_bwrap()
    pool = KernelPool(kernel_settings(tmp_path_factory.mktemp("prof"), uid_base=62200))
    await pool.start()
    the_kernel = await pool.kernel("pat", "nb")
    stage(the_kernel, "data_sales", SALES)
    stage(the_kernel, "data_other", pa.table({"x": [1]}))
    yield the_kernel
    await pool.close()


async def cell(
    kernel: NotebookKernel, code: str, bind: dict[str, str] | None = None
) -> tuple[ExecutionResult, dict]:
    cell_id = f"c{abs(hash(code)) % 10**9}"
    result = await run(kernel, header(cell_id, bind) + "\n" + code)
    return result, manifest(result)


async def with_reply(
    kernel: NotebookKernel, cell_id: str, code: str, **expressions: str
) -> ExecutionResult:
    """``code`` as the server runs it: the manifest asked for in the execute reply."""
    code = "# dataref:" + json.dumps({"cell": cell_id, "bind": {}, "reply": True}) + "\n" + code
    asked = {"manifest": "__dataref_manifest__()", **expressions}
    return await kernel.execute(code, timeout_s=30, user_expressions=asked)


def read(kernel: NotebookKernel, man: dict, name: str) -> pd.DataFrame:
    with kernel.open_output(man["cell"], f"{name}.arrow", 10**8) as f:
        return pa.ipc.open_file(pa.BufferReader(f.read())).read_all().to_pandas()


async def test_inputs_are_bound_from_the_mapping_and_writes_never_fail(
    kernel: NotebookKernel,
) -> None:
    result, _ = await cell(
        kernel,
        "print(sales.shape)\n"
        "sales.loc[0, 'units'] = 100\nsales['double'] = sales['units'] * 2\n"
        "print(int(sales.loc[0, 'units']))",
        {"sales": "data_sales"},
    )
    assert result.status == "ok", result.error
    assert result.stdout.split() == ["(4,", "3)", "100"]


async def test_a_name_bound_to_the_same_ref_is_not_reloaded(kernel: NotebookKernel) -> None:
    bind = {"s": "data_sales"}
    await cell(kernel, "first = s", bind)
    result, _ = await cell(kernel, "print(s is first)", bind)
    assert result.stdout.strip() == "True"
    await ok(kernel, "s = 'rebound by the agent'")
    result, _ = await cell(kernel, "print(type(s).__name__, s is first)", bind)
    assert result.stdout.split() == ["DataFrame", "False"]
    result, _ = await cell(kernel, "print(list(s.columns))", {"s": "data_other"})
    assert result.stdout.strip() == "['x']"


async def test_inputs_are_views_of_the_mapping_not_copies(kernel: NotebookKernel) -> None:
    result, _ = await cell(
        kernel,
        "from pandas.api.types import is_string_dtype\n"
        "print(all(not b.values.flags.writeable for b in s._mgr.blocks if b.dtype.kind in 'if'),"
        " is_string_dtype(s.line))",
        {"s": "data_sales"},
    )
    assert result.stdout.split() == ["True", "True"], (result.error, result.stdout)


async def test_a_float_column_with_nulls_is_a_view_when_nan_sits_under_them(
    kernel: NotebookKernel,
) -> None:
    frame = pd.DataFrame({"price": [1.5, None, 2.0]})  # a frame stores NaN under its nulls
    stage(kernel, "data_gappy", pa.Table.from_pandas(frame, preserve_index=False))
    stage(kernel, "data_hidden", pa.table({"price": pa.array([1.5, None, 2.0])}))  # 0 under
    writeable = "[b.values.flags.writeable for b in {}._mgr.blocks]"
    result, _ = await cell(
        kernel,
        f"print({writeable.format('g')}, {writeable.format('h')})\n"
        "print(g.price.isna().tolist() == h.price.isna().tolist() == [False, True, False])\n"
        "g.loc[1, 'price'] = 3.0\nprint(g.price.tolist())",
        {"g": "data_gappy", "h": "data_hidden"},
    )
    assert result.status == "ok", result.error
    assert result.stdout.split("\n")[:3] == ["[False] [True]", "True", "[1.5, 3.0, 2.0]"]


async def test_a_frame_kept_after_its_name_is_rebound_can_still_be_written(
    kernel: NotebookKernel,
) -> None:
    await cell(kernel, "kept = sales", {"sales": "data_sales"})
    result, _ = await cell(
        kernel,
        "kept.loc[0, 'units'] = 7\nkept['units'] += 1\nprint(int(kept.loc[0, 'units']))",
        {"sales": "data_other"},
    )
    assert result.status == "ok", result.error
    assert result.stdout.strip() == "8"
    result, _ = await cell(kernel, "print(sales.units.tolist())", {"sales": "data_sales"})
    assert result.stdout.strip() == "[1, 2, 3, 4]"  # the stored input is untouched


async def test_an_input_nothing_uses_any_more_is_unmapped(kernel: NotebookKernel) -> None:
    stage(kernel, "data_passing", pa.table({"v": list(range(1000))}))
    maps = "print('data_passing.arrow' in open('/proc/self/maps').read())"
    result, _ = await cell(kernel, "view = p[['v']]\n" + maps, {"p": "data_passing"})
    assert result.stdout.strip() == "True"
    result, _ = await cell(kernel, maps, {"p": "data_other"})  # `view` still shares its data
    assert result.stdout.strip() == "True"
    await ok(kernel, "del view")
    result, _ = await cell(kernel, maps, {})
    assert result.stdout.strip() == "False"


async def test_a_successful_cell_returns_its_manifest_in_the_execute_reply(
    kernel: NotebookKernel,
) -> None:
    result = await with_reply(kernel, "inreply", "result = 41 + 1")
    assert result.status == "ok" and result.displays == []
    reply = result.user_expressions["manifest"]
    assert reply["status"] == "ok"
    man = reply["data"]["application/vnd.dataref.collect+json"]
    assert man["cell"] == "inreply" and man["result"] == "42"


async def test_other_user_expressions_are_still_formatted_by_ipython(
    kernel: NotebookKernel,
) -> None:
    result = await with_reply(kernel, "besides", "result = 1", other="41 + 1")
    other = result.user_expressions["other"]
    assert other["status"] == "ok" and other["data"]["text/plain"] == "42"
    manifest_data = result.user_expressions["manifest"]["data"]
    assert list(manifest_data) == ["application/vnd.dataref.collect+json"]


async def test_a_failed_cell_publishes_its_manifest_even_when_the_reply_was_asked(
    kernel: NotebookKernel,
) -> None:
    code = "outputs['t'] = __import__('pandas').DataFrame({'a': [1]})\n1 / 0"
    result = await with_reply(kernel, "failed", code)
    assert result.status == "error" and result.user_expressions == {}
    man = manifest(result)
    assert man["cell"] == "failed" and man["outputs"] == ["t"]


async def test_an_input_that_cannot_load_stops_the_cell_before_it_runs(
    kernel: NotebookKernel,
) -> None:
    result, man = await cell(kernel, "print('ran')", {"gone": "data_missing"})
    assert result.status == "error" and result.stdout == ""
    assert result.error and result.error["ename"] == "DatarefInputError"
    assert "data_missing" in result.error["evalue"] and man["outputs"] == []


async def test_the_header_line_is_stripped_so_tracebacks_keep_the_agents_line_numbers(
    kernel: NotebookKernel,
) -> None:
    result, _ = await cell(kernel, "x = 1\ny = x / 0")
    assert result.error and result.error["ename"] == "ZeroDivisionError"
    assert any("line 2" in frame for frame in result.error["traceback"])


async def test_dataframe_outputs_are_written_as_arrow_files(kernel: NotebookKernel) -> None:
    result, man = await cell(
        kernel,
        "import pandas as pd\n"
        "outputs['by_line'] = src.groupby('line')['units'].sum()\n"  # a Series, keyed
        "outputs['filtered'] = src[src.units > 1]\n"  # leftover row numbers
        "wide = src.pivot_table(index='line', columns='units', values='price')\n"
        "outputs['wide'] = wide\n"
        "outputs['by_date'] = pd.DataFrame({'v': [1, 2]},\n"
        "    index=pd.DatetimeIndex(['2025-01-01', '2025-01-02'], name='day'))",
        {"src": "data_sales"},
    )
    assert result.status == "ok", result.error
    assert man["outputs"] == ["by_line", "filtered", "wide", "by_date"] and man["errors"] == []
    assert man["output_info"]["filtered"]["rows"] == 3
    assert read(kernel, man, "by_line").to_dict("list") == {
        "line": ["A", "B", "C"],
        "units": [4, 2, 4],
    }
    assert list(read(kernel, man, "filtered").columns) == ["line", "units", "price"]
    assert list(read(kernel, man, "wide").columns) == ["line", "1", "2", "3", "4"]
    assert list(read(kernel, man, "by_date").columns) == ["day", "v"]


async def test_bad_outputs_get_a_clear_error_each_and_do_not_stop_the_others(
    kernel: NotebookKernel,
) -> None:
    _, man = await cell(
        kernel,
        "import pandas as pd\n"
        "outputs['good'] = pd.DataFrame({'a': [1]})\n"
        "outputs['2bad'] = pd.DataFrame({'a': [1]})\n"
        "outputs['number'] = 5\n"
        "outputs['mixed'] = pd.DataFrame({'m': [1, 'x', 2.5]})\n"
        "outputs['dupes'] = pd.DataFrame([[1, 2]], columns=['a', 'a'])",
    )
    assert man["outputs"] == ["good"]
    errors = "\n".join(man["errors"])
    assert "outputs['2bad']: names must be identifiers" in errors
    assert "outputs['number']: is a int; only DataFrames" in errors
    assert "outputs['mixed']" in errors and ".astype(str)" in errors
    assert "outputs['dupes']: duplicate column names ['a']" in errors


async def test_outputs_are_collected_even_when_the_cell_fails(kernel: NotebookKernel) -> None:
    result, man = await cell(
        kernel,
        "import pandas as pd\noutputs['partial'] = pd.DataFrame({'a': [1]})\nraise KeyError('x')",
    )
    assert result.status == "error" and man["outputs"] == ["partial"]


async def test_open_figures_are_saved_as_png_and_closed(kernel: NotebookKernel) -> None:
    result, man = await cell(
        kernel,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.figure(figsize=(40, 10))\n"
        "plt.bar(['a'], [1])",
    )
    assert result.status == "ok" and man["figures"] == ["figure_1.png", "figure_2.png"]
    with kernel.open_output(man["cell"], "figure_1.png", 10**7) as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with kernel.open_output(man["cell"], "figure_2.png", 10**7) as f:
        assert max(Image.open(f).size) <= 1600  # a huge figure is scaled down
    assert (await ok(kernel, "print(plt.get_fignums())")).strip() == "[]"


async def test_a_figure_left_by_a_failed_cell_does_not_leak_into_the_next(
    kernel: NotebookKernel,
) -> None:
    await ok(kernel, "import matplotlib.pyplot as plt\nplt.plot([1])")  # no header: not collected
    _, man = await cell(kernel, "pass")
    assert man["figures"] == []


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (
            "{'n': np.int64(3), 'f': np.float32(1.5), 'b': np.bool_(True)}",
            {"n": 3, "f": 1.5, "b": True},
        ),
        ("[float('nan'), float('inf'), None, pd.NA, pd.NaT]", [None, None, None, None, None]),
        ("pd.Timestamp('2025-01-02 03:04')", "2025-01-02T03:04:00"),
        (
            "{'when': dt.date(2025, 1, 2), 'dt64': np.datetime64('2025-01-02')}",
            {"when": "2025-01-02", "dt64": "2025-01-02T00:00:00"},
        ),
        ("(1, (2, 3))", [1, [2, 3]]),
        ("{3, 1, 2}", [1, 2, 3]),
        (
            "{1: 'a', pd.Timestamp('2025-01-01'): 'b', None: 'c'}",
            {"1": "a", "2025-01-01T00:00:00": "b", "null": "c"},
        ),
        ("decimal.Decimal('2.5')", 2.5),
        ("pd.Period('2025Q1')", "2025Q1"),
        ("df.head(2).round(1).to_dict()", {"a": {"0": 1.0, "1": 2.0}}),
        ("None", None),
    ],
)
async def test_result_is_converted_to_json(
    kernel: NotebookKernel, expression: str, expected: object
) -> None:
    result, man = await cell(
        kernel,
        "import datetime as dt, decimal\nimport numpy as np, pandas as pd\n"
        "df = pd.DataFrame({'a': [1.0, 2.0, 3.0]})\n"
        f"result = {expression}",
    )
    assert result.status == "ok", result.error
    assert man["has_result"] and man["result_error"] is None
    assert json.loads(man["result"]) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("df", "result is a DataFrame: put tables in outputs"),
        ("df['a']", "result is a Series"),
        ("df['a'].values", "result is a ndarray"),
        ("{'x': [object()]}", "result['x'][0] is a object, which is not JSON"),
    ],
)
async def test_a_result_that_is_not_json_like_gets_an_error_with_a_hint(
    kernel: NotebookKernel, expression: str, message: str
) -> None:
    _, man = await cell(
        kernel, f"import pandas as pd\ndf = pd.DataFrame({{'a': [1.0]}})\nresult = {expression}"
    )
    assert man["result"] is None and message in man["result_error"]
    assert ".to_dict()" in man["result_error"] or "str(x)" in man["result_error"]


async def test_result_and_outputs_are_cleared_before_each_cell(kernel: NotebookKernel) -> None:
    _, first = await cell(
        kernel, "result = 1\noutputs['t'] = __import__('pandas').DataFrame({'a': [1]})"
    )
    assert first["has_result"] and first["outputs"] == ["t"]
    _, second = await cell(kernel, "x = 2")
    assert not second["has_result"] and second["outputs"] == []


async def test_a_huge_result_is_refused_in_the_kernel(kernel: NotebookKernel) -> None:
    code = "result = 'x' * 100"
    result = await run(
        kernel, "# dataref:" + json.dumps({"cell": "big", "max_result_bytes": 50}) + "\n" + code
    )
    man = manifest(result)
    assert man["result"] is None and man["result_bytes"] == 102
    assert "over the 50 byte cap" in man["result_error"]


async def test_the_explicit_begin_bind_collect_calls_work_without_a_header(
    kernel: NotebookKernel,
) -> None:
    result = await run(
        kernel,
        "__dataref_begin__()\n__dataref_bind__('t', 'data_sales')\n"
        "outputs['copy'] = t\nresult = int(t.units.sum())\n__dataref_collect__('explicit')",
    )
    man = manifest(result)
    assert man["cell"] == "explicit" and man["outputs"] == ["copy"] and man["result"] == "10"


async def test_the_profile_adds_only_outputs_to_the_namespace(kernel: NotebookKernel) -> None:
    names = await ok(
        kernel,
        "print(sorted(k for k in get_ipython().user_ns_hidden if not k.startswith('_')))",
    )
    ipython_own = {"In", "Out", "exit", "get_ipython", "open", "quit"}
    assert set(eval(names)) - ipython_own == {"outputs"}
