"""The plumbing of issue 18's throughput benchmark (bench/share_gpu.py --interleave), run with its
CPU substitutes: every mode's workers are started first, then each round times one window per
mode, the order reversed every other round. The figures themselves are not judged here (the CPU
machine's are noise, and benchmarks are not tests); what is checked is that each round has a
window of each mode, in the order said, with every worker's steps counted. The step profile's
host phases (bench/step_profile.py) are checked the same way, with a fake clock; targets18's
target 2, bench/step_spread.py (CUDA stood in) and bench/forward_ablation.py (on the CPU) are
run end to end, so that a mistake in them shows here rather than in scarce GPU time."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_targets18(*args, env=None):
    """bench/targets18.py's CPU smoke run with args. It keeps its own temporary folder, with the
    daemons' sockets in it: a short TMPDIR of this call's (pytest's tmp_path is too long for a
    socket's path), removed after."""
    short = tempfile.mkdtemp(prefix="t18-", dir="/tmp")
    try:
        return subprocess.run(
            [sys.executable, str(REPO / "bench" / "targets18.py"), "--device", "cpu", "--window",
             "0.2", "--graphd", os.path.join(os.environ["GRAPHD_BUILD"], "graphd")] + list(args),
            capture_output=True, text=True, timeout=300, env=dict(env or os.environ, TMPDIR=short))
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_share_gpu_interleaves_the_modes_windows_in_one_set_of_processes(tmp_path):
    out = tmp_path / "share.json"
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "share_gpu.py"), "--device", "cpu", "--procs", "2",
         "--batch", "8", "--width", "16", "--depth", "2", "--steps", "3", "--warmup", "1",
         "--modes", "c,a", "--interleave", "3",
         "--graphd", os.path.join(os.environ["GRAPHD_BUILD"], "graphd"), "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    rounds = doc["rounds"]
    assert [r["order"] for r in rounds] == [["c", "a"], ["a", "c"], ["c", "a"]]
    for r in rounds:
        for mode in "ac":
            # --steps 3 in each of the 2 workers, every window
            assert r[mode]["steps"] == 6, r
            assert r[mode]["steps_per_s"] > 0
    assert not any("warning" in res for res in doc["results"]), doc["results"]
    assert "round 3 (c,a)" in p.stdout and "(c)/(a)" in p.stdout, p.stdout


def test_an_interleaved_run_that_fails_says_why_and_exits_1(tmp_path):
    out = tmp_path / "share.json"
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "share_gpu.py"), "--device", "cpu", "--procs", "1",
         "--steps", "1", "--modes", "c,a", "--interleave", "1",
         "--address", "unix:%s" % (tmp_path / "no-daemon.sock"), "--json", str(out)],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TMPDIR=str(tmp_path)))  # where it keeps a failed run's logs
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAILED" in p.stdout and "no-daemon.sock" in p.stdout, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    doc = json.loads(out.read_text())
    assert doc["rounds"] == [] and "error" in doc["results"][0]


def _step_profile():
    """bench/step_profile.py as a module (its folder on sys.path, as when it runs)."""
    bench = str(REPO / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import step_profile
    return step_profile


def test_step_profile_alternates_its_modes_so_a_drifting_host_moves_both_alike(monkeypatch):
    """The step profile's host phases are measured in alternated chunks. A host that slows down
    steadily during the run (here a fake clock: each forward costs more than the one before)
    must come out as the same step time for two identical modes; measured one mode after the
    other, as before, the second mode came out slower than the first by the drift."""
    import time

    import torch
    import torch.nn as nn

    step_profile = _step_profile()
    now = [0]
    calls = []

    class Drifting(nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            calls.append(self.name)
            now[0] += 1000 + 10 * len(calls)  # ns: every call 1 % of the first one slower
            return x * self.w

    monkeypatch.setattr(time, "perf_counter_ns", lambda: now[0])
    a, b = Drifting("a"), Drifting("b")
    modes = [("a", a, torch.optim.SGD(a.parameters(), lr=0.1)),
             ("b", b, torch.optim.SGD(b.parameters(), lr=0.1))]
    x, y = torch.ones(2, 4), torch.zeros(2, 4)
    got = step_profile.phases(modes, x, y, steps=12, chunks=4, sync=lambda: None)

    # 20 warm-up steps each, then per chunk 3 unsynchronised steps and 1 synchronised step of
    # each mode, the order reversed every other chunk
    timed = calls[40:]
    assert timed == list("aaaabbbb" "bbbbaaaa" "aaaabbbb" "bbbbaaaa"), timed
    wall_a, wall_b = got["a"][1], got["b"][1]
    assert abs(wall_a / wall_b - 1) < 0.01, (wall_a, wall_b)
    assert abs(got["a"][3]["forward"] / got["b"][3]["forward"] - 1) < 0.01, got
    assert set(got["a"][0]) == set(step_profile.PHASES)


def test_targets18_target2_rounds_carry_each_modes_step_and_host_work(tmp_path):
    """Target 2's smoke run on the CPU: every round reports the step time of both modes and of
    the control (a second in-process copy), the slices' ratios and the host's own work a step of
    each (what places a miss on the host or the device), in its line and in the JSON; the
    control's row is printed unjudged. --daemon-arg reaches the daemon (a setting it refuses
    would fail the run)."""
    out = tmp_path / "t2.json"
    p = run_targets18("--targets", "2", "--json", str(out),
                      "--daemon-arg=--replay-spin-slice-us=0")
    assert p.returncode == 0, p.stdout + p.stderr
    rounds = json.loads(out.read_text())["rounds"]["2"]
    assert len(rounds) == 3, rounds
    for r in rounds:
        assert r["graphd"] > 0 and r["inproc"] > 0 and r["control"] > 0, r
        assert len(r["slice_ratios"]) == len(r["control_slice_ratios"]) > 0, r
        assert set(r["host_own_ms"]) == {"graphd", "inproc", "control"}, r
        assert all(v > 0 for v in r["host_own_ms"].values()), r
    lines = [ln for ln in p.stderr.splitlines() if "target 2 (" in ln and "round" in ln]
    assert len(lines) == 3 and all("the host's own work a step graphd" in ln and "control" in ln
                                   for ln in lines), p.stderr
    control = [ln for ln in p.stdout.splitlines() if "control: in-process copy 2/copy 1" in ln]
    assert len(control) == 1 and control[0].rstrip().endswith("-"), p.stdout


# bench/step_spread.py needs CUDA; this runs its logic on the CPU with the CUDA calls it makes
# replaced by stand-ins (both graphing calls return the eager model), so that a mistake in it
# shows here and not on the GPU machine, whose time is scarce. Its figures mean nothing here.
FAKE_CUDA = r'''
import sys, time
sys.path.insert(0, %(bench)r)
import torch, torch.nn as nn
import graphd
torch.cuda.is_available = lambda: True
torch.cuda.make_graphed_callables = lambda m, a: m
graphd.make_graphed_callables = lambda m, a: m
torch.cuda.synchronize = lambda *a: None
torch.cuda.get_device_name = lambda *a: "stand-in"
nn.Module.cuda = lambda self, *a: self
_randn = torch.randn
torch.randn = lambda *a, device=None, **k: _randn(*a, **k)


class Event:
    def __init__(self, **k):
        self.t = 0.0

    def record(self, *a):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


torch.cuda.Event = Event
import step_spread
sys.argv = ["step_spread", "--shape", "8,16,2", "--copies", "2", "--slices", "2",
            "--slice-s", "0.05", "--steps", "10", "--synced-steps", "5"]
sys.exit(step_spread.main())
'''


def test_step_spread_runs_end_to_end_with_cuda_stood_in(tmp_path):
    script = tmp_path / "spread.py"
    script.write_text(FAKE_CUDA % {"bench": str(REPO / "bench")})
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    names = ("in-process 0", "in-process 1", "graphd 0", "graphd 1")
    # three tables (step times, host work by phase, device phases), one row per copy in each
    for name in names:
        rows = [ln for ln in p.stdout.splitlines() if ln.strip().startswith(name)]
        assert len(rows) == 3, p.stdout
    assert "host own" in p.stdout and "sum" in p.stdout, p.stdout


def test_forward_ablation_runs_its_modes_on_the_cpu_and_checks_its_lean_functions(tmp_path):
    """bench/forward_ablation.py on graphd's CPU graphs (the session's daemon): a row per mode in
    its three tables; its lean Functions first pass its own bit-for-bit check against the
    client, and --opcodes counts fewer opcodes for the lean Function than for the client."""
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "forward_ablation.py"), "--device", "cpu",
         "--shape", "8,16,2", "--rounds", "2", "--slices", "2", "--slice-s", "0.02",
         "--synced-steps", "3", "--guards-apart", "--opcodes"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    counts = {}
    for name in ("in-process", "in-process copy", "graphd", "graphd lean", "graphd lean, C apply",
                 "graphd lean + protect", "graphd lean + module check",
                 "graphd lean + input checks", "graphd lean + param ptrs", "graphd lean + guards"):
        rows = [ln for ln in p.stdout.splitlines() if ln.strip().startswith(name + "  ")]
        assert len(rows) == 3, (name, p.stdout)
        assert "ratios" in rows[0] and "zero_grad" in rows[1], p.stdout
        assert int(rows[2].split("calls")[1].split()[0]) >= 1, p.stdout
        counts[name] = int(rows[2].split("opcodes")[1])
    # The lean Function runs fewer opcodes than the client it strips down, and the guards add
    # some; on the CPU the in-process model is the eager one, not counted against either.
    assert counts["graphd lean"] < counts["graphd lean + guards"] < counts["graphd"], p.stdout


def test_targets18_measures_the_client_pythonpath_names_in_every_process(tmp_path):
    """An A/B of two clients puts the other client first on PYTHONPATH: targets18 (target 3,
    the quickest) must measure that one, in its own process and in each part's, and say so in
    its output and JSON; before, it put this tree's client ahead of PYTHONPATH, so both sides of
    such an A/B ran the tree's client."""
    alt = tmp_path / "alt"
    shutil.copytree(REPO / "client" / "python" / "graphd", alt / "graphd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    marks = tmp_path / "marks"
    with open(alt / "graphd" / "__init__.py", "a") as f:  # each importing process says so
        f.write("\nwith open(%r, 'a') as _f:\n    _f.write('%%d\\n' %% __import__('os').getpid())\n"
                % str(marks))
    out = tmp_path / "t3.json"
    p = run_targets18("--targets", "3", "--t3-idle", "0.05", "--json", str(out),
                      env=dict(os.environ, PYTHONPATH=str(alt)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(out.read_text())["client"] == str(alt)
    # --t3-idle reaches each round's process (the daemon idle before graphd's warm-up)
    assert [m["idle_before_graphd_s"] for m in json.loads(out.read_text())["rounds"]["3"]] \
        == [0.05] * 3
    assert "client package from %s" % alt in p.stderr, p.stderr
    pids = set(marks.read_text().split()) if marks.exists() else set()
    assert len(pids) >= 2, pids  # the parent and at least one part's process


def test_targets18_target4_compares_the_medians_of_later_captures(tmp_path):
    """Target 4's smoke run on the CPU: each round's capture parts time captures 2 to
    --captures of each mode (one ~10 ms capture a mode decided a round before), and the medians'
    ratio is a row of its own next to the second capture's."""
    out = tmp_path / "t4.json"
    p = run_targets18("--targets", "4", "--captures", "4", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(out.read_text())
    rounds = got["rounds"]["4"]
    assert len(rounds) == 3, rounds
    for r in rounds:
        for mode in ("graphd", "inproc"):
            later = r[mode]["later_ms"]
            assert len(later) == 3 and later[0] == r[mode]["second_ms"], r
            assert all(t > 0 for t in later), r
            # each capture's Python gc pauses, the first capture's included
            assert len(r[mode]["gc_ms"]) == 4 and min(r[mode]["gc_ms"]) >= 0, r
    rows = {t["name"]: t for t in got["targets"]}
    assert len(rows["captures 2-4, median graphd/in-process"]["values"]) == 3, rows
    assert "captures 2-4, median graphd/in-process" in p.stdout, p.stdout
    assert p.stderr.count("ms a capture (gc ms inside): ") == 3, p.stderr


def test_gc_pauses_times_the_collections_inside_a_span():
    """bench/gc_pauses.py, which the capture benchmarks print beside each capture: a forced full
    collection over many cycles is counted as one of generation 2 and its pause is timed; take()
    starts anew, and a span with no collection reads zero."""
    import gc
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from gc_pauses import GcPauses
    finally:
        sys.path.remove(str(REPO / "bench"))
    pauses = GcPauses()
    try:
        pauses.take()
        for _ in range(20000):  # cycles only the collector frees
            a, b = [], []
            a.append(b)
            b.append(a)
        del a, b
        gc.collect()
        ms, gens = pauses.take()
        assert gens[2] >= 1 and ms > 0, (ms, gens)
        was = gc.isenabled()
        gc.disable()
        try:
            assert pauses.take() == (0.0, (0, 0, 0))
        finally:
            if was:
                gc.enable()
    finally:
        pauses.close()
    assert pauses._callback not in gc.callbacks
