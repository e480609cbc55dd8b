"""Compacted per-step logs (metrics.jsonl.xz): the same bytes come back, every reader of a store
gives the same answers on a plain copy and on a compacted one (a synthetic store and runs copied
from experiments/results), a kill at any point of compacting or expanding loses nothing, a
compacted run resumes, and `lrt-lab store compact` says what it did."""

from __future__ import annotations

import importlib.util
import json
import lzma
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from lrt_lab.commands.cli import main
from lrt_lab.store import results
from lrt_lab.store.claims import acquire
from lrt_lab.store.compact import compact_store
from lrt_lab.store.events import reach_times
from lrt_lab.store.results import (
    METRICS,
    METRICS_XZ,
    Run,
    evaluations,
    load_metrics,
    load_runs,
    metrics_file,
)
from lrt_lab.store.study_spec import parse_study
from lrt_results.study import at_step, event_table, study_table

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "experiments" / "results"
# two arms of two seeds, evaluated at steps 500, 1000, 1500 (the smallest logs of the trainers)
REAL_RUNS = [
    f"a5_prefix-L16-small-lrt-{schedule}-s{seed}-trainers"
    for schedule in ("rollout_1", "fixedpoint_0.01_16")
    for seed in (0, 1)
]
REAL_STUDY = {
    "question": "does the trainer change when exact decoding reaches the training length?",
    "primary": "pos90_exact@16",
    "lower_is_better": False,
    "budget": "matched steps",
    "decision": "none: a reading test",
    "time_to_event": "exact",
    "contrasts": [{"a": "lrt rollout:1", "b": "lrt fixedpoint:0.01:16", "paired": True}],
}


def synthetic_store(root: Path) -> Path:
    """Four complete runs (two arms, two seeds) with train and eval lines, a run in progress and
    one whose last line a kill cut, written as files (no store writer, so nothing compacts)."""
    for kind, schedule in (("transformer", "onepass"), ("lrt", "interleaved:2")):
        for seed in (0, 1):
            folder = root / f"{kind}-s{seed}"
            folder.mkdir(parents=True)
            config = {
                "kind": kind,
                "schedule": schedule,
                "model": {"n_layer": 2},
                "train": {"task": "a5_prefix", "length": 8, "seed": seed, "steps": 40},
            }
            (folder / "config.json").write_text(json.dumps(config))
            lines = []
            for step in range(1, 41):
                loss = 3.0 / step + 0.01 * seed
                lines.append(
                    {"kind": "train", "step": step, "loss": loss, "tokens": 8 * step,
                     "compute_tokens": 16.0 * step, "tokens_per_s": 100.0 + step}
                )  # fmt: skip
                if step % 10 == 0:
                    pos = 8 if kind == "lrt" and step >= 20 + 10 * seed else 3
                    lines.append(
                        {"kind": "eval", "step": step, "pos90_exact@8": pos,
                         "ce_exact@8": 1.0 / step + seed, "compute_tokens": 16.0 * step}
                    )  # fmt: skip
            text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in lines)
            (folder / METRICS).write_text(text)
            last = {k: v for k, v in lines[-1].items() if k in ("pos90_exact@8", "ce_exact@8")}
            summary = {"status": "complete", "steps": 40, "final_loss": 0.1, "eval": last}
            (folder / "summary.json").write_text(json.dumps(summary))
    running = root / "transformer-s9"
    shutil.copytree(root / "transformer-s0", running)
    (running / "summary.json").unlink()
    with open(root / "lrt-s1" / METRICS, "a") as f:
        f.write('{"kind": "train", "st')  # cut by a kill: dropped, counted, kept byte for byte
    return root


SYNTHETIC_STUDY = {
    **REAL_STUDY,
    "primary": "ce_exact@8",
    "lower_is_better": True,
    "contrasts": [{"a": "transformer", "b": "lrt interleaved:2", "paired": True}],
}


def readings(root: Path, study: dict, step: int) -> dict:
    """What every reader of the per-step logs gives over the store `root`."""
    from lrt_app import store_data

    runs = load_runs(root, include_incomplete=True)
    complete = load_runs(root)
    metric = study["primary"]
    spec = parse_study(study)
    out = {"runs": runs.drop(columns="path")}
    for _, row in runs.iterrows():
        name = row["run"]
        out[f"{name} records"] = Run(row["path"]).metrics_records()
        for kind in (None, "train", "eval"):
            out[f"{name} {kind}"] = load_metrics(row, kind=kind)
            out[f"{name} {kind} app"] = store_data.metrics_of(row["path"], kind)
        out[f"{name} dropped"] = load_metrics(row).attrs["dropped_lines"]
        out[f"{name} bytes"] = Run(row["path"]).metrics_bytes()
    out["evaluations"] = evaluations(complete, metric).assign(
        row=lambda d: d["row"].map(complete["run"])
    )
    out["at_step"] = at_step(complete, metric, step).set_axis(complete["run"])
    out["reach"] = reach_times(complete)
    out["reach flops"] = reach_times(complete, time="compute_tokens")
    out["study at step"] = study_table(root, spec, n_resamples=99, step=step)
    out["events"] = event_table(root, spec)
    out["median tokens/s"] = [_scaling_tables()._median_tokens_per_s(p) for p in runs["path"]]
    return out


def _scaling_tables():
    """experiments/scaling_tables.py, whose throughput column reads the logs itself."""
    if "scaling_tables" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "scaling_tables", ROOT / "experiments" / "scaling_tables.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["scaling_tables"] = module
        spec.loader.exec_module(module)
    return sys.modules["scaling_tables"]


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], pd.DataFrame):
            pd.testing.assert_frame_equal(a[key], b[key], obj=key)
        elif isinstance(a[key], pd.Series):
            pd.testing.assert_series_equal(a[key], b[key], obj=key)
        else:
            assert a[key] == b[key], key


def plain_and_compacted(plain: Path, tmp_path: Path) -> tuple[Path, Path]:
    packed = tmp_path / "compacted"
    shutil.copytree(plain, packed)
    done = compact_store(packed)
    assert done.compacted and not (set(done.compacted) & set(done.in_progress))
    return plain, packed


@pytest.fixture(scope="module")
def real_stores(tmp_path_factory):
    """REAL_RUNS copied from the committed store (which is not touched) with each log as the plain
    metrics.jsonl it was trained as (the committed .xz decompressed by lzma, not by the store's
    reader), and a copy of that compacted again."""
    if not all((COMMITTED / name / "config.json").is_file() for name in REAL_RUNS):
        pytest.skip("the committed runs are not in this checkout")
    tmp = tmp_path_factory.mktemp("real")
    for name in REAL_RUNS:
        run = tmp / "plain" / name
        shutil.copytree(COMMITTED / name, run)
        if (run / METRICS_XZ).exists():
            (run / METRICS).write_bytes(lzma.decompress((run / METRICS_XZ).read_bytes()))
            (run / METRICS_XZ).unlink()
    return plain_and_compacted(tmp / "plain", tmp)


def test_a_compacted_log_decompresses_to_the_same_bytes_and_is_the_same_file_each_time(tmp_path):
    root = synthetic_store(tmp_path / "s")
    run = Run(root / "lrt-s1")
    original = (run.path / METRICS).read_bytes()
    assert run.compact_metrics() == (len(original), (run.path / METRICS_XZ).stat().st_size)
    assert not (run.path / METRICS).exists() and run.is_compacted
    packed = (run.path / METRICS_XZ).read_bytes()
    assert lzma.decompress(packed) == original  # any xz reader: the .xz is a plain xz stream
    assert run.metrics_bytes() == original
    assert results.compress_metrics(original) == packed  # deterministic: the same log, same file
    assert len(packed) * 5 < len(original)


def test_every_reader_gives_the_same_on_a_plain_and_a_compacted_synthetic_store(tmp_path):
    plain, packed = plain_and_compacted(synthetic_store(tmp_path / "plain"), tmp_path)
    assert sorted(p.parent.name for p in packed.glob(f"*/{METRICS}")) == ["transformer-s9"]
    with pytest.warns(UserWarning):  # lrt-s1's cut line, read from both
        assert_same(readings(plain, SYNTHETIC_STUDY, 20), readings(packed, SYNTHETIC_STUDY, 20))
    with results.reading_once():  # the cache keeps each store's records apart
        with pytest.warns(UserWarning):
            assert_same(readings(plain, SYNTHETIC_STUDY, 20), readings(packed, SYNTHETIC_STUDY, 20))


def test_every_reader_gives_the_same_on_committed_runs_and_their_compacted_copies(real_stores):
    plain, packed = real_stores
    before = sum((plain / n / METRICS).stat().st_size for n in REAL_RUNS)
    after = sum((packed / n / METRICS_XZ).stat().st_size for n in REAL_RUNS)
    assert before > 5 * after
    assert_same(readings(plain, REAL_STUDY, 1000), readings(packed, REAL_STUDY, 1000))


def test_the_dashboards_signatures_see_a_compaction(tmp_path):
    from lrt_app import store_data

    root = synthetic_store(tmp_path / "s")
    run = Run(root / "lrt-s0")
    signature = store_data.store_signature(root)
    run.compact_metrics()
    assert store_data.store_signature(root) != signature
    assert metrics_file(run.path).name == METRICS_XZ
    signature, shown = store_data.store_signature(root), store_data.metrics_of(str(run.path), None)
    run.log({"kind": "train", "step": 41, "loss": 0.5})  # a compacted log changes (a recount)
    run.compact_metrics()
    assert store_data.store_signature(root) != signature  # only the .xz differs
    assert len(store_data.metrics_of(str(run.path), None)) == len(shown) + 1  # not the cached one


def _crash_on_unlink(monkeypatch, name: str):
    """Path.unlink of `name` raises, as a kill just before it would leave the folder."""
    unlink = Path.unlink

    def crash(self, *a, **k):
        if self.name == name:
            raise KeyboardInterrupt("killed")
        return unlink(self, *a, **k)

    monkeypatch.setattr(Path, "unlink", crash)


def test_a_kill_between_writing_the_xz_and_removing_the_plain_log_loses_nothing(
    tmp_path, monkeypatch
):
    root = synthetic_store(tmp_path / "s")
    run = Run(root / "lrt-s0")
    original, records = run.metrics_bytes(), run.metrics_records()
    with monkeypatch.context() as m:
        _crash_on_unlink(m, METRICS)
        with pytest.raises(KeyboardInterrupt):
            compact_store(root)
    assert (run.path / METRICS).exists() and (run.path / METRICS_XZ).exists()
    assert run.metrics_path.name == METRICS  # both there: the plain one is read
    assert run.metrics_records() == records
    run.log({"kind": "train", "step": 41, "loss": 0.5})  # appended to the plain one: kept
    assert run.metrics_records() == [*records, {"kind": "train", "step": 41, "loss": 0.5}]
    assert compact_store(root).compacted  # run again, it goes on where it stopped
    assert not (run.path / METRICS).exists()
    assert run.metrics_bytes().startswith(original) and len(run.metrics_records()) == 45
    assert not list(run.path.glob(".*.tmp"))


def test_a_kill_between_expanding_and_removing_the_xz_loses_nothing(tmp_path, monkeypatch):
    root = synthetic_store(tmp_path / "s")
    run = Run(root / "lrt-s0")
    records = run.metrics_records()
    run.compact_metrics()
    with monkeypatch.context() as m:
        _crash_on_unlink(m, METRICS_XZ)
        with pytest.raises(KeyboardInterrupt):
            run.log({"kind": "train", "step": 41, "loss": 0.5})
    assert (run.path / METRICS).exists() and (run.path / METRICS_XZ).exists()
    assert run.metrics_records() == records
    run.log({"kind": "train", "step": 41, "loss": 0.5})
    assert not (run.path / METRICS_XZ).exists()  # the next append finishes the expansion
    assert run.metrics_records() == [*records, {"kind": "train", "step": 41, "loss": 0.5}]


def test_a_damaged_xz_is_reported_and_a_cut_one_gives_what_it_holds(tmp_path):
    root = synthetic_store(tmp_path / "s")
    for name in ("lrt-s0", "transformer-s0"):
        Run(root / name).compact_metrics()
    cut = root / "lrt-s0" / METRICS_XZ
    whole = load_metrics(root / "lrt-s0")
    cut.write_bytes(cut.read_bytes()[:-40])  # the end of the stream is lost
    with pytest.warns(UserWarning, match="lrt-s0"):
        df = load_metrics(root / "lrt-s0")
    assert df.attrs["dropped_lines"] >= 1 and len(df) <= len(whole)
    pd.testing.assert_frame_equal(df, whole.iloc[: len(df)])
    garbage = root / "transformer-s0" / METRICS_XZ
    garbage.write_bytes(b"not xz at all")
    with pytest.warns(UserWarning, match="not a readable xz file"):
        df = load_metrics(root / "transformer-s0")
    assert df.empty and METRICS_XZ in df.attrs["damaged"]
    assert sorted(load_runs(root)["run"]) == [
        "lrt-s0",
        "lrt-s1",
        "transformer-s0",
        "transformer-s1",
    ]


def test_a_trained_run_ends_compacted_and_a_compacted_run_resumes(tmp_path):
    from helpers import tiny_train_config

    from lrt_lab.training.loop import train

    full = train(tiny_train_config(steps=6, checkpoint_every=3, name="full"), out=tmp_path)
    assert full.is_complete and full.is_compacted and not (full.path / METRICS).exists()
    cfg = tiny_train_config(steps=6, checkpoint_every=3, name="cut")
    cut = train(cfg, out=tmp_path, progress=False, stop_after=4)
    cut.compact_metrics()  # a log compacted before its run was done (by hand, say)
    train(cfg, out=tmp_path, resume=True, progress=False)
    assert cut.is_compacted and not (cut.path / METRICS).exists()
    steps = load_metrics(cut, kind="train")["step"].tolist()
    assert steps == list(range(1, 7))
    losses = [load_metrics(r, kind="train")["loss"].tolist() for r in (full, cut)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert train(cfg, out=tmp_path, resume=True, progress=False).is_compacted  # untouched


def test_store_compact_skips_runs_in_progress_and_claimed_and_is_idempotent(tmp_path, capsys):
    root = synthetic_store(tmp_path / "s")
    sizes = {p.parent.name: p.stat().st_size for p in root.glob(f"*/{METRICS}")}
    claim = acquire(root / "lrt-s0")  # a live writer
    try:
        assert main(["store", "compact", str(root), "--dry-run"]) == 0
        out = capsys.readouterr().out
        total = sum(v for k, v in sizes.items() if k not in ("lrt-s0", "transformer-s9"))
        assert (
            out.splitlines()[0]
            == f"would compact 3 run(s): {total / 1e6:.2f} MB ({total:,} bytes) of metrics.jsonl"
        )
        assert "1 run(s) in progress" in out and "1 run(s) being written" in out
        assert not list(root.glob(f"*/{METRICS_XZ}"))  # a dry run changes nothing
        assert main(["store", "compact", str(root)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("compacted 3 run(s): metrics.jsonl") and "x smaller" in out
        assert (root / "lrt-s0" / METRICS).exists() and (root / "transformer-s9" / METRICS).exists()
    finally:
        claim.release()
    assert main(["store", "compact", str(root)]) == 0  # released: now it is compacted too
    assert capsys.readouterr().out.splitlines()[:2] == [
        "compacted 1 run(s): " + _line_of(root, "lrt-s0", sizes),
        "3 run(s) compacted already",
    ]
    assert main(["store", "compact", str(root)]) == 0
    assert capsys.readouterr().out.startswith("compacted 0 runs: nothing to do\n4 run(s) compacted")


def _line_of(root: Path, name: str, sizes: dict) -> str:
    before, after = sizes[name], (root / name / METRICS_XZ).stat().st_size
    return (
        f"metrics.jsonl {before / 1e6:.2f} MB ({before:,} bytes) -> metrics.jsonl.xz "
        f"{after / 1e6:.2f} MB ({after:,} bytes) ({before / after:.2f}x smaller)"
    )


def test_store_compact_errors_are_one_line(tmp_path, capsys):
    assert main(["store", "compact", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err == f"lrt-lab: error: no such store: {tmp_path / 'nowhere'} is not a folder\n"
    with pytest.raises(SystemExit):
        main(["store"])
    assert capsys.readouterr().err.startswith("lrt-lab: error:")
