"""lrt_lab: a research sandbox for the Latent Recurrent Transformer (LRT).

    from lrt_lab import ModelConfig, MemoryConfig, LRT
    from lrt_lab.schedules import OnePass, Interleaved, FullSequence, Chunked, Exact, run_schedule
    from lrt_lab.decode import Decoder

The names below load on first use (PEP 562), so light modules such as lrt_lab.results (the run
store the dashboard reads) do not pay for importing torch.
"""

import importlib

_LAZY = {"LRT": "model", "MemoryConfig": "config", "ModelConfig": "config", "PRESETS": "config",
         "preset": "config", "memory_preset": "config", "MEMORY_PRESETS": "config"}

__all__ = list(_LAZY)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'lrt_lab' has no attribute {name!r}")
