"""The thread policy: explicit settings win, otherwise torch gets the cores other processes leave free."""

import os

import pytest
import torch

from lrt_lab.cli import build_parser
from lrt_lab.threads import apply_threads, choose_threads, wait_passively_when_busy

NO_ENV: dict = {}


def threads_for(usable, load, machine=None, cap=4):
    return choose_threads(env=NO_ENV, usable_cores=usable, machine_cores=machine or usable, load_1min=load,
                          cap=cap).threads


def test_an_idle_machine_gets_every_core_up_to_the_cap():
    assert threads_for(usable=2, load=0.0) == 2
    assert threads_for(usable=64, load=0.3) == 4
    assert threads_for(usable=64, load=0.3, cap=64) == 64


def test_busy_cores_are_left_to_the_processes_that_hold_them():
    assert threads_for(usable=2, load=1.0) == 1   # one job on a 2-core machine
    assert threads_for(usable=2, load=2.0) == 1   # two single-thread jobs: never fewer than 1
    assert threads_for(usable=2, load=6.0) == 1   # two 2-thread jobs and more
    assert threads_for(usable=8, load=5.0) == 3
    assert threads_for(usable=8, load=4.4) == 4   # rounded: a core busy less than half the time is free
    assert threads_for(usable=8, load=4.6) == 3


def test_a_machine_wide_load_counts_for_this_process_s_share_of_the_cores():
    # taskset / a container gives 4 of 64 cores; a load of 32 means half of every core is busy
    assert threads_for(usable=4, machine=64, load=32.0) == 2
    assert threads_for(usable=4, machine=64, load=0.0) == 4


def test_an_explicit_request_wins_over_the_load_and_the_environment():
    choice = choose_threads(3, env={"OMP_NUM_THREADS": "1"}, usable_cores=2, load_1min=9.0)
    assert choice.threads == 3 and "--threads" in choice.why
    with pytest.raises(ValueError, match="threads=0 is invalid"):
        choose_threads(0)


def test_the_user_s_omp_num_threads_leaves_torch_alone():
    choice = choose_threads(env={"OMP_NUM_THREADS": "2"}, usable_cores=2, load_1min=9.0)
    assert choice.threads is None and "OMP_NUM_THREADS" in choice.why
    assert threads_for(usable=2, load=0.0) == choose_threads(env={"OMP_NUM_THREADS": " "}, usable_cores=2,
                                                             machine_cores=2, load_1min=0.0).threads


def test_the_reason_names_the_numbers_it_used():
    assert choose_threads(env=NO_ENV, usable_cores=2, machine_cores=2, load_1min=1.96).why == \
        "2 usable cores, 2 busy (load 2.0)"


def test_the_system_is_read_when_nothing_is_given(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    monkeypatch.setattr("os.getloadavg", lambda: (1.2, 0.0, 0.0))
    assert choose_threads() == (2, "3 usable cores, 1 busy (load 1.2)")


def test_apply_threads_sets_torch_and_none_leaves_it():
    saved = torch.get_num_threads()
    try:
        assert apply_threads(choose_threads(1)) == 1 == torch.get_num_threads()
        assert apply_threads(choose_threads(env={"OMP_NUM_THREADS": "7"})) == 1  # unchanged
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("command", [["demo"], ["train"]])
def test_demo_and_train_take_threads(command):
    assert build_parser().parse_args([*command, "--threads", "3"]).threads == 3
    assert build_parser().parse_args(command).threads is None


def wait_policy_set(env, load, torch_loaded=False):
    done = wait_passively_when_busy(env, torch_loaded=torch_loaded, usable_cores=2, machine_cores=2,
                                    load_1min=load)
    assert done == (env.get("OMP_WAIT_POLICY") == "PASSIVE")
    return done


def test_idle_openmp_threads_sleep_only_on_a_busy_machine():
    assert wait_policy_set({}, load=2.0)
    assert not wait_policy_set({}, load=0.4)  # idle: spinning is fastest, keep the default


def test_a_user_s_wait_policy_wins_and_a_loaded_torch_is_left_alone():
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert not wait_policy_set(env, load=6.0) and env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert not wait_policy_set({"GOMP_SPINCOUNT": "10000"}, load=6.0)
    assert not wait_policy_set({}, load=6.0, torch_loaded=True)  # too late: libgomp read it already


def test_the_cli_sets_the_wait_policy_before_torch_loads():
    """Through OpenMP's own report of its settings, in a fresh interpreter on a machine made busy.

    libgomp reports OMP_WAIT_POLICY as 'PASSIVE' even when unset; what changes is its spin count
    (300000 by default, 0 when passive)."""
    import subprocess
    import sys
    from pathlib import Path
    program = ("import os; os.getloadavg = lambda: (64.0, 64.0, 64.0)\n"
               "import runpy, sys; sys.argv = ['lrt-lab', 'report', '--help']\n"
               "runpy.run_module('lrt_lab.cli', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    repo = Path(__file__).resolve().parent.parent
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    done = subprocess.run([sys.executable, "-c", program], env=env, cwd=repo, capture_output=True, text=True,
                          timeout=120)
    assert "GOMP_SPINCOUNT = '0'" in done.stdout + done.stderr, done.stderr[-2000:]
