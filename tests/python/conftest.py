"""Fixtures for the Python client tests: one real graphd per test session, started from
$GRAPHD_BUILD (default build/) on a socket in a temporary directory with an empty config and the
CPU split into two devices, cpu:0 and cpu:1 (test_devices.py), with GRAPHD_ADDRESS pointing at
it; stopped with SIGTERM at the end, which must exit 0.

tests/run_tests.sh runs these with PYTHONPATH=client/python and GRAPHD_BUILD set; from the source
tree, `PYTHONPATH=client/python /usr/bin/python3 -m pytest -q tests/python` does the same.
"""
import contextlib
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


@contextlib.contextmanager
def fresh_daemon(tmp_path, tag, args=()):
    """A graphd of its own on a socket in tmp_path (so fresh executors for this uid),
    started with this process's environment, args, and the options in GRAPHD_TEST_DAEMON_ARGS
    (split on spaces; e.g. "--executor-cuda-queues 8" to see the held-session test fail without
    its fix); yields its address. On the way out it is stopped, and an exit code other than 0 fails
    the test with the end of its log."""
    sock = tmp_path / ("graphd-%s.sock" % tag)
    log = tmp_path / ("graphd-%s.log" % tag)
    address = "unix:%s" % sock
    with open(log, "w") as out:
        daemon = subprocess.Popen([str(BUILD / "graphd"), "--config", "/dev/null",
                                   "--listen", address] + list(args)
                                  + os.environ.get("GRAPHD_TEST_DAEMON_ARGS", "").split(),
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_answering(daemon, address, 20) and daemon.poll() is None, log.read_text()
        yield address
    finally:
        daemon.terminate()
        try:
            rc = daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            rc = daemon.wait()
    assert rc == 0, "graphd (%s) exited with %s: %s" % (tag, rc, log.read_text()[-2000:])


def start_workers(script, args, address):
    """One Python process per element of args running script with it, on the daemon at address,
    each read until it prints its 'ready' line."""
    env = dict(os.environ, GRAPHD_ADDRESS=address)
    procs = [subprocess.Popen([sys.executable, str(script)] + [str(a) for a in arg], text=True,
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for arg in args]
    try:
        for arg, p in zip(args, procs):
            line = p.stdout.readline()
            if not line.startswith("ready"):
                try:
                    p.wait(timeout=10)  # its stderr is whole once it has exited
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                raise AssertionError("worker %s printed %r, not ready (exit %s): %s" % (
                    arg, line, p.returncode, p.stderr.read()[-3000:]))
    except BaseException:
        kill_all(procs)
        raise
    return procs


def tell(p, line):
    p.stdin.write(line + "\n")
    p.stdin.flush()


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def capture_at_once(tmp_path, device, procs, rounds, timeout=300):
    """A torchrun-like start (issue 18), rounds times, each against a fresh daemon: procs
    processes of this uid (tests/python/concurrent_worker.py) build their models on device, wait
    at a barrier, then all capture at the same moment, every capture queued on the one executor
    of this uid and device that the first of them starts, and train 20 steps each against an
    eager twin, their replays interleaved with the others' captures; then the daemon must show
    one executor for the device, started once. Returns the failures, one line each (round,
    process, exit code, the end of its stderr; or the executors)."""
    script = Path(__file__).resolve().parent / "concurrent_worker.py"
    failures = []
    for rnd in range(rounds):
        with fresh_daemon(tmp_path, "%s-%d" % (device, rnd)) as address:
            workers = start_workers(script, [[r, device] for r in range(procs)], address)
            try:
                for p in workers:
                    tell(p, "go")
                for r, p in enumerate(workers):
                    out, err = p.communicate(timeout=timeout)
                    if p.returncode != 0 or "done ok" not in out:
                        failures.append("round %d process %d (exit %s): %s" % (
                            rnd, r, p.returncode, err.strip().splitlines()[-3:]))
            finally:
                kill_all(workers)
            # The first captures raced to start this uid's executor on the device: one started,
            # once, and served them all.
            with graphd.Client(address) as c:
                execs = [x for x in c.status()["executors"]
                         if x["device"].split(":")[0] == device]
            if [(int(x["starts"]), int(x["died"])) for x in execs] != [(1, 0)]:
                failures.append("round %d: executors on %s (one started once expected): %s" % (
                    rnd, device, execs))
    return failures


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
