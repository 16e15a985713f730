"""graphd: PyTorch graph capture as a per-node service.

``graphd.make_graphed_callables`` is a drop-in for ``torch.cuda.make_graphed_callables`` (and the
XPU one) whose graphs live in the graphd daemon; ``graphd.Client`` talks to the daemon (status,
devices, pools). The package is ctypes over libgraphd (no gRPC or protobuf in Python); torch is
imported only by make_graphed_callables.

Environment: GRAPHD_ADDRESS (daemon address, default unix:/run/graphd/graphd.sock), GRAPHD_LIB
(path of libgraphd.so), GRAPHD_BUILD (a build directory holding it), GRAPHD_TIMEOUT_MS (libgraphd's
per-call deadline).
"""
from .client import (DEFAULT_ADDRESS, Client, Graph, PoolHandle, Region, default_client,
                     graph_pool_handle)
from .errors import (AlreadyExists, FailedPrecondition, GraphdError, Internal, InvalidArgument,
                     NotFound, PerformanceWarning, PermissionDenied, ResourceExhausted,
                     Unavailable)

__version__ = "0.1.0"

__all__ = [
    "make_graphed_callables", "graph_pool_handle", "Client", "default_client", "Graph",
    "PoolHandle", "Region", "DEFAULT_ADDRESS", "GraphdError", "InvalidArgument", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Unavailable",
    "Internal", "PerformanceWarning",
]


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
