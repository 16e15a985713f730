"""DistributedDataParallel over graphd-graphed modules (issue 17), on the CPU with gloo.

Each rank is a tests/python/ddp_worker.py subprocess with the environment torchrun sets (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free port). Every scenario trains the same MLP for 30
steps under DDP with different data on each rank, eagerly and graphed (graph first, then wrap);
the losses and final parameters must equal the eager DDP run's to 1e-5 relative and be identical
across ranks. Layouts: both ranks on the test daemon sharing one pool, and each rank on a daemon
of its own (two sockets, standing in for two nodes).
"""
import os
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import graphd
from conftest import BUILD, REPO, wait_answering, wait_for

HERE = Path(__file__).resolve().parent
WORKER = HERE / "ddp_worker.py"
ALL = ("plain,no_sync,find_unused,find_unused_all_used,static_graph,no_sync_find_unused,"
       "bucket_view,graph_the_wrapper,unused_no_find,buffers")
RTOL = 1e-5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(rank, world, port, address):
    env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
               WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               GRAPHD_ADDRESS=address)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def start_ranks(addresses, *args):
    port = free_port()
    return [subprocess.Popen([sys.executable, str(WORKER)] + [str(a) for a in args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env_for(r, len(addresses), port, addr))
            for r, addr in enumerate(addresses)]


def finish(procs, timeout=300):
    """(returncode, stdout, stderr) of each rank; a rank that outlives timeout is killed (a hang
    is a failure, not a wait)."""
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, e = p.communicate()
            raise AssertionError("a rank did not finish within %d s:\n%s\n%s" % (timeout, o, e))
        out.append((p.returncode, o, e))
    return out


def port_taken(outs):
    """The free port was taken by someone else before rank 0's store bound it (the machine is
    shared): run again on another."""
    return any("address already in use" in e.lower() for rc, o, e in outs)


def launch(addresses, *args, timeout=300):
    for _ in range(3):
        outs = finish(start_ranks(addresses, *args), timeout)
        if not port_taken(outs):
            break
    return outs


def run_ranks(tmp_path, addresses, scenarios, *extra):
    outs = launch(addresses, "--scenarios", scenarios, "--out", tmp_path / "rank{rank}.pt",
                  *extra)
    for rank, (rc, o, e) in enumerate(outs):
        assert rc == 0, "rank %d exited with %s:\n%s\n%s" % (rank, rc, o, e)
    return [torch.load(tmp_path / ("rank%d.pt" % r)) for r in range(len(addresses))], outs


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def check_parity(results, scenarios):
    for sc in scenarios.split(","):
        if sc == "unused_no_find":
            check_unused_no_find(results)
            continue
        for rank, res in enumerate(results):
            eager, gd = res[sc]["eager"], res[sc]["graphd"]
            assert len(gd["losses"]) == len(eager["losses"]) == 30
            le, lg = torch.tensor(eager["losses"]), torch.tensor(gd["losses"])
            assert rel(lg, le) <= RTOL, "%s rank %d: losses %s, eager %s" % (
                sc, rank, gd["losses"], eager["losses"])
            assert sorted(gd["params"]) == sorted(eager["params"])
            for name, pe in eager["params"].items():
                assert rel(gd["params"][name], pe) <= RTOL, "%s rank %d: parameter %s" % (
                    sc, rank, name)
            assert sorted(gd["buffers"]) == sorted(eager["buffers"])
            for name, be in eager["buffers"].items():  # BatchNorm's, broadcast by DDP
                assert rel(gd["buffers"][name].double(), be.double()) <= RTOL, (
                    "%s rank %d: buffer %s" % (sc, rank, name))
            # an unused parameter's .grad stays None under find_unused/static_graph, as eager
            assert gd["grad_none"] == eager["grad_none"], sc
        # DDP keeps the replicas identical: the same all-reduced gradients, the same steps
        p0, p1 = results[0][sc]["graphd"]["params"], results[1][sc]["graphd"]["params"]
        for name in p0:
            assert torch.equal(p0[name], p1[name]), "%s: %s differs across ranks" % (sc, name)
        # different data per rank: the ranks' losses differ
        assert results[0][sc]["graphd"]["losses"] != results[1][sc]["graphd"]["losses"]
    # the scenarios with a never-called parameter did see it unused
    if "buffers" in scenarios.split(","):  # the BatchNorm scenario did have buffers
        assert "bn.running_mean" in results[0]["buffers"]["graphd"]["buffers"]
    if "find_unused" in scenarios.split(","):
        assert results[0]["find_unused"]["graphd"]["grad_none"] == ["spare.bias",
                                                                   "spare.weight"]


def check_unused_no_find(results):
    """A parameter the graph never uses, under find_unused_parameters=False: over the eager module
    DDP raises at the second step (the parameter's reduction never came); over the graphed one
    it must too, not all-reduce a zero gradient for it as it would if the parameter were an input
    of the graphed autograd Function (upstream's make_graphed_callables does that)."""
    for rank, res in enumerate(results):
        eager, gd = res["unused_no_find"]["eager"], res["unused_no_find"]["graphd"]
        assert eager["error"] and "finished reduction" in eager["error"], eager
        assert gd["error"] is not None, (
            "rank %d: graphd trained %d steps where eager DDP raised: %s" % (
                rank, gd["step"], eager["error"]))
        assert gd["step"] == eager["step"] == 1, (gd, eager)
        assert "finished reduction" in gd["error"], gd


def pool_empty(address, name):
    with graphd.Client(address) as c:
        st = c.status()
    pool = next((p for p in st["pools"] if p["name"] == name), None)
    return pool is None or (int(pool["sessions"]) == 0 and int(pool["graphs"]) == 0
                            and int(pool["regions"]) == 0)


class SecondDaemon:
    """Another graphd on a socket of its own, as a second node's daemon would be."""

    def __init__(self, tmp):
        self.address = "unix:%s" % (tmp / "graphd2.sock")
        self.log = tmp / "graphd2.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([str(BUILD / "graphd"), "--config", "/dev/null",
                                          "--listen", self.address], stdout=out,
                                         stderr=subprocess.STDOUT)
        wait_answering(self.proc, self.address, 20)
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the second graphd did not exit on SIGTERM:\n" +
                                 self.log.read_text())
        assert rc == 0, self.log.read_text()


@pytest.fixture(scope="module")
def second_daemon(tmp_path_factory):
    d = SecondDaemon(tmp_path_factory.mktemp("graphd2"))
    yield d
    d.stop()


def test_ddp_two_ranks_one_daemon_shared_pool(daemon, tmp_path):
    results, outs = run_ranks(tmp_path, [daemon.address] * 2, ALL, "--pool", "ddp-shared")
    check_parity(results, ALL)
    for rc, o, e in outs:  # graphing the wrapper itself warned, and said what to write
        assert "got a DistributedDataParallel wrapper" in e, e
        assert "graphd.make_graphed_callables(model, sample_args)" in e, e
    # each rank had its own session on the one daemon
    sessions = {o.split("session ")[1].split()[0] for rc, o, e in outs}
    assert len(sessions) == 2, [o for rc, o, e in outs]
    assert wait_for(lambda: pool_empty(daemon.address, "ddp-shared"), 10), \
        graphd.default_client().status()


def test_ddp_two_ranks_two_daemons(daemon, second_daemon, tmp_path):
    scenarios = "plain,no_sync,find_unused,static_graph,unused_no_find,buffers"
    results, _ = run_ranks(tmp_path, [daemon.address, second_daemon.address], scenarios)
    check_parity(results, scenarios)
    with graphd.Client(second_daemon.address) as c:  # rank 1 did replay there
        pools = c.status()["pools"]
    assert sum(int(p.get("replays", 0)) for p in pools) >= 2 * 30 * 4, pools


def test_ddp_rank_killed_midrun(daemon, tmp_path):
    """Rank 1 SIGKILLs itself after a forward (its session holding graphs and regions): rank 0
    gets torch.distributed's own error from gloo (raised, within the gloo timeout, not a hang),
    and the daemon keeps nothing of either rank."""
    (rc0, o0, e0), (rc1, o1, e1) = launch(
        [daemon.address] * 2, "--scenarios", "plain", "--modes", "graphd", "--out",
        tmp_path / "rank{rank}.pt", "--pool", "ddp-kill", "--die-at", "5", "--die-rank", "1",
        "--timeout", "10", timeout=120)
    assert rc1 == -signal.SIGKILL, (rc1, o1, e1)
    assert rc0 == 3, "rank 0 should have raised torch.distributed's error:\n%s\n%s" % (o0, e0)
    err = next(line for line in o0.splitlines() if line.startswith("dist-error"))
    assert err.startswith("dist-error RuntimeError"), err
    assert any(w in err.lower() for w in ("connection", "timed out", "timeout", "closed",
                                          "peer")), err
    assert "step plain graphd 4" in o1 and "step plain graphd 5" not in o1, o1
    sessions = [int(line.split()[1]) for o in (o0, o1) for line in o.splitlines()
                if line.startswith("session ")]
    assert len(sessions) == 2, (o0, o1)

    def nothing_left():
        st = graphd.default_client().status()
        if any(int(s["id"]) in sessions for s in st["sessions"]):
            return False
        if any(int(g["session"]) in sessions for g in st.get("graphs", [])):
            return False
        return pool_empty(daemon.address, "ddp-kill")

    assert wait_for(nothing_left, 10), graphd.default_client().status()


def test_ddp_cuda_device_resident(daemon, tmp_path):
    """The same on cuda:0 (GPU machine only): 2 ranks, gloo over CUDA tensors, each rank a
    device-resident session on the test daemon's cuda:0. bench/ddp_gpu.py prints the numbers."""
    if not torch.cuda.is_available() or not any(
            d["id"] == "cuda:0" for d in graphd.default_client().devices()):
        pytest.skip("no CUDA here, or the daemon has no cuda:0 device")
    scenarios = "plain,no_sync,find_unused,static_graph,unused_no_find"
    results, _ = run_ranks(tmp_path, [daemon.address] * 2, scenarios, "--device", "cuda:0")
    check_parity(results, scenarios)


def _fake_ddp(module):
    """A DistributedDataParallel object without a process group (none in this process): enough
    for make_graphed_callables' isinstance check."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    d = DDP.__new__(DDP)
    torch.nn.Module.__init__(d)
    d.module = module
    return d


def test_nested_ddp_is_an_error(daemon):
    inner = torch.nn.Linear(4, 2)
    outer = torch.nn.Sequential(_fake_ddp(inner))
    with pytest.raises(ValueError, match=r"contains a DistributedDataParallel wrapper \('0'\)"):
        graphd.make_graphed_callables(outer, (torch.randn(3, 4),))


def test_ddp_wrapper_warns_and_graphs_its_module(daemon):
    inner = torch.nn.Linear(4, 2)
    wrapper = _fake_ddp(inner)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = graphd.make_graphed_callables(wrapper, (torch.randn(3, 4),))
    assert got is wrapper and got.module is inner
    assert hasattr(inner, "_graphd_runner")
    mine = [x for x in w if "DistributedDataParallel" in str(x.message)]
    assert len(mine) == 1 and "ddp.module" in str(mine[0].message), [str(x.message) for x in w]
    assert mine[0].filename == __file__  # it points at the caller's line
    x = torch.randn(3, 4)
    assert torch.allclose(inner(x), x @ inner.weight.t() + inner.bias)


def _torchrun_workaround():
    """Debian's torch 1.13 torchrun under Python 3.11: its default --redirects/--tee "0" parse to
    None (an IntFlag's 0 is no longer iterated) and the launcher fails with an AttributeError;
    "1" parses. Returns the flags that avoid it there, none elsewhere."""
    try:
        from torch.distributed.elastic.multiprocessing.api import Std
    except ImportError:
        return []
    return [] if Std.from_str("0") is not None else ["--redirects", "1", "--tee", "1"]


def run_launcher(cmd, env, timeout):
    """subprocess.run for torchrun, in a process group of its own: a launcher that outlives
    timeout is killed with its ranks (subprocess.run's timeout kills only the launcher, leaving
    its ranks running)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        o, e = p.communicate()
        raise AssertionError("torchrun did not finish within %d s:\n%s\n%s" % (timeout, o, e))
    return subprocess.CompletedProcess(cmd, p.returncode, o, e)


def test_torchrun_runs_the_example(daemon, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", GRAPHD_ADDRESS=daemon.address)
    for attempt in range(3):
        # (--nproc_per_node: torch 1.13 knows no --nproc-per-node; 2.x takes both)
        cmd = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port()), "--log_dir",
                str(tmp_path / ("logs%d" % attempt))] + _torchrun_workaround()
               + [str(REPO / "client/python/examples/train_mlp.py"), "--steps", "30",
                  "--every", "10"])
        out = run_launcher(cmd, env, 240)
        text = out.stdout + out.stderr
        if "address already in use" not in text.lower():
            break
    assert out.returncode == 0, text
    ranks = [line for line in text.splitlines() if "graphd session" in line]
    assert len(ranks) == 2 and all("(down)" in line for line in ranks), text
    assert "rank 0/2" in text and "rank 1/2" in text, text
    # rank 0's graphctl status ran while both ranks' sessions were alive: two sessions of the
    # example, each with its graph
    lines = [line for line in text.splitlines() if "python:train_mlp.py" in line]
    assert len(lines) == 2, text
