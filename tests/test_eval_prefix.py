"""Evaluation sets share prefixes across lengths (paper app. "Non-Commutative State Tracking": the
curves at 64, 128 and 256 coincide on their shared prefix), so pos@90 cannot move between
evaluation lengths by sampling noise."""

import torch

from lrt_lab import LRT, memory_preset, preset
from lrt_lab.run.evaluation import evaluate
from lrt_lab.run.metrics import pos_at
from lrt_lab.run.schedules import Interleaved
from lrt_tasks import make_eval_sets, make_task
from lrt_tasks.eval_sets import eval_seed

LENGTHS = (8, 16, 32)


def test_shorter_sets_are_prefixes_of_the_longest():
    for task in (make_task("a5_prefix", 8), make_task("flipflop", 8)):
        sets = make_eval_sets(task, lengths=LENGTHS, n=16)
        for length in LENGTHS:
            for a, b in zip(sets[length], sets[32]):
                assert torch.equal(a, b[:, :length]), (task.name, length)
    # a single-length call draws what it always drew: one generator at that length's seed
    task = make_task("a5_prefix", 8)
    alone = make_eval_sets(task, lengths=(16,), n=16)[16]
    g = torch.Generator().manual_seed(eval_seed(task, 16, 0))
    assert torch.equal(alone.inputs, task.sample(16, g, length=16).inputs)
    # tasks whose prefixes are not samples (copy: the delimiter sits at a length-dependent place)
    # keep independent sets
    copy = make_eval_sets(make_task("copy", 8), lengths=(8, 16), n=4)
    assert not torch.equal(copy[8].inputs, copy[16].inputs[:, :8])


def lrt_model():
    torch.manual_seed(0)
    return LRT(preset("tiny", memory=memory_preset("paper", 2), vocab_size=6, sequence_len=8))


def test_per_position_accuracy_coincides_on_the_shared_prefix():
    """For a fixed model, parallel forward and exact decoding score every shared position the same
    at every evaluation length; with independently drawn sets they would not."""
    task = make_task("group_prefix", 8, group="S3")
    model = lrt_model()
    res = evaluate(model, Interleaved(2), make_eval_sets(task, lengths=LENGTHS, n=64), exact=True)
    for mode in ("parallel", "exact"):
        for length in LENGTHS[:-1]:
            acc = res[length][mode]["accuracy"]
            assert torch.equal(acc, res[32][mode]["accuracy"][:length]), (mode, length)
        # so pos@90 agrees wherever it ends inside the shortest length
        p = [pos_at(res[length][mode]["accuracy"], 0.9) for length in LENGTHS]
        assert p[0] == LENGTHS[0] or len(set(p)) == 1
    # the check is sensitive: independent draws per length give different curves on the prefix
    independent = {
        L: task.sample(64, torch.Generator().manual_seed(eval_seed(task, L, 0)), length=L)
        for L in LENGTHS
    }
    other = evaluate(model, Interleaved(2), independent, exact=False)
    assert not torch.equal(other[8]["parallel"]["accuracy"], other[32]["parallel"]["accuracy"][:8])
