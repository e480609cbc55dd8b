"""A GPU check for the scaling runs that fits eight minutes on one H100/H200, and writes a report.

    bash scale/launch/gpu_check.sh                      # one GPU: the report in docs/gpu_check/
    bash scale/launch/gpu_check.sh --dry-run --out /tmp/check   # CPU, toy sizes, every section

The launcher runs every section as its own process under ``timeout`` (its budget in
``Sizes.budgets``, start-up included), with ``TORCH_LOGS=recompiles,graph_breaks``: a section that
hangs, compiles for minutes or runs out of memory is killed at its budget and the next one starts
from a fresh process (no dynamo cache, no CUDA allocator state carried over). Each section writes
``<out>/sections/<name>.json`` after every measurement, so a killed one keeps what it measured;
its stderr (dynamo's recompile and graph-break logs) goes to ``<out>/logs/<name>.log``. Then
``python -m lrt_scale.gpu_check report`` merges them into ``gpu_check.json`` and ``gpu_check.md``
(recompiles and graph breaks counted from the logs, not guessed from the number of graphs).

    python -m lrt_scale.gpu_check plan [--dry-run]             # "section budget" lines
    python -m lrt_scale.gpu_check section NAME --out DIR [--dry-run]
    python -m lrt_scale.gpu_check report --out DIR [--dry-run]

Sections, in order (the compile probe last: it is the one most likely to run out of time):

- ``pytest_gpu``: the CUDA tests (``pytest -m gpu``; ``--dry-run`` only collects them).
- ``attention``: which kernel each stage kind actually runs (profiler op names), next to what
  ``lrt_lab.core.attention.pick_backend`` asks for.
- ``attention_parity``: flash-attn, FlexAttention and SDPA in bf16 against an fp32 reference for a
  full sequence, a chunk, a strided subset and a sliding window.
- ``d12_eager`` and ``d12_compiled``: a d12 training step of the LRT (interleaved:2) and of the
  transformer (onepass) at ``rows`` x 2048, forward+backward timed apart from the optimizer step
  (Muon's Newton-Schulz iterations cost the same for both models and would pull their ratio toward
  1), tokens/s, MFU (causal attention counted as causal, ``lrt_scale.flops``) of the forward+
  backward and of the whole step, peak memory; compiled as ``lrt_scale.train --compile`` does,
  with the first step's time (mostly compiling).
- ``decode``: decoding tokens/s at batch 1 and 8 for both d12 models after a prefilled prompt,
  and their ratio (paper: 0.92x); then a short sequential BPB (prompt prefilled with onepass,
  interleaved:2 and exact) next to the parallel forward on the same positions.
- ``memory_d20``: the peak memory of one d20 training step (optimizer state included) at two
  device batch sizes per model; peak = fixed + per_row x B fitted through them gives the largest
  device batch for ``scale/launch/d20_8gpu.sh`` on an 80 GB H100 (``H100_80GB_BYTES``, whatever
  GPU ran the check), next to DDP's gradient buckets, within 95% of it
  (``recommended_device_batch``).
- ``compile_probe``: eager against compiled losses over a few steps of a 12-layer LRT, then an
  evaluation forward and more training steps under
  ``torch.compiler.set_stance("fail_on_recompile")``: whether anything recompiles after warm-up,
  the graphs compiled and graph breaks.

Synthetic "copy" rows stand in for data (no download on the GPU machine). ``--dry-run`` runs every
section on CPU at toy sizes (compiling with the "eager" backend, no memory figures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.core.attention import (
    attend,
    contiguous_tail,
    flash_attn_available,
    visible_mask,
)
from lrt_lab.run.decode import Decoder
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.training.optim import gate_saturation

from . import evaluate as ev
from . import flops as fl
from . import train as st
from .batches import SyntheticData
from .distributed import autocast_for, select_device, synchronize

REPO = Path(__file__).resolve().parents[1]
PAPER = {"step_time_ratio": 2.96, "decode_ratio": 0.92}
GATE_RANGE = (0.05, 1.95)
# an 80 GB H100's memory as torch reports it, about 79.2 GiB (nvidia-smi shows 81,559 MiB, of which
# the driver keeps a little): the launcher's GPUs, whatever GPU the check runs on
H100_80GB_BYTES = 85_045_379_072
FIT_FRACTION = 0.95
LAUNCH_BATCHES = (1, 2, 4, 8, 16, 32)  # d20_8gpu.sh: 32 rows per GPU per step, B must divide 32
CHECK_MINUTES = 8


@dataclass
class Sizes:
    small: str = "d12"  # the timing and decode model
    big: str = "d20"  # the memory model
    probe: str = "d12"  # the compile probe's model (12 layers: past dynamo's recompile limit of 8)
    seq_len: int = 2048
    vocab: int = 32768
    rows: int = 16  # d12 device batch
    warm_steps: int = 2  # untimed (the first compiles)
    timed_steps: int = 4
    decode_batches: tuple = (1, 8)
    decode_prompt: int = 512
    decode_warm: int = 8
    decode_steps: int = 64
    seq_prompt: int = 256  # the sequential BPB after decoding: prompt, then scored tokens
    seq_tokens: int = 32
    seq_rows: int = 2
    memory_batches: dict = field(default_factory=lambda: {"lrt": (2, 4), "transformer": (4, 8)})
    probe_seq_len: int = 512
    probe_rows: int = 2
    probe_steps: int = 3
    backend: str = "inductor"
    # seconds per section, process start-up included; the launcher kills a section at its budget
    budgets: dict = field(
        default_factory=lambda: {
            "pytest_gpu": 80,
            "attention": 30,
            "attention_parity": 20,
            "d12_eager": 50,
            "d12_compiled": 120,
            "decode": 30,
            "memory_d20": 60,
            "compile_probe": 60,
        }
    )


DRY = Sizes(
    small="tiny",
    big="tiny",
    probe="tiny",
    seq_len=16,
    vocab=64,
    rows=2,
    warm_steps=1,
    timed_steps=2,
    decode_batches=(1, 2),
    decode_prompt=8,
    decode_warm=1,
    decode_steps=4,
    seq_prompt=6,
    seq_tokens=4,
    seq_rows=2,
    memory_batches={"lrt": (1, 2), "transformer": (1, 2)},
    probe_seq_len=16,
    probe_rows=2,
    probe_steps=2,
    backend="eager",  # compiles in seconds: the dry run still takes every path
    budgets={
        k: 120
        for k in (
            "pytest_gpu",
            "attention",
            "attention_parity",
            "d12_eager",
            "d12_compiled",
            "decode",
            "memory_d20",
            "compile_probe",
        )
    },
)


class Section:
    """One section's measurements, written to <out>/sections/<name>.json after every update."""

    def __init__(self, name: str, out: Path, sizes: Sizes, device, dry: bool):
        self.name, self.sizes, self.device, self.dry = name, sizes, device, dry
        self.path = out / "sections" / f"{name}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.res: dict = {"status": "running", "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.t0 = time.perf_counter()
        self.save()

    @property
    def budget(self) -> float:
        return self.sizes.budgets[self.name]

    def left(self) -> float:
        """Seconds left of the budget (the process itself started a few seconds before)."""
        return self.budget - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.res["seconds"] = time.perf_counter() - self.t0
        _atomic_write(self.path, json.dumps(self.res, indent=1, default=str))

    def update(self, **kv) -> None:
        self.res.update(kv)
        self.save()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _model(name: str, lrt: bool, sizes: Sizes, device, seed: int = 0, seq_len=None) -> LRT:
    torch.manual_seed(seed)
    cfg = preset(
        name,
        memory=MemoryConfig() if lrt else None,
        sequence_len=seq_len or sizes.seq_len,
        vocab_size=sizes.vocab,
    )
    with torch.device(device):
        return LRT(cfg)


def _optimizers(model: LRT, name: str, steps: int):
    """The run's optimizers at the paper's rates for a 2^19-token batch (lrt_scale.train's
    builder)."""
    args = st.parse_args(["--preset", name, "--synthetic", "--steps", str(steps)])
    args.n_layer, args.total_steps, args.seq_len = (
        model.config.n_layer,
        steps,
        model.config.sequence_len,
    )
    return st.make_optimizers(model, args), args


def compile_like_the_launcher(model: LRT, backend: str = "inductor") -> LRT:
    """What ``lrt_scale.train --compile`` does to the model: its blocks compiled regionally."""
    return model.compile_blocks(dynamic=False, backend=backend)


def train_steps(model, opts, args, schedule, data, steps: int, autocast, device) -> list[dict]:
    """`steps` optimizer steps of one micro batch each; per step the forward+backward and the
    optimizer step timed apart ({"loss", "fwd_bwd_s", "opt_s", "step_s"})."""
    out = []
    for step in range(steps):
        st.set_schedules(opts, step, args)
        x, y = data.batch(step, 0)
        synchronize(device)
        t = time.perf_counter()
        with autocast or contextlib.nullcontext():
            res = run_schedule(model, x, y, schedule)
        res.loss.backward()
        synchronize(device)
        t_fb = time.perf_counter()
        st.optimizer_step(opts, model.parameters(), 0.0)
        synchronize(device)
        t_opt = time.perf_counter()
        out.append(
            {
                "loss": res.loss.item(),
                "fwd_bwd_s": t_fb - t,
                "opt_s": t_opt - t_fb,
                "step_s": t_opt - t,
            }
        )
        del res
    return out


def _reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


# Sections -----------------------------------------------------------------------------------------
def gpu_test_files() -> list[str]:
    """The test files that mark a test gpu (all of tests/ if none is found)."""
    marked = [
        str(f)
        for f in sorted((REPO / "tests").glob("test_*.py"))
        if "mark.gpu" in f.read_text(encoding="utf-8")
    ]
    return marked or [str(REPO / "tests")]


def pytest_gpu(c: Section) -> None:
    # no notebooks among the gpu tests: nbmake's plugin only costs its import (seconds)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:nbmake",
    ]
    if c.dry:
        # collecting the whole suite imports pandas, scipy, jupyter... for files with nothing
        # to select under -m gpu: --dry collects the files that mark gpu tests
        cmd += [*gpu_test_files(), "--collect-only"]
    else:
        cmd.append(str(REPO / "tests"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TORCH_LOGS", None)  # the tests' own compiles would flood the section's log
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(5, c.left() - 5)
    )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    c.update(
        ok=proc.returncode == 0,
        returncode=proc.returncode,
        summary=last,
        tail=proc.stdout[-2000:] + proc.stderr[-1000:],
    )


def attention_backends(c: Section) -> None:
    """Kernels that run per stage kind (profiler op names with attention/flash/flex in them)."""
    from torch.profiler import ProfilerActivity, profile

    sizes, device, res = c.sizes, c.device, c.res
    model = _model(sizes.small, True, sizes, device)
    autocast = autocast_for(device)
    T = sizes.seq_len
    idx = torch.randint(sizes.vocab, (1, T), device=device)
    out = res
    out.update({"dispatch": {}, "ran": {}})

    def ops(fn) -> list[str]:
        with torch.no_grad(), autocast or contextlib.nullcontext():
            fn()  # warm (FlexAttention compiles on first use)
            synchronize(device)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
                synchronize(device)
        names = {e.key for e in prof.key_averages()}
        return sorted(
            n for n in names if any(w in n.lower() for w in ("attention", "flash", "flex", "attn"))
        )

    dtype = torch.bfloat16 if autocast is not None else torch.float32
    # rollout:1 runs one stage per position: at T = 2048 that is 2048 stages of the whole model, and
    # the profiler's per-op bookkeeping alone outlasts the section. Its stage kind (one position
    # against the buffer) picks the same kernel at any length, so it is profiled on a short prefix.
    short = min(T, 64)
    for spec, x in (
        ("onepass", idx),
        ("interleaved:2", idx),
        (f"chunked:{max(1, T // 4)}", idx),
        ("rollout:1", idx[:, :short]),
    ):
        schedule = parse_schedule(spec)
        out["dispatch"][spec] = st.attention_dispatch(model.config, schedule, device, dtype)
        out["ran"][spec] = ops(lambda: run_schedule(model, x, None, schedule))  # noqa: B023 (called here)
        c.save()

    def decode():
        dec = Decoder(model, 1, T)
        dec.prefill(idx[:, : T - 1])
        dec.step(idx[:, T - 1])

    out["ran"]["decode (prefill + 1 step)"] = ops(decode)
    c.update(ok=True)


def attention_parity(c: Section) -> None:
    """Max |bf16 kernel - fp32 reference| per case and backend (bf16 rounding: expect ~1e-2)."""
    sizes, device, dry, res = c.sizes, c.device, c.dry, c.res
    g = torch.Generator().manual_seed(0)
    T, H, Hkv, D = (sizes.seq_len, 4, 2, 64) if not dry else (16, 4, 2, 8)
    cases = {
        "full": (range(0, T), None),
        "chunk": (range(T - T // 4, T), None),
        "strided": (range(1, T, 2), None),
        "window": (range(0, T), max(2, T // 8)),
    }
    backends = ["sdpa"] + (["flash", "flex"] if device.type == "cuda" else [])
    res.update({"tolerance": 3e-2, "cases": {}})
    for name, (P, window) in cases.items():
        q = torch.randn(2, len(P), H, D, generator=g).to(device)
        k, v = torch.randn(2, 2, T, Hkv, D, generator=g).to(device).unbind(0)
        # reference: fp32 explicit mask and softmax, keys repeated for the query heads
        kk, vv = (x.repeat_interleave(H // Hkv, dim=2) for x in (k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) / math.sqrt(D)
        scores = scores.masked_fill(~visible_mask(P, T, window, device), float("-inf"))
        ref = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vv)
        row = {}
        for backend in backends:
            if backend == "flash" and not contiguous_tail(P, T):
                row[backend] = {"skipped": "flash runs contiguous blocks ending at the last key"}
                continue
            if backend == "flash" and not flash_attn_available():
                row[backend] = {"skipped": "flash-attn is not installed (the extra 'gpu')"}
                continue
            try:
                y = attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), P, window, backend=backend)
                err = (y.float() - ref).abs().max().item()
                row[backend] = {"max_abs_err": err, "ok": err < res["tolerance"]}
            except Exception as e:  # noqa: BLE001 - a backend that cannot run this case is a finding
                row[backend] = {"error": f"{type(e).__name__}: {e}"[:300]}
        if device.type != "cuda":
            row.update({b: {"skipped": "needs CUDA"} for b in ("flash", "flex")})
        res["cases"][name] = row
        c.save()
    c.update(
        ok=all(
            r.get("ok", True) and "error" not in r
            for case in res["cases"].values()
            for r in case.values()
        )
    )


def gate_statistics(
    model: LRT, idx: torch.Tensor, schedule, autocast=None, lo_hi=GATE_RANGE
) -> dict:
    """Fraction of gate values 2 sigmoid(W_g h) outside [lo, hi] per layer, as the model applied
    them in the last stage that computed each position (its `blocks.{l}.attn.hook_gate_local` /
    `hook_gate_rec` hook points)."""
    cache = {}
    with torch.no_grad(), autocast or contextlib.nullcontext():
        run_schedule(model, idx, None, schedule, cache=cache)
    per_layer = [
        gate_saturation(
            [cache[f"blocks.{l}.attn.hook_gate_local"], cache[f"blocks.{l}.attn.hook_gate_rec"]],
            *lo_hi,
        )
        for l in range(len(model.pathway.gates))
    ]
    return {
        "range": list(lo_hi),
        "saturated_per_layer": per_layer,
        "saturated": sum(per_layer) / len(per_layer),
    }


MODELS = (("lrt", "interleaved:2"), ("transformer", "onepass"))


def _d12(c: Section, compiled: bool) -> None:
    """A training step of both d12 models, forward+backward and optimizer timed apart."""
    sizes, device = c.sizes, c.device
    autocast = autocast_for(device)
    T, rows = sizes.seq_len, sizes.rows
    tokens = rows * T
    c.update(rows=rows, seq_len=T, tokens_per_step=tokens, compiled=compiled, models={})
    # compiled: the transformer first, so a slow LRT compile still leaves one compiled figure
    order = MODELS[::-1] if compiled else MODELS
    for kind, spec in order:
        rec = c.res["models"][kind] = {"schedule": spec, "status": "building"}
        c.save()
        model = _model(sizes.small, kind == "lrt", sizes, device)
        opts, args = _optimizers(model, sizes.small, sizes.warm_steps + sizes.timed_steps)
        if compiled:
            compile_like_the_launcher(model, sizes.backend)
        data = SyntheticData(sizes.vocab, T, rows, 0, 1, 0, "copy", device)
        schedule = parse_schedule(spec)
        rec["status"] = "compiling (first step)" if compiled else "warming up"
        c.save()
        warm = train_steps(model, opts, args, schedule, data, sizes.warm_steps, autocast, device)
        rec.update({"first_step_s": warm[0]["step_s"], "status": "timing"})
        c.save()
        _reset_peak(device)
        log = train_steps(model, opts, args, schedule, data, sizes.timed_steps, autocast, device)
        fb = sum(r["fwd_bwd_s"] for r in log) / len(log)
        opt = sum(r["opt_s"] for r in log) / len(log)
        flops = fl.plan(model.config, spec, steps=1, global_batch_tokens=tokens).flops_per_step
        rec.update(
            {
                "status": "done",
                "fwd_bwd_s": fb,
                "optimizer_s": opt,
                "step_s": fb + opt,
                "tokens_per_s": tokens / (fb + opt),
                "tokens_per_s_fwd_bwd": tokens / fb,
                "flops_per_step": flops,
                "mfu_fwd_bwd": fl.mfu(flops / fb),
                "mfu_step": fl.mfu(flops / (fb + opt)),
                "peak_gib": _peak_gib(device),
                "losses": [r["loss"] for r in warm + log],
            }
        )
        c.save()
        del model, opts, data
        if compiled:
            torch._dynamo.reset()  # the next model compiles from nothing, as in its own run
    m = c.res["models"]
    c.update(
        step_time_ratio={
            "fwd_bwd_lrt_over_transformer": m["lrt"]["fwd_bwd_s"] / m["transformer"]["fwd_bwd_s"],
            "step_lrt_over_transformer": m["lrt"]["step_s"] / m["transformer"]["step_s"],
            "paper": PAPER["step_time_ratio"],
        },
        mfu_peak_flops=fl.H100_BF16_PEAK_FLOPS,
        mfu_attention="causal",
        ok=True,
    )


def d12_eager(c: Section) -> None:
    _d12(c, compiled=False)


def d12_compiled(c: Section) -> None:
    _d12(c, compiled=True)


def decode(c: Section) -> None:
    """Decoding tokens/s at each batch size for both models (eager, the Decoder), their ratio;
    then a short sequential BPB after a prompt prefilled three ways."""
    sizes, device = c.sizes, c.device
    autocast = autocast_for(device)
    speed = c.res["tokens_per_s"] = {}
    models = {}
    for kind, _ in MODELS:
        models[kind] = model = _model(sizes.small, kind == "lrt", sizes, device).eval()
        speed[kind] = {}
        for B in sizes.decode_batches:
            prompt = torch.randint(sizes.vocab, (B, sizes.decode_prompt), device=device)
            max_len = sizes.decode_prompt + sizes.decode_warm + sizes.decode_steps
            with torch.no_grad(), autocast or contextlib.nullcontext():
                dec = Decoder(model, B, max_len)
                feed = dec.prefill(prompt).argmax(-1)
                for _ in range(sizes.decode_warm):
                    feed = dec.step(feed, check_values=False).argmax(-1)
                synchronize(device)
                t = time.perf_counter()
                for _ in range(sizes.decode_steps):
                    feed = dec.step(feed, check_values=False).argmax(-1)
                synchronize(device)
            speed[kind][str(B)] = B * sizes.decode_steps / (time.perf_counter() - t)
            c.save()
    c.update(
        lrt_over_transformer={
            str(B): speed["lrt"][str(B)] / speed["transformer"][str(B)]
            for B in sizes.decode_batches
        },
        paper=PAPER["decode_ratio"],
        prompt=sizes.decode_prompt,
        steps=sizes.decode_steps,
    )
    lrt = models["lrt"]
    T = sizes.seq_prompt + sizes.seq_tokens
    val = SyntheticData(sizes.vocab, T, sizes.seq_rows, 0, 1, 1, "copy", device, split="val")
    x, y = val.block(0)
    ones = torch.ones(sizes.vocab, dtype=torch.long)
    seq = c.res["sequential_bpb"] = {"prompt": sizes.seq_prompt, "scored": sizes.seq_tokens}
    for spec in ("onepass", "interleaved:2", "exact"):
        seq[spec] = ev.sequential_bpb(lrt, [(x, y)], ones, sizes.seq_prompt, spec, autocast)["bpb"]
        c.save()
    seq["parallel interleaved:2 (same positions)"] = ev.parallel_bpb(
        lrt, [(x, y)], ones, "interleaved:2", autocast, min_position=sizes.seq_prompt - 1
    )["bpb"]
    c.update(ok=True)


def fit_device_batch(
    runs: list[dict],
    param_bytes: int,
    capacity: int = H100_80GB_BYTES,
    fraction: float = FIT_FRACTION,
    batches: tuple = LAUNCH_BATCHES,
) -> dict:
    """The largest device batch in `batches` whose peak, fitted as fixed + per_row x B through
    the measured (device_batch, peak_bytes) runs, plus DDP's gradient buckets (`param_bytes`)
    stays within `fraction` of `capacity`; {"device_batch": None, ...} if none fits or fewer than
    two batch sizes were measured."""
    pts = sorted({(r["device_batch"], r["peak_bytes"]) for r in runs if r.get("peak_bytes")})
    out = {"capacity_bytes": capacity, "fraction": fraction, "param_bytes": param_bytes}
    if len(pts) < 2:
        return {**out, "device_batch": None, "why": "fewer than two batch sizes measured"}
    (b0, p0), (b1, p1) = pts[0], pts[-1]
    per_row = (p1 - p0) / (b1 - b0)
    fixed = p0 - per_row * b0
    fits = [b for b in batches if fixed + per_row * b + param_bytes <= fraction * capacity]
    return {
        **out,
        "fixed_bytes": fixed,
        "per_row_bytes": per_row,
        "device_batch": max(fits) if fits else None,
        "predicted_peak_gib": {b: (fixed + per_row * b) / 2**30 for b in batches},
    }


def memory_d20(c: Section) -> None:
    """Peak memory of one d20 training step at two device batch sizes per model (eager), and the
    launcher's device batch on an 80 GB H100 fitted through them."""
    sizes, device = c.sizes, c.device
    cuda = device.type == "cuda"
    c.update(
        local_capacity_gib=(
            torch.cuda.get_device_properties(device).total_memory / 2**30 if cuda else None
        ),
        runs=[],
        fit={},
        recommended_device_batch={},
        rule=f"fixed + per_row x B + DDP buckets <= {FIT_FRACTION:.0%} of an 80 GB H100",
    )
    for kind, spec in MODELS:
        runs = []
        param_bytes = 0
        for B in sizes.memory_batches[kind]:
            model = _model(sizes.big, kind == "lrt", sizes, device)
            param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            opts, args = _optimizers(model, sizes.big, 10)
            data = SyntheticData(sizes.vocab, sizes.seq_len, B, 0, 1, 0, "copy", device)
            row = {"kind": kind, "device_batch": B}
            _reset_peak(device)
            try:
                log = train_steps(
                    model, opts, args, parse_schedule(spec), data, 2, autocast_for(device), device
                )
                row["step_s"] = log[-1]["step_s"]
                if cuda:
                    row["peak_bytes"] = torch.cuda.max_memory_allocated(device)
                    row["peak_gib"] = row["peak_bytes"] / 2**30
            except torch.OutOfMemoryError:
                row["oom"] = True
            del model, opts, data
            runs.append(row)
            c.res["runs"].append(row)
            c.save()
            if row.get("oom"):
                break
        fit = c.res["fit"][kind] = fit_device_batch(runs, param_bytes)
        c.res["recommended_device_batch"][kind] = fit["device_batch"]
        c.save()
    c.update(ok=True)


def compile_probe(c: Section) -> None:
    """A 12-layer LRT (interleaved:2) trained eager and compiled from the same weights and batches,
    then, compiled, an evaluation forward and more training under
    torch.compiler.set_stance("fail_on_recompile"): does anything recompile after warm-up?"""
    from torch._dynamo.utils import counters

    sizes, device = c.sizes, c.device
    autocast = autocast_for(device)
    spec = "interleaved:2"
    T, rows = sizes.probe_seq_len, sizes.probe_rows
    losses = c.res["losses"] = {}
    for mode in ("eager", "compiled"):
        model = _model(sizes.probe, True, sizes, device, seq_len=T)
        opts, args = _optimizers(model, sizes.probe, 2 * sizes.probe_steps)
        if mode == "compiled":
            torch._dynamo.reset()
            counters.clear()
            compile_like_the_launcher(model, sizes.backend)
        data = SyntheticData(sizes.vocab, T, rows, 0, 1, 0, "copy", device)
        schedule = parse_schedule(spec)
        log = train_steps(model, opts, args, schedule, data, sizes.probe_steps, autocast, device)
        losses[mode] = [r["loss"] for r in log]
        c.res[f"first_step_s_{mode}"] = log[0]["step_s"]
        c.save()
    x, y = data.batch(0, 0)

    def evaluate():
        with torch.no_grad(), autocast or contextlib.nullcontext():
            run_schedule(model, x, y, schedule)  # evaluation: no autograd, a graph of its own

    t = time.perf_counter()
    evaluate()  # warm-up ends with the first evaluation (training and evaluation graphs exist)
    c.update(
        n_layer=model.config.n_layer,
        first_eval_s=time.perf_counter() - t,
        after_warmup=st.compile_stats(),
        max_abs_loss_diff=max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"])),
    )
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            train_steps(model, opts, args, schedule, data, sizes.probe_steps, autocast, device)
            evaluate()
            train_steps(model, opts, args, schedule, data, 1, autocast, device)
        c.update(recompiled_after_warmup=False)
    except Exception as e:  # noqa: BLE001 - a recompile (or a failure) after warm-up is the finding
        c.update(recompiled_after_warmup=True, error_after_warmup=f"{type(e).__name__}: {e}"[:500])
    final = st.compile_stats()
    c.update(
        final=final,
        ok=c.res["max_abs_loss_diff"] < 0.05
        and final["graph_breaks"] == 0
        and not c.res["recompiled_after_warmup"],
    )


SECTIONS = {
    "pytest_gpu": pytest_gpu,
    "attention": attention_backends,
    "attention_parity": attention_parity,
    "d12_eager": d12_eager,
    "d12_compiled": d12_compiled,
    "decode": decode,
    "memory_d20": memory_d20,
    "compile_probe": compile_probe,
}


def run_section(name: str, out: Path, dry: bool) -> dict:
    """Run one section in this process; its JSON is written as it goes."""
    if not dry and not torch.cuda.is_available():
        raise ValueError("device: CUDA is not available; allowed: a CUDA machine, or --dry-run")
    device = select_device("cpu" if dry else "cuda")  # CUDA: matmuls in TF32, as in the runs
    sizes = DRY if dry else Sizes()
    c = Section(name, out, sizes, device, dry)
    c.update(device=torch.cuda.get_device_name(device) if not dry else "cpu", budget_s=c.budget)
    try:
        SECTIONS[name](c)
        c.res["status"] = "done"
    except Exception as e:  # noqa: BLE001 - a failed section is a finding (what it measured stays)
        c.res.update(
            {
                "status": "failed",
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "tail": traceback.format_exc()[-3000:],
            }
        )
    c.save()
    return c.res


# Report -------------------------------------------------------------------------------------------
RECOMPILE_LINE = re.compile(r"Recompiling function")
GRAPH_BREAK_LINE = re.compile(r"\bGraph break\b", re.IGNORECASE)
RECOMPILE_LIMIT_LINE = re.compile(r"recompile_limit|cache_size_limit", re.IGNORECASE)


def log_counts(text: str) -> dict:
    """Dynamo's events in a section's log (TORCH_LOGS=recompiles,graph_breaks): recompiles (one
    "Recompiling function" line each), graph breaks, and whether a recompile limit was hit."""
    lines = text.splitlines()
    return {
        "recompiles": sum(1 for line in lines if RECOMPILE_LINE.search(line)),
        "graph_breaks": sum(1 for line in lines if GRAPH_BREAK_LINE.search(line)),
        "recompile_limit_hit": any(RECOMPILE_LIMIT_LINE.search(line) for line in lines),
    }


def collect(out: Path, dry: bool) -> dict:
    """Every section's JSON, return code (from the launcher) and log counts in one report."""
    sizes = DRY if dry else Sizes()
    report = {
        "dry": dry,
        "torch": torch.__version__,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "sizes": asdict(sizes),
        "budget_s": sum(sizes.budgets.values()),
        "sections": {},
        "recommended_device_batch": None,
    }
    for name in SECTIONS:
        path = out / "sections" / f"{name}.json"
        if not path.exists():
            continue
        sec = json.loads(path.read_text())
        rc_path = out / "sections" / f"{name}.rc.json"
        if rc_path.exists():
            sec["launcher"] = json.loads(rc_path.read_text())
            if sec["launcher"].get("returncode") in (124, 137) and sec.get("status") == "running":
                sec["status"] = "timed out"
        log = out / "logs" / f"{name}.log"
        if log.exists():
            sec["dynamo_log"] = log_counts(log.read_text(errors="replace"))
        report["sections"][name] = sec
        report.setdefault("device", sec.get("device"))
    mem = report["sections"].get("memory_d20", {})
    if mem.get("recommended_device_batch") and all(mem["recommended_device_batch"].values()):
        report["recommended_device_batch"] = mem["recommended_device_batch"]
    return report


def _fmt(x, spec=".3g", unit="") -> str:
    if x is None:
        return "still open"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return (format(x, spec) if isinstance(x, (int, float)) else str(x)) + unit


def headline(report: dict) -> list[str]:
    """The figures the check exists for, one line each ("still open" where no run gave them)."""
    s = report["sections"]
    lines = []
    for name in ("d12_eager", "d12_compiled"):
        m = s.get(name, {}).get("models", {})
        for kind, _ in MODELS:
            r = m.get(kind, {})
            fb, opt = _fmt(r.get("fwd_bwd_s"), ".3g", " s"), _fmt(r.get("optimizer_s"), ".3g", " s")
            lines.append(
                f"{name} {kind}: forward+backward {fb}, optimizer {opt}, "
                f"tokens/s {_fmt(r.get('tokens_per_s'), ',.0f')}, "
                f"MFU {_fmt(r.get('mfu_fwd_bwd'), '.1%')} (forward+backward) / "
                f"{_fmt(r.get('mfu_step'), '.1%')} (step), peak "
                f"{_fmt(r.get('peak_gib'), '.1f', ' GiB')}, first step "
                f"{_fmt(r.get('first_step_s'), '.1f', ' s')}"
            )
        ratio = s.get(name, {}).get("step_time_ratio", {})
        lines.append(
            f"{name} LRT/transformer step time: forward+backward "
            f"{_fmt(ratio.get('fwd_bwd_lrt_over_transformer'), '.3g', 'x')}, whole step "
            f"{_fmt(ratio.get('step_lrt_over_transformer'), '.3g', 'x')} "
            f"(paper {PAPER['step_time_ratio']}x)"
        )
    dec = s.get("decode", {})
    for B in (DRY if report["dry"] else Sizes()).decode_batches:
        tps = {k: dec.get("tokens_per_s", {}).get(k, {}).get(str(B)) for k, _ in MODELS}
        lines.append(
            f"decode batch {B}: LRT {_fmt(tps['lrt'], ',.0f')} / transformer "
            f"{_fmt(tps['transformer'], ',.0f')} tokens/s = "
            f"{_fmt(dec.get('lrt_over_transformer', {}).get(str(B)), '.3g', 'x')} (paper "
            f"{PAPER['decode_ratio']}x)"
        )
    mem = s.get("memory_d20", {})
    for kind, _ in MODELS:
        runs = [r for r in mem.get("runs", []) if r["kind"] == kind]
        peaks = ", ".join(
            f"B={r['device_batch']}: "
            + ("OOM" if r.get("oom") else _fmt(r.get("peak_gib"), ".1f", " GiB"))
            for r in runs
        )
        fit = mem.get("fit", {}).get(kind, {})
        lines.append(
            f"d20 {kind} peak memory: {peaks or 'still open'}; device batch on an 80 GB H100: "
            f"{_fmt(fit.get('device_batch'), 'd')}"
        )
    probe = s.get("compile_probe", {})
    lines.append(
        f"compile probe (layers: {_fmt(probe.get('n_layer'), 'd')}): recompiled after warm-up "
        f"{_fmt(probe.get('recompiled_after_warmup'))}, graphs "
        f"{_fmt(probe.get('final', {}).get('unique_graphs'), 'd')}, graph breaks "
        f"{_fmt(probe.get('final', {}).get('graph_breaks'), 'd')}, recompiles in the log "
        f"(warm-up's stage kinds and grad modes included) "
        f"{_fmt(probe.get('dynamo_log', {}).get('recompiles'), 'd')}, first compiled step "
        f"{_fmt(probe.get('first_step_s_compiled'), '.1f', ' s')}"
    )
    return lines


def markdown(report: dict) -> str:
    where = "dry run, CPU, toy sizes" if report["dry"] else report.get("device") or "not run yet"
    lines = [
        f"# GPU check ({where})",
        "",
        f"Generated {report['generated']} (torch {report['torch']}) by `python -m "
        f"lrt_scale.gpu_check report`; sections budgeted {report['budget_s']} s in all "
        f"(`bash scale/launch/gpu_check.sh`, {CHECK_MINUTES} minutes).",
        "",
    ]
    notes = list(report.get("notes", []))
    if not report["sections"]:
        notes.insert(0, "No section of this check has run yet: every figure below is still open.")
    lines += [f"- {note}" for note in notes] + ([""] if notes else [])
    lines += ["## Figures", ""] + [f"- {line}" for line in headline(report)] + [""]
    lines += [
        "## Recommended device batch (d20 on 80 GB H100s, for scale/launch/d20_8gpu.sh)",
        "",
        f"`{json.dumps(report.get('recommended_device_batch'))}`",
        "",
    ]
    for name in SECTIONS:
        sec = report["sections"].get(name)
        if sec is None:
            lines += [f"## {name}: still open (not run)", ""]
            continue
        status = "ok" if sec.get("ok") else sec.get("status", "failed").upper()
        if status == "DONE":
            status = "FAILED"
        lines += [
            f"## {name}: {status} ({sec.get('seconds', 0):.0f} s of {sec.get('budget_s', '?')})",
            "",
            "```json",
            json.dumps(
                {k: v for k, v in sec.items() if k not in ("seconds", "tail")},
                indent=1,
                default=str,
            )[:4000],
            "```",
            "",
        ]
        if "tail" in sec:
            lines += ["```", sec["tail"][-1500:], "```", ""]
    return "\n".join(lines)


def write_report(out: Path, dry: bool, notes: list[str] | None = None) -> dict:
    report = collect(out, dry)
    notes_file = out / "notes.json"  # notes written beside a report by hand lead its page
    report["notes"] = list(notes or []) + (
        json.loads(notes_file.read_text()) if notes_file.exists() else []
    )
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "gpu_check.json", json.dumps(report, indent=1, default=str))
    _atomic_write(out / "gpu_check.md", markdown(report))
    return report


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lrt_scale.gpu_check", description=__doc__.split("\n")[0]
    )
    ap.add_argument("command", choices=("plan", "section", "report"))
    ap.add_argument("name", nargs="?", default=None, help="the section (command section)")
    ap.add_argument(
        "--out",
        default=str(REPO / "docs" / "gpu_check"),
        help="report folder (sections/, logs/, gpu_check.json, .md)",
    )
    ap.add_argument(
        "--dry-run", "--dry", action="store_true", dest="dry", help="CPU, toy sizes, every section"
    )
    ap.add_argument(
        "--sections", default=None, help=f"comma-separated subset of {', '.join(SECTIONS)} (plan)"
    )
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sizes = DRY if args.dry else Sizes()
    out = Path(args.out)
    if args.command == "plan":
        only = args.sections.split(",") if args.sections else list(SECTIONS)
        bad = [s for s in only if s not in SECTIONS]
        if bad:
            print(
                f"error: --sections {','.join(bad)} is invalid; allowed: {', '.join(SECTIONS)}",
                file=sys.stderr,
            )
            return 2
        for name in SECTIONS:
            if name in only:
                print(name, sizes.budgets[name])
        return 0
    if args.command == "section":
        if args.name not in SECTIONS:
            print(
                f"error: section {args.name!r} is invalid; allowed: {', '.join(SECTIONS)}",
                file=sys.stderr,
            )
            return 2
        try:
            res = run_section(args.name, out, args.dry)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0 if res.get("ok") else 1
    report = write_report(out, args.dry)
    failed = [k for k, v in report["sections"].items() if not v.get("ok")]
    print(f"[gpu_check] report in {out}; not ok: {', '.join(failed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
