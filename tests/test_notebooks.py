"""The notebooks in notebooks/ run top to bottom (small sizes) and are committed without outputs.

Execution uses nbclient with LRT_NOTEBOOK_SMALL=1 (each notebook's first code cell reads it and
picks tiny sizes), the `python3` kernel, and a temporary working directory, so runs land in temp
stores and never in the repository. Equivalent by hand:

    LRT_NOTEBOOK_SMALL=1 pytest --nbmake notebooks/
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[notebooks]')")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = ["01_quickstart", "02_state_tracking", "03_trainers_and_gap_recovery", "04_probes"]
CELL_TIMEOUT_S = 300
KERNEL = "python3"


def _ids(paths):
    return [p.stem for p in paths]


def test_notebooks_present():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_outputs_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert not cell.get("outputs"), f"{path.name} cell {i} has outputs; strip them before committing"
        assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_small_parameter(path):
    """The first code cell reads LRT_NOTEBOOK_SMALL, so the suite can run the notebook quickly."""
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert 'os.environ.get("LRT_NOTEBOOK_SMALL", "0") == "1"' in first.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebooks_use_public_api_only(path):
    nb = nbformat.read(path, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not re.search(r"""["']\.{0,2}/?results[/"']""", src), "notebooks must not write into the repository's results/"
    for line in src.splitlines():
        line = line.strip()
        if line.startswith(("import ", "from ")) and ("lrt_lab" in line or "tasks" in line):
            module = line.split()[1]
            assert not any(part.startswith("_") for part in module.split(".")), line


def _kernel_available() -> str | None:
    """None when the python3 kernel can be started, else why not."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError:
        return "jupyter_client is not installed (pip install -e '.[notebooks]')"
    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        return (f"no {KERNEL!r} Jupyter kernel spec; install one with `python -m ipykernel install --user`")
    return None


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[notebooks]')")
    reason = _kernel_available()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("LRT_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # the kernel inherits this environment; keep it to one thread on shared CPUs
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError (with the traceback) on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
