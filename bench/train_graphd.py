#!/usr/bin/env python3
"""Training step and capture time through a running graphd (issue 5, benchmarks 1 and 4), side by
side with eager PyTorch and in-process torch.cuda.make_graphed_callables, in one run.

One step = forward, MSE loss, backward, SGD step, for MLPs of (batch, width, depth). graphd here is
host-staged: the client's model, optimizer and tensors stay on the CPU in shared host regions; the
daemon's CUDA graphs copy inputs and parameters to the GPU and outputs and grads back. (The
device-resident mode of issue 5 is not built yet.)

Usage: GRAPHD_ADDRESS=unix:/path python3 bench/train_graphd.py [--steps 100] [--shapes 64,512,8 ...]
"""
import argparse
import copy
import time

import torch
import torch.nn as nn

import graphd


def mlp(width, depth):
    layers = []
    for i in range(depth):
        layers += [nn.Linear(width, width)] + ([nn.ReLU()] if i < depth - 1 else [])
    return nn.Sequential(*layers)


def timed(step, steps, sync):
    for _ in range(10):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def bench(batch, width, depth, steps):
    torch.manual_seed(0)
    base = mlp(width, depth)
    out = {}
    sync = torch.cuda.synchronize

    # eager on the GPU
    m = copy.deepcopy(base).cuda()
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, width, device="cuda")
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)

    def step_eager():
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    out["eager"] = timed(step_eager, steps, sync)

    # in-process CUDA graphs
    m2 = copy.deepcopy(base).cuda()
    opt2 = torch.optim.SGD(m2.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    g2 = torch.cuda.make_graphed_callables(m2, (x.clone().requires_grad_(False),))
    sync()
    out["capture_inproc"] = (time.perf_counter() - t0) * 1e3

    def step_graphed():
        opt2.zero_grad(set_to_none=True)
        nn.functional.mse_loss(g2(x), y).backward()
        opt2.step()
    out["graphed"] = timed(step_graphed, steps, sync)

    # graphd, host-staged
    m3 = copy.deepcopy(base)
    xc, yc = x.cpu(), y.cpu()
    opt3 = torch.optim.SGD(m3.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    g3 = graphd.make_graphed_callables(m3, (xc.clone(),), device="cuda:0")
    out["capture_graphd"] = (time.perf_counter() - t0) * 1e3

    def step_graphd():
        opt3.zero_grad(set_to_none=True)
        nn.functional.mse_loss(g3(xc), yc).backward()
        opt3.step()
    out["graphd_host"] = timed(step_graphd, steps, lambda: None)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--shapes", nargs="*", default=["64,512,8", "64,1024,16", "256,4096,8"])
    args = ap.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    print("%-14s %10s %10s %12s %8s %8s %12s %12s %8s" % (
        "(b,w,d)", "eager ms", "graphed ms", "graphd-host", "gd/gr", "gd/eager",
        "capture ms", "gd capture", "ratio"))
    for s in args.shapes:
        b, w, d = (int(v) for v in s.split(","))
        r = bench(b, w, d, args.steps)
        print("%-14s %10.3f %10.3f %12.3f %7.2fx %7.2fx %12.1f %12.1f %7.2fx" % (
            "(%d,%d,%d)" % (b, w, d), r["eager"], r["graphed"], r["graphd_host"],
            r["graphd_host"] / r["graphed"], r["graphd_host"] / r["eager"],
            r["capture_inproc"], r["capture_graphd"], r["capture_graphd"] / r["capture_inproc"]))


if __name__ == "__main__":
    main()
