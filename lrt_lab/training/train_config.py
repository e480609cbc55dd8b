"""What a training run is: `TrainConfig`, every field checked at construction, saved as the run's
config.json["train"]. Apart from the loop so that the command line reads its fields and defaults
without importing torch (`lrt-lab --help` and argument errors answer at once).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field

from lrt_lab.core.config import FLOAT32_MAX, MEMORY_PRESETS, PRESETS
from lrt_lab.core.plugins import load_plugins
from lrt_lab.core.validation import TRAIN_SEED_LIMIT, check_fields, fail, field_defaults, is_int
from lrt_lab.run.registry import parse_schedule

PARAM_CONVENTIONS = ("all", "matrices")
# What the optimizers may multiply a learning rate by in float32 (AdamW's first bias correction
# 1/(1 - 0.8) = 5, Muon's shape factor, the weight decay): a rate stays this far below FLOAT32_MAX.
RATE_HEADROOM = 2.0**20
OPTIONS_DIGEST_CHARS = 5  # hex digits of the options digest in a derived run name

# plus the baselines' spellings, lrt_lab.core.baselines.BASELINE_KINDS
MODEL_KINDS = ("transformer", "lrt")


def _ranged(default, low=None, high=None, **kw):
    """A field with a declared range, checked by validation.check_fields."""
    return field(default=default, metadata={"range": (low, high)}, **kw)


@dataclass
class TrainConfig:
    """Everything a run needs; saved as config.json["train"] so the run can be redone exactly.

    Every field is validated at construction (types from the annotations, ranges and choices from
    the field metadata), so a bad value fails before any run folder is written.
    """

    task: str = "a5_prefix"
    length: int = _ranged(64, 1)  # training sequence length (the curriculum's end)
    task_options: dict = field(default_factory=dict)  # e.g. curriculum_start, curriculum_steps
    preset: str = field(default="small", metadata={"choices": tuple(PRESETS)})
    model: str = "lrt"  # transformer | lrt (baselines: loop:N, ponder:N)
    overrides: dict = field(default_factory=dict)  # ModelConfig fields, "memory.<field>" too
    memory_preset: str = "paper"  # LRT memory: "paper" (its text) or "released" (its code)
    schedule: str = "interleaved:2"
    steps: int = _ranged(1000, 1)  # replaced by the budget when tokens_per_param is given
    # A budget in the paper's units: train tokens = R x parameters (app. "Compute Budget"); the
    # steps follow from it (`lrt_lab.training.budget`), so the warm-down lands at this run's end.
    tokens_per_param: float | None = _ranged(None, 0)
    # which parameters R counts: "all" (the paper's text) or "matrices" (its released code: the
    # 2-D hidden matrices and the head, no embeddings or scalars)
    param_convention: str = field(default="all", metadata={"choices": PARAM_CONVENTIONS})
    batch_size: int = _ranged(64, 1)
    # below the evaluation seeds (lrt_tasks.eval_sets)
    seed: int = _ranged(0, 0, TRAIN_SEED_LIMIT - 1)
    lr_scale: float = _ranged(1.0, 0)
    matrix_lr: float = _ranged(0.02, 0)  # Muon (paper: 0.02)
    embedding_lr: float = _ranged(0.1, 0)  # AdamW, before (d/768)^-1/2 (paper 0.3; capped for toys)
    head_lr: float = _ranged(0.004, 0)  # AdamW, before (d/768)^-1/2 (paper 0.004)
    scalar_lr: float = _ranged(0.05, 0)  # AdamW: gamma, residual scalars (paper 0.5)
    weight_decay: float = _ranged(0.0, 0)
    warmdown_frac: float = _ranged(0.5, 0, 1)  # linear warm-down to 0 over this final fraction
    grad_clip: float = _ranged(1.0, 0)
    # The loss-spike guard (lrt_lab.training.guard), off by default: a step whose loss is more than
    # this many nats above the running mean of accepted losses (or not finite) is refused, the
    # update before it undone, and every rate multiplied by spike_backoff from then on.
    spike_guard: float | None = _ranged(None, 0)
    spike_backoff: float = _ranged(0.5, 0, 1)
    eval_every: int = _ranged(200, 0)
    # None: 1x, 2x and 4x the training length (the generalisation the docs report)
    eval_lengths: tuple | None = None
    eval_size: int = _ranged(256, 1)
    eval_exact: bool = True  # also evaluate with exact recurrent decoding
    # also log the memory map's Lyapunov exponent and the change of Jacobi sweeps for an LRT
    # reading m_(t-1) (lrt_lab.run.contraction_monitor): on a few sequences' prefix, cheap next to
    # exact decoding
    eval_contraction: bool = True
    checkpoint_every: int = _ranged(500, 0)  # 0: only at the end
    device: str = field(default="auto", metadata={"choices": ("auto", "cpu", "cuda")})
    compile: bool = False
    name: str | None = None
    # files or modules imported before the checks below, registering the schedules and memory
    # mechanisms the run names (`--plugin`, lrt_lab.core.plugins; docs/extending.md): recorded,
    # a file by its absolute path, so a resume, a sweep worker and `lrt-lab analyze` load them too
    plugins: tuple = ()

    def __post_init__(self):
        check_fields(self)
        self.plugins = load_plugins(self.plugins)
        self._check_float32()
        if self.eval_lengths is None and is_int(self.length):
            self.eval_lengths = (self.length, 2 * self.length, 4 * self.length)
        self.eval_lengths = tuple(self.eval_lengths or ())
        if not self.eval_lengths or not all(is_int(n) and n >= 1 for n in self.eval_lengths):
            fail("eval_lengths", self.eval_lengths, "a non-empty tuple of integers >= 1")
        if self.memory_preset not in MEMORY_PRESETS:
            fail("memory_preset", self.memory_preset, ", ".join(MEMORY_PRESETS))
        if self.device == "cuda":
            import torch  # only a run that asks for CUDA needs torch to check for it

            if not torch.cuda.is_available():
                raise ValueError(
                    "device='cuda' is invalid; allowed: auto, cpu (CUDA is not available)"
                )
        if not self.spike_backoff > 0:  # a rate of 0 after the first refusal ends learning
            fail("spike_backoff", self.spike_backoff, "a number in (0, 1]")
        if self.tokens_per_param is not None and not self.tokens_per_param > 0:
            fail("tokens_per_param", self.tokens_per_param, "a number > 0 or None")
        self.schedule = parse_schedule(self.schedule).spec  # validates, canonical spelling
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:+=,-]*", self.name):
            raise ValueError(f"name={self.name!r} is invalid; allowed: letters, digits and _.:+=,-")

    def _check_float32(self) -> None:
        """Every float field finite as the float32 training computes in, and so every learning
        rate the optimizers get (lr_scale x rate, x (n_embd/768)^-1/2 for embedding and head;
        lrt_lab.training.loop.make_optimizers): beyond it the first step fails instead of
        diverging."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and abs(value) > FLOAT32_MAX:
                fail(
                    f.name,
                    value,
                    f"a number of magnitude <= {FLOAT32_MAX:.3g} (it must be finite as float32, "
                    "the dtype training computes in)",
                )
        n_embd = self.overrides.get("n_embd", PRESETS.get(self.preset, {}).get("n_embd", 1))
        width = (n_embd / 768) ** -0.5 if is_int(n_embd) and n_embd >= 1 else 768**0.5
        rates = {
            "matrix_lr": self.matrix_lr,
            "embedding_lr": self.embedding_lr * width,
            "head_lr": self.head_lr * width,
            "scalar_lr": self.scalar_lr,
        }
        name, top = max(rates.items(), key=lambda kv: kv[1])
        limit = FLOAT32_MAX / RATE_HEADROOM / max(1.0, self.weight_decay)
        if self.lr_scale * top > limit:
            fail(
                "lr_scale",
                self.lr_scale,
                f"a scale whose learning rates stay finite as float32: lr_scale x {name}"
                f"{' x (n_embd/768)^-1/2' if name in ('embedding_lr', 'head_lr') else ''} = "
                f"{self.lr_scale * top:.3g}, above {limit:.3g} (float32's largest, with room "
                "for the optimizers' step factors); lower lr_scale or the rates",
            )

    @property
    def run_name(self) -> str:
        """The run folder's name: `name` when given, else `base_name` followed by
        `options_digest` where the run sets task options or model overrides, so that a one-off
        ablation (`--task-opt X=1`, `--set n_layer=3`) gets a folder of its own instead of the
        base run's."""
        if self.name:
            return self.name
        digest = self.options_digest
        return f"{self.base_name}-{digest}" if digest else self.base_name

    @property
    def base_name(self) -> str:
        """The name derived from the task, length, preset, model, schedule, budget and seed, with
        no digest of the options: the sweep builds its names from it (each variant of a sweep
        carries its label instead), so the names of the runs it trained before the digest existed
        stay theirs."""
        sched = "" if self.model != "lrt" else f"-{self.schedule}"
        if self.model == "lrt" and self.memory_preset != "paper":  # the default keeps older names
            sched += f"-{self.memory_preset}"
        if self.tokens_per_param is not None:  # one run per budget point
            sched += f"-R{self.tokens_per_param:g}"
            sched += "-matrices" if self.param_convention == "matrices" else ""
        return f"{self.task}-L{self.length}-{self.preset}-{self.model}{sched}-s{self.seed}".replace(
            ":", "_"
        )

    @property
    def options_digest(self) -> str:
        """`o` and the first OPTIONS_DIGEST_CHARS hex digits of sha256 over the canonical JSON of
        task_options and overrides (sorted keys, no spaces); "" when both are empty. The same
        options give the same digest in every process and on every machine, whatever their order."""
        if not self.task_options and not self.overrides:
            return ""
        text = json.dumps(
            {"overrides": self.overrides, "task_options": self.task_options},
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        )
        return "o" + hashlib.sha256(text.encode()).hexdigest()[:OPTIONS_DIGEST_CHARS]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_value(text: str):
    """A --set value: JSON (numbers, true/false, null, lists) or else a plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def stored_train_config(saved):
    """A run's config.json["train"] with today's default for every field the run predates (a run
    trained before `param_convention` existed counted its parameters as "all" does), so that it
    compares equal to the TrainConfig that would train it now. Anything but a dict is returned
    as it is."""
    return {**defaults(), **saved} if isinstance(saved, dict) else saved


def defaults() -> dict:
    """{field: default} of TrainConfig, without constructing one (which checks the schedule)."""
    return field_defaults(TrainConfig)
