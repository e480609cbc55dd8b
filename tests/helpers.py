"""Tiny float64 models and inputs that the core tests share (test_core, test_fixedpoint, test_hooks,
test_invariants, test_rollout): every memory variant in CONFIGS, every weight random."""

import torch

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.run.decode import Decoder

T = 10  # the default sequence length of tokens()

CONFIGS = {
    "default": MemoryConfig(),
    "source1_lag2": MemoryConfig(source_layer=1, lag=2),
    "layerwise": MemoryConfig(projections="layerwise"),
    "averages": MemoryConfig(source_layer=2, source_avg=2, lag_avg=3),
    "keys_replace": MemoryConfig(kv="keys", kv_mode="replace"),
    "values_nogate": MemoryConfig(kv="values", gate=False),
    "residual_only": MemoryConfig(kv="none"),
    "kv_only": MemoryConfig(residual=False),
    "reset_at_bos": MemoryConfig(reset_memory_at_bos=True),
}


# One spelling of every registered schedule, each optional argument exercised once
SCHEDULE_SPELLINGS = [
    "onepass",
    "interleaved:2",
    "fullseq:2",
    "fullseq:1:1,2",
    "chunked:4",
    "exact",
    "fixedpoint:0.01:4",
    "fixedpoint:0.01:4:2",
    "rollout:2",
    "gaussseidel:2:3",
    "gaussseidel:2:3:2",
]


def make_model(memory, seed=0, **overrides):
    """A tiny float64 model with every weight random, so no pathway hides behind a zero init."""
    fields = dict(n_layer=3, window_pattern="SL", short_window=4)
    fields.update(overrides)
    if memory is not None and memory.reset_memory_at_bos:
        fields["bos_token_id"] = 0
    cfg = preset("tiny", memory=memory, **fields)
    torch.manual_seed(seed)
    model = LRT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def tokens(B=2, T=T, vocab=64, seed=1):
    """(B, T) random token ids from `seed`, with id 0 (the BOS) at position 4 when T > 4."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (B, T), generator=g)
    if T > 4:
        idx[:, 4] = 0  # a BOS mid-sequence, so reset_memory_at_bos has something to do
    return idx


def decode_all(model, idx):
    """The logits of token-by-token decoding from an empty cache, (B, T, V)."""
    dec = Decoder(model, idx.size(0), idx.size(1))
    return torch.stack([dec.step(idx[:, t]) for t in range(idx.size(1))], dim=1)


def maxdiff(a, b):
    """The largest absolute difference between two tensors, as a float."""
    return (a - b).abs().max().item()


# the run a test trains when it needs a real one on disk: S3 at length 6, a few steps (about a
# second on one thread); each test changes only what it is about
TINY_RUN = dict(
    task="group_prefix",
    task_options={"group": "S3"},
    length=6,
    preset="tiny",
    model="lrt",
    schedule="exact",
    steps=4,
    batch_size=8,
    eval_every=0,
    eval_lengths=(6,),
    eval_size=16,
    checkpoint_every=0,
    device="cpu",
)


def tiny_train_config(**changes):
    """A TrainConfig for TINY_RUN with `changes` applied."""
    from lrt_lab.training.loop import TrainConfig

    return TrainConfig(**{**TINY_RUN, **changes})
