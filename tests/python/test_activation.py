"""Socket activation (deploy/systemd/graphd.socket, docs/OPERATIONS.md "Socket activation"): the
control socket comes from systemd as fd 3 with LISTEN_FDS=1 and LISTEN_PID, graphd accepts on it
and serves gRPC on each connection, and the socket outlives the daemon, so that a client that
connects while none runs is served by the next one. Here the test plays systemd: it binds and
listens on the socket itself and starts graphd through /bin/sh, which sets LISTEN_PID to its own
pid before it execs graphd (the pid stays the same), with the socket on fd 3.
"""
import os
import shutil
import signal
import socket
import subprocess

import graphd
import pytest
from conftest import BUILD, wait_for

# HTTP/2: what a client sends first (the preface and an empty SETTINGS frame), and the frame type
# of the server's first frame (SETTINGS), RFC 9113 3.4.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
H2_SETTINGS = 4


class Activated:
    """A listening socket held here (systemd's), and graphd daemons started on it in turn."""

    def __init__(self, tmp_path, bind=None):
        self.dir = tmp_path
        self.path = str(tmp_path / "graphd.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(bind or self.path)
        self.sock.listen(16)
        self.proc = None
        self.n = 0

    def start(self, *args, wait=True):
        self.n += 1
        self.log = self.dir / ("graphd-%d.log" % self.n)
        listening = self.sock.fileno()

        def on_fd_3():  # in the child, before Popen closes the descriptors it does not pass
            os.dup2(listening, 3)  # SD_LISTEN_FDS_START
        env = dict(os.environ, LISTEN_FDS="1")
        env.pop("LISTEN_FDNAMES", None)
        cmd = ["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$@"',
               "sh", str(BUILD / "graphd"), "--config", "/dev/null", "--listen",
               "unix:" + self.path, "--cpu-devices", "1"] + list(args)
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, env=env, pass_fds=(3,), preexec_fn=on_fd_3,
                                         stdout=out, stderr=subprocess.STDOUT)
        if wait:
            assert wait_for(self.answers, 30), "graphd did not answer:\n" + self.log.read_text()
        return self.proc

    def answers(self):
        assert self.proc.poll() is None, "graphd exited:\n" + self.log.read_text()
        try:
            with graphd.Client("unix:" + self.path) as c:
                return c.status()
        except graphd.GraphdError:
            return None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        assert rc == 0, "graphd exited with %d:\n%s" % (rc, self.log.read_text())
        self.proc = None

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


def test_a_client_works_through_the_inherited_socket(tmp_path):
    a = Activated(tmp_path)
    try:
        a.start()
        assert "(socket from systemd)" in a.log.read_text()
        with graphd.Client("unix:" + a.path) as c:
            c.create_pool("act", "cpu:0", limit_bytes=1 << 20)
            region = c.alloc_region(4096, "act")
            region.write(b"through fd 3")
            assert region.read(12) == b"through fd 3"
            st = c.status()
            assert [int(s["pid"]) for s in st["sessions"]] == [os.getpid()]
            region.free()
        # The session socket is graphd's own, beside the control socket, as without systemd.
        assert os.path.exists(a.path + ".session")
        r = subprocess.run([str(BUILD / "graphctl"), "--address", "unix:" + a.path, "status"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "pid" in r.stdout, r.stderr
        a.stop()
        # The socket is systemd's: graphd leaves it in place, still listening.
        assert os.path.exists(a.path)
    finally:
        a.close()


def test_a_client_that_connects_between_daemons_is_served_by_the_next(tmp_path):
    a = Activated(tmp_path)
    try:
        a.start()
        a.stop()
        # No daemon runs: the kernel completes the connection into the socket's backlog.
        waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        waiting.connect(a.path)
        waiting.sendall(H2_PREFACE)
        a.start(wait=False)
        waiting.settimeout(60)
        head = waiting.recv(9)
        waiting.close()
        assert len(head) == 9 and head[3] == H2_SETTINGS, (head, a.log.read_text())
        assert wait_for(a.answers, 30)
        a.stop()
    finally:
        a.close()


def _fails(a, *args):
    a.start(*args, wait=False)
    rc = a.proc.wait(timeout=60)
    a.proc = None
    return rc, a.log.read_text()


def test_a_socket_at_another_path_than_listen_is_refused(tmp_path):
    a = Activated(tmp_path, bind=str(tmp_path / "other.sock"))
    try:
        rc, log = _fails(a)
        assert rc != 0
        assert "systemd passed the socket %s" % (tmp_path / "other.sock") in log, log
        assert "set listen = unix:%s" % (tmp_path / "other.sock") in log, log
    finally:
        a.close()


def test_a_socket_that_is_not_a_unix_stream_listener_is_refused(tmp_path):
    a = Activated(tmp_path)
    a.sock.close()
    a.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    a.sock.bind(("127.0.0.1", 0))
    a.sock.listen(1)
    try:
        rc, log = _fails(a)
        assert rc != 0
        assert "not a listening unix stream socket" in log and "ListenStream=" in log, log
    finally:
        a.close()


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate is not installed (package systemd)")
def test_systemd_socket_activate_starts_graphd_on_the_first_connection(tmp_path):
    """systemd's own launcher: it binds the socket, and execs graphd with it on fd 3 when the
    first client connects; that client is served by the daemon it started."""
    path = str(tmp_path / "graphd.sock")
    log = tmp_path / "graphd.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["systemd-socket-activate", "-l", path, str(BUILD / "graphd"),
                                 "--config", "/dev/null", "--listen", "unix:" + path,
                                 "--cpu-devices", "1"], stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: os.path.exists(path), 30), log.read_text()
        # The first connection, which starts the daemon, is served: no retry here. (libgraphd
        # once gave a connection attempt 100 ms to see the server's SETTINGS, and a daemon that
        # systemd had just started took longer: the first call failed UNAVAILABLE.)
        with graphd.Client("unix:" + path) as c:
            st = c.status()
        assert int(st["daemon"]["pid"]) == proc.pid  # exec'd in place: systemd's LISTEN_PID
        assert "(socket from systemd)" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert os.path.exists(path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
