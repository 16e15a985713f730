"""Every upstream argument check of make_graphed_callables raises the same exception type (and,
where the text is the same across PyTorch versions, the same message) as upstream. Upstream's
checks run before it touches CUDA, so torch.cuda.make_graphed_callables itself is the reference
on this CPU-only machine."""
import pytest
import torch
import torch.nn as nn

import graphd


def both_raise(callables, sample_args, **kw):
    """(upstream's exception, graphd's exception) for the same call."""
    with pytest.raises(Exception) as up:
        torch.cuda.make_graphed_callables(callables, sample_args)
    with pytest.raises(Exception) as ours:
        graphd.make_graphed_callables(callables, sample_args, **kw)
    assert type(ours.value) is type(up.value), (up.value, ours.value)  # noqa: E721 (exact type)
    return up.value, ours.value


@pytest.mark.parametrize("hook", ["forward", "forward_pre", "backward"])
def test_module_with_hooks(hook):
    m = nn.Linear(3, 2)
    if hook == "forward":
        m.register_forward_hook(lambda mod, inp, out: None)
    elif hook == "forward_pre":
        m.register_forward_pre_hook(lambda mod, inp: None)
    else:
        m.register_full_backward_hook(lambda mod, gi, go: None)
    up, ours = both_raise(m, (torch.randn(4, 3),))
    assert isinstance(ours, AssertionError)
    assert str(ours) == str(up)
    # The tuple form checks each callable.
    up, ours = both_raise((nn.Linear(3, 3), m), ((torch.randn(4, 3),), (torch.randn(4, 3),)))
    assert str(ours) == str(up)


def test_buffer_requires_grad():
    m = nn.Linear(3, 2)
    m.register_buffer("scale", torch.ones(2, requires_grad=True))
    up, ours = both_raise(m, (torch.randn(4, 3),))
    assert isinstance(ours, AssertionError)
    assert str(ours) == str(up)


@pytest.mark.parametrize("bad", [3, None, "x", [1.0]])
def test_non_tensor_sample_args(bad):
    up, ours = both_raise(nn.Linear(3, 2), (torch.randn(4, 3), bad))
    assert isinstance(ours, AssertionError)
    assert "sample_args" in str(ours)


def test_non_tensor_nested_sample_arg():
    with pytest.raises(AssertionError):
        graphd.make_graphed_callables(lambda a: a[0] * 2, ((torch.randn(2), 5),))


def test_autocast_with_cache():
    prev = torch.is_autocast_enabled()
    torch.set_autocast_enabled(True)  # what `torch.cuda.amp.autocast()` sets on a GPU machine
    try:
        up, ours = both_raise(nn.Linear(3, 2), (torch.randn(4, 3),))
    finally:
        torch.set_autocast_enabled(prev)
    assert isinstance(ours, RuntimeError)
    assert str(ours) == str(up)


def test_cpu_autocast_with_cache():
    """graphd runs graphs on the CPU device, so CPU autocast's cache is refused the same way."""
    with torch.autocast("cpu"):
        with pytest.raises(RuntimeError) as e:
            graphd.make_graphed_callables(nn.Linear(3, 2), (torch.randn(4, 3),))
    assert "cache_enabled=False" in str(e.value)


def test_checks_leave_the_module_alone():
    m = nn.Linear(3, 2)
    fwd = m.forward
    m.register_forward_hook(lambda mod, inp, out: None)
    with pytest.raises(AssertionError):
        graphd.make_graphed_callables(m, (torch.randn(4, 3),))
    assert m.forward == fwd and "_graphd_runner" not in m.__dict__


def test_module_error_in_capture_is_a_runtime_error():
    """A module that cannot run on its sample args: upstream's warm-up raises libtorch's
    RuntimeError; graphd's capture does too (a GraphdError, which is a RuntimeError)."""
    def f(x):
        return x @ torch.ones(5, 2)  # x is (4, 3): a shape mismatch

    with pytest.raises(RuntimeError):
        f(torch.randn(4, 3))
    with pytest.raises(RuntimeError):  # traced locally: the same error, before the daemon
        graphd.make_graphed_callables(f, (torch.randn(4, 3),))


def test_arg_on_another_device_is_refused():
    """A replay's args must be on the device of the graph's static inputs: graphd refuses rather
    than copy between devices behind the caller's back (a meta tensor stands in for another
    device on this CPU-only machine; tests/python/test_cuda.py does it with cuda:0 and the
    CPU)."""
    m = nn.Linear(4, 4)
    graphed = graphd.make_graphed_callables(m, (torch.randn(2, 4),))
    graphed(torch.randn(2, 4))  # fine
    with pytest.raises(RuntimeError, match="arg 0 is on meta, but the graph's static inputs are "
                                           "on cpu"):
        graphed(torch.empty(2, 4, device="meta"))
    graphed(torch.randn(2, 4))  # still usable
