"""Connections to graphd: Client (control plane, session, graphs), the module-level default
client, and graph pool handles. Nothing here imports torch.

Lifetimes. A Client owns one libgraphd client and at most one session (opened on first need).
A Graph owns one libgraphd graph handle and, through it, the mapping of the graph's static
region; the torch tensors made over that mapping keep the Graph alive, so the mapping stays valid
while any of them is used. The Graph releases itself (ReleaseGraph, unmap) when it is garbage
collected. Client.close() ends the session and closes the libgraphd client at once; libgraphd
keeps each open graph and region handle (and its mapping) valid until it is released, so that no
mapping disappears under a live tensor (graphd.h, graphd_close).
"""
import atexit
import ctypes
import gc
import json
import os
import secrets
import sys
import threading
import weakref

from . import _lib, recovery
from .errors import GraphdError, make_error

DEFAULT_ADDRESS = "unix:/run/graphd/graphd.sock"

_exiting = False  # set by the atexit hook: finalizers then leave libgraphd alone
_clients = weakref.WeakSet()


def _error(rc, message):
    L = _lib.lib()
    return make_error(_lib.text(L.graphd_err_name(rc)) or "UNKNOWN",
                      message or _lib.text(L.graphd_strerror(rc)), rc)


def normalize_device(device):
    """The daemon's name for a device: None, "cpu" or torch.device("cpu") => "cpu:0";
    "cuda" => "cuda:0"; "kind:N" as given."""
    if device is None:
        return "cpu:0"
    s = str(device).strip()
    if not s:
        return "cpu:0"
    return s if ":" in s else s + ":0"


class Graph:
    """One captured callable in the daemon: its id, mode at capture, and static tensors.

    Made by Client.capture(); released (ReleaseGraph, then unmapped) when garbage collected.
    Keep it alive as long as anything points into its static tensors (the torch views that
    graphd.make_graphed_callables makes hold a reference to it).
    """

    def __init__(self, client, handle, pool):
        self._client = client
        self._handle = handle
        self.pool = pool
        self.device = None  # "cuda:N" for a device-resident graph (set by make_graphed_callables)
        self.copy_param_grads = False  # as captured (device-resident graphs only)
        self._lost = None  # why replays fail for good (device memory gone with a daemon restart)
        self._runner = None  # weakref to what rebinds its static tensors after a restart
        L = _lib.lib()
        self.id = int(L.graphd_graph_id(handle))
        self.training = bool(L.graphd_graph_training(handle))
        self.has_backward = bool(L.graphd_graph_has_backward(handle))
        # The daemon skipped this capture's warm-up (its reuse_warmup setting)
        self.warmup_reused = bool(L.graphd_graph_warmup_reused(handle))
        count = ctypes.c_size_t(0)
        fn = L.graphd_graph_tensors
        rc = fn(handle, ctypes.byref(count), None)
        if rc == 0 and count.value:
            items = (_lib.Tensor * count.value)()
            rc = fn(handle, ctypes.byref(count), items)
        else:
            items = []
        if rc != 0:
            raise _error(rc, "graphd_graph_tensors failed")
        self.tensors = list(items)  # _lib.Tensor structs, in the daemon's order
        self._finalizer = weakref.finalize(self, client._release_graph, handle)
        self._finalizer.atexit = False

    def replay(self, phase, rpc=False, stream=None, recover=True):
        """Replays FORWARD (0) or BACKWARD (1); returns the daemon's time in ns. The session
        socket's REPLAY frame by default, the gRPC Replay RPC with rpc=True.

        stream (device-resident graphs): a CUDA stream (a torch.cuda.Stream or its cuda_stream
        handle; 0 is the default stream) to order the replay by instead of waiting for it: the
        replay runs after the work queued on the stream so far, the work queued after the call
        runs after the replay, and the call returns once the daemon has launched it (CUDA IPC
        events; no host synchronisation).

        When the daemon went away, the session is restored and the replay retried once
        (graphd.recovery); recover=False raises instead."""
        return recovery.replay(self, phase, rpc, None if stream is None else
                               getattr(stream, "cuda_stream", stream), recover)

    def __repr__(self):
        return "<graphd.Graph id=%d pool=%r training=%s tensors=%d>" % (
            self.id, getattr(self.pool, "name", self.pool), self.training, len(self.tensors))


class Region:
    """A shared region of a client's session (Client.alloc_region): host memory mapped here, or,
    when is_device, device memory of the pool's device (cuda:N or xpu:N) opened here with IPC in
    this process's own context (CUDA IPC; Level Zero IPC, the loader libze_loader.so.1 loaded by
    libgraphd). ptr is its address in this process (a device pointer when is_device), valid until
    free() or the client's close(), which ends the session (the daemon frees its regions). read()
    and write() copy to and from it, host or device. Freed when garbage collected if free() was
    not called."""

    def __init__(self, client, handle, pool):
        L = _lib.lib()
        self._client = client
        self._handle = handle
        self.pool = pool
        self.id = int(L.graphd_region_id(handle))
        self.size = int(L.graphd_region_size(handle))
        self.mapped_size = int(L.graphd_region_mapped_size(handle))
        self.ptr = int(L.graphd_region_ptr(handle) or 0)
        self.is_device = bool(L.graphd_region_is_device(handle))
        self._finalizer = weakref.finalize(self, client._free_region, handle)
        self._finalizer.atexit = False

    def _live_handle(self):
        if not self._finalizer.alive:
            raise ValueError("graphd region %d is freed" % self.id)
        return self._handle

    def write(self, data, offset=0):
        """Copies data (bytes, bytearray, memoryview or anything with the buffer protocol) into
        the region at offset: memcpy for a host region, a synchronous device copy for a device
        region. graphd.InvalidArgument when it does not fit."""
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if n and mv.readonly:
            buf = (ctypes.c_char * n).from_buffer_copy(mv)
        elif n:
            buf = (ctypes.c_char * n).from_buffer(mv)
        else:
            buf = None
        with self._client._lock:
            rc = _lib.lib().graphd_region_write(self._live_handle(), int(offset), buf, n)
            if rc != 0:
                raise self._client._fail(rc, "graphd_region_write failed")

    def read(self, n, offset=0):
        """n bytes of the region at offset, as bytes (a synchronous device copy for a device
        region). graphd.InvalidArgument when they are not inside the region."""
        n = int(n)
        if n < 0:
            raise ValueError("graphd region read of %d bytes" % n)
        buf = ctypes.create_string_buffer(max(n, 1))
        with self._client._lock:
            rc = _lib.lib().graphd_region_read(self._live_handle(), int(offset), buf, n)
            if rc != 0:
                raise self._client._fail(rc, "graphd_region_read failed")
        return buf.raw[:n]

    def free(self):
        """FreeRegion, then unmaps it here (a device region's mapping is closed first, after
        waiting for the device). Idempotent."""
        if self._finalizer.detach() is not None:
            self._client._free_region(self._handle, raise_errors=True)

    def __repr__(self):
        return "<graphd.Region id=%d pool=%r size=%d%s>" % (self.id, self.pool, self.size,
                                                            " device" if self.is_device else "")


class PoolHandle:
    """A daemon graph pool, usable as make_graphed_callables(..., pool=handle). Graphs captured
    with the same pool name, from any process, share that daemon pool. device is None until the
    pool exists: a handle made without a device (as upstream's graph_pool_handle(), which has
    none) gets its pool on the device of the first callables graphed with it (bind)."""

    def __init__(self, name, device, owned=False, client=None):
        self.name = name
        self.device = device
        # Made by graph_pool_handle() without a name: deleted when this handle goes, which is
        # after every graph captured in it (each holds it), or with the session at the latest.
        self.owned = owned
        self._client = client
        if owned and device is not None:
            self._delete_when_gone(client)

    def _delete_when_gone(self, client):
        """An own pool lives as long as its handle, as upstream's private mempool lives as long
        as its handle and the graphs made in it. Else a process that graphs again and again
        would keep every pool, with its graphs' device memory, until it ends, and its 65th
        make_graphed_callables would fail on max_pools_per_uid."""
        c = client or default_client()
        weakref.finalize(self, c._pool_gone, self.name).atexit = False

    def bind(self, device, client=None):
        """The pool on device: made there (or found there, for a name that exists) if this
        handle has none yet. A handle whose pool is on another device keeps it (the caller
        compares). Returns self."""
        if self.device is None:
            c = self._client or client or default_client()
            self.device = _pool_on(c, self.name, c.check_device(device), self.owned,
                                   must_match=True)
            if self.owned:
                self._delete_when_gone(c)
        return self

    def __repr__(self):
        return "graphd.PoolHandle(%r, device=%r)" % (self.name, self.device)

    def __eq__(self, other):
        return isinstance(other, PoolHandle) and (self.name, self.device) == (other.name,
                                                                              other.device)

    def __hash__(self):
        return hash(self.name)  # the device may be set later (bind): not part of the hash


class Client:
    """A connection to graphd. address: a gRPC target ("unix:/path", or a bare path); default
    $GRAPHD_ADDRESS, else unix:/run/graphd/graphd.sock (libgraphd reads the settings: an invalid
    one is a graphd.InvalidArgument naming it). Connecting does no I/O: an absent daemon shows as
    graphd.Unavailable from the first call. Usable as a context manager. Calls are serialised by
    a lock, so one client may be shared between threads."""

    def __init__(self, address=None, name=None):
        L = _lib.lib()
        handle = ctypes.c_void_p()
        rc = L.graphd_connect(str(address).encode() if address else None, ctypes.byref(handle))
        if rc != 0:  # the message names the setting or the address at fault
            raise _error(rc, _lib.text(L.graphd_last_error(None)) or
                         "cannot make a client for %r" % (address,))
        self._h = handle
        self._lock = threading.RLock()
        self._name = name or "python:%s" % (os.path.basename(sys.argv[0] or "") or "python")
        self._session = False
        self._closed = False
        self.address = _lib.text(L.graphd_address(handle))
        self._recovery = recovery.State(self)  # what a daemon restart needs made again
        # (session id, the device ids its daemon serves) once a session has listed them: a
        # daemon serves the same devices while it runs, and a restart is a new session.
        self._served = (0, frozenset())
        self._pools_gone = []  # own pools whose handles went while they still held regions
        # The replay path's C functions and its out-parameter, looked up and made once: a
        # training step replays twice, and on the GPU machine every Python operation of that
        # path showed (docs/BENCHMARKS.md, "Step profile"). ns is only used under the lock.
        self._c_replay, self._c_replay_rpc = L.graphd_replay, L.graphd_replay_rpc
        self._c_replay_stream = L.graphd_replay_stream
        self._replay_ns = ctypes.c_uint64(0)
        self._replay_ns_ref = ctypes.byref(self._replay_ns)
        _clients.add(self)

    # ---- plumbing ----------------------------------------------------------------------

    def _fail(self, rc, what):
        msg = _lib.text(_lib.lib().graphd_last_error(self._h)) if self._h else ""
        return _error(rc, msg or what)

    def _check_open(self):
        if self._closed or not self._h:
            raise make_error("FAILED_PRECONDITION", "client for %s is closed" % self.address)

    def _ensure_session(self):
        if self._session:
            return
        rc = _lib.lib().graphd_hello(self._h, self._name.encode())
        if rc != 0:
            raise self._fail(rc, "Hello failed")
        self._session = True

    def _list(self, fn, struct):
        with self._lock:
            self._check_open()
            while True:
                count = ctypes.c_size_t(0)
                rc = fn(self._h, ctypes.byref(count), None)
                if rc != 0:
                    raise self._fail(rc, fn.__name__ + " failed")
                items = (struct * max(count.value, 1))()
                rc = fn(self._h, ctypes.byref(count), items)
                if rc == _lib.ETRUNC:
                    continue  # grew in between
                if rc != 0:
                    raise self._fail(rc, fn.__name__ + " failed")
                return list(items)[:count.value]

    @staticmethod
    def _struct_dict(s):
        out = {}
        for name, _ in s._fields_:
            v = getattr(s, name)
            out[name] = _lib.text(v) if isinstance(v, bytes) else v
        return out

    # ---- public API --------------------------------------------------------------------

    @property
    def session_id(self):
        """The open session's id, 0 when none is open."""
        with self._lock:
            return int(_lib.lib().graphd_session_id(self._h)) if self._h else 0

    @recovery.retrying
    def status(self):
        """The daemon's Status as plain dicts and lists: keys "daemon", "devices", "pools",
        "sessions", "graphs", "others", field names as in graphd.proto. Asked as this client's
        session (opened if need be): its uid's sessions and graphs and the pools it may use in
        full, the rest counted in "others" (root and the daemon's user see everything)."""
        L = _lib.lib()
        with self._lock:
            self._check_open()
            self._ensure_session()
            while True:
                need = ctypes.c_size_t(0)
                rc = L.graphd_status_json(self._h, None, ctypes.byref(need))
                if rc != 0:
                    raise self._fail(rc, "Status failed")
                buf = ctypes.create_string_buffer(need.value + 4096)
                size = ctypes.c_size_t(len(buf))
                rc = L.graphd_status_json(self._h, buf, ctypes.byref(size))
                if rc == _lib.ETRUNC:
                    continue
                if rc != 0:
                    raise self._fail(rc, "Status failed")
                return json.loads(buf.value.decode("utf-8"))

    @recovery.retrying
    def devices(self):
        """Devices the daemon serves: dicts with id, kind, name, compute_capability, ordinal,
        memory_total, memory_free, mps (bool: on a CUDA device, the daemon's contexts go
        through an NVIDIA MPS server, without which every cross-process ordering of a
        device-resident replay switches GPU contexts; False for CPU devices), and what Level Zero
        says of an xpu device: uuid, compute_units, max_clock_mhz, driver (None where the
        device's family does not say) and telemetry: None when the family reads none, else a dict
        with read_unix_ms, memory_free, memory_total, engine_active_us, utilisation (0..1),
        memory_health and wedged, each None when the driver does not report it (never a 0 standing
        in for "unknown")."""
        return [_device_dict(d) for d in self._list(_lib.lib().graphd_list_devices, _lib.Device)]

    @recovery.retrying
    def pools(self):
        """The pools this client's session (opened if need be) may use, with their accounting:
        dicts with name, device, limit_bytes, reserved_bytes, used_bytes, regions, sessions,
        created_unix_ms, graph_mempool_reserved_bytes, graph_mempool_in_use_bytes (CUDA pools:
        the graph mempool's device memory), owner_uid, owner_gid, mode ("private", "group",
        "public") and delete_with_session."""
        with self._lock:
            self._check_open()
            self._ensure_session()
        pools = [self._struct_dict(p) for p in self._list(_lib.lib().graphd_list_pools,
                                                           _lib.Pool)]
        names = {v: k for k, v in _lib.POOL_MODES.items()}
        for p in pools:
            p["mode"] = names.get(p["mode"], p["mode"])
            p["delete_with_session"] = bool(p["delete_with_session"])
        return pools

    @recovery.retrying
    def create_pool(self, name, device=None, limit_bytes=0, mode="private",
                    delete_with_session=False):
        """Creates a named pool (device default "cpu:0"; limit 0: the daemon's default) owned by
        this client's uid and returns it as a dict. mode: "private" (sessions of this uid may
        use it), "group" (also sessions of this gid) or "public". delete_with_session: the daemon
        deletes it when this client's session ends, however it ends. graphd.AlreadyExists,
        graphd.InvalidArgument, graphd.NotFound, graphd.ResourceExhausted (max_pools_per_uid)."""
        if mode not in _lib.POOL_MODES:
            raise ValueError("pool mode %r is not one of %s" % (mode, ", ".join(_lib.POOL_MODES)))
        info = _lib.Pool()
        with self._lock:
            self._check_open()
            self._ensure_session()
            flags = _lib.POOL_DELETE_WITH_SESSION if delete_with_session else 0
            rc = _lib.lib().graphd_pool_create_ex(self._h, name.encode(),
                                                  device.encode() if device else None,
                                                  int(limit_bytes), _lib.POOL_MODES[mode], flags,
                                                  ctypes.byref(info))
            if rc != 0:
                raise self._fail(rc, "CreatePool failed")
        d = self._struct_dict(info)
        self._recovery.pool_created(name, dict(device=d["device"], limit_bytes=limit_bytes,
                                               mode=mode,
                                               delete_with_session=delete_with_session))
        d["mode"] = mode
        d["delete_with_session"] = bool(d["delete_with_session"])
        return d

    @recovery.retrying
    def delete_pool(self, name):
        """Deletes an empty pool this client's uid owns (root and the daemon's user may delete
        any but the default pool). graphd.NotFound; graphd.PermissionDenied for another uid's
        pool; graphd.FailedPrecondition while it holds regions."""
        with self._lock:
            self._check_open()
            self._ensure_session()
            rc = _lib.lib().graphd_pool_delete(self._h, name.encode())
            if rc != 0:
                raise self._fail(rc, "DeletePool failed")
            self._recovery.pool_deleted(name)

    def _pool_gone(self, name):
        """The handle of pool name, one of this process's own, went (a finalizer): deletes the
        pool. One that still holds regions (its handle and its graphs collected together, the
        handle first) is tried again before the next own pool is made."""
        if _exiting:
            return  # the process is going: the daemon deletes it with the session
        with self._lock:
            self._recovery.pool_deleted(name)  # a restored session does without it too
            if self._closed or not self._h or not self._session:
                return  # the daemon deleted it with the session
            rc = _lib.lib().graphd_pool_delete(self._h, name.encode())
            if rc != 0 and self._fail(rc, "").code == "FAILED_PRECONDITION":
                self._pools_gone.append(name)
            # else deleted, or gone with a daemon that went away

    def _delete_pools_gone(self):
        with self._lock:  # a finalizer on another thread may be adding one
            names, self._pools_gone = self._pools_gone, []
            for name in names:
                self._pool_gone(name)

    def check_device(self, device):
        """The canonical id of device ("cpu" => "cpu:0"); graphd.NotFound when the daemon does
        not serve it."""
        dev = normalize_device(device)
        if dev == "cpu:0":
            return dev
        sid = self.session_id
        if sid and self._served[0] == sid and dev in self._served[1]:
            return dev  # no devices() RPC for every capture (it reads each device's memory)
        ids = [d["id"] for d in self.devices()]
        if sid:
            self._served = (sid, frozenset(ids))
        if dev not in ids:
            raise make_error("NOT_FOUND", "graphd at %s has no device %r (it serves: %s)" %
                             (self.address, dev, ", ".join(ids) or "none"))
        return dev

    def close(self):
        """Ends the session (the daemon frees its regions and graphs) and closes the libgraphd
        client. Graphs and Regions still alive keep their memory mapped here until they go;
        their replays raise graphd.FailedPrecondition. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            L = _lib.lib()
            if self._session:  # the daemon deletes this session's own pools with it
                L.graphd_goodbye(self._h)
                self._session = False
            L.graphd_close(self._h)  # live graph and region handles keep what they map
            self._h = None

    def __del__(self):
        if not _exiting and not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<graphd.Client %s%s>" % (self.address, " closed" if self._closed else "")

    @recovery.retrying
    def alloc_region(self, size, pool=None, device=False):
        """Allocates a shared region of size bytes for this client's session in pool (a
        PoolHandle, a pool name, or None: the daemon's default pool) and maps it here: host
        memory, or with device=True device memory of the pool's device, opened here with IPC
        (graphd.InvalidArgument for a pool that is not on a device). device may also name the
        device ("xpu:0", "cuda:0"): with pool None the region goes to this uid's owner-only pool
        on that device (regions-<device>-<uid>, made if need be); a pool named on another device
        is a ValueError. An xpu region is mapped through Level Zero in this process's own
        context (graphd.FailedPrecondition naming the package, libze1, when the loader is
        missing). Returns a Region (read/write for device memory). graphd.ResourceExhausted past
        the pool's limit."""
        if isinstance(device, str) or (device not in (False, True, None, 0, 1)
                                       and hasattr(device, "type")):
            dev = self.check_device(device)
            if dev.startswith("cpu"):
                raise ValueError("graphd: device=%r is the host: use device=False for a host "
                                 "region" % (device,))
            if pool is None:
                pool = "regions-%s-%d" % (dev.replace(":", ""), os.getuid())
                _pool_on(self, pool, dev, False, True)
            else:
                name = pool.name if isinstance(pool, PoolHandle) else pool
                info = next((p for p in self.pools() if p["name"] == name), None)
                if info is not None and info["device"] != dev:
                    raise ValueError("graphd pool %r is on %s, not %s" % (name, info["device"],
                                                                           dev))
            device = True
        pool_name = pool.name if isinstance(pool, PoolHandle) else pool
        L = _lib.lib()
        fn = L.graphd_region_alloc_device if device else L.graphd_region_alloc
        handle = ctypes.c_void_p()
        with self._lock:
            self._check_open()
            self._ensure_session()
            rc = fn(self._h, pool_name.encode() if pool_name else None, int(size),
                    ctypes.byref(handle))
            if rc != 0:
                raise self._fail(rc, "AllocRegion failed")
            region = Region(self, handle, pool_name)
            self._recovery.region_allocated(region)
            return region

    def _free_region(self, handle, raise_errors=False):
        if _exiting:
            return  # the process is going: the daemon reclaims on EOF
        with self._lock:
            if not self._h:  # closed: the daemon freed the region with the session
                _lib.lib().graphd_region_release(handle)
                return
            rc = _lib.lib().graphd_region_free(self._h, handle)
            if rc != 0 and raise_errors and self._session:
                raise self._fail(rc, "FreeRegion failed")

    # ---- modules and graphs (used by graphd.make_graphed_callables) --------------------

    @recovery.retrying
    def register_module(self, archive, name=None):
        """Registers a TorchScript archive (bytes) for this client's session; returns its id."""
        mid = ctypes.c_uint64(0)
        fn = _lib.lib().graphd_module_register
        with self._lock:
            self._check_open()
            self._ensure_session()
            rc = fn(self._h, archive, len(archive), name.encode()[:63] if name else None,
                    ctypes.byref(mid))
            if rc != 0:
                raise self._fail(rc, "RegisterModule failed")
        self._recovery.module_registered(int(mid.value), archive, name)
        return int(mid.value)

    def release_module(self, module_id):
        fn = _lib.lib().graphd_module_release
        with self._lock:
            self._check_open()
            rc = fn(self._h, self._recovery.module_released(int(module_id)))
            if rc != 0:
                raise self._fail(rc, "ReleaseModule failed")

    @recovery.retrying
    def capture(self, callables, num_warmup_iters=3, allow_unused_input=False, pool=None,
                device_resident=False, copy_param_grads=False):
        """Captures callables, a list of (module_id, method or None, [(dtype code, shape,
        requires_grad), ...]), in one Capture call sharing one pool (a PoolHandle, a pool name,
        or None: the daemon's default pool). Returns one Graph per callable. device_resident:
        the static tensors in device memory of the pool's CUDA device, mapped here with CUDA IPC
        (each Graph.tensors entry then has on_device = 1 and data a device pointer); their
        parameter gradients stay in the daemon's graph mempool, where a later replay in the
        pool may overwrite them, unless copy_param_grads (BACKWARD then copies them into the
        graph's own region)."""
        n = len(callables)
        cs = (_lib.Callable * n)()
        keep = []
        for i, (module_id, method, specs) in enumerate(callables):
            arr = (_lib.TensorSpec * max(len(specs), 1))()
            for j, (dtype, shape, requires_grad) in enumerate(specs):
                if len(shape) > _lib.GRAPHD_MAX_DIMS:
                    raise make_error("INVALID_ARGUMENT", "sample arg %d of callable %d has %d "
                                     "dimensions, at most %d" % (j, i, len(shape),
                                                                 _lib.GRAPHD_MAX_DIMS))
                arr[j].dtype = dtype
                arr[j].ndim = len(shape)
                for k, s in enumerate(shape):
                    arr[j].shape[k] = int(s)
                arr[j].requires_grad = 1 if requires_grad else 0
            keep.append(arr)
            cs[i].module_id = self._recovery.module_id(module_id)
            cs[i].method = method.encode() if method else None
            cs[i].n_args = len(specs)
            cs[i].args = arr
        opts = _lib.CaptureOpts()
        _lib.lib().graphd_capture_opts_init(ctypes.byref(opts))
        opts.num_warmup_iters = int(num_warmup_iters)
        opts.allow_unused_input = 1 if allow_unused_input else 0
        opts.device_resident = 1 if device_resident else 0
        opts.copy_param_grads = 1 if copy_param_grads else 0
        pool_name = pool.name if isinstance(pool, PoolHandle) else pool
        opts.pool = pool_name.encode() if pool_name else None
        handles = (ctypes.c_void_p * n)()
        fn = _lib.lib().graphd_capture
        with self._lock:
            self._check_open()
            self._ensure_session()
            rc = fn(self._h, n, cs, ctypes.byref(opts), handles)
            if rc != 0:
                raise self._fail(rc, "Capture failed")
        graphs = []
        try:
            for i in range(n):
                graphs.append(Graph(self, ctypes.c_void_p(handles[i]), pool))
                graphs[-1].copy_param_grads = bool(copy_param_grads)
        except BaseException:
            for i in range(len(graphs), n):
                self._release_graph(ctypes.c_void_p(handles[i]))
            raise
        self._recovery.captured(callables, dict(
            num_warmup_iters=num_warmup_iters, allow_unused_input=allow_unused_input, pool=pool,
            device_resident=device_resident, copy_param_grads=copy_param_grads), graphs)
        return graphs

    def _replay(self, handle, phase, rpc, stream=None):
        """One replay: stream-ordered when stream (a cudaStream_t as int) is given, else the REPLAY
        frame or, with rpc, the gRPC Replay."""
        if stream is not None:  # an int; 0 (the default stream) goes as NULL
            return self._post(handle, int(phase), int(stream))
        with self._lock:
            if self._closed or not self._h:
                self._check_open()
            if rpc:
                rc = self._c_replay_rpc(handle, int(phase), self._replay_ns_ref)
            else:
                rc = self._c_replay(handle, int(phase), self._replay_ns_ref)
            if rc != 0:
                raise self._fail(rc, "Replay failed")
            return self._replay_ns.value

    def _post(self, handle, phase, stream):
        """A stream-ordered replay (phase an int, stream a cudaStream_t as int): a
        device-resident graph's. _Runner.replay, which issues one twice in every training step,
        carries this body inline (graphs.py): a change here goes there too. Returns what the
        daemon reports as its launch time (0 when posted)."""
        with self._lock:
            if self._closed or not self._h:
                self._check_open()
            rc = self._c_replay_stream(handle, phase, stream, self._replay_ns_ref)
            if rc != 0:
                raise self._fail(rc, "Replay failed")
            return self._replay_ns.value

    def set_replay_posted(self, posted):
        """Stream-ordered replays posted (True, the default unless GRAPHD_REPLAY_ORDER=events):
        ordered by sequence counters, no answer waited for, a failure raised at a later replay;
        or (False) ordered by CUDA IPC events, each call waiting for the daemon's launch.
        Returns the previous setting."""
        with self._lock:
            self._check_open()
            return bool(_lib.lib().graphd_set_replay_posted(self._h, 1 if posted else 0))

    def _release_graph(self, handle):
        if _exiting:
            return  # the process is going: the daemon reclaims on EOF
        with self._lock:  # also after close(): the handle holds the libgraphd client
            _lib.lib().graphd_graph_release(handle)


_default = None
_default_lock = threading.Lock()


def default_client():
    """The process-wide client (address from $GRAPHD_ADDRESS), made on first use and closed at
    exit."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = Client()
        return _default


def graph_pool_handle(name=None, device=None, client=None):
    """A pool token for make_graphed_callables(pool=...). With a name, that daemon pool (created
    when missing): the same name from several processes shares one pool. Without one, a new
    pool private to this process's uid, deleted when the handle and every graph captured in it
    are gone, and by the daemon when its client's session ends at the latest (however the
    process ends). device: a device the daemon
    serves ("cpu", "cuda:0", ...), where the pool is made now (a named pool that exists on
    another device is a ValueError); None, as upstream's handle, which has no device: a named
    pool that exists stays where it is, and otherwise the pool is made on the device of the
    first callables graphed with the handle, so that one handle serves several
    make_graphed_callables calls on CUDA modules as upstream's does."""
    c = client or default_client()
    owned = name is None
    if owned:
        name = "py-%d-%s" % (os.getpid(), secrets.token_hex(6))
    if device is None:
        info = None if owned else next((p for p in c.pools() if p["name"] == name), None)
        return PoolHandle(name, info["device"] if info else None, owned, c)
    return PoolHandle(name, _pool_on(c, name, c.check_device(device), owned, True), owned, c)


def _own_pool_on(c, name, dev):
    """Makes pool name, one of this process's own, on device dev. At the daemon's
    max_pools_per_uid, the pools of handles that are garbage but not yet collected (graphed
    modules and their graphs refer to each other, so only the cycle collector frees them) are
    deleted first: as the CUDA caching allocator frees its cache and tries again before an
    out-of-memory error."""
    c._delete_pools_gone()
    try:
        return c.create_pool(name, dev, delete_with_session=True)
    except GraphdError as e:
        if e.code != "RESOURCE_EXHAUSTED":
            raise
    gc.collect()  # runs the finalizers of own pools' handles: PoolHandle._delete_when_gone
    c._delete_pools_gone()
    return c.create_pool(name, dev, delete_with_session=True)


def _pool_on(c, name, dev, owned, must_match):
    """Makes pool name on device dev (owned: one of this process's own, _own_pool_on) or, for a
    name that exists, finds it; returns the pool's device. ValueError when it exists on another
    device and must_match."""
    if owned:
        return _own_pool_on(c, name, dev)["device"]
    try:
        info = c.create_pool(name, dev)
    except GraphdError as e:
        if e.code != "ALREADY_EXISTS":
            raise
        info = next((p for p in c.pools() if p["name"] == name), None)
        if info is None:  # deleted in between, or another uid's pool this one may not use
            try:
                info = c.create_pool(name, dev)
            except GraphdError as e2:
                if e2.code != "ALREADY_EXISTS":
                    raise
                raise make_error("PERMISSION_DENIED", "graphd pool %r exists and belongs to "
                                 "another user: this uid may not use it; choose another name"
                                 % name) from None
        elif must_match and info["device"] != dev:
            raise ValueError("graphd pool %r is on %s, not %s" % (name, info["device"], dev))
    return info["device"]


def _device_dict(s):
    """A graphd_device_t as Client.devices() gives it: absent values None, not 0."""
    def text(v):
        return _lib.text(v) or None

    d = {"id": _lib.text(s.id), "kind": _lib.text(s.kind), "name": _lib.text(s.name),
         "compute_capability": _lib.text(s.compute_capability), "ordinal": s.ordinal,
         "memory_total": s.memory_total, "memory_free": s.memory_free, "mps": bool(s.mps),
         "uuid": text(s.uuid), "compute_units": s.compute_units or None,
         "max_clock_mhz": s.max_clock_mhz or None, "driver": text(s.driver), "telemetry": None}
    if s.have_telemetry:
        d["telemetry"] = {
            "read_unix_ms": s.telemetry_read_unix_ms,
            "memory_free": s.telemetry_memory_free if s.have_memory else None,
            "memory_total": s.telemetry_memory_total if s.have_memory else None,
            "engine_active_us": s.engine_active_us if s.have_engine else None,
            "utilisation": s.utilisation if s.have_utilisation else None,
            "memory_health": text(s.memory_health),
            "wedged": bool(s.wedged) if s.have_reset else None,
        }
    return d


def _close_all():
    global _exiting
    for c in list(_clients):
        try:
            c.close()
        except Exception:  # the daemon may be gone already; nothing to tell anyone at exit
            pass
    _exiting = True


atexit.register(_close_all)
