"""Shared by the bench scripts that start a graphd of their own (capture_profile.py,
share_gpu.py): waiting until it answers."""
import time


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
