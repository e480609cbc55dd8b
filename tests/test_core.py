"""The core's invariants (docs/design.md), in float64 on tiny random models with every pathway
active."""

import dataclasses
import math

import pytest
import torch
from helpers import CONFIGS, T, decode_all, make_model, maxdiff, tokens
from reference import NaiveLRT, naive_cross_entropy

from lrt_lab import LRT, MemoryConfig, ModelConfig, preset
from lrt_lab.run.decode import Decoder, generate
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Chunked, Exact, FullSequence, Interleaved, OnePass
from lrt_lab.training.optim import param_groups

TOL = 1e-10


@pytest.mark.parametrize("name", list(CONFIGS))
def test_limits_coincide(name):
    """Exact == Chunked(1) == Interleaved(S=T) == FullSequence(K=T) == token-by-token decoding."""
    model = make_model(CONFIGS[name])
    idx = tokens()
    exact = run_schedule(model, idx, None, Exact()).logits
    for sched in (Chunked(1), Interleaved(T), FullSequence(T)):
        assert maxdiff(run_schedule(model, idx, None, sched).logits, exact) <= TOL, sched
    assert maxdiff(decode_all(model, idx), exact) <= TOL
    # chunks no longer than the nearest row read are exact too: memory never crosses inside a chunk
    chunk = CONFIGS[name].exact_chunk
    assert chunk == CONFIGS[name].lag  # the nearest row a position reads is m_{t-lag}
    assert maxdiff(run_schedule(model, idx, None, Chunked(chunk)).logits, exact) <= TOL


@pytest.mark.parametrize(
    "name", ["default", "source1_lag2", "layerwise", "averages", "keys_replace", "reset_at_bos"]
)
def test_exact_matches_naive_reference(name):
    model = make_model(CONFIGS[name])
    idx = tokens(B=1, T=7)
    naive, _ = NaiveLRT(model).run(idx, [[t] for t in range(7)])
    assert maxdiff(run_schedule(model, idx, None, Exact()).logits, naive) <= TOL


@pytest.mark.parametrize("name", ["default", "source1_lag2", "layerwise", "averages", "kv_only"])
@pytest.mark.parametrize(
    "sched",
    [Interleaved(2), Interleaved(3), FullSequence(1), FullSequence(2, (0.1, 0.3, 0.6)), Chunked(3)],
)
def test_parallel_schedules_match_naive_and_differ_from_exact(name, sched):
    """The approximations are real (they differ from Exact)
    and are exactly what the paper defines."""
    model = make_model(CONFIGS[name])
    idx = tokens(B=2, T=8)
    targets = tokens(B=2, T=8, seed=7)
    targets[0, 3] = -1  # an ignored position
    out = run_schedule(model, idx, targets, sched)
    stages = [list(P) for P in sched.stages(8)]
    naive, naive_stages = NaiveLRT(model).run(idx, stages)
    assert maxdiff(out.logits, naive) <= TOL
    exact = run_schedule(model, idx, None, Exact()).logits
    assert maxdiff(out.logits, exact) > 1e-3
    # the loss is the paper's combination of per-stage losses
    weights = sched.stage_weights(8)
    if weights is None:
        expected = naive_cross_entropy(naive, targets)
    else:
        per_stage = [naive_cross_entropy(lg, targets[:, P]) for P, lg in zip(stages, naive_stages)]
        expected = sum(w * l for w, l in zip(weights, per_stage)) / sum(weights)
    assert abs(out.loss.item() - float(expected)) <= 1e-9


@pytest.mark.parametrize(
    "name", ["default", "source1_lag2", "averages", "keys_replace", "reset_at_bos"]
)
def test_exact_defers_the_blocks_above_the_source_layer(name):
    """run_schedule's Exact runs blocks 1..source_layer per position and the rest in one parallel
    stage; logits, loss and every gradient equal the plain per-position loop over the whole
    stack."""
    model = make_model(CONFIGS[name])
    split = model.exact_split(1)
    assert split == model.config.source_layer < model.config.n_layer
    idx, targets = tokens(), tokens(seed=5)
    targets[1, 2] = -1
    out = run_schedule(model, idx, targets, Exact())
    grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)

    buf, parts = model.empty_buffer(idx), []  # the unsplit loop, written out
    for t in range(T):
        logits_t, buf = model.stage(idx[:, t : t + 1], range(t, t + 1), buf)
        parts.append(logits_t)
    loop = torch.cat(parts, dim=1)
    loop_loss = naive_cross_entropy(loop, targets)
    loop_grads = torch.autograd.grad(loop_loss, list(model.parameters()), allow_unused=True)
    assert maxdiff(out.logits, loop) <= TOL
    assert abs(out.loss.item() - loop_loss.item()) <= TOL
    for (n, _), g, want in zip(model.named_parameters(), grads, loop_grads):
        assert (g is None) == (want is None), n
        if g is not None:
            assert maxdiff(g, want) <= 1e-9, n
    # chunks up to the nearest row read split too (memory never crosses inside them); longer ones
    # must not
    chunk = CONFIGS[name].exact_chunk
    assert model.exact_split(chunk) == split and model.exact_split(chunk + 1) is None
    # the split never applies to a model whose source is its top block
    top = make_model(dataclasses.replace(CONFIGS[name], source_layer=3, source_avg=1))
    assert top.exact_split(1) is None


def test_stage_layer_ranges_are_checked():
    model = make_model(MemoryConfig())
    idx = tokens()
    buf = model.empty_buffer(idx)
    x, _ = model.stage(idx, range(0, T), buf, layers=range(0, 2))
    assert x.shape == (2, T, model.config.n_embd)
    for layers, resid in (
        (range(0, 4), None),
        (range(2, 2), x),
        (range(0, 3, 2), None),
        (range(1, 3), None),
        (range(0, 3), x),
    ):
        with pytest.raises(ValueError, match="layers|resid"):
            model.stage(idx, range(0, T), buf, layers=layers, resid=resid)


def test_plain_transformer_decoding_equals_full_forward_and_reference():
    model = make_model(None)
    idx = tokens()
    full = run_schedule(model, idx, None, OnePass()).logits
    assert maxdiff(decode_all(model, idx), full) <= TOL
    naive, _ = NaiveLRT(model).run(idx[:1], [list(range(T))])
    assert maxdiff(full[:1], naive) <= TOL


@pytest.mark.parametrize("name", ["default", "layerwise", "averages"])
def test_zeroed_memory_pathway_gives_the_plain_model(name):
    plain = make_model(None, seed=3)
    lrt = make_model(CONFIGS[name], seed=4)
    missing, unexpected = lrt.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("pathway.") for k in missing)
    with torch.no_grad():
        for n, p in lrt.pathway.named_parameters():
            if n.startswith(("gamma", "k_rec", "v_rec", "gates")):
                p.zero_()  # gamma = 0, W_rec = 0, W_g = 0 (gates at 1)
    idx = tokens()
    ref = run_schedule(plain, idx, None, OnePass()).logits
    for sched in (OnePass(), Interleaved(2), FullSequence(2), Exact()):
        assert maxdiff(run_schedule(lrt, idx, None, sched).logits, ref) <= TOL


def test_refinement_backpropagates_into_the_init_stage_buffer():
    model = make_model(MemoryConfig())
    idx, targets = tokens(), tokens(seed=5)
    _, buf0 = model.stage(idx, range(0, T), model.empty_buffer(idx))
    for t in buf0.k + buf0.v + [buf0.mem]:
        t.retain_grad()
    P = range(1, T, 2)
    logits, _ = model.stage(idx[:, 1::2], P, buf0)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[:, 1::2].flatten())
    loss.backward()
    others = [t for t in range(T) if t not in P]
    for layer in range(model.config.n_layer):
        assert buf0.k[layer].grad[:, others].abs().sum() > 0  # K/V read from the init stage
        assert buf0.v[layer].grad[:, others].abs().sum() > 0
    assert buf0.mem.grad.abs().sum() > 0  # the memory the refinement read


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_memory_parameter_gets_gradient(name):
    model = make_model(CONFIGS[name])
    idx, targets = tokens(), tokens(seed=5)
    run_schedule(model, idx, targets, Interleaved(2)).loss.backward()
    for n, p in model.pathway.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_hooks_expose_memory_flow():
    """Under Exact, the memory injected at t is the source state emitted at t-1."""
    model = make_model(MemoryConfig(source_layer=2))
    idx = tokens()
    cache = {}
    out = run_schedule(model, idx, None, Exact(), cache=cache)
    assert maxdiff(cache["hook_mem_in"][:, 1:], cache["hook_mem_out"][:, :-1]) <= TOL
    assert cache["hook_mem_in"][:, 0].abs().max() == 0
    # source layer 2 (1-based)
    assert maxdiff(cache["hook_mem_out"], cache["blocks.1.hook_resid_post"]) <= TOL
    for l in range(model.config.n_layer):
        for hook in ("resid_pre", "resid_post", "attn_out", "mlp_out", "mem_in"):
            assert cache[f"blocks.{l}.hook_{hook}"].shape == (2, T, model.config.n_embd)
        # one quantity, one meaning: a layer's memory read is the model's memory read
        assert torch.equal(cache[f"blocks.{l}.hook_mem_in"], cache["hook_mem_in"])
        assert cache[f"blocks.{l}.attn.hook_gate_rec"].shape == (2, T, model.config.n_kv_head)
    assert out.logits.shape == (2, T, model.config.vocab_size)


@pytest.mark.parametrize("schedule", [OnePass(), Interleaved(2), Exact()])
def test_prefill_then_decode_matches_reference(schedule):
    """The decoder continues from whatever buffer the prefill schedule produced."""
    model = make_model(MemoryConfig())
    idx = tokens(B=1, T=8)
    dec = Decoder(model, 1, 8)
    last = dec.prefill(idx[:, :5], schedule)
    steps = [dec.step(idx[:, t]) for t in range(5, 8)]
    stages = [list(P) for P in schedule.stages(5)] + [[5], [6], [7]]
    naive, _ = NaiveLRT(model).run(idx, stages)
    assert maxdiff(last, naive[:, 4]) <= TOL
    assert maxdiff(torch.stack(steps, 1), naive[:, 5:]) <= TOL


def test_prefill_takes_schedule_and_its_earlier_name_strategy_with_a_warning():
    model = make_model(MemoryConfig())
    idx = tokens(B=1, T=5)
    by_name = Decoder(model, 1, 8).prefill(idx, schedule="interleaved:2")
    with pytest.warns(DeprecationWarning, match="use schedule="):
        old = Decoder(model, 1, 8).prefill(idx, strategy=Interleaved(2))
    assert torch.equal(by_name, old)
    assert not torch.equal(by_name, Decoder(model, 1, 8).prefill(idx))  # OnePass differs
    with pytest.raises(ValueError, match="not both"), pytest.warns(DeprecationWarning):
        Decoder(model, 1, 8).prefill(idx, Exact(), strategy=Exact())


def test_generate_greedy_equals_argmax_of_exact_forward_and_is_seeded():
    model = make_model(MemoryConfig())
    prompt = tokens(B=2, T=3)
    out = generate(model, prompt, 5, temperature=0, prefill=Exact())
    exact = run_schedule(model, out[:, :-1], None, Exact()).logits
    assert torch.equal(out[:, 3:], exact[:, 2:].argmax(-1))
    # the default prefill is the exact recurrence; a one-pass prefill starts decoding from
    # zero-memory prompt states, a different path (asked for by name)
    assert torch.equal(generate(model, prompt, 5, temperature=0), out)
    onepass = generate(model, prompt, 5, temperature=0, prefill=OnePass())
    assert onepass.shape == out.shape
    a = generate(model, prompt, 6, temperature=1.0, top_k=5, seed=11)
    b = generate(model, prompt, 6, temperature=1.0, top_k=5, seed=11)
    assert torch.equal(a, b) and a.shape == (2, 9)


def test_param_report_counts_match_a_hand_count():
    with torch.device("meta"):
        shared = LRT(preset("d20", memory=MemoryConfig())).param_report()
        layerwise = LRT(preset("d20", memory=MemoryConfig(projections="layerwise"))).param_report()
        plain = LRT(preset("d20")).param_report()
    d, L, kv = 1280, 20, 1280
    gates = L * 2 * 10 * d
    assert shared["added"] == 2 * kv * d + gates + L  # W_k,rec, W_v,rec, per-layer gates, gamma
    assert layerwise["added"] == L * 2 * kv * d + gates + L
    assert shared["baseline"] == plain["total"] == layerwise["baseline"]
    # the paper reports +0.3% / +4.8% for d20 (added / total)
    assert round(shared["added_pct_of_total"], 1) == 0.3
    assert round(layerwise["added_pct_of_total"], 1) == 4.8


def test_param_groups_partition_parameters():
    model = make_model(MemoryConfig(queries=True))
    groups = param_groups(model)
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert all(p.ndim == 2 for p in groups["matrix"])
    for p in (
        model.pathway.k_rec[0].weight,
        model.pathway.q_rec[0].weight,
        model.pathway.gates[0].weight,
        model.blocks[0].attn.ve_gate.weight,
    ):
        assert any(p is q for q in groups["matrix"])  # Muon gets W_rec and the gate matrices
    assert any(p is model.pathway.gamma for p in groups["scalar"])


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: MemoryConfig(source_layer=0), "memory.source_layer"),
        (lambda: preset("tiny", memory=MemoryConfig(source_layer=3)), "memory.source_layer"),
        (
            lambda: preset("tiny", memory=MemoryConfig(source_layer=1, source_avg=2)),
            "memory.source_avg",
        ),
        (lambda: MemoryConfig(lag=0), "memory.lag"),
        (lambda: MemoryConfig(kv="queries"), "memory.kv"),
        (lambda: MemoryConfig(kv_mode="mul"), "memory.kv_mode"),
        (lambda: MemoryConfig(projections="tied"), "memory.projections"),
        (lambda: MemoryConfig(residual=False, kv="none"), "memory.kv"),
        (lambda: MemoryConfig(rec_init="normal"), "memory.rec_init"),
        (lambda: preset("tiny", memory=MemoryConfig(reset_memory_at_bos=True)), "bos_token_id"),
        (lambda: ModelConfig(n_embd=30, n_head=4), "n_head"),
        (lambda: ModelConfig(n_head=6, n_kv_head=4), "n_kv_head"),
        (lambda: ModelConfig(window_pattern="SXL"), "window_pattern"),
        (lambda: ModelConfig(vocab_size=0), "vocab_size"),
        (lambda: ModelConfig(softcap=-1.0), "softcap"),
        (lambda: preset("d99"), "preset"),
        (lambda: Interleaved(0), "Interleaved.S"),
        (lambda: Interleaved(5).stages(4), "Interleaved.S"),
        (lambda: Chunked(0), "Chunked.C"),
        (lambda: FullSequence(-1), "FullSequence.K"),
        (lambda: FullSequence(2, (0.5, 0.5)), "FullSequence.weights"),
        (lambda: FullSequence(1, (-1.0, 2.0)), "FullSequence.weights"),
        (lambda: parse_schedule("interleaved:x"), "schedule"),
        (lambda: parse_schedule("zigzag:2"), "schedule"),
        (lambda: ModelConfig.from_dict({"n_layers": 3}), "config"),
    ],
)
def test_invalid_input_names_the_field(make, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


def test_bad_runtime_inputs_are_rejected():
    model = make_model(MemoryConfig())
    with pytest.raises(ValueError, match="idx"):
        run_schedule(model, torch.zeros(2, 3), None, OnePass())
    with pytest.raises(ValueError, match="targets"):
        run_schedule(model, tokens(), tokens()[:, :3], OnePass())
    dec = Decoder(model, 2, 3)
    for t in range(3):
        dec.step(tokens()[:, t])
    with pytest.raises(ValueError, match="max_len"):
        dec.step(tokens()[:, 0])
    with pytest.raises(ValueError, match="batch_size"):
        Decoder(model, 0, 4)


def test_schedule_specs_round_trip():
    for spec in (
        "onepass",
        "interleaved:2",
        "fullseq:3",
        "fullseq:2:0.1,0.3,0.6",
        "chunked:64",
        "exact",
    ):
        assert parse_schedule(spec).spec == spec


def test_config_round_trips_through_a_dict():
    cfg = preset("a5", memory=MemoryConfig(lag=2, projections="layerwise"))
    assert ModelConfig.from_dict(dataclasses.asdict(cfg)) == cfg
    assert preset("d20").source_layer == 12 and preset("d24").source_layer == 14  # paper's choices


def test_decoding_runs_past_the_training_length():
    """RoPE is computed per position, so evaluation at 4x the training length needs no re-config."""
    model = make_model(MemoryConfig())
    idx = tokens(B=1, T=4 * model.config.sequence_len, seed=2)
    exact = run_schedule(model, idx, None, Exact()).logits
    assert maxdiff(decode_all(model, idx), exact) <= TOL


def test_same_seed_gives_the_same_backbone_with_or_without_memory():
    torch.manual_seed(5)
    plain = LRT(preset("tiny"))
    torch.manual_seed(5)
    lrt = LRT(preset("tiny", memory=MemoryConfig(projections="layerwise")))
    lrt_state = lrt.state_dict()
    for name, p in plain.state_dict().items():
        assert torch.equal(p, lrt_state[name]), name


@pytest.mark.parametrize(
    "temperature, top_k", [(1.0, None), (0.5, None), (2.0, 3), (0.7, 1), (1.3, 5)]
)
def test_sampling_draws_from_the_tempered_top_k_distribution(temperature, top_k):
    """sample_next over many rows of the same logits: tokens outside the top k never appear, and
    each token's frequency is within 5 standard errors of softmax(logits / temperature) restricted
    to the top k (written out here by sorting, not with topk)."""
    from lrt_lab.run.decode import sample_next

    logits = torch.tensor([2.0, -1.0, 0.5, 1.5, -0.3, 0.0, 1.0, -2.0])
    n = 40_000
    draws = sample_next(logits.expand(n, -1), temperature, top_k, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=8).double() / n
    keep = sorted(range(8), key=lambda i: -logits[i].item())[: top_k or 8]
    weights = torch.tensor(
        [math.exp(logits[i].item() / temperature) if i in keep else 0.0 for i in range(8)],
        dtype=torch.float64,
    )
    p = weights / weights.sum()
    assert (freq[p == 0] == 0).all()
    se = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-12).all(), (freq, p)


def test_a_checkpoint_saved_as_model_memory_loads_into_the_pathway():
    """State dicts written while the pathway was `model.memory` keep loading: their `memory.*` keys
    land on `pathway.*`, weight for weight."""
    model = make_model(MemoryConfig())
    old = {
        ("memory." + k[len("pathway.") :] if k.startswith("pathway.") else k): v
        for k, v in model.state_dict().items()
    }
    assert any(k.startswith("memory.") for k in old)
    fresh = make_model(MemoryConfig(), seed=1)
    assert fresh.load_state_dict(old).missing_keys == []
    for name, p in model.pathway.named_parameters():
        assert torch.equal(fresh.pathway.get_parameter(name), p), name


@pytest.mark.parametrize("memory", [None, MemoryConfig()])
def test_the_forward_reaches_the_attention_kernel_in_six_project_frames(memory, monkeypatch):
    """model(idx) reads top to bottom: forward, stage, run_blocks, Block, Attention, the kernel;
    each added layer of indirection between the model and SDPA shows up here."""
    import traceback

    import torch.nn.functional as F

    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append([f.name for f in traceback.extract_stack() if "/lrt_lab/" in f.filename])
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = make_model(memory)
    logits, loss = model(tokens(), tokens(seed=2))
    assert seen and all(len(frames) <= 6 for frames in seen), seen[0]
    assert torch.equal(logits, run_schedule(model, tokens(), None, OnePass()).logits)
    assert loss is not None
