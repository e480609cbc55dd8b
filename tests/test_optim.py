"""Optimizer groups by declared role; gate matrices trained so they stay unsaturated."""

import pytest
import torch
import torch.nn as nn

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.core.baselines import build_baseline
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact, Interleaved
from lrt_lab.training.loop import TrainConfig, build_model, make_optimizers, prepare
from lrt_lab.training.optim import (
    ROLES,
    Muon,
    build_optimizers,
    gate_saturation,
    newton_schulz,
    optimizer_step,
    param_roles,
    set_lr_schedule,
)


@pytest.mark.parametrize(
    "memory",
    [
        None,
        MemoryConfig(),
        MemoryConfig(
            queries=True, projections="layerwise", source_layer=2, source_avg=2, lag_avg=2
        ),
    ],
)
def test_every_parameter_has_exactly_one_role(memory):
    model = LRT(preset("tiny", memory=memory))
    roles = param_roles(model)
    assert set(roles) == {n for n, _ in model.named_parameters()}
    assert all(r in ROLES for r in roles.values())
    assert all(p.ndim == 2 for n, p in model.named_parameters() if roles[n] == "matrix")
    opts = build_optimizers(model, {r: 0.01 for r in ROLES})
    in_groups = [id(p) for o in opts for g in o.param_groups for p in g["params"]]
    assert sorted(in_groups) == sorted(id(p) for p in model.parameters())


def test_baselines_are_covered_too():
    model = build_baseline("loop:2", preset("tiny"))
    assert set(param_roles(model)) == {n for n, _ in model.named_parameters()}


def test_an_undeclared_parameter_is_an_error():
    model = LRT(preset("tiny", memory=MemoryConfig()))
    model.pathway.extra = torch.nn.Parameter(torch.zeros(3))  # a new mechanism that forgot its role
    with pytest.raises(ValueError, match="pathway.extra"):
        param_roles(model)


def test_gate_saturation_counts_values_outside_the_range():
    g = torch.tensor([0.01, 0.5, 1.0, 1.97, 1.94])
    assert gate_saturation([g]) == pytest.approx(2 / 5)


@pytest.mark.slow
def test_gates_stay_unsaturated_after_30_steps_of_the_toy_a5_recipe():
    """experiments/a5_cpu.toml's LRT recipe (d=128, 256 sequences, 4 -> 8 curriculum,
    Interleaved(2), its rates) for 30 steps: fewer than 5% of gate values outside [0.05, 1.95].
    Two blocks instead of four and 30 steps instead of 60 keep the test short: what sets the gate
    update is the rate, the width and the batch (at 128 sequences even Muon's gates reach 17%), not
    the depth. At this shape, with the gate matrices in AdamW at the scalar rate, as before, 49%
    were saturated (the recipe's four blocks after 60 steps: 64%; with Muon 0.0% in all three)."""
    cfg = TrainConfig(
        task="a5_prefix",
        length=8,
        preset="small",
        model="lrt",
        schedule="interleaved:2",
        steps=800,
        batch_size=256,
        task_options={"curriculum_start": 4, "curriculum_steps": 300},
        overrides={"n_layer": 2, "memory.gamma_init": 0.0, "memory.rec_init": "zero"},
        eval_lengths=(8,),
        device="cpu",
    )
    task, _, schedule = prepare(cfg, None)
    torch.manual_seed(0)
    model = build_model(cfg, task.vocab_size)
    opts = make_optimizers(model, cfg)
    gen = torch.Generator().manual_seed(0)
    for step in range(30):
        set_lr_schedule(opts, step, cfg.steps, cfg.warmdown_frac)
        b = task.sample(256, gen, length=task.length_at(step))
        run_schedule(model, b.inputs, b.targets, schedule).loss.backward()
        optimizer_step(opts, list(model.parameters()), cfg.grad_clip)
    cache = {}
    with torch.no_grad():
        run_schedule(
            model,
            task.sample(64, torch.Generator().manual_seed(1), length=8).inputs,
            None,
            Exact(),
            cache=cache,
        )
    gates = [v for k, v in cache.items() if "hook_gate" in k]
    assert len(gates) == 2 * model.config.n_layer == 4
    assert gate_saturation(gates) < 0.05


@pytest.mark.slow
def test_gates_stay_unsaturated_after_3_steps_of_the_scale_recipe_at_d768():
    """lrt_scale.train's optimizers at the paper's rates (matrix 0.02, scalar 0.5 at a 2^19-token
    batch) and d12's weight decay, d=768 (the d12 width), Interleaved(2): after 3 steps fewer than
    5% of gate values are saturated. One block, 16 positions and 2 rows keep the test short: the
    rates depend on the width and the nominal batch, not on the depth or the rows fed (Muon's
    orthogonalisation of the 768-wide matrices is most of the cost, per block). With W_g in AdamW
    at the scalar rate, 85% were at this shape (2 blocks of 64 positions, 4 rows: 82%; with Muon
    0.0% at both shapes and in the full 12-block d12, README)."""
    from lrt_scale import train as st
    from lrt_scale.batches import SyntheticData

    torch.manual_seed(0)
    model = LRT(preset("d12", memory=MemoryConfig(), n_layer=1, sequence_len=16, vocab_size=512))
    args = st.parse_args(["--preset", "d12", "--synthetic", "--steps", "3"])
    args.n_layer, args.total_steps, args.seq_len = 12, 3, 16  # d12's weight decay
    opts = st.make_optimizers(model, args)
    data = SyntheticData(512, 16, 2, 0, 1, 0, "copy", "cpu")
    schedule = Interleaved(2)
    for step in range(3):
        st.set_schedules(opts, step, args)
        x, y = data.batch(step, 0)
        run_schedule(model, x, y, schedule).loss.backward()
        st.optimizer_step(opts, model.parameters(), 0.0)
    moved = model.pathway.gates[0].weight.abs().max()
    assert moved > 1e-3  # the gates did train
    cache = {}
    with torch.no_grad():
        run_schedule(model, data.batch(99, 0)[0], None, schedule, cache=cache)
    gates = [v for k, v in cache.items() if "hook_gate" in k]
    assert len(gates) == 2
    assert gate_saturation(gates) < 0.05


@pytest.mark.parametrize("shape,adjust", [((48, 16), None), ((16, 40), "match_rms_adamw")])
def test_cpu_muon_follows_torch_muon(shape, adjust):
    """lrt_lab.training.optim.Muon orthogonalises in float32 on CPU; torch.optim.Muon in bfloat16.
    Three
    steps from the same start, with momentum, weight decay and the rate scaling, must agree to
    bf16 precision: same update rule, only a more precise orthogonalisation."""
    torch.manual_seed(0)
    start = torch.randn(*shape)
    grads = [torch.randn(*shape) for _ in range(3)]
    params = []
    for cls in (torch.optim.Muon, Muon):
        p = nn.Parameter(start.clone())
        opt = cls([p], lr=0.05, momentum=0.9, weight_decay=0.1, adjust_lr_fn=adjust)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        params.append(p.detach())
    moved = (params[0] - start).norm()
    assert (params[1] - params[0]).norm() / moved < 2e-2


def test_newton_schulz_orthogonalises():
    """The quintic iteration maps every singular value of a generic matrix into about [0.5, 1.5]
    (Muon's design; condition number 100 here) while keeping the singular vectors: checked
    against a float64 SVD."""
    torch.manual_seed(1)
    g = torch.randn(64, 24, dtype=torch.float64) @ torch.diag(
        torch.logspace(-1, 1, 24, dtype=torch.float64)
    )
    out = newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    sv = torch.linalg.svdvals(out)
    assert sv.min() > 0.3 and sv.max() < 1.6
    # out ~ U diag(s') V^T with the same U, V: projecting onto them leaves a diagonal matrix
    core = u.T @ out @ vh.T
    assert (core - torch.diag(torch.diagonal(core))).abs().max() < 1e-8
