#!/usr/bin/env python3
"""Where a device-resident training step's time goes, next to in-process
torch.cuda.make_graphed_callables (issue 5, benchmark 1's profile).

For one MLP (batch, width, depth) it runs the same step (zero_grad, forward, MSE loss, backward,
SGD step) both ways and prints:
- the host time of each phase (time.perf_counter_ns around it, no synchronisation), and the
  step's wall time over many steps, the two steps measured in alternated chunks: when the
  phases add up to the wall time the step is bound by the host (Python, autograd, launches),
  else by the GPU;
- the step's latency on the device (synchronised after each step);
- the device time between the phase boundaries (CUDA events on the current stream), where the
  GPU's time went, including its waits for the daemon's stream;
- the functions that take the most host time (cProfile, tottime) in graphd's step.

Usage (GPU machine, a graphd running): GRAPHD_ADDRESS=unix:/path python3 bench/step_profile.py
       [--shape 64,512,8] [--steps 300]
"""
import argparse
import copy
import cProfile
import ctypes
import io
import pstats
import time

import torch
import torch.nn as nn

import graphd
from bench_models import PHASES, mlp, synced_steps, timed_step  # bench/, the script's folder


def phases(modes, x, y, steps, chunks=6, sync=None):
    """For each (name, model, opt) of modes: the mean host µs of each phase, the mean wall ms of
    a step over many steps, the synchronised step's ms, and the mean host µs of each phase when
    every step is synchronised (where the host no longer waits in a launch for the device to
    drain its queue). The modes are measured in `chunks` alternated chunks, the order reversed
    every other chunk, each chunk steps // chunks steps unsynchronised, then a third as many
    synchronised: a host whose speed moves during the run moves every mode's figures alike
    (one mode after the other, as before, the eighteenth and twenty-second sessions' runs could
    not tell a slower step from a slower host). Returns {name: (acc, wall, synced, acc_synced)}."""
    sync = torch.cuda.synchronize if sync is None else sync
    clock = time.perf_counter_ns
    per = max(1, steps // chunks)
    per_synced = max(1, steps // 3 // chunks)
    got = {name: {"acc": [0] * len(PHASES), "wall": 0, "acc_synced": [0] * len(PHASES),
                  "synced": 0} for name, _, _ in modes}
    for _, model, opt in modes:
        for _ in range(20):
            timed_step(model, opt, x, y, [0] * len(PHASES))
    sync()
    for k in range(chunks):
        for name, model, opt in modes if k % 2 == 0 else modes[::-1]:
            g = got[name]
            t0 = clock()
            for _ in range(per):
                timed_step(model, opt, x, y, g["acc"])
            sync()
            g["wall"] += clock() - t0
            t0 = clock()
            synced_steps(model, opt, x, y, per_synced, sync, g["acc_synced"])
            g["synced"] += clock() - t0
    n, n_synced = per * chunks, per_synced * chunks
    return {name: ({k: v / n / 1e3 for k, v in zip(PHASES, g["acc"])},
                   g["wall"] / n / 1e6, g["synced"] / n_synced / 1e6,
                   {k: v / n_synced / 1e3 for k, v in zip(PHASES, g["acc_synced"])})
            for name, g in got.items()}


def device_phases(model, opt, x, y, steps):
    """Mean device µs between the phase boundaries of a step, from CUDA events recorded on the
    current stream at each boundary (the event pairs are read after the last step, so nothing
    waits in between): where the GPU's time per step went, next to the host's (phases()). For
    graphd the forward and backward include the ordering waits on the daemon's stream (the
    client's stream waits for done); a gap that the host figures do not show is the GPU waiting
    for the daemon."""
    names = PHASES
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    marks = []
    for _ in range(steps):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(names) + 1)]
        ev[0].record()
        opt.zero_grad(set_to_none=True)
        ev[1].record()
        out = model(x)
        ev[2].record()
        loss = nn.functional.mse_loss(out, y)
        ev[3].record()
        loss.backward()
        ev[4].record()
        opt.step()
        ev[5].record()
        marks.append(ev)
    torch.cuda.synchronize()
    acc = dict.fromkeys(names, 0.0)
    for ev in marks:
        for k, name in enumerate(names):
            acc[name] += ev[k].elapsed_time(ev[k + 1]) * 1e3
    return {k: v / steps for k, v in acc.items()}


def replays(g1, o1, g2, o2, x, y, steps):
    """Host µs of each replay call inside the step (p50 over the steps): the in-process
    CUDAGraph.replay() against graphd's ordered replay, and the daemon's own launch time for it
    (what the daemon reports: its stream wait, graph launch and event record; 0 for posted
    replays, which the daemon does not answer). The difference is the messaging, the client's
    event or counter calls and the daemon's wake-up."""
    from graphd import client as gclient
    clock = time.perf_counter_ns
    rec = {}

    def timed(owner, name, key_of):
        orig = getattr(owner, name)

        def wrapper(*a, **kw):
            t0 = clock()
            r = orig(*a, **kw)
            rec.setdefault(key_of(a), []).append((clock() - t0, r))
            return r
        setattr(owner, name, wrapper)
        return orig
    fwd = graphd._lib.PHASE_FORWARD
    from graphd import graphs as ggraphs

    variant = [""]  # the run's: "" (libgraphd as graphd loads it) or ", GIL kept"

    def phase_key(layer, phase):
        return "graphd %s %s%s" % ("forward" if phase == fwd else "backward", layer, variant[0])
    orig_cuda = timed(torch.cuda.CUDAGraph, "replay", lambda a: "in-process")
    # The layers of graphd's replay, outermost first, each timed around the one inside it:
    # _Runner.replay (protect, recovery), Client._replay (lock, ctypes arguments), the ctypes
    # call of graphd_replay_stream (GIL release, conversion, the C call; GRAPHD_REPLAY_PROFILE
    # times the C call from inside).
    orig_runner = timed(ggraphs._Runner, "replay", lambda a: phase_key("1 _Runner.replay", a[1]))
    orig_gd = timed(gclient.Client, "_replay", lambda a: phase_key("2 Client._replay", a[2]))
    # A client from 2026-12-06 calls Client._post (the stream branch alone) from _Runner.replay;
    # one since 4dfb1ed carries _post's body in _Runner.replay, so that row is then absent.
    orig_post = (timed(gclient.Client, "_post", lambda a: phase_key("2 Client._post", a[2]))
                 if hasattr(gclient.Client, "_post") else None)
    lib = graphd._lib.lib()
    client = g2._graphd_runner.graph._client  # it calls its own reference to the C function
    orig_c = client._c_replay_stream
    # The same C function through ctypes.PyDLL, which keeps the GIL across the call: the
    # difference between the two is what releasing and taking back the GIL costs in a step.
    held = ctypes.PyDLL(lib._name).graphd_replay_stream
    held.argtypes, held.restype = orig_c.argtypes, orig_c.restype

    def c_call_of(fn, layer):
        def c_call(*a):
            t0 = clock()
            r = fn(*a)
            rec.setdefault(phase_key(layer, a[1]), []).append((clock() - t0, None))
            return r
        return c_call
    runs = ((g1, o1, None, ""), (g2, o2, c_call_of(orig_c, "3 ctypes call"), ""),
            (g2, o2, c_call_of(held, "3 ctypes call"), ", GIL kept (PyDLL)"))
    try:
        for g, o, c_call, name in runs:
            variant[0] = name
            if c_call is not None:
                client._c_replay_stream = c_call
            for _ in range(steps):
                o.zero_grad(set_to_none=True)
                nn.functional.mse_loss(g(x), y).backward()
                o.step()
            torch.cuda.synchronize()
    finally:
        torch.cuda.CUDAGraph.replay = orig_cuda
        gclient.Client._replay = orig_gd
        if orig_post is not None:
            gclient.Client._post = orig_post
        ggraphs._Runner.replay = orig_runner
        client._c_replay_stream = orig_c

    def p50(v):
        return sorted(v)[len(v) // 2] / 1e3
    print("replay calls, host µs p50                       calls   call µs   daemon launch µs")
    for key, v in sorted(rec.items()):
        daemon = [r for _, r in v if isinstance(r, int)]
        print("%-48s %6d %9.1f %18s" % (key, len(v), p50([t for t, _ in v]),
                                        "%.1f" % p50(daemon) if daemon else "-"))


def forward_parts(g1, g2, x, reps=7, n=300):
    """Host µs (median of reps runs of n calls, synchronised after each run) of a forward and of
    its parts, both ways: the whole call, the call with the graph's replay made a no-op (the
    Python and autograd around it), the replay call alone, and graphd's own steps (module check,
    pytree flatten, the protect cycle of a step's handed-out gradients). The forward-only loop
    never runs a backward, so the protect cycle is timed apart."""
    import statistics
    import timeit
    from graphd import graphs as ggraphs
    from torch.utils._pytree import tree_flatten

    def us(fn, calls=n):
        t = timeit.Timer(fn)
        runs = []
        for _ in range(reps):
            runs.append(t.timeit(calls) / calls * 1e6)
            torch.cuda.synchronize()
        return statistics.median(runs)
    runner = g2._graphd_runner
    graph_of = {}
    orig = torch.cuda.CUDAGraph.replay

    def grab(self):  # upstream's forward graph, for its replay alone
        graph_of.setdefault("fwd", self)
        return orig(self)
    torch.cuda.CUDAGraph.replay = grab
    try:
        g1(x)
    finally:
        torch.cuda.CUDAGraph.replay = orig
    rows = [("forward, whole call", us(lambda: g1(x)), us(lambda: g2(x)))]
    torch.cuda.CUDAGraph.replay = lambda self: None
    runner.replay = lambda phase: None  # an instance attribute over the method
    try:
        rows.append(("forward, replay a no-op", us(lambda: g1(x)), us(lambda: g2(x))))
        params = runner.autograd_params
        rows.append(("  graphd _Graphed.apply, replay a no-op", None,
                     us(lambda: ggraphs._Graphed.apply(runner, x, *params))))
    finally:
        torch.cuda.CUDAGraph.replay = orig
        del runner.replay
    fwd = graph_of.get("fwd")
    rows.append(("the replay call alone", us(fwd.replay) if fwd is not None else None,
                 us(lambda: runner.replay(graphd._lib.PHASE_FORWARD))))
    own = torch.empty_like(x)
    rows.append(("static input copy_ (in-process: own memory)", us(lambda: own.copy_(x)),
                 us(lambda: runner.static.inputs[0].copy_(x))))
    if runner.slots:
        rows.append(("  graphd check_module()", None, us(runner.check_module, 3000)))
    # A client since 5124c07 skips it for plain tensor args; the older one paid it every call.
    rows.append(("  pytree flatten of (x,)", None, us(lambda: tree_flatten((x,)), 3000)))
    pairs = [(p, p) for p in runner.module_params]
    expose = getattr(runner, "expose", None) or (lambda: ggraphs._EXPOSED.add(runner))

    def protect_cycle():  # backward's hand-out, then the next forward's check (grads None)
        runner.handed_out = list(pairs)
        expose()
        runner.protect()
    for p in runner.module_params:
        p.grad = None
    rows.append(("  graphd protect cycle, %d grads None" % len(pairs), None,
                 us(protect_cycle, 3000)))
    print("forward parts, host µs (median of %d runs)       in-process    graphd" % reps)
    for name, a, b in rows:
        print("%-48s %10s %9s" % (name, "-" if a is None else "%.1f" % a,
                                  "-" if b is None else "%.1f" % b))


def table(title, named, extra=()):
    """Prints one row per (name, µs by phase[, one ms figure per extra heading]) with the
    phases' sum."""
    print("%-20s" % title + "".join("%10s" % h for h in PHASES + ("sum",) + extra))
    for name, us, *more in named:
        print("%-20s" % name + "".join("%10.1f" % us[k] for k in PHASES) +
              "%10.1f" % sum(us.values()) + "".join("%10.3f" % v for v in more))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="64,512,8")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    batch, width, depth = (int(v) for v in args.shape.split(","))
    torch.manual_seed(0)
    base = mlp(width, depth)
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, width, device="cuda")
    m1 = copy.deepcopy(base).cuda()
    g1 = torch.cuda.make_graphed_callables(m1, (x.clone(),))
    o1 = torch.optim.SGD(m1.parameters(), lr=1e-3)
    m2 = copy.deepcopy(base).cuda()
    g2 = graphd.make_graphed_callables(m2, (x.clone(),))
    o2 = torch.optim.SGD(m2.parameters(), lr=1e-3)
    print("torch %s, %s, MLP %s, %d steps" % (torch.__version__, torch.cuda.get_device_name(0),
                                            args.shape, args.steps))
    got = phases([("in-process graphed", g1, o1), ("graphd resident", g2, o2)], x, y,
                 args.steps)
    rows = list(got.items())
    table("host µs per phase", [(name, acc, wall, synced)
                                for name, (acc, wall, synced, _) in rows],
          ("wall ms", "synced ms"))
    table("host, each synced", [(name, acc) for name, (_, _, _, acc) in rows])
    print("(host µs per phase with each step synchronised: no launch waits for a full queue)")
    table("device µs per phase", [(name, device_phases(g, o, x, y, args.steps))
                                  for name, (g, o) in (("in-process graphed", (g1, o1)),
                                                       ("graphd resident", (g2, o2)))])

    forward_parts(g1, g2, x)
    replays(g1, o1, g2, o2, x, y, args.steps)

    own = {}
    for name, (g, o) in (("in-process graphed", (g1, o1)), ("graphd resident", (g2, o2))):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            o.zero_grad(set_to_none=True)
            nn.functional.mse_loss(g(x), y).backward()
            o.step()
        torch.cuda.synchronize()
        prof.disable()
        st = pstats.Stats(prof)
        own[name] = {func[2]: (cc, tt) for func, (cc, _, tt, _, _) in st.stats.items()}
        if name == "graphd resident":
            s = io.StringIO()
            st.stream = s
            st.sort_stats("tottime").print_stats(18)
            print("graphd resident step, cProfile over %d steps (tottime first):" % args.steps)
            print("\n".join(s.getvalue().splitlines()[4:]))
    print("the step's launches, cProfile own time, µs a call (calls):")
    for fn in ("<method 'copy_' of 'torch._C.TensorBase' objects>",
               "<built-in method torch._C._nn.mse_loss>",
               "<built-in method torch._foreach_add_>",
               "<method 'run_backward' of 'torch._C._EngineBase' objects>",
               "<method 'replay' of 'torch._C._CUDAGraph' objects>"):
        print("  %-62s" % fn + "".join(
            "  %s %.1f (%d)" % (n.split()[0], own[n][fn][1] / max(own[n][fn][0], 1) * 1e6,
                                own[n][fn][0]) if fn in own[n] else "  %s -" % n.split()[0]
            for n in own))


if __name__ == "__main__":
    main()
