"""graphd's command line as a newcomer meets it (issue 16): --help fits 80 columns with one
default per setting, a mistyped flag gets one line with a hint, and --check-config validates a
file without starting anything."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("GRAPHD_BUILD", os.path.join(ROOT, "build")))
GRAPHD = os.path.join(BUILD, "graphd")


def graphd(*args):
    return subprocess.run([GRAPHD, *args], capture_output=True, text=True, timeout=30)


def settings():
    """The settings as --check-config prints them: name -> value."""
    r = graphd("--check-config", "--config", "/dev/null")
    assert r.returncode == 0, r.stderr
    return dict(line.split(" = ", 1) for line in r.stdout.splitlines()[1:])


def test_help_fits_80_columns_with_one_default_each():
    r = graphd("--help")
    assert r.returncode == 0
    long = [line for line in r.stdout.splitlines() if len(line) > 80]
    assert long == []
    blocks = re.split(r"^  --", r.stdout.split("settings (", 1)[1], flags=re.M)[1:]
    names = set(settings())
    assert {b.split("\n", 1)[0].replace("-", "_") for b in blocks} == names
    for b in blocks:
        body = b.split("\n", 1)[1]
        assert len(re.findall(r"Default:\s", body)) == 1, b
        assert not re.search(r"\(default", body, re.I), b


def test_unknown_flag_is_one_line_with_a_hint():
    r = graphd("--max-sesions", "3")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1, r.stderr
    assert "unknown option '--max-sesions' (did you mean --max-sessions?)" in r.stderr
    r = graphd("--frobnicate")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "see graphd --help" in r.stderr and "did you mean" not in r.stderr
    r = graphd("--listen")
    assert r.returncode == 2 and "--listen needs a value" in r.stderr


def test_check_config(tmp_path):
    good = tmp_path / "good.conf"
    good.write_text("[graphd]\nmax_sessions = 7\nlog_level = debug\n")
    r = graphd("--check-config", "--config", str(good))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# %s: OK\n" % good)
    assert "max_sessions = 7\n" in r.stdout and "log_level = debug\n" in r.stdout
    bad = tmp_path / "bad.conf"
    bad.write_text("[graphd]\nmax_sessions = many\n")
    r = graphd("--check-config", "--config", str(bad))
    assert r.returncode == 1
    assert "bad.conf:2: max_sessions" in r.stderr and r.stdout == ""
    r = graphd("--check-config", "--config", str(tmp_path / "missing.conf"))
    assert r.returncode == 1 and "missing.conf" in r.stderr


def start_and_stop(tmp_path, env_extra=None, journal=False):
    """Runs graphd with stderr to a file until its session socket exists, then SIGTERM; returns
    the log's lines."""
    import signal
    import time
    log = tmp_path / "graphd.log"
    sock = tmp_path / "g.sock"
    with open(log, "w") as err:
        env = dict(os.environ, **(env_extra or {}))
        if journal:
            st = os.fstat(err.fileno())
            env["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
        p = subprocess.Popen([GRAPHD, "--config", "/dev/null", "--listen", "unix:%s" % sock,
                              "--socket-group", "no-such-group-gd"], stderr=err, env=env)
        for _ in range(300):
            if os.path.exists(str(sock) + ".session"):
                break
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    return log.read_text().splitlines()


def test_log_off_a_terminal_has_timestamps_and_journald_gets_priorities(tmp_path):
    lines = start_and_stop(tmp_path)
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (info|warn|error|debug) "
    assert lines and all(re.match(stamp, line) for line in lines), lines[:3]
    # A socket group that does not exist is a warning, once, that says what to do.
    warned = [line for line in lines if "socket_group 'no-such-group-gd' does not exist" in line]
    assert len(warned) == 1 and " warn " in warned[0] and "groupadd" in warned[0]
    lines = start_and_stop(tmp_path, journal=True)
    assert lines and all(re.match(r"<[3-7]>(info|warn|error|debug): ", line) for line in lines)


GRAPHCTL = os.path.join(BUILD, "graphctl")


def test_graphctl_says_why_it_cannot_connect(tmp_path):
    """No daemon at the address, and a socket this user may not open: each named with what to
    do, not gRPC's bare 'failed to connect to all addresses'."""
    r = subprocess.run([GRAPHCTL, "--address", "unix:%s/none.sock" % tmp_path, "status"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "no socket at %s/none.sock: is graphd running there?" % tmp_path in r.stderr
    if os.geteuid() != 0:
        return  # the second half runs a client as another uid (setpriv), which needs root
    import shutil
    import signal
    import time
    if shutil.which("setpriv") is None:
        return
    import grp
    import tempfile
    from pathlib import Path
    # pytest's tmp_path is under a directory closed to other uids: the hint then says only that
    r = subprocess.run(["setpriv", "--reuid=4321", "--regid=4321", "--clear-groups",
                        GRAPHCTL, "--address", "unix:%s/none.sock" % tmp_path, "status"],
                       capture_output=True, text=True, timeout=60)
    assert "permission denied: uid 4321 may not reach %s/none.sock (a directory on its path is " \
        "closed to it" % tmp_path in r.stderr, r.stderr
    tmp_path = Path(tempfile.mkdtemp(prefix="graphd-perm-"))  # reachable by every uid
    os.chmod(tmp_path, 0o755)
    sock = tmp_path / "g.sock"
    with open(tmp_path / "graphd.log", "w") as err:
        p = subprocess.Popen([GRAPHD, "--config", "/dev/null", "--listen", "unix:%s" % sock,
                              "--socket-mode", "0660"], stderr=err)
    try:
        for _ in range(300):
            if os.path.exists(str(sock) + ".session"):
                break
            time.sleep(0.1)
        for group in ("nogroup", "root"):  # a group to join; root's, which is no advice
            try:
                os.chown(sock, -1, grp.getgrnam(group).gr_gid)
            except KeyError:
                continue
            r = subprocess.run(["setpriv", "--reuid=4321", "--regid=4321", "--clear-groups",
                                GRAPHCTL, "--address", "unix:%s" % sock, "status"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode != 0
            assert "permission denied: uid 4321 may not open %s" % sock in r.stderr, r.stderr
            if group == "root":
                assert "its group is root; ask the operator to create the group that socket_group" \
                    in r.stderr, r.stderr
                assert "usermod" not in r.stderr
            else:
                assert "join its group '%s'" % group in r.stderr and "usermod -aG" in r.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_systemd_notify_ready_status_and_watchdog(tmp_path):
    """Under systemd (Type=notify, WatchdogSec=): READY=1 once serving, a STATUS= line with the
    sessions and graphs, and WATCHDOG=1 keep-alives from the loop."""
    import signal
    import socket
    import time
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(str(tmp_path / "notify"))
    ns.settimeout(0.5)
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="2000000")
    env.pop("WATCHDOG_PID", None)
    with open(tmp_path / "graphd.log", "w") as err:
        p = subprocess.Popen([GRAPHD, "--config", "/dev/null", "--listen",
                              "unix:%s" % (tmp_path / "g.sock")], stderr=err, env=env)
    got = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                got.append(ns.recv(4096).decode())
            except socket.timeout:
                pass
            text = "\n".join(got)
            if "WATCHDOG=1" in text and "STATUS=" in text:
                break
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        ns.close()
    text = "\n".join(got)
    assert "READY=1" in text, got
    assert "STATUS=0 sessions, 0 graphs" in text, got
    assert "WATCHDOG=1" in text, got


def test_executor_settings_reach_the_executor(tmp_path):
    """The executor settings that only an executor uses travel on its command line: here
    executor_cuda_queues (docs/CUDA.md), which a CUDA executor turns into
    CUDA_DEVICE_MAX_CONNECTIONS before its context exists (a CPU executor takes and ignores
    it)."""
    import signal
    import sys

    from conftest import wait_answering

    assert settings()["executor_cuda_queues"] == "32"
    address = "unix:%s" % (tmp_path / "g.sock")
    child = (  # a session of its own on that daemon, whose capture starts this uid's executor
        "import torch, graphd\n"
        "graphd.make_graphed_callables(torch.nn.Linear(4, 2), (torch.randn(3, 4),))\n"
        "pid = [e['pid'] for e in graphd.default_client().status()['executors']\n"
        "       if e['device'] == 'cpu:0'][0]\n"
        "print(open('/proc/%d/cmdline' % pid).read().replace('\\0', ' '))\n")
    with open(tmp_path / "graphd.log", "w") as err:
        p = subprocess.Popen([GRAPHD, "--config", "/dev/null", "--listen", address,
                              "--executor-cuda-queues", "7"], stderr=err)
    try:
        assert wait_answering(p, address, 20) and p.poll() is None
        r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, GRAPHD_ADDRESS=address))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    assert r.returncode == 0, r.stderr
    argv = r.stdout.split()
    assert argv[argv.index("--cuda-queues") + 1] == "7", argv
