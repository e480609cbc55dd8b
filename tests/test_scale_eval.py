"""lrt_scale.evaluate: BPB against hand values, sequential == parallel where they must agree, CORE
on a synthetic bundle whose answers are known (a character tokenizer and a "copy the current
token" model)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.core.interface import SequenceModel
from lrt_lab.run.schedules import Exact, Interleaved, OnePass
from lrt_scale import evaluate as ev

torch.set_num_threads(1)


# Stubs
# ----------------------------------------------------------------------------------------------
class _StubCache:
    def __init__(self, max_len):
        self.length, self.max_len = 0, max_len

    def load(self, buffer, tokens):
        self.length = tokens.size(1)

    def append_tokens(self, tokens):
        self.length += tokens.size(1)


class FixedLM(torch.nn.Module):
    """The same next-token distribution at every position, whatever the context: a model of its own
    (not an LRT) that implements lrt_lab.core.interface.SequenceModel."""

    pathway = None
    forward_cost, forwards_per_token, has_sequential_decoding = 1.0, 1, False

    def __init__(self, probs):
        super().__init__()
        self.register_buffer("logp", torch.tensor(probs, dtype=torch.float64).log())
        # Decoder reads a dtype/device
        self.anchor = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        self.config = SimpleNamespace(is_lrt=False, vocab_size=len(probs))

    def empty_buffer(self, idx):
        return None

    def stage(self, tokens, P, buffer, hooks=None):
        return self.logp.expand(tokens.size(0), tokens.size(1), -1), buffer

    def new_decode_cache(self, batch_size, max_len, device=None, dtype=None):
        return _StubCache(max_len)

    def exact_split(self, chunk=1):
        return None

    def param_roles(self):
        return {"anchor": "scalar"}

    def param_report(self):
        return {"total": 1}


class CharTokenizer:
    """One token per ASCII character (id = code point), BOS = 0."""

    bos_token_id = 0
    vocab_size = 128

    def encode(self, text, prepend_bos=False):
        return [0] * prepend_bos + [ord(c) for c in text]


def copy_forward(ids):
    """Logits that prefer "the next token repeats the current one"."""
    return 5.0 * torch.nn.functional.one_hot(ids, 128).double()


# BPB
# ------------------------------------------------------------------------------------------------
P = [0.5, 0.25, 0.125, 0.125]  # -log2 p = 1, 2, 3, 3 bits
TOKEN_BYTES = torch.tensor([2, 1, 3, 0])  # token 3 is "special": 0 bytes, counted in neither sum
TARGETS = torch.tensor([[0, 1, 2, 3], [0, 0, 1, -1]])
INPUTS = torch.zeros(2, 4, dtype=torch.long)


def test_bpb_of_a_model_with_known_probabilities():
    model = FixedLM(P)
    assert isinstance(model, SequenceModel)  # a model outside lrt_lab needs only the interface
    batches = [(INPUTS, TARGETS)]
    # bits: (1 + 2 + 3) + (1 + 1 + 2) = 10; bytes: (2 + 1 + 3) + (2 + 2 + 1) = 11
    assert ev.parallel_bpb(model, batches, TOKEN_BYTES)["bpb"] == pytest.approx(10 / 11, abs=1e-12)
    res = ev.parallel_bpb(model, batches, TOKEN_BYTES, Interleaved(2))
    assert res["bpb"] == pytest.approx(10 / 11, abs=1e-12)
    # stage 0: every position; stage 1: t = 0, 2 -> (1 + 3 + 1 + 2) / (2 + 3 + 2 + 1); stage 2: t =
    # 1, 3 -> (2 + 1) / (1 + 2)
    assert res["stages"] == pytest.approx([10 / 11, 7 / 8, 1.0], abs=1e-12)
    assert res["bytes"] == 11 and res["tokens"] == 8
    assert ev.sequential_bpb(model, batches, TOKEN_BYTES)["bpb"] == pytest.approx(
        10 / 11, abs=1e-12
    )
    # after a 2-token prompt only t >= 1 is scored: (2 + 3 + 1 + 2) bits / (1 + 3 + 2 + 1) bytes
    assert ev.sequential_bpb(model, batches, TOKEN_BYTES, prompt_len=2)["bpb"] == pytest.approx(
        8 / 7, abs=1e-12
    )
    assert ev.parallel_bpb(model, batches, TOKEN_BYTES, min_position=1)["bpb"] == pytest.approx(
        8 / 7, abs=1e-12
    )
    assert ev.parallel_bpb(model, batches, TOKEN_BYTES, OnePass())["stages"] == pytest.approx(
        [10 / 11]
    )
    with pytest.raises(ValueError, match="prompt_len"):
        ev.sequential_bpb(model, batches, TOKEN_BYTES, prompt_len=4)
    with pytest.raises(ValueError, match="empty"):
        ev.parallel_bpb(model, [], TOKEN_BYTES)


def _data(V=64, B=3, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(V, (B, T + 1), generator=g)
    token_bytes = torch.randint(0, 4, (V,), generator=g)
    return [(rows[:, :-1], rows[:, 1:])], token_bytes


@pytest.mark.parametrize("memory", [None, MemoryConfig()], ids=["transformer", "lrt"])
def test_sequential_bpb_equals_parallel_where_decoding_is_exact(memory):
    """Plain transformer: cached decoding == its forward. LRT: decoding == the Exact schedule."""
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=memory)).double()
    with torch.no_grad():  # wake the memory pathway up (gamma, gates) so the test is not vacuous
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batches, tb = _data()
    schedule = Exact() if memory is not None else OnePass()
    par = ev.parallel_bpb(model, batches, tb, schedule)["bpb"]
    assert ev.sequential_bpb(model, batches, tb)["bpb"] == pytest.approx(par, abs=1e-10)
    # the paper's prompt + continuation setting: prefill 6 tokens, decode the rest, score after the
    # prompt
    cont = ev.parallel_bpb(model, batches, tb, schedule, min_position=5)["bpb"]
    seq = ev.sequential_bpb(model, batches, tb, prompt_len=6, prefill=schedule)
    assert seq["bpb"] == pytest.approx(cont, abs=1e-10) and seq["prefill"] == schedule.spec
    if memory is not None:  # the parallel schedules are not exact recurrence: they differ, a little
        assert ev.parallel_bpb(model, batches, tb, Interleaved(2))["bpb"] != pytest.approx(
            par, abs=1e-10
        )
        one = ev.sequential_bpb(model, batches, tb, prompt_len=6, prefill="onepass")["bpb"]
        assert math.isfinite(one) and one != pytest.approx(cont, abs=1e-12)


def per_token_sequential_nats(model, batches, token_bytes, prompt_len=0, prefill=None):
    """The reference: one Decoder per batch, one step per position, every (B, V) logits row kept
    and scored at the end (what sequential_bpb did before it batched)."""
    from lrt_lab.run.decode import Decoder

    nats = nbytes = 0.0
    with torch.no_grad():
        for inputs, targets in batches:
            B, T = inputs.shape
            dec = Decoder(model, B, T)
            logits = []
            if prompt_len:
                logits.append(dec.prefill(inputs[:, :prompt_len], prefill))
            for t in range(prompt_len, T):
                logits.append(dec.step(inputs[:, t]))
            first = max(prompt_len - 1, 0)
            logp = torch.stack(logits, 1).log_softmax(-1)
            tgt = targets[:, first:]
            per = -logp.gather(-1, tgt[..., None])[..., 0]
            w = token_bytes[tgt]
            nats += float((per * (w > 0)).sum())
            nbytes += float(w.sum())
    return nats, nbytes


@pytest.mark.parametrize("memory", [None, MemoryConfig()], ids=["transformer", "lrt"])
@pytest.mark.parametrize("prompt_len,prefill", [(0, None), (6, "interleaved:2"), (5, "exact")])
@pytest.mark.parametrize("max_rows", [None, 3])
def test_batched_sequential_bpb_equals_the_per_token_loop(memory, prompt_len, prefill, max_rows):
    """Rows of several batches decoded together (up to max_rows), and a memory-less model scored
    in one causal pass: the same nats and bytes as one decoder per batch stepping every position,
    in float64."""
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=memory)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batches = [_data(B=B, seed=s)[0][0] for B, s in ((2, 0), (3, 1), (1, 2))]
    tb = _data(seed=3)[1]
    nats, nbytes = per_token_sequential_nats(model, batches, tb, prompt_len, prefill)
    res = ev.sequential_bpb(model, batches, tb, prompt_len, prefill, max_rows=max_rows)
    assert res["nats"] == pytest.approx(nats, rel=1e-12, abs=1e-12)
    assert res["bytes"] == nbytes and res["tokens"] == 6 * (16 - max(prompt_len - 1, 0))
    assert nats > 0 and res["bpb"] == pytest.approx(nats / nbytes / math.log(2), rel=1e-12)


def test_decode_groups_concatenate_rows_of_one_length():
    rows = [torch.full((b, t), i) for i, (b, t) in enumerate([(2, 4), (2, 4), (1, 4), (2, 5)])]
    got = [x for x, _ in ev._decode_groups([(r, r) for r in rows], 4)]
    assert [tuple(x.shape) for x in got] == [(4, 4), (1, 4), (2, 5)]
    assert got[0][:, 0].tolist() == [0, 0, 1, 1]
    assert [tuple(x.shape) for x, _ in ev._decode_groups([(r, r) for r in rows], None)] == [
        (5, 4),
        (2, 5),
    ]


def test_bucket_sizes():
    assert [ev.bucket(n) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]
    assert [ev.bucket(n, 64, 300) for n in (1, 64, 65, 200, 256, 257, 300, 301)] == [
        64,
        64,
        128,
        256,
        256,
        300,
        300,
        301,
    ]


@pytest.mark.parametrize("spec", ["onepass", "interleaved:2", "chunked:5", "exact", "rollout:1"])
def test_core_forward_pads_to_few_shapes_and_changes_no_logit(spec):
    """CORE's forward pads every item to bucketed (rows, length) shapes, so a compiled stage sees a
    handful of shapes, not one per item; the logits of the real rows and positions are those of the
    unpadded forward (float64; causal schedules read nothing to their right)."""
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=MemoryConfig(), sequence_len=128)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    seen = []
    inner = ev.model_forward(model, spec, pad=False)
    padded = ev.padded_forward(lambda ids: seen.append(tuple(ids.shape)) or inner(ids), 128)
    g = torch.Generator().manual_seed(1)
    for B, T in ((1, 5), (2, 17), (3, 40), (4, 64), (5, 70), (2, 100), (1, 128)):
        ids = torch.randint(64, (B, T), generator=g)
        want = inner(ids)
        got = padded(ids)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert set(seen) <= {(r, n) for r in (1, 2, 4, 8) for n in (64, 128)}
    assert ev.model_forward(model, spec).__name__ == "run"  # padded
    assert ev.model_forward(model, "fixedpoint:0.1:4").__name__ == "forward"  # run as given


def test_interleaved_stage_bpb():
    """Stage 0 of Interleaved is the init pass (zero memory) == OnePass; merged == final logits."""
    torch.manual_seed(1)
    model = LRT(preset("tiny", memory=MemoryConfig())).double()
    batches, tb = _data(seed=1)
    res = ev.parallel_bpb(model, batches, tb, Interleaved(2))
    assert len(res["stages"]) == 3
    assert res["stages"][0] == pytest.approx(
        ev.parallel_bpb(model, batches, tb, OnePass())["bpb"], abs=1e-12
    )
    nats = bytes_ = 0.0
    for s, P in enumerate(Interleaved(2).stages(16)[1:], start=1):
        sub = [(x, y.masked_fill((torch.arange(16) % 2 != P.start)[None], -1)) for x, y in batches]
        part = ev.parallel_bpb(model, sub, tb, Interleaved(2))
        assert part["bpb"] == pytest.approx(res["stages"][s], abs=1e-12)
        nats, bytes_ = nats + part["nats"], bytes_ + part["bytes"]
    assert res["bpb"] == pytest.approx(nats / (math.log(2) * bytes_), abs=1e-12)


# CORE
# -----------------------------------------------------------------------------------------------
def test_prompt_rendering():
    shot_mc = {"query": "E?", "choices": ["x", "y"], "gold": 0}
    assert ev.render_mc({"query": "Q?", "choices": ["a", "b"], "gold": 1}, " ", [shot_mc]) == [
        "E? x\n\nQ? a",
        "E? x\n\nQ? b",
    ]
    shot_schema = {"context_options": ["c0", "c1"], "continuation": "k", "gold": 1}
    assert ev.render_schema(
        {"context_options": ["A", "B"], "continuation": "z", "gold": 0}, " ", [shot_schema]
    ) == ["c1 k\n\nA z", "c1 k\n\nB z"]
    shot_lm = {"context": "A ", "continuation": "B"}
    assert ev.render_lm({"context": " C ", "continuation": "D"}, " ", [shot_lm]) == [
        "A B\n\nC",
        "A B\n\nC D",
    ]
    assert ev.render_lm({"context": "C", "continuation": "D"}, " ") == ["C", "C D"]
    tok = CharTokenizer()
    seqs, starts, ends = ev.item_sequences(tok, "multiple_choice", ["Q? ab", "Q? cd"])
    assert starts == [4, 4] and ends == [6, 6]  # BOS + "Q? " shared; the choices differ
    seqs, starts, ends = ev.item_sequences(tok, "schema", ["xy k", "z k"])
    assert starts == [3, 2] and ends == [5, 4]  # " k" shared at the end
    seqs, starts, ends = ev.item_sequences(tok, "language_modeling", ["C", "C D"])
    assert seqs == [[0, 67, 32, 68]] and starts == [2] and ends == [4]


MC = [
    {"query": "xa", "choices": ["aa", "bb"], "gold": 0},  # copy prefers "aa" after "a": right
    {"query": "xb", "choices": ["aa", "bb"], "gold": 0},  # prefers "bb": wrong
    {"query": "xb", "choices": ["aa", "bb"], "gold": 1},  # right
    {"query": "xc", "choices": ["cc", "aa", "bb"], "gold": 0},
]  # right -> 3/4
SCHEMA = [
    {"context_options": ["pa", "pb"], "continuation": "aaa", "gold": 0},  # right
    {"context_options": ["pa", "pb"], "continuation": "bbb", "gold": 0},  # wrong
    {"context_options": ["qb", "qa"], "continuation": "bb", "gold": 0},
]  # right -> 2/3
LM = [
    {"context": "kk", "continuation": "kk"},  # right
    {"context": "km", "continuation": "kk"},  # copy predicts "m" after "m": wrong
    {"context": "  zz  ", "continuation": "zzz"},
]  # context trimmed: right -> 2/3
TASKS = [
    ("mc", "multiple_choice", 1, 25.0, MC),
    ("schema", "schema", 0, 50.0, SCHEMA),
    ("lm", "language_modeling", 1, 0.0, LM),
]
EXPECTED = {
    "accuracy": {"mc": 3 / 4, "schema": 2 / 3, "lm": 2 / 3},
    "centered": {"mc": (0.75 - 0.25) / 0.75, "schema": (2 / 3 - 0.5) / 0.5, "lm": 2 / 3},
}


def write_json_bundle(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    tasks = []
    for label, kind, shots, rb, items in TASKS:
        (d / f"{label}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
        tasks.append(
            {
                "label": label,
                "type": kind,
                "num_fewshot": shots,
                "random_baseline": rb,
                "continuation_delimiter": "",
            }
        )
    (d / "core.json").write_text(json.dumps({"tasks": tasks}))
    return d


def test_core_on_a_synthetic_bundle(tmp_path):
    out = ev.evaluate_core(copy_forward, CharTokenizer(), write_json_bundle(tmp_path / "b"))
    assert out["accuracy"] == pytest.approx(EXPECTED["accuracy"])
    assert out["centered"] == pytest.approx(EXPECTED["centered"])
    assert out["core"] == pytest.approx((2 / 3 + 1 / 3 + 2 / 3) / 3)
    # a model with no preference ties every choice: the first wins (nanochat's min), as for a
    # constant model
    flat = ev.evaluate_core(
        lambda ids: torch.zeros(*ids.shape, 128), CharTokenizer(), tmp_path / "b"
    )
    assert flat["accuracy"]["mc"] == pytest.approx(3 / 4) and flat["accuracy"]["lm"] == 0


def test_core_reads_the_dclm_bundle_layout(tmp_path):
    pytest.importorskip("yaml")
    d = tmp_path / "eval_bundle"
    (d / "eval_data" / "sub").mkdir(parents=True)
    lines, meta = ["icl_tasks:"], ["Eval Task,Task Category,Random baseline"]
    for label, kind, shots, rb, items in TASKS:
        (d / "eval_data" / "sub" / f"{label}.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in items)
        )
        lines += [
            f"- label: {label}",
            f"  dataset_uri: sub/{label}.jsonl",
            f"  num_fewshot: [{shots}]",
            f"  icl_task_type: {kind}",
            "  continuation_delimiter: ''",
        ]
        meta.append(f"{label},test,{rb}")
    (d / "core.yaml").write_text("\n".join(lines) + "\n")
    (d / "eval_meta_data.csv").write_text("\n".join(meta) + "\n")
    out = ev.evaluate_core(copy_forward, CharTokenizer(), d)
    assert out["centered"] == pytest.approx(EXPECTED["centered"])


def test_core_bundle_validation(tmp_path):
    with pytest.raises(ValueError, match="neither core.json nor core.yaml"):
        ev.load_bundle(tmp_path)
    d = write_json_bundle(tmp_path / "b")
    spec = json.loads((d / "core.json").read_text())
    spec["tasks"][0]["type"] = "cloze"
    (d / "core.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="type 'cloze'"):
        ev.load_bundle(d)
    spec["tasks"][0].update(type="schema", random_baseline=None)
    (d / "core.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="random_baseline"):
        ev.load_bundle(d)
    spec["tasks"][0].update(random_baseline=25, dataset_uri="missing.jsonl")
    (d / "core.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="does not exist"):
        ev.load_bundle(d)


def test_core_with_a_real_lrt(tmp_path):
    """The schedule's parallel forward of a tiny LRT plugs into the harness (spec or schedule
    object),
    reproducibly; Exact recurrence and max_per_task work too."""
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=MemoryConfig(), vocab_size=128, sequence_len=32))
    d = write_json_bundle(tmp_path / "b")
    a = ev.evaluate_core(ev.model_forward(model, "interleaved:2"), CharTokenizer(), d)
    b = ev.evaluate_core(ev.model_forward(model, Interleaved(2)), CharTokenizer(), d)
    assert a == b and -3 <= a["core"] <= 1
    c = ev.evaluate_core(ev.model_forward(model, "exact"), CharTokenizer(), d, max_per_task=2)
    assert set(c["accuracy"]) == {"mc", "schema", "lm"}


# Mixed precision
# ------------------------------------------------------------------------------------
def flash_dtype_rules(attend):
    """A stand-in for flash-attn's input checks: q, k, v in one 16-bit dtype."""

    def checked(q, k, v, *args, **kwargs):
        if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(
                f"FlashAttention only supports fp16 and bf16 data type, got q {q.dtype} "
                f"k {k.dtype} v {v.dtype}"
            )
        return attend(q, k, v, *args, **kwargs)

    return checked


@pytest.mark.parametrize("prefill", ["onepass", "interleaved:2", "exact"])
def test_sequential_bpb_under_bf16_autocast_keeps_one_dtype(monkeypatch, prefill):
    """Under bf16 autocast with fp32 weights the decoder's KV cache must be bf16: an fp32 cache
    (the parameters' dtype) hands fp32 keys to bf16 queries, which flash-attn rejects."""
    import lrt_lab.core.model

    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=MemoryConfig()))
    idx = torch.randint(0, 64, (2, 17))
    batches = [(idx[:, :-1], idx[:, 1:])]
    ref = ev.sequential_bpb(
        copy.deepcopy(model).double(),
        batches,
        torch.ones(64, dtype=torch.long),
        prompt_len=8,
        prefill=prefill,
    )
    pick = lrt_lab.core.model.attention_kernel
    monkeypatch.setattr(
        lrt_lab.core.model, "attention_kernel", lambda *args: flash_dtype_rules(pick(*args))
    )
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    res = ev.sequential_bpb(
        model,
        batches,
        torch.ones(64, dtype=torch.long),
        prompt_len=8,
        prefill=prefill,
        autocast=autocast,
    )
    assert res["bpb"] == pytest.approx(ref["bpb"], rel=0.05)  # bf16 against an fp64 decode


def test_decoder_refuses_to_mix_dtypes_after_filling():
    from lrt_lab.run.decode import Decoder

    model = LRT(preset("tiny", memory=MemoryConfig()))
    dec = Decoder(model, 1, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dec.step(torch.tensor([3]))
    # made outside autocast, settled at the first step
    assert dec.cache.k[0].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="computes in torch.float32"):
        dec.step(torch.tensor([4]))
