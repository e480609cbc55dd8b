"""Pretraining launcher for the scaling runs: one process per device under torchrun, or one process.

    torchrun --standalone --nproc_per_node=8 -m lrt_scale.train --preset d20 \\
        --schedule interleaved:2 --ratio 10 \\
        --data-dir ~/.cache/lrt_lab/fineweb --tokenizer-dir ~/.cache/lrt_lab/tokenizer
    torchrun --standalone --nproc_per_node=8 -m lrt_scale.train --preset d20 \\
        --model transformer --ratio 20 ...
    # one GPU, no dataset
    python -m lrt_scale.train --preset d12 --synthetic --steps 300 --compile
    # accounting only
    python -m lrt_scale.train --preset d20 --schedule interleaved:2 --ratio 10 --dry-run

Distributed: ``torch.distributed`` with the environment torchrun sets (RANK, WORLD_SIZE,
LOCAL_RANK), nccl on CUDA and gloo otherwise, and DistributedDataParallel. Each optimizer step
sees a global batch of ``--total-batch-size`` tokens (2^19, the paper's): ``device_batch_size x
seq_len x world_size`` tokens per micro step, accumulated over ``total / that`` micro steps (DDP
all-reduces only on the last one).

Muon under DDP: the gradients are all-reduced (averaged) before ``optimizer.step()``, so every rank
holds the same full gradient and the single-process ``torch.optim.Muon`` computes the same update on
every rank; the Newton-Schulz work is duplicated rather than sharded as in nanochat's distributed
Muon (its cost at 20L is not measured yet). FSDP2 (``fully_shard``) is not offered:
``torch.optim.Muon`` on FSDP2's sharded DTensor parameters runs without error but orthogonalises
each rank's shard on its own, so the update is wrong (a 2-rank gloo check in torch 2.13 differed
from a single process by 1.4e-2 after 3 steps, AdamW by 4e-8). A sharded Muon (gather each matrix's
gradient, orthogonalise, scatter) is future work; until then DDP is the supported path. DDP keeps
full fp32 parameters, gradients, its gradient buckets and the optimizer state on every GPU: about 25
GB at 20L and 37 GB at 24L (most parameters are embeddings, with two AdamW moments each), before
activations (estimated, not measured).

Optimisation (paper app. A "Optimization"; nanochat's recipe): Muon for the 2-D hidden matrices
(attention, MLP, LRT projections) at lr 0.02; AdamW betas (0.8, 0.95), eps 1e-10, for the token and
value embeddings (0.3) and LM head (0.004), both scaled by (d/768)^-1/2, and the scalars (0.5; the
residual coefficients at 0.5 x 0.01; the input-skip coefficients with betas (0.96, 0.95)). Every
rate is scaled by sqrt(total_batch / 2^19). No warm-up; linear warm-down to zero over the final half
(``lrt_lab.training.optim.lr_multiplier``); Muon momentum 0.85 -> 0.95 over the first 300 steps;
Muon weight decay ``--weight-decay`` (0.2, nanochat's) x (12/L)^2, annealed linearly to zero over
training. Gradient clipping is off by default (nanochat), ``--grad-clip`` turns it on.

Run length and accounting (``lrt_scale.flops``): ``--ratio R`` trains on R x N_baseline tokens,
N_baseline being the backbone's parameter count without the memory pathway, so LRT and baseline at
the same R see the same tokens; FLOPs count every stage of the schedule; each step logs tokens/s and
MFU (against ``--peak-flops``, default H100 dense bf16), and baseline-equivalent tokens
(``compute_tokens``).

Data: ``--data-dir`` (parquet shards in ``lrt_scale.data``'s format; the last shard is validation)
with
``--tokenizer-dir`` (``lrt_scale.tokenizer.Tokenizer.save``), read by
``lrt_scale.loader.DistributedPackingLoader``
(every rank its own row groups; its state goes into the checkpoint, so a resume continues with the
exact next batch). ``--synthetic`` needs no dataset: random-token rows whose second half copies the
first (learnable: induction), a function of (seed, step) only, split over ranks and micro steps by
row so any world size sees the same global batch; its BPB counts 1 byte per token.

Run store: rank 0 writes ``<out>/<name>/`` through ``lrt_lab.store.results.Run`` (the dashboard's
store): config.json (arguments, model config, params, accounting), metrics.jsonl (``kind: train``
per step: loss, stage_losses, cumulative tokens / compute_tokens / flops, the step's mfu,
tokens_per_s and step_time_s, time since the start, lr_mult; ``kind: eval``: val_bpb,
val_bpb_stage_k, seq_bpb, cont_bpb_parallel, core, core_<task>), summary.json, tables/core.csv, and
checkpoints/step_*.pt (model, optimizers, data-loader state of every rank). Once the summary is
written the log is compacted to metrics.jsonl.xz, the same bytes compressed (the store's readers,
this module's included, read either). ``--resume`` continues
the newest checkpoint with the same arguments; the resumed run equals an uninterrupted
one exactly (tested).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch
import torch.distributed as dist

from lrt_lab.core.attention import pick_backend
from lrt_lab.core.config import MEMORY_PRESETS, PRESETS
from lrt_lab.core.model import LRT
from lrt_lab.core.validation import check_int, check_number
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import Scheduled, run_schedule
from lrt_lab.store.results import Run
from lrt_lab.training.checkpoints import check_belongs, read_checkpoint, save_checkpoint
from lrt_lab.training.loop import model_config
from lrt_lab.training.optim import build_optimizers, optimizer_step, set_lr_schedule
from lrt_lab.training.train_config import parse_value

from . import evaluate as ev
from . import flops as fl
from .batches import SYNTHETIC_KINDS, LoaderData, SyntheticData, load_tokenizer, make_batches
from .distributed import (
    DistContext,
    autocast_for,
    barrier,
    on_rank0,
    setup_distributed,
    synchronize,
    teardown_distributed,
)

# Arguments that may differ between a run and its --resume (they do not change what is trained).
# device_batch_size too: the global batch (and the data stream, split by rows) does not depend on
# it,
# so a resume may lower it after an out-of-memory error.
RUNTIME_ARGS = (
    "resume",
    "stop_after",
    "threads",
    "dry_run",
    "log_every",
    "compile",
    "keep_checkpoints",
    "final_checkpoint",
    "device_batch_size",
)


# Optimisation -----------------------------------------------------------------------------------
def make_optimizers(model: LRT, args) -> list[torch.optim.Optimizer]:
    """Muon + AdamW with the paper's rates and scalings (see the module docstring), by declared
    parameter role (lrt_lab.training.optim: the gate matrices train with Muon, as in the released
    code)."""
    width = (model.config.n_embd / 768) ** -0.5
    batch = math.sqrt(args.total_batch_size / fl.REFERENCE_BATCH_TOKENS)
    lrs = {
        "matrix": args.matrix_lr * batch,
        "embedding": args.embedding_lr * width * batch,
        "head": args.head_lr * width * batch,
        "scalar": args.scalar_lr * batch,
        "resid_scalar": args.scalar_lr * 0.01 * batch,
        "x0_scalar": args.scalar_lr * batch,
    }
    return build_optimizers(
        model, lrs, weight_decay=weight_decay_at(0, args), betas={"x0_scalar": (0.96, 0.95)}
    )


def weight_decay_at(step: int, args) -> float:
    """Muon weight decay: --weight-decay x (12/L)^2, linearly annealed to zero over training."""
    n_layer = args.n_layer
    return args.weight_decay * (12 / n_layer) ** 2 * max(0.0, 1 - step / args.total_steps)


def set_schedules(opts, step: int, args) -> float:
    """The toy loop's learning-rate schedule (lrt_lab.training.optim.set_lr_schedule) plus Muon's
    annealed
    weight decay; returns the rate multiplier."""
    return set_lr_schedule(
        opts,
        step,
        args.total_steps,
        args.warmdown_frac,
        args.momentum_warmup_steps,
        muon_weight_decay=weight_decay_at(step, args),
    )


# Arguments --------------------------------------------------------------------------------------
def _add_model_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("model")
    g.add_argument("--preset", default="d20", choices=sorted(PRESETS), help="backbone shape")
    g.add_argument(
        "--model", default="lrt", choices=("lrt", "transformer"), help="lrt or the plain baseline"
    )
    g.add_argument(
        "--schedule",
        default=None,
        help="training schedule: onepass, interleaved:S, gaussseidel:S:N[:G], fullseq:K[:w..], "
        "chunked:C, exact, fixedpoint:TOL:MAX[:G], rollout[:G] "
        "(default: interleaved:2 for lrt, onepass for transformer)",
    )
    g.add_argument(
        "--memory-preset",
        default="paper",
        choices=sorted(MEMORY_PRESETS),
        help="LRT memory: paper (its text) or released (its released code); --set applies on top",
    )
    g.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ModelConfig field or memory.<field>, e.g. memory.projections=layerwise (repeatable)",
    )
    g.add_argument(
        "--seq-len", type=int, default=None, help="sequence length (default: the preset's)"
    )
    g.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="default: the tokenizer's (or the preset's with --synthetic)",
    )


def _add_run_length_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("run length (exactly one)")
    g.add_argument(
        "--ratio",
        type=float,
        default=None,
        help="tokens per baseline parameter R: R x N_baseline tokens",
    )
    g.add_argument("--tokens", type=int, default=None, help="training tokens")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps")
    g.add_argument(
        "--ratio-params",
        default="total",
        choices=fl.RATIO_PARAMS,
        help="N of R x N: total = the baseline's parameters, embeddings included "
        "(the paper's text); "
        "matrices = the model's matrices + LM head (the released code)",
    )


def _add_batch_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("batch")
    g.add_argument(
        "--total-batch-size",
        type=int,
        default=fl.REFERENCE_BATCH_TOKENS,
        help="tokens per optimizer step (global)",
    )
    g.add_argument(
        "--device-batch-size", type=int, default=32, help="rows per device per micro step"
    )


def _add_data_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("data")
    g.add_argument(
        "--data-dir",
        default=None,
        help="parquet shards (lrt_scale.data format; the last one is validation)",
    )
    g.add_argument("--tokenizer-dir", default=None, help="a saved lrt_scale.tokenizer.Tokenizer")
    g.add_argument(
        "--synthetic",
        nargs="?",
        const="copy",
        default=None,
        choices=SYNTHETIC_KINDS,
        help="synthetic rows instead of a dataset (copy: second half repeats the first)",
    )


def _add_optimisation_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("optimisation (paper app. A; rates at d=768, batch 2^19)")
    g.add_argument("--matrix-lr", type=float, default=0.02, help="Muon")
    g.add_argument(
        "--embedding-lr",
        type=float,
        default=0.3,
        help="AdamW, token and value embeddings, x (d/768)^-1/2",
    )
    g.add_argument("--head-lr", type=float, default=0.004, help="AdamW, LM head, x (d/768)^-1/2")
    g.add_argument(
        "--scalar-lr",
        type=float,
        default=0.5,
        help="AdamW, scalars and gates (residual scalars x 0.01)",
    )
    g.add_argument(
        "--weight-decay", type=float, default=0.2, help="Muon, x (12/L)^2, annealed to 0"
    )
    g.add_argument(
        "--warmdown-frac",
        type=float,
        default=0.5,
        help="linear warm-down to 0 over this final fraction",
    )
    g.add_argument(
        "--momentum-warmup-steps",
        type=int,
        default=300,
        help="Muon momentum 0.85 -> 0.95 over these steps",
    )
    g.add_argument("--grad-clip", type=float, default=0.0, help="max grad norm (0: off)")


def _add_execution_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("execution")
    g.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    g.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="auto: bf16 autocast on CUDA, float32 on CPU",
    )
    g.add_argument("--compile", action="store_true", help="torch.compile the stage primitive")
    g.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--peak-flops", type=float, default=fl.H100_BF16_PEAK_FLOPS, help="per-device peak for MFU"
    )


def _add_evaluation_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("evaluation")
    g.add_argument(
        "--eval-every",
        type=int,
        default=250,
        help="validation BPB every N steps (0: only at the end)",
    )
    g.add_argument(
        "--eval-tokens",
        type=int,
        default=10 * 2**19,
        help="validation tokens per evaluation (global)",
    )
    g.add_argument(
        "--seq-eval-rows", type=int, default=0, help="rows for sequential BPB at the end (0: skip)"
    )
    g.add_argument(
        "--seq-prompt",
        type=int,
        default=0,
        help="prefilled prompt tokens for sequential BPB (paper: 1024)",
    )
    g.add_argument("--seq-prefill", default="onepass", help="prefill schedule for --seq-prompt")
    g.add_argument(
        "--core-bundle", default=None, help="CORE eval bundle directory (evaluated at the end)"
    )
    g.add_argument(
        "--core-every",
        type=int,
        default=0,
        help="also evaluate CORE every N steps (0: only at the end)",
    )
    g.add_argument(
        "--core-max-per-task", type=int, default=500, help="items per CORE task (-1: all)"
    )
    g.add_argument(
        "--core-schedule",
        default="train",
        help="forward CORE scores with: train (the training schedule) or a schedule spec; "
        "onepass = zero "
        "memory, how the released code (and so the paper's CORE numbers) scores an LRT",
    )


def _add_run_store_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("run store")
    g.add_argument("--out", default="runs", help="run store root")
    g.add_argument(
        "--name",
        default=None,
        help="run folder name (default from preset, model, schedule, R, seed)",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=1000,
        help="every N steps and at the last one; 0: none (but --final-checkpoint, or the end of a "
        "--stop-after segment, which --resume needs)",
    )
    g.add_argument(
        "--final-checkpoint",
        action="store_true",
        help="write a checkpoint after the last step also with --checkpoint-every 0",
    )
    g.add_argument("--keep-checkpoints", type=int, default=2)
    g.add_argument(
        "--resume", action="store_true", help="continue <out>/<name> from its newest checkpoint"
    )
    g.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="stop (resumable, no summary) after N steps of this process",
    )
    g.add_argument(
        "--log-every",
        type=int,
        default=10,
        help="print every N steps (every step is logged to the store)",
    )
    g.add_argument("--dry-run", action="store_true", help="print the accounting and exit")


# The argument groups in the order --help lists them: a new option goes into its group's function.
ARGUMENT_GROUPS = (
    _add_model_arguments,
    _add_run_length_arguments,
    _add_batch_arguments,
    _add_data_arguments,
    _add_optimisation_arguments,
    _add_execution_arguments,
    _add_evaluation_arguments,
    _add_run_store_arguments,
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lrt_scale.train",
        description="LRT / baseline pretraining (torchrun-ready)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for add_group in ARGUMENT_GROUPS:
        add_group(ap)
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.schedule is None:
        args.schedule = "interleaved:2" if args.model == "lrt" else "onepass"
    args.schedule = parse_schedule(args.schedule).spec
    if args.model == "transformer" and args.schedule != "onepass":
        raise ValueError(
            f"schedule={args.schedule!r} is invalid for --model transformer (it has no memory); "
            "allowed: onepass"
        )
    parse_schedule(args.seq_prefill)
    if args.core_schedule != "train":
        args.core_schedule = parse_schedule(args.core_schedule).spec
    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} is invalid; allowed: KEY=VALUE")
        overrides[key.strip()] = parse_value(value.strip())
    args.overrides = overrides
    for name in ("total_batch_size", "device_batch_size", "keep_checkpoints"):
        check_int(f"--{name.replace('_', '-')}", getattr(args, name), 1)
    for name in (
        "eval_every",
        "core_every",
        "checkpoint_every",
        "seq_eval_rows",
        "seq_prompt",
        "momentum_warmup_steps",
    ):
        check_int(f"--{name.replace('_', '-')}", getattr(args, name), 0)
    check_number("--warmdown-frac", args.warmdown_frac, 0, 1)
    if args.stop_after is not None:
        check_int("--stop-after", args.stop_after, 1)
    if sum(v is not None for v in (args.ratio, args.tokens, args.steps)) != 1:
        raise ValueError("run length: give exactly one of --ratio, --tokens, --steps")
    if not args.synthetic and not args.dry_run and not (args.data_dir and args.tokenizer_dir):
        raise ValueError("data: give --data-dir and --tokenizer-dir, or --synthetic")
    if args.synthetic and args.core_bundle:
        raise ValueError(
            "--core-bundle needs a tokenizer: use --data-dir and --tokenizer-dir, not --synthetic"
        )
    return args


def run_name(args) -> str:
    if args.name:
        return args.name
    length = (
        f"R{args.ratio:g}"
        if args.ratio is not None
        else f"tok{args.tokens}"
        if args.tokens is not None
        else f"steps{args.steps}"
    )
    sched = "" if args.model == "transformer" else f"-{args.schedule}"
    return f"{args.preset}-{args.model}{sched}-{length}-s{args.seed}".replace(":", "_")


def build_config(args, vocab_size: int):
    seq_len = args.seq_len or PRESETS[args.preset]["sequence_len"]
    spec = SimpleNamespace(
        model=args.model,
        overrides=args.overrides,
        preset=args.preset,
        length=seq_len,
        memory_preset=getattr(args, "memory_preset", "paper"),
    )
    return model_config(spec, vocab_size)


def stored_args(args) -> dict:
    """The arguments a resume must repeat (config.json["train"])."""
    d = {k: v for k, v in vars(args).items() if k not in RUNTIME_ARGS}
    d["task"] = "fineweb" if not args.synthetic else f"synthetic_{args.synthetic}"
    d["length"] = args.seq_len
    return json.loads(json.dumps(d))


# Training ---------------------------------------------------------------------------------------
def _grad_accum(args, seq_len: int, world: int) -> int:
    per_micro = args.device_batch_size * seq_len * world
    if args.total_batch_size % per_micro:
        raise ValueError(
            f"--total-batch-size={args.total_batch_size} is invalid: it must be a multiple of "
            f"device_batch_size x seq_len x world_size = {args.device_batch_size} x {seq_len} x "
            f"{world} "
            f"= {per_micro}"
        )
    return args.total_batch_size // per_micro


@contextlib.contextmanager
def eager(model):
    """Run the uncompiled stage inside: decoding (one position per call, a new `range` each time)
    and CORE (a new length per item) would recompile a compiled stage over and over."""
    compiled = model.__dict__.pop("stage", None)
    try:
        yield model
    finally:
        if compiled is not None:
            model.stage = compiled


def _guarded(name: str, fn: Callable[[], dict], rec: dict, ctx: DistContext) -> None:
    """rec.update(fn()), or rec["error_<name>"] = the error: an evaluation that fails (a CORE item,
    a kernel) must not end a run or lose its weights; `python -m lrt_scale.evaluate` can redo it.
    (A failure on some ranks only would leave the others in a collective: not caught here.)"""
    try:
        rec.update(fn())
    except Exception as e:  # noqa: BLE001 - recorded, printed, and the run goes on
        rec[f"error_{name}"] = f"{type(e).__name__}: {e}"
        ctx.print0(
            f"warning: evaluation {name} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}"
        )


def _evaluate(
    model,
    args,
    ctx,
    schedule,
    val_batches,
    token_bytes,
    tokenizer,
    autocast,
    seq_len,
    core: bool,
    sequential: bool = False,
) -> dict:
    """Validation BPB, CORE (core=True) and sequential BPB (sequential=True), each on its own: one
    failing leaves an error_<section> entry and the others' results."""
    rec = {}

    def bpb():
        n = max(1, args.eval_tokens // (args.device_batch_size * seq_len * ctx.world_size))
        res = ev.parallel_bpb(model, val_batches(n), token_bytes, schedule, autocast)
        return {
            "val_bpb": res["bpb"],
            **{f"val_bpb_stage_{k}": v for k, v in enumerate(res["stages"])},
        }

    def core_eval():
        core_schedule = (
            schedule if args.core_schedule == "train" else parse_schedule(args.core_schedule)
        )
        with eager(model):
            out = ev.evaluate_core(
                ev.model_forward(model, core_schedule, autocast),
                tokenizer,
                args.core_bundle,
                ctx.device,
                args.core_max_per_task,
                log=ctx.print0,
            )
        return {
            "core": out["core"],
            **{f"core_{k}": v for k, v in out["centered"].items()},
            "_core_table": out,
        }

    _guarded("val_bpb", bpb, rec, ctx)
    if core and args.core_bundle and tokenizer is not None:
        _guarded("core", core_eval, rec, ctx)
    if sequential and args.seq_eval_rows:
        _guarded(
            "seq_bpb",
            lambda: _sequential_eval(
                model, args, ctx, val_batches, token_bytes, autocast, schedule
            ),
            rec,
            ctx,
        )
    return rec


def _sequential_eval(model, args, ctx, val_batches, token_bytes, autocast, schedule) -> dict:
    n = max(1, math.ceil(args.seq_eval_rows / (args.device_batch_size * ctx.world_size)))
    with eager(model):
        res = ev.sequential_bpb(
            model, val_batches(n), token_bytes, args.seq_prompt, args.seq_prefill, autocast
        )
    rec = {"seq_bpb": res["bpb"]}
    if args.seq_prompt:
        par = ev.parallel_bpb(
            model, val_batches(n), token_bytes, schedule, autocast, min_position=args.seq_prompt - 1
        )
        rec["cont_bpb_parallel"] = par["bpb"]
    return rec


def unused_parameters(
    model, schedule, seq_len: int, vocab_size: int, device, autocast=None
) -> list[str]:
    """Names of the parameters a training step leaves without a gradient, from one forward and
    backward of one random row at full length on the unwrapped model (DDP must be told
    find_unused_parameters exactly then: an LRT under onepass or fullseq:0 never reads memory,
    chunked:C with C >= T neither). The global RNG and the gradients are left as they were."""
    g = torch.Generator().manual_seed(0)
    row = torch.randint(vocab_size, (1, seq_len + 1), generator=g).to(device)
    with autocast or contextlib.nullcontext():
        out = run_schedule(model, row[:, :-1], row[:, 1:], schedule)
    out.loss.backward()
    del out
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def attention_dispatch(config, schedule, device, dtype) -> dict:
    """{stage kind: kernels} that lrt_lab.core.attention.pick_backend chooses for the schedule's
    stages at T (keys cut at the stage's last position, as LRT.stage does) and for a decoding step,
    over the layers' windows. What runs is measured by the GPU check; this says what was asked
    for."""
    T = config.sequence_len
    q = torch.empty(0, device=device, dtype=dtype)
    windows = config.window_sizes()

    def kind(P: range) -> str:
        if P.step != 1:
            return "strided"
        return "full" if (P.start, P.stop) == (0, T) else "chunk"

    out: dict[str, set] = {}
    for P in schedule.stages(T):
        out.setdefault(kind(P), set()).update(pick_backend(q, P, P.stop, w) for w in windows)
    out["decode"] = {pick_backend(q, range(T - 1, T), T, w) for w in windows}
    return {k: sorted(v) for k, v in out.items()}


def compile_stats() -> dict:
    """torch.compile's graph breaks and compiled graphs so far in this process (dynamo counters)."""
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": counters["stats"]["unique_graphs"],
    }


def train(args: argparse.Namespace) -> Path | None:
    """Train (or resume) one run; returns the run folder (None for --dry-run)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = setup_distributed(args.device)
    try:
        return _train(args, ctx)
    finally:
        teardown_distributed(ctx)


@dataclass
class Setup:
    """What a run is, decided before anything is written (a dry run stops here)."""

    schedule: object
    tokenizer: object
    vocab: int
    config: object  # the ModelConfig
    seq_len: int
    accum: int  # gradient accumulation steps per optimizer step
    plan: object  # lrt_scale.flops.Plan: steps, tokens, FLOPs
    data_plan: dict
    backends: dict  # the attention kernel each stage kind dispatches to


@dataclass
class ScaleLoop:
    """What the loop carries from step to step."""

    step: int
    start: int  # the step this process started (or resumed) at
    stop: int  # the step this process stops after
    counters: dict  # tokens, compute_tokens, flops
    t0: float  # perf_counter() at step 0 (a resumed run's earlier time included)
    data_epoch: int = 0
    last_eval: dict = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def _train(args, ctx: DistContext) -> Path | None:
    """One run (see `train`): plan, open the run folder, build and restore, loop, summarise."""
    setup = _setup(args, ctx)
    if args.dry_run:
        return None
    run, ckpt_path, complete = _open_run(args, ctx, setup)
    if complete:
        ctx.print0(f"{run.path} is already complete")
        return run.path
    torch.manual_seed(args.seed)
    with torch.device(ctx.device):
        model = LRT(setup.config)
    opts = make_optimizers(model, args)
    data = _training_data(args, ctx, setup)
    start, elapsed, counters = _restore(ckpt_path, model, opts, data, ctx, run=run)
    if ckpt_path is not None:
        ctx.print0(f"resumed {run.path} at step {start} from {ckpt_path}")
    if ctx.rank == 0 and args.resume:
        run.truncate_metrics(start)  # steps after the checkpoint are redone and logged again
    val_batches, token_bytes, _ = make_batches(
        args.data_dir,
        args.tokenizer_dir,
        setup.vocab,
        args.device_batch_size,
        setup.seq_len,
        ctx,
        args.seed,
        args.synthetic,
    )
    autocast = autocast_for(ctx.device, args.dtype)
    net, ddp = _distributed(model, setup, ctx, autocast)
    if args.compile:
        # regional: two graphs every block shares, no recompile per layer or position set
        # (lrt_lab's default way to compile; docs/scale.md)
        model.compile_blocks(dynamic=False)
    loop = ScaleLoop(
        start,
        start,
        _stop_step(args, setup, start),
        counters,
        time.perf_counter() - elapsed,
        data.progress().get("data_epoch", 0),
    )

    def evaluate_and_log(core: bool, sequential: bool) -> None:
        loop.last_eval = _evaluate_and_log(
            run, model, args, ctx, setup, val_batches, token_bytes, autocast, loop, core, sequential
        )

    model.train()
    while loop.step < loop.stop:
        record = _train_step(args, ctx, setup, model, net, ddp, opts, data, autocast, loop)
        _log_step(run, args, ctx, setup, record, loop)
        final = loop.step == setup.plan.steps
        # the checkpoint first: an evaluation that fails or runs out of memory loses no training
        if wants_checkpoint(args, loop.step, loop.stop, setup.plan.steps):
            _checkpoint(run, model, opts, data, ctx, args, loop)
        do_eval = final or (args.eval_every and loop.step % args.eval_every == 0)
        do_core = final or (args.core_every and loop.step % args.core_every == 0)
        if do_eval or do_core:
            evaluate_and_log(core=do_core, sequential=final)
    if loop.step < setup.plan.steps:
        ctx.print0(f"stopped at step {loop.step} of {setup.plan.steps}; continue with --resume")
        return run.path
    # resumed after the last step (killed before the summary): evaluate now
    if start == setup.plan.steps:
        evaluate_and_log(core=True, sequential=True)
    if ctx.rank == 0:
        _write_summary(run, args, ctx, setup, data, loop)
    barrier(ctx)
    return run.path


def _training_data(args, ctx: DistContext, setup: Setup):
    """This rank's training batches: synthetic rows, or the packing loader over the shards."""
    if args.synthetic:
        return SyntheticData(
            setup.vocab,
            setup.seq_len,
            args.device_batch_size,
            ctx.rank,
            ctx.world_size,
            args.seed,
            args.synthetic,
            ctx.device,
        )
    return LoaderData(args.data_dir, setup.tokenizer, args.device_batch_size, setup.seq_len, ctx)


def _stop_step(args, setup: Setup, start: int) -> int:
    """The step this process stops after: the plan's last, or sooner with --stop-after."""
    if args.stop_after is None:
        return setup.plan.steps
    return min(setup.plan.steps, start + args.stop_after)


def wants_checkpoint(args, step: int, stop: int, total: int) -> bool:
    """Whether to write a checkpoint after `step`: every --checkpoint-every steps and after the
    last step of the segment; with --checkpoint-every 0 only where asked (--final-checkpoint) or
    where a --stop-after segment ends before the run does (its --resume needs one)."""
    if args.checkpoint_every:
        return step % args.checkpoint_every == 0 or step == stop
    return step == stop and (bool(getattr(args, "final_checkpoint", False)) or stop < total)


def _setup(args, ctx: DistContext) -> Setup:
    """The tokenizer, model config, accumulation and the FLOP/data plan of a run, printed; the
    checks that would otherwise fail after the first step (vocabulary, prompt length, CORE
    bundle)."""
    schedule = parse_schedule(args.schedule)
    tokenizer = None
    if args.synthetic or args.dry_run:
        vocab = args.vocab_size or PRESETS[args.preset]["vocab_size"]
    else:
        tokenizer = load_tokenizer(args.tokenizer_dir)
        vocab = args.vocab_size or tokenizer.vocab_size
        if vocab < tokenizer.vocab_size:
            raise ValueError(
                f"--vocab-size={vocab} is invalid; allowed: >= the tokenizer's "
                f"{tokenizer.vocab_size}"
            )
    config = build_config(args, vocab)
    seq_len = args.seq_len = config.sequence_len
    args.n_layer = config.n_layer
    if args.seq_eval_rows and args.seq_prompt >= seq_len:
        raise ValueError(
            f"--seq-prompt={args.seq_prompt} is invalid; allowed: 0 <= seq_prompt < "
            f"seq_len={seq_len}"
        )
    accum = _grad_accum(args, seq_len, ctx.world_size)
    plan = fl.plan(
        config,
        schedule,
        ratio=args.ratio,
        tokens=args.tokens,
        steps=args.steps,
        global_batch_tokens=args.total_batch_size,
        seq_len=seq_len,
        ratio_params=args.ratio_params,
    )
    args.total_steps = plan.steps
    ctx.print0(
        f"world {ctx.world_size} ({ctx.backend or 'single process'}) on {ctx.device}; micro batch "
        f"{args.device_batch_size} x {seq_len} per rank, {accum} accumulation steps -> "
        f"{args.total_batch_size:,} tokens per step"
    )
    ctx.print0(fl.format_plan(plan))
    dtype = torch.bfloat16 if autocast_for(ctx.device, args.dtype) else torch.float32
    backends = attention_dispatch(config, schedule, ctx.device, dtype)
    ctx.print0(
        "attention kernels chosen: "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in backends.items())
    )
    if args.core_bundle:
        ev.load_bundle(args.core_bundle)  # a broken bundle fails now, not after the last step
    data_plan = fl.data_plan(plan.tokens)
    if args.data_dir and not args.synthetic:
        from .data import resolve_shards

        have = len(resolve_shards(args.data_dir, "train"))
        if have < data_plan["train_shards"]:
            ctx.print0(
                f"warning: data: {have} train shards in {args.data_dir}, "
                f"~{data_plan['train_shards']} "
                "needed with best-fit cropping: the run will start another epoch (logged as "
                "data_epoch)"
            )
    return Setup(schedule, tokenizer, vocab, config, seq_len, accum, plan, data_plan, backends)


def _open_run(args, ctx: DistContext, setup: Setup) -> tuple[Run, str | None, bool]:
    """(the run, its newest checkpoint or None, whether it is complete): a new run folder with its
    config, or with --resume the existing one, whose stored arguments must match (rank 0
    decides)."""
    name, root, train_args = run_name(args), Path(args.out), stored_args(args)
    with torch.device("meta"):
        params = LRT(setup.config).param_report()
    run_config = {
        "train": train_args,
        "model": setup.config.to_dict(),
        "params": params,
        "kind": args.model,
        "schedule": setup.schedule.spec,
        "schedule_cost": setup.schedule.cost,
        "forwards_per_token": 1,
        "task": train_args["task"],
        "world_size": ctx.world_size,
        "grad_accum": setup.accum,
        "accounting": setup.plan.to_dict(),
        "data_plan": setup.data_plan,
        "attention_dispatch": setup.backends,
        "torch": torch.__version__,
    }

    def open_on_rank0():
        if not args.resume:
            return str(Run.create(root, name, run_config).path), None, False
        run = Run(root / name)
        if not (run.path / "config.json").exists():
            raise ValueError(f"--resume: no run folder at {run.path}")
        if run.config["train"] != train_args:
            diff = sorted(
                k
                for k in set(run.config["train"]) | set(train_args)
                if run.config["train"].get(k) != train_args.get(k)
            )
            raise ValueError(
                f"--resume: arguments differ from {run.path}/config.json in {diff}; "
                "resume with the same ones"
            )
        ckpt = run.latest_checkpoint()
        return str(run.path), (str(ckpt) if ckpt else None), run.is_complete

    run_path, ckpt_path, complete = on_rank0(ctx, open_on_rank0)
    return Run(run_path), ckpt_path, complete


def _restore(
    ckpt_path: str | None, model, opts, data, ctx: DistContext, run: Run | None = None
) -> tuple[int, float, dict]:
    """(step, elapsed seconds, counters) from a checkpoint (model, optimizers and this rank's data
    loader restored), or a fresh start."""
    if ckpt_path is None:
        return 0, 0.0, {"tokens": 0, "compute_tokens": 0.0, "flops": 0.0}
    state = read_checkpoint(ckpt_path, map_location=ctx.device)  # tensors and plain values only
    if run is not None:
        check_belongs(state, run, ckpt_path)  # a checkpoint copied in from another run: refused
    model.load_state_dict(state["model"])
    for opt, s in zip(opts, state["optimizers"]):
        opt.load_state_dict(s)
    start, elapsed, counters = state["step"], state["elapsed"], dict(state["counters"])
    # the loaded tensors (a full model + optimizer state) would stay on the GPU for the whole run
    del state
    data_states = counters.pop("data", None)
    saved_world = counters.pop("world_size", ctx.world_size)
    if data_states is not None and any(s is not None for s in data_states):
        if saved_world != ctx.world_size:
            raise ValueError(
                f"--resume: the checkpoint was written by {saved_world} ranks, this run has "
                f"{ctx.world_size}; the data loader can only resume with the same world size"
            )
        data.load_state_dict(data_states[ctx.rank])
    return start, elapsed, counters


def _distributed(model, setup: Setup, ctx: DistContext, autocast):
    """(the module to call (`net(x, y)` runs the schedule), the DDP wrapper or None): DDP across
    ranks, with find_unused_parameters only when the schedule leaves some parameter without
    gradient (measured, not assumed)."""
    net = Scheduled(model, setup.schedule)
    if not ctx.distributed:
        return net, None
    from torch.nn.parallel import DistributedDataParallel as DDP

    unused = unused_parameters(
        model, setup.schedule, setup.seq_len, setup.vocab, ctx.device, autocast
    )
    if unused:
        ctx.print0(
            f"DDP: {len(unused)} parameters get no gradient under {setup.schedule.spec} "
            "(find_unused_parameters on): "
            f"{', '.join(unused[:6])}{' ...' if len(unused) > 6 else ''}"
        )
    ddp = DDP(
        net,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        find_unused_parameters=bool(unused),
    )
    return ddp, ddp


def _train_step(
    args, ctx: DistContext, setup: Setup, model, net, ddp, opts, data, autocast, loop: ScaleLoop
) -> dict:
    """One optimizer step over `accum` micro batches (DDP syncs on the last); advances `loop` and
    returns the step's metrics line (the loss averaged over micro batches and ranks)."""
    mult = set_schedules(opts, loop.step, args)
    cuda = ctx.device.type == "cuda"
    synchronize(ctx.device)
    t_step = time.perf_counter()
    loss_sum = None
    for micro in range(setup.accum):
        x, y = data.batch(loop.step, micro)
        sync = (
            contextlib.nullcontext() if ddp is None or micro == setup.accum - 1 else ddp.no_sync()
        )
        with sync:
            with autocast or contextlib.nullcontext():
                out = net(x, y)
            (out.loss / setup.accum).backward()  # outside autocast, as torch recommends
        losses = torch.stack(
            [out.loss.detach().float()] + [l.detach().float() for l in out.stage_losses]
        )
        loss_sum = losses if loss_sum is None else loss_sum + losses
        # this micro step's logits (every stage's and the merged ones) and K/V buffers would
        # otherwise stay alive through the next forward: several GiB at 20L
        del out, x, y
    optimizer_step(opts, model.parameters(), args.grad_clip)
    loss_vec = loss_sum / setup.accum
    if ctx.distributed:
        dist.all_reduce(loss_vec)
        loss_vec /= ctx.world_size
    loss_vals = loss_vec.tolist()  # synchronises the device
    synchronize(ctx.device)
    dt = time.perf_counter() - t_step
    loop.step += 1
    plan, counters = setup.plan, loop.counters
    counters["tokens"] += args.total_batch_size
    counters["flops"] += plan.flops_per_step
    counters["compute_tokens"] += (
        args.total_batch_size * plan.train_flops_per_token / plan.baseline_train_flops_per_token
    )
    record = {
        "kind": "train",
        "step": loop.step,
        "loss": loss_vals[0],
        "stage_losses": loss_vals[1:],
        "tokens": counters["tokens"],
        "compute_tokens": counters["compute_tokens"],
        "flops": counters["flops"],
        "tokens_per_s": args.total_batch_size / dt,
        "mfu": fl.mfu(plan.flops_per_step / dt, args.peak_flops, ctx.world_size),
        "step_time_s": dt,
        "time": loop.elapsed(),
        "lr_mult": mult,
        **data.progress(),
    }
    if cuda:
        record["peak_mem_gib"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
    return record


def _log_step(
    run: Run, args, ctx: DistContext, setup: Setup, record: dict, loop: ScaleLoop
) -> None:
    """Rank 0 logs the line (and prints it every log_every steps); a new data epoch and the first
    compiled step are reported; a non-finite loss is logged, then raises."""
    step = loop.step
    if record.get("data_epoch", 0) > loop.data_epoch:
        loop.data_epoch = record["data_epoch"]
        ctx.print0(
            f"warning: data: rank 0 started epoch {loop.data_epoch} at step {step}: the train "
            "shards "
            "are used up and tokens repeat"
        )
    if step == loop.start + 1 and args.compile:
        ctx.print0(
            f"compile: {compile_stats()} after the first step ({record['step_time_s']:.1f} s)"
        )
    if ctx.rank == 0:
        run.log(record)
    if not math.isfinite(record["loss"]):
        raise FloatingPointError(f"loss became {record['loss']} at step {step}")
    if ctx.rank == 0 and (step == 1 or step % args.log_every == 0 or step == loop.stop):
        ctx.print0(
            f"step {step:6d}/{setup.plan.steps} | loss {record['loss']:.4f} | lr "
            f"x{record['lr_mult']:.3f} | "
            f"{record['step_time_s'] * 1000:8.1f} ms | {record['tokens_per_s']:,.0f} tok/s | "
            f"mfu {record['mfu'] * 100:.2f}%"
        )


def _checkpoint(run: Run, model, opts, data, ctx: DistContext, args, loop: ScaleLoop) -> None:
    """Rank 0 saves the model, optimizers and every rank's data-loader state."""
    states = [data.state_dict()]
    if ctx.distributed:
        states = [None] * ctx.world_size
        dist.all_gather_object(states, data.state_dict())
    if ctx.rank == 0:
        save_checkpoint(
            run,
            loop.step,
            model,
            opts,
            torch.Generator(),
            loop.elapsed(),
            {**loop.counters, "data": states, "world_size": ctx.world_size},
            keep=args.keep_checkpoints,
        )
    barrier(ctx)


def _evaluate_and_log(
    run: Run,
    model,
    args,
    ctx: DistContext,
    setup: Setup,
    val_batches,
    token_bytes,
    autocast,
    loop: ScaleLoop,
    core: bool,
    sequential: bool,
) -> dict:
    """Validation BPB (and CORE, and sequential decoding when asked) logged by rank 0."""
    rec = _evaluate(
        model,
        args,
        ctx,
        setup.schedule,
        val_batches,
        token_bytes,
        setup.tokenizer,
        autocast,
        setup.seq_len,
        core=core,
        sequential=sequential,
    )
    core_table = rec.pop("_core_table", None)
    if ctx.rank == 0:
        counters = loop.counters
        run.log(
            {
                "kind": "eval",
                "step": loop.step,
                "tokens": counters["tokens"],
                "compute_tokens": counters["compute_tokens"],
                "flops": counters["flops"],
                "time": loop.elapsed(),
                **rec,
            }
        )
        ctx.print0(
            "eval step {}: {}".format(
                loop.step,
                ", ".join(
                    f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in rec.items()
                ),
            )
        )
        if core_table is not None:
            run.write_table(
                "core",
                pd.DataFrame(
                    [
                        {
                            "task": k,
                            "accuracy": core_table["accuracy"][k],
                            "centered": core_table["centered"][k],
                        }
                        for k in core_table["accuracy"]
                    ]
                ),
            )
    return rec


def _write_summary(run: Run, args, ctx: DistContext, setup: Setup, data, loop: ScaleLoop) -> None:
    """summary.json: final loss, steady-state step time, throughput and MFU, the last evaluation."""
    records = [r for r in run.metrics_records() if r.get("kind") == "train"]
    tail = [r["loss"] for r in records[-max(1, len(records) // 20) :]]
    times = [r["step_time_s"] for r in records]
    steady = times[min(10, len(times) // 4) :] or times  # leave out compile / warm-up steps
    mean_dt = sum(steady) / len(steady)
    cuda, plan, counters, last_eval = (
        ctx.device.type == "cuda",
        setup.plan,
        loop.counters,
        loop.last_eval,
    )
    run.write_summary(
        {
            "status": "complete",
            "steps": plan.steps,
            "final_loss": sum(tail) / len(tail),
            "wall_time_s": loop.elapsed(),
            "tokens": counters["tokens"],
            "compute_tokens": counters["compute_tokens"],
            "flops": counters["flops"],
            "ratio": plan.ratio,
            "compute_ratio": plan.compute_ratio,
            "schedule_cost": setup.schedule.cost,
            "forwards_per_token": 1,
            "step_time_s": mean_dt,
            "step_time_median_s": statistics.median(steady),
            "tokens_per_s": args.total_batch_size / mean_dt,
            "mfu": fl.mfu(plan.flops_per_step / mean_dt, args.peak_flops, ctx.world_size),
            "world_size": ctx.world_size,
            "device": str(torch.cuda.get_device_name(ctx.device)) if cuda else "cpu",
            "peak_mem_gib": torch.cuda.max_memory_allocated(ctx.device) / 2**30 if cuda else None,
            "compile": {"enabled": bool(args.compile), **compile_stats()},
            "attention_dispatch": setup.backends,
            "data": data.progress(),
            "eval": last_eval,
            "eval_errors": {
                k[len("error_") :]: v for k, v in last_eval.items() if k.startswith("error_")
            },
        }
    )
    ctx.print0(
        f"done: {run.path} (summary.json; final val_bpb "
        f"{last_eval.get('val_bpb', float('nan')):.4f})"
    )
    if any(k.startswith("error_") for k in last_eval):
        ctx.print0(
            "warning: part of the final evaluation failed (summary.json eval_errors); the weights "
            "are "
            f"in {run.checkpoint_dir()}: redo it with python -m lrt_scale.evaluate --run-dir "
            f"{run.path} ..."
        )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
