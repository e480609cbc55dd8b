"""Where a store's analysis tables and a report's figures go: folders, no torch.

Store-level tables (gap recovery, depth sweep, train/inference mismatch) live in
`<store>/.analysis/tables/<name>.csv` (results.write_table on the folder): a hidden folder, so
`load_runs` neither lists it as a run nor warns about it (it skips only folders whose name starts
with "."). The analyses that rebuild a model (lrt_lab.analysis.loading) and the statistics built
on the store (lrt_results) both write there, so the folders live below them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lrt_lab.core.validation import check_out_dir
from lrt_lab.store.results import write_table

ANALYSIS_DIR = ".analysis"
DEFAULT_OUTPUTS = "outputs"  # output_dir's folder when none is given


def output_dir(store, out=None) -> Path:
    """Where a report's or an analysis's figures and tables of `store` go: `out` when given,
    else outputs/<the store folder's name>/ under the current directory (ignored by git at the
    repository's root), never into the store, so a committed store stays as it was committed."""
    folder = check_out_dir("out", out) if out is not None else Path(DEFAULT_OUTPUTS)
    if out is None:
        folder = folder / (Path(store).resolve().name or "store")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def analysis_dir(store) -> Path:
    d = Path(store) / ANALYSIS_DIR
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_store_table(store, name: str, df: pd.DataFrame) -> Path:
    """Atomically write <store>/.analysis/tables/<name>.csv (results.write_table on the hidden
    folder)."""
    return write_table(analysis_dir(store), name, df)


def read_store_table(store, name: str) -> pd.DataFrame | None:
    path = Path(store) / ANALYSIS_DIR / "tables" / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else None
