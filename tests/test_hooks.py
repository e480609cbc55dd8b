"""Hook points intervene, not only capture, in every schedule and in decoding; module hooks fire."""

import torch
from helpers import make_model, maxdiff, tokens

from lrt_lab import MemoryConfig
from lrt_lab.run.decode import Decoder
from lrt_lab.run.hooks import hooks, patch_from, zero_at
from lrt_lab.run.runner import run_schedule, run_with_cache
from lrt_lab.run.schedules import Exact, Interleaved

TOL = 1e-10


def test_a_forward_hook_on_a_block_fires_in_schedules_and_decoding():
    model = make_model(MemoryConfig())
    seen = []
    handle = model.blocks[0].register_forward_hook(
        lambda mod, args, out: seen.append(out.x.shape[1])
    )
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
    with hooks(
        model, {"blocks.2.hook_resid_post": patch_from(cache_b["blocks.2.hook_resid_post"])}
    ):
        patched = run_schedule(model, a, None, Interleaved(2)).logits
    assert maxdiff(patched, out_b) <= TOL  # logits = head(resid_post of the top block)
    with hooks(
        model, {"blocks.2.hook_resid_post": patch_from(cache_b["blocks.2.hook_resid_post"], [4])}
    ):
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


def test_hook_points_count_the_hooks_registered_on_them():
    """A HookPoint skips nn.Module's call machinery while nothing is registered on it, and it knows
    that itself: a forward hook registered on it directly fires (and can replace), counts once
    however often its handle is removed, and a point with its hooks removed is unhooked again."""
    model = make_model(MemoryConfig())
    idx = tokens(B=1, T=5)
    plain = run_schedule(model, idx, None, Exact()).logits
    point = model.blocks[0].hook_mlp_out
    assert not point.hooked
    handle = point.register_forward_hook(lambda mod, args, kwargs, out: out * 0, with_kwargs=True)
    pre = point.register_forward_pre_hook(lambda mod, args: None)
    assert point.hooked and point.n_hooks == 2
    zeroed = run_schedule(model, idx, None, Exact()).logits
    handle.remove()
    handle.remove()  # removing twice counts once
    assert point.n_hooks == 1
    pre.remove()
    assert not point.hooked
    assert maxdiff(zeroed, plain) > 1e-3
    with hooks(model, {"blocks.0.hook_mlp_out": lambda x, positions: x * 0}):
        assert point.hooked
        assert maxdiff(run_schedule(model, idx, None, Exact()).logits, zeroed) <= TOL
    assert not point.hooked
    assert maxdiff(run_schedule(model, idx, None, Exact()).logits, plain) <= TOL


def test_decoding_runs_without_autograd_yet_its_captures_and_caches_serve_training():
    """Decoding runs under inference mode (no autograd bookkeeping). What it leaves behind must
    still work with autograd: activations captured while decoding train a probe, and the RoPE
    tables a prefill cached serve a training step over the same positions."""
    from lrt_lab.run.hooks import capture

    model = make_model(MemoryConfig())
    idx = tokens(B=2, T=6)
    with capture(model, ["blocks.1.hook_resid_post"]) as cap:
        dec = Decoder(model, 2, 8)
        dec.prefill(idx, Interleaved(2))
        logits = dec.step(idx[:, 0])
    assert logits.is_inference()  # the step really ran without autograd
    # as recorded
    acts = torch.cat([x for _, x in cap.calls["blocks.1.hook_resid_post"][1:]], dim=1)
    probe = torch.nn.Linear(acts.size(-1), 1).double()
    probe(acts).square().mean().backward()
    assert probe.weight.grad is not None and probe.weight.grad.abs().sum() > 0
    out = run_schedule(model, idx, idx, Interleaved(2))
    out.loss.backward()
    assert all(p.grad is not None for p in model.pathway.parameters())


def test_the_memory_pathway_declares_hook_points_for_its_own_values():
    """pathway.hook_source and pathway.hook_update_gate are the pathway's modules: capturing them
    gives h_t and z = sigmoid(W_z h_t), and forcing z to 1 keeps the (zero) initial memory
    forever, in a schedule and in the decoder alike."""
    from lrt_lab.run.hooks import capture

    model = make_model(MemoryConfig(update="gated"))
    assert {"pathway.hook_source", "pathway.hook_update_gate"} <= {
        n for n, _ in model.named_modules()
    }
    idx = tokens(B=2, T=6)
    with capture(model, ["pathway.hook_source", "pathway.hook_update_gate", "hook_mem_out"]) as cap:
        run_schedule(model, idx, None, Exact())
    acts = cap.assembled(6)
    W_z = model.pathway.update_gate.weight.detach()
    assert (
        maxdiff(
            acts["pathway.hook_update_gate"], torch.sigmoid(acts["pathway.hook_source"] @ W_z.T)
        )
        <= TOL
    )
    keep_all = {"pathway.hook_update_gate": lambda z, positions: torch.ones_like(z)}
    with hooks(model, keep_all), capture(model, ["hook_mem_out"]) as cap:
        run_schedule(model, idx, None, Exact())
        dec = Decoder(model, 2, 6)
        for t in range(6):
            dec.step(idx[:, t])
    assert all(x.abs().max().item() == 0 for _, x in cap.calls["hook_mem_out"])
    assert acts["hook_mem_out"].abs().max().item() > 0  # without the hook the memory is not zero


def test_run_with_cache_attention_patterns_match_decoding_and_leave_the_logits_alone():
    """run_with_cache records (B, heads, T, T) patterns: rows sum to 1 over visible keys only,
    Exact's
    equal the decoder's step by step, and the written-out attention they need (hook_z, logits)
    equals the fused kernels' (a second code path)."""
    from lrt_lab.run.hooks import capture
    from lrt_lab.run.schedules import OnePass

    model = make_model(MemoryConfig(), n_layer=2, window_pattern="SL", short_window=3)
    B, T = 2, 7
    idx = tokens(B=B, T=T)
    fast = run_schedule(model, idx, None, Exact()).logits
    with capture(model, ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]) as cap:
        run_schedule(model, idx, None, Exact())
    z_fast = cap.assembled(T)
    logits, cache = run_with_cache(model, idx, schedule=Exact())
    assert maxdiff(logits, fast) <= TOL
    H = model.config.n_head
    for l, window in ((0, 3), (1, None)):
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        assert pattern.shape == (B, H, T, T)
        q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
        # a window of N (short_window=3) covers the query and the N keys before it
        visible = (k <= q) & ((q - k <= window) if window else True)
        assert pattern[..., ~visible].abs().max() == 0
        assert maxdiff(pattern.sum(-1), torch.ones(B, H, T, dtype=pattern.dtype)) <= TOL
        assert torch.isinf(cache[f"blocks.{l}.attn.hook_attn_scores"][..., ~visible]).all()
        assert maxdiff(cache[f"blocks.{l}.attn.hook_z"], z_fast[f"blocks.{l}.attn.hook_z"]) <= TOL
    with capture(model, ["blocks.1.attn.hook_pattern"]) as cap:
        dec = Decoder(model, B, T)
        for t in range(T):
            dec.step(idx[:, t])
    assert (
        maxdiff(cap.assembled(T)["blocks.1.attn.hook_pattern"], cache["blocks.1.attn.hook_pattern"])
        <= TOL
    )
    # OnePass reads no memory: its pattern differs from Exact's (the memory reaches the keys)
    _, one = run_with_cache(model, idx, schedule=OnePass(), names=["blocks.1.attn.hook_pattern"])
    assert list(one) == ["blocks.1.attn.hook_pattern"]
    assert maxdiff(one["blocks.1.attn.hook_pattern"], cache["blocks.1.attn.hook_pattern"]) > 1e-3


def test_a_pattern_intervention_changes_the_output_as_attention_would():
    """Replacing layer 1's pattern by uniform weights over the visible keys gives the mean of the
    visible values (hook_v) per head, which the test computes from the captured values."""
    model = make_model(MemoryConfig(), n_layer=2, window_pattern="LL")
    idx = tokens(B=1, T=5)

    def uniform(pattern, hook):
        assert hook.name == "blocks.1.attn.hook_pattern" and hook.layer() == 1
        visible = (pattern > 0).to(pattern.dtype)
        return visible / visible.sum(-1, keepdim=True)

    with hooks(model, {"blocks.1.attn.hook_pattern": uniform}):
        _, cache = run_with_cache(
            model, idx, schedule=Exact(), names=["blocks.1.attn.hook_z", "blocks.1.attn.hook_v"]
        )
    z, v = cache["blocks.1.attn.hook_z"], cache["blocks.1.attn.hook_v"]
    group = model.config.n_head // model.config.n_kv_head
    v = v.repeat_interleave(group, dim=2)
    means = torch.stack([v[:, : t + 1].mean(1) for t in range(5)], 1)
    assert maxdiff(z, means) <= TOL


def test_transformerlens_style_hooks_see_name_and_positions_and_replace():
    """fn(act, hook) gets the hook's name and the stage's positions; its return replaces the
    activation exactly as the positions form does."""
    model = make_model(MemoryConfig(source_layer=2))
    idx = tokens(B=2, T=6)
    seen = []

    def ablate(act, hook):
        seen.append((hook.name, hook.positions))
        return torch.zeros_like(act)

    with hooks(model, {"hook_mem_in": ablate}):
        tl_form = run_schedule(model, idx, None, Interleaved(2)).logits
    with hooks(model, {"hook_mem_in": zero_at(range(6))}):
        positions_form = run_schedule(model, idx, None, Interleaved(2)).logits
    assert maxdiff(tl_form, positions_form) <= TOL
    assert seen == [
        ("hook_mem_in", range(0, 6)),
        ("hook_mem_in", range(0, 6, 2)),
        ("hook_mem_in", range(1, 6, 2)),
    ]


def test_resid_pre_is_the_block_input_and_q_k_hooks_sit_before_rope():
    """hook_resid_pre is the block's input: alpha x + beta x0 + gamma m rebuilt from it is
    hook_resid_injected. hook_q is before QK-norm and RoPE: at position 0 (no rotation) hook_rot_q
    is hook_q RMS-normalised per head, and every hook_rot_q head vector has norm sqrt(head_dim)."""
    model = make_model(MemoryConfig())
    idx = tokens(B=2, T=6)
    _, c = run_with_cache(model, idx, schedule=Exact())
    for l in range(model.config.n_layer):
        alpha, beta, gamma = model.resid_lambdas[l], model.x0_lambdas[l], model.pathway.gamma[l]
        rebuilt = (
            alpha * c[f"blocks.{l}.hook_resid_pre"]
            + beta * c["hook_embed"]
            + gamma * c[f"blocks.{l}.hook_mem_in"]
        )
        assert maxdiff(rebuilt, c[f"blocks.{l}.hook_resid_injected"]) <= TOL
        q, rot_q = c[f"blocks.{l}.attn.hook_q"], c[f"blocks.{l}.attn.hook_rot_q"]
        D = q.size(-1)
        assert (
            maxdiff(rot_q.norm(dim=-1), torch.full(rot_q.shape[:-1], D**0.5, dtype=q.dtype)) <= TOL
        )
        q0 = q[:, 0] / q[:, 0].pow(2).mean(-1, keepdim=True).sqrt()
        assert maxdiff(rot_q[:, 0], q0) <= TOL
        assert maxdiff(q.norm(dim=-1), torch.full(q.shape[:-1], D**0.5, dtype=q.dtype)) > 1e-3


def test_run_with_cache_per_stage_keeps_what_every_stage_computed():
    """Each stage's record, read position by position, rebuilds the final cache (later stages win),
    and the last of T full-sequence sweeps is exact decoding's memory (a second code path)."""
    from lrt_lab.run.schedules import FullSequence

    model = make_model(MemoryConfig())
    idx = tokens(T=6)
    T = idx.size(1)
    for schedule in (Interleaved(2), FullSequence(2)):
        _, cache = run_with_cache(model, idx, schedule=schedule, per_stage=True)
        name = "hook_mem_out"
        stages = sorted(
            (int(k.split(".")[1]), v) for k, v in cache.items() if k.endswith(f".{name}")
        )
        assert len(stages) == len(schedule.stages(T))
        for p in range(T):
            last = [v for _, v in stages if not torch.isnan(v[:, p]).any()][-1]
            assert torch.equal(last[:, p], cache[name][:, p]), (schedule, p)
    _, sweeps = run_with_cache(model, idx, schedule=FullSequence(T), per_stage=True)
    _, exact = run_with_cache(model, idx, schedule=Exact())
    last = max(int(k.split(".")[1]) for k in sweeps if k.startswith("stage."))
    assert torch.allclose(sweeps[f"stage.{last}.hook_mem_out"], exact["hook_mem_out"], atol=1e-10)
    # the first sweep's memory is not yet exact: the difference is there to be read
    assert not torch.allclose(sweeps["stage.0.hook_mem_out"], exact["hook_mem_out"], atol=1e-6)
    assert not any(k.endswith("hook_pattern") for k in sweeps if k.startswith("stage."))
