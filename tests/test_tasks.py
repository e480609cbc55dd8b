"""Tasks checked against independent references: prefix products folded by hand over the
permutations (convention (p*q)[i] = p[q[i]]), Z60 by cumulative sums, copy and flip-flop by
per-sequence Python simulations of their definitions."""

import pytest
import torch

from lrt_tasks import (
    TASK_NAMES,
    Batch,
    CurriculumSampler,
    LengthCurriculum,
    eval_seed,
    make_eval_sets,
    make_task,
)
from lrt_tasks.groups import alternating, get_group


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def compose(p, q):
    return tuple(p[q[i]] for i in range(len(q)))


def build(name, length=12, **options):
    if name == "group_prefix":
        options.setdefault("group", "S3")
    return make_task(name, length, **options)


EXPECTED_VOCAB = {
    "a5_prefix": 60,
    "z60_prefix": 60,
    "s5_prefix": 120,
    "a4xz5_prefix": 60,
    "d30_prefix": 60,
    "group_prefix": 6,
    "copy": 18,
    "flipflop": 5,
    "text_bytes": 256,
}


def test_required_names_exist():
    for name in ["a5_prefix", "z60_prefix", "s5_prefix", "a4xz5_prefix", "copy", "flipflop"]:
        assert name in TASK_NAMES
    assert set(EXPECTED_VOCAB) == set(TASK_NAMES)


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("length", [1, 2, 7, 12])
def test_batch_contract(name, length):
    if name == "copy" and length < 2:
        pytest.skip("copy needs length >= 2")
    task = build(name, length)
    assert task.name == name and task.length == length
    assert task.vocab_size == EXPECTED_VOCAB[name]
    b = task.sample(5, gen())
    assert isinstance(b, Batch)
    for x, dtype in [
        (b.inputs, torch.long),
        (b.targets, torch.long),
        (b.loss_mask, torch.bool),
        (b.state, torch.long),
    ]:
        assert x.shape == (5, length) and x.dtype == dtype
    for x in (b.inputs, b.targets):
        assert int(x.min()) >= 0 and int(x.max()) < task.vocab_size
    assert name in repr(task) and f"length={length}" in repr(task)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_sampling_is_deterministic_in_the_generator(name):
    task = build(name, 16)
    a, b = task.sample(4, gen(3)), task.sample(4, gen(3))
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    torch.manual_seed(123)  # the global RNG must not matter
    c = task.sample(4, gen(3))
    assert torch.equal(a.inputs, c.inputs)
    assert not torch.equal(a.inputs, task.sample(4, gen(4)).inputs)
    g = gen(3)
    task.sample(4, g)
    assert not torch.equal(a.inputs, task.sample(4, g).inputs)  # the generator advances


def test_length_override():
    task = make_task("a5_prefix", 64)
    assert task.sample(2, gen(), length=5).inputs.shape == (2, 5)
    assert task.sample(2, gen()).inputs.shape == (2, 64)
    with pytest.raises(ValueError, match="length"):
        task.sample(2, gen(), length=0)
    with pytest.raises(ValueError, match="batch_size"):
        task.sample(0, gen())


@pytest.mark.parametrize(
    "name,group", [("a5_prefix", "A5"), ("s5_prefix", "S5"), ("d30_prefix", "D30")]
)
def test_permutation_prefix_products_by_hand(name, group):
    task = make_task(name, 40)
    perms = get_group(group).perms
    b = task.sample(6, gen(7))
    assert bool(b.loss_mask.all()) and torch.equal(b.state, b.targets)
    for row in range(6):
        acc = tuple(range(len(perms[0])))
        for t in range(40):
            acc = compose(acc, perms[int(b.inputs[row, t])])  # x_1 * ... * x_t, left to right
            assert perms[int(b.targets[row, t])] == acc


def test_a5_prefix_is_order_sensitive():
    # The same two inputs in the other order give another product (non-commutative), unlike Z60.
    a5 = make_task("a5_prefix", 2).group
    p, q = (
        a5.element_id((1, 2, 0, 3, 4)),
        a5.element_id((0, 1, 3, 4, 2)),
    )  # 3-cycles (0 1 2), (2 3 4)
    y = a5.prefix_products(torch.tensor([[p, q], [q, p]]))
    assert a5.perms[int(y[0, 1])] == compose(a5.perms[p], a5.perms[q]) == (1, 2, 3, 4, 0)
    assert a5.perms[int(y[1, 1])] == (1, 3, 0, 4, 2)
    z = make_task("z60_prefix", 2).group.prefix_products(torch.tensor([[7, 11], [11, 7]]))
    assert z[0, 1] == z[1, 1] == 18


def test_z60_prefix_is_cumulative_sum_mod_60():
    b = make_task("z60_prefix", 50).sample(8, gen(1))
    assert torch.equal(b.targets, b.inputs.cumsum(dim=1) % 60)


def test_a4xz5_prefix_componentwise_by_hand():
    b = make_task("a4xz5_prefix", 30).sample(4, gen(2))
    a4 = alternating(4).perms
    a_in, z_in = b.inputs // 5, b.inputs % 5
    assert torch.equal(b.targets % 5, z_in.cumsum(1) % 5)
    for row in range(4):
        acc = (0, 1, 2, 3)
        for t in range(30):
            acc = compose(acc, a4[int(a_in[row, t])])
            assert a4[int(b.targets[row, t]) // 5] == acc


def test_prefix_inputs_are_uniform():
    x = make_task("a5_prefix", 64).sample(300, gen(5)).inputs
    counts = torch.bincount(x.flatten(), minlength=60).float()
    expected = x.numel() / 60  # 320
    assert counts.min() > 0.7 * expected and counts.max() < 1.3 * expected


def test_group_prefix_option():
    task = make_task("group_prefix", 8, group="A4xZ5")
    assert task.vocab_size == 60 and "A4xZ5" in repr(task)
    assert make_task("group_prefix", 8, group=alternating(4)).vocab_size == 12
    with pytest.raises(ValueError, match="group"):
        make_task("group_prefix", 8)
    with pytest.raises(ValueError, match="group"):
        make_task("group_prefix", 8, group="Q8")


@pytest.mark.parametrize("length", [2, 3, 10, 11])
def test_copy_against_reference(length):
    task = make_task("copy", length, alphabet_size=5)
    sep, bos = 5, 6
    b = task.sample(7, gen(4), length=length)
    n = length // 2
    for row in range(7):
        x, y, m, s = (v[row].tolist() for v in (b.inputs, b.targets, b.loss_mask, b.state))
        lead = [bos] if length % 2 else []
        string = x[len(lead) : len(lead) + n]
        assert all(0 <= c < 5 for c in string)
        assert x == lead + string + [sep] + string[:-1]
        assert y == (lead + string + [sep] + string)[1:]
        k = len(lead) + n  # position of SEP
        assert m == [False] * k + [True] * n
        assert [y[i] for i in range(length) if m[i]] == string  # loss only on the copy
        assert s == x[:k] + string


def test_copy_options_and_tokens():
    task = make_task("copy", 20, alphabet_size=3)
    assert task.vocab_size == 5 and task.sep_id == 3 and task.bos_id == 4
    b = task.sample(50, gen())
    assert set(b.inputs[:, :10].unique().tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="alphabet_size"):
        make_task("copy", 20, alphabet_size=1)
    with pytest.raises(ValueError, match="length"):
        make_task("copy", 1)


def flipflop_reference(x):
    """Simulate one flip-flop sequence: expected read bits and memory after each token."""
    memory, state, reads = 0, [], {}
    for t, tok in enumerate(x):
        if t % 2 == 1 and x[t - 1] == 2:  # bit of a write
            memory = tok
        if t % 2 == 1 and x[t - 1] == 3:
            assert tok == memory  # a read returns the last written bit
        if tok == 3:
            reads[t] = memory
        state.append(memory)
    return reads, state


@pytest.mark.parametrize("length", [1, 2, 9, 64])
def test_flipflop_against_reference(length):
    b = make_task("flipflop", length, p_ignore=0.5).sample(16, gen(8))
    for row in range(16):
        x, y, m, s = (v[row].tolist() for v in (b.inputs, b.targets, b.loss_mask, b.state))
        assert x[0] == 2  # starts with a write
        assert all(tok in (2, 3, 4) for tok in x[0::2]) and all(tok in (0, 1) for tok in x[1::2])
        assert y[:-1] == x[1:]  # next-token targets
        reads, state = flipflop_reference(x)
        assert [i for i in range(length) if m[i]] == sorted(reads)
        assert all(y[i] == bit for i, bit in reads.items())
        assert s == state


def test_flipflop_instruction_rates():
    x = make_task("flipflop", 2000, p_ignore=0.8).sample(8, gen(9)).inputs[:, 2::2]
    frac = {tok: float((x == tok).float().mean()) for tok in (2, 3, 4)}
    assert abs(frac[4] - 0.8) < 0.02 and abs(frac[2] - 0.1) < 0.02 and abs(frac[3] - 0.1) < 0.02
    x = make_task("flipflop", 200, p_ignore=0.0).sample(8, gen(9)).inputs
    assert not bool((x[:, 0::2] == 4).any())
    with pytest.raises(ValueError, match="p_ignore"):
        make_task("flipflop", 10, p_ignore=1.0)


def test_length_curriculum_doubling():
    c = LengthCurriculum(4, 64, 1000)
    assert c.schedule == "doubling"
    lengths = [c.length_at(s) for s in range(1200)]
    assert lengths[0] == 4 and lengths[999] == 32 and lengths[1000] == 64 and lengths[-1] == 64
    assert sorted(set(lengths)) == [4, 8, 16, 32, 64]
    assert lengths == sorted(lengths)
    assert [c.length_at(s) for s in (249, 250, 500, 750)] == [4, 8, 16, 32]
    # a non-power-of-two ratio ends with a partial stage
    assert sorted({LengthCurriculum(3, 20, 30).length_at(s) for s in range(40)}) == [3, 6, 12, 20]


def test_length_curriculum_linear_and_edges():
    c = LengthCurriculum(4, 64, 60, schedule="linear")
    lengths = [c.length_at(s) for s in range(100)]
    assert lengths[0] == 4 and lengths[30] == 34 and lengths[60] == 64 and lengths[99] == 64
    assert lengths == sorted(lengths) and max(lengths) == 64
    assert LengthCurriculum(8, 8, 100).length_at(0) == 8
    assert LengthCurriculum(2, 8, 0).length_at(0) == 8
    for kwargs, field in [
        (dict(start_length=0, end_length=8, steps=5), "start_length"),
        (dict(start_length=9, end_length=8, steps=5), "start_length"),
        (dict(start_length=2, end_length=8, steps=-1), "steps"),
        (dict(start_length=2, end_length=8, steps=5, schedule="cosine"), "schedule"),
    ]:
        with pytest.raises(ValueError, match=field):
            LengthCurriculum(**kwargs)
    with pytest.raises(ValueError, match="step"):
        c.length_at(-1)


def test_curriculum_sampler_returns_shorter_sequences():
    task = make_task("a5_prefix", 64, curriculum_start=4, curriculum_steps=100)
    assert task.curriculum.start_length == 4 and task.curriculum.end_length == 64
    assert "curriculum" in repr(task)
    sampler = CurriculumSampler(task)
    assert sampler.sample(3, gen(), step=0).inputs.shape == (3, 4)
    assert sampler.sample(3, gen(), step=60).inputs.shape == (3, 16)
    assert sampler.sample(3, gen(), step=100).inputs.shape == (3, 64)
    assert [task.length_at(s) for s in (0, 100)] == [4, 64]
    # shorter batches are prefixes of the same distribution and still correct
    b = sampler.sample(3, gen(), step=0)
    assert torch.equal(b.targets, alternating(5).prefix_products(b.inputs))
    # explicit curriculum on a task without one, linear schedule through make_task
    plain = make_task("copy", 32)
    assert plain.length_at(5) == 32
    with pytest.raises(ValueError, match="curriculum"):
        CurriculumSampler(plain)
    s2 = CurriculumSampler(plain, LengthCurriculum(3, 32, 10, schedule="linear"))
    assert s2.sample(2, gen(), step=0).inputs.shape == (2, 3)
    lin = make_task(
        "flipflop", 32, curriculum_start=2, curriculum_steps=10, curriculum_schedule="linear"
    )
    assert lin.curriculum.schedule == "linear" and lin.length_at(5) == 17


def test_curriculum_option_errors():
    with pytest.raises(ValueError, match="curriculum_steps"):
        make_task("a5_prefix", 64, curriculum_start=4)
    with pytest.raises(ValueError, match="curriculum_start"):
        make_task("a5_prefix", 64, curriculum_steps=10)
    with pytest.raises(ValueError, match="curriculum_start"):
        make_task("a5_prefix", 64, curriculum_start=65, curriculum_steps=10)
    with pytest.raises(ValueError, match="curriculum_start"):
        make_task("copy", 64, curriculum_start=1, curriculum_steps=10)
    with pytest.raises(ValueError, match="curriculum_schedule"):
        make_task(
            "a5_prefix", 64, curriculum_start=4, curriculum_steps=10, curriculum_schedule="exp"
        )


def test_eval_sets_fixed_and_disjoint_from_training():
    task = make_task("a5_prefix", 64)
    sets = make_eval_sets(task, n=32)
    assert sorted(sets) == [64, 128, 256]
    for length, b in sets.items():
        assert b.inputs.shape == (32, length)
        assert torch.equal(b.targets, alternating(5).prefix_products(b.inputs))
    again = make_eval_sets(make_task("a5_prefix", 16), n=32)  # training length does not matter
    for length in sets:
        assert torch.equal(sets[length].inputs, again[length].inputs)
    assert not torch.equal(
        sets[64].inputs, make_eval_sets(task, lengths=(64,), n=32, seed=1)[64].inputs
    )
    # seeds live in [2**62, 2**63), far from the small run seeds training uses
    for length in (64, 128, 256):
        for seed in range(5):
            assert 2**62 <= eval_seed(task, length, seed) < 2**63
    assert eval_seed(task, 64) != eval_seed(make_task("z60_prefix", 64), 64)
    assert eval_seed(task, 64) != eval_seed(task, 128)
    train = {tuple(task.sample(32, gen(s)).inputs[0].tolist()) for s in range(100)}
    assert tuple(sets[64].inputs[0].tolist()) not in train


def test_eval_sets_other_tasks_and_errors():
    sets = make_eval_sets(make_task("copy", 8), lengths=(8, 9), n=4)
    assert sets[9].inputs.shape == (4, 9)
    with pytest.raises(ValueError, match="lengths"):
        make_eval_sets(make_task("copy", 8), lengths=(1,), n=4)
    with pytest.raises(ValueError, match="n="):
        make_eval_sets(make_task("copy", 8), n=0)


def test_unknown_names_and_options():
    with pytest.raises(ValueError) as err:
        make_task("a6_prefix", 64)
    msg = str(err.value)
    assert "task" in msg and "'a6_prefix'" in msg and all(name in msg for name in TASK_NAMES)
    with pytest.raises(ValueError, match="alphabet_size"):
        make_task("a5_prefix", 64, alphabet_size=4)
    with pytest.raises(ValueError, match="length"):
        make_task("a5_prefix", 0)
    with pytest.raises(ValueError, match="length"):
        make_task("a5_prefix", 8.0)


def test_batch_to_and_unpacking():
    b = make_task("z60_prefix", 4).sample(2, gen())
    inputs, targets, mask, state = b
    moved = b.to("cpu")
    assert torch.equal(moved.inputs, inputs) and moved.state is not None
    assert Batch(inputs, targets, mask).to("cpu").state is None


def test_readme_snippet():
    task = make_task("a5_prefix", 64, curriculum_start=4, curriculum_steps=1000)
    batch = task.sample(32, torch.Generator().manual_seed(0), length=task.length_at(0))
    assert batch.inputs.shape == (32, 4)
    evals = make_eval_sets(task, n=256)
    assert {k: tuple(v.inputs.shape) for k, v in evals.items()} == {
        64: (256, 64),
        128: (256, 128),
        256: (256, 256),
    }


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_supervise_every_counts_only_every_kth_position(k):
    """The mask counts positions t with (t + 1) % k == 0 (written out as a list here); the targets
    stay the running products everywhere, so the state still has to be carried in between."""
    task = make_task("a5_prefix", 12, supervise_every=k)
    batch = task.sample(3, torch.Generator().manual_seed(0))
    counted = [t for t in range(12) if (t + 1) % k == 0]
    assert [t for t in range(12) if batch.loss_mask[0, t]] == counted
    assert bool((batch.loss_mask == batch.loss_mask[:1]).all())
    plain = make_task("a5_prefix", 12).sample(3, torch.Generator().manual_seed(0))
    assert torch.equal(batch.inputs, plain.inputs) and torch.equal(batch.targets, plain.targets)
    # accuracy and pos@90 see only the counted positions: perfect there, wrong elsewhere -> all of T
    from lrt_lab.run.metrics import per_position_accuracy, pos_at

    logits = torch.full((3, 12, task.vocab_size), -10.0)
    wrong = (batch.targets + 1) % task.vocab_size
    logits.scatter_(2, torch.where(batch.loss_mask, batch.targets, wrong)[..., None], 10.0)
    acc = per_position_accuracy(logits, batch.targets, batch.loss_mask)
    assert pos_at(acc, 0.9, skip_nan=True) == 12
    assert pos_at(per_position_accuracy(logits, batch.targets), 0.9) == (0 if k > 1 else 12)
