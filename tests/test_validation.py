"""The ValueError contract, property-based: every invalid value of every config field and input
raises a ValueError that names the field, and nothing is written first.

Invalid values are generated, not listed: for each dataclass field, values of the wrong type
(derived from the field's annotation, so a field added later is covered without editing this
file), non-finite or overflowing numbers, and values outside the ranges written down below (the
specification, kept independent of the code under test).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lrt_lab import LRT
from lrt_lab.commands.cli import main
from lrt_lab.core.config import MemoryConfig, ModelConfig, preset
from lrt_lab.core.validation import TRAIN_SEED_LIMIT
from lrt_lab.run.decode import Decoder, generate
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Chunked, Exact, FullSequence, Interleaved
from lrt_lab.training.loop import TrainConfig
from lrt_lab.training.sweep import expand, validate_spec
from lrt_tasks import make_task
from lrt_tasks.eval_sets import EVAL_SEED_OFFSET, eval_seed
from lrt_tasks.registry import _OPTIONS
from lrt_tasks.text import CORPORA, TextBytesTask

# derandomize: the same examples on every run, so CI is deterministic; deadline None: the first
# example of a test pays for imports and model construction.
FAST = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# Any JSON-like or Python value a user could pass by mistake.
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(10**300, 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(-3, 3), max_size=3),
    st.tuples(st.text(max_size=2)),
    st.dictionaries(st.integers(0, 3), st.integers(), max_size=2),
)

NONFINITE = st.sampled_from([float("nan"), float("inf"), float("-inf"), 10**400, -(10**400)])


# The specification (independent of lrt_lab.core.validation) -------------------------------------
def _is_finite_number(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def acceptable_type(value, annotation) -> bool:
    """Whether `value` has the type the annotation declares (ints are acceptable floats)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(acceptable_type(value, a) for a in args)
    if annotation is type(None):
        return value is None
    base = typing.get_origin(annotation) or annotation
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return _is_finite_number(value)
    if base is tuple:
        return isinstance(value, (tuple, list))
    if base is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return isinstance(value, base)


# Allowed values per field: (low, high) for numbers (None: unbounded), or a tuple of choices.
MODEL_RANGES = {
    "vocab_size": (1, None),
    "n_layer": (1, None),
    "n_embd": (2, None),
    "n_head": (1, None),
    "n_kv_head": (1, None),
    "sequence_len": (1, None),
    "short_window": (1, None),
    "softcap": (1e-300, None),
    "rope_base": (1.0 + 1e-9, None),
    "bos_token_id": (0, 32767),
}
MEMORY_RANGES = {
    "source_layer": (1, 12),
    "source_avg": (1, None),
    "lag": (1, None),
    "lag_avg": (1, None),
    "kv": ("both", "keys", "values", "none"),
    "kv_mode": ("add", "replace"),
    "projections": ("shared", "layerwise"),
    "rec_init": ("uniform", "zero"),
    "source_tap": ("resid", "normed", "attn_out"),
}
TRAIN_RANGES = {
    "length": (1, None),
    "steps": (1, None),
    "batch_size": (1, None),
    "seed": (0, 2**62 - 1),
    "lr_scale": (0, None),
    "matrix_lr": (0, None),
    "embedding_lr": (0, None),
    "head_lr": (0, None),
    "scalar_lr": (0, None),
    "weight_decay": (0, None),
    "warmdown_frac": (0, 1),
    "grad_clip": (0, None),
    "eval_every": (0, None),
    "eval_size": (1, None),
    "checkpoint_every": (0, None),
    "preset": ("tiny", "small", "a5", "d12", "d20", "d24"),
    "device": ("auto", "cpu", "cuda"),
}

# Defaults under which one field at a time is made invalid. TrainConfig: the CPU device, so the
# only error is the field's (device="cuda" is invalid on a machine without CUDA for another reason).
BUILDERS = {
    "model": (
        lambda **kw: ModelConfig(**{"memory": MemoryConfig(), **kw}),
        ModelConfig,
        "",
        MODEL_RANGES,
    ),
    "memory": (
        lambda **kw: ModelConfig(memory=MemoryConfig(**kw)),
        MemoryConfig,
        "memory.",
        MEMORY_RANGES,
    ),
    "train": (lambda **kw: TrainConfig(**{"device": "cpu", **kw}), TrainConfig, "", TRAIN_RANGES),
}


def _out_of_range(spec) -> st.SearchStrategy:
    if isinstance(spec[0], str):  # choices: any other string
        return st.text(max_size=8).filter(lambda s: s not in spec)
    low, high = spec
    parts = [NONFINITE]
    if isinstance(low, int) and (high is None or isinstance(high, int)):
        parts.append(st.integers(max_value=low - 1, min_value=low - 2**40))
        if high is not None:
            parts.append(st.integers(min_value=high + 1, max_value=high + 2**70))
    else:
        parts.append(
            st.floats(max_value=low, exclude_max=True, allow_nan=False, allow_infinity=False)
        )
        if high is not None:
            parts.append(
                st.floats(min_value=high, exclude_min=True, allow_nan=False, allow_infinity=False)
            )
    return st.one_of(*parts)


def _assert_names(err: pytest.ExceptionInfo, name: str):
    assert re.search(rf"(^|[\s.']){re.escape(name)}\b", str(err.value)), str(err.value)
    assert "allowed" in str(err.value), str(err.value)


@pytest.mark.parametrize("which", list(BUILDERS))
@FAST
@given(data=st.data())
def test_every_config_field_rejects_a_wrong_type_by_name(which, data):
    build, cls, prefix, _ = BUILDERS[which]
    hints = typing.get_type_hints(cls)
    f = data.draw(st.sampled_from([f for f in dataclasses.fields(cls)]), label="field")
    value = data.draw(
        ANY_VALUE.filter(lambda v: not acceptable_type(v, hints[f.name])), label="value"
    )
    with pytest.raises(ValueError) as err:
        build(**{f.name: value})
    _assert_names(err, prefix + f.name)


@pytest.mark.parametrize("which", list(BUILDERS))
@FAST
@given(data=st.data())
def test_every_ranged_config_field_rejects_an_out_of_range_value_by_name(which, data):
    build, cls, prefix, ranges = BUILDERS[which]
    name = data.draw(st.sampled_from(sorted(ranges)), label="field")
    value = data.draw(_out_of_range(ranges[name]), label="value")
    with pytest.raises(ValueError) as err:
        build(**{name: value})
    _assert_names(err, prefix + name)


def test_the_specification_covers_every_field_and_accepts_the_defaults():
    # the range tables name real fields, and the default configs satisfy the type rules above
    for build, cls, _, ranges in BUILDERS.values():
        names = {f.name for f in dataclasses.fields(cls)}
        assert set(ranges) <= names
        default = build()
        obj = default.memory if cls is MemoryConfig else default
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert acceptable_type(getattr(obj, f.name), hints[f.name]), f.name


# Seeds -------------------------------------------------------------------------------------------
@FAST
@given(seed=st.integers(0, TRAIN_SEED_LIMIT - 1))
def test_every_valid_training_seed_reads_the_training_split(seed):
    TrainConfig(seed=seed, device="cpu")
    assert TextBytesTask.default_split(torch.Generator().manual_seed(seed)) == "train"


@FAST
@given(
    seed=st.integers(TRAIN_SEED_LIMIT, 2**80), key=st.text(max_size=6), length=st.integers(1, 512)
)
def test_seeds_that_could_reach_an_evaluation_stream_are_rejected(seed, key, length):
    with pytest.raises(ValueError, match="seed"):
        TrainConfig(seed=seed, device="cpu")
    assert EVAL_SEED_OFFSET == TRAIN_SEED_LIMIT
    task = make_task("a5_prefix", 4)
    task.name = key  # eval_key defaults to the name for tasks without their own
    assert eval_seed(task, length) >= TRAIN_SEED_LIMIT


# Schedules ---------------------------------------------------------------------------------------
SCHEDULE_TEXT = st.text(alphabet="onepasintrlvdfuqckhx:0123456789,.-e ", max_size=16)


@FAST
@given(
    spec=st.one_of(
        SCHEDULE_TEXT,
        st.sampled_from(
            [
                "fullseq:1:nan,1",
                "fullseq:1:inf,1",
                "fullseq:0:1e309",
                "interleaved:0",
                "chunked:-1",
                "fullseq:2:1,1",
            ]
        ),
    )
)
def test_parse_schedule_returns_a_schedule_or_names_the_field(spec):
    try:
        sched = parse_schedule(spec)
    except ValueError as e:
        assert "schedule" in str(e) and "allowed" in str(e)
        return
    assert parse_schedule(sched.spec) == sched  # what it parsed, it can spell back


@FAST
@given(
    kind=st.sampled_from(["Interleaved.S", "Chunked.C", "FullSequence.K", "FullSequence.weights"]),
    data=st.data(),
)
def test_schedule_objects_reject_invalid_arguments_by_name(kind, data):
    if kind == "FullSequence.weights":
        bad = data.draw(
            st.one_of(
                ANY_VALUE.filter(lambda v: not isinstance(v, (tuple, list)) and v is not None),
                st.lists(
                    st.one_of(
                        NONFINITE,
                        st.floats(max_value=-1e-9, allow_nan=False),
                        st.text(max_size=2),
                        st.booleans(),
                    ),
                    min_size=2,
                    max_size=2,
                ).map(tuple),
                st.just((0, 0)),
                st.just((1.0,)),
                st.just((1e308, 1e308)),
            )
        )
        make = lambda: FullSequence(1, bad)  # noqa: E731
    else:
        low = 0 if kind == "FullSequence.K" else 1
        bad = data.draw(
            st.one_of(
                ANY_VALUE.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool))),
                st.integers(max_value=low - 1),
            )
        )
        cls = {"Interleaved.S": Interleaved, "Chunked.C": Chunked, "FullSequence.K": FullSequence}[
            kind
        ]
        make = lambda: cls(bad)  # noqa: E731
    with pytest.raises(ValueError, match=re.escape(kind)):
        make()


# Model inputs ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LRT(preset("tiny", memory=MemoryConfig())).eval()  # vocab_size 64


def bad_token_tensors(shape=(2, 3), vocab=64):
    """Tensors that are not valid token ids for a vocab-64
    model: out-of-range values, other dtypes."""
    ints = st.lists(
        st.integers(-(2**40), 2**40), min_size=math.prod(shape), max_size=math.prod(shape)
    )
    out_of_range = ints.filter(lambda v: any(x < 0 or x >= vocab for x in v)).map(
        lambda v: torch.tensor(v, dtype=torch.long).view(shape)
    )
    other_dtype = st.tuples(
        st.sampled_from([torch.float32, torch.int32, torch.bool, torch.uint8, torch.float64]),
        st.integers(0, 3),
    ).map(lambda t: torch.full(shape, t[1]).to(t[0]))
    return st.one_of(out_of_range, other_dtype, ANY_VALUE)


@FAST
@given(idx=bad_token_tensors())
def test_run_schedule_rejects_bad_token_ids(model, idx):
    with pytest.raises(ValueError) as err:
        run_schedule(model, idx, None, "exact")
    _assert_names(err, "idx")


@FAST
@given(
    targets=st.one_of(
        bad_token_tensors().filter(
            lambda t: (
                t is not None
                and not (  # None: no loss, valid
                    isinstance(t, torch.Tensor)
                    and t.dtype == torch.long
                    and ((t >= -1) & (t < 64)).all()
                )
            )
        ),  # -1: ignored
        st.just(torch.zeros(2, 4, dtype=torch.long)),
    )
)  # wrong shape
def test_run_schedule_rejects_bad_targets(model, targets):
    idx = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError) as err:
        run_schedule(model, idx, targets, "onepass")
    _assert_names(err, "targets")


def test_run_schedule_takes_a_schedule_string_and_ignores_minus_one_targets(model):
    idx = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    targets = idx.clone()
    targets[:, :2] = -1
    from lrt_lab.run.schedules import Exact

    by_string, by_object = (
        run_schedule(model, idx, targets, "exact"),
        run_schedule(model, idx, targets, Exact()),
    )
    assert torch.equal(by_string.logits, by_object.logits) and torch.equal(
        by_string.loss, by_object.loss
    )
    with pytest.raises(ValueError, match="schedule"):
        run_schedule(model, idx, targets, "exactly")


@FAST
@given(tokens=bad_token_tensors(shape=(2,)))
def test_decoder_step_rejects_bad_token_ids(model, tokens):
    dec = Decoder(model, 2, 4)
    with pytest.raises(ValueError) as err:
        dec.step(tokens)
    _assert_names(err, "token_ids")
    assert dec.length == 0  # nothing was appended


@FAST
@given(prompt=bad_token_tensors())
def test_decoder_prefill_and_generate_reject_bad_prompts(model, prompt):
    with pytest.raises(ValueError) as err:
        Decoder(model, 2, 8).prefill(prompt)
    _assert_names(err, "prompt_idx")
    with pytest.raises(ValueError) as err:
        generate(model, prompt, 2)
    _assert_names(err, "prompt_ids")


@FAST
@given(name=st.sampled_from(["max_new_tokens", "temperature", "top_k", "seed"]), data=st.data())
def test_generate_rejects_bad_sampling_options_by_name(model, name, data):
    valid = {
        "max_new_tokens": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "temperature": lambda v: _is_finite_number(v) and v >= 0,
        "top_k": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        "seed": lambda v: (
            v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64)
        ),
    }
    value = data.draw(
        st.one_of(ANY_VALUE, NONFINITE, st.integers(2**64, 2**70)).filter(
            lambda v: not valid[name](v)
        )
    )
    with pytest.raises(ValueError) as err:
        generate(model, torch.zeros(1, 2, dtype=torch.long), **{"max_new_tokens": 1, name: value})
    _assert_names(err, name)


# Task options ------------------------------------------------------------------------------------
# every (task, option) the registry declares, curriculum options on one task (all tasks share them)
TASK_OPTIONS = sorted(
    {(task, option) for task, options in _OPTIONS.items() for option in options}
    | {("a5_prefix", "curriculum_start")}
)


@FAST
@given(task_option=st.sampled_from(TASK_OPTIONS), value=ANY_VALUE)
def test_task_options_of_the_wrong_kind_are_rejected_by_name(task_option, value):
    task, option = task_option
    valid = {
        # no generated value spells a group (the alphabet has no digits after A/S/Z/D)
        "group": lambda v: False,
        "alphabet_size": lambda v: (
            isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= 2**20
        ),
        "p_ignore": lambda v: _is_finite_number(v) and 0 <= v < 1,
        "corpus": lambda v: isinstance(v, str) and v in CORPORA,
        "curriculum_start": lambda v: (
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 8
        ),
        "supervise_every": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 8,
    }
    assume(not valid[option](value))
    if (
        option == "group"
        and isinstance(value, str)
        and re.fullmatch(r"([asdzASDZ]\d+)(x[asdzASDZ]\d+)*", value)
    ):
        return  # a spelled group (possibly valid): not what this test generates
    options = {option: value}
    if option == "curriculum_start":
        options["curriculum_steps"] = 10
    if task == "group_prefix" and option != "group":
        options["group"] = "S3"
    with pytest.raises(ValueError) as err:
        make_task(task, 8, **options)
    _assert_names(err, option)


@pytest.mark.parametrize(
    "group, limit", [("Z5000", "Z<n>"), ("D2", "D<n>"), ("A5xA5", "order"), ("S9", "S<n>")]
)
def test_group_errors_name_the_group_not_its_factor(group, limit):
    with pytest.raises(
        ValueError, match=rf"^group='{group}' is invalid; allowed: .*{re.escape(limit)}"
    ):
        make_task("group_prefix", 4, group=group)


# Sweep specs -------------------------------------------------------------------------------------
SWEEP_LISTS = {"tasks": str, "models": str, "schedules": str, "seeds": int}


@FAST
@given(key=st.sampled_from(sorted(SWEEP_LISTS) + ["out", "name_prefix"]), value=ANY_VALUE)
def test_sweep_spec_fields_of_the_wrong_type_are_rejected_by_name(key, value):
    kind = SWEEP_LISTS.get(key)
    if kind is None:
        assume(not isinstance(value, str))
    else:
        assume(
            not (
                isinstance(value, list)
                and value
                and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
            )
        )
    sweep = {"tasks": ["a5_prefix"], "models": ["lrt"], key: value}
    with pytest.raises(ValueError) as err:
        validate_spec({"sweep": sweep})
    _assert_names(err, key)


@FAST
@given(data=st.data())
def test_sweep_train_fields_are_validated_as_train_config_fields(data):
    hints = typing.get_type_hints(TrainConfig)
    names = sorted(set(hints) - {"task", "model", "schedule", "seed", "name", "device"})
    name = data.draw(st.sampled_from(names))
    value = data.draw(ANY_VALUE.filter(lambda v: not acceptable_type(v, hints[name])))
    spec = validate_spec(
        {"sweep": {"tasks": ["a5_prefix"], "models": ["lrt"]}, "train": {name: value}}
    )
    with pytest.raises(ValueError) as err:
        expand(spec)
    _assert_names(err, name)


def test_a_sweep_checks_every_run_before_writing_any(tmp_path):
    from lrt_lab.training.sweep import run_sweep

    spec = validate_spec(
        {
            "sweep": {"tasks": ["group_prefix", "copy"], "models": ["transformer"]},
            "train": {
                "length": 4,
                "preset": "tiny",
                "steps": 1,
                "eval_lengths": [4],
                "eval_size": 2,
                "task_options": {"group": "S3"},
                "device": "cpu",
            },
        }
    )
    with pytest.raises(ValueError, match="group: unknown option for task 'copy'"):
        run_sweep(spec, out=str(tmp_path / "store"))
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


# The command line --------------------------------------------------------------------------------
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_cli_rejects_invalid_model_fields_in_one_line_and_writes_nothing(
    tmp_path_factory, capsys, data
):
    import json

    hints = typing.get_type_hints(ModelConfig)
    name = data.draw(st.sampled_from(sorted(set(hints) - {"memory"})))
    json_values = st.one_of(
        st.booleans(),
        st.text(alphabet="abc", min_size=1, max_size=3),
        st.floats(allow_nan=True, allow_infinity=True),
        st.lists(st.integers(0, 2), max_size=2),
    )
    value = data.draw(json_values.filter(lambda v: not acceptable_type(v, hints[name])))
    out = tmp_path_factory.mktemp("cli") / "store"
    capsys.readouterr()
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--steps",
            "1",
            "--length",
            "4",
            "--device",
            "cpu",
            "--quiet",
            "--out",
            str(out),
            "--set",
            f"{name}={json.dumps(value)}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert (
        code == 2
        and len(err.splitlines()) == 1
        and err.startswith("lrt-lab: error:")
        and name in err
    )
    assert not out.exists()


@FAST
@given(
    name=st.sampled_from(["batch_size", "max_len"]),
    value=st.one_of(ANY_VALUE, st.integers(max_value=0)),
)
def test_decoder_sizes_are_checked_by_name(model, name, value):
    assume(not (isinstance(value, int) and not isinstance(value, bool) and value >= 1))
    with pytest.raises(ValueError) as err:
        Decoder(model, **{"batch_size": 1, "max_len": 4, name: value})
    _assert_names(err, name)


def test_generate_matches_stepping_the_decoder_by_hand(model):
    # generate skips the per-token range check of the ids it sampled itself; the result must be
    # what the checked public path gives
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = generate(model, prompt, 4, temperature=0)
    dec = Decoder(model, 2, 7)
    logits, tokens = dec.prefill(prompt, Exact()), [prompt]  # generate's default prefill
    for i in range(4):
        nxt = logits.argmax(-1)
        tokens.append(nxt[:, None])
        if i < 3:
            logits = dec.step(nxt)
    assert torch.equal(out, torch.cat(tokens, dim=1))
