"""The scale/ command lines under torchrun, and the GPU check's --dry-run end to end on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.run import get_args_parser

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_scale import evaluate, gpu_check, train
from lrt_scale import flops as fl

REPO = Path(__file__).resolve().parents[1]


def option_strings(parser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


@pytest.mark.parametrize("module", [train, evaluate, gpu_check])
def test_torchrun_passes_every_option_through(module):
    """torchrun parses the whole command line with argparse, which expands abbreviations even after
    `-m module`: an option that is a prefix of one of torchrun's (`--run` of `--run-path`) fails
    with "ambiguous option" or is taken by torchrun."""
    options = option_strings(module.build_parser())
    argv = [x for o in options for x in (o, "1")]
    parsed = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node=2", "-m", module.__name__, *argv]
    )
    assert parsed.training_script == module.__name__ and parsed.training_script_args == argv


def test_gate_statistics_match_the_models_own_gates():
    """The saturated fraction the check reports equals one recomputed independently from W_g and
    the normed residual stream entering each block."""
    torch.manual_seed(0)
    model = LRT(preset("tiny", memory=MemoryConfig()))
    with torch.no_grad():
        for gate in model.pathway.gates:
            gate.weight.normal_(0, 3.0)  # far from the neutral init: some gates saturate
    idx = torch.randint(0, 64, (2, 16))
    stats = gpu_check.gate_statistics(model, idx, parse_schedule("interleaved:2"))
    cache = {}
    run_schedule(model, idx, None, parse_schedule("interleaved:2"), cache=cache)
    for l, frac in enumerate(stats["saturated_per_layer"]):
        h = torch.nn.functional.rms_norm(
            cache[f"blocks.{l}.hook_resid_injected"], (model.config.n_embd,)
        )
        g = 2 * torch.sigmoid(h @ model.pathway.gates[l].weight.T)
        assert frac == pytest.approx(((g < 0.05) | (g > 1.95)).float().mean().item())
    assert 0 < stats["saturated"] < 1
    with torch.no_grad():
        for gate in model.pathway.gates:
            gate.weight.zero_()  # 2 sigmoid(0) = 1 everywhere
    assert gpu_check.gate_statistics(model, idx, parse_schedule("interleaved:2"))["saturated"] == 0


def check_report(out, sections):
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry"] and list(report["sections"]) == sections
    failed = {k: v.get("error") for k, v in report["sections"].items() if not v.get("ok")}
    assert not failed
    assert all(f"## {name}: ok" in (out / "gpu_check.md").read_text() for name in sections)
    return report


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One --dry-run of the launcher on CPU, toy sizes (every section its own process under
    timeout, as on the GPU), read by the tests below: (its exit status, report folder)."""
    out = tmp_path_factory.mktemp("gpu_check_dry")
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        ["bash", str(REPO / "scale/launch/gpu_check.sh"), "--dry-run", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc.returncode, out


@pytest.mark.slow
def test_gpu_check_dry_runs_every_section(dry_run):
    status, out = dry_run
    assert status == 0
    report = check_report(out, list(gpu_check.SECTIONS))
    sec = report["sections"]
    assert all(s["launcher"]["returncode"] == 0 for s in sec.values())
    assert sec["attention_parity"]["cases"]["strided"]["sdpa"]["ok"]
    probe = sec["compile_probe"]
    assert probe["max_abs_loss_diff"] < 1e-4 and probe["final"]["graph_breaks"] == 0
    assert probe["recompiled_after_warmup"] is False
    # the launcher set TORCH_LOGS: the warm-up's recompiles (stage kinds, grad mode) are logged
    assert probe["dynamo_log"]["recompiles"] > 0
    for name in ("d12_eager", "d12_compiled"):
        assert set(sec[name]["models"]) == {"lrt", "transformer"}
        assert sec[name]["step_time_ratio"]["fwd_bwd_lrt_over_transformer"] > 0
    assert set(sec["decode"]["lrt_over_transformer"]) == {"1", "2"}
    assert set(sec["decode"]["sequential_bpb"]) >= {"onepass", "interleaved:2", "exact"}
    assert len(sec["memory_d20"]["runs"]) == 4  # two batch sizes per model
    assert any("scaled_dot_product" in op for op in sec["attention"]["ran"]["interleaved:2"])
    page = (out / "gpu_check.md").read_text()
    assert "d12_compiled lrt: forward+backward" in page and "## Figures" in page


@pytest.mark.slow
def test_gpu_check_dry_collects_the_gpu_tests(dry_run):
    """The pytest_gpu section under --dry-run: `pytest -m gpu --collect-only` on the files that
    mark gpu tests selects some and fails on none."""
    status, out = dry_run
    summary = json.loads((out / "gpu_check.json").read_text())["sections"]["pytest_gpu"]["summary"]
    selected = re.match(r"(\d+)(/\d+)? tests? collected", summary)
    assert status == 0 and selected and int(selected.group(1)) > 0, summary


def test_gpu_check_budgets_fit_eight_minutes():
    """The sections' budgets (process start-up included), the plan and the report's start-up
    fit the check's eight minutes; the compile probe comes last."""
    sizes = gpu_check.Sizes()
    assert list(sizes.budgets) == list(gpu_check.SECTIONS)
    assert sum(sizes.budgets.values()) + 20 <= gpu_check.CHECK_MINUTES * 60
    assert list(gpu_check.SECTIONS)[-1] == "compile_probe"


def test_gpu_check_plan_lists_the_sections_named(capsys):
    assert gpu_check.main(["plan", "--sections", "decode,d12_eager"]) == 0
    assert capsys.readouterr().out.split() == ["d12_eager", "50", "decode", "30"]
    assert gpu_check.main(["plan", "--sections", "memory,nope"]) == 2
    assert gpu_check.main(["section", "nope", "--dry-run"]) == 2


def test_d12_section_times_the_optimizer_apart_and_counts_causal_flops(tmp_path):
    """The d12 section at toy size in this process: forward+backward and the optimizer step are
    timed apart, their sum is the step, and MFU divides the schedule's causal FLOPs by them."""
    res = gpu_check.run_section("d12_eager", tmp_path, dry=True)
    assert res["ok"] and json.loads((tmp_path / "sections/d12_eager.json").read_text())["ok"]
    for kind, spec in gpu_check.MODELS:
        r = res["models"][kind]
        cfg = preset("tiny", memory=MemoryConfig() if kind == "lrt" else None, sequence_len=16)
        flops = fl.plan(cfg, spec, steps=1, global_batch_tokens=2 * 16).flops_per_step
        assert r["flops_per_step"] == flops and r["step_s"] == r["fwd_bwd_s"] + r["optimizer_s"]
        assert r["mfu_fwd_bwd"] == pytest.approx(flops / r["fwd_bwd_s"] / fl.H100_BF16_PEAK_FLOPS)
        assert r["mfu_step"] < r["mfu_fwd_bwd"] and r["optimizer_s"] > 0
    ratio = res["step_time_ratio"]["fwd_bwd_lrt_over_transformer"]
    assert ratio == res["models"]["lrt"]["fwd_bwd_s"] / res["models"]["transformer"]["fwd_bwd_s"]


def test_device_batch_fits_an_80gb_h100_from_two_measured_sizes():
    """peak = fixed + per_row x B through two measurements; the largest launcher batch whose peak
    and DDP buckets stay within 95% of an 80 GB H100, whatever GPU measured it."""
    gib = 2**30
    runs = [
        {"device_batch": 2, "peak_bytes": 20 * gib},  # fixed 12 GiB + 4 GiB per row
        {"device_batch": 4, "peak_bytes": 28 * gib},
    ]
    fit = gpu_check.fit_device_batch(runs, param_bytes=5 * gib)
    assert fit["fixed_bytes"] == 12 * gib and fit["per_row_bytes"] == 4 * gib
    cap = 0.95 * gpu_check.H100_80GB_BYTES  # ~75.2 GiB: 12 + 4 B + 5 <= 75.2 -> B <= 14.5
    assert fit["device_batch"] == 8 and 12 * gib + 4 * gib * 8 + 5 * gib <= cap
    assert 12 * gib + 4 * gib * 16 + 5 * gib > cap
    assert gpu_check.fit_device_batch(runs[:1], 0)["device_batch"] is None
    too_big = [
        {"device_batch": 1, "peak_bytes": 76 * gib},
        {"device_batch": 2, "peak_bytes": 77 * gib},
    ]
    assert gpu_check.fit_device_batch(too_big, 0)["device_batch"] is None


def test_report_marks_a_section_killed_at_its_budget_and_keeps_its_figures(tmp_path):
    """A section the launcher's timeout killed (exit 124) still has the JSON it wrote while it ran:
    the report says it timed out and shows what it measured; sections never run are still open;
    recompiles and graph breaks are counted from the section's dynamo log."""
    (tmp_path / "sections").mkdir()
    (tmp_path / "logs").mkdir()
    partial = {"status": "running", "models": {"transformer": {"fwd_bwd_s": 0.5}}, "seconds": 9}
    (tmp_path / "sections/d12_compiled.json").write_text(json.dumps(partial))
    (tmp_path / "sections/d12_compiled.rc.json").write_text('{"returncode": 124, "wall_s": 120}')
    (tmp_path / "logs/d12_compiled.log").write_text(
        "V1202 guards.py:5396] [0/1] [__recompiles] Recompiling function stage in model.py:585\n"
        "V1202 guards.py:5396] [0/1] [__recompiles]     triggered by the following guards\n"
        "V1202 [__graph_breaks] Graph break in user code at attention.py:154\n"
        "W1202 torch._dynamo hit config.recompile_limit (8)\n"
    )
    report = gpu_check.write_report(tmp_path, dry=False, notes=["by hand"])
    sec = report["sections"]["d12_compiled"]
    assert sec["status"] == "timed out" and sec["models"]["transformer"]["fwd_bwd_s"] == 0.5
    assert sec["dynamo_log"] == {"recompiles": 1, "graph_breaks": 1, "recompile_limit_hit": True}
    page = (tmp_path / "gpu_check.md").read_text()
    assert "## d12_compiled: TIMED OUT" in page and "## compile_probe: still open" in page
    assert "d12_compiled transformer: forward+backward 0.5 s" in page
    assert "d12_eager lrt: forward+backward still open" in page
    assert page.index("- by hand") < page.index("## Figures")
    assert report["recommended_device_batch"] is None
