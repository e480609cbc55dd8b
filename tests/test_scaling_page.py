"""docs/scaling.md (its summary, In short, included) is what experiments/scaling_tables.py makes of
the committed scaling store, so it cannot go stale."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location(
        "scaling_tables", ROOT / "experiments" / "scaling_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _points(rows, **columns):
    """Grid points from (method, R, C, seed, BPB exact) rows, with the other columns constant."""
    import pandas as pd

    points = pd.DataFrame(rows, columns=["method", "R", "C", "seed", "bpb_exact"])
    return points.assign(**columns)


def _t_half(diffs):
    """Half-width of the 95% t interval of the mean of `diffs`, by hand with scipy's t quantile."""
    import numpy as np
    from scipy import stats as sps

    return sps.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / np.sqrt(len(diffs))


@pytest.mark.slow
def test_scaling_page_is_current():
    assert _module().main(["--check"]) == 0


@pytest.mark.slow
def test_the_page_changes_when_a_run_does(tmp_path):
    import shutil

    from lrt_lab.store.results import load_runs

    tables = _module()
    store = tmp_path / "store"
    shutil.copytree(ROOT / "experiments" / "scaling_runs", store)
    before = tables.render(tables.TEMPLATE.read_text(), load_runs(store))
    run = next(p for p in store.iterdir() if p.name.startswith("pilot-") and "lrt" in p.name)
    summary = (run / "summary.json").read_text()
    key = '"ce_exact@256": '
    i = summary.index(key) + len(key)
    (run / "summary.json").write_text(summary[:i] + "9.0, " + summary[i:].split(",", 1)[1])
    assert tables.render(tables.TEMPLATE.read_text(), load_runs(store)) != before


def test_the_scoreboard_keeps_two_groups_apart_that_share_a_budget(tmp_path):
    """A grid run at another Muon rate and the same R: its scoreboard row keeps its full label
    (a short one, method and R, would merge it with the default rate's)."""
    import json
    import shutil

    from lrt_lab.store.results import load_runs

    tables = _module()
    store = tmp_path / "store"
    source = ROOT / "experiments" / "scaling_runs"
    name = "text_bytes-L256-small-lrt-interleaved_2-R10-s0"
    shutil.copytree(source / name, store / name)
    other = store / f"{name}-rate"
    shutil.copytree(source / name, other)
    config = json.loads((other / "config.json").read_text())
    config["train"].update(matrix_lr=0.04, name=other.name)
    (other / "config.json").write_text(json.dumps(config))
    rows = [
        r for r in tables.scoreboard_table(load_runs(store)).splitlines() if r.startswith("| lrt")
    ]
    assert len(rows) == 2 and not any(r.startswith("| lrt interleaved:2, R = 10 |") for r in rows)
    assert any("matrix_lr=0.04" in r for r in rows), rows


def test_repetition_is_named_wherever_a_run_saw_its_data_more_than_once():
    """Every budget whose runs passed over the training split more than once, with the most epochs
    one of its seeds made, and none of those that did not."""
    import pandas as pd

    tables = _module()
    points = pd.DataFrame(
        {
            "method": ["transformer"] * 4 + ["lrt interleaved:2"] * 2,
            "R": [40.0, 40.0, 80.0, 20.0, 40.0, 40.0],
            "epochs": [0.99, 1.14, 2.28, 0.57, 1.01, 0.98],
        }
    )
    text = tables.repeats(points)
    assert text == (
        "lrt interleaved:2 at R = 40: 1.01 epochs; transformer at R = 40: 1.14 epochs; "
        "transformer at R = 80: 2.28 epochs"
    )
    assert tables.repeats(points[points["epochs"] < 1]).startswith("none")


def test_where_the_lrt_is_ahead_reads_each_interval_against_zero():
    import math

    import pandas as pd

    tables = _module()
    deltas = pd.DataFrame(
        {
            "match": ["tokens", "compute", "tokens", "compute", "compute"],
            "R": [5.0, 2.5, 10.0, 5.0, 10.0],
            "R_base": [5.0, 5.0, 10.0, 10.0, 20.0],
            "ci_low": [-0.2, 0.1, -0.1, -0.05, math.nan],  # C = 20: one pair, no interval
            "ci_high": [-0.1, 0.3, 0.02, -0.01, math.nan],
        }
    )
    text = tables.where_ahead(deltas)
    assert text.startswith(
        "Token-matched, the LRT is ahead at R = 5; level at R = 10. "
        "Compute-matched, the LRT is ahead at C = 10; behind at C = 5 ("
    )
    assert "C = 20" not in text


def test_each_rival_is_paired_by_seed_with_the_lrt_and_the_transformer():
    tables = _module()
    rows = [  # method, R, C, seed, BPB
        ("transformer", 40, 40.0, 0, 1.50),
        ("transformer", 40, 40.0, 1, 1.52),
        ("lrt interleaved:2", 20, 40.0, 0, 1.53),
        ("lrt interleaved:2", 20, 40.0, 1, 1.51),
        ("lrt rollout:1", 26.667, 40.0, 1, 1.45),  # seed 1 only: one pair each
        ("transformer", 80, 80.0, 0, 1.40),  # another compute: not a rival at C = 40
    ]
    points = _points(rows, flops=2e13, wall_s=600.0)
    points["bpb_parallel"] = points["bpb_exact"]
    text = tables.rivals_table(points)
    rollout = next(line for line in text.splitlines() if line.startswith("| lrt rollout:1"))
    cells = [c.strip() for c in rollout.strip("|").split("|")]
    assert cells[-3:] == ["-0.0600 (1)", "-0.0700 (1)", "10"]  # 1.45-1.51, 1.45-1.52
    lrt = next(line for line in text.splitlines() if line.startswith("| lrt interleaved:2"))
    half = _t_half([0.03, -0.01])  # pairs (0.03, -0.01): mean 0.01
    want = f"+0.0100 [{0.01 - half:+.4f}, {0.01 + half:+.4f}] (2)"
    assert lrt.rstrip(" |").endswith(f"| - | {want} | 10")
    assert "| 80 |" not in text
    # the sentence places each method by its interval against the transformer at its FLOPs
    # (here every run spent the transformer's FLOPs per unit of C: both rivals sit at C = 40)
    sentence = tables.rivals_sentence(points)
    assert sentence == (
        f"not placed: lrt interleaved:2 at R = 20 (C = 40.0 by FLOPs; {want} at C = 40); "
        "lrt rollout:1 at R = 26.667 (C = 40.0 by FLOPs; -0.0700 (1) at C = 40)"
    )
    ahead = points.copy()
    ahead["bpb_exact"] = [1.50, 1.50, 1.40, 1.41, 1.45, 1.40]  # LRT -0.10, -0.09: t excludes 0
    assert tables.rivals_sentence(ahead).startswith(
        "ahead: lrt interleaved:2 at R = 20 (C = 40.0 by FLOPs; -0.0950 ["
    )


def test_a_rival_is_compared_at_the_compute_its_flops_equal():
    """A rival that spent 30 units of the transformer's compute in FLOPs (its C says 40) is paired
    with the transformer at C = 20 (less compute) and C = 40 (more): ahead of the one with more
    compute places it ahead; behind the one with less places it behind; neither: not placed."""
    tables = _module()
    rows = [  # method, R, C, seed, BPB
        ("transformer", 20, 20.0, 0, 1.60),
        ("transformer", 20, 20.0, 1, 1.61),
        ("transformer", 40, 40.0, 0, 1.50),
        ("transformer", 40, 40.0, 1, 1.52),
        ("lrt fixedpoint:0.1:8", 10, 40.0, 0, 1.45),
        ("lrt fixedpoint:0.1:8", 10, 40.0, 1, 1.469),
    ]
    points = _points(rows, wall_s=600.0)
    points["flops"] = [1e13, 1e13, 2e13, 2e13, 1.5e13, 1.5e13]  # 5e11 per unit of C
    points["bpb_parallel"] = points["bpb_exact"]
    d = tables.rivals_at_their_flops(points).set_index("side")
    assert d["C_flops"].tolist() == [30.0, 30.0]
    assert d.loc["less", "R_base"] == 20 and d.loc["more", "R_base"] == 40
    assert d.loc["more", "delta"] == pytest.approx(-0.0505)  # -0.05, -0.051: t excludes 0
    assert set(d["verdict"]) == {"ahead"}
    behind = points.assign(bpb_exact=[1.40, 1.418, 1.30, 1.32, 1.45, 1.469])  # worse than C = 20
    assert set(tables.rivals_at_their_flops(behind)["verdict"]) == {"behind"}
    between = points.assign(bpb_exact=[1.60, 1.61, 1.40, 1.42, 1.45, 1.469])
    assert set(tables.rivals_at_their_flops(between)["verdict"]) == {"not placed"}


def test_the_exact_reference_is_paired_with_interleaved_and_the_transformer_at_c_and_4c():
    tables = _module()
    rows = [  # method, R, C, seed, BPB
        ("lrt exact", 10, 10.0, 0, 1.50),
        ("lrt exact", 10, 10.0, 1, 1.52),
        ("lrt interleaved:2", 10, 20.0, 0, 1.62),
        ("lrt interleaved:2", 10, 20.0, 1, 1.66),
        ("transformer", 10, 10.0, 0, 1.75),
        ("transformer", 10, 10.0, 1, 1.77),
        ("transformer", 40, 40.0, 1, 1.53),  # seed 1 only: one pair, no interval
    ]
    points = _points(rows, flops=6.3e12)
    text = tables.exact_reference(points)
    half = _t_half([-0.12, -0.14])
    assert text == (
        "at R = 10 (C = 10, 6.3 TFLOPs), BPB 1.5100 over 2 seed(s): "
        f"-0.1300 [{-0.13 - half:+.4f}, {-0.13 + half:+.4f}] (2) against Interleaved(2) at the "
        "same R = 10; -0.2500 [-0.2500, -0.2500] (2) against the transformer at the same C = 10; "
        "-0.0100 (1) against the transformer at four times the compute (C = 40)"
    )
    assert tables.exact_reference(points[points["method"] != "lrt exact"]).startswith("no exact")


def test_the_pages_reading_is_what_the_committed_store_shows():
    """Each claim of the page's "Reading" section, checked against the intervals it rests on: if a
    run added to the store moved one, the prose would have to change with it."""
    import numpy as np

    from lrt_lab.store.results import load_runs

    tables = _module()
    points = tables.grid_points(load_runs(tables.STORE))
    deltas = tables.paired_deltas(points).set_index(["match", "R"])
    assert (deltas.xs("tokens")["ci_high"] < 0).all()  # the memory helps token-matched everywhere
    compute = deltas.xs("compute").sort_index()
    assert (compute["delta"].diff().dropna() < 0).all()  # drifting toward the LRT as C grows
    assert compute.loc[compute["C"] < 15, "ci_low"].gt(0).all()  # behind at low C ...
    level = compute[compute["C"] >= 19]
    assert ((level["ci_low"] < 0) & (level["ci_high"] > 0)).all()  # ... level from C = 20 on
    # the paper's effect at C = 80 (about 0.5% of BPB) is inside the interval's half-width
    c80 = compute.loc[compute["C"].idxmax()]
    assert (c80["ci_high"] - c80["ci_low"]) / 2 > 0.005 * c80["base"]

    rivals = tables.rival_deltas(points).set_index(["method", "ref"])
    rollout = rivals.loc[("lrt rollout:1", tables.LRT)]
    assert rollout["ci_high"] < 0  # below Interleaved(2) at the same C ...
    at_c = tables.near_c(points).groupby("method")["flops"].mean()
    assert at_c["lrt rollout:1"] < at_c[tables.LRT]  # ... with fewer FLOPs
    versus_base = rivals.loc[("lrt rollout:1", tables.BASE)]
    assert versus_base["ci_low"] < 0 < versus_base["ci_high"]  # not decided on 3 seeds
    for method in ("lrt fullseq:3", "lrt fixedpoint:0.1:8", "loop:2", "loop:3", "ponder:1"):
        for ref in (tables.LRT, tables.BASE):
            assert rivals.loc[(method, ref), "ci_low"] > 0, (method, ref)  # behind both

    exact = points[points["method"] == "lrt exact"]
    r = float(exact["R"].iloc[0])
    a, b = tables.paired_by_seed(points, "bpb_exact", (tables.LRT, r), ("lrt exact", r))
    diff = np.subtract(b, a)
    assert len(diff) >= 3 and diff.max() < 0  # well below Interleaved(2) at the same R
