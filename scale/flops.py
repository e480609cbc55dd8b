"""FLOP and token accounting for the scaling runs: what a step costs, how many steps R buys.

Two choices the reference code gets wrong for LRT, made explicit here:

Tokens from the *baseline's* parameter count
    The paper trains "a model with N trainable parameters at ratio R on R x N tokens" and compares
    LRT at R with the baseline at 2R. N is the backbone's total trainable parameter count,
    embeddings included (that is how a 20L model is "1.3B": 1,315,969,320 parameters, of which
    839M are value embeddings) and *without* the memory pathway, i.e.
    ``LRT.param_report()["baseline"]``. LRT-shared (+0.3%) and LRT-layerwise (+4.8%) at ratio R
    therefore see exactly the same number of tokens as the baseline at ratio R:

        tokens = R * N_baseline,    steps = ceil(tokens / global_batch_tokens)

FLOPs from every stage of the schedule
    nanochat's ``estimate_flops`` counts one forward per token (6 N + attention). A schedule runs
    several stages over a sequence of T tokens; stage P recomputes |P| positions, each a full
    pass through the network attending to the whole buffer. So

        forward FLOPs per position  f = 2 * N_matmul + sum_l 4 * n_head * head_dim * min(w_l, T)
        training FLOPs per token     = 3 * f * (sum_P |P|) / T          (backward = 2 x forward)

    with (sum_P |P|)/T = 1 for OnePass, Chunked(C) and Exact; 2 for Interleaved(S) (an init pass
    over all T plus S subsets that cover T once); K+1 for FullSequence(K); G for Rollout(G), whose
    rollout adds a forward without backward through the blocks that feed the memory:
    f * split / n_layer per token. Each schedule states both counts (`Schedule.forwards`:
    differentiated and inference forwards per token). Counting only the first pass undercounts
    Interleaved training by ~2x.

    N_matmul counts every 2-D weight used as a matrix multiply per position: attention q/k/v/out,
    the value-embedding gate, MLP, LM head, and for LRT the recurrent K/V projections (applied
    once per stage when shared, once per layer when layerwise) and the dual gates. Embedding and
    value-embedding tables are lookups (no FLOPs) and 1-D scalars are negligible, as in nanochat.
    The attention term counts what causal attention computes: query t sees min(t + 1, w_l) keys
    (w_l = T for full layers, the window for sliding "S" layers), QK^T and AV at 2 FLOPs per
    multiply-add each, averaged over the T positions of a sequence: 4 * n_head * head_dim *
    mean_t min(t + 1, w_l) per layer, about half of the non-causal count at full length. Every
    stage kind sees the same keys per position (a stage's queries attend causally to the whole
    buffer), so a schedule that covers T positions c times costs c times this. ``causal=False``
    gives the convention of nanochat's ``estimate_flops`` and torchtitan's model FLOP count
    (every query charged min(w_l, T) keys: 12 * l * h * q * T per token, no causal halving),
    whose attention term reads about 2x higher; MFU here uses the causal count (as
    FlashAttention's benchmarks do for causal kernels), so it reads lower than nanochat's MFU
    for the same run, by the attention's share of the FLOPs over 2. The memory
    pathway is charged in every stage, also the init
    stage where the memory is zero and its projections are skipped: an upper bound off by at most
    the pathway's share of N_matmul (0.3% of a 20L model).

Two definitions of N for "R x N" (``ratio_params``, named in the dry run and config.json)
    ``total`` (default, the paper's text): the baseline's parameters, embeddings included, as
    above: 13.16B tokens for 20L at R = 10, the same for LRT and baseline.
    ``matrices`` (the released code, nanochat's "scaling parameters"): the trained model's own
    matrix parameters, transformer matrices + LM head, no embeddings: 435M for the 20L baseline,
    so about 3x fewer tokens at the same R, and an LRT counts its memory matrices too, so it gets
    more tokens than the baseline at the same R.

Data read per token trained (``data_plan``)
    Best-fit packing crops documents that do not fit a row (``lrt_scale.loader``, remainder "drop"):
    at T = 2048 about 35% of the tokens read are cropped away (nanochat's measurement), so a run
    reads ``tokens / (1 - 0.35)`` tokens of text, ~52M per shard (250M characters at ~4.8
    characters per token): 20L baseline at R = 20 needs ~780 train shards, not 510. With fewer
    the loader starts another epoch (logged as ``data_epoch``).

Baseline-equivalent compute
    ``compute_tokens = tokens * train_flops_per_token / baseline_train_flops_per_token``: the
    tokens a baseline (same backbone, OnePass) could have trained on with the same FLOPs. Divided
    by N_baseline it is the baseline-equivalent ratio the paper plots LRT at (about 2R for
    Interleaved(2)).

MFU = achieved training FLOP/s / (peak FLOP/s per device * devices), the FLOPs counted as above
(causal attention); ``peak`` defaults to an H100 SXM's dense bf16 989 TFLOP/s.

Models are built on the meta device for counting, so a 24L plan costs no memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from lrt_lab.core.config import ModelConfig
from lrt_lab.core.model import LRT, LanguageModel
from lrt_lab.run.registry import as_schedule

H100_BF16_PEAK_FLOPS = 989e12  # H100 SXM dense bf16 (no sparsity)
REFERENCE_BATCH_TOKENS = 2**19  # the paper's (and nanochat's) global batch
RATIO_PARAMS = ("total", "matrices")
# nanochat's figures: a shard holds ~250M characters at ~4.8 characters per token, and best-fit
# packing at T = 2048 crops ~35% of the tokens it reads
SHARD_TOKENS_ESTIMATE = 250e6 / 4.8
BEST_FIT_CROP_FRACTION = 0.35


def _as_model(model_or_config) -> LanguageModel:
    if isinstance(model_or_config, ModelConfig):
        with torch.device("meta"):
            return LRT(model_or_config)
    if isinstance(model_or_config, LanguageModel):
        return model_or_config
    raise ValueError(
        f"model={type(model_or_config).__name__} is invalid; allowed: a model (LRT, a "
        "baseline) or a ModelConfig"
    )


def _is_embedding(name: str) -> bool:
    return name.startswith("wte.") or name.startswith("value_embeds.")


def count_params(model_or_config) -> dict:
    """Parameter counts: total, baseline (without the memory pathway), matmul (FLOP-bearing) for
    both, embedding (lookup tables) and scalar (1-D) parameters."""
    model = _as_model(model_or_config)
    out = {
        "total": 0,
        "baseline": 0,
        "matmul": 0,
        "matmul_baseline": 0,
        "embedding": 0,
        "scalar": 0,
    }
    for name, p in model.named_parameters():
        n = p.numel()
        memory = name.startswith("pathway.")  # the memory pathway's parameters
        out["total"] += n
        out["baseline"] += 0 if memory else n
        if _is_embedding(name):
            out["embedding"] += n
        elif p.ndim >= 2:
            out["matmul"] += n
            out["matmul_baseline"] += 0 if memory else n
        else:
            out["scalar"] += n
    return out


def mean_visible_keys(seq_len: int, window: int | None, causal: bool = True) -> float:
    """Keys one query sees, averaged over the positions 0..T-1 of a sequence: mean_t min(t + 1, w)
    (causal), or min(w, T) (``causal=False``, every query charged the whole window)."""
    T = seq_len
    w = T if window is None else min(window, T)
    if not causal:
        return float(w)
    # sum_{t<T} min(t + 1, w) = w (w + 1) / 2 for the first w positions, w for the other T - w
    return (w * (w + 1) / 2 + (T - w) * w) / T


def attention_flops_per_position(
    config: ModelConfig, seq_len: int | None = None, causal: bool = True
) -> float:
    """Forward attention FLOPs of one query position, averaged over a sequence: sum over layers of
    4 * n_head * head_dim * keys seen (QK^T and AV, each 2 FLOPs per multiply-add); keys seen =
    mean_t min(t + 1, window) for causal attention (default), min(window, T) with causal=False
    (nanochat's and torchtitan's convention)."""
    T = seq_len or config.sequence_len
    hq = config.n_head * config.head_dim
    return sum(4 * hq * mean_visible_keys(T, w, causal) for w in config.window_sizes())


def forward_flops_per_position(
    model_or_config, seq_len: int | None = None, baseline: bool = False, causal: bool = True
) -> float:
    """Forward FLOPs of one pass over one position: 2 * N_matmul + attention."""
    model = _as_model(model_or_config)
    counts = count_params(model)
    n = counts["matmul_baseline" if baseline else "matmul"]
    return 2 * n + attention_flops_per_position(model.config, seq_len, causal)


def train_flops_per_token(
    model_or_config, schedule=None, seq_len: int | None = None, causal: bool = True
) -> float:
    """Training FLOPs per token: 3 x forward (backward = 2x) for every stage of the schedule, plus
    1 x forward for what runs without autograd (Rollout's rollout)."""
    model = _as_model(model_or_config)
    T = seq_len or model.config.sequence_len
    fwd = forward_flops_per_position(model, T, causal=causal)
    forwards = as_schedule(schedule).forwards(model, T)
    return 3.0 * fwd * forwards.differentiated + fwd * forwards.inference


def official_flops_per_token(
    model_or_config, seq_len: int | None = None, causal: bool = True
) -> float:
    """What nanochat-style accounting reports: one training pass (6 N + attention), whatever the
    schedule, with the attention counted as `causal` says (the same convention as the schedule's
    count, so their ratio is the schedule's undercount alone). Kept only to show the undercount."""
    model = _as_model(model_or_config)
    return 3.0 * forward_flops_per_position(model, seq_len, causal=causal)


def mfu(
    flops_per_second: float, peak_flops: float = H100_BF16_PEAK_FLOPS, devices: int = 1
) -> float:
    """Model FLOP utilisation: achieved / (peak per device * devices)."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r} is invalid; allowed: a number > 0")
    if not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices={devices!r} is invalid; allowed: an integer >= 1")
    return flops_per_second / (peak_flops * devices)


@dataclass
class Plan:
    """The accounting of one run (stored in config.json["accounting"])."""

    seq_len: int
    global_batch_tokens: int
    steps: int
    tokens: int  # steps * global_batch_tokens
    ratio: float  # tokens / params_baseline (the R the run really gets)
    params_total: int
    params_baseline: int  # N of "R x N" (embeddings included, memory excluded)
    params_matmul: int
    params_matmul_baseline: int
    token_forwards: float  # sum_P |P| / T of the schedule's differentiated stages
    forward_flops_per_position: float
    train_flops_per_token: float  # every stage
    official_flops_per_token: float  # one pass (the undercount)
    baseline_train_flops_per_token: float  # same backbone, OnePass
    flops_per_step: float
    flops_total: float
    compute_tokens: float  # baseline-equivalent tokens
    compute_ratio: float  # baseline-equivalent R = compute_tokens / params_baseline
    undercount: float  # train_flops_per_token / official_flops_per_token
    ratio_params: str = "total"  # which N "R x N" counts (RATIO_PARAMS)
    params_ratio: int = 0  # that N
    rollout_forwards: float = 0.0  # forwards per token without backward (Rollout's rollout)
    attention: str = "causal"  # how attention FLOPs are counted: causal, or noncausal (nanochat's)

    def to_dict(self) -> dict:
        return asdict(self)


def plan(
    model_or_config,
    schedule=None,
    *,
    ratio: float | None = None,
    tokens: int | None = None,
    steps: int | None = None,
    global_batch_tokens: int = REFERENCE_BATCH_TOKENS,
    seq_len: int | None = None,
    ratio_params: str = "total",
    causal: bool = True,
) -> Plan:
    """Steps, tokens and FLOPs of a run. Exactly one of `steps`, `tokens`, `ratio` sets the length
    (steps = ceil(tokens / global batch), tokens = ratio * N with N per `ratio_params`: "total" =
    N_baseline, "matrices" = the model's matrix parameters; see the module docstring)."""
    if ratio_params not in RATIO_PARAMS:
        raise ValueError(
            f"ratio_params={ratio_params!r} is invalid; allowed: {', '.join(RATIO_PARAMS)}"
        )
    model = _as_model(model_or_config)
    T = seq_len or model.config.sequence_len
    given = [
        k for k, v in (("steps", steps), ("tokens", tokens), ("ratio", ratio)) if v is not None
    ]
    if len(given) != 1:
        raise ValueError(
            f"run length: {'/'.join(given) or 'nothing'} given; allowed: exactly one of steps, "
            "tokens, ratio"
        )
    if not isinstance(global_batch_tokens, int) or global_batch_tokens < 1:
        raise ValueError(
            f"global_batch_tokens={global_batch_tokens!r} is invalid; allowed: an integer >= 1"
        )
    counts = count_params(model)
    n_ratio = counts["baseline"] if ratio_params == "total" else counts["matmul"]
    n_ratio_baseline = counts["baseline"] if ratio_params == "total" else counts["matmul_baseline"]
    if steps is not None:
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps={steps!r} is invalid; allowed: an integer >= 1")
    elif tokens is not None:
        if not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens={tokens!r} is invalid; allowed: an integer >= 1")
        steps = math.ceil(tokens / global_batch_tokens)
    else:
        if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"ratio={ratio!r} is invalid; allowed: a number > 0")
        steps = max(1, math.ceil(ratio * n_ratio / global_batch_tokens))
    n_tokens = steps * global_batch_tokens
    fwd = forward_flops_per_position(model, T, causal=causal)
    tf, rollout = as_schedule(schedule).forwards(model, T)
    train = 3.0 * fwd * tf + fwd * rollout
    official = 3.0 * fwd
    base = 3.0 * forward_flops_per_position(model, T, baseline=True, causal=causal)
    compute_tokens = n_tokens * train / base
    return Plan(
        seq_len=T,
        global_batch_tokens=global_batch_tokens,
        steps=steps,
        tokens=n_tokens,
        ratio=n_tokens / n_ratio,
        params_total=counts["total"],
        params_baseline=counts["baseline"],
        params_matmul=counts["matmul"],
        params_matmul_baseline=counts["matmul_baseline"],
        token_forwards=tf,
        forward_flops_per_position=fwd,
        train_flops_per_token=train,
        official_flops_per_token=official,
        baseline_train_flops_per_token=base,
        flops_per_step=train * global_batch_tokens,
        flops_total=train * n_tokens,
        compute_tokens=compute_tokens,
        compute_ratio=compute_tokens / n_ratio_baseline,
        undercount=train / official,
        ratio_params=ratio_params,
        params_ratio=n_ratio,
        rollout_forwards=rollout,
        attention="causal" if causal else "noncausal",
    )


def data_plan(
    tokens: int,
    crop_fraction: float = BEST_FIT_CROP_FRACTION,
    shard_tokens: float = SHARD_TOKENS_ESTIMATE,
) -> dict:
    """Text a run reads for `tokens` trained tokens under best-fit packing, and the train shards
    that holds (an estimate; the loader logs the real crop and epoch)."""
    if not 0 <= crop_fraction < 1:
        raise ValueError(f"crop_fraction={crop_fraction!r} is invalid; allowed: a number in [0, 1)")
    read = tokens / (1 - crop_fraction)
    return {
        "tokens_trained": tokens,
        "crop_fraction": crop_fraction,
        "tokens_read": read,
        "shard_tokens": shard_tokens,
        "train_shards": math.ceil(read / shard_tokens),
    }


def format_plan(p: Plan) -> str:
    """A few lines for the launcher's log."""
    return "\n".join(
        [
            f"params: {p.params_total:,} total, {p.params_baseline:,} baseline (without the memory "
            "pathway), "
            f"{p.params_matmul:,} in matmuls",
            f"run: {p.steps:,} steps x {p.global_batch_tokens:,} tokens = {p.tokens:,} tokens (R = "
            f"{p.ratio:.2f} "
            f"over N = {p.params_ratio:,}, ratio_params={p.ratio_params})",
            f"FLOPs/token: {p.train_flops_per_token:.4e} over {p.token_forwards:g} token-forwards"
            + (
                f" + a {p.rollout_forwards:g}-pass rollout without backward"
                if p.rollout_forwards
                else ""
            )
            + " "
            f"(one-pass count {p.official_flops_per_token:.4e}: x{p.undercount:.3f}); total "
            f"{p.flops_total:.4e}",
            f"baseline-equivalent: {p.compute_tokens:,.0f} tokens (R_eq = {p.compute_ratio:.2f})",
            "data: ~{tokens_read:,.0f} tokens read with {crop_fraction:.0%} cropped by best-fit "
            "packing "
            "= ~{train_shards} train shards of ~{shard_tokens:,.0f} tokens".format(
                **data_plan(p.tokens)
            ),
        ]
    )


__all__ = [
    "BEST_FIT_CROP_FRACTION",
    "H100_BF16_PEAK_FLOPS",
    "RATIO_PARAMS",
    "REFERENCE_BATCH_TOKENS",
    "SHARD_TOKENS_ESTIMATE",
    "Plan",
    "attention_flops_per_position",
    "mean_visible_keys",
    "count_params",
    "data_plan",
    "forward_flops_per_position",
    "format_plan",
    "mfu",
    "official_flops_per_token",
    "plan",
    "train_flops_per_token",
]
