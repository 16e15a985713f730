"""How to order one process's CUDA work after another's, with no host wait, and what it costs.

graphd's device-resident replays are ordered between the client's stream and the daemon's pool
stream. This probe measures the candidate mechanisms on their own, between two processes, with
the same message pattern as a replay (the client signals, sends a message, gets the answer, and
makes its stream wait): CUDA interprocess events, and stream memory operations
(cuStreamWriteValue32 / cuStreamWaitValue32 on a word of device memory shared by CUDA IPC).
The "server" process replays a trivial CUDA graph (y = x * 2) between its wait and its signal;
"pipe only" is the same message exchange with no CUDA call, the floor.

Per mechanism it prints the round trip as the client sees it (p50/p99, µs) and the mean cost of
each CUDA call on both sides, and it checks the ordering: every 50th iteration the client queues
a ~1 ms kernel before writing x, so a server that did not wait would read a stale x.

Usage (GPU machine): python3 bench/ordering_probe.py [--iters 5000]
"""
import argparse
import ctypes
import time

import torch
import torch.multiprocessing as mp  # its reductions send CUDA tensors by CUDA IPC

GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ


def _driver():
    cu = ctypes.CDLL("libcuda.so.1")

    def fn(*names):
        for n in names:
            try:
                f = getattr(cu, n)
            except AttributeError:
                continue
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            return f
        raise RuntimeError("libcuda lacks %s" % (names,))
    return (fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32"),
            fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32"))


def _check(rc, what):
    if rc != 0:
        raise RuntimeError("%s: CUresult %d" % (what, rc))


class Costs:
    def __init__(self):
        self.ns = {}

    def add(self, name, t0):
        t = time.perf_counter_ns()
        s = self.ns.setdefault(name, [0, 0])
        s[0] += t - t0
        s[1] += 1
        return t

    def means(self):
        return {k: v[0] / v[1] / 1e3 for k, v in self.ns.items()}


def _doubling_graph(x):
    """A stream of its own and a CUDA graph, captured on it, of y = x * 2 (y preallocated)."""
    stream = torch.cuda.Stream()
    y = torch.empty_like(x)
    with torch.cuda.stream(stream):
        torch.mul(x, 2, out=y)
    stream.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        torch.mul(x, 2, out=y)
    return stream, g, y


def server(conn, mode):
    torch.cuda.set_device(0)
    write, wait = _driver()
    x, flags, ready_handle = conn.recv()  # CUDA tensors arrive through torch's IPC reductions
    stream, g, y = _doubling_graph(x)
    done = torch.cuda.Event(interprocess=True)
    ready = torch.cuda.Event.from_ipc_handle(0, ready_handle) if mode == "events" else None
    conn.send((y, done.ipc_handle() if mode == "events" else None))
    costs = Costs()
    sp = stream.cuda_stream
    torch.cuda.set_stream(stream)  # CUDAGraph.replay launches on the current stream
    while True:
        msg = conn.recv_bytes()
        if msg == b"q":
            break
        seq = int.from_bytes(msg, "little")
        t = time.perf_counter_ns()
        if mode == "events":
            stream.wait_event(ready)
            t = costs.add("server wait_event", t)
        elif mode == "values":
            _check(wait(sp, flags.data_ptr(), seq, GEQ), "cuStreamWaitValue32")
            t = costs.add("server waitValue32", t)
        if mode != "pipe":
            g.replay()
            t = costs.add("server graph launch", t)
        if mode == "events":
            done.record(stream)
            t = costs.add("server record", t)
        elif mode == "values":
            _check(write(sp, flags.data_ptr() + 4, seq, 0), "cuStreamWriteValue32")
            t = costs.add("server writeValue32", t)
        conn.send_bytes(b"k")
    stream.synchronize()
    conn.send(costs.means())


def _local_server(x):
    """The server's side in this process (mode "local"): its own stream, ordinary events."""
    return _doubling_graph(x) + (torch.cuda.Event(), torch.cuda.Event())


def client(mode, iters, sync):
    """sync: the round trip includes a synchronize of the client's stream after the wait (the
    whole chain on the GPU), else it is what the host pays to queue it."""
    write, wait = _driver()
    x = torch.zeros(4, device="cuda")
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")  # [ready seq, done seq]
    stream = torch.cuda.current_stream()
    sp = stream.cuda_stream
    if mode == "local":
        lstream, g, y, ready, done = _local_server(x)
    else:
        ctx = mp.get_context("spawn")
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=server, args=(theirs, mode))
        p.start()
        ready = torch.cuda.Event(interprocess=True)
        mine.send((x, flags, ready.ipc_handle()))
        y, done_handle = mine.recv()
        done = torch.cuda.Event.from_ipc_handle(0, done_handle) if mode == "events" else None
    costs = Costs()
    times, bad = [], 0
    for it in range(1, iters + 1):
        check = it % 50 == 0
        if check:
            torch.cuda._sleep(2_000_000)  # ~1 ms: the write below lands late
        x.fill_(float(it))
        t0 = t = time.perf_counter_ns()
        if mode in ("events", "local"):
            ready.record(stream)
            t = costs.add("client record", t)
        elif mode == "values":
            _check(write(sp, flags.data_ptr(), it, 0), "cuStreamWriteValue32")
            t = costs.add("client writeValue32", t)
        if mode == "local":
            lstream.wait_event(ready)
            with torch.cuda.stream(lstream):
                g.replay()
            done.record(lstream)
            t = costs.add("local wait, launch, record", t)
        else:
            mine.send_bytes(it.to_bytes(8, "little"))
            mine.recv_bytes()
            t = costs.add("client message round trip", t)
        if mode in ("events", "local"):
            stream.wait_event(done)
            t = costs.add("client wait_event", t)
        elif mode == "values":
            _check(wait(sp, flags.data_ptr() + 4, it, GEQ), "cuStreamWaitValue32")
            t = costs.add("client waitValue32", t)
        if sync:
            stream.synchronize()
            t = costs.add("client synchronize", t)
        if not check:
            times.append(t - t0)
        elif mode != "pipe" and y[0].item() != 2.0 * it:  # .item() syncs the current stream
            bad += 1
    server_costs = {}
    if mode != "local":
        mine.send_bytes(b"q")
        server_costs = mine.recv()
        p.join()
    times.sort()
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))] / 1e3  # noqa: E731
    checked = iters // 50 if mode != "pipe" else 0
    print("%-7s %-6s round trip p50 %8.2f µs  p99 %8.2f µs   ordering: %d of %d checks wrong" %
          (mode, "+sync" if sync else "", q(0.5), q(0.99), bad, checked))
    for k, v in sorted({**costs.means(), **server_costs}.items()):
        print("          %-28s %8.2f µs" % (k, v))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--modes", default="local,pipe,events,values")
    args = ap.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    for sync in (False, True):
        for mode in args.modes.split(","):
            client(mode, args.iters, sync)


if __name__ == "__main__":
    main()
