"""Several devices at once, on the test daemon's CPU split into cpu:0 and cpu:1 (conftest.py):
make_graphed_callables(..., device="cpu:1") trains exactly as eager PyTorch in a pool on cpu:1,
status shows its pool and graphs there, and two training processes, one per device, train at the
same time and both match their eager twins."""
import pytest
import torch

import graphd
import gd_models
from conftest import wait_for
from test_multiprocess import Trainer, captured


def test_the_daemon_serves_two_cpu_devices(client):
    devs = {d["id"]: d for d in client.devices()}
    assert {"cpu:0", "cpu:1"} <= set(devs) and "cpu:2" not in devs
    assert devs["cpu:1"]["kind"] == "cpu" and devs["cpu:1"]["ordinal"] == 1
    assert devs["cpu:1"]["name"] == devs["cpu:0"]["name"]  # one host, two queues
    assert devs["cpu:0"]["mps"] is False and devs["cpu:1"]["mps"] is False
    assert client.check_device("cpu:1") == "cpu:1"
    with pytest.raises(graphd.NotFound) as e:
        client.check_device("cpu:2")
    assert "cpu:1" in str(e.value)  # the message lists what the daemon serves
    with pytest.raises(graphd.NotFound):
        client.create_pool("pytest-cpu2", device="cpu:2")


def test_check_device_lists_the_devices_once_per_session(client, monkeypatch):
    """make_graphed_callables checks its device before each capture: the devices a session's
    daemon serves are listed once (a devices() RPC reads every device's memory), a device it
    does not serve is still refused, and a new session (a daemon restart) lists them again."""
    client.pools()  # a session is open
    calls = []
    real = graphd.Client.devices

    def counted(self):
        calls.append(1)
        return real(self)
    monkeypatch.setattr(graphd.Client, "devices", counted)
    for _ in range(3):
        assert client.check_device("cpu:1") == "cpu:1"
    assert len(calls) <= 1
    with pytest.raises(graphd.NotFound):
        client.check_device("cpu:2")
    n = len(calls)
    client._served = (client.session_id + 1, client._served[1])  # as after a new session
    assert client.check_device("cpu:1") == "cpu:1"
    assert len(calls) == n + 1


@pytest.mark.parametrize("case", ["mlp", "two", "function"])
def test_training_on_cpu1_matches_eager(case):
    graphs = []

    def ready(g):
        callables = g if isinstance(g, tuple) else (g,)
        graphs.extend((c._graphd_runner if isinstance(c, torch.nn.Module) else c).graph
                      for c in callables)

    result = gd_models.train_side_by_side(gd_models.CASES[case], "sgd", steps=50,
                                          device="cpu:1", on_ready=ready)
    gd_models.assert_parity(result)
    assert result[1][-1] < result[1][0]  # it did train

    st = graphd.default_client().status()
    pools = {p["name"]: p for p in st["pools"]}
    by_id = {int(g["id"]): g for g in st["graphs"]}
    assert graphs
    for graph in graphs:
        # device="cpu:1" without a pool: a pool of this process's own on cpu:1.
        assert isinstance(graph.pool, graphd.PoolHandle) and graph.pool.device == "cpu:1"
        pool = pools[graph.pool.name]
        assert pool["device"] == "cpu:1"
        assert int(pool["graphs"]) == len(graphs) and int(pool["replays"]) >= 2 * 50
        assert by_id[graph.id]["device"] == "cpu:1"
        assert by_id[graph.id]["pool"] == graph.pool.name


def test_two_processes_train_at_once_one_per_device(tmp_path):
    stop = tmp_path / "stop"
    trainers = [Trainer("--pool", "pytest-dev%d" % k, "--device", "cpu:%d" % k, "--seed", str(k),
                        "--steps", "100000", "--every", "1", "--stop-file", str(stop))
                for k in (0, 1)]
    try:
        caps = [captured(t) for t in trainers]
        st = graphd.default_client().status()
        pools = {p["name"]: p for p in st["pools"]}
        by_id = {int(g["id"]): g for g in st["graphs"]}
        for k, (sid, pid, gids) in enumerate(caps):
            assert pools["pytest-dev%d" % k]["device"] == "cpu:%d" % k
            for gid in gids:
                assert by_id[gid]["device"] == "cpu:%d" % k and int(by_id[gid]["session"]) == sid

        # At once: both keep stepping over the same stretch of time, neither waiting for the
        # other to finish.
        for t in trainers:
            t.expect("step")
        start = []
        for t in trainers:
            t.pump()
            start.append(t.steps)

        def both_advanced():
            for t in trainers:
                t.pump()
            return all(t.steps >= s + 30 for t, s in zip(trainers, start))

        assert wait_for(both_advanced, 60), "steps: %s from %s" % (
            [t.steps for t in trainers], start)
        assert all(t.proc.poll() is None for t in trainers)
        stop.write_text("")
        for t in trainers:
            done = t.expect("done")
            assert done[2] == "ok", " ".join(done)
            assert t.finish() == 0, t.stderr()
    finally:
        for t in trainers:
            t.kill()
