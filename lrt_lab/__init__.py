"""lrt_lab: a research sandbox for the Latent Recurrent Transformer (LRT).

    from lrt_lab import ModelConfig, MemoryConfig, LRT
    from lrt_lab.schedules import OnePass, Interleaved, FullSequence, Chunked, Exact, run_schedule
    from lrt_lab.decode import Decoder
"""

from .config import PRESETS, MemoryConfig, ModelConfig, preset
from .model import LRT

__all__ = ["LRT", "MemoryConfig", "ModelConfig", "PRESETS", "preset"]
__version__ = "0.1.0"
