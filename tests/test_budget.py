"""Budgets in tokens per parameter, counted FLOPs, and the evaluation's cross-entropy.

References are independent of the code under test: parameter counts summed by hand from the
model's modules, FLOPs from the matmul shapes (6 x tokens x weights, plus attention), a second
full count on every step, and cross-entropy from torch's own loss on the same logits.
"""

import math

import pytest
import torch
from helpers import tiny_train_config

from lrt_lab.core.config import memory_preset, preset
from lrt_lab.core.model import LRT
from lrt_lab.run.evaluation import eval_record, evaluate
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.store.results import load_metrics
from lrt_lab.training.budget import StepFlops, budget_steps, counted_params, flop_counter_mode
from lrt_lab.training.loop import TrainConfig, budgeted, train
from lrt_lab.training.sweep import checked_grid, expand, validate_spec


def lm(memory: bool, n_layer=2, d=32, T=16):
    torch.manual_seed(0)
    mem = memory_preset("paper", n_layer) if memory else None
    return LRT(preset("tiny", memory=mem, vocab_size=50, sequence_len=T, n_layer=n_layer, n_embd=d))


def test_counted_params_conventions_by_hand():
    model = lm(memory=True)
    assert counted_params(model, "all") == sum(p.numel() for p in model.parameters())
    # the released code's count: the weights of the linear maps (hidden matrices, gates, head), no
    # embeddings (token and value) and no scalars
    assert counted_params(model, "matrices") == _linear_weights(model)
    assert _linear_weights(model) < counted_params(model, "all")
    with pytest.raises(ValueError, match="param_convention='some' is invalid"):
        counted_params(model, "some")


def test_budget_steps_reach_the_tokens_with_a_growing_length():
    # 4 tokens per row at step 0, 8 from step 2: 4, 4, 8, 8 ... per row, 2 rows
    assert budget_steps(40, 2, lambda s: 4 if s < 2 else 8) == 4  # 8 + 8 + 16 = 32 < 40 <= 48
    assert budget_steps(48, 2, lambda s: 4 if s < 2 else 8) == 4
    assert budget_steps(49, 2, lambda s: 4 if s < 2 else 8) == 5
    assert budget_steps(1, 64, lambda s: 16) == 1


def text_cfg(**kw):
    base = dict(
        task="text_bytes",
        length=16,
        preset="tiny",
        model="lrt",
        schedule="interleaved:2",
        overrides={"n_layer": 2, "n_embd": 32},
        batch_size=4,
        eval_every=0,
        eval_lengths=(16,),
        eval_size=8,
        checkpoint_every=0,
        device="cpu",
    )
    return TrainConfig(**{**base, **kw})


def test_tokens_per_param_sets_the_steps_and_names_the_run(tmp_path):
    cfg = text_cfg(tokens_per_param=0.05)
    resolved = budgeted(cfg)
    with torch.device("meta"):
        from lrt_lab.training.loop import build_model

        n = sum(p.numel() for p in build_model(cfg, 256).parameters())
    assert resolved.steps == math.ceil(0.05 * n / (4 * 16))
    assert resolved.base_name.endswith("-R0.05-s0") and resolved.run_name == cfg.run_name
    matrices = budgeted(text_cfg(tokens_per_param=0.05, param_convention="matrices"))
    assert matrices.steps < resolved.steps and matrices.base_name.endswith("-R0.05-matrices-s0")
    # a sweep trains the budgeted steps, and finds the stored run unchanged on the next call
    spec = {
        "sweep": {"tasks": ["text_bytes"], "models": ["lrt"], "schedules": ["interleaved:2"]},
        "train": {k: v for k, v in cfg.to_dict().items() if k not in ("task", "model", "name")},
    }
    (grid,) = checked_grid(spec, str(tmp_path))
    assert grid.steps == resolved.steps
    run = train(grid, out=tmp_path, progress=False)
    assert run.config["train"]["steps"] == resolved.steps
    assert run.config["train"]["tokens_per_param"] == 0.05
    # the warm-down ends at the budget's last step
    lr = load_metrics(run, kind="train")["lr_mult"].tolist()
    assert len(lr) == resolved.steps and lr[-1] < lr[0] / 2
    assert run.summary["tokens"] >= 0.05 * n > run.summary["tokens"] - 4 * 16
    assert checked_grid(spec, str(tmp_path))[0].steps == resolved.steps
    with pytest.raises(ValueError, match="tokens_per_param=0 is invalid"):
        text_cfg(tokens_per_param=0)


def _linear_weights(model) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_counted_flops_of_a_transformer_step_match_the_matmul_shapes():
    model = lm(memory=False)
    B, T = 3, 16
    x, y = torch.randint(50, (B, T)), torch.randint(50, (B, T))
    with flop_counter_mode() as fwd:
        loss = run_schedule(model, x, y, parse_schedule("onepass")).loss
    with flop_counter_mode() as bwd:
        loss.backward()
    cfg = model.config
    head_dim = cfg.n_embd // cfg.n_head
    # QK^T and AV: 2 x (2 B H T^2 hd) forward (keys and values at the query's heads); the
    # backward's five products (the scores recomputed, then four gradients) 2.5 times that
    attention = cfg.n_layer * 4 * B * cfg.n_head * T * T * head_dim
    weights = _linear_weights(model)
    assert fwd.get_total_flops() == 2 * B * T * weights + attention
    assert bwd.get_total_flops() == 4 * B * T * weights + 5 * attention // 2


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_forward_flops_are_counted_whatever_the_autograd_mode(mode):
    """The one-pass forward's count equals the matmul shapes' with gradients on, under no_grad and
    under inference_mode (where composite operators such as matmul and linear reach the counter
    undecomposed, and were once counted as zero)."""
    model = lm(memory=False)
    B, T = 3, 16
    x = torch.randint(50, (B, T))
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad}.get(mode, torch.inference_mode)
    with context(), flop_counter_mode() as fwd:
        model(x)
    cfg = model.config
    attention = cfg.n_layer * 4 * B * cfg.n_head * T * T * (cfg.n_embd // cfg.n_head)
    assert fwd.get_total_flops() == 2 * B * T * _linear_weights(model) + attention


def test_the_rollout_of_rollout_is_in_its_step_flops():
    """Rollout(G) rolls the memory out under inference_mode: its count there equals the same
    rollout's count under no_grad (a second path through the counter), is nonzero, and the step's
    forward counts it on top of its G differentiated stages."""
    from lrt_lab.run.execution import rollout_memory

    model = lm(memory=True)
    x, y = torch.randint(50, (2, 16)), torch.randint(50, (2, 16))
    with flop_counter_mode() as inference:
        rollout_memory(model, x)
    with torch.no_grad(), flop_counter_mode() as no_grad:
        rollout_memory.__wrapped__(model, x)  # the same function without its inference_mode
    assert inference.get_total_flops() == no_grad.get_total_flops() > 0
    with flop_counter_mode() as step:
        run_schedule(model, x, y, parse_schedule("rollout:1"))
    with flop_counter_mode() as one_stage:
        run_schedule(model, x, y, parse_schedule("onepass"))
    assert step.get_total_flops() >= one_stage.get_total_flops() + inference.get_total_flops()


def test_step_flops_of_an_adaptive_schedule_match_a_full_count():
    """FixedPoint runs as many no-grad sweeps as it needs: scaling the counted step's forward by
    the passes, and keeping its backward, gives what counting the other step finds."""
    model = lm(memory=True)
    x, y = torch.randint(50, (2, 16)), torch.randint(50, (2, 16))

    def counted(spec):
        with flop_counter_mode() as fwd:
            result = run_schedule(model, x, y, parse_schedule(spec))
        with flop_counter_mode() as bwd:
            result.loss.backward()
        return fwd, bwd, result.measured.cost

    few = counted("fixedpoint:1000:8")  # converges at once
    many = counted("fixedpoint:0:8")  # never converges: all 8 sweeps
    assert many[2] > few[2] + 2  # the two steps ran different numbers of passes
    meter = StepFlops()
    meter.step(16, few[0], few[1], few[2])
    predicted = meter.step(16, None, None, many[2])
    exact = many[0].get_total_flops() + many[1].get_total_flops()
    assert predicted == pytest.approx(exact, rel=0.02)
    # counting passes alone (forward and backward scaled together) would overstate it
    naive = (few[0].get_total_flops() + few[1].get_total_flops()) * many[2] / few[2]
    assert naive > 1.2 * exact


def test_a_run_records_flops_epochs_and_what_corpus_it_read(tmp_path):
    run = train(text_cfg(steps=3), out=tmp_path, progress=False)
    steps = load_metrics(run, kind="train")
    assert run.summary["flops"] == pytest.approx(steps["step_flops"].sum())
    assert (steps["step_flops"] == steps["step_flops"].iloc[0]).all()  # one length, fixed passes
    assert steps["step_flops"].iloc[0] > 0
    info = run.config["task_info"]
    train_bytes = info["bytes"]["train"]
    assert run.summary["epochs"] == pytest.approx(3 * 4 * 16 / train_bytes)


def test_evaluation_cross_entropy_matches_torch_loss():
    model = lm(memory=True)
    torch.manual_seed(1)
    x, y = torch.randint(50, (5, 16)), torch.randint(50, (5, 16))
    mask = torch.rand(5, 16) > 0.3
    mask[:, 3] = False  # a position nothing counts at
    batch = type("B", (), {"inputs": x, "targets": y, "loss_mask": mask})
    res = evaluate(model, parse_schedule("interleaved:2"), {16: batch}, exact=True, chunk=2)
    with torch.no_grad():
        logits = run_schedule(model, x, None, parse_schedule("interleaved:2")).logits
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none").double()
    per_position = (ce * mask).sum(0) / mask.sum(0)
    got = res[16]["parallel"]["ce"]
    assert not got.requires_grad  # no autograd graph kept alive by the results
    assert math.isnan(got[3]) and math.isnan(per_position[3])
    keep = torch.arange(16) != 3
    assert torch.allclose(got[keep].double(), per_position[keep], rtol=1e-5)
    with torch.no_grad():
        from lrt_lab.run.evaluation import exact_logits

        same = (logits.argmax(-1) == exact_logits(model, x).argmax(-1)) & mask
    agreement = res[16]["exact"]["agreement"]
    assert torch.allclose(agreement[keep].double(), (same.sum(0) / mask.sum(0))[keep].double())
    rec = eval_record(res)
    assert rec["agree@16"] == pytest.approx(same.sum().item() / mask.sum().item())
    assert 0 < rec["agree@16"] < 1  # an untrained memory: the two forwards differ somewhere
    assert rec["ce_parallel@16"] == pytest.approx((ce * mask).sum().item() / mask.sum().item())
    assert rec["ce_exact@16"] != pytest.approx(rec["ce_parallel@16"], rel=1e-6)


def test_a_nan_cross_entropy_is_recorded_as_nan_and_an_uncounted_one_is_not_counted():
    """NaN logits at counted positions give a NaN cross-entropy and a count of the positions, never
    a number (they were once read as 0); NaN logits only where nothing is counted leave the mean
    what torch's loss gives over the counted targets."""
    model = lm(memory=False)
    x, y = torch.randint(1, 50, (4, 16)), torch.randint(50, (4, 16))
    x[0, 0] = 0  # token 0's embedding is NaN: every logit of example 0 is NaN
    with torch.no_grad():
        model.wte.weight[0] = float("nan")
        logits = model(x).logits
    assert logits[0].isnan().all() and not logits[1:].isnan().any()

    def record(mask):
        batch = type("B", (), {"inputs": x, "targets": y, "loss_mask": mask})
        return eval_record(evaluate(model, parse_schedule("onepass"), {16: batch}, chunk=2))

    mask = torch.rand(4, 16, generator=torch.Generator().manual_seed(0)) > 0.2
    mask[0, :2], mask[0, 2:] = True, False  # NaN counted at positions 1 and 2 only
    rec = record(mask)
    assert math.isnan(rec["ce_parallel@16"]) and rec["nonfinite_parallel@16"] == 2
    mask[0] = False  # every NaN uncounted
    rec = record(mask)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none")
    counted = ce[mask]
    assert rec["ce_parallel@16"] == pytest.approx(counted.mean().item(), rel=1e-6)
    assert "nonfinite_parallel@16" not in rec


def test_a_sweep_expands_budgets_per_model_and_can_run_seed_by_seed():
    spec = validate_spec(
        {
            "sweep": {
                "tasks": ["text_bytes"],
                "models": ["transformer", "lrt", "loop2"],
                "seeds": [0, 1],
                "budgets": [5, 10],
                "order": "seeds",
            },
            "train": {"length": 16, "preset": "tiny"},
            "models": {
                "lrt": {"budgets": [2.5]},
                "loop2": {"model": "loop:2", "budgets": [20]},
            },
        }
    )
    configs = expand(spec)
    got = [(c.model, c.tokens_per_param, c.seed) for c in configs]
    # the sweep's budgets for the transformer, each variant's own for the others; all of seed 0
    # before any of seed 1
    assert got == [
        ("transformer", 5, 0),
        ("transformer", 10, 0),
        ("lrt", 2.5, 0),
        ("loop:2", 20, 0),
        ("transformer", 5, 1),
        ("transformer", 10, 1),
        ("lrt", 2.5, 1),
        ("loop:2", 20, 1),
    ]
    assert len({c.run_name for c in configs}) == 8
    assert configs[0].run_name == "text_bytes-L16-tiny-transformer-R5-s0"
    for bad, field in (({"budgets": [0]}, "sweep.budgets"), ({"order": "x"}, "sweep.order")):
        with pytest.raises(ValueError, match=field):
            validate_spec({"sweep": {"tasks": ["a5_prefix"], "models": ["lrt"], **bad}})


def test_first_reach_and_censoring(tmp_path):
    from lrt_lab.store.events import first_reach, reach_times
    from lrt_lab.store.results import load_runs

    evals = [
        {"kind": "eval", "step": 10, "compute_tokens": 100, "pos90_exact@8": 3},
        {"kind": "train", "step": 15, "pos90_exact@8": 8},  # not an evaluation
        {"kind": "eval", "step": 20, "compute_tokens": 200, "flops": 7.0, "pos90_exact@8": 8},
        {"kind": "eval", "step": 30, "compute_tokens": 300, "pos90_exact@8": 5},
    ]
    assert first_reach(evals, "pos90_exact@8", 8) == {
        "step": 20,
        "compute_tokens": 200,
        "flops": 7.0,
    }
    assert first_reach(evals, "pos90_exact@8", 9) is None
    # a trained run: its summary says when, and reach_times agrees with it (or censors)
    cfg = tiny_train_config(
        length=2,
        schedule="interleaved:2",
        steps=60,
        batch_size=64,
        eval_every=10,
        eval_lengths=(2,),
        eval_size=32,
    )
    run = train(cfg, out=tmp_path, progress=False)
    hit = run.summary["reached"]["pos90_exact@2"]  # S3 at length 2 is learnt within 60 steps
    times = reach_times(load_runs(tmp_path)).iloc[0]
    assert times["reached"] and times["time"] == hit["step"] and hit["step"] % 10 == 0
    evals = load_metrics(run, kind="eval")
    assert (evals.loc[evals["step"] < hit["step"], "pos90_exact@2"] < 2).all()
    with pytest.raises(ValueError, match="time='wall'"):
        reach_times(load_runs(tmp_path), time="wall")
