"""Fixed evaluation sets at several lengths, from seeds that training can never use.

The paper evaluates A5 models trained at length 64 at lengths 64, 128 and 256 and reports that
the per-position accuracy curves agree on their shared prefixes (appendix "Non-Commutative State
Tracking"); these are those sets.

Shared prefixes: for a task whose prefixes are themselves samples (`Task.prefix_closed`: the prefix
products, flip-flop), one set is drawn at the longest length and the shorter sets are its prefixes,
as in the paper, where the per-position curves at 64, 128 and 256 coincide on their shared
prefix. A fixed model then scores every shared position identically at every length, so pos@90 can
differ between lengths only where the curve continues past the shorter length, never by sampling
noise. A call's sets are therefore deterministic in (task, max(lengths), n, seed); a single-length
call draws exactly what it always did. Other tasks draw each length independently.

Seed guarantee: the generator for (task, length, seed) is seeded with
    2**62 + sha256("eval|<task.eval_key>|<length>|<seed>") mod 2**62,
a number in [2**62, 2**63). Training seeds its generators with the run seed, a small integer, so
as long as training seeds stay below 2**62 no evaluation batch is ever drawn from a training
stream. The key includes the task's distribution (`eval_key`: group, alphabet size, ...) and the
length, so every set is fixed across runs, machines and code that samples other sets first.
"""

from __future__ import annotations

import hashlib

import torch

from lrt_lab.core.validation import TRAIN_SEED_LIMIT
from lrt_tasks.base import Batch, Task, check_int

# Evaluation seeds start where training seeds end (TrainConfig range-checks seeds below it).
EVAL_SEED_OFFSET = TRAIN_SEED_LIMIT


def eval_seed(task: Task, length: int, seed: int = 0) -> int:
    """The generator seed of the evaluation set (task, length, seed); always >= EVAL_SEED_OFFSET."""
    digest = hashlib.sha256(f"eval|{task.eval_key}|{length}|{seed}".encode()).digest()
    return EVAL_SEED_OFFSET + int.from_bytes(digest[:8], "big") % EVAL_SEED_OFFSET


def make_eval_sets(
    task: Task, lengths=(64, 128, 256), n: int = 512, seed: int = 0
) -> dict[int, Batch]:
    """{length: Batch of n sequences} for each length, deterministic in (task, max(lengths), n,
    seed);
    for a prefix-closed task every shorter set is the prefix of the longest one."""
    check_int("n", n, 1)
    check_int("seed", seed, 0)
    lengths = tuple(lengths)
    if not lengths:
        raise ValueError("lengths=() is invalid; allowed: a non-empty sequence of lengths")
    for length in lengths:
        check_int("lengths", length, task.min_length)
    if getattr(task, "prefix_closed", False):
        longest = max(lengths)
        full = task.sample(
            n, torch.Generator().manual_seed(eval_seed(task, longest, seed)), length=longest
        )
        return {length: truncate(full, length) for length in lengths}
    sets = {}
    for length in lengths:
        g = torch.Generator().manual_seed(eval_seed(task, length, seed))
        sets[length] = task.sample(n, g, length=length)
    return sets


def truncate(batch: Batch, length: int) -> Batch:
    """The first `length` positions of every field (targets
    are aligned with inputs, tasks/base.py)."""
    return Batch(*(None if x is None else x[:, :length].contiguous() for x in batch))
