"""graphd under torch.nn.parallel.DistributedDataParallel.

Upstream's rule for partial-network capture (make_graphed_callables) under DDP: graph the
module's sections first, then wrap the network with DDP. The graphs hold only the module's own
forward and backward; DDP's gradient all-reduce runs outside them, from the hooks DDP puts on the
parameters' gradient accumulators. graphd's graphs live in the daemon, which has no part in the
process group, so that is the only way here: graph first, then wrap. Nothing else is needed:

- The parameters stay the user's Parameter objects (their .data is the static tensor in shared
  memory), so DDP's broadcast at construction writes into the daemon's copy in place, and its
  reducer finds them by identity.
- The graphed backward hands each parameter's gradient to AccumulateGrad as eager autograd does,
  so DDP's hooks fire, copy it into their buckets, and write the mean back into .grad; under
  no_sync() the gradients accumulate in .grad (graphd copies a handed-out static gradient before
  the graph's next backward overwrites it).
- Buffers are the static BUFFER tensors: DDP's buffer broadcast before each forward writes the
  values the next replay reads.
- A parameter the graph does not use (allow_unused_input=True) is not an input of the graphed
  autograd Function (graphs._Runner.grad_params), so it is no more part of the autograd graph
  than in eager: with find_unused_parameters=True or static_graph=True DDP finds it unused and
  leaves its .grad None; with find_unused_parameters=False DDP raises at the next step, as over
  the eager module. (Upstream's graphed Function takes every parameter: DDP over it all-reduces
  a zero gradient for such a parameter instead.)

The CUDA graphs doc's "11 DDP-enabled warm-up iterations" is for capturing the whole backward,
all-reduce included, with torch.cuda.graph: DDP's reducer must have settled first. graphd never
captures DDP (it cannot: the collectives belong to the training process), so it asks for no
warm-up beyond make_graphed_callables' own num_warmup_iters.

This module finds the DDP wrappers among the callables given to make_graphed_callables: graphing
the wrapper itself cannot work (its forward calls the reducer, which no graph can hold), so the
module inside it is graphed instead, with a warning, and the wrapper is returned; a wrapper deeper
inside a callable is an error that says what to do.
"""
import warnings

import torch

WRAPPER_MSG = (
    "graphd: make_graphed_callables got a DistributedDataParallel wrapper. Its forward drives "
    "DDP's reducer, which cannot be part of a graph, so graphd graphs the module inside it "
    "(ddp.module) and returns the wrapper, whose all-reduce runs outside the graph. Graph first, "
    "then wrap, as upstream asks: ddp = DistributedDataParallel("
    "graphd.make_graphed_callables(model, sample_args))")

NESTED_MSG = (
    "graphd: callable %d contains a DistributedDataParallel wrapper (%r): DDP's forward drives "
    "its reducer, which cannot be part of a graph. Graph the module inside it first, then wrap: "
    "DistributedDataParallel(graphd.make_graphed_callables(model, sample_args))")


def _ddp_classes():
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch built without distributed
        return ()
    return (DistributedDataParallel,)


def unwrap(callables):
    """The callables to graph (a DDP wrapper replaced by its module, with a warning) and the
    wrappers to return in their place (None where the callable is not one). Raises ValueError for
    a DDP wrapper inside a callable."""
    classes = _ddp_classes()
    if not classes:
        return callables, None
    inner = []
    wrappers = []
    for i, c in enumerate(callables):
        if isinstance(c, classes):
            warnings.warn(WRAPPER_MSG, UserWarning, stacklevel=4)
            wrappers.append(c)
            inner.append(c.module)
            c = c.module
        else:
            wrappers.append(None)
            inner.append(c)
        if isinstance(c, torch.nn.Module):
            for name, sub in c.named_modules():
                if name and isinstance(sub, classes):
                    raise ValueError(NESTED_MSG % (i, name))
    if not any(w is not None for w in wrappers):
        return callables, None
    return tuple(inner), wrappers


def rewrap(ret, wrappers):
    """make_graphed_callables' results with each unwrapped DDP wrapper back in its place (its
    module is the graphed one)."""
    if wrappers is None:
        return ret
    return tuple(w if w is not None else r for r, w in zip(ret, wrappers))
