/*
 * The executor channel: how the daemon drives an executor process (graph_runtime/executor.c),
 * which runs graph_runtime's C ABI for one tenant on one device. Both ends are built from this
 * tree, so values are in host order and structs of runtime.h go as their bytes.
 *
 * Transport: a SOCK_STREAM socketpair (the executor's fd GX_CHANNEL_FD). A message is a
 * gx_msg_hdr_t followed by len payload bytes; file descriptors (memfds of static regions) ride
 * on the header's sendmsg as SCM_RIGHTS, nfds of them. The daemon sends one request and reads
 * its reply before the next (one caller at a time per executor). A reply has the request's op
 * and seq; rc is GR_OK and the payload is the op's result, or rc is a GR_ error and the payload
 * is the message (no NUL). The executor first sends GX_OP_READY unprompted once it is
 * sandboxed. A second socketpair (fd GX_URGENT_FD) carries GX_OP_SEQ_RELEASE and GX_OP_SEQ_SKIP
 * requests, which get no reply and are served at once by a thread of their own (both may run on
 * any thread; the daemon sends them from its loop, which never waits for an executor).
 *
 * The daemon treats everything an executor sends as hostile input: every reader below is bounds
 * checked, and a malformed reply counts as the executor failing.
 *
 * Payloads (u32/u64/i32/i64 host order; str = u32 length + bytes; bytes = u64 length + bytes):
 *   READY            -> str torch_version, u32 no_new_privs, u32 landlock_abi, u32 seccomp, str off
 *   MODULE_LOAD      bytes archive -> u64 module, gr_module_info_t
 *   MODULE_RELEASE   u32 n, u64 module[n] -> (nothing)
 *   POOL_CREATE      str device -> u64 pool
 *   POOL_DESTROY     u64 pool -> ()
 *   POOL_MEMORY      u64 pool -> u64 reserved, u64 in_use
 *   CAPTURE_PREPARE  str device, i32 warmup, i32 allow_unused, u64 pool (0: private),
 *                    i32 resident, i32 copy_param_grads, i32 reuse_warmup, u32 n, n x callable
 *                      callable = u64 module, str method ("": forward), u32 n_args, n_args x arg
 *                      arg = i32 dtype, u32 ndim, i64 shape[ndim], i32 requires_grad,
 *                            bytes data (empty: none)
 *                    -> u64 capture, u32 n, n x (u64 count, u64 total_bytes)
 *   CAPTURE_ABORT    u64 capture -> ()
 *   CAPTURE_FINISH   u64 capture, u32 n, n x (u32 kind, u64 value): kind GX_BLOCK_HOST: value is
 *                    the mapped length of the next memfd (in order) of the message; kind
 *                    GX_BLOCK_DEVICE: value is a pointer DEVICE_ALLOC returned
 *                    -> u32 n, n x graph
 *                      graph = u64 graph, gr_graph_info_t, u64 total_bytes, u32 count,
 *                              count x tensor, u32 next, next x external
 *                      tensor = i32 role, u32 index, str name, i32 dtype, u32 ndim,
 *                               i64 shape[ndim], i64 strides[ndim], u64 offset, u64 nbytes,
 *                               u32 flags
 *                      external = u64 tensor, u64 base, u64 size, u64 offset,
 *                                 GR_IPC_HANDLE_SIZE bytes handle
 *   GRAPH_REPLAY     u64 graph, i32 phase, u32 mode (GX_REPLAY_*), then for ORDERED u64 wait
 *                    event, u64 done event; for POSTED u64 seq, u64 n -> u64 elapsed_ns
 *   GRAPH_DESTROY    u64 graph -> ()
 *   DEVICE_ALLOC     str device, u64 bytes -> u64 ptr, handle
 *   DEVICE_FREE      str device, u64 ptr -> ()
 *   EVENT_CREATE     str device -> u64 event, handle
 *   EVENT_OPEN       str device, handle -> u64 event
 *   EVENT_DESTROY    u64 event -> ()
 *   SEQ_CREATE       str device -> u64 seq, handle
 *   SEQ_SKIP         u64 seq, u64 n -> () (on the urgent socket: no reply)
 *   SEQ_RELEASE      u64 seq -> () (on the urgent socket: no reply)
 *   SEQ_DESTROY      u64 seq -> ()
 *   CONN_OPEN        u64 session, and one fd: a SOCK_STREAM socket whose other end the session's
 *                    client holds -> (); the client sends REPLAY frames (graphd_frame.h) on it and
 *                    reads their replies there ("the direct data plane", below)
 *   GRAPH_BIND       u64 graph, u64 session, u64 handle (the daemon's graph id), u32 slot ->
 *                    (): the session may replay the graph over its connections by handle; the
 *                    executor counts those replays in the state page's slot (GX_NO_SLOT: none)
 *   SESSION_BIND     u64 session, u32 what (GX_BIND_*), u64 object -> (): the session's
 *                    sequence counters (posted REPLAYs) or events (ordered REPLAYs) on this
 *                    device
 * Object ids are the executor's, from 1, never reused; an unknown id is GR_ENOTFOUND.
 *
 * The direct data plane. A client's REPLAY frames go straight to its executor on the socket of
 * CONN_OPEN, not through the daemon: the executor checks each frame as the daemon did (the graph
 * is bound to the connection's session, phase, flags, a posted replay's number is the session's
 * next), replays, and answers on the socket without ever blocking on it (an output buffer capped
 * at --reply-max bytes; a client over it is disconnected, counted in GX_STATE's dropped_conns).
 * It serves its connections round-robin, one frame each in turn, and the channel before them. A
 * connection whose peer has gone (POLLHUP: the client died, or the daemon shut the socket down at
 * the session's end) is closed with the frames still queued on it unrun (counted in
 * replays_dropped). Before GRAPH_DESTROY it runs the frames already queued by the graph's session,
 * so a replay sent before a release still runs.
 *
 * The state page (fd GX_STATE_FD, a memfd of sizeof(gx_state_t) the daemon made and maps too):
 * the executor writes it, the daemon only reads it, and treats what it reads as untrusted
 * numbers. busy_since_ns is the CLOCK_MONOTONIC time a direct replay began (0: none running), so
 * that the daemon's watchdog can kill a replay that passes max_replay_ms as it kills a stuck call.
 */
#ifndef GR_EXEC_PROTO_H
#define GR_EXEC_PROTO_H

#include "hist.h"
#include "runtime.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GX_CHANNEL_FD 3
#define GX_URGENT_FD 4
#define GX_STATE_FD 5
#define GX_MAGIC 0x47584543u /* "GXEC" */
#define GX_MAX_PAYLOAD (UINT64_C(8) << 30)
#define GX_MAX_FDS 64 /* memfds in one message: one per callable of a capture */

#define GX_OP_MAP(X)                                                                               \
    X(READY, 1)                                                                                    \
    X(MODULE_LOAD, 2)                                                                              \
    X(MODULE_RELEASE, 3)                                                                           \
    X(POOL_CREATE, 4)                                                                              \
    X(POOL_DESTROY, 5)                                                                             \
    X(POOL_MEMORY, 6)                                                                              \
    X(CAPTURE_PREPARE, 7)                                                                          \
    X(CAPTURE_ABORT, 8)                                                                            \
    X(CAPTURE_FINISH, 9)                                                                           \
    X(GRAPH_REPLAY, 10)                                                                            \
    X(GRAPH_DESTROY, 11)                                                                           \
    X(DEVICE_ALLOC, 12)                                                                            \
    X(DEVICE_FREE, 13)                                                                             \
    X(EVENT_CREATE, 14)                                                                            \
    X(EVENT_OPEN, 15)                                                                              \
    X(EVENT_DESTROY, 16)                                                                           \
    X(SEQ_CREATE, 17)                                                                              \
    X(SEQ_SKIP, 18)                                                                                \
    X(SEQ_RELEASE, 19)                                                                             \
    X(SEQ_DESTROY, 20)                                                                             \
    X(CONN_OPEN, 21)                                                                               \
    X(GRAPH_BIND, 22)                                                                              \
    X(SESSION_BIND, 23)

typedef enum {
#define GX_OP_ENUM(name, value) GX_OP_##name = value,
    GX_OP_MAP(GX_OP_ENUM)
#undef GX_OP_ENUM
} gx_op_t;

#define GX_BLOCK_HOST 0u
#define GX_BLOCK_DEVICE 1u

#define GX_BIND_SEQ 0u  /* the session's sequence counters */
#define GX_BIND_WAIT 1u /* the client's event, opened here */
#define GX_BIND_DONE 2u /* the executor's event */

#define GX_NO_SLOT UINT32_MAX
#define GX_STATE_SLOTS 4096 /* graphs with replay figures per executor */

/* One graph's figures for the replays that came to the executor directly. */
typedef struct gx_slot {
    _Atomic uint64_t forward, backward, errors;
    gx_hist_t latency; /* ns from reading the frame to sending the answer */
} gx_slot_t;

typedef struct gx_state {
    _Atomic uint64_t busy_since_ns;   /* CLOCK_MONOTONIC ns a direct replay began; 0: none */
    _Atomic uint64_t busy_graph;      /* its handle (the daemon's graph id) */
    _Atomic uint64_t replays_dropped; /* queued on connections whose peer had gone, unrun */
    _Atomic uint64_t dropped_conns;   /* connections closed for not reading their answers */
    uint64_t reserved[4];
    gx_slot_t slot[GX_STATE_SLOTS];
} gx_state_t;

#define GX_REPLAY_PLAIN 0u
#define GX_REPLAY_ORDERED 1u
#define GX_REPLAY_POSTED 2u

typedef struct gx_msg_hdr {
    uint32_t magic;
    uint32_t op;
    uint64_t seq;
    uint64_t len; /* payload bytes that follow */
    int32_t rc;   /* replies: GR_OK or a GR_ error */
    uint32_t nfds;
} gx_msg_hdr_t;

/* ---- building a payload ------------------------------------------------------------------- */

typedef struct gx_wbuf {
    uint8_t *data;
    size_t len, cap;
    bool oom; /* an append failed: the buffer is unusable */
} gx_wbuf_t;

static inline void gx_put(gx_wbuf_t *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *grown = (uint8_t *)realloc(b->data, cap);
        if (grown == NULL) {
            b->oom = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
}
static inline void gx_put_u32(gx_wbuf_t *b, uint32_t v)
{
    gx_put(b, &v, sizeof v);
}
static inline void gx_put_i32(gx_wbuf_t *b, int32_t v)
{
    gx_put(b, &v, sizeof v);
}
static inline void gx_put_u64(gx_wbuf_t *b, uint64_t v)
{
    gx_put(b, &v, sizeof v);
}
static inline void gx_put_i64(gx_wbuf_t *b, int64_t v)
{
    gx_put(b, &v, sizeof v);
}
static inline void gx_put_str(gx_wbuf_t *b, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    gx_put_u32(b, (uint32_t)n);
    gx_put(b, s, n);
}
static inline void gx_put_bytes(gx_wbuf_t *b, const void *p, uint64_t n)
{
    gx_put_u64(b, n);
    gx_put(b, p, (size_t)n);
}
static inline void gx_wbuf_free(gx_wbuf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- reading a payload -------------------------------------------------------------------- */

typedef struct gx_rbuf {
    const uint8_t *p;
    size_t len, pos;
    bool bad; /* a read ran past the end, or a value was out of range */
} gx_rbuf_t;

static inline bool gx_get(gx_rbuf_t *b, void *out, size_t n)
{
    if (b->bad || n > b->len - b->pos) {
        b->bad = true;
        memset(out, 0, n);
        return false;
    }
    memcpy(out, b->p + b->pos, n);
    b->pos += n;
    return true;
}
static inline uint32_t gx_get_u32(gx_rbuf_t *b)
{
    uint32_t v;
    gx_get(b, &v, sizeof v);
    return v;
}
static inline int32_t gx_get_i32(gx_rbuf_t *b)
{
    int32_t v;
    gx_get(b, &v, sizeof v);
    return v;
}
static inline uint64_t gx_get_u64(gx_rbuf_t *b)
{
    uint64_t v;
    gx_get(b, &v, sizeof v);
    return v;
}
static inline int64_t gx_get_i64(gx_rbuf_t *b)
{
    int64_t v;
    gx_get(b, &v, sizeof v);
    return v;
}
/* A pointer into the buffer for n bytes (NULL, and bad, when they are not all there). */
static inline const void *gx_get_span(gx_rbuf_t *b, size_t n)
{
    if (b->bad || n > b->len - b->pos) {
        b->bad = true;
        return NULL;
    }
    const void *p = b->p + b->pos;
    b->pos += n;
    return p;
}
/* A string into out (max bytes, NUL included): bad when it is longer, or holds a NUL. */
static inline void gx_get_str(gx_rbuf_t *b, char *out, size_t max)
{
    uint32_t n = gx_get_u32(b);
    const char *s = (const char *)gx_get_span(b, n);
    if (s == NULL || n >= max || memchr(s, 0, n) != NULL) {
        b->bad = true;
        if (max)
            out[0] = 0;
        return;
    }
    memcpy(out, s, n);
    out[n] = 0;
}
/* bytes: a pointer into the buffer and its length. */
static inline const void *gx_get_bytes(gx_rbuf_t *b, uint64_t *n)
{
    *n = gx_get_u64(b);
    if (*n > b->len) {
        b->bad = true;
        return NULL;
    }
    return gx_get_span(b, (size_t)*n);
}

#endif
