"""One log line for a slow capture (issue 16): make_graphed_callables traces, registers and
captures before it returns, and a big module can take minutes in the daemon's warm-up and
capture. Past GRAPHD_SLOW_CAPTURE_S seconds (README, "Settings (environment)"; default 2) the
logger "graphd" says which callables are being captured and for how long, so that a user knows
the call is working and not hung; graphctl status shows the session "capturing" meanwhile. When
such a capture ends, a second line says how long it took."""
import logging
import os
import threading
import time

from . import _lib

log = logging.getLogger("graphd")

# One watcher thread per process for every capture in flight (a thread started per capture cost
# a capture about as much as the rest of the client's own work: docs/BENCHMARKS.md, benchmark 4).
_cv = threading.Condition()
_watches = set()   # Watches not yet fired or done
_thread_pid = None  # the process the watcher thread runs in (none after a fork)


class Watch:
    """Started before a capture, done() after it however it ends."""

    def __init__(self, names):
        self.names = ", ".join(names) or "?"
        self.t0 = time.monotonic()
        self.fired = False
        self.finished = False
        limit = int(_lib.setting("GRAPHD_SLOW_CAPTURE_S"))
        if limit == 0:
            self._fire()
            return
        self.deadline = self.t0 + limit
        with _cv:
            _watches.add(self)
            _start_watcher()
            _cv.notify()

    def _fire(self):
        with _cv:
            if self.finished:
                return
            self.fired = True
        log.warning("graphd: capturing %s for %.1f s so far: tracing, then the daemon's warm-up "
                    "and capture; it is working, not hung (graphctl status shows the session "
                    "capturing)", self.names, time.monotonic() - self.t0)

    def done(self, ok=True):
        with _cv:
            _watches.discard(self)
            self.finished = True
            fired = self.fired
        if fired:
            log.warning("graphd: capture of %s %s after %.1f s", self.names,
                        "done" if ok else "failed", time.monotonic() - self.t0)


def _after_fork_in_child():
    """A fork copies neither the watcher thread nor, safely, a lock another thread held."""
    global _cv, _watches, _thread_pid
    _cv = threading.Condition()
    _watches = set()
    _thread_pid = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start_watcher():
    """Starts the watcher thread if this process has none (called with _cv held)."""
    global _thread_pid
    if _thread_pid == os.getpid():
        return
    _thread_pid = os.getpid()
    threading.Thread(target=_watcher, name="graphd-slow-capture", daemon=True).start()


def _watcher():
    with _cv:
        while True:
            now = time.monotonic()
            due = [w for w in _watches if w.deadline <= now]
            if due:
                _watches.difference_update(due)
                _cv.release()  # the log call outside the lock
                try:
                    for w in due:
                        w._fire()
                finally:
                    _cv.acquire()
                continue
            _cv.wait(min(w.deadline for w in _watches) - now if _watches else None)


def watch(names):
    """A Watch over the capture of the callables named names (a list of str)."""
    return Watch(names)
