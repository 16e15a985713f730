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
 *   local one) until the next call on that client.
 *
 * Environment: GRAPHD_ADDRESS (default address), GRAPHD_TIMEOUT_MS (deadline
 * of each RPC and data-plane exchange, default 60000).
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
} graphd_pool_t;

/*
 * Creates a client for the daemon at address: a gRPC target ("unix:/path";
 * a bare "/path" means "unix:/path"). No I/O happens here: a daemon that is
 * not there shows as GRAPHD_EUNAVAILABLE from the first call. Non-unix
 * targets use TLS with the system's roots. GRAPHD_EINVALID_ARGUMENT,
 * GRAPHD_ENOMEM.
 */
int graphd_connect(const char *address /* [in][optional] NULL: $GRAPHD_ADDRESS, else default */,
                   graphd_client_t **out /* [out] */);
/*
 * Ends the session if one is open (Goodbye, then closes the session socket),
 * unmaps and frees every region handle of this client that is still open,
 * and destroys the client. Pointers into those regions are invalid after it.
 * The Goodbye may wait up to GRAPHD_TIMEOUT_MS for a daemon that hangs; a
 * daemon that is gone answers at once. NULL is a no-op.
 */
void graphd_close(graphd_client_t *c /* [in][optional] */);
/* Message of the last failed call on c (never NULL; "" after a success). */
const char *graphd_last_error(const graphd_client_t *c);
/* The resolved target this client talks to. */
const char *graphd_address(const graphd_client_t *c);

/*
 * Opens a session (Hello) and attaches its data-plane socket. A client holds
 * at most one session: GRAPHD_EFAILED_PRECONDITION if one is open.
 */
int graphd_hello(graphd_client_t *c, const char *client_name /* [in][optional] NULL: "" */);
/*
 * Ends the session: the daemon frees its regions. Region handles stay
 * mapped (the memory stays valid) until graphd_region_release/free or
 * graphd_close. The session socket is closed even when the RPC fails.
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
/* Pools with their accounting. Two-call pattern; GRAPHD_ETRUNC when *count was too small. */
int graphd_list_pools(graphd_client_t *c, size_t *count /* [in,out] */,
                      graphd_pool_t *items /* [out][optional] */);
/*
 * Creates a named pool. The daemon checks the name (1..63 of [A-Za-z0-9._-]):
 * GRAPHD_EINVALID_ARGUMENT, GRAPHD_EALREADY_EXISTS, GRAPHD_ENOT_FOUND for an
 * unknown device. limit_bytes 0: the daemon's default limit.
 */
int graphd_pool_create(graphd_client_t *c, const char *name /* [in] */,
                       const char *device /* [in][optional] NULL: "cpu:0" */, uint64_t limit_bytes,
                       graphd_pool_t *info /* [out][optional] the new pool */);
/* GRAPHD_ENOT_FOUND; GRAPHD_EFAILED_PRECONDITION while the pool holds regions. */
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
 * Maps an existing region of this session by id (e.g. one the daemon made).
 * GRAPHD_ENOT_FOUND, GRAPHD_EPERMISSION_DENIED for another session's region.
 */
int graphd_region_map(graphd_client_t *c, uint64_t region_id, graphd_region_t **out /* [out] */);
/*
 * Frees the region in the daemon (FreeRegion), then unmaps it and frees the
 * handle. The handle is gone even when the RPC fails; the RPC's error is
 * returned.
 */
int graphd_region_free(graphd_client_t *c, graphd_region_t *r /* [in] consumed */);
/* FreeRegion by id only: nothing is unmapped here. For tools and tests. */
int graphd_region_free_id(graphd_client_t *c, uint64_t region_id);
/* Unmaps the region here and frees the handle; the daemon keeps the region. NULL: no-op. */
void graphd_region_release(graphd_region_t *r /* [in][optional] consumed */);

uint64_t graphd_region_id(const graphd_region_t *r);
/* Start of the mapping: mapped_size bytes, read-write, shared with the daemon. */
void *graphd_region_ptr(const graphd_region_t *r);
/* Bytes asked for (for a region mapped by id: its mapped size). */
uint64_t graphd_region_size(const graphd_region_t *r);
/* Bytes mapped (page-rounded). */
uint64_t graphd_region_mapped_size(const graphd_region_t *r);

/*
 * The daemon's Status as one JSON object (UTF-8, NUL-terminated) with keys
 * "daemon", "devices", "pools", "sessions" and any later section, field
 * names as in graphd.proto; repeated *Entry messages (daemon.config) become
 * objects keyed by name. Two-call: with buf NULL, *len gets the bytes needed
 * (NUL included) and GRAPHD_OK; with buf too small, the same and
 * GRAPHD_ETRUNC. Each call asks the daemon anew, so the size may grow in
 * between: retry on GRAPHD_ETRUNC.
 */
int graphd_status_json(graphd_client_t *c, char *buf /* [out][optional] */,
                       size_t *len /* [in,out] */);

#ifdef __cplusplus
}
#endif

#endif
