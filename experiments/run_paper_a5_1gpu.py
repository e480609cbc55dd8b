"""The paper-shape A5 run on one GPU in about five minutes (experiments/a5_paper_1gpu.toml).

    python experiments/run_paper_a5_1gpu.py                  # one GPU: train, then the pos@90 table
    python experiments/run_paper_a5_1gpu.py --dry-run --out /tmp/a5   # CPU, toy steps and lengths
    python experiments/run_paper_a5_1gpu.py --predict        # CPU: measure, predict the GPU time

Trains the spec's three runs one after another (transformer, LRT with Interleaved(2), LRT with
FixedPoint(0.1, 8)) into the run store (`--out`, default the spec's), resuming any that a previous
call left unfinished, and stops at `--time-limit` seconds (the run in progress checkpointed, so the
same command continues it). Then it writes `a5_paper_1gpu.json` and `.md` into the store: pos@90 at
64 / 128 / 256 with the training schedule's parallel forward and with exact recurrent decoding,
per run, from its final evaluation (or its last logged one, marked, for a run not finished).

`--predict` measures on this CPU what a GPU step costs the host, and the FLOPs a GPU would add:
every run's training step at the paper's shape but a reduced length and batch (its steps/s), the
aten operations one step dispatches (each a kernel launch on a GPU), and one decoding step's; the
prediction of a GPU step is ops x the host cost of one op (the larger of ``GPU_OP_S`` and this
CPU's measured cost per op: the same Python and dispatcher run on the GPU's host) plus the step's
FLOPs at the full shape over ``GPU_FLOPS`` (a sustained rate for d = 256 matmuls), and the same for
the evaluations. It prints the steps that fit ``--gpu-seconds`` and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lrt_lab.run.decode import Decoder  # noqa: E402
from lrt_lab.run.runner import run_schedule  # noqa: E402
from lrt_lab.store.results import Run  # noqa: E402
from lrt_lab.training.loop import (  # noqa: E402
    _masked_targets,
    build_model,
    make_optimizers,
    make_task,
    prepare,
    train,
)
from lrt_lab.training.optim import optimizer_step, set_lr_schedule  # noqa: E402
from lrt_lab.training.sweep import expand, load_spec  # noqa: E402
from lrt_scale import flops as fl  # noqa: E402

SPEC = REPO / "experiments" / "a5_paper_1gpu.toml"
# the host cost of one eager CUDA op (Python, dispatcher, launch): ~10 us in eager PyTorch
GPU_OP_S = 10e-6
# sustained bf16 rate of the step's matmuls at d = 256 on an H100/H200 (a quarter of the 989 TFLOP/s
# dense peak: small matrices, a batch of 256 x 64 rows)
GPU_FLOPS = 0.25 * 989e12
GPU_RUN_START_S = 15  # building a run, CUDA context, first-step warm-up (per run, a guess)


def configs(spec_path: Path, device: str | None = None) -> list:
    cfgs = expand(load_spec(spec_path))
    return [dataclasses.replace(c, device=device) if device else c for c in cfgs]


def dry_configs(cfgs: list) -> list:
    """The same runs at toy size on CPU: every code path of the real run in seconds."""
    return [
        dataclasses.replace(
            c,
            device="cpu",
            steps=4,
            batch_size=8,
            length=8,
            task_options={"curriculum_start": 4, "curriculum_steps": 2},
            eval_every=2,
            eval_lengths=(8, 16, 32),
            eval_size=8,
            checkpoint_every=0,
        )
        for c in cfgs
    ]


# Training and the table ---------------------------------------------------------------------------
LENGTHS_KEY = ("pos90_parallel", "pos90_exact")


def run_all(cfgs: list, out: Path, time_limit: float | None, progress: bool = True) -> None:
    deadline = None if time_limit is None else time.monotonic() + time_limit
    for cfg in cfgs:
        if deadline is not None and time.monotonic() >= deadline:
            print(f"time limit: {cfg.run_name} not started", flush=True)
            continue
        t = time.perf_counter()
        run = train(
            cfg, out, resume=(out / cfg.run_name).exists(), progress=progress, deadline=deadline
        )
        state = "complete" if run.is_complete else "stopped (run again to continue)"
        print(f"{cfg.run_name}: {state} in {time.perf_counter() - t:.0f} s", flush=True)


def table(cfgs: list, out: Path) -> dict:
    """pos@90 per run, evaluation length and forward, from the final evaluation (or the last one
    logged, for a run not finished)."""
    rows = []
    for cfg in cfgs:
        folder = out / cfg.run_name
        row = {"run": cfg.run_name, "model": cfg.model, "schedule": cfg.schedule, "steps": None}
        if folder.exists():
            run = Run(folder)
            evals = run.metrics_records(kind="eval")
            last = evals[-1] if evals else {}
            summary = run.summary if run.is_complete else None
            rec = summary["eval"] if summary else last
            row.update(
                {
                    "complete": bool(summary),
                    "steps": summary["steps"] if summary else last.get("step"),
                    "wall_time_s": summary.get("wall_time_s") if summary else None,
                }
            )
            for L in cfg.eval_lengths:
                for key in LENGTHS_KEY:
                    row[f"{key}@{L}"] = rec.get(f"{key}@{L}")
        rows.append(row)
    return {"lengths": list(cfgs[0].eval_lengths), "rows": rows}


def markdown(result: dict) -> str:
    lengths = result["lengths"]
    head = ["run", "steps"] + [f"{L} parallel / exact" for L in lengths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        steps = (
            "not run"
            if r["steps"] is None
            else f"{r['steps']}" + ("" if r.get("complete") else " (not finished)")
        )
        cells = [
            f"{r.get(f'pos90_parallel@{L}', '-')} / {r.get(f'pos90_exact@{L}', '-')}"
            for L in lengths
        ]
        lines.append("| " + " | ".join([r["run"], steps, *cells]) + " |")
    return "\n".join(
        [
            "# A5 at the paper's shape on one GPU (experiments/a5_paper_1gpu.toml)",
            "",
            "pos@90 with the training schedule's parallel forward / exact recurrent decoding "
            "(the paper: transformer 5 / 5 / 5, LRT with Interleaved(2) 24 / 24 / 24).",
            "",
            *lines,
            "",
        ]
    )


def write_table(cfgs: list, out: Path) -> dict:
    result = table(cfgs, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "a5_paper_1gpu.json").write_text(json.dumps(result, indent=1))
    (out / "a5_paper_1gpu.md").write_text(markdown(result))
    return result


# The prediction -----------------------------------------------------------------------------------
class OpCount(TorchDispatchMode):
    """Counts the aten operations dispatched (each a kernel launch on a GPU, eager)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _step_fns(cfg, B: int, L: int):
    """cfg's training step as the loop runs it, on a batch of B sequences of length L on CPU, in
    its two parts: (forward+backward, optimizer step), and the model, schedule and task."""
    torch.manual_seed(cfg.seed)
    task = make_task(cfg)
    _, _, schedule = prepare(cfg, task)
    model = build_model(cfg, task.vocab_size)
    opts = make_optimizers(model, cfg)
    g = torch.Generator().manual_seed(0)

    def fwd_bwd(i: int = 0):
        batch = task.sample(B, g, length=L)
        res = run_schedule(model, batch.inputs, _masked_targets(batch), schedule)
        res.loss.backward()
        res.loss.item()
        return res.measured.cost  # forwards per token this step ran (FixedPoint: its sweeps)

    def opt(i: int = 0):
        set_lr_schedule(opts, i, cfg.steps, cfg.warmdown_frac)
        optimizer_step(opts, model.parameters(), cfg.grad_clip)

    return fwd_bwd, opt, model, schedule, task


def _time(fn, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t) / n


def measure(cfg, B: int, L: int, repeats: int) -> dict:
    """CPU figures of one run: steps/s at (B, L); at (1, 4) the forward+backward time and aten ops
    (host-bound: what one op costs this host) and the optimizer's ops and FLOPs (the same at any
    batch); the ops of one decoding step; the model's FLOPs per step at the spec's full shape."""
    from torch.utils.flop_counter import FlopCounterMode

    fwd_bwd, opt, model, schedule, task = _step_fns(cfg, B, L)
    fwd_bwd(0), opt(0)  # warm-up
    per_step = _time(lambda i: (fwd_bwd(i), opt(i)), repeats)
    tiny_fb, tiny_opt, *_ = _step_fns(cfg, 1, 4)
    tiny_fb(0), tiny_opt(0)
    tiny = _time(tiny_fb, repeats)
    with OpCount() as fb_ops:
        ran = tiny_fb(0)
    with OpCount() as opt_ops, FlopCounterMode(display=False) as opt_flops:
        tiny_opt(0)
    model.eval()
    with torch.inference_mode():
        dec = Decoder(model, 1, 8)
        dec.prefill(task.sample(1, torch.Generator().manual_seed(1), length=4).inputs)
        with OpCount() as dec_ops:
            dec.step(torch.zeros(1, dtype=torch.long))
    T = cfg.length
    most = sum(schedule.forwards(model, T))
    return {
        "run": cfg.run_name,
        "cpu_batch": B,
        "cpu_length": L,
        "cpu_step_s": per_step,
        "cpu_steps_per_s": 1 / per_step,
        "cpu_tiny_fwd_bwd_s": tiny,
        # a schedule that stops early (FixedPoint) ran `ran` of at most `most` forwards per token
        # here: its ops scaled to the most it may run
        "ops_fwd_bwd": round(fb_ops.n * max(1.0, most / ran)),
        "ops_fwd_bwd_measured": fb_ops.n,
        "forwards_ran": ran,
        "ops_optimizer": opt_ops.n,
        "optimizer_flops": opt_flops.get_total_flops(),
        "ops_per_decode_step": dec_ops.n,
        "forwards_per_token": list(schedule.forwards(model, T)),
        "flops_per_step_full_shape": fl.train_flops_per_token(model, schedule, T)
        * cfg.batch_size
        * T,
    }


def predict(m: dict, cfg, op_s: float | None = None) -> dict:
    """A GPU step and a GPU evaluation from the CPU figures (see the module docstring); op_s: the
    host cost of one op (default: this CPU's, measured, at least GPU_OP_S)."""
    if op_s is None:
        op_s = max(GPU_OP_S, m["cpu_tiny_fwd_bwd_s"] / m["ops_fwd_bwd_measured"])
    ops = m["ops_fwd_bwd"] + m["ops_optimizer"]
    step = ops * op_s + (m["flops_per_step_full_shape"] + m["optimizer_flops"]) / GPU_FLOPS
    # an evaluation: exact decoding steps over every evaluation length (batched over the sequences),
    # the parallel forward's cost is a few steps' worth and is left in the margin
    decode_steps = sum(cfg.eval_lengths)
    evaluation = decode_steps * m["ops_per_decode_step"] * op_s
    return {"gpu_op_s": op_s, "gpu_step_s": step, "gpu_eval_s": evaluation}


def steps_that_fit(preds: list[dict], cfgs: list, seconds: float) -> int:
    """The most steps (a multiple of 100) every run can train, with an evaluation every quarter
    and at the end, within `seconds` for all of them together."""
    fixed = sum(GPU_RUN_START_S + 5 * p["gpu_eval_s"] for p in preds)  # 4 evaluations + final
    per_step = sum(p["gpu_step_s"] for p in preds)
    return max(100, int((seconds - fixed) / per_step) // 100 * 100)


def run_predict(cfgs: list, B: int, L: int, repeats: int, seconds: float, out: Path | None):
    figures = []
    idle = []
    for cfg in cfgs:
        m = measure(cfg, B, L, repeats)
        m.update(predict(m, cfg))
        figures.append(m)
        idle.append(predict(m, cfg, GPU_OP_S))
        m["idle_host"] = idle[-1]
        print(
            f"{cfg.run_name}: CPU {m['cpu_steps_per_s']:.2f} steps/s at batch {B} x length {L} "
            f"(forward+backward {m['cpu_tiny_fwd_bwd_s'] * 1e3:.1f} ms at 1 x 4: "
            f"{m['ops_fwd_bwd']} ops, {m['gpu_op_s'] * 1e6:.0f} us each; optimizer "
            f"{m['ops_optimizer']} ops), "
            f"{m['flops_per_step_full_shape'] / 1e9:.1f} GFLOP per step at "
            f"{cfg.batch_size} x {cfg.length}; GPU: {m['gpu_step_s'] * 1e3:.1f} ms per step, "
            f"{m['gpu_eval_s']:.1f} s per evaluation",
            flush=True,
        )

    def total(preds, n):
        return sum(GPU_RUN_START_S + 5 * p["gpu_eval_s"] + n * p["gpu_step_s"] for p in preds)

    steps = steps_that_fit(figures, cfgs, seconds)
    steps_idle = steps_that_fit(idle, cfgs, seconds)
    print(
        f"steps that fit {seconds:.0f} s of GPU for the {len(cfgs)} runs, eager: {steps} at this "
        f"host's cost per op (predicted {total(figures, steps):.0f} s), {steps_idle} on an idle "
        f"host at {GPU_OP_S * 1e6:.0f} us per op (predicted {total(idle, steps_idle):.0f} s)",
        flush=True,
    )
    result = {
        "gpu_op_s_floor": GPU_OP_S,
        "gpu_flops": GPU_FLOPS,
        "gpu_run_start_s": GPU_RUN_START_S,
        "seconds": seconds,
        "steps_that_fit": steps,
        "predicted_total_s": total(figures, steps),
        "steps_that_fit_idle_host": steps_idle,
        "predicted_total_s_idle_host": total(idle, steps_idle),
        "torch_threads": torch.get_num_threads(),
        "runs": figures,
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "a5_paper_1gpu_prediction.json").write_text(json.dumps(result, indent=1))
    return result


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--out", default=None, help="run store (default: the spec's sweep.out)")
    ap.add_argument("--device", default=None, help="cuda, cpu or auto (default: the spec's)")
    ap.add_argument(
        "--time-limit",
        type=float,
        default=420.0,
        help="seconds of training for all runs; the run in progress is checkpointed",
    )
    ap.add_argument("--dry-run", action="store_true", help="CPU, toy steps and lengths")
    ap.add_argument("--predict", action="store_true", help="measure on CPU, predict the GPU time")
    ap.add_argument("--predict-batch", type=int, default=16)
    ap.add_argument("--predict-length", type=int, default=16)
    ap.add_argument("--predict-repeats", type=int, default=3)
    ap.add_argument("--gpu-seconds", type=float, default=300.0)
    ap.add_argument("--quiet", action="store_true")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    spec_path = Path(args.spec)
    out = Path(args.out or load_spec(spec_path)["sweep"].get("out", "runs"))
    if not out.is_absolute():
        out = Path.cwd() / out
    cfgs = configs(spec_path, args.device)
    if args.predict:
        run_predict(
            [dataclasses.replace(c, device="cpu") for c in cfgs],
            args.predict_batch,
            args.predict_length,
            args.predict_repeats,
            args.gpu_seconds,
            Path(args.out) if args.out else None,
        )
        return 0
    if args.dry_run:
        cfgs = dry_configs(cfgs)
    run_all(cfgs, out, args.time_limit, progress=not args.quiet)
    result = write_table(cfgs, out)
    print(markdown(result))
    return 0 if all(r.get("complete") for r in result["rows"]) else 3


if __name__ == "__main__":
    sys.exit(main())
