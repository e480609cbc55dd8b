"""GaussSeidel(S, N, G): N sweeps over Interleaved's strided groups after an init pass, the last G
differentiated. In float64 against independent computations: Interleaved(S) (N = 1), Exact (S = T,
and N >= ceil(T/S) sweeps), hand counts of the stages and the cost, and the per-position
reference (tests/reference.py) run with differentiable weights over a stage plan built here, for
the loss and every gradient.

The generated suite (tests/test_invariants.py) holds GaussSeidel(T, 1) and GaussSeidel(3,
ceil(T/3)) == Exact (logits), GaussSeidel(2, 1) == Interleaved(2) and GaussSeidel(T, 2) == Exact
(loss and gradients), and the prefill handoff over the whole config space."""

import math

import pytest
import torch
from helpers import CONFIGS, make_model, maxdiff, tokens
from reference import NaiveLRT, naive_cross_entropy

from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact, GaussSeidel, Interleaved, OnePass

T = 10


def close(a, b, tol=1e-10):
    """Within float64 rounding relative to the scale of b."""
    return maxdiff(a, b) <= tol * max(1.0, b.abs().max().item())


def named_grads(model, loss) -> dict[str, torch.Tensor]:
    names, params = zip(*model.named_parameters())
    got = torch.autograd.grad(loss, params, allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g for n, p, g in zip(names, params, got)}


def test_spelling_parses_round_trips_and_refuses_bad_arguments():
    assert parse_schedule("gaussseidel:2:3") == GaussSeidel(2, 3, 1)
    assert parse_schedule("gaussseidel:4:3:2") == GaussSeidel(4, 3, 2)
    for s in (GaussSeidel(2, 3), GaussSeidel(4, 3, 2), GaussSeidel(1, 1)):
        assert parse_schedule(s.spec) == s
    assert GaussSeidel(2, 3).spec == "gaussseidel:2:3"  # G = 1 is the default, left out
    assert GaussSeidel(2, 3, 3).spec == "gaussseidel:2:3:3"
    for bad in (
        "gaussseidel:2",
        "gaussseidel:0:1",
        "gaussseidel:2:0",
        "gaussseidel:2:2:3",  # more differentiated sweeps than sweeps
        "gaussseidel:2:2:0",
        "gaussseidel:x:2",
        "gaussseidel:2:2:1:1",
    ):
        with pytest.raises(ValueError, match="gaussseidel"):
            parse_schedule(bad)
    with pytest.raises(ValueError, match="grad_sweeps"):
        GaussSeidel(2, 2, 3)
    with pytest.raises(ValueError, match="S=11"):
        GaussSeidel(11, 1).stages(10)


def test_stages_and_cost_counted_by_hand():
    groups = [range(0, 8, 3), range(1, 8, 3), range(2, 8, 3)]
    untruncated = GaussSeidel(3, 2, 2)
    assert untruncated.stages(8) == [range(0, 8)] + groups + groups
    assert untruncated.stages_without_grad(8) == []
    truncated = GaussSeidel(3, 4, 1)
    assert truncated.stages(8) == groups  # the stages that carry a loss
    assert truncated.stages_without_grad(8) == [range(0, 8)] + groups * 3
    assert truncated.stage_weights(8) == [1.0] * 3
    # init + 4 sweeps, each recomputing every position once; 1 of them with autograd
    assert (untruncated.cost, truncated.cost) == (3.0, 5.0)
    model = make_model(CONFIGS["default"])
    assert tuple(untruncated.forwards(model, 8)) == (3.0, 0.0)
    assert tuple(truncated.forwards(model, 8)) == (1.0, 4.0)
    for S in (1, 2, 3):  # one sweep: Interleaved's stages and cost
        assert GaussSeidel(S, 1).stages(T) == Interleaved(S).stages(T)
        assert GaussSeidel(S, 1).cost == Interleaved(S).cost
    out = run_schedule(model, tokens(T=8), None, truncated)
    assert out.measured.cost == 5.0 and out.stages == groups


@pytest.mark.parametrize("name", ["default", "source1_lag2", "averages"])
@pytest.mark.parametrize("S", [1, 2, 3])
def test_one_sweep_is_interleaved_in_loss_and_every_gradient(name, S):
    model = make_model(CONFIGS[name])
    idx, targets = tokens(T=T), tokens(T=T, seed=3)
    out = run_schedule(model, idx, targets, GaussSeidel(S, 1))
    ref = run_schedule(model, idx, targets, Interleaved(S))
    assert close(out.logits, ref.logits) and close(out.loss, ref.loss)
    got, want = named_grads(model, out.loss), named_grads(model, ref.loss)
    for n in want:
        assert close(got[n], want[n]), n


@pytest.mark.parametrize("name", ["default", "source1_lag2", "reset_at_bos"])
def test_one_position_per_group_is_exact(name):
    """S = T: each group is one position, visited in order, so every sweep is the exact
    recurrence. Its logits are Exact's for any N; with a no-grad phase (G < N) the loss is the
    mean of G exact sweeps' CE and the gradient BPTT's, since the differentiated sweep reads only
    rows written earlier in itself (the detached buffer is never read)."""
    model = make_model(CONFIGS[name])
    idx, targets = tokens(T=T), tokens(T=T, seed=3)
    exact = run_schedule(model, idx, targets, Exact())
    with torch.no_grad():
        for N in (1, 2, 3):
            assert close(run_schedule(model, idx, None, GaussSeidel(T, N)).logits, exact.logits)
    want = named_grads(model, exact.loss)
    for sched in (GaussSeidel(T, 2), GaussSeidel(T, 3, 2)):
        out = run_schedule(model, idx, targets, sched)
        assert close(out.loss, exact.loss), sched
        got = named_grads(model, out.loss)
        for n in want:
            assert close(got[n], want[n]), (sched, n)


@pytest.mark.parametrize("name", ["default", "source1_lag2", "averages"])
@pytest.mark.parametrize("S", [1, 2, 3, 4])
def test_each_sweep_makes_the_next_block_of_positions_exact(name, S):
    """After sweep n the positions < n*S have Exact's logits, for any weights and read offsets:
    a position reads only rows before itself, and the ones in its own block of S (earlier groups)
    were recomputed earlier in the same sweep. So the exact prefix never shrinks as N grows, and
    N = ceil(T/S) sweeps give Exact everywhere (a bound of T/S + 1 would be one more than needed).

    The largest error is *not* monotone in N: positions beyond the prefix read memory that is
    still wrong, and one more sweep can move them further off (on the lag-1 model at S = 1 the
    largest logit error goes 11, 11, 9.8, 11, 12 over the first sweeps). With lag 1 the bound
    is tight: position n*S reads m_{n*S-1} from the previous sweep, exact only since that one."""
    model = make_model(CONFIGS[name])
    idx = tokens(B=3, T=T)
    need = math.ceil(T / S)
    with torch.no_grad():
        exact = run_schedule(model, idx, None, Exact()).logits
        prefix = []
        for N in range(1, need + 2):
            logits = run_schedule(model, idx, None, GaussSeidel(S, N)).logits
            err = (logits - exact).abs().amax(dim=(0, 2))
            wrong = (err > 1e-10 * max(1.0, exact.abs().max().item())).nonzero()
            prefix.append(int(wrong[0]) if len(wrong) else T)
    assert all(p >= min(N * S, T) for N, p in enumerate(prefix, start=1)), prefix
    assert prefix[need - 1] == prefix[need] == T, prefix  # N = ceil(T/S) and one more: Exact
    if CONFIGS[name].lag == 1 and CONFIGS[name].lag_avg == 1:  # tight: the prefix grows by
        bound, tight = 1, []  # S per sweep from the block boundary at or below it (the init pass
        for _ in range(need + 1):  # leaves position 0 exact, which S = 1, Jacobi, keeps: N + 1)
            bound = min(S * (bound // S) + S, T)
            tight.append(bound)
        assert prefix == tight, prefix


def reference_loss(model, idx, targets, S, N, G):
    """The GaussSeidel loss computed by the per-position reference, with its weights as leaves:
    a plan of stages built here (init, then N sweeps over {t : t % S == g} for g = 0..S-1), the
    stages before the last G sweeps run without autograd, then the uniform mean of the
    differentiated stages' hand-written CE (the init's too when G = N)."""
    naive = NaiveLRT(model)
    naive.W = {k: v.clone().requires_grad_(True) for k, v in naive.W.items()}
    T = idx.size(1)
    plan = [(list(range(T)), G < N)]  # (positions, without gradient)
    for n in range(N):
        for g in range(S):
            plan.append(([t for t in range(T) if t % S == g], n < N - G))
    bufs = [naive.empty_buffer() for _ in range(idx.size(0))]
    losses = []
    for P, frozen in plan:
        with torch.no_grad() if frozen else torch.enable_grad():
            stage = []
            for b in range(idx.size(0)):
                out, bufs[b] = naive.stage(idx[b], P, bufs[b])
                stage.append(torch.stack([out[t] for t in P]))
        if not frozen:
            losses.append(naive_cross_entropy(torch.stack(stage), targets[:, P]))
    return sum(losses) / len(losses), naive.W


@pytest.mark.parametrize("name", ["default", "averages"])
@pytest.mark.parametrize("S,N,G", [(2, 1, 1), (2, 3, 1), (3, 3, 2), (2, 2, 2)])
def test_loss_and_gradients_match_the_per_position_reference(name, S, N, G):
    model = make_model(CONFIGS[name])
    idx, targets = tokens(B=2, T=6), tokens(B=2, T=6, seed=3)
    out = run_schedule(model, idx, targets, GaussSeidel(S, N, G))
    ref_loss, W = reference_loss(model, idx, targets, S, N, G)
    assert close(out.loss, ref_loss.detach()), (float(out.loss), float(ref_loss))
    got = named_grads(model, out.loss)
    ref = dict(zip(W, torch.autograd.grad(ref_loss, list(W.values()), allow_unused=True)))
    for n, g in got.items():
        want = torch.zeros_like(g) if ref[n] is None else ref[n]
        assert close(g, want, 1e-9), n


def test_without_memory_every_sweep_is_the_plain_forward():
    model = make_model(None)
    idx = tokens(T=T)
    with torch.no_grad():
        plain = run_schedule(model, idx, None, OnePass()).logits
        assert close(run_schedule(model, idx, None, GaussSeidel(3, 2)).logits, plain)
