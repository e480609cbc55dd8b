"""Metrics on hand-computed cases."""

import math

import pytest
import torch

from lrt_lab.run.metrics import (
    accuracy,
    bits_per_byte,
    per_position_accuracy,
    pos_at,
    sequence_accuracy,
)


def one_hot_logits(preds, vocab=4):
    return torch.nn.functional.one_hot(torch.tensor(preds), vocab).float()


TARGETS = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]])
PREDS = torch.tensor(
    [
        [0, 1, 2, 3],  # all right
        [0, 1, 0, 3],  # wrong at position 3
        [0, 2, 0, 0],
    ]
)  # wrong at 2, 3, 4


def test_per_position_accuracy_hand_computed():
    acc = per_position_accuracy(PREDS, TARGETS)
    assert acc.dtype == torch.float32 and acc.shape == (4,)
    assert torch.allclose(acc, torch.tensor([1.0, 2 / 3, 1 / 3, 2 / 3]))
    # (B, T, V) logits give the same answer through argmax
    assert torch.allclose(per_position_accuracy(one_hot_logits(PREDS.tolist()), TARGETS), acc)


def test_per_position_accuracy_mask_excludes_and_nan():
    mask = torch.tensor(
        [[True, True, False, False], [True, False, True, False], [False, False, True, False]]
    )
    acc = per_position_accuracy(PREDS, TARGETS, mask)
    # pos1: rows 0,1 counted, both right -> 1; pos2: row 0 only, right -> 1;
    # pos3: rows 1,2 counted (row 0, the right one, is masked), both wrong -> 0; pos4: none -> NaN
    assert acc[:3].tolist() == pytest.approx([1.0, 1.0, 0.0])
    assert math.isnan(acc[3])


def test_shape_errors():
    with pytest.raises(ValueError, match="logits"):
        per_position_accuracy(torch.zeros(3, 5, dtype=torch.long), TARGETS)
    with pytest.raises(ValueError, match="mask"):
        per_position_accuracy(PREDS, TARGETS, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="logits"):
        per_position_accuracy(torch.zeros(4), TARGETS)


def test_pos_at():
    assert pos_at(torch.tensor([1.0, 0.95, 0.9, 0.89, 1.0])) == 3  # 0.9 itself passes
    assert pos_at(torch.tensor([0.5, 1.0, 1.0])) == 0  # position 1 already below
    assert pos_at(torch.tensor([1.0, 1.0])) == 2  # never drops: the full length
    assert pos_at([1.0, 0.8, 0.7], threshold=0.75) == 2
    assert pos_at(torch.tensor([1.0, 0.6]), threshold=0.5) == 2
    assert pos_at(torch.tensor([])) == 0


def test_pos_at_exactly_at_threshold_in_float32():
    # 9 of 10 right at position 2 is exactly 90% and must pass, although float32(0.9) < 0.9.
    targets = torch.zeros(10, 3, dtype=torch.long)
    preds = torch.zeros(10, 3, dtype=torch.long)
    preds[0, 1] = 1
    preds[:2, 2] = 1
    acc = per_position_accuracy(preds, targets)
    assert acc.dtype == torch.float32 and float(acc[1]) < 0.9
    assert pos_at(acc) == 2
    assert pos_at(acc.double()) == 2 and pos_at(acc.tolist()) == 2
    assert pos_at([1.0, 0.9 - 1e-4]) == 1  # but a real shortfall still fails


def test_pos_at_nan_handling():
    acc = torch.tensor([math.nan, math.nan, 1.0, 0.5])
    assert pos_at(acc) == 0
    assert pos_at(acc, skip_nan=True) == 3  # position 3, the first counted one, passes
    # counted positions only: an unsupervised position never passes on its own
    every_4th = torch.tensor([math.nan, math.nan, math.nan, 0.02] * 4)  # at chance everywhere
    assert pos_at(every_4th, skip_nan=True) == 0
    every_4th[[3, 7]] = 1.0  # positions 4 and 8 learnt, 12 not
    assert pos_at(every_4th, skip_nan=True) == 8
    every_4th[[11, 15]] = 0.95
    assert pos_at(every_4th, skip_nan=True) == 16
    assert pos_at(torch.tensor([1.0, math.nan, math.nan]), skip_nan=True) == 1
    assert pos_at(torch.tensor([math.nan, math.nan]), skip_nan=True) == 0
    with pytest.raises(ValueError, match="threshold"):
        pos_at(acc, threshold=1.5)


def test_pos_at_on_the_paper_shape():
    # Transformer-like curve: perfect through 5, then decays -> pos@90 = 5 (paper: Transformer 5).
    acc = torch.cat([torch.ones(5), torch.linspace(0.85, 0.02, 59)])
    assert (
        pos_at(
            per_position_accuracy(
                torch.zeros(1, 64, dtype=torch.long), torch.zeros(1, 64, dtype=torch.long)
            )
        )
        == 64
    )
    assert pos_at(acc) == 5


def test_bits_per_byte():
    assert bits_per_byte(math.log(2) * 10, 10) == pytest.approx(1.0)
    assert bits_per_byte(1000.0, 500) == pytest.approx(2.0 / math.log(2))
    assert bits_per_byte(torch.tensor(math.log(2) * 3), 2) == pytest.approx(1.5)
    for bad in (0, -5):
        with pytest.raises(ValueError, match="total_bytes"):
            bits_per_byte(1.0, bad)


def test_sequence_accuracy():
    assert sequence_accuracy(PREDS, TARGETS) == pytest.approx(1 / 3)
    assert sequence_accuracy(one_hot_logits(PREDS.tolist()), TARGETS) == pytest.approx(1 / 3)
    # counting only position 1 and 4: row 0 right, row 1 right, row 2 wrong at 4
    mask = torch.tensor([[True, False, False, True]] * 3)
    assert sequence_accuracy(PREDS, TARGETS, mask) == pytest.approx(2 / 3)
    # a sequence with nothing counted is left out; none counted at all is NaN
    mask = torch.tensor([[False] * 4, [True, True, False, False], [False, True, False, False]])
    assert sequence_accuracy(PREDS, TARGETS, mask) == pytest.approx(1 / 2)
    assert math.isnan(sequence_accuracy(PREDS, TARGETS, torch.zeros(3, 4, dtype=torch.bool)))


def test_accuracy():
    assert accuracy(PREDS, TARGETS) == pytest.approx(8 / 12)
    mask = torch.tensor([[True, False, False, False]] * 3)
    assert accuracy(PREDS, TARGETS, mask) == 1.0
    assert math.isnan(accuracy(PREDS, TARGETS, torch.zeros(3, 4, dtype=torch.bool)))
