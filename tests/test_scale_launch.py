"""The scale/ command lines under torchrun, and the GPU check's --dry mode end to end on CPU."""

from __future__ import annotations

import pytest
from torch.distributed.run import get_args_parser

from scale import evaluate, train


def option_strings(parser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


@pytest.mark.parametrize("module", [train, evaluate])
def test_torchrun_passes_every_option_through(module):
    """torchrun parses the whole command line with argparse, which expands abbreviations even after
    `-m module`: an option that is a prefix of one of torchrun's (`--run` of `--run-path`) fails
    with "ambiguous option" or is taken by torchrun."""
    options = option_strings(module.build_parser())
    argv = [x for o in options for x in (o, "1")]
    parsed = get_args_parser().parse_args(["--standalone", "--nproc-per-node=2", "-m", module.__name__, *argv])
    assert parsed.training_script == module.__name__ and parsed.training_script_args == argv
