"""Python's garbage-collector pauses inside timed spans, for the bench scripts.

A collection that lands inside one timed capture or step adds its whole pause to that one span,
and shows as a single outlier among otherwise even runs: on the 2-core CPU machine, one
generation-1 collection inside a graphd capture took 3.4 ms. Timing the pauses next to each span
tells such an outlier from a slow daemon or a slow RPC.

    pauses = GcPauses()
    pauses.take()            # forget what came before
    ...timed span...
    ms, by_generation = pauses.take()
"""
import gc
import time


class GcPauses:
    """Sums the wall time of every collection (gc.callbacks) and counts them by generation."""

    def __init__(self):
        self.ms = 0.0
        self.collections = [0, 0, 0]
        self._start = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.ms += (time.perf_counter() - self._start) * 1e3
            self.collections[min(info["generation"], 2)] += 1
            self._start = None

    def take(self):
        """(ms paused, (generation 0, 1, 2 collections)) since the last take, and starts anew."""
        got = (self.ms, tuple(self.collections))
        self.ms, self.collections = 0.0, [0, 0, 0]
        return got

    def close(self):
        gc.callbacks.remove(self._callback)
