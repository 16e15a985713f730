"""ctypes bindings of libgraphd (client/c/graphd.h): finding the library, its structs, the
prototypes of all its functions (bound when it loads: the package and the library ship together),
and the client settings and version it reports. Nothing here knows about torch.

The library is looked up, first match wins, in: $GRAPHD_LIB (a file); $GRAPHD_BUILD/libgraphd.so
(a build directory); <repo>/build/libgraphd.so when the package runs from the source tree;
ctypes.util.find_library("graphd"); then the bare soname libgraphd.so.0 (the dynamic loader's
own search path).
"""
import ctypes
import ctypes.util
import os
import threading

from .errors import make_error

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
ROLE_RNG_STATE = 8  # generator state, in/out of FORWARD ("cpu": uint8, "cuda": int64[3])
ROLE_NAMES = {ROLE_INPUT: "input", ROLE_OUTPUT: "output", ROLE_GRAD_OUTPUT: "grad_output",
              ROLE_GRAD_INPUT: "grad_input", ROLE_PARAM: "param", ROLE_PARAM_GRAD: "param_grad",
              ROLE_BUFFER: "buffer", ROLE_RNG_STATE: "rng_state"}


class Device(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char * 64), ("kind", ctypes.c_char * 16),
                ("name", ctypes.c_char * 128), ("compute_capability", ctypes.c_char * 32),
                ("ordinal", ctypes.c_uint32), ("memory_total", ctypes.c_uint64),
                ("memory_free", ctypes.c_uint64), ("mps", ctypes.c_int),
                ("uuid", ctypes.c_char * 40), ("compute_units", ctypes.c_uint32),
                ("max_clock_mhz", ctypes.c_uint32), ("driver", ctypes.c_char * 96),
                ("have_telemetry", ctypes.c_int), ("telemetry_read_unix_ms", ctypes.c_uint64),
                ("have_memory", ctypes.c_int), ("telemetry_memory_free", ctypes.c_uint64),
                ("telemetry_memory_total", ctypes.c_uint64), ("have_engine", ctypes.c_int),
                ("engine_active_us", ctypes.c_uint64), ("have_utilisation", ctypes.c_int),
                ("utilisation", ctypes.c_double), ("memory_health", ctypes.c_char * 16),
                ("have_reset", ctypes.c_int), ("wedged", ctypes.c_int)]


class Pool(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("device", ctypes.c_char * 64),
                ("limit_bytes", ctypes.c_uint64), ("reserved_bytes", ctypes.c_uint64),
                ("used_bytes", ctypes.c_uint64), ("regions", ctypes.c_uint32),
                ("sessions", ctypes.c_uint32), ("created_unix_ms", ctypes.c_uint64),
                ("graph_mempool_reserved_bytes", ctypes.c_uint64),
                ("graph_mempool_in_use_bytes", ctypes.c_uint64),
                ("owner_uid", ctypes.c_uint32), ("owner_gid", ctypes.c_uint32),
                ("mode", ctypes.c_int), ("delete_with_session", ctypes.c_int)]


# enum graphd_pool_mode (equal to graphd.v1.PoolMode), by name; GRAPHD_POOL_DELETE_WITH_SESSION.
POOL_MODES = {"private": 1, "group": 2, "public": 3}
POOL_DELETE_WITH_SESSION = 0x1


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

# Every function of graphd.h, name: (restype, argtypes), bound when the library loads; one it
# lacks is an OSError naming the library (tests/python/test_client.py checks this list against
# graphd.h).
_PROTOS = {
    "graphd_strerror": (_c.c_char_p, [_c.c_int]),
    "graphd_err_name": (_c.c_char_p, [_c.c_int]),
    "graphd_err_from_grpc": (_c.c_int, [_c.c_int]),
    "graphd_err_to_grpc": (_c.c_int, [_c.c_int]),
    "graphd_version": (_c.c_char_p, []),
    "graphd_setting": (_c.c_int, [_c.c_char_p, _c.c_char_p, _SIZE_P]),
    "graphd_setting_name": (_c.c_char_p, [_c.c_size_t]),
    "graphd_connect": (_c.c_int, [_c.c_char_p, _c.POINTER(_P)]),
    "graphd_close": (None, [_P]),
    "graphd_last_error": (_c.c_char_p, [_P]),
    "graphd_address": (_c.c_char_p, [_P]),
    "graphd_hello": (_c.c_int, [_P, _c.c_char_p]),
    "graphd_goodbye": (_c.c_int, [_P]),
    "graphd_session_id": (_c.c_uint64, [_P]),
    "graphd_session_socket": (_c.c_char_p, [_P]),
    "graphd_daemon_version": (_c.c_char_p, [_P]),
    "graphd_list_devices": (_c.c_int, [_P, _SIZE_P, _c.POINTER(Device)]),
    "graphd_list_pools": (_c.c_int, [_P, _SIZE_P, _c.POINTER(Pool)]),
    "graphd_pool_create": (_c.c_int, [_P, _c.c_char_p, _c.c_char_p, _c.c_uint64,
                                      _c.POINTER(Pool)]),
    "graphd_pool_create_ex": (_c.c_int, [_P, _c.c_char_p, _c.c_char_p, _c.c_uint64, _c.c_int,
                                         _c.c_uint, _c.POINTER(Pool)]),
    "graphd_pool_delete": (_c.c_int, [_P, _c.c_char_p]),
    "graphd_status_json": (_c.c_int, [_P, _c.c_char_p, _SIZE_P]),
    "graphd_module_register": (_c.c_int, [_P, _c.c_void_p, _c.c_size_t, _c.c_char_p, _U64_P]),
    "graphd_module_release": (_c.c_int, [_P, _c.c_uint64]),
    "graphd_capture_opts_init": (None, [_c.POINTER(CaptureOpts)]),
    "graphd_capture": (_c.c_int, [_P, _c.c_size_t, _c.POINTER(Callable), _c.POINTER(CaptureOpts),
                                  _c.POINTER(_P)]),
    "graphd_graph_tensors": (_c.c_int, [_P, _SIZE_P, _c.POINTER(Tensor)]),
    "graphd_graph_id": (_c.c_uint64, [_P]),
    "graphd_graph_training": (_c.c_int, [_P]),
    "graphd_graph_has_backward": (_c.c_int, [_P]),
    "graphd_graph_warmup_reused": (_c.c_int, [_P]),
    "graphd_replay": (_c.c_int, [_P, _c.c_int, _U64_P]),
    "graphd_replay_rpc": (_c.c_int, [_P, _c.c_int, _U64_P]),
    "graphd_replay_stream": (_c.c_int, [_P, _c.c_int, _P, _U64_P]),
    "graphd_set_replay_posted": (_c.c_int, [_P, _c.c_int]),
    "graphd_graph_release": (_c.c_int, [_P]),
    # regions (graphd.Region): handles are graphd_region_t *
    "graphd_region_alloc": (_c.c_int, [_P, _c.c_char_p, _c.c_uint64, _c.POINTER(_P)]),
    "graphd_region_alloc_device": (_c.c_int, [_P, _c.c_char_p, _c.c_uint64, _c.POINTER(_P)]),
    "graphd_region_map": (_c.c_int, [_P, _c.c_uint64, _c.POINTER(_P)]),
    "graphd_region_free": (_c.c_int, [_P, _P]),
    "graphd_region_free_id": (_c.c_int, [_P, _c.c_uint64]),
    "graphd_region_release": (None, [_P]),
    "graphd_region_id": (_c.c_uint64, [_P]),
    "graphd_region_ptr": (_c.c_void_p, [_P]),
    "graphd_region_is_device": (_c.c_int, [_P]),
    "graphd_region_size": (_c.c_uint64, [_P]),
    "graphd_region_mapped_size": (_c.c_uint64, [_P]),
    "graphd_region_write": (_c.c_int, [_P, _c.c_uint64, _c.c_void_p, _c.c_size_t]),
    "graphd_region_read": (_c.c_int, [_P, _c.c_uint64, _c.c_void_p, _c.c_size_t]),
    # a session's xpu event pool: handles are graphd_events_t *
    "graphd_events_open": (_c.c_int, [_P, _c.c_char_p, _c.c_uint, _c.POINTER(_P)]),
    "graphd_events_count": (_c.c_uint, [_P]),
    "graphd_events_signal": (_c.c_int, [_P, _c.c_uint]),
    "graphd_events_reset": (_c.c_int, [_P, _c.c_uint]),
    "graphd_events_query": (_c.c_int, [_P, _c.c_uint]),
    "graphd_events_wait": (_c.c_int, [_P, _c.c_uint, _c.c_uint64]),
    "graphd_events_release": (None, [_P]),
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


def _bind(lib, path):
    for name, (restype, argtypes) in _PROTOS.items():
        fn = getattr(lib, name, None)
        if fn is None:
            raise OSError("graphd: libgraphd at %s does not export %s(): the package and the "
                          "library ship together; rebuild or reinstall both" % (path, name))
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
            _bind(handle, path)
            _lib, _lib_path = handle, path
            return _lib
        raise OSError("graphd: cannot load libgraphd; set GRAPHD_LIB to its path. Tried: " +
                      "; ".join(tried))


def lib_path():
    """The path libgraphd was loaded from (loads it if needed)."""
    lib()
    return _lib_path


def text(b):
    """A C string (bytes or None) as str."""
    return b.decode("utf-8", "replace") if b else ""


def version():
    """libgraphd's version: the VERSION file it was built from (graphd.__version__)."""
    return text(lib().graphd_version())


def setting(name):
    """The effective value (str) of a client setting, read by libgraphd from the environment now
    through its one table (README, "Settings (environment)"): the default when unset or empty,
    else the value checked and normalized ("0250" => "250"). graphd.InvalidArgument naming the
    variable, its value and what is accepted (the message graphd_connect gives too);
    graphd.NotFound for a name that is not a setting."""
    L = lib()
    encoded = name.encode()
    while True:
        need = ctypes.c_size_t(0)
        rc = L.graphd_setting(encoded, None, ctypes.byref(need))
        if rc == 0:
            buf = ctypes.create_string_buffer(need.value)
            rc = L.graphd_setting(encoded, buf, ctypes.byref(need))
            if rc == ETRUNC:
                continue  # the environment changed in between
        if rc != 0:
            raise make_error(text(L.graphd_err_name(rc)), text(L.graphd_last_error(None)), rc)
        return buf.value.decode("utf-8", "surrogateescape")


def setting_names():
    """The names of every client setting in libgraphd's table, in its order."""
    L = lib()
    names = []
    while True:
        name = L.graphd_setting_name(len(names))
        if name is None:
            return names
        names.append(text(name))
