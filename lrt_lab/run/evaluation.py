"""Evaluation with the decoding the model will really use (paper sec. 4): per-position accuracy
and pos@90 at each evaluation length, with the training schedule's parallel forward *and* with exact
recurrent decoding (the Decoder, one position at a time), so the train/inference mismatch is
visible.
"""

from __future__ import annotations

import contextlib

import pandas as pd
import torch
import torch.nn.functional as F

from lrt_lab.core.token_ids import check_token_ids, vocab_size_of
from lrt_lab.run.decode import Decoder
from lrt_lab.run.metrics import pos_at
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


@torch.no_grad()  # the cross-entropy sums would otherwise hold every chunk's graph
def evaluate(
    model, schedule, eval_sets: dict, exact: bool = True, chunk: int = EVAL_CHUNK, autocast=None
) -> dict:
    """{length: {"parallel": scores, "exact": scores}}, scores = {"accuracy": acc[T], "ce": ce[T],
    "count": n[T]}: per-position accuracy and mean cross-entropy in nats (CPU float tensors; NaN
    at a position with no counted example), with the training schedule's parallel forward and with
    exact recurrent decoding; where exact decoding ran, its scores also hold "agreement": the
    share of counted examples at each position whose argmax token is the parallel forward's.

    For a model without memory, exact decoding equals the parallel forward (tested in
    tests/test_core.py and tests/test_baselines.py), so it is not recomputed, unless the model
    says its parallel forward only approximates its decoding (`has_sequential_decoding`, ponder).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = {}
    for length, batch in eval_sets.items():
        parts = {"parallel": [], "exact": []}  # per chunk: (hits, ce sums, counts) per position
        agree = []  # per chunk: positions where both forwards predict the same token
        for i in range(0, batch.inputs.size(0), chunk):
            inputs = batch.inputs[i : i + chunk].to(device)
            targets = batch.targets[i : i + chunk].to(device)
            mask = batch.loss_mask[i : i + chunk].to(device)
            with autocast or contextlib.nullcontext():
                par = run_schedule(model, inputs, None, schedule).logits
                parts["parallel"].append(_position_sums(par, targets, mask))
                if exact and (model.pathway is not None or model.has_sequential_decoding):
                    ex = exact_logits(model, inputs)
                    parts["exact"].append(_position_sums(ex, targets, mask))
                    same = (par.argmax(-1) == ex.argmax(-1)) & mask.bool()
                    agree.append(same.sum(0).float().cpu())
        res = {mode: _position_means(sums) for mode, sums in parts.items() if sums}
        if agree:  # how often the training forward picks the token exact decoding picks
            res["exact"]["agreement"] = sum(agree) / res["exact"]["count"].clamp(min=1)
        if "exact" not in res:
            res["exact"] = res["parallel"]
        out[length] = res
    model.train(was_training)
    return out


def _position_sums(logits, targets, mask) -> tuple:
    """(hits, summed cross-entropy, counts) per position over a chunk's counted examples."""
    mask = mask.bool()
    hits = ((logits.argmax(-1) == targets) & mask).sum(0).float().cpu()
    ce = F.cross_entropy(logits.float().transpose(1, 2), targets.clamp(min=0), reduction="none")
    # where, not a product: an uncounted example's non-finite loss (0 * NaN) must not reach the
    # position's sum, while a counted one's must (NaN logits are a NaN cross-entropy, never 0)
    ce = torch.where(mask, ce, torch.zeros_like(ce)).sum(0).cpu()
    return hits, ce, mask.sum(0).cpu()


def _position_means(sums: list) -> dict:
    hits, ce, n = (sum(s[k] for s in sums) for k in range(3))
    nan = torch.full_like(hits, float("nan"))
    counted = n > 0
    return {
        "accuracy": torch.where(counted, hits / n.clamp(min=1), nan),
        "ce": torch.where(counted, ce / n.clamp(min=1), nan),
        "count": n,
    }


def eval_record(results: dict) -> dict:
    """Per evaluation length and decoding mode, for a metrics line: pos@90, the mean accuracy, and
    the cross-entropy in nats per counted token (ce_*; for a byte-level task BPB = ce / ln 2).
    A cross-entropy that is not finite at some position (NaN logits) is recorded as NaN (null in
    the JSON), never as a number, with nonfinite_{mode}@{length}: how many positions it was."""
    rec = {}
    for length, res in results.items():
        for mode, scores in res.items():
            acc, n = scores["accuracy"], scores["count"]
            rec[f"pos90_{mode}@{length}"] = pos_at(acc, 0.9, skip_nan=True)
            rec[f"acc_{mode}@{length}"] = float(torch.nanmean(acc))
            total = n.sum().item()
            # positions without a counted example carry NaN and weigh nothing; a counted position
            # whose cross-entropy is NaN or inf makes the mean so, and is counted apart
            counted = n > 0
            ce = torch.where(counted, scores["ce"] * n, torch.zeros_like(scores["ce"]))
            rec[f"ce_{mode}@{length}"] = ce.sum().item() / total if total else float("nan")
            nonfinite = int((counted & ~torch.isfinite(scores["ce"])).sum())
            if nonfinite:
                rec[f"nonfinite_{mode}@{length}"] = nonfinite
            if "agreement" in scores:  # argmax agreement of the parallel forward with exact
                hits = (scores["agreement"] * n).sum().item()
                rec[f"agree@{length}"] = hits / total if total else float("nan")
    return rec


def per_position_table(results: dict) -> pd.DataFrame:
    """One row per (length, mode, position): the run's per_position table."""
    rows = []
    for length, res in results.items():
        for mode, scores in res.items():
            agreement = scores.get("agreement", torch.full_like(scores["ce"], float("nan")))
            columns = zip(*(scores[k].tolist() for k in ("accuracy", "ce")), agreement.tolist())
            for p, (a, ce, agree) in enumerate(columns):
                rows.append(
                    {
                        "length": length,
                        "mode": mode,
                        "position": p + 1,
                        "accuracy": a,
                        "ce": ce,
                        "agreement": agree,
                    }
                )
    return pd.DataFrame(rows)
