"""A process's own pools (graph_pool_handle() without a name) belong to its session: private to its
uid, marked delete_with_session, and deleted by the daemon when the session ends however it ends,
on any device (here cpu:1 of the test daemon, after SIGKILL)."""
import os
import signal
import subprocess
import sys
import textwrap

import graphd
from conftest import wait_for

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
