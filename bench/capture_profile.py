#!/usr/bin/env python3
"""Where graphd.make_graphed_callables spends its time (issue 5, benchmark 4: capture), next to the
in-process alternative, for an MLP of (batch, width, depth).

The client's part is timed by wrapping the graphd package's steps (nothing in the package is
changed): the trace (torch.jit.trace) and archive (torch.jit.save), RegisterModule, the Capture
call (gRPC plus mapping the static regions), and the binding of the module to its static tensors.
The daemon's part comes from its log line for the capture ("prepare X ms, regions Y ms, finish Z
ms, queued W ms"), so the script starts its own daemon from $GRAPHD_BUILD (default build/) with
--config /dev/null at info level, unless --address (or $GRAPHD_ADDRESS) names a running one; give
that one's log with --daemon-log to see its part.

In-process alternative: on CUDA, torch.cuda.make_graphed_callables on a copy of the model; on the
CPU, where PyTorch has no graphs, the same number of eager warm-up iterations (forward and
autograd.grad, as upstream's warm-up) in-process, so the ratio is what graphd adds over doing the
warm-up yourself. It runs twice and the ratios use the second run: the first pays one-off costs
(on CUDA, seconds of lazy initialisation, even after an eager step: docs/BENCHMARKS.md,
benchmark 4).

--steps N also times N training steps' forward and backward (MSE loss) through the last graphed
model, next to the same steps eager in-process: on the CPU every replay runs the TorchScript method
again, so executor settings that make capture cheaper must not make these slower.

The last two rows are the Python gc pauses inside each capture (bench/gc_pauses.py), part of the
rows above them: a single slow run that a collection explains is the process's, not graphd's.

Each of --repeat captures uses a fresh copy of the same model; the first can include one-off costs
(libtorch's first use in the daemon, CUDA context), so the table shows each run and the median of
all but the first.

Trace cache (graphd/trace_cache.py, GRAPHD_TRACE_CACHE): the first capture traces, the later ones
of the same structure reuse the archive (rows "trace cache: ..."). The script points
GRAPHD_TRACE_CACHE_DIR at a fresh temporary directory unless it is set, so its first capture is a
miss. Then (unless --no-new-process) two new processes each time one first capture against the
same daemon, after one eager step each (CUDA context and cuBLAS up in both): graphd's (which finds
the archive in the disk cache the runs above left) and the in-process alternative. The last lines
print the issue 18 targets as ratios: later captures <= 1.2x in-process, and a new process's first
capture at least 10x faster than in-process (<= 0.10x).

Usage:
  /usr/bin/python3 bench/capture_profile.py [--shape 64,512,8] [--repeat 4]      # CPU
  python3 bench/capture_profile.py --device cuda:0                 # device-resident (GPU machine)
  python3 bench/capture_profile.py --device cuda:0 --host-staged   # CPU model, device="cuda:0"
"""
import argparse
import copy
import cProfile
import json
import io
import os
import pstats
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gd_daemon import client_on_path  # bench/, the script's own folder

REPO = Path(__file__).resolve().parents[1]
CLIENT = client_on_path()  # PYTHONPATH's graphd package, else this tree's

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import graphd  # noqa: E402
from graphd import client as gd_client  # noqa: E402
from graphd import graphs as gd_graphs  # noqa: E402
from graphd import slow as gd_slow  # noqa: E402
from graphd import trace_cache as gd_trace_cache  # noqa: E402
from gd_daemon import wait_until_answering  # noqa: E402 (bench/, the script's own folder)
from gc_pauses import GcPauses  # noqa: E402 (bench/, the script's own folder)
from bench_models import mlp  # noqa: E402 (bench/, the script's own folder)

# The daemon's line for a capture; a daemon from before the steps were logged gives the total only.
DAEMON_LINE = re.compile(r"captured \d+ graphs? in pool \S+ \(([\d.]+) ms(?:: prepare ([\d.]+) ms, "
                         r"regions ([\d.]+) ms, finish ([\d.]+) ms, queued ([\d.]+) ms"
                         r"(?:; warm-up reused for (\d+))?)?\)")


PAUSES = GcPauses()  # Python's gc pauses, taken around each timed capture


class Timers:
    """Seconds spent in wrapped functions, by name, for the run in progress."""

    def __init__(self):
        self.t = {}

    def wrap(self, owner, attr, name):
        orig = getattr(owner, attr)
        timers = self

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                timers.t[name] = timers.t.get(name, 0.0) + time.perf_counter() - t0
        setattr(owner, attr, timed)


def instrument(timers):
    w = timers.wrap
    w(gd_graphs, "_trace", "trace+save")
    w(gd_trace_cache, "key", "cache key")
    w(gd_trace_cache, "_load", "cache read")
    w(torch.jit, "trace", "trace")
    w(torch.jit, "save", "save")
    w(gd_client.Client, "_ensure_session", "hello")
    w(gd_client.Client, "register_module", "RegisterModule")
    w(gd_client.Client, "capture", "Capture")
    w(gd_client.Client, "release_module", "ReleaseModule")
    w(gd_graphs, "_warm_up_buffers", "buffer warm-up")
    w(gd_graphs, "_resolve_pool", "pool")
    w(gd_graphs, "_warn_without_mps", "mps check")
    w(gd_slow, "watch", "slow watch")
    w(gd_trace_cache, "register", "register")  # includes RegisterModule when it is called
    w(gd_trace_cache, "release", "release")  # includes ReleaseModule when it is called
    for f in ("_Static", "_bind_params", "_bind_buffers", "_bind_sample_args"):
        w(gd_graphs, f, "bind")


class Daemon:
    """$GRAPHD_BUILD/graphd on a socket in a temporary directory, logging at info to a file."""

    def __init__(self, log=None):
        build = Path(os.environ.get("GRAPHD_BUILD", "build"))
        exe = (build if build.is_absolute() else REPO / build) / "graphd"
        if not exe.exists():
            sys.exit("no %s: build it first (make)" % exe)
        self.dir = tempfile.TemporaryDirectory(prefix="graphd-capture-")
        self.address = "unix:%s/graphd.sock" % self.dir.name
        self.log = Path(log) if log else Path(self.dir.name) / "graphd.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([str(exe), "--config", "/dev/null", "--listen",
                                          self.address, "--log-level", "info"],
                                         stdout=out, stderr=subprocess.STDOUT)
        why = wait_until_answering(self.proc, self.address)
        if why is not None:
            sys.exit("%s:\n%s" % (why, self.log.read_text()))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.dir.cleanup()


class LogTail:
    """The daemon's capture lines written since the last call."""

    def __init__(self, path):
        self.path = Path(path) if path else None
        self.pos = self.path.stat().st_size if self.path and self.path.exists() else 0

    def captures(self):
        if self.path is None:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            text = f.read().decode("utf-8", "replace")
            self.pos = f.tell()
        return [tuple(float(v) if v else float("nan") for v in m.groups())
                for m in DAEMON_LINE.finditer(text)]


def in_process(model, x, device, warmup):
    """ms of the in-process alternative (see the module docstring)."""
    if device.type == "cuda":
        # CUDA/cuBLAS init, on a copy: a backward through the model itself on the default stream
        # leaves AccumulateGrad nodes that upstream's warm-up on its side stream then warns of
        # ("stream does not match", torch 2.11), and may synchronise on
        init = copy.deepcopy(model)
        nn.functional.mse_loss(init(x), torch.zeros_like(x)).backward()
        del init
        torch.cuda.synchronize()
        PAUSES.take()
        t0 = time.perf_counter()
        torch.cuda.make_graphed_callables(model, (x,), num_warmup_iters=warmup)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3
    params = [p for p in model.parameters() if p.requires_grad]
    PAUSES.take()
    t0 = time.perf_counter()
    for _ in range(warmup):  # upstream's warm-up body
        out = model(x)
        torch.autograd.grad((out,), params, (torch.zeros_like(out),))
    return (time.perf_counter() - t0) * 1e3


def steps_ms(model, x, steps):
    """Mean ms of a forward, MSE loss and backward through model, after 3 untimed steps."""
    with torch.no_grad():
        y = torch.zeros_like(model(x))

    def step():
        nn.functional.mse_loss(model(x), y).backward()
    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def graphd_capture(model, x, device_arg, warmup, timers, tail):
    """(wall ms, client step timings, the daemon's numbers or None, the graphed model)."""
    timers.t = {}
    if x.is_cuda:
        torch.cuda.synchronize()
    PAUSES.take()
    t0 = time.perf_counter()
    g = graphd.make_graphed_callables(model, (x,), num_warmup_iters=warmup, device=device_arg)
    wall = (time.perf_counter() - t0) * 1e3
    timers.t["gc ms"], gens = PAUSES.take()
    timers.t["gc n"] = sum(gens)
    lines = tail.captures()
    return wall, dict(timers.t), (lines[-1] if lines else None), g


def eager_step(model, x):
    """One forward and backward, untimed: CUDA's context and cuBLAS up before a timed capture."""
    nn.functional.mse_loss(model(x), torch.zeros_like(x)).backward()
    model.zero_grad(set_to_none=True)
    if x.is_cuda:
        torch.cuda.synchronize()


def child(args, batch, width, depth, device, model_device, device_arg):
    """--child graphd|inproc: one first capture in this new process, as a JSON line."""
    where = device if args.child == "inproc" else model_device
    torch.manual_seed(0)
    model = mlp(width, depth).to(where)
    x = torch.randn(batch, width).to(where)
    eager_step(model, x)
    if args.child == "inproc":
        print(json.dumps({"wall": in_process(model, x, device, args.warmup)}))
        return
    timers = Timers()
    instrument(timers)
    wall, t, _, _ = graphd_capture(model, x, device_arg, args.warmup, timers, LogTail(None))
    print(json.dumps({"wall": wall, "t": t, "cache": gd_trace_cache.stats}))
    graphd.default_client().close()


def new_process(args, kind):
    """The JSON of a child (see child()) run with this script's arguments."""
    argv = [sys.executable, __file__, "--child", kind, "--shape", args.shape, "--device",
            args.device, "--warmup", str(args.warmup), "--modules-held",
            str(args.modules_held)] + (["--host-staged"] if args.host_staged
                                                          else [])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("the %s child failed:\n%s" % (kind, out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="64,512,8", help="batch,width,depth (default 64,512,8)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    ap.add_argument("--host-staged", action="store_true",
                    help="with --device cuda:N: a CPU model captured with device='cuda:N'")
    ap.add_argument("--warmup", type=int, default=3, help="num_warmup_iters (default 3)")
    ap.add_argument("--repeat", type=int, default=4, help="graphd captures (default 4)")
    ap.add_argument("--steps", type=int, default=0,
                    help="then time this many forward+backward steps, graphd and eager (default 0)")
    ap.add_argument("--address", default=os.environ.get("GRAPHD_ADDRESS"),
                    help="a running daemon (default: start build/graphd)")
    ap.add_argument("--daemon-log",
                    help="with --address: that daemon's log, for its part of the time; else where "
                    "the daemon started here logs (default: a temporary file)")
    ap.add_argument("--modules-held", type=int, default=gd_trace_cache.MODULES_HELD,
                    help="modules a client keeps registered for later captures (0: release each "
                    "after its capture, as before issue 18; default %(default)s)")
    ap.add_argument("--no-new-process", action="store_true",
                    help="skip the two new processes' first captures")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also print the N functions with the most own time (cProfile) over the "
                    "graphd captures after the first (default 0: none)")
    ap.add_argument("--child", choices=("graphd", "inproc"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    batch, width, depth = (int(v) for v in args.shape.split(","))
    device = torch.device(args.device)
    if args.host_staged and device.type != "cuda":
        ap.error("--host-staged needs --device cuda:N")
    model_device = torch.device("cpu") if args.host_staged else device
    device_arg = args.device if args.host_staged else None
    gd_trace_cache.MODULES_HELD = args.modules_held
    if args.child:
        return child(args, batch, width, depth, device, model_device, device_arg)
    cache_dir = None
    if not os.environ.get("GRAPHD_TRACE_CACHE_DIR"):
        cache_dir = tempfile.TemporaryDirectory(prefix="graphd-traces-")
        os.environ["GRAPHD_TRACE_CACHE_DIR"] = cache_dir.name  # also the children's

    daemon = None
    if args.address:
        os.environ["GRAPHD_ADDRESS"] = args.address
        tail = LogTail(args.daemon_log)
    else:
        daemon = Daemon(args.daemon_log)
        os.environ["GRAPHD_ADDRESS"] = daemon.address
        tail = LogTail(daemon.log)
    timers = Timers()
    instrument(timers)

    torch.manual_seed(0)
    base = mlp(width, depth)
    x = torch.randn(batch, width)
    mode = ("host-staged on " + args.device if args.host_staged
            else "device-resident on " + args.device if device.type == "cuda" else "cpu")
    print("torch %s, %d threads; MLP (%d, %d, %d), %s, num_warmup_iters %d; client package from %s"
          % (torch.__version__, torch.get_num_threads(), batch, width, depth, mode, args.warmup,
             CLIENT))

    try:
        ref = copy.deepcopy(base).to(device)
        inproc = in_process(ref, x.to(device), device, args.warmup)
        inproc_gc = PAUSES.take()[0]
        inproc2 = in_process(copy.deepcopy(base).to(device), x.to(device), device, args.warmup)
        inproc2_gc = PAUSES.take()[0]
        del ref
        runs = []
        prof = cProfile.Profile() if args.cprofile > 0 else None
        for k in range(args.repeat):
            m = copy.deepcopy(base).to(model_device)
            if prof is not None and k > 0:
                prof.enable()
            wall, t, dmn, g = graphd_capture(m, x.to(model_device), device_arg, args.warmup,
                                             timers, tail)
            if prof is not None:
                prof.disable()
            runs.append((wall, t, dmn))
        if args.steps > 0:
            xs = x.to(model_device)
            step_graphd = steps_ms(g, xs, args.steps)
            step_eager = steps_ms(copy.deepcopy(base).to(model_device), xs, args.steps)
        del g, m
        fresh = None
        if not args.no_new_process:
            fresh = (new_process(args, "graphd"), new_process(args, "inproc"))
    finally:
        graphd.default_client().close()
        if daemon is not None:
            daemon.stop()
        if cache_dir is not None:
            cache_dir.cleanup()

    label = ("torch.cuda.make_graphed_callables" if device.type == "cuda"
             else "%d eager warm-up iterations" % args.warmup)
    print("in-process (%s): %.1f ms (Python gc %.1f ms of it), again %.1f ms (gc %.1f ms)"
          % (label, inproc, inproc_gc, inproc2, inproc2_gc))
    print("trace cache (GRAPHD_TRACE_CACHE): %s, modules held %d" % (
        os.environ.get("GRAPHD_TRACE_CACHE", "disk"), args.modules_held))
    rows = [
        ("trace (torch.jit.trace)", lambda w, t, d: t.get("trace", 0) * 1e3),
        ("archive (torch.jit.save)", lambda w, t, d: t.get("save", 0) * 1e3),
        ("trace cache: key", lambda w, t, d: t.get("cache key", 0) * 1e3),
        ("trace cache: disk read", lambda w, t, d: t.get("cache read", 0) * 1e3),
        ("archive read + other", lambda w, t, d: (t.get("trace+save", 0) - t.get("trace", 0)
                                          - t.get("save", 0) - t.get("cache key", 0)
                                          - t.get("cache read", 0)) * 1e3),
        ("Hello (first call only)", lambda w, t, d: t.get("hello", 0) * 1e3),
        ("RegisterModule", lambda w, t, d: (t.get("RegisterModule", 0) - t.get("hello", 0))
         * 1e3),
        ("Capture call", lambda w, t, d: t.get("Capture", 0) * 1e3),
        ("  daemon: prepare", lambda w, t, d: d[1] if d else float("nan")),
        ("  daemon: regions", lambda w, t, d: d[2] if d else float("nan")),
        ("  daemon: finish", lambda w, t, d: d[3] if d else float("nan")),
        ("  daemon: queued", lambda w, t, d: d[4] if d else float("nan")),
        ("  daemon: warm-ups reused (count)", lambda w, t, d: d[5] if d else float("nan")),
        ("  gRPC + mapping regions", lambda w, t, d: (t.get("Capture", 0) * 1e3 - d[0])
         if d else float("nan")),
        ("held-module lookup (client)", lambda w, t, d: (t.get("register", 0)
                                                         - t.get("RegisterModule", 0)) * 1e3),
        ("ReleaseModule", lambda w, t, d: t.get("ReleaseModule", 0) * 1e3),
        ("held-module release (client)", lambda w, t, d: (t.get("release", 0)
                                                          - t.get("ReleaseModule", 0)) * 1e3),
        ("pool: device check + pool", lambda w, t, d: t.get("pool", 0) * 1e3),
        ("MPS check (first call only)", lambda w, t, d: t.get("mps check", 0) * 1e3),
        ("slow-capture watch (thread)", lambda w, t, d: t.get("slow watch", 0) * 1e3),
        ("buffer warm-up (client)", lambda w, t, d: t.get("buffer warm-up", 0) * 1e3),
        ("static views + binding", lambda w, t, d: t.get("bind", 0) * 1e3),
        ("other", lambda w, t, d: w - 1e3 * sum(t.get(k, 0) for k in (
            "trace+save", "register", "Capture", "release", "buffer warm-up", "bind", "pool",
            "mps check", "slow watch"))),
        ("make_graphed_callables", lambda w, t, d: w),
        ("  of it, Python gc pauses", lambda w, t, d: t.get("gc ms", 0)),
        ("  Python gc (collections)", lambda w, t, d: t.get("gc n", 0)),
    ]
    head = "%-28s" % "graphd, ms" + "".join("%10s" % ("run %d" % (i + 1))
                                              for i in range(len(runs)))
    head += "%10s" % ("median>1" if len(runs) > 1 else "")
    print(head)
    for name, f in rows:
        vals = [f(*r) for r in runs]
        rest = statistics.median(vals[1:]) if len(vals) > 1 else float("nan")
        print("%-28s" % name + "".join("%10.1f" % v for v in vals) +
              ("%10.1f" % rest if len(vals) > 1 else ""))
    if args.steps > 0:
        print("forward+backward step, mean of %d: graphd %.2f ms, eager in-process %.2f ms "
              "(%.2fx)" % (args.steps, step_graphd, step_eager, step_graphd / step_eager))
    if prof is not None and len(runs) > 1:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.cprofile)
        print("cProfile of captures 2-%d, by own time (the Capture call's C part is the ctypes "
              "call's row):" % len(runs))
        print("\n".join(ln for ln in buf.getvalue().splitlines()[3:] if ln.strip()))
    walls = [r[0] for r in runs]
    steady = statistics.median(walls[1:]) if len(walls) > 1 else walls[0]
    if gd_trace_cache.last_reason:
        print("trace cache: the model was traced every time: %s" % gd_trace_cache.last_reason)
    print("graphd / in-process: first %.2fx, median of the rest %.2fx (target <= 1.2x)" % (
        walls[0] / inproc2, steady / inproc2))
    if fresh is not None:
        g, ip = fresh
        t = g["t"]
        print("new process, first capture: graphd %.1f ms (trace %.1f ms, cache key %.1f ms, "
              "disk read %.1f ms, RegisterModule %.1f ms, Capture call %.1f ms; cache %s), "
              "in-process %.1f ms" % (
                  g["wall"], t.get("trace", 0) * 1e3, t.get("cache key", 0) * 1e3,
                  t.get("cache read", 0) * 1e3,
                  (t.get("RegisterModule", 0) - t.get("hello", 0)) * 1e3,
                  t.get("Capture", 0) * 1e3,
                  ", ".join("%s %d" % kv for kv in sorted(g["cache"].items()) if kv[1]),
                  ip["wall"]))
        print("graphd / in-process, new process's first capture: %.2fx (target <= 0.10x, "
              "10x faster)" % (g["wall"] / ip["wall"]))


if __name__ == "__main__":
    main()
