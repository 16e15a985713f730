"""graphd: PyTorch graph capture as a per-node service.

``graphd.make_graphed_callables`` is a drop-in for ``torch.cuda.make_graphed_callables`` (and the
XPU one) whose graphs live in the graphd daemon; ``graphd.Client`` talks to the daemon (status,
devices, pools). The package is ctypes over libgraphd (no gRPC or protobuf in Python); torch is
imported only by make_graphed_callables.

Environment: GRAPHD_LIB (path of libgraphd.so) and GRAPHD_BUILD (a build directory holding it)
find the library; every other setting (GRAPHD_ADDRESS, GRAPHD_TIMEOUT_MS, ...) is read by libgraphd
through its one table. README.md, "Settings (environment)", lists them all.

``graphd.__version__`` is libgraphd's version, the repository's VERSION file, as the daemon's.
"""
from .client import (DEFAULT_ADDRESS, Client, Graph, PoolHandle, Region, default_client,
                     graph_pool_handle)
from .errors import (AlreadyExists, DeadlineExceeded, FailedPrecondition, GraphdError, Internal,
                     InvalidArgument, NotFound, PerformanceWarning, PermissionDenied,
                     ResourceExhausted, Unavailable)

__all__ = [
    "make_graphed_callables", "graph_pool_handle", "Client", "default_client", "Graph",
    "PoolHandle", "Region", "DEFAULT_ADDRESS", "GraphdError", "InvalidArgument", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Unavailable",
    "Internal", "DeadlineExceeded", "PerformanceWarning",
]


def __getattr__(name):
    # __version__ comes from libgraphd (built with VERSION, as the daemon), read when first asked
    # for: the package and the library ship together, and importing graphd loads nothing.
    if name == "__version__":
        from . import _lib
        return _lib.version()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False,
                           pool=None, device=None):
    """Accepts callables (functions or nn.Modules) and returns graphed versions whose forward and
    backward replay graphs captured in graphd: the signature and semantics of
    torch.cuda.make_graphed_callables, plus device= (None or "cpu": graphd's CPU device; CUDA
    callables are captured device-resident on their own device, CPU ones with device="cuda:N"
    host-staged). pool: graphd.graph_pool_handle(...), a pool name, or None (the daemon's default
    pool). Details in graphd.graphs.make_graphed_callables."""
    from .graphs import make_graphed_callables as impl  # torch is imported only from here on
    return impl(callables, sample_args, num_warmup_iters=num_warmup_iters,
                allow_unused_input=allow_unused_input, pool=pool, device=device)
