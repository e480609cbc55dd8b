"""`lrt-lab bench`: the LRT's cost next to the plain transformer's, in one process and one run.

The paper's efficiency claim (app. "Measured Efficiency and Parallel Prefill") is that latent
recurrence is cheap: about 2x token compute for interleaved S=2 training, one forward per
generated token, baseline-cost one-pass prefill. This module measures exactly those ratios:

- training step (forward + backward + optimizer: Muon for the hidden matrices, AdamW for the rest,
  as in paper app. A) for OnePass (the plain transformer), Interleaved(2), Interleaved(4),
  FullSequence(1), FullSequence(3), Chunked(64), Exact, FixedPoint(1e-2, 8, 1) (with the sweeps
  it used per step: they depend on the weights, which the optimizer changes between repeats) and
  Rollout(1), Rollout(2) (with the rollout's share of the step), and any schedule the caller adds
  (`run_bench(schedules=[...])`, `--schedules SPEC[,SPEC...]`: a registered spelling, one
  registered outside the package too, or a schedule object), keyed by its spec;
- prefill of a prompt (default 1,024 tokens) with OnePass / Interleaved(2) / Exact;
- decoding tokens/s at batch 1 and a larger batch;
- peak memory on CUDA.

Method: warm-up, then several repeats of every case *round-robin* (so slow drift of the machine hits
every case alike), median; the device is synchronised around each timing (CUDA events on CUDA,
`perf_counter` on CPU). The transformer is the same preset with `memory=None`; the LRT uses
`MemoryConfig()` (the paper's LRT-shared). Ratios are LRT time / transformer time, except decoding
throughput, which is LRT tokens/s / transformer tokens/s. Exact runs one stage per position, so its
repeats are capped (`exact_repeats`); it is measured at `exact_seq_len` (default min(T, 256))
against a transformer step at the same length; so is every added schedule whose `exact` is true.

Benchmarks are not assertions: the test suite only checks that this runs and writes valid JSON.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from lrt_lab.commands.bench_args import (  # noqa: F401 - the bench's names, read from here too
    BENCH_PRESETS,
    BenchPreset,
    add_arguments,
    parse,
)
from lrt_lab.core.config import PRESETS, MemoryConfig
from lrt_lab.core.config import fail as _fail
from lrt_lab.core.config import preset as model_preset
from lrt_lab.core.interface import Schedule
from lrt_lab.core.model import LRT
from lrt_lab.core.plugins import load_plugins
from lrt_lab.run.decode import Decoder
from lrt_lab.run.registry import as_schedule, split_spellings
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import (
    Chunked,
    Exact,
    FixedPoint,
    FullSequence,
    Interleaved,
    OnePass,
    Rollout,
)
from lrt_lab.store.markdown import markdown_lines
from lrt_lab.store.results import respect_umask
from lrt_lab.training.optim import ROLES, build_optimizers, optimizer_step

TRAIN_CASES = {  # JSON key -> schedule (the transformer runs OnePass)
    "interleaved_2": Interleaved(2),
    "interleaved_4": Interleaved(4),
    "fullseq_1": FullSequence(1),
    "fullseq_3": FullSequence(3),
    "chunked_64": Chunked(64),
    "exact": Exact(),
    "fixedpoint": FixedPoint(1e-2, 8, 1),
    "rollout_1": Rollout(1),
    "rollout_2": Rollout(2),
}
PREFILL_CASES = {"onepass": OnePass(), "interleaved_2": Interleaved(2), "exact": Exact()}


# Validation
# ----------------------------------------------------------------------------------------
def _resolve_device(device) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            _fail("device", device, "cpu (CUDA is not available)")
        return device
    if device != "cpu":
        _fail(
            "device",
            device,
            "auto, cpu" + (", cuda" if torch.cuda.is_available() else " (CUDA is not available)"),
        )
    return device


def _int_or_default(name, value, default, low):
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        _fail(name, value, f"an integer >= {low}")
    return value


# Timing
# --------------------------------------------------------------------------------------------
class _Timer:
    """Seconds one call takes, with the device synchronised before and after (CUDA: events).

    The timed function receives `mark`: calling it splits the time there (training steps mark
    the end of the backward pass, so the optimizer's share is reported separately)."""

    def __init__(self, device: str, clock: str = "wall"):
        self.cuda = device == "cuda"
        # "process": CPU seconds of this process. On a shared machine, with --threads 1, it is
        # what the run would take on an idle core (time spent descheduled is not counted).
        self.now = time.process_time if clock == "process" else time.perf_counter

    def __call__(self, fn) -> list[float]:
        """[total, first segment, second segment, ...] in seconds."""
        if self.cuda:
            torch.cuda.synchronize()
            events = [torch.cuda.Event(enable_timing=True)]
            events[0].record()

            def mark():
                events.append(torch.cuda.Event(enable_timing=True))
                events[-1].record()

            fn(mark)
            mark()
            events[-1].synchronize()
            stamps = [events[0].elapsed_time(e) / 1000.0 for e in events]
        else:
            t0 = self.now()
            stamps = [0.0]

            def mark():
                stamps.append(self.now() - t0)

            fn(mark)
            mark()
        return [stamps[-1]] + [b - a for a, b in zip(stamps, stamps[1:])]


@dataclass
class _Case:
    name: str
    fn: object  # () -> None, or a (setup, timed) pair for decoding
    warmup: int
    repeats: int
    setup: object = None  # run untimed before each call (decoding: a fresh prefilled decoder)
    times: list = dataclasses.field(default_factory=list)  # seconds per repeat
    segments: list = dataclasses.field(default_factory=list)  # per repeat: seconds between marks
    peak_mib: float | None = None


def _run_cases(cases: list[_Case], timer: _Timer, device: str, log) -> None:
    """Warm every case up, then run repeats round-robin, so drift of the machine hits all alike.

    case.fn(mark) or, with a setup, case.fn(state, mark): `mark()` splits the timing."""

    def call(case, arg, mark):
        return case.fn(arg, mark) if case.setup else case.fn(mark)

    for case in cases:
        for _ in range(case.warmup):
            arg = case.setup() if case.setup else None
            call(case, arg, lambda: None)
    rounds = max(c.repeats for c in cases)
    for r in range(rounds):
        for case in cases:
            if r >= case.repeats:
                continue
            arg = case.setup() if case.setup else None
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            total, *segments = timer(lambda mark: call(case, arg, mark))  # noqa: B023 (called here)
            case.times.append(total)
            case.segments.append(segments)
            if device == "cuda":
                peak = torch.cuda.max_memory_allocated() / 2**20
                case.peak_mib = max(case.peak_mib or 0.0, peak)
        log(f"  round {r + 1}/{rounds} done")


# The benchmark
# -------------------------------------------------------------------------------------
def _build(
    name: str, memory, seq_len: int, device: str, seed: int, compile_: bool
) -> tuple[LRT, LRT]:
    """(training model, inference model). On CUDA the inference copy holds bf16 weights (the
    usual serving setup: a bf16 KV cache, no autocast casts per step); elsewhere it is the same
    model."""
    torch.manual_seed(seed)
    model = LRT(model_preset(name, memory=memory, sequence_len=seq_len)).to(device)
    infer = copy.deepcopy(model).to(torch.bfloat16) if device == "cuda" else model
    if compile_:
        # Compiles the stage primitive; strided and chunk stages recompile per position set, and
        # torch.compile's first step is slow (tens of seconds on CPU, docs/design.md), so this is
        # opt-in.
        model.stage = torch.compile(model.stage, dynamic=False)
        if infer is not model:
            infer.stage = torch.compile(infer.stage, dynamic=False)
    return model, infer


def _optimizers(model: LRT, device: str) -> list:
    """Paper app. A: Muon for the 2-D hidden matrices (W_rec and gates included), AdamW for the
    rest."""
    lrs = {"matrix": 0.02, **{role: 3e-4 for role in ROLES if role != "matrix"}}
    return build_optimizers(model, lrs, fused=device == "cuda" or None)


def _autocast(device: str):
    if device == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _train_step_fn(model, opts, idx, targets, schedule, device, measured: list | None = None):
    """One training step; what the schedule measured beyond its cost (`Measured.record` of the
    forward + backward time: FixedPoint's sweeps, Rollout's rollout share) is appended to
    `measured`."""

    def step(mark):
        start = time.perf_counter()
        with _autocast(device):
            out = run_schedule(model, idx, targets, schedule)
        out.loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        mark()  # forward + backward | optimizer
        optimizer_step(opts, model.parameters())
        if measured is not None:
            measured.append(out.measured.record(wall))

    return step


def _measured_field(
    measured: dict[str, list[dict]], name: str, schedules: dict[str, Schedule]
) -> dict:
    """{case: {spec, median, samples}} of one field the schedules measured, for the cases whose
    steps measured it."""
    out = {}
    for key, records in measured.items():
        samples = [r[name] for r in records if name in r]
        if samples:
            out[key] = {
                "spec": schedules[key].spec,
                "median": statistics.median(samples),
                "samples": samples,
            }
    return out


def _prefill_case(name, model, prompt, schedule, device, warmup, repeats):
    B, n = prompt.shape

    def setup():
        return Decoder(model, B, n)

    @torch.no_grad()
    def fn(decoder, mark):
        decoder.prefill(prompt, schedule)

    return _Case(name, fn, warmup, repeats, setup=setup)


def _decode_case(name, model, prompt, steps, device, warmup, repeats, vocab):
    B, n = prompt.shape
    g = torch.Generator(device="cpu").manual_seed(1)
    feed = torch.randint(0, vocab, (steps, B), generator=g).to(device)

    @torch.no_grad()
    def setup():
        decoder = Decoder(model, B, n + steps)
        decoder.prefill(prompt)  # untimed: the decode measurement starts from a full context
        return decoder

    @torch.no_grad()
    def fn(decoder, mark):
        for i in range(steps):
            # fixed, valid tokens: neither sampling nor input checks are measured
            decoder.step(feed[i], check_values=False)

    return _Case(name, fn, warmup, repeats, setup=setup)


# Settings
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchSettings:
    """Everything one benchmark run uses, checked: `run_bench` builds it from its arguments, the
    unset ones taken from the bench preset."""

    device: str  # "cpu" or "cuda" ("auto" resolved)
    preset: str  # the bench preset's name
    bench_preset: BenchPreset
    seq_len: int  # training length T
    batch_size: int  # training batch B
    prompt_len: int
    decode_batch: int  # the larger decode batch (batch 1 is always run)
    decode_steps: int
    repeats: int
    warmup: int
    exact_repeats: int  # <= repeats: for schedules that run one position per stage
    exact_warmup: int
    exact_seq_len: int  # <= seq_len: the length those schedules train at
    compile: bool
    seed: int
    clock: str  # "wall" or "process"
    train_cases: tuple[tuple[str, Schedule], ...]  # (JSON key, the LRT's schedule), in timing order

    def repeats_of(self, schedule: Schedule) -> tuple[int, int]:
        """(warm-up, repeats) of a case: capped where the schedule runs one position per stage."""
        if schedule.exact:
            return self.exact_warmup, self.exact_repeats
        return self.warmup, self.repeats


def run_bench(
    device: str = "cpu",
    preset: str = "small",
    *,
    seq_len: int | None = None,
    batch_size: int | None = None,
    prompt_len: int | None = None,
    decode_batch: int | None = None,
    decode_steps: int | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    exact_repeats: int | None = None,
    exact_seq_len: int | None = None,
    compile: bool = False,
    seed: int = 0,
    threads: int | None = None,
    clock: str = "wall",
    schedules=(),
    json_path: str | os.PathLike | None = None,
    verbose: bool = False,
    out=None,
) -> dict:
    """Run the benchmark; returns the result dict (also written to json_path when given).

    schedules: more LRT training cases after TRAIN_CASES, each a registered spelling
    ("interleaved:3", one registered outside the package too) or a schedule object, keyed by its
    spec in train_ratio and the rest of the result.
    out: a text stream for the table (default: none printed; `run` prints to stdout).
    """
    settings = _settings(
        device,
        preset,
        seq_len=seq_len,
        batch_size=batch_size,
        prompt_len=prompt_len,
        decode_batch=decode_batch,
        decode_steps=decode_steps,
        repeats=repeats,
        warmup=warmup,
        exact_repeats=exact_repeats,
        exact_seq_len=exact_seq_len,
        compile=compile,
        seed=seed,
        clock=clock,
        schedules=schedules,
    )
    threads = _int_or_default("threads", threads, None, 1)
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if verbose else (lambda msg: None)
    saved_threads = torch.get_num_threads()
    if threads is not None:
        # CPU: on a busy machine, fewer intra-op threads than cores avoids OpenMP oversubscription
        torch.set_num_threads(threads)
    try:
        result = _bench(settings, log)
    finally:
        torch.set_num_threads(saved_threads)
    if out is not None:
        print(format_table(result), file=out)
    if json_path is not None:
        _write_json(result, json_path)
    return result


def _settings(
    device,
    preset,
    *,
    seq_len,
    batch_size,
    prompt_len,
    decode_batch,
    decode_steps,
    repeats,
    warmup,
    exact_repeats,
    exact_seq_len,
    compile,
    seed,
    clock,
    schedules,
) -> BenchSettings:
    """run_bench's arguments, each checked (ValueError naming the field), the unset ones from the
    bench preset."""
    device = _resolve_device(device)
    if preset is None:
        preset = "cpu" if device == "cpu" else "d12"
    if preset not in BENCH_PRESETS:
        _fail("preset", preset, ", ".join(BENCH_PRESETS))
    bp = BENCH_PRESETS[preset]
    T = _int_or_default("seq_len", seq_len, bp.seq_len, 4)  # Interleaved(4) needs T >= 4
    shapes = dict(
        batch_size=_int_or_default("batch_size", batch_size, bp.batch_size, 1),
        prompt_len=_int_or_default("prompt_len", prompt_len, bp.prompt_len, 2),
        decode_batch=_int_or_default("decode_batch", decode_batch, bp.decode_batch, 1),
        decode_steps=_int_or_default("decode_steps", decode_steps, bp.decode_steps, 1),
    )
    reps = _int_or_default("repeats", repeats, bp.repeats, 1)
    warm = _int_or_default("warmup", warmup, bp.warmup, 0)
    exact_reps = min(reps, _int_or_default("exact_repeats", exact_repeats, bp.exact_repeats, 1))
    exact_T = _int_or_default("exact_seq_len", exact_seq_len, min(T, bp.exact_seq_len), 1)
    if exact_T > T:
        _fail("exact_seq_len", exact_T, f"an integer in [1, seq_len={T}]")
    if compile not in (True, False):
        _fail("compile", compile, "True or False")
    if clock not in ("wall", "process") or (clock == "process" and device == "cuda"):
        _fail("clock", clock, "wall, or process (CPU only)")
    return BenchSettings(
        device,
        preset,
        bp,
        T,
        **shapes,
        repeats=reps,
        warmup=warm,
        exact_repeats=exact_reps,
        exact_warmup=min(warm, 1),
        exact_seq_len=exact_T,
        compile=compile,
        seed=seed,
        clock=clock,
        train_cases=_train_cases(schedules, T, exact_T),
    )


def _train_cases(schedules, T: int, exact_T: int) -> tuple[tuple[str, Schedule], ...]:
    """TRAIN_CASES, then each added schedule (a spelling or a schedule object) keyed by its spec;
    each checked to run at the length it will train at, so a mistake stops the run before any
    timing."""
    if isinstance(schedules, str) or hasattr(schedules, "spec"):
        schedules = [schedules]  # one spelling or one schedule
    cases = dict(TRAIN_CASES)
    taken = {"transformer", "transformer_exact_T", *cases, *(s.spec for s in cases.values())}
    for given in schedules or ():
        schedule = as_schedule(given)
        key = schedule.spec
        if key in taken:
            _fail(
                "schedules",
                key,
                "a schedule not timed already: none of the default cases ("
                + ", ".join(s.spec for s in TRAIN_CASES.values())
                + "), none added twice",
            )
        n = exact_T if schedule.exact else T
        try:
            schedule.stages(n)
        except ValueError as e:
            _fail("schedules", key, f"a schedule that runs at T={n} ({e})")
        taken.add(key)
        cases[key] = schedule
    return tuple(cases.items())


# The run
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Inputs:
    """The tokens every case reads, drawn once from the seed."""

    vocab: int
    idx: torch.Tensor  # (B, T) training inputs
    targets: torch.Tensor
    exact_idx: torch.Tensor  # their first exact_seq_len positions
    exact_targets: torch.Tensor
    prompt: torch.Tensor  # (prefill_batch, prompt_len)
    decode_prompts: dict  # decode batch -> (batch, prompt_len)


@dataclass(frozen=True)
class _Models:
    """The transformer and the LRT: each a training model, its optimizers and an inference copy."""

    plain: LRT
    plain_infer: LRT
    plain_opts: list
    lrt: LRT
    lrt_infer: LRT
    lrt_opts: list


def _inputs(s: BenchSettings) -> _Inputs:
    vocab = PRESETS[s.bench_preset.model]["vocab_size"]
    gen = torch.Generator(device="cpu").manual_seed(s.seed)

    def tokens(*shape):
        return torch.randint(0, vocab, shape, generator=gen).to(s.device)

    idx = tokens(s.batch_size, s.seq_len + 1)
    idx, targets = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    n = s.exact_seq_len
    return _Inputs(
        vocab,
        idx,
        targets,
        idx[:, :n].contiguous(),
        targets[:, :n].contiguous(),
        tokens(s.bench_preset.prefill_batch, s.prompt_len),
        {b: tokens(b, s.prompt_len) for b in (1, s.decode_batch)},
    )


def _models(s: BenchSettings) -> _Models:
    plain, plain_infer = _build(s.bench_preset.model, None, s.seq_len, s.device, s.seed, s.compile)
    lrt, lrt_infer = _build(
        s.bench_preset.model, MemoryConfig(), s.seq_len, s.device, s.seed, s.compile
    )
    return _Models(
        plain, plain_infer, _optimizers(plain, s.device), lrt, lrt_infer, _optimizers(lrt, s.device)
    )


def _training_cases(
    s: BenchSettings, inputs: _Inputs, m: _Models, measured: dict[str, list[dict]]
) -> list[_Case]:
    """The transformer's step (OnePass; again at exact_seq_len when that is shorter), then the
    LRT's for each training case; what each LRT step measured beyond its cost goes to
    measured[key]."""

    def step(model, opts, schedule, at_exact_len, used=None):
        idx, targets = (
            (inputs.exact_idx, inputs.exact_targets)
            if at_exact_len
            else (inputs.idx, inputs.targets)
        )
        return _train_step_fn(model, opts, idx, targets, schedule, s.device, used)

    cases = [
        _Case("transformer", step(m.plain, m.plain_opts, OnePass(), False), s.warmup, s.repeats)
    ]
    if s.exact_seq_len != s.seq_len:
        cases.append(
            _Case(
                "transformer_exact_T",
                step(m.plain, m.plain_opts, OnePass(), True),
                s.warmup,
                s.repeats,
            )
        )
    for key, schedule in s.train_cases:
        fn = step(m.lrt, m.lrt_opts, schedule, schedule.exact, measured.setdefault(key, []))
        cases.append(_Case(key, fn, *s.repeats_of(schedule)))
    return cases


def _prefill_cases(s: BenchSettings, inputs: _Inputs, m: _Models) -> list[_Case]:
    """The transformer's OnePass prefill, then the LRT's with each of PREFILL_CASES (inference
    copies: no autograd)."""
    cases = [
        _prefill_case(
            "transformer", m.plain_infer, inputs.prompt, OnePass(), s.device, s.warmup, s.repeats
        )
    ]
    for key, schedule in PREFILL_CASES.items():
        cases.append(
            _prefill_case(
                key, m.lrt_infer, inputs.prompt, schedule, s.device, *s.repeats_of(schedule)
            )
        )
    return cases


def _decode_cases(s: BenchSettings, inputs: _Inputs, m: _Models) -> list[_Case]:
    """Decoding at batch 1 and the larger batch, transformer then LRT (named `lrt_batch_8`)."""
    return [
        _decode_case(
            f"{who}_batch_{b}",
            model,
            inputs.decode_prompts[b],
            s.decode_steps,
            s.device,
            s.warmup,
            s.repeats,
            inputs.vocab,
        )
        for b in dict.fromkeys((1, s.decode_batch))
        for who, model in (("transformer", m.plain_infer), ("lrt", m.lrt_infer))
    ]


def _bench(s: BenchSettings, log) -> dict:
    """Time the training, prefill and decode cases, each group round-robin; the result dict."""
    inputs, models = _inputs(s), _models(s)
    timer = _Timer(s.device, s.clock)
    t_start = time.perf_counter()
    measured: dict[str, list[dict]] = {}  # per case, what each step measured beyond its cost
    train = _training_cases(s, inputs, models, measured)
    log("training ...")
    _run_cases(train, timer, s.device, log)
    prefill = _prefill_cases(s, inputs, models)
    log("prefill ...")
    _run_cases(prefill, timer, s.device, log)
    decode = _decode_cases(s, inputs, models)
    log("decode ...")
    _run_cases(decode, timer, s.device, log)
    return _result(s, train, prefill, decode, measured, time.perf_counter() - t_start)


# The result
# ----------------------------------------------------------------------------------------
def _medians(cases: list[_Case], segment: int | None = None) -> dict[str, float]:
    """Median seconds per case: of the whole call, or of one segment between its marks."""
    if segment is None:
        return {c.name: statistics.median(c.times) for c in cases}
    return {c.name: statistics.median(seg[segment] for seg in c.segments) for c in cases}


def _ms(seconds: dict[str, float]) -> dict[str, float]:
    return {k: 1000 * v for k, v in seconds.items()}


def _train_ratios(s: BenchSettings, seconds: dict[str, float]) -> dict[str, float]:
    """LRT / transformer per training case; a case at
    exact_seq_len against the transformer there."""
    base = seconds["transformer"]
    exact_base = seconds.get("transformer_exact_T", base)
    return {
        key: seconds[key] / (exact_base if schedule.exact else base)
        for key, schedule in s.train_cases
    }


def _decode_tokens_per_s(s: BenchSettings, decode: list[_Case]) -> dict[str, float]:
    """{transformer,lrt}_{batch_1,batch_N}: tokens per second of each decode case."""
    tps = {c.name: _batch_of(c.name) * s.decode_steps / statistics.median(c.times) for c in decode}
    return {
        f"{who}_{key}": tps[f"{who}_batch_{b}"]
        for who in ("transformer", "lrt")
        for key, b in (("batch_1", 1), ("batch_N", s.decode_batch))
    }


def _result(
    s: BenchSettings,
    train: list[_Case],
    prefill: list[_Case],
    decode: list[_Case],
    measured: dict[str, list[dict]],
    elapsed: float,
) -> dict:
    """The JSON layout: ratios, absolute figures, what the schedules measured, settings, samples."""
    step, fwd_bwd, pre = _medians(train), _medians(train, 0), _medians(prefill)
    tokens_per_s = _decode_tokens_per_s(s, decode)
    absolute = {
        "train_step_ms": _ms(step),
        "train_fwd_bwd_ms": _ms(fwd_bwd),
        "optimizer_ms": _ms(_medians(train, 1)),
        "prefill_ms": _ms(pre),
        "decode_tokens_per_s": tokens_per_s,
    }
    if s.device == "cuda":
        absolute["peak_memory_mib"] = {
            f"{group}_{c.name}": c.peak_mib
            for group, cases in (("train", train), ("prefill", prefill))
            for c in cases
        }
    schedules = dict(s.train_cases)
    return {
        "device": s.device,
        "preset": s.preset,
        "train_ratio": _train_ratios(s, step),
        # without the optimizer (same work for both models)
        "train_ratio_fwd_bwd": _train_ratios(s, fwd_bwd),
        "prefill_ratio": {k: pre[k] / pre["transformer"] for k in PREFILL_CASES},
        "decode_throughput_ratio": {
            key: tokens_per_s[f"lrt_{key}"] / tokens_per_s[f"transformer_{key}"]
            for key in ("batch_1", "batch_N")
        },
        "absolute": absolute,
        # FixedPoint: its spec and the sweeps used in every step run (warm-up included)
        "sweeps_used": _measured_field(measured, "sweeps", schedules),
        # Rollout: the fraction of the forward + backward wall time spent rolling the memory out
        "rollout_share": _measured_field(measured, "rollout_share", schedules),
        "settings": _settings_record(s),
        "samples_ms": {
            f"{group}.{c.name}": [1000 * t for t in c.times]
            for group, cases in (("train", train), ("prefill", prefill), ("decode", decode))
            for c in cases
        },
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": _machine(s.device),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
        },
        "elapsed_s": elapsed,
    }


def _settings_record(s: BenchSettings) -> dict:
    """The settings as the JSON records them; with schedules added, how each of those ran."""
    bp = s.bench_preset
    record = {
        "model_preset": bp.model,
        "seq_len": s.seq_len,
        "batch_size": s.batch_size,
        "prompt_len": s.prompt_len,
        "prefill_batch": bp.prefill_batch,
        "decode_batch_N": s.decode_batch,
        "decode_steps": s.decode_steps,
        "repeats": s.repeats,
        "warmup": s.warmup,
        "exact_repeats": s.exact_repeats,
        "exact_warmup": s.exact_warmup,
        "exact_seq_len": s.exact_seq_len,
        "compile": s.compile,
        "seed": s.seed,
        "clock": s.clock,
        "dtype": (
            "training: fp32 weights + bf16 autocast; inference: bf16 weights"
            if s.device == "cuda"
            else "float32"
        ),
        "optimizer": "Muon (matrices) + AdamW (embeddings, head, scalars)",
    }
    added = {
        key: (s.exact_seq_len if schedule.exact else s.seq_len, *s.repeats_of(schedule))
        for key, schedule in s.train_cases
        if key not in TRAIN_CASES
    }
    if added:
        record["schedules"] = {
            key: {"seq_len": n, "warmup": warm, "repeats": reps}
            for key, (n, warm, reps) in added.items()
        }
    return record


def _batch_of(name: str) -> int:
    """The batch a decode case name encodes (`lrt_batch_8` -> 8)."""
    return int(name.rsplit("_", 1)[1])


def _machine(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _write_json(result: dict, path) -> None:
    """Atomic write (write a temporary file, then rename), like the run store."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".bench-", suffix=".json")
    respect_umask(tmp)  # not mkstemp's 0600: readable as a plain open's file would be
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=2, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


_LABEL_WIDTH = 30  # the table's first column


def format_table(result: dict) -> str:
    s, a = result["settings"], result["absolute"]
    lines = [
        f"lrt-lab bench: device={result['device']} ({result['environment']['machine']}), "
        f"preset={result['preset']} (model {s['model_preset']}), {s['dtype']}, "
        f"median of {s['repeats']} (Exact: {s['exact_repeats']}), {s['clock']} clock, "
        f"{result['environment']['threads']} thread(s), torch {result['environment']['torch']}"
    ]
    w = _LABEL_WIDTH

    def row(label, value, unit, ratio, target=""):
        r = f"{ratio:6.2f}x" if ratio is not None else "      -"
        return f"  {label:<{w}} {value:>10.1f} {unit:<5} {r}  {target}"

    lines += _train_rows(result)
    lines.append(f"prefill ({s['prompt_len']}-token prompt, B={s['prefill_batch']})")
    pm = a["prefill_ms"]
    lines.append(row("transformer (OnePass)", pm["transformer"], "ms", 1.0))
    for k in PREFILL_CASES:
        lines.append(
            row(
                k,
                pm[k],
                "ms",
                result["prefill_ratio"][k],
                "(paper 1.00x, aim <= 1.02x)" if k == "onepass" else "",
            )
        )
    lines.append(
        f"decoding ({s['decode_steps']} tokens after a {s['prompt_len']}-token prompt)"
        "          tok/s LRT/transformer"
    )
    dt = a["decode_tokens_per_s"]
    for b, key in ((1, "batch_1"), (s["decode_batch_N"], "batch_N")):
        lines.append(row(f"transformer, batch {b}", dt[f"transformer_{key}"], "tok/s", 1.0))
        lines.append(
            row(
                f"LRT, batch {b}",
                dt[f"lrt_{key}"],
                "tok/s",
                result["decode_throughput_ratio"][key],
                "(paper 0.92x, aim >= 0.97x)",
            )
        )
    if "peak_memory_mib" in a:
        lines.append(
            "peak memory (MiB): "
            + ", ".join(f"{k} {v:.0f}" for k, v in a["peak_memory_mib"].items())
        )
    lines.append(f"({result['elapsed_s']:.1f} s)")
    return "\n".join(lines)


def _train_rows(result: dict) -> list[str]:
    """The training step's lines of the table: the transformer, then every case of train_ratio
    (the default ones, then the added ones), with what the dynamic schedules measured."""
    s, a = result["settings"], result["absolute"]
    tm, fb, op = a["train_step_ms"], a["train_fwd_bwd_ms"], a["optimizer_ms"]
    targets = {"interleaved_2": "(paper 2.96x, aim <= 2.2x)", "fullseq_1": "(aim <= 2.2x)"}

    def train_row(label, k, ratio, ratio_fb, note=""):
        r = f"{ratio:6.2f}x" if ratio is not None else "      -"
        rf = f"{ratio_fb:6.2f}x" if ratio_fb is not None else "      -"
        times = f"{tm[k]:>9.1f} {r} {fb[k]:>10.1f} {rf} {op[k]:>10.1f}"
        return f"  {label:<{_LABEL_WIDTH}} {times}  {note}"

    lines = [
        f"training step (T={s['seq_len']}, B={s['batch_size']})     step ms   ratio   "
        "fwd+bwd ms   ratio   optimizer ms",
        train_row("transformer (OnePass)", "transformer", 1.0, 1.0),
    ]
    used = result.get("sweeps_used", {})
    for k in result["train_ratio"]:
        n = _case_seq_len(result, k)
        label = f"{k} (T={n})" if k == "exact" or n != s["seq_len"] else k
        note = targets.get(k, "")
        if k in used:
            label = used[k]["spec"]
            samples = used[k]["samples"]
            note = f"(sweeps used: median {used[k]['median']:g}, {min(samples)}-{max(samples)})"
        if k in result.get("rollout_share", {}):
            share = result["rollout_share"][k]
            label = share["spec"]
            note = f"(rollout: {100 * share['median']:.0f}% of fwd+bwd wall time)"
        lines.append(
            train_row(label, k, result["train_ratio"][k], result["train_ratio_fwd_bwd"][k], note)
        )
    if "transformer_exact_T" in tm:
        lines.append(
            train_row(f"transformer (T={s['exact_seq_len']})", "transformer_exact_T", None, None)
        )
    return lines


def _case_seq_len(result: dict, key: str) -> int:
    """The length a training case ran at: exact_seq_len for Exact and for an added schedule that
    runs one position per stage, else seq_len."""
    s = result["settings"]
    if key == "exact":
        return s["exact_seq_len"]
    return s.get("schedules", {}).get(key, {}).get("seq_len", s["seq_len"])


# The committed results as a markdown table (docs/performance.md) ---------------------------------
# It lives here, beside the JSON layout it reads, so a change to that layout and to the table that
# docs/performance.md shows are made in one place; scripts/bench_table.py writes it into the page
# and tests/test_bench.py fails when the page's copy differs from what the committed JSON gives.
TABLE_START = "<!-- bench-table:start -->"
TABLE_END = "<!-- bench-table:end -->"


def load_results(folder) -> list[tuple[str, dict]]:
    """(file name, result) of every *.json in folder, shortest training length first."""
    folder = os.fspath(folder)
    results = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                results.append((name, json.load(f)))

    def shape(name_result):
        name, result = name_result
        return result["settings"]["seq_len"], result["settings"]["batch_size"], name

    return sorted(results, key=shape)


def markdown_table(results: list[tuple[str, dict]]) -> str:
    """One column per bench result, one row per case: LRT / transformer ratios (whole training step,
    forward + backward alone in brackets), with what the dynamic schedules measured; a case that
    only some results timed (an added schedule) shows "-" in the others."""
    columns = [_markdown_column(name, r) for name, r in results]
    heads = [f"T={r['settings']['seq_len']}, B={r['settings']['batch_size']}" for _, r in results]
    rows = [[label, *(c.get(label, "-") for c in columns)] for label in _row_labels(columns)]
    return "\n".join(markdown_lines(["LRT / transformer", *heads], rows))


def _markdown_column(name: str, r: dict) -> dict[str, str]:
    """{row label: cell} of one result."""

    def ratio(x):
        return f"{x:.2f}x"

    s, a, env = r["settings"], r["absolute"], r["environment"]
    cells = {
        "bench JSON": f"`{name}`",
        "machine": f"{r['device']}: {env['machine']}",
        "threads, clock": f"{env['threads']}, {s['clock']}",
        "torch, model, repeats": f"{env['torch']}, {s['model_preset']}, "
        f"median of {s['repeats']} (Exact {s['exact_repeats']})",
        "transformer step, ms (fwd+bwd)": f"{a['train_step_ms']['transformer']:.1f} "
        f"({a['train_fwd_bwd_ms']['transformer']:.1f})",
    }
    for key in r["train_ratio"]:
        cell = f"{ratio(r['train_ratio'][key])} ({ratio(r['train_ratio_fwd_bwd'][key])})"
        if _case_seq_len(r, key) != s["seq_len"]:
            cell += f" at T={_case_seq_len(r, key)}"
        if key in r.get("sweeps_used", {}):
            cell += f", {r['sweeps_used'][key]['median']:g} sweeps"
        if key in r.get("rollout_share", {}):
            cell += f", rollout {100 * r['rollout_share'][key]['median']:.0f}%"
        cells[f"train {TRAIN_CASES[key].spec if key in TRAIN_CASES else key}"] = (
            cell  # added: key == spec
        )
    for key, schedule in PREFILL_CASES.items():
        cells[f"prefill {schedule.spec}"] = ratio(r["prefill_ratio"][key])
    cells["decode tok/s, batch 1"] = ratio(r["decode_throughput_ratio"]["batch_1"])
    cells["decode tok/s, batch N"] = (
        f"{ratio(r['decode_throughput_ratio']['batch_N'])} (N={s['decode_batch_N']})"
    )
    return cells


def _row_labels(columns: list[dict]) -> list[str]:
    """Every column's row labels once, in order: a label missing from the columns before goes
    right after the label that precedes it in its own column."""
    labels: list[str] = []
    for cells in columns:
        previous = None
        for label in cells:
            if label not in labels:
                labels.insert(labels.index(previous) + 1 if previous is not None else 0, label)
            previous = label
    return labels


def replace_table(page: str, table: str) -> str:
    """page with the text between TABLE_START and TABLE_END replaced by table."""
    start, end = page.find(TABLE_START), page.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {TABLE_START} ... {TABLE_END} markers in that order")
    return page[: start + len(TABLE_START)] + "\n" + table + "\n" + page[end:]


# Command line
# --------------------------------------------------------------------------------------
# torch.compile on CPU (--compile-study)
# -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompileShape:
    """A study's training shape for the compile measurement."""

    preset: str
    vocab_size: int
    seq_len: int
    batch_size: int


COMPILE_SHAPES: dict[str, CompileShape] = {
    # experiments/a5_study.toml: depth 4, d = 128, A5 (60 symbols), length 16, batch 256
    "a5_study": CompileShape("small", 60, 16, 256),
    # experiments/scaling_pilot.toml: the same backbone on bytes, length 256, batch 16
    "scaling_miniature": CompileShape("small", 256, 256, 16),
}
COMPILE_CASES = (("transformer", None, OnePass()), ("lrt", MemoryConfig(), Interleaved(2)))
COMPILE_GAIN_FOR_DEFAULT = 1.3  # steady eager/compiled speed-up that would make sweeps compile


def _compile_case(shape: CompileShape, memory, schedule, compiled: bool, seed: int):
    """A training step (forward, backward, optimizer) of one model at `shape`; compiled, the stage
    primitive under inductor with static shapes, as `lrt_scale.train --compile` and this
    benchmark's --compile compile it (with automatic dynamic shapes, an Interleaved(2) stage's
    second position set would trace its length symbolically, which the memory read refuses)."""
    torch.manual_seed(seed)
    cfg = model_preset(
        shape.preset, memory=memory, sequence_len=shape.seq_len, vocab_size=shape.vocab_size
    )
    model = LRT(cfg)
    if compiled:
        model.stage = torch.compile(model.stage, dynamic=False)
    opts = _optimizers(model, "cpu")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(shape.vocab_size, (shape.batch_size, shape.seq_len + 1), generator=g)

    def step():
        out = run_schedule(model, idx[:, :-1], idx[:, 1:], schedule)
        out.loss.backward()
        optimizer_step(opts, model.parameters())
        return out.loss.item()

    return step


def run_compile_study(
    shapes=None,
    repeats: int = 5,
    warmup: int = 2,
    seed: int = 0,
    threads: int | None = 1,
    log=lambda msg: None,
) -> dict:
    """torch.compile (inductor) against eager on CPU, per study shape and model: the first step's
    wall time (mostly compiling) and the steady step time after `warmup` steps, eager and compiled
    steps alternating (`repeats` each) so a shared machine's drift hits both alike. Step times are
    this process's CPU seconds (with one thread, what other processes on the machine do not
    inflate) and wall seconds; `speedup` = eager / compiled median CPU seconds. shapes: names of
    COMPILE_SHAPES (default: all)."""
    shapes = tuple(COMPILE_SHAPES) if shapes is None else tuple(shapes)
    for name in shapes:
        if name not in COMPILE_SHAPES:
            _fail("shapes", name, f"one of {', '.join(COMPILE_SHAPES)}")
    _int_or_default("repeats", repeats, 1, 1)
    _int_or_default("warmup", warmup, 0, 0)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rows = []
    try:
        for name in shapes:
            for kind, memory, schedule in COMPILE_CASES:
                row = _compile_case_row(name, kind, memory, schedule, repeats, warmup, seed, log)
                rows.append(row)
                log(f"  {name} {kind}: compiled {row['speedup']:.2f}x eager (steady)")
    finally:
        torch.set_num_threads(saved)
    gains = [r["speedup"] for r in rows]
    return {
        "kind": "compile_study",
        "torch": torch.__version__,
        "machine": _machine("cpu"),
        "threads": threads,
        "repeats": repeats,
        "warmup": warmup,
        "rows": rows,
        "min_speedup": min(gains),
        "compile_by_default": min(gains) >= COMPILE_GAIN_FOR_DEFAULT,
        "rule": f"sweeps compile by default if every steady speed-up >= "
        f"{COMPILE_GAIN_FOR_DEFAULT}x",
    }


def _compile_case_row(name, kind, memory, schedule, repeats, warmup, seed, log) -> dict:
    """One shape and model of the compile study: the first step of each mode, then `warmup`
    steps each, then `repeats` steps with eager and compiled alternating."""
    shape = COMPILE_SHAPES[name]
    steps = {}
    first = {}
    for mode in ("eager", "compiled"):
        steps[mode] = _compile_case(shape, memory, schedule, mode == "compiled", seed)
        t = time.perf_counter()
        steps[mode]()
        first[mode] = time.perf_counter() - t
        log(f"  {name} {kind} {mode}: first step {first[mode]:.1f} s")
    for mode in steps:
        for _ in range(warmup):
            steps[mode]()
    cpu = {"eager": [], "compiled": []}
    wall = {"eager": [], "compiled": []}
    losses = {"eager": [], "compiled": []}
    for _ in range(repeats):
        for mode in ("eager", "compiled"):
            c, w = time.process_time(), time.perf_counter()
            losses[mode].append(steps[mode]())
            cpu[mode].append(time.process_time() - c)
            wall[mode].append(time.perf_counter() - w)
    med = {m: statistics.median(v) for m, v in cpu.items()}
    return {
        "shape": name,
        **dataclasses.asdict(shape),
        "model": kind,
        "schedule": schedule.spec,
        "first_step_s": first,
        "step_cpu_s": med,
        "step_wall_s": {m: statistics.median(v) for m, v in wall.items()},
        "steps_per_s": {m: 1 / v for m, v in med.items()},
        "speedup": med["eager"] / med["compiled"],
        "max_abs_loss_diff": max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"])),
    }


def format_compile_table(result: dict) -> str:
    lines = [
        f"torch.compile (inductor) vs eager on CPU, {result['threads']} thread(s), "
        f"{result['repeats']} alternating steps each after {result['warmup']} warm-up",
        f"{'shape':<18} {'model':<12} {'first eager':>11} {'first comp.':>11} "
        f"{'eager ms':>9} {'comp. ms':>9} {'speed-up':>8}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['shape']:<18} {r['model']:<12} {r['first_step_s']['eager']:>10.2f}s "
            f"{r['first_step_s']['compiled']:>10.1f}s {r['step_cpu_s']['eager'] * 1e3:>9.1f} "
            f"{r['step_cpu_s']['compiled'] * 1e3:>9.1f} {r['speedup']:>7.2f}x"
        )
    verdict = "yes" if result["compile_by_default"] else "no"
    lines.append(f"{result['rule']}: {verdict} (smallest {result['min_speedup']:.2f}x)")
    return "\n".join(lines)


def run(args) -> int:
    """Run from parsed arguments: print the table, write --json; returns the exit code."""
    if getattr(args, "compile_study", False):
        try:
            result = run_compile_study(
                repeats=args.repeats or 5,
                warmup=2 if args.warmup is None else args.warmup,
                seed=args.seed,
                threads=args.threads or 1,
                log=(lambda m: None)
                if args.quiet
                else (lambda m: print(m, file=sys.stderr, flush=True)),
            )
        except ValueError as e:
            print(f"lrt-lab bench: error: {e}", file=sys.stderr)
            return 2
        print(format_compile_table(result))
        if args.json:
            _write_json(result, args.json)
        return 0
    try:
        load_plugins(getattr(args, "plugin", None))  # before the spellings they register are read
        run_bench(
            device=args.device,
            preset=args.preset,
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            prompt_len=args.prompt_len,
            decode_batch=args.decode_batch,
            decode_steps=args.decode_steps,
            repeats=args.repeats,
            warmup=args.warmup,
            exact_repeats=args.exact_repeats,
            exact_seq_len=args.exact_seq_len,
            compile=args.compile,
            seed=args.seed,
            threads=args.threads,
            clock=args.clock,
            schedules=split_spellings(args.schedules),
            json_path=args.json,
            verbose=not getattr(args, "quiet", False),
            out=sys.stdout,
        )
    except ValueError as e:
        print(f"lrt-lab bench: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    return run(parse(argv))


if __name__ == "__main__":
    raise SystemExit(main())
