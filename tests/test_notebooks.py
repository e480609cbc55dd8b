"""The notebooks in notebooks/ run top to bottom (small sizes) and are committed without outputs.

Execution uses nbclient with LRT_NOTEBOOK_SMALL=1 (each notebook's first code cell reads it and
picks tiny sizes), one `python3` kernel for all of them (its namespace emptied before each), and a
temporary working directory per notebook, so runs land in temp stores and never in the repository.
Equivalent by hand (a kernel per notebook):

    LRT_NOTEBOOK_SMALL=1 pytest -p nbmake --nbmake notebooks/

(pyproject.toml turns the nbmake plugin off for the suite, whose collection it slowed by seconds
per process; -p nbmake turns it back on.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def nbformat():
    """Imported by the tests that read a notebook, not at collection: nbformat's schema validation
    (jsonschema with its URI grammars) takes seconds to import, which every pytest-xdist worker
    would pay to collect this file."""
    return pytest.importorskip(
        "nbformat", reason="nbformat is not installed (pip install -e '.[notebooks]')"
    )


# one pytest-xdist worker (under --dist loadgroup) imports nbformat and starts the kernel
pytestmark = pytest.mark.xdist_group("notebooks")

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
def test_notebook_outputs_stripped(path, nbformat):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert not cell.get("outputs"), (
            f"{path.name} cell {i} has outputs; strip them before committing"
        )
        assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_small_parameter(path, nbformat):
    """The first code cell reads LRT_NOTEBOOK_SMALL, so the suite can run the notebook quickly."""
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert 'os.environ.get("LRT_NOTEBOOK_SMALL", "0") == "1"' in first.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebooks_use_public_api_only(path, nbformat):
    nb = nbformat.read(path, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not re.search(r"""["']\.{0,2}/?results[/"']""", src), (
        "notebooks must not write into the repository's results/"
    )
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
        return (
            f"no {KERNEL!r} Jupyter kernel spec; install one with "
            "`python -m ipykernel install --user`"
        )
    return None


# What the kernel inherits: tiny sizes, no display, one thread on shared CPUs.
NOTEBOOK_ENV = {
    "LRT_NOTEBOOK_SMALL": "1",
    "MPLBACKEND": "Agg",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One python3 kernel for the module's notebooks: starting one and importing torch, pandas and
    matplotlib into it costs more CPU than a small notebook's cells. Each notebook still runs
    top to bottom from an empty namespace (`%reset -f`) in a folder of its own; what survives is
    what a kernel keeps past %reset (imported modules, torch's global settings)."""
    nbclient = pytest.importorskip(
        "nbclient", reason="nbclient is not installed (pip install -e '.[notebooks]')"
    )
    reason = _kernel_available()
    if reason:
        pytest.skip(reason)
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    km = AsyncKernelManager(kernel_name=KERNEL)
    with pytest.MonkeyPatch.context() as mp:
        for var, value in NOTEBOOK_ENV.items():
            mp.setenv(var, value)
        run_sync(km.start_kernel)(cwd=str(tmp_path_factory.mktemp("kernel")))
    try:
        yield nbclient, km, run_sync
    finally:
        run_sync(km.shutdown_kernel)(now=True)


def _fresh_start(folder: Path, nbformat):
    """A first cell that empties the kernel's namespace and figures and moves into `folder`."""
    return nbformat.v4.new_code_cell(
        "%reset -f\n"
        "import os as _os, sys as _sys\n"
        f"_os.chdir({str(folder)!r})\n"
        "if 'matplotlib.pyplot' in _sys.modules:\n"
        "    _sys.modules['matplotlib.pyplot'].close('all')\n"
        "del _os, _sys"
    )


# Notebooks executed by this pytest process, by name: a test that reads a notebook's outputs
# reuses the run of test_notebook_runs instead of executing it again.
EXECUTED: dict = {}


def _execute(path: Path, folder: Path, kernel, nbformat):
    """The notebook at `path`, executed top to bottom in `folder` (outputs filled in)."""
    nbclient, km, run_sync = kernel
    if not run_sync(km.is_alive)():  # an earlier notebook took the kernel down: a new one for this
        run_sync(km.restart_kernel)(now=True)
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, _fresh_start(folder, nbformat))
    client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL)
    try:
        client.execute()  # raises CellExecutionError (with the traceback) on the first failing cell
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
    EXECUTED[path.stem] = nb
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path, tmp_path, kernel, nbformat):
    nb = _execute(path, tmp_path, kernel, nbformat)
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, errors


def _printed(cell) -> str:
    return "".join(
        o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream"
    )


@pytest.mark.slow
def test_quickstart_patching_closes_a_share_of_a_real_gap(tmp_path, kernel, nbformat):
    """Notebook 01's patching cell prints, for every position it restores the memory at, a share
    of the gap closed that is a number in [0, 1] (not NaN: the model it patches is trained, so
    the gap is not 0/0), 0 where the memory read comes from before the corrupted token, and
    clearly more than 0 after it."""
    nb = EXECUTED.get("01_quickstart") or _execute(
        NOTEBOOK_DIR / "01_quickstart.ipynb", tmp_path, kernel, nbformat
    )
    (cell,) = [
        c for c in nb.cells if c.cell_type == "code" and "share of the gap closed" in c.source
    ]
    text = _printed(cell)
    gap = re.search(r"patching gap \(.*\): (\S+)", text)
    assert gap and float(gap.group(1)) > 0, text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "share of the gap closed" in line)
    shares = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        position, share = line.split()
        shares[int(position)] = float(share)
    assert sorted(shares) == list(range(1, 8)), text
    assert all(0.0 <= v <= 1.0 for v in shares.values()), shares  # NaN fails this too
    assert shares[1] == shares[2] == 0.0  # memory written before the corrupted token (position 2)
    assert min(shares[p] for p in range(3, 8)) > 0.2, shares
