"""Model configuration: the nanochat-style backbone and the LRT memory pathway.

`ModelConfig(memory=None)` is a plain transformer; `ModelConfig(memory=MemoryConfig())` is the
paper's default LRT (sec. 2: KV projection + residual injection, shared projections, dual gates,
m_{t-1} from an upper-middle source layer). Every option of the paper's ablations (sec. 5.4 and
appendix "Additional Architecture Ablations") is a field of `MemoryConfig`.

Configs are validated at construction: a bad value raises ValueError naming the field and what is
allowed, so a typo on the command line never becomes a silently different experiment.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

# fail and check_int are re-exported for the tasks
from lrt_lab.core.plugins import MECHANISM_GROUP, load_entry_points, route
from lrt_lab.core.validation import check_choice, check_fields, check_int, fail  # noqa: F401

FLOAT32_MAX = 3.4028234663852886e38


# Memory mechanisms by name: MemoryConfig.mechanism's allowed values, and the MemoryPathway class
# each builds. Filled by `lrt_lab.core.memory.register_memory` ("lrt": the paper's pathway, and
# any a user registers), so validation and the generated invariant tests see every one.
# "lrt" is known before lrt_lab.core.memory (which fills in its class) is imported.
MEMORY_MECHANISMS: dict[str, type | None] = {"lrt": None}


def check_mechanism(name) -> None:
    """A registered mechanism's name; an unknown one first loads the modules installed packages
    name under the entry point group `lrt_lab.memory_mechanisms` (lrt_lab.core.plugins), then is
    refused, naming the route to one's own."""
    if isinstance(name, str) and name not in MEMORY_MECHANISMS:
        load_entry_points(MECHANISM_GROUP)
    if not isinstance(name, str) or name not in MEMORY_MECHANISMS:
        known = ", ".join(repr(n) for n in MEMORY_MECHANISMS)
        fail("memory.mechanism", name, f"{known}; {route(MECHANISM_GROUP)}")


@dataclass(frozen=True)
class MemoryConfig:
    """The LRT memory pathway (paper sec. 2). Defaults are the paper's LRT-shared.

    source_layer:    the layer number (from 1, as n_layer counts: the output of block index
                     source_layer - 1, hook `blocks.{source_layer - 1}.hook_resid_post`) whose
                     output h^src_t is the memory m_t. None resolves to round(0.6 * n_layer)
                     (layer 12 of 20, 14 of 24: the paper's choice).
    source_avg:      >1 makes m_t a learned softmax average of the outputs of layers
                     source_layer-source_avg+1 .. source_layer ("learned avg. above 4 layers").
    lag:             token t reads m_{t-lag} (the temporal-source ablation: m_{t-1} .. m_{t-4}).
    lag_avg:         >1 makes the read a learned softmax average of
                     m_{t-lag} .. m_{t-lag-lag_avg+1}.
    residual:        residual injection x' = alpha*x + gamma*m (sec. 2.2).
    gamma_init:      initial gamma. The paper uses 0.1; a prototype on A5 learned nothing with 0.1
                     and learned well when the model started as the plain transformer
                     (gamma_init=0, rec_init="zero"), so the initialisation is a first-class option.
    kv:              which of keys/values receive the recurrent projection (sec. 2.1): "both",
                     "keys", "values", or "none".
    kv_mode:         "add" (the paper's default) or "replace": in the first third of the layers
                     the local K/V are replaced by the recurrent ones (the "KV replace, early 1/3
                     layers" ablation); the remaining layers add.
    projections:     "shared" (one W_k,rec / W_v,rec for all layers, +0.3% params at d20) or
                     "layerwise" (one pair per layer, +4.8%).
    gate:            dual per-KV-head gates 2*sigmoid(W_g x) (eq. 3); W_g is zero-initialised.
    rec_init:        "uniform" (like the other K/V projections) or "zero" (so the LRT starts exactly
                     as the plain transformer).
    queries:         also inject the memory into the queries,
                     q = g_loc * q_local + g_rec * W_q,rec m (an extension beyond the paper; the
                     gates are the KV heads' gates, shared by the query heads of each group).
    gate_channels:   the gates read only the first gate_channels channels of the normed residual,
                     W_g in R^{2 n_kv x gate_channels}. None (default) = all d channels, as the
                     paper's eq. 3 writes W_g in R^{2 n_kv x d}; 32 is the paper's released code
                     (`ve_gate_channels = 32` in its nanochat/gpt.py, as nanochat's value-embedding
                     gate).
    source_tap:      which activation of the source layer becomes m_t: "resid" (the residual stream
                     after the block: the paper's text), "normed" (its RMS norm: what the paper's
                     released code feeds back; with source_layer = n_layer it is the LM head's
                     input), "attn_out" (the block's attention output).
    update:          how m_t is formed from the source activation h_t: "overwrite" (m_t = h_t, the
                     paper) or "gated" (m_t = z * m + (1 - z) * h_t, z = sigmoid(W_z h_t) per
                     channel, m the memory position t read, i.e. m_{t-lag}: a GRU-like memory that
                     updates itself, an exponential moving average when W_z is constant; W_z
                     zero-initialised, so z starts at 1/2). An extension beyond the paper.
    reset_memory_at_bos: zero the injected memory when its source position lies in an earlier
                     document (documents start at ModelConfig.bos_token_id). Off by default, as in
                     the paper's packed-row pretraining, where memory crosses document boundaries.
    mechanism:       the pathway class that implements the memory (`register_memory`): "lrt", the
                     paper's (`lrt_lab.core.memory.MemoryPathway`), or one registered by name,
                     e.g. a subclass defined in the user's own file (docs/extending.md).
    gate_value_embeds: whether the local gate also scales the value embedding. False (the
                     default): v = g_loc * c_v h + g_ve * ve + g_rec * W_v,rec m, as the paper's
                     released code computes it; the paper keeps value embeddings a baseline
                     component "kept fixed across the baseline and LRT variants" (app. A), so the
                     memory's gate leaves them alone. True: v = g_loc * (c_v h + g_ve * ve) +
                     g_rec * W_v,rec m, the convention of runs recorded before this field existed
                     (kept so they stay reproducible; `LEGACY_FIELDS`). Forwards agree while
                     g_loc = 1 (at init); gradients of the gates differ from the first step.
    """

    source_layer: int | None = None
    source_avg: int = field(default=1, metadata={"min": 1})
    lag: int = field(default=1, metadata={"min": 1})
    lag_avg: int = field(default=1, metadata={"min": 1})
    residual: bool = field(default=True, metadata={"choices": (True, False)})
    gamma_init: float = 0.1
    kv: str = field(default="both", metadata={"choices": ("both", "keys", "values", "none")})
    kv_mode: str = field(default="add", metadata={"choices": ("add", "replace")})
    projections: str = field(default="shared", metadata={"choices": ("shared", "layerwise")})
    gate: bool = field(default=True, metadata={"choices": (True, False)})
    rec_init: str = field(default="uniform", metadata={"choices": ("uniform", "zero")})
    reset_memory_at_bos: bool = field(default=False, metadata={"choices": (True, False)})
    queries: bool = field(default=False, metadata={"choices": (True, False)})
    source_tap: str = field(default="resid", metadata={"choices": ("resid", "normed", "attn_out")})
    gate_channels: int | None = field(default=None, metadata={"choices": (None, 32)})
    update: str = field(default="overwrite", metadata={"choices": ("overwrite", "gated")})
    mechanism: str = field(default="lrt", metadata={"choices": MEMORY_MECHANISMS})
    gate_value_embeds: bool = field(default=False, metadata={"choices": (True, False)})

    def __post_init__(self):
        check_mechanism(self.mechanism)
        check_fields(self, "memory.")  # types, finite numbers, declared choices (any field)
        # integer fields declare their minimum in their metadata (the generated invariant tests
        # in tests/test_invariants.py read the same declarations)
        for f in dataclasses.fields(self):
            if "min" in f.metadata:
                check_int(f"memory.{f.name}", getattr(self, f.name), f.metadata["min"])
        if self.source_layer is not None:
            check_int("memory.source_layer", self.source_layer, 1)
        if (
            not isinstance(self.gamma_init, (int, float))
            or isinstance(self.gamma_init, bool)
            or not math.isfinite(self.gamma_init)
        ):
            fail("memory.gamma_init", self.gamma_init, "a finite number")
        if abs(self.gamma_init) > FLOAT32_MAX:  # the parameter is float32 (or bf16) in training
            fail(
                "memory.gamma_init",
                self.gamma_init,
                f"a number of magnitude <= {FLOAT32_MAX:.3g} (it must be finite as float32, "
                "the dtype it is trained in)",
            )
        if not self.residual and self.kv == "none" and not self.queries:
            fail(
                "memory.kv",
                self.kv,
                "'both', 'keys' or 'values' when memory.residual is False "
                "(with neither pathway, use memory=None for a plain transformer)",
            )

    @classmethod
    def choices(cls) -> dict[str, tuple]:
        """The categorical options and their allowed values (from the fields' metadata)."""
        return {
            f.name: f.metadata["choices"]
            for f in dataclasses.fields(cls)
            if "choices" in f.metadata
        }

    @property
    def uses_kv(self) -> bool:
        return self.kv != "none"

    @property
    def gated(self) -> bool:
        """Whether dual gates 2*sigmoid(W_g x) exist: some attention input receives memory."""
        return self.gate and (self.uses_kv or self.queries)

    @property
    def read_offsets(self) -> range:
        """How far back a position's memory reaches: position t reads m_{t-o} for o in this range
        (sec. 2; m_{t-lag} .. m_{t-lag-lag_avg+1}). The one statement every exactness rule derives
        from: the decoder keeps `history` rows, and a chunk of at most `exact_chunk` positions never
        reads a row written inside itself (the Exact split and Chunked's exact limit, sec. 3.2).
        A mechanism that reads further back or nearer widens this range and nothing else."""
        return range(self.lag, self.lag + self.lag_avg)

    @property
    def history(self) -> int:
        """How many past memory rows a position can read: the decoder keeps only these."""
        return self.read_offsets.stop - 1

    @property
    def exact_chunk(self) -> int:
        """The longest chunk whose positions read only rows written before it: the nearest
        offset."""
        return self.read_offsets.start


@dataclass(frozen=True)
class ModelConfig:
    """A nanochat-style decoder (appendix "Implementation Details") with an optional LRT memory.

    window_pattern is tiled over the layers ("S" = short window of short_window tokens, "L" = full
    context); the last layer is always full. short_window=None means sequence_len // 2 (nanochat).

    window_convention says what a window of N tokens covers: "nanochat" (the default) N + 1 keys,
    the query's own and the N before it, as nanochat's and the paper's released code's
    flash-attn window (N, 0) does; "keys" N keys, the query's own and the N - 1 before it: the
    convention of runs recorded before this field existed (kept so they stay reproducible;
    `LEGACY_FIELDS`). With window_pattern "L" the two are the same model.
    """

    vocab_size: int = 32768
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 6
    n_kv_head: int = 6
    sequence_len: int = 2048
    window_pattern: str = "SSSL"
    short_window: int | None = None
    use_value_embeds: bool = True
    use_x0_residual: bool = True
    use_resid_lambdas: bool = True
    softcap: float | None = 15.0
    rope_base: float = 10000.0
    bos_token_id: int | None = None
    window_convention: str = field(default="nanochat", metadata={"choices": ("nanochat", "keys")})
    memory: MemoryConfig | None = None

    def __post_init__(self):
        check_fields(self)  # types and finite numbers first, so the checks below compare numbers
        check_int("vocab_size", self.vocab_size, 1)
        check_int("n_layer", self.n_layer, 1)
        check_int("n_embd", self.n_embd, 2)
        check_int("n_head", self.n_head, 1)
        check_int("n_kv_head", self.n_kv_head, 1)
        check_int("sequence_len", self.sequence_len, 1)
        if self.n_embd % self.n_head:
            fail("n_head", self.n_head, f"a divisor of n_embd={self.n_embd}")
        if self.n_head % self.n_kv_head:
            fail("n_kv_head", self.n_kv_head, f"a divisor of n_head={self.n_head}")
        if (self.n_embd // self.n_head) % 2:
            fail("n_head", self.n_head, "a value giving an even head_dim (RoPE rotates pairs)")
        if not self.window_pattern or set(self.window_pattern.upper()) - {"S", "L"}:
            fail("window_pattern", self.window_pattern, "a non-empty string of 'S' and 'L'")
        if self.short_window is not None:
            check_int("short_window", self.short_window, 1)
        for name in ("use_value_embeds", "use_x0_residual", "use_resid_lambdas"):
            check_choice(name, getattr(self, name), (True, False))
        positive_number = isinstance(self.softcap, (int, float)) and self.softcap > 0
        if self.softcap is not None and not positive_number:
            fail("softcap", self.softcap, "a positive number or None")
        if not (isinstance(self.rope_base, (int, float)) and self.rope_base > 1):
            fail("rope_base", self.rope_base, "a number > 1")
        if self.bos_token_id is not None:
            check_int("bos_token_id", self.bos_token_id, 0, self.vocab_size - 1)
        if self.memory is not None:
            if not isinstance(self.memory, MemoryConfig):
                fail("memory", self.memory, "a MemoryConfig or None")
            m = self.memory
            if m.source_layer is not None and m.source_layer > self.n_layer:
                fail(
                    "memory.source_layer",
                    m.source_layer,
                    f"an integer in [1, n_layer={self.n_layer}]",
                )
            if m.source_avg > self.source_layer:
                fail(
                    "memory.source_avg",
                    m.source_avg,
                    f"an integer in [1, source_layer={self.source_layer}]",
                )
            if m.gate_channels is not None and m.gate_channels > self.n_embd:
                fail(
                    "memory.gate_channels",
                    m.gate_channels,
                    f"None or an integer <= n_embd={self.n_embd}",
                )
            if m.reset_memory_at_bos and self.bos_token_id is None:
                fail("bos_token_id", None, "a token id when memory.reset_memory_at_bos is True")

    # Derived shapes -------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def is_lrt(self) -> bool:
        return self.memory is not None

    @property
    def source_layer(self) -> int:
        """The resolved 1-based source layer (paper: round(0.6 * depth))."""
        if self.memory is not None and self.memory.source_layer is not None:
            return self.memory.source_layer
        return max(1, round(0.6 * self.n_layer))

    def window_sizes(self) -> list[int | None]:
        """Per-layer attention window as the number of keys a query sees, its own included (None =
        full causal context): short_window + 1 under the "nanochat" convention (a window of N
        covers the query and the N tokens before it), short_window under "keys"."""
        short = self.short_window or max(1, self.sequence_len // 2)
        short += 1 if self.window_convention == "nanochat" else 0
        pattern = self.window_pattern.upper()
        sizes = [short if pattern[i % len(pattern)] == "S" else None for i in range(self.n_layer)]
        sizes[-1] = None  # the last layer always sees the full context (nanochat, paper app. A)
        return sizes

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """The config a stored dict describes (`to_dict`'s output, e.g. a run's config.json): a
        field the dict lacks was written before that field existed, so it reads as what the run
        ran under (`LEGACY_FIELDS`), not as today's default."""
        d = with_legacy_fields(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            fail("config", sorted(unknown), ", ".join(f.name for f in dataclasses.fields(cls)))
        mem = d.pop("memory", None)
        if isinstance(mem, dict):
            known = {f.name for f in dataclasses.fields(MemoryConfig)}
            bad = set(mem) - known
            if bad:
                fail("memory", sorted(bad), ", ".join(sorted(known)))
            mem = MemoryConfig(**mem)
        return cls(**d, memory=mem)


# Fields added after runs were recorded, with the value those runs ran under: a stored config
# without the field reads as that value, not as today's default, so an old run is rebuilt as it was
# trained and is never pooled with runs of the new convention (lrt_lab.store reads configs through
# `with_legacy_fields` too). Top level: ModelConfig's fields; "memory": MemoryConfig's.
LEGACY_FIELDS: dict[str, dict] = {
    "model": {"window_convention": "keys"},
    "memory": {"gate_value_embeds": True},
}


def with_legacy_fields(d: dict) -> dict:
    """A copy of a stored ModelConfig dict with every field it lacks from `LEGACY_FIELDS` filled
    in with the value it ran under (a non-dict memory, e.g. None, is left as it is)."""
    d = {**LEGACY_FIELDS["model"], **d}
    if isinstance(d.get("memory"), dict):
        d["memory"] = {**LEGACY_FIELDS["memory"], **d["memory"]}
    return d


# Memory presets ---------------------------------------------------------------------------------
# The paper's text and its released code (github.com/OoDBag/Latent_recurrent_transformer,
# nanochat/gpt.py) describe two different memories; each preset states one of them, with its source.
# Fields not named keep MemoryConfig's defaults (the paper's), which the released code shares:
# gamma_init 0.1 ("interleaved_lambdas.fill_(0.1)"), uniform W_rec with the std of W_k/W_v,
# zero-initialised gates, K and V projection plus residual injection, lag 1.
MEMORY_PRESETS: dict[str, str] = {
    # sec. 2 and app. "Source layer": m_t = h_t^{l_src}, the raw residual stream after block
    # l_src = round(0.6 L) (12 of 20, 14 of 24); "LRT-shared" projections (sec. 5, the default);
    # gamma_l initialised to 0.1 (eq. 6); gates 2 sigmoid(W_g x) with W_g in R^{2 n_kv x d} (eq. 3).
    "paper": "source layer round(0.6 L), raw residual, shared projections, gamma 0.1, "
    "uniform W_rec, gates on all d channels",
    # the released code: the feedback is h_final "after final norm" (the LM head's input), so
    # source_layer = L with source_tap "normed"; one K and one V projection per layer
    # (`interleaved_projections`, `interleaved_key_projections`); the gates read
    # x[..., :ve_gate_channels] with ve_gate_channels = 32 (GPTConfig default at commit e0d0f6e).
    # Its third gate channel is the value embedding's gate: v = g_loc c_v h + g_ve ve + g_fb W_v m,
    # the value embedding outside the local gate (MemoryConfig.gate_value_embeds False, every
    # preset's default), with g_ve read from the same 32 channels (lrt_lab's ve_gate).
    "released": "final layer, RMS-normed, layerwise projections, gamma 0.1, uniform W_rec, "
    "gates on the first 32 channels",
}


def memory_preset(name: str, n_layer: int, **overrides) -> MemoryConfig:
    """The MemoryConfig of a named preset (MEMORY_PRESETS) for a model of n_layer blocks, with field
    overrides on top (e.g. gamma_init=0.0, rec_init="zero" for the start-as-transformer init)."""
    if name not in MEMORY_PRESETS:
        fail("memory_preset", name, ", ".join(MEMORY_PRESETS))
    check_int("n_layer", n_layer, 1)
    fields = {}  # "paper" is MemoryConfig's defaults: source_layer None resolves to round(0.6 L)
    if name == "released":
        fields = dict(
            source_layer=n_layer, source_tap="normed", projections="layerwise", gate_channels=32
        )
    return MemoryConfig(**{**fields, **overrides})


def _nanochat_shape(depth: int) -> dict:
    # nanochat's constant aspect ratio (app. A "Model scaling"): d = 64 * depth, head_dim 128.
    d = 64 * depth
    return dict(
        n_layer=depth,
        n_embd=d,
        n_head=d // 128,
        n_kv_head=d // 128,
        vocab_size=32768,
        sequence_len=2048,
        window_pattern="SSSL",
    )


PRESETS: dict[str, dict] = {
    # Tests: every pathway active, windows exercised at short T, GQA (2 query heads per KV head).
    "tiny": dict(
        n_layer=2,
        n_embd=32,
        n_head=4,
        n_kv_head=2,
        vocab_size=64,
        sequence_len=16,
        window_pattern="SL",
        short_window=4,
    ),
    # CPU-sized runs (demo, bench on a laptop).
    "small": dict(
        n_layer=4,
        n_embd=128,
        n_head=2,
        n_kv_head=2,
        vocab_size=64,
        sequence_len=64,
        window_pattern="L",
    ),
    # The paper's state-tracking model (app. "Non-Commutative State Tracking"): depth 4, d 256.
    "a5": dict(
        n_layer=4,
        n_embd=256,
        n_head=2,
        n_kv_head=2,
        vocab_size=60,
        sequence_len=64,
        window_pattern="L",
    ),
    "d12": _nanochat_shape(12),
    "d20": _nanochat_shape(20),
    "d24": _nanochat_shape(24),
}


def preset(name: str, memory: MemoryConfig | None = None, **overrides) -> ModelConfig:
    """A named backbone shape, optionally with an LRT memory and field overrides."""
    if name not in PRESETS:
        fail("preset", name, ", ".join(PRESETS))
    fields = {**PRESETS[name], **overrides}
    return ModelConfig(**fields, memory=memory)
