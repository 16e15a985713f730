#!/usr/bin/env python3
"""How fast this host runs the kinds of work a replay call is made of, so that figures taken on
two machines (the 2-core CPU machine, the GPU machine) can be read against each other: the
host's facts (CPU model, threads per core, clock source, load), then nanoseconds per operation of
plain Python calls, a clock read, a lock, ctypes calls into libc (GIL released, and kept) and,
where torch sees a GPU, the torch calls a device-resident step makes around its replays (the raw
current stream, a tiny copy_ launch, CUDAGraph.replay of a one-kernel graph, and the same
launches into memory of another process mapped through CUDA IPC).

Nothing here touches graphd: it answers whether a Python layer that costs 1 us on one machine
and 10 us on another is graphd's doing or the host's (docs/BENCHMARKS.md, "Step profile").

Usage: python3 bench/host_probe.py [--json out.json]
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import statistics
import sys
import threading
import time
import timeit


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_facts():
    facts = {"python": platform.python_version(), "cpus": os.cpu_count(),
             "affinity": len(os.sched_getaffinity(0)),
             "clocksource": read("/sys/devices/system/clocksource/clocksource0/"
                                 "current_clocksource"),
             "governor": read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
             "load": os.getloadavg()}
    info = read("/proc/cpuinfo") or ""
    for line in info.splitlines():
        if line.startswith("model name"):
            facts["model"] = line.split(":", 1)[1].strip()
            break
    sib = read("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    facts["cpu0_siblings"] = sib
    quota = read("/sys/fs/cgroup/cpu.max")
    facts["cgroup_cpu_max"] = quota
    return facts


def per_op_ns(stmt, number, repeat=7):
    """Median over repeat of (time of number calls) / number, in ns."""
    t = timeit.Timer(stmt)
    return statistics.median(t.repeat(repeat=repeat, number=number)) / number * 1e9


def probes():
    rows = []

    def f():
        pass

    class Obj:
        def m(self):
            pass

    o = Obj()
    lock = threading.Lock()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc_kept = ctypes.PyDLL(ctypes.util.find_library("c"))
    labs, labs_kept = libc.labs, libc_kept.labs
    labs.argtypes = labs_kept.argtypes = [ctypes.c_long]
    labs.restype = labs_kept.restype = ctypes.c_long
    out = ctypes.c_uint64(0)
    ref = ctypes.byref(out)
    memset = libc.memset

    def with_lock():
        with lock:
            pass

    n = 200000
    rows.append(("lambda: None call", per_op_ns(lambda: None, n)))
    rows.append(("Python function call", per_op_ns(f, n)))
    rows.append(("method call", per_op_ns(o.m, n)))
    rows.append(("time.perf_counter_ns()", per_op_ns(time.perf_counter_ns, n)))
    rows.append(("with threading.Lock()", per_op_ns(with_lock, n)))
    rows.append(("ctypes labs(1), GIL released", per_op_ns(lambda: labs(1), n)))
    rows.append(("ctypes labs(1), GIL kept (PyDLL)", per_op_ns(lambda: labs_kept(1), n)))
    rows.append(("ctypes memset(byref(c_uint64), 0, 8)", per_op_ns(
        lambda: memset(ref, 0, 8), n)))
    rows.append(("os.getppid() (a system call)", per_op_ns(os.getppid, n)))
    return rows


def torch_probes():
    try:
        import torch
    except ImportError:
        return None, []
    rows = []
    p = torch.nn.Parameter(torch.zeros(4))
    rows.append(("param.grad (None)", per_op_ns(lambda: p.grad, 100000)))
    t = torch.zeros(4)
    rows.append(("CPU tensor.detach()", per_op_ns(t.detach, 100000)))
    if not torch.cuda.is_available():
        return torch.__version__, rows
    dev = torch.device("cuda:0")
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        rows.append(("torch._C._cuda_getCurrentRawStream(0)", per_op_ns(lambda: raw(0), 100000)))
    rows.append(("torch.cuda.current_stream()", per_op_ns(torch.cuda.current_stream, 20000)))
    a, b = torch.zeros(4, device=dev), torch.ones(4, device=dev)
    a.copy_(b)
    torch.cuda.synchronize()
    rows.append(("CUDA a.copy_(b), float32[4] (launch only)", per_op_ns(lambda: a.copy_(b),
                                                                       2000)))
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = a * 2
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = a * 2
    torch.cuda.synchronize()
    rows.append(("CUDAGraph.replay(), one kernel (launch only)", per_op_ns(g.replay, 2000)))
    torch.cuda.synchronize()

    def replay_sync():
        g.replay()
        torch.cuda.current_stream().synchronize()
    rows.append(("CUDAGraph.replay() + synchronize", per_op_ns(replay_sync, 2000)))
    del y
    rows += ipc_probes(torch, dev, a, b)
    return torch.__version__ + " (" + torch.cuda.get_device_name(0) + ")", rows


def _ipc_owner(q, done):
    """Child of ipc_probes: allocates a float32[4] on cuda:0 and shares it (CUDA IPC)."""
    import torch
    t = torch.zeros(4, device="cuda:0")
    q.put(t)
    done.wait()


def ipc_probes(torch, dev, local, src):
    """The same launches into memory another process allocated (CUDA IPC, as a device-resident
    graph's static tensors are to its client) and into this process's own."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_ipc_owner, args=(q, done))
    p.start()
    rows = []
    try:
        remote = q.get(timeout=60)
        for name, dst in (("own memory", local), ("CUDA IPC memory", remote)):
            dst.copy_(src)
            torch.cuda.synchronize()
            rows.append(("CUDA dst.copy_(src) into %s" % name,
                         per_op_ns(lambda: dst.copy_(src), 2000)))
            torch.cuda.synchronize()
            rows.append(("CUDA dst.mul_(2) on %s" % name, per_op_ns(lambda: dst.mul_(2), 2000)))
            torch.cuda.synchronize()
            di, si = dst.view(torch.int32), src.view(torch.int32)
            rows.append(("CUDA bitwise_or(src, 0, out=dst) into %s" % name,
                         per_op_ns(lambda: torch.bitwise_or(si, 0, out=di), 2000)))
            torch.cuda.synchronize()
        del remote
    finally:
        done.set()
        p.join(30)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    facts = cpu_facts()
    for k, v in facts.items():
        print("%-16s %s" % (k, v))
    rows = probes()
    tv, trows = torch_probes()
    if tv:
        print("%-16s %s" % ("torch", tv))
    print("%-48s %10s" % ("operation", "ns/op"))
    for name, ns in rows + trows:
        print("%-48s %10.1f" % (name, ns))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"facts": facts, "torch": tv, "ns": dict(rows + trows)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
