"""scale: the ``lrt_lab`` core lifted to multi-GPU FineWeb-Edu pretraining.

Part 1 (data side, no GPU needed):

* :mod:`lrt_scale.data` -- the shard format, ``python -m lrt_scale.data download``, a local shard
reader.
* :mod:`lrt_scale.tokenizer` -- byte-level BPE (train with HF ``tokenizers``, encode with
``tiktoken``),
  ``token_bytes()`` for bits-per-byte.
* :mod:`lrt_scale.loader` -- ``DistributedPackingLoader``: per-rank row groups, BOS + best-fit
packing,
  exact resume.

The dependency points one way: ``scale`` may import ``lrt_lab``, never the reverse.
"""

from importlib import import_module

# Lazy exports: ``python -m lrt_scale.data download`` should not pay for importing torch.
_EXPORTS = {
    "DistributedPackingLoader": "loader",
    "SPECIAL_TOKENS": "tokenizer",
    "Tokenizer": "tokenizer",
    "train_tokenizer": "tokenizer",
    "download_shards": "data",
    "iter_documents": "data",
    "list_shards": "data",
    "text_iterator": "data",
    "write_shard": "data",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
