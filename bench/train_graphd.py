#!/usr/bin/env python3
"""Training step and capture time through a running graphd (issue 5, benchmarks 1 and 4), side by
side with eager PyTorch and in-process torch.cuda.make_graphed_callables, in one run; and the
replay round trip of a trivial graph (benchmark 2).

One step = forward, MSE loss, backward, SGD step, for MLPs of (batch, width, depth). Two graphd
modes:
- device-resident: the model and its tensors on cuda:0 as in-process; the static tensors are the
  daemon's device memory mapped here with CUDA IPC, the optimizer updates them in place on the
  GPU, and the parameter gradients stay in the daemon's graph mempool (mapped here too). Each
  replay is posted: ordered on the current stream by sequence counters (CUDA stream memory
  operations), no answer waited for, no host waits. The "evt" column orders the same graphs by
  CUDA IPC events, each replay waiting for the daemon's launch (GRAPHD_REPLAY_ORDER=events); the
  "sync" column by host synchronisation (current stream synchronised before the REPLAY frame, the
  daemon answering once its replay is done), as GRAPHD_REPLAY_ORDER=sync does; the "copy" column
  is a second capture whose backward graph copies every parameter gradient into the graph's
  region (GRAPHD_COPY_PARAM_GRADS=1).
- host-staged: the client's model, optimizer and tensors stay on the CPU in shared host regions;
  the daemon's CUDA graphs copy inputs and parameters to the GPU and outputs and grads back.

Replay round trip: a graph of `x * 2` on a float32[4] cuda tensor, p50/p99 over --replays calls
(after 1,000 warm-up calls, in blocks of 1,000 taken in turn): in-process CUDAGraph.replay() then
stream synchronize; graphd posted replay (Graph.replay(stream=...): counters and the REPLAY
frame, through ctypes) then stream synchronize, so that it too has finished on the device; the
same without the synchronize (what a training step waits for: the call); the same two ordered
by IPC events; graphd fast path unordered (Graph.replay: the daemon synchronises before it
answers); graphd gRPC Replay.

The step times of eager, in-process graphs and the device-resident columns are taken in turns:
--rounds rounds of --steps steps each per mode, the median round reported, so that a drift of
the GPU's clocks or of the machine's load falls on every column alike.

Usage: GRAPHD_ADDRESS=unix:/path python3 bench/train_graphd.py [--steps 100] [--rounds 3]
       [--shapes 64,512,8 ...] [--no-host] [--replays 10000]
"""
import argparse
import copy
import time

import torch
import torch.nn as nn

import graphd
from bench_models import mlp  # bench/, the script's own folder


def timed(step, steps, sync):
    for _ in range(10):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def sgd_step(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return step


def bench(batch, width, depth, steps, rounds=3, host=True):
    torch.manual_seed(0)
    base = mlp(width, depth)
    out = {}
    sync = torch.cuda.synchronize

    # eager on the GPU
    m = copy.deepcopy(base).cuda()
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, width, device="cuda")
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    modes = {"eager": sgd_step(m, opt, x, y)}

    # in-process CUDA graphs
    m2 = copy.deepcopy(base).cuda()
    opt2 = torch.optim.SGD(m2.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    g2 = torch.cuda.make_graphed_callables(m2, (x.clone().requires_grad_(False),))
    sync()
    out["capture_inproc"] = (time.perf_counter() - t0) * 1e3
    modes["graphed"] = sgd_step(g2, opt2, x, y)

    # graphd, device-resident
    m4 = copy.deepcopy(base).cuda()
    opt4 = torch.optim.SGD(m4.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    g4 = graphd.make_graphed_callables(m4, (x.clone(),))
    out["capture_resident"] = (time.perf_counter() - t0) * 1e3
    modes["graphd_resident"] = sgd_step(g4, opt4, x, y)

    def step_resident_sync():  # the same graphs, ordered by host synchronisation
        g4._graphd_runner.host_sync = True
        try:
            modes["graphd_resident"]()
        finally:
            g4._graphd_runner.host_sync = False
    modes["graphd_resident_sync"] = step_resident_sync
    client = graphd.default_client()

    def step_resident_events():  # the same graphs, ordered by CUDA IPC events
        client.set_replay_posted(False)
        try:
            modes["graphd_resident"]()
        finally:
            client.set_replay_posted(True)
    modes["graphd_resident_events"] = step_resident_events

    # graphd, device-resident, gradients copied into the graph's region by its backward graph
    m5 = copy.deepcopy(base).cuda()
    opt5 = torch.optim.SGD(m5.parameters(), lr=1e-3)
    graphd.graphs._COPY_PARAM_GRADS = True
    try:
        g5 = graphd.make_graphed_callables(m5, (x.clone(),))
    finally:
        graphd.graphs._COPY_PARAM_GRADS = False
    modes["graphd_resident_copy"] = sgd_step(g5, opt5, x, y)

    times = {name: [] for name in modes}
    for _ in range(rounds):
        for name, step in modes.items():
            times[name].append(timed(step, steps, sync))
    for name, ts in times.items():
        out[name] = sorted(ts)[len(ts) // 2]
    modes.clear()

    if not host:
        return out
    # graphd, host-staged
    m3 = copy.deepcopy(base)
    xc, yc = x.cpu(), y.cpu()
    opt3 = torch.optim.SGD(m3.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    g3 = graphd.make_graphed_callables(m3, (xc.clone(),), device="cuda:0")
    out["capture_graphd"] = (time.perf_counter() - t0) * 1e3

    out["graphd_host"] = timed(sgd_step(g3, opt3, xc, yc), steps, lambda: None)
    return out


class Double(nn.Module):
    def forward(self, x):
        return x * 2


def quantiles(ns):
    ns = sorted(ns)

    def q(p):  # nearest rank
        return ns[min(len(ns) - 1, max(0, int(-(-p * len(ns) // 1)) - 1))] / 1e3
    return q(0.50), q(0.99)


def replay_bench(replays):
    """p50/p99 in µs of one replay round trip for a trivial graph, three ways."""
    x = torch.ones(4, device="cuda")
    # in-process CUDA graph
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            Double()(x)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = Double()(x)
    cur = torch.cuda.current_stream()

    def inproc():
        g.replay()
        cur.synchronize()
    # graphd, device-resident; Graph.replay is the REPLAY frame through ctypes, no autograd
    gm = graphd.make_graphed_callables(Double().cuda(), (x.clone(),))
    graph = gm._graphd_runner.graph

    def ordered():
        graph.replay(0, stream=cur)
        cur.synchronize()

    def ordered_launch():
        graph.replay(0, stream=cur)

    def fast():
        graph.replay(0)

    def rpc():
        graph.replay(0, rpc=True)
    # (name, function, replays posted): the stream-ordered ones either way
    paths = [("in-process CUDAGraph.replay()+sync", inproc, True),
             ("graphd posted (REPLAY+counters)+sync", ordered, True),
             ("graphd posted, launch only", ordered_launch, True),
             ("graphd ordered (REPLAY+events)+sync", ordered, False),
             ("graphd ordered by events, launch only", ordered_launch, False),
             ("graphd fast path, unordered (sync'd)", fast, True),
             ("graphd gRPC Replay", rpc, True)]
    client = graphd.default_client()
    times = {name: [] for name, _, _ in paths}
    clock = time.perf_counter_ns
    for name, fn, posted in paths:  # warm-up
        client.set_replay_posted(posted)
        for _ in range(1000):
            fn()
    block = 1000
    for _ in range(max(1, replays // block)):
        for name, fn, posted in paths:
            client.set_replay_posted(posted)
            t = times[name]
            for _ in range(block):
                t0 = clock()
                fn()
                t.append(clock() - t0)
    client.set_replay_posted(True)
    cur.synchronize()
    assert torch.equal(y, x * 2)
    return [(name, len(times[name])) + quantiles(times[name]) for name, _, _ in paths]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", nargs="*", default=["64,512,8", "64,1024,16", "256,4096,8"])
    ap.add_argument("--no-host", action="store_true", help="skip the host-staged column")
    ap.add_argument("--replays", type=int, default=10000, help="0: skip the replay round trip")
    args = ap.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    print("training step (ms, median of %d rounds of %d steps) and capture (ms); /gr: over "
          "in-process graphed, /eag: over eager" % (args.rounds, args.steps))
    print("%-14s %8s %8s %9s %6s %6s %9s %6s %9s %6s %9s %6s %9s %6s %8s %8s %6s %8s %6s" % (
        "(b,w,d)", "eager", "graphed", "gd-resid", "/gr", "/eag", "gd-r-evt", "/gr", "gd-r-sync",
        "/gr", "gd-r-copy", "/gr", "gd-host", "/gr", "cap-inpr", "cap-res", "ratio", "cap-host",
        "ratio"))
    for s in args.shapes:
        b, w, d = (int(v) for v in s.split(","))
        r = bench(b, w, d, args.steps, args.rounds, host=not args.no_host)
        host = r.get("graphd_host", float("nan"))
        cap_host = r.get("capture_graphd", float("nan"))
        gr = r["graphed"]
        print("%-14s %8.3f %8.3f %9.3f %5.3fx %5.3fx %9.3f %5.3fx %9.3f %5.2fx %9.3f %5.3fx "
              "%9.3f %5.2fx %8.1f %8.1f %5.2fx %8.1f %5.2fx" % (
                  "(%d,%d,%d)" % (b, w, d), r["eager"], gr, r["graphd_resident"],
                  r["graphd_resident"] / gr, r["graphd_resident"] / r["eager"],
                  r["graphd_resident_events"], r["graphd_resident_events"] / gr,
                  r["graphd_resident_sync"], r["graphd_resident_sync"] / gr,
                  r["graphd_resident_copy"], r["graphd_resident_copy"] / gr, host, host / gr,
                  r["capture_inproc"], r["capture_resident"],
                  r["capture_resident"] / r["capture_inproc"], cap_host,
                  cap_host / r["capture_inproc"]), flush=True)
    if args.replays > 0:
        print("replay round trip, trivial graph (x * 2, float32[4] on cuda:0), µs")
        rows = replay_bench(args.replays)
        base = rows[0][2]
        for name, n, p50, p99 in rows:
            print("%-38s n=%d p50 %8.2f p99 %8.2f  p50 - in-process %+8.2f" % (
                name, n, p50, p99, p50 - base), flush=True)


if __name__ == "__main__":
    main()
