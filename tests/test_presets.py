"""Memory presets (the paper's text vs its released code) and the gate_channels field they need."""

import json

import pytest
import torch
from reference import NaiveLRT

from lrt_lab import LRT, MEMORY_PRESETS, MemoryConfig, memory_preset, preset
from lrt_lab.commands.cli import main
from lrt_lab.core.memory import norm
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact, Interleaved
from lrt_lab.training.loop import TrainConfig, model_config
from lrt_lab.training.sweep import expand, validate_spec

TOL = 1e-10


def random_model(memory, n_embd=64, n_layer=3):
    """float64, every weight random, d=64 so that 32 gate channels are a real restriction."""
    cfg = preset("tiny", memory=memory, n_layer=n_layer, n_embd=n_embd, n_head=4, n_kv_head=2)
    torch.manual_seed(0)
    model = LRT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def test_paper_preset_is_the_default_and_resolves_to_the_papers_source_layer():
    assert memory_preset("paper", 4) == MemoryConfig()
    m = memory_preset("paper", 20)
    assert (m.source_tap, m.projections, m.gamma_init, m.rec_init, m.gate_channels) == (
        "resid",
        "shared",
        0.1,
        "uniform",
        None,
    )
    assert preset("d20", memory=m).source_layer == 12 and preset("a5", memory=m).source_layer == 2


def test_released_preset_reads_the_normed_final_state_with_layerwise_projections():
    m = memory_preset("released", 4)
    assert (m.source_layer, m.source_tap, m.projections, m.gate_channels) == (
        4,
        "normed",
        "layerwise",
        32,
    )
    assert (m.gamma_init, m.rec_init) == (
        0.1,
        "uniform",
    )  # the released code's init, as the paper's
    assert memory_preset("released", 4, gamma_init=0.0).gamma_init == 0.0  # overrides on top
    assert set(MEMORY_PRESETS) == {"paper", "released"}


def test_released_memory_is_the_lm_heads_input():
    """m_t is rms_norm of the last block's output: what
    lm_head reads (the released code's h_final)."""
    model = random_model(memory_preset("released", 3))
    idx = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    cache = {}
    run_schedule(model, idx, None, Exact(), cache=cache)
    assert torch.allclose(
        cache["hook_mem_out"], norm(cache["blocks.2.hook_resid_post"]), atol=1e-12
    )


@pytest.mark.parametrize("sched", [Exact(), Interleaved(2)])
def test_gates_on_32_channels_match_the_reference(sched):
    """gate_channels=32 at d=64: the gate matrices are (2 n_kv, 32), and the model equals the
    independent reference, which slices h[:32] itself."""
    model = random_model(memory_preset("released", 3))
    assert model.pathway.gates[0].weight.shape == (4, 32)
    idx = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(2))
    naive, _ = NaiveLRT(model).run(idx, [list(P) for P in sched.stages(7)])
    assert (run_schedule(model, idx, None, sched).logits - naive).abs().max().item() <= TOL


def test_gate_channels_change_the_output():
    """The channels past 32 reach the gates only when gate_channels is None."""
    full = random_model(MemoryConfig())
    part = random_model(MemoryConfig(gate_channels=32))
    with torch.no_grad():  # the same weights; the 32-channel gates get the first 32 columns
        for l, g in enumerate(part.pathway.gates):
            g.weight.copy_(full.pathway.gates[l].weight[:, :32])
        part_sd = {k: v for k, v in full.state_dict().items() if not k.startswith("pathway.gates")}
        part.load_state_dict(part_sd, strict=False)
    idx = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    a = run_schedule(full, idx, None, Exact()).logits
    b = run_schedule(part, idx, None, Exact()).logits
    assert (a - b).abs().max().item() > 1e-3
    with torch.no_grad():  # zero the columns past 32: now the two models agree
        for g in full.pathway.gates:
            g.weight[:, 32:] = 0
    a = run_schedule(full, idx, None, Exact()).logits
    assert (a - b).abs().max().item() <= TOL


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: memory_preset("paper_v2", 4), "memory_preset"),
        (lambda: MemoryConfig(gate_channels=16), "memory.gate_channels"),
        (
            lambda: preset(
                "tiny", memory=MemoryConfig(gate_channels=32), n_embd=16, n_head=2, n_kv_head=1
            ),
            "memory.gate_channels",
        ),
        (lambda: TrainConfig(memory_preset="code"), "memory_preset"),
    ],
)
def test_bad_presets_name_the_field(make, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


def test_train_config_applies_the_preset_then_the_overrides():
    cfg = TrainConfig(
        preset="small", memory_preset="released", overrides={"memory.gamma_init": 0.0}
    )
    m = model_config(cfg, 60).memory
    assert (m.source_layer, m.source_tap, m.projections, m.gamma_init) == (
        4,
        "normed",
        "layerwise",
        0.0,
    )
    deep = model_config(
        TrainConfig(preset="small", memory_preset="released", overrides={"n_layer": 6}), 60
    )
    assert deep.memory.source_layer == 6  # the final layer of the model actually built
    assert "released" in cfg.run_name and "released" not in TrainConfig().run_name


def test_cli_records_the_preset_in_the_run_config(tmp_path):
    args = [
        "train",
        "--task",
        "group_prefix",
        "--task-opt",
        "group=S3",
        "--length",
        "4",
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--eval-every",
        "0",
        "--eval-lengths",
        "4",
        "--eval-size",
        "4",
        "--checkpoint-every",
        "0",
        "--device",
        "cpu",
        "--memory-preset",
        "released",
        "--name",
        "r",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert main(args) == 0
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["train"]["memory_preset"] == "released"
    assert config["model"]["memory"]["source_tap"] == "normed"
    assert (
        config["model"]["memory"]["source_layer"] == 2
        and config["model"]["memory"]["gate_channels"] == 32
    )


def test_sweep_specs_select_presets_per_variant():
    spec = validate_spec(
        {
            "sweep": {
                "tasks": ["a5_prefix"],
                "models": ["lrt", "released"],
                "schedules": ["exact"],
            },
            "train": {"length": 8},
            "models": {"released": {"model": "lrt", "memory_preset": "released"}},
        }
    )
    presets = {c.run_name: c.memory_preset for c in expand(spec)}
    assert sorted(presets.values()) == ["paper", "released"]
