"""Every notebook in examples/ ships without outputs and runs headless to the end (nbclient, a fresh kernel)."""
from __future__ import annotations

import os
import pathlib

import pytest
from conftest import QUICK_COMPILES_ENV

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))


def test_notebooks_ship():
    assert [p.name for p in NOTEBOOKS] == ["01_neurons_and_models.ipynb", "02_sharding.ipynb",
                                           "03_spikingjelly_import.ipynb", "04_train_checkpoint_restore.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stripped_and_runs(path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name}: strip its outputs"
    # The kernel inherits this environment: the tests' 8 CPU devices, and the source tree on the path.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for key, value in QUICK_COMPILES_ENV.items():
        monkeypatch.setenv(key, value)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for c in code for o in c.outputs if o.output_type == "stream")
    assert "Traceback" not in text
