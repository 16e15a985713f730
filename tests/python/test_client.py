"""graphd.Client against a real daemon: status, devices, pools, errors, pool handles."""
import ctypes
import ctypes.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import graphd
from graphd import _lib

REPO = Path(__file__).resolve().parents[2]


def test_library_is_the_build_one(daemon):
    path = os.path.realpath(_lib.lib_path())
    assert path == os.path.realpath(os.path.join(os.environ["GRAPHD_BUILD"], "libgraphd.so"))


def _header_functions():
    """The names of the functions graphd.h declares."""
    text = (REPO / "client" / "c" / "graphd.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # comments may mention calls
    return set(re.findall(r"\b(graphd_[a-z0-9_]+)\s*\(", text)) - {"graphd_err_t"}


def test_every_function_is_bound_at_load():
    """The package binds every function of graphd.h when the library loads (restype and
    argtypes): none is looked up later, and a new one cannot be forgotten."""
    declared = _header_functions()
    assert "graphd_capture" in declared and "graphd_setting" in declared
    assert declared == set(_lib._PROTOS)
    L = _lib.lib()
    for name, (restype, argtypes) in _lib._PROTOS.items():
        fn = getattr(L, name)
        assert fn.restype is restype and fn.argtypes == argtypes, name
    assert not hasattr(_lib, "capture_fn") and not hasattr(_lib, "has_capture_api")


def test_a_missing_function_is_an_oserror_naming_the_library():
    libc = ctypes.util.find_library("c")
    with pytest.raises(OSError) as e:
        _lib._bind(ctypes.CDLL(libc), libc)
    assert libc in str(e.value) and "graphd_" in str(e.value)


def test_status_sections(client, daemon):
    st = client.status()
    for key in ("daemon", "devices", "pools", "sessions"):
        assert key in st
    assert st["daemon"]["pid"] == daemon.proc.pid
    assert st["daemon"]["config"]["listen"]["value"] == daemon.address
    assert any(d["id"] == "cpu:0" for d in st["devices"])
    assert any(p["name"] == "default" for p in st["pools"])


def test_devices_and_pools(client):
    devs = client.devices()
    cpu = [d for d in devs if d["id"] == "cpu:0"]
    assert cpu and cpu[0]["kind"] == "cpu" and cpu[0]["memory_total"] > 0
    assert cpu[0]["mps"] is False  # MPS is a CUDA matter
    st_cpu = [d for d in client.status()["devices"] if d["id"] == "cpu:0"]
    assert st_cpu[0]["mps"] is False
    pools = {p["name"]: p for p in client.pools()}
    assert pools["default"]["device"] == "cpu:0"


def test_pool_create_delete_and_errors(client):
    info = client.create_pool("pytest-pool", limit_bytes=1 << 20)
    assert info["name"] == "pytest-pool" and info["device"] == "cpu:0"
    assert info["limit_bytes"] == 1 << 20
    with pytest.raises(graphd.AlreadyExists) as e:
        client.create_pool("pytest-pool")
    assert e.value.code == "ALREADY_EXISTS" and "pytest-pool" in str(e.value)
    assert isinstance(e.value, graphd.GraphdError) and e.value.errno == -6
    client.delete_pool("pytest-pool")
    with pytest.raises(graphd.NotFound):
        client.delete_pool("pytest-pool")
    with pytest.raises(graphd.InvalidArgument):
        client.create_pool("bad name!")
    with pytest.raises(graphd.GraphdError) as e:
        client.create_pool("p", device="cuda:7")
    assert e.value.code in ("NOT_FOUND", "INVALID_ARGUMENT")


def test_regions(client):
    """Client.alloc_region: a host region mapped here, counted by its pool, freed once; device
    memory is refused on a cpu pool (test_cuda.py allocates it on cuda:0)."""
    import ctypes
    pools = {p["name"]: p for p in client.pools()}
    assert pools["default"]["graph_mempool_reserved_bytes"] == 0  # a cpu pool has no mempool
    assert pools["default"]["graph_mempool_in_use_bytes"] == 0
    before = pools["default"]["used_bytes"]
    r = client.alloc_region(1000)
    assert isinstance(r, graphd.Region) and not r.is_device and r.size == 1000
    assert r.mapped_size >= 1000 and r.ptr
    ctypes.memset(r.ptr, 0x5A, r.size)
    assert ctypes.string_at(r.ptr, 4) == b"\x5a" * 4
    assert {p["name"]: p for p in client.pools()}["default"]["used_bytes"] == before + 1000
    r.free()
    r.free()  # idempotent
    assert {p["name"]: p for p in client.pools()}["default"]["used_bytes"] == before
    with pytest.raises(graphd.InvalidArgument) as e:
        client.alloc_region(4096, device=True)
    assert "cuda" in str(e.value) and "cpu:0" in str(e.value)
    assert {p["name"]: p for p in client.pools()}["default"]["used_bytes"] == before


def test_unreachable_daemon(tmp_path):
    c = graphd.Client("unix:%s" % (tmp_path / "nobody.sock"))
    with pytest.raises(graphd.Unavailable) as e:
        c.status()
    assert e.value.code == "UNAVAILABLE" and e.value.message
    c.close()
    c.close()  # idempotent
    with pytest.raises(graphd.GraphdError) as e:
        c.status()
    assert e.value.code == "FAILED_PRECONDITION"


def test_default_client_uses_env(daemon):
    c = graphd.default_client()
    assert c is graphd.default_client()
    assert c.address == daemon.address


def test_graph_pool_handle(client):
    h1 = graphd.graph_pool_handle("pytest-shared", device="cpu", client=client)
    h2 = graphd.graph_pool_handle("pytest-shared", device="cpu", client=client)  # exists: fine
    h3 = graphd.graph_pool_handle("pytest-shared", client=client)  # exists: where it is
    assert h1 == h2 == h3 and h1.device == "cpu:0" and not h1.owned
    anon = graphd.graph_pool_handle(client=client)
    assert anon.owned and anon.name != h1.name
    assert anon.device is None  # no device yet: made where it is first used (bind)
    assert anon.name not in [p["name"] for p in client.pools()]
    assert anon.bind("cpu", client).device == "cpu:0"
    names = [p["name"] for p in client.pools()]
    assert "pytest-shared" in names and anon.name in names
    with pytest.raises(graphd.NotFound) as e:
        graphd.graph_pool_handle("pytest-gpu", device="cuda:3", client=client)
    assert "cuda:3" in str(e.value)
    client.delete_pool("pytest-shared")
    client.close()  # deletes the pools it made without a name
    with graphd.Client(client.address) as c:
        assert anon.name not in [p["name"] for p in c.pools()]


def test_import_without_torch(daemon):
    """graphd's client part does not need torch."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import graphd\n"
            "print(graphd.Client().status()['daemon']['version'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_performance_warning_without_mps():
    """A device-resident capture on a GPU the daemon reaches without MPS warns once per device
    and process; with MPS, or for devices it does not list, it says nothing. (The daemon's side,
    Device.mps, is in test_devices; here a stand-in lists the devices.)"""
    import warnings
    from types import SimpleNamespace

    from graphd import graphs

    listed = [{"id": "cuda:7", "mps": False}, {"id": "cuda:8", "mps": True}]
    fake = SimpleNamespace(devices=lambda: listed)
    graphs._mps_checked.difference_update({"cuda:7", "cuda:8", "cuda:9"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for dev in ("cuda:7", "cuda:7", "cuda:8", "cuda:9"):
            graphs._warn_without_mps(fake, dev)
    assert [w.category for w in caught] == [graphd.PerformanceWarning]
    message = str(caught[0].message)
    assert "cuda:7" in message and "nvidia-cuda-mps-control" in message
