"""Reused warm-ups (issue 18, capture time; graph_runtime/runtime.h, gr_capture_prepare): a capture
of a module, method and sample specs that the tenant's executor has warmed up before skips its
warm-up where the warm-up could change nothing and could not depend on the sample values, and
trains bit for bit as a warmed-up capture; every other capture warms up as upstream does, and the
daemon's reuse_warmup = 0 turns it off.

The test daemon is shared by the session and its executors remember every structure they warmed
up, so each test uses sample shapes (batch sizes) of its own: its first capture is a miss."""
import io
import os
import signal
import subprocess
import tempfile

import pytest
import torch
import torch.nn as nn

import graphd
from conftest import BUILD, wait_answering
from graphd import graphs

F32 = graphs._DTYPES[torch.float32]
I64 = graphs._DTYPES[torch.int64]


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))


def _archive(module, *args, script=False):
    m = torch.jit.script(module) if script else torch.jit.trace(module, args, check_trace=False)
    buf = io.BytesIO()
    torch.jit.save(m, buf)
    return buf.getvalue()


def _reused(client, archive, specs, **kw):
    """Captures archive twice with specs (one callable); whether each capture reused a warm-up."""
    mid = client.register_module(archive)
    out = []
    for _ in range(2):
        (g,) = client.capture([(mid, None, specs)], **kw)
        out.append(g.warmup_reused)
        del g
    client.release_module(mid)
    return out


def _train(model, x, steps=3):
    """Outputs and gradients of steps forward/backward/SGD steps of the graphed model, and whether
    its capture reused a warm-up."""
    g = graphd.make_graphed_callables(model, (x.clone(),))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    res = []
    for k in range(steps):
        opt.zero_grad(set_to_none=True)
        out = g(x + k)
        out.square().sum().backward()
        opt.step()
        res += [out.detach().clone()] + [p.grad.clone() for p in model.parameters()]
    res += [p.detach().clone() for p in model.parameters()]
    return res, g._graphd_runner.graph.warmup_reused


def test_a_second_capture_of_the_same_structure_skips_its_warmup_and_trains_the_same():
    x = torch.randn(3, 8)
    first, reused = _train(_mlp(0), x)
    assert not reused  # the first warm-up of this structure runs
    second, reused = _train(_mlp(0), x)  # another instance, the same values
    assert reused
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    third, reused = _train(_mlp(1), x)  # other parameter values: still the same key
    assert reused and not torch.equal(third[0], first[0])


def test_other_sample_specs_warm_up_again(client):
    arch = _archive(_mlp(0), torch.randn(5, 8))
    assert _reused(client, arch, [(F32, (5, 8), False)]) == [False, True]
    assert _reused(client, arch, [(F32, (6, 8), False)]) == [False, True]  # another shape
    assert _reused(client, arch, [(F32, (6, 8), True)]) == [False, True]  # requires grad
    assert _reused(client, arch, [(F32, (6, 8), True)], allow_unused_input=True) == [False, True]


class _Buffered(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.lin(x))


class _Lin(nn.Module):
    """One Linear(8, 8); each subclass below is a forward around it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)


class _Drop(_Lin):
    def forward(self, x):
        return nn.functional.dropout(self.lin(x), 0.5, True)


class _WritesInput(_Lin):
    def forward(self, x):
        x.mul_(2.0)
        return self.lin(x)


class _WritesParam(_Lin):
    def forward(self, x):
        with torch.no_grad():
            self.lin.bias.add_(1.0)
        return self.lin(x)


class _Branches(_Lin):
    def forward(self, x):
        if bool(x.sum() > 0):
            return self.lin(x)
        return self.lin(x * 2.0)


class _Embeds(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)

    def forward(self, idx):
        return self.emb(idx)


@pytest.mark.parametrize("what", ["buffers", "random ops", "writes its input",
                                  "writes a parameter", "branches", "index args"])
def test_a_warmup_that_could_change_state_or_read_values_always_runs(client, what):
    x = torch.randn(7, 8)
    if what == "buffers":  # BatchNorm's running stats: warm-up updates them
        arch, spec = _archive(_Buffered(), x), [(F32, (7, 8), False)]
    elif what == "random ops":
        arch, spec = _archive(_Drop(), x), [(F32, (7, 8), False)]
    elif what == "writes its input":
        arch, spec = _archive(_WritesInput(), x.clone()), [(F32, (7, 8), False)]
    elif what == "writes a parameter":
        arch, spec = _archive(_WritesParam(), script=True), [(F32, (7, 8), False)]
    elif what == "branches":  # scripted: the sample values pick the path
        arch, spec = _archive(_Branches(), script=True), [(F32, (7, 8), False)]
    else:  # int64 indices: values a warm-up can trip over
        arch, spec = (_archive(_Embeds(), torch.zeros(7, dtype=torch.long)),
                      [(I64, (7,), False)])
    assert _reused(client, arch, spec) == [False, False]


def test_reuse_warmup_0_warms_up_every_capture():
    """A daemon of its own, with reuse_warmup = 0 (its own executor, which has warmed up
    nothing)."""
    with tempfile.TemporaryDirectory() as d:
        address = "unix:%s/g.sock" % d
        with open(os.path.join(d, "log"), "w") as log:
            proc = subprocess.Popen([str(BUILD / "graphd"), "--config", "/dev/null", "--listen",
                                     address, "--reuse-warmup", "0"],
                                    stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_answering(proc, address, 20)
            assert proc.poll() is None
            with graphd.Client(address) as c:
                arch = _archive(_mlp(0), torch.randn(9, 8))
                assert _reused(c, arch, [(F32, (9, 8), False)]) == [False, False]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        with open(os.path.join(d, "log")) as f:
            assert "warm-up reused for 0" in f.read()
