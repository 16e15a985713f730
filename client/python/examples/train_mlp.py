#!/usr/bin/env python3
"""A plain PyTorch training loop (a small MLP regressing a synthetic target with SGD) whose model
runs through graphd: one line differs from the upstream version.

    GRAPHD_ADDRESS=unix:/path/to/graphd.sock PYTHONPATH=client/python python3 train_mlp.py

Prints the loss every few steps, then `graphctl status` (build/graphctl from the source tree, or
graphctl on PATH) to show the daemon's view: the pool, this session and its graph.

Under torchrun (WORLD_SIZE > 1 in the environment) the same script trains data-parallel: each
rank joins a gloo process group, takes its own shard of the data, graphs the model through its
own graphd session and wraps the graphed model in DistributedDataParallel (graph first, then
wrap); rank 0 prints the loss and the status, which then shows every rank's session:

    torchrun --nproc-per-node 2 train_mlp.py     (or python3 -m torch.distributed.run ...)
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
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun
    rank = 0
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo")  # RANK, MASTER_ADDR, MASTER_PORT: torchrun's
        rank = dist.get_rank()
        x, y = x[rank::world], y[rank::world]  # this rank's shard

    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_hidden),
                          nn.GELU(), nn.Linear(d_hidden, d_out))
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    # model = torch.cuda.make_graphed_callables(model, (x,))
    model = graphd.make_graphed_callables(model, (x,))
    if world > 1:  # after graphing: DDP's all-reduce runs outside the graph
        model = nn.parallel.DistributedDataParallel(model)

    first = last = None
    for step in range(args.steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        last = loss.item()
        first = last if first is None else first
        if rank == 0 and (step % args.every == 0 or step == args.steps - 1):
            print("step %4d  loss %.6f" % (step, last), flush=True)
    if world > 1:
        print("rank %d/%d, graphd session %d: loss %.6f -> %.6f (%s)" % (
            rank, world, graphd.default_client().session_id, first, last,
            "down" if last < first else "NOT down"), flush=True)
        dist.barrier()  # every rank has trained: rank 0's status shows all the sessions
    if rank == 0:
        print("loss %.6f -> %.6f (%s)" % (first, last, "down" if last < first else "NOT down"),
              flush=True)
        show_status()
    if world > 1:
        dist.barrier()  # the other ranks' sessions stay until the status is printed
        dist.destroy_process_group()
    return 0 if last < first else 1


def show_status():
    exe = graphctl()
    if exe:
        print("\n$ graphctl status", flush=True)
        env = dict(os.environ)
        cmd = [exe] + (["--address", env["GRAPHD_ADDRESS"]] if env.get("GRAPHD_ADDRESS") else [])
        subprocess.run(cmd + ["status"], check=False)
    else:
        print("\n(graphctl not found; the daemon's status as JSON:)")
        print(graphd.default_client().status())


if __name__ == "__main__":
    sys.exit(main())
