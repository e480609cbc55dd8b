"""Fixed evaluation sets at several lengths, from seeds that training can never use.

The paper evaluates A5 models trained at length 64 at lengths 64, 128 and 256 and reports that
the per-position accuracy curves agree on their shared prefixes (appendix "Non-Commutative State
Tracking"); these are those sets.

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

from lrt_lab.validation import TRAIN_SEED_LIMIT

from tasks.base import Batch, Task, check_int

# Evaluation seeds start where training seeds end (TrainConfig range-checks seeds below it).
EVAL_SEED_OFFSET = TRAIN_SEED_LIMIT


def eval_seed(task: Task, length: int, seed: int = 0) -> int:
    """The generator seed of the evaluation set (task, length, seed); always >= EVAL_SEED_OFFSET."""
    digest = hashlib.sha256(f"eval|{task.eval_key}|{length}|{seed}".encode()).digest()
    return EVAL_SEED_OFFSET + int.from_bytes(digest[:8], "big") % EVAL_SEED_OFFSET


def make_eval_sets(task: Task, lengths=(64, 128, 256), n: int = 512, seed: int = 0) -> dict[int, Batch]:
    """{length: Batch of n sequences} for each length, deterministic in (task, length, n, seed)."""
    check_int("n", n, 1)
    check_int("seed", seed, 0)
    lengths = tuple(lengths)
    if not lengths:
        raise ValueError("lengths=() is invalid; allowed: a non-empty sequence of lengths")
    sets = {}
    for length in lengths:
        check_int("lengths", length, task.min_length)
        g = torch.Generator().manual_seed(eval_seed(task, length, seed))
        sets[length] = task.sample(n, g, length=length)
    return sets
