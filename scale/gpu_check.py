"""One command that checks a GPU for the scaling runs in about ten minutes, and writes a report.

    python -m lrt_scale.gpu_check                 # one H100: the report in docs/gpu_check/
    python -m lrt_scale.gpu_check --dry --out /tmp/check   # CPU, tiny sizes: every section but the
    CUDA kernels

Sections (each with a time budget; one that fails or runs out of time is recorded, the others go
on):

- ``pytest_gpu``: the CUDA tests (``pytest -m gpu``; ``--dry`` only collects them, from the
  test files that mark any).
- ``attention``: which kernel each stage kind of onepass / interleaved:2 / chunked / rollout:1 /
  decoding actually runs (torch.profiler's op names), next to what
  ``lrt_lab.core.attention.pick_backend`` asks for.
- ``attention_parity``: flash-attn, FlexAttention and SDPA in bf16 against an fp32 reference
  (explicit mask and softmax) for a full sequence, a chunk, a strided subset and a sliding window;
  flash-attn is skipped, with the reason, where it is not installed or the case is not a
  contiguous block.
- ``compile``: eager vs ``torch.compile`` losses over a few training steps from the same weights
  and batches, the first compiled step's time (mostly compiling), dynamo's graph breaks and
  compiled graphs counted.
- ``memory``: peak memory of one d20 training step (paper optimizer state included) at candidate
  device batch sizes, eager (compiled too with ``Sizes.compile_timing``); the largest that fits
  leaves room for DDP's gradient buckets (the parameters' size again) within 95% of the GPU:
  ``recommended_device_batch``, which ``scale/launch/d20_8gpu.sh`` reads (an eager peak bounds the
  compiled one in practice: inductor frees activations sooner).
- ``d12_training``: d12 LRT (interleaved:2) for ``gate_steps`` steps at the paper's rates, then the
  baseline: step-time ratio LRT/transformer (paper, 8xH100 20L: 2.96) and MFU, eager unless
  ``Sizes.compile_timing`` (the compile section says why); then the gate
  statistics of the trained LRT (fraction of 2 sigmoid(W_g x) outside [0.05, 1.95]), decode tokens/s
  ratio (paper 0.92x) and sequential BPB after a 1,024-token prompt prefilled with onepass,
  interleaved:2 and exact (plus the parallel forward on the same positions).

Synthetic "copy" rows stand in for data (no download on the GPU machine). ``--dry`` runs the same
code on CPU at tiny sizes (compile with the "eager" backend, no memory figures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
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


@dataclass
class Sizes:
    small: str = "d12"  # the timing / gate / decode model
    big: str = "d20"  # the memory sweep's model
    seq_len: int = 2048
    vocab: int = 32768
    prompt: int = 1024
    rows: int = 16  # device batch of the d12 sections
    gate_steps: int = 100
    gate_batch_rows: int = 16  # rows per optimizer step (rates as at 2^19: the paper's)
    base_steps: int = 15
    compile_steps: int = 5
    compile_rows: int = 2
    candidates: tuple = (1, 2, 4, 8, 16, 32)
    decode_rows: int = 8
    decode_steps: int = 128
    seq_rows: int = 4
    # Inductor's first d12 step took over 200 s on an H200 (torch 2.11), and each new shape compiles
    # again: compiled memory and timing sections cannot fit the check's ten minutes. The compile
    # section measures compiling once; memory and d12_training run eager unless this is set.
    compile_timing: bool = False
    budgets: dict = field(
        default_factory=lambda: {
            "pytest_gpu": 90,
            "attention": 60,
            "attention_parity": 15,
            "compile": 260,
            "memory": 90,
            "d12_training": 150,
        }
    )


DRY = Sizes(
    small="tiny",
    big="tiny",
    seq_len=16,
    vocab=64,
    prompt=8,
    rows=2,
    gate_steps=4,
    gate_batch_rows=4,
    base_steps=3,
    compile_steps=3,
    compile_rows=2,
    candidates=(1, 2),
    decode_rows=2,
    decode_steps=4,
    seq_rows=2,
    compile_timing=True,  # the eager backend compiles in seconds: --dry still runs every path
    budgets={
        k: 60
        for k in (
            "pytest_gpu",
            "attention",
            "attention_parity",
            "compile",
            "memory",
            "d12_training",
        )
    },
)


class OutOfTime(Exception):
    pass


def _deadline(budget_s: float):
    end = time.perf_counter() + budget_s

    def check(what: str):
        if time.perf_counter() > end:
            raise OutOfTime(f"{what}: past the section's {budget_s:.0f} s budget")

    return check


def _model(name: str, lrt: bool, sizes: Sizes, device, seed: int = 0) -> LRT:
    torch.manual_seed(seed)
    cfg = preset(
        name,
        memory=MemoryConfig() if lrt else None,
        sequence_len=sizes.seq_len,
        vocab_size=sizes.vocab,
    )
    with torch.device(device):
        return LRT(cfg)


def _optimizers(model: LRT, name: str, steps: int):
    """The run's optimizers at the paper's rates for a
    2^19-token batch (lrt_scale.train's builder)."""
    args = st.parse_args(["--preset", name, "--synthetic", "--steps", str(steps)])
    args.n_layer, args.total_steps, args.seq_len = (
        model.config.n_layer,
        steps,
        model.config.sequence_len,
    )
    return st.make_optimizers(model, args), args


def _train(
    model, opts, args, schedule, data, steps: int, accum: int, autocast, device, check=None
) -> list[dict]:
    """`steps` optimizer steps of `accum` micro batches; [{"loss", "dt"}] per step."""
    out = []
    for step in range(steps):
        if check:
            check(f"step {step}")
        st.set_schedules(opts, step, args)
        synchronize(device)
        t = time.perf_counter()
        total = 0.0
        for micro in range(accum):
            x, y = data.batch(step, micro)
            with autocast or contextlib.nullcontext():
                res = run_schedule(model, x, y, schedule)
            (res.loss / accum).backward()
            total += res.loss.item() / accum
            del res
        st.optimizer_step(opts, model.parameters(), 0.0)
        synchronize(device)
        out.append({"loss": total, "dt": time.perf_counter() - t})
    return out


# Sections -----------------------------------------------------------------------------------------
def gpu_test_files() -> list[str]:
    """The test files that mark a test gpu (all of tests/ if none is found)."""
    marked = [
        str(f)
        for f in sorted((REPO / "tests").glob("test_*.py"))
        if "mark.gpu" in f.read_text(encoding="utf-8")
    ]
    return marked or [str(REPO / "tests")]


def pytest_gpu(sizes: Sizes, device, dry: bool, budget: float, res: dict) -> dict:
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
    if dry:
        # collecting the whole suite imports pandas, scipy, jupyter... for files with nothing
        # to select under -m gpu: --dry collects the files that mark gpu tests
        cmd += [*gpu_test_files(), "--collect-only"]
    else:
        cmd.append(str(REPO / "tests"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=budget)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    res.update(
        {
            "ok": proc.returncode == 0,
            "returncode": proc.returncode,
            "summary": last,
            "tail": proc.stdout[-2000:] + proc.stderr[-1000:],
        }
    )
    return res


def attention_backends(sizes: Sizes, device, dry: bool, budget: float, res: dict) -> dict:
    """Kernels that run per stage kind (profiler op names with attention/flash/flex in them)."""
    from torch.profiler import ProfilerActivity, profile

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

    def decode():
        dec = Decoder(model, 1, T)
        dec.prefill(idx[:, : T - 1])
        dec.step(idx[:, T - 1])

    out["ran"]["decode (prefill + 1 step)"] = ops(decode)
    return out


def attention_parity(sizes: Sizes, device, dry: bool, budget: float, res: dict) -> dict:
    """Max |bf16 kernel - fp32 reference| per case and backend (bf16 rounding: expect ~1e-2)."""
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
    res["ok"] = all(
        r.get("ok", True) and "error" not in r for c in res["cases"].values() for r in c.values()
    )
    return res


def compile_parity(sizes: Sizes, device, dry: bool, budget: float, res: dict) -> dict:
    """Eager vs compiled stage: the same weights, batches and steps; graph breaks and graphs."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    check = _deadline(budget)
    losses = res["losses"] = {}
    for mode in ("eager", "compiled"):
        model = _model(sizes.small, True, sizes, device)
        opts, args = _optimizers(model, sizes.small, sizes.compile_steps)
        if mode == "compiled":
            torch._dynamo.reset()
            counters.clear()
            model.stage = torch.compile(
                model.stage, dynamic=False, backend="eager" if dry else "inductor"
            )
        data = SyntheticData(
            sizes.vocab, sizes.seq_len, sizes.compile_rows, 0, 1, 0, "copy", device
        )
        log = _train(
            model,
            opts,
            args,
            parse_schedule("interleaved:2"),
            data,
            sizes.compile_steps,
            1,
            autocast_for(device),
            device,
            check,
        )
        losses[mode] = [r["loss"] for r in log]
        res[f"first_step_s_{mode}"] = log[0]["dt"]  # compiled: mostly the compile itself
    stats = st.compile_stats()
    diff = max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"]))
    res.update(
        {
            "max_abs_loss_diff": diff,
            **stats,
            "recompiles": max(0, stats["unique_graphs"] - 1),
            "ok": diff < 0.05 and stats["graph_breaks"] == 0,
        }
    )
    return res


def peak_memory(sizes: Sizes, device, dry: bool, budget: float, res: dict) -> dict:
    """Peak memory of one d20 training step per device batch, until one does not fit."""
    check = _deadline(budget)
    cuda = device.type == "cuda"
    capacity = torch.cuda.get_device_properties(device).total_memory if cuda else None
    res.update(
        {
            "capacity_gib": capacity / 2**30 if cuda else None,
            "runs": [],
            "recommended_device_batch": {},
            "fits": "peak + DDP's gradient buckets (the parameters' bytes) <= 95% of the GPU",
        }
    )
    for kind, spec in (("lrt", "interleaved:2"), ("transformer", "onepass")):
        best = res["recommended_device_batch"][kind] = {}
        for compiled in (False, True) if sizes.compile_timing else (False,):
            # compiling costs a minute per shape: start the compiled sweep at the eager result
            start = best.get("eager", sizes.candidates[0]) if compiled else sizes.candidates[0]
            for B in [b for b in sizes.candidates if b >= start]:
                check(f"{kind} B={B}")
                model = _model(sizes.big, kind == "lrt", sizes, device)
                opts, args = _optimizers(model, sizes.big, 10)
                if compiled:
                    model.stage = torch.compile(
                        model.stage, dynamic=False, backend="eager" if dry else "inductor"
                    )
                data = SyntheticData(sizes.vocab, sizes.seq_len, B, 0, 1, 0, "copy", device)
                ddp_buckets = sum(p.numel() * p.element_size() for p in model.parameters())
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                row = {"kind": kind, "compile": compiled, "device_batch": B}
                try:
                    steps = _train(
                        model,
                        opts,
                        args,
                        parse_schedule(spec),
                        data,
                        2,
                        1,
                        autocast_for(device),
                        device,
                    )
                    row["step_s"] = steps[-1]["dt"]
                    if cuda:
                        peak = torch.cuda.max_memory_allocated(device)
                        row["peak_gib"] = peak / 2**30
                        row["fits_8gpu"] = peak + ddp_buckets <= 0.95 * capacity
                except torch.OutOfMemoryError:
                    row["oom"] = True
                del model, opts, data
                res["runs"].append(row)
                if row.get("oom") or row.get("fits_8gpu") is False:
                    break
                if row.get("fits_8gpu") or not cuda:
                    best["compile" if compiled else "eager"] = B
    return res


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


def d12_training(sizes: Sizes, device, dry: bool, budget: float, res: dict) -> dict:
    check = _deadline(budget)
    autocast = autocast_for(device)
    rows = sizes.rows
    accum = max(1, sizes.gate_batch_rows // rows)
    times = {}
    trained = None
    for kind, spec, steps in (
        ("lrt", "interleaved:2", sizes.gate_steps),
        ("transformer", "onepass", sizes.base_steps),
    ):
        model = _model(sizes.small, kind == "lrt", sizes, device)
        opts, args = _optimizers(model, sizes.small, steps)
        if sizes.compile_timing:
            model.stage = torch.compile(
                model.stage, dynamic=False, backend="eager" if dry else "inductor"
            )
        data = SyntheticData(sizes.vocab, sizes.seq_len, rows, 0, 1, 0, "copy", device)
        log = _train(
            model, opts, args, parse_schedule(spec), data, steps, accum, autocast, device, check
        )
        steady = [r["dt"] for r in log[min(3, len(log) - 1) :]]
        times[kind] = sum(steady) / len(steady)
        tokens = rows * accum * sizes.seq_len
        plan = fl.plan(model.config, spec, steps=1, global_batch_tokens=tokens)
        res[kind] = {
            "steps": steps,
            "final_loss": log[-1]["loss"],
            "step_s": times[kind],
            "tokens_per_s": tokens / times[kind],
            "mfu": fl.mfu(plan.flops_per_step / times[kind]),
            "compiled": sizes.compile_timing,
        }
        model.__dict__.pop("stage", None)  # eager again for decoding and the gate statistics
        if kind == "lrt":
            trained = model
        else:
            base = model
    res["step_time_ratio"] = {
        "lrt_over_transformer": times["lrt"] / times["transformer"],
        "paper": PAPER["step_time_ratio"],
    }
    res["tokens_per_step"] = rows * accum * sizes.seq_len
    val = SyntheticData(
        sizes.vocab, sizes.seq_len, sizes.seq_rows, 0, 1, 1, "copy", device, split="val"
    )
    x, y = val.block(0)
    res["gates_after_training"] = gate_statistics(
        trained, x, parse_schedule("interleaved:2"), autocast
    )

    check("decode")
    speed = {}
    for kind, model in (("lrt", trained), ("transformer", base)):
        prompt = torch.randint(sizes.vocab, (sizes.decode_rows, sizes.prompt), device=device)
        with torch.no_grad(), autocast or contextlib.nullcontext():
            dec = Decoder(model, sizes.decode_rows, sizes.prompt + sizes.decode_steps)
            dec.prefill(prompt)
            feed = prompt[:, 0]
            synchronize(device)
            t = time.perf_counter()
            for _ in range(sizes.decode_steps):
                dec.step(feed)
            synchronize(device)
        speed[kind] = sizes.decode_rows * sizes.decode_steps / (time.perf_counter() - t)
    res["decode"] = {
        "tokens_per_s": speed,
        "lrt_over_transformer": speed["lrt"] / speed["transformer"],
        "paper": PAPER["decode_ratio"],
    }

    check("sequential BPB")
    ones = torch.ones(sizes.vocab, dtype=torch.long)
    seq = {
        spec: ev.sequential_bpb(trained, [(x, y)], ones, sizes.prompt, spec, autocast)["bpb"]
        for spec in ("onepass", "interleaved:2", "exact")
    }
    seq["parallel interleaved:2 (same positions)"] = ev.parallel_bpb(
        trained, [(x, y)], ones, "interleaved:2", autocast, min_position=sizes.prompt - 1
    )["bpb"]
    res["sequential_bpb"] = {"prompt": sizes.prompt, "bits_per_token": seq}
    return res


SECTIONS = {
    "pytest_gpu": pytest_gpu,
    "attention": attention_backends,
    "attention_parity": attention_parity,
    "compile": compile_parity,
    "memory": peak_memory,
    "d12_training": d12_training,
}


# Report -------------------------------------------------------------------------------------------
def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def markdown(report: dict) -> str:
    lines = [
        f"# GPU check ({'dry, CPU' if report['dry'] else report['device']})",
        "",
        f"torch {report['torch']}, {report['started']}; sizes: `{json.dumps(report['sizes'])}`",
        "",
    ]
    # notes written beside a report by hand (how it was run, what it found) come first
    notes = report.get("notes", [])
    lines += [f"- {note}" for note in notes] + ([""] if notes else [])
    for name, sec in report["sections"].items():
        status = "ok" if sec.get("ok", "error" not in sec) else "FAILED"
        lines += [
            f"## {name}: {status} ({sec.get('seconds', 0):.0f} s)",
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
    lines += [
        "## recommended device batch (d20, for scale/launch/d20_8gpu.sh)",
        "",
        f"`{json.dumps(report.get('recommended_device_batch'))}`",
        "",
    ]
    return "\n".join(lines)


def run_check(out: Path, dry: bool, only: list[str] | None = None, log=print) -> dict:
    if not dry and not torch.cuda.is_available():
        raise ValueError("device: CUDA is not available; allowed: a CUDA machine, or --dry on CPU")
    device = select_device("cpu" if dry else "cuda")  # CUDA: matmuls in TF32, as in the runs
    sizes = DRY if dry else Sizes()
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "dry": dry,
        "device": torch.cuda.get_device_name(device) if not dry else "cpu",
        "torch": torch.__version__,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "sizes": asdict(sizes),
        "sections": {},
        "recommended_device_batch": None,
    }
    for name, fn in SECTIONS.items():
        if only and name not in only:
            continue
        budget = sizes.budgets[name]
        log(f"[gpu_check] {name} (budget {budget} s)")
        t = time.perf_counter()
        sec = {}
        try:
            fn(sizes, device, dry, budget, sec)
        except Exception as e:  # noqa: BLE001 - a failed section is a finding (what it measured stays)
            sec.update(
                {"ok": False, "error": f"{type(e).__name__}: {e}", "tail": traceback.format_exc()}
            )
        sec["seconds"] = time.perf_counter() - t
        report["sections"][name] = sec
        if name == "memory" and sec.get("recommended_device_batch"):
            report[
                "recommended_device_batch"
            ] = {  # compiled when measured: the launchers use --compile
                kind: b.get("compile", b.get("eager"))
                for kind, b in sec["recommended_device_batch"].items()
            }
        _atomic_write(out / "gpu_check.json", json.dumps(report, indent=1, default=str))
        _atomic_write(out / "gpu_check.md", markdown(report))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lrt_scale.gpu_check", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--out",
        default=str(REPO / "docs" / "gpu_check"),
        help="report folder (gpu_check.json, .md)",
    )
    ap.add_argument(
        "--dry", action="store_true", help="CPU, tiny sizes: everything but the CUDA kernels"
    )
    ap.add_argument(
        "--sections", default=None, help=f"comma-separated subset of {', '.join(SECTIONS)}"
    )
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    only = args.sections.split(",") if args.sections else None
    bad = [s for s in only or [] if s not in SECTIONS]
    if bad:
        print(
            f"error: --sections {','.join(bad)} is invalid; allowed: {', '.join(SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    try:
        report = run_check(Path(args.out), args.dry, only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = [k for k, v in report["sections"].items() if not v.get("ok", "error" not in v)]
    print(f"[gpu_check] report in {args.out}; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
