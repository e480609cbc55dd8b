"""A compiled stage is one graph per position set: every registered schedule whose run calls the
stage with a few position sets compiles with fullgraph=True (which raises at any graph break) and
gives eager's loss and gradients. A graph break splits the stage into frames that dynamo compiles
per block, one guard per layer index, until its recompile limit sends the later layers to eager.

A schedule of one stage per position (exact decoding, a rollout's steps) compiles a graph per
position: the training scripts run those uncompiled, and the test says so and skips. Dynamo's
guards and breaks do not depend on its backend, so the eager backend stands in for inductor."""

import pytest
import torch
import torch._dynamo
from helpers import SCHEDULE_SPELLINGS, make_model, tokens

from lrt_lab import MemoryConfig
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule

RECOMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit's default


def position_sets(model, x, y, schedule) -> set[tuple]:
    """The distinct position sets an eager run of `schedule` calls the stage with."""
    seen, stage = set(), model.stage

    def counting(tokens, P, *args, **kwargs):
        seen.add((P.start, P.stop, P.step))
        return stage(tokens, P, *args, **kwargs)

    model.stage = counting
    try:
        run_schedule(model, x, y, schedule)
    finally:
        del model.stage
    return seen


@pytest.mark.slow  # dynamo traces every stage kind: seconds each
@pytest.mark.parametrize("spec", SCHEDULE_SPELLINGS)
def test_a_compiled_stage_is_one_graph_and_gives_eagers_loss_and_gradients(spec):
    model = make_model(MemoryConfig())
    x, y = tokens(T=12), tokens(T=12, seed=2)
    schedule = parse_schedule(spec)
    sets = position_sets(model, x, y, schedule)
    if len(sets) > RECOMPILE_LIMIT:
        pytest.skip(f"{spec}: {len(sets)} position sets, a graph each (run uncompiled)")

    def loss_and_grads():
        model.zero_grad()
        loss = run_schedule(model, x, y, schedule).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    eager = loss_and_grads()
    torch._dynamo.reset()
    model.stage = torch.compile(model.stage, fullgraph=True, dynamic=False, backend="eager")
    try:
        compiled = loss_and_grads()
    finally:
        del model.stage
    assert torch.allclose(compiled[0], eager[0], rtol=0, atol=1e-12)
    assert len(compiled[1]) == len(eager[1])
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(compiled[1], eager[1]))
