"""Recurrent decoding: one forward (one stage of one position) per generated token.

The decoder's state is the standard KV cache plus the last source-layer state per sequence
(paper app. "Measured Efficiency and Parallel Prefill"). Prefill is any schedule run on the
prompt: OnePass (baseline cost, `Decoder.prefill`'s default), Interleaved(S) (matches training),
or Exact (the recurrence itself, `generate`'s default); the source state at the last prompt
position then starts recurrent decoding.

Prefill and steps run under `torch.inference_mode()` (no autograd bookkeeping at all: decoding is
launch-bound, and it removes a per-op cost from every small op of a step). Their logits are
inference tensors: read them freely; to backpropagate through one, clone it first
(`lrt_lab.run.hooks.capture` hands out such clones). `generate` returns normal tensors.
"""

from __future__ import annotations

import warnings

import torch

from lrt_lab.core.buffer import compute_dtype
from lrt_lab.core.token_ids import check_token_ids, vocab_size_of
from lrt_lab.core.validation import TORCH_SEED_LIMIT, check_int, check_number, check_seed
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact, OnePass


class Decoder:
    """Token-by-token decoding for a batch of B sequences of up to max_len positions.

    The cache holds keys and values in the dtype the forward computes them in (the autocast dtype
    under autocast, else the parameters'), settled at the first prefill or step; `dtype` fixes it.

    keep_memory=True keeps every memory row the decoder produces (prefill included), handed out by
    `memory_rows()`: give them to `run_schedule(..., memory_rows=rows)` to recompute the decoded
    sequence in one parallel pass (paper sec. "SFT and Reinforcement Learning"); its logits are the
    decoder's when the prompt was prefilled exactly (Exact) or stepped (an approximate prefill's
    cached keys were computed from memory its last stage had not finished). The default keeps only
    the last `memory.history` rows, as the paper's decoder does."""

    def __init__(
        self,
        model,
        batch_size: int,
        max_len: int,
        device=None,
        dtype=None,
        keep_memory: bool = False,
    ):
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            check_int(name, value, 1)
        ref = next(model.parameters())
        device = torch.device(device or ref.device)
        self.model = model
        self.batch_size = batch_size
        if keep_memory not in (True, False):
            raise ValueError(f"keep_memory={keep_memory!r} is invalid; allowed: True or False")
        self._fixed_dtype, self._param_dtype = dtype, ref.dtype
        self.keep_memory = keep_memory
        self.cache = self._new_cache(max_len, device, dtype or compute_dtype(device, ref.dtype))

    def _new_cache(self, max_len: int, device, dtype):
        if not self.keep_memory or self.model.pathway is None:  # no rows to keep
            return self.model.new_decode_cache(self.batch_size, max_len, device=device, dtype=dtype)
        return self.model.new_decode_cache(
            self.batch_size, max_len, device=device, dtype=dtype, keep_memory=True
        )

    def _match_compute_dtype(self):
        """Re-create a still empty cache in the dtype the next forward computes in (a Decoder made
        outside the autocast it then runs in); refuse a filled one rather than mix dtypes."""
        keys = getattr(self.cache, "k", None)
        if self._fixed_dtype is not None or not keys:
            return
        want = compute_dtype(keys[0].device, self._param_dtype)
        if keys[0].dtype == want:
            return
        if self.cache.length:
            raise ValueError(
                f"the decoder's cache holds {keys[0].dtype} keys but this step "
                f"computes in {want}; allowed: decode in the autocast (or dtype) the "
                "cache was filled in"
            )
        self.cache = self._new_cache(self.cache.max_len, keys[0].device, want)

    @property
    def length(self) -> int:
        return self.cache.length

    def memory_rows(self) -> torch.Tensor | None:
        """(B, length, d): the memory row m_t of every position decoded so far, as a normal tensor
        (None for a model without memory). Needs keep_memory=True."""
        if not self.keep_memory:
            raise ValueError("memory_rows needs a Decoder made with keep_memory=True")
        if self.model.pathway is None:
            return None
        rows = self.cache.memory_rows()
        return None if rows is None else rows.clone()

    def _check_tokens(self, tokens: torch.Tensor, name: str, ndim: int, values: bool = True):
        check_token_ids(name, tokens, vocab_size_of(self.model), ndim, values=values)
        if tokens.size(0) != self.batch_size:
            raise ValueError(
                f"{name} is invalid: batch size {tokens.size(0)}; allowed: the "
                f"decoder's batch_size={self.batch_size}"
            )

    @torch.inference_mode()
    def prefill(self, prompt_idx: torch.Tensor, schedule=None, *, strategy=None) -> torch.Tensor:
        """Run `schedule` (a schedule or its spelling; default OnePass) on the prompt, fill the
        cache; returns the last logits (B, V). `strategy=` is its earlier name (deprecated)."""
        if strategy is not None:
            warnings.warn(
                "Decoder.prefill(strategy=) is deprecated; use schedule=",
                DeprecationWarning,
                stacklevel=3,  # the caller's line, past inference_mode's wrapper
            )
            if schedule is not None:
                raise ValueError("prefill takes schedule= or strategy=, not both")
            schedule = strategy
        self._check_tokens(prompt_idx, "prompt_idx", 2)
        if self.cache.length:
            raise ValueError(
                "prefill needs an empty decoder; create a new Decoder per prompt batch"
            )
        if prompt_idx.size(1) > self.cache.max_len:
            raise ValueError(
                f"prompt of {prompt_idx.size(1)} tokens exceeds max_len={self.cache.max_len}"
            )
        self._match_compute_dtype()
        out = run_schedule(self.model, prompt_idx, None, schedule or OnePass())
        self.cache.load(out.buffer, prompt_idx)
        return out.logits[:, -1]

    @torch.inference_mode()
    def step(self, token_ids: torch.Tensor, check_values: bool = True) -> torch.Tensor:
        """Append one token per sequence; returns the next-token logits (B, V).

        check_values=False skips the range check of the ids (shape and dtype are always checked):
        it costs a host-device sync per token on CUDA, which a caller whose ids are valid by
        construction (sampled from the logits, or checked once up front) need not pay.
        """
        self._check_tokens(token_ids, "token_ids", 1, values=check_values)
        t = self.cache.length
        if t >= self.cache.max_len:
            raise ValueError(f"the decoder is full (max_len={self.cache.max_len})")
        self._match_compute_dtype()
        tokens = token_ids[:, None]
        self.cache.append_tokens(tokens)
        logits, _ = self.model.stage(tokens, range(t, t + 1), self.cache)
        return logits[:, 0]


def sample_next(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator
) -> torch.Tensor:
    """Greedy at temperature 0; otherwise softmax sampling, optionally restricted to the top k."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]


def generate(
    model,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    prefill=None,
) -> torch.Tensor:
    """(B, T_prompt + max_new_tokens): the prompt followed by sampled tokens.

    The prompt is prefilled with `prefill`, then every new token is one recurrent decoding step
    (`Decoder.step`). The default (None) is the exact recurrence: `Exact()` for a model with
    memory (each prompt position reads the memory of the one before, as if the prompt had been
    decoded token by token), so greedy `generate` continues the prompt as the step-by-step loop and
    the argmax of `run_schedule(model, ..., Exact())` do; a model without memory gets its one
    pass, which is the same thing. Exact runs the prompt as one-position stages in a row (some 26x
    the time of a one-pass prefill of 1,024 tokens, docs/performance.md); a faster approximate
    prefill of a long prompt is asked for by name: `OnePass()` (one parallel pass with zero
    memory, the cheapest; what `Decoder.prefill` does by default) or the schedule the model was
    trained with (`Interleaved(2)`); its continuation can differ from the exact one, since decoding
    then starts from prompt states the recurrence would not have produced."""
    check_int("max_new_tokens", max_new_tokens, 0)
    check_number("temperature", temperature, low=0)
    if top_k is not None:
        check_int("top_k", top_k, 1)
    if seed is not None:
        check_seed("seed", seed, TORCH_SEED_LIMIT)
    check_token_ids("prompt_ids", prompt_ids, vocab_size_of(model), ndim=(1, 2))
    if prompt_ids.dim() == 1:
        prompt_ids = prompt_ids[None]
    if prompt_ids.numel() == 0:
        raise ValueError(
            f"prompt_ids is invalid: shape {tuple(prompt_ids.shape)}; allowed: at "
            "least one sequence of at least one token"
        )
    B, T = prompt_ids.shape
    generator = None
    if seed is not None:
        generator = torch.Generator(device=prompt_ids.device).manual_seed(seed)
    if prefill is None:
        exact = model.pathway is not None or model.has_sequential_decoding
        prefill = Exact() if exact else OnePass()
    decoder = Decoder(model, B, T + max_new_tokens)
    # the forwards run in inference mode (Decoder); sampling runs outside it, so the ids returned
    # are normal tensors: generated ids often feed a training forward, which saves them
    logits = decoder.prefill(prompt_ids, prefill)
    out = [prompt_ids]
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, generator)
        out.append(nxt[:, None])
        if i + 1 < max_new_tokens:
            # sampled from the logits: always in the vocabulary
            logits = decoder.step(nxt, check_values=False)
    return torch.cat(out, dim=1)
