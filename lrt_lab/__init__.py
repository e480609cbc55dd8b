"""lrt_lab: a research sandbox for the Latent Recurrent Transformer (LRT).

    from lrt_lab import ModelConfig, MemoryConfig, LRT
    from lrt_lab.run.schedules import OnePass, Interleaved, FullSequence, Chunked, Exact, run_schedule
    from lrt_lab.run.decode import Decoder

The names below load on first use (PEP 562), so light modules such as lrt_lab.store.results (the run
store the dashboard reads) do not pay for importing torch.
"""

import importlib

_LAZY = {"LRT": "lrt_lab.core.model", "MemoryConfig": "lrt_lab.core.config", "ModelConfig": "lrt_lab.core.config", "PRESETS": "lrt_lab.core.config",
         "preset": "lrt_lab.core.config", "memory_preset": "lrt_lab.core.config", "MEMORY_PRESETS": "lrt_lab.core.config"}

__all__ = list(_LAZY)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lrt_lab' has no attribute {name!r}")
