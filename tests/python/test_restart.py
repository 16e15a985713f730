"""The Python client survives a daemon restart (graphd.recovery; README, "Upgrading and
restarting"): a training loop through graphd.make_graphed_callables goes on with the same loss
curve, bit for bit, when its daemon is stopped with SIGTERM or killed with SIGKILL and a new one
started on the same socket; a stopped daemon (SIGSTOP) is a clear error naming its pid, and the
loop goes on after SIGCONT. The daemon's status shows no leftovers afterwards.

Each test starts its own daemons (not the session's: this one is killed) on a socket of its own.
The training loop runs in a child process (this file run as a script), which pauses at the steps
the test names, so that the test acts at a known point of the loop: nothing here depends on
timing.
"""
import ctypes
import os
import signal
import subprocess
import sys

import pytest

import graphd
from conftest import BUILD, wait_answering, wait_for

STEPS = 10


# ---- the training loop (the child process) -------------------------------------------------


def _train(steps, pauses):
    """Two small MLPs (one with SGD and momentum, one with Adam), graphed on graphd's CPU device,
    trained side by side; prints each step's losses as exact hex floats. pauses: {step: where},
    where "before" (before the step's forward) or "mid" (between forward and backward): the loop
    prints PAUSE and reads a line from stdin there. A step that fails with a GraphdError is
    reported (ERROR code message), paused at, and run again."""
    import torch

    torch.manual_seed(0)
    data = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(4)]
    runs = []
    for opt in ("sgd", "adam"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.1), torch.nn.Linear(32, 4))
        x = torch.zeros(16, 8)
        model = graphd.make_graphed_callables(model, (x,))
        if opt == "sgd":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        runs.append((model, x, optimizer))

    def pause(what):
        print("PAUSE %s" % what, flush=True)
        sys.stdin.readline()

    if os.environ.get("TRAIN_ADVANCE_OLD_RNG"):
        # Before each session restore: what a stopped and resumed daemon's interrupted FORWARD
        # does to the old graphs' static tensors (test_stopped_daemon_is_reported_and_recovered,
        # where it happens or not by timing), here every time: their RNG state moves on from the
        # one the step has just written there. Then waits for the test (PAUSE recover).
        restore = graphd.recovery.State.recover

        def advance_then_recover(state, cause):
            for model, _, _ in runs:
                rng = model._graphd_runner.static.rng
                rng.copy_(torch.Generator().manual_seed(1234).get_state())
            pause("recover")
            return restore(state, cause)
        graphd.recovery.State.recover = advance_then_recover

    client = graphd.default_client()
    print("SESSION %d" % client.session_id, flush=True)
    step = 0
    while step < steps:
        try:
            if pauses.get(step) == "before":
                pause("%d before" % step)
            xs, ys = data[step % len(data)]
            losses = []
            for model, x, _ in runs:
                x.copy_(xs)
                losses.append(torch.nn.functional.mse_loss(model(x), ys))
            if pauses.get(step) == "mid":
                pause("%d mid" % step)
            for loss, (_, _, optimizer) in zip(losses, runs):
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        except graphd.GraphdError as e:
            print("ERROR %s %s" % (e.code, e.message.replace("\n", " ")), flush=True)
            pauses.pop(step, None)
            pause("%d error" % step)
            continue
        print("LOSS %d %s" % (step, " ".join(float(v).hex() for v in losses)), flush=True)
        step += 1
    # The module's parameters still live in the graph's static tensors (rebound after each
    # restart, not copied in at every forward): the count of those that do not.
    apart = sum(not any(p.data_ptr() == v.data_ptr() for v in model._graphd_runner.static.params)
                for model, _, _ in runs for p in model.parameters())
    print("RESTORES %d SESSION %d APART %d" % (client._recovery.restores, client.session_id,
                                               apart), flush=True)
    pause("done")


# ---- the tests -------------------------------------------------------------------------------


class Daemons:
    """Daemons started one after another on one socket."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.address = "unix:%s" % (tmp_path / "graphd.sock")
        self.proc = None
        self.n = 0
        self.trainers = []

    def start(self):
        self.n += 1
        log = self.dir / ("graphd-%d.log" % self.n)
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [str(BUILD / "graphd"), "--config", "/dev/null", "--listen", self.address,
                 "--cpu-devices", "1"], stdout=out, stderr=subprocess.STDOUT)
        self.log = log
        wait_answering(self.proc, self.address, 30)
        assert self.proc.poll() is None, "graphd exited:\n" + log.read_text()
        return self.proc

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=30)
        if sig == signal.SIGTERM:
            assert rc == 0, "graphd exited with %d:\n%s" % (rc, self.log.read_text())
        self.proc = None

    def status(self):
        with graphd.Client(self.address) as c:
            st = c.status()
            mine = c.session_id
        st["sessions"] = [s for s in st["sessions"] if int(s["id"]) != mine]
        return st

    def trainer(self, pauses, env=()):
        """A Trainer on these daemons' socket, killed (if still running) after the test."""
        t = Trainer(self.address, pauses, env)
        self.trainers.append(t)
        return t

    def client(self, timeout_ms):
        """A graphd.Client of these daemons whose GRAPHD_TIMEOUT_MS is timeout_ms (the
        environment of other clients stays as it was)."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GRAPHD_TIMEOUT_MS", str(timeout_ms))
            return graphd.Client(self.address)


@pytest.fixture
def daemons(tmp_path):
    """Daemons on a socket in tmp_path. After the test, the trainers it started through
    daemons.trainer() are killed and a daemon still running is stopped (SIGTERM, exit 0)."""
    d = Daemons(tmp_path)
    yield d
    for t in d.trainers:
        t.kill()
    if d.proc is not None:
        d.stop()


class Trainer:
    def __init__(self, address, pauses, env=()):
        e = dict(os.environ, GRAPHD_ADDRESS=address, PYTHONUNBUFFERED="1")
        e.update(env)
        arg = ",".join("%d:%s" % kv for kv in sorted(pauses.items()))
        self.proc = subprocess.Popen([sys.executable, __file__, "--train", str(STEPS), arg],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=e, text=True)
        self.lines = []

    def expect(self, prefix):
        """Reads lines up to the first one starting with prefix, which it returns."""
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("the trainer exited (%s) before %r:\n%s" %
                                     (self.proc.wait(), prefix, "".join(self.lines)))
            self.lines.append(line)
            if line.startswith(prefix):
                return line.strip()
            if line.startswith("ERROR"):  # the trainer now waits at "PAUSE n error"
                self.proc.kill()
                raise AssertionError("the trainer failed before %r:\n%s" %
                                     (prefix, "".join(self.lines)))

    def go(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self):
        self.expect("PAUSE done")
        self.go()
        assert self.proc.wait(timeout=120) == 0, "".join(self.lines)
        return [ln.split(None, 2)[2].strip() for ln in self.lines if ln.startswith("LOSS")]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _reference(daemons, env=()):
    return daemons.trainer({}, env).finish()


def _same_curve(t, expected):
    """t runs to its end with the loss curve expected, bit for bit."""
    got = t.finish()
    assert got == expected, "\n".join("%s | %s" % ab for ab in zip(expected, got))


def _graphs_of(st, sid):
    return sorted(int(g["id"]) for g in st.get("graphs", []) if int(g["session"]) == sid)


def test_restart_keeps_the_loss_curve(daemons):
    """SIGTERM before the forward of step 3, SIGKILL between the forward and the backward of
    step 6 (the new daemon started only after the trainer found the old one gone, so that it
    waits with backoff): the same losses as the uninterrupted run, bit for bit."""
    d = daemons
    d.start()
    env = {"GRAPHD_TIMEOUT_MS": "60000"}
    expected = _reference(d, env)
    assert len(expected) == STEPS
    t = d.trainer({3: "before", 6: "mid"}, env)
    t.expect("PAUSE 3 before")
    st = d.status()
    mine = [s for s in st["sessions"] if int(s["pid"]) == t.proc.pid]
    assert len(mine) == 1, st["sessions"]
    regions, graphs = int(mine[0]["regions"]), len(_graphs_of(st, int(mine[0]["id"])))
    assert regions > 0 and graphs == 2, (mine, st.get("graphs"))

    d.stop(signal.SIGTERM)
    d.start()
    t.go()
    t.expect("PAUSE 6 mid")
    d.stop(signal.SIGKILL)
    t.go()  # the trainer's backward finds the daemon gone and waits for the next one
    d.start()
    last = t.expect("RESTORES")
    assert last.split()[1] == "2", t.lines  # two restarts, each restored once
    assert last.split()[5] == "0", last  # the parameters live in the new static tensors

    # No leftovers: the new daemon has the trainer's one session, with as many regions and
    # graphs as before the restarts, and nothing else.
    st = d.status()
    assert [int(s["pid"]) for s in st["sessions"]] == [t.proc.pid], st["sessions"]
    s = st["sessions"][0]
    assert int(s["id"]) == int(last.split()[3])
    assert int(s["regions"]) == regions
    assert len(_graphs_of(st, int(s["id"]))) == graphs
    assert len(st.get("graphs", [])) == graphs
    _same_curve(t, expected)


def test_stopped_daemon_is_reported_and_recovered(daemons):
    """SIGSTOP before step 2: the step fails with graphd.DeadlineExceeded naming the daemon's pid
    (the replays go through the daemon here: GRAPHD_DIRECT=0); after SIGCONT the step runs again
    and the loss curve is the uninterrupted one."""
    d = daemons
    proc = d.start()
    env = {"GRAPHD_TIMEOUT_MS": "8000", "GRAPHD_DIRECT": "0"}
    expected = _reference(d, env)
    t = d.trainer({2: "before"}, env)
    t.expect("PAUSE 2 before")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        t.go()
        err = t.expect("ERROR")
        t.expect("PAUSE 2 error")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert err.startswith("ERROR DEADLINE_EXCEEDED"), err
    assert "graphd (pid %d)" % proc.pid in err and "is not answering" in err, err
    assert "GRAPHD_TIMEOUT_MS" in err and "kill -CONT" in err, err
    t.go()
    last = t.expect("RESTORES")
    assert last.split()[1] == "1", t.lines

    def one_session():  # the old session ends once the resumed daemon reads its socket
        st = d.status()
        return st if len(st["sessions"]) == 1 else None
    st = wait_for(one_session, 30)
    assert st, d.status()["sessions"]
    assert int(st["sessions"][0]["pid"]) == t.proc.pid
    assert int(st["sessions"][0]["id"]) == int(last.split()[3])
    assert len(st.get("graphs", [])) == 2
    _same_curve(t, expected)


def test_a_retried_forward_draws_from_the_rng_state_it_wrote(daemons):
    """The FORWARD a restart interrupted runs again on the new graph from the RNG state that the
    step wrote before it, not from the old graph's static RNG state, which a stopped daemon that
    resumes may advance after that write by running the interrupted FORWARD (the race behind
    test_stopped_daemon_is_reported_and_recovered failing in about half its runs): the trainer
    advances it itself before the restore. SIGKILL before step 3's forward."""
    d = daemons
    d.start()
    env = {"GRAPHD_TIMEOUT_MS": "60000"}
    expected = _reference(d, env)
    t = d.trainer({3: "before"}, dict(env, TRAIN_ADVANCE_OLD_RNG="1"))
    t.expect("PAUSE 3 before")
    d.stop(signal.SIGKILL)
    t.go()
    t.expect("PAUSE recover")
    d.start()
    t.go()
    last = t.expect("RESTORES")
    assert last.split()[1] == "1", t.lines
    _same_curve(t, expected)


def test_an_rpc_that_reaches_the_new_daemon_first_restores(daemons):
    """After a restart, gRPC reconnects by itself: an RPC can reach the new daemon before the
    client has read the old session socket's EOF, with the old session, and the new daemon
    answers NOT_FOUND "no such session: N". That restores the session as UNAVAILABLE does (it
    failed test_a_restart_without_a_new_daemon_says_so once under load)."""
    d = daemons
    d.start()
    c = graphd.Client(d.address)
    try:
        c.create_pool("mine", "cpu:0", limit_bytes=1 << 20, mode="group")
        d.stop(signal.SIGKILL)
        d.start()

        def reaches_new_daemon():  # a call without a session, not retried: the channel is up
            try:
                return c._list(graphd._lib.lib().graphd_list_devices, graphd._lib.Device)
            except graphd.GraphdError:
                return None
        assert wait_for(reaches_new_daemon, 30)
        pools = {p["name"]: p for p in c.pools()}
        assert c._recovery.restores == 1
        assert pools["mine"]["limit_bytes"] == 1 << 20 and pools["mine"]["mode"] == "group"
        assert [int(s["pid"]) for s in d.status()["sessions"]] == [os.getpid()]
    finally:
        c.close()


def test_an_rpc_to_a_stopped_daemon_names_it(daemons):
    """A control-plane call (Status) to a stopped daemon: graphd.DeadlineExceeded with its pid;
    after SIGCONT the same client goes on (its session was not lost)."""
    d = daemons
    proc = d.start()
    c = d.client(1000)
    try:
        sid = (c.status(), c.session_id)[1]
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(graphd.DeadlineExceeded) as e:
                c.status()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert "graphd (pid %d)" % proc.pid in str(e.value), e.value
        assert "not answering" in str(e.value) and "1000 ms" in str(e.value)
        assert wait_for(lambda: c.status() and c.session_id == sid, 10)
        assert c._recovery.restores == 0
    finally:
        c.close()


def test_a_restart_without_a_new_daemon_says_so(daemons):
    """The daemon killed and none started: the call fails with graphd.Unavailable once
    GRAPHD_TIMEOUT_MS has passed, saying what to do; once a daemon runs there again, the next
    call restores the session (pools and host regions included)."""
    d = daemons
    d.start()
    c = d.client(300)
    try:
        c.create_pool("mine", "cpu:0", limit_bytes=1 << 20, mode="group")
        region = c.alloc_region(8192, "mine")
        ctypes.memmove(region.ptr, b"graphd-restart", 14)
        d.stop(signal.SIGKILL)
        with pytest.raises(graphd.Unavailable) as e:
            c.pools()
        assert "no daemon answered there within 300 ms (GRAPHD_TIMEOUT_MS)" in str(e.value)
        assert "systemctl start graphd" in str(e.value)
        d.start()
        pools = {p["name"]: p for p in c.pools()}
        assert pools["mine"]["limit_bytes"] == 1 << 20 and pools["mine"]["mode"] == "group"
        assert c._recovery.restores == 1
        # The region was allocated again in the new session, with its bytes.
        assert ctypes.string_at(region.ptr, 14) == b"graphd-restart"
        st = c.status()
        assert [int(s["regions"]) for s in st["sessions"]] == [1], st["sessions"]
        assert pools["mine"]["regions"] == 1 and pools["mine"]["used_bytes"] >= 8192
        region.free()
        assert [int(s["regions"]) for s in c.status()["sessions"]] == [0]
    finally:
        c.close()


def test_errors_of_a_live_daemon_are_not_restarts(client):
    """A DEADLINE_EXCEEDED the daemon sends (a bound, named in its message) and an UNAVAILABLE
    while the daemon still lists the session (a replay connection whose executor died) are raised
    as they are: no "not answering", no new session."""
    sid = (client.status(), client.session_id)[1]
    for code, message in (("DEADLINE_EXCEEDED", "module load took over max_load_ms (120000 ms)"),
                          ("UNAVAILABLE", "the replay connection of graph 7 closed")):
        err = graphd.errors.make_error(code, message)
        with pytest.raises(graphd.GraphdError) as e:
            client._recovery.recover_or_raise(err)
        assert e.value is err
    assert client.session_id == sid and client._recovery.restores == 0


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--train":
    _train(int(sys.argv[2]), {int(k): v for k, v in
                              (item.split(":") for item in sys.argv[3].split(",") if item)})
