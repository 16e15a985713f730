"""make_graphed_callables semantics beyond plain training: eval-mode fallback, unused inputs,
outputs without grad, inputs without grad, the static input passed back, gradient accumulation,
pytree args and outputs, both replay paths."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graphd
import gd_models

RT = dict(rtol=gd_models.RTOL, atol=gd_models.ATOL)


def graph_status(graph_id):
    st = graphd.default_client().status()
    return next(g for g in st.get("graphs", []) if int(g["id"]) == graph_id)


def replays(graph_id):
    g = graph_status(graph_id)
    return int(g.get("replays_forward", 0)), int(g.get("replays_backward", 0))


class DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(6, 16)
        self.drop = nn.Dropout(0.5)
        self.lin2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.lin2(self.drop(F.relu(self.lin1(x))))


def test_eval_mode_falls_back_to_local_forward():
    torch.manual_seed(0)
    m = DropNet()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(5, 6),))
    gid = g._graphd_runner.graph.id
    assert g._graphd_runner.graph.training

    # Training mode: the graph runs (replays counted by the daemon).
    before = replays(gid)
    g(torch.randn(5, 6)).sum().backward()
    assert replays(gid) == (before[0] + 1, before[1] + 1)

    # Eval mode: the original forward runs here; the daemon sees nothing.
    g.eval()
    twin.eval()
    x = torch.randn(5, 6)
    before = replays(gid)
    out = g(x)
    torch.testing.assert_close(out, twin(x), **RT)
    out.sum().backward()  # local autograd, into the same (shared) parameters
    assert replays(gid) == before
    g.train()
    g(x)
    assert replays(gid)[0] == before[0] + 1


def test_graph_captured_in_eval_mode():
    torch.manual_seed(0)
    m = DropNet().eval()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(5, 6),))
    assert not g._graphd_runner.graph.training
    x = torch.randn(5, 6)
    torch.testing.assert_close(g(x), twin(x), **RT)  # dropout off in the daemon too


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, y):
        return self.lin(x)


def test_allow_unused_input():
    torch.manual_seed(0)
    sample = (torch.randn(2, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True))
    with pytest.raises(RuntimeError) as e:  # upstream: autograd.grad's RuntimeError
        graphd.make_graphed_callables(Unused(), sample)
    assert isinstance(e.value, graphd.GraphdError) and e.value.code == "INVALID_ARGUMENT"
    assert "allow_unused" in str(e.value) or "not have been used" in str(e.value)

    m = Unused()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, sample, allow_unused_input=True)
    x = torch.randn(2, 4, requires_grad=True)
    y = torch.randn(2, 4, requires_grad=True)
    xe, ye = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    g(x, y).pow(2).sum().backward()
    twin(xe, ye).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, **RT)
    torch.testing.assert_close(m.lin.weight.grad, twin.lin.weight.grad, **RT)
    # As upstream (and eager), the unused input gets no gradient at all.
    assert ye.grad is None
    assert y.grad is None


class MultiOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        h = self.lin(x)
        return {"y": h, "label": h.argmax(-1), "aux": (h.detach() * 2, torch.tanh(h))}


def test_outputs_some_without_grad_and_structure():
    torch.manual_seed(0)
    m = MultiOut()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(6, 4),))
    x = torch.randn(6, 4)
    out, ref = g(x), twin(x)
    assert isinstance(out, dict) and list(out) == ["y", "label", "aux"]
    assert isinstance(out["aux"], tuple) and len(out["aux"]) == 2
    flat_out = [out["y"], out["label"], out["aux"][0], out["aux"][1]]
    flat_ref = [ref["y"], ref["label"], ref["aux"][0], ref["aux"][1]]
    for o, r in zip(flat_out, flat_ref):
        assert o.dtype == r.dtype and o.shape == r.shape
        assert o.requires_grad == r.requires_grad
        torch.testing.assert_close(o, r, **RT)
    # Only some outputs take part in the loss; the others' grads are None or zeros.
    (out["y"].sum() + out["aux"][1].pow(2).sum()).backward()
    (ref["y"].sum() + ref["aux"][1].pow(2).sum()).backward()
    for p, q in zip(m.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **RT)


def test_inputs_without_grad():
    def f(x, w, scale):
        return (x @ w) * scale

    torch.manual_seed(0)
    sample = (torch.randn(3, 4), torch.randn(4, 2, requires_grad=True), torch.randn(3, 2))
    g = graphd.make_graphed_callables(f, sample)
    x, scale = torch.randn(3, 4), torch.randn(3, 2)
    w = torch.randn(4, 2, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    out = g(x, w, scale)
    ref = f(x, we, scale)
    torch.testing.assert_close(out, ref, **RT)
    assert out.requires_grad
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(w.grad, we.grad, **RT)
    assert x.grad is None and scale.grad is None

    # Nothing requires grad: an output without grad, no backward node.
    with torch.no_grad():
        torch.testing.assert_close(g(x, we, scale), f(x, we, scale), **RT)
    out = g(x, we.detach(), scale)
    assert not out.requires_grad


def test_backward_with_create_graph_gives_grads_that_refuse_a_second_differentiation():
    """As upstream's Graphed.backward (once_differentiable): under create_graph=True the
    gradients come back, and differentiating them again raises, naming why. The usual backward
    (grad mode off) skips that wrapper; this is the path that keeps it."""
    torch.manual_seed(0)
    m = nn.Linear(4, 3)
    twin = copy.deepcopy(m)
    x = torch.randn(5, 4)
    g = graphd.make_graphed_callables(m, (x.clone(),))
    (gw,) = torch.autograd.grad(g(x).pow(2).sum(), [m.weight], create_graph=True)
    (ref,) = torch.autograd.grad(twin(x).pow(2).sum(), [twin.weight])
    torch.testing.assert_close(gw.detach(), ref, **RT)
    assert gw.requires_grad
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gw.sum().backward()


@pytest.mark.skipif(not hasattr(torch, "func"), reason="torch.func's transforms (torch >= 2.0)")
def test_under_torch_func_transforms_as_upstreams_function():
    """The graphed callable calls torch's C apply straight, without Function.apply's Python
    layers, and behaves as through them: inside a torch.func transform it is refused with
    upstream's message, as any Function without setup_context is (the C apply's own check would
    refuse with another), and a tensor leaked from a transform that has ended (a dead wrapper,
    which the runner unwraps as Function.apply does) replays to the plain tensor's output. The
    values alone may not tell an unwrapped dead wrapper from one passed as it is: graphd copies
    the input's values either way."""
    torch.manual_seed(0)
    m = nn.Linear(4, 3)
    x = torch.randn(5, 4)
    g = graphd.make_graphed_callables(m, (x.clone(),))
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: g(t).sum())(x)
    ref = g(x).detach()
    leaked = []
    torch.func.grad(lambda t: (leaked.append(t), (t * 2).sum())[1])(x.clone())
    torch.testing.assert_close(g(leaked[0]).detach(), ref, rtol=0, atol=0)


def test_static_input_passed_back():
    torch.manual_seed(0)
    m = gd_models.mlp()
    twin = copy.deepcopy(m)
    static_x = torch.randn(16, 8)
    g = graphd.make_graphed_callables(m, (static_x,))
    runner = g._graphd_runner
    # As upstream, the sample arg is the static input: filling it in place costs no copy.
    assert static_x.data_ptr() == runner.static.inputs[0].data_ptr()
    for step in range(3):
        data = torch.randn(16, 8)
        static_x.copy_(data)
        out = g(static_x)
        torch.testing.assert_close(out, twin(data), **RT)
        out.sum().backward()
        twin(data).sum().backward()
    for p, q in zip(m.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **RT)
    # Any other tensor still works (copied in).
    other = torch.randn(16, 8)
    torch.testing.assert_close(g(other), twin(other), **RT)


@pytest.mark.parametrize("set_to_none", [False, True])
def test_gradient_accumulation(set_to_none):
    torch.manual_seed(0)
    m = gd_models.mlp()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(16, 8),))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    e_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    data = gd_models.batches((16, 8), (16, 4), n=6, seed=3)
    static_grads = [t for t in m._graphd_runner.static.param_grads.values()]
    for k in range(3):
        for model, o in ((g, opt), (twin, e_opt)):
            o.zero_grad(set_to_none=set_to_none)
            for x, y in data[2 * k:2 * k + 2]:  # two backward passes, then one step
                F.mse_loss(model(x), y).backward()
        for p, q in zip(m.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **RT)
            # .grad never aliases the static gradient the next BACKWARD overwrites
            assert all(p.grad.data_ptr() != s.data_ptr() for s in static_grads)
        opt.step()
        e_opt.step()
    for p, q in zip(m.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, **RT)


def test_param_grad_is_the_static_gradient_without_a_copy():
    """One backward per step after zero_grad(set_to_none=True) (the default since torch 2.0):
    param.grad is the graph's static gradient, as upstream's, with no copy; the steps still
    train as eager does."""
    torch.manual_seed(0)
    m = gd_models.mlp()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(16, 8),))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    e_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    static_ptrs = {t.data_ptr() for t in m._graphd_runner.static.param_grads.values()}
    for x, y in gd_models.batches((16, 8), (16, 4), n=4, seed=5):
        for model, o in ((g, opt), (twin, e_opt)):
            o.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
        assert {p.grad.data_ptr() for p in m.parameters()} == static_ptrs
        for p, q in zip(m.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **RT)
        opt.step()
        e_opt.step()
    for p, q in zip(m.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, **RT)


def test_input_that_requires_grad_gets_its_grad():
    torch.manual_seed(0)
    m = gd_models.mlp()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(4, 8, requires_grad=True),))
    for _ in range(2):  # accumulates into x.grad across two backward passes
        x = torch.randn(4, 8, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        g(x).pow(2).sum().backward()
        g(x).sum().backward()
        twin(xe).pow(2).sum().backward()
        twin(xe).sum().backward()
        torch.testing.assert_close(x.grad, xe.grad, **RT)


def test_nested_sample_args():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 2)
            self.b = nn.Linear(5, 2)

        def forward(self, pair, extra):
            return [self.a(pair[0]) + self.b(pair[1]["z"]), extra * 2]

    torch.manual_seed(0)
    m = Pair()
    twin = copy.deepcopy(m)
    sample = ((torch.randn(4, 3), {"z": torch.randn(4, 5)}), torch.randn(4, 2))
    g = graphd.make_graphed_callables(m, sample)
    args = ((torch.randn(4, 3), {"z": torch.randn(4, 5)}), torch.randn(4, 2))
    out, ref = g(*args), twin(*args)
    assert isinstance(out, list) and len(out) == 2
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, **RT)


def test_scriptmodule_taken_as_is():
    torch.manual_seed(0)
    m = torch.jit.script(gd_models.mlp())
    torch.manual_seed(0)
    twin = torch.jit.script(gd_models.mlp())  # deepcopy of a ScriptModule breaks its leaves
    g = graphd.make_graphed_callables(m, (torch.randn(4, 8),))
    x = torch.randn(4, 8)
    out = g(x)
    ref = twin(x)
    torch.testing.assert_close(out, ref, **RT)
    out.sum().backward()
    ref.sum().backward()
    for p, q in zip(m.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **RT)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # BatchNorm's batch-size check
def test_frozen_parameters_and_buffers():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    m[0].weight.requires_grad_(False)
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(6, 4),))
    x = torch.randn(6, 4)
    out, ref = g(x), twin(x)
    torch.testing.assert_close(out, ref, **RT)  # training mode: batch statistics
    out.sum().backward()
    ref.sum().backward()
    assert m[0].weight.grad is None
    for p, q in zip(m.parameters(), twin.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **RT)


def _upstream_warmup(func, args, iters=3):
    """What upstream's make_graphed_callables warm-up does to func: forward and autograd.grad on
    the sample args (its buffers move, its parameters' .grad stays None)."""
    for _ in range(iters):
        out = func(*args)
        targets = [a for a in args if a.requires_grad] + [p for p in func.parameters()
                                                          if p.requires_grad]
        torch.autograd.grad(out, targets, torch.zeros_like(out))


def _bn_net():
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _assert_buffers_equal(m, twin):
    got, want = dict(m.named_buffers()), dict(twin.named_buffers())
    assert list(got) == list(want)
    for name in want:
        if want[name].is_floating_point():
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7,
                                       msg=lambda s, n=name: "%s: %s" % (n, s))
        else:
            assert torch.equal(got[name], want[name]), (name, got[name], want[name])


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # BatchNorm's batch-size check
def test_batchnorm_running_stats_match_eager():
    """The module's buffers are the daemon's: after 20 training steps through graphd the running
    stats and num_batches_tracked equal eager training's, warm-up iterations counted as upstream
    counts them (its warm-up runs the module itself), and eval mode (the local forward) and
    state_dict see them."""
    torch.manual_seed(0)
    m = _bn_net()
    twin = copy.deepcopy(m)
    sample = torch.randn(6, 4)
    g = graphd.make_graphed_callables(m, (sample.clone(),))
    _upstream_warmup(twin, (sample,))
    _assert_buffers_equal(m, twin)  # the three warm-up updates
    assert int(m[1].num_batches_tracked) == 3
    gid = g._graphd_runner.graph.id

    opt_g = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    opt_e = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    before = replays(gid)
    for step in range(20):
        x = torch.randn(6, 4) * (1 + 0.1 * step) + 0.05 * step
        y = torch.randn(6, 2)
        losses = []
        for model, opt in ((g, opt_g), (twin, opt_e)):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], **RT)
    assert replays(gid) == (before[0] + 20, before[1] + 20)  # the graph ran, not the fallback
    _assert_buffers_equal(m, twin)
    assert int(m[1].num_batches_tracked) == 23
    sd, sd_twin = m.state_dict(), twin.state_dict()
    for key in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
        torch.testing.assert_close(sd[key], sd_twin[key], rtol=1e-5, atol=1e-7)

    m.eval()
    twin.eval()
    x = torch.randn(6, 4)
    torch.testing.assert_close(m(x), twin(x), **RT)  # running stats, in the local forward
    m.train()


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_buffer_writes_reach_the_graph():
    """Buffers written in place here (load_state_dict, reset_running_stats) are what the next
    replay reads, as upstream's graphs read the module's own buffers."""
    torch.manual_seed(0)
    m = _bn_net().eval()
    twin = copy.deepcopy(m)
    g = graphd.make_graphed_callables(m, (torch.randn(6, 4),))
    assert not g._graphd_runner.graph.training
    x = torch.randn(6, 4)
    torch.testing.assert_close(g(x), twin(x), **RT)
    stats = {"1.running_mean": torch.linspace(-1, 1, 8), "1.running_var": torch.linspace(0.5, 3, 8)}
    state = dict(twin.state_dict(), **stats)
    m.load_state_dict(state)
    twin.load_state_dict(state)
    gid = g._graphd_runner.graph.id
    before = replays(gid)
    out = g(x)
    assert replays(gid)[0] == before[0] + 1  # the graph, in eval mode
    torch.testing.assert_close(out, twin(x), **RT)

    # Training mode from reset stats: the graph starts from what reset_running_stats wrote.
    t = _bn_net()
    t_twin = copy.deepcopy(t)
    gt = graphd.make_graphed_callables(t, (torch.randn(6, 4),))
    t[1].reset_running_stats()
    t_twin[1].reset_running_stats()
    for _ in range(2):
        x = torch.randn(6, 4)
        gt(x)
        t_twin(x)
    _assert_buffers_equal(t, t_twin)
    assert int(t[1].num_batches_tracked) == 2


def _two_callables_sharing(shared):
    """a = Linear(3, 4) then shared, b = shared then Linear(4, 2), graphed in one call: (a, b),
    their eager twins (sharing their copy of shared), the sample args and the graphed pair."""
    a = nn.Sequential(nn.Linear(3, 4), shared)
    b = nn.Sequential(shared, nn.Linear(4, 2))
    twin_a, twin_b = copy.deepcopy((a, b))
    assert twin_a[1] is twin_b[0]
    xs = torch.randn(5, 3)
    hs = torch.randn(5, 4, requires_grad=True)
    ga, gb = graphd.make_graphed_callables((a, b), ((xs.clone(),), (hs.detach().clone()
                                                                   .requires_grad_(),)))
    return a, b, twin_a, twin_b, xs, hs, ga, gb


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_buffers_shared_by_two_callables():
    """One BatchNorm in two callables of one call: its buffers live in the first graph's static
    tensors and are copied in and out around the second's replays, so both updates land, in
    order, as in eager mode."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4)
    a, b, twin_a, twin_b, xs, hs, ga, gb = _two_callables_sharing(bn)
    _upstream_warmup(twin_a, (xs,))
    _upstream_warmup(twin_b, (hs,))
    assert int(bn.num_batches_tracked) == 6
    _assert_buffers_equal(a, twin_a)
    opt_g = torch.optim.SGD(list(a.parameters()) + list(b[1].parameters()), lr=0.05)
    opt_e = torch.optim.SGD(list(twin_a.parameters()) + list(twin_b[1].parameters()), lr=0.05)
    for _ in range(5):
        x = torch.randn(5, 3)
        for fa, fb, opt in ((ga, gb, opt_g), (twin_a, twin_b, opt_e)):
            opt.zero_grad()
            fb(fa(x)).pow(2).mean().backward()
            opt.step()
    _assert_buffers_equal(a, twin_a)
    assert int(bn.num_batches_tracked) == 16
    for p, q in zip(list(a.parameters()) + list(b.parameters()),
                    list(twin_a.parameters()) + list(twin_b.parameters())):
        torch.testing.assert_close(p, q, **RT)


def test_replay_paths_agree():
    torch.manual_seed(0)
    g = graphd.make_graphed_callables(gd_models.mlp(), (torch.randn(4, 8),))
    runner = g._graphd_runner
    runner.static.inputs[0].copy_(torch.randn(4, 8))
    runner.graph.replay(0)
    fast = runner.static.outputs[0].clone()
    runner.graph.replay(0, rpc=True)
    assert torch.equal(fast, runner.static.outputs[0])


def test_pool_and_device_arguments():
    torch.manual_seed(0)
    pool = graphd.graph_pool_handle("pytest-sem")
    g = graphd.make_graphed_callables(gd_models.mlp(), (torch.randn(4, 8),), pool=pool,
                                      device="cpu")
    assert graph_status(g._graphd_runner.graph.id)["pool"] == "pytest-sem"
    g2 = graphd.make_graphed_callables(gd_models.mlp(), (torch.randn(4, 8),), pool="pytest-sem",
                                       device=torch.device("cpu"))
    assert graph_status(g2._graphd_runner.graph.id)["pool"] == "pytest-sem"
    with pytest.raises(graphd.NotFound) as e:
        graphd.make_graphed_callables(gd_models.mlp(), (torch.randn(4, 8),), device="cuda:5")
    assert "cuda:5" in str(e.value)
    with pytest.raises(graphd.NotFound):
        graphd.make_graphed_callables(gd_models.mlp(), (torch.randn(4, 8),), pool="no-such-pool")
    with pytest.raises(TypeError):
        graphd.make_graphed_callables(gd_models.mlp(), (torch.randn(4, 8),), pool=42)


def test_graph_released_when_unused():
    torch.manual_seed(0)
    g = graphd.make_graphed_callables(lambda x: x.sin() * 2, (torch.randn(3, requires_grad=True),))
    gid = g.graph.id
    assert graph_status(gid)
    out = g(torch.randn(3, requires_grad=True))
    del g
    assert any(int(x["id"]) == gid for x in graphd.default_client().status()["graphs"])
    del out  # the last view of the static region
    import gc
    gc.collect()
    st = graphd.default_client().status()
    assert all(int(x["id"]) != gid for x in st.get("graphs", []))


def test_parameter_shared_by_two_callables():
    """One Linear in two callables of one call: its parameters are rebound to the first graph's
    static tensors, so the second graph's forward copies them into its own before each replay
    (found by comparing data pointers every call); after optimizer steps both graphs must see the
    updated weights, as the eager modules do."""
    torch.manual_seed(0)
    a, b, twin_a, twin_b, xs, hs, ga, gb = _two_callables_sharing(nn.Linear(4, 4))
    params = lambda m1, m2: list(m1.parameters()) + list(m2[1].parameters())  # noqa: E731
    opt_g = torch.optim.SGD(params(a, b), lr=0.1)
    opt_e = torch.optim.SGD(params(twin_a, twin_b), lr=0.1)
    for _ in range(4):
        x = torch.randn(5, 3)
        outs = []
        for fa, fb, opt in ((ga, gb, opt_g), (twin_a, twin_b, opt_e)):
            opt.zero_grad()
            out = fb(fa(x))
            out.pow(2).mean().backward()
            opt.step()
            outs.append(out.detach())
        torch.testing.assert_close(outs[0], outs[1], **RT)
    for p, q in zip(params(a, b), params(twin_a, twin_b)):
        torch.testing.assert_close(p, q, **RT)
