"""One log line for a slow capture (issue 16): make_graphed_callables traces, registers and
captures before it returns, and a big module can take minutes in the daemon's warm-up and
capture. Past GRAPHD_SLOW_CAPTURE_S seconds (README, "Settings (environment)"; default 2) the
logger "graphd" says which callables are being captured and for how long, so that a user knows
the call is working and not hung; graphctl status shows the session "capturing" meanwhile. When
such a capture ends, a second line says how long it took."""
import logging
import threading
import time

from . import _lib

log = logging.getLogger("graphd")


class Watch:
    """Started before a capture, done() after it however it ends."""

    def __init__(self, names):
        self.names = ", ".join(names) or "?"
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.fired = False
        self.finished = False
        self.timer = None
        limit = int(_lib.setting("GRAPHD_SLOW_CAPTURE_S"))
        if limit == 0:
            self._fire()
        else:
            self.timer = threading.Timer(limit, self._fire)
            self.timer.daemon = True
            self.timer.start()

    def _fire(self):
        with self.lock:
            if self.finished:
                return
            self.fired = True
        log.warning("graphd: capturing %s for %.1f s so far: tracing, then the daemon's warm-up "
                    "and capture; it is working, not hung (graphctl status shows the session "
                    "capturing)", self.names, time.monotonic() - self.t0)

    def done(self, ok=True):
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            self.finished = True
            fired = self.fired
        if fired:
            log.warning("graphd: capture of %s %s after %.1f s", self.names,
                        "done" if ok else "failed", time.monotonic() - self.t0)


def watch(names):
    """A Watch over the capture of the callables named names (a list of str)."""
    return Watch(names)
