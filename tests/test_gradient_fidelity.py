"""Gradient fidelity (lrt_lab/analysis/gradient.py): each trainer's gradient against exact BPTT's
per parameter group, on tiny float64 models, against independent computations: schedules whose
gradient is Exact's (cosine 1, norm ratio 1), a cosine and norm ratio computed here from
flattened gradients with the groups listed by hand, hand counts of the families' F and G, and
the command on a freshly trained run."""

import math

import pandas as pd
import pytest
import torch
from helpers import CONFIGS, make_model, tiny_train_config, tokens

from lrt_lab.analysis.gradient import (
    default_schedules,
    gradient_fidelity,
    group_of,
    smallest_passing,
    sweeps_of,
)
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule

T = 6


@pytest.fixture(scope="module")
def model():
    return make_model(CONFIGS["default"])


@pytest.fixture(scope="module")
def batch():
    return tokens(B=3, T=T), tokens(B=3, T=T, seed=3)


def test_groups_by_module_name(model):
    by_hand = {
        "pathway.gamma": "memory",
        "pathway.k_rec.0.weight": "memory",
        "pathway.gates.2.weight": "memory",
        "blocks.0.attn.c_q.weight": "attention",
        "blocks.2.attn.ve_gate.weight": "attention",
        "blocks.1.mlp.c_fc.weight": "mlp",
        "wte.weight": "embed_head",
        "value_embeds.1.weight": "embed_head",
        "lm_head.weight": "embed_head",
        "resid_lambdas": "other",
        "x0_lambdas": "other",
    }
    assert {n: group_of(n) for n in by_hand} == by_hand
    assert set(by_hand) <= {n for n, _ in model.named_parameters()}


def test_exact_and_schedules_equal_to_it_have_cosine_one_and_norm_ratio_one(model, batch):
    """Exact against itself; Chunked(1) (Exact's stages without the split); GaussSeidel(T, 2),
    whose differentiated sweep is the exact recurrence (tests/test_gauss_seidel.py)."""
    idx, targets = batch
    table = gradient_fidelity(model, idx, targets, ["exact", "chunked:1", f"gaussseidel:{T}:2"])
    assert set(table["group"]) == {"memory", "attention", "mlp", "embed_head", "other"}
    assert (table["cosine"] - 1).abs().max() < 1e-12
    assert (table["norm_ratio"] - 1).abs().max() < 1e-10


def test_a_forward_equal_to_exacts_is_not_a_gradient_equal_to_it(model, batch):
    """FixedPoint with F >= T sweeps has Exact's logits (Jacobi on a triangular system), but its
    last sweep's gradient crosses one memory hop only: the cosine is below 1."""
    idx, targets = batch
    with torch.no_grad():
        exact = run_schedule(model, idx, None, "exact").logits
        fp = run_schedule(model, idx, None, f"fixedpoint:0:{T}:1").logits
    assert (fp - exact).abs().max() < 1e-10
    table = gradient_fidelity(model, idx, targets, [f"fixedpoint:0:{T}:1"])
    assert table["cosine"].min() < 0.99


def by_group(model, loss) -> dict[str, torch.Tensor]:
    """Flattened gradients concatenated per group, the groups written out here by name."""

    def group(name):
        if name.startswith("pathway."):
            return "memory"
        if ".attn." in name:
            return "attention"
        if ".mlp." in name:
            return "mlp"
        if name.split(".")[0] in ("wte", "value_embeds", "lm_head"):
            return "embed_head"
        return "other"

    model.zero_grad()
    loss.backward()
    out = {}
    for name, p in model.named_parameters():
        g = torch.zeros_like(p) if p.grad is None else p.grad
        out[group(name)] = torch.cat([out.get(group(name), torch.zeros(0).double()), g.flatten()])
    model.zero_grad()
    return out


def test_cosine_and_norm_ratio_match_a_hand_computation(model, batch):
    idx, targets = batch
    row = gradient_fidelity(model, idx, targets, ["interleaved:2"]).set_index("group")
    g = by_group(model, run_schedule(model, idx, targets, "interleaved:2").loss)
    ref = by_group(model, run_schedule(model, idx, targets, "exact").loss)
    for name in ("memory", "attention", "mlp", "embed_head", "other"):
        a, b = g[name], ref[name]
        cosine = sum(x * y for x, y in zip(a.tolist(), b.tolist())) / math.sqrt(
            sum(x * x for x in a.tolist()) * sum(y * y for y in b.tolist())
        )
        assert abs(row.loc[name, "cosine"] - cosine) < 1e-10, name
        assert abs(row.loc[name, "norm_ratio"] - float(a.norm() / b.norm())) < 1e-10, name
    assert row["cosine"].min() < 0.99  # interleaved's gradient is not exact's on this model


def test_families_and_their_sweeps_counted_by_hand():
    cases = {
        "fixedpoint:0:4:1": ("fixedpoint G=1", 4, 1),
        "fixedpoint:0:4:2": ("fixedpoint G=2", 4, 2),
        "fixedpoint:0:2:3": ("fixedpoint G=3", 2, 2),  # nothing truncated
        "rollout:2": ("rollout", T + 2, 2),  # == FixedPoint(0, T+G, G)
        "fullseq:3": ("fullseq", 3, 3),
        "interleaved:2": ("interleaved S=2", 1, 1),
        "gaussseidel:2:3": ("gaussseidel S=2 G=1", 3, 1),
        "gaussseidel:3:4:2": ("gaussseidel S=3 G=2", 4, 2),
    }
    for spec, want in cases.items():
        assert sweeps_of(parse_schedule(spec), T) == (want[0], float(want[1]), float(want[2]))
    family, F, G = sweeps_of(parse_schedule("exact"), T)
    assert family == "exact" and math.isnan(F) and math.isnan(G)
    specs = default_schedules(6)
    assert {"fixedpoint:0:1", "fixedpoint:0:6:2", "fullseq:4", "gaussseidel:2:6"} <= set(specs)
    assert {"interleaved:2", "interleaved:4", "rollout:1", "rollout:4"} <= set(specs)
    assert not any(s.startswith("fixedpoint:0:1:2") for s in specs)
    assert all(parse_schedule(s).spec == s for s in specs)  # as the table spells them
    for bad in (1, 0, "8"):
        with pytest.raises(ValueError, match="T="):
            default_schedules(bad)


def test_smallest_passing_f_per_family():
    rows = []
    for F, cos in ((1, (0.5, 0.95)), (2, (0.91, 0.89)), (4, (0.92, 0.97)), (8, (0.99, 0.99))):
        for group, c in zip(("memory", "mlp"), cos):
            rows.append({"family": "a", "schedule": f"a:{F}", "F": F, "group": group, "cosine": c})
    rows.append({"family": "a", "schedule": "a:1", "F": 1, "group": "other", "cosine": 0.0})
    for F in (1, 2):
        rows.append({"family": "b", "schedule": f"b:{F}", "F": F, "group": "mlp", "cosine": 0.3})
    rows.append(
        {"family": "exact", "schedule": "exact", "F": math.nan, "group": "mlp", "cosine": 1}
    )
    got = smallest_passing(pd.DataFrame(rows)).set_index("family")
    assert set(got.index) == {"a", "b"}  # exact has no sweeps
    assert got.loc["a", "F"] == 4 and got.loc["a", "schedule"] == "a:4"  # "other" not counted
    assert got.loc["a", "min_cosine"] == 0.92
    assert math.isnan(got.loc["b", "F"]) and got.loc["b", "min_cosine"] == 0.3


def test_refuses_bad_arguments(model, batch):
    idx, targets = batch
    with pytest.raises(ValueError, match="schedules"):
        gradient_fidelity(model, idx, targets, [])
    with pytest.raises(ValueError, match="schedule"):
        gradient_fidelity(model, idx, targets, ["nosuch:2"])
    with pytest.raises(ValueError, match="chunk"):
        gradient_fidelity(model, idx, targets, ["exact"], chunk=0)


def test_the_command_on_a_trained_run(tmp_path, capsys):
    from lrt_lab.commands.analyze import main
    from lrt_lab.store.results import load_table
    from lrt_lab.training.loop import train

    cfg = tiny_train_config(schedule="gaussseidel:2:2", steps=3)
    run = train(cfg, out=tmp_path, progress=False)
    assert main(["gradient", str(run.path), "--n-sequences", "8"]) == 0
    table = load_table(run, "gradient_fidelity")
    assert set(table["schedule"]) == set(default_schedules(6))
    assert set(table.columns) >= {
        "run",
        "family",
        "F",
        "G",
        "cost",
        "group",
        "cosine",
        "norm_ratio",
    }
    assert (run.path / "gradient_fidelity.png").exists()
    out = capsys.readouterr().out
    assert "smallest F whose cosine passes 0.9" in out and "plot:" in out
    spec = "exact,fullseq:2:1,1,2,gaussseidel:2:3"  # fullseq's weights keep their commas
    assert main(["gradient", str(run.path), "--n-sequences", "4", "--schedules", spec]) == 0
    table = load_table(run, "gradient_fidelity")
    assert set(table["schedule"]) == {"exact", "fullseq:2:1,1,2", "gaussseidel:2:3"}
    exact = table[table["schedule"] == "exact"]
    assert (exact["cosine"] - 1).abs().max() < 1e-9
    assert main(["gradient", str(run.path), "--schedules", "gaussseidel:7:1"]) == 2  # S > T
    assert "S=7" in capsys.readouterr().err
