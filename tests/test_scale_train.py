"""lrt_scale.train and scale.flops on CPU: FLOP accounting against a hand count and torch's FLOP
counter,
2-process gloo DDP against one process, exact checkpoint/resume, real shards + tokenizer end to end.

Tiny models only (preset "tiny", T = 16 or 32), one thread per process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.store.results import Run, load_runs
from lrt_scale import flops as fl
from lrt_scale import train as st
from lrt_scale.batches import make_batches
from lrt_scale.distributed import DistContext

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]


# FLOP accounting
# ------------------------------------------------------------------------------------
def test_flops_hand_count_tiny():
    """preset tiny: L=2, d=32, 4 heads of 8, 2 KV heads (kv width 16), vocab 64, T=16, windows (4,
    full): a window of 4 covers the query and the 4 keys before it, 5 keys."""
    d, kv, V, L, T = 32, 16, 64, 2, 16
    per_layer = (
        d * d
        + kv * d
        + kv * d
        + d * d  # c_q, c_k, c_v, c_proj
        + 2 * 32  # value-embedding gate: 32 input channels -> 2 KV heads
        + 4 * d * d
        + 4 * d * d
    )  # MLP c_fc, c_proj
    base = L * per_layer + V * d  # + LM head (embeddings are lookups)
    assert per_layer == 11328 and base == 24704
    rec = kv * d + kv * d  # shared W_k,rec, W_v,rec
    gates = L * (2 * 2 * d)  # per layer: 2 gates per KV head
    lrt = base + rec + gates
    assert lrt == 25984
    attn = 4 * (4 * 8) * 5 + 4 * (4 * 8) * 16  # 4 h q min(keys, T): 5 keys, then full T
    assert attn == 2688

    cfg = preset("tiny", memory=MemoryConfig())
    counts = fl.count_params(cfg)
    assert counts["matmul_baseline"] == base and counts["matmul"] == lrt
    assert counts["embedding"] == V * d + L * V * kv  # wte + value embeddings
    assert counts["baseline"] == LRT(preset("tiny")).param_report()["total"]
    assert fl.attention_flops_per_position(cfg, causal=False) == attn
    assert fl.forward_flops_per_position(cfg, causal=False) == 2 * lrt + attn == 54656
    # causal: query t sees min(t + 1, keys) keys; 5 keys over T=16: (1+2+3+4+5*12)/16, full: 17/2
    causal_attn = 4 * (4 * 8) * (70 / 16) + 4 * (4 * 8) * (17 / 2)
    assert causal_attn == 1648 and fl.attention_flops_per_position(cfg) == causal_attn
    expected = {
        "onepass": 1,
        "interleaved:2": 2,
        "interleaved:4": 2,
        "fullseq:3": 4,
        "chunked:4": 1,
        "exact": 1,
    }
    for spec, forwards in expected.items():
        assert parse_schedule(spec).forwards(LRT(cfg), T) == (forwards, 0.0)
        assert fl.train_flops_per_token(cfg, spec, causal=False) == 3 * (2 * lrt + attn) * forwards
        assert fl.train_flops_per_token(cfg, spec) == 3 * (2 * lrt + causal_attn) * forwards
    assert fl.train_flops_per_token(cfg, "interleaved:2", causal=False) == 327936  # 3 x 54656 x 2
    # the one-pass count: half of the real cost
    assert fl.official_flops_per_token(cfg, causal=False) == 163968

    layerwise = fl.count_params(preset("tiny", memory=MemoryConfig(projections="layerwise")))
    assert layerwise["matmul"] == base + L * rec + gates


@pytest.mark.parametrize("window", [None, 1, 3, 5, 16, 40])
@pytest.mark.parametrize("T", [1, 7, 16])
def test_causal_attention_flops_count_the_visible_pairs(T, window):
    """The causal attention term equals 4 h q x (query, key) pairs a causal mask lets through,
    counted one by one, over T; the non-causal term charges every query min(w, T) keys."""
    pairs = sum(
        1 for t in range(T) for j in range(T) if j <= t and (window is None or t - j < window)
    )
    assert fl.mean_visible_keys(T, window) * T == pytest.approx(pairs, abs=1e-9)
    assert fl.mean_visible_keys(T, window, causal=False) == (
        T if window is None else min(window, T)
    )
    cfg = preset("tiny", window_pattern="S", sequence_len=T, short_window=window or T)
    hq = cfg.n_head * cfg.head_dim
    seen = [
        sum(1 for t in range(T) for j in range(T) if j <= t and (w is None or t - j < w))
        for w in cfg.window_sizes()
    ]
    assert fl.attention_flops_per_position(cfg) == pytest.approx(4 * hq * sum(seen) / T)


def test_plan_counts_tokens_from_the_baseline():
    cfg_lrt, cfg_base = preset("tiny", memory=MemoryConfig()), preset("tiny")
    n = fl.count_params(cfg_base)["total"]
    p_lrt = fl.plan(cfg_lrt, "interleaved:2", ratio=10, global_batch_tokens=256)
    p_base = fl.plan(cfg_base, "onepass", ratio=10, global_batch_tokens=256)
    assert p_lrt.params_baseline == p_base.params_baseline == n
    assert p_lrt.steps == p_base.steps == math.ceil(10 * n / 256)
    assert p_lrt.tokens == p_base.tokens == p_lrt.steps * 256
    assert p_base.compute_ratio == pytest.approx(p_base.ratio)
    # LRT at R costs about a baseline at 2R (exactly 2R x its forward / the baseline's forward)
    causal_attn = 1648  # test_flops_hand_count_tiny
    assert p_lrt.compute_ratio == pytest.approx(
        2 * p_lrt.ratio * (2 * 25984 + causal_attn) / (2 * 24704 + causal_attn)
    )
    assert p_lrt.undercount == 2 and p_lrt.attention == "causal"
    flat = fl.plan(cfg_lrt, "interleaved:2", ratio=10, global_batch_tokens=256, causal=False)
    assert flat.compute_ratio == pytest.approx(2 * flat.ratio * 54656 / (2 * 24704 + 2688))
    assert fl.plan(cfg_lrt, "exact", steps=7, global_batch_tokens=256).tokens == 7 * 256
    assert fl.plan(cfg_lrt, tokens=1000, global_batch_tokens=256).steps == 4
    with pytest.raises(ValueError, match="exactly one"):
        fl.plan(cfg_lrt, ratio=1, steps=2)
    with pytest.raises(ValueError, match="ratio"):
        fl.plan(cfg_lrt, ratio=-1)
    assert fl.mfu(989e12 * 4, devices=8) == pytest.approx(0.5)


def test_paper_scale_accounting():
    """A 20L backbone is the paper's "1.3B"; LRT-shared adds 0.3%; meta device, no memory used."""
    base = fl.plan(preset("d20"), "onepass", ratio=20)
    lrt = fl.plan(preset("d20", memory=MemoryConfig()), "interleaved:2", ratio=10)
    assert base.params_baseline == lrt.params_baseline == 1_315_969_320
    assert lrt.params_total / lrt.params_baseline == pytest.approx(1.003, abs=5e-4)
    assert base.steps == math.ceil(20 * 1_315_969_320 / 2**19) and lrt.tokens * 2 == pytest.approx(
        base.tokens, rel=1e-4
    )
    assert lrt.compute_ratio == pytest.approx(20, rel=0.01)  # LRT at R=10 ~ baseline at 20


@pytest.mark.parametrize(
    "mem,spec",
    [
        (None, "onepass"),
        ("shared", "interleaved:2"),
        ("layerwise", "fullseq:2"),
        ("shared", "chunked:4"),
    ],
)
def test_matmul_flops_match_torch_flop_counter(mem, spec):
    """torch's FlopCounterMode sees every stage's linear layers: 2 N_matmul per position per stage,
    minus the recurrent projections that a zero-memory init stage skips; backward = 2 x forward."""
    memory = None if mem is None else MemoryConfig(projections=mem)
    model = LRT(preset("tiny", memory=memory))
    B, T = 3, 16
    idx = torch.randint(0, 64, (B, T))
    schedule = parse_schedule(spec)
    with FlopCounterMode(display=False) as fwd:
        out = run_schedule(model, idx, idx, schedule)
    with FlopCounterMode(display=False) as bwd:
        out.loss.backward()
    counts = fl.count_params(model)
    rec = sum(p.numel() for n, p in model.named_parameters() if ".k_rec." in n or ".v_rec." in n)
    # the first stage reads no memory: its W_rec m is skipped
    skipped = rec * len(schedule.stages(T)[0])
    expected = 2 * B * (counts["matmul"] * schedule.forwards(model, T).differentiated * T - skipped)
    measured = sum(v for k, v in fwd.get_flop_counts()["Global"].items() if "mm" in str(k))
    assert measured == expected
    assert sum(bwd.get_flop_counts()["Global"].values()) == 2 * measured


class MatmulFlops(TorchDispatchMode):
    """2 * m * k * n per matrix multiply, counted at dispatch (FlopCounterMode's module tracker
    cannot follow a forward run under inference mode, as Rollout's rollout is)."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            a, b = args[-2], args[-1]
            self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        elif func is torch.ops.aten.linear.default:  # not decomposed under inference mode
            x, w = args[0], args[1]
            self.flops += 2 * x.numel() * w.shape[0]
        return out


@pytest.mark.parametrize("G", [1, 2])
def test_rollout_flops_are_the_sweeps_plus_a_forward_only_rollout(G):
    """Rollout(G)'s matrix multiplies: G full differentiated passes (backward 2x of those only)
    plus the rollout's forward through the blocks below the split, counted by hand here; the plan
    charges that rollout as split / n_layer of a forward over T - 1 of the T positions."""
    model = LRT(preset("small", memory=MemoryConfig(), vocab_size=64))
    B, T = 2, 8
    idx = torch.randint(0, 64, (B, T))
    with MatmulFlops() as fwd:
        out = run_schedule(model, idx, idx, parse_schedule(f"rollout:{G}"))
    with MatmulFlops() as bwd:
        out.loss.backward()
    split = model.exact_split(1)
    named = dict(model.named_parameters())
    lower = sum(
        p.numel()
        for n, p in named.items()
        if any(n.startswith((f"blocks.{l}.", f"pathway.gates.{l}.")) for l in range(split))
        and p.ndim == 2
    )
    rec = sum(p.numel() for n, p in named.items() if ".k_rec." in n or ".v_rec." in n)
    counts = fl.count_params(model)
    # the rollout: positions 0 .. T-2 (the last one's memory is read by no position) through blocks
    # [0, split), W_rec m from position 1 on (0 reads zero memory)
    rollout = 2 * B * (lower * (T - 1) + rec * (T - 2))
    # every sweep reads the rolled-out memory: nothing skipped
    sweeps = 2 * B * counts["matmul"] * T * G
    assert fwd.flops == sweeps + rollout
    # backward: 2x the sweeps, less the input gradient of W_rec m in the first sweep (its rows are
    # the rollout's, detached: nothing upstream to reach)
    assert bwd.flops == 2 * sweeps - 2 * B * T * rec
    differentiated, inference = parse_schedule(f"rollout:{G}").forwards(model, T)
    assert inference == pytest.approx(0.5 * (T - 1) / T) and differentiated == G


def test_rollout_trains_in_the_launcher(tmp_path):
    st.train(st.parse_args(synthetic_args(tmp_path, "rollout", "--schedule", "rollout:2")))
    cfg = Run(tmp_path / "rollout").config
    assert cfg["schedule"] == "rollout:2" and cfg["accounting"]["rollout_forwards"] > 0
    losses = train_losses(tmp_path / "rollout")
    assert len(losses) == 3 and all(math.isfinite(l) for l in losses)
    assert "val_bpb_stage_1" in Run(tmp_path / "rollout").summary["eval"] or any(
        "stage" in k for k in Run(tmp_path / "rollout").summary
    )


# The launcher
# ---------------------------------------------------------------------------------------
def tiny_args(out, *extra) -> list[str]:
    return [
        "--preset",
        "tiny",
        "--out",
        str(out),
        "--threads",
        "1",
        "--log-every",
        "1000",
        "--eval-every",
        "0",
        *extra,
    ]


def synthetic_args(tmp_path, name, *extra) -> list[str]:
    return tiny_args(
        tmp_path,
        "--synthetic",
        "--vocab-size",
        "64",
        "--steps",
        "3",
        "--total-batch-size",
        "128",
        "--device-batch-size",
        "2",
        "--eval-tokens",
        "64",
        "--name",
        name,
        *extra,
    )


def final_state(run_dir) -> dict:
    ckpt = Run(run_dir).latest_checkpoint()
    return torch.load(ckpt, weights_only=True)


def train_losses(run_dir) -> list[float]:
    return [r["loss"] for r in Run(run_dir).metrics_records() if r["kind"] == "train"]


def test_checkpoint_every_zero_writes_none_unless_asked(tmp_path):
    """--checkpoint-every 0: no checkpoint at all (a d12 one is ~5 GB), one after the last step
    with --final-checkpoint; the default writes one at the end."""
    for name, extra, written in (
        ("none", ("--checkpoint-every", "0"), 0),
        ("asked", ("--checkpoint-every", "0", "--final-checkpoint"), 1),
        ("default", (), 1),
    ):
        st.train(st.parse_args(synthetic_args(tmp_path, name, "--steps", "2", *extra)))
        assert len(list(Run(tmp_path / name).checkpoint_dir().glob("*.pt"))) == written, name
        assert Run(tmp_path / name).summary  # the run completed either way


def test_checkpoint_schedule():
    def steps(every, final, stop, total):
        args = argparse.Namespace(checkpoint_every=every, final_checkpoint=final)
        return [s for s in range(1, stop + 1) if st.wants_checkpoint(args, s, stop, total)]

    assert steps(3, False, 7, 7) == [3, 6, 7]
    assert steps(0, False, 7, 7) == []
    assert steps(0, True, 7, 7) == [7]
    assert steps(0, False, 4, 7) == [4]  # a --stop-after segment: its --resume needs it


def test_cli_validation(tmp_path):
    with pytest.raises(ValueError, match="exactly one of --ratio"):
        st.parse_args(["--synthetic"])
    with pytest.raises(ValueError, match="invalid for --model transformer"):
        st.parse_args(
            ["--synthetic", "--steps", "1", "--model", "transformer", "--schedule", "interleaved:2"]
        )
    with pytest.raises(ValueError, match="--data-dir and --tokenizer-dir"):
        st.parse_args(["--steps", "1"])
    with pytest.raises(ValueError, match="--set"):
        st.parse_args(["--synthetic", "--steps", "1", "--set", "memory.lag"])
    with pytest.raises(ValueError, match="needs a tokenizer"):
        st.parse_args(["--synthetic", "--steps", "1", "--core-bundle", str(tmp_path)])
    assert (
        st.parse_args(["--synthetic", "--steps", "1", "--model", "transformer"]).schedule
        == "onepass"
    )
    args = st.parse_args(synthetic_args(tmp_path, "bad", "--total-batch-size", "100"))
    with pytest.raises(ValueError, match="multiple of"):
        st.train(args)
    with pytest.raises(ValueError, match="seq-prompt"):
        st.train(
            st.parse_args(
                synthetic_args(tmp_path, "bad", "--seq-eval-rows", "2", "--seq-prompt", "16")
            )
        )
    assert st.main(["--synthetic"]) == 2


def test_dry_run_prints_the_accounting(capsys):
    assert st.train(st.parse_args(["--preset", "d20", "--ratio", "10", "--dry-run"])) is None
    out = capsys.readouterr().out
    assert "1,315,969,320 baseline" in out and "x2.000" in out and "R = 10.00" in out


def test_optimizer_groups_follow_the_paper(tmp_path):
    args = st.parse_args(
        ["--preset", "d12", "--synthetic", "--steps", "10", "--total-batch-size", str(2**17)]
    )
    args.n_layer, args.total_steps = 12, 10
    with torch.device("meta"):
        # d = 64
        model = LRT(preset("tiny", memory=MemoryConfig(), n_embd=64, n_head=2, n_kv_head=2))
    muon, adam = st.make_optimizers(model, args)
    half = 0.5  # sqrt(2^17 / 2^19)
    width = (64 / 768) ** -0.5
    assert muon.param_groups[0]["lr"] == pytest.approx(0.02 * half)
    lrs = {g["name"]: g["lr"] for g in adam.param_groups}
    assert lrs["embedding"] == pytest.approx(0.3 * width * half)
    assert lrs["head"] == pytest.approx(0.004 * width * half)
    assert lrs["scalar"] == pytest.approx(0.5 * half) and lrs["resid_scalar"] == pytest.approx(
        0.005 * half
    )
    assert [g["betas"] for g in adam.param_groups if g["name"] == "x0_scalar"] == [(0.96, 0.95)]
    assert adam.defaults["betas"] == (0.8, 0.95)
    n_params = sum(p.numel() for o in (muon, adam) for g in o.param_groups for p in g["params"])
    assert n_params == sum(p.numel() for p in model.parameters())
    assert st.set_schedules([muon, adam], 0, args) == 1.0
    assert muon.param_groups[0]["momentum"] == pytest.approx(0.85) and muon.param_groups[0][
        "weight_decay"
    ] == pytest.approx(0.2)
    # warm-down over the final half
    assert st.set_schedules([muon, adam], 8, args) == pytest.approx(0.4)
    # annealed linearly to 0
    assert muon.param_groups[0]["weight_decay"] == pytest.approx(0.2 * 0.2)
    args.n_layer = 24
    assert st.weight_decay_at(0, args) == pytest.approx(0.2 / 4)  # x (12/L)^2


DDP_DRIVER = """
import json, os, sys
import torch.distributed as dist
from lrt_scale import train
# one process group for every run (train joins the one it finds), kept between runs: a rank
# that left its group while the other was still in the run's last collective reset the
# other's connection (gloo: "Connection reset by peer")
dist.init_process_group("gloo")
train.teardown_distributed = lambda ctx: dist.barrier()
for name, argv in json.loads(sys.argv[1]).items():
    if os.environ["RANK"] == "0":
        print(f"=== run {name}", flush=True)
    assert train.main(argv) == 0
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """One torchrun launch, 2 gloo ranks, that trains the DDP tests' runs one after the other in
    the same two workers and process group: starting torchrun and its workers costs more than
    the runs. Returns the runs' folder and {run name: what rank 0 printed during it}."""
    out = tmp_path_factory.mktemp("ddp")
    batch = ["--total-batch-size", "64"]
    runs = {
        "ddp": synthetic_args(out, "ddp", *batch),
        "fullseq0": synthetic_args(out, "fullseq0", "--schedule", "fullseq:0", *batch),
    }
    (out / "driver.py").write_text(DDP_DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(out / "driver.py"),
        json.dumps(runs),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = dict(re.findall(r"^=== run (\w+)\n(.*?)(?=^=== run |\Z)", proc.stdout, re.M | re.S))
    assert list(printed) == list(runs), proc.stdout[-3000:]
    return out, printed


@pytest.mark.slow
def test_ddp_two_processes_match_one_process(tmp_path, ddp_runs):
    """torchrun, 2 ranks, gloo, 1 micro step each == 1 process, 2 micro steps, same global batch."""
    out, printed = ddp_runs
    assert "world 2 (gloo)" in printed["ddp"] and "1 accumulation steps" in printed["ddp"]
    # 4 rows of 16: 2 per rank, or 2 micro steps of 2 in one process
    batch = ["--total-batch-size", "64"]
    st.train(st.parse_args(synthetic_args(tmp_path, "single", *batch)))

    ddp, single = final_state(out / "ddp"), final_state(tmp_path / "single")
    assert ddp["step"] == single["step"] == 3
    for k, v in single["model"].items():
        torch.testing.assert_close(ddp["model"][k], v, rtol=0, atol=1e-5)
    assert train_losses(out / "ddp") == pytest.approx(train_losses(tmp_path / "single"), abs=1e-5)
    cfg = Run(out / "ddp").config
    assert (
        cfg["world_size"] == 2
        and cfg["grad_accum"] == 1
        and Run(tmp_path / "single").config["grad_accum"] == 2
    )
    records = Run(out / "ddp").metrics_records()  # rank 0 alone writes: one record per step
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert {
        "loss",
        "tokens",
        "flops",
        "mfu",
        "tokens_per_s",
        "time",
        "lr_mult",
        "compute_tokens",
    } <= set(records[0])
    assert [r["kind"] for r in records].count("eval") == 1


def test_resume_equals_uninterrupted_run(tmp_path):
    full = synthetic_args(tmp_path, "full", "--schedule", "interleaved:2")
    st.train(st.parse_args(full))
    part = synthetic_args(tmp_path, "part", "--schedule", "interleaved:2")
    st.train(st.parse_args(part + ["--stop-after", "2"]))
    assert Run(tmp_path / "part").summary is None and final_state(tmp_path / "part")["step"] == 2
    st.train(st.parse_args(part + ["--resume"]))
    a, b = final_state(tmp_path / "full"), final_state(tmp_path / "part")
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert train_losses(tmp_path / "full") == train_losses(tmp_path / "part")
    assert (
        Run(tmp_path / "part").summary["tokens"]
        == Run(tmp_path / "full").summary["tokens"]
        == 3 * 128
    )
    with pytest.raises(ValueError, match="arguments differ"):
        st.train(st.parse_args(part + ["--resume", "--matrix-lr", "0.01"]))
    with pytest.raises(FileExistsError):
        st.train(st.parse_args(part))


# Real shards and a tokenizer
# ------------------------------------------------------------------------
def stdlib_docs() -> list[str]:
    docs = []
    for f in sorted(Path(os.path.dirname(json.__file__)).glob("*.py")):
        docs += [p for p in re.split(r"\n\n\n+", f.read_text(encoding="utf-8")) if p.strip()]
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3 shards of the json package's source (the last is validation) and a BPE of vocab 512."""
    from lrt_scale.data import write_shard
    from lrt_scale.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("scale_corpus")
    docs = stdlib_docs()
    (root / "data").mkdir()
    for i, part in enumerate((docs[:10], docs[10:20], docs[20:])):
        write_shard(part, root / "data" / f"shard_{i:05d}.parquet", row_group_size=2)
    tok = train_tokenizer(iter(docs), vocab_size=512)
    tok.save(root / "tok")
    return root, tok


def write_core_bundle(root: Path) -> Path:
    """A 3-task bundle in core.json form (one task per type) with plain-English items."""
    b = root / "bundle"
    b.mkdir(exist_ok=True)
    mc = [
        {"query": f"The number {i} is", "choices": ["even", "odd"], "gold": i % 2} for i in range(6)
    ]
    schema = [
        {
            "context_options": ["The cat sat", "The dog ran"],
            "continuation": "on the mat.",
            "gold": 0,
        }
    ] * 3
    lm = [{"context": f"def f{i}(x):", "continuation": "return x"} for i in range(4)]
    for name, items in (("mc", mc), ("schema", schema), ("lm", lm)):
        (b / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    tasks = [
        {"label": "mc", "type": "multiple_choice", "num_fewshot": 2, "random_baseline": 50},
        {"label": "schema", "type": "schema", "num_fewshot": 0, "random_baseline": 50},
        {"label": "lm", "type": "language_modeling", "num_fewshot": 1, "random_baseline": 0},
    ]
    (b / "core.json").write_text(json.dumps({"tasks": tasks}))
    return b


@pytest.fixture
def small_loader_buffer(monkeypatch):
    """The runs' loaders (training, validation, lrt_scale.evaluate's) buffer 32 documents instead
    of 1,000: the corpus holds 20 training and a few validation documents, so every loader would
    tokenize it about 50 times over before its first row (most of these tests' time), and the
    buffer's size changes nothing they check."""
    from lrt_scale import loader

    class SmallBuffer(loader.DistributedPackingLoader):
        def __init__(self, *args, buffer_docs: int = 32, **kwargs):
            super().__init__(*args, buffer_docs=buffer_docs, **kwargs)

    monkeypatch.setattr(loader, "DistributedPackingLoader", SmallBuffer)


@pytest.mark.slow
@pytest.mark.usefixtures("small_loader_buffer")
def test_shards_tokenizer_resume_and_evaluate(tmp_path, corpus, capsys):
    """Real data: the loader's state rides in the checkpoint (resume is exact), BPB uses the
    tokenizer's byte lengths, CORE runs at the end, and lrt_scale.evaluate reads the run back."""
    root, tok = corpus
    bundle = write_core_bundle(tmp_path)
    runs = tmp_path / "runs"
    common = tiny_args(
        runs,
        "--data-dir",
        str(root / "data"),
        "--tokenizer-dir",
        str(root / "tok"),
        "--seq-len",
        "32",
        "--steps",
        "3",
        "--total-batch-size",
        "128",
        "--device-batch-size",
        "2",
        "--eval-tokens",
        "128",
        "--core-bundle",
        str(bundle),
        "--core-max-per-task",
        "-1",
    )
    st.train(st.parse_args(common + ["--name", "full"]))
    st.train(st.parse_args(common + ["--name", "part", "--stop-after", "2"]))
    assert final_state(runs / "part")["counters"]["data"][0]["version"] == 1  # the loader's state
    st.train(st.parse_args(common + ["--name", "part", "--resume"]))
    a, b = final_state(runs / "full"), final_state(runs / "part")
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert train_losses(runs / "full") == train_losses(runs / "part")

    run = Run(runs / "full")
    cfg, summary = run.config, run.summary
    assert cfg["model"]["vocab_size"] == tok.vocab_size and cfg["model"]["sequence_len"] == 32
    assert (
        cfg["train"]["task"] == "fineweb"
        and cfg["kind"] == "lrt"
        and cfg["schedule"] == "interleaved:2"
    )
    ev = summary["eval"]
    assert 0 < ev["val_bpb"] < 30 and len([k for k in ev if k.startswith("val_bpb_stage_")]) == 3
    assert set(ev) >= {"core", "core_mc", "core_schema", "core_lm"} and -10 < ev["core"] <= 1
    assert set(run.tables()) == {"core"}
    df = load_runs(runs)
    assert set(df["run"]) == {"full", "part"}

    from lrt_scale import evaluate

    capsys.readouterr()
    assert (
        evaluate.main(
            [
                "--run-dir",
                str(run.path),
                "--bpb-tokens",
                "128",
                "--batch-size",
                "2",
                "--seq-rows",
                "2",
                "--seq-prompt",
                "16",
                "--seq-prefill",
                "onepass,exact",
                "--core-bundle",
                str(bundle),
            ]
        )
        == 0
    )
    rec = [r for r in run.metrics_records() if r.get("source") == "lrt_scale.evaluate"][-1]
    # same model, same validation tokens
    assert rec["val_bpb"] == pytest.approx(ev["val_bpb"], rel=1e-6)
    assert rec["core"] == pytest.approx(ev["core"])
    assert {"seq_bpb_onepass", "seq_bpb_exact", "cont_bpb_parallel"} <= set(rec)


# What would break or mislead the first GPU run
# ------------------------------------------------------
def test_ratio_params_and_data_plan():
    """Both definitions of N at 20L (the paper's text: 1.316B with embeddings; the released code:
    matrices + LM head, 435M), and the shards best-fit cropping needs (about 770 at R=20, not
    520)."""
    base = fl.plan(preset("d20"), ratio=20, ratio_params="matrices")
    lrt = fl.plan(
        preset("d20", memory=MemoryConfig()), "interleaved:2", ratio=20, ratio_params="matrices"
    )
    assert base.params_ratio == 435_165_440 and base.ratio_params == "matrices"
    # the LRT counts its memory matrices
    assert lrt.params_ratio > base.params_ratio and lrt.tokens > base.tokens
    total = fl.plan(preset("d20"), ratio=10)
    assert total.params_ratio == 1_315_969_320 and total.tokens == pytest.approx(13.16e9, rel=1e-3)
    shards = fl.data_plan(fl.plan(preset("d20"), ratio=20).tokens)["train_shards"]
    assert 760 <= shards <= 800
    assert "ratio_params=matrices" in fl.format_plan(base) and "train shards" in fl.format_plan(
        base
    )
    with pytest.raises(ValueError, match="ratio_params"):
        fl.plan(preset("d20"), ratio=1, ratio_params="embeddings")


@pytest.mark.parametrize(
    "spec,memory_unused",
    [
        ("interleaved:2", False),
        ("onepass", True),
        ("fullseq:0", True),
        ("chunked:16", True),
        ("chunked:4", False),
        ("rollout:1", False),
    ],
)
def test_unused_parameters_from_one_backward(spec, memory_unused):
    """DDP needs find_unused_parameters exactly when a step leaves parameters without a gradient:
    not only OnePass, also fullseq:0 and chunked:C with C >= T (one chunk: memory never read)."""
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=MemoryConfig()))
    state = torch.random.get_rng_state()
    unused = st.unused_parameters(model, parse_schedule(spec), 16, 64, "cpu")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert bool(unused) == memory_unused
    # (the gates still get a gradient: they see h)
    assert all(n.startswith("pathway.") for n in unused)


@pytest.mark.slow
def test_ddp_lrt_whose_memory_gets_no_gradient(ddp_runs):
    """torchrun, 2 gloo ranks, an LRT under fullseq:0: DDP without find_unused_parameters fails at
    step 2 ("Expected to have finished reduction in the prior iteration")."""
    out, printed = ddp_runs
    assert "world 2 (gloo)" in printed["fullseq0"]
    assert "find_unused_parameters on" in printed["fullseq0"]
    records = Run(out / "fullseq0").metrics_records()
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]


def test_previous_micro_step_and_loaded_checkpoint_are_freed(tmp_path, monkeypatch):
    """Each forward starts with the previous micro step's outputs gone, and a resumed run does not
    keep the loaded checkpoint's tensors."""
    args = synthetic_args(tmp_path, "mem")
    st.train(st.parse_args(args + ["--stop-after", "1"]))
    previous, loaded = [], []
    real_forward, real_load = LRT.forward, torch.load

    def forward(self, *a, **kw):
        assert all(r() is None for r in previous), (
            "the previous micro step's logits are still alive"
        )
        assert loaded and all(r() is None for r in loaded), "the loaded checkpoint is still alive"
        out = real_forward(self, *a, **kw)
        previous[:] = [weakref.ref(out.logits)] + [weakref.ref(t) for t in out.stage_logits]
        return out

    def load(*a, **kw):
        state = real_load(*a, **kw)
        loaded.extend(weakref.ref(t) for t in state["model"].values())
        return state

    monkeypatch.setattr(LRT, "forward", forward)
    monkeypatch.setattr(torch, "load", load)
    st.train(st.parse_args(args + ["--resume"]))  # 2 steps of 2 micro steps each
    assert Run(tmp_path / "mem").summary["steps"] == 3


def test_resume_with_another_device_batch_size(tmp_path):
    """The global batch and the data stream do not depend on --device-batch-size, so a resume may
    lower it (after an out-of-memory error) and continue the same run."""
    full = synthetic_args(tmp_path, "full")
    st.train(st.parse_args(full))
    part = synthetic_args(tmp_path, "part")
    st.train(st.parse_args(part + ["--stop-after", "1"]))
    st.train(st.parse_args(part + ["--resume", "--device-batch-size", "1"]))
    a, b = final_state(tmp_path / "full"), final_state(tmp_path / "part")
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=0, atol=1e-5)
    assert train_losses(tmp_path / "part") == pytest.approx(
        train_losses(tmp_path / "full"), abs=1e-5
    )


def test_synthetic_validation_does_not_depend_on_world_size():
    """The same validation rows for 1 rank or 2 (each rank's share of eval_tokens)."""

    def rows(world):
        out = []
        for rank in range(world):
            ctx = DistContext(rank, world, rank, torch.device("cpu"), world > 1, None)
            batches, _, _ = make_batches(None, None, 64, 2, 16, ctx, seed=3, synthetic="copy")
            out += [
                r for x, y in batches(4 // world) for r in torch.cat([x, y[:, -1:]], 1).tolist()
            ]
        return sorted(out)

    assert rows(1) == rows(2) and len(rows(1)) == 8


@pytest.mark.usefixtures("small_loader_buffer")
def test_failing_core_keeps_the_weights_and_writes_the_summary(tmp_path, corpus):
    """A CORE item that fails to score (here: a multiple-choice item without choices) used to raise
    before the final checkpoint: no weights, no summary, and --resume failed the same way."""
    root, _ = corpus
    bundle = write_core_bundle(tmp_path)
    (bundle / "mc.jsonl").write_text(
        json.dumps({"query": "broken", "gold": 0})
        + "\n" * 1
        + "".join(
            json.dumps({"query": f"q{i}", "choices": ["a", "b"], "gold": 0}) + "\n"
            for i in range(3)
        )
    )
    runs = tmp_path / "runs"
    args = tiny_args(
        runs,
        "--data-dir",
        str(root / "data"),
        "--tokenizer-dir",
        str(root / "tok"),
        "--seq-len",
        "32",
        "--steps",
        "2",
        "--total-batch-size",
        "64",
        "--device-batch-size",
        "2",
        "--eval-tokens",
        "64",
        "--core-bundle",
        str(bundle),
        "--name",
        "core",
    )
    st.train(st.parse_args(args))
    run = Run(runs / "core")
    assert final_state(run.path)["step"] == 2
    summary = run.summary
    assert "core" in summary["eval_errors"] and math.isfinite(summary["eval"]["val_bpb"])
    assert "core" not in summary["eval"]
    (bundle / "mc.jsonl").unlink()  # a bundle that cannot work fails before the first step
    with pytest.raises(ValueError, match="does not exist"):
        st.train(st.parse_args(args[:-1] + ["never"]))
    assert not (runs / "never").exists()
