"""client/python/examples/train_mlp.py (what `make demo` runs) trains through the daemon with a
loss that goes down and ends with `graphctl status`; README.md's training snippet and its
"running the daemon by hand" block run as the README writes them."""
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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


README = REPO / "README.md"
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT|\d\d:\d\d:\d\d\.\d{3} )\S* ?(error|warn|info|debug) ",
                      flags=re.M)


def readme_section(title):
    text = README.read_text()
    assert text.count("\n## %s\n" % title) == 1, "README.md has no single section '## %s'" % title
    return text.split("\n## %s\n" % title, 1)[1].split("\n## ", 1)[0]


def code_blocks(section, lang):
    return re.findall(r"^```%s\n(.*?)^```$" % lang, section, flags=re.M | re.S)


def test_readme_training_example_runs_as_written(daemon, tmp_path):
    """README.md, "Train through graphd": the snippet, run with the environment the README
    gives (its GRAPHD_ADDRESS pointed at the test daemon), from the repository root."""
    section = readme_section("Train through graphd")
    snippet, = code_blocks(section, "python")
    assert "graphd.make_graphed_callables" in snippet
    cmd_line, = [ln for b in code_blocks(section, "sh") for ln in b.splitlines()
                 if ln.endswith(" train.py")]
    words = shlex.split(cmd_line)
    assigns = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
    argv = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
    assert set(assigns) == {"GRAPHD_ADDRESS", "PYTHONPATH"} and argv[-1] == "train.py", cmd_line
    if not os.path.exists(argv[0]):
        pytest.skip("%s (the README's interpreter) is not here" % argv[0])
    (tmp_path / "train.py").write_text(snippet)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRAPHD_ADDRESS")}
    env.update(assigns, GRAPHD_ADDRESS=daemon.address, OMP_NUM_THREADS="1")
    out = subprocess.run(argv[:-1] + [str(tmp_path / "train.py")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"loss \d+\.\d+(e-?\d+)?", last), out.stdout


def test_readme_daemon_by_hand_runs_without_log_lines_in_its_output(tmp_path):
    """README.md, "Running the daemon by hand": the block as a script (its /tmp paths moved to a
    temporary directory, build/ to the build under test) runs, the daemon exits 0 on the
    block's SIGTERM, and none of the daemon's log lines run into graphctl's output."""
    block, = code_blocks(readme_section("Running the daemon by hand"), "sh")
    assert "--log-level" in block
    build = os.environ["GRAPHD_BUILD"]
    script = (block.replace("/tmp/graphd.sock", str(tmp_path / "graphd.sock"))
              .replace("/tmp/graphd.log", str(tmp_path / "graphd.log"))
              .replace("build/", build.rstrip("/") + "/"))
    # The daemon's exit status, after the block's kill: it must drain and exit 0.
    script += "\nwait %1; echo \"graphd exited $?\"\n"
    env = {k: v for k, v in os.environ.items() if k != "GRAPHD_ADDRESS"}
    # A process group of its own, so that a block that hangs leaves no daemon behind.
    proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    both = stdout + stderr
    assert proc.returncode == 0 and "graphd exited 0" in stdout, both
    assert "# Pools" in stdout and "sweep" in stdout, both
    assert not LOG_LINE.search(both), "the daemon's log ran into the output:\n" + both
