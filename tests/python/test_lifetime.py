"""Lifetimes across the ctypes boundary: mapped static memory outlives Client.close() while a
tensor still points into it (libgraphd keeps each graph and region handle, and its mapping, until
it is released, after graphd_close too); replay errors come back as exceptions with the daemon's
status."""
import ctypes
import gc
import io

import pytest
import torch

import graphd
from graphd import graphs as ggraphs


def _archive():
    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(torch.nn.Linear(3, 2), (torch.randn(4, 3),)), buf)
    return buf.getvalue()


def _sessions():
    return {int(s["id"]) for s in graphd.default_client().status()["sessions"]}


def test_close_with_a_live_graph(daemon):
    c = graphd.Client(daemon.address)
    mid = c.register_module(_archive(), "lin")
    (g,) = c.capture([(mid, None, [(1, (4, 3), True)])])
    c.release_module(mid)
    assert g.has_backward and g.training
    static = ggraphs._Static(g, 1)
    static.inputs[0].copy_(torch.ones(4, 3))
    assert g.replay(0) >= 0
    out = static.outputs[0].clone()
    sid = c.session_id
    assert sid in _sessions()

    r = c.alloc_region(64)
    ctypes.memset(r.ptr, 7, 64)
    c.close()
    assert c._h is None  # graphd_close at once: the handles hold the libgraphd client
    assert sid not in _sessions()  # Goodbye: the daemon freed the session's graph and region
    assert torch.equal(static.outputs[0], out)  # still mapped here
    static.inputs[0].fill_(2.0)
    assert ctypes.string_at(r.ptr, 64) == b"\x07" * 64
    with pytest.raises(graphd.FailedPrecondition):
        g.replay(0)
    r.free()  # after close: only unmaps (the daemon freed it with the session)
    r.free()
    del g, static  # the graph's finalizer releases the handle, the client's last reference
    gc.collect()


def test_replay_errors(daemon):
    with graphd.Client(daemon.address) as c:
        mid = c.register_module(_archive())
        (g,) = c.capture([(mid, None, [(1, (4, 3), False)])])
        with pytest.raises(graphd.FailedPrecondition) as e:
            g.replay(1)  # BACKWARD before FORWARD
        assert e.value.message and e.value.code == "FAILED_PRECONDITION"
        g.replay(0)
        g.replay(1)
        with pytest.raises(graphd.FailedPrecondition):
            g.replay(1, rpc=True)
        with pytest.raises(graphd.InvalidArgument) as e:
            c.register_module(b"not a torchscript archive")
        with pytest.raises(graphd.NotFound):
            c.capture([(mid + 1000, None, [(1, (4, 3), False)])])
        with pytest.raises(graphd.InvalidArgument):  # the module does not take (4, 5)
            c.capture([(mid, None, [(1, (4, 5), False)])])
        del g
        gc.collect()


def test_device_resident_needs_a_cuda_pool(daemon):
    # Checked by the daemon before any work: runs on a machine without a GPU too.
    with graphd.Client(daemon.address) as c:
        mid = c.register_module(_archive())
        with pytest.raises(graphd.InvalidArgument) as e:
            c.capture([(mid, None, [(1, (4, 3), False)])], device_resident=True)
        assert "cuda" in e.value.message
        mine = [g for g in c.status().get("graphs", []) if int(g["session"]) == c.session_id]
        assert not mine


def test_tuple_of_callables_shares_one_pool():
    pool = graphd.graph_pool_handle("pytest-tuple")
    a, b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    ga, gb = graphd.make_graphed_callables((a, b), ((torch.randn(2, 3),),
                                                    (torch.randn(2, 4, requires_grad=True),)),
                                           pool=pool)
    st = graphd.default_client().status()
    ids = {ga._graphd_runner.graph.id, gb._graphd_runner.graph.id}
    assert {g["pool"] for g in st["graphs"] if int(g["id"]) in ids} == {"pytest-tuple"}
    p = next(p for p in st["pools"] if p["name"] == "pytest-tuple")
    assert int(p["graphs"]) == 2
