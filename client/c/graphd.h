/*
 * libgraphd: the C client of graphd. It opens a session with the daemon over
 * gRPC (control plane), attaches the per-session Unix socket (data plane),
 * and maps the daemon's shared regions into the caller.
 *
 * Conventions, so that the library wraps cleanly with Python ctypes:
 * - every function returns an int error code (0 = GRAPHD_OK, errors < 0) or
 *   a plain value; handles are opaque pointers; no global mutable state;
 * - outputs go to caller-owned buffers; lists use the two-call pattern:
 *   items NULL ⇒ *count gets the number of items; otherwise up to *count
 *   items are filled, *count gets the total, and GRAPHD_ETRUNC says the
 *   buffer was too small;
 * - a client is not thread-safe: use it from one thread at a time (separate
 *   clients are independent and may be used from different threads);
 * - after a failed call, graphd_last_error(c) has the daemon's message (or a
 *   local one) until the next call on that client; the calls without a
 *   client (graphd_connect, graphd_setting) keep theirs per thread, read with
 *   graphd_last_error(NULL);
 * - lifetimes: a client is referenced by its caller until graphd_close and by
 *   each open region and graph handle; graphd_close ends the session at once,
 *   and the client's memory, with every mapping, goes with the last release
 *   (see graphd_close).
 *
 * Settings come from the environment (GRAPHD_ADDRESS, GRAPHD_TIMEOUT_MS,
 * GRAPHD_SPIN_US, GRAPHD_TLS_CA, GRAPHD_REPLAY_ORDER, GRAPHD_COPY_PARAM_GRADS, and the
 * Python package's GRAPHD_TRACE_CACHE and GRAPHD_TRACE_CACHE_DIR),
 * all read through one table in libgraphd (settings.c) and documented in one
 * table: client/python/README.md, "Settings (environment)". graphd_connect
 * reads them anew each time; graphd_setting gives any of them.
 */
#ifndef GRAPHD_H
#define GRAPHD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GRAPHD_DEFAULT_ADDRESS "unix:/run/graphd/graphd.sock"
#define GRAPHD_PROTOCOL_VERSION 1

/*
 * X(name, value, grpc status code, message). The gRPC-backed codes are
 * GRAPHD_E<STATUS> = -<status code>, so a daemon status maps one to one; the
 * client-local codes have no gRPC status (-1).
 */
#define GRAPHD_ERR_MAP(X)                                                                          \
    X(OK, 0, 0, "success")                                                                         \
    X(ECANCELLED, -1, 1, "call cancelled")                                                         \
    X(EUNKNOWN, -2, 2, "unknown error")                                                            \
    X(EINVALID_ARGUMENT, -3, 3, "invalid argument")                                                \
    X(EDEADLINE_EXCEEDED, -4, 4, "deadline exceeded")                                              \
    X(ENOT_FOUND, -5, 5, "not found")                                                              \
    X(EALREADY_EXISTS, -6, 6, "already exists")                                                    \
    X(EPERMISSION_DENIED, -7, 7, "permission denied")                                              \
    X(ERESOURCE_EXHAUSTED, -8, 8, "resource exhausted")                                            \
    X(EFAILED_PRECONDITION, -9, 9, "failed precondition")                                          \
    X(EABORTED, -10, 10, "aborted")                                                                \
    X(EOUT_OF_RANGE, -11, 11, "out of range")                                                      \
    X(EUNIMPLEMENTED, -12, 12, "not implemented by the daemon")                                    \
    X(EINTERNAL, -13, 13, "internal daemon error")                                                 \
    X(EUNAVAILABLE, -14, 14, "daemon unavailable")                                                 \
    X(EDATA_LOSS, -15, 15, "data loss")                                                            \
    X(EUNAUTHENTICATED, -16, 16, "unauthenticated")                                                \
    X(ESYS, -100, -1, "system call failed")                                                        \
    X(EPROTO, -101, -1, "data-plane protocol error")                                               \
    X(ENOMEM, -102, -1, "out of memory")                                                           \
    X(ETRUNC, -103, -1, "buffer too small")

typedef enum graphd_err {
#define GRAPHD_ERR_ENUM(name, value, grpc, msg) GRAPHD_##name = value,
    GRAPHD_ERR_MAP(GRAPHD_ERR_ENUM)
#undef GRAPHD_ERR_ENUM
} graphd_err_t;

/* A static description of err ("unknown error code" for values not in the map). */
const char *graphd_strerror(int err);
/* "INVALID_ARGUMENT" for gRPC-backed codes, "ESYS" etc. for local ones, "OK" for 0. */
const char *graphd_err_name(int err);
/* The error for a gRPC status code: 0 ⇒ GRAPHD_OK, unknown codes ⇒ GRAPHD_EUNKNOWN. */
int graphd_err_from_grpc(int grpc_status);
/* The gRPC status code behind err, or -1 for client-local codes. */
int graphd_err_to_grpc(int err);

/* libgraphd's version ("0.1.0"): the VERSION file it was built from, as the daemon's. */
const char *graphd_version(void);

/*
 * The effective value of the client setting name ("GRAPHD_TIMEOUT_MS"), read from the
 * environment now: its default when unset or empty, else the value checked and normalized
 * ("007" => "7", "/path" => "unix:/path"). Two-call: with buf NULL, *len gets the bytes needed
 * (NUL included); with buf too small, the same and GRAPHD_ETRUNC. GRAPHD_ENOT_FOUND for a name
 * not in the table; GRAPHD_EINVALID_ARGUMENT for a value it does not accept, with
 * graphd_last_error(NULL) naming the variable, the value and what is accepted (graphd_connect
 * fails with the same message).
 */
int graphd_setting(const char *name /* [in] */, char *buf /* [out][optional] */,
                   size_t *len /* [in,out] */);
/* The name of the index-th client setting, NULL past the last: for listing them all. */
const char *graphd_setting_name(size_t index);

typedef struct graphd_client graphd_client_t;
typedef struct graphd_region graphd_region_t;

typedef struct graphd_device {
    char id[64]; /* "cpu:0", "cuda:0", "xpu:0" */
    char kind[16];
    char name[128];
    char compute_capability[32];
    uint32_t ordinal;
    uint64_t memory_total; /* bytes */
    uint64_t memory_free;  /* bytes */
    /* cuda: 1 when the daemon's contexts on it go through an NVIDIA MPS server (else every
     * cross-process ordering of a device-resident replay switches GPU contexts); 0 for cpu. */
    int mps;
    /* xpu (Level Zero); "" or 0 where the device's family does not say */
    char uuid[40];          /* 32 lower-case hex digits */
    uint32_t compute_units; /* slices x subslices x EUs per subslice */
    uint32_t max_clock_mhz;
    char driver[96]; /* "Level Zero <api major>.<minor>, driver <version>" */
    /* Telemetry the driver reported (xpu: Sysman). have_telemetry 0: the family reads none. Each
     * value counts only with its presence flag: a value the driver does not have is absent. */
    int have_telemetry;
    uint64_t telemetry_read_unix_ms;
    int have_memory;
    uint64_t telemetry_memory_free; /* bytes */
    uint64_t telemetry_memory_total;
    int have_engine;
    uint64_t engine_active_us; /* cumulative busy time of the device's engines */
    int have_utilisation;
    double utilisation;     /* 0..1, busy fraction since the daemon's previous read */
    char memory_health[16]; /* "" absent; "ok", "degraded", "critical", "replace" */
    int have_reset;
    int wedged; /* the device needs a reset */
} graphd_device_t;

typedef struct graphd_pool {
    char name[64];
    char device[64];
    uint64_t limit_bytes;    /* 0: none */
    uint64_t reserved_bytes; /* page-rounded bytes of live regions */
    uint64_t used_bytes;     /* bytes asked for by live regions */
    uint32_t regions;
    uint32_t sessions; /* sessions holding a region in the pool */
    uint64_t created_unix_ms;
    /* CUDA pools: device memory of the pool's graph mempool (libtorch's caching allocator), where
     * its graphs' captured allocations live; not in reserved_bytes/used_bytes, which count the
     * pool's regions. 0 for a cpu pool. */
    uint64_t graph_mempool_reserved_bytes; /* allocator segments the mempool owns */
    uint64_t graph_mempool_in_use_bytes;   /* bytes of them held by live allocations */
    uint32_t owner_uid;                    /* the creating session's uid */
    uint32_t owner_gid;
    int mode;                /* GRAPHD_POOL_PRIVATE, GRAPHD_POOL_GROUP or GRAPHD_POOL_PUBLIC */
    int delete_with_session; /* 1: the daemon deletes it when its creating session ends */
} graphd_pool_t;

/* Who may use a pool (allocate regions, capture graphs in it); only its owner or an admin (uid 0
 * or the daemon's uid) deletes it. Equal to graphd.v1.PoolMode. */
enum graphd_pool_mode {
    GRAPHD_POOL_DEFAULT = 0, /* the daemon's default: private */
    GRAPHD_POOL_PRIVATE = 1, /* sessions of the owner's uid */
    GRAPHD_POOL_GROUP = 2,   /* and sessions whose gid is the owner's gid */
    GRAPHD_POOL_PUBLIC = 3,  /* any session */
};
/* graphd_pool_create_ex flags: the daemon deletes the pool when this client's session ends,
 * however it ends (a per-process pool). */
#define GRAPHD_POOL_DELETE_WITH_SESSION 0x1u

/*
 * Creates a client for the daemon at address: a gRPC target ("unix:/path";
 * a bare "/path" means "unix:/path"). No I/O happens here: a daemon that is
 * not there shows as GRAPHD_EUNAVAILABLE from the first call. Non-unix
 * targets use TLS with the system's roots, or GRAPHD_TLS_CA's. It reads the
 * client settings (see graphd_setting): GRAPHD_EINVALID_ARGUMENT for one
 * that is not valid, GRAPHD_ESYS for a GRAPHD_TLS_CA that cannot be read,
 * GRAPHD_ENOMEM; the message is graphd_last_error(NULL).
 */
int graphd_connect(const char *address /* [in][optional] NULL: $GRAPHD_ADDRESS, else default */,
                   graphd_client_t **out /* [out] */);
/*
 * Drops the caller's reference on c: ends the session if one is open
 * (Goodbye, then closes the session socket; the daemon frees the session's
 * regions, modules and graphs) and releases the gRPC channel. The caller
 * must not pass c to any function after it. Region and graph handles still
 * open stay valid, as after graphd_goodbye: host memory stays mapped and
 * readable, replays fail with GRAPHD_EFAILED_PRECONDITION, and
 * graphd_graph_release / graphd_region_release free them. Each holds a
 * reference on the client, whose memory goes with the last of them (at once
 * when none is open). The Goodbye may wait up to GRAPHD_TIMEOUT_MS for a
 * daemon that hangs; a daemon that is gone answers at once. NULL is a no-op.
 */
void graphd_close(graphd_client_t *c /* [in][optional] */);
/* Message of the last failed call on c (never NULL; "" after a success). With c NULL, the
 * message of the last graphd_connect or graphd_setting of this thread that failed. */
const char *graphd_last_error(const graphd_client_t *c);
/* The resolved target this client talks to. */
const char *graphd_address(const graphd_client_t *c);

/*
 * Opens a session (Hello) and attaches its data-plane socket. A client holds
 * at most one session: GRAPHD_EFAILED_PRECONDITION if one is open.
 */
int graphd_hello(graphd_client_t *c, const char *client_name /* [in][optional] NULL: "" */);
/*
 * Ends the session: the daemon frees its regions, modules and graphs. Host
 * region and graph handles stay mapped (the memory stays valid) until
 * graphd_region_release/free, graphd_graph_release or graphd_close. Device
 * regions are unmapped here first (after waiting for the device), since the
 * daemon frees device memory with the session. The session socket is closed
 * even when the RPC fails.
 */
int graphd_goodbye(graphd_client_t *c);
/* The open session's id, 0 when none. */
uint64_t graphd_session_id(const graphd_client_t *c);
/* Filesystem path of the session socket ("" when no session is open). */
const char *graphd_session_socket(const graphd_client_t *c);
/* The daemon's version from Hello ("" before it). */
const char *graphd_daemon_version(const graphd_client_t *c);

/* Devices the daemon serves. Two-call pattern; GRAPHD_ETRUNC when *count was too small. */
int graphd_list_devices(graphd_client_t *c, size_t *count /* [in,out] */,
                        graphd_device_t *items /* [out][optional] */);
/* Pools with their accounting: those the open session may use (all for an admin's session);
 * without a session, none. Two-call pattern; GRAPHD_ETRUNC when *count was too small. */
int graphd_list_pools(graphd_client_t *c, size_t *count /* [in,out] */,
                      graphd_pool_t *items /* [out][optional] */);
/*
 * Creates a named pool owned by the session's uid, private to it (graphd_pool_create_ex sets
 * the mode). Needs an open session (GRAPHD_EFAILED_PRECONDITION without one). The daemon checks
 * the name (1..63 of [A-Za-z0-9._-]): GRAPHD_EINVALID_ARGUMENT, GRAPHD_EALREADY_EXISTS,
 * GRAPHD_ENOT_FOUND for an unknown device, GRAPHD_ERESOURCE_EXHAUSTED past max_pools_per_uid.
 * limit_bytes 0: the daemon's default limit.
 */
int graphd_pool_create(graphd_client_t *c, const char *name /* [in] */,
                       const char *device /* [in][optional] NULL: "cpu:0" */, uint64_t limit_bytes,
                       graphd_pool_t *info /* [out][optional] the new pool */);
/* The same with a mode (enum graphd_pool_mode) and flags (GRAPHD_POOL_DELETE_WITH_SESSION). */
int graphd_pool_create_ex(graphd_client_t *c, const char *name /* [in] */,
                          const char *device /* [in][optional] NULL: "cpu:0" */,
                          uint64_t limit_bytes, int mode, unsigned flags,
                          graphd_pool_t *info /* [out][optional] the new pool */);
/* Needs an open session of the pool's owner uid or an admin's (GRAPHD_EPERMISSION_DENIED);
 * GRAPHD_ENOT_FOUND; GRAPHD_EFAILED_PRECONDITION while the pool holds regions or without a
 * session. */
int graphd_pool_delete(graphd_client_t *c, const char *name /* [in] */);

/*
 * Allocates a shared host region of size bytes for the session and maps it
 * read-write into the caller. The handle belongs to the client (see
 * graphd_close). GRAPHD_EFAILED_PRECONDITION without a session;
 * GRAPHD_ENOT_FOUND (pool), GRAPHD_EINVALID_ARGUMENT (size),
 * GRAPHD_ERESOURCE_EXHAUSTED (pool limit) from the daemon.
 */
int graphd_region_alloc(graphd_client_t *c, const char *pool /* [in][optional] NULL: default */,
                        uint64_t size, graphd_region_t **out /* [out] */);
/*
 * The same in device memory of the pool's device (cuda:N or xpu:N): the daemon allocates it
 * (cudaMalloc; zeMemAllocDevice) and this process opens it with IPC in its own context: CUDA IPC
 * through the CUDA runtime, or Level Zero IPC (zeMemOpenIpcHandle, the fd passed with the handle)
 * through the Level Zero loader (GRAPHD_ZE_LOADER, libze_loader.so.1), each loaded at run time the
 * first time. graphd_region_ptr is then a device pointer on that device and
 * graphd_region_is_device 1; graphd_region_read/write copy to and from it. The pool's limit counts
 * it as any region. Nothing orders this process's device work on it against the daemon's:
 * synchronise before freeing it. The daemon frees it with FreeRegion or the session
 * (graphd_region_free and graphd_goodbye close the IPC mapping first, after waiting for the
 * device). GRAPHD_EINVALID_ARGUMENT for a pool that is not on a device;
 * GRAPHD_EFAILED_PRECONDITION when this process cannot load the device's library (the message
 * names the package: libze1 for Level Zero) or open the handle (the message names the driver);
 * GRAPHD_ENOT_FOUND when this process does not see the device (the region is freed again in each
 * case); otherwise as graphd_region_alloc.
 */
int graphd_region_alloc_device(graphd_client_t *c,
                               const char *pool /* [in][optional] NULL: default */, uint64_t size,
                               graphd_region_t **out /* [out] */);
/*
 * Maps an existing region of this session by id (e.g. one the daemon made).
 * GRAPHD_ENOT_FOUND, GRAPHD_EPERMISSION_DENIED for another session's region.
 */
int graphd_region_map(graphd_client_t *c, uint64_t region_id, graphd_region_t **out /* [out] */);
/*
 * Frees the region in the daemon (FreeRegion), then unmaps it and frees the
 * handle (a device region's IPC mapping is closed first, after waiting for
 * the device: the daemon's cudaFree must come after it). The handle is gone
 * even when the RPC fails; the RPC's error is returned.
 * GRAPHD_EFAILED_PRECONDITION for a device-resident graph's region (it goes
 * with graphd_graph_release).
 */
int graphd_region_free(graphd_client_t *c, graphd_region_t *r /* [in] consumed */);
/* FreeRegion by id only: nothing is unmapped here. For tools and tests. */
int graphd_region_free_id(graphd_client_t *c, uint64_t region_id);
/* Unmaps the region here and frees the handle; the daemon keeps the region (until its session
 * ends). The way to free a region handle after graphd_close. NULL: no-op. */
void graphd_region_release(graphd_region_t *r /* [in][optional] consumed */);

uint64_t graphd_region_id(const graphd_region_t *r);
/* Start of the mapping: mapped_size bytes, read-write, shared with the daemon. For a device
 * region (graphd_region_is_device), a device pointer opened from the daemon's IPC handle in this
 * process's context (CUDA, or Level Zero for xpu; NULL once the session has ended: the daemon
 * frees device memory with its session). */
void *graphd_region_ptr(const graphd_region_t *r);
/* 1 for a region in device memory (a device-resident graph's, or graphd_region_alloc_device's),
 * 0 for a host region. */
int graphd_region_is_device(const graphd_region_t *r);
/* Bytes asked for (for a region mapped by id: its mapped size). */
uint64_t graphd_region_size(const graphd_region_t *r);
/* Bytes mapped (page-rounded). */
uint64_t graphd_region_mapped_size(const graphd_region_t *r);
/*
 * Copies n bytes from src into the region at offset: memcpy for a host region, a synchronous
 * device copy for a device region (cuda: cudaMemcpy; xpu: an immediate command list in this
 * process's Level Zero context), returning once the bytes are in the region.
 * GRAPHD_EINVALID_ARGUMENT when [offset, offset + n) is not inside the mapping or src is NULL;
 * GRAPHD_EFAILED_PRECONDITION when the region is unmapped (its session ended) or the copy fails
 * (the message names the device and the driver's answer).
 */
int graphd_region_write(graphd_region_t *r, uint64_t offset, const void *src /* [in] */, size_t n);
/* The other way: n bytes of the region at offset into dst. Errors as graphd_region_write. */
int graphd_region_read(graphd_region_t *r, uint64_t offset, void *dst /* [out] */, size_t n);

/* Raised when a field of graphd_status_json changes meaning or goes away; a new field does not
 * raise it. */
#define GRAPHD_STATUS_SCHEMA_VERSION 1

/*
 * Ordering events on an xpu device (Level Zero): the session's IPC event pool on device
 * ("xpu:0"), count events (0: the daemon's default, 64; at most GRAPHD_EVENTS_MAX), made by the
 * daemon and opened in this process's own Level Zero context (zeEventPoolOpenIpcHandle), once per
 * session and device. Events are numbered 0..count-1 and start unsignalled; this process signals,
 * resets, queries and waits on them from the host, and so may any process the daemon's pool was
 * shared with. When the session ends (graphd_goodbye, graphd_close, this process's death, the
 * daemon stopping) the daemon signals every event, so that no wait on one hangs on a client that
 * is gone. The handle holds a reference on c: release it with graphd_events_release.
 * GRAPHD_EINVALID_ARGUMENT for a device that is not "xpu:N" or too many events;
 * GRAPHD_EUNIMPLEMENTED on cuda (graphd_replay_stream orders by the stream there);
 * GRAPHD_EALREADY_EXISTS for a second pool on the device; GRAPHD_ENOT_FOUND when the daemon or
 * this process lacks the device; GRAPHD_EFAILED_PRECONDITION when the driver shares no event
 * pools between processes (the message names the driver) or the loader cannot be loaded.
 */
#define GRAPHD_EVENTS_MAX 4096
typedef struct graphd_events graphd_events_t;
int graphd_events_open(graphd_client_t *c, const char *device, unsigned count,
                       graphd_events_t **out /* [out] */);
/* The pool's number of events; 0 for NULL. */
unsigned graphd_events_count(const graphd_events_t *e);
/* Signals event k from the host (zeEventHostSignal). GRAPHD_EINVALID_ARGUMENT for k >= count. */
int graphd_events_signal(graphd_events_t *e, unsigned k);
/* Makes event k unsignalled again (zeEventHostReset). */
int graphd_events_reset(graphd_events_t *e, unsigned k);
/* 1 when event k is signalled, 0 when not, or a negative error. */
int graphd_events_query(graphd_events_t *e, unsigned k);
/* Waits up to timeout_ns (UINT64_MAX: for ever) for event k to be signalled
 * (zeEventHostSynchronize): GRAPHD_OK, or GRAPHD_EDEADLINE_EXCEEDED when the time ran out. */
int graphd_events_wait(graphd_events_t *e, unsigned k, uint64_t timeout_ns);
/* Closes the pool here (its events first) and drops the handle's reference on its client. NULL:
 * no-op. */
void graphd_events_release(graphd_events_t *e /* [in][optional] consumed */);

/*
 * The daemon's Status as one JSON object (UTF-8, NUL-terminated) with keys
 * "daemon", "devices", "pools", "sessions" and any later section, field
 * names as in graphd.proto; as the open session may see it (an admin's: all;
 * a tenant's: its uid's sessions and graphs and the pools it may use, the
 * rest counted in "others"; without a session: counts only); repeated *Entry messages
 * (daemon.config) become objects keyed by name. Two-call: with buf NULL, *len gets the bytes needed
 * (NUL included) and GRAPHD_OK; with buf too small, the same and
 * GRAPHD_ETRUNC. Each call asks the daemon anew, so the size may grow in
 * between: retry on GRAPHD_ETRUNC. The object's first key is "schema_version"
 * (GRAPHD_STATUS_SCHEMA_VERSION; docs/OPERATIONS.md, "Reading status").
 */
int graphd_status_json(graphd_client_t *c, char *buf /* [out][optional] */,
                       size_t *len /* [in,out] */);

/* ---- modules, capture, replay ---------------------------------------------------------- */

/* Element types: values equal graphd.v1.DType and graph_runtime's gr_dtype_t. */
enum graphd_dtype {
    GRAPHD_FLOAT32 = 1,
    GRAPHD_FLOAT64 = 2,
    GRAPHD_FLOAT16 = 3,
    GRAPHD_BFLOAT16 = 4,
    GRAPHD_INT64 = 5,
    GRAPHD_INT32 = 6,
    GRAPHD_INT16 = 7,
    GRAPHD_INT8 = 8,
    GRAPHD_UINT8 = 9,
    GRAPHD_BOOL = 10,
};
/* Roles of a graph's static tensors: values equal graphd.v1.TensorRole. */
enum graphd_role {
    GRAPHD_ROLE_INPUT = 1,       /* a sample arg: written by the caller before FORWARD */
    GRAPHD_ROLE_OUTPUT = 2,      /* written by FORWARD */
    GRAPHD_ROLE_GRAD_OUTPUT = 3, /* d loss / d output: written by the caller before BACKWARD */
    GRAPHD_ROLE_GRAD_INPUT = 4,  /* written by BACKWARD */
    GRAPHD_ROLE_PARAM = 5,       /* a module parameter: the caller may update it in place */
    GRAPHD_ROLE_PARAM_GRAD = 6,  /* written by BACKWARD */
    GRAPHD_ROLE_BUFFER = 7,      /* a module buffer (running stats): FORWARD updates it in place */
    /* The generator state the graph's random ops draw from (a method with random ops only):
     * "cpu", uint8[5056] (torch.get_rng_state()), written by the caller before FORWARD, which
     * writes the advanced state back; "cuda", int64 (seed, offset, increment): the caller writes
     * the Philox seed and offset, the capture wrote the increment (docs/PROTOCOL.md). */
    GRAPHD_ROLE_RNG_STATE = 8,
};
#define GRAPHD_PHASE_FORWARD 0
#define GRAPHD_PHASE_BACKWARD 1
#define GRAPHD_MAX_DIMS 8

/*
 * Registers a TorchScript archive (torch.jit.save) for the session. Archives
 * up to 1 MiB go inline in the request; larger ones are copied into a
 * temporary region of the default pool (a RegionSlice) that is freed after
 * the call. *module_id gets the daemon's id; identical bytes share the loaded
 * code. GRAPHD_EINVALID_ARGUMENT with libtorch's error when the archive does
 * not load; GRAPHD_EFAILED_PRECONDITION without a session.
 */
int graphd_module_register(graphd_client_t *c, const void *bytes /* [in] */, size_t len,
                           const char *name /* [in][optional] shown in status */,
                           uint64_t *module_id /* [out] */);
/* Drops the session's handle on a module (graphs captured from it stay usable). */
int graphd_module_release(graphd_client_t *c, uint64_t module_id);

/* One sample arg, as make_graphed_callables' sample_args tensor would be. */
typedef struct graphd_tensor_spec {
    int dtype; /* enum graphd_dtype */
    uint32_t ndim;
    int64_t shape[GRAPHD_MAX_DIMS];
    int requires_grad;
} graphd_tensor_spec_t;

typedef struct graphd_callable {
    uint64_t module_id;
    const char *method; /* [optional] NULL: "forward" */
    size_t n_args;
    const graphd_tensor_spec_t *args;
} graphd_callable_t;

typedef struct graphd_capture_opts {
    int num_warmup_iters; /* < 0: the daemon's default (3) */
    int allow_unused_input;
    const char *pool; /* [optional] NULL: the default pool */
    /* 1: the static tensors live in device memory that the daemon allocates on the pool's CUDA
     * device and this process maps with CUDA IPC (the CUDA runtime is loaded at run time, the
     * first time; the pool must be on a cuda device). Each graphd_tensor_t's data is then a
     * device pointer (on_device = 1). Order this process's device work against the replays
     * with graphd_replay_stream (CUDA IPC events, no host synchronisation); or synchronise the
     * work that writes inputs or reads outputs (cudaStreamSynchronize) before graphd_replay,
     * which returns once the replay has finished on the device. 0: host regions. */
    int device_resident;
    /* Device-resident only. 0: each PARAM_GRAD tensor stays where the daemon's backward graph
     * computes it, in its graph mempool, which this process maps (one mapping per mempool
     * segment, shared by the graphs whose gradients lie there) and BACKWARD copies nothing. A
     * later replay of any of this session's graphs in the pool may overwrite it: read or copy
     * the gradients before the next replay, as with upstream's static gradients. 1: BACKWARD
     * copies each gradient into the graph's own region, where only the next BACKWARD writes. */
    int copy_param_grads;
} graphd_capture_opts_t;
/* Fills o with the defaults: num_warmup_iters -1, allow_unused_input 0, pool NULL,
 * device_resident 0, copy_param_grads 0. */
void graphd_capture_opts_init(graphd_capture_opts_t *o /* [out] */);

/* A captured callable; owns the mapping of its static region. */
typedef struct graphd_graph graphd_graph_t;

/*
 * Captures n callables sharing one pool in one Capture call, as
 * make_graphed_callables does (forwards in order, backwards in reverse
 * order), maps each graph's static region and fills graphs[0..n-1]. The
 * handles belong to the client (see graphd_close). On failure nothing is left
 * allocated, here or in the daemon. Module errors (shape or dtype mismatch, an
 * unused input) are GRAPHD_EINVALID_ARGUMENT with libtorch's message; a pool
 * limit too small is GRAPHD_ERESOURCE_EXHAUSTED.
 */
int graphd_capture(graphd_client_t *c, size_t n, const graphd_callable_t *callables /* [in] n */,
                   const graphd_capture_opts_t *opts /* [in][optional] NULL: defaults */,
                   graphd_graph_t **graphs /* [out] n */);

/* One static tensor of a graph: a contiguous tensor at data in this process. */
typedef struct graphd_tensor {
    int role;       /* enum graphd_role */
    uint32_t index; /* position within its role */
    /* parameter or buffer name for PARAM / PARAM_GRAD / BUFFER; output path; for RNG_STATE
     * the generator's device kind ("cpu": uint8 CPU generator state; "cuda": int64 Philox
     * seed, offset, increment; docs/PROTOCOL.md) */
    char name[128];
    int dtype; /* enum graphd_dtype */
    uint32_t ndim;
    int64_t shape[GRAPHD_MAX_DIMS];
    int64_t strides[GRAPHD_MAX_DIMS]; /* in elements */
    uint64_t nbytes;
    int requires_grad;
    void *data; /* the mapped address in this process, valid until the graph is released */
    int absent; /* GRAD_INPUT / PARAM_GRAD: no gradient (upstream's None); zero-filled */
    /* 1: data is a CUDA device pointer (a device-resident graph's tensor), 0: host memory */
    int on_device;
} graphd_tensor_t;

/*
 * The graph's static tensors (inputs, outputs, grad-outputs, grad-inputs,
 * params, param grads) in the daemon's order. Two-call pattern;
 * GRAPHD_ETRUNC when *count was too small.
 */
int graphd_graph_tensors(const graphd_graph_t *g, size_t *count /* [in,out] */,
                         graphd_tensor_t *items /* [out][optional] */);
uint64_t graphd_graph_id(const graphd_graph_t *g);
/* The module's training mode at capture (1 training, 0 eval). */
int graphd_graph_training(const graphd_graph_t *g);
/* 1 when some output requires grad, so that BACKWARD is available. */
int graphd_graph_has_backward(const graphd_graph_t *g);
/* 1 when the daemon skipped the capture's warm-up, having warmed up the same module and sample
 * specs for this uid before (its reuse_warmup setting; docs/OPERATIONS.md). */
int graphd_graph_warmup_reused(const graphd_graph_t *g);
/*
 * Replays one phase (GRAPHD_PHASE_*) with a REPLAY frame on the session
 * socket and waits for its completion; no allocation, one send and one
 * receive. device_ns gets the daemon's time in the replay. Errors carry the
 * daemon's message in graphd_last_error: GRAPHD_EFAILED_PRECONDITION
 * (BACKWARD without FORWARD), GRAPHD_EINTERNAL (the module threw; the graph
 * stays usable), GRAPHD_ENOT_FOUND (the graph is gone).
 */
int graphd_replay(graphd_graph_t *g, int phase, uint64_t *device_ns /* [out][optional] */);
/*
 * Replays one phase of a device-resident graph in the order of a CUDA stream, with no host
 * synchronisation on either side: the replay starts after the work queued on stream before this
 * call (the writes into the static tensors), and the work queued on stream after it (reads of the
 * outputs, the next writes) starts after the replay. stream is a cudaStream_t of the graph's
 * device (NULL: that device's legacy default stream).
 *
 * By default the replay is posted: the stream writes a sequence number into counters the daemon
 * shares with this session (CUDA stream memory operations), the REPLAY frame goes out, the
 * stream is made to wait for the daemon's done counter, and the call returns without waiting for
 * any answer (launch_ns gets 0). The daemon answers only a failure, which the next replay call
 * of this client returns (GRAPHD_E* with "an earlier posted replay ... failed"), as CUDA reports
 * asynchronous errors; the stream goes on either way. The first call for a device maps the
 * counters (SEQ frame). With GRAPHD_REPLAY_ORDER=events in the environment, or
 * graphd_set_replay_posted(c, 0), or where the daemon's driver lacks stream memory operations,
 * the replay is ordered by a pair of CUDA IPC events instead and the call waits for the daemon to
 * launch it (launch_ns: the daemon's launch time); the first such call exchanges the events
 * (EVENTS frame). Errors as graphd_replay; GRAPHD_EINVALID_ARGUMENT for a host-staged graph;
 * GRAPHD_EFAILED_PRECONDITION when the CUDA runtime cannot be loaded or refuses;
 * GRAPHD_EUNIMPLEMENTED for a graph on a device kind with no ordering primitives here (xpu).
 */
int graphd_replay_stream(graphd_graph_t *g, int phase, void *stream /* [optional] */,
                         uint64_t *launch_ns /* [out][optional] */);
/* 1: graphd_replay_stream posts its replays (the default), 0: it orders them by events and
 * waits for the daemon's launch. Returns the previous setting. */
int graphd_set_replay_posted(graphd_client_t *c, int posted);
/* The same through the gRPC Replay RPC. */
int graphd_replay_rpc(graphd_graph_t *g, int phase, uint64_t *device_ns /* [out][optional] */);
/*
 * Unmaps and frees the handle, then ReleaseGraph (the daemon frees the graph
 * and its region), also when the RPC fails; the RPC's error is returned
 * (GRAPHD_EFAILED_PRECONDITION once the session has ended, by graphd_goodbye
 * or graphd_close). NULL: no-op.
 */
int graphd_graph_release(graphd_graph_t *g /* [in][optional] consumed */);

#ifdef __cplusplus
}
#endif

#endif
