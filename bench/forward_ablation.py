#!/usr/bin/env python3
"""What each part of graphd's client costs inside a training step (issue 18, target 1's
profile).

On the slower H100 hosts graphd's training step takes more host time than in-process
make_graphed_callables' (twenty-fifth session: target 1 at 0.894-1.018), and the step profile
puts the extra in the forward, outside the replay call's own C time (docs/BENCHMARKS.md, "Step
profile"). Hot loops of the forward alone do not show where: inside a step each Python layer
costs two to seven times what it costs in a loop of itself. This script times the whole step
in one process, on one graphd-captured MLP, three ways, next to upstream's in-process graphed
copy and a second in-process copy (the control):

- graphd: the client as it is (graphd.make_graphed_callables' module).
- graphd lean: the same graph and static tensors driven by a bare autograd Function: the input
  copied if it is not the static input, the posted replay through the ctypes function, the
  outputs detached; the backward copies the incoming gradient, posts, and returns the static
  gradients detached. None of graphd's guards, no layers between the Function and the C call.
  Correct only for this step (zero_grad(set_to_none=True) before each forward, one input, one
  output, nothing shared): it is a measuring stick, not a client.
- graphd lean + guards: the lean Function plus graphd's guards, called as the client calls them
  (the module check, the input's dtype, device and shape checks, the parameters' pointer check;
  the backward's hand-out of its gradients and the next forward's protect cycle over them),
  without the client's layers.
- graphd lean, C apply: the lean Function called through torch's C apply, without
  Function.apply's Python layers (since torch 2.0: dead functorch wrappers unwrapped among all
  the args, then the C apply; on torch 1.x the two are one).
- graphd lean + protect: the lean Function with the hand-out and protect cycle alone, of the
  guards the one that only a device-resident step pays (its gradients left in the daemon's
  graph mempool). --guards-apart adds the lean Function with each other guard alone: the module
  check, the input checks, the parameters' pointer check.

So: graphd - (lean + guards) is what the client's layers cost in a step (its Python frames,
pytree, the lock and checks around the ctypes call); (lean + guards) - lean is what the guards
cost; lean - in-process is what remains of graphd's way of replaying (the posted replay against
CUDAGraph.replay(), the static tensors in the daemon's memory).

Each mode's step is timed in alternated slices (ABC... then ...CBA), --rounds rounds, and after
each slice --synced-steps steps each followed by a synchronisation, whose host time by phase is
the host's own work a step (bench_models.timed_step). Ratios are to "in-process".
--opcodes also counts the Python calls and opcodes of one forward of each mode (sys.settrace):
the times move with the host, these counts do not.

Usage (GPU machine, a graphd running; bench/run_gpu.sh's daemon or graphd --listen ...):
  GRAPHD_ADDRESS=unix:/path python3 bench/forward_ablation.py [--shape 64,512,8] [--rounds 3]
--device cpu runs the same plumbing on graphd's CPU graphs against the eager model (nothing
judged; the lean Function then replays by the synchronous REPLAY frame).
"""
import argparse
import copy
import sys

import torch
import torch.nn as nn

import graphd
from bench_models import PHASES, mlp, synced_steps, timed  # bench/, the script's own folder
from graphd import _lib
from graphd import graphs as ggraphs

_DETACH = ggraphs._DETACH

# The guards, as bits of _Lean's guards argument: the hand-out and protect cycle, the module
# check, the input's checks, the parameters' pointer check.
PROTECT, MODULE, INPUT, PARAMS = 1, 2, 4, 8
ALL = PROTECT | MODULE | INPUT | PARAMS


class _Lean(torch.autograd.Function):
    """The bare Function (module docstring), with the guards whose bits are set in guards."""

    @staticmethod
    def forward(ctx, runner, guards, x, *params):
        ctx.runner, ctx.guards = runner, guards
        s = runner.static
        static = s.inputs[0]
        if guards & MODULE:
            runner.check_module()
        if guards & INPUT:
            if not ggraphs._same_tensor(static, x):
                if x.dtype != static.dtype or x.device != static.device \
                        or x.shape != static.shape:
                    raise RuntimeError("forward_ablation: the input does not match")
                static.copy_(x)
        elif static.data_ptr() != x.data_ptr():
            static.copy_(x)
        if guards & PARAMS:
            if list(map(ggraphs._DATA_PTR, runner.module_params)) != s.param_ptrs:
                raise RuntimeError("forward_ablation: a parameter moved")
        if guards & PROTECT:
            if ggraphs._EXPOSED:
                for ref in list(ggraphs._EXPOSED.values()):
                    r = ref()
                    if r is not None:
                        r.protect()
        _replay(runner, _lib.PHASE_FORWARD)
        return tuple(map(_DETACH, s.outputs))

    @staticmethod
    def backward(ctx, *grads):
        runner = ctx.runner
        s = runner.static
        for k, static in s.grad_outputs.items():
            if grads[k] is None:
                static.zero_()
            elif static.data_ptr() != grads[k].data_ptr():
                static.copy_(grads[k])
        _replay(runner, _lib.PHASE_BACKWARD)
        pairs, views = runner.grad_pairs(s)
        if ctx.guards & PROTECT:  # the hand-out that the next forward's protect cycle reads
            runner.handed_out.extend(pairs)
            if runner.external_grads:
                runner.expose()
        return (None, None, None) + tuple(map(_DETACH, views))


def _replay(runner, phase):
    g = runner.graph
    c = g._client
    if runner.posted:
        rc = c._c_replay_stream(g._handle, phase,
                                ggraphs._RAW_STREAM(runner.cuda_device.index), c._replay_ns_ref)
    else:
        rc = c._c_replay(g._handle, phase, c._replay_ns_ref)
    if rc != 0:
        raise c._fail(rc, "Replay failed")


def lean_forward(module, guards, c_apply=False):
    """A forward for module (graphd's graphed module) through _Lean, dispatched as the client's
    new_fwd is (the training-state check, then the call). c_apply: through torch's C apply
    straight, not Function.apply (a Python classmethod since torch 2.0, around the same)."""
    runner = module._graphd_runner
    apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Lean) if c_apply \
        else _Lean.apply
    params = runner.autograd_params
    state = module.training
    if len(runner.static.inputs) != 1 or len(runner.static.outputs) != 1:
        raise SystemExit("forward_ablation: the lean Function takes one input and one output")

    def new_fwd(x):
        if module.training == state:
            return apply(runner, guards, x, *params)[0]
        raise RuntimeError("forward_ablation: the module's training state changed")
    return new_fwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="64,512,8", help="batch,width,depth of the MLP")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of slices (default 3)")
    ap.add_argument("--slices", type=int, default=6, help="slices per mode and round")
    ap.add_argument("--slice-s", type=float, default=0.5, help="seconds per slice")
    ap.add_argument("--synced-steps", type=int, default=50,
                    help="synchronised steps after each slice, for the host's own work")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda where there is one")
    ap.add_argument("--guards-apart", action="store_true",
                    help="also the lean Function with each other guard alone (module check, "
                    "input checks, parameters' pointers)")
    ap.add_argument("--opcodes", action="store_true",
                    help="also count the Python calls and opcodes of one forward of each mode "
                    "(sys.settrace; the forward runs on this thread, the backward may not)")
    a = ap.parse_args()
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda":
        sync, inproc = torch.cuda.synchronize, torch.cuda.make_graphed_callables
    else:
        sync, inproc = (lambda: None), (lambda m, args: m)
    b, w, d = (int(v) for v in a.shape.split(","))
    torch.manual_seed(0)
    base = mlp(w, d).to(dev)
    x = torch.randn(b, w, device=dev)
    y = torch.randn(b, w, device=dev)
    inproc0 = inproc(copy.deepcopy(base), (x.clone(),))
    inproc1 = inproc(copy.deepcopy(base), (x.clone(),))
    gmod = graphd.make_graphed_callables(copy.deepcopy(base), (x.clone(),))
    tree_fwd = gmod.forward
    forwards = {"graphd": tree_fwd, "graphd lean": lean_forward(gmod, 0),
                "graphd lean, C apply": lean_forward(gmod, 0, c_apply=True),
                "graphd lean + protect": lean_forward(gmod, PROTECT)}
    if a.guards_apart:
        forwards.update({"graphd lean + module check": lean_forward(gmod, MODULE),
                         "graphd lean + input checks": lean_forward(gmod, INPUT),
                         "graphd lean + param ptrs": lean_forward(gmod, PARAMS)})
    forwards["graphd lean + guards"] = lean_forward(gmod, ALL)
    opts = {m: torch.optim.SGD(m.parameters(), lr=1e-3) for m in (inproc0, inproc1, gmod)}
    modes = [("in-process", inproc0, None), ("in-process copy", inproc1, None)]
    modes += [(name, gmod, fwd) for name, fwd in forwards.items()]

    def use(model, fwd):
        if fwd is not None:
            model.forward = fwd

    def step(model):
        opt = opts[model]
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    # The lean Functions must compute what the client does, or their times mean nothing: one
    # step of each from the same parameters and a new input, outputs and gradients compared bit
    # for bit with the client's (a replay left out would leave the previous input's).
    def one_step(fwd, xi):
        use(gmod, fwd)
        opts[gmod].zero_grad(set_to_none=True)
        out = gmod(xi)
        nn.functional.mse_loss(out, y).backward()
        return [out.detach().clone()] + [p.grad.clone() for p in gmod.parameters()]
    for name, fwd in forwards.items():
        xi = torch.randn_like(x)
        if not all(map(torch.equal, one_step(fwd, xi), one_step(tree_fwd, xi))):
            raise SystemExit("forward_ablation: %s gives other outputs or gradients than the "
                             "client" % name)
    for _, model, fwd in modes:
        use(model, fwd)
        for _ in range(30):
            step(model)
    counted = {name: count_forward(model, fwd, use, opts[model], x, y)
               for name, model, fwd in modes} if a.opcodes else None
    sync()
    names = [m[0] for m in modes]
    per_slice = {n: [] for n in names}  # (round, µs a step)
    own = {n: [0] * len(PHASES) for n in names}  # host ns of synchronised steps, by phase
    k = 0
    for r in range(a.rounds):
        for _ in range(a.slices):
            for name, model, fwd in modes if k % 2 == 0 else modes[::-1]:
                use(model, fwd)
                t, n = timed(lambda: step(model), a.slice_s, sync)
                per_slice[name].append((r, t / n * 1e6))
                synced_steps(model, opts[model], x, y, a.synced_steps, sync, own[name])
            k += 1
    gmod.forward = tree_fwd
    name0 = "graphd" if dev == "cpu" else torch.cuda.get_device_name(0)
    print("torch %s, %s; MLP %s; %d rounds of %d alternated %.2f s slices per mode; µs a step "
          "(mean of a round's slices), its ratio to in-process, and the host's own work a "
          "synchronised step" % (torch.__version__, name0, a.shape, a.rounds, a.slices,
                                 a.slice_s))

    def round_means(name):
        return [sum(t for rr, t in per_slice[name] if rr == r) / a.slices
                for r in range(a.rounds)]
    ref = round_means("in-process")
    steps_synced = a.synced_steps * a.slices * a.rounds
    for name in names:
        means = round_means(name)
        print("  %-28s %s   ratios %s   host own %7.1f" % (
            name, " ".join("%7.1f" % m for m in means),
            " ".join("%.3f" % (m / q) for m, q in zip(means, ref)),
            sum(own[name]) / steps_synced / 1e3))
    print("host's own work by phase, µs a synchronised step")
    for name in names:
        print("  %-28s %s" % (name, "  ".join("%s %6.1f" % (p, v / steps_synced / 1e3)
                                              for p, v in zip(PHASES, own[name]))))
    if counted:
        print("Python calls and opcodes in one forward (sys.settrace, this thread; deterministic, "
              "unlike the times: what each mode's forward runs in Python)")
        for name in names:
            print("  %-28s calls %4d   opcodes %5d" % ((name,) + counted[name]))
    return 0


def count_forward(model, fwd, use, opt, x, y):
    """(Python calls, opcodes) of one forward of model through fwd, inside a whole step (zero_grad
    before, the backward after, untraced)."""
    n = [0, 0]

    def tracer(frame, event, arg):
        if event == "call":
            n[0] += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            n[1] += 1
        return tracer
    use(model, fwd)
    opt.zero_grad(set_to_none=True)
    sys.settrace(tracer)
    try:
        out = model(x)
    finally:
        sys.settrace(None)
    nn.functional.mse_loss(out, y).backward()
    return tuple(n)


if __name__ == "__main__":
    sys.exit(main())
