"""Fixtures for the Python client tests: one real graphd per test session, started from
$GRAPHD_BUILD (default build/) on a socket in a temporary directory with an empty config and the
CPU split into two devices, cpu:0 and cpu:1 (test_devices.py), with GRAPHD_ADDRESS pointing at
it; stopped with SIGTERM at the end, which must exit 0.

tests/run_tests.sh runs these with PYTHONPATH=client/python and GRAPHD_BUILD set; from the source
tree, `PYTHONPATH=client/python /usr/bin/python3 -m pytest -q tests/python` does the same.
"""
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("GRAPHD_BUILD", "build"))
if not BUILD.is_absolute():
    BUILD = REPO / BUILD
os.environ["GRAPHD_BUILD"] = str(BUILD)  # for the package and for subprocesses
PYTHONPATH = str(REPO / "client" / "python")
if PYTHONPATH not in sys.path:
    sys.path.insert(0, PYTHONPATH)
if PYTHONPATH not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # for subprocesses
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (PYTHONPATH, os.environ.get("PYTHONPATH")) if p)

import graphd  # noqa: E402  (after sys.path is set)


class Daemon:
    def __init__(self, proc, address, log):
        self.proc = proc
        self.address = address
        self.log = log

    def log_text(self):
        try:
            return Path(self.log).read_text()
        except OSError:
            return ""


def wait_for(pred, timeout, interval=0.02):
    """pred()'s first true value within timeout seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def wait_answering(proc, address, timeout):
    """Waits until the daemon proc answers Status at address or has exited; wait_for's value
    (false: still silent after timeout seconds)."""
    def answers():
        if proc.poll() is not None:
            return True
        try:
            with graphd.Client(address) as c:
                c.status()
            return True
        except graphd.GraphdError:
            return False
    return wait_for(answers, timeout)


@pytest.fixture(scope="session", autouse=True)
def daemon(tmp_path_factory):
    exe = BUILD / "graphd"
    if not exe.exists():
        pytest.exit("no %s: build it first (make)" % exe, returncode=2)
    d = tmp_path_factory.mktemp("graphd")
    address = "unix:%s" % (d / "graphd.sock")
    log = d / "graphd.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(exe), "--config", "/dev/null", "--listen", address,
                                 "--cpu-devices", "2"],
                                stdout=out, stderr=subprocess.STDOUT)
    os.environ["GRAPHD_ADDRESS"] = address
    traces = d / "traces"  # the disk trace cache (trace_cache.py): this run's own, never ~/.cache
    traces.mkdir(mode=0o700)
    os.environ["GRAPHD_TRACE_CACHE_DIR"] = str(traces)
    dm = Daemon(proc, address, log)
    wait_answering(proc, address, 20)
    if proc.poll() is not None:
        pytest.exit("graphd exited with %s:\n%s" % (proc.returncode, dm.log_text()), returncode=2)
    yield dm

    gc.collect()  # graphs still held by dead objects are released while the daemon is up
    graphd.default_client().close()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("graphd did not exit within 20 s of SIGTERM:\n" + dm.log_text())
    assert rc == 0, "graphd exited with %d:\n%s" % (rc, dm.log_text())


@pytest.fixture
def client(daemon):
    with graphd.Client(daemon.address) as c:
        yield c
