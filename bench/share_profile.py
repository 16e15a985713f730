#!/usr/bin/env python3
"""Where benchmark 3's mode (c) spends its time, by daemon setting (issue 18's profile).

For each variant QUEUES:SPIN (executor_cuda_queues, replay_spin_us) a fresh graphd is started
with those settings and `bench/share_gpu.py --address ... --modes c` runs N processes against it
for a timed window; meanwhile this script reads, every --interval seconds, the CPU time of each
thread of the executor serving them (/proc/PID/task/*/stat) and the pool's replay count and
daemon-side latency (Status). Each variant row reports, over the timed window: aggregate steps/s,
step time per process, the executor's busiest thread's CPU seconds per second, replays per
second, the daemon-side replay latency p50 (frame read to launch queued) and replays/s × p50 as
an estimate of the share of a core the replays themselves take (the rest of a polling thread's
time is the poll). Mode (a), in-process make_graphed_callables, runs once per round as the
reference. Variants and (a) alternate their order from round to round.

GPU machine (docs/BENCHMARKS.md, "Issue 18's targets"):

    python3 bench/share_profile.py --graphd build/graphd --json OUT/share_profile.json

Without a GPU, a smoke run of the same plumbing on CPU substitutes (nothing judged):

    python3 bench/share_profile.py --device cpu --procs 2 --seconds 0.5 --variants 32:2000
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def now():
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def thread_ticks(pid):
    """{tid: utime + stime in clock ticks} of process pid's threads ({} once it is gone)."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        out[tid] = int(fields[11]) + int(fields[12])
    return out


class Sampler(threading.Thread):
    """Reads the executor of device (its pid from Status) and pool every interval seconds:
    samples of (time, {tid: ticks}, replays, latency p50 ns)."""

    def __init__(self, address, device, interval):
        super().__init__(daemon=True)
        self.address, self.device, self.interval = address, device, interval
        self.samples = []
        self.halt = threading.Event()
        self.error = None

    def run(self):
        import graphd
        try:
            with graphd.Client(self.address) as c:
                while not self.halt.is_set():
                    st = c.status()
                    pids = [int(e["pid"]) for e in st.get("executors", [])
                            if e["device"] == self.device and int(e.get("pid") or 0) > 0]
                    pools = [p for p in st.get("pools", []) if p["device"] == self.device
                             and p["name"].startswith("share-gpu-")]
                    if pids and pools:
                        self.samples.append((now(), thread_ticks(pids[0]),
                                             int(pools[0]["replays"]),
                                             int(pools[0]["latency"]["p50_ns"])))
                    self.halt.wait(self.interval)
        except Exception as e:  # noqa: BLE001 (reported with the row)
            self.error = repr(e)


def share_gpu(a, tmp, tag, modes, address=None):
    """bench/share_gpu.py's result for one mode."""
    out = Path(tmp) / ("share-%s.json" % tag)
    cmd = [sys.executable, str(HERE / "share_gpu.py"), "--modes", modes, "--procs",
           str(a.procs), "--seconds", str(a.seconds), "--json", str(out)]
    if a.device:
        cmd += ["--device", a.device]
    cmd += ["--address", address] if address else ["--graphd", str(a.graphd)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0 or not out.exists():
        raise RuntimeError("share_gpu.py (%s) exited %d:\n%s" % (tag, r.returncode,
                                                                 (r.stdout + r.stderr)[-3000:]))
    res = json.loads(out.read_text())["results"][0]
    if "error" in res:
        raise RuntimeError("share_gpu.py (%s): %s" % (tag, res["error"]))
    return res


def window_figures(samples, t0, t1):
    """Over the samples inside [t0, t1]: the busiest thread's CPU s/s, replays/s, last p50."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return None
    (ta, ka, ra, _), (tb, kb, rb, p50) = inside[0], inside[-1]
    hz = os.sysconf("SC_CLK_TCK")
    busiest = max((kb[t] - ka.get(t, 0)) / hz / (tb - ta) for t in kb)
    rate = (rb - ra) / (tb - ta)
    return {"span_s": tb - ta, "executor_busiest_cpu_s_per_s": busiest,
            "replays_per_s": rate, "replay_p50_us": p50 / 1e3,
            "replay_share_of_a_core": rate * p50 / 1e9}


def run_variant(a, tmp, tag, queues, spin):
    """Mode (c) against a fresh daemon with these settings, sampled."""
    from gd_daemon import wait_until_answering  # bench/, this script's own folder
    sock = Path(tmp) / ("g-%s.sock" % tag)
    address = "unix:%s" % sock
    log = Path(tmp) / ("graphd-%s.log" % tag)
    with open(log, "w") as err:
        proc = subprocess.Popen([str(a.graphd), "--config", "/dev/null", "--listen", address,
                                 "--log-level", "warn", "--executor-cuda-queues", str(queues),
                                 "--replay-spin-us", str(spin)],
                                stdout=err, stderr=subprocess.STDOUT)
    try:
        why = wait_until_answering(proc, address)
        if why is not None:
            raise RuntimeError("graphd (%s): %s:\n%s" % (tag, why, log.read_text()))
        device = "cpu:0" if a.device == "cpu" else "cuda:0"
        sampler = Sampler(address, device, a.interval)
        sampler.start()
        try:
            res = share_gpu(a, tmp, tag, "c", address)
        finally:
            sampler.halt.set()
            sampler.join(30)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    ws = res["workers"]
    row = {"variant": tag, "queues": queues, "spin_us": spin,
           "steps_per_s": res["steps_per_s"], "step_ms": res["step_ms_mean"]}
    # the window in which every worker was stepping
    fig = window_figures(sampler.samples, max(w["t_start"] for w in ws),
                         min(w["t_end"] for w in ws))
    row.update(fig or {"sampler": sampler.error or "fewer than two samples in the window"})
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphd", type=Path, default=REPO / "build" / "graphd")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed window per row")
    ap.add_argument("--variants", default="32:2000,8:2000,32:0",
                    help="comma-separated QUEUES:SPIN (executor_cuda_queues:replay_spin_us)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    from gd_daemon import client_on_path  # bench/, this script's own folder
    print("share_profile: client package from %s" % client_on_path(), file=sys.stderr)
    os.environ.setdefault("GRAPHD_BUILD", str(a.graphd.parent))
    variants = []
    for v in a.variants.split(","):
        q, s = v.split(":")
        variants.append((int(q), int(s)))
    rows = []
    hdr = "%-18s %10s %10s %12s %11s %9s %11s" % (
        "row", "steps/s", "ms/proc", "exec CPU/s", "replays/s", "p50 us", "replay core")
    print(hdr)
    print("-" * len(hdr), flush=True)
    with tempfile.TemporaryDirectory(prefix="share_profile-") as tmp:
        for r in range(a.rounds):
            order = [("a", None)] + [("c", v) for v in variants]
            if r % 2:
                order.reverse()
            for kind, v in order:
                if kind == "a":
                    res = share_gpu(a, tmp, "a%d" % r, "a")
                    row = {"variant": "a (in-process)", "steps_per_s": res["steps_per_s"],
                           "step_ms": res["step_ms_mean"]}
                else:
                    row = run_variant(a, tmp, "q%d-s%d-r%d" % (v[0], v[1], r), *v)
                    row["variant"] = "c q%d spin%d" % v
                row["round"] = r + 1
                rows.append(row)
                print("%-18s %10.1f %10.3f %12s %11s %9s %11s" % (
                    row["variant"], row["steps_per_s"], row["step_ms"],
                    "%.2f" % row["executor_busiest_cpu_s_per_s"] if "span_s" in row else "-",
                    "%.0f" % row["replays_per_s"] if "span_s" in row else "-",
                    "%.1f" % row["replay_p50_us"] if "span_s" in row else "-",
                    "%.2f" % row["replay_share_of_a_core"] if "span_s" in row else "-"),
                    flush=True)
    refs = {r["round"]: r["steps_per_s"] for r in rows if r["variant"].startswith("a ")}
    for row in rows:
        if not row["variant"].startswith("a "):
            row["over_a"] = row["steps_per_s"] / refs[row["round"]]
    print()
    for row in rows:
        if "over_a" in row:
            print("round %d: %s / a = %.3f" % (row["round"], row["variant"], row["over_a"]))
    if a.json:
        Path(a.json).write_text(json.dumps({"config": vars(a) | {"graphd": str(a.graphd)},
                                            "rows": rows}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
