"""One run's figures and labels: what `lrt-lab train` and the demo print when a run ends.

A run's own summary read back, no statistics across runs: the lab prints it, so it lives in the
store (lrt_results.report, the tables across runs, re-exports these names).
"""

from __future__ import annotations

import re
import sys

import pandas as pd

from lrt_lab.store.results import Run, diverged_line
from lrt_lab.store.run_groups import method_label


def memory_label(row) -> str:
    """Which memory preset and which initialisation an LRT run used; "-" for a model without memory.
    Runs made before presets existed built MemoryConfig's defaults, i.e. the "paper" preset."""
    if row.get("config.kind") != "lrt":
        return "-"
    preset = row.get("config.train.memory_preset")
    preset = "paper" if not isinstance(preset, str) else preset
    g, rec = row.get("config.model.memory.gamma_init"), row.get("config.model.memory.rec_init")
    if g == 0 and rec == "zero":
        init = "start-as-transformer init (gamma 0, zero W_rec)"
    elif g == 0.1 and rec == "uniform":
        init = "paper init (gamma 0.1, uniform W_rec)"
    else:
        init = f"init gamma {g}, {rec} W_rec"
    return f"{preset} preset, {init}"


def model_label(row) -> str:
    """`transformer (4 layers)`, `lrt exact (4 layers)`; for an LRT, what differs from the paper
    preset's memory: `lrt exact (4 layers, memory from block 4, normed)`, or `released preset`."""
    text = f"{method_label(row)} ({int(row['config.model.n_layer'])} layers"
    if row.get("config.kind") == "lrt" and row.get("config.train.memory_preset") == "released":
        text += ", released preset"
    elif row.get("config.kind") == "lrt":
        src = row.get("config.model.memory.source_layer")
        if src is not None and not pd.isna(src):
            text += f", memory from block {int(src)}"
        for field, default in (("source_tap", "resid"), ("projections", "shared")):
            value = row.get(f"config.model.memory.{field}")
            if isinstance(value, str) and value != default:  # NaN: a run from before the field
                text += f", {value}"
    return text + ")"


def run_figures(run: Run) -> pd.DataFrame:
    """pos@90 / accuracy / cross-entropy per evaluation length and decoding mode, from
    summary.json."""
    ev = (run.summary or {}).get("eval", {})
    rows = {}
    for key, value in ev.items():
        m = re.match(r"(pos90|acc|ce)_(parallel|exact)@(\d+)", key)
        if m:
            rows.setdefault(int(m.group(3)), {})[f"{m.group(1)}_{m.group(2)}"] = value
    return pd.DataFrame.from_dict(rows, orient="index").sort_index().rename_axis("length")


def print_run(run: Run) -> None:
    """A run's figures (stdout) when it is complete; one line saying what it is otherwise: a
    diverged run's step and loss (stderr), or that it is incomplete."""
    s = run.summary
    if s is None:
        print(f"{run.name}: incomplete (resume with --resume)")
        return
    if s.get("status", "complete") != "complete":  # diverged: no final loss, no evaluation
        print(
            diverged_line(run.name, s)
            if s.get("status") == "diverged"
            else f"{run.name}: status {s.get('status')!r} in summary.json",
            file=sys.stderr,
        )
        return
    print(
        f"\n{run.name}: loss {s['final_loss']:.4f}, {s['wall_time_s']:.0f} s, "
        f"{s['tokens']:,} tokens "
        f"(x{s['schedule_cost']:g} compute)"
    )
    print(run_figures(run).to_string())
    print(f"run folder: {run.path}")
