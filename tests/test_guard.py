"""The loss-spike guard (lrt_lab.training.guard): its rule, what a refusal restores, that a guard
which never fires changes nothing, and that resume refuses what the uninterrupted run did."""

import copy
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import tiny_train_config

from lrt_lab.run.runner import run_schedule
from lrt_lab.store.collapse import first_collapse
from lrt_lab.store.results import Run, load_metrics
from lrt_lab.training import guard as guard_module
from lrt_lab.training.guard import MAX_REFUSALS, SpikeGuard
from lrt_lab.training.loop import (
    _masked_targets,
    build_model,
    make_optimizers,
    make_task,
    train,
)
from lrt_lab.training.optim import optimizer_step, set_lr_schedule


def tiny_cfg(**kw):
    return tiny_train_config(
        **{"schedule": "exact", "steps": 30, "batch_size": 8, "checkpoint_every": 0, **kw}
    )


def hand_decisions(stream, threshold, arm, decay=0.9):
    """The guard's rule written out, with pandas' EMA over the accepted losses at each length."""
    out, here, length, in_row = [], [], None, 0
    for loss, n in stream:
        if n != length:
            here = []
        ema = pd.Series(here).ewm(alpha=1 - decay, adjust=False).mean().iloc[-1] if here else None
        spike = not math.isfinite(loss) or (len(here) >= arm and loss > ema + threshold)
        refuse = any(not r for r in out) and in_row < MAX_REFUSALS and spike
        out.append(refuse)
        if refuse:
            in_row += 1
        else:
            in_row, length = 0, n
            here.append(loss)
    return out


def test_the_rule_against_a_hand_ema(monkeypatch):
    monkeypatch.setattr(guard_module, "ARM_STEPS", 5)
    torch.manual_seed(0)
    losses = list(2.0 - 0.05 * torch.arange(12) + 0.02 * torch.randn(12))
    stream = [(float(x), 4) for x in losses]
    # just under the threshold above the mean: the mean's weighting decides this one
    ema = pd.Series([x for x, _ in stream]).ewm(alpha=0.1, adjust=False).mean().iloc[-1]
    stream += [(ema + 0.99, 4)]
    stream += [(5.0, 4), (5.0, 4), (5.0, 4), (5.0, 4)]  # refused 3 times, then given way
    stream += [(1.5, 4), (2.3, 4), (math.nan, 4), (1.4, 4)]  # a rise under the threshold; NaN
    stream += [(3.0, 8)] * 3 + [(2.9, 8)] * 4 + [(4.5, 8)]  # a new length: not armed at once
    model = torch.nn.Linear(2, 2)
    opts = [torch.optim.SGD(model.parameters(), lr=0.1)]
    g = SpikeGuard(threshold=1.0)
    got = []
    for step, (loss, n) in enumerate(stream, 1):
        refused = g.refuses(loss, n)
        got.append(refused)
        if refused:
            g.refuse(step, model, opts)
        else:
            g.keep(model, opts)
            g.accept(loss, n)
    want = hand_decisions(stream, 1.0, arm=5)
    assert got == want
    assert sum(want) == 5 and want[12:17] == [False, True, True, True, False]
    assert g.refused_steps == [i + 1 for i, r in enumerate(want) if r]
    assert g.lr_factor == 0.5**5


def _step(model, opts, batch, schedule="exact"):
    result = run_schedule(model, batch[0], batch[1], schedule)
    result.loss.backward()
    optimizer_step(opts, model.parameters(), 1.0)
    return result.loss.item()


def test_a_destructive_update_is_refused_and_restored_bit_for_bit(monkeypatch):
    monkeypatch.setattr(guard_module, "ARM_STEPS", 3)
    cfg = tiny_cfg()
    task = make_task(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, task.vocab_size)
    opts = make_optimizers(model, cfg)
    gen = torch.Generator().manual_seed(0)

    def batch():
        b = task.sample(8, gen, length=6)
        return b.inputs, _masked_targets(b)

    g = SpikeGuard(threshold=1.0)
    for step in range(5):
        set_lr_schedule(opts, step, 100, 0.5)
        g.keep(model, opts)
        g.accept(_step(model, opts, batch()), 6)
    # an independent copy of the state before the destructive update
    model2 = copy.deepcopy(model)
    opts2 = make_optimizers(model2, cfg)
    for o2, o in zip(opts2, opts):
        o2.load_state_dict(copy.deepcopy(o.state_dict()))
    g.keep(model, opts)
    g.accept(_step(model, opts, batch()), 6)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(300.0)
    spiking = batch()
    loss = run_schedule(model, *spiking, "exact").loss.item()
    assert loss > g.ema + 1.0
    assert g.refuses(loss, 6)
    g.refuse(7, model, opts)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    for o, o2 in zip(opts, opts2):
        s, s2 = o.state_dict()["state"], o2.state_dict()["state"]
        assert s.keys() == s2.keys()
        for k in s:
            for name, v in s[k].items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(s2[k][name])), name
    # the next step: the guard's (backed-off rates) against the copy's at half its rates
    nxt = batch()
    set_lr_schedule(opts, 7, 100, 0.5)
    g.scale_rates(opts)
    set_lr_schedule(opts2, 7, 100, 0.5)
    for o in opts2:
        for group in o.param_groups:
            group["lr"] = group["initial_lr"] * 0.5
    _step(model, opts, nxt)
    _step(model2, opts2, nxt)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_a_guard_that_never_fires_changes_nothing(tmp_path):
    off = train(tiny_cfg(name="off"), out=tmp_path, progress=False)
    on = train(tiny_cfg(name="on", spike_guard=1e6), out=tmp_path, progress=False)
    a, b = load_metrics(off, kind="train"), load_metrics(on, kind="train")
    assert a["loss"].tolist() == b["loss"].tolist()
    assert (b["guard_fired"] == 0).all() and "guard_fired" not in a
    assert on.summary["guard"] == {"refused_steps": [], "lr_factor": 1.0}
    assert off.summary["eval"] == on.summary["eval"]
    # the CPU seconds of the steps: counted from 0, growing, in the summary
    assert a["cpu_s"].is_monotonic_increasing and a["cpu_s"].iloc[0] > 0
    assert off.summary["cpu_s"] == a["cpu_s"].iloc[-1]


def test_resume_just_before_a_refusal_refuses_what_the_uninterrupted_run_did(tmp_path, monkeypatch):
    monkeypatch.setattr(guard_module, "ARM_STEPS", 3)
    # a threshold of 0 nats refuses every rise above the mean: refusals within 30 tiny steps
    full = train(tiny_cfg(name="full", spike_guard=0.0), out=tmp_path, progress=False)
    refused = full.summary["guard"]["refused_steps"]
    first = next(s for s in refused if s > 6)
    cut = tiny_cfg(name="cut", spike_guard=0.0)
    train(cut, out=tmp_path, progress=False, stop_after=first - 1)  # checkpointed there
    run = train(cut, out=tmp_path, resume=True, progress=False)
    a, b = load_metrics(full, kind="train"), load_metrics(run, kind="train")
    assert b["step"].tolist() == list(range(1, 31))
    assert b["guard_refused"].tolist() == a["guard_refused"].tolist()
    assert b["loss"].tolist() == pytest.approx(a["loss"].tolist(), rel=1e-6)
    assert run.summary["guard"] == full.summary["guard"]


ROLLOUT_RUNS = Path(__file__).resolve().parent.parent / "experiments" / "results"


def test_first_collapse_finds_the_four_collapsed_rollout_runs_of_the_a5_study():
    """Against an independent reading (pandas: the running minimum before each evaluation)."""
    found, expected = {}, set()
    for seed in range(10, 18):
        path = ROLLOUT_RUNS / f"trainers16-a5_prefix-L16-small-lrt-rollout_1-s{seed}-rollout"
        event = first_collapse(Run(path).metrics_records())
        if event is not None:
            found[seed] = event
        log = path / "metrics.jsonl"  # or its compacted .xz (pandas infers the compression)
        df = pd.read_json(log if log.exists() else log.with_suffix(".jsonl.xz"), lines=True)
        ev = df[df["kind"] == "eval"].dropna(subset=["ce_exact@16"])
        below_before = ev["ce_exact@16"].cummin().shift(1) < 1.0
        hits = ev[below_before & (ev["ce_exact@16"] > 3.0)]
        if len(hits):
            expected.add(seed)
            assert found[seed] == {"step": hits["step"].iloc[0], "flops": hits["flops"].iloc[0]}
    assert set(found) == expected == {13, 14, 16, 17}
    # a run that never got below `low` has no collapse, however high it goes
    records = [{"kind": "eval", "step": s, "flops": s, "ce_exact@16": 4.0} for s in (1, 2)]
    assert first_collapse(records) is None


def test_a_sweep_spec_sets_the_guard_and_the_stability_study_pre_states_its_arms():
    from lrt_lab.training.sweep import expand, load_spec

    spec = load_spec(ROLLOUT_RUNS.parent / "a5_rollout_stability.toml")
    guards = {(c.name.rsplit("-", 1)[-1], c.spike_guard, c.matrix_lr) for c in expand(spec)}
    assert guards == {
        ("rollout", None, 0.02),
        ("rollout_half", None, 0.01),
        ("rollout_guarded", 1.0, 0.02),
    }
    seeds = {c.seed for c in expand(spec)}
    assert seeds == set(range(30, 36))
    assert all(c.eval_lengths == (16, 32, 64) for c in expand(spec))  # 1x, 2x, 4x
