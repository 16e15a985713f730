"""ctypes bindings of libgraphd (client/c/graphd.h): finding the library, its structs and the
prototypes of the functions the package calls. Nothing here knows about torch.

The library is looked up, first match wins, in: $GRAPHD_LIB (a file); $GRAPHD_BUILD/libgraphd.so
(a build directory); <repo>/build/libgraphd.so when the package runs from the source tree;
ctypes.util.find_library("graphd"); then the bare soname libgraphd.so.0 (the dynamic loader's
own search path).
"""
import ctypes
import ctypes.util
import os
import threading

GRAPHD_MAX_DIMS = 8
PHASE_FORWARD = 0
PHASE_BACKWARD = 1
ETRUNC = -103

# enum graphd_dtype (equal to graphd.v1.DType).
DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_FLOAT16, DTYPE_BFLOAT16 = 1, 2, 3, 4
DTYPE_INT64, DTYPE_INT32, DTYPE_INT16, DTYPE_INT8, DTYPE_UINT8, DTYPE_BOOL = 5, 6, 7, 8, 9, 10

# enum graphd_role (equal to graphd.v1.TensorRole).
ROLE_INPUT, ROLE_OUTPUT, ROLE_GRAD_OUTPUT = 1, 2, 3
ROLE_GRAD_INPUT, ROLE_PARAM, ROLE_PARAM_GRAD, ROLE_BUFFER = 4, 5, 6, 7
ROLE_RNG_STATE = 8  # uint8 generator state ("cpu": torch.get_rng_state()), in/out of FORWARD
ROLE_NAMES = {ROLE_INPUT: "input", ROLE_OUTPUT: "output", ROLE_GRAD_OUTPUT: "grad_output",
              ROLE_GRAD_INPUT: "grad_input", ROLE_PARAM: "param", ROLE_PARAM_GRAD: "param_grad",
              ROLE_BUFFER: "buffer", ROLE_RNG_STATE: "rng_state"}


class Device(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char * 64), ("kind", ctypes.c_char * 16),
                ("name", ctypes.c_char * 128), ("compute_capability", ctypes.c_char * 32),
                ("ordinal", ctypes.c_uint32), ("memory_total", ctypes.c_uint64),
                ("memory_free", ctypes.c_uint64), ("mps", ctypes.c_int)]


class Pool(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("device", ctypes.c_char * 64),
                ("limit_bytes", ctypes.c_uint64), ("reserved_bytes", ctypes.c_uint64),
                ("used_bytes", ctypes.c_uint64), ("regions", ctypes.c_uint32),
                ("sessions", ctypes.c_uint32), ("created_unix_ms", ctypes.c_uint64),
                ("graph_mempool_reserved_bytes", ctypes.c_uint64),
                ("graph_mempool_in_use_bytes", ctypes.c_uint64)]


class TensorSpec(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("ndim", ctypes.c_uint32),
                ("shape", ctypes.c_int64 * GRAPHD_MAX_DIMS), ("requires_grad", ctypes.c_int)]


class Callable(ctypes.Structure):
    _fields_ = [("module_id", ctypes.c_uint64), ("method", ctypes.c_char_p),
                ("n_args", ctypes.c_size_t), ("args", ctypes.POINTER(TensorSpec))]


class CaptureOpts(ctypes.Structure):
    _fields_ = [("num_warmup_iters", ctypes.c_int), ("allow_unused_input", ctypes.c_int),
                ("pool", ctypes.c_char_p), ("device_resident", ctypes.c_int),
                ("copy_param_grads", ctypes.c_int)]


class Tensor(ctypes.Structure):
    _fields_ = [("role", ctypes.c_int), ("index", ctypes.c_uint32), ("name", ctypes.c_char * 128),
                ("dtype", ctypes.c_int), ("ndim", ctypes.c_uint32),
                ("shape", ctypes.c_int64 * GRAPHD_MAX_DIMS),
                ("strides", ctypes.c_int64 * GRAPHD_MAX_DIMS), ("nbytes", ctypes.c_uint64),
                ("requires_grad", ctypes.c_int), ("data", ctypes.c_void_p),
                ("absent", ctypes.c_int), ("on_device", ctypes.c_int)]


_c = ctypes
_P = ctypes.c_void_p  # opaque handles: graphd_client_t *, graphd_graph_t *
_SIZE_P = ctypes.POINTER(ctypes.c_size_t)
_U64_P = ctypes.POINTER(ctypes.c_uint64)

# name: (restype, argtypes). The capture API is optional so that an older library still serves
# status and pools; calling it then raises a clear error.
_PROTOS = {
    "graphd_strerror": (_c.c_char_p, [_c.c_int]),
    "graphd_err_name": (_c.c_char_p, [_c.c_int]),
    "graphd_connect": (_c.c_int, [_c.c_char_p, _c.POINTER(_P)]),
    "graphd_close": (None, [_P]),
    "graphd_last_error": (_c.c_char_p, [_P]),
    "graphd_address": (_c.c_char_p, [_P]),
    "graphd_hello": (_c.c_int, [_P, _c.c_char_p]),
    "graphd_goodbye": (_c.c_int, [_P]),
    "graphd_session_id": (_c.c_uint64, [_P]),
    "graphd_daemon_version": (_c.c_char_p, [_P]),
    "graphd_list_devices": (_c.c_int, [_P, _SIZE_P, _c.POINTER(Device)]),
    "graphd_list_pools": (_c.c_int, [_P, _SIZE_P, _c.POINTER(Pool)]),
    "graphd_pool_create": (_c.c_int, [_P, _c.c_char_p, _c.c_char_p, _c.c_uint64,
                                      _c.POINTER(Pool)]),
    "graphd_pool_delete": (_c.c_int, [_P, _c.c_char_p]),
    "graphd_status_json": (_c.c_int, [_P, _c.c_char_p, _SIZE_P]),
}
_CAPTURE_PROTOS = {
    "graphd_module_register": (_c.c_int, [_P, _c.c_void_p, _c.c_size_t, _c.c_char_p, _U64_P]),
    "graphd_module_release": (_c.c_int, [_P, _c.c_uint64]),
    "graphd_capture_opts_init": (None, [_c.POINTER(CaptureOpts)]),
    "graphd_capture": (_c.c_int, [_P, _c.c_size_t, _c.POINTER(Callable), _c.POINTER(CaptureOpts),
                                  _c.POINTER(_P)]),
    "graphd_graph_tensors": (_c.c_int, [_P, _SIZE_P, _c.POINTER(Tensor)]),
    "graphd_graph_id": (_c.c_uint64, [_P]),
    "graphd_graph_training": (_c.c_int, [_P]),
    "graphd_graph_has_backward": (_c.c_int, [_P]),
    "graphd_replay": (_c.c_int, [_P, _c.c_int, _U64_P]),
    "graphd_replay_rpc": (_c.c_int, [_P, _c.c_int, _U64_P]),
    "graphd_replay_stream": (_c.c_int, [_P, _c.c_int, _P, _U64_P]),
    "graphd_set_replay_posted": (_c.c_int, [_P, _c.c_int]),
    "graphd_graph_release": (_c.c_int, [_P]),
    # regions (graphd.Region): handles are graphd_region_t *
    "graphd_region_alloc": (_c.c_int, [_P, _c.c_char_p, _c.c_uint64, _c.POINTER(_P)]),
    "graphd_region_alloc_device": (_c.c_int, [_P, _c.c_char_p, _c.c_uint64, _c.POINTER(_P)]),
    "graphd_region_free": (_c.c_int, [_P, _P]),
    "graphd_region_id": (_c.c_uint64, [_P]),
    "graphd_region_ptr": (_c.c_void_p, [_P]),
    "graphd_region_is_device": (_c.c_int, [_P]),
    "graphd_region_size": (_c.c_uint64, [_P]),
    "graphd_region_mapped_size": (_c.c_uint64, [_P]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("GRAPHD_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # <repo>/client/python/graphd
    in_tree = os.path.exists(os.path.join(repo, "client", "c", "graphd.h"))
    build = os.environ.get("GRAPHD_BUILD")
    if build:
        yield os.path.join(build, "libgraphd.so")
        if in_tree and not os.path.isabs(build):
            yield os.path.join(repo, build, "libgraphd.so")
    if in_tree:
        yield os.path.join(repo, "build", "libgraphd.so")
    found = ctypes.util.find_library("graphd")
    if found:
        yield found
    yield "libgraphd.so.0"


def _bind(lib, protos, required):
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name, None)
        if fn is None:
            if required:
                raise OSError("%s does not export %s" % (lib._name, name))
            continue
        fn.restype = restype
        fn.argtypes = argtypes


def lib():
    """The loaded libgraphd (loaded and bound on first use). OSError when it cannot be found."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            is_file = os.sep in path
            if is_file and not os.path.exists(path):
                tried.append(path + " (missing)")
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            _bind(handle, _PROTOS, True)
            _bind(handle, _CAPTURE_PROTOS, False)
            _lib, _lib_path = handle, path
            return _lib
        raise OSError("graphd: cannot load libgraphd; set GRAPHD_LIB to its path. Tried: " +
                      "; ".join(tried))


def lib_path():
    """The path libgraphd was loaded from (loads it if needed)."""
    lib()
    return _lib_path


def has_capture_api():
    return hasattr(lib(), "graphd_capture")


def capture_fn(name):
    """A function of the capture API; OSError naming the library when it lacks it."""
    fn = getattr(lib(), name, None)
    if fn is None:
        raise OSError("libgraphd at %s has no %s(): it predates the capture API; rebuild it "
                      "(make build/libgraphd.so)" % (_lib_path, name))
    return fn


def text(b):
    """A C string (bytes or None) as str."""
    return b.decode("utf-8", "replace") if b else ""
