"""Training parity: 100 steps eager and through graphd.make_graphed_callables, same model, data
and optimizer; losses and final parameters equal to 1e-5 relative."""
import pytest
import torch

import gd_models


@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
@pytest.mark.parametrize("case", ["mlp", "cnn", "two", "function"])
def test_training_parity(case, opt_kind):
    result = gd_models.train_side_by_side(gd_models.CASES[case], opt_kind, steps=100)
    gd_models.assert_parity(result)
    g_losses = result[1]
    assert g_losses[-1] < g_losses[0]  # it did train


def test_optimizer_built_before_the_call():
    """An optimizer built on module.parameters() before make_graphed_callables keeps working:
    the same Parameter objects now live in the shared region."""
    result = gd_models.train_side_by_side(gd_models.CASES["mlp"], "sgd", steps=30,
                                          opt_before=True)
    gd_models.assert_parity(result)


def test_parameters_live_in_the_graph():
    import graphd
    torch.manual_seed(0)
    m = gd_models.mlp()
    params = list(m.parameters())
    before = [p.detach().clone() for p in params]
    g = graphd.make_graphed_callables(m, (torch.randn(4, 8),))
    assert g is m
    after = list(m.parameters())
    assert all(a is b for a, b in zip(params, after))  # same Parameter objects
    runner = m._graphd_runner
    for p, view, b in zip(params, runner.static.params, before):
        assert p.data_ptr() == view.data_ptr()
        assert torch.equal(p.detach(), b)
    # An in-place update here is what the next replay sees, with no upload.
    x = torch.randn(4, 8)
    with torch.no_grad():
        params[-1].add_(1.0)  # the last layer's bias
        ref = torch.nn.functional.linear(
            torch.nn.functional.gelu(m[2](torch.nn.functional.gelu(m[0](x)))),
            m[4].weight, m[4].bias)
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-6)
