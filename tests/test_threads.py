"""The thread policy: explicit settings win, otherwise torch gets the cores other processes leave
free, measured by a short sample of the CPU (the load average where that cannot be read)."""

import json
import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lrt_lab.commands.cli import build_parser
from lrt_lab.training import threads
from lrt_lab.training.threads import (
    CpuSample,
    apply_threads,
    busy_cores,
    choose_threads,
    sample_cpu,
    wait_passively_when_busy,
)

NO_ENV: dict = {}
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_sample_from_before(monkeypatch):
    """Every test measures afresh: no sample reused from an earlier test (threads.REUSE_S)."""
    monkeypatch.setattr(threads, "_last_sample", None)


def threads_seeing(usable, busy, cap=4):
    """The rule: `busy` cores' worth of CPU time used by other processes during the sample."""
    return choose_threads(
        env=NO_ENV, usable_cores=usable, sample=CpuSample(busy, 0.3), cap=cap
    ).threads


def threads_for(usable, load, machine=None, cap=4):
    """The fallback rule, from the 1-minute load average."""
    return choose_threads(
        env=NO_ENV, usable_cores=usable, machine_cores=machine or usable, load_1min=load, cap=cap
    ).threads


def test_an_idle_machine_gets_every_core_up_to_the_cap():
    assert threads_seeing(usable=2, busy=0.03) == 2
    assert threads_seeing(usable=64, busy=0.3) == 4
    assert threads_seeing(usable=64, busy=0.3, cap=64) == 64


def test_busy_cores_are_left_to_the_processes_that_hold_them():
    assert threads_seeing(usable=2, busy=1.0) == 1  # one job on a 2-core machine
    assert threads_seeing(usable=2, busy=2.0) == 1  # both cores busy: never fewer than 1
    assert threads_seeing(usable=8, busy=5.0) == 3
    assert threads_seeing(usable=8, busy=4.4) == 4  # rounded: a core busy less than half is free
    assert threads_seeing(usable=8, busy=4.6) == 3


def test_the_load_average_rule_where_the_cpu_cannot_be_sampled():
    assert threads_for(usable=2, load=0.0) == 2 and threads_for(usable=64, load=0.3) == 4
    assert threads_for(usable=2, load=1.0) == 1  # one job on a 2-core machine
    assert threads_for(usable=2, load=6.0) == 1  # two 2-thread jobs and more
    assert threads_for(usable=8, load=4.4) == 4 and threads_for(usable=8, load=4.6) == 3
    # taskset / a container gives 4 of 64 cores; a load of 32 means half of every core is busy
    assert threads_for(usable=4, machine=64, load=32.0) == 2
    assert threads_for(usable=4, machine=64, load=0.0) == 4


def test_an_explicit_request_wins_over_the_load_and_the_environment():
    choice = choose_threads(
        3, env={"OMP_NUM_THREADS": "1"}, usable_cores=2, sample=CpuSample(2.0, 0.3)
    )
    assert choice.threads == 3 and "--threads" in choice.why
    with pytest.raises(ValueError, match="threads=0 is invalid"):
        choose_threads(0)


def test_the_user_s_omp_num_threads_leaves_torch_alone():
    choice = choose_threads(
        env={"OMP_NUM_THREADS": "2"}, usable_cores=2, sample=CpuSample(2.0, 0.3)
    )
    assert choice.threads is None and "OMP_NUM_THREADS" in choice.why
    blank = choose_threads(env={"OMP_NUM_THREADS": " "}, usable_cores=2, sample=CpuSample(0, 0.3))
    assert blank.threads == threads_seeing(usable=2, busy=0.0) == 2


def test_the_reason_names_the_numbers_it_used():
    assert (
        choose_threads(env=NO_ENV, usable_cores=2, sample=CpuSample(0.06, 0.3)).why
        == "2 usable cores, 0 busy (CPU 3% over 0.3 s)"
    )
    assert (
        choose_threads(env=NO_ENV, usable_cores=2, machine_cores=2, load_1min=1.96).why
        == "2 usable cores, 2 busy (load 2.0)"
    )


Times = namedtuple("Times", "user nice system idle iowait")


def fake_cpu(monkeypatch, shares, mine_s, affinity):
    """psutil and the clock for one sample: core i busy shares[i] of it, this process mine_s."""
    seconds = threads.SAMPLE_S
    readings = iter(
        [
            [Times(0, 0, 0, 0, 0)] * len(shares),
            [Times(s * seconds, 0, 0, (1 - s) * seconds, 0) for s in shares],
        ]
    )
    mine = iter([Times(0, 0, 0, 0, 0), Times(mine_s, 0, 0, 0, 0)])
    psutil = SimpleNamespace(
        cpu_times=lambda percpu=False: next(readings),
        Process=lambda: SimpleNamespace(cpu_times=lambda: next(mine)),
    )
    clock = [0.0]
    monkeypatch.setitem(sys.modules, "psutil", psutil)
    monkeypatch.setattr(
        threads,
        "time",
        SimpleNamespace(
            monotonic=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s)
        ),
    )
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(affinity), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: len(shares))
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 9.0, 9.0))  # must not be read
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_the_sample_counts_this_process_s_cores_less_its_own_time(monkeypatch):
    # cores 0 and 2 of 3 are ours: 1.0 + 0.5 busy, of which this process used 0.15 s of 0.3 s
    fake_cpu(monkeypatch, shares=[1.0, 1.0, 0.5], mine_s=0.15, affinity={0, 2})
    assert choose_threads() == (1, "2 usable cores, 1 busy (CPU 50% over 0.3 s)")


def test_cores_numbered_unlike_psutil_s_list_get_the_machine_wide_share(monkeypatch):
    fake_cpu(monkeypatch, shares=[1.0, 1.0, 0.0, 0.0], mine_s=0.0, affinity={7, 9})
    assert sample_cpu() == CpuSample(1.0, threads.SAMPLE_S)  # half the machine busy, of 2 cores


@pytest.mark.parametrize("failure", ["no psutil", "no CPU times"])
def test_without_cpu_times_the_load_average_is_read(monkeypatch, failure):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    monkeypatch.setattr("os.getloadavg", lambda: (1.2, 0.0, 0.0))
    if failure == "no psutil":
        monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    else:
        import psutil

        def refused(percpu=False):
            raise PermissionError("/proc/stat")

        monkeypatch.setattr(psutil, "cpu_times", refused)
    assert sample_cpu() is None
    assert choose_threads() == (2, "3 usable cores, 1 busy (load 1.2)")


def test_the_wait_policy_and_the_thread_count_come_from_one_sample(monkeypatch):
    taken = []
    monkeypatch.setattr(threads, "sample_cpu", lambda: taken.append(1) or CpuSample(1.0, 0.3))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = {}
    assert wait_passively_when_busy(env, torch_loaded=False, usable_cores=2)
    assert choose_threads(env={}, usable_cores=2).threads == 1 and len(taken) == 1
    clock = time.monotonic() + threads.REUSE_S  # an old sample is not reused
    monkeypatch.setattr(threads, "time", SimpleNamespace(monotonic=lambda: clock))
    choose_threads(env={}, usable_cores=2)
    assert len(taken) == 2


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


def wait_policy_set(env, busy, torch_loaded=False):
    done = wait_passively_when_busy(
        env, torch_loaded=torch_loaded, usable_cores=2, sample=CpuSample(busy, 0.3)
    )
    assert done == (env.get("OMP_WAIT_POLICY") == "PASSIVE")
    return done


def test_idle_openmp_threads_sleep_only_on_a_busy_machine():
    assert wait_policy_set({}, busy=2.0)
    assert not wait_policy_set({}, busy=0.4)  # idle: spinning is fastest, keep the default
    assert wait_passively_when_busy(
        {}, torch_loaded=False, usable_cores=2, machine_cores=2, load_1min=2.0
    )  # the fallback rule decides the same way


def test_a_user_s_wait_policy_wins_and_a_loaded_torch_is_left_alone():
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert not wait_policy_set(env, busy=6.0) and env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert not wait_policy_set({"GOMP_SPINCOUNT": "10000"}, busy=6.0)
    assert not wait_policy_set({}, busy=6.0, torch_loaded=True)  # too late: libgomp read it


def test_the_cli_loads_no_torch_until_a_command_needs_it():
    """`lrt-lab --help`, a subcommand's arguments and their errors answer without torch (a second
    or more on a busy machine); only the command that trains or measures loads it."""
    program = (
        "import sys\n"
        "from lrt_lab.commands import cli\n"
        "parser = cli.build_parser()\n"
        "parser.parse_args(['train', '--length', '8', '--schedule', 'exact'])\n"
        "parser.parse_args(['report', 'runs'])\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_the_cli_sets_the_wait_policy_before_torch_loads():
    """Through OpenMP's own report of its settings, in a fresh interpreter on a machine made busy.

    libgomp reports OMP_WAIT_POLICY as 'PASSIVE' even when unset; what changes is its spin count
    (300000 by default, 0 when passive)."""
    program = (
        "from lrt_lab.training import threads\n"
        "threads.sample_cpu = lambda: threads.CpuSample(64.0, 0.3)\n"
        # a command that loads torch (to refuse the preset); its --help loads none
        "import runpy, sys; sys.argv = ['lrt-lab', 'bench', '--preset', 'nope']\n"
        "runpy.run_module('lrt_lab', run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "GOMP_SPINCOUNT = '0'" in done.stdout + done.stderr, done.stderr[-2000:]


# On the real machine. Other work may share it: a test whose claim another process could spoil
# measures first and skips, saying so, when the machine is busy.

needs_cpu_sample = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or sample_cpu(0.01) is None,
    reason="needs psutil's CPU times and CPU affinity (Linux)",
)
SPIN = "import os, sys\n{setup}\nwhile True: pass"


def spinner(setup="", wait=True):
    """A process that keeps one core busy, started (wait: and seen running)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", SPIN.format(setup=setup)])
    deadline = time.monotonic() + 10
    while wait and psutil.Process(proc.pid).cpu_times().user < 0.05 and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


def stop(procs):
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait(timeout=10)


def choice_in_a_fresh_process(cpus):
    """choose_threads in a fresh interpreter whose affinity is `cpus` (None: left alone).

    threads.py is loaded from its file: it imports nothing of lrt_lab, so the interpreter stays
    idle (it sleeps through the sample) and starts fast."""
    program = (
        "import importlib.util, os, sys\n"
        f"cpus = {cpus!r}\n"
        "if cpus: os.sched_setaffinity(0, cpus)\n"
        "spec = importlib.util.spec_from_file_location('threads', sys.argv[1])\n"
        "threads = importlib.util.module_from_spec(spec); spec.loader.exec_module(threads)\n"
        "print(repr(tuple(threads.choose_threads(env={}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(REPO / "lrt_lab" / "training" / "threads.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return eval(done.stdout)


@needs_cpu_sample
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_a_process_spinning_now_leaves_fewer_threads_on_2_cores(pinned):
    """A busy loop started before the choice: a 2-core process takes 1 thread, not 2.

    Pinned: the spinner on one core, the choice on that core and another (any machine with 2).
    Unpinned: both wherever the scheduler puts them, which is a 2-core choice only on a machine
    with 2 usable cores. Other work can only add busy cores, so nothing needs to be idle."""
    ours = sorted(os.sched_getaffinity(0))
    if pinned and len(ours) < 2:
        pytest.skip("needs 2 usable cores")
    if not pinned and len(ours) != 2:
        pytest.skip(f"the unpinned case needs exactly 2 usable cores ({len(ours)} here)")
    cpus = set(ours[:2]) if pinned else None
    spin = spinner(f"os.sched_setaffinity(0, {{{ours[0]}}})" if pinned else "")
    try:
        chosen, why = choice_in_a_fresh_process(cpus)
    finally:
        stop([spin])
    assert chosen == 1, why
    assert why.startswith("2 usable cores, ") and "over 0.3 s" in why, why  # measured, not load
    assert not why.startswith("2 usable cores, 0 busy"), why


@pytest.mark.slow
@needs_cpu_sample
def test_right_after_a_burst_an_idle_machine_gets_every_core():
    """Processes spin for at least 2 s, until the 1-minute load average shows them, and stop: the
    choice made at once takes every usable core, where the load average still counts a core busy
    (the demo took 1 thread, not 2, on an idle machine right after `make demo`'s setup step).

    The spinners run at nice 19, so they raise the load average (which counts runnable processes)
    while taking little from any other work on the machine."""
    before = sample_cpu()
    if before.busy >= 0.25:
        pytest.skip(
            f"the machine is busy: other processes used {before.busy:.2f} cores' worth "
            f"of CPU over {before.seconds:.1f} s before the test"
        )
    usable = len(os.sched_getaffinity(0))

    def load_rule_busy():
        return busy_cores(load_1min=os.getloadavg()[0])[1]

    count = min(32, 10 * -(-os.cpu_count() // usable))  # 10 a usable core's share of the machine
    spinners = [spinner("os.nice(19)", wait=False) for _ in range(count)]
    try:
        start = time.monotonic()  # the load average moves every 5 s: within 12 s, twice
        while time.monotonic() < start + 2 or (
            load_rule_busy() < 1 and time.monotonic() < start + 12
        ):
            time.sleep(0.1)
    finally:
        stop(spinners)
    if load_rule_busy() < 1:
        pytest.skip(f"the load average did not rise ({os.getloadavg()[0]:.2f} after 12 s)")
    chosen, why = choose_threads(env={})
    load_after = os.getloadavg()[0]
    if chosen != min(threads.DEFAULT_CAP, usable) and sample_cpu().busy >= 0.5:
        pytest.skip(f"other processes became busy during the test ({why})")
    assert chosen == min(threads.DEFAULT_CAP, usable), why
    assert ", 0 busy (CPU" in why, why
    assert busy_cores(load_1min=load_after)[1] >= 1, (
        f"the load average ({load_after:.2f}) should still count the ended burst"
    )


# Claims on cores: processes that start together -------------------------------------------------
def test_the_threads_another_live_process_claims_are_left_to_it(tmp_path, monkeypatch):
    """A claim of a live process (here the parent of this one) counts as busy cores, and its
    threads wait passively; a claim of a process that is gone counts for nothing."""
    monkeypatch.setenv(threads.CLAIMS_ENV, str(tmp_path))
    (tmp_path / str(os.getppid())).write_text("2")
    idle = CpuSample(0.0, 0.3)  # the other one is still starting: nothing to see in the sample
    chosen = choose_threads(env=NO_ENV, usable_cores=4, sample=idle)
    assert chosen.threads == 2 and "2 claimed by other lrt_lab processes" in chosen.why
    assert wait_passively_when_busy({}, torch_loaded=False, usable_cores=4, sample=idle)
    assert (tmp_path / str(os.getpid())).read_text() == "2"  # its own claim, for those after it
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    (tmp_path / str(os.getppid())).rename(tmp_path / dead)
    assert choose_threads(env=NO_ENV, usable_cores=4, sample=idle).threads == 4
    assert not (tmp_path / dead).exists()
    assert not wait_passively_when_busy({}, torch_loaded=False, usable_cores=4, sample=idle)


TOGETHER = """
import importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("threads", sys.argv[1])
threads = importlib.util.module_from_spec(spec); spec.loader.exec_module(threads)
# the machine is otherwise idle (other work on it must not decide the test): the sample sleeps
# as the real one does and sees no other process busy
threads.sample_cpu = lambda seconds=0.3: time.sleep(seconds) or threads.CpuSample(0.0, seconds)
open(sys.argv[2] + "." + str(os.getpid()), "w").close()  # ready
while not os.path.exists(sys.argv[2]):  # both start at once
    time.sleep(0.005)
env = {}
passive = threads.wait_passively_when_busy(env, torch_loaded=False, usable_cores=2)
print(json.dumps([threads.choose_threads(env={}, usable_cores=2).threads, passive]), flush=True)
sys.stdin.read()  # trains: alive, its claim held, until the test has both answers
"""


@pytest.mark.slow
def test_two_processes_started_together_split_two_cores_and_wait_passively(tmp_path):
    """Two lrt_lab processes started side by side on 2 cores: each used to take both (the sample
    each takes at its start sees the other still starting), four threads spinning on two cores.
    threads.py is loaded from its file (no torch), so each child is cheap."""
    env = {**os.environ, threads.CLAIMS_ENV: str(tmp_path / "claims")}
    env.pop("OMP_NUM_THREADS", None)
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                TOGETHER,
                str(REPO / "lrt_lab" / "training" / "threads.py"),
                str(go),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [json.loads(child.stdout.readline()) for child in children]
    for child in children:
        child.communicate(timeout=60)  # closes its stdin: it ends, and removes its claim
    assert sum(n for n, _ in results) <= 2 and all(n >= 1 for n, _ in results), results
    assert all(passive for _, passive in results), results  # neither spins for the other's core
    assert not list((tmp_path / "claims").iterdir())  # each removed its claim on exit


def test_an_in_process_sweep_trains_with_threads_per_run(tmp_path, monkeypatch):
    """--threads-per-run with --workers 1 (the grid trained in this process) used to be dropped:
    each run took what torch had."""
    import lrt_lab.training.sweep as sweep_module

    seen = []
    real = sweep_module.train

    def recording(*a, **k):
        seen.append(torch.get_num_threads())
        return real(*a, **k)

    monkeypatch.setattr(sweep_module, "train", recording)
    spec = {
        "sweep": {"tasks": ["a5_prefix"], "models": ["transformer"], "seeds": [0]},
        "train": {
            "length": 4,
            "preset": "tiny",
            "steps": 1,
            "batch_size": 2,
            "eval_size": 2,
            "eval_lengths": [4],
            "eval_every": 0,
            "checkpoint_every": 0,
            "device": "cpu",
        },
    }
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sweep_module.run_sweep(spec, out=str(tmp_path), progress=False, threads_per_run=1)
        assert seen == [1] and torch.get_num_threads() == 2  # restored after the grid
    finally:
        torch.set_num_threads(saved)
