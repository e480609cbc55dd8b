"""Tiny real run stores and the dashboard under streamlit.testing.v1.AppTest, shared by test_app,
test_app_browser and test_fixedpoint (its Convergence page)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("streamlit")
from helpers import tiny_train_config
from streamlit.testing.v1 import AppTest  # noqa: E402

from lrt_lab.store.results import Run, write_table  # noqa: E402
from lrt_lab.training.loop import TrainConfig, train  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")


def tiny_config(model: str, schedule: str, seed: int) -> TrainConfig:
    return tiny_train_config(
        model=model, schedule=schedule, steps=6, eval_every=3, eval_lengths=(6, 12), seed=seed
    )


# group_prefix-L6-tiny-lrt-interleaved_2-s0-o<digest of the task options>, ...
LRT_RUNS = [tiny_config("lrt", "interleaved:2", seed).run_name for seed in (0, 1)]
TRANSFORMER_RUN = tiny_config("transformer", "onepass", 0).run_name
UNKNOWN_RUN = "mystery-kind-s0"
COMPLETE_RUNS = LRT_RUNS + [TRANSFORMER_RUN]


def build_store(root: Path, analysis: bool = True, lrt_seeds=(0, 1)) -> Path:
    """Tiny real runs (a second or two each), then the awkward folders and the analysis tables."""
    torch.set_num_threads(1)
    runs = [("lrt", "interleaved:2", seed) for seed in lrt_seeds] + [("transformer", "onepass", 0)]
    for model, schedule, seed in runs:
        train(tiny_config(model, schedule, seed), out=root, progress=False)
    if not analysis:
        return root
    # A run of a kind the dashboard does not know (a later baseline, say).
    shutil.copytree(
        root / TRANSFORMER_RUN, root / UNKNOWN_RUN, ignore=shutil.ignore_patterns("checkpoints")
    )
    cfg = json.loads((root / UNKNOWN_RUN / "config.json").read_text())
    cfg["kind"], cfg["schedule"] = "mystery:7", "weird"
    (root / UNKNOWN_RUN / "config.json").write_text(json.dumps(cfg))
    # A half-written folder (cut config.json) and a run still training (no summary.json).
    (root / "half-written").mkdir()
    (root / "half-written" / "config.json").write_text('{"train": {"task": ')
    (root / "still-running").mkdir()
    shutil.copy(root / TRANSFORMER_RUN / "config.json", root / "still-running" / "config.json")
    # the log as it was while training: plain (the complete run's is compacted to an .xz)
    log = Run(root / TRANSFORMER_RUN).metrics_bytes()
    (root / "still-running" / "metrics.jsonl").write_bytes(log)
    # Analysis tables in the layout lrt_lab.analysis writes: probe_<decoding> in a run, and
    # gap recovery (+ per seed) and a depth sweep in the store's hidden .analysis folder.
    probe = pd.DataFrame(
        [
            {
                "run": LRT_RUNS[0],
                "kind": "lrt",
                "site": site,
                "target": "state",
                "position": p,
                "control": control,
                "accuracy": min(1.0, 0.2 + 0.1 * i + 0.05 * p),
                "n_test": 10,
                "decoding": "exact",
                "layer_index": i,
            }
            for i, site in enumerate(
                ["hook_embed", "blocks.0.hook_resid_post", "hook_mem_in", "hook_mem_out"]
            )
            for p in range(1, 7)
            for control in ("probe", "majority")
        ]
    )
    Run(root / LRT_RUNS[0]).write_table("probe_exact", probe)
    (root / ".analysis").mkdir()
    group = {"config.train.task": "group_prefix", "config.train.length": 6}
    write_table(
        root / ".analysis",
        "gap_recovery",
        pd.DataFrame(
            [
                {
                    **group,
                    "method": m,
                    "n_seeds": 2,
                    "recovered": r,
                    "ci_low": r - 0.2,
                    "ci_high": r + 0.1,
                    "metric": "bpb.exact",
                    "baseline": "transformer",
                    "exact_method": "lrt exact",
                }
                for m, r in (("lrt interleaved:2", 0.75), ("lrt fullseq:3", 0.88))
            ]
        ),
    )
    write_table(
        root / ".analysis",
        "gap_recovery_per_seed",
        pd.DataFrame(
            [
                {**group, "method": m, "seed": s, "recovered": r}
                for m, r0 in (("lrt interleaved:2", 0.75), ("lrt fullseq:3", 0.88))
                for s, r in ((0, r0 - 0.05), (1, r0 + 0.05))
            ]
        ),
    )
    write_table(
        root / ".analysis",
        "depth_sweep",
        pd.DataFrame(
            [
                {
                    "task": "group_prefix",
                    "method": "transformer",
                    "n_layer": d,
                    "n": 2,
                    "mean": 2.0 * d,
                    "ci_low": 2.0 * d - 1,
                    "ci_high": 2.0 * d + 1,
                    "metric": "summary.eval.pos90_exact@6",
                }
                for d in (1, 2, 3)
            ]
            + [
                {
                    "task": "group_prefix",
                    "method": "lrt interleaved:2",
                    "n_layer": 2,
                    "n": 2,
                    "mean": 5.0,
                    "ci_low": 4.0,
                    "ci_high": 6.0,
                    "metric": "summary.eval.pos90_exact@6",
                }
            ]
        ),
    )
    return root


def run_app(monkeypatch, runs_dir) -> AppTest:
    monkeypatch.setenv("LRT_RUNS", str(runs_dir))
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py"])
    return AppTest.from_file(APP, default_timeout=60).run()


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


# Stores written by hand: every number known ------------------------------------------------------
def template_run(root: Path) -> Path:
    """One tiny real transformer run (a second): the config and summary the hand-written runs of
    `synthetic_store` start from."""
    torch.set_num_threads(1)
    cfg = tiny_train_config(
        model="transformer",
        schedule="onepass",
        steps=2,
        batch_size=4,
        eval_size=8,
        seed=0,
        name="template",
    )
    train(cfg, out=root, progress=False)
    return root / "template"


def synthetic_store(root: Path, template: Path, runs: list[dict]) -> Path:
    """A store of runs copied from `template` (template_run), each with its own config fields and
    metrics.jsonl: runs are dicts of name, seed, train (config.train fields to set: lr_scale, ...)
    and records (the metrics.jsonl lines, written as given)."""
    for spec in runs:
        path = root / spec["name"]
        shutil.copytree(template, path, ignore=shutil.ignore_patterns("checkpoints"))
        config = json.loads((path / "config.json").read_text())
        config["train"] |= {"seed": spec["seed"], "name": spec["name"], **spec.get("train", {})}
        (path / "config.json").write_text(json.dumps(config))
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in spec["records"]))
    return root


def loss_records(losses, cost: float = 1.0, tokens_per_step: int = 100) -> list[dict]:
    """metrics.jsonl train lines for losses at steps 1, 2, ...: tokens, compute (tokens x cost)
    and FLOPs (10 per compute token) as the trainer logs them."""
    return [
        {
            "kind": "train",
            "step": i,
            "loss": loss,
            "tokens": i * tokens_per_step,
            "compute_tokens": i * tokens_per_step * cost,
            "flops": 10.0 * i * tokens_per_step * cost,
            "time": 0.1 * i,
        }
        for i, loss in enumerate(losses, start=1)
    ]
