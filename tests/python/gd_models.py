"""Small models, data and a side-by-side trainer shared by the tests and by trainer.py (the
subprocess the multi-process tests start). Everything is seeded: the eager twin and the graphed
model start from the same parameters and see the same batches."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import graphd

RTOL = 1e-5
ATOL = 1e-6  # for values near zero, where a relative bound means nothing


def mlp(d_in=8, d_hidden=32, d_out=4):
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_hidden),
                         nn.GELU(), nn.Linear(d_hidden, d_out))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 2 * 2, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    raise ValueError(kind)


def batches(shape_x, shape_y, n=4, seed=7):
    """n batches (x, y) with y a fixed smooth function of x plus a little noise: learnable."""
    g = torch.Generator().manual_seed(seed)
    d_in = 1
    for s in shape_x[1:]:
        d_in *= s
    w = torch.randn(d_in, shape_y[-1], generator=g) / d_in ** 0.5
    out = []
    for _ in range(n):
        x = torch.randn(*shape_x, generator=g)
        y = torch.tanh(2 * x.flatten(1) @ w) + 0.05 * torch.randn(*shape_y, generator=g)
        out.append((x, y))
    return out


class Case:
    """A model to train both ways: build() => (callables, params, forward(callables, x)); sample
    args; data."""

    def __init__(self, name, build, sample, data):
        self.name, self.build, self.sample, self.data = name, build, sample, data


def _mlp_case():
    def build():
        m = mlp()
        return m, list(m.parameters()), lambda c, x: c(x)
    return Case("mlp", build, lambda: (torch.randn(16, 8),), batches((16, 8), (16, 4)))


def _cnn_case():
    def build():
        m = SmallCNN()
        return m, list(m.parameters()), lambda c, x: c(x)
    return Case("cnn", build, lambda: (torch.randn(8, 1, 8, 8),), batches((8, 1, 8, 8), (8, 3)))


def _two_case():
    def build():
        a, b = mlp(8, 16, 12), mlp(12, 16, 4)
        return (a, b), list(a.parameters()) + list(b.parameters()), lambda c, x: c[1](c[0](x))
    # As upstream's example: the second callable's input requires grad (it is a's output).
    return Case("two", build,
                lambda: ((torch.randn(16, 8),), (torch.randn(16, 12, requires_grad=True),)),
                batches((16, 8), (16, 4)))


def fn_model(x, w1, b1, w2):
    return torch.tanh(x @ w1 + b1) @ w2


def _fn_case():
    def build():
        w1 = (0.3 * torch.randn(8, 32)).requires_grad_()
        b1 = torch.zeros(32).requires_grad_()
        w2 = (0.3 * torch.randn(32, 4)).requires_grad_()
        ws = [w1, b1, w2]
        return fn_model, ws, lambda c, x: c(x, *ws)
    # The sample weights are stand-ins: the real ones are passed at each call.
    return Case("function", build,
                lambda: (torch.randn(16, 8), torch.randn(8, 32, requires_grad=True),
                         torch.randn(32, requires_grad=True),
                         torch.randn(32, 4, requires_grad=True)),
                batches((16, 8), (16, 4)))


CASES = {c.name: c for c in (_mlp_case(), _cnn_case(), _two_case(), _fn_case())}


def train_side_by_side(case, opt_kind, steps=100, seed=0, pool=None, on_step=None,
                       opt_before=False, on_ready=None, device=None):
    """Trains the case eagerly and through graphd (make_graphed_callables' pool and device) from
    the same start for `steps` steps (MSE loss). on_ready(graphed callables) runs once they are
    made; on_step(step, graphd loss) after every step, and a true result stops the run early.
    Returns (eager losses, graphd losses, eager params, graphd params)."""
    torch.manual_seed(seed)
    callables, params, fwd = case.build()
    # The twin: for a function, its weight tensors; for modules, the modules themselves.
    twin_callables = copy.deepcopy((callables, params))
    e_callables, e_params = twin_callables
    if case.name == "function":
        e_fwd = (lambda ws: (lambda c, x: c(x, *ws)))(e_params)
    else:
        e_fwd = fwd
    e_opt = make_optimizer(opt_kind, e_params)
    g_opt = make_optimizer(opt_kind, params) if opt_before else None

    torch.manual_seed(seed + 1)
    sample = case.sample()
    g_callables = graphd.make_graphed_callables(callables, sample, pool=pool, device=device)
    if case.name == "function":
        ws = params
        g_fwd = lambda c, x: c(x, *ws)  # noqa: E731
    else:
        g_fwd = fwd
    if g_opt is None:
        g_opt = make_optimizer(opt_kind, params)
    if on_ready is not None:
        on_ready(g_callables)

    e_losses, g_losses = [], []
    for step in range(steps):
        x, y = case.data[step % len(case.data)]
        for callables_, fwd_, opt_, losses in ((e_callables, e_fwd, e_opt, e_losses),
                                               (g_callables, g_fwd, g_opt, g_losses)):
            opt_.zero_grad()
            loss = F.mse_loss(fwd_(callables_, x), y)
            loss.backward()
            opt_.step()
            losses.append(loss.item())
        if on_step is not None and on_step(step, g_losses[-1]):
            break
    return (torch.tensor(e_losses), torch.tensor(g_losses),
            [p.detach().clone() for p in e_params], [p.detach().clone() for p in params])


def assert_parity(result):
    e_losses, g_losses, e_params, g_params = result
    torch.testing.assert_close(g_losses, e_losses, rtol=RTOL, atol=ATOL)
    assert len(e_params) == len(g_params)
    for e, g in zip(e_params, g_params):
        torch.testing.assert_close(g, e, rtol=RTOL, atol=ATOL)
