"""client/python/examples/train_mlp.py (what `make demo` runs) trains through the daemon with a
loss that goes down and ends with `graphctl status`."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_train_mlp_example(daemon):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(REPO / "client/python/examples/train_mlp.py"),
                          "--steps", "60", "--every", "20"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(down)" in out.stdout, out.stdout
    assert "step    0" in out.stdout and "step   59" in out.stdout
    # graphctl status ran while the example's session was alive: it shows its graph.
    assert "# Pools" in out.stdout and "# Sessions" in out.stdout, out.stdout
    assert "train_mlp.py" in out.stdout, out.stdout
