"""The plumbing of issue 18's throughput benchmark (bench/share_gpu.py --interleave), run with its
CPU substitutes: every mode's workers are started first, then each round times one window per
mode, the order reversed every other round. The figures themselves are not judged here (the CPU
machine's are noise, and benchmarks are not tests); what is checked is that each round has a
window of each mode, in the order said, with every worker's steps counted."""
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
