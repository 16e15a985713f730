#!/usr/bin/env python3
"""What one device-side hand-off between two processes costs on the GPU (issue 18, target 1).

A device-resident replay through graphd hands the device over twice: the client's stream writes
"ready = n" after its copy into the static inputs, the executor's stream waits for it, runs the
graph and writes "done = n", and the client's stream waits for that before its next kernel.
In-process make_graphed_callables has neither: the copy and the graph run on one stream.

This probe times that chain with nothing else in it: a tiny kernel on each side (the copy, the
graph), K round trips queued on both streams behind a kernel that holds the client's stream for
20 ms (HOLD_NS) and then released at once, so the time between two CUDA events on the client's
stream is the device's alone (no host in it). Rows:
- one stream: both kernels on one stream (in-process replay's shape);
- two streams, events: the same process, cudaStreamWaitEvent each way;
- two streams / two processes, value ops: cuStreamWaitValue64 (GEQ) and cuStreamWriteValue64,
  graphd's counters; the executor's side in a spawned process on memory shared through CUDA IPC;
- the same with a spin kernel (one thread polling the word with ld.acquire.sys, from PTX the
  driver compiles) in place of the executor's wait, the client's wait, or both.

Nothing here touches graphd. Run it with and without MPS (the benchmarks run under MPS).
Usage: python3 bench/handoff_probe.py [--round-trips 100] [--reps 20]
"""
import argparse
import ctypes
import faulthandler
import statistics
import sys
import time

import torch

# One thread spins until *addr >= value, or until limit ns of the GPU's global timer have passed
# (so that a lost writer cannot hang the device), and then counts the timeout in *timeouts.
SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry probe_spin_geq(.param .u64 p_addr, .param .u64 p_value, .param .u64 p_limit,
                               .param .u64 p_timeouts)
{
    .reg .pred %p<3>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [p_addr];
    ld.param.u64 %rd2, [p_value];
    ld.param.u64 %rd3, [p_limit];
    mov.u64 %rd4, %globaltimer;
    add.u64 %rd5, %rd4, %rd3;
$Lloop:
    ld.acquire.sys.global.u64 %rd6, [%rd1];
    setp.ge.u64 %p1, %rd6, %rd2;
    @%p1 bra $Ldone;
    mov.u64 %rd7, %globaltimer;
    setp.lt.u64 %p2, %rd7, %rd5;
    @%p2 bra $Lloop;
    ld.param.u64 %rd1, [p_timeouts];
    atom.global.add.u64 %rd6, [%rd1], 1;
$Ldone:
    ret;
}

// Holds its stream for p_ns of the GPU's global timer: the rep's launches queue behind it.
.visible .entry probe_hold(.param .u64 p_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [p_ns];
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
$Lhold:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p1, %rd4, %rd3;
    @%p1 bra $Lhold;
    ret;
}
"""
SPIN_LIMIT_NS = 200_000_000
# How long the hold kernel keeps the client's stream shut while the host queues a rep. It opens
# by itself on the device: the first version's gate was opened by the host after queuing, and a
# host blocked in a launch by a full queue never opened it; the second version's gate was opened
# by a timer thread, which needs the GIL, and torch calls that block in a launch may hold it.
HOLD_NS = 20_000_000


class Driver:
    """The CUDA driver calls the probe needs, through ctypes (the current context is torch's)."""

    def __init__(self):
        torch.zeros(1, device="cuda:0")  # torch's primary context, current on this thread
        self.lib = ctypes.CDLL("libcuda.so.1")

        def sym(*names):
            for n in names:
                f = getattr(self.lib, n, None)
                if f is not None:
                    return f
            raise RuntimeError("libcuda.so.1 has none of %s" % (names,))
        u64 = ctypes.c_uint64
        self.wait = sym("cuStreamWaitValue64_v2", "cuStreamWaitValue64")
        self.wait.argtypes = [ctypes.c_void_p, u64, u64, ctypes.c_uint]
        self.write = sym("cuStreamWriteValue64_v2", "cuStreamWriteValue64")
        self.write.argtypes = [ctypes.c_void_p, u64, u64, ctypes.c_uint]
        self.launch = self.lib.cuLaunchKernel
        self.launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        module, fn, hold = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self.ok(self.lib.cuModuleLoadData(ctypes.byref(module), SPIN_PTX), "cuModuleLoadData")
        self.ok(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, b"probe_spin_geq"),
                "cuModuleGetFunction")
        self.ok(self.lib.cuModuleGetFunction(ctypes.byref(hold), module, b"probe_hold"),
                "cuModuleGetFunction")
        self.fn, self.hold_fn = fn, hold

    @staticmethod
    def ok(rc, what):
        if rc != 0:
            raise RuntimeError("%s failed: CUresult %d" % (what, rc))

    def wait_geq(self, stream, addr, value, spin):
        s = ctypes.c_void_p(stream.cuda_stream)
        if not spin:
            self.ok(self.wait(s, addr, value, 0), "cuStreamWaitValue64")
            return
        # The flags' word at TIMEOUTS counts the spins that gave up (addr's flags: addr is one
        # word of them, at READY or DONE).
        timeouts = addr - addr % 32 + TIMEOUTS
        args = (ctypes.c_uint64(addr), ctypes.c_uint64(value), ctypes.c_uint64(SPIN_LIMIT_NS),
                ctypes.c_uint64(timeouts))
        params = (ctypes.c_void_p * 4)(*[ctypes.addressof(a) for a in args])
        self.ok(self.launch(self.fn, 1, 1, 1, 1, 1, 1, 0, s, params, None), "cuLaunchKernel")

    def hold(self, stream, ns):
        """Queues the hold kernel: stream runs nothing else for ns of the GPU's timer."""
        arg = ctypes.c_uint64(ns)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
        self.ok(self.launch(self.hold_fn, 1, 1, 1, 1, 1, 1, 0, ctypes.c_void_p(stream.cuda_stream),
                            params, None), "cuLaunchKernel")

    def write_value(self, stream, addr, value):
        self.ok(self.write(ctypes.c_void_p(stream.cuda_stream), addr, value, 0),
                "cuStreamWriteValue64")


READY, DONE, TIMEOUTS = 0, 8, 24  # byte offsets of the words of the flags


def executor_side(drv, stream, base, first, k, spin, work):
    """Queues k replays' worth of the executor's side: wait ready, the "graph", write done."""
    with torch.cuda.stream(stream):
        for i in range(first, first + k):
            drv.wait_geq(stream, base + READY, i, spin)
            work.add_(1)
            drv.write_value(stream, base + DONE, i)


def _executor(q_in, q_out):
    """The spawned "executor": queues its side of each run when told, on its own stream."""
    drv = Driver()
    stream = torch.cuda.Stream()
    work = torch.zeros(16, device="cuda:0")
    flags = None
    while True:
        msg = q_in.get()
        if msg is None:
            break
        if msg[0] == "flags":
            flags = msg[1]
            q_out.put("ok")
            continue
        _, first, k, spin = msg
        executor_side(drv, stream, flags.data_ptr(), first, k, spin, work)
        q_out.put("queued")
        stream.synchronize()
        q_out.put("done")


class Probe:
    def __init__(self, k, reps):
        self.k, self.reps = k, reps
        self.drv = Driver()
        self.client = torch.cuda.Stream()
        self.executor = torch.cuda.Stream()
        self.flags = torch.zeros(4, dtype=torch.int64, device="cuda:0")
        self.base = self.flags.data_ptr()
        self.x = torch.zeros(16, device="cuda:0")
        self.y = torch.zeros(16, device="cuda:0")
        self.n = 0  # the counters' last value: they only grow, across rows and reps
        self.filled = 0  # reps whose hold ended before all of their launches were queued
        torch.cuda.synchronize()

    def held(self, body, before_release=None):
        """Runs body(first) for one rep behind the hold kernel; returns device µs per round
        trip."""
        first = self.n + 1
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # A stream's queue can hold fewer launches than a rep (under MPS the nineteenth session saw
        # the host block in a launch): if queuing outlasts the hold, the device waited for the
        # host, and the rep counts as one whose queue filled.
        t0 = time.monotonic()
        with torch.cuda.stream(self.client):
            self.drv.hold(self.client, HOLD_NS)
            ev0.record(self.client)
            body(first)
            ev1.record(self.client)
        if before_release is not None:
            before_release()
        if time.monotonic() - t0 >= HOLD_NS / 1e9:
            self.filled += 1
        ev1.synchronize()
        self.n = first + self.k - 1
        return ev0.elapsed_time(ev1) * 1e3 / self.k

    def row(self, body, before_release=None, after=None):
        times = []
        for _ in range(self.reps):
            times.append(self.held(body, before_release))
            if after is not None:
                after()
        torch.cuda.synchronize()
        if self.filled:
            print("  (%d of %d reps: the host was still queuing when the hold ended, so the "
                  "device waited for launches: not device-bound figures; lower --round-trips)"
                  % (self.filled, self.reps), flush=True)
            self.filled = 0
        timeouts = int(self.flags[3].item())
        if timeouts:
            print("  (%d spins gave up after %.1f s: a spin kernel held a queue that the write it "
                  "waited for was behind)" % (timeouts, SPIN_LIMIT_NS / 1e9), flush=True)
            self.flags[3] = 0
        return statistics.median(times), min(times), max(times)

    def one_stream(self, first):
        for _ in range(self.k):
            self.x.add_(1)
            self.y.add_(1)

    def events(self, first):
        for _ in range(self.k):
            self.x.add_(1)
            ready = torch.cuda.Event()
            ready.record(self.client)
            self.executor.wait_event(ready)
            with torch.cuda.stream(self.executor):
                self.y.add_(1)
            done = torch.cuda.Event()
            done.record(self.executor)
            self.client.wait_event(done)

    def client_side(self, spin):
        def body(first):
            for i in range(first, first + self.k):
                self.x.add_(1)
                self.drv.write_value(self.client, self.base + READY, i)
                self.drv.wait_geq(self.client, self.base + DONE, i, spin)
        return body


class Rows:
    """Prints each row as it comes (a hang in a later row leaves the earlier ones)."""

    def append(self, row):
        name, (med, lo, hi) = row
        print("%-52s %8.2f %8.2f %8.2f" % (name, med, lo, hi), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--round-trips", type=int, default=100,
                    help="round trips queued per held rep (default 100)")
    ap.add_argument("--reps", type=int, default=20, help="held reps per row (default 20)")
    ap.add_argument("--limit", type=float, default=0,
                    help="seconds after which to print every thread's stack and exit")
    a = ap.parse_args()
    if a.limit > 0:
        faulthandler.dump_traceback_later(a.limit, exit=True)
    if not torch.cuda.is_available():
        print("handoff_probe: no CUDA device; nothing to probe", file=sys.stderr)
        return 0
    p = Probe(a.round_trips, a.reps)
    print("device: %s, torch %s; %d round trips per rep, %d reps; device us per round trip"
          % (torch.cuda.get_device_name(0), torch.__version__, a.round_trips, a.reps))
    print("%-52s %8s %8s %8s" % ("chain", "median", "min", "max"), flush=True)
    rows = Rows()
    rows.append(("one stream: copy kernel, graph kernel", p.row(p.one_stream)))
    rows.append(("two streams, one process: events", p.row(p.events)))
    for spin_e, spin_c, name in ((False, False, "wait values"),
                                 (True, False, "executor spins"),
                                 (False, True, "client spins"),
                                 (True, True, "both spin")):
        def queue(spin_e=spin_e):
            executor_side(p.drv, p.executor, p.base, p.n + 1, p.k, spin_e, p.y)
        rows.append(("two streams, one process: " + name,
                     p.row(p.client_side(spin_c), before_release=queue)))

    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_executor, args=(q_in, q_out))
    child.start()
    try:
        q_in.put(("flags", p.flags))
        assert q_out.get(timeout=120) == "ok"
        for spin_e, spin_c, name in ((False, False, "wait values"),
                                     (True, False, "executor spins"),
                                     (False, True, "client spins"),
                                     (True, True, "both spin")):
            def queue(spin_e=spin_e):
                q_in.put(("run", p.n + 1, p.k, spin_e))
                assert q_out.get(timeout=60) == "queued"

            def after():
                assert q_out.get(timeout=60) == "done"
            rows.append(("two processes (CUDA IPC): " + name,
                         p.row(p.client_side(spin_c), before_release=queue, after=after)))
    finally:
        q_in.put(None)
        child.join(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
