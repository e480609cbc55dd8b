"""Evaluation with the decoding the model will really use (paper sec. 4): per-position accuracy
and pos@90 at each evaluation length, with the training schedule's parallel forward *and* with exact
recurrent decoding (the Decoder, one position at a time), so the train/inference mismatch is
visible.
"""

from __future__ import annotations

import contextlib

import pandas as pd
import torch

from lrt_lab.core.token_ids import check_token_ids, vocab_size_of
from lrt_lab.run.decode import Decoder
from lrt_lab.run.metrics import per_position_accuracy, pos_at
from lrt_lab.run.runner import run_schedule

EVAL_CHUNK = 128  # evaluation sequences per forward (evaluate's chunk)


@torch.no_grad()
def exact_logits(model, inputs: torch.Tensor) -> torch.Tensor:
    """Logits under exact recurrent decoding: one Decoder step per position."""
    # once, not once per position (a sync each on CUDA)
    check_token_ids("inputs", inputs, vocab_size_of(model))
    dec = Decoder(model, inputs.size(0), inputs.size(1))
    return torch.stack(
        [dec.step(inputs[:, t], check_values=False) for t in range(inputs.size(1))], dim=1
    )


def evaluate(
    model, schedule, eval_sets: dict, exact: bool = True, chunk: int = EVAL_CHUNK, autocast=None
) -> dict:
    """{length: {"parallel": acc[T], "exact": acc[T]}} per-position accuracy (CPU float tensors).

    For a model without memory, exact decoding equals the parallel forward (tested in
    tests/test_core.py and tests/test_baselines.py), so it is not recomputed, unless the model
    says its parallel forward only approximates its decoding (`has_sequential_decoding`, ponder).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = {}
    for length, batch in eval_sets.items():
        accs = {"parallel": [], "exact": []}
        for i in range(0, batch.inputs.size(0), chunk):
            inputs = batch.inputs[i : i + chunk].to(device)
            targets = batch.targets[i : i + chunk].to(device)
            mask = batch.loss_mask[i : i + chunk].to(device)
            with autocast or contextlib.nullcontext():
                par = run_schedule(model, inputs, None, schedule).logits
                accs["parallel"].append((per_position_accuracy(par, targets, mask), mask.sum(0)))
                if exact and (model.pathway is not None or model.has_sequential_decoding):
                    ex = exact_logits(model, inputs)
                    accs["exact"].append((per_position_accuracy(ex, targets, mask), mask.sum(0)))
        res = {}
        for mode, parts in accs.items():
            if not parts:
                continue
            num = sum(torch.nan_to_num(a.float().cpu()) * n.cpu() for a, n in parts)
            den = sum(n.cpu() for _, n in parts)
            res[mode] = torch.where(
                den > 0, num / den.clamp(min=1), torch.full_like(num, float("nan"))
            )
        if "exact" not in res:
            res["exact"] = res["parallel"]
        out[length] = res
    model.train(was_training)
    return out


def eval_record(results: dict) -> dict:
    """pos@90 and mean accuracy per evaluation length and decoding mode, for a metrics line."""
    rec = {}
    for length, res in results.items():
        for mode, acc in res.items():
            rec[f"pos90_{mode}@{length}"] = pos_at(acc, 0.9, skip_nan=True)
            rec[f"acc_{mode}@{length}"] = float(torch.nanmean(acc))
    return rec


def per_position_table(results: dict) -> pd.DataFrame:
    """One row per (length, mode, position): the run's per_position table."""
    rows = []
    for length, res in results.items():
        for mode, acc in res.items():
            for p, a in enumerate(acc.tolist()):
                rows.append({"length": length, "mode": mode, "position": p + 1, "accuracy": a})
    return pd.DataFrame(rows)
