"""graphctl status as an operator reads it (issue 16): columns that mean nothing on a device are
not shown, the settings only with --config and last, uptime once, latency labelled cumulative,
user names next to uids, a capturing session marked, --json with a schema_version, status
--watch / top with replay rates, pools as status shows them; and the Python client's log line
for a slow capture."""
import json
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import torch

import graphd
from conftest import BUILD, wait_for

GRAPHCTL = str(BUILD / "graphctl")
GRAPHD = str(BUILD / "graphd")


def ctl(*args, env=None):
    r = subprocess.run([GRAPHCTL, *args], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def section(out, title):
    """The lines of section "# title" of a table output: header first, up to the blank line."""
    lines = out.split("\n")
    start = lines.index("# " + title) + 1
    end = lines.index("", start)
    return lines[start:end]


def titles(out):
    return [line[2:] for line in out.split("\n") if line.startswith("# ")]


def test_cpu_devices_and_pools_show_no_columns_of_other_kinds():
    out = ctl("status")
    header = section(out, "Devices")[0].split()
    assert header == ["ID", "KIND", "NAME", "MEMORY", "FREE"], out
    pools = section(out, "Pools")[0].split()
    assert "MEMPOOL" not in pools and "MEMPOOL_USED" not in pools, out
    # The JSON keeps every field, for programs: mps is there, false.
    st = json.loads(ctl("--json", "status"))
    assert all(d["mps"] is False for d in st["devices"])
    assert all("graph_mempool_reserved_bytes" in p for p in st["pools"])


def test_config_only_with_the_flag_and_last():
    out = ctl("status")
    assert "Config" not in titles(out), out
    assert "max_capture_ms" not in out
    out = ctl("status", "--config")
    assert titles(out)[-1] == "Config", titles(out)
    assert re.search(r"^max_capture_ms +\d+ +yes$", out, re.M), out


def test_uptime_and_start_once_latency_labelled_cumulative():
    out = ctl("status")
    daemon = section(out, "Daemon")
    assert [line for line in daemon if line.startswith("uptime ")] != [], daemon
    assert [line for line in daemon if line.startswith("started")] == [], daemon
    assert re.search(r"\(started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", "\n".join(daemon))
    pools = section(out, "Pools")
    assert "P50_ALL" in pools[0] and "P99_ALL" in pools[0]
    assert "P50_ALL, P99_ALL: replay latency over all replays since the pool was created " \
           "(cumulative, not windowed)" in pools


def test_user_names_next_to_uids():
    me = pwd.getpwuid(os.getuid()).pw_name
    rows = section(ctl("status"), "Sessions")
    header = rows[0].split()
    assert header[2:4] == ["UID", "USER"], rows
    mine = [r.split() for r in rows[1:] if r.split()[1] == "graphctl"]
    assert mine and mine[0][2] == str(os.getuid()) and mine[0][3] == me, rows


def test_json_has_a_schema_version_first():
    st = json.loads(ctl("--json", "status"))
    assert list(st)[0] == "schema_version" and st["schema_version"] == 1
    assert {"daemon", "devices", "pools", "sessions", "graphs", "others", "executors"} <= set(st)
    # The Python client reads the same document.
    assert graphd.default_client().status()["schema_version"] == 1


def test_pools_is_the_pools_section_of_status():
    strip = re.compile(r"\S+ ago$")  # CREATED moves between the two calls
    a = [strip.sub("", line) for line in section(ctl("status"), "Pools")]
    b = [strip.sub("", line) for line in ctl("pools").split("\n")[1:] if line]
    assert ctl("pools").startswith("# Pools\n")
    assert a == b
    # --json: status's "pools" array.
    assert [p["name"] for p in json.loads(ctl("--json", "pools"))] == \
        [p["name"] for p in json.loads(ctl("--json", "status"))["pools"]]


def test_watch_twice_with_rates_and_no_screen_clearing_off_a_terminal():
    out = ctl("status", "--watch", "0.2", "--count", "2")
    assert "\033[" not in out
    blocks = re.split(r"^graphctl status --watch 0\.2: .*, refresh \d+\n", out, flags=re.M)
    assert len(blocks) == 3 and blocks[0] == "", out  # two blocks, each with its title line
    assert "REPLAYS/S" not in blocks[1]  # no rate without an earlier reply
    pools = section(blocks[2], "Pools")
    assert "REPLAYS/S" in pools[0].split(), blocks[2]
    assert re.match(r"REPLAYS/S: over the last \d+\.\d s$", pools[-1]), pools
    col = pools[0].split().index("REPLAYS/S")
    assert float(pools[1].split()[col]) >= 0
    # top is the same thing; --json gives one document per refresh, rates in the second.
    out = ctl("--json", "top", "0.2", "--count", "2")
    docs = [json.loads(d) for d in re.split(r"(?<=\n})\n(?=\{)", out.strip())]
    assert len(docs) == 2
    assert all("replays_per_s" not in p for p in docs[0]["pools"])
    assert all(p["replays_per_s"] >= 0 for p in docs[1]["pools"])


def test_watch_ends_cleanly_on_sigint():
    p = subprocess.Popen([GRAPHCTL, "top", "0.2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        assert first.startswith("graphctl status --watch 0.2: "), first
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and err == "", err


def test_watch_usage_errors():
    for args, want in [(["status", "--watch", "0"], "bad refresh interval '0'"),
                       (["top", "x"], "bad refresh interval 'x'"),
                       (["status", "--count", "2"], "--count goes with"),
                       (["top", "--count", "0"], "bad --count '0'"),
                       (["pools", "--watch"], "--watch goes with 'status'"),
                       (["pools", "--config"], "--config goes with 'status'")]:
        r = subprocess.run([GRAPHCTL, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and want in r.stderr, (args, r.stderr)


def test_an_unusable_address_is_named(monkeypatch):
    env = dict(os.environ, GRAPHD_ADDRESS="relative/graphd.sock")
    r = subprocess.run([GRAPHCTL, "status"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "cannot use address 'relative/graphd.sock' (from GRAPHD_ADDRESS)" in r.stderr, r.stderr
    assert "(default)" not in r.stderr


def test_slow_capture_logs_a_line_naming_the_callable(monkeypatch, caplog):
    """GRAPHD_SLOW_CAPTURE_S=0: the line for every capture, and the one when it ends."""
    monkeypatch.setenv("GRAPHD_SLOW_CAPTURE_S", "0")
    caplog.set_level(logging.WARNING, logger="graphd")
    lin = torch.nn.Linear(4, 2)
    graphd.make_graphed_callables(lin, (torch.randn(3, 4, requires_grad=True),))
    lines = [r.getMessage() for r in caplog.records if r.name == "graphd"]
    assert len(lines) == 2, lines
    assert re.match(r"graphd: capturing Linear for \d+\.\d s so far: .* not hung", lines[0])
    assert re.match(r"graphd: capture of Linear done after \d+\.\d s$", lines[1]), lines
    caplog.clear()
    monkeypatch.setenv("GRAPHD_SLOW_CAPTURE_S", "3600")  # a fast capture says nothing
    graphd.make_graphed_callables(torch.nn.Linear(4, 2), (torch.randn(3, 4, requires_grad=True),))
    assert [r for r in caplog.records if r.name == "graphd"] == []


# Fast where the client runs it (the output spec, under no_grad), for ever in the daemon's
# warm-up (grad on): a capture that stays in flight until its daemon stops.
STUCK = r'''
import logging, sys, torch, graphd
from torch import nn

class Stuck(nn.Module):
    def forward(self, x):
        if torch.is_grad_enabled():
            i = 0
            while i >= 0:
                i = i + 1
        return x * 2.0

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
print("capturing", flush=True)
graphd.make_graphed_callables(torch.jit.script(Stuck()), (torch.randn(4, requires_grad=True),))
'''


def test_a_capturing_session_says_so():
    """A daemon of its own (the stuck capture holds its executor): while the capture is in flight
    the client has logged its line (GRAPHD_SLOW_CAPTURE_S=1) and status shows the session
    capturing, in the table and in the JSON. As root, also: a uid without an account shows as
    its number in the USER column (the socket is open to all uids there)."""
    tmp = tempfile.mkdtemp(prefix="graphd-status-")
    os.chmod(tmp, 0o755)
    address = "unix:%s/g.sock" % tmp
    with open(os.path.join(tmp, "graphd.log"), "w") as log:
        d = subprocess.Popen([GRAPHD, "--config", "/dev/null", "--listen", address,
                              "--socket-mode", "0666"], stderr=log)
    client = None
    try:
        env = dict(os.environ, GRAPHD_ADDRESS=address)
        assert wait_for(lambda: subprocess.run([GRAPHCTL, "status"], env=env,
                                               capture_output=True).returncode == 0, 60)
        script = os.path.join(tmp, "stuck.py")  # TorchScript reads the class's source
        with open(script, "w") as f:
            f.write(STUCK)
        client = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=dict(env, GRAPHD_SLOW_CAPTURE_S="1"))
        line = client.stderr.readline()  # blocks until the line (or the client's end)
        assert re.match(r"graphd: capturing RecursiveScriptModule for \d+\.\d s so far: .*"
                        r"not hung", line), line + client.stderr.read()

        def capturing():
            st = json.loads(ctl("--json", "status", env=env))
            return [s for s in st["sessions"] if s["capturing_graphs"] > 0]
        busy = wait_for(capturing, 60, interval=0.1)
        assert busy and busy[0]["pid"] == client.pid, busy
        assert busy[0]["capturing_since_unix_ms"] > 0
        rows = section(ctl("status", env=env), "Sessions")
        assert "CAPTURING" in rows[0].split()
        pid = rows[0].split().index("PID")  # ID, NAME, UID and USER are one word each
        mine = [r for r in rows[1:] if r.split()[pid] == str(client.pid)]
        assert mine and re.search(r"\byes, for \S+", mine[0]), rows
        # The others are not capturing.
        assert all(s["capturing_since_unix_ms"] == 0 and s["capturing_graphs"] == 0
                   for s in json.loads(ctl("--json", "status", env=env))["sessions"]
                   if s["pid"] != client.pid)
        if os.geteuid() == 0 and shutil.which("setpriv") is not None and not has_account(4377):
            r = subprocess.run(["setpriv", "--reuid=4377", "--regid=4377", "--clear-groups",
                                GRAPHCTL, "status"], capture_output=True, text=True, timeout=60,
                               env=env)
            assert r.returncode == 0, r.stderr
            rows = [r.split() for r in section(r.stdout, "Sessions")[1:]]
            assert rows and rows[0][2:4] == ["4377", "4377"], r.stdout  # its own session only
    finally:
        if client is not None:
            client.kill()
            client.communicate()
        d.send_signal(signal.SIGTERM)
        try:
            d.wait(timeout=60)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def has_account(uid):
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_operations_doc_names_every_json_field():
    """docs/OPERATIONS.md, "Reading status", lists every field of the JSON (schema_version too),
    so that a field added to Status without a line there fails here."""
    from conftest import REPO
    doc = (REPO / "docs" / "OPERATIONS.md").read_text()
    doc = doc[doc.index("## Reading status"):]
    doc = doc[:doc.find("\n## ", 1)] if "\n## " in doc[1:] else doc
    assert "`schema_version`, now **1**" in doc

    def keys(v, out):
        if isinstance(v, dict):
            for k, sub in v.items():
                out.add(k)
                if k != "config":  # daemon.config is keyed by setting name
                    keys(sub, out)
        elif isinstance(v, list):
            for sub in v:
                keys(sub, out)
        return out
    st = json.loads(ctl("--json", "status"))
    missing = sorted(k for k in keys(st, set())
                     if "`%s`" % k not in doc and "`%s[]`" % k not in doc)
    assert missing == [], missing


def test_a_cut_cell_ends_with_dots():
    """A long text cell (an executor's SANDBOX, over 95 characters where there is no cgroup2) is
    cut with "..." rather than mid-word without a sign; --json has it whole."""
    ctl("status")  # this uid's executor exists once a session has run a call; status lists it
    graphd.make_graphed_callables(torch.nn.Linear(4, 2), (torch.randn(3, 4, requires_grad=True),))
    st = json.loads(ctl("--json", "status"))
    rows = section(ctl("status"), "Executors")
    col = rows[0].index("SANDBOX")
    for e in st["executors"]:
        cells = [r[col:] for r in rows[1:] if r.split()[3] == str(e["pid"] or "-")]
        assert len(cells) == 1, rows
        cell = cells[0]
        if cell.endswith("..."):
            assert e["sandbox"].startswith(cell[:-3]) and len(e["sandbox"]) > len(cell) - 3
        else:
            assert cell == e["sandbox"], (cell, e["sandbox"])
