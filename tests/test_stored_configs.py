"""Every committed run's config.json rebuilds the model it trained: the parameter counts the run
recorded when it trained (not recomputed by today's code), a dict round trip, and the source layer
counted as it was written (1-based: layer l is block l-1's output, the paper's "layer 12 of 20")."""

from pathlib import Path

import pytest
import torch

from lrt_lab.core.baselines import build_baseline, is_baseline_kind
from lrt_lab.core.config import ModelConfig, with_legacy_fields
from lrt_lab.core.model import LRT

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "experiments").glob("**/config.json"))


def _rebuild(stored: dict):
    config = ModelConfig.from_dict(stored["model"])
    with torch.device("meta"):  # shapes only: 220 models in a second
        if is_baseline_kind(stored.get("kind")):
            return config, build_baseline(stored["kind"], config)
        return config, LRT(config)


def test_the_committed_stores_hold_configs():
    assert len(CONFIGS) > 100


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_a_committed_config_rebuilds_the_model_it_trained(path):
    import json

    stored = json.loads(path.read_text())
    config, model = _rebuild(stored)
    assert model.param_report() == stored["params"]
    # a saved config reads back as itself, its legacy conventions included
    assert ModelConfig.from_dict(config.to_dict()) == config
    # every field the run wrote reads as what it wrote (a field it lacks: LEGACY_FIELDS' value,
    # else today's default, which it ran under)
    written, read = with_legacy_fields(stored["model"]), config.to_dict()
    assert {k: read[k] for k in written if k != "memory"} == {
        k: v for k, v in written.items() if k != "memory"
    }
    if written.get("memory") is not None:
        assert {k: read["memory"][k] for k in written["memory"]} == written["memory"]
    memory = stored["model"].get("memory")
    if memory is not None:
        layer = memory.get("source_layer") or max(1, round(0.6 * config.n_layer))
        assert model.pathway.source_blocks == tuple(range(layer - memory["source_avg"], layer))
