"""Loop transformer and PonderLM-2-style latent thoughts:
float64, tiny models, every weight random."""

import pytest
import torch

from lrt_lab import LRT, LanguageModel, MemoryConfig, preset
from lrt_lab.core.baselines import (
    BASELINE_KINDS,
    LoopTransformer,
    PonderLM,
    build_baseline,
    is_baseline_kind,
)
from lrt_lab.run.decode import Decoder, generate
from lrt_lab.run.hooks import hooks, zero_at
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Chunked, Exact, Interleaved, OnePass

T = 10
TOL = 1e-10


def config(**overrides):
    # short windows (4 tokens, T = 10) so the window handling is exercised
    return preset("tiny", **{"n_layer": 2, "window_pattern": "SL", "short_window": 4, **overrides})


def randomise(model, seed=0):
    torch.manual_seed(seed)
    model = model.double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def tokens(B=2, T=T, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (B, T), generator=g)


def decode_all(model, idx):
    dec = Decoder(model, idx.size(0), idx.size(1))
    return torch.stack([dec.step(idx[:, t]) for t in range(idx.size(1))], dim=1)


def maxdiff(a, b):
    return (a - b).abs().max().item()


MODELS = {
    "loop:1": lambda: LoopTransformer(config(), 1),
    "loop:2": lambda: LoopTransformer(config(), 2),
    "loop:3": lambda: LoopTransformer(config(), 3),
    "ponder:1": lambda: PonderLM(config(), 1),
    "ponder:2": lambda: PonderLM(config(), 2, jacobi=1),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_shapes_and_causality(kind):
    """Logits (B, T, V); perturbing token t changes no logit before t, and does change logit t."""
    model = randomise(MODELS[kind]())
    idx = tokens()
    out = run_schedule(model, idx, tokens(seed=5), OnePass())
    assert out.logits.shape == (2, T, 64) and out.loss.ndim == 0
    for t in (0, 3, T - 1):
        other = idx.clone()
        other[:, t] = (other[:, t] + 1) % 64
        changed = run_schedule(model, other, None, OnePass()).logits
        if t:
            assert maxdiff(changed[:, :t], out.logits[:, :t]) <= TOL
        assert maxdiff(changed[:, t], out.logits[:, t]) > 1e-6


@pytest.mark.parametrize("n", [1, 2, 3])
def test_loop_decoding_equals_full_forward(n):
    model = randomise(LoopTransformer(config(), n))
    idx = tokens()
    full = run_schedule(model, idx, None, OnePass()).logits
    assert maxdiff(decode_all(model, idx), full) <= TOL
    for sched in (Exact(), Chunked(3)):  # any contiguous order of stages is the same function
        assert maxdiff(run_schedule(model, idx, None, sched).logits, full) <= TOL
    dec = Decoder(model, 2, T)  # prefill, then continue
    last = dec.prefill(idx[:, :6])
    steps = torch.stack([dec.step(idx[:, t]) for t in range(6, T)], dim=1)
    assert maxdiff(last, full[:, 5]) <= TOL and maxdiff(steps, full[:, 6:]) <= TOL
    assert model.forwards_per_token == n and model.forward_cost == n


def test_loop_of_one_is_the_plain_transformer_and_more_loops_differ():
    plain = randomise(LRT(config()), seed=3)
    loop1, loop2 = LoopTransformer(config(), 1).double(), LoopTransformer(config(), 2).double()
    loop1.load_state_dict(plain.state_dict())  # same parameter names: a checkpoint carries over
    loop2.load_state_dict(plain.state_dict())
    idx = tokens()
    ref = run_schedule(plain, idx, None, OnePass()).logits
    assert maxdiff(run_schedule(loop1, idx, None, OnePass()).logits, ref) <= TOL
    assert maxdiff(decode_all(loop1, idx), ref) <= TOL
    assert maxdiff(run_schedule(loop2, idx, None, OnePass()).logits, ref) > 1e-3
    assert loop1.param_report()["total"] == plain.param_report()["total"]


def test_random_loop_counts_vary_in_training_and_evaluation_uses_the_configured_count():
    model = randomise(LoopTransformer(config(), 3, random_loops=(1, 4)))
    L, idx = model.config.n_layer, tokens()
    torch.manual_seed(0)
    drawn = [len(model.empty_buffer(idx).k) // L for _ in range(40)]
    assert set(drawn) == {1, 2, 3, 4}
    # a training forward runs the drawn count: the same as a fixed model with that many loops
    torch.manual_seed(7)
    count = len(model.empty_buffer(idx).k) // L
    torch.manual_seed(7)
    train_logits = run_schedule(model, idx, None, OnePass()).logits
    fixed = LoopTransformer(config(), count).double()
    fixed.load_state_dict(model.state_dict())
    assert maxdiff(train_logits, run_schedule(fixed, idx, None, OnePass()).logits) <= TOL
    model.eval()
    assert {len(model.empty_buffer(idx).k) // L for _ in range(10)} == {3}
    model.train()
    with torch.no_grad():  # prefill/generation uses the configured count even in train mode
        assert len(model.empty_buffer(idx).k) // L == 3
    assert model.forward_cost == 2.5 and model.forwards_per_token == 3


@pytest.mark.parametrize("n_thoughts", [1, 2])
def test_ponder_decoding_equals_the_converged_jacobi_forward(n_thoughts):
    """Sequential decoding (N+1 forwards per token) is the definition; Jacobi with K >= N*T
    refinements reaches it exactly, and so does the exact schedule (one token per chunk)."""
    model = randomise(PonderLM(config(), n_thoughts, jacobi=n_thoughts * T))
    idx = tokens()
    decoded = decode_all(model, idx)
    assert maxdiff(run_schedule(model, idx, None, OnePass()).logits, decoded) <= TOL
    model.jacobi = n_thoughts
    assert maxdiff(run_schedule(model, idx, None, Exact()).logits, decoded) <= TOL
    model.jacobi = n_thoughts * 4  # chunks of 4 tokens converge with 4N refinements
    assert maxdiff(run_schedule(model, idx, None, Chunked(4)).logits, decoded) <= TOL
    assert model.forwards_per_token == n_thoughts + 1 and model.has_sequential_decoding


@pytest.mark.parametrize("K", [0, 1, 3])
def test_ponder_few_jacobi_refinements_approximate_decoding(K):
    """With K refinements the first K+1 tokens are exact (one thought) and later ones are not: the
    parallel forward differs from what the model does at inference, so evaluation must decode."""
    model = randomise(PonderLM(config(), 1, jacobi=K))
    idx = tokens()
    par, decoded = run_schedule(model, idx, None, OnePass()).logits, decode_all(model, idx)
    assert maxdiff(par[:, : K + 1], decoded[:, : K + 1]) <= TOL
    assert maxdiff(par[:, K + 1 :], decoded[:, K + 1 :]) > 1e-3
    assert model.forward_cost == 1 + (K + 1) * 2


def test_ponder_prefill_then_decode_and_generate():
    model = randomise(PonderLM(config(), 1, jacobi=1))
    idx = tokens()
    decoded = decode_all(model, idx)
    dec = Decoder(model, 2, T)
    last = dec.prefill(idx[:, :6], Exact())  # exact prefill (K >= N), then sequential steps
    steps = torch.stack([dec.step(idx[:, t]) for t in range(6, T)], dim=1)
    assert maxdiff(last, decoded[:, 5]) <= TOL and maxdiff(steps, decoded[:, 6:]) <= TOL
    out = generate(model, idx[:, :3], 4, temperature=0, prefill=Exact())
    assert torch.equal(out[:, 3:], decode_all(model, out[:, :-1])[:, 2:].argmax(-1))


def test_ponder_trains_through_every_jacobi_pass():
    model = randomise(PonderLM(config(), 1, jacobi=2))
    idx, targets = tokens(), tokens(seed=5)
    cache = {}
    out = run_schedule(model, idx, targets, OnePass(), cache=cache)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    # block hooks report the final pass's rows (N+1 per token); the token's prediction is read at
    # its last thought row, so the head of that row's residual stream gives the logits
    resid = cache["blocks.1.hook_resid_post"]
    assert resid.shape == (2, 2 * T, model.config.n_embd) and cache["hook_embed"].shape[1] == T
    assert maxdiff(model.head(resid[:, 1::2]), out.logits) <= TOL
    # buffer: layers 0..L-1 hold the 2T interleaved rows, L..2L-1 the init pass's T rows; the
    # interleaved rows never read the init pass's K/V, so a gradient reaching them has flowed
    # back through the thoughts the init pass seeded (nothing is detached)
    logits, buf = model.stage(idx, range(0, T), model.empty_buffer(idx))
    assert len(buf.k) == 4 and buf.k[0].size(1) == 2 * T and buf.k[2].size(1) == T
    (grad,) = torch.autograd.grad(logits.square().sum(), buf.k[2])
    assert grad.abs().sum() > 0


def test_random_jacobi_counts_vary_in_training_only():
    model = randomise(PonderLM(config(), 1, jacobi=3, random_jacobi=(0, 3)))
    torch.manual_seed(0)
    assert {model._iterations() for _ in range(40)} == {0, 1, 2, 3}
    model.eval()
    assert {model._iterations() for _ in range(5)} == {3}
    assert model.forward_cost == 1 + 2.5 * 2


@pytest.mark.parametrize(
    "kind, cls, attrs",
    [
        ("loop:3", LoopTransformer, {"n_loops": 3, "random_loops": None}),
        ("loop:2:1-4", LoopTransformer, {"n_loops": 2, "random_loops": (1, 4)}),
        ("ponder:1", PonderLM, {"n_thoughts": 1, "jacobi": 3, "random_jacobi": None}),
        ("ponder:2:1", PonderLM, {"n_thoughts": 2, "jacobi": 1}),
        ("ponder:1:2-3", PonderLM, {"n_thoughts": 1, "jacobi": 3, "random_jacobi": (2, 3)}),
    ],
)
def test_build_baseline_parses_kinds(kind, cls, attrs):
    model = build_baseline(kind, config())
    assert type(model) is cls and is_baseline_kind(kind) and not model.config.is_lrt
    for name, value in attrs.items():
        assert getattr(model, name) == value


def test_every_kind_is_a_language_model_and_only_the_lrt_has_memory():
    """The type names say what the models are: the baselines share the base, not the LRT."""
    models = [build_baseline(k, config()) for k in ("loop:2", "ponder:1")]
    assert all(isinstance(m, LanguageModel) and not isinstance(m, LRT) for m in models)
    assert isinstance(LRT(config()), LanguageModel)
    with pytest.warns(DeprecationWarning, match="LanguageModel"):
        from lrt_lab.core.model import Transformer
    assert Transformer is LanguageModel


@pytest.mark.parametrize(
    "kind, field",
    [
        ("loop", "model"),
        ("loop:0", "n_loops"),
        ("loop:2:3", "model"),
        ("loop:2:3-1", "random_loops"),
        ("ponder:0", "n_thoughts"),
        ("ponder:1:x", "model"),
        ("transformer", "model"),
        ("recurrent:2", "model"),
    ],
)
def test_bad_kinds_name_the_field(kind, field):
    with pytest.raises(ValueError, match=f"model=.*{field}" if field != "model" else "model="):
        build_baseline(kind, config())
    with pytest.raises(ValueError, match="model=.*memory"):
        build_baseline("loop:2", config(memory=MemoryConfig()))


def test_baselines_refuse_memory_and_strided_stages():
    with pytest.raises(ValueError, match="memory"):
        LoopTransformer(config(memory=MemoryConfig()), 2)
    model = randomise(PonderLM(config(), 1))
    with pytest.raises(ValueError, match="contiguous"):
        run_schedule(model, tokens(), None, Interleaved(2))
    assert set(BASELINE_KINDS) >= {"loop:N", "ponder:N"}


@pytest.mark.parametrize("kind", ["loop:2", "ponder:1"])
def test_baseline_interventions_act_in_every_pass_and_match_decoding(kind):
    """The baselines' passes run the LRT's Block modules, so a hook can replace an activation: the
    same ablation gives the same logits in the parallel forward and token-by-token decoding (for
    ponder at its fixed point, K >= N T), and it changes them."""
    model = randomise(
        LoopTransformer(config(), 2) if kind == "loop:2" else PonderLM(config(), 1, jacobi=T)
    )
    idx = tokens()
    plain = run_schedule(model, idx, None, OnePass()).logits
    with hooks(
        model,
        {
            "blocks.0.hook_mlp_out": zero_at(range(3, 6)),
            "blocks.1.attn.hook_v": lambda v, positions: 2 * v,
        },
    ):
        ablated = run_schedule(model, idx, None, OnePass()).logits
        decoded = decode_all(model, idx)
    assert maxdiff(ablated, decoded) <= TOL
    assert maxdiff(ablated, plain) > 1e-3


def test_ponder_capture_is_per_row_under_any_chunking():
    """Block hooks report rows ((N+1) per token) of the passes that produce the output; the init
    pass
    over the tokens alone is not reported, so a chunked capture tiles the rows like OnePass's."""
    # at the fixed point chunking changes nothing
    model = randomise(PonderLM(config(), 1, jacobi=T))
    idx = tokens()
    caps = []
    for schedule in (OnePass(), Chunked(5)):
        cache = {}
        run_schedule(model, idx, None, schedule, cache=cache)
        caps.append(cache["blocks.0.hook_resid_pre"])
    assert caps[0].shape == (2, 2 * T, model.config.n_embd) and maxdiff(*caps) <= TOL


# The model interface
# -------------------------------------------------------------------------------
def _members(protocol) -> set[str]:
    """The names a Protocol declares: its annotated attributes and its methods."""
    methods = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return set(protocol.__annotations__) | methods


@pytest.mark.parametrize(
    "build",
    [
        lambda c: LRT(c.replace(memory=MemoryConfig())),
        LRT,
        lambda c: LoopTransformer(c, 2),
        lambda c: PonderLM(c, 1),
    ],
    ids=["lrt", "transformer", "loop", "ponder"],
)
def test_every_model_kind_implements_the_sequence_model_interface(build):
    from lrt_lab.core.interface import DeclaresParamRoles, SequenceModel

    model = build(config())
    assert isinstance(model, SequenceModel) and isinstance(model, DeclaresParamRoles)
    assert {
        "config",
        "pathway",
        "stage",
        "empty_buffer",
        "new_decode_cache",
        "exact_split",
        "forward_cost",
        "forwards_per_token",
        "has_sequential_decoding",
        "param_roles",
    } <= _members(SequenceModel)
    missing = [name for name in _members(SequenceModel) if not hasattr(model, name)]
    assert not missing
    assert isinstance(model.forward_cost, float) and isinstance(model.forwards_per_token, int)
    assert isinstance(model.has_sequential_decoding, bool)
    split = model.exact_split(1)
    assert split is None if model.pathway is None else 0 < split < model.config.n_layer


def test_no_getattr_or_hasattr_reads_a_model_member():
    """Callers read the interface's members plainly (lrt_lab/core/interface.py): a getattr/hasattr
    on a
    model, or on one of the interface's member names, would bring the duck typing back."""
    import re
    from pathlib import Path

    from lrt_lab.core.interface import Schedule, SequenceModel, Task

    root = Path(__file__).resolve().parents[1]
    names = _members(SequenceModel) | _members(Task) | _members(Schedule)
    call = re.compile(
        r"\b(?:getattr|hasattr)\(\s*([^,()]+(?:\([^()]*\))?[^,()]*),\s*['\"](\w+)['\"]"
    )
    found = []
    for path in sorted([*(root / "lrt_lab").rglob("*.py"), *(root / "scale").rglob("*.py")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for obj, attr in call.findall(line):
                if re.search(r"\bmodel\b", obj) or attr in names:
                    found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
