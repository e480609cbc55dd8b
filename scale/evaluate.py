"""Language-model evaluation at scale: validation BPB (parallel, per stage), sequential BPB, CORE.

Bits per byte (paper sec. 4 "Metrics"): BPB = sum_i nats_i / (ln 2 * sum_i bytes_i) over target
tokens, bytes_i = UTF-8 length of the target token (``Tokenizer.token_bytes()``). Targets with 0
bytes (special tokens such as ``<|bos|>``) or -1 count in neither sum, as in nanochat.

- ``parallel_bpb``: the training schedule's parallel forward (what validation loss measures); also
  per stage of Interleaved/FullSequence schedules (stage 0 is the init pass, i.e. zero memory;
  Interleaved subset s covers positions t % S == s only) and "merged" (each position's final
  logits).
- ``sequential_bpb``: what the model really does at inference, the recurrent ``Decoder``: one
  forward per token, optionally after prefilling a prompt of ``prompt_len`` tokens with OnePass,
  Interleaved(S) or Exact (the paper's 1,024 + 1,024 setting, app. "Parallel prefill"). Only the
  targets after the prompt are scored: positions t >= prompt_len - 1, i.e. every token that
  follows the prompt. For a plain transformer, and for an LRT under the Exact schedule, it equals
  ``parallel_bpb`` on the same positions (tested).
- ``evaluate_core``: the DCLM CORE suite as nanochat implements it (see below).

Under torchrun every function evaluates this rank's share and sums nats/bytes/counts over ranks
(``torch.distributed.all_reduce``), so all ranks return the global figure.

CORE bundle (a local directory; nothing is downloaded)
------------------------------------------------------
Two layouts are read:

1. DCLM's own eval bundle (as nanochat uses it): ``core.yaml`` with ``icl_tasks`` entries
   (``label``, ``dataset_uri``, ``num_fewshot`` (a list; the first is used), ``icl_task_type``,
   ``continuation_delimiter``), data under ``eval_data/<dataset_uri>`` (JSONL), and the random
   baselines (percent) in ``eval_meta_data.csv`` (columns ``Eval Task``, ``Random baseline``).
   Reading ``core.yaml`` needs PyYAML.
2. A plain JSON manifest ``core.json``: ``{"tasks": [{"label", "type", "num_fewshot",
   "random_baseline" (percent), "continuation_delimiter" (default " "), "dataset_uri" (JSONL path
   relative to the bundle, default "<label>.jsonl")}]}``.

Task types and their JSONL items (DCLM's schema):
- ``multiple_choice``: ``{"query", "choices": [...], "gold"}``; the prompts share the context and
  differ in the continuation; the prediction is the choice with the lowest mean loss over its
  continuation tokens.
- ``schema``: ``{"context_options": [...], "continuation", "gold"}``; the contexts differ and the
  continuation is shared; the prediction is the context under which the continuation has the
  lowest mean loss.
- ``language_modeling``: ``{"context", "continuation"}``; correct when the continuation is
  predicted exactly under greedy decoding (every continuation token is the argmax given the true
  prefix, which is the same as greedy generation reproducing it).

Few-shot examples: ``num_fewshot`` other items drawn with ``random.Random(1234 + i)``, rendered
before the item and separated by a blank line, exactly nanochat's templates; items are shuffled
with ``random.Random(1337)`` before ``max_per_task`` crops them. Centered accuracy
``(acc - r) / (1 - r)`` with r = random_baseline / 100; CORE = the mean centered accuracy.
For an LRT the forward is a schedule's parallel forward (default: the training schedule; pass
``Exact()`` for exact recurrence).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from lrt_lab.core.config import ModelConfig
from lrt_lab.core.loss import IGNORE_INDEX
from lrt_lab.core.model import LRT
from lrt_lab.core.token_ids import check_token_ids, vocab_size_of
from lrt_lab.run.decode import Decoder
from lrt_lab.run.registry import as_schedule, parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import OnePass
from lrt_lab.store.results import Run
from lrt_lab.training.checkpoints import check_belongs, read_checkpoint

from .batches import make_batches
from .distributed import (
    all_reduce_sum,
    autocast_for,
    rank_and_world,
    setup_distributed,
    teardown_distributed,
)

LN2 = math.log(2)
TASK_TYPES = ("multiple_choice", "schema", "language_modeling")


# BPB
# ------------------------------------------------------------------------------------------------
def token_nats(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position cross entropy in nats (in at least float32), 0 where the target is -1."""
    B, T = targets.shape
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    nats = F.cross_entropy(
        logits.reshape(B * T, -1), targets.reshape(-1).clamp(min=0), reduction="none"
    )
    return nats.view(B, T).masked_fill(targets == IGNORE_INDEX, 0.0)


def nats_and_bytes(
    logits: torch.Tensor,
    targets: torch.Tensor,
    token_bytes: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed nats, summed bytes) as float64 scalars over targets with > 0 bytes (and in mask)."""
    return _sum_nats_bytes(token_nats(logits, targets), targets, token_bytes, mask)


def _sum_nats_bytes(
    nats: torch.Tensor,
    targets: torch.Tensor,
    token_bytes: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    tb = token_bytes.to(targets.device)
    nbytes = torch.where(targets >= 0, tb[targets.clamp(min=0)], torch.zeros_like(targets))
    if mask is not None:
        nbytes = nbytes * mask.to(nbytes.dtype)
    counted = nbytes > 0
    return (nats.double() * counted).sum(), nbytes.double().sum()


def _check_token_bytes(token_bytes, vocab_size: int | None = None) -> torch.Tensor:
    if not isinstance(token_bytes, torch.Tensor) or token_bytes.dim() != 1:
        raise ValueError(
            "token_bytes is invalid; allowed: a 1-D tensor of byte lengths per token id"
        )
    if vocab_size is not None and token_bytes.numel() < vocab_size:
        raise ValueError(
            f"token_bytes has {token_bytes.numel()} entries; allowed: at least "
            f"vocab_size={vocab_size}"
        )
    return token_bytes


def _bpb(nats: float, nbytes: float) -> float:
    return nats / (LN2 * nbytes) if nbytes > 0 else math.nan


@torch.no_grad()
def parallel_bpb(
    model,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    token_bytes: torch.Tensor,
    schedule=None,
    autocast=None,
    min_position: int = 0,
) -> dict:
    """BPB of the schedule's parallel forward over `batches` of (inputs, targets), summed over
    ranks.

    Returns {"bpb" (merged final logits), "stages": [bpb per stage] (Interleaved/FullSequence only;
    [] otherwise), "nats", "bytes", "tokens"}. min_position: score only targets at t >= it (to
    compare with ``sequential_bpb`` after a prompt).
    """
    schedule = as_schedule(schedule)
    token_bytes = _check_token_bytes(token_bytes)
    was_training = model.training
    model.eval()
    sums, stage_sums, tokens = None, None, 0
    try:
        for inputs, targets in batches:
            T = inputs.size(1)
            mask = None
            if min_position:
                mask = (torch.arange(T, device=targets.device) >= min_position)[None].expand_as(
                    targets
                )
            with autocast or contextlib.nullcontext():
                out = run_schedule(model, inputs, None, schedule)
            n, b = nats_and_bytes(out.logits, targets, token_bytes, mask)
            per_stage = []
            # per-stage BPB where the stages are the same every batch (not FixedPoint's
            # data-dependent
            # count, nor Chunked's chunks: stage_weights None)
            if schedule.stage_weights(T) is not None:
                for P, lp in zip(out.stages, out.stage_logits):
                    sl = slice(P.start, P.stop, P.step)
                    per_stage.extend(
                        nats_and_bytes(
                            lp, targets[:, sl], token_bytes, None if mask is None else mask[:, sl]
                        )
                    )
            vec = torch.stack([n, b])
            sums = vec if sums is None else sums + vec
            if per_stage:
                st = torch.stack(per_stage)
                stage_sums = st if stage_sums is None else stage_sums + st
            tokens += targets.numel()
    finally:
        model.train(was_training)
    if sums is None:
        raise ValueError("batches is empty; allowed: at least one (inputs, targets) batch")
    device = sums.device
    packed = torch.cat(
        [
            sums,
            stage_sums if stage_sums is not None else sums.new_zeros(0),
            torch.tensor([float(tokens)], dtype=torch.float64, device=device),
        ]
    )
    packed = all_reduce_sum(packed).cpu().tolist()
    nats, nbytes, tokens = packed[0], packed[1], int(packed[-1])
    stages = packed[2:-1]
    return {
        "bpb": _bpb(nats, nbytes),
        "stages": [_bpb(stages[i], stages[i + 1]) for i in range(0, len(stages), 2)],
        "nats": nats,
        "bytes": nbytes,
        "tokens": tokens,
    }


def _decode_groups(batches, max_rows: int | None):
    """(inputs, targets) batches regrouped into decoder batches: the rows of consecutive batches of
    one length concatenated, up to max_rows rows each (None: no limit)."""
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []
    rows = 0
    for inputs, targets in batches:
        if pending and (
            inputs.size(1) != pending[0][0].size(1)
            or (max_rows is not None and rows + inputs.size(0) > max_rows)
        ):
            yield torch.cat([x for x, _ in pending]), torch.cat([y for _, y in pending])
            pending, rows = [], 0
        pending.append((inputs, targets))
        rows += inputs.size(0)
    if pending:
        yield torch.cat([x for x, _ in pending]), torch.cat([y for _, y in pending])


@torch.no_grad()
def sequential_bpb(
    model,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    token_bytes: torch.Tensor,
    prompt_len: int = 0,
    prefill=None,
    autocast=None,
    max_rows: int | None = None,
) -> dict:
    """BPB under recurrent decoding (one Decoder step per token), summed over ranks.

    prompt_len > 0: the first prompt_len tokens are prefilled with `prefill` (a schedule or its
    spec: onepass, interleaved:S, exact; default OnePass) and only the targets at positions
    t >= prompt_len - 1 (the tokens after the prompt) are scored. prompt_len = 0: every position is
    decoded one token at a time from an empty cache and every target is scored.

    Batched as decoding batches: the rows of all batches of one length go through one Decoder
    together (at most `max_rows` at a time; None: all), so a position costs one step for all rows,
    and only each step's target log-probabilities are kept, not its (B, V) logits. A model
    without memory has no recurrence, so its cached steps compute what one causal pass over the
    whole sequence computes: it is scored in that one pass (equal to the step-by-step decode in
    float64; tested).
    """
    if not isinstance(prompt_len, int) or prompt_len < 0:
        raise ValueError(f"prompt_len={prompt_len!r} is invalid; allowed: an integer >= 0")
    if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 1):
        raise ValueError(f"max_rows={max_rows!r} is invalid; allowed: None or an integer >= 1")
    prefill = as_schedule(prefill)
    token_bytes = _check_token_bytes(token_bytes)
    was_training = model.training
    model.eval()
    sums, tokens = None, 0
    recurrent = model.pathway is not None
    try:
        for inputs, targets in _decode_groups(batches, max_rows):
            B, T = inputs.shape
            if prompt_len >= T:
                raise ValueError(
                    f"prompt_len={prompt_len} is invalid for sequences of T={T}; allowed: 0 <= "
                    "prompt_len < T"
                )
            # once, not a sync per position on CUDA
            check_token_ids("inputs", inputs, vocab_size_of(model))
            first = max(prompt_len - 1, 0)
            scored = targets[:, first:]
            with autocast or contextlib.nullcontext():
                if not recurrent:
                    logits = run_schedule(model, inputs, None, OnePass()).logits[:, first:]
                    nats = token_nats(logits, scored)
                    del logits
                else:
                    nats = _decoded_nats(model, inputs, targets, prompt_len, prefill)
            n, b = _sum_nats_bytes(nats, scored, token_bytes)
            vec = torch.stack([n, b])
            sums = vec if sums is None else sums + vec
            tokens += scored.numel()
    finally:
        model.train(was_training)
    if sums is None:
        raise ValueError("batches is empty; allowed: at least one (inputs, targets) batch")
    packed = torch.cat(
        [sums, torch.tensor([float(tokens)], dtype=torch.float64, device=sums.device)]
    )
    nats, nbytes, tokens = all_reduce_sum(packed).cpu().tolist()
    return {
        "bpb": _bpb(nats, nbytes),
        "nats": nats,
        "bytes": nbytes,
        "tokens": int(tokens),
        "prompt_len": prompt_len,
        "prefill": prefill.spec if prompt_len else None,
    }


def _decoded_nats(model, inputs, targets, prompt_len: int, prefill) -> torch.Tensor:
    """(B, scored positions) nats of the targets under recurrent decoding: the prompt prefilled
    (its last target scored from the prefill's logits), then one Decoder step per token."""
    B, T = inputs.shape
    dec = Decoder(model, B, T)
    steps = []
    if prompt_len:
        last = dec.prefill(inputs[:, :prompt_len], prefill)
        steps.append(token_nats(last[:, None], targets[:, prompt_len - 1 : prompt_len]))
    for t in range(prompt_len, T):
        logits = dec.step(inputs[:, t], check_values=False)
        steps.append(token_nats(logits[:, None], targets[:, t : t + 1]))
    return torch.cat(steps, dim=1)


# CORE
# -----------------------------------------------------------------------------------------------
def render_mc(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
    """One prompt per choice: few-shot "query<d>gold choice" blocks, then "query<d>choice"."""
    shots = "".join(f"{ex['query']}{delimiter}{ex['choices'][ex['gold']]}\n\n" for ex in fewshot)
    return [f"{shots}{item['query']}{delimiter}{choice}" for choice in item["choices"]]


def render_schema(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
    """One prompt per context option, each followed by the shared continuation."""
    shots = "".join(
        f"{ex['context_options'][ex['gold']]}{delimiter}{ex['continuation']}\n\n" for ex in fewshot
    )
    return [f"{shots}{ctx}{delimiter}{item['continuation']}" for ctx in item["context_options"]]


def render_lm(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
    """[prompt without the continuation (stripped), prompt with it]."""
    shots = "".join(f"{ex['context'].strip()}{delimiter}{ex['continuation']}\n\n" for ex in fewshot)
    base = f"{shots}{item['context'].strip()}{delimiter}"
    return [base.strip(), base + item["continuation"]]


def _common_length(seqs: Sequence[Sequence[int]], from_end: bool = False) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        j = -1 - i if from_end else i
        if any(s[j] != seqs[0][j] for s in seqs):
            return i
    return n


def item_sequences(
    tokenizer, task_type: str, prompts: list[str]
) -> tuple[list[list[int]], list[int], list[int]]:
    """Token sequences (BOS first) and, per sequence, the
    [start, end) of the scored continuation."""
    tokens = [tokenizer.encode(p, prepend_bos=True) for p in prompts]
    if task_type == "multiple_choice":
        start = _common_length(tokens)
        return tokens, [start] * len(tokens), [len(t) for t in tokens]
    if task_type == "schema":
        suffix = _common_length(tokens, from_end=True)
        return tokens, [len(t) - suffix for t in tokens], [len(t) for t in tokens]
    if task_type == "language_modeling":
        without, with_ = tokens
        if len(without) >= len(with_) or with_[: len(without)] != without:
            raise ValueError(
                "language_modeling item: the prompt without the continuation does not tokenize to "
                "a "
                "prefix of the prompt with it"
            )
        return [with_], [len(without)], [len(with_)]
    raise ValueError(f"task type {task_type!r} is invalid; allowed: {', '.join(TASK_TYPES)}")


def _pad(tokens: list[list[int]], pad_id: int) -> torch.Tensor:
    out = torch.full((len(tokens), max(len(t) for t in tokens)), pad_id, dtype=torch.long)
    for i, t in enumerate(tokens):
        out[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    return out


def bucket(n: int, smallest: int = 1, largest: int | None = None) -> int:
    """The power of two >= n (at least `smallest`), capped at `largest` where n fits under it."""
    b = max(smallest, 1 << max(0, n - 1).bit_length())
    return max(n, min(b, largest)) if largest is not None else b


# the shortest bucketed CORE length: 64, 128, ..., 2048 are 6 shapes for a 2048-token model, under
# dynamo's recompile limit (8) with the row buckets of one task
MIN_BUCKET_LEN = 64


def padded_forward(forward, max_len: int | None = None):
    """`forward` on (B, T) ids padded on the right to bucketed shapes (rows and length each to the
    next power of two, lengths from MIN_BUCKET_LEN up to max_len), logits cut back to (B, T, V).

    A compiled forward (and FlexAttention, compiled per shape) then sees a few shapes instead of one
    per CORE item. Right padding changes nothing before it for a causal schedule
    (`Schedule.causal`: position t reads positions <= t, the memory too), and extra rows are
    separate sequences. FixedPoint's stopping test reads every position, so a padded sequence may
    iterate once more: it is not causal and runs unpadded (``model_forward`` decides)."""

    def run(ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        R, L = bucket(B), bucket(T, MIN_BUCKET_LEN, max_len)
        if (R, L) == (B, T):
            return forward(ids)
        padded = ids.new_zeros(R, L)  # id 0: any valid token, never scored
        padded[:B, :T] = ids
        return forward(padded)[:B, :T]

    return run


def model_forward(
    model, schedule=None, autocast=None, pad: bool = True
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A (B, T) ids -> (B, T, V) logits function: `schedule`'s parallel forward (default OnePass),
    on inputs padded to bucketed shapes (``padded_forward``; pad=False: as given)."""
    schedule = as_schedule(schedule)

    @torch.no_grad()
    def forward(ids: torch.Tensor) -> torch.Tensor:
        with autocast or contextlib.nullcontext():
            return run_schedule(model, ids, None, schedule).logits

    if not pad or not schedule.causal:
        return forward
    return padded_forward(forward, model.config.sequence_len)


@torch.no_grad()
def score_item(
    forward,
    tokenizer,
    item: dict,
    task_type: str,
    delimiter: str,
    fewshot: Sequence[dict] = (),
    device="cpu",
    max_len: int | None = None,
) -> bool:
    """Is the model right on one item? (see the module docstring for each type)."""
    render = {
        "multiple_choice": render_mc,
        "schema": render_schema,
        "language_modeling": render_lm,
    }.get(task_type)
    if render is None:
        raise ValueError(f"task type {task_type!r} is invalid; allowed: {', '.join(TASK_TYPES)}")
    tokens, starts, ends = item_sequences(tokenizer, task_type, render(item, delimiter, fewshot))
    # keep the last max_len tokens (nanochat's crop for short-context models)
    if max_len is not None:
        crops = [max(0, len(t) - max_len) for t in tokens]
        tokens = [t[c:] for t, c in zip(tokens, crops)]
        starts = [max(1, s - c) for s, c in zip(starts, crops)]
        ends = [e - c for e, c in zip(ends, crops)]
    ids = _pad(tokens, tokenizer.bos_token_id).to(device)
    logits = forward(ids).float()
    if task_type == "language_modeling":
        s, e = starts[0], ends[0]
        return bool(torch.equal(logits[0, s - 1 : e - 1].argmax(-1), ids[0, s:e]))
    # predicts ids[:, t+1]
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    means = [losses[i, s - 1 : e - 1].mean().item() for i, (s, e) in enumerate(zip(starts, ends))]
    return means.index(min(means)) == item["gold"]


def load_bundle(bundle_dir: str | os.PathLike) -> list[dict]:
    """Tasks of a bundle directory: [{"label", "type", "num_fewshot", "random_baseline" (percent),
    "continuation_delimiter", "path"}] (see the module docstring for the two layouts)."""
    d = Path(bundle_dir).expanduser()
    if not d.is_dir():
        raise ValueError(f"core bundle: {d} is not a directory")
    tasks = []
    if (d / "core.json").is_file():
        spec = json.loads((d / "core.json").read_text())
        for t in spec.get("tasks", []):
            label = t.get("label")
            tasks.append(
                {
                    "label": label,
                    "type": t.get("type"),
                    "num_fewshot": t.get("num_fewshot", 0),
                    "random_baseline": t.get("random_baseline"),
                    "continuation_delimiter": t.get("continuation_delimiter", " "),
                    "path": d / t.get("dataset_uri", f"{label}.jsonl"),
                }
            )
    elif (d / "core.yaml").is_file():
        try:
            import yaml
        except ImportError:
            raise ValueError(
                "core bundle: core.yaml needs PyYAML (pip install pyyaml), or write core.json"
            ) from None
        spec = yaml.safe_load((d / "core.yaml").read_text())
        baselines = {}
        meta = d / "eval_meta_data.csv"
        if meta.is_file():
            with open(meta, newline="") as f:
                baselines = {r["Eval Task"]: float(r["Random baseline"]) for r in csv.DictReader(f)}
        for t in spec.get("icl_tasks", []):
            shots = t.get("num_fewshot", 0)
            tasks.append(
                {
                    "label": t.get("label"),
                    "type": t.get("icl_task_type"),
                    "num_fewshot": shots[0] if isinstance(shots, list) else shots,
                    "random_baseline": baselines.get(t.get("label")),
                    "continuation_delimiter": t.get("continuation_delimiter", " "),
                    "path": d / "eval_data" / t["dataset_uri"],
                }
            )
    else:
        raise ValueError(f"core bundle: {d} has neither core.json nor core.yaml")
    if not tasks:
        raise ValueError(f"core bundle: {d} lists no tasks")
    for t in tasks:
        if not t["label"]:
            raise ValueError(f"core bundle: a task has no label in {d}")
        if t["type"] not in TASK_TYPES:
            raise ValueError(
                f"core bundle: task {t['label']!r} has type {t['type']!r}; allowed: "
                f"{', '.join(TASK_TYPES)}"
            )
        rb = t["random_baseline"]
        if not isinstance(rb, (int, float)) or not 0 <= rb < 100:
            raise ValueError(
                f"core bundle: task {t['label']!r} has random_baseline={rb!r}; allowed: a "
                "percentage in [0, 100)"
            )
        if not isinstance(t["num_fewshot"], int) or t["num_fewshot"] < 0:
            raise ValueError(
                f"core bundle: task {t['label']!r} has num_fewshot={t['num_fewshot']!r}; allowed: "
                "an integer >= 0"
            )
        if not Path(t["path"]).is_file():
            raise ValueError(
                f"core bundle: task {t['label']!r}: data file {t['path']} does not exist"
            )
    return tasks


def read_items(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def centered(accuracy: float, random_baseline_percent: float) -> float:
    r = 0.01 * random_baseline_percent
    return (accuracy - r) / (1.0 - r)


def evaluate_task(
    forward, tokenizer, items: list[dict], task: dict, device="cpu", max_len: int | None = None
) -> float:
    """Accuracy on a task; under torchrun each rank scores items rank, rank + world, ... ."""
    rank, world = rank_and_world()
    k = task["num_fewshot"]
    if k and len(items) <= k:
        raise ValueError(
            f"task {task['label']!r}: num_fewshot={k} needs more than {k} items, got {len(items)}"
        )
    correct = 0
    for i in range(rank, len(items), world):
        shots = []
        if k:
            rng = random.Random(1234 + i)
            shots = [items[j] for j in rng.sample([j for j in range(len(items)) if j != i], k)]
        correct += score_item(
            forward,
            tokenizer,
            items[i],
            task["type"],
            task["continuation_delimiter"],
            shots,
            device,
            max_len,
        )
    total = all_reduce_sum(torch.tensor([float(correct)], dtype=torch.float64, device=device))
    return float(total.item()) / len(items)


def evaluate_core(
    forward,
    tokenizer,
    bundle_dir,
    device="cpu",
    max_per_task: int = -1,
    max_len: int | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """CORE over a bundle: {"core", "accuracy": {label: acc}, "centered": {label: c}}.

    forward: (B, T) ids -> (B, T, V) logits (``model_forward(model, schedule)``). max_per_task > 0
    crops every task to that many items (after the fixed shuffle), for quick checks.
    """
    tasks = load_bundle(bundle_dir)
    acc, cen = {}, {}
    for task in tasks:
        t0 = time.perf_counter()
        items = read_items(task["path"])
        random.Random(1337).shuffle(items)
        if max_per_task > 0:
            items = items[:max_per_task]
        if not items:
            raise ValueError(f"task {task['label']!r} has no items in {task['path']}")
        acc[task["label"]] = evaluate_task(forward, tokenizer, items, task, device, max_len)
        cen[task["label"]] = centered(acc[task["label"]], task["random_baseline"])
        if log:
            log(
                f"core {task['label']} ({task['num_fewshot']}-shot {task['type']}): accuracy "
                f"{acc[task['label']]:.4f} "
                f"centered {cen[task['label']]:.4f} ({time.perf_counter() - t0:.1f}s)"
            )
    return {"core": sum(cen.values()) / len(cen), "accuracy": acc, "centered": cen}


# Command line: evaluate a trained run ----------------------------------------------------------
def _load_run_model(run_dir: Path, checkpoint: str | None, device: torch.device):
    run = Run(run_dir)
    if not (run.path / "config.json").is_file():
        raise ValueError(f"--run-dir: {run.path} has no config.json")
    cfg = run.config
    model = LRT(ModelConfig.from_dict(cfg["model"])).to(device)
    ckpt = Path(checkpoint) if checkpoint else run.latest_checkpoint()
    if ckpt is None:
        raise ValueError(f"--run-dir: {run.path} has no checkpoint; pass --checkpoint")
    state = read_checkpoint(ckpt, map_location=device)  # tensors and plain values only
    check_belongs(state, run, ckpt)
    model.load_state_dict(state["model"])
    return run, cfg, model, state.get("step")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lrt_scale.evaluate",
        description="BPB, sequential BPB and CORE of a run trained by lrt_scale.train",
    )
    ap.add_argument(
        "--run-dir",
        required=True,
        help="run folder (runs/<name>) with config.json and checkpoints/ "
        "(not --run: under torchrun that abbreviates torchrun's own --run-path)",
    )
    ap.add_argument(
        "--checkpoint", default=None, help="a checkpoint file (default: the run's latest)"
    )
    ap.add_argument(
        "--data-dir",
        default=None,
        help="parquet shards; the last one is validation (default: the run's)",
    )
    ap.add_argument("--tokenizer-dir", default=None, help="saved tokenizer (default: the run's)")
    ap.add_argument(
        "--schedule",
        default=None,
        help="schedule of the parallel forward (default: the training schedule)",
    )
    ap.add_argument(
        "--bpb-tokens", type=int, default=2**20, help="validation tokens for parallel BPB (0: skip)"
    )
    ap.add_argument(
        "--seq-rows", type=int, default=0, help="validation rows for sequential BPB (0: skip)"
    )
    ap.add_argument(
        "--seq-prompt",
        type=int,
        default=0,
        help="prompt tokens prefilled before decoding (paper: 1024)",
    )
    ap.add_argument(
        "--seq-prefill",
        default="onepass",
        help="comma-separated prefill strategies for --seq-prompt > 0 "
        "(e.g. onepass,interleaved:2,exact)",
    )
    ap.add_argument(
        "--core-bundle",
        default=None,
        help="CORE eval bundle directory (core.json or DCLM core.yaml)",
    )
    ap.add_argument("--core-max-per-task", type=int, default=-1)
    ap.add_argument(
        "--core-schedule",
        default="train",
        help="forward CORE scores with: train (the training schedule) or a schedule spec; "
        "onepass = zero "
        "memory, how the released code (and so the paper's CORE numbers) scores an LRT",
    )
    ap.add_argument("--batch-size", type=int, default=8, help="rows per forward")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.core_schedule != "train":
        parse_schedule(args.core_schedule)  # a bad spec fails before the model is loaded

    ctx = setup_distributed(args.device)
    try:
        run, cfg, model, step = _load_run_model(Path(args.run_dir), args.checkpoint, ctx.device)
        train_args = cfg.get("train", {})
        autocast = autocast_for(ctx.device, train_args.get("dtype", "auto"))
        schedule = parse_schedule(args.schedule or cfg.get("schedule", "onepass"))
        data_dir = args.data_dir or train_args.get("data_dir")
        tok_dir = args.tokenizer_dir or train_args.get("tokenizer_dir")
        T = model.config.sequence_len
        batches, token_bytes, tokenizer = make_batches(
            data_dir,
            tok_dir,
            model.config.vocab_size,
            args.batch_size,
            T,
            ctx,
            seed=train_args.get("seed", 0),
            synthetic=train_args.get("synthetic"),
        )
        rec = {"kind": "eval", "step": step, "source": "lrt_scale.evaluate"}
        if args.bpb_tokens:
            n = max(1, args.bpb_tokens // (args.batch_size * T * ctx.world_size))
            res = parallel_bpb(model, batches(n), token_bytes, schedule, autocast)
            rec["val_bpb"] = res["bpb"]
            rec.update({f"val_bpb_stage_{k}": v for k, v in enumerate(res["stages"])})
        if args.seq_rows:
            n = max(1, math.ceil(args.seq_rows / (args.batch_size * ctx.world_size)))
            prefills = args.seq_prefill.split(",") if args.seq_prompt else ["onepass"]
            for spec in prefills:
                res = sequential_bpb(
                    model, batches(n), token_bytes, args.seq_prompt, spec, autocast
                )
                key = (
                    "seq_bpb"
                    if not args.seq_prompt
                    else f"seq_bpb_{parse_schedule(spec).spec.replace(':', '')}"
                )
                rec[key] = res["bpb"]
            if args.seq_prompt:
                par = parallel_bpb(
                    model,
                    batches(n),
                    token_bytes,
                    schedule,
                    autocast,
                    min_position=args.seq_prompt - 1,
                )
                rec["cont_bpb_parallel"] = par["bpb"]
        if args.core_bundle:
            if tokenizer is None:
                raise ValueError(
                    "--core-bundle needs a tokenizer (--tokenizer-dir); synthetic runs have none"
                )
            core_schedule = (
                schedule if args.core_schedule == "train" else parse_schedule(args.core_schedule)
            )
            core = evaluate_core(
                model_forward(model, core_schedule, autocast),
                tokenizer,
                args.core_bundle,
                ctx.device,
                args.core_max_per_task,
                log=ctx.print0,
            )
            rec["core"] = core["core"]
            rec["core_schedule"] = core_schedule.spec
            rec.update({f"core_{k}": v for k, v in core["centered"].items()})
        if ctx.rank == 0:
            run.log(rec)
            print(json.dumps(rec, indent=2, sort_keys=True))
    finally:
        teardown_distributed(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
