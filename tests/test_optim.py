"""Optimizer groups by declared role; gate matrices trained so they stay unsaturated."""

import pytest
import torch

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.baselines import build_baseline
from lrt_lab.optim import ROLES, build_optimizers, gate_saturation, param_roles
from lrt_lab.schedules import Exact, run_schedule
from lrt_lab.train import TrainConfig, build_model, make_optimizers, optimizer_step, prepare, set_schedules


@pytest.mark.parametrize("memory", [None, MemoryConfig(), MemoryConfig(queries=True, projections="layerwise", source_layer=2,
                                                                       source_avg=2, lag_avg=2)])
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
    model.memory.extra = torch.nn.Parameter(torch.zeros(3))  # a new mechanism that forgot its role
    with pytest.raises(ValueError, match="memory.extra"):
        param_roles(model)


def test_gate_saturation_counts_values_outside_the_range():
    g = torch.tensor([0.01, 0.5, 1.0, 1.97, 1.94])
    assert gate_saturation([g]) == pytest.approx(2 / 5)


@pytest.mark.slow
def test_gates_stay_unsaturated_after_60_steps_of_the_toy_a5_recipe():
    """experiments/a5_cpu.toml's LRT recipe (d=128, 256 sequences, 4 -> 8 curriculum,
    Interleaved(2)) for 60 steps: fewer than 5% of gate values outside [0.05, 1.95] (with the gate
    matrices in AdamW at the scalar rate, as before, 67% were)."""
    torch.set_num_threads(1)
    cfg = TrainConfig(task="a5_prefix", length=8, preset="small", model="lrt", schedule="interleaved:2",
                      steps=800, batch_size=256, task_options={"curriculum_start": 4, "curriculum_steps": 300},
                      overrides={"memory.gamma_init": 0.0, "memory.rec_init": "zero"}, eval_lengths=(8,),
                      device="cpu")
    task, _, schedule = prepare(cfg, None)
    torch.manual_seed(0)
    model = build_model(cfg, task.vocab_size)
    opts = make_optimizers(model, cfg)
    gen = torch.Generator().manual_seed(0)
    for step in range(60):
        set_schedules(opts, step, cfg)
        b = task.sample(256, gen, length=task.length_at(step))
        run_schedule(model, b.inputs, b.targets, schedule).loss.backward()
        optimizer_step(opts, list(model.parameters()), cfg.grad_clip)
    cache = {}
    with torch.no_grad():
        run_schedule(model, task.sample(64, torch.Generator().manual_seed(1), length=8).inputs, None, Exact(),
                     cache=cache)
    gates = [v for k, v in cache.items() if "hook_gate" in k]
    assert len(gates) == 2 * model.config.n_layer
    assert gate_saturation(gates) < 0.05
