"""The regional compile (`LanguageModel.compile_blocks`) on the CUDA dispatch, traced on CPU.

On CPU `pick_backend` always answers "sdpa", so the kernels a GPU runs (FlexAttention for strided
subsets and sliding windows, flash-attn for contiguous blocks) never reach dynamo in the CPU tests.
Here the dispatcher follows its CUDA branch (`cuda_backend`), FlexAttention is traced with the
eager backend and flash-attn is stood in for by the written-out attention, on a model deeper than
dynamo's recompile limit (8 graphs per code object): a block that guards on its layer index
recompiles per layer and, past the limit, raises here (`fail_on_recompile_limit_hit`) where a real
run would fall back to eager silently. Every schedule kind trains and evaluates in one process;
after that warm-up nothing may compile again (`set_stance("fail_on_recompile")`). Dynamo's guards,
graphs and breaks do not depend on its backend, so "eager" stands in for inductor.
"""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from helpers import make_model, tokens
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import flex_attention

import lrt_lab.core.attention as attention
from lrt_lab import MemoryConfig
from lrt_lab.run.decode import Decoder
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule

DEPTH = 12  # past dynamo's recompile limit of 8
# one of each schedule kind: one pass, interleaved subsets, full-sequence sweeps, the exact split
# (chunks of one position below the source layers, one parallel stage above), the rollout (one
# stage per position) and the fixed-point iteration over chunks
SCHEDULES = ("onepass", "interleaved:2", "fullseq:2", "exact", "rollout", "fixedpoint:0.01:3:3")
# flash-attn is chosen for contiguous blocks ending at the last key: chunks and single positions
FLASH_SCHEDULES = ("chunked:3", "exact")
T = 6  # windows of 2 (pattern "SL") are active inside it


def _flash_stand_in(q, k, v, causal=True, window_size=(-1, 0)):
    """flash-attn's flash_attn_func (bottom-right causal, a left window), written out."""
    assert causal and window_size[1] == 0
    n_q, n_k = q.size(1), k.size(1)
    window = None if window_size[0] < 0 else window_size[0] + 1
    return attention.attend_explicit(q, k, v, range(n_k - n_q, n_k), window)


class _OnCuda:
    """What pick_backend reads of a query on CUDA: the device, and a 16-bit dtype when flash-attn
    is to be chosen where it applies."""

    is_cuda = True

    def __init__(self, flash: bool):
        self.dtype = torch.bfloat16 if flash else torch.float32


@pytest.fixture(params=["flex", "flash"])
def cuda_dispatch(request, monkeypatch):
    """The dispatcher's CUDA branch on CPU: FlexAttention for strided subsets and active windows,
    and (param "flash") flash-attn for contiguous blocks ending at the last key."""
    flash = request.param == "flash"
    pick_backend = attention.pick_backend

    def pick(q, q_pos, n_keys, window=None):
        return pick_backend(_OnCuda(flash), q_pos, n_keys, window)

    monkeypatch.setattr(attention, "pick_backend", pick)
    compiled_flex = torch.compile(flex_attention, backend="eager", dynamic=False)

    def flex(q, k, v, block_mask, enable_gqa):
        if not (torch.is_grad_enabled() and q.requires_grad):
            return compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
        # FlexAttention has no backward on CPU: the same attention through its mask_mod, dense
        q_idx = torch.arange(q.size(2))[:, None]
        kv_idx = torch.arange(k.size(2))[None, :]
        mask = block_mask.mask_mod(0, 0, q_idx, kv_idx)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)

    monkeypatch.setattr(attention, "_compiled_flex", lambda: flex)
    monkeypatch.setattr(attention, "_flash_attn_func", lambda: _flash_stand_in)
    attention._flex_block_mask.cache_clear()
    yield request.param
    attention._flex_block_mask.cache_clear()


def _deep_model(n_layer=DEPTH, **memory):
    return make_model(
        MemoryConfig(**memory), n_layer=n_layer, n_embd=16, n_head=2, n_kv_head=1, short_window=2
    ).float()


def _train_and_evaluate(model, spec: str, evaluate: bool = True):
    """One training step's forward and backward, a no-grad evaluation, and decoding after a
    prefill (the evaluation's exact protocol), as a run does them (evaluate=False: training)."""
    x, y = tokens(B=2, T=T), tokens(B=2, T=T, seed=2)
    schedule = parse_schedule(spec)
    model.train()
    model.zero_grad(set_to_none=True)
    run_schedule(model, x, y, schedule).loss.backward()
    if not evaluate:
        return
    model.eval()
    with torch.no_grad():
        run_schedule(model, x, None, schedule)
    dec = Decoder(model, 2, T)
    logits = dec.prefill(x[:, :3], parse_schedule("onepass"))
    for _ in range(T - 3):
        logits = dec.step(logits.argmax(-1))


def _warm_then_rerun(model, schedules=SCHEDULES, evaluate=True):
    """Warm up the schedules (raising if a code object passes the recompile limit), then run them
    all again where any compile raises; (unique graphs, graph breaks) after the warm-up."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for spec in schedules:
            _train_and_evaluate(model, spec, evaluate)
        graphs = counters["stats"]["unique_graphs"]
        breaks = sum(counters["graph_break"].values())
        with torch.compiler.set_stance("fail_on_recompile"):
            for spec in schedules:
                _train_and_evaluate(model, spec, evaluate)
    return graphs, breaks


@pytest.mark.slow  # dynamo traces a block's two regions per variant: about 30 s
@pytest.mark.parametrize("cuda_dispatch", ["flex"], indirect=True)
def test_a_deep_model_compiles_to_graphs_every_layer_shares_and_never_recompiles(cuda_dispatch):
    model = _deep_model().compile_blocks(backend="eager", fullgraph=True)
    graphs, breaks = _warm_then_rerun(model)
    assert breaks == 0
    # what a graph is specialised on: the region (before / after attention), the grad mode
    # (training, no_grad, the decoder's inference mode), whether the memory is zero (before
    # attention only), and the stage's shape (a first static one, then dynamic; 1 apart), never
    # the layer: 12 layers fit dynamo's limit of 8 graphs per code object
    assert 0 < graphs <= (3 * 2 + 3) * 4


@pytest.mark.slow
@pytest.mark.parametrize("cuda_dispatch", ["flash"], indirect=True)
def test_the_flash_attn_branch_compiles_without_recompiles(cuda_dispatch):
    graphs, breaks = _warm_then_rerun(
        _deep_model().compile_blocks(backend="eager", fullgraph=True), FLASH_SCHEDULES
    )
    assert breaks == 0 and graphs > 0


@pytest.mark.slow
@pytest.mark.parametrize("cuda_dispatch", ["flex"], indirect=True)
def test_the_graph_count_does_not_grow_with_depth(cuda_dispatch):
    """The same training step at 2 and at 20 layers compiles the same graphs: every layer reuses
    them (a block that guarded on its layer would compile one per layer, or run eager past 8)."""
    counts = []
    for depth in (2, 20):
        model = _deep_model(depth).compile_blocks(backend="eager", fullgraph=True)
        counts.append(_warm_then_rerun(model, ("interleaved:2",), evaluate=False)[0])
    assert counts[0] == counts[1]


@pytest.mark.slow
@pytest.mark.parametrize("cuda_dispatch", ["flex"], indirect=True)
@pytest.mark.parametrize(
    "memory",
    [{}, {"projections": "layerwise", "kv_mode": "replace"}, {"gate_value_embeds": True}],
    ids=["default", "layerwise_replace", "gated_value_embeds"],
)
def test_compiled_blocks_give_eagers_loss_and_gradients(cuda_dispatch, memory):
    """The compiled regions compute exactly the eager blocks' math, at every layer."""
    torch._dynamo.reset()
    model = make_model(MemoryConfig(**memory), n_layer=DEPTH, n_embd=16, n_head=2, n_kv_head=1)
    x, y = tokens(T=T), tokens(T=T, seed=2)

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = run_schedule(model, x, y, "interleaved:2").loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    eager = loss_and_grads()
    model.compile_blocks(backend="eager", fullgraph=True)
    compiled = loss_and_grads()
    assert torch.allclose(compiled[0], eager[0], rtol=0, atol=1e-12)
    assert len(compiled[1]) == len(eager[1])
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(compiled[1], eager[1]))


@pytest.mark.slow
def test_an_eager_stage_between_compiled_steps_recompiles_nothing():
    """The RoPE tables a compiled stage reads are filled before compiling: an eager stage of the
    same model in between (an evaluation run uncompiled) builds none, so the compiled stage's
    guards still hold."""
    torch._dynamo.reset()
    model = make_model(MemoryConfig(), n_layer=1, window_pattern="L")
    model.compile_stage(backend="eager", fullgraph=True)
    x, y = tokens(T=T), tokens(T=T, seed=2)

    def step():
        model.zero_grad(set_to_none=True)
        run_schedule(model, x, y, "onepass").loss.backward()

    step()
    with torch.no_grad():
        eager = type(model).stage.__get__(model)  # the uncompiled stage of the same model
        eager(x, range(T), model.empty_buffer(x))
    with torch.compiler.set_stance("fail_on_recompile"):
        step()


@pytest.mark.slow  # no compile, but dynamo's import and three models: a few seconds
def test_hooks_on_compiled_blocks_run_eagerly_and_see_every_layer():
    """While a hook point is hooked the compiled blocks run eagerly: the hook is called at every
    layer with its positions, its replacement takes effect, and nothing is compiled for it."""
    from lrt_lab.run.hooks import hooks

    torch._dynamo.reset()
    counters.clear()
    eager_model = make_model(MemoryConfig(), n_layer=3)
    model = make_model(MemoryConfig(), n_layer=3).compile_blocks(backend="eager", fullgraph=True)
    x = tokens(T=T)
    seen = []

    def zero_mlp(act, positions):
        seen.append(positions)
        return act * 0

    names = {f"blocks.{l}.hook_mlp_out": zero_mlp for l in range(3)}
    outs = []
    for m in (eager_model, model):
        with hooks(m, names):
            outs.append(run_schedule(m, x, None, "interleaved:2").logits)
    assert torch.equal(outs[0], outs[1])
    assert seen[: len(seen) // 2] == seen[len(seen) // 2 :] and range(0, T, 2) in seen
    assert counters["stats"]["unique_graphs"] == 0
    assert not torch.equal(outs[1], run_schedule(eager_model, x, None, "interleaved:2").logits)
