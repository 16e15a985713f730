"""Shared by the bench scripts that start a graphd of their own (capture_profile.py,
share_gpu.py, ...): which client package they measure, and waiting until the daemon answers."""
import importlib.util
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def client_on_path():
    """The graphd package a bench script measures, in its own process and in the workers it
    starts: the one the caller's PYTHONPATH (or an install) names, else this tree's client,
    which is then put first on sys.path and on PYTHONPATH for the workers. Returns the folder
    that holds the package; scripts print it, so that an A/B of two clients shows which ran."""
    spec = importlib.util.find_spec("graphd")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent.parent
    pkg = str(REPO / "client" / "python")
    sys.path.insert(0, pkg)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (pkg, os.environ.get("PYTHONPATH")) if p)
    return Path(pkg)


def wait_until_answering(proc, address, timeout=30.0):
    """Waits until the graphd process proc answers Status on address. None once it does, else
    why not: it exited (with its code), or it did not answer within timeout seconds. The caller
    adds the daemon's log to the reason."""
    import graphd  # the caller has put the client package on sys.path
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            return "graphd exited with %s" % proc.returncode
        try:
            with graphd.Client(address) as c:
                c.status()
            return None
        except graphd.GraphdError:
            if time.monotonic() > deadline:
                return "graphd did not answer within %g s" % timeout
            time.sleep(0.05)
