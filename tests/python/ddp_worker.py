#!/usr/bin/env python3
"""One rank of the DistributedDataParallel tests (test_ddp.py) and of bench/ddp_gpu.py.

Reads the environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), joins a gloo
process group and, for each scenario asked for, trains the same MLP for --steps steps twice under
DDP: once eager, once graphed by graphd.make_graphed_callables (graph first, then wrap). Each rank
draws its own data (seeded by rank and step). Writes to --out (torch.save) a dict

    {scenario: {"eager": run, "graphd": run}}, run = {"losses": [float], "params": {name:
    tensor}, "grad_none": [names of parameters whose .grad is None at the end]}

and prints "session <id> <pid>" once graphd has a session, "step <scenario> <k>" each step.
--die-at K: this rank SIGKILLs itself after the forward of graphd step K of the first scenario,
with its graphs and regions held in the daemon. A torch.distributed error in a rank is printed as
"dist-error <type> <message>" and exits 3.
"""
import argparse
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import graphd

# name: (find_unused_parameters, static_graph, micro-batches per step (no_sync for all but the
# last), a parameter the forward never uses, gradient_as_bucket_view)
SCENARIOS = {
    "plain": (False, False, 1, False, False),
    "no_sync": (False, False, 3, False, False),
    "find_unused": (True, False, 1, True, False),
    "find_unused_all_used": (True, False, 1, False, False),
    "static_graph": (False, True, 1, True, False),
    "no_sync_find_unused": (True, False, 3, True, False),
    "bucket_view": (False, False, 2, False, True),
    # DDP first, then make_graphed_callables(ddp): graphd warns and graphs ddp.module
    "graph_the_wrapper": (False, False, 1, False, False),
    # a never-called parameter without find_unused_parameters: eager DDP raises at the second
    # step; recorded as {"error": message, "step": k}, to be the same for graphd
    "unused_no_find": (False, False, 1, True, False),
    # BatchNorm: DDP broadcasts rank 0's buffers before each forward, into graphd's static ones
    "buffers": (False, False, 1, False, False),
}
WITH_BATCHNORM = {"buffers"}

D_IN, D_HIDDEN, D_OUT, BATCH = 8, 16, 4, 16


class MLP(nn.Module):
    def __init__(self, unused, batchnorm=False):
        super().__init__()
        self.l1 = nn.Linear(D_IN, D_HIDDEN)
        self.bn = nn.BatchNorm1d(D_HIDDEN) if batchnorm else nn.Identity()
        self.l2 = nn.Linear(D_HIDDEN, D_HIDDEN)
        self.l3 = nn.Linear(D_HIDDEN, D_OUT)
        # never called: its gradient is None (eager) or absent (graphd)
        self.spare = nn.Linear(D_HIDDEN, D_OUT) if unused else None

    def forward(self, x):
        return self.l3(torch.tanh(self.l2(torch.tanh(self.bn(self.l1(x))))))


def batch(rank, step, micro, device):
    g = torch.Generator().manual_seed(100003 * (rank + 1) + 101 * step + micro)
    x = torch.randn(BATCH, D_IN, generator=g)
    w = torch.linspace(-1, 1, D_IN * D_OUT).reshape(D_IN, D_OUT)
    y = torch.sin(x @ w) + 0.01 * torch.randn(BATCH, D_OUT, generator=g)
    return x.to(device), y.to(device)


def train(mode, scenario, a, rank, device, on_forward=None):
    find_unused, static_graph, micro, unused, bucket_view = SCENARIOS[scenario]
    torch.manual_seed(1234 + rank)  # different on each rank: DDP's broadcast makes them equal
    model = MLP(unused, scenario in WITH_BATCHNORM).to(device)
    ddp_kw = dict(find_unused_parameters=find_unused, static_graph=static_graph,
                  gradient_as_bucket_view=bucket_view)
    sample = torch.randn(BATCH, D_IN, device=device)
    # a named pool (made by the first rank that asks), shared by the ranks on one daemon
    graph_kw = {"pool": graphd.graph_pool_handle(a.pool)} if a.pool else {}
    # as upstream: a parameter the graph does not use needs allow_unused_input=True
    graph_kw["allow_unused_input"] = unused
    if mode == "eager":
        # what make_graphed_callables' warm-up (num_warmup_iters=3) does to the buffers, as
        # upstream's: three forwards on the sample args
        with torch.random.fork_rng(devices=[]):
            for _ in range(3 if scenario in WITH_BATCHNORM else 0):
                model(sample)
        ddp = DDP(model, **ddp_kw)
    elif scenario == "graph_the_wrapper":  # graphd warns, graphs ddp.module, returns the DDP
        ddp = graphd.make_graphed_callables(DDP(model, **ddp_kw), (sample,), **graph_kw)
    else:  # upstream's order: graph, then wrap
        ddp = DDP(graphd.make_graphed_callables(model, (sample,), **graph_kw), **ddp_kw)
    if mode == "graphd" and a.first_session:
        a.first_session = False
        print("session %d %d" % (graphd.default_client().session_id, os.getpid()), flush=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    losses = []
    if scenario == "unused_no_find":
        try:
            for step in range(a.steps):
                opt.zero_grad()
                x, y = batch(rank, step, 0, device)
                loss_fn(ddp(x), y).backward()
                opt.step()
        except RuntimeError as e:
            return {"error": str(e), "step": step}
        return {"error": None, "step": a.steps}
    for step in range(a.steps):
        opt.zero_grad()
        total = 0.0
        for m in range(micro):
            x, y = batch(rank, step, m, device)
            if m < micro - 1:
                with ddp.no_sync():
                    loss = loss_fn(ddp(x), y) / micro
                    loss.backward()
            else:
                loss = loss_fn(ddp(x), y) / micro
                if on_forward is not None:
                    on_forward(step)
                loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
        print("step %s %s %d" % (scenario, mode, step), flush=True)
    params = {n: p.detach().cpu().clone() for n, p in ddp.module.named_parameters()}
    buffers = {n: b.detach().cpu().clone() for n, b in ddp.module.named_buffers()}
    grad_none = sorted(n for n, p in ddp.module.named_parameters() if p.grad is None)
    return {"losses": losses, "params": params, "buffers": buffers, "grad_none": grad_none}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="plain")
    ap.add_argument("--modes", default="eager,graphd")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", required=True, help="a file name; {rank} is replaced")
    ap.add_argument("--pool", help="a graphd pool name (default: the daemon's default pool)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda:N (device-resident)")
    ap.add_argument("--timeout", type=float, default=20, help="gloo timeout, seconds")
    ap.add_argument("--die-at", type=int, default=-1)
    ap.add_argument("--die-rank", type=int, default=1)
    a = ap.parse_args()
    a.first_session = True
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank = dist.get_rank()
    device = torch.device(a.device)

    def die(step):
        if rank == a.die_rank and step == a.die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    results = {}
    try:
        for i, scenario in enumerate(a.scenarios.split(",")):
            results[scenario] = {}
            for mode in a.modes.split(","):
                hook = die if (i == 0 and mode == "graphd" and a.die_at >= 0) else None
                results[scenario][mode] = train(mode, scenario, a, rank, device, hook)
    except graphd.GraphdError:
        raise
    except RuntimeError as e:  # gloo's errors are RuntimeErrors
        print("dist-error %s %s" % (type(e).__name__, str(e).replace("\n", " | ")), flush=True)
        return 3
    torch.save(results, a.out.replace("{rank}", str(rank)))
    dist.destroy_process_group()
    print("done %d" % rank, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
