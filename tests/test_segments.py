"""Sweeps in segments of bounded wall time (lrt-lab sweep --time-limit;
experiments/run_paper_a5.sh):
a run cut by the time limit is checkpointed and continued by the next segment, and ends exactly
where an uninterrupted run ends."""

import sys

import pytest

from lrt_lab.store.results import Run, load_metrics
from lrt_lab.training.loop import train
from lrt_lab.training.sweep import expand, load_spec, run_sweep, validate_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SPEC = {
    "sweep": {
        "tasks": ["group_prefix"],
        "models": ["lrt"],
        "schedules": ["interleaved:2"],
        "seeds": [0],
    },
    "train": {
        "task_options": {"group": "S3"},
        "length": 6,
        "preset": "tiny",
        "steps": 40,
        "batch_size": 8,
        "eval_every": 20,
        "eval_lengths": [6, 12],
        "eval_size": 8,
        "checkpoint_every": 0,
        "device": "cpu",
        "memory_preset": "released",
    },
}


@pytest.mark.slow
def test_time_limited_segments_continue_exactly(tmp_path):
    spec = validate_spec(SPEC)
    segments = 0
    while not all(
        r.is_complete for r in run_sweep(spec, out=str(tmp_path / "seg"), time_limit_s=0.1)
    ):
        segments += 1
        # every segment trains at least one step, however slow the start-up: 40 steps, 40 segments
        assert segments < 40
    assert segments >= 2  # the limit really cut the run
    (cfg,) = expand(spec)
    full = train(cfg, out=tmp_path / "full", progress=False)
    cut = Run(tmp_path / "seg" / cfg.run_name)
    train_rows = load_metrics(cut, kind="train")
    assert train_rows["step"].tolist() == list(range(1, 41))  # every step logged once
    assert train_rows["loss"].tolist() == pytest.approx(
        load_metrics(full, kind="train")["loss"].tolist(), rel=1e-6
    )
    assert cut.summary["eval"] == full.summary["eval"]


def test_bad_time_limit_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="time_limit_s"):
        run_sweep(validate_spec(SPEC), out=str(tmp_path), time_limit_s=0)


def test_paper_spec_is_the_papers_setting():
    """experiments/a5_paper.toml: depth 4, d=256, trained at 64, evaluated at 64/128/256, 3 seeds,
    transformer, LRT with Interleaved(2) (the claim) and with FixedPoint(0.1, 8) (the study's best
    trainer),
    checkpoints for resuming."""
    spec = load_spec("experiments/a5_paper.toml")
    with open("experiments/a5_paper.toml", "rb") as f:
        assert tomllib.load(f)["sweep"]["seeds"] == [0, 1, 2]
    configs = expand(spec)
    assert sorted((c.model, c.schedule) for c in configs) == (
        [("lrt", "fixedpoint:0.1:8")] * 3
        + [("lrt", "interleaved:2")] * 3
        + [("transformer", "onepass")] * 3
    )
    for c in configs:
        assert (c.preset, c.length, c.eval_lengths) == (
            "a5",
            64,
            (64, 128, 256),
        ) and c.checkpoint_every > 0


def test_a_run_not_started_for_lack_of_time_is_returned_incomplete(tmp_path):
    """The time limit can run out while the grid is being checked, before any run starts: the runs
    come back incomplete (not left out), so `while not all(r.is_complete ...)` keeps going."""
    runs = run_sweep(validate_spec(SPEC), out=str(tmp_path), time_limit_s=1e-9)
    assert len(runs) == 1 and not runs[0].is_complete


def test_a_sweep_records_its_plan_in_the_store_and_a_dry_run_does_not(tmp_path):
    """What a partly run grid still owes (lrt_results.scaling.planned_seeds reads it): the
    runs and seeds of the spec, written before the first run starts."""
    from lrt_lab.store.results import load_plans

    spec = validate_spec({**SPEC, "sweep": {**SPEC["sweep"], "seeds": [3, 1]}})
    run_sweep(spec, out=str(tmp_path / "dry"), dry_run=True)
    assert load_plans(tmp_path / "dry") == []
    runs = run_sweep(spec, out=str(tmp_path / "s"), time_limit_s=1e-9)
    assert load_plans(tmp_path / "s") == [
        {"runs": sorted(r.path.name for r in runs), "seeds": [1, 3]}
    ]
