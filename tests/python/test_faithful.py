"""No silent wrong results: every case where a trace would freeze something that eager PyTorch
reads afresh at each call is either made right (static inputs kept in sync) or refused with a
clear error at make_graphed_callables time; every misuse after graphing that would train the
wrong tensors is an error at the call. Each test here fails on a client that traces naively."""
import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn

import graphd

RTOL, ATOL = 1e-5, 1e-6


def close(a, b):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


# ---- what the trace would freeze -----------------------------------------------------------

class DataBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # a branch on data
            return self.fc(x) * 2
        return self.fc(x)


def test_data_dependent_branch_is_refused():
    x = torch.ones(2, 4)
    with pytest.raises(graphd.InvalidArgument) as e:
        graphd.make_graphed_callables(DataBranch(), (x,))
    msg = str(e.value)
    assert "bool() of a tensor" in msg and "test_faithful.py" in msg and "x.sum() > 0" in msg
    assert "torch.where" in msg  # says what to change


@pytest.mark.parametrize("read", ["item", "float", "tolist", "numpy"])
def test_host_reads_are_refused(read):
    def f(x):
        if read == "item":
            s = x.sum().item()
        elif read == "float":
            s = float(x[0, 0])
        elif read == "tolist":
            s = x.tolist()[0][0]
        else:
            s = float(x.detach().numpy()[0, 0])
        return x * s

    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(graphd.InvalidArgument) as e:
        graphd.make_graphed_callables(f, (x,))
    assert "reads a tensor's value on the host" in str(e.value)
    assert "test_faithful.py" in str(e.value)


def test_branch_on_a_closure_tensor_is_refused():
    flag = torch.ones(())

    def f(x):
        return x * 2 if flag > 0 else x

    with pytest.raises(graphd.InvalidArgument, match="reads a tensor's value on the host"):
        graphd.make_graphed_callables(f, (torch.randn(2, 3),))


def test_library_modules_asserting_on_shapes_are_allowed():
    """torch.nn code checks shapes against Python numbers (multi-head attention's
    head_dim * num_heads == embed_dim, group_norm's batch size): the tracer wraps the numbers
    as tensor constants, which are not values that change."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Upsample(scale_factor=2))
    x = torch.randn(2, 3, 8, 8)
    eager = copy.deepcopy(m)
    graphd.make_graphed_callables(m, (x,))
    close(m(x), eager(x))


def test_reads_of_shapes_are_allowed():
    """Shapes are fixed in a graph, so Python reading them is faithful."""
    lin = nn.Linear(6, 3).requires_grad_(False)

    def f(x):
        n = int(x.shape[0])
        if x.size(1) > 2:
            x = x * 2
        return lin(x.view(n, -1))

    x = torch.randn(4, 6)
    g = graphd.make_graphed_callables(f, (x,))
    x2 = torch.randn(4, 6)
    close(g(x2), lin(x2 * 2))


def test_closure_tensor_follows_in_place_updates():
    scale = torch.ones(4)
    lin = nn.Linear(4, 4).requires_grad_(False)  # a closure's module: its weights are read too

    def f(x):
        return lin(x) * scale

    x = torch.randn(3, 4, requires_grad=True)
    g = graphd.make_graphed_callables(f, (x,))
    with torch.no_grad():
        scale.mul_(3.0)  # after graphing, in place: upstream's graph reads the live memory
    x2 = torch.randn(3, 4)
    with torch.no_grad():
        expected = lin(x2) * 3.0
    close(g(x2), expected)
    assert torch.equal(scale, torch.full((4,), 3.0))  # the user's tensor is still right


class PlainAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.mask = torch.ones(4)  # neither a parameter nor a buffer

    def forward(self, x):
        return self.fc(x) * self.mask


def test_plain_tensor_attribute_follows_in_place_updates():
    torch.manual_seed(0)
    m = PlainAttribute()
    eager = copy.deepcopy(m)
    x = torch.randn(3, 4)
    graphd.make_graphed_callables(m, (x,))  # a module is graphed in place (its forward)
    opt, opt_e = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(eager.parameters(),
                                                                           lr=0.1)
    for step in range(4):
        with torch.no_grad():
            m.mask[step] = 0.0  # the user edits the attribute in place between steps
            eager.mask[step] = 0.0
        xb = torch.randn(3, 4)
        for model, o in ((m, opt), (eager, opt_e)):
            o.zero_grad()
            model(xb).pow(2).sum().backward()
            o.step()
        close(m(xb), eager(xb))
    for p, q in zip(m.parameters(), eager.parameters()):
        close(p, q)


def test_closure_tensor_that_requires_grad_is_refused():
    w = torch.ones(4, requires_grad=True)

    def f(x):
        return x * w

    with pytest.raises(graphd.InvalidArgument) as e:
        graphd.make_graphed_callables(f, (torch.randn(2, 4),))
    assert "requires grad" in str(e.value) and "nn.Parameter" in str(e.value)


def test_closure_tensor_of_a_view_is_refused():
    base = torch.ones(8)
    part = base[:4]

    def f(x):
        return x * part

    with pytest.raises(graphd.InvalidArgument) as e:
        graphd.make_graphed_callables(f, (torch.randn(2, 4),))
    assert "view of another tensor" in str(e.value)


def test_tensors_made_in_forward_stay_constants():
    """A tensor the callable makes at each call (torch.tensor in forward) is the same at every
    call: no static input for it."""
    def f(x):
        return x + torch.tensor([1.0, 2.0, 3.0])

    x = torch.randn(2, 3)
    g = graphd.make_graphed_callables(f, (x,))
    x2 = torch.randn(2, 3)
    close(g(x2), x2 + torch.tensor([1.0, 2.0, 3.0]))
    assert not g.static.buffers


@pytest.mark.parametrize("op", ["mask", "nonzero", "unique"])
def test_value_dependent_shapes_are_refused(op):
    def f(x):
        if op == "mask":
            return x[x > 0] * 2
        if op == "nonzero":
            return x.nonzero().float()
        return torch.unique(x)

    with pytest.raises(graphd.InvalidArgument) as e:
        graphd.make_graphed_callables(f, (torch.tensor([1.0, -1.0, 2.0, -3.0]),))
    assert "depends on tensor values" in str(e.value) and "test_faithful.py" in str(e.value)


def test_masked_writes_keep_their_shape_and_are_allowed():
    def f(x):
        y = x.clone()
        y[y < 0] = 0.0  # index_put with a mask: the shape stays
        return y * 2

    x = torch.tensor([1.0, -1.0, 2.0, -3.0])
    g = graphd.make_graphed_callables(f, (x,))
    x2 = torch.tensor([-1.0, 5.0, -2.0, 3.0])
    close(g(x2), torch.tensor([0.0, 10.0, 0.0, 6.0]))


def test_batchnorm_with_cumulative_average_is_refused():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=None))
    with pytest.raises(graphd.InvalidArgument) as e:
        graphd.make_graphed_callables(m, (torch.randn(8, 4),))
    assert "momentum=None" in str(e.value) and "1 (BatchNorm1d)" in str(e.value)
    m.eval()  # in eval mode it reads no count: graphable
    g = graphd.make_graphed_callables(m, (torch.randn(8, 4),))
    assert g is m


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_custom_autograd_function_is_refused_plainly():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return Double.apply(self.fc(x))

    with pytest.raises(graphd.InvalidArgument) as e:
        graphd.make_graphed_callables(M(), (torch.randn(2, 4),))
    msg = str(e.value)
    assert "Double" in msg and "torch.autograd.Function" in msg and "@script" not in msg


# ---- misuse after graphing -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_call_with_another_dtype_is_refused(dtype):
    g = graphd.make_graphed_callables(nn.Linear(3, 2), (torch.randn(4, 3),))
    with pytest.raises(RuntimeError, match="has dtype %s, but the callable was captured with "
                       "torch.float32" % dtype):
        g(torch.ones(4, 3, dtype=dtype))


def test_replaced_parameter_is_refused():
    m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    graphd.make_graphed_callables(m, (torch.randn(4, 3),))
    m(torch.randn(4, 3))
    m[1].weight = nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="parameter 'weight' of the graphed module was "
                       "replaced"):
        m(torch.randn(4, 3))


@pytest.mark.parametrize("convert", ["double", "half"])
def test_converted_module_is_refused(convert):
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    graphd.make_graphed_callables(m, (torch.randn(4, 3),))
    getattr(m, convert)()
    with pytest.raises(RuntimeError, match="was converted"):
        m(torch.randn(4, 3, dtype=m[0].weight.dtype))


def test_buffer_moved_in_place_is_refused():
    """A buffer the graph keeps in its own static tensor, whose storage was swapped in place
    (b.data = ...: the same tensor object, so the slot check passes) is refused, not trained
    past: the graph would go on reading the old storage."""
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    graphd.make_graphed_callables(m, (torch.randn(4, 3),))
    m(torch.randn(4, 3))
    m[1].running_mean.data = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="a buffer of the graphed module is now torch.float64"):
        m(torch.randn(4, 3))


def test_forward_before_the_pending_backward_is_refused_at_that_backward():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    graphd.make_graphed_callables(m, (torch.randn(5, 3),))
    x, x2 = torch.randn(5, 3), torch.randn(5, 3)
    loss = m(x).sum()
    with torch.no_grad():
        m(x2)  # would overwrite the saved activations the pending backward needs
    with pytest.raises(graphd.FailedPrecondition) as e:
        loss.backward()
    assert "overwritten" in str(e.value) and e.value.code == "FAILED_PRECONDITION"
    # The next step works.
    m.zero_grad()
    m(x).sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_second_backward_is_refused_in_pytorch_terms():
    m = nn.Linear(3, 1)
    graphd.make_graphed_callables(m, (torch.randn(5, 3),))
    loss = m(torch.randn(5, 3)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(graphd.FailedPrecondition) as e:
        loss.backward()
    assert "backward through the graphed callable a second time" in str(e.value)
    assert "BACKWARD needs" not in str(e.value)
    assert e.value.code == "FAILED_PRECONDITION"


def test_deepcopy_and_pickle_give_an_eager_copy():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    graphd.make_graphed_callables(m, (torch.randn(5, 3),))
    m(torch.randn(5, 3)).sum().backward()
    c = copy.deepcopy(m)
    assert type(c) is nn.Sequential and "_graphd_runner" not in c.__dict__
    for p, q in zip(m.state_dict().values(), c.state_dict().values()):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr()
    x = torch.randn(5, 3)
    close(m(x), c(x))  # the copy computes eagerly what the graph does
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)  # a whole module, not only weights
    assert type(loaded) is nn.Sequential
    for p, q in zip(m.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(p, q)
    assert isinstance(m, nn.Sequential) and type(m).__name__ == "Sequential"
    m(x)  # the graphed module still replays


def test_graphed_function_copy_is_refused():
    g = graphd.make_graphed_callables(lambda x: x * 2, (torch.randn(2, requires_grad=True),))
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.deepcopy(g)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(g)


# ---- random numbers follow the client's generator ---------------------------------------------

class DropMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(torch.relu(self.fc1(x)))
        return self.fc2(h) + 0.01 * torch.randn_like(self.fc2.bias)


def _train_dropout(graphed, seed, steps=8):
    """(losses, outputs, final parameters, generator state) of `steps` SGD steps of DropMLP from
    the same initial parameters, seeded with `seed` after graphing."""
    torch.manual_seed(0)
    m = DropMLP()
    data = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(steps)]
    if graphed:
        graphd.make_graphed_callables(m, (data[0][0],))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch.manual_seed(seed)
    losses, outs = [], []
    for x, y in data:
        opt.zero_grad()
        out = m(x)
        loss = (out - y).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        outs.append(out.detach().clone())
    return losses, outs, [p.detach().clone() for p in m.parameters()], torch.get_rng_state()


def test_random_ops_follow_the_clients_seed_bitwise():
    """The same seed gives eager's dropout masks and noise, bit for bit, run after run; the
    client's generator ends where eager's does; masks differ from step to step; another seed
    gives other masks."""
    e_losses, e_outs, e_params, e_rng = _train_dropout(False, 1234)
    for _ in range(2):
        g_losses, g_outs, g_params, g_rng = _train_dropout(True, 1234)
        assert all(torch.equal(a, b) for a, b in zip(e_outs, g_outs))
        assert all(torch.equal(a, b) for a, b in zip(e_losses, g_losses))
        assert all(torch.equal(a, b) for a, b in zip(e_params, g_params))
        assert torch.equal(e_rng, g_rng)
    assert not torch.equal(g_outs[0], g_outs[1])
    other = _train_dropout(True, 99)[1]
    assert not torch.equal(other[0], g_outs[0])


def test_graph_without_random_ops_leaves_the_generator_alone():
    m = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    graphd.make_graphed_callables(m, (x,))
    assert m._graphd_runner.static.rng is None
    torch.manual_seed(5)
    before = torch.get_rng_state()
    m(x).sum().backward()
    assert torch.equal(torch.get_rng_state(), before)


# ---- a pool handle has no device until it is used ----------------------------------------------

def test_pool_handle_without_a_device_binds_to_the_first_callables():
    """Upstream's pattern: one graph_pool_handle() shared by several make_graphed_callables
    calls. Its pool is made on the device of the first callables (here cpu:1 of the test
    daemon; on a GPU machine, cuda:0 for CUDA modules: test_cuda.py)."""
    pool = graphd.graph_pool_handle()
    assert pool.device is None
    a = graphd.make_graphed_callables(nn.Linear(3, 3), (torch.randn(2, 3),), pool=pool,
                                      device="cpu:1")
    b = graphd.make_graphed_callables(nn.Linear(3, 2), (torch.randn(2, 3),), pool=pool,
                                      device="cpu:1")
    assert pool.device == "cpu:1"
    graphs = {g["id"]: g for g in graphd.default_client().status()["graphs"]}
    for m in (a, b):
        g = graphs[m._graphd_runner.graph.id]
        assert g["pool"] == pool.name and g["device"] == "cpu:1"
    with pytest.raises(ValueError, match="is on cpu:1"):
        graphd.make_graphed_callables(nn.Linear(3, 2), (torch.randn(2, 3),), pool=pool,
                                      device="cpu:0")


def test_transformer_layer_with_dropout_trains_as_eager():
    """A realistic module with dropout in three places and shape assertions inside: the same
    seed gives eager's losses and parameters, bit for bit."""
    def run(graphed):
        torch.manual_seed(0)
        m = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        xs = [torch.randn(4, 5, 16) for _ in range(5)]
        if graphed:
            graphd.make_graphed_callables(m, (xs[0],))
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        torch.manual_seed(3)
        losses = []
        for x in xs:
            opt.zero_grad()
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        return losses, [p.detach().clone() for p in m.parameters()]

    (le, pe), (lg, pg) = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(le, lg))
    assert all(torch.equal(a, b) for a, b in zip(pe, pg))
