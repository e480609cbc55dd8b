"""What a schedule says about itself (`sweep`, `solver_sweeps`, `family`, `causal`), for every
built-in spelling the registry holds, against counts made by hand from each schedule's definition
(paper sec. 3.1-3.2), and where possible against what its stages and its run do."""

import itertools
import math

import pytest
import torch
from helpers import CONFIGS, make_model, tokens

from lrt_lab.run import registry
from lrt_lab.run.runner import run_schedule

T = 9
# Values to put in each argument of a spelling (`interleaved:S` -> S); combinations a schedule
# refuses (GaussSeidel's G > N) are left out. Weights are optional and left out.
SAMPLES = {"S": (1, 2, 3, T), "N": (1, 3), "G": (1, 2, 4), "K": (0, 2), "C": (1, 4)}
SAMPLES |= {"TOL": (0, 0.01), "MAX": (1, 4)}
NAN = (math.nan, math.nan)


def _strided(S):
    return [range(g, T, S) for g in range(S)]


def _chunks(C):
    return [range(a, min(a + C, T)) for a in range(0, T, C)]


# name -> (args -> (F, G, family, causal, sweep or None)), from each schedule's definition:
# F forward sweeps after the init pass, G of them with a gradient.
HAND = {
    "onepass": lambda: (*NAN, "onepass", True, None),
    "interleaved": lambda S: (1, 1, f"interleaved S={S}", True, _strided(S)),
    "gaussseidel": lambda S, N, G=1: (N, G, f"gaussseidel S={S} G={G}", True, _strided(S)),
    "fullseq": lambda K: (K, K, "fullseq", True, [range(0, T)]),
    "chunked": lambda C: (*NAN, f"chunked C={C}", True, _chunks(C)),
    "exact": lambda: (*NAN, "exact", True, _chunks(1)),
    # the stopping rule reads every position: not causal
    "fixedpoint": lambda TOL, MAX, G=1: (MAX, min(G, MAX), f"fixedpoint G={G}", False, [range(T)]),
    # the exact rollout stands for T sweeps (its twin FixedPoint(0, T+G, G))
    "rollout": lambda G=1: (T + G, G, "rollout", True, [range(0, T)]),
}


def _builtin_specs():
    """Every built-in spelling with each combination of the sample values (as spelled)."""
    out = []
    for reg in registry.registered().values():
        if reg.cls.__module__ != registry.BUILTIN_MODULE:
            continue
        name, *rest = reg.spelling.replace("[", "").replace("]", "").split(":")
        required = reg.spelling.split("[")[0].split(":")[1:]
        args = [a for a in rest if not a.startswith("w0")]
        for n in range(len(required), len(args) + 1):
            for values in itertools.product(*(SAMPLES[a] for a in args[:n])):
                spec = ":".join([name, *map(str, values)])
                try:
                    schedule = registry.parse_schedule(spec)
                except ValueError:
                    continue  # a combination the schedule refuses
                out.append((spec, name, values, schedule))
    return out


SPECS = _builtin_specs()
IDS = [spec for spec, *_ in SPECS]


def test_every_builtin_schedule_is_counted_by_hand():
    names = {name for _, name, _, _ in SPECS}
    assert names == set(registry.BUILTIN_NAMES) == set(HAND)
    assert len(SPECS) > 30


@pytest.mark.parametrize("spec, name, values, schedule", SPECS, ids=IDS)
def test_what_a_schedule_says_of_itself_is_the_hand_count(spec, name, values, schedule):
    F, G, family, causal, sweep = HAND[name](*values)
    got = schedule.solver_sweeps(T)
    assert (got == (F, G)) or (math.isnan(F) and all(math.isnan(x) for x in got)), got
    assert schedule.family == family and schedule.causal is causal
    if sweep is None:
        with pytest.raises(ValueError, match="does not iterate"):
            schedule.sweep(T)
    else:
        assert schedule.sweep(T) == sweep


@pytest.mark.parametrize("spec, name, values, schedule", SPECS, ids=IDS)
def test_a_sweep_computes_every_position_once(spec, name, values, schedule):
    if name == "onepass":
        return
    positions = sorted(t for P in schedule.sweep(T) for t in P)
    assert positions == list(range(T))


@pytest.mark.parametrize("spec, name, values, schedule", SPECS, ids=IDS)
def test_a_static_schedules_sweeps_are_its_stages(spec, name, values, schedule):
    """Where the stages are known up front: the last position is computed once by the init pass
    and once per sweep (F + 1 times), and the last G sweeps' stages carry the gradient."""
    F, G = schedule.solver_sweeps(T)
    if name in ("fixedpoint", "rollout") or math.isnan(F):
        return
    warm = schedule.stages_without_grad(T) if hasattr(schedule, "stages_without_grad") else []
    every = warm + schedule.stages(T)
    assert sum(T - 1 in P for P in every) == F + 1
    assert sum(T - 1 in P for P in schedule.stages(T)) >= G


def test_fixedpoint_counts_the_sweeps_its_run_took():
    model, idx = make_model(CONFIGS["default"]), tokens(T=T)
    for spec in ("fixedpoint:0.5:6", "fixedpoint:0.5:6:6", "fixedpoint:0:3:2"):
        schedule = registry.parse_schedule(spec)
        with torch.no_grad():
            measured = run_schedule(model, idx, None, schedule).measured
        F, G = schedule.solver_sweeps(T, measured)
        assert F == measured.sweeps == len(measured.residuals)
        assert G == min(schedule.grad_sweeps, measured.sweeps)


@pytest.mark.parametrize("spec, name, values, schedule", SPECS, ids=IDS)
def test_a_causal_schedule_ignores_what_follows(spec, name, values, schedule):
    """Right padding leaves a causal schedule's logits before it as they were (float64)."""
    if not schedule.causal or (name in ("interleaved", "gaussseidel") and values[0] > 6):
        return  # S > the unpadded length is refused
    model = make_model(CONFIGS["default"])
    idx = tokens(B=1, T=T)
    with torch.no_grad():
        short = run_schedule(model, idx[:, :6], None, schedule).logits
        full = run_schedule(model, idx, None, schedule).logits[:, :6]
    assert (short - full).abs().max() < 1e-10


def test_as_schedule_names_what_an_object_lacks():
    class Partial:
        spec, cost, exact = "partial", 1.0, False

        def stages(self, T):
            return [range(0, T)]

    with pytest.raises(ValueError, match="causal, family, stage_weights, sweep, solver_sweeps"):
        registry.as_schedule(Partial())
