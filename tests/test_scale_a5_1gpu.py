"""experiments/run_paper_a5_1gpu.py: the paper-shape A5 spec, its CPU dry run, and the arithmetic
of its GPU-time prediction."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def a5():
    spec = importlib.util.spec_from_file_location(
        "run_paper_a5_1gpu", REPO / "experiments" / "run_paper_a5_1gpu.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_spec_is_the_papers_shape_one_seed_each(a5):
    cfgs = a5.configs(a5.SPEC)
    assert [(c.model, c.schedule) for c in cfgs] == [
        ("transformer", "onepass"),
        ("lrt", "interleaved:2"),
        ("lrt", "fixedpoint:0.1:8"),
    ]
    for c in cfgs:
        assert (c.preset, c.length, c.batch_size, c.seed) == ("a5", 64, 256, 0)
        assert tuple(c.eval_lengths) == (64, 128, 256) and c.eval_exact
        assert c.task_options == {"curriculum_start": 8, "curriculum_steps": 390}
        assert c.steps == 1300 and c.checkpoint_every == 0


def test_prediction_arithmetic(a5):
    """A GPU step = ops x the host's cost per op (at least GPU_OP_S) + FLOPs over GPU_FLOPS; an
    evaluation = the exact decoding steps of every length x a decoding step's ops x that cost."""
    m = {
        "cpu_tiny_fwd_bwd_s": 0.002,
        "ops_fwd_bwd_measured": 1000,  # 2 us per op on this host: the floor applies
        "ops_fwd_bwd": 1000,
        "ops_optimizer": 500,
        "flops_per_step_full_shape": 2e12,
        "optimizer_flops": 0.5e12,
        "ops_per_decode_step": 300,
    }

    class Cfg:
        eval_lengths = (64, 128, 256)

    p = a5.predict(m, Cfg)
    assert p["gpu_op_s"] == a5.GPU_OP_S
    assert p["gpu_step_s"] == pytest.approx(1500 * a5.GPU_OP_S + 2.5e12 / a5.GPU_FLOPS)
    assert p["gpu_eval_s"] == pytest.approx(448 * 300 * a5.GPU_OP_S)
    slow = a5.predict({**m, "cpu_tiny_fwd_bwd_s": 0.05}, Cfg)  # 50 us per op on this host
    assert slow["gpu_op_s"] == pytest.approx(50e-6)
    preds = [{"gpu_step_s": 0.1, "gpu_eval_s": 1.0}, {"gpu_step_s": 0.2, "gpu_eval_s": 2.0}]
    # 300 s - (2 x 15 s start + 5 x 3 s evaluations) = 255 s at 0.3 s per step: 850 -> 800
    assert a5.steps_that_fit(preds, [None, None], 300) == 800


@pytest.mark.slow
def test_dry_run_trains_every_run_and_scores_both_forwards(a5, tmp_path):
    """--dry-run: the spec's three runs at toy size on CPU through the same code, and the table
    with pos@90 for the parallel forward and exact decoding at every evaluation length."""
    assert a5.main(["--dry-run", "--out", str(tmp_path), "--quiet"]) == 0
    result = json.loads((tmp_path / "a5_paper_1gpu.json").read_text())
    assert len(result["rows"]) == 3 and all(r["complete"] for r in result["rows"])
    for r in result["rows"]:
        assert r["steps"] == 4
        for L in result["lengths"]:
            assert isinstance(r[f"pos90_parallel@{L}"], int)
            assert isinstance(r[f"pos90_exact@{L}"], int)
    page = (tmp_path / "a5_paper_1gpu.md").read_text()
    assert "parallel / exact" in page and page.count("| a5_prefix") == 3
