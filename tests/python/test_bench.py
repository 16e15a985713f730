"""The plumbing of issue 18's throughput benchmark (bench/share_gpu.py --interleave), run with its
CPU substitutes: every mode's workers are started first, then each round times one window per
mode, the order reversed every other round. The figures themselves are not judged here (the CPU
machine's are noise, and benchmarks are not tests); what is checked is that each round has a
window of each mode, in the order said, with every worker's steps counted. The step profile's
host phases (bench/step_profile.py) are checked the same way, with a fake clock."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
