"""Traced archives reused across captures (issue 18, graphd/trace_cache.py): a key that changes
with everything the trace depends on (each component changed alone gives another key, a fresh
instance of the same structure the same one), callables whose trace cannot be keyed traced every
time, results bit-identical to an uncached capture, and the disk cache: a new process's hit,
file and directory permissions, corrupt files, and files or directories of another uid."""
import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
import types

import pytest
import torch
import torch.nn as nn

import graphd
from graphd import graphs, trace_cache as tc, tracing

DT = graphs._DTYPES
OFFSET = 1.0  # read by Offset.forward: a global is part of the key


def _act(x):
    return torch.relu(x)


class Net(nn.Module):
    def __init__(self, width=8, depth=2, scale=2.0):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
        self.bn = nn.BatchNorm1d(width)
        self.scale = scale

    def forward(self, x):
        return self.bn(_act(self.layers(x))) * self.scale


class Offset(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) + OFFSET


def _other_net_class():
    class Net(nn.Module):  # the same name and structure, another forward
        def __init__(self, width=8, depth=2, scale=2.0):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
            self.bn = nn.BatchNorm1d(width)
            self.scale = scale

        def forward(self, x):
            return self.bn(torch.tanh(self.layers(x))) * self.scale
    Net.__qualname__ = "Net"  # the same qualified name too: only the code differs
    return Net


def key(m, *args):
    return tc.key(m, tuple(args), tuple(args), DT)


def x8(*shape, **kw):
    return torch.randn(*(shape or (4, 8)), **kw)


# ---- the key -------------------------------------------------------------------------------

def test_a_fresh_instance_of_the_same_structure_has_the_same_key():
    torch.manual_seed(0)
    a = Net()
    torch.manual_seed(1)
    b = Net()  # other weights
    with torch.no_grad():
        b.bn.running_mean.fill_(3.0)  # other buffer values
    assert key(a, x8()) == key(b, x8())


def _tied():
    m = Net()
    m.layers[1].weight = m.layers[0].weight
    return m


def _frozen():
    m = Net()
    m.layers[0].weight.requires_grad_(False)
    return m


def _patched_forward(monkeypatch):
    monkeypatch.setattr(Net, "forward", lambda self, x: self.layers(x))
    return Net(), (x8(),)


def _global_changed(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "OFFSET", 2.0)
    return Offset(), (x8(),)


def _helper_changed(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "_act", torch.sigmoid)
    return Net(), (x8(),)


# Each variant changes one thing the trace depends on; (module, args) against Net(), (x8(),).
VARIANTS = {
    "width": lambda mp: (Net(width=6), (x8(4, 6),)),
    "depth": lambda mp: (Net(depth=3), (x8(),)),
    "attribute value": lambda mp: (Net(scale=3.0), (x8(),)),
    "submodule attribute": lambda mp: (Net().apply(
        lambda m: setattr(m, "eps", 1e-3) if isinstance(m, nn.BatchNorm1d) else None), (x8(),)),
    "dtype": lambda mp: (Net().double(), (x8(dtype=torch.float64),)),
    "requires_grad of a parameter": lambda mp: (_frozen(), (x8(),)),
    "training flag": lambda mp: (Net().eval(), (x8(),)),
    "a submodule's training flag": lambda mp: (Net().apply(
        lambda m: m.eval() if isinstance(m, nn.BatchNorm1d) else None), (x8(),)),
    "tied parameters": lambda mp: (_tied(), (x8(),)),
    "class code": lambda mp: (_other_net_class()(), (x8(),)),
    "patched forward": _patched_forward,
    "helper function": _helper_changed,
    "arg shape": lambda mp: (Net(), (x8(5, 8),)),
    "arg dtype": lambda mp: (Net().double(), (x8(dtype=torch.float64),)),
    "arg requires_grad": lambda mp: (Net(), (x8(requires_grad=True),)),
    "arg stride": lambda mp: (Net(), (x8(8, 4).t(),)),
}


@pytest.mark.parametrize("what", sorted(VARIANTS))
def test_each_key_component_changes_the_key(what, monkeypatch):
    base = key(Net(), x8())
    m, args = VARIANTS[what](monkeypatch)
    assert key(m, *args) != base


def test_a_global_the_code_reads_is_in_the_key(monkeypatch):
    base = key(Offset(), x8())
    m, args = _global_changed(monkeypatch)
    assert key(m, *args) != base


def _default_class(k):
    class Scaled(nn.Module):  # the same code and qualified name for every k
        def forward(self, x, k=k):
            return x * k
    return Scaled


def _closure_class(k):
    class Scaled(nn.Module):
        def forward(self, x):
            return x * k
    return Scaled


@pytest.mark.parametrize("make", [_default_class, _closure_class], ids=["default", "closure"])
def test_defaults_and_closures_of_the_code_are_in_the_key(make):
    """Two classes of the same code and name that differ only in a default of forward or in a
    value its closure holds trace to different archives."""
    assert key(make(2.0)(), x8()) == key(make(2.0)(), x8())
    assert key(make(2.0)(), x8()) != key(make(3.0)(), x8())


def test_grad_mode_and_arg_structure_are_in_the_key():
    x = x8()
    base = tc.key(Net(), (x,), (x,), DT)
    with torch.no_grad():
        assert tc.key(Net(), (x,), (x,), DT) != base
    assert tc.key(Net(), ([x],), (x,), DT) != base
    assert tc.key(Net(), (x, x), (x, x), DT) != tc.key(Net(), (x, x8()), (x, x8()), DT)


def _with_tensor_attr():
    m = Net()
    m.extra = torch.ones(8)
    return m


def _with_hook():
    m = Net()
    m.layers[0].register_forward_hook(lambda mod, i, o: o * 2)
    return m


def _with_buffer(dtype):
    m = Net()
    m.register_buffer("z", torch.zeros(2, dtype=dtype))
    return m


def _with_object():
    m = Net()
    m.cfg = object()
    return m


CONFIG = types.ModuleType("gd_test_config")  # a module of the user's: its attributes can change
CONFIG.SCALE = 2.0


class Configured(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) * CONFIG.SCALE


UNCACHEABLE = {
    "a module of the user's read by forward": Configured,
    "plain tensor attribute": _with_tensor_attr,
    "hook on a submodule": _with_hook,
    "object attribute": _with_object,
    "plain function": lambda: (lambda x: x * 2),
    "ScriptModule": lambda: torch.jit.script(nn.Linear(8, 8)),
    "buffer of a dtype graphd does not carry": lambda: _with_buffer(torch.complex64),
}


@pytest.mark.parametrize("what", sorted(UNCACHEABLE))
def test_what_cannot_be_keyed_is_uncacheable(what):
    m = UNCACHEABLE[what]()
    with pytest.raises(tc.Uncacheable):
        key(m, x8())


class _Sigmoid(torch.overrides.TorchFunctionMode):
    """A mode that changes what a trace records: relu becomes sigmoid."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.relu:
            func = torch.sigmoid
        return func(*args, **(kwargs or {}))


def test_an_active_torch_function_mode_is_uncacheable():
    m, x = Net(), x8()
    base = key(m, x)
    with _Sigmoid():
        with pytest.raises(tc.Uncacheable, match="torch function mode"):
            key(m, x)
    assert key(m, x) == base


@pytest.mark.skipif(not hasattr(torch, "set_default_device"), reason="torch < 2.0")
def test_the_default_device_is_in_the_key():
    m, x = Net(), x8()
    base = key(m, x)
    with torch.device("meta"):  # torch.zeros(...) in a forward would be made there
        assert key(m, x) != base


# ---- captures ------------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh disk cache in tmp_path/traces, an empty memory cache, and the list of callables
    that tracing.trace was called for."""
    d = tmp_path / "traces"
    monkeypatch.setenv("GRAPHD_TRACE_CACHE_DIR", str(d))
    monkeypatch.setenv("GRAPHD_TRACE_CACHE", "disk")
    tc.release_held()
    tc.clear_memory()
    tc.reset_stats()
    calls = []
    orig = tracing.trace

    def counted(*a, **k):
        calls.append(a[0])
        return orig(*a, **k)
    monkeypatch.setattr(tracing, "trace", counted)
    yield d, calls
    tc.release_held()
    tc.clear_memory()


def _seeded(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw)


def _run(m, x):
    """Outputs, gradients and buffers after two forward/backward steps of the graphed m."""
    g = graphd.make_graphed_callables(m, (x.clone(),))
    res = []
    for k in range(2):
        out = g(x + k)
        out.square().sum().backward()
        res.append(out.detach().clone())
    res += [p.grad.clone() for p in m.parameters()]
    res += [b.clone() for b in m.buffers()]
    return res


def _equal(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and torch.equal(u, v)


def test_a_hit_is_bit_identical_to_an_uncached_capture(cache, monkeypatch):
    d, calls = cache
    x = torch.randn(4, 8)
    monkeypatch.setenv("GRAPHD_TRACE_CACHE", "off")
    ref = _run(_seeded(), x)
    assert len(calls) == 1
    monkeypatch.setenv("GRAPHD_TRACE_CACHE", "disk")
    first = _seeded(5)
    with torch.no_grad():  # buffers of other values in the archive: never read from it
        first.bn.running_mean.fill_(7.0)
        first.bn.running_var.fill_(3.0)
    _run(first, x)
    assert len(calls) == 2 and tc.stats["traced"] == 1
    _equal(_run(_seeded(), x), ref)  # a fresh instance: a hit, no trace
    assert len(calls) == 2 and tc.stats["memory"] == 1


def test_another_structure_is_traced_again(cache):
    d, calls = cache
    x = torch.randn(4, 8)
    _run(_seeded(scale=2.0), x)
    out3 = _run(_seeded(scale=3.0), x)
    assert len(calls) == 2 and tc.stats["memory"] == 0
    with torch.no_grad():
        assert torch.allclose(out3[0], _seeded(scale=3.0)(x))  # 3.0, not a reused 2.0


def test_disk_cache_is_private_and_serves_a_new_process(cache):
    d, calls = cache
    x = torch.randn(4, 8)
    ref = _run(_seeded(), x)
    files = list(d.iterdir())
    assert [f.suffix for f in files] == [".trace"]
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    tc.clear_memory()  # as a new process finds it
    _equal(_run(_seeded(), x), ref)
    assert len(calls) == 1 and tc.stats["disk"] == 1
    child = textwrap.dedent("""
        import sys, torch
        sys.path.insert(0, %r)
        from test_capture_cache import Net
        import graphd
        from graphd import trace_cache as tc
        graphd.make_graphed_callables(Net(), (torch.randn(4, 8),))
        print(tc.stats["disk"], tc.stats["traced"])
    """ % os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0"], out.stdout + out.stderr


def _only_file(d):
    (f,) = list(d.iterdir())
    return f


def test_a_corrupt_file_is_traced_again_and_replaced(cache):
    d, calls = cache
    x = torch.randn(4, 8)
    ref = _run(_seeded(), x)
    f = _only_file(d)
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF  # inside the archive
    f.write_bytes(bytes(data))
    tc.clear_memory()
    _equal(_run(_seeded(), x), ref)
    assert len(calls) == 2 and tc.stats["corrupt"] == 1
    k = f.name[:-len(".trace")]
    assert tc._load(str(d), k) is not None  # written again, whole


@pytest.mark.parametrize("how", ["truncated", "garbage", "another key", "empty", "deep spec",
                                 "another spec", "format 1"])
def test_corrupt_files_are_misses(cache, how):
    d, calls = cache
    x = torch.randn(4, 8)
    m = Net()
    k = key(m, x)
    archive, out_spec, prefix, _ = tracing.trace(m, (x,), (x,), DT)
    d.mkdir(mode=0o700)
    tc._store(str(d), k, archive, out_spec, prefix)
    f = d / (k + ".trace")
    assert tc._load(str(d), k)[0] == archive
    data = f.read_bytes()
    if how == "truncated":
        f.write_bytes(data[:-1])
    elif how == "garbage":
        f.write_bytes(b"\x00garbage\n" * 10)
    elif how == "empty":
        f.write_bytes(b"")
    elif how in ("deep spec", "another spec", "format 1"):
        rest = data[data.index(b"\n", len(tc.MAGIC)) + 1:]
        head = json.loads(rest[:rest.index(b"\n")])
        if how == "deep spec":  # an output spec nesting past Python's recursion limit, digest good
            n = sys.getrecursionlimit() * 2
            out = '["t", [' * n + '"x"' + "]]" * n
            head = json.dumps(dict(head, out="@")).replace('"@"', out).encode()
            f.write_bytes(tc._file_bytes(head, archive))
        elif how == "another spec":  # a damaged header that still parses: a 1-tuple output
            assert head["out"] == "x", head["out"]
            damaged = json.dumps(dict(head, out=["t", ["x"]])).encode()
            f.write_bytes(data[:len(data) - len(rest)] + damaged + b"\n" + archive)
        else:  # format 1: the digest covered the archive alone
            head = json.dumps(dict(head, sha256=hashlib.sha256(archive).hexdigest())).encode()
            f.write_bytes(b"graphd-trace 1\n" + head + b"\n" + archive)
    else:
        f.rename(d / ("0" * 64 + ".trace"))
        k = "0" * 64
    assert tc._load(str(d), k) is None
    assert tc.stats["corrupt"] == 1 and not (d / (k + ".trace")).exists()


def _stored(d):
    m, x = Net(), torch.randn(4, 8)
    k = key(m, x)
    archive, out_spec, prefix, _ = tracing.trace(m, (x,), (x,), DT)
    d.mkdir(mode=0o700, exist_ok=True)
    tc._store(str(d), k, archive, out_spec, prefix)
    return k, d / (k + ".trace")


def test_a_file_open_to_others_is_not_read(cache):
    d, _ = cache
    k, f = _stored(d)
    f.chmod(0o644)
    assert tc._load(str(d), k) is None
    assert tc.stats["refused"] == 1 and f.exists()  # not ours alone: left alone


def test_a_link_is_not_followed(cache, tmp_path):
    d, _ = cache
    k, f = _stored(d)
    target = tmp_path / "elsewhere.trace"
    f.rename(target)
    f.symlink_to(target)
    assert tc._load(str(d), k) is None and tc.stats["refused"] == 1


def test_a_directory_open_to_others_is_not_used(cache):
    d, calls = cache
    d.mkdir(mode=0o700)
    d.chmod(0o755)
    tc._warned.clear()
    with pytest.warns(RuntimeWarning, match="chmod 700"):
        assert tc._private_dir() is None
    _run(Net(), torch.randn(4, 8))
    assert list(d.iterdir()) == [] and tc.stats["traced"] == 1  # memory only


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@root_only
def test_another_uids_file_is_not_used(cache):
    """A tenant cannot slip an archive into another's cache: a file of another uid (here as if
    uid 65534 had written it into this uid's directory) is never read, nor removed."""
    d, calls = cache
    k, f = _stored(d)
    os.chown(f, 65534, 65534)
    assert tc._load(str(d), k) is None and f.exists()
    tc.clear_memory()
    _run(Net(), torch.randn(4, 8))
    assert tc.stats["disk"] == 0 and tc.stats["traced"] == 1 and tc.stats["refused"] == 2


@root_only
def test_another_uids_directory_is_not_used(cache):
    d, calls = cache
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    tc._warned.clear()
    with pytest.warns(RuntimeWarning, match="of uid 65534"):
        assert tc._private_dir() is None


def test_off_traces_every_time(cache, monkeypatch):
    d, calls = cache
    monkeypatch.setenv("GRAPHD_TRACE_CACHE", "off")
    x = torch.randn(4, 8)
    _run(Net(), x)
    _run(Net(), x)
    assert len(calls) == 2 and not d.exists()


def test_memory_keeps_the_disk_alone(cache, monkeypatch):
    d, calls = cache
    monkeypatch.setenv("GRAPHD_TRACE_CACHE", "memory")
    x = torch.randn(4, 8)
    _run(Net(), x)
    _run(Net(), x)
    assert len(calls) == 1 and tc.stats["memory"] == 1 and not d.exists()


def test_issue7_guards_still_refuse(cache):
    """A refused trace is never stored, and the same module is refused again."""
    d, calls = cache

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            return y if y.sum() > 0 else -y

    for _ in range(2):
        with pytest.raises(graphd.InvalidArgument, match="reads a tensor's value"):
            graphd.make_graphed_callables(Branchy(), (torch.randn(4, 8),))
    assert len(calls) == 2 and not list(d.glob("*.trace"))
    bn = Net()
    bn.bn.momentum = None
    with pytest.raises(graphd.InvalidArgument, match="momentum=None"):
        graphd.make_graphed_callables(bn, (torch.randn(4, 8),))


# ---- modules held for later captures ---------------------------------------------------------

@pytest.fixture
def registrations(monkeypatch):
    """The sessions (clients) that RegisterModule was called for, in order."""
    calls = []
    orig = graphd.Client.register_module

    def counted(self, *a, **k):
        calls.append(self)
        return orig(self, *a, **k)
    monkeypatch.setattr(graphd.Client, "register_module", counted)
    return calls


def test_a_later_capture_reuses_the_module_the_client_holds(cache, registrations):
    x = torch.randn(4, 8)
    ref = _run(_seeded(), x)
    _equal(_run(_seeded(), x), ref)
    assert len(registrations) == 1 and tc.stats["held"] == 1
    client = graphd.default_client()
    assert len(tc._held[client]) == 1
    tc.release_held()
    _equal(_run(_seeded(), x), ref)  # registered again
    assert len(registrations) == 2


def test_only_archives_of_the_cache_are_held(cache, registrations, monkeypatch):
    monkeypatch.setenv("GRAPHD_TRACE_CACHE", "off")
    x = torch.randn(4, 8)
    _run(Net(), x)
    _run(Net(), x)
    assert len(registrations) == 2 and not tc._held.get(graphd.default_client())


def test_at_most_modules_held(cache, monkeypatch):
    monkeypatch.setattr(tc, "MODULES_HELD", 1)
    x = torch.randn(4, 8)
    _run(Net(scale=2.0), x)
    (first,) = tc._held[graphd.default_client()].values()
    _run(Net(scale=3.0), x)
    (second,) = tc._held[graphd.default_client()].values()
    assert second != first


def test_a_failed_capture_releases_the_module(cache, registrations):
    client = graphd.default_client()
    x = torch.randn(4, 8)
    _run(Net(), x)
    mid = next(iter(tc._held[client].values()))
    tc.release(client, [mid], failed=True)
    assert not tc._held[client]
    with pytest.raises(graphd.NotFound):
        client.capture([(mid, None, [(graphs._DTYPES[torch.float32], (4, 8), False)])])


def test_another_session_neither_gets_nor_uses_a_held_module(cache, registrations, daemon):
    """Held module ids are the session's: another client (here of the same uid; another uid's
    executor is another process altogether) registers its own, and the id held by the first is
    refused to it."""
    x = torch.randn(4, 8)
    _run(Net(), x)
    mine = next(iter(tc._held[graphd.default_client()].values()))
    archive = tc._memory[next(iter(tc._memory))][0]
    with graphd.Client(daemon.address) as other:
        theirs = tc.register(other, archive, "Net")
        assert theirs != mine and registrations[-1] is other
        spec = [(graphs._DTYPES[torch.float32], (4, 8), False)]
        with pytest.raises(graphd.PermissionDenied, match="another session"):
            other.capture([(mine, None, spec)])
        tc.release_held(other)
