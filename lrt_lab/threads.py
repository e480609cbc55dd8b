"""How many CPU threads torch gets: the cores free when a command starts, not every core there is.

torch starts one OpenMP thread per core. When other jobs already hold those cores, the extra
threads do not just wait: at every barrier they spin for a thread that is not running, and a small
model slows by 5x or more (FullSequence(3) on 2 cores fell from 8.5 to 1.5 steps/s beside two
2-thread jobs) where one thread would have lost little. Reads only os and the environment, so it
can run before torch is imported (which wait_passively_when_busy needs).
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

DEFAULT_CAP = 4  # the demo's models are small: past a few threads the gain is nothing


class ThreadChoice(NamedTuple):
    threads: int | None  # None: leave torch's setting alone (it already follows OMP_NUM_THREADS)
    why: str             # one phrase for a log line, e.g. "2 usable cores, 1 busy (load 1.2)"


def choose_threads(requested: int | None = None, *, cap: int = DEFAULT_CAP, env=None,
                   usable_cores: int | None = None, machine_cores: int | None = None,
                   load_1min: float | None = None) -> ThreadChoice:
    """Threads for torch: an explicit request, else the user's OMP_NUM_THREADS, else the free cores.

    requested (a --threads flag) wins, then a non-empty OMP_NUM_THREADS in env (threads None: torch
    has read it already). Otherwise: the cores this process may run on (its CPU affinity, which
    taskset or a container can narrow below os.cpu_count()) less the ones other processes keep busy,
    at least 1 and at most `cap` (busy_cores says how busy). The load average trails a change by
    about a minute, so a job started just before is undercounted, and one started later is not
    seen at all: wait_passively_when_busy covers that case.
    The keyword arguments other than cap replace what is read from the system (for tests).
    """
    env = os.environ if env is None else env
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads={requested!r} is invalid; allowed: an integer >= 1")
        return ThreadChoice(requested, "set by --threads")
    if env.get("OMP_NUM_THREADS", "").strip():
        return ThreadChoice(None, "set by OMP_NUM_THREADS")
    usable, busy, load = busy_cores(usable_cores, machine_cores, load_1min)
    threads = max(1, min(cap, usable - busy))
    return ThreadChoice(threads, f"{usable} usable core{'s' * (usable != 1)}, {busy} busy (load {load:.1f})")


def busy_cores(usable_cores: int | None = None, machine_cores: int | None = None,
               load_1min: float | None = None) -> tuple[int, int, float]:
    """(usable cores, how many of them other processes keep busy, the load average used).

    The 1-minute load average counts the whole machine: it is scaled to this process's share of
    the machine's cores, then rounded (a core busy more than half the time counts as taken).
    """
    usable = usable_cores if usable_cores is not None else _usable_cores()
    machine = max(machine_cores if machine_cores is not None else (os.cpu_count() or usable), usable)
    load = load_1min if load_1min is not None else _load_1min()
    return usable, min(usable, round(load * usable / machine)), load


def wait_passively_when_busy(env=None, *, torch_loaded: bool | None = None, **system) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE when other processes keep cores busy; True if it did.

    An OpenMP thread that finishes its share spins for the others by default: fastest on idle
    cores, but beside other jobs the spinning takes the CPU time a thread still working needs
    (quick demo, 2 threads beside two 2-thread jobs on 2 cores: 730 s spinning, 87 s passive).
    The thread count alone cannot prevent this when the load rises after the start. An idle
    machine keeps the default. libgomp reads the variable once, when torch loads it: set after
    `import torch` it does nothing, so this must run first (torch_loaded: for tests). A user's
    OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
    system: usable_cores, machine_cores, load_1min, as in busy_cores (for tests).
    """
    env = os.environ if env is None else env
    torch_loaded = "torch" in sys.modules if torch_loaded is None else torch_loaded
    chosen_by_user = any(env.get(v, "").strip() for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    if torch_loaded or chosen_by_user or busy_cores(**system)[1] == 0:
        return False
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def apply_threads(choice: ThreadChoice) -> int:
    """Set torch's thread count from a choice (None: unchanged); returns the count torch now uses."""
    import torch
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    return torch.get_num_threads()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def _load_1min() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average: assume the machine is idle
        return 0.0
