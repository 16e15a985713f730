"""Several training processes on one daemon: a shared pool, a process killed mid-training, and
eight capturing at once against a fresh daemon. Each process is tests/python/trainer.py (the
last test's, concurrent_worker.py) under /usr/bin/python3 (the interpreter running the tests),
which checks its own graphd run against an eager twin."""
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import graphd
from conftest import capture_at_once, wait_for

HERE = Path(__file__).resolve().parent


class Trainer:
    """A trainer.py subprocess whose stdout lines are collected by a thread."""

    def __init__(self, *args):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen([sys.executable, str(HERE / "trainer.py")] + list(args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines = queue.Queue()
        self.seen = []
        self.steps = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.split())

    def pump(self):
        while True:
            try:
                words = self.lines.get_nowait()
            except queue.Empty:
                return
            self.seen.append(words)
            if words and words[0] == "step":
                self.steps = int(words[1]) + 1

    def expect(self, word, timeout=60):
        """The first line starting with word (its words), failing on timeout or exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                words = self.lines.get(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(words)
            if words and words[0] == "step":
                self.steps = int(words[1]) + 1
            if words and words[0] == word:
                return words
        raise AssertionError("no %r from trainer (exit %s); stderr:\n%s" % (
            word, self.proc.poll(), self.stderr()))

    def send(self, text):
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def stderr(self):
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read()

    def finish(self, timeout=60):
        rc = self.proc.wait(timeout=timeout)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def captured(t):
    words = t.expect("captured")
    return int(words[1]), int(words[2]), [int(g) for g in words[3].split(",")]


def test_two_processes_share_a_pool():
    a = Trainer("--pool", "shared", "--wait-go", "--seed", "1", "--steps", "100", "--every", "25")
    b = Trainer("--pool", "shared", "--wait-go", "--seed", "2", "--steps", "100", "--every", "25",
                "--opt", "adam")
    try:
        sa, pa, ga = captured(a)
        sb, pb, gb = captured(b)
        assert sa != sb
        st = graphd.default_client().status()
        pool = next(p for p in st["pools"] if p["name"] == "shared")
        assert int(pool["sessions"]) == 2 and int(pool["graphs"]) == 2
        sessions = {int(s["id"]): s for s in st["sessions"]}
        assert int(sessions[sa]["pid"]) == pa and int(sessions[sb]["pid"]) == pb
        assert int(sessions[sa]["graphs"]) == 1 and int(sessions[sb]["graphs"]) == 1
        graphs = {int(g["id"]): g for g in st["graphs"]}
        for sid, gids in ((sa, ga), (sb, gb)):
            for gid in gids:
                assert graphs[gid]["pool"] == "shared" and int(graphs[gid]["session"]) == sid
        a.send("go\n")
        b.send("go\n")
        for t in (a, b):
            done = t.expect("done")
            assert done[2] == "ok", " ".join(done)
            assert t.finish() == 0, t.stderr()
    finally:
        a.kill()
        b.kill()
    # Both sessions ended (Goodbye at exit): the pool holds nothing of theirs.

    def empty():
        st = graphd.default_client().status()
        pool = next(p for p in st["pools"] if p["name"] == "shared")
        return (not [s for s in st["sessions"] if int(s["id"]) in (sa, sb)]
                and int(pool["sessions"]) == 0 and int(pool["graphs"]) == 0
                and int(pool["regions"]) == 0)

    assert wait_for(empty, 2.0), graphd.default_client().status()


def test_killed_process_leaves_nothing_behind(tmp_path):
    stop = tmp_path / "stop"
    victim = Trainer("--pool", "shared", "--steps", "100000", "--every", "1")
    other = Trainer("--pool", "shared", "--steps", "100000", "--every", "10", "--seed", "3",
                    "--stop-file", str(stop))
    try:
        sv, pv, gv = captured(victim)
        so, po, go = captured(other)
        victim.expect("step")
        other.expect("step")
        st = graphd.default_client().status()
        assert any(int(s["id"]) == sv and int(s["regions"]) > 0 for s in st["sessions"])

        os.kill(pv, signal.SIGKILL)
        t0 = time.monotonic()

        def gone():
            st = graphd.default_client().status()
            if any(int(s["id"]) == sv for s in st["sessions"]):
                return None
            if any(int(g["id"]) in gv or int(g["session"]) == sv for g in st.get("graphs", [])):
                return None
            pool = next(p for p in st["pools"] if p["name"] == "shared")
            mine = next(s for s in st["sessions"] if int(s["id"]) == so)
            if int(pool["sessions"]) != 1 or int(pool["graphs"]) != len(go):
                return None
            if int(pool["regions"]) != int(mine["regions"]):
                return None
            return st

        st = wait_for(gone, 1.0)
        elapsed = time.monotonic() - t0
        assert st, "the killed session is still in the daemon after %.2fs: %s" % (
            elapsed, graphd.default_client().status())
        victim.proc.wait()

        # The other process kept training through it.
        other.pump()
        at_kill = other.steps
        assert wait_for(lambda: (other.pump(), other.steps >= at_kill + 30)[1], 30), \
            "the surviving trainer stopped at step %d" % other.steps
        stop.write_text("")
        done = other.expect("done")
        assert done[2] == "ok", " ".join(done)
        assert other.finish() == 0, other.stderr()
    finally:
        victim.kill()
        other.kill()


def test_processes_capture_at_once_against_a_fresh_daemon(tmp_path, monkeypatch):
    """A torchrun-like start on the CPU (issue 18): eight processes of one uid capture at the
    same moment against a daemon that has just started, so every capture waits in the queue of
    the one executor the first of them starts, then all train, their replays interleaved with
    the others' captures; two rounds, a fresh daemon each, no failure allowed. The GPU form,
    16 processes and 10 rounds, is test_cuda.py's."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # eight processes, and the executor, on few cores
    failures = capture_at_once(tmp_path, "cpu", 8, 2)
    assert not failures, "\n".join(failures)
