"""How many CPU threads torch gets: the cores free when a command starts, not every core there is.

torch starts one OpenMP thread per core. When other jobs already hold those cores, the extra
threads do not just wait: at every barrier they spin for a thread that is not running, and a small
model slows by 5x or more (FullSequence(3) on 2 cores fell from 8.5 to 1.5 steps/s beside two
2-thread jobs) where one thread would have lost little. "Free" is measured, not assumed: the CPU
time other processes use during a short sample taken at the start (psutil), so a command started
right after a pip install or a test run still gets every core once those have ended. Reads only
os, psutil and the environment, so it can run before torch is imported (which
wait_passively_when_busy needs).

Processes started together cannot see each other's load in that sample (both are still starting),
so each lrt_lab process also claims its threads in a file per process in a folder this machine's
lrt_lab processes share ($LRT_LAB_CORE_CLAIMS, else lrt_lab-cores-<uid> in the temporary folder):
the claim is made before the sample and read after it, so two processes started within the sample
of each other both see the other and split the cores, and a later one takes only the cores the
earlier ones left. A claim of a process that is gone counts for nothing.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

DEFAULT_CAP = 4  # the demo's models are small: past a few threads the gain is nothing
# How long the CPU is watched. 0.3 s is 30 clock ticks of each core's accounting (USER_HZ = 100),
# so a core busy more than half the time is told apart from an idle one with room to spare, and
# a command's start waits for it only once (REUSE_S).
SAMPLE_S = 0.3
# A sample this recent is used again, so that the wait policy, decided when lrt_lab.commands.cli is
# imported, and the thread count, decided after torch has loaded (10 s and more on a busy
# machine), come from the same measurement and the command waits for one sample only.
REUSE_S = 30.0


class ThreadChoice(NamedTuple):
    threads: int | None  # None: leave torch's setting alone (it already follows OMP_NUM_THREADS)
    why: str  # a phrase for the log, e.g. "2 usable cores, 1 busy (CPU 52% over 0.3 s)"


class CpuSample(NamedTuple):
    busy: float  # cores' worth of CPU time other processes used on this process's cores
    seconds: float  # over how long


def choose_threads(
    requested: int | None = None,
    *,
    cap: int = DEFAULT_CAP,
    env=None,
    usable_cores: int | None = None,
    machine_cores: int | None = None,
    load_1min: float | None = None,
    sample: CpuSample | None = None,
) -> ThreadChoice:
    """Threads for torch: an explicit request, else the user's OMP_NUM_THREADS, else the free cores.

    requested (a --threads flag) wins, then a non-empty OMP_NUM_THREADS in env (threads None: torch
    has read it already). Otherwise: the cores this process may run on (its CPU affinity, which
    taskset or a container can narrow below os.cpu_count()) less the ones other processes keep
    busy, at least 1 and at most `cap` (busy_cores says how busy is measured). It is decided once,
    at the start: a job that starts later is not seen.
    The keyword arguments other than cap replace what is read from the system (for tests).
    """
    env = os.environ if env is None else env
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads={requested!r} is invalid; allowed: an integer >= 1")
        claim_cores(requested)
        return ThreadChoice(requested, "set by --threads")
    if env.get("OMP_NUM_THREADS", "").strip():
        omp = env["OMP_NUM_THREADS"].strip().split(",")[0]
        claim_cores(int(omp) if omp.isdigit() and int(omp) > 0 else 1)
        return ThreadChoice(None, "set by OMP_NUM_THREADS")
    usable = usable_cores if usable_cores is not None else _usable_cores()
    claim_cores(max(1, min(cap, usable)), provisional=True)  # before the sample: see busy_cores
    usable, busy, measured = busy_cores(usable, machine_cores, load_1min, sample)
    others = claimed_by_others()
    threads = max(1, min(cap, usable - max(busy, others)))
    claim_cores(threads)
    cores = f"{usable} usable core{'s' * (usable != 1)}"
    claimed = f", {others} claimed by other lrt_lab processes" if others else ""
    return ThreadChoice(threads, f"{cores}, {busy} busy ({measured}){claimed}")


def busy_cores(
    usable_cores: int | None = None,
    machine_cores: int | None = None,
    load_1min: float | None = None,
    sample: CpuSample | None = None,
) -> tuple[int, int, str]:
    """(usable cores, how many of them other processes keep busy, what that was measured from).

    Measured from what the machine does now: the CPU time other processes use on this process's
    cores during SAMPLE_S (sample_cpu; this process sleeps meanwhile and its own time is left
    out), rounded (a core busy more than half the time counts as taken). Where psutil is missing
    or cannot read CPU times, the 1-minute load average instead, scaled to this process's share of
    the machine's cores and rounded the same way; it trails a change by about a minute, so it
    still counts a job that has just ended. The third element says which: "CPU 3% over 0.3 s"
    (of the usable cores) or "load 1.2".
    Tests pass `sample`, or `load_1min` to take the load-average rule with that value.
    """
    usable = usable_cores if usable_cores is not None else _usable_cores()
    if sample is None and load_1min is None:
        sample = _recent_sample()
    if sample is not None:
        busy = min(usable, round(sample.busy))
        percent = 100 * sample.busy / usable
        return usable, busy, f"CPU {percent:.0f}% over {sample.seconds:.1f} s"
    machine = machine_cores if machine_cores is not None else (os.cpu_count() or usable)
    machine = max(machine, usable)
    load = load_1min if load_1min is not None else _load_1min()
    return usable, min(usable, round(load * usable / machine)), f"load {load:.1f}"


def sample_cpu(seconds: float = SAMPLE_S) -> CpuSample | None:
    """The CPU time other processes use on the cores this process may run on, over `seconds`.

    Each core's busy share (all but idle and I/O wait, from psutil.cpu_times) is added up over
    this process's cores (over every core, scaled to their share, where the two numberings may
    not match), less what this process itself used. None where psutil is missing or cannot read
    the CPU times (busy_cores then falls back to the load average).
    """
    try:
        import psutil

        me = psutil.Process()
        before, mine_before, start = psutil.cpu_times(True), me.cpu_times(), time.monotonic()
        time.sleep(seconds)
        after, mine_after, end = psutil.cpu_times(True), me.cpu_times(), time.monotonic()
    except Exception:  # noqa: BLE001 - no psutil, no /proc, a refusing sandbox: use the load
        return None
    if not before or len(before) != len(after) or end <= start:
        return None
    shares = [_busy_share(b, a) for b, a in zip(before, after)]
    cpus = _usable_cpu_ids()
    if cpus and max(cpus) < len(shares) and len(shares) == os.cpu_count():
        busy = sum(shares[c] for c in cpus)
    else:
        busy = sum(shares) * (len(cpus) or len(shares)) / len(shares)
    mine = mine_after.user + mine_after.system - mine_before.user - mine_before.system
    return CpuSample(max(0.0, busy - mine / (end - start)), end - start)


def wait_passively_when_busy(env=None, *, torch_loaded: bool | None = None, **system) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE when other processes keep cores busy; True if it did.

    An OpenMP thread that finishes its share spins for the others by default: fastest on idle
    cores, but beside other jobs the spinning takes the CPU time a thread still working needs
    (quick demo, 2 threads beside two 2-thread jobs on 2 cores: 730 s spinning, 87 s passive).
    The thread count alone cannot prevent this when the load rises after the start. "Busy" is
    busy_cores's, the same measurement choose_threads uses (a sample is reused for REUSE_S), so
    the two agree. An idle machine keeps the default. libgomp reads the variable once, when torch
    loads it: set after `import torch` it does nothing, so this must run first (torch_loaded: for
    tests). A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
    system: usable_cores, machine_cores, load_1min, sample, as in busy_cores (for tests).
    """
    env = os.environ if env is None else env
    torch_loaded = "torch" in sys.modules if torch_loaded is None else torch_loaded
    chosen_by_user = any(env.get(v, "").strip() for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    if torch_loaded or chosen_by_user:
        return False
    usable = system.get("usable_cores") or _usable_cores()
    claim_cores(max(1, min(DEFAULT_CAP, usable)), provisional=True)  # seen by those starting now
    if busy_cores(**system)[1] == 0 and claimed_by_others() == 0:
        return False  # alone on idle cores: spinning is fastest
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


# Claims on cores ---------------------------------------------------------------------------------
CLAIMS_ENV = "LRT_LAB_CORE_CLAIMS"


def claims_dir() -> Path:
    """The folder this machine's lrt_lab processes claim their threads in (one file per pid)."""
    folder = os.environ.get(CLAIMS_ENV, "").strip()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(folder) if folder else Path(tempfile.gettempdir()) / f"lrt_lab-cores-{uid}"


def claim_cores(threads: int, provisional: bool = False) -> None:
    """Record that this process uses `threads` threads (a provisional claim does not replace a
    final one); removed when it exits. Best effort: a folder that cannot be written claims
    nothing."""
    path = claims_dir() / str(os.getpid())
    try:
        if provisional and path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(str(int(threads)))
        os.replace(tmp, path)
    except OSError:
        return
    if not _claimed_at_exit:
        _claimed_at_exit.append(path)
        atexit.register(lambda: path.unlink(missing_ok=True))


_claimed_at_exit: list[Path] = []


def claimed_by_others() -> int:
    """Threads claimed by other live processes in claims_dir (those of dead ones are removed)."""
    total = 0
    try:
        entries = list(claims_dir().iterdir())
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            threads = int(entry.read_text().strip() or 0)
        except (OSError, ValueError):
            continue
        if _alive(int(entry.name)):
            total += max(0, threads)
        else:
            entry.unlink(missing_ok=True)
    return total


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def apply_threads(choice: ThreadChoice) -> int:
    """Set torch's thread count from a choice (None: unchanged); returns torch's count now."""
    import torch

    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    return torch.get_num_threads()


_last_sample: tuple[float, frozenset, CpuSample] | None = None  # (taken at, cores, sample)


def _recent_sample() -> CpuSample | None:
    """sample_cpu's, or one taken less than REUSE_S ago on the same cores."""
    global _last_sample
    cpus = frozenset(_usable_cpu_ids())
    if _last_sample is not None:
        taken, cores, sample = _last_sample
        if cores == cpus and time.monotonic() - taken < REUSE_S:
            return sample
    sample = sample_cpu()
    _last_sample = None if sample is None else (time.monotonic(), cpus, sample)
    return sample


def _busy_share(before, after) -> float:
    """The share of one core's time spent busy between two psutil.cpu_times readings."""

    def busy_and_total(t):
        # Linux counts guest time inside user time as well; idle and I/O wait are not busy
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return total - t.idle - getattr(t, "iowait", 0.0), total

    (busy0, total0), (busy1, total1) = busy_and_total(before), busy_and_total(after)
    return min(1.0, max(0.0, (busy1 - busy0) / (total1 - total0))) if total1 > total0 else 0.0


def _usable_cpu_ids() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return set()


def _usable_cores() -> int:
    return len(_usable_cpu_ids()) or os.cpu_count() or 1


def _load_1min() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average: assume the machine is idle
        return 0.0
