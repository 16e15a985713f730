"""Traced archives reused across captures (issue 18): a process's second and later captures of a
module with the same structure skip torch.jit.trace and torch.jit.save, and with the disk cache
so does a new process's first.

tracing.trace's result (the archive, the output spec, the parameter prefix) depends only on what
the trace reads, and key() names all of it:
- the code: for each module of the tree, its class (module, qualified name) and, for classes
  outside torch, the bytecode, constants, defaults and closure of every function of the class
  and its bases, with the globals that code names (plain values by value, functions by their
  code, recursively; the modules of torch, numpy and the standard library by name, a module of
  the user's not at all: uncacheable); torch's own classes go by torch's version;
- the structure: each module's path, training flag and every other attribute of its __dict__
  (hook dicts included), which must be plain values (numbers, strings, None, dtypes, devices
  and containers of them); parameter and buffer names, shapes, strides, dtypes, devices,
  requires_grad, and which of them (and of the args) are the same tensor;
- the sample args: their pytree structure and each flat tensor's shape, stride, dtype, device,
  layout and requires_grad;
- torch's state the trace reads (grad mode, default dtype and device, autocast; any other torch
  function or dispatch mode active makes it uncacheable) and the versions of torch
  and of this package's tracing code (tracing.py and this file, by content).
A callable whose key cannot be made that way is traced every time (uncacheable, with the
reason in last_reason): a plain function, a ScriptModule, a hook, a tensor or an object of
another kind held in an attribute, a global or a closure (issue 7's Python-side tensors), a
buffer of a dtype graphd does not carry (its value would come from the archive). Issue 7's
guards are kept: a cached archive is one that passed them under the same key, and a key whose
trace fails them is never stored.

Buffer values are in the archive but never read from it: the client copies its own buffers into
the static BUFFER tensors when it binds them (graphs._bind_buffers), so an archive traced from
another instance of the same structure gives bit-identical graphs.

Cache levels (GRAPHD_TRACE_CACHE): "disk" (default) keeps the archives in this process's memory
and in GRAPHD_TRACE_CACHE_DIR (default $XDG_CACHE_HOME/graphd/traces, else
~/.cache/graphd/traces): one file per key, written 0600 into a 0700 directory that must belong
to this uid and be closed to others, else it is not used (a warning says what to change). A file
is used only if it is a regular file of this uid closed to others, carries the key it is named
by and the SHA-256 of its header and archive matches; anything else is a miss (a corrupt file
of ours, or one of an earlier format, is removed and written again). "memory" keeps them in
memory only, "off" traces every time.

Modules held (register() and release(), around the Capture call): the daemon loads an archive
once per uid (its executor finds the same bytes by SHA-256), but only while some session holds
it; make_graphed_callables used to release its module right after the capture, so the next
capture of the same structure uploaded and loaded it again. A client now keeps the modules of
archives from this cache registered in its session (at most MODULES_HELD, least recently used
released first) and gives the same module id to a later capture of the same archive, which then
skips RegisterModule; and while this process holds it, another process of the same uid that
registers the same archive gets the daemon's loaded module back instead of a new load. Module
ids are the session's own and the daemon's executors are per uid, so nothing is shared across
tenants (tests/python/test_capture_cache.py). The session's status counts them as its modules.
"""
import collections
import enum
import hashlib
import json
import os
import stat
import sys
import tempfile
import threading
import types
import warnings
import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _lib, tracing

# A cache file: MAGIC, the hex SHA-256 of everything after its line, a line of JSON (key, prefix,
# output spec, archive size), the archive. Version 1 covered the archive alone, so a damaged header
# could still parse into another output structure; its files are misses, written again.
MAGIC = b"graphd-trace 2\n"
MEMORY_MAX = 256  # archives kept in memory (least recently used dropped)
MODULES_HELD = 16  # modules a client keeps registered for later captures (see register())
FILE_MAX = 1 << 30  # a cache file larger than this is not read

stats = {"memory": 0, "disk": 0, "traced": 0, "uncacheable": 0, "corrupt": 0, "refused": 0,
         "held": 0}
last_reason = None  # why the last uncacheable callable was

_memory = {}  # key => (archive, out_spec, prefix, archive's SHA-256)
_holdable = {}  # SHA-256 of an archive in _memory => how many keys have it
_held = weakref.WeakKeyDictionary()  # Client => OrderedDict SHA-256 => module id (LRU first)
_lock = threading.Lock()
_warned = set()
_source_digest = None


class Uncacheable(Exception):
    """key() cannot name everything the callable's trace depends on."""


def clear_memory():
    with _lock:
        _memory.clear()
        _holdable.clear()


def reset_stats():
    for k in stats:
        stats[k] = 0


# ---- the key -----------------------------------------------------------------------------

_ATOMS = (type(None), type(Ellipsis), bool, int, float, complex, str, bytes)
_TORCH_ATOMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)


def _plain(v, depth=0):
    """A canonical text of a plain value; Uncacheable for anything else."""
    if depth > 16:
        raise Uncacheable("a value nested more than 16 deep")
    t = type(v)
    if t in _ATOMS:
        return "%s:%r" % (t.__name__, v)
    if isinstance(v, _TORCH_ATOMS):
        return "%s:%s" % (t.__name__, v)
    if t in (tuple, list, torch.Size):
        return "%s(%s)" % (t.__name__, ",".join(_plain(x, depth + 1) for x in v))
    if isinstance(v, dict) and t.__module__ in ("builtins", "collections"):
        return "%s{%s}" % (t.__name__, ",".join("%s:%s" % (_plain(k, depth + 1),
                                                             _plain(x, depth + 1))
                                                 for k, x in v.items()))
    if t is slice:
        return "slice(%s)" % ",".join(_plain(x, depth + 1) for x in (v.start, v.stop, v.step))
    if t in (set, frozenset):
        return "%s{%s}" % (t.__name__, ",".join(sorted(_plain(x, depth + 1) for x in v)))
    if isinstance(v, enum.Enum):
        return "enum:%s.%s.%s" % (t.__module__, t.__qualname__, v.name)
    if isinstance(v, torch.Tensor):
        raise Uncacheable("it reads a tensor that is not a parameter, a buffer or an arg")
    raise Uncacheable("it reads a %s.%s object, whose effect on the trace graphd cannot key"
                      % (t.__module__, t.__qualname__))


def _is_torch(obj):
    mod = getattr(obj, "__module__", None) or ""
    return mod == "torch" or mod.startswith("torch.")


class _Keyer:
    def __init__(self):
        self.seen = {}  # id(function or class) => its text (cycles: a name)

    def code(self, co, globs, out):
        out.append(co.co_code.hex())
        out.append(repr(co.co_names) + repr(co.co_varnames) + repr(co.co_freevars))
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c, globs, out)
            else:
                out.append(_plain(c))
        for name in co.co_names:
            if name in globs:
                out.append("global %s=%s" % (name, self.value(globs[name])))

    def function(self, fn):
        if id(fn) in self.seen:
            return self.seen[id(fn)]
        name = "fn:%s.%s" % (fn.__module__, fn.__qualname__)
        self.seen[id(fn)] = name  # a recursive function names itself
        if len(self.seen) > 512:
            raise Uncacheable("its code reaches more than 512 functions and classes")
        out = [name]
        self.code(fn.__code__, fn.__globals__, out)
        out.append(_plain(fn.__defaults__))
        out.append(_plain(fn.__kwdefaults__))
        for cell in fn.__closure__ or ():
            try:
                out.append(self.value(cell.cell_contents))
            except ValueError:  # an empty cell
                out.append("empty")
        text = hashlib.sha256("\n".join(out).encode()).hexdigest()
        self.seen[id(fn)] = text
        return text

    def cls(self, c):
        if id(c) in self.seen:
            return self.seen[id(c)]
        name = "class:%s.%s" % (c.__module__, c.__qualname__)
        self.seen[id(c)] = name
        if _is_torch(c) or c.__module__ == "builtins":
            return name
        out = [name]
        for base in c.__mro__[1:]:
            out.append(self.cls(base))
        for k, v in sorted(vars(c).items()):
            if k in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__",
                     "__annotations__", "__slotnames__", "__parameters__", "__orig_bases__"):
                continue
            out.append("%s=%s" % (k, self.value(v)))
        text = hashlib.sha256("\n".join(out).encode()).hexdigest()
        self.seen[id(c)] = text
        return text

    def value(self, v):
        """A global's, a closure cell's or a class attribute's value."""
        if isinstance(v, (staticmethod, classmethod)):
            return "%s(%s)" % (type(v).__name__, self.value(v.__func__))
        if isinstance(v, property):
            return "property(%s)" % ",".join(self.value(f) for f in (v.fget, v.fset, v.fdel))
        if isinstance(v, types.FunctionType):
            return self.function(v) if not _is_torch(v) else "fn:%s.%s" % (v.__module__,
                                                                            v.__qualname__)
        if isinstance(v, type):
            return self.cls(v)
        if isinstance(v, types.ModuleType):
            top = v.__name__.partition(".")[0]
            if top not in ("torch", "numpy") and top not in getattr(sys, "stdlib_module_names",
                                                                      ()):
                raise Uncacheable("its code reads module %s, whose attributes graphd cannot key"
                                  % v.__name__)
            return "module:" + v.__name__
        if isinstance(v, (types.BuiltinFunctionType, types.MethodDescriptorType,
                          types.WrapperDescriptorType, types.GetSetDescriptorType,
                          types.MemberDescriptorType)):
            return "builtin:%s.%s" % (getattr(v, "__module__", None) or
                                      getattr(getattr(v, "__objclass__", None), "__name__", ""),
                                      getattr(v, "__qualname__", getattr(v, "__name__", "")))
        if isinstance(v, torch.nn.Module):
            raise Uncacheable("its code reads a module that is not one of its submodules")
        if _is_torch(type(v)) and not isinstance(v, torch.Tensor) and callable(v):
            return "torch:%s.%s" % (type(v).__module__, type(v).__qualname__)
        return _plain(v)


def _tensor(t):
    return "%s %s %s %s %s %s rg=%d" % (type(t).__qualname__, t.dtype, tuple(t.shape),
                                        t.stride() if t.layout == torch.strided else (),
                                        t.device, t.layout, t.requires_grad)


def _sources():
    global _source_digest
    if _source_digest is None:
        h = hashlib.sha256()
        for f in (tracing.__file__, __file__):
            with open(f, "rb") as src:
                h.update(src.read())
        _source_digest = h.hexdigest()
    return _source_digest


def _autocast():
    try:
        cpu = torch.is_autocast_enabled("cpu")  # torch >= 2.4
    except TypeError:
        cpu = torch.is_autocast_cpu_enabled()
    return (torch.is_autocast_enabled(), cpu)


def _modes():
    """The torch function and dispatch modes a trace would run under: the default device's
    (torch.set_default_device, torch >= 2.0) by its device; any other changes what the trace
    records in ways graphd cannot key, so it is uncacheable."""
    out = []
    for mode in torch.overrides._get_current_function_mode_stack():
        if type(mode).__name__ == "DeviceContext" and _is_torch(type(mode)):
            out.append("default device %s" % mode.device)
        else:
            raise Uncacheable("a torch function mode (%s) is active"
                              % type(mode).__qualname__)
    if torch._C._len_torch_dispatch_stack():
        raise Uncacheable("a torch dispatch mode is active")
    return out


def key(func, args, flat_args, dtypes):
    """The hex SHA-256 naming everything tracing.trace(func, args, ...) depends on; Uncacheable
    when it cannot be named (see the module docstring)."""
    if not isinstance(func, torch.nn.Module):
        raise Uncacheable("only modules are cached, not a %s" % type(func).__name__)
    if isinstance(func, torch.jit.ScriptModule):
        raise Uncacheable("a ScriptModule is taken as is")
    m = torch.nn.modules.module
    for hooks in ("_global_forward_hooks", "_global_forward_pre_hooks",
                  "_global_backward_hooks", "_global_backward_pre_hooks"):
        if getattr(m, hooks, None):
            raise Uncacheable("a global module hook is registered")
    keyer = _Keyer()
    alias = {}  # id(tensor) => its first index, across parameters, buffers and args

    def same(t):
        return alias.setdefault(id(t), len(alias))

    out = ["torch " + torch.__version__, "tracing " + _sources(),
           "grad %d default %s autocast %s" % (torch.is_grad_enabled(),
                                               torch.get_default_dtype(), _autocast())]
    out += _modes()
    for path, mod in func.named_modules(remove_duplicate=False):
        if isinstance(mod, torch.jit.ScriptModule):
            raise Uncacheable("submodule %r is a ScriptModule" % path)
        out.append("module %r %s training=%d" % (path, keyer.cls(type(mod)), mod.training))
        for k, v in mod.__dict__.items():
            if k in ("_parameters", "_buffers", "_modules", "training"):
                continue
            try:
                out.append("attr %s=%s" % (k, _plain(v)))
            except Uncacheable as e:
                raise Uncacheable("%s (attribute %r of %s)" % (e, k, path or "the module"))
        for k, p in mod._parameters.items():
            out.append("param %s %s" % (k, "None" if p is None else
                                        "%s #%d" % (_tensor(p), same(p))))
        for k, b in mod._buffers.items():
            if b is not None and b.dtype not in dtypes:
                raise Uncacheable("buffer %r is %s, which graphd does not carry" % (k, b.dtype))
            out.append("buffer %s %s" % (k, "None" if b is None else
                                         "%s #%d" % (_tensor(b), same(b))))
        for k, sub in mod._modules.items():
            out.append("child %s %s" % (k, "None" if sub is None else "#%d" % same(sub)))
    out.append("args " + repr(tree_flatten(args)[1]))
    for t in flat_args:
        out.append("arg %s #%d" % (_tensor(t), same(t)))
    return hashlib.sha256("\n".join(out).encode()).hexdigest()


# ---- output specs on disk ----------------------------------------------------------------

class _Leaf:
    pass


_LEAF = _Leaf()


def _encode(obj):
    t = type(obj)
    if obj is _LEAF:
        return "x"
    if t in (tuple, list):
        return [t.__name__[0], [_encode(x) for x in obj]]
    if t is dict and all(type(k) is str for k in obj):
        return ["d", [[k, _encode(v)] for k, v in obj.items()]]
    raise ValueError("output of a %s" % t.__name__)


def _decode(j):
    if j == "x":
        return _LEAF
    kind, items = j
    if kind == "t":
        return tuple(_decode(x) for x in items)
    if kind == "l":
        return [_decode(x) for x in items]
    if kind == "d":
        return {k: _decode(v) for k, v in items}
    raise ValueError("unknown kind %r" % kind)


def _spec_text(spec):
    """JSON of an output spec (tuples, lists, dicts with str keys); ValueError for others."""
    return _encode(tree_unflatten([_LEAF] * spec.num_leaves, spec))


def _spec_of(text):
    return tree_flatten(_decode(text))[1]


# ---- the disk cache ----------------------------------------------------------------------

def _warn_once(what, msg):
    if what not in _warned:
        _warned.add(what)
        warnings.warn("graphd: " + msg, RuntimeWarning, stacklevel=5)


def cache_dir():
    d = _lib.setting("GRAPHD_TRACE_CACHE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "graphd", "traces")


def _private_dir():
    """The cache directory, made 0700 if missing; None (and a warning) if it is not this uid's
    alone."""
    d = cache_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        _warn_once(("mkdir", d), "no trace cache in %s (%s): set GRAPHD_TRACE_CACHE_DIR to a "
                   "directory of yours, or GRAPHD_TRACE_CACHE=memory" % (d, e.strerror))
        return None
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
            or st.st_mode & 0o077):
        _warn_once(("private", d), "not using the trace cache directory %s: it must be a "
                   "directory of uid %d closed to others (it is %s of uid %d, mode %04o); "
                   "`chmod 700 %s`, or set GRAPHD_TRACE_CACHE_DIR to another" % (
                       d, os.geteuid(), "a directory" if stat.S_ISDIR(st.st_mode) else
                       "not a directory", st.st_uid, stat.S_IMODE(st.st_mode), d))
        return None
    return d


def _load(d, k):
    path = os.path.join(d, k + ".trace")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # a link (O_NOFOLLOW), unreadable
        stats["refused"] += 1
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077
                or st.st_size > FILE_MAX):
            stats["refused"] += 1  # not ours alone: never read, never removed
            return None
        data = f.read()
    try:
        if not data.startswith(MAGIC):
            raise ValueError("no header of this version")
        end = data.index(b"\n", len(MAGIC))
        digest, rest = data[len(MAGIC):end], data[end + 1:]
        if digest.decode() != hashlib.sha256(rest).hexdigest():
            raise ValueError("digest differs")
        end = rest.index(b"\n")
        head = json.loads(rest[:end].decode())
        archive = rest[end + 1:]
        if head["key"] != k or head["size"] != len(archive):
            raise ValueError("key or size differ")
        return archive, _spec_of(head["out"]), str(head["prefix"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        stats["corrupt"] += 1
        try:
            os.unlink(path)
        except OSError:
            pass
        return None


def _file_bytes(head, archive):
    """A cache file's bytes for header JSON head (bytes) and archive."""
    rest = head + b"\n" + archive
    return MAGIC + hashlib.sha256(rest).hexdigest().encode() + b"\n" + rest


def _store(d, k, archive, out_spec, prefix):
    try:
        out = _spec_text(out_spec)
    except ValueError:
        return  # an output structure of another kind: memory only
    head = json.dumps({"key": k, "prefix": prefix, "out": out, "size": len(archive)}).encode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)  # 0600
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_file_bytes(head, archive))
        os.replace(tmp, os.path.join(d, k + ".trace"))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


# ---- the hook ----------------------------------------------------------------------------

def trace(func, args, flat_args, dtypes):
    """tracing.trace's result, from the cache when an archive of the same key is there."""
    global last_reason
    level = _lib.setting("GRAPHD_TRACE_CACHE")
    if level == "off":
        return tracing.trace(func, args, flat_args, dtypes)
    try:
        k = key(func, args, flat_args, dtypes)
    except Exception as e:  # Uncacheable, or an object key() did not expect: trace it
        stats["uncacheable"] += 1
        last_reason = str(e) if isinstance(e, Uncacheable) else "%s: %s" % (type(e).__name__, e)
        return tracing.trace(func, args, flat_args, dtypes)
    tracing._check_modules(func, tracing.callable_name(func))  # cheap: the same error at once
    with _lock:
        hit = _memory.pop(k, None)
        if hit is not None:
            _memory[k] = hit  # most recently used last
    if hit is not None:
        stats["memory"] += 1
        return hit[:3] + ([],)
    d = _private_dir() if level == "disk" else None
    hit = _load(d, k) if d else None
    if hit is not None:
        stats["disk"] += 1
    else:
        archive, out_spec, prefix, free = tracing.trace(func, args, flat_args, dtypes)
        stats["traced"] += 1
        if free:  # Python-side tensors made buffers: this instance's own (key() refuses them)
            return archive, out_spec, prefix, free
        hit = (archive, out_spec, prefix)
        if d:
            _store(d, k, archive, out_spec, prefix)
    digest = hashlib.sha256(hit[0]).hexdigest()
    with _lock:
        if k not in _memory:
            _holdable[digest] = _holdable.get(digest, 0) + 1
        _memory[k] = hit + (digest,)
        while len(_memory) > MEMORY_MAX:
            gone = _memory.pop(next(iter(_memory)))[3]
            _holdable[gone] -= 1
            if not _holdable[gone]:
                del _holdable[gone]
    return hit + ([],)


def register(client, archive, name):
    """The id of a module of archive in client's session: one this client holds from an earlier
    capture, else a new registration, held when the archive is one of this cache's."""
    digest = hashlib.sha256(archive).hexdigest()
    with _lock:
        held = _held.get(client)
        mid = held.pop(digest, None) if held is not None else None
        if mid is not None:
            held[digest] = mid  # most recently used last
            stats["held"] += 1
            return mid
    mid = client.register_module(archive, name)
    drop = []
    with _lock:
        if digest in _holdable and MODULES_HELD > 0:
            held = _held.setdefault(client, collections.OrderedDict())
            held[digest] = mid
            while len(held) > MODULES_HELD:
                drop.append(held.popitem(last=False)[1])
    for old in drop:
        _release(client, old)
    return mid


def release(client, module_ids, failed=False):
    """After a capture: releases the modules this client does not hold, and after a failed
    capture those it holds too (a later capture registers them again)."""
    with _lock:
        held = _held.get(client) or {}
        kept = set(held.values())
        if failed:
            for digest in [d for d, m in held.items() if m in module_ids]:
                del held[digest]
            kept = set()
    for mid in module_ids:
        if mid not in kept:
            _release(client, mid)


def release_held(client=None):
    """Releases the modules client (None: every client) holds for later captures."""
    with _lock:
        clients = [client] if client is not None else list(_held.keys())
        mids = [(c, m) for c in clients for m in (_held.pop(c, None) or {}).values()]
    for c, mid in mids:
        _release(c, mid)


def _release(client, mid):
    try:
        client.release_module(mid)
    except Exception:  # a closed client, a daemon gone: nothing left to release
        pass
