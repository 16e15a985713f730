#!/usr/bin/env python3
"""DistributedDataParallel over graphd on one GPU (issue 17): 2 ranks, gloo over CUDA tensors,
each rank a device-resident session on cuda:0, against eager DDP on the same GPU.

Runs tests/python/ddp_worker.py as 2 ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as
torchrun sets them) with --device cuda:0: every scenario trains the worker's MLP for --steps
steps under DDP, eagerly and graphed (graph first, then wrap; the static tensors are the daemon's
device memory, mapped with CUDA IPC), each rank with its own data. Prints, per scenario and rank,
the largest relative difference of the losses and of the final parameters and buffers (the
BatchNorm scenario's running stats) from the eager run, and whether the two ranks' graphed
parameters are identical; "parity ok" when every difference is within --rtol (default 1e-5, the
CPU tests' bound) and the replicas agree. Exit status 0 then.

The script starts its own daemon (build/graphd, --config /dev/null, on a socket in a temporary
directory), unless --address (or $GRAPHD_ADDRESS) names a running one.

Usage (GPU machine, repository root, build/graphd built with `make TORCH=python PYTHON=python3`):
  PYTHONPATH=client/python python3 bench/ddp_gpu.py
Smoke test without a GPU (graphd's cpu:0 device, the same orchestration):
  PYTHONPATH=client/python /usr/bin/python3 bench/ddp_gpu.py --device cpu
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "python" / "ddp_worker.py"
SCENARIOS = "plain,no_sync,find_unused,static_graph,bucket_view,buffers"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(tmp):
    from gd_daemon import wait_until_answering  # bench/, the script's own folder
    build = Path(os.environ.get("GRAPHD_BUILD") or REPO / "build")
    address = "unix:%s" % (Path(tmp) / "graphd.sock")
    log = open(Path(tmp) / "graphd.log", "w")
    proc = subprocess.Popen([str(build / "graphd"), "--config", "/dev/null", "--listen", address],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    why = wait_until_answering(proc, address)
    if why:
        proc.kill()
        sys.exit("%s:\n%s" % (why, (Path(tmp) / "graphd.log").read_text()))
    return proc, address


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--scenarios", default=SCENARIOS)
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--address", default=os.environ.get("GRAPHD_ADDRESS"),
                    help="a running daemon (default: start build/graphd)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds for the whole run")
    args = ap.parse_args()
    from gd_daemon import client_on_path  # bench/, the script's own folder
    print("ddp_gpu: client package from %s" % client_on_path(), flush=True)

    import torch
    with tempfile.TemporaryDirectory() as tmp:
        daemon = None
        address = args.address
        if not address:
            daemon, address = start_daemon(tmp)
        try:
            port = free_port()
            procs = []
            for rank in range(2):
                env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           GRAPHD_ADDRESS=address)
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (env.get("PYTHONPATH"), str(WORKER.parent)) if p)
                procs.append(subprocess.Popen(
                    [sys.executable, str(WORKER), "--device", args.device, "--steps",
                     str(args.steps), "--scenarios", args.scenarios, "--out",
                     str(Path(tmp) / "rank{rank}.pt")], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True))
            outs = []
            for p in procs:
                try:
                    outs.append(p.communicate(timeout=args.timeout)[0])
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    sys.exit("a rank did not finish within %d s" % args.timeout)
            for rank, (p, out) in enumerate(zip(procs, outs)):
                if p.returncode != 0:
                    sys.exit("rank %d exited with %s:\n%s" % (rank, p.returncode, out))
            res = [torch.load(Path(tmp) / ("rank%d.pt" % r)) for r in range(2)]
        finally:
            if daemon is not None:
                os.killpg(daemon.pid, signal.SIGTERM)
                daemon.wait(timeout=30)

    print("torch %s, device %s, 2 ranks (gloo), %d steps" % (torch.__version__, args.device,
                                                              args.steps))
    print("%-22s %4s  %12s  %12s  %s" % ("scenario", "rank", "loss rel", "param/buf rel",
                                         "replicas identical"))
    ok = True
    for sc in args.scenarios.split(","):
        same = all(torch.equal(res[0][sc]["graphd"]["params"][n], res[1][sc]["graphd"]["params"][n])
                   for n in res[0][sc]["graphd"]["params"])
        ok &= same
        for rank in range(2):
            e, g = res[rank][sc]["eager"], res[rank][sc]["graphd"]
            lr = rel(torch.tensor(g["losses"]), torch.tensor(e["losses"]))
            pr = max([rel(g["params"][n], e["params"][n]) for n in e["params"]]
                     + [rel(g["buffers"][n].double(), e["buffers"][n].double())
                        for n in e.get("buffers", ())])
            ok &= lr <= args.rtol and pr <= args.rtol and g["grad_none"] == e["grad_none"]
            print("%-22s %4d  %12.3e  %12.3e  %s" % (sc, rank, lr, pr, "yes" if same else "NO"))
    print("parity %s (rtol %g)" % ("ok" if ok else "FAILED", args.rtol))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
