"""`lrt-lab bench` runs on the tiny preset and writes the JSON layout below (RATIO_KEYS and more);
the committed results render into docs/performance.md's table.

Benchmarks are not assertions: no timing is checked here, only that every figure exists and is a
positive finite number.
"""

import argparse
import copy
import dataclasses
import io
import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from lrt_lab import LRT, MemoryConfig, preset, register_schedule
from lrt_lab.commands import bench
from lrt_lab.core.buffer import shifted_rows
from lrt_lab.core.interface import Measured
from lrt_lab.run.decode import Decoder
from lrt_lab.run.hooks import capture
from lrt_lab.run.registry import SCHEDULES
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Chunked, Exact, Interleaved, OnePass, StagedSchedule

RATIO_KEYS = {
    "train_ratio": {
        "interleaved_2",
        "interleaved_4",
        "fullseq_1",
        "fullseq_3",
        "chunked_64",
        "exact",
        "fixedpoint",
        "rollout_1",
        "rollout_2",
    },
    "prefill_ratio": {"onepass", "interleaved_2", "exact"},
    "decode_throughput_ratio": {"batch_1", "batch_N"},
}


def _numbers(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _numbers(v)
    else:
        yield tree


def _positive_finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _parse(argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def test_bench_tiny_writes_valid_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    args = _parse(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--json",
            str(path),
            "--quiet",
            "--threads",
            "1",
        ]
    )
    assert bench.run(args) == 0
    table = capsys.readouterr().out
    assert "interleaved_2" in table and "decoding" in table
    result = json.loads(path.read_text())
    assert result["device"] == "cpu" and result["preset"] == "tiny"
    for group, keys in RATIO_KEYS.items():
        assert set(result[group]) == keys, group
        assert all(_positive_finite(v) for v in result[group].values()), result[group]
    absolute = result["absolute"]
    assert {"train_step_ms", "prefill_ms", "decode_tokens_per_s"} <= set(absolute)
    assert all(_positive_finite(v) for v in _numbers(absolute)), absolute
    assert result["settings"]["prompt_len"] == 16  # the tiny preset shrinks the 1,024-token prompt
    used = result["sweeps_used"]["fixedpoint"]
    # one repeat, no warm-up
    assert used["spec"] == "fixedpoint:0.01:8" and len(used["samples"]) == 1
    assert all(1 <= k <= 8 for k in used["samples"]) and "sweeps used" in table
    for key, spec in (("rollout_1", "rollout:1"), ("rollout_2", "rollout:2")):
        share = result["rollout_share"][key]
        assert share["spec"] == spec and len(share["samples"]) == 1
        assert all(0 < x < 1 for x in share["samples"])  # a part of the step, never all of it
    assert "rollout:1" in table and "of fwd+bwd wall time" in table


@pytest.mark.slow
def test_bench_runs_at_the_a5_study_shape():
    """--seq-len 16 --batch-size 256 (the A5 study's shape) on the bench preset's model."""
    result = bench.run_bench(
        "cpu",
        "cpu",
        seq_len=16,
        batch_size=256,
        prompt_len=16,
        decode_batch=2,
        decode_steps=1,
        repeats=1,
        warmup=0,
        threads=1,
    )
    assert result["settings"]["seq_len"] == 16 and result["settings"]["batch_size"] == 256
    assert result["settings"]["exact_seq_len"] == 16
    assert all(_positive_finite(v) for v in result["train_ratio"].values())


def test_run_bench_from_python_returns_the_same_layout():
    result = bench.run_bench(
        "cpu", "tiny", repeats=1, warmup=0, decode_batch=1, decode_steps=2, threads=1
    )
    for group, keys in RATIO_KEYS.items():
        assert set(result[group]) == keys
    assert result["settings"]["decode_batch_N"] == 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(device="tpu"), "device"),
        (dict(preset="d99"), "preset"),
        (dict(repeats=0), "repeats"),
        (dict(warmup=-1), "warmup"),
        (dict(seq_len=2), "seq_len"),
        (dict(batch_size=0), "batch_size"),
        (dict(prompt_len=1), "prompt_len"),
        (dict(exact_seq_len=64), "exact_seq_len"),  # longer than the tiny preset's T=16
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    kwargs = {"preset": "tiny", **kwargs}
    with pytest.raises(ValueError, match=rf"^{field}="):
        bench.run_bench(**kwargs)


def test_cuda_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError, match=r"device='cuda' is invalid; allowed: cpu \(CUDA is not available\)"
    ):
        bench.run_bench(device="cuda", preset="tiny")


def test_cli_reports_bad_arguments_as_exit_code_2(capsys):
    assert bench.run(_parse(["--device", "cpu", "--preset", "nope", "--quiet"])) == 2
    assert "preset='nope' is invalid" in capsys.readouterr().err


# Schedules added to the default training cases ----------------------------------------------------


@dataclasses.dataclass
class HalvesMeasured(Measured):
    sweeps: int = 0  # passes over the whole sequence

    def record(self, step_s: float) -> dict:
        return {"sweeps": self.sweeps}


@dataclasses.dataclass(frozen=True)
class Halves(StagedSchedule):
    """A schedule of the user's own: the whole sequence, then its first and second halves in turn,
    `rounds` times; it reports the passes it made as sweeps, as FixedPoint does."""

    rounds: int = 1

    def stages(self, T: int) -> list[range]:
        if T < 2:
            raise ValueError(f"Halves needs T >= 2, got T={T}")
        return [range(0, T)] + [range(0, T // 2), range(T // 2, T)] * self.rounds

    @property
    def cost(self) -> float:
        return 1.0 + self.rounds

    def run(self, model, idx, buffer):
        out = super().run(model, idx, buffer)
        return dataclasses.replace(out, measured=HalvesMeasured(out.measured.cost, 1 + self.rounds))


@pytest.fixture
def halves():
    """Halves registered as `halves:R` for one test only
    (other tests list the built-in spellings)."""
    register_schedule("halves:R")(Halves)
    yield Halves
    del SCHEDULES["halves"]


def test_bench_times_a_schedule_registered_in_the_users_own_file(halves, tmp_path):
    path, table = tmp_path / "bench.json", io.StringIO()
    result = bench.run_bench(
        "cpu",
        "tiny",
        repeats=1,
        warmup=0,
        decode_steps=1,
        threads=1,
        schedules=[halves(2), "halves:1"],
        json_path=path,
        out=table,
    )
    written = json.loads(path.read_text())
    assert list(written["train_ratio"]) == list(result["train_ratio"])
    assert set(written["train_ratio"]) == RATIO_KEYS["train_ratio"] | {"halves:2", "halves:1"}
    assert list(written["train_ratio"])[-2:] == ["halves:2", "halves:1"]  # after the default cases
    for key, sweeps in (("halves:2", 3), ("halves:1", 2)):
        assert _positive_finite(written["train_ratio"][key])
        assert _positive_finite(written["train_ratio_fwd_bwd"][key])
        assert _positive_finite(written["absolute"]["train_step_ms"][key])
        assert len(written["samples_ms"][f"train.{key}"]) == 1
        assert written["sweeps_used"][key] == {"spec": key, "median": sweeps, "samples": [sweeps]}
        assert written["settings"]["schedules"][key] == {"seq_len": 16, "warmup": 0, "repeats": 1}
        assert (
            f"  {key} " in table.getvalue() and f"sweeps used: median {sweeps}" in table.getvalue()
        )
    assert "| train halves:2 |" in bench.markdown_table([("bench.json", written)])


def test_cli_adds_builtin_spellings_to_the_default_cases(tmp_path, capsys):
    """A comma between fullseq's weights stays in its spelling; chunked:1 runs one position per
    stage, so it trains at --exact-seq-len, as Exact does."""
    path = tmp_path / "bench.json"
    args = _parse(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--decode-steps",
            "1",
            "--exact-seq-len",
            "8",
            "--json",
            str(path),
            "--quiet",
            "--threads",
            "1",
            "--schedules",
            "interleaved:3,fullseq:2:1,1,2",
            "--schedules",
            "chunked:1",
        ]
    )
    assert bench.run(args) == 0
    table = capsys.readouterr().out
    result = json.loads(path.read_text())
    added = ["interleaved:3", "fullseq:2:1,1,2", "chunked:1"]
    assert list(result["train_ratio"]) == [*bench.TRAIN_CASES, *added]
    assert all(_positive_finite(result["train_ratio"][key]) for key in added), result["train_ratio"]
    assert {key: s["seq_len"] for key, s in result["settings"]["schedules"].items()} == {
        "interleaved:3": 16,
        "fullseq:2:1,1,2": 16,
        "chunked:1": 8,
    }
    assert (
        "  interleaved:3 " in table
        and "  fullseq:2:1,1,2 " in table
        and "  chunked:1 (T=8) " in table
    )
    assert "| train chunked:1 | " in bench.markdown_table([("bench.json", result)])
    assert (
        "schedules"
        not in bench.run_bench("cpu", "tiny", repeats=1, warmup=0, decode_steps=1, threads=1)[
            "settings"
        ]
    )  # the default layout as before


@pytest.mark.parametrize(
    "spec, message",
    [
        ("interleaved:3,nope:2", "schedule='nope:2' is invalid; allowed: onepass, interleaved:S"),
        (
            "interleaved:99",
            "schedules='interleaved:99' is invalid; allowed: a schedule that runs at T=16",
        ),
        (
            "interleaved:2",
            "schedules='interleaved:2' is invalid; allowed: a schedule not timed already",
        ),
        (
            "chunked:8,chunked:8",
            "schedules='chunked:8' is invalid; allowed: a schedule not timed already",
        ),
    ],
)
def test_cli_refuses_a_bad_schedule_before_timing_anything(spec, message, monkeypatch, capsys):
    timed = []
    monkeypatch.setattr(bench, "_run_cases", lambda cases, *rest: timed.append(cases))
    assert bench.run(_parse(["--device", "cpu", "--preset", "tiny", "--schedules", spec])) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("lrt-lab bench: error: ") and message in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""  # one line; no progress, no table
    assert not timed


def test_run_bench_refuses_what_is_not_a_schedule():
    with pytest.raises(ValueError, match=r"^schedule=.* lacks spec, cost"):
        bench.run_bench("cpu", "tiny", schedules=[object()])


# The committed results and docs/performance.md's table --------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def test_performance_page_shows_the_committed_bench_json():
    """The table between the bench-table markers is what the committed JSON renders to, so the page
    never shows hand-typed or stale figures (python scripts/bench_table.py rewrites it)."""
    page = (REPO / "docs" / "performance.md").read_text()
    results = bench.load_results(REPO / "docs" / "bench")
    assert results, "no committed bench JSON in docs/bench"
    table = bench.markdown_table(results)
    assert bench.replace_table(page, table) == page, "run: python scripts/bench_table.py"
    for name, _ in results:
        assert f"`{name}`" in table


def test_bench_table_renders_a_fresh_result_and_needs_its_markers(tmp_path):
    result = bench.run_bench(
        "cpu",
        "tiny",
        repeats=1,
        warmup=0,
        decode_steps=1,
        threads=1,
        json_path=tmp_path / "tiny.json",
    )
    table = bench.markdown_table(bench.load_results(tmp_path))
    assert "`tiny.json`" in table and "train rollout:1" in table
    assert f"{result['train_ratio']['interleaved_2']:.2f}x" in table
    page = f"intro\n{bench.TABLE_START}\nold\n{bench.TABLE_END}\noutro\n"
    want = f"intro\n{bench.TABLE_START}\n{table}\n{bench.TABLE_END}\noutro\n"
    assert bench.replace_table(page, table) == want
    with pytest.raises(ValueError, match="markers"):
        bench.replace_table("no markers here", table)


# The performance work's fast paths (lrt_lab.core.model/buffer/attention), beyond what test_core
# holds --


def _model(memory=MemoryConfig(), seed=0):  # noqa: B008 (a frozen dataclass)
    torch.manual_seed(seed)
    model = LRT(
        preset("tiny", memory=memory, n_layer=3, window_pattern="SL", short_window=4)
    ).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def test_shifted_rows_matches_a_loop_with_gradients():
    for n_rows in (1, 2, 7):
        mem = torch.randn(2, n_rows, 3, dtype=torch.float64, requires_grad=True)
        for start, stop, step, shift in itertools.product(
            range(9), range(12), range(1, 5), range(5)
        ):
            P = range(start, stop, step)
            got = shifted_rows(mem, P, shift)
            rows = [
                mem[:, t - shift] if 0 <= t - shift < n_rows else mem.new_zeros(2, 3) for t in P
            ]
            want = torch.stack(rows, 1) if rows else mem.new_zeros(2, 0, 3)
            assert got.shape == want.shape and torch.equal(got, want), (P, shift)
            if got.requires_grad and want.requires_grad:
                (g1,) = torch.autograd.grad((got * got).sum(), mem)
                (g2,) = torch.autograd.grad((want * want).sum(), mem)
                assert torch.equal(g1, g2)


def test_decoder_sees_weight_updates_between_steps():
    """Nothing derived from the weights may be cached across decoding steps: an in-place update
    between steps must change the next step exactly as a fresh cache would."""
    model = _model()
    idx = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    dec = Decoder(model, 2, 6)
    for t in range(3):
        dec.step(idx[:, t])
    with torch.no_grad():
        for block in model.blocks:
            block.attn.c_k.weight.mul_(1.5)
        model.pathway.gates[0].weight.add_(0.3)
    reference = copy.deepcopy(dec.cache)
    got = dec.step(idx[:, 3])
    want, _ = model.stage(idx[:, 3:4], range(3, 4), reference)
    assert torch.equal(got, want[:, 0])


def test_hooks_keep_the_memory_they_were_given_during_decoding():
    model = _model()
    dec = Decoder(model, 1, 4)
    tok = torch.tensor([3])
    dec.step(tok)
    with capture(dec.model, ["hook_mem_in"]) as cap:
        dec.step(tok)
    held = cap.calls["hook_mem_in"][0][1]
    before = held.clone()
    dec.step(tok)  # rebinds the cache's memory row
    assert torch.equal(held, before)


def test_inference_mode_first_then_training():
    """Rotary tables and attention masks are cached; caching them under inference_mode must not
    make a later training step fail ("inference tensors cannot be saved for backward")."""
    model = _model()
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        run_schedule(model, idx, None, Interleaved(2))
    run_schedule(model, idx, idx, Interleaved(2)).loss.backward()
    assert model.blocks[0].attn.c_q.weight.grad is not None


def test_transformer_and_lrt_prefill_then_decode_match_exact_under_no_grad():
    for memory in (None, MemoryConfig()):
        model = _model(memory)
        idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
        sched = OnePass() if memory is None else Exact()
        dec = Decoder(model, 2, 9)
        last = dec.prefill(idx[:, :5], sched)
        steps = torch.stack([last] + [dec.step(idx[:, t]) for t in range(5, 8)], 1)
        ref = run_schedule(model, idx[:, :8], None, sched).logits[:, 4:]
        assert (steps - ref).abs().max() < 1e-10


def test_no_grad_appends_grow_in_place_without_corrupting_branches():
    """Without autograd, chunk appends write into preallocated storage; re-running a stage from an
    older buffer must leave the newer buffer's rows alone."""
    model = _model()
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    other = torch.randint(0, 64, (2, 3), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, b1 = model.stage(idx[:, :3], range(0, 3), model.empty_buffer(idx))
        _, b2 = model.stage(idx[:, 3:6], range(3, 6), b1)  # storage allocated here
        _, b3 = model.stage(idx[:, 6:9], range(6, 9), b2)  # grows in place
        k3, mem3 = b3.k[1].clone(), b3.mem.clone()
        branch, _ = model.stage(other, range(6, 9), b2)  # another continuation of b2
    assert torch.equal(b3.k[1], k3) and torch.equal(b3.mem, mem3)
    _, r2 = model.stage(
        idx[:, 3:6], range(3, 6), model.stage(idx[:, :3], range(0, 3), model.empty_buffer(idx))[1]
    )
    want_branch, _ = model.stage(other, range(6, 9), r2)
    assert (branch - want_branch).abs().max() < 1e-12
    chunked = run_schedule(model, idx, None, Chunked(3)).buffer
    assert (b3.k[1] - chunked.k[1]).abs().max() < 1e-12 and (
        b3.mem - chunked.mem
    ).abs().max() < 1e-12


@pytest.mark.slow
def test_compile_study_layout_and_its_rule(tmp_path, monkeypatch, capsys):
    """--compile-study (outside the default benchmark): per shape and model, eager and compiled
    first-step and steady times, speed-up = eager / compiled median, the losses of the two equal
    (same weights and batch), and the default rule applied to the smallest speed-up. Compiled
    with the "eager" backend here, so the test takes seconds (the measurement uses inductor)."""
    import functools

    from lrt_lab.commands import bench

    monkeypatch.setattr(
        bench, "COMPILE_SHAPES", {"toy": bench.CompileShape("tiny", 64, 8, 2)}, raising=True
    )
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    path = tmp_path / "compile.json"
    args = ["--compile-study", "--repeats", "2", "--warmup", "1", "--json", str(path), "--quiet"]
    assert bench.main(args) == 0
    result = json.loads(path.read_text())
    assert [(r["shape"], r["model"]) for r in result["rows"]] == [
        ("toy", "transformer"),
        ("toy", "lrt"),
    ]
    for r in result["rows"]:
        cpu = r["step_cpu_s"]
        assert r["speedup"] == pytest.approx(cpu["eager"] / cpu["compiled"])
        assert r["max_abs_loss_diff"] < 1e-5 and set(r["first_step_s"]) == {"eager", "compiled"}
    assert result["min_speedup"] == min(r["speedup"] for r in result["rows"])
    assert result["compile_by_default"] == (result["min_speedup"] >= 1.3)
    assert "speed-up" in capsys.readouterr().out
    with pytest.raises(ValueError, match="shapes"):
        bench.run_compile_study(shapes=("nope",))


def test_a_bench_result_file_follows_the_umask(tmp_path):
    import os

    from lrt_lab.commands.bench import _write_json

    old = os.umask(0o027)
    try:
        _write_json({"a": 1}, tmp_path / "bench.json")
    finally:
        os.umask(old)
    assert (tmp_path / "bench.json").stat().st_mode & 0o777 == 0o640
