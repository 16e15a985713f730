"""The Prometheus endpoint (metrics_listen): a daemon of its own with /metrics on a free
127.0.0.1 port, some work through the Python client, then a scrape checked against Status taken
right before and after it, figure by figure; 404 and 405 elsewhere; a bad metrics_listen refuses
to start with a message that says what to give."""
import io
import math
import os
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request

import pytest
import torch

import graphd
from conftest import BUILD, wait_for
from graphd import graphs

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, frozenset of (label, value)): value} from Prometheus text 0.0.4, and the
    families' TYPE lines; every non-comment line must be a sample."""
    samples, types = {}, {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, "not a sample line: %r" % line
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        key = (m.group(1), labels)
        assert key not in samples, "duplicate sample %r" % line
        samples[key] = float(m.group(3))
    return samples, types


def get(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def select(samples, name):
    """[(labels dict, value)] of every sample named name."""
    return [(dict(k[1]), v) for k, v in samples.items() if k[0] == name]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def http_code(url, method="GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _archive():
    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(torch.nn.Linear(3, 2), (torch.randn(4, 3),)), buf)
    return buf.getvalue()


@pytest.fixture
def metrics_daemon(tmp_path):
    port = free_port()
    address = "unix:%s" % (tmp_path / "m.sock")
    log = open(tmp_path / "m.log", "w")
    proc = subprocess.Popen([str(BUILD / "graphd"), "--config", "/dev/null", "--listen", address,
                             "--metrics-listen", "127.0.0.1:%d" % port],
                            stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port

    def up():
        if proc.poll() is not None:
            return True
        try:
            with graphd.Client(address) as c:
                c.status()
            return http_code(url + "/metrics") == 200
        except (graphd.GraphdError, OSError):
            return False

    wait_for(up, 20)
    assert proc.poll() is None, (tmp_path / "m.log").read_text()
    yield address, url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, (tmp_path / "m.log").read_text()
    log.close()


def rpc_calls(samples):
    return {(lab["method"], lab["code"]): v
            for lab, v in select(samples, "graphd_rpc_calls_total")}


def check_histogram(samples, name, **labels):
    """Buckets cumulative, ending in +Inf equal to _count; returns _count."""
    buckets = sorted(((float(lab["le"]), v) for lab, v in select(samples, name + "_bucket")
                      if all(lab.get(k) == x for k, x in labels.items())))
    assert len(buckets) == 26 and math.isinf(buckets[-1][0])
    assert buckets[0][0] == pytest.approx(2 ** 10 / 1e9)
    assert buckets[-2][0] == pytest.approx(2 ** 34 / 1e9)
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets
    count = get(samples, name + "_count", **labels)
    assert buckets[-1][1] == count
    assert (get(samples, name + "_sum", **labels) > 0) == (count > 0)
    return count


def test_metrics_match_status(metrics_daemon):
    address, url = metrics_daemon
    before_work = rpc_calls(parse(scrape(url + "/metrics"))[0])
    with graphd.Client(address) as c:
        c.create_pool("metrics-pool", "cpu:0", limit_bytes=1 << 20)
        regions = [c.alloc_region(n, pool="metrics-pool") for n in (4096, 8192)]
        mid = c.register_module(_archive(), "lin")
        (g,) = c.capture([(mid, None, [(1, (4, 3), False)])], pool="metrics-pool")
        for _ in range(5):
            g.replay(0)
        g.replay(0, rpc=True)
        with pytest.raises(graphd.NotFound):
            c.delete_pool("no-such-pool")

        st = c.status()
        text = scrape(url + "/metrics")
        after = c.status()
        m, types = parse(text)

        # Pools: every figure Status has, the same in Status before, the scrape, and after.
        for p in st["pools"]:
            q = next(x for x in after["pools"] if x["name"] == p["name"])
            lab = {"pool": p["name"], "device": p["device"]}
            for field, metric in (("reserved_bytes", "graphd_pool_reserved_bytes"),
                                  ("used_bytes", "graphd_pool_used_bytes"),
                                  ("limit_bytes", "graphd_pool_limit_bytes"),
                                  ("regions", "graphd_pool_regions"),
                                  ("graphs", "graphd_pool_graphs"),
                                  ("sessions", "graphd_pool_sessions"),
                                  ("replays", "graphd_pool_replays_total")):
                want = int(p.get(field, 0))
                assert int(q.get(field, 0)) == want, (p["name"], field)
                assert get(m, metric, **lab) == want, (p["name"], field)
            assert check_histogram(m, "graphd_pool_replay_duration_seconds", **lab) == \
                int(p.get("replays", 0))
        mp = next(p for p in st["pools"] if p["name"] == "metrics-pool")
        assert int(mp["regions"]) >= 2 and int(mp["reserved_bytes"]) >= 4096 + 8192
        assert int(mp["replays"]) == 6 and int(mp["graphs"]) == 1
        assert types["graphd_pool_replay_duration_seconds"] == "histogram"
        assert types["graphd_pool_replays_total"] == "counter"

        # Devices, daemon, sessions per uid, executors: as Status says.
        for d in st["devices"]:
            assert get(m, "graphd_device_memory_total_bytes", device=d["id"]) == \
                int(d["memory_total"])
            reserved = sum(int(p.get("reserved_bytes", 0)) for p in st["pools"]
                           if p["device"] == d["id"])
            assert get(m, "graphd_device_memory_reserved_bytes", device=d["id"]) == reserved
        assert get(m, "graphd_build_info", version=st["daemon"]["version"]) == 1
        assert get(m, "graphd_sessions") == int(st["daemon"]["sessions"])
        uid = str(os.getuid())
        mine = [s for s in st["sessions"] if s.get("attached") and str(s.get("uid", 0)) == uid]
        assert get(m, "graphd_uid_sessions", uid=uid) == len(mine) >= 1
        region_bytes = sum(int(s.get("bytes", 0)) for s in mine)
        assert get(m, "graphd_uid_region_bytes", uid=uid) == region_bytes
        for e in st.get("executors", []):
            lab = {"uid": str(e.get("uid", 0)), "device": e["device"]}
            assert get(m, "graphd_executor_starts_total", **lab) == int(e.get("starts", 0))
            assert get(m, "graphd_executor_deaths_total", **lab) == int(e.get("died", 0))
            assert get(m, "graphd_executor_time_kills_total", **lab) == \
                int(e.get("killed_time", 0))
            assert get(m, "graphd_executor_memory_kills_total", **lab) == \
                int(e.get("killed_memory", 0))
        assert st.get("executors"), "the capture started an executor"

        # Captures: the one made, and its duration histogram.
        assert get(m, "graphd_captures_total") == 1
        assert get(m, "graphd_capture_failures_total") == 0
        assert get(m, "graphd_capture_warmups_reused_total") == 0  # the daemon's first capture
        assert check_histogram(m, "graphd_capture_duration_seconds") == 1

        # RPCs: what the work called, by method and code; in all, Status's counters (the
        # Status call before the scrape finished after its own reply was built).
        calls = rpc_calls(m)
        delta = {k: v - before_work.get(k, 0) for k, v in calls.items()}
        assert delta[("CreatePool", "OK")] == 1
        assert delta[("RegisterModule", "OK")] == 1
        assert delta[("Capture", "OK")] == 1
        assert delta[("Replay", "OK")] == 1
        assert delta[("DeletePool", "NOT_FOUND")] == 1
        assert sum(calls.values()) == int(st["daemon"]["calls_total"]) + 1
        assert sum(v for (_, code), v in calls.items() if code != "OK") == \
            int(st["daemon"]["calls_failed"])
        for r in regions:
            r.free()


def test_metrics_other_paths_and_methods(metrics_daemon):
    _, url = metrics_daemon
    assert http_code(url + "/") == 404
    assert http_code(url + "/metrics/x") == 404
    assert http_code(url + "/metrics", "POST") == 405


@pytest.mark.parametrize("listen,says", [
    ("localhost:9464", "'localhost' is not an IP address"),
    ("127.0.0.1", "has no port"),
    ("127.0.0.1:0", "the port must be 1 to 65535"),
    ("127.0.0.1:http", "the port must be 1 to 65535"),
    ("::1:9464", "an IPv6 address goes in brackets"),
    ("[::1]9464", "needs [ADDR]:PORT"),
])
def test_bad_metrics_listen_refuses_to_start(tmp_path, listen, says):
    r = subprocess.run([str(BUILD / "graphd"), "--config", "/dev/null", "--listen",
                        "unix:%s" % (tmp_path / "bad.sock"), "--metrics-listen", listen],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert says in out and "e.g. 127.0.0.1:9464" in out, out
    assert not (tmp_path / "bad.sock").exists()
    r = subprocess.run([str(BUILD / "graphd"), "--check-config", "--config", "/dev/null",
                        "--metrics-listen", listen], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and says in r.stderr, r.stdout + r.stderr


def test_reused_warmups_are_counted(metrics_daemon):
    """Two captures of one module and spec: the second skips its warm-up (reuse_warmup,
    tests/python/test_warmup_reuse.py), and the counter says so."""
    address, url = metrics_daemon
    with graphd.Client(address) as c:
        mid = c.register_module(_archive())
        reused = []
        for _ in range(2):
            (g,) = c.capture([(mid, None, [(graphs._DTYPES[torch.float32], (4, 3), False)])])
            reused.append(g.warmup_reused)
            del g
    m, types = parse(scrape(url + "/metrics"))
    assert reused == [False, True]
    assert types["graphd_capture_warmups_reused_total"] == "counter"
    assert get(m, "graphd_captures_total") == 2
    assert get(m, "graphd_capture_warmups_reused_total") == 1
