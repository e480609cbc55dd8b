"""Hook points intervene, not only capture, in every schedule and in decoding; module hooks fire."""

import torch

from lrt_lab import MemoryConfig
from lrt_lab.decode import Decoder
from lrt_lab.hooks import hooks, patch_from, zero_at
from lrt_lab.schedules import Exact, Interleaved, run_schedule
from test_core import make_model, maxdiff, tokens

TOL = 1e-10


def test_a_forward_hook_on_a_block_fires_in_schedules_and_decoding():
    model = make_model(MemoryConfig())
    seen = []
    handle = model.blocks[0].register_forward_hook(lambda mod, args, out: seen.append(out.x.shape[1]))
    idx = tokens(B=1, T=6)
    run_schedule(model, idx, None, Interleaved(2))
    assert seen == [6, 3, 3]  # init stage, then the two strided subsets
    seen.clear()
    dec = Decoder(model, 1, 6)
    for t in range(3):
        dec.step(idx[:, t])
    assert seen == [1, 1, 1]
    handle.remove()


def test_memory_ablation_equals_decoding_with_the_memory_zeroed_by_hand():
    """Zeroing the memory read at positions 3..5 through the hook point gives, under Exact and
    under the decoder, the logits of a reference decoder whose memory row is zeroed by hand."""
    model = make_model(MemoryConfig(source_layer=2))
    idx = tokens(B=2, T=8)
    span = range(3, 6)
    with hooks(model, {"hook_mem_in": zero_at(span)}):
        ablated = run_schedule(model, idx, None, Exact()).logits
        dec = Decoder(model, 2, 8)
        decoded = torch.stack([dec.step(idx[:, t]) for t in range(8)], 1)
    by_hand = Decoder(model, 2, 8)  # second path: overwrite the cache's memory row before each step
    steps = []
    for t in range(8):
        if t in span:
            by_hand.cache.mem = torch.zeros_like(by_hand.cache.mem)
        steps.append(by_hand.step(idx[:, t]))
    by_hand = torch.stack(steps, 1)
    assert maxdiff(ablated, by_hand) <= TOL and maxdiff(decoded, by_hand) <= TOL
    plain = run_schedule(model, idx, None, Exact()).logits
    assert maxdiff(ablated[:, :3], plain[:, :3]) <= TOL  # before the span nothing changes
    assert maxdiff(ablated[:, 3:], plain[:, 3:]) > 1e-3


def test_patching_a_layer_from_another_run_moves_the_output_to_that_run():
    """Activation patching: replacing block 2's residual output by the one another input produced
    makes every later computation that input's (the top block reads only it and the memory)."""
    model = make_model(MemoryConfig(source_layer=1), n_layer=3)
    a, b = tokens(B=1, T=6, seed=1), tokens(B=1, T=6, seed=2)
    cache_b = {}
    out_b = run_schedule(model, b, None, Interleaved(2), cache=cache_b).logits
    with hooks(model, {"blocks.2.hook_resid_post": patch_from(cache_b["blocks.2.hook_resid_post"])}):
        patched = run_schedule(model, a, None, Interleaved(2)).logits
    assert maxdiff(patched, out_b) <= TOL  # logits = head(resid_post of the top block)
    with hooks(model, {"blocks.2.hook_resid_post": patch_from(cache_b["blocks.2.hook_resid_post"], [4])}):
        one = run_schedule(model, a, None, Interleaved(2)).logits
    assert maxdiff(one[:, 4], out_b[:, 4]) <= TOL and maxdiff(one[:, 3], out_b[:, 3]) > 1e-3


def test_unknown_hook_names_are_rejected_with_the_allowed_names():
    model = make_model(MemoryConfig())
    try:
        with hooks(model, {"blocks.0.resid_post": zero_at([0])}):
            pass
    except ValueError as e:
        assert "blocks.0.hook_resid_post" in str(e)
    else:
        raise AssertionError("no error")


def test_hook_points_honour_module_and_global_hooks_registered_directly():
    """A HookPoint skips nn.Module's call machinery only while no hook could see it: a forward hook
    registered on it directly, and a global module hook, both still fire (and can replace)."""
    model = make_model(MemoryConfig())
    idx = tokens(B=1, T=5)
    plain = run_schedule(model, idx, None, Exact()).logits
    point = model.blocks[0].hook_mlp_out
    handle = point.register_forward_hook(lambda mod, args, kwargs, out: out * 0, with_kwargs=True)
    zeroed = run_schedule(model, idx, None, Exact()).logits
    handle.remove()
    assert maxdiff(zeroed, plain) > 1e-3
    with hooks(model, {"blocks.0.hook_mlp_out": lambda x, positions: x * 0}):
        assert maxdiff(run_schedule(model, idx, None, Exact()).logits, zeroed) <= TOL
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: seen.append(type(mod).__name__))
    try:
        run_schedule(model, idx, None, Exact())
    finally:
        handle.remove()
    assert "HookPoint" in seen
    assert maxdiff(run_schedule(model, idx, None, Exact()).logits, plain) <= TOL


def test_decoding_runs_without_autograd_yet_its_captures_and_caches_serve_training():
    """Decoding runs under inference mode (no autograd bookkeeping). What it leaves behind must
    still work with autograd: activations captured while decoding train a probe, and the RoPE
    tables a prefill cached serve a training step over the same positions."""
    from lrt_lab.hooks import capture
    model = make_model(MemoryConfig())
    idx = tokens(B=2, T=6)
    with capture(model, ["blocks.1.hook_resid_post"]) as cap:
        dec = Decoder(model, 2, 8)
        dec.prefill(idx, Interleaved(2))
        logits = dec.step(idx[:, 0])
    assert logits.is_inference()  # the step really ran without autograd
    acts = torch.cat([x for _, x in cap.calls["blocks.1.hook_resid_post"][1:]], dim=1)  # as recorded
    probe = torch.nn.Linear(acts.size(-1), 1).double()
    probe(acts).square().mean().backward()
    assert probe.weight.grad is not None and probe.weight.grad.abs().sum() > 0
    out = run_schedule(model, idx, idx, Interleaved(2))
    out.loss.backward()
    assert all(p.grad is not None for p in model.memory.parameters())
