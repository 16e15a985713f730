"""A Client's way through a daemon restart: what it made in its session, and how it makes it again.

When the daemon goes away under a call (killed, restarted: UNAVAILABLE from an RPC, EOF or a reset
on the session socket), the client reconnects with backoff for up to GRAPHD_TIMEOUT_MS, opens a new
session and restores what its session had, from what it kept here:
- the pools it created (same names, devices, limits, modes, delete_with_session);
- the modules it has registered (their archives are kept until released);
- its graphs: each Capture call again, in the same pool with the same options, after which each
  Graph object takes the new graph's handle, id and static tensors. The old static tensors are
  memfds mapped here, so they outlived the daemon: their bytes (parameters, buffers, RNG state,
  inputs and gradients) are copied into the new ones, and whoever uses the graph is told
  (graphd.make_graphed_callables' runners rebind the module's parameters, buffers and sample args
  to the new static tensors with `t.data = view`: the Parameter objects an optimizer holds stay
  the same, so its references and its state stay valid). The old mappings stay until the Graph
  goes, since tensors the user still holds (outputs, p.grad) may point into them;
- its host regions (Client.alloc_region): allocated again, same pool and size, their bytes copied;
  Region.ptr and Region.id change;
then it retries the failed call once. Device-resident graphs and device regions cannot be
restored: their memory was the daemon's, so their next use raises graphd.FailedPrecondition
saying so (re-create the graphed callables).

A daemon that does not answer within GRAPHD_TIMEOUT_MS (stopped with SIGSTOP, hung) is a
graphd.DeadlineExceeded naming its pid, when the socket says it; nothing is retried then, and the
next call restores the session once the daemon answers again (SIGCONT) or a new one runs.
"""
import ctypes
import functools
import socket
import time
import weakref

from . import _lib
from .errors import GraphdError, make_error

_LOST_CODES = ("UNAVAILABLE",)


class Recovered(Exception):
    """Internal: the session was restored under a replay that its caller retries itself (a
    graphed callable re-runs a FORWARD first when a BACKWARD lost its saved activations)."""


def retrying(method):
    """Client method decorator: when the call fails because the daemon went away, the session is
    restored (State.recover_or_raise) and the call made once more."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except GraphdError as e:
            self._recovery.recover_or_raise(e)
        return method(self, *args, **kwargs)
    return wrapper


def replay(graph, phase, rpc, stream, recover):
    """Graph.replay with recovery: recover True restores a lost session and retries once; "raise"
    restores it and raises Recovered for the caller to retry; False only raises."""
    if graph._lost:
        raise make_error("FAILED_PRECONDITION", graph._lost)
    client = graph._client
    try:
        return client._replay(graph._handle, phase, rpc, stream)
    except GraphdError as e:
        if not recover:
            raise
        if recover == "raise":
            failed(graph, e)
        client._recovery.recover_or_raise(e)
    if graph._lost:
        raise make_error("FAILED_PRECONDITION", graph._lost)
    return client._replay(graph._handle, phase, rpc, stream)


def failed(graph, e):
    """A replay of graph failed with e: raises e, or, where the daemon was restarted and the
    session restored, Recovered for the caller to retry on the new graph."""
    graph._client._recovery.recover_or_raise(e)
    raise Recovered()


def _daemon_silent(e):
    """True when e is the daemon not answering in time: gRPC's deadline, or libgraphd's on the
    session socket. A DEADLINE_EXCEEDED the daemon sent (a bound such as max_load_ms, named in
    its message) or a replay connection's (an executor's) is not."""
    return e.code == "DEADLINE_EXCEEDED" and (
        e.message.lower() == "deadline exceeded"
        or e.message.startswith("no answer on the session socket"))


def _peer_pid(address):
    """The pid of the process listening on a unix address (SO_PEERCRED of a connection the
    kernel completes even while that process is stopped); None when it cannot be told."""
    if not address.startswith("unix:"):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(address[5:])
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        pid = int.from_bytes(cred[:4], "little", signed=True)
        return pid if pid > 0 else None
    except OSError:
        return None
    finally:
        s.close()


def _release_all(client, handles):
    for h in handles:
        client._release_graph(h)


class _Capture:
    """One Capture call to make again: its callables (archive, name, method, arg specs), options
    and pool, and its Graphs (weakly: a graph that went is captured again but released)."""

    def __init__(self, modules, kwargs, graphs):
        self.modules = modules
        pool = kwargs.get("pool")
        if pool is not None and not isinstance(pool, str):
            # A PoolHandle: its graphs hold it, this record only while they live (an own pool
            # is deleted when its handle goes: client.PoolHandle)
            kwargs = dict(kwargs, pool=weakref.ref(pool))
        self.kwargs = kwargs
        self.graphs = [weakref.ref(g) for g in graphs]

    def capture_kwargs(self):
        """The Capture call's options, its pool a PoolHandle again where it was one."""
        pool = self.kwargs.get("pool")
        if isinstance(pool, weakref.ref):
            return dict(self.kwargs, pool=pool())
        return self.kwargs


class State:
    """What a Client keeps to restore its session (Client._recovery)."""

    def __init__(self, client):
        self._client = weakref.ref(client)
        self.timeout_ms = int(_lib.setting("GRAPHD_TIMEOUT_MS"))
        self.pools = {}       # name => create_pool kwargs, in creation order
        self.modules = {}     # id the caller knows => [archive, name, id in this session]
        self.captures = []    # _Capture
        self.regions = weakref.WeakSet()
        self.active = False   # restoring now: a failure is raised, not recovered from
        self.restores = 0     # sessions restored so far (tests and logs)

    # ---- bookkeeping hooks (Client) ------------------------------------------------------

    def pool_created(self, name, kwargs):
        if not self.active:
            self.pools[name] = kwargs

    def pool_deleted(self, name):
        self.pools.pop(name, None)

    def module_registered(self, mid, archive, name):
        if not self.active:
            self.modules[mid] = [archive, name, mid]

    def module_released(self, mid):
        """The id to release in this session (the caller's id when it was not re-registered)."""
        entry = self.modules.pop(mid, None)
        return entry[2] if entry else mid

    def module_id(self, mid):
        entry = self.modules.get(mid)
        return entry[2] if entry else mid

    def captured(self, callables, kwargs, graphs):
        if self.active:
            return
        modules = []
        for module_id, method, specs in callables:
            entry = self.modules.get(module_id)
            if entry is None:  # not registered through this client: cannot be made again
                return
            modules.append((entry[0], entry[1], method, list(specs)))
        self.captures = [c for c in self.captures if any(r() is not None for r in c.graphs)]
        self.captures.append(_Capture(modules, kwargs, graphs))

    def region_allocated(self, region):
        self.regions.add(region)

    # ---- deciding ------------------------------------------------------------------------

    def _not_answering(self, e):
        c = self._client()
        pid = _peer_pid(c.address)
        who = "graphd (pid %d)" % pid if pid else "graphd"
        return make_error(
            "DEADLINE_EXCEEDED",
            "%s at %s is not answering: no reply within %d ms (GRAPHD_TIMEOUT_MS); it is "
            "stopped (SIGSTOP), hung or overloaded. Resume it (kill -CONT), or restart it: this "
            "client restores its session at its next call once a daemon answers there (%s)"
            % (who, c.address, self.timeout_ms, e.message), e.errno)

    def _session_lost(self, e):
        """True when e means this client's session is gone with its daemon."""
        c = self._client()
        L = _lib.lib()
        if not L.graphd_session_id(c._h):
            return True  # libgraphd ended it: the session socket closed or went out of step
        if e.code == "NOT_FOUND" and e.message.startswith("no such session"):
            # A daemon that does not know this session: a new one on the same socket, reached by
            # an RPC before this client read the old session socket's EOF (gRPC reconnects on
            # its own), or the same daemon, which ended it. The session token makes sure it is
            # never another client's session of the same id.
            return True
        if e.code not in _LOST_CODES:
            return False
        # UNAVAILABLE with the session socket seemingly open: an RPC found no daemon, or a replay
        # connection closed (an executor died). The daemon's Status tells which.
        sid = int(L.graphd_session_id(c._h))
        try:
            st = c.status.__wrapped__(c)
        except GraphdError as e2:
            if _daemon_silent(e2):
                raise self._not_answering(e2) from None
            return e2.code in _LOST_CODES or not L.graphd_session_id(c._h)
        return not any(int(s.get("id", 0)) == sid for s in st.get("sessions", []))

    def recover_or_raise(self, e):
        """Returns once the session is restored after e, when e means the daemon went away;
        otherwise raises e, or for a daemon that does not answer, graphd.DeadlineExceeded."""
        c = self._client()
        if self.active or c is None or c._closed or not c._session:
            raise e
        if _daemon_silent(e):
            raise self._not_answering(e) from None
        gen = self.restores
        with c._lock:  # one thread restores; the others find it done
            if self.restores != gen:
                return
            if not self._session_lost(e):
                raise e
            self.recover(e)

    # ---- restoring -----------------------------------------------------------------------

    def _connect(self):
        """A new libgraphd client with a new session, or a GraphdError."""
        c = self._client()
        L = _lib.lib()
        h = ctypes.c_void_p()
        rc = L.graphd_connect(c.address.encode(), ctypes.byref(h))
        if rc != 0:
            raise _lib_error(rc, _lib.text(L.graphd_last_error(None)))
        rc = L.graphd_hello(h, c._name.encode())
        if rc != 0:
            err = _lib_error(rc, _lib.text(L.graphd_last_error(h)))
            L.graphd_close(h)
            raise err
        return h

    def recover(self, cause):
        """Reconnects with backoff (up to GRAPHD_TIMEOUT_MS) and restores the session (under the
        client's lock)."""
        c = self._client()
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        delay = 0.02
        while True:
            try:
                h = self._connect()
                break
            except GraphdError as e:
                if _daemon_silent(e):
                    raise self._not_answering(e) from None
                if e.code not in _LOST_CODES:
                    raise
                last = e
            if time.monotonic() + delay >= deadline:
                raise make_error(
                    "UNAVAILABLE",
                    "graphd at %s went away (%s) and no daemon answered there within %d ms "
                    "(GRAPHD_TIMEOUT_MS): start it again (systemctl start graphd) or raise "
                    "GRAPHD_TIMEOUT_MS; the next call tries again (last: %s)"
                    % (c.address, cause.message, self.timeout_ms, last.message)) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        old, c._h = c._h, h
        c._session = True
        # Ends the old session where its daemon still runs (resumed after SIGCONT); the old graph
        # and region handles keep their mappings until they are released.
        _lib.lib().graphd_close(old)
        self.active = True
        try:
            self._restore(c)
        finally:
            self.active = False
        self.restores += 1

    def _restore(self, c):
        # A copy: a pool's handle may go (its finalizer: pool_deleted) while this runs
        for name, kw in list(self.pools.items()):
            if name not in self.pools:
                continue
            try:
                c.create_pool(name, **kw)
            except GraphdError as e:
                if e.code != "ALREADY_EXISTS":
                    raise
        for mid, entry in self.modules.items():  # registered and not yet released
            entry[2] = c.register_module(entry[0], entry[1])
        self.captures = [r for r in self.captures if any(g() is not None for g in r.graphs)]
        for rec in self.captures:
            self._recapture(c, rec)
        for region in list(self.regions):
            _realloc(c, region)

    def _recapture(self, c, rec):
        graphs = [r() for r in rec.graphs]
        if rec.kwargs.get("device_resident"):
            for g in graphs:
                if g is not None:
                    g._lost = _DEVICE_LOST % (g.id, g.device or "its device")
            return
        kwargs = rec.capture_kwargs()
        pool = kwargs.get("pool")
        if hasattr(pool, "device") and pool.name not in self.pools and pool.device:
            try:  # a pool another process made: make it again (it may be back already)
                c.create_pool(pool.name, pool.device)
            except GraphdError as e:
                if e.code != "ALREADY_EXISTS":
                    raise
        mids = [c.register_module(archive, name) for archive, name, _, _ in rec.modules]
        try:
            new = c.capture([(m, method, specs) for m, (_, _, method, specs)
                             in zip(mids, rec.modules)], **kwargs)
        finally:
            for m in mids:
                c.release_module(m)
        for g, n in zip(graphs, new):
            if g is None:
                continue  # n is released when it goes
            _transplant(c, g, n)
        for g in graphs:
            runner = g and g._runner and g._runner()
            if runner is not None:
                runner.recovered()


_DEVICE_LOST = ("graphd: graph %d was device-resident on %s: its device memory went with the "
                "daemon, which was restarted, so it cannot be restored. Re-create the graphed "
                "callables (graphd.make_graphed_callables) from the module, whose parameters "
                "are still here, and re-create the optimizer if it holds device state")


def _lib_error(rc, message):
    L = _lib.lib()
    return make_error(_lib.text(L.graphd_err_name(rc)) or "UNKNOWN",
                      message or _lib.text(L.graphd_strerror(rc)), rc)


def _transplant(c, g, n):
    """Graph g takes new graph n's handle, id and static tensors, with the bytes of its old
    static tensors; g keeps its old handles (their mappings) until it goes."""
    old = {(d.role, d.index): d for d in g.tensors}
    for d in n.tensors:
        o = old.get((d.role, d.index))
        if o is None or not o.data or not d.data or o.on_device or d.on_device:
            continue
        ctypes.memmove(d.data, o.data, min(o.nbytes, d.nbytes))
    handles = list(getattr(g, "_old_handles", [])) + [g._handle]
    g._finalizer.detach()
    n._finalizer.detach()
    g._old_handles = handles
    g._handle, g.id, g.tensors = n._handle, n.id, n.tensors
    g._finalizer = weakref.finalize(g, _release_all, c, [n._handle] + handles)
    g._finalizer.atexit = False


class _Gone:
    pass


def _finished():
    """A weakref.finalize that has run (detach() gives None)."""
    f = weakref.finalize(_Gone(), lambda: None)
    f()
    return f


def _realloc(c, region):
    """A host region allocated again in the new session with the old bytes; a device region is
    left lost (its memory was the daemon's)."""
    if region._finalizer.detach() is None:
        return  # freed already
    # The old handle belongs to the old client: only unmapped, when the Region goes (FreeRegion
    # would reach the new session, and a region there with the same id).
    keep = weakref.finalize(region, _lib.lib().graphd_region_release, region._handle)
    keep.atexit = False
    if region.is_device:  # lost: free() has nothing to free, the old mapping goes with it
        region._finalizer = _finished()
        return
    new = c.alloc_region(region.size, region.pool)
    if region.ptr and new.ptr:
        ctypes.memmove(new.ptr, region.ptr, region.size)
    new._finalizer.detach()
    region._handle, region.id, region.ptr = new._handle, new.id, new.ptr
    region.mapped_size = new.mapped_size
    region._finalizer = weakref.finalize(region, c._free_region, new._handle)
    region._finalizer.atexit = False
