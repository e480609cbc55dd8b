"""The committed run store (`experiments/results/`) and the README's Results tables built from it.

The tables come from lrt_lab's run store and seed statistics; here each cell is recomputed from
the runs' JSON files with the standard library alone and looked up in the printed table."""

import importlib.util
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from lrt_lab.results import load_runs

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "experiments" / "results"


def _tables_module():
    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "experiments" / "results_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runs_by_method(task: str) -> dict:
    """{training length: {(label, init): [summary.eval dicts]}} for complete runs of `task`, read
    straight from the files (the label names what differs from the paper preset's base)."""
    out = defaultdict(lambda: defaultdict(list))
    for folder in sorted(STORE.iterdir()):
        if not (folder / "summary.json").is_file():
            continue
        config = json.loads((folder / "config.json").read_text())
        if config["train"]["task"] != task:
            continue
        kind, schedule = config["kind"], config["schedule"]
        method = kind if schedule == "onepass" and kind != "lrt" else f"{kind} {schedule}"
        mem = config["model"].get("memory") or {}
        where, init = "", "-"
        if kind == "lrt":
            init = "start-as-transformer" if mem.get("gamma_init") == 0 and mem.get("rec_init") == "zero" else "paper init"
            if config["train"].get("memory_preset") == "released":
                where = ", released preset"
            else:
                if mem.get("source_layer") is not None:
                    where = f", memory from block {mem['source_layer']}"
                for field, default in (("source_tap", "resid"), ("projections", "shared")):
                    if mem.get(field, default) != default:
                        where += f", {mem[field]}"
        label = f"{method} ({config['model']['n_layer']} layers{where})"
        summary = json.loads((folder / "summary.json").read_text())
        out[config["train"]["length"]][(label, init, config["train"]["steps"])].append(summary)
    # runs of one label and init trained for different numbers of steps are different rows, each
    # label then saying its steps
    named = defaultdict(lambda: defaultdict(list))
    for length, groups in out.items():
        for (label, init, steps), summaries in groups.items():
            mixed = len({s for (l, i, s) in groups if (l, i) == (label, init)}) > 1
            named[length][(f"{label} ({steps} steps)" if mixed else label, init)] = summaries
    return named


def _row(table: str, label: str, init: str | None = None) -> list[str]:
    """The row whose first cell is `label` (and, given `init`, whose memory cell names it)."""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 1 and cells[0] == label and (
                init is None or (init in cells[1] if init != "-" else cells[1] == "-")):
            return cells
    raise AssertionError(f"no row {label!r} ({init}) in\n{table}")


@pytest.mark.parametrize("task", ["a5_prefix", "z60_prefix"])
def test_state_tracking_table_matches_the_run_files(task):
    by_length = _runs_by_method(task)
    assert by_length, f"experiments/results/ holds no complete {task} runs"
    df = load_runs(STORE)
    for length, runs in by_length.items():
        table = _tables_module().state_tracking_table(df[df["config.train.length"] == length], task, None)
        header = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
        lengths = [int(h.split()[-1]) for h in header if h.startswith("pos@90 at") and not h.endswith("per seed")]
        assert lengths and lengths[0] == length, header
        col = {h: i for i, h in enumerate(header)}  # columns by name: the table may gain others
        for (label, init), summaries in runs.items():
            evals = [s["eval"] for s in summaries]
            cells = _row(table, label, init)
            compute = statistics.mean(s["compute_tokens"] for s in summaries) / 1e6
            assert cells[col["compute (M token-forwards)"]] == f"{compute:.1f}", (label, cells)
            for n in lengths:
                values = [e[f"pos90_exact@{n}"] for e in evals]
                cell = cells[col[f"pos@90 at {n}"]]
                assert cell.startswith(f"{statistics.mean(values):.1f}"), (label, n, cell)
                assert f"(n={len(values)})" in cell
            acc = statistics.mean(e[f"acc_exact@{lengths[0]}"] for e in evals)
            assert cells[col[f"accuracy at {lengths[0]}"]].startswith(f"{acc:.3f}"), (label, cells)
            per_seed = sorted(cells[col[f"pos@90 at {lengths[0]} per seed"]].split(", "))
            assert per_seed == sorted(str(e[f"pos90_exact@{lengths[0]}"]) for e in evals), (label, cells)
            parallel = cells[col[next(h for h in header if h.startswith("parallel forward"))]]
            assert sorted(parallel.split(", ")) == sorted(
                "/".join(str(e[f"pos90_parallel@{n}"]) for n in lengths) for e in evals), (label, parallel)


def test_gap_table_recovered_fraction_matches_the_bpb_tables():
    """(base - method) / (base - exact) per seed from each run's tables/bpb.csv, averaged."""
    bpb = defaultdict(dict)
    for folder in sorted(STORE.iterdir()):
        csv = folder / "tables" / "bpb.csv"
        if not csv.is_file() or not (folder / "summary.json").is_file():
            continue
        config = json.loads((folder / "config.json").read_text())
        if config["train"]["task"] != "text_bytes":
            continue
        exact = next(line.split(",")[3] for line in csv.read_text().splitlines() if line.startswith("exact,"))
        method = config["kind"] if config["kind"] != "lrt" else f"lrt {config['schedule']}"
        bpb[method][config["train"]["seed"]] = float(exact)
    assert {"transformer", "lrt exact"} <= set(bpb), sorted(bpb)
    table = _tables_module().gap_table(load_runs(STORE))
    for method in set(bpb) - {"transformer", "lrt exact"}:
        seeds = sorted(set(bpb[method]) & set(bpb["transformer"]) & set(bpb["lrt exact"]))
        fractions = [(bpb["transformer"][s] - bpb[method][s]) / (bpb["transformer"][s] - bpb["lrt exact"][s])
                     for s in seeds]
        cells = _row(table, method)
        assert cells[2].startswith(f"{100 * statistics.mean(fractions):.0f}%"), (method, cells)
        assert f"(n={len(seeds)})" in cells[2]
