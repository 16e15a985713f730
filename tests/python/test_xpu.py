"""xpu:N devices and regions through the Python client, against a daemon of its own that serves
xpu:0 and xpu:1 from Debian's real Level Zero loader and the test driver
(build/tests/ze_driver/libze_graphd_test.so, ZE_ENABLE_ALT_DRIVERS for the daemon and for this
process, which maps regions in its own Level Zero context through libgraphd). The daemon's side of
a region is read back from the driver's free log (GRAPHD_ZE_TEST_FREE_LOG: the first bytes the
daemon's allocation held when freed). This process uses the loader passing calls through; one
test runs a child with ZE_ENABLE_LOADER_INTERCEPT=1. The session daemon of conftest.py has no
driver: there devices() is as before."""
import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import graphd
from conftest import BUILD, wait_answering, wait_for

DRIVER = (BUILD / "tests" / "ze_driver" / "libze_graphd_test.so").resolve()
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def xpu_daemon(tmp_path_factory):
    if not DRIVER.exists():
        pytest.fail("no %s: make builds it" % DRIVER)
    d = tmp_path_factory.mktemp("graphd-xpu")
    address = "unix:%s" % (d / "graphd.sock")
    free_log = d / "free.log"
    env = dict(os.environ, ZE_ENABLE_ALT_DRIVERS=str(DRIVER), GRAPHD_ZE_TEST_DEVICES="2",
               GRAPHD_ZE_TEST_FREE_LOG=str(free_log), GRAPHD_ZE_TEST_DIRTY_ALLOC="165")
    env.pop("ZE_ENABLE_LOADER_INTERCEPT", None)
    # This process maps the regions: its loader must find the same driver (read at its zeInit,
    # the first xpu mapping, which no other test makes).
    saved = {k: os.environ.get(k) for k in ("ZE_ENABLE_ALT_DRIVERS", "ZE_ENABLE_LOADER_INTERCEPT")}
    os.environ["ZE_ENABLE_ALT_DRIVERS"] = str(DRIVER)
    os.environ.pop("ZE_ENABLE_LOADER_INTERCEPT", None)
    log = d / "graphd.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BUILD / "graphd"), "--config", "/dev/null", "--listen",
                                 address], stdout=out, stderr=subprocess.STDOUT, env=env)
    wait_answering(proc, address, 20)
    assert proc.poll() is None, log.read_text()
    yield address, free_log
    for k, v in saved.items():  # later tests' daemons start without the driver
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, log.read_text()


@pytest.fixture
def xc(xpu_daemon):
    with graphd.Client(xpu_daemon[0]) as c:
        yield c


def freed(free_log, line):
    return wait_for(lambda: free_log.exists() and line in free_log.read_text(), 5)


def test_devices_list_xpu_with_telemetry(xc):
    devs = {d["id"]: d for d in xc.devices()}
    assert {"cpu:0", "xpu:0", "xpu:1"} <= set(devs)
    for i, cu in ((0, 64), (1, 96)):
        d = devs["xpu:%d" % i]
        assert d["kind"] == "xpu" and d["ordinal"] == i
        assert d["name"] == "graphd test XPU %d" % i
        assert d["compute_units"] == cu and d["max_clock_mhz"] > 0
        assert len(d["uuid"]) == 32 and d["driver"].startswith("Level Zero 1.")
        assert d["memory_total"] == 256 * MiB
    assert devs["xpu:0"]["uuid"] != devs["xpu:1"]["uuid"]
    assert devs["cpu:0"]["telemetry"] is None and devs["cpu:0"]["uuid"] is None

    def telemetry():
        t = {d["id"]: d for d in xc.devices()}["xpu:1"]["telemetry"]
        return t if t and t["utilisation"] is not None else None
    t = wait_for(telemetry, 5, 0.1)  # utilisation needs the daemon's second read
    assert t is not None
    assert t["memory_total"] == 256 * MiB and t["memory_free"] == 256 * MiB
    assert 0.0 <= t["utilisation"] <= 1.0 and t["engine_active_us"] is not None
    assert t["memory_health"] == "ok" and t["wedged"] is False and t["read_unix_ms"] > 0


@pytest.mark.parametrize("dev", ["xpu:0", "xpu:1"])
def test_alloc_region_on_xpu_write_and_read_back(xc, xpu_daemon, dev):
    size = MiB + 100
    r = xc.alloc_region(size, device=dev)
    assert r.is_device and r.size == size
    pool = "regions-%s-%d" % (dev.replace(":", ""), os.getuid())
    assert r.pool == pool
    assert {p["name"]: p for p in xc.pools()}[pool]["device"] == dev
    assert r.read(size) == bytes(size)  # the daemon's zero fill (the driver hands out 0xa5)
    pattern = bytes((i * 7 + 3) & 0xff for i in range(size))
    r.write(pattern)
    assert r.read(size) == pattern
    r.write(b"\x01\x02\x03", offset=10)
    assert r.read(5, offset=9) == pattern[9:10] + b"\x01\x02\x03" + pattern[13:14]
    with pytest.raises(graphd.InvalidArgument, match="pass the end of region"):
        r.write(b"xx", offset=size - 1)
    with pytest.raises(graphd.InvalidArgument):
        r.read(1, offset=size)
    expect = (pattern[:10] + b"\x01\x02\x03" + pattern[13:16]).hex()
    r.free()
    # the daemon's own allocation held this process's write when it freed it
    assert freed(xpu_daemon[1], "free %s %d %s" % (dev[-1], size, expect))
    assert wait_for(lambda: {p["name"]: p for p in xc.pools()}[pool]["regions"] == 0, 5)
    with pytest.raises(ValueError, match="freed"):
        r.read(1)


def test_alloc_region_pool_on_another_device_is_refused(xc):
    xc.create_pool("pytest-xpu1-only", device="xpu:1")
    with pytest.raises(ValueError, match="is on xpu:1, not xpu:0"):
        xc.alloc_region(4096, pool="pytest-xpu1-only", device="xpu:0")
    with pytest.raises(graphd.NotFound, match="xpu:7"):
        xc.alloc_region(4096, device="xpu:7")
    r = xc.alloc_region(4096, pool="pytest-xpu1-only", device=True)  # the pool's device
    assert r.is_device
    r.free()
    xc.delete_pool("pytest-xpu1-only")


def test_host_region_read_write(xc):
    r = xc.alloc_region(100)
    assert not r.is_device
    r.write(bytearray(b"abc"), offset=5)
    assert r.read(3, offset=5) == b"abc"
    assert ctypes_at(r.ptr + 5, 3) == b"abc"  # the same bytes through the mapping
    r.free()


def ctypes_at(addr, n):
    import ctypes
    return ctypes.string_at(addr, n)


def _archive():
    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(torch.nn.Linear(3, 2), (torch.randn(4, 3),)), buf)
    return buf.getvalue()


def test_capture_on_xpu_is_unimplemented(xc, xpu_daemon):
    # make_graphed_callables talks to the default client (GRAPHD_ADDRESS): a process of its own.
    child = textwrap.dedent("""
        import torch, graphd
        try:
            graphd.make_graphed_callables(torch.nn.Linear(3, 2), (torch.randn(4, 3),),
                                          device="xpu:0")
        except graphd.GraphdError as e:
            print(e.code)
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120,
                         env=dict(os.environ, GRAPHD_ADDRESS=xpu_daemon[0]))
    code, _, message = out.stdout.decode().partition("\n")
    assert code == "UNIMPLEMENTED", out.stdout.decode() + out.stderr.decode()
    assert "built without an XPU libtorch" in message
    # device-resident likewise
    xc.create_pool("pytest-xpu-dr", device="xpu:0")
    mid = xc.register_module(_archive(), "lin")
    with pytest.raises(graphd.GraphdError) as e:
        xc.capture([(mid, None, [(1, (4, 3), True)])], pool="pytest-xpu-dr",
                   device_resident=True)
    assert e.value.code == "UNIMPLEMENTED"
    assert "built without an XPU libtorch" in str(e.value)
    xc.release_module(mid)
    xc.delete_pool("pytest-xpu-dr")


def test_sigkilled_client_region_is_reclaimed(xpu_daemon, tmp_path):
    """A Python client SIGKILLed holding an xpu region it wrote: the daemon reclaims it. The child
    maps through the loader intercepting (ZE_ENABLE_LOADER_INTERCEPT=1), the other mode."""
    address, free_log = xpu_daemon
    with graphd.Client(address) as c:
        c.create_pool("pytest-xpu-kill", device="xpu:0", mode="private")
    child = textwrap.dedent("""
        import sys, time, graphd
        c = graphd.Client(sys.argv[1])
        r = c.alloc_region(65536, pool="pytest-xpu-kill", device="xpu:0")
        r.write(b"\\x5c" * 65536)
        assert r.read(16) == b"\\x5c" * 16
        print("ready", flush=True)
        time.sleep(600)
    """)
    env = dict(os.environ, ZE_ENABLE_LOADER_INTERCEPT="1")
    p = subprocess.Popen([sys.executable, "-c", child, address], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    try:
        line = p.stdout.readline()
        assert line == b"ready\n", p.stderr.read().decode()
        with graphd.Client(address) as c:
            pool = {q["name"]: q for q in c.pools()}["pytest-xpu-kill"]
            assert pool["regions"] == 1 and pool["used_bytes"] == 65536
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
            assert freed(free_log, "free 0 65536 " + "5c" * 16)
            assert wait_for(lambda: {q["name"]: q for q in c.pools()}["pytest-xpu-kill"]
                            ["regions"] == 0, 5)
            pool = {q["name"]: q for q in c.pools()}["pytest-xpu-kill"]
            assert pool["reserved_bytes"] == 0 and pool["used_bytes"] == 0
            c.delete_pool("pytest-xpu-kill")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_without_the_driver_devices_are_as_before(client):
    """The session daemon (conftest.py) was started without ZE_ENABLE_ALT_DRIVERS."""
    devs = client.devices()
    assert [d["id"] for d in devs] == ["cpu:0", "cpu:1"]
    for d in devs:
        assert d["uuid"] is None and d["compute_units"] is None and d["telemetry"] is None
    st = client.status()
    assert all("compute_units" not in d for d in st["devices"])
    with pytest.raises(graphd.NotFound, match="no device 'xpu:0'"):
        client.alloc_region(4096, device="xpu:0")
