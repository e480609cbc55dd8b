"""lrt_lab: a research sandbox for the Latent Recurrent Transformer (LRT).

    from lrt_lab import LRT, ModelConfig, MemoryConfig, preset
    from lrt_lab import OnePass, Interleaved, FullSequence, Chunked, Exact, run_schedule
    from lrt_lab import Decoder, generate, hooks, run_with_cache, TrainConfig, train, load_runs

Every name a user needs is importable from here, so a move inside the package breaks no user code.
The package is layered (docs/design.md), each folder importing only the ones below it:
`commands` (the CLI, demo, bench) > `analysis` > `training` (the loop, optimizers, sweeps) >
`run` (schedules, decoding, evaluation, hooks) | `store` (the run store and reports, no torch)
> `core` (the model's math, configs, the protocols).

The names load on first use (PEP 562), so light modules such as the run store, which the
dashboard reads, do not pay for importing torch.
"""

import importlib

_LAYERS = {
    "lrt_lab.core.config": (
        "ModelConfig",
        "MemoryConfig",
        "PRESETS",
        "MEMORY_PRESETS",
        "preset",
        "memory_preset",
    ),
    "lrt_lab.core.model": ("LRT", "LanguageModel"),
    "lrt_lab.core.baselines": ("LoopTransformer", "PonderLM", "build_baseline"),
    "lrt_lab.core.memory": ("MemoryPathway", "register_memory"),
    "lrt_lab.core.interface": (
        "SequenceModel",
        "Schedule",
        "Task",
        "ScheduleRun",
        "Measured",
        "Forwards",
    ),
    "lrt_lab.core.hook_points": ("HookPoint", "hook_points"),
    "lrt_lab.core.loss": ("IGNORE_INDEX", "cross_entropy"),
    "lrt_lab.run.schedules": (
        "StagedSchedule",
        "OnePass",
        "Interleaved",
        "FullSequence",
        "Chunked",
        "Exact",
        "FixedPoint",
        "Rollout",
        "GaussSeidel",
    ),
    "lrt_lab.run.registry": ("register_schedule", "parse_schedule", "as_schedule"),
    "lrt_lab.run.runner": ("run_schedule", "run_with_cache", "ScheduleOutput"),
    "lrt_lab.run.decode": ("Decoder", "generate"),
    "lrt_lab.run.hooks": ("hooks", "capture", "zero_at", "patch_from"),
    "lrt_lab.run.patching": ("route_effects", "run_patched", "generate_patched"),
    "lrt_lab.run.evaluation": ("evaluate",),
    "lrt_lab.training.loop": ("TrainConfig", "train"),
    "lrt_lab.training.optim": ("build_optimizers", "param_groups"),
    "lrt_lab.training.sweep": ("run_sweep", "load_spec"),
    "lrt_lab.store.results": ("Run", "load_runs", "load_metrics", "load_table"),
}
_LAZY = {name: module for module, names in _LAYERS.items() for name in names}

__all__ = sorted(_LAZY)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lrt_lab' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
