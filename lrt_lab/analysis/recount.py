"""Restate what a run recorded with today's counters, without training it again.

Two kinds of record can be restated from what a run folder holds:

- **FLOPs.** Runs counted before the counter decomposed the operators that reach it whole under
  inference_mode (Rollout's rollout) were recorded without that work. A step's count depends on
  the run's config and the step's length only (and, for a schedule whose passes vary, its passes:
  `StepFlops`), so `restate_flops` counts one forward at each length the run trained at, on the
  model its config.json describes, both as the counter counts now and as it counted then, and adds
  the difference to every FLOP field: each train line's `step_flops` and running `flops`, each
  eval line's `flops`, and summary.json's `flops` and `reached.*.flops`. A run the change does not
  touch (no difference at any length) is left as it is.
- **Non-finite cross-entropy.** A run evaluated before NaN was kept as NaN recorded the mean of
  its finite positions' cross-entropy with the NaN ones as 0. The final evaluation's
  per_position table keeps each position's value, so `restate_nonfinite` rewrites the final
  evaluation's ce_* as NaN (null) wherever a counted position there is NaN, with
  `nonfinite_{mode}@{length}`, in summary.json and in the eval line of the same step. Earlier
  evaluation lines kept no per-position values and are left as they were.

What was rewritten is recorded in summary.json under `restated` (the earlier totals), so a
restated run says so.

- **Model conventions.** A config.json written before a convention field existed ran under the
  earlier convention (`lrt_lab.core.config.LEGACY_FIELDS`), which every reader already assumes;
  `record_conventions` writes those fields into it, so the file itself says what the run ran under.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from lrt_lab.analysis.loading import as_run
from lrt_lab.core.baselines import build_baseline, is_baseline_kind
from lrt_lab.core.config import ModelConfig, with_legacy_fields
from lrt_lab.core.loss import IGNORE_INDEX
from lrt_lab.core.model import LRT
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.store.results import write_json
from lrt_lab.training.budget import flop_counter_mode
from lrt_lab.training.loop import make_task
from lrt_lab.training.train_config import TrainConfig, stored_train_config


def _model(config: dict):
    """The model a stored config describes, under the conventions it ran with."""
    model_cfg = ModelConfig.from_dict(config["model"])
    kind = config["train"]["model"]
    return build_baseline(kind, model_cfg) if is_baseline_kind(kind) else LRT(model_cfg)


def step_counts(run, lengths, model=None) -> dict:
    """{length: (forward FLOPs, the same forward as the counter counted before it decomposed
    composite operators, the step's measured cost)} of one training step of the run at each
    length, on a batch drawn as the training loop draws its steps (`model`: the run's, if built
    already)."""
    run = as_run(run)
    config = run.config
    cfg = TrainConfig(**stored_train_config(config["train"]))
    task = make_task(cfg)
    torch.manual_seed(cfg.seed)
    model = (model if model is not None else _model(config)).train()
    schedule = parse_schedule(config.get("schedule") or cfg.schedule)
    generator = torch.Generator().manual_seed(cfg.seed)
    counts = {}
    for length in sorted(set(lengths)):
        batch = task.sample(cfg.batch_size, generator, length=length)
        targets = batch.targets.masked_fill(~batch.loss_mask, IGNORE_INDEX)
        with torch.no_grad(), flop_counter_mode() as now, flop_counter_mode(False) as before:
            result = run_schedule(model, batch.inputs, targets, schedule)
        counts[length] = (now.total, before.total, result.measured.cost)
    return counts


def restate_flops(run, write: bool = True) -> dict:
    """Add to the run's recorded FLOPs what the counter missed (module docstring), and rewrite its
    records when that is anything and `write`. The backward and every forward the counter saw
    stay as recorded (a schedule whose passes vary keeps its recorded scaling). Returns {"run",
    "recorded", "restated" (totals), "missed": {length: forward FLOPs per counted step}}; a run
    that recorded no FLOPs (trained before they were counted), or was restated already, is left
    alone."""
    run = as_run(run)
    records = run.metrics_records()
    train = [r for r in records if r.get("kind") == "train"]
    summary = run.summary or {}
    recorded = summary.get("flops")
    out = {"run": run.name, "recorded": recorded, "restated": recorded, "missed": {}}
    if not train or any(not _finite(r.get("step_flops")) for r in train):
        return out
    if "flops" in summary.get("restated", {}):  # restated once: its records are today's count
        return out
    model = _model(run.config)
    counts = step_counts(run, [r["length"] for r in train], model)
    out["missed"] = {L: now - before for L, (now, before, _) in counts.items() if now != before}
    if not out["missed"]:
        return out
    forward_cost = model.forward_cost
    total, at_step = 0.0, {}
    for line in train:
        now, before, cost = counts[line["length"]]
        passes = line["step_cost"] / forward_cost  # the schedule's measured cost that step
        line["step_flops"] += (now - before) * (passes / cost if cost else 1.0)
        total += line["step_flops"]
        line["flops"] = at_step[line["step"]] = total
    out["restated"] = total
    if not write:
        return out
    for line in records:
        if line.get("kind") == "eval" and line.get("step") in at_step:
            line["flops"] = at_step[line["step"]]
    run.replace_metrics(records)
    summary["flops"] = total
    for reach in (summary.get("reached") or {}).values():
        if isinstance(reach, dict) and reach.get("step") in at_step:
            reach["flops"] = at_step[reach["step"]]
    summary.setdefault("restated", {})["flops"] = {"recorded": recorded}
    run.write_summary(summary)
    return out


def restate_nonfinite(run, write: bool = True) -> dict:
    """Mark the final evaluation's cross-entropies NaN where a counted position of its
    per_position table is (module docstring). Returns {"run", "nonfinite": {key: positions}}."""
    run = as_run(run)
    summary = run.summary
    path = run.tables().get("per_position")
    out = {"run": run.name, "nonfinite": {}}
    if summary is None or "eval" not in summary or path is None:
        return out
    table = pd.read_csv(path)
    if not {"ce", "accuracy", "length", "mode"} <= set(table.columns):
        return out  # a table written before cross-entropy was evaluated: nothing to read
    for (length, mode), rows in table.groupby(["length", "mode"]):
        # NaN accuracy: nothing counted there; a counted position has an accuracy, and NaN
        # cross-entropy there came from non-finite logits
        n = int((rows["ce"].isna() & rows["accuracy"].notna()).sum())
        key = f"ce_{mode}@{length}"
        if n and key in summary["eval"] and _finite(summary["eval"][key]):
            out["nonfinite"][key] = n
    if not (write and out["nonfinite"]):
        return out
    records = run.metrics_records()
    # (a restated value is NaN now, so a second call finds nothing finite to restate)
    evals = [r for r in records if r.get("kind") == "eval"]
    final = evals[-1] if evals and evals[-1].get("step") == summary.get("steps") else None
    recorded = {}
    for key, n in out["nonfinite"].items():
        mode_at = key[len("ce_") :]
        recorded[key] = summary["eval"][key]
        for target in [summary["eval"]] + ([final] if final is not None else []):
            target[key] = math.nan
            target[f"nonfinite_{mode_at}"] = n
    if final is not None:
        run.replace_metrics(records)
    summary.setdefault("restated", {})["nonfinite"] = {"recorded": recorded}
    run.write_summary(summary)
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def record_conventions(run, write: bool = True) -> list[str]:
    """Write into the run's config.json the convention fields it predates, with the values it ran
    under (module docstring). Returns the fields added ("model.window_convention", ...)."""
    run = as_run(run)
    config = run.config
    model = config.get("model")
    if not isinstance(model, dict):
        return []
    full = with_legacy_fields(model)
    added = [f"model.{k}" for k in full if k not in model]
    if isinstance(model.get("memory"), dict):
        added += [f"model.memory.{k}" for k in full["memory"] if k not in model["memory"]]
    if added and write:
        write_json(run.path / "config.json", {**config, "model": full})
    return added
