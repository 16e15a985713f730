#!/usr/bin/env python3
"""How much one process's device-resident step moves from one capture to the next (issue 18,
target 2's profile).

Target 2's rounds at (64, 1024, 16) came out at 1.025, 1.066 and 1.028 with each round's 0.5 s
slices within 1 % of each other (twenty-second session): each round is a new process whose graphs
are captured anew, so the excess is set by the process or the capture, not by the host's noise.
This script captures, in one process, two in-process graphed copies of one MLP (the control:
how much in-process moves between captures) and K copies through graphd, times each copy's
training step in alternated 0.5 s slices (6 by default; the order reversed every other slice
round), and prints each copy's µs a step per slice and its ratio to the first in-process copy.
After each slice the same copy runs 100 steps each followed by a synchronisation, and their
host time is summed phase by phase (bench_models.timed_step): the host's own work a step, with
no launch waiting for a full queue. Where a copy's own host work is well under its wall time,
its step waits for the device, and what it takes over in-process is device time (the graph's
kernels, the hand-offs); where the two are close, the host bounds it. Last, each copy's device
time per phase (CUDA events on the client's stream, bench/step_profile.py's device_phases:
these include the device's idle time, so they say where the GPU's time went, not what bound
it).

Run it under different placements (taskset of the client and of the daemon) to see whether the
daemon's threads slow the client's (docs/BENCHMARKS.md, "Step profile").

Usage (GPU machine, a graphd running):
  GRAPHD_ADDRESS=unix:/path python3 bench/step_spread.py [--shape 64,1024,16] [--copies 3]
"""
import argparse
import copy
import sys

import torch
import torch.nn as nn

import graphd
from bench_models import PHASES, mlp, synced_steps, timed  # bench/, the script's own folder
from step_profile import device_phases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="64,1024,16", help="batch,width,depth of the MLP")
    ap.add_argument("--copies", type=int, default=3, help="graphd-captured copies (default 3)")
    ap.add_argument("--slices", type=int, default=6, help="0.5 s slices per copy (default 6)")
    ap.add_argument("--slice-s", type=float, default=0.5, help="seconds per slice")
    ap.add_argument("--synced-steps", type=int, default=100,
                    help="synchronised steps after each slice, for the host's own work")
    ap.add_argument("--steps", type=int, default=500, help="steps for the device phases")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("step_spread: no CUDA device; nothing to measure", file=sys.stderr)
        return 0
    b, w, d = (int(v) for v in a.shape.split(","))
    torch.manual_seed(0)
    base = mlp(w, d).cuda()
    x = torch.randn(b, w, device="cuda")
    y = torch.randn(b, w, device="cuda")
    copies = [("in-process %d" % i,
               torch.cuda.make_graphed_callables(copy.deepcopy(base), (x.clone(),)))
              for i in range(2)]
    copies += [("graphd %d" % i, graphd.make_graphed_callables(copy.deepcopy(base), (x.clone(),)))
               for i in range(a.copies)]
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in copies}

    def step(name, model):
        opt = opts[name]
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for name, model in copies:
        for _ in range(30):
            step(name, model)
    torch.cuda.synchronize()
    per_slice = {name: [] for name, _ in copies}
    own = {name: [0] * len(PHASES) for name, _ in copies}  # host ns, synchronised steps
    for r in range(a.slices):
        for name, model in copies if r % 2 == 0 else copies[::-1]:
            t, n = timed(lambda: step(name, model), a.slice_s, torch.cuda.synchronize)
            per_slice[name].append(t / n * 1e6)
            synced_steps(model, opts[name], x, y, a.synced_steps, torch.cuda.synchronize,
                         own[name])
    ref = sum(per_slice[copies[0][0]]) / a.slices
    print("torch %s, %s; MLP %s; µs a step in each %.1f s slice, the mean, its ratio to "
          "in-process 0's, and the host's own work a step (synchronised steps)"
          % (torch.__version__, torch.cuda.get_device_name(0), a.shape, a.slice_s))
    steps_synced = a.synced_steps * a.slices
    for name, _ in copies:
        v = per_slice[name]
        mean = sum(v) / len(v)
        print("  %-13s %s   mean %7.1f   %.3f   host own %7.1f" % (
            name, " ".join("%7.1f" % t for t in v), mean, mean / ref,
            sum(own[name]) / steps_synced / 1e3))
    print("host's own work by phase, µs a synchronised step")
    for name, _ in copies:
        print("  %-13s %s" % (name, "  ".join("%s %6.1f" % (k, v / steps_synced / 1e3)
                                              for k, v in zip(PHASES, own[name]))))
    print("device µs per phase (CUDA events on the client's stream, %d steps)" % a.steps)
    for name, model in copies:
        ph = device_phases(model, opts[name], x, y, a.steps)
        print("  %-13s %s   sum %7.1f" % (name, "  ".join("%s %6.1f" % kv for kv in ph.items()),
                                           sum(ph.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
