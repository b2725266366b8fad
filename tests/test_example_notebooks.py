"""Every example notebook in notebooks/ runs from the top in a plain kernel, data-free."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_examples_of_the_docs_are_there():
    names = {p.name for p in NOTEBOOKS}
    assert {"quarter-over-quarter.ipynb", "teaching-tour.ipynb"} <= names


@pytest.fixture(scope="module")
def reader_env(tmp_path_factory) -> dict[str, str]:
    """A person with a fresh state dir: the demo database is built on the first fetch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    env["DATAREF_STATE_DIR"] = str(tmp_path_factory.mktemp("reader"))
    env["DATAREF_OWNER"] = "reader"
    return env


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_example_notebook_runs_from_the_top(path, reader_env):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "committed with outputs"
    NotebookClient(nb, kernel_name="python3", timeout=180).execute(env=reader_env)
    for cell in code:
        assert all(o.output_type != "error" for o in cell.outputs), cell.source
        if cell.source.rstrip().endswith(("dr.show(result)", ".shape")):
            assert any(o.output_type == "execute_result" for o in cell.outputs), cell.source
        if cell.source.startswith("dr.chart("):
            assert "image/png" in cell.outputs[-1].data
