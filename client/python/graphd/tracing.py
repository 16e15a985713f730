"""The TorchScript archive of a callable, for the daemon to capture, and the checks that keep it
faithful.

torch.jit.trace records the tensor operations that one run of the callable performs. Whatever
Python reads along the way is frozen into the trace: a branch on a tensor's value, .item(), a
tensor that is neither an input nor a parameter or buffer (a closure's, a plain attribute's). A
frozen value is a silently wrong graph for every other input, so trace() turns each such case
into a clear error or a static input:

- A host read of a tensor's value (bool(t) in an `if`, int(t), float(t), t.item(), t.tolist(),
  t.numpy()) that depends on an input, a parameter or a buffer is an error naming the source
  line. Upstream refuses the same reads at capture (a host read is illegal while a CUDA stream
  captures). Reads of shapes (x.size(0), x.shape[1] > 2) stay allowed: a graph has fixed shapes.
- A tensor that the callable reads and that Python holds elsewhere (a closure's, a global's, a
  plain tensor attribute of a module) becomes a buffer of the traced wrapper, named
  "graphd_free_<k>", and so a BUFFER static tensor that make_graphed_callables binds as it binds
  the module's own buffers: the user's tensor then lives in the static tensor, and in-place
  updates to it are what the next replay reads, as upstream's graph reads the live memory.
- A Python function inside the trace (a custom torch.autograd.Function, a @torch.jit.ignore
  function) cannot run in the daemon: an error saying so.
- BatchNorm with momentum=None in training mode reads num_batches_tracked on the host at every
  forward: an error, as upstream's capture refuses it.
"""
import gc
import inspect
import io
import os
import tempfile
import threading
import traceback
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import make_error

WRAPPED = "m."  # prefix of the user's module inside _FlatCall
FREE = "graphd_free_"  # prefix of the buffers that stand for Python-side tensors


class _FlatCall(torch.nn.Module):
    """Calls the user's callable with its args rebuilt from flat tensors and returns the outputs
    flattened, so the traced archive's forward takes and returns flat tensors (what the daemon's
    Capture describes), whatever pytree structure the user's callable has."""

    def __init__(self, func, in_spec):
        super().__init__()
        if isinstance(func, torch.nn.Module):
            self.m = func
        else:
            self.__dict__["fn"] = func  # a plain attribute, never a submodule
        self.__dict__["in_spec"] = in_spec
        self.__dict__["out_spec"] = None

    def forward(self, *flat):
        args = tree_unflatten(list(flat), self.in_spec)
        out = (self.m if "m" in self._modules else self.fn)(*args)
        leaves, self.__dict__["out_spec"] = tree_flatten(out)
        return tuple(leaves)


class _Unchanged:
    """Runs a block without leaving a trace in module state or the RNG stream: buffers (BatchNorm
    running stats) are restored and the CPU RNG is forked, so tracing is invisible to the user's
    training run."""

    def __init__(self, func):
        self.buffers = list(func.buffers()) if isinstance(func, torch.nn.Module) else []

    def __enter__(self):
        with torch.no_grad():
            self.saved = [b.clone() for b in self.buffers]
        self.rng = torch.random.fork_rng(devices=[])
        self.rng.__enter__()

    def __exit__(self, *exc):
        self.rng.__exit__(*exc)
        with torch.no_grad():
            for b, s in zip(self.buffers, self.saved):
                b.copy_(s)


def callable_name(func):
    if isinstance(func, torch.nn.Module):
        return type(func).__name__
    return getattr(func, "__name__", None) or type(func).__name__


# ---- host reads --------------------------------------------------------------------------

# Tensor methods that hand a tensor's value to Python, and how the message names each.
_HOST_READS = {
    "__bool__": "bool() of a tensor (an `if`, `while`, `and` or `or` on a tensor)",
    "__int__": "int() of a tensor", "__float__": "float() of a tensor",
    "__complex__": "complex() of a tensor", "__index__": "a tensor used as a Python index",
    "item": "Tensor.item()", "tolist": "Tensor.tolist()", "numpy": "Tensor.numpy()",
}
# Nodes whose result depends only on shapes, dtypes and devices, never on tensor values.
_SHAPE_KINDS = frozenset(("aten::size", "aten::sym_size", "aten::dim", "aten::numel",
                          "aten::sym_numel", "aten::len", "prim::device", "prim::dtype",
                          "prim::layout", "aten::is_floating_point"))
_MISSING = object()
_patch_lock = threading.Lock()
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


class _HostRead(Exception):
    """Raised out of the user's forward by a guarded host read; trace() turns it into the
    user-facing error."""


def _reads_values(value, consts):
    """Whether a traced value depends on the values (not only the shapes) of the trace's inputs,
    parameters or buffers. The tensor constants it depends on are appended to consts: a Python
    number the tracer wrapped (head_dim * num_heads == embed_dim in torch.nn's checks) is no
    value that changes, a tensor Python holds elsewhere is (_HostReadsRefused.check decides)."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        node = v.node()
        kind = node.kind()
        if kind in _SHAPE_KINDS:
            continue
        if kind == "prim::Constant":
            if isinstance(v.type(), torch._C.TensorType):
                consts.append(node.t("value"))
            continue
        if kind in ("prim::Param", "prim::GetAttr"):
            return True
        stack.extend(node.inputs())
    return False


def _held_by_python(tensors, ours):
    """The ids of those of tensors that something holds besides frames and the containers in
    ours (the caller's own lists): a module's __dict__, a closure cell, a global, a container.
    One scan of the garbage collector's objects for all of them."""
    own = {id(c) for c in ours}
    held = set()
    for r in gc.get_referrers(*tensors):
        if id(r) not in own and not inspect.isframe(r):
            held.update(id(x) for x in gc.get_referents(r))
    return held


def _user_frame():
    """'file:line: code' of the innermost frame outside torch and graphd (the user's line)."""
    for fr in reversed(traceback.extract_stack()):
        f = os.path.abspath(fr.filename)
        if not (f.startswith(_TORCH_DIR + os.sep) or f.startswith(_HERE + os.sep)):
            return "%s:%d: %s" % (fr.filename, fr.lineno, (fr.line or "").strip())
    return "an unknown line"


def _guard(name, orig, pending):
    def guarded(self, *args, **kwargs):
        if torch._C._get_tracing_state() is not None:
            consts = []
            try:
                reads = _reads_values(torch._C._get_value_trace(self), consts)
            except RuntimeError:  # not part of the trace: a tensor Python made on the side
                reads = True
            what = "%s reads a tensor's value on the host at %s" % (_HOST_READS[name],
                                                                    _user_frame())
            if reads:
                raise _HostRead(what)
            if consts:
                pending.append((what, consts))
        return orig(self, *args, **kwargs)
    guarded.__name__ = getattr(orig, "__name__", name)
    return guarded


class _HostReadsRefused:
    """While tracing, the Tensor methods of _HOST_READS raise _HostRead when the value they read
    depends on the values of inputs, parameters or buffers; reads that depend on tensor
    constants only wait for check(). The tracer's own warnings for the reads let through
    (shapes) are silenced: for a graph of fixed shapes they are not a risk."""

    def __enter__(self):
        _patch_lock.acquire()
        self.saved = {}
        self.pending = []  # (message, [tensor constants the read depends on])
        try:
            for name in _HOST_READS:
                orig = getattr(torch.Tensor, name, None)
                if orig is None:
                    continue
                self.saved[name] = torch.Tensor.__dict__.get(name, _MISSING)
                setattr(torch.Tensor, name, _guard(name, orig, self.pending))
        except BaseException:
            self._restore()
            raise
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.filterwarnings("ignore", message="Converting a tensor to a ",
                                category=torch.jit.TracerWarning)
        return self

    def _restore(self):
        for name, orig in self.saved.items():
            if orig is _MISSING:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, orig)
        _patch_lock.release()

    def __exit__(self, *exc):
        self.warnings.__exit__(*exc)
        self._restore()

    def check(self):
        """After the trace: _HostRead for the first pending read that depends on a tensor Python
        holds elsewhere (a module's __dict__, a closure cell, a global, a container: found by
        the garbage collector's referrers, one scan for all). A tensor the tracer made from a
        Python number is held by nothing but the graph and these lists."""
        consts = [t for _, ts in self.pending for t in ts]
        if not consts:
            return
        held = _held_by_python(consts, [consts] + [ts for _, ts in self.pending])
        for what, ts in self.pending:
            if any(id(t) in held for t in ts):
                raise _HostRead(what)


# ---- what the trace froze ----------------------------------------------------------------

def _nodes(graph):
    """Every node of graph, sub-blocks included."""
    stack = [graph.nodes()]
    while stack:
        for node in stack.pop():
            yield node
            stack.extend(node.blocks())


def _where(node):
    """The innermost line of the user's code in node's traceback ("file(line): function")."""
    lines = [ln.strip() for ln in node.sourceRange().split("\n") if ln.strip()]
    for ln in lines:
        if not os.path.abspath(ln).startswith(_TORCH_DIR + os.sep):
            return ln
    return lines[0] if lines else "an unknown line"


def _python_side_tensors(scripted):
    """The tensors frozen into the trace as constants that Python holds elsewhere (a module's
    __dict__, a closure cell, a global, a container), each once. A tensor that the callable made
    while it ran (torch.tensor([...]) in forward) is held by nothing but frames."""
    consts, where = [], {}
    for node in _nodes(scripted.inlined_graph):
        if node.kind() == "prim::Constant" and isinstance(node.output().type(),
                                                          torch._C.TensorType):
            t = node.t("value")
            if id(t) not in where:
                consts.append(t)
                where[id(t)] = _where(node)
    if not consts:
        return []
    held = _held_by_python(consts, [consts])
    return [(t, where[id(t)]) for t in consts if id(t) in held]


def _python_ops(scripted):
    return [(node.pyname(), _where(node))
            for node in _nodes(scripted.inlined_graph) if node.kind() == "prim::PythonOp"]


# Ops whose result's shape depends on tensor values (upstream's capture refuses them: they
# synchronise with the host); aten::index is one when an index is a mask.
_VALUE_SHAPED = frozenset(("aten::nonzero", "aten::nonzero_numpy", "aten::argwhere",
                           "aten::masked_select", "aten::unique", "aten::_unique",
                           "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive"))


def _value_shaped_ops(scripted):
    found = []
    for node in _nodes(scripted.inlined_graph):
        kind = node.kind()
        if kind == "aten::index":
            indices = list(node.inputs())[1].node().inputs()
            if not any(isinstance(v.type(), torch._C.TensorType)
                       and v.type().scalarType() in ("Bool", "Byte") for v in indices):
                continue
            kind = "indexing with a mask"
        elif kind not in _VALUE_SHAPED:
            continue
        found.append("%s at %s" % (kind, _where(node)))
    return found


def _refuse(name, what, fix):
    raise make_error("INVALID_ARGUMENT", "graphd cannot capture %s faithfully: %s. %s" %
                     (name, what, fix))


def _check_modules(func, name):
    if not isinstance(func, torch.nn.Module):
        return
    for path, mod in func.named_modules():
        if (isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.momentum is None
                and mod.training and mod.track_running_stats):
            _refuse(name, "%s (%s) has momentum=None, whose cumulative average reads "
                    "num_batches_tracked on the host at every forward (upstream's capture "
                    "refuses it too)" % (path or "the module", type(mod).__name__),
                    "Give it a momentum (e.g. momentum=0.1), or graph it in eval mode")


def _check_free(name, tensors, dtypes):
    for t, where in tensors:
        if t.dtype not in dtypes or t.layout != torch.strided:
            _refuse(name, "it reads a %s %s tensor that is neither an arg, a parameter nor a "
                    "buffer (%s)" % (t.dtype, t.layout, where),
                    "Pass it as an arg, or make it a buffer (register_buffer)")
        if t._base is not None:
            _refuse(name, "it reads a tensor that is neither an arg, a parameter nor a buffer "
                    "and is a view of another tensor (%s): graphd keeps such tensors in sync "
                    "with the graph by moving them into shared memory, which would cut the view "
                    "off from its base" % where,
                    "Pass it as an arg, or make the whole tensor a buffer (register_buffer)")


def _trace_wrapper(wrapper, flat_args, name):
    try:
        with _HostReadsRefused() as reads:
            scripted = torch.jit.trace(wrapper, tuple(flat_args), check_trace=False)
        reads.check()
        return scripted
    except _HostRead as e:
        _refuse(name, str(e), "A graph replays tensor operations only, so the value would stay "
                "what it was at capture. Compute it with tensor operations instead (torch.where "
                "for a branch, keep the tensor instead of .item()), or keep this code outside "
                "the graphed callable")
    except RuntimeError as e:
        if "requires grad as a constant" in str(e):
            _refuse(name, "it reads a tensor that requires grad but is neither an arg nor one "
                    "of its parameters (a closure's, a global's or another module's), whose "
                    "gradient the graph would never compute",
                    "Pass it as an arg, or make it a parameter of the module (nn.Parameter)")
        raise


def trace(func, args, flat_args, dtypes):
    """(archive bytes, output spec, parameter name prefix in the archive, Python-side tensors the
    archive reads as buffers: [(buffer name, tensor)]). dtypes: those graphd carries. Raises
    graphd.InvalidArgument for a callable whose trace would not be faithful."""
    name = callable_name(func)
    as_is = (isinstance(func, torch.jit.ScriptModule) and isinstance(args, tuple)
             and len(args) == len(flat_args) and all(isinstance(a, torch.Tensor) for a in args))
    free = []
    with _Unchanged(func):
        if as_is:  # scripted code reads no Python state: nothing can be frozen
            with torch.no_grad():
                out_spec = tree_flatten(func(*args))[1]
            scripted, prefix = func, ""
        else:
            _check_modules(func, name)
            wrapper = _FlatCall(func, tree_flatten(args)[1])
            if isinstance(func, torch.nn.Module):
                wrapper.training = func.training  # not .train(): keeps the submodules' own modes
            scripted = _trace_wrapper(wrapper, flat_args, name)
            found = _python_side_tensors(scripted)
            if found:  # trace again, with each of them a buffer of the wrapper
                _check_free(name, found, dtypes)
                for k, (t, _) in enumerate(found):
                    wrapper.register_buffer(FREE + str(k), t)
                    free.append((FREE + str(k), t))
                scripted = _trace_wrapper(wrapper, flat_args, name)
                left = _python_side_tensors(scripted)
                if left:
                    _refuse(name, "it reads tensors that Python holds elsewhere (%s), and "
                            "graphd could not make them inputs of the graph" %
                            "; ".join(w for _, w in left), "Pass them as args")
            ops = _python_ops(scripted)
            if ops:
                _refuse(name, "it calls Python code that TorchScript cannot record: %s. The "
                        "daemon runs TorchScript, not Python, so a custom "
                        "torch.autograd.Function (or a @torch.jit.ignore function) cannot run "
                        "there" % "; ".join("%s at %s" % op for op in ops),
                        "Write it with torch operations (autograd then derives its backward), or "
                        "graph this callable in-process with torch.cuda.make_graphed_callables")
            shaped = _value_shaped_ops(scripted)
            if shaped:
                _refuse(name, "the shape of a result depends on tensor values (%s), and a graph "
                        "has fixed shapes" % "; ".join(shaped),
                        "Use operations of fixed shape instead (torch.where(mask, x, 0), "
                        "masked_fill, a sum over x * mask)")
            out_spec, prefix = wrapper.out_spec, WRAPPED
    with _ParametersLeftOut(scripted):
        archive = _archive(scripted)
    return archive, out_spec, prefix, free


class _ParametersLeftOut:
    """While saving the archive, each parameter of the traced module is a one-element tensor
    expanded to its shape (stride 0), so the archive carries the module's code, shapes and
    buffers but not its weights: the daemon needs only their shapes (its warm-up and capture
    record kernels, not values), and the client copies the user's parameters into the static
    PARAM tensors when it binds them, which it does anyway. A (256, 4096, 8) MLP's archive goes
    from 537 MB to kilobytes, and with it the save, the copy into the region, the daemon's SHA-256
    and torch::jit::load. The traced module shares its parameters with the user's module, so
    they are restored at once."""

    def __init__(self, scripted):
        self.params = list({id(p): p for p in scripted.parameters()}.values())

    def __enter__(self):
        self.saved = [p.data for p in self.params]
        for p in self.params:
            p.data = torch.zeros((), dtype=p.dtype, device=p.device).expand(p.shape)

    def __exit__(self, *exc):
        for p, data in zip(self.params, self.saved):
            p.data = data


def _archive(scripted):
    """torch.jit.save's archive of scripted, as bytes. Saved to a file (in memory where /dev/shm
    exists) that libtorch writes itself: saving to a BytesIO goes through save_to_buffer and
    Python's writes, much slower (docs/BENCHMARKS.md, "One-off probes"). The file is
    called "archive", the name torch.jit.save gives a buffer's archive, so the bytes are the same
    (and so is their SHA-256, which the daemon's module cache goes by)."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    try:
        with tempfile.TemporaryDirectory(prefix="graphd-", dir=shm) as d:
            path = os.path.join(d, "archive")
            torch.jit.save(scripted, path)
            with open(path, "rb") as f:
                return f.read()
    except (OSError, RuntimeError):  # nowhere to write (a save error comes back below)
        buf = io.BytesIO()
        torch.jit.save(scripted, buf)
        return buf.getvalue()
