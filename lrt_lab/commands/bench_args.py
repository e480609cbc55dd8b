"""`lrt-lab bench`'s presets and command line, apart from the bench so that `lrt-lab bench -h` and a
bad option answer without importing torch (lrt_lab.commands.bench imports it)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

DESCRIPTION = (
    "`lrt-lab bench`: the LRT's cost next to the plain transformer's, in one process and one run."
)


@dataclass(frozen=True)
class BenchPreset:
    """A model preset plus the shapes and repeat counts of one benchmark."""

    model: str  # a name in lrt_lab.core.config.PRESETS
    seq_len: int  # training length T (also the model's sequence_len: sets the windows)
    batch_size: int  # training batch
    prompt_len: int  # prefill prompt length
    prefill_batch: int  # prefill batch
    decode_batch: int  # the "larger batch" of the decode measurement (batch 1 is always run)
    decode_steps: int  # tokens decoded per timed repeat (after an untimed prefill of prompt_len)
    repeats: int
    warmup: int
    exact_repeats: int  # Exact is T stages: cap its repeats (and warm-up) on slow devices
    exact_seq_len: int  # Exact is measured at this T (the aim "Exact training at T=256")


BENCH_PRESETS: dict[str, BenchPreset] = {
    # The test suite's preset: every case runs, in a few seconds.
    "tiny": BenchPreset(
        model="tiny",
        seq_len=16,
        batch_size=2,
        prompt_len=16,
        prefill_batch=1,
        decode_batch=2,
        decode_steps=4,
        repeats=3,
        warmup=1,
        exact_repeats=1,
        exact_seq_len=16,
    ),
    # A 2-core CPU in under 2 minutes: depth 4, d 128, T 256, B 8 (nanochat-style "small").
    "cpu": BenchPreset(
        model="small",
        seq_len=256,
        batch_size=8,
        prompt_len=1024,
        prefill_batch=1,
        decode_batch=8,
        decode_steps=32,
        repeats=5,
        warmup=1,
        exact_repeats=2,
        exact_seq_len=256,
    ),
    # The paper's comparison shape on one H100/H200: d12, T 2048.
    "d12": BenchPreset(
        model="d12",
        seq_len=2048,
        batch_size=8,
        prompt_len=1024,
        prefill_batch=1,
        decode_batch=32,
        decode_steps=128,
        repeats=10,
        warmup=3,
        exact_repeats=3,
        exact_seq_len=256,
    ),
}
BENCH_PRESETS["small"] = BENCH_PRESETS["cpu"]  # the model preset's name works too


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`lrt-lab bench` options. Unset shape/repeat options come from the bench preset."""
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    parser.add_argument(
        "--preset",
        default=None,
        help=f"bench preset: {', '.join(BENCH_PRESETS)} (default: cpu on CPU, d12 on CUDA)",
    )
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="write the results as JSON here"
    )
    parser.add_argument("--seq-len", type=int, default=None, help="training length T")
    parser.add_argument("--batch-size", type=int, default=None, help="training batch")
    parser.add_argument(
        "--prompt-len",
        type=int,
        default=None,
        help="prefill prompt length (default 1024; the tiny preset uses 16)",
    )
    parser.add_argument("--decode-batch", type=int, default=None, help="the larger decode batch")
    parser.add_argument("--decode-steps", type=int, default=None, help="tokens decoded per repeat")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per case (median)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed warm-up runs per case")
    parser.add_argument("--exact-repeats", type=int, default=None, help="cap on Exact's repeats")
    parser.add_argument(
        "--exact-seq-len", type=int, default=None, help="T for Exact (default min(T, 256))"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="experimental: torch.compile each model's stage (recompiles per position "
        "set; see docs/performance.md)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "process"),
        help="CPU only: 'process' counts this process's CPU seconds (use with "
        "--threads 1 on a shared machine)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--schedules",
        action="append",
        default=None,
        metavar="SPEC[,SPEC...]",
        help="more LRT training cases, timed beside the default ones: schedule "
        "spellings, e.g. interleaved:3,chunked:8 (also those an installed package "
        "registers); repeatable",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--plugin",
        action="append",
        default=None,
        metavar="FILE_OR_MODULE",
        help="import a Python file or module first, so the schedules it registers can be named "
        "in --schedules; repeatable (docs/extending.md)",
    )
    parser.add_argument(
        "--compile-study",
        action="store_true",
        help="instead of the benchmark: torch.compile (inductor) against eager on CPU at the A5 "
        "study and scaling-miniature shapes, first step and steady step (minutes; "
        "--repeats, --warmup, --threads and --json apply)",
    )


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other command says it, not a usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


def parse(argv=None) -> argparse.Namespace:
    """`lrt-lab bench`'s arguments (exit 2 with one line on a bad one; -h: the help)."""
    parser = Parser(prog="lrt-lab bench", description=DESCRIPTION)
    add_arguments(parser)
    return parser.parse_args(argv)
