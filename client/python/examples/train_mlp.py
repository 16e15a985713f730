#!/usr/bin/env python3
"""A plain PyTorch training loop (a small MLP regressing a synthetic target with SGD) whose model
runs through graphd: one line differs from the upstream version.

    GRAPHD_ADDRESS=unix:/path/to/graphd.sock PYTHONPATH=client/python python3 train_mlp.py

Prints the loss every few steps, then `graphctl status` (build/graphctl from the source tree, or
graphctl on PATH) to show the daemon's view: the pool, this session and its graph.
"""
import argparse
import os
import shutil
import subprocess
import sys

import torch
import torch.nn as nn

import graphd


def graphctl():
    """build/graphctl when run from the source tree, else graphctl on PATH, else None."""
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.environ.get("GRAPHD_BUILD") or os.path.join(here, "..", "..", "..", "build")
    exe = os.path.join(build, "graphctl")
    return exe if os.access(exe, os.X_OK) else shutil.which("graphctl")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20, help="print the loss every N steps")
    args = ap.parse_args()

    torch.manual_seed(0)
    n, d_in, d_hidden, d_out = 256, 16, 64, 4
    x = torch.randn(n, d_in)
    w_true = torch.randn(d_in, d_out)
    y = torch.tanh(x @ w_true) + 0.05 * torch.randn(n, d_out)

    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_hidden),
                          nn.GELU(), nn.Linear(d_hidden, d_out))
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    # model = torch.cuda.make_graphed_callables(model, (x,))
    model = graphd.make_graphed_callables(model, (x,))

    first = last = None
    for step in range(args.steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        last = loss.item()
        first = last if first is None else first
        if step % args.every == 0 or step == args.steps - 1:
            print("step %4d  loss %.6f" % (step, last), flush=True)
    print("loss %.6f -> %.6f (%s)" % (first, last, "down" if last < first else "NOT down"),
          flush=True)

    exe = graphctl()
    if exe:
        print("\n$ graphctl status", flush=True)
        env = dict(os.environ)
        cmd = [exe] + (["--address", env["GRAPHD_ADDRESS"]] if env.get("GRAPHD_ADDRESS") else [])
        subprocess.run(cmd + ["status"], check=False)
    else:
        print("\n(graphctl not found; the daemon's status as JSON:)")
        print(graphd.default_client().status())
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
