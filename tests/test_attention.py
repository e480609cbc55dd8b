"""attend() against a hand-written masked softmax, for every kind of position set a stage uses."""

import math

import pytest
import torch

from lrt_lab.core.attention import attend


def naive_attend(q, k, v, positions, window):
    B, Tq, H, D = q.shape
    group = H // k.size(2)
    out = torch.zeros_like(q)
    for b in range(B):
        for i, p in enumerate(positions):
            for h in range(H):
                keys = [
                    j for j in range(k.size(1)) if j <= p and (window is None or p - j < window)
                ]
                s = torch.stack([q[b, i, h] @ k[b, j, h // group] for j in keys]) / math.sqrt(D)
                w = torch.softmax(s, 0)
                out[b, i, h] = sum(wj * v[b, j, h // group] for wj, j in zip(w, keys))
    return out


CASES = [
    (range(0, 9), None),  # full causal: the is_causal fast path
    (range(0, 9), 3),  # full with a sliding window
    (range(4, 9), None),  # contiguous block ending at the last key (chunk)
    (range(8, 9), None),  # one query at the end (decoding)
    (range(8, 9), 2),
    (range(1, 9, 2), None),  # strided subset (interleaved)
    (range(0, 9, 3), 4),
    (range(2, 3), None),  # a single query in the middle (keys beyond it are masked)
]


@pytest.mark.parametrize("positions, window", CASES)
def test_attend_matches_naive(positions, window):
    torch.manual_seed(0)
    B, H, Hkv, D = 2, 4, 2, 8
    q = torch.randn(B, len(positions), H, D, dtype=torch.float64)
    k = torch.randn(B, 9, Hkv, D, dtype=torch.float64)
    v = torch.randn(B, 9, Hkv, D, dtype=torch.float64)
    out = attend(q, k, v, positions, window)
    assert (out - naive_attend(q, k, v, list(positions), window)).abs().max() < 1e-12


def test_attend_rejects_bad_arguments():
    q = torch.randn(1, 2, 2, 4)
    k = v = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match="window"):
        attend(q, k, v, 0, window=0)
    with pytest.raises(ValueError, match="backend"):
        attend(q, k, v, 0, backend="magic")
    with pytest.raises(ValueError, match="q_pos"):
        attend(q, k, v, range(2, 4))  # position 3 has no key


@pytest.mark.gpu
@pytest.mark.parametrize("positions, window", CASES)
@pytest.mark.parametrize("backend", ["auto", "flex"])
def test_cuda_backends_match_sdpa(positions, window, backend):
    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(2, len(positions), 4, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(2, 9, 2, 64, device=dev, dtype=torch.bfloat16)
    v = torch.randn(2, 9, 2, 64, device=dev, dtype=torch.bfloat16)
    ref = attend(q.double(), k.double(), v.double(), positions, window, backend="sdpa")
    out = attend(q, k, v, positions, window, backend=backend)
    assert (out.double() - ref).abs().max() < 3e-2


def test_flex_compiles_once_per_query_length_whatever_the_positions_and_window(monkeypatch):
    """FlexAttention is compiled once per process; a strided stage, a chunk and every layer's
    window at one query length must share that one graph (a graph per (start, step, window) passed
    dynamo's recompile limit within one model and then ran unfused). Dynamo's guards do not depend
    on its backend, so the eager backend stands in for inductor here, on CPU, without gradients
    (FlexAttention has no CPU backward)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention

    import lrt_lab.core.attention as attention

    compiled = torch.compile(flex_attention, backend="eager", dynamic=False)
    monkeypatch.setattr(attention, "_compiled_flex", lambda: compiled)
    attention._flex_block_mask.cache_clear()
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    k, v = torch.randn(2, 1, 9, 2, 16).unbind(0)
    with torch.no_grad():
        for window in (None, 3, 4):
            for positions in (range(1, 9, 2), range(0, 8, 2), range(5, 9)):  # 4 queries each
                q = torch.randn(1, 4, 2, 16)
                out = attend(q, k, v, positions, window, backend="flex")
                ref = naive_attend(q, k, v, list(positions), window)
                assert (out - ref).abs().max() < 1e-5, (positions, window)
    assert counters["stats"]["unique_graphs"] == 1


def test_the_flash_query_is_a_constant_in_a_compiled_graph():
    """pick_backend asks whether flash-attn is installed at every CUDA attention call; inside a
    compiled stage that question must not be traced (a failed import breaks the graph)."""
    from lrt_lab.core.attention import _flash_attn_func, flash_attn_available

    f = torch.compile(
        lambda x: x + 1 if flash_attn_available() else x - 1, backend="eager", fullgraph=True
    )
    x = torch.zeros(2)
    assert torch.equal(f(x), x + 1 if _flash_attn_func() is not None else x - 1)


@pytest.mark.gpu
def test_a_compiled_training_stage_is_one_graph_on_cuda():
    """fullgraph=True raises at any graph break: every stage kind of an interleaved:2 step, with a
    sliding-window layer and the memory pathway, compiles whole and gives the eager loss."""
    from lrt_lab import LRT, MemoryConfig, preset
    from lrt_lab.run.registry import parse_schedule
    from lrt_lab.run.runner import run_schedule

    torch.manual_seed(0)
    cfg = preset("tiny", memory=MemoryConfig(), sequence_len=64)
    with torch.device("cuda"):
        model = LRT(cfg)
    x, y = torch.randint(cfg.vocab_size, (2, 2, 64), device="cuda").unbind(0)
    schedule = parse_schedule("interleaved:2")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = run_schedule(model, x, y, schedule).loss.item()
        model.stage = torch.compile(model.stage, fullgraph=True, dynamic=False)
        loss = run_schedule(model, x, y, schedule).loss
    loss.backward()
    assert abs(loss.item() - eager) < 2e-2
