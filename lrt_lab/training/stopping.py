"""Stopping a run cleanly on a signal: what schedulers send before preemption or the time limit."""

from __future__ import annotations

import contextlib
import signal
import threading


class StopRequest:
    """Set by SIGTERM or SIGUSR1 (a scheduler's warning before preemption or the time limit): the
    training loop then checkpoints at the end of its step and returns, like --time-limit."""

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGUSR1") if hasattr(signal, n))

    def __init__(self):
        self.requested: str | None = None

    def request(self, signum, frame=None) -> None:
        self.requested = signal.Signals(signum).name

    @contextlib.contextmanager
    def installed(self):
        """Handle SIGTERM / SIGUSR1 while inside (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self.request) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
