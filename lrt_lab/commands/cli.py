"""The `lrt-lab` command: train, sweep, demo, report, bench, app.

Every bad argument gives one `lrt-lab: error: ...` line naming the field and what is allowed,
exits with status 2, and writes nothing (all validation happens before a run folder is made).
The exit statuses (`lrt_lab.training.exitcodes`): 0 complete, 1 error, 2 refused, 3 incomplete
(resumable), 4 diverged, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

from lrt_lab.run.registry import spellings
from lrt_lab.training import exitcodes
from lrt_lab.training.mirror_settings import MIRROR_PACKAGES, MirrorSettings
from lrt_lab.training.threads import wait_passively_when_busy
from lrt_lab.training.train_config import TrainConfig, defaults, parse_value

# This module and what it imports load no torch, so `--help` and argument errors answer at once;
# each command loads what it needs when it runs. The commands that load torch first set the
# OpenMP wait policy for a busy machine (its runtime reads it once, when torch loads).
LOADS_TORCH = ("train", "sweep", "demo", "analyze", "bench")
SCHEDULE_SPELLINGS = "{schedules}"  # in a help text: the registered spellings, filled at --help


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Fills {schedules} in an option's help with the registry's spellings when help is shown
    (the built-ins' as the registry states them: no torch)."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        if SCHEDULE_SPELLINGS in text:
            text = text.replace(SCHEDULE_SPELLINGS, spellings().replace(", ", " | "))
        return text


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage dump
        self.exit(exitcodes.USAGE, f"lrt-lab: error: {message}\n")


def key_values(pairs: list[str], flag: str) -> dict:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {pair!r} is invalid; allowed: KEY=VALUE")
        out[key.strip()] = parse_value(value.strip())
    return out


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is invalid; allowed: comma-separated integers, e.g. 64,128,256"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("needs at least one length")
    return values


def add_train_arguments(p: argparse.ArgumentParser):
    """The train options, in the order --help lists them; a new option goes into its group."""
    d = SimpleNamespace(**defaults())  # no TrainConfig() here: checking one loads torch
    for add_group in (
        _add_task_arguments,
        _add_model_arguments,
        _add_budget_arguments,
        _add_eval_arguments,
        _add_run_arguments,
    ):
        add_group(p, d)
    add_threads_argument(p)
    add_plugin_argument(p)


def _add_task_arguments(p: argparse.ArgumentParser, d: SimpleNamespace):
    p.add_argument(
        "--task",
        default=d.task,
        help="task name (tasks.TASK_NAMES), e.g. a5_prefix, z60_prefix, copy",
    )
    p.add_argument("--length", type=int, default=d.length, help="training sequence length")
    p.add_argument(
        "--curriculum",
        metavar="START:STEPS",
        help="grow the length from START to --length over STEPS steps",
    )
    p.add_argument(
        "--task-opt",
        action="append",
        metavar="KEY=VALUE",
        help="task option, e.g. group=S4, alphabet_size=16",
    )


def _add_model_arguments(p: argparse.ArgumentParser, d: SimpleNamespace):
    p.add_argument("--preset", default=d.preset, help="model shape: tiny, small, a5, d12, d20, d24")
    p.add_argument(
        "--model",
        default=d.model,
        help="transformer, lrt, or a baseline: loop:N[:LO-HI] (the stack N times per token), "
        "ponder:N[:K|:LO-HI] (N latent thoughts per token, K Jacobi refinements in training)",
    )
    p.add_argument(
        "--schedule",
        default=None,
        help=f"{SCHEDULE_SPELLINGS} (default: interleaved:2 for lrt, onepass for transformer "
        "and baselines)",
    )
    p.add_argument(
        "--memory-preset",
        default=d.memory_preset,
        help="LRT memory: paper (its text: block round(0.6 L), raw residual, shared projections) "
        "or released (its code: final layer, RMS-normed, layerwise projections, 32-channel gates); "
        "--set memory.<field> applies on top",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a model config field, e.g. n_layer=2, memory.source_layer=2 (layers "
        "count from 1: the second block's output), memory.gamma_init=0",
    )


def _add_budget_arguments(p: argparse.ArgumentParser, d: SimpleNamespace):
    """How long and how big: steps or a token budget, batch, seed, learning rate."""
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument(
        "--tokens-per-param",
        type=float,
        default=d.tokens_per_param,
        metavar="R",
        help="a budget of R tokens per parameter: sets --steps from the parameter count",
    )
    p.add_argument(
        "--param-convention",
        default=d.param_convention,
        help="the parameters R counts: all (the paper's text) or matrices (its released code: "
        "hidden matrices and the head)",
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--lr-scale", type=float, default=d.lr_scale, help="multiplies every learning rate"
    )


def _add_eval_arguments(p: argparse.ArgumentParser, d: SimpleNamespace):
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument(
        "--eval-lengths",
        type=int_list,
        default=d.eval_lengths,
        help="e.g. 64,128,256 (default: 1x, 2x and 4x the training length)",
    )
    p.add_argument(
        "--eval-size", type=int, default=d.eval_size, help="sequences per evaluation length"
    )
    p.add_argument(
        "--no-exact-eval", action="store_true", help="skip exact recurrent-decoding evaluation"
    )


def _add_run_arguments(p: argparse.ArgumentParser, d: SimpleNamespace):
    """Where and how the run goes: the spike guard, checkpoints, device, its folder, resuming."""
    p.add_argument(  # the loss-spike guard (lrt_lab.training.guard)
        "--spike-guard",
        type=float,
        default=d.spike_guard,
        metavar="NATS",
        help="refuse a step whose loss is NATS above the running mean (default: off)",
    )
    p.add_argument("--spike-backoff", type=float, default=d.spike_backoff, metavar="F")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--device", default=d.device, help="auto, cpu or cuda")
    p.add_argument(
        "--compile", action="store_true", help="torch.compile the stage (slow first step)"
    )
    p.add_argument(
        "--name", default=None, help="run folder name (default: derived from the config)"
    )
    p.add_argument("--out", default="runs", help="run store directory")
    p.add_argument(
        "--resume", action="store_true", help="continue the run folder from its last checkpoint"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_plugin_argument(p: argparse.ArgumentParser, recorded: str = "recorded in the run's config"):
    p.add_argument(
        "--plugin",
        action="append",
        default=None,
        metavar="FILE_OR_MODULE",
        help="import a Python file or module first: the schedules and memory mechanisms it "
        f"registers become valid --schedule and --set memory.mechanism= values ({recorded}); "
        "repeatable (docs/extending.md)",
    )


def check_file(name: str, path: str, allowed: str) -> None:
    """A path that must be a file, refused before anything heavy loads."""
    from pathlib import Path

    reason = "no such file" if not Path(path).exists() else "not a file"
    if not Path(path).is_file():
        raise ValueError(f"{name}={str(path)!r} is invalid: {reason}; allowed: {allowed}")


def add_threads_argument(p: argparse.ArgumentParser):
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default: $OMP_NUM_THREADS if set, else the cores free at the start, "
        "at most 4)",
    )


def add_log_arguments(p: argparse.ArgumentParser):
    p.add_argument(
        "--log",
        action="append",
        choices=tuple(MIRROR_PACKAGES),
        default=None,
        help="also mirror every metrics line, the config and the summary to W&B (offline unless "
        "WANDB_API_KEY is set) or TensorBoard (<run>/tensorboard); repeatable; needs the "
        "[wandb] / [tensorboard] extra",
    )
    p.add_argument(
        "--wandb-project", default=None, help="W&B project (default: $WANDB_PROJECT, else lrt_lab)"
    )


def mirror_settings_from_args(a) -> MirrorSettings:
    return MirrorSettings(tuple(a.log or ()), wandb_project=a.wandb_project)


def train_config_from_args(a) -> TrainConfig:
    task_options = key_values(a.task_opt, "--task-opt")
    if a.curriculum:
        start, sep, steps = a.curriculum.partition(":")
        try:
            task_options.update(curriculum_start=int(start), curriculum_steps=int(steps))
        except ValueError:
            raise ValueError(
                f"--curriculum {a.curriculum!r} is invalid; allowed: START:STEPS, e.g. 4:1000"
            ) from None
    schedule = a.schedule or ("interleaved:2" if a.model == "lrt" else "onepass")
    overrides = key_values(a.set, "--set")
    if "memory.mechanism" in overrides:  # the one model field plugins add values to: checked
        from lrt_lab.core.config import check_mechanism  # here, before the schedule loads torch
        from lrt_lab.core.plugins import load_plugins

        load_plugins(a.plugin)
        check_mechanism(overrides["memory.mechanism"])
    return TrainConfig(
        task=a.task,
        length=a.length,
        task_options=task_options,
        preset=a.preset,
        model=a.model,
        overrides=overrides,
        memory_preset=a.memory_preset,
        schedule=schedule,
        steps=a.steps,
        tokens_per_param=a.tokens_per_param,
        param_convention=a.param_convention,
        batch_size=a.batch_size,
        seed=a.seed,
        lr_scale=a.lr_scale,
        spike_guard=a.spike_guard,
        spike_backoff=a.spike_backoff,
        eval_every=a.eval_every,
        eval_lengths=a.eval_lengths,
        eval_size=a.eval_size,
        eval_exact=not a.no_exact_eval,
        checkpoint_every=a.checkpoint_every,
        device=a.device,
        compile=a.compile,
        name=a.name,
        plugins=tuple(a.plugin or ()),
    )


def cmd_train(a) -> int:
    # Every field is checked first: a bad value is refused before torch loads (a valid schedule's
    # check imports the schedules, and a plugin its own imports).
    check_threads(a.threads)
    cfg = train_config_from_args(a)
    from pathlib import Path

    from lrt_lab.store.results import Run
    from lrt_lab.store.run_summary import print_run
    from lrt_lab.training.checkpoints import resume_folder
    from lrt_lab.training.loop import train
    from lrt_lab.training.threads import apply_threads, choose_threads

    apply_threads(choose_threads(a.threads))
    finished_before = a.resume and Run(resume_folder(Path(a.out), cfg)).is_complete
    run = train(
        cfg, out=a.out, resume=a.resume, progress=not a.quiet, log=mirror_settings_from_args(a)
    )
    status = run.status
    # A run that diverged or stopped in this process was said by train, in one line; a run found
    # finished by --resume is said here.
    if status == "complete" or finished_before:
        print_run(run)
    return exitcodes.for_statuses([status])


def check_sweep_arguments(a) -> None:
    """The sweep's own arguments, as run_sweep checks them, before the spec loads torch."""
    from lrt_lab.core.validation import check_int

    check_file("spec", a.spec, "a path to a .toml sweep spec")
    if a.time_limit is not None and not a.time_limit > 0:
        raise ValueError(
            f"time_limit_s={a.time_limit!r} is invalid; allowed: a number of seconds > 0"
        )
    check_int("workers", a.workers, 1)
    if a.threads_per_run is not None:
        check_int("threads_per_run", a.threads_per_run, 1)
    if not a.gpus_per_run >= 0:
        raise ValueError(f"gpus_per_run={a.gpus_per_run!r} is invalid; allowed: a number >= 0")


def cmd_sweep(a) -> int:
    check_sweep_arguments(a)
    from lrt_lab.core.plugins import load_plugins

    plugins = load_plugins(a.plugin)  # before the spec's runs are checked
    from lrt_lab.training.sweep import load_spec, run_sweep

    spec = load_spec(a.spec)
    if plugins:  # recorded in every run, as a [train] plugins list would be
        shared = spec.setdefault("train", {})
        shared["plugins"] = list(dict.fromkeys([*shared.get("plugins", []), *plugins]))
    if a.device:  # e.g. --device cuda for a spec written device-neutral
        spec.setdefault("train", {})["device"] = a.device
    slurm = None
    if a.slurm is not None:
        from lrt_lab.training.parallel import parse_slurm

        slurm = parse_slurm(a.slurm)
    runs = run_sweep(
        spec,
        out=a.out,
        dry_run=a.dry_run,
        time_limit_s=a.time_limit,
        progress=not a.quiet,
        workers=a.workers,
        threads_per_run=a.threads_per_run,
        gpus_per_run=a.gpus_per_run,
        address=a.address,
        slurm=slurm,
        log=mirror_settings_from_args(a),
    )
    if a.dry_run:
        return exitcodes.COMPLETE
    return exitcodes.for_statuses(run.status for run in runs)  # what the store holds now


def check_threads(threads) -> None:
    """--threads, as choose_threads checks it, before the command loads torch."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads={threads!r} is invalid; allowed: an integer >= 1")


def cmd_demo(a) -> int:
    check_threads(a.threads)
    from lrt_lab.commands.demo import DemoStopped, run_demo

    try:
        run_demo(out=a.out, quick=a.quick, quiet=a.quiet, threads=a.threads)
    except DemoStopped as stopped:  # its one line is said
        return exitcodes.for_statuses([stopped.status])
    return exitcodes.COMPLETE


def cmd_report(a) -> int:
    from pathlib import Path

    if not Path(a.runs).is_dir():
        reason = "no such directory" if not Path(a.runs).exists() else "not a directory"
        raise ValueError(f"runs={a.runs!r} is invalid: {reason}; allowed: a run store directory")

    if a.study is not None:
        return report_study(a)
    if a.out is not None:
        raise ValueError(
            "--out is invalid without --study; allowed: --study SPEC.toml --out DIR (the tables "
            "are printed; only a study draws figures)"
        )
    if a.scoreboard:
        for flag, value in (("--metric", a.metric), ("--group-by", a.group_by)):
            if value is not None:
                raise ValueError(
                    f"{flag} is invalid with --scoreboard; allowed: --format, --task, --where, "
                    "--prefix (the scoreboard's metrics are fixed)"
                )
    from lrt_lab.core.plugins import provided

    return provided("report")(a)  # the tables: lrt_results.cli


def report_study(a) -> int:
    """`report --study SPEC.toml`: the spec's [study] over the runs of its grid in the store."""
    for flag, value in (
        ("--metric", a.metric),
        ("--group-by", a.group_by),
        ("--format", a.format if a.format != "table" else None),
        ("--task", a.task),
        ("--where", a.where),
        ("--prefix", a.prefix),
        ("--scoreboard", a.scoreboard or None),
    ):
        if value is not None:
            raise ValueError(
                f"{flag} is invalid with --study; allowed: --study alone (the study names its "
                "metrics and arms)"
            )
    check_file("--study", a.study, "a path to a .toml sweep spec with a [study] table")
    from lrt_lab.core.plugins import provided
    from lrt_lab.store.results import reading_once
    from lrt_lab.store.study_spec import parse_study

    wait_passively_when_busy()  # as the commands that load torch do (LOADS_TORCH)
    from lrt_lab.training.sweep import expand, load_spec  # loads torch: the grid's run names

    spec = load_spec(a.study)  # checks the study and its arms against the grid
    if "study" not in spec:
        raise ValueError(
            f"--study {a.study!r} is invalid: the spec has no [study] table; allowed: a sweep "
            "spec with a [study] table (docs/tour.md)"
        )
    names = [cfg.run_name for cfg in expand(spec)]
    study = parse_study(spec["study"])
    with reading_once():  # each run's metrics parsed once for every table and figure
        return provided("report_study")(a, study, names)  # lrt_results.cli


def cmd_analyze(a) -> int:
    from lrt_lab.commands.analyze import main as analyze_main

    return analyze_main(a.args, debug=a.debug or None)


def cmd_bench(a) -> int:
    from lrt_lab.commands.bench_args import parse

    args = parse(a.args)  # its parser and defaults load no torch: -h and bad values answer at once
    from lrt_lab.commands import bench

    return bench.run(args)


def cmd_app(a) -> int:
    from lrt_lab.commands.app_launcher import launch

    return launch(a.runs, a.port, a.address, a.allow_root or ())


def cmd_store_compact(a) -> int:
    from lrt_lab.store.compact import compact_store

    for line in compact_store(a.store, dry_run=a.dry_run).lines():
        print(line)
    return 0


def add_store_parser(sub) -> None:
    """lrt-lab store compact STORE [--dry-run]: a group of commands that tend a run store."""
    group = sub.add_parser("store", help="tend a run store (lrt-lab store compact -h)")
    commands = group.add_subparsers(
        dest="store_command", metavar="compact", required=True, parser_class=Parser
    )
    p = commands.add_parser(
        "compact",
        help="store each complete run's metrics.jsonl as metrics.jsonl.xz (the same bytes, "
        "compressed); runs in progress are left as they are",
    )
    p.add_argument("store", metavar="STORE", help="the run store (a folder of run folders)")
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be compacted; change nothing"
    )
    p.set_defaults(func=cmd_store_compact)


def _stated() -> dict:
    """What the help of a command that trains says beyond its options: the exit statuses."""
    return dict(epilog=exitcodes.epilog(), formatter_class=HelpFormatter)


def add_train_command(sub) -> None:
    p = sub.add_parser(
        "train", help="train one model on a toy task into the run store", **_stated()
    )
    add_train_arguments(p)
    add_log_arguments(p)
    p.set_defaults(func=cmd_train)


def add_sweep_command(sub) -> None:
    p = sub.add_parser(
        "sweep",
        **_stated(),
        help="train a grid (tasks x models x schedules x seeds) from a TOML spec",
    )
    p.add_argument("spec", help="path to the sweep spec (.toml); see experiments/")
    p.add_argument(
        "--out", default=None, help="run store directory (default: the spec's sweep.out, or runs)"
    )
    p.add_argument("--dry-run", action="store_true", help="list the runs without training")
    p.add_argument(
        "--device", default=None, help="auto, cpu or cuda for every run (default: the spec's)"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds, the run in progress checkpointed; "
        "run again to continue",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bar (a line per finished run still)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs at a time, as Ray tasks (needs the [cluster] extra); "
        "1: one after another, no Ray",
    )
    p.add_argument(
        "--threads-per-run",
        type=int,
        default=None,
        help="CPU threads of each run, in this process too (default: with --workers, cores / "
        "workers; else the free cores, as train takes them)",
    )
    p.add_argument(
        "--gpus-per-run", type=float, default=0.0, help="GPUs each run asks Ray for (e.g. 1)"
    )
    p.add_argument(
        "--address",
        default=None,
        help="a running Ray cluster: auto (the one started last on this machine), host:port "
        "(its head's address), or ray://host:port (the store must be on a filesystem every node "
        "sees)",
    )
    add_plugin_argument(p, "recorded in every run's config, as a [train] plugins list is")
    p.add_argument(
        "--slurm",
        default=None,
        metavar="KEY=VALUE,...",
        help="submit the grid to Slurm as a job array through submitit (the [slurm] extra), e.g. "
        "partition=gpu,gpus_per_node=1,timeout_min=240,slurm_array_parallelism=8",
    )
    add_log_arguments(p)
    p.set_defaults(func=cmd_sweep)


def add_demo_command(sub) -> None:
    p = sub.add_parser(
        "demo", help="the main job: transformer vs LRT on a state-tracking task, in minutes"
    )
    p.add_argument("--out", default="runs", help="run store directory")
    p.add_argument(
        "--quick", action="store_true", help="a much shorter run (smoke test, not a result)"
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bars, only the table and the summary"
    )
    add_threads_argument(p)
    p.set_defaults(func=cmd_demo)


def add_report_command(sub) -> None:
    p = sub.add_parser(
        "report",
        help="a comparison table over the runs in a store (mean, 95%% t-interval over seeds)",
        description="One table per study (a task at one training length): a row per group of "
        "runs that differ only by seed, named by what tells the groups shown apart, with the "
        "study's metric as mean [95% t-interval over seeds], n, std, the seeds, the schedule's "
        "cost and the wall clock.",
    )
    p.add_argument("runs", nargs="?", default="runs", help="run store directory")
    p.add_argument(
        "--metric",
        default=None,
        help="what to compare: bpb (bits per byte, exact decoding, at the training length), "
        "pos90 (pos@90, exact decoding, at the training length) or a summary column such as "
        "pos90_parallel@32 or final_loss (default: bpb for byte-level text tasks, pos90 for "
        "the others)",
    )
    p.add_argument(
        "--group-by",
        default=None,
        help="comma list of columns (e.g. method); default: one group per config up to the seed",
    )
    p.add_argument(
        "--format",
        default="table",
        choices=("table", "md", "csv"),
        help="table (aligned text), md (GitHub markdown tables) or csv (one machine-readable "
        "table, every figure at full precision; notes on stderr) (default: table)",
    )
    p.add_argument(
        "--task",
        default=None,
        metavar="TASK[,TASK]",
        help="only the runs of these tasks, e.g. a5_prefix",
    )
    p.add_argument(
        "--where",
        action="append",
        default=None,
        metavar="FIELD=VALUE",
        help="only the runs whose config has FIELD=VALUE, e.g. train.length=16, kind=lrt, "
        "model.n_layer=4 (null: unset); repeatable, all must hold",
    )
    p.add_argument(
        "--prefix", default=None, metavar="NAME_PREFIX", help="only the runs whose names start so"
    )
    p.add_argument(
        "--study",
        default=None,
        metavar="SPEC.toml",
        help="the [study] of a sweep spec instead: its question, budget and decision rules, and "
        "each pre-stated contrast (B minus A, bootstrap interval, permutation p, Holm, power) "
        "over the runs of its grid",
    )
    p.add_argument(
        "--scoreboard",
        action="store_true",
        help="the approximate-vs-exact scoreboard instead: per group of LRT runs, the "
        "cross-entropy of the training forward minus exact decoding's, and their argmax "
        "agreement, at each evaluation length",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="with --study: where its figures go (default: outputs/<store folder name>/ under "
        "the current directory; nothing is written into the store)",
    )
    p.set_defaults(func=cmd_report)


def add_analyze_command(sub) -> None:
    p = sub.add_parser(
        "analyze",
        help="probes, gap recovery, depth sweep, convergence (lrt-lab analyze -h)",
        add_help=False,  # -h goes on to lrt-lab analyze's own parser, which knows its subcommands
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_analyze)


def add_bench_command(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="time training, prefill and decoding: LRT vs transformer, side by side "
        "(lrt-lab bench -h)",
        add_help=False,  # its options are the bench's own parser's (it loads torch)
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)


def add_app_command(sub) -> None:
    p = sub.add_parser("app", help="open the Streamlit dashboard over a run store")
    p.add_argument(
        "--runs", default=None, help="run store (default: $LRT_RUNS, else ./runs, else ./results)"
    )
    p.add_argument("--port", type=int, default=8501)
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="where it listens (default 127.0.0.1: this machine only; 0.0.0.0 exposes it to "
        "every host that can reach this one)",
    )
    p.add_argument(
        "--allow-root",
        action="append",
        metavar="DIR",
        help="a folder whose stores the sidebar may also open (repeatable; default: only the "
        "store it starts on)",
    )
    p.set_defaults(func=cmd_app)


# The subcommands in the order `lrt-lab --help` lists them: a new one is a function above and a
# line here.
COMMANDS = (
    add_train_command,
    add_sweep_command,
    add_demo_command,
    add_report_command,
    add_analyze_command,
    add_bench_command,
    add_app_command,
    add_store_parser,
)


def build_parser() -> Parser:
    parser = Parser(prog="lrt-lab", description="Latent Recurrent Transformer research sandbox.")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an unexpected failure (also: LRT_LAB_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    for add_command in COMMANDS:
        add_command(sub)
    return parser


CONTINUE = {
    "train": "continue it with the same command and --resume",
    "sweep": "run the same command again to continue",
    "demo": "run the same command again to continue",
}


def main(argv: list[str] | None = None) -> int:
    import os

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("analyze", "bench"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # options before the rest (-h) belong to the command's own parser
        args.args = extra + args.args
    asks_help = any(w in ("-h", "--help") for w in getattr(args, "args", ()))  # analyze, bench
    if args.command in LOADS_TORCH and not asks_help:
        wait_passively_when_busy()
    debug = args.debug or os.environ.get("LRT_LAB_DEBUG", "") not in ("", "0")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(
            f"lrt-lab: interrupted ({CONTINUE.get(args.command, 'nothing was lost')})",
            file=sys.stderr,
        )
        return exitcodes.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - every failure is one line naming its cause (--debug: traceback)
        if debug:
            raise
        print(f"lrt-lab: error: {describe_failure(e, args.command)}", file=sys.stderr)
        return exitcodes.USAGE if isinstance(e, (ValueError, OSError)) else exitcodes.ERROR


def describe_failure(e: BaseException, command: str) -> str:
    """One line: what failed and what to do."""
    import errno

    if isinstance(e, (ValueError, OSError)) and not (
        isinstance(e, OSError) and e.errno == errno.ENOSPC
    ):
        return str(e)  # bad input, a refused path, a claimed run: the message names it already
    if isinstance(e, OSError):  # a full disk
        return (
            f"{e.strerror or e}"
            if "disk full" in str(e)
            else f"disk full ({e}); free space and try again"
        )
    name = type(e).__name__
    if isinstance(e, MemoryError) or "OutOfMemory" in name or "out of memory" in str(e).lower():
        return (
            f"out of memory ({name}); lower --batch-size, --length or --eval-lengths, or use a "
            "larger "
            f"device; {CONTINUE.get(command, 'try again')}"
        )
    first = str(e).splitlines()[0][:300] if str(e) else "no message"
    return f"{name}: {first} (run with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
