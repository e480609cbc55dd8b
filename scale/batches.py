"""The batches a scaling run trains and validates on: synthetic rows or the packed shards of
``lrt_scale.loader``, split over ranks (``lrt_scale.train`` and ``lrt_scale.evaluate`` both read
them).

``--synthetic`` needs no dataset: random-token rows whose second half copies the first (learnable:
induction), a function of (seed, step) only, split over ranks and micro steps by row so any world
size sees the same global batch; its BPB counts 1 byte per token. The loader and the tokenizer are
imported when a run reads real data.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from .distributed import DistContext

SYNTHETIC_KINDS = ("copy", "random")


class SyntheticData:
    """Rows of T+1 tokens, a function of (seed, step) only; rank r's micro step m takes rows [(m *
    world + r) * B, ... + B) of the step's global batch, so the global batch does not depend on how
    it is split. "copy": the second half of each row repeats the first (learnable); "random": i.i.d.
    uniform tokens."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        kind: str = "copy",
        device="cpu",
        split: str = "train",
    ):
        if kind not in SYNTHETIC_KINDS:
            raise ValueError(
                f"synthetic={kind!r} is invalid; allowed: {', '.join(SYNTHETIC_KINDS)}"
            )
        self.V, self.T, self.B = vocab_size, seq_len, batch_size
        self.rank, self.world = rank, world_size
        self.seed, self.kind, self.device = seed, kind, torch.device(device)
        # validation rows never overlap training rows
        self.offset = 0 if split == "train" else 1 << 40

    def rows(self, index: int, first_row: int, n_rows: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.offset + index)
        n = first_row + n_rows
        if self.kind == "random":
            rows = torch.randint(self.V, (n, self.T + 1), generator=g)
        else:
            half = torch.randint(self.V, (n, (self.T + 2) // 2), generator=g)
            rows = torch.cat([half, half], dim=1)[:, : self.T + 1]
        return rows[first_row:]

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = (micro * self.world + self.rank) * self.B
        rows = self.rows(step, first, self.B).to(self.device)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def block(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [0, B) of batch `index`, whatever the rank
        (validation: the caller spreads blocks)."""
        rows = self.rows(index, 0, self.B).to(self.device)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self):
        return None  # stateless: batches are a function of the step

    def load_state_dict(self, state):
        pass

    def progress(self) -> dict:
        return {}


class LoaderData:
    """lrt_scale.loader.DistributedPackingLoader behind the same interface (its state resumes
    exactly)."""

    def __init__(
        self, data_dir, tokenizer, batch_size: int, seq_len: int, ctx: DistContext, state=None
    ):
        from .loader import DistributedPackingLoader

        self.loader = DistributedPackingLoader(
            data_dir,
            tokenizer,
            batch_size,
            seq_len,
            rank=ctx.rank,
            world_size=ctx.world_size,
            split="train",
            device=ctx.device,
            state=state,
            prefetch=2,  # the next batches tokenize and pack while the GPU trains
        )

    def batch(self, step: int, micro: int):
        return next(self.loader)

    def progress(self) -> dict:
        """This rank's data epoch and the share of the tokens read that best-fit packing cropped."""
        stats = self.loader.stats
        return {
            "data_epoch": self.loader.epoch,
            "data_crop_frac": stats["tokens_cropped"] / max(1, stats["tokens_read"]),
        }

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)


def load_tokenizer(tokenizer_dir):
    from .tokenizer import Tokenizer

    return Tokenizer.load(Path(tokenizer_dir).expanduser())


def make_batches(
    data_dir,
    tokenizer_dir,
    vocab_size: int,
    batch_size: int,
    seq_len: int,
    ctx: DistContext,
    seed: int = 0,
    synthetic: str | None = None,
):
    """(val_batches(n) -> iterator of n (inputs, targets) batches on this rank, token_bytes,
    tokenizer).

    Every call of val_batches starts the validation split from its beginning, so each evaluation
    sees the same tokens. Synthetic data has no tokenizer and counts 1 byte per token."""
    if synthetic:
        val = SyntheticData(
            vocab_size,
            seq_len,
            batch_size,
            ctx.rank,
            ctx.world_size,
            seed,
            synthetic,
            ctx.device,
            split="val",
        )

        def synthetic_batches(n: int) -> Iterator:
            # rank r's i-th batch is block i * world + r of B rows: any world size covers the same
            # n * world blocks, so val_bpb does not depend on how many ranks evaluate
            return (val.block(i * ctx.world_size + ctx.rank) for i in range(n))

        return synthetic_batches, torch.ones(vocab_size, dtype=torch.long), None
    if not data_dir or not tokenizer_dir:
        raise ValueError("data: give --data-dir and --tokenizer-dir, or --synthetic")
    from .loader import DistributedPackingLoader

    tokenizer = load_tokenizer(tokenizer_dir)

    def loader_batches(n: int) -> Iterator:
        loader = DistributedPackingLoader(
            data_dir,
            tokenizer,
            batch_size,
            seq_len,
            rank=ctx.rank,
            world_size=ctx.world_size,
            split="val",
            device=ctx.device,
        )
        return (next(loader) for _ in range(n))

    return loader_batches, tokenizer.token_bytes(), tokenizer
