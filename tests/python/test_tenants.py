"""A process's own pools (graph_pool_handle() without a name) belong to its session: private to its
uid, marked delete_with_session, and deleted by the daemon when the session ends however it ends,
on any device (here cpu:1 of the test daemon, after SIGKILL); and deleted by the client before
that when the handle and its graphs are gone, so that graphing again and again keeps no pools."""
import gc
import os
import signal
import subprocess
import sys
import textwrap

import torch
from torch import nn

import graphd
from conftest import fresh_daemon, wait_for

CHILD = textwrap.dedent("""
    import sys, time, graphd
    h = graphd.graph_pool_handle(device="cpu:1")
    c = graphd.default_client()
    r = c.alloc_region(1 << 16, pool=h)
    print(h.name, flush=True)
    time.sleep(600)
""")


def _pool(client, name):
    return next((p for p in client.pools() if p["name"] == name), None)


def test_own_pool_is_private_and_goes_with_its_session(client):
    h = graphd.graph_pool_handle(device="cpu:1", client=client)
    p = _pool(client, h.name)
    assert p is not None and p["device"] == "cpu:1"
    assert p["mode"] == "private" and p["delete_with_session"] is True
    assert p["owner_uid"] == os.getuid()
    client.alloc_region(4096, pool=h)
    client.close()  # Goodbye: the daemon deletes it with the session, regions and all
    with graphd.Client() as other:
        assert _pool(other, h.name) is None


def test_own_pool_of_a_killed_client_on_cpu1_is_deleted(client):
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("py-")
        assert _pool(client, name)["device"] == "cpu:1"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_for(lambda: _pool(client, name) is None, 5), "pool %s outlived its client" % name


def test_a_named_pool_stays(client):
    client.create_pool("pytest-stays", device="cpu:1")
    client.close()
    with graphd.Client() as other:
        p = _pool(other, "pytest-stays")
        assert p is not None and p["delete_with_session"] is False
        other.delete_pool("pytest-stays")


# ---- an own pool lives as long as its handle and its graphs --------------------------------------

def _names(client):
    return {p["name"] for p in client.pools()}


def test_own_pool_goes_with_its_handle_and_its_graphs():
    """As upstream's graph_pool_handle(): the pool lives while the handle or any graph captured
    in it does, and goes with the last of them (graphed modules and their graphs refer to each
    other: the cycle collector frees them)."""
    c = graphd.default_client()
    h = graphd.graph_pool_handle()
    a = graphd.make_graphed_callables(nn.Linear(3, 2), (torch.randn(4, 3),), pool=h,
                                      device="cpu:1")
    b = graphd.make_graphed_callables(nn.Linear(3, 2), (torch.randn(4, 3),), pool=h,
                                      device="cpu:1")
    name = h.name
    del h
    gc.collect()
    assert name in _names(c), "the pool went while graphs captured in it live"
    a(torch.randn(4, 3)).sum().backward()
    del a
    gc.collect()
    assert name in _names(c)
    b(torch.randn(4, 3)).sum().backward()
    # Without a pool, a capture on a device other than cpu:0 gets one of its own
    m = graphd.make_graphed_callables(nn.Linear(3, 2), (torch.randn(4, 3),), device="cpu:1")
    own = m._graphd_runner.graph.pool.name
    assert own.startswith("py-") and own in _names(c)
    del b, m
    gc.collect()
    assert not {name, own} & _names(c), "own pools outlived their handles and graphs"


def test_own_pool_still_holding_regions_goes_once_they_are_freed():
    """A handle collected before the regions in its pool (the order of a cycle's finalizers):
    the pool is deleted before the next own pool is made."""
    c = graphd.default_client()
    h = graphd.graph_pool_handle(device="cpu:1")
    name = h.name
    r = c.alloc_region(4096, pool=name)  # by name: the region does not hold the handle
    del h
    gc.collect()
    assert name in _names(c) and c._pools_gone == [name]
    r.free()
    h2 = graphd.graph_pool_handle(device="cpu:1")
    assert name not in _names(c) and h2.name in _names(c) and c._pools_gone == []


GRAPH_AGAIN = textwrap.dedent("""
    import torch, graphd
    for i in range(8):
        m = graphd.make_graphed_callables(torch.nn.Linear(3, 2), (torch.randn(4, 3),),
                                          device="cpu:1")
        m(torch.randn(4, 3)).sum().backward()
        print(i, flush=True)
""")


def test_graphing_again_and_again_does_not_run_out_of_pools(tmp_path):
    """Each make_graphed_callables without a pool on a device other than cpu:0 makes a pool of
    its own; the earlier ones (their graphs garbage) are deleted, not kept until the process
    ends: here the 4th of 8 captures would fail on max_pools_per_uid = 3."""
    with fresh_daemon(tmp_path, "pools", ["--cpu-devices", "2", "--max-pools-per-uid", "3"]) \
            as address:
        out = subprocess.run([sys.executable, "-c", GRAPH_AGAIN], capture_output=True, text=True,
                             timeout=240, env=dict(os.environ, GRAPHD_ADDRESS=address))
        assert out.returncode == 0, out.stdout + out.stderr[-2000:]
        assert out.stdout.split() == [str(i) for i in range(8)]


def test_own_pool_whose_handle_goes_while_the_session_is_restored(client, monkeypatch):
    """After a daemon restart the client makes its pools again (graphd.recovery); a handle that
    goes meanwhile (its finalizer runs in any allocation) drops its pool from that list while the
    restore walks it: that pool is not made again, and the walk goes on."""
    h1 = graphd.graph_pool_handle(device="cpu:1", client=client)
    holder = [graphd.graph_pool_handle(device="cpu:1", client=client)]
    gone = holder[0].name
    real = client.create_pool

    def create_pool(name, *args, **kwargs):
        holder.clear()  # the second handle goes while the first pool is made again
        return real(name, *args, **kwargs)

    monkeypatch.setattr(client, "create_pool", create_pool)
    client._recovery._restore(client)  # both pools still exist here: ALREADY_EXISTS is fine
    names = _names(client)
    assert h1.name in names and gone not in names
    assert gone not in client._recovery.pools
