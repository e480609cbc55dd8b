"""Experiment-tracking mirrors (lrt_lab.training.mirrors, `--log wandb` / `--log tensorboard`): what
W&B and
TensorBoard received is read back from the files they wrote and compared with the run store, which
stays the source of truth. Tests that need a package skip without it; the missing-package error is
tested with the package hidden."""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from lrt_lab.commands.cli import main
from lrt_lab.store.results import Run
from lrt_lab.store.run_groups import group_name
from lrt_lab.training.loop import TrainConfig, train
from lrt_lab.training.mirrors import Mirrors, MirrorSettings, record_scalars, wandb_mode
from lrt_lab.training.parallel import train_grid_point
from lrt_lab.training.sweep import run_sweep

TINY = [
    "--preset",
    "tiny",
    "--length",
    "8",
    "--batch-size",
    "4",
    "--eval-size",
    "4",
    "--eval-lengths",
    "8",
    "--steps",
    "6",
    "--eval-every",
    "3",
    "--quiet",
]
RUN_NAME = "a5_prefix-L8-tiny-lrt-interleaved_2-s0"


def tiny_cfg(**kw):
    base = dict(
        task="a5_prefix",
        length=8,
        preset="tiny",
        steps=6,
        batch_size=4,
        eval_every=3,
        eval_lengths=(8,),
        eval_size=4,
        checkpoint_every=2,
    )
    return TrainConfig(**{**base, **kw})


def store_scalars(run: Run) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every number in the run's metrics.jsonl, named as the mirrors name
    them."""
    out = {}
    for record in run.metrics_records():
        for tag, value in record_scalars(record).items():
            out.setdefault(tag, {})[record["step"]] = value
    return out


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """W&B as on a machine without an API key, its own settings and caches under tmp_path."""
    pytest.importorskip("wandb")
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))


# TensorBoard -------------------------------------------------------------------------------------
def tensorboard_events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def tensorboard_scalars(acc) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_text(acc, tag: str) -> list[str]:
    return [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")]


def assert_tensorboard_matches_store(run: Run):
    """Every number of every metrics line, at its step, once, with the store's value (as float32,
    what TensorBoard keeps); nothing else but the summary."""
    got = tensorboard_scalars(tensorboard_events(run.path / "tensorboard"))
    want = store_scalars(run)
    assert set(want) == {tag for tag in got if not tag.startswith("summary/")}
    for tag, by_step in want.items():
        assert got[tag] == [(step, float(np.float32(v))) for step, v in sorted(by_step.items())], (
            tag
        )


def test_tensorboard_mirrors_every_metrics_line_the_config_and_the_summary(tmp_path):
    pytest.importorskip("tensorboard")
    assert main(["train", *TINY, "--out", str(tmp_path), "--log", "tensorboard"]) == 0
    run = Run(tmp_path / RUN_NAME)
    assert run.is_complete and "train/loss" in store_scalars(run)
    assert_tensorboard_matches_store(run)
    acc = tensorboard_events(run.path / "tensorboard")
    (config_text,) = tensorboard_text(acc, "config")
    config = json.loads(config_text.strip("`\n"))
    assert config["train"] == json.loads(json.dumps(run.config["train"]))
    assert config["group"] == group_name(run.config)
    summary = run.summary
    assert acc.Scalars("summary/final_loss")[0].value == float(np.float32(summary["final_loss"]))
    assert acc.Scalars("summary/final_loss")[0].step == 6
    (summary_text,) = tensorboard_text(acc, "summary")
    assert json.loads(summary_text.strip("`\n"))["status"] == "complete"
    assert "log" not in run.config["train"]  # a mirror is not part of the run's identity


def test_tensorboard_after_a_resume_holds_each_step_once_with_the_stores_values(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = tiny_cfg()
    run = train(cfg, out=tmp_path, progress=False, stop_after=3, log=["tensorboard"])
    assert not run.is_complete
    # as if killed after step 3 before its checkpoint: steps 3.. are trained (and mirrored) again
    (run.path / "checkpoints" / "step_0000003.pt").unlink()
    run = train(cfg, out=tmp_path, progress=False, resume=True, log=["tensorboard"])
    assert run.is_complete
    assert len(list((run.path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert_tensorboard_matches_store(run)
    assert len(tensorboard_text(tensorboard_events(run.path / "tensorboard"), "config")) == 1


# W&B ---------------------------------------------------------------------------------------------
def wandb_records(run_file: Path) -> list:
    """The records of an offline run's .wandb file (a LevelDB-style log of protobuf records:
    a 7-byte file header, then 32 KiB blocks of chunks, each with a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunks, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def finished_records(run_file: Path, timeout_s: float = 60.0) -> list:
    """The records once W&B's service has written the run's exit record: offline, `run.finish()`
    returns before that process has flushed the file (seen with wandb 0.31 on a loaded machine)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = wandb_records(run_file)
        except Exception:  # noqa: BLE001 (a record still being written does not parse yet)
            records = []
        if (
            any(r.WhichOneof("record_type") == "exit" for r in records)
            or time.monotonic() > deadline
        ):
            return records
        time.sleep(0.2)


def offline_run(run: Run, index: int = 0) -> dict:
    """One offline W&B run under the run folder: its run record, config, history and summary."""
    folders = sorted((run.path / "wandb").glob("offline-run-*"))
    (run_file,) = folders[index].glob("run-*.wandb")
    out = {"run": None, "config": {}, "history": {}, "summary": {}, "folders": len(folders)}
    for record in finished_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"] = {
                item.key: json.loads(item.value_json) for item in record.run.config.update
            }
        elif kind == "history":
            step = record.history.step.num
            for item in record.history.item:
                tag = item.key or "/".join(item.nested_key)
                if not tag.startswith("_"):
                    out["history"].setdefault(tag, {})[step] = json.loads(item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                out["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def test_wandb_offline_run_folder_holds_the_config_every_metrics_line_and_the_summary(
    tmp_path, offline_wandb
):
    assert main(["train", *TINY, "--out", str(tmp_path / "runs"), "--log", "wandb"]) == 0
    run = Run(tmp_path / "runs" / RUN_NAME)
    wb = offline_run(run)
    assert wb["folders"] == 1
    stored_id = json.loads((run.path / "wandb" / "lrt_lab_run_id.json").read_text())["id"]
    assert wb["run"].run_id == stored_id and wb["run"].project == "lrt_lab"
    assert wb["run"].display_name == RUN_NAME and wb["run"].run_group == group_name(run.config)
    assert wb["config"]["train"] == json.loads(json.dumps(run.config["train"]))
    assert wb["config"]["params"] == run.config["params"]
    assert wb["history"] == store_scalars(run)  # every step of every metric, the same doubles
    assert wb["summary"]["final_loss"] == run.summary["final_loss"]
    assert wb["summary"]["status"] == "complete" and wb["summary"]["eval"] == run.summary["eval"]


def test_wandb_resume_continues_the_same_wandb_run(tmp_path, offline_wandb):
    cfg = tiny_cfg()
    train(cfg, out=tmp_path / "runs", progress=False, stop_after=3, log=["wandb"])
    run = train(cfg, out=tmp_path / "runs", progress=False, resume=True, log=["wandb"])
    first, second = offline_run(run, 0), offline_run(run, 1)
    # one W&B run, two segments
    assert second["folders"] == 2 and first["run"].run_id == second["run"].run_id
    assert sorted(first["history"]["train/loss"]) == [1, 2, 3]
    assert sorted(second["history"]["train/loss"]) == [4, 5, 6]
    both = {**first["history"]["train/loss"], **second["history"]["train/loss"]}
    assert both == store_scalars(run)["train/loss"]
    assert "final_loss" not in first["summary"] and second["summary"]["status"] == "complete"


def test_a_sweeps_seeds_share_one_wandb_group_named_after_their_config_group(
    tmp_path, offline_wandb
):
    spec = {
        "sweep": {"tasks": ["a5_prefix"], "models": ["lrt"], "seeds": [0, 1]},
        "train": {
            "length": 8,
            "preset": "tiny",
            "steps": 4,
            "batch_size": 4,
            "eval_size": 4,
            "eval_lengths": [8],
            "eval_every": 0,
            "device": "cpu",
        },
    }
    runs = run_sweep(
        spec,
        out=str(tmp_path / "runs"),
        progress=False,
        log=MirrorSettings(("wandb",), wandb_project="grid"),
    )
    assert [r.status for r in runs] == ["complete", "complete"]
    wbs = [offline_run(r)["run"] for r in runs]
    assert (
        {wb.run_group for wb in wbs} == {group_name(runs[0].config)} == {group_name(runs[1].config)}
    )
    assert len({wb.run_id for wb in wbs}) == 2 and {wb.project for wb in wbs} == {"grid"}
    # another config of the same sweep is another group
    longer = {**runs[0].config, "train": {**runs[0].config["train"], "steps": 5}}
    assert group_name(longer) != wbs[0].run_group


def test_a_diverged_run_ends_its_mirrors_with_its_status(tmp_path, offline_wandb):
    pytest.importorskip("tensorboard")
    run = train(
        tiny_cfg(steps=20, lr_scale=1e30),
        out=tmp_path / "runs",
        progress=False,
        log=["wandb", "tensorboard"],
    )
    summary = run.summary
    assert summary["status"] == "diverged"
    wb = offline_run(run)
    assert wb["summary"]["status"] == "diverged"
    assert wb["summary"]["diverged_at_step"] == summary["diverged_at_step"]
    (exit_record,) = [
        r
        for r in finished_records(next((run.path / "wandb").glob("offline-run-*/run-*.wandb")))
        if r.WhichOneof("record_type") == "exit"
    ]
    assert exit_record.exit.exit_code == 1  # W&B shows it failed
    losses = tensorboard_scalars(tensorboard_events(run.path / "tensorboard"))["train/loss"]
    assert losses[-1][0] == summary["diverged_at_step"]
    # the loss that ended it (null in the store: JSON has no NaN)
    assert not np.isfinite(losses[-1][1])
    assert wb["history"]["train/loss"].keys() == {step for step, _ in losses}


def test_wandb_is_offline_without_an_api_key():
    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"
    assert wandb_mode({"WANDB_MODE": "online"}) == "online"


# Without the packages, and when a mirror fails ---------------------------------------------------
@pytest.mark.parametrize("name", ["wandb", "tensorboard"])
@pytest.mark.parametrize("command", ["train", "sweep"])
def test_a_missing_package_is_one_line_naming_the_extra_and_nothing_is_written(
    tmp_path, monkeypatch, capsys, name, command
):
    # `import name` now fails as if it were not installed
    monkeypatch.setitem(sys.modules, name, None)
    spec = tmp_path / "grid.toml"
    spec.write_text(
        '[sweep]\ntasks = ["a5_prefix"]\nmodels = ["lrt"]\n[train]\nlength = 8\npreset = "tiny"\n'
        "steps = 4\nbatch_size = 4\neval_size = 4\neval_lengths = [8]\n"
    )
    args = ["train", *TINY] if command == "train" else ["sweep", str(spec), "--quiet"]
    assert main([*args, "--out", str(tmp_path / "runs"), "--log", name]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"lrt-lab: error: --log {name}: the {name} package is not installed; "
        f"pip install 'lrt-lab[{name}]'\n"
    )
    assert not (tmp_path / "runs").exists()


def test_bad_log_arguments_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *TINY, "--out", str(tmp_path), "--log", "mlflow"])
    assert exit_.value.code == 2 and "--log: invalid choice: 'mlflow'" in capsys.readouterr().err
    assert main(["train", *TINY, "--out", str(tmp_path), "--wandb-project", "p"]) == 2
    assert capsys.readouterr().err == "lrt-lab: error: --wandb-project needs --log wandb\n"
    with pytest.raises(ValueError, match="allowed: wandb, tensorboard"):
        train(tiny_cfg(), out=tmp_path, log=["mlflow"])
    assert not list(tmp_path.iterdir())


class Recording:
    def __init__(self):
        self.calls = []

    def start(self, config, run_name, group):
        self.calls.append(("start", run_name, group))

    def log(self, step, metrics):
        self.calls.append(("log", step, metrics))

    def finish(self, summary):
        self.calls.append(("finish", summary))


class FailingAt(Recording):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def log(self, step, metrics):
        if step == self.step:
            raise OSError("No space left on device\n(second line)")
        super().log(step, metrics)


def test_a_failing_mirror_is_dropped_with_one_warning_line_and_the_others_go_on(capsys):
    failing, recording = FailingAt(2), Recording()
    mirrors = Mirrors({"tensorboard": failing, "wandb": recording}, "r").start({}, "r", "g")
    for step in (1, 2, 3):
        record = {
            "kind": "train",
            "step": step,
            "loss": 1.0 / step,
            "stage_losses": [0.5],
            "converged": True,
        }
        mirrors.log(record)
    mirrors.finish({"status": "complete"})
    mirrors.finish(None)  # what leaving train() does: nothing more once a summary ended them
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "lrt-lab: warning: --log tensorboard stopped mirroring r"
    )
    assert "OSError: No space left on device (second line)" in err
    assert [c[:2] for c in failing.calls] == [("start", "r"), ("log", 1)]
    assert [c[:2] for c in recording.calls] == [
        ("start", "r"),
        ("log", 1),
        ("log", 2),
        ("log", 3),
        ("finish", {"status": "complete"}),
    ]
    assert recording.calls[1][2] == {
        "train/loss": 1.0,
        "train/stage_losses/0": 0.5,
        "train/converged": 1.0,
    }


def test_a_mirror_failing_mid_run_costs_the_run_store_nothing(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tensorboard")
    from lrt_lab.training import mirrors

    def full_disk(self, step, metrics):
        if step >= 3:
            raise OSError("No space left on device")
        return original(self, step, metrics)

    original = mirrors.TensorBoardMirror.log
    monkeypatch.setattr(mirrors.TensorBoardMirror, "log", full_disk)
    run = train(tiny_cfg(), out=tmp_path, progress=False, log=["tensorboard"])
    assert run.is_complete and sorted(store_scalars(run)["train/loss"]) == [1, 2, 3, 4, 5, 6]
    assert capsys.readouterr().err.count("lrt-lab: warning: --log tensorboard") == 1
    got = tensorboard_scalars(tensorboard_events(run.path / "tensorboard"))
    assert [step for step, _ in got["train/loss"]] == [1, 2]  # what it had before it failed


def test_a_grid_point_passes_its_mirrors_to_the_run(tmp_path):
    """The function Ray tasks and Slurm jobs run: its runs are
    mirrored like the sequential sweep's."""
    pytest.importorskip("tensorboard")
    result = train_grid_point(
        tiny_cfg(steps=2, eval_every=0), str(tmp_path), threads=1, log=("tensorboard",)
    )
    assert result["status"] == "complete"
    assert_tensorboard_matches_store(Run(tmp_path / RUN_NAME))
