#!/usr/bin/env python3
"""CUDA training-step benchmark (issue 5, partial): eager PyTorch, in-process
torch.cuda.make_graphed_callables, and graphd's CUDA family host-staged, called in-process from C
(build/bench/train_cuda_graphd: graph_runtime linked into the process, no daemon).

One step = forward, MSE loss, backward, SGD step. MLP (batch, width, depth): depth Linear(width,
width) layers with ReLU between them, float32. Each figure is the mean over --steps steps after 20
warm-up steps, with torch.cuda.synchronize() around the timed loop. Prints one line per method and
the ratios, per shape.

Usage: python3 bench/train_cuda.py [--graphd build/bench/train_cuda_graphd] [--steps 200]
"""
import argparse
import copy
import os
import re
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F
from bench_models import mlp  # bench/, the script's own folder

SHAPES = [(64, 512, 8), (64, 1024, 16)]
WARM = 20


def time_steps(step, steps):
    for _ in range(WARM):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def train_step(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphd", default="build/bench/train_cuda_graphd")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    tmp = tempfile.mkdtemp(prefix="graphd-bench-")
    for batch, width, depth in SHAPES:
        torch.manual_seed(0)
        base = mlp(width, depth)
        x_cpu = torch.randn(batch, width)
        path = os.path.join(tmp, "mlp_%d_%d_%d.pt" % (batch, width, depth))
        torch.jit.trace(base, (x_cpu,)).save(path)
        x = x_cpu.to(dev)
        y = torch.randn(batch, width, device=dev)

        eager = copy.deepcopy(base).to(dev)
        t_eager = time_steps(train_step(eager, torch.optim.SGD(eager.parameters(), lr=1e-3), x, y),
                             args.steps)

        graphed = copy.deepcopy(base).to(dev)
        t0 = time.perf_counter()
        g = torch.cuda.make_graphed_callables(graphed, (x,))
        t_cap = (time.perf_counter() - t0) * 1e3
        t_graphed = time_steps(train_step(g, torch.optim.SGD(graphed.parameters(), lr=1e-3), x, y),
                               args.steps)

        t_gd = replay_gd = cap_gd = None
        if os.path.exists(args.graphd):
            r = subprocess.run([args.graphd, path, str(batch), str(width), str(args.steps)],
                               capture_output=True, text=True)
            line = r.stdout.strip()
            m = re.search(r"step_ms=([\d.]+) replay_ms=([\d.]+) capture_ms=([\d.]+)", line)
            if m:
                t_gd, replay_gd, cap_gd = (float(v) for v in m.groups())
            else:
                print("  graphd bench failed (rc %d): %s %s" % (r.returncode, line,
                                                               r.stderr.strip()[-800:]))
            print("  " + line)
        print("MLP (%d, %d, %d):" % (batch, width, depth))
        print("  eager                     %8.4f ms/step" % t_eager)
        print("  make_graphed_callables    %8.4f ms/step   (capture %.1f ms)" % (t_graphed, t_cap))
        if t_gd is not None:
            print("  graphd host-staged (C)    %8.4f ms/step   (fwd+bwd replay %.4f ms, capture "
                  "%.1f ms)" % (t_gd, replay_gd, cap_gd))
            print("  ratios: graphed/eager %.3f  graphd-hs/graphed %.3f  graphd-hs/eager %.3f  "
                  "capture graphd/graphed %.2f" % (t_graphed / t_eager, t_gd / t_graphed,
                                                   t_gd / t_eager, cap_gd / t_cap))
        else:
            print("  ratios: graphed/eager %.3f" % (t_graphed / t_eager))


if __name__ == "__main__":
    main()
