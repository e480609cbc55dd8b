"""The scale/ command lines under torchrun, and the GPU check's --dry mode end to end on CPU."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch.distributed.run import get_args_parser

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_scale import evaluate, gpu_check, train


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
    failed = {
        k: v.get("error")
        for k, v in report["sections"].items()
        if not v.get("ok", "error" not in v)
    }
    assert not failed
    assert all(f"## {name}: ok" in (out / "gpu_check.md").read_text() for name in sections)
    return report


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One --dry run of every section on CPU, tiny sizes (the same code as on the H100 except the
    CUDA kernels), read by the tests below: (main's exit status, report folder)."""
    out = tmp_path_factory.mktemp("gpu_check_dry")
    return gpu_check.main(["--dry", "--out", str(out)]), out


@pytest.mark.slow
def test_gpu_check_dry_runs_every_section(dry_run):
    status, out = dry_run
    assert status == 0
    report = check_report(out, list(gpu_check.SECTIONS))
    sec = report["sections"]
    assert sec["attention_parity"]["cases"]["strided"]["sdpa"]["ok"]
    assert sec["compile"]["max_abs_loss_diff"] < 1e-4 and sec["compile"]["graph_breaks"] == 0
    assert set(report["recommended_device_batch"]) == {"lrt", "transformer"}
    d12 = sec["d12_training"]
    assert set(d12["sequential_bpb"]["bits_per_token"]) >= {"onepass", "interleaved:2", "exact"}
    assert (
        0 <= d12["gates_after_training"]["saturated"] <= 1
        and d12["step_time_ratio"]["lrt_over_transformer"] > 0
    )
    assert any("scaled_dot_product" in op for op in sec["attention"]["ran"]["interleaved:2"])


@pytest.mark.slow
def test_gpu_check_dry_collects_the_gpu_tests(dry_run):
    """The pytest_gpu section under --dry: `pytest -m gpu --collect-only` on the files that mark
    gpu tests selects some and fails on none."""
    status, out = dry_run
    summary = json.loads((out / "gpu_check.json").read_text())["sections"]["pytest_gpu"]["summary"]
    selected = re.match(r"(\d+)(/\d+)? tests? collected", summary)
    assert status == 0 and selected and int(selected.group(1)) > 0, summary


def test_gpu_check_runs_only_the_sections_named(tmp_path):
    assert gpu_check.main(["--dry", "--out", str(tmp_path), "--sections", "attention_parity"]) == 0
    check_report(tmp_path, ["attention_parity"])
    assert gpu_check.main(["--dry", "--out", str(tmp_path), "--sections", "memory,nope"]) == 2


def test_a_reports_notes_come_before_its_sections():
    """Notes written beside a report (how it was run, what it found) lead its page, one bullet
    each; a report without notes has no bullet before its first section."""
    report = {
        "dry": True,
        "torch": "x",
        "started": "now",
        "sizes": {},
        "sections": {"attention": {"ok": True, "seconds": 1.0}},
    }
    bare = gpu_check.markdown(report)
    assert "\n- " not in bare.split("## attention")[0]
    page = gpu_check.markdown({**report, "notes": ["ran twice", "flash skipped"]})
    head = page.split("## attention")[0]
    assert head.index("- ran twice") < head.index("- flash skipped")
