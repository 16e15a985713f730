"""graphd.make_graphed_callables: torch.cuda.make_graphed_callables with the graphs in graphd.

Mirrors upstream (torch/cuda/graphs.py) step by step: the same argument checks with the same
exception types and messages, one callable or a tuple sharing one pool, pytree-flattened args and
outputs, one torch.autograd.Function per callable whose forward and backward replay the remote
forward and backward graphs, and for an nn.Module the module itself returned with its forward
replaced (the graph runs when module.training matches the mode at capture, else the original
forward runs locally).

Where graphd differs, and why:
- The callable is traced here (torch.jit.trace, a ScriptModule taken as is) and the archive is
  sent to the daemon, which does the warm-up and the capture on its own copy. The daemon warms
  up on sample values of its own, so for a module with buffers the warm-up forwards also run
  here, on the sample args (RNG forked): the module's buffers (BatchNorm running stats,
  num_batches_tracked) end up where upstream's warm-up leaves them, warm-up iterations counted.
- Every static tensor lives in a shared region mapped into this process. The module's
  parameters are rebound to the PARAM tensors (param.data = shared view), so an optimizer
  updates the daemon's copy in place; its buffers are rebound to the BUFFER tensors, so the
  running stats every FORWARD updates are the module's own, as upstream's graphs update the
  module's buffers in place (the eval-mode fallback and state_dict see them); the sample args
  that are plain leaf tensors are rebound to the INPUT tensors, so that, as upstream, filling a
  sample tensor in place and passing it costs no copy.
- Parameter gradients come back as upstream's do, as detached views of the static gradients,
  so AccumulateGrad takes the view as param.grad with no copy (after zero_grad() with its
  default set_to_none=True, the usual loop): until the next BACKWARD, param.grad is the static
  gradient, as it is upstream. Unlike upstream, accumulation stays right: before a replay that
  may overwrite a static gradient (its graph's next BACKWARD; for gradients left in the
  daemon's graph mempool, also the next FORWARD, whose activations may share that memory), a
  param.grad that is still one of them is replaced by a copy, so a second backward without
  zero_grad (gradient accumulation, zero_grad(set_to_none=False)) adds to the old gradient
  instead of to itself (upstream's result is twice the new gradient). A loop that calls
  zero_grad() before the forward pays no copy; one that calls it between forward and backward
  pays a copy of each gradient of a device-resident graph at that forward.
  Gradients for the user args are clones: a leaf arg's .grad outlives the graph's next BACKWARD
  in ways the graph cannot see.
- Outputs that do not require grad are marked non-differentiable, so they come back with
  requires_grad=False as they would from the eager callable.
- A parameter the graph computes no gradient for (allow_unused_input=True) is not an input of
  the autograd Function, as it is no part of eager's autograd graph, so DistributedDataParallel
  treats it as over the eager module (ddp.py); upstream's Function takes every parameter.
- Device-resident: when the callables' parameters and sample args are on a CUDA device, the
  static tensors are device memory the daemon allocates on that device and exports with CUDA IPC;
  the views here are CUDA tensors over the same memory (zero copy), so the optimizer updates the
  daemon's parameters in place on the GPU. Replays are ordered on the current stream as if the
  graph ran on that stream: the daemon's pool stream waits for the work queued before the replay
  (the writes of inputs, grad-outputs and parameter updates), the current stream waits for the
  replay before the work queued after it, and neither host waits. By default a replay is posted:
  the two streams write and wait for sequence numbers in counters the daemon shares with the
  session (CUDA stream memory operations), and the call returns once the REPLAY frame is sent; a
  replay that fails in the daemon raises at a later replay, as CUDA reports asynchronous errors.
  GRAPHD_REPLAY_ORDER=events orders by a pair of CUDA IPC events instead, each call waiting for
  the daemon's launch; GRAPHD_REPLAY_ORDER=sync synchronises both sides. The parameter
  gradients stay where the daemon's backward graph computes them, in its graph mempool, mapped
  here too, so no step copies them (GRAPHD_COPY_PARAM_GRADS=1: the backward graph copies them
  into the graph's own memory, for comparison). A CPU module with device="cuda:N" stays
  host-staged: its replays have finished when they return.
"""
import copy
import ctypes
import functools
import itertools
import operator
import warnings
import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _lib, recovery, slow as _slow
from . import ddp as _ddp
from .client import PoolHandle, default_client, graph_pool_handle, normalize_device
from .errors import GraphdError, PerformanceWarning, make_error
from . import trace_cache
from .trace_cache import trace as _trace  # tracing.trace, reused across the same keys
from .tracing import callable_name

_DTYPES = {
    torch.float32: _lib.DTYPE_FLOAT32, torch.float64: _lib.DTYPE_FLOAT64,
    torch.float16: _lib.DTYPE_FLOAT16, torch.bfloat16: _lib.DTYPE_BFLOAT16,
    torch.int64: _lib.DTYPE_INT64, torch.int32: _lib.DTYPE_INT32, torch.int16: _lib.DTYPE_INT16,
    torch.int8: _lib.DTYPE_INT8, torch.uint8: _lib.DTYPE_UINT8, torch.bool: _lib.DTYPE_BOOL,
}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}

# Runners whose static gradients, left in the daemon's graph mempool, were handed to
# AccumulateGrad since their last protect(): the next FORWARD of any graph may overwrite them (its
# activations can share that memory, as upstream's do), so it calls protect() on each first.
# id(runner) -> weakref to it, dropped when the runner dies: a plain dict, as every FORWARD
# looks at it (a WeakSet's Python-level len, iteration and add cost a device-resident step a few
# microseconds each).
_EXPOSED = {}


def _unexpose(key, ref):
    if _EXPOSED.get(key) is ref:
        del _EXPOSED[key]


_GRAD = operator.attrgetter("grad")
_FIRST = operator.itemgetter(0)
_DATA_PTR = torch.Tensor.data_ptr
_DETACH = torch.Tensor.detach
_FORWARD, _BACKWARD = _lib.PHASE_FORWARD, _lib.PHASE_BACKWARD
_GRAD_ENABLED = torch.is_grad_enabled

_HOOKS_MSG = ("Modules must not have hooks registered at the time they are passed. However, "
              "registering hooks on modules after passing them through make_graphed_callables "
              "is allowed.")
_BUFFERS_MSG = ("In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, "
                "only parameters may be trainable. All buffers must have "
                "``requires_grad=False``.")
_ARGS_MSG = ("In the beta API, sample_args for each callable must contain only Tensors. Other "
             "types are not allowed.")
_AUTOCAST_MSG = ("make_graphed_callables does not support the autocast caching. Please set "
                 "`cache_enabled=False`.")


def _autocast_enabled():
    """Upstream's check (CUDA autocast), and CPU autocast: graphd's graphs run on the CPU."""
    if torch.is_autocast_enabled():
        return True
    try:
        return torch.is_autocast_enabled("cpu")  # torch >= 2.4
    except TypeError:
        return torch.is_autocast_cpu_enabled()


def _spec(t, i, j):
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise TypeError("graphd: sample arg %d of callable %d has dtype %s, which graphd does not "
                        "carry (it takes %s)" % (j, i, t.dtype,
                                                 ", ".join(str(d) for d in _DTYPES)))
    return dtype, tuple(t.shape), bool(t.requires_grad)


# __cuda_array_interface__ type strings; bfloat16 has none, so it goes as int16 and is viewed back.
_CAI_TYPES = {
    torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2", torch.bfloat16: "<i2",
    torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.int8: "|i1",
    torch.uint8: "|u1", torch.bool: "|b1",
}


class _CudaMemory:
    """A static tensor's device memory (a CUDA IPC mapping owned by a Graph) as a
    __cuda_array_interface__ (version 3) object, for torch.as_tensor: no copy. The tensor made
    from it keeps it, and so the Graph, alive."""

    def __init__(self, ptr, shape, strides_bytes, typestr, owner):
        self.__cuda_array_interface__ = {"version": 3, "shape": shape, "typestr": typestr,
                                         "strides": strides_bytes, "data": (ptr, False)}
        self.graphd_graph = owner


def _have_numpy():
    try:
        import numpy  # noqa: F401
        return True
    except ImportError:
        return False


def _view(desc, owner):
    """A torch tensor over a static tensor's mapped memory, no copy: a CPU tensor over a host
    region, a CUDA tensor over a device-resident graph's device memory. It keeps owner (the Graph,
    which owns the mapping) alive."""
    dtype = _TORCH_DTYPES.get(desc.dtype)
    if dtype is None:
        raise make_error("INTERNAL", "static tensor %r has unknown dtype %d" %
                         (_lib.text(desc.name), desc.dtype))
    shape = tuple(desc.shape[k] for k in range(desc.ndim))
    strides = tuple(desc.strides[k] for k in range(desc.ndim))
    device = (getattr(owner, "device", None) or "cuda") if getattr(desc, "on_device", 0) else None
    if any(s == 0 for s in shape):
        return torch.empty(shape, dtype=dtype, device=device)  # nothing to share
    itemsize = torch.empty((), dtype=dtype).element_size()
    extent = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    if extent * itemsize > desc.nbytes or not desc.data:
        raise make_error("INTERNAL", "static tensor %r: %d bytes cannot hold shape %s" %
                         (_lib.text(desc.name), desc.nbytes, shape))
    if device is not None:
        if not _have_numpy():  # torch reads __cuda_array_interface__ with numpy
            storage = torch._C._construct_storage_from_data_pointer(
                desc.data, torch.device(device), extent * itemsize)
            t = torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape, strides)
            t.graphd_graph = owner  # weaker than the CAI path: views of t do not hold it
            return t
        mem = _CudaMemory(desc.data, shape, tuple(st * itemsize for st in strides),
                          _CAI_TYPES[dtype], owner)
        t = torch.as_tensor(mem, device=device)
        return t.view(dtype) if t.dtype != dtype else t
    mem = (ctypes.c_byte * (extent * itemsize)).from_address(desc.data)
    mem.graphd_graph = owner
    return torch.frombuffer(mem, dtype=dtype).as_strided(shape, strides)


class _Static:
    """The static tensors of one graph, as torch views, by role."""

    def __init__(self, graph, n_args):
        self.graph = graph
        by_role = {r: {} for r in _lib.ROLE_NAMES}
        names = {}
        flags = {}
        self.absent = set()  # (role, index) of grads autograd does not give (upstream's None)
        for d in graph.tensors:
            by_role[d.role][d.index] = _view(d, graph)
            if d.absent:
                self.absent.add((d.role, d.index))
            names[(d.role, d.index)] = _lib.text(d.name)
            flags[(d.role, d.index)] = bool(d.requires_grad)

        def ordered(role):
            got = by_role[role]
            if sorted(got) != list(range(len(got))):
                raise make_error("INTERNAL", "graph %d: %s indices %s are not 0..n-1" %
                                 (graph.id, _lib.ROLE_NAMES[role], sorted(got)))
            return [got[k] for k in range(len(got))]

        self.inputs = ordered(_lib.ROLE_INPUT)
        if len(self.inputs) != n_args:
            raise make_error("INTERNAL", "graph %d has %d inputs, %d sample args were sent" %
                             (graph.id, len(self.inputs), n_args))
        self.outputs = ordered(_lib.ROLE_OUTPUT)
        self.output_requires_grad = [flags[(_lib.ROLE_OUTPUT, k)]
                                     for k in range(len(self.outputs))]
        self.grad_outputs = by_role[_lib.ROLE_GRAD_OUTPUT]  # output index => view
        self.grad_inputs = by_role[_lib.ROLE_GRAD_INPUT]    # arg index => view
        self.params = ordered(_lib.ROLE_PARAM)
        self.param_ptrs = list(map(_DATA_PTR, self.params))  # for each FORWARD's check
        self.param_names = [names[(_lib.ROLE_PARAM, k)] for k in range(len(self.params))]
        self.param_grads = by_role[_lib.ROLE_PARAM_GRAD]    # param index => view
        self.buffers = ordered(_lib.ROLE_BUFFER)
        self.buffer_names = [names[(_lib.ROLE_BUFFER, k)] for k in range(len(self.buffers))]
        # The generator state the graph's random ops draw from (graphs without random ops have
        # none): see _Rng.
        self.rng = by_role[_lib.ROLE_RNG_STATE].get(0)


class _Rng:
    """Makes a graph's random ops draw from this process's generator, as the eager callable's
    would, through the graph's RNG_STATE tensor, and advances the generator as eager would.
    - uint8 (graphd's CPU device): the CPU generator's whole state (torch.get_rng_state()),
      written before FORWARD and read back after it, so the same seed gives eager's masks.
    - int64 (seed, offset, increment) (CUDA): the Philox seed and offset the graph's kernels
      start from, as upstream's graphs read them from device memory at replay; the daemon wrote
      the graph's whole offset increment at capture. Device-resident, they are this device's CUDA
      generator's seed and offset (written on the current stream), and the offset advances by
      the increment, as eager's and upstream's graphs' do: eager's masks for the same seed. A
      host-staged graph runs on a GPU for a CPU model: its seed is drawn from the CPU generator
      at each FORWARD, so the same seed gives the same masks run after run (not eager CPU's,
      which come from another algorithm)."""

    def __init__(self, static, cuda_device):
        self.state = static
        self.cuda = None
        self.increment = 0
        if static.dtype == torch.int64:
            self.increment = int(static[2])  # once, at capture: a copy from the device if there
            if cuda_device is not None:
                self.cuda = torch.cuda.default_generators[cuda_device.index]

    def before(self):
        if self.state.dtype == torch.uint8:
            self.saved = torch.get_rng_state()  # a new tensor: kept for a re-run (recovered)
            self.state.copy_(self.saved)
        elif self.cuda is not None:
            seed = self.cuda.initial_seed()
            self.offset = self.cuda.get_offset()
            self.state[0].fill_(seed - (1 << 64) if seed >= 1 << 63 else seed)
            self.state[1].fill_(self.offset)
        else:
            self.state[0] = int(torch.empty((), dtype=torch.int64).random_())
            self.state[1] = 0
            self.saved = self.state.clone()

    def after(self):
        if self.state.dtype == torch.uint8:
            torch.set_rng_state(self.state)
        elif self.cuda is not None:
            self.cuda.set_offset(self.offset + self.increment)


def _same_tensor(a, b):
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride())


class _Runner:
    """What one graphed callable's autograd Function needs: the graph, its static tensors, the
    user's parameters (in PARAM order) and the output structure."""

    def __init__(self, graph, static, n_args, module_params, out_spec, module_buffers=(),
                 slots=(), bound_args=()):
        self.graph = graph
        self.static = static
        self.n_args = n_args
        self.module_params = tuple(module_params)
        # The parameters the graph computes a gradient for (PARAM indices) are the autograd
        # Function's inputs; one it does not use (allow_unused_input=True) is left out, so that it
        # is no more part of the autograd graph than in eager: DistributedDataParallel then finds
        # it unused, or raises without find_unused_parameters, as over the eager module (ddp.py).
        self.grad_params = tuple(k for k in range(len(self.module_params))
                                 if (_lib.ROLE_PARAM_GRAD, k) not in static.absent)
        self.autograd_params = tuple(self.module_params[k] for k in self.grad_params)
        self.module_buffers = tuple(module_buffers)
        # The user's sample args that live in this graph's static inputs (weakly), rebound after
        # a daemon restart with the parameters and buffers (recovered()).
        self.bound_args = [weakref.ref(x) for x in bound_args]
        # Set when a daemon restart lost the saved activations of the graph's last FORWARD: a
        # BACKWARD then runs that FORWARD again first (recovered(), _reforward()).
        self.stale = False
        graph._runner = weakref.ref(self)
        # Buffers that live in another graph's static tensor (a module shared by two callables
        # of one call): copied in before each FORWARD and back after it. The others live in this
        # graph's: a buffer found elsewhere at a call was converted (module.double()) since.
        self.mirrored_buffers = [(view, b) for view, b in zip(static.buffers, module_buffers)
                                 if not _same_tensor(view, b)]
        self.own_buffers = [(view, b) for view, b in zip(static.buffers, module_buffers)
                            if _same_tensor(view, b)]
        # (module, attribute, tensor, "_parameters" or "_buffers") of the module's parameters and
        # buffers at capture: one replaced since (module.w = nn.Parameter(...)) is an error.
        self.slots = tuple(slots)
        # The same, column by column, for check_module's passes in C: each (module, kind) once
        # with its dict, then each slot's dict, attribute name and tensor.
        owners = tuple(dict.fromkeys((m, k) for m, _, _, k in slots))
        self.slot_owners = (tuple(m for m, _ in owners), tuple(k for _, k in owners),
                            tuple(getattr(m, k) for m, k in owners))
        self.slot_cols = (tuple(getattr(m, k) for m, _, _, k in slots),
                          tuple(a for _, a, _, _ in slots), tuple(t for _, _, t, _ in slots))
        # Forwards so far, and the forward whose saved activations a BACKWARD already used: the
        # graph keeps one set of saved activations, so only the last forward can be
        # backpropagated, once (checked before the daemon is asked).
        self.forwards = 0
        self.backpropagated = 0
        self.out_spec = out_spec
        self.module = None  # a graphed module's, from bind_module()
        self.leaf_out = _is_leaf(out_spec)  # one tensor out: __call__ returns it, no pytree
        self.no_grad_outputs = [k for k, rg in enumerate(static.output_requires_grad) if not rg]
        # Device-resident: the CUDA device whose current stream orders the replays.
        on_device = any(getattr(d, "on_device", 0) for d in graph.tensors)
        self.cuda_device = torch.device(graph.device) if on_device else None
        self.device_index = self.cuda_device.index if on_device else None
        # GRAPHD_REPLAY_ORDER (README, "Settings"): "posted" (the default) and "events" are
        # libgraphd's; "sync" synchronises on the host here.
        self.host_sync = _lib.setting("GRAPHD_REPLAY_ORDER") == "sync"
        # The parameter gradients are in the daemon's graph mempool (not the graph's region).
        self.external_grads = on_device and not graph.copy_param_grads
        # (parameter, static gradient) handed to AccumulateGrad since the last protect()
        self.handed_out = []
        self._grad_pairs = None  # grad_pairs()'s, with the _Static it was made for
        self.ref = weakref.ref(self, functools.partial(_unexpose, id(self)))
        self.rng = _Rng(static.rng, self.cuda_device) if static.rng is not None else None
        # Device-resident replays ordered on the current stream by libgraphd (posted or by
        # events): replay() issues them itself, with Client._post's body inline.
        self.posted = (self.cuda_device is not None and not self.host_sync
                       and _RAW_STREAM is not None)

    def replay(self, phase):
        """Replays phase, after protect() of the runners whose handed-out gradients it may
        overwrite. Device-resident graphs are ordered on the current stream (posted, or by CUDA
        IPC events): the replay runs after the work queued so far (the writes into the static
        tensors) and before the work queued next (reads of the outputs), with no host wait
        (GRAPHD_REPLAY_ORDER=sync: host synchronisation on both sides instead, for
        comparison). Host-staged and CPU graphs: the replay has finished when this returns."""
        if phase == _FORWARD:
            if _EXPOSED:
                for ref in list(_EXPOSED.values()):
                    runner = ref()
                    if runner is not None:
                        runner.protect()
        elif self.handed_out:
            self.protect()
        if phase == _BACKWARD and self.stale:
            self._reforward()
        g = self.graph
        try:
            if self.posted and not g._lost:
                # The usual step's path, twice a step: Client._post's body, here, for inside a
                # step each Python frame costs several times what it costs in a loop of itself
                # (bench/forward_ablation.py).
                c = g._client
                try:
                    with c._lock:
                        if c._closed or not c._h:
                            c._check_open()
                        rc = c._c_replay_stream(g._handle, phase, _RAW_STREAM(self.device_index),
                                                c._replay_ns_ref)
                        if rc != 0:
                            raise c._fail(rc, "Replay failed")
                except GraphdError as e:
                    recovery.failed(g, e)  # raises, Recovered where the session was restored
            else:
                self._replay(phase, "raise")
        except recovery.Recovered:  # the daemon was restarted: retried once, on the new graph
            if phase == _BACKWARD and self.stale:
                self._reforward()
            self._replay(phase, False)
        if phase == _FORWARD:
            self.stale = False

    def _replay(self, phase, recover):
        # recovery.replay is what Graph.replay calls, without its argument handling: this runs
        # twice per training step.
        if self.cuda_device is None:
            recovery.replay(self.graph, phase, False, None, recover)
        elif self.host_sync:
            torch.cuda.current_stream(self.cuda_device).synchronize()
            recovery.replay(self.graph, phase, False, None, recover)
        else:
            recovery.replay(self.graph, phase, False, _current_raw_stream(self.cuda_device),
                            recover)

    def recovered(self):
        """The daemon was restarted and the graph captured again (graphd.recovery): its new
        static tensors hold the old ones' bytes. The module's parameters and buffers and the
        sample args that lived in the old static tensors are rebound to the new ones (the same
        Parameter objects, so an optimizer's references and state stay valid); tensors the user
        took before (outputs, p.grad) keep the old mapping, which the Graph keeps."""
        old = self.static
        new = _Static(self.graph, self.n_args)
        with torch.no_grad():
            for ts, olds, news in ((self.module_params, old.params, new.params),
                                   (self.module_buffers, old.buffers, new.buffers)):
                for t, o, n in zip(ts, olds, news):
                    if _same_tensor(t, o):
                        t.data = n
            for ref in self.bound_args:
                x = ref()
                for o, n in zip(old.inputs, new.inputs) if x is not None else ():
                    if _same_tensor(x, o):
                        x.data = n
                        break
        self.static = new
        self.mirrored_buffers = [(v, b) for v, b in zip(new.buffers, self.module_buffers)
                                 if not _same_tensor(v, b)]
        self.own_buffers = [(v, b) for v, b in zip(new.buffers, self.module_buffers)
                            if _same_tensor(v, b)]
        saved = getattr(self.rng, "saved", None)
        self.rng = _Rng(new.rng, self.cuda_device) if new.rng is not None else None
        if saved is not None:
            self.rng.saved = saved
            # The FORWARD retried on the new graph draws from the state its before() wrote, not
            # the copied one: a daemon that was stopped and resumed may have run the interrupted
            # FORWARD on the old static tensors after that write, advancing their state.
            self.rng.state.copy_(saved)
        self.stale = self.forwards > 0

    def _reforward(self):
        """Runs the last FORWARD again on a graph captured anew after a daemon restart, so that
        the BACKWARD that follows has its saved activations: from the same inputs (still in the
        static inputs) and RNG state, and the buffers left as that FORWARD had left them."""
        s = self.static
        buffers = [b.clone() for b in s.buffers]
        if self.rng is not None and getattr(self.rng, "saved", None) is not None:
            self.rng.state.copy_(self.rng.saved)
        self._replay(_lib.PHASE_FORWARD, False)
        with torch.no_grad():
            for b, v in zip(s.buffers, buffers):
                b.copy_(v)
        self.stale = False

    def grad_pairs(self, s):
        """((parameter, static gradient), ...) and (static gradient, ...) of s, in the order of
        the Function's parameter inputs (grad_params), or None when one of those has no static
        gradient (a frozen parameter); made once per _Static."""
        if self._grad_pairs is None or self._grad_pairs[0] is not s:
            pairs = None
            if all(k in s.param_grads for k in self.grad_params):
                pairs = tuple((self.module_params[k], s.param_grads[k]) for k in self.grad_params)
            self._grad_pairs = (s, pairs, pairs and tuple(g for _, g in pairs))
        return self._grad_pairs[1:]

    def protect(self):
        """Before a replay that may overwrite this runner's static gradients (its own BACKWARD;
        where they are in the graph mempool, any FORWARD): a param.grad that is still one of them
        gets a copy of its own, to which AccumulateGrad then adds the next gradient."""
        handed = self.handed_out
        # The usual loop (zero_grad(set_to_none=True) before the forward) left every such
        # param.grad None: one pass in C tells, instead of a Python loop over the parameters.
        grads = list(map(_GRAD, map(_FIRST, handed)))
        if any(map(operator.is_not, grads, itertools.repeat(None))):
            for (param, static), grad in zip(handed, grads):
                if grad is not None and grad.data_ptr() == static.data_ptr():
                    param.grad = grad.clone()
        self.handed_out = []
        _EXPOSED.pop(id(self), None)

    def expose(self):
        """After a BACKWARD that handed out gradients in the daemon's graph mempool."""
        _EXPOSED[id(self)] = self.ref

    def check_module(self):
        """Raises when a parameter or buffer of the module was replaced since capture, or the
        module was converted (module.double(), .half(), .to(device)): the graph would go on
        training its static tensors, not the module's."""
        mods, kinds, owner_dicts = self.slot_owners
        dicts, attrs, tensors = self.slot_cols
        # Every call: each module's dict is still the one it had, and holds the same tensor
        # (two passes in C); _check_slots only finds and names what changed.
        if not (all(map(operator.is_, map(getattr, mods, kinds), owner_dicts))
                and all(map(operator.is_, map(dict.get, dicts, attrs), tensors))):
            self._check_slots()
        if self.own_buffers:
            self._check_own_buffers()

    def _check_own_buffers(self):
        for view, b in self.own_buffers:
            if b.data_ptr() != view.data_ptr():
                _converted("buffer", b, view)

    def _check_slots(self):
        for mod, attr, t, kind in self.slots:
            now = getattr(mod, kind).get(attr)
            if now is not t:
                if now is not None and (now.dtype, now.device) != (t.dtype, t.device):
                    _converted("parameter" if kind == "_parameters" else "buffer", now, t)
                raise RuntimeError(
                    "graphd: %s %r of the graphed module was replaced after "
                    "make_graphed_callables (the graph reads the tensor it was captured with). "
                    "Update it in place (with torch.no_grad(): p.copy_(new)), or graph the module "
                    "again" % ("parameter" if kind == "_parameters" else "buffer", attr))

    def __deepcopy__(self, memo):
        raise TypeError("graphd: a graphed function cannot be copied: it replays graphs that "
                        "live in the daemon. Copy the original function and graph the copy")

    def __reduce_ex__(self, protocol):
        raise TypeError("graphd: a graphed function cannot be pickled: it replays graphs that "
                        "live in the daemon. Pickle the original function")

    def bind_module(self, module):
        """Makes this runner module's forward (module.forward = runner): upstream's new_fwd and
        functionalized in one call, for inside a training step each Python frame costs several
        times what it costs in a loop of itself (bench/forward_ablation.py). The graph runs while
        module.training is what it was at capture; otherwise the module's own forward does."""
        self.module, self.training_state, self.orig_forward = module, module.training, \
            module.forward
        module.forward = self

    def __call__(self, *user_args, **user_kwargs):
        module = self.module
        if module is not None and module.training != self.training_state:
            return self.orig_forward(*user_args, **user_kwargs)
        if self.slots:
            # check_module(), here (one frame fewer a step): its two passes, then only what
            # they found changed, or buffers of the graph's own, costs a call
            mods, kinds, owner_dicts = self.slot_owners
            dicts, attrs, tensors = self.slot_cols
            if not (all(map(operator.is_, map(getattr, mods, kinds), owner_dicts))
                    and all(map(operator.is_, map(dict.get, dicts, attrs), tensors))):
                self._check_slots()
            if self.own_buffers:
                self._check_own_buffers()
        if user_kwargs:
            raise TypeError("graphd: a graphed callable takes its args as in sample_args "
                            "(positional only), not keyword args %s" % sorted(user_kwargs))
        # Plain tensors (the usual call) are their own flattening: tree_flatten only for others.
        tensors = all(map(isinstance, user_args, itertools.repeat(torch.Tensor)))
        flat = user_args if tensors else tuple(tree_flatten(user_args)[0])
        if len(flat) != self.n_args:
            raise TypeError("graphd: the graphed callable was captured with %d tensor args, "
                            "got %d" % (self.n_args, len(flat)))
        if tensors and not _TRANSFORMS_ACTIVE():
            # What torch's Function.apply does here, without its Python layers (since torch 2.0
            # a classmethod that unwraps dead functorch wrappers among all the args, each
            # parameter included, before the C apply): the user's args unwrapped, the
            # parameters are the module's own (checked above), then the C apply.
            if _UNWRAP_IF_DEAD is not None:
                flat = tuple(map(_UNWRAP_IF_DEAD, flat))
            out = _APPLY(self, *flat, *self.autograd_params)
        else:  # under torch.func's transforms (which refuse the Function, as upstream's)
            out = _Graphed.apply(self, *flat, *self.autograd_params)
        if self.leaf_out:
            return out[0]
        return tree_unflatten(list(out), self.out_spec)


def _is_leaf(spec):
    """True when spec (tree_flatten's) is one bare leaf: the callable returns one tensor."""
    leaf = object()
    try:
        return tree_unflatten([leaf], spec) is leaf
    except Exception:  # not one leaf
        return False


def _converted(what, t, static):
    raise RuntimeError(
        "graphd: a %s of the graphed module is now %s on %s, but the graph was captured with %s "
        "on %s: the module was converted (e.g. .double(), .half(), .to(device)) after "
        "make_graphed_callables. Convert it before graphing, and graph it again" %
        (what, t.dtype, t.device, static.dtype, static.device))


_BACKWARD_TWICE = (
    "graphd: trying to backward through the graphed callable a second time since its last "
    "forward. A graph keeps one set of saved activations, which its backward uses up (as "
    "backward with retain_graph=False frees them in eager PyTorch): run the forward again before "
    "each backward")
_BACKWARD_STALE = (
    "graphd: this backward belongs to a forward of the graphed callable that a later call of it "
    "(with or without grad, e.g. under torch.no_grad()) has overwritten. A graph keeps one set "
    "of saved activations, those of its last forward: run each backward before the next call of "
    "the same graphed callable, or make extra forwards with the eager module (module.eval() "
    "runs the original forward)")

_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # looked up once


def _current_raw_stream(device):
    """The current stream's cudaStream_t (an int) on device: torch's raw accessor where it has
    one (no torch.cuda.Stream object built for each replay), else through that object."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


class _Graphed(torch.autograd.Function):
    """Upstream's Graphed: forward and backward replay the remote graphs over static tensors."""

    @staticmethod
    def forward(ctx, runner, *inputs):
        s = runner.static
        ctx.runner = runner
        ctx.materialize_grads = False  # set_materialize_grads(False)'s work, without its frame
        # Only the user args may be new tensors; parameters are the static tensors unless the
        # same Parameter is shared with another graphed callable (or was rebound since).
        for k, (static, x) in enumerate(zip(s.inputs, inputs)):
            if static.data_ptr() != x.data_ptr() or not _same_tensor(static, x):
                if x.dtype != static.dtype:  # copy_ would cast it silently
                    raise RuntimeError(
                        "graphd: arg %d has dtype %s, but the callable was captured with %s; "
                        "convert it (x.to(%s)), or capture another graph for %s" %
                        (k, x.dtype, static.dtype, static.dtype, x.dtype))
                if x.device != static.device:  # copy_ would move it between devices silently
                    raise RuntimeError(
                        "graphd: arg %d is on %s, but the graph's static inputs are on %s (it "
                        "was captured for that device); move the arg there, or capture another "
                        "graph on %s" % (k, x.device, static.device, x.device))
                if x.shape != static.shape:  # copy_ would broadcast it silently
                    raise RuntimeError("graphd: arg %d has shape %s, but the callable was "
                                       "captured with %s" % (k, tuple(x.shape),
                                                             tuple(static.shape)))
                static.copy_(x)
        # Parameters are their static tensors unless shared with another graphed callable
        # (compared in C: a Python loop over them would cost every step more than the check).
        if list(map(_DATA_PTR, runner.module_params)) != s.param_ptrs:
            for static, p in zip(s.params, runner.module_params):
                if static.data_ptr() != p.data_ptr():
                    if ((p.dtype, p.device, p.shape)
                            != (static.dtype, static.device, static.shape)):
                        _converted("parameter", p, static)
                    static.copy_(p)
        for static, b in runner.mirrored_buffers:
            if (b.dtype, b.device, b.shape) != (static.dtype, static.device, static.shape):
                _converted("buffer", b, static)
            static.copy_(b)
        if runner.rng is not None:
            runner.rng.before()
        runner.replay(_FORWARD)
        if runner.rng is not None:
            runner.rng.after()
        runner.forwards += 1
        ctx.forward = runner.forwards
        for static, b in runner.mirrored_buffers:
            b.copy_(static)
        s = runner.static  # captured anew if the daemon was restarted under the replay
        outs = tuple(map(_DETACH, s.outputs))
        if runner.no_grad_outputs:
            ctx.mark_non_differentiable(*(outs[k] for k in runner.no_grad_outputs))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        # The engine runs a backward with grad mode off, but under create_graph=True; then, as
        # upstream's, through once_differentiable, whose outputs raise when differentiated. With
        # grad mode off its torch.no_grad() would change nothing and cost the step several
        # Python frames (bench/forward_ablation.py).
        if _GRAD_ENABLED():
            return _backward_once(ctx, *grads)
        return _backward(ctx, *grads)


def _backward(ctx, *grads):
    """_Graphed.backward's work: the incoming gradients into the static ones, the BACKWARD
    replay, and the static gradients handed out (user args' as clones, parameters' as detached
    views)."""
    runner = ctx.runner
    s = runner.static
    if ctx.forward != runner.forwards:
        raise make_error("FAILED_PRECONDITION", _BACKWARD_STALE)
    if runner.backpropagated == ctx.forward:
        raise make_error("FAILED_PRECONDITION", _BACKWARD_TWICE)
    runner.backpropagated = ctx.forward
    need = ctx.needs_input_grad
    for k, static in s.grad_outputs.items():
        grad = grads[k]
        if grad is None:
            static.zero_()
        elif static.data_ptr() != grad.data_ptr() or not _same_tensor(static, grad):
            static.copy_(grad)
    runner.replay(_BACKWARD)
    s = runner.static  # captured anew if the daemon was restarted under the replay
    base = 1 + runner.n_args
    if any(need[1:base]):  # an arg that wants its gradient (else: None for the runner and each)
        result = [None]  # the runner
        for k in range(runner.n_args):
            g = s.grad_inputs.get(k)
            if (_lib.ROLE_GRAD_INPUT, k) in s.absent:
                g = None
            result.append(g.clone() if g is not None and need[1 + k] else None)
    else:
        result = [None] * base
    # The Function's parameter inputs (grad_params: none is absent, a frozen one has no
    # static gradient). AccumulateGrad takes a detached view as param.grad, with no copy.
    pairs, views = runner.grad_pairs(s)
    if pairs is not None and all(need[base:]):  # the usual step: every one wants its grad
        runner.handed_out.extend(pairs)
        result.extend(map(_DETACH, views))
    else:
        for j, k in enumerate(runner.grad_params):
            g = s.param_grads.get(k) if need[base + j] else None
            if g is not None:
                runner.handed_out.append((runner.module_params[k], g))
                g = g.detach()
            result.append(g)
    if runner.external_grads and runner.handed_out:
        runner.expose()
    return tuple(result)


_backward_once = torch.autograd.function.once_differentiable(_backward)
# _Graphed.apply as torch implements it in C (_Runner.__call__).
_APPLY = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
# A torch without it there (none known) keeps Function.apply, which does the same work.
_APPLY = _APPLY.__get__(None, _Graphed) if _APPLY is not None else _Graphed.apply
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_UNWRAP_IF_DEAD = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def _resolve_pool(client, pool, device):
    dev = client.check_device(device) if device is not None else None
    if isinstance(pool, PoolHandle):
        pool.bind(dev or "cpu:0", client)  # a handle made without a device: here, now
        if dev is not None and pool.device != dev:
            raise ValueError("graphd: pool %r is on %s, but device=%r" % (pool.name, pool.device,
                                                                          device))
        return pool
    if isinstance(pool, str):
        return pool
    if pool is not None:
        raise TypeError("graphd: pool must be a graphd.graph_pool_handle(), a pool name or None, "
                        "not %s" % type(pool).__name__)
    if dev is not None and dev != "cpu:0":
        return graph_pool_handle(device=dev, client=client)
    return None  # the daemon's default pool


_mps_checked = set()  # devices already checked in this process


def _warn_without_mps(client, device):
    """Once per device and process: a PerformanceWarning when the daemon reaches the GPU of a
    device-resident capture without NVIDIA MPS. Each replay then makes the GPU switch between
    this process's context and the daemon's twice, which makes a trivial ordered replay several
    times slower than under MPS (docs/BENCHMARKS.md, "Ordering probe")."""
    if device in _mps_checked:
        return
    _mps_checked.add(device)
    info = next((d for d in client.devices() if d["id"] == device), None)
    if info is not None and not info.get("mps", True):
        warnings.warn(
            "graphd: the daemon reaches %s without NVIDIA MPS, so every device-resident replay "
            "switches the GPU between this process's context and the daemon's; start "
            "`nvidia-cuda-mps-control -d` before graphd and its clients (docs/ARCHITECTURE.md, "
            "on MPS)" % device, PerformanceWarning, stacklevel=4)


def _cuda_device(callables, flatten_sample_args, device):
    """The CUDA device ("cuda:N") that the callables' parameters, buffers and sample args are
    on, for a device-resident capture; None when they are all on the CPU (graphd's CPU device,
    or host-staged with device="cuda:N")."""
    devs = set()
    for func, flat in zip(callables, flatten_sample_args):
        tensors = list(flat)
        if isinstance(func, torch.nn.Module):
            tensors += list(func.parameters()) + list(func.buffers())
        devs.update(t.device for t in tensors)
    if not any(d.type == "cuda" for d in devs):
        return None
    if len(devs) > 1:
        raise ValueError("graphd: the callables' parameters and sample args are on %s; put them "
                         "all on one device" % ", ".join(sorted(str(d) for d in devs)))
    d = devs.pop()
    name = "cuda:%d" % (d.index if d.index is not None else torch.cuda.current_device())
    if device is not None and normalize_device(device) != name:
        raise ValueError("graphd: the callables' tensors are on %s, but device=%r" %
                         (name, device))
    return name


def _graphed_class(cls):
    """The class a graphed module gets (as torch.nn.utils.parametrize does): cls under its own
    name, whose deepcopy and pickle give an eager copy of the module (its class, parameters,
    buffers and state, without the graphs), since the graphs live in the daemon and cannot be
    copied."""
    base = getattr(cls, "_graphd_eager_class", cls)
    sub = _GRAPHED_CLASSES.get(base)
    if sub is None:
        sub = type(base.__name__, (base,), {
            "_graphd_eager_class": base, "__module__": base.__module__,
            "__qualname__": base.__qualname__, "__deepcopy__": _eager_deepcopy,
            "__reduce_ex__": _eager_reduce_ex})
        _GRAPHED_CLASSES[base] = sub
    return sub


_GRAPHED_CLASSES = {}


def _eager_deepcopy(module, memo):
    """A deep copy of a graphed module as the eager module it was: the graphed forward and the
    runner are left out and the copy has the module's own class."""
    state = module.__dict__
    saved = {k: state.pop(k) for k in ("forward", "_graphd_runner") if k in state}
    cls = module.__class__
    module.__class__ = cls._graphd_eager_class
    try:
        return copy.deepcopy(module, memo)
    finally:
        module.__class__ = cls
        state.update(saved)


def _eager_reduce_ex(module, protocol):
    """Pickles the eager copy, unpickled by operator.getitem (the standard library's) so that
    loading it needs no graphd."""
    return operator.getitem, ([_eager_deepcopy(module, {})], 0)


def _bind_params(func, prefix, static, graph_id, bound):
    """The user's Parameters in PARAM order; each rebound to its static view (values copied in
    first) unless an earlier callable of this call already bound it."""
    if not isinstance(func, torch.nn.Module):
        if static.params:
            raise make_error("INTERNAL", "graph %d has parameters but the callable is not a "
                             "module" % graph_id)
        return []
    named = dict((prefix + n, p) for n, p in func.named_parameters())
    params = []
    for name in static.param_names:
        p = named.get(name)
        if p is None:
            raise make_error("INTERNAL", "graph %d: parameter %r is not one of the module's (%s)"
                             % (graph_id, name, ", ".join(sorted(named))))
        params.append(p)
    if len(params) != len(named):
        raise make_error("INTERNAL", "graph %d has %d parameters, the module %d" %
                         (graph_id, len(params), len(named)))
    with torch.no_grad():
        for p, view in zip(params, static.params):
            if id(p) in bound:
                continue
            if p.dtype != view.dtype or p.shape != view.shape:
                raise make_error("INTERNAL", "parameter is %s%s, its static tensor %s%s" %
                                 (p.dtype, tuple(p.shape), view.dtype, tuple(view.shape)))
            view.copy_(p)
            p.data = view
            bound.add(id(p))
    return params


def _warm_up_buffers(func, args, num_warmup_iters):
    """What upstream's warm-up does to a module's buffers: num_warmup_iters forwards on the
    sample args (BatchNorm's running stats and num_batches_tracked move as upstream's do). Only
    for modules with buffers; upstream's backward passes leave buffers alone and are skipped. The
    CPU RNG is forked, so the user's random stream is untouched, as upstream's device-side
    warm-up leaves it."""
    if (not isinstance(func, torch.nn.Module) or num_warmup_iters <= 0
            or next(func.buffers(), None) is None):
        return
    with torch.random.fork_rng(devices=[]):
        for _ in range(num_warmup_iters):
            func(*args)


def _slots(func, names, prefix, kind):
    """(owning module, attribute name, tensor) for each of func's parameters or buffers named
    in names (archive names, prefix included), for _Runner.check_module."""
    slots = []
    for name in names:
        if not name.startswith(prefix):
            continue  # a Python-side tensor's buffer (tracing.FREE): no attribute of func's
        path, _, attr = name[len(prefix):].rpartition(".")
        mod = func.get_submodule(path) if path else func
        slots.append((mod, attr, getattr(mod, kind)[attr], kind))
    return slots


def _bind_buffers(func, prefix, static, graph_id, bound, free=()):
    """The user's buffers in BUFFER order, as _bind_params does for parameters: each rebound to
    its static view (values copied in first), so the running stats every FORWARD updates are the
    module's own (eval-mode fallback, state_dict) and a write to a buffer (load_state_dict) is
    what the next replay reads. A buffer of a dtype graphd does not carry has no BUFFER tensor
    and stays local. free: the Python-side tensors that the trace made buffers of its wrapper
    ([(buffer name, tensor)], tracing.trace), bound the same way: the user's tensor then lives in
    the static tensor, so an in-place update to it is what the next replay reads."""
    named = dict(free)
    if isinstance(func, torch.nn.Module):
        try:  # every name of a buffer registered under several (the trace keeps them all)
            named.update((prefix + n, b) for n, b in func.named_buffers(remove_duplicate=False))
        except TypeError:  # torch < 2.0
            named.update((prefix + n, b) for n, b in func.named_buffers())
    buffers = []
    for name in static.buffer_names:
        b = named.get(name)
        if b is None:
            raise make_error("INTERNAL", "graph %d: buffer %r is not one of the module's (%s)"
                             % (graph_id, name, ", ".join(sorted(named))))
        buffers.append(b)
    with torch.no_grad():
        for name, b, view in zip(static.buffer_names, buffers, static.buffers):
            if id(b) in bound:
                continue
            if b.dtype != view.dtype or b.shape != view.shape:
                raise make_error("INTERNAL", "buffer %r is %s%s, its static tensor %s%s" %
                                 (name, b.dtype, tuple(b.shape), view.dtype, tuple(view.shape)))
            view.copy_(b)
            b.data = view
            bound.add(id(b))
    return buffers


def _bind_sample_args(flat_args, static, bound):
    """As upstream, where the sample args are the static inputs: a sample arg that is a plain
    leaf tensor (not a view, not a Parameter) now lives in the static input, so a loop that fills
    it in place and passes it pays no copy. Returns the args it bound."""
    done = []
    with torch.no_grad():
        for x, view in zip(flat_args, static.inputs):
            if (id(x) in bound or isinstance(x, torch.nn.Parameter) or not x.is_leaf
                    or x._base is not None or x.dtype != view.dtype or x.shape != view.shape
                    or x.device != view.device or view.numel() == 0):
                continue
            view.copy_(x)
            x.data = view
            bound.add(id(x))
            done.append(x)
    return done


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False,
                           pool=None, device=None):
    r"""Accepts callables (functions or nn.Modules) and returns graphed versions whose forward
    and backward replay graphs captured in graphd: the same signature and semantics as
    torch.cuda.make_graphed_callables (see its documentation), plus ``device`` (None or "cpu":
    graphd's CPU device; otherwise a device the daemon serves). Callables whose parameters and
    sample args are on a CUDA device are captured device-resident on that device (device None or
    that device): their static tensors are CUDA tensors in the daemon's device memory. CPU
    callables with device="cuda:N" are host-staged.

    callables: an nn.Module or function, or a tuple of them (captured in one pool, in the order
    they run). sample_args: a tuple of (pytrees of) tensors, or for a tuple of callables a tuple
    of such tuples. pool: graphd.graph_pool_handle(...), a pool name, or None (the daemon's
    default pool). A module comes back as itself with its forward replaced and its parameters
    living in shared memory; a function comes back as a new callable.
    """
    if _autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError(_AUTOCAST_MSG)

    just_one_callable = False
    if not isinstance(callables, tuple):
        just_one_callable = True
        callables = (callables,)
        sample_args = (sample_args,)
    callables, ddp_wrappers = _ddp.unwrap(callables)  # a DDP wrapper: its module (ddp.py)
    assert len(sample_args) == len(callables), (
        "make_graphed_callables: %d callables but %d sample_args tuples" %
        (len(callables), len(sample_args)))

    flatten_sample_args = []
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            assert (len(c._backward_hooks) == 0 and len(c._forward_hooks) == 0
                    and len(c._forward_pre_hooks) == 0), _HOOKS_MSG
            assert all(b.requires_grad is False for b in c.buffers()), _BUFFERS_MSG
        # A bare tensor would be unpacked along its first dimension: say so instead.
        assert not isinstance(args, torch.Tensor), (
            "sample_args must be a tuple of tensors (for a tuple of callables, a tuple of such "
            "tuples), not a tensor: write (x,)")
        flatten_arg = tree_flatten(tuple(args))[0]
        flatten_sample_args.append(tuple(flatten_arg))
        assert all(isinstance(arg, torch.Tensor) for arg in flatten_arg), _ARGS_MSG

    arg_specs = [[_spec(t, i, j) for j, t in enumerate(flat)]
                 for i, flat in enumerate(flatten_sample_args)]
    client = default_client()
    cuda_dev = _cuda_device(callables, flatten_sample_args, device)
    pool = _resolve_pool(client, pool, cuda_dev or device)

    # Trace and register every callable, then capture them in one call: one pool, forwards in
    # order and backwards in reverse order, as upstream.
    traced = []
    module_ids = []
    copy_param_grads = _lib.setting("GRAPHD_COPY_PARAM_GRADS") == "1"  # README, "Settings"
    slow = _slow.watch([callable_name(f) for f in callables])  # a log line if it takes long
    failed = True
    try:
        for func, args, flat in zip(callables, sample_args, flatten_sample_args):
            archive, out_spec, prefix, free = _trace(func, tuple(args), flat, _DTYPES)
            # The id of a module this client still holds from a capture of the same archive, or
            # a new one (trace_cache.register).
            module_ids.append(trace_cache.register(client, archive, callable_name(func)))
            traced.append((out_spec, prefix, free))
        graphs = client.capture([(mid, None, a) for mid, a in zip(module_ids, arg_specs)],
                                num_warmup_iters=num_warmup_iters,
                                allow_unused_input=allow_unused_input, pool=pool,
                                device_resident=cuda_dev is not None,
                                copy_param_grads=copy_param_grads)
        for graph in graphs:
            graph.device = cuda_dev  # where a device-resident graph's static tensors are
        if cuda_dev is not None:
            _warn_without_mps(client, cuda_dev)
        failed = False
    finally:
        slow.done(not failed)
        # The graphs own a copy: the modules are not needed any more, but for those the client
        # holds for a later capture of the same archive.
        trace_cache.release(client, module_ids, failed)

    # Upstream's warm-up updates the module's buffers; the daemon's updated its own copy (with
    # sample values of its own), so do here what upstream's warm-up does to them.
    for func, args in zip(callables, sample_args):
        _warm_up_buffers(func, tuple(args), num_warmup_iters)

    ret = []
    bound = set()
    for func, flat, graph, (out_spec, prefix, free) in zip(callables, flatten_sample_args,
                                                           graphs, traced):
        static = _Static(graph, len(flat))
        params = _bind_params(func, prefix, static, graph.id, bound)
        buffers = _bind_buffers(func, prefix, static, graph.id, bound, free)
        bound_args = _bind_sample_args(flat, static, bound)
        slots = []
        if isinstance(func, torch.nn.Module) and not isinstance(func, torch.jit.ScriptModule):
            slots = (_slots(func, static.param_names, prefix, "_parameters")
                     + _slots(func, static.buffer_names, prefix, "_buffers"))
        graphed = _Runner(graph, static, len(flat), params, out_spec, buffers, slots, bound_args)

        if isinstance(func, torch.nn.Module):
            # If the module's training-or-eval state matches what we graphed, the graph runs,
            # otherwise the original forward method.
            graphed.bind_module(func)
            func._graphd_runner = graphed  # the graph and its static tensors, for inspection
            if not isinstance(func, torch.jit.ScriptModule):
                func.__class__ = _graphed_class(type(func))
            ret.append(func)
        else:
            ret.append(graphed)

    ret = _ddp.rewrap(ret, ddp_wrappers)
    if just_one_callable:
        return ret[0]
    return tuple(ret)
