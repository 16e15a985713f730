"""Exceptions for failures reported by graphd or libgraphd.

Every failure is a GraphdError carrying the error's name (``code``: the gRPC status name such as
"NOT_FOUND", or a client-local name such as "ESYS"), libgraphd's numeric code (``errno``) and the
message (the daemon's, when it sent one). The commonest codes have subclasses so that callers can
catch, say, ``graphd.NotFound``. GraphdError is a RuntimeError, the type upstream
make_graphed_callables raises for what fails inside libtorch (a module that does not run on its
sample args, an unused input without allow_unused_input): graphd raises those from the daemon.
"""


class PerformanceWarning(UserWarning):
    """graphd works, but slower than it could: for instance device-resident graphs on a GPU that
    the daemon reaches without NVIDIA MPS. Filter it with the warnings module."""


class GraphdError(RuntimeError):
    """A graphd call failed. ``code``: "INVALID_ARGUMENT" etc.; ``errno``: libgraphd's code
    (negative; 0 for errors raised by the Python package itself); ``message``: the text."""

    code = "UNKNOWN"

    def __init__(self, message, code=None, errno=0):
        if code is not None:
            self.code = code
        self.errno = errno
        self.message = message
        super().__init__("%s: %s" % (self.code, message) if message else self.code)


class InvalidArgument(GraphdError):
    code = "INVALID_ARGUMENT"


class NotFound(GraphdError):
    code = "NOT_FOUND"


class AlreadyExists(GraphdError):
    code = "ALREADY_EXISTS"


class PermissionDenied(GraphdError):
    code = "PERMISSION_DENIED"


class ResourceExhausted(GraphdError):
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(GraphdError):
    code = "FAILED_PRECONDITION"


class Unavailable(GraphdError):
    code = "UNAVAILABLE"


class Internal(GraphdError):
    code = "INTERNAL"


class DeadlineExceeded(GraphdError):
    """No answer within GRAPHD_TIMEOUT_MS: the daemon is stopped, hung or overloaded (the
    message names its pid when the socket tells it)."""
    code = "DEADLINE_EXCEEDED"


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
                                      ResourceExhausted, FailedPrecondition, Unavailable,
                                      Internal, DeadlineExceeded)}


def make_error(code, message, errno=0):
    """The GraphdError (subclass when there is one) for a code name."""
    return _BY_CODE.get(code, GraphdError)(message, code=code, errno=errno)
