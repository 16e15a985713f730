"""CUDA device through the daemon (issue 5): host-staged sessions, where the client keeps every
tensor in host regions and never opens a CUDA context; the captured graphs copy inputs and
parameters to the device and outputs and grads back. Skipped unless the daemon lists cuda:0 (CI has
no GPU; these run on the GPU machine, see docs/BENCHMARKS.md)."""
import copy

import pytest
import torch
import torch.nn as nn

import graphd


@pytest.fixture(autouse=True)
def cuda_device(daemon):
    # Asked of the test session's daemon (the conftest fixture), not at import time: the default
    # client must not be created before GRAPHD_ADDRESS points at that daemon.
    if not any(d["id"] == "cuda:0" for d in graphd.default_client().devices()):
        pytest.skip("the daemon has no cuda:0 device")

RT = dict(rtol=1e-4, atol=1e-5)


def mlp(width, depth):
    layers = []
    for i in range(depth):
        layers += [nn.Linear(width, width)] + ([nn.GELU()] if i < depth - 1 else [])
    return nn.Sequential(*layers)


def train(model, step_fn, xs, ys, opt):
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(step_fn(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_host_staged_parity_with_eager(opt_name):
    torch.manual_seed(0)
    eager = mlp(64, 4)
    graphed = copy.deepcopy(eager)
    xs = [torch.randn(32, 64) for _ in range(30)]
    ys = [torch.randn(32, 64) for _ in range(30)]

    def make_opt(m):
        if opt_name == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        return torch.optim.Adam(m.parameters(), lr=1e-3)

    opt_e = make_opt(eager)
    opt_g = make_opt(graphed)
    graphed = graphd.make_graphed_callables(graphed, (xs[0].clone(),), device="cuda:0")
    ref = train(eager, eager, xs, ys, opt_e)
    got = train(graphed, graphed, xs, ys, opt_g)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), **RT)
    for a, b in zip(graphed.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, **RT)
    st = graphd.default_client().status()
    pools = [p for p in st["pools"] if p["device"] == "cuda:0" and p.get("graphs", 0) > 0]
    assert pools, "no graph in a cuda:0 pool: %r" % st["pools"]


def test_two_callables_share_a_cuda_pool():
    torch.manual_seed(1)
    a, b = mlp(32, 2), mlp(32, 2)
    ea, eb = copy.deepcopy(a), copy.deepcopy(b)
    x = torch.randn(8, 32, requires_grad=True)
    pool = graphd.graph_pool_handle("cuda-shared", device="cuda:0")
    ga, gb = graphd.make_graphed_callables((a, b), ((x,), (torch.randn(8, 32, requires_grad=True),)),
                                           pool=pool)
    xi = torch.randn(8, 32, requires_grad=True)
    xe = xi.detach().clone().requires_grad_()
    gb(ga(xi)).pow(2).sum().backward()
    eb(ea(xe)).pow(2).sum().backward()
    torch.testing.assert_close(xi.grad, xe.grad, **RT)
    for p, q in zip(list(a.parameters()) + list(b.parameters()),
                    list(ea.parameters()) + list(eb.parameters())):
        torch.testing.assert_close(p.grad, q.grad, **RT)
