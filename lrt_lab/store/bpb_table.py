"""A run's stored BPB (tables/bpb.csv, written by lrt_lab.analysis.bpb.evaluate_bpb) read back
as columns of a load_runs table, without torch: the gap analysis (lrt_results.gap), the
dashboard and the BPB evaluation itself read it."""

from __future__ import annotations

import pandas as pd

from lrt_lab.store.results import load_table


def read_bpb(df: pd.DataFrame) -> pd.DataFrame:
    """df (load_runs) with columns bpb.parallel, bpb.exact and bpb.stage.<k> from each run's
    tables/bpb.csv (written by `lrt_lab.analysis.bpb.evaluate_bpb`), NaN where a run has none.
    Stage columns are filled only for schedules whose first stage covers every position."""
    df = df.copy()
    values = []
    for _, row in df.iterrows():
        t = load_table(row, "bpb")
        rec = {}
        if t is not None:
            stages = t[t["mode"] == "stage"]
            # per-stage figures only for schedules whose first stage covers the sequence (OnePass,
            # Interleaved, FullSequence); Chunked/Exact stages cover growing prefixes
            full = not stages.empty and float(stages["coverage"].iloc[0]) == 1.0
            for _, r in t.iterrows():
                if r["mode"] != "stage":
                    rec[f"bpb.{r['mode']}"] = r["bpb"]
                elif full:
                    rec[f"bpb.stage.{int(r['stage'])}"] = r["bpb"]
        values.append(rec)
    extra = pd.DataFrame(values, index=df.index)
    for c in extra.columns:
        df[c] = extra[c]
    return df
