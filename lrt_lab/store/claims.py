"""One writer per run folder: an exclusive claim file with its owner and a heartbeat.

A process that trains a run holds `<run>/.claim` (JSON: host, pid, start time) and touches it every
`HEARTBEAT_S` seconds while it trains. The owner's JSON is written to a temporary file first and
hard-linked into place as `.claim`: the link fails when `.claim` exists and is atomic on local
filesystems and on NFS (where `flock` may not work across nodes), so of two processes only one gets
it, and nobody ever sees a claim without its owner (on a filesystem without hard links, O_CREAT |
O_EXCL and a write). A second writer gets `RunClaimedError` naming the owner. A claim is stale, and
taken over with a warning, when its heartbeat is older than `STALE_S` or when its owner is a process
of this host that no longer exists (a kill -9, a node that came back); an unreadable claim only by
its age. The takeover renames the stale file away first (atomic: only one of two takers wins),
checks that what it moved is still stale (a live claim made meanwhile goes back), and then claims
as usual.

A new run folder is assembled with its claim inside and renamed into place (`results.Run.create`),
so a run folder never exists unclaimed while its first writer sets it up.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
import warnings
from pathlib import Path

CLAIM = ".claim"
HEARTBEAT_S = 30.0  # how often the owner touches its claim
STALE_S = 300.0  # a claim untouched this long is abandoned (10 missed heartbeats)


class RunClaimedError(ValueError):
    """The run folder is being written by another live process."""


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}


def describe(path: Path) -> str:
    """'host H, pid P, heartbeat N s ago' for a claim file (or what is known of it)."""
    try:
        owner = json.loads(Path(path).read_text())
        age = time.time() - Path(path).stat().st_mtime
        return f"host {owner.get('host')}, pid {owner.get('pid')}, heartbeat {age:.0f} s ago"
    except (OSError, ValueError):
        return "an unknown owner (unreadable claim file)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def is_stale(path: Path, stale_s: float = STALE_S) -> bool:
    """Whether the claim at `path` is abandoned: no heartbeat for stale_s, or its owner is a dead
    process of this host."""
    try:
        age = time.time() - path.stat().st_mtime
        owner = json.loads(path.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        owner = None  # unreadable (damaged, or written in place just now): only its age decides
    if age > stale_s:
        return True
    if not isinstance(owner, dict):
        return False
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        return owner["pid"] != os.getpid() and not _pid_alive(owner["pid"])
    return False


class Claim:
    """An acquired claim on a run folder; `release()` (or leaving the `with` block) gives it up.
    A daemon thread touches the file every heartbeat_s until then."""

    def __init__(self, path: Path, heartbeat_s: float = HEARTBEAT_S):
        self.path = Path(path)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat,
            args=(heartbeat_s,),
            daemon=True,
            name=f"claim-heartbeat:{self.path.parent.name}",
        )
        self._thread.start()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                os.utime(self.path)
            except OSError:
                continue  # renamed into place just now (Run.create), or removed: try again later

    def moved_to(self, run_dir: Path) -> Claim:
        """The same claim after its folder was renamed to run_dir (Run.create)."""
        self.path = Path(run_dir) / CLAIM
        return self

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            mine = json.loads(self.path.read_text()).get("pid") == os.getpid()
        except (OSError, ValueError):
            mine = False
        if mine:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def acquire(run_dir, stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S) -> Claim:
    """Claim run_dir (which must exist) for this process; RunClaimedError when another live
    process holds it. A stale claim is taken over, with a warning naming its old owner."""
    path = Path(run_dir) / CLAIM
    for _ in range(3):
        try:
            created = _create(path, _owner())
        except FileNotFoundError:
            if not Path(run_dir).is_dir():
                raise ValueError(f"run folder {run_dir} does not exist") from None
            continue  # the temporary file was removed under us (a resume's clean-up): again
        if created:
            return Claim(path, heartbeat_s)
        if not is_stale(path, stale_s):
            raise _claimed(run_dir, path)
        who = describe(path)
        aside = path.with_name(f"{CLAIM}.stale.{os.getpid()}.{time.time_ns()}")
        try:
            os.rename(path, aside)  # atomic: of two takers one wins, the other retries
        except FileNotFoundError:
            continue
        if not is_stale(aside, stale_s):  # a live claim made after ours was judged: put it back
            try:
                os.link(aside, path)
            except OSError:
                pass  # someone claimed meanwhile; the claim we moved is lost to its owner
            finally:
                aside.unlink(missing_ok=True)
            raise _claimed(run_dir, path)
        aside.unlink(missing_ok=True)
        warnings.warn(f"run {Path(run_dir).name}: taking over a stale claim ({who})", stacklevel=2)
    raise RunClaimedError(
        f"run {Path(run_dir).name}: its claim changed hands while taking it over; try again"
    )


def _claimed(run_dir, path: Path) -> RunClaimedError:
    return RunClaimedError(
        f"run {Path(run_dir).name} is being written by {describe(path)}; "
        "wait for it, or remove its .claim if that process is gone"
    )


def _create(path: Path, owner: dict) -> bool:
    """Create the claim file `path` holding `owner` unless it exists (False then), complete from
    the moment it appears: written beside it (a `.tmp` file, which a resume's clean-up removes if
    a kill leaves it) and hard-linked into place. Where hard links are not supported, O_EXCL and
    a write."""
    tmp = path.with_name(f"{CLAIM}.{os.getpid()}.{threading.get_ident()}.{time.time_ns()}.tmp")
    tmp.write_text(json.dumps(owner))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
            raise
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(owner, f)
    return True


def claimed_by_other(run_dir, stale_s: float = STALE_S) -> str | None:
    """A description of the live owner of run_dir's claim, or None (unclaimed, or stale)."""
    path = Path(run_dir) / CLAIM
    if not path.exists() or is_stale(path, stale_s):
        return None
    return describe(path)
