/*
 * The gRPC edge of the daemon: a gRPC C core server, one completion-queue
 * thread that receives and decodes calls, and hand-over of decoded calls to
 * the libuv loop through a queue and a uv_async_t. Handlers run on the loop
 * thread as plain functions of (daemon, call, request) and finish each call
 * exactly once, from the loop, with gd_call_reply or gd_call_fail (possibly
 * later, e.g. after a device worker is done).
 */
#ifndef GD_RPC_H
#define GD_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* gRPC status codes, as on the wire (grpc/status.h), for handlers that do not include gRPC. */
enum {
    GD_OK = 0,
    GD_CANCELLED = 1,
    GD_UNKNOWN = 2,
    GD_INVALID_ARGUMENT = 3,
    GD_DEADLINE_EXCEEDED = 4,
    GD_NOT_FOUND = 5,
    GD_ALREADY_EXISTS = 6,
    GD_PERMISSION_DENIED = 7,
    GD_RESOURCE_EXHAUSTED = 8,
    GD_FAILED_PRECONDITION = 9,
    GD_ABORTED = 10,
    GD_OUT_OF_RANGE = 11,
    GD_UNIMPLEMENTED = 12,
    GD_INTERNAL = 13,
    GD_UNAVAILABLE = 14,
    GD_DATA_LOSS = 15,
    GD_UNAUTHENTICATED = 16,
};

const char *gd_status_name(int code);

typedef struct gd_rpc gd_rpc_t;
typedef struct gd_call gd_call_t;

typedef void (*gd_handler_fn)(void *ctx, gd_call_t *call, const ProtobufCMessage *req);

typedef struct gd_method {
    const char *path; /* "/graphd.v1.Graphd/Hello" */
    const ProtobufCMessageDescriptor *request;
    gd_handler_fn handler;
} gd_method_t;

typedef struct gd_rpc_opts {
    const char *listen; /* "unix:/path" or "host:port" */
    const char *tls_cert, *tls_key;
    uint64_t max_message_bytes;
    /* Socket activation (activation.c): bind no port; connections come through gd_rpc_add_fd. */
    bool no_port;
} gd_rpc_opts_t;

/* Binds and starts the server and its completion-queue thread; handlers get ctx. 0 or -1
 * (logged). The method table must outlive the server. */
int gd_rpc_start(uv_loop_t *loop, const gd_rpc_opts_t *opts, const gd_method_t *methods,
                 size_t nmethods, void *ctx, gd_rpc_t **out);
/* Serves one accepted connection (a connected unix stream socket, which the server now owns);
 * for socket activation, where gRPC core cannot adopt a listening socket. Thread-safe. */
void gd_rpc_add_fd(gd_rpc_t *rpc, int fd);
/* Stops accepting calls; in-flight calls go on. Calls on_idle (on the loop) once no call is in
 * flight and the server has shut down. */
void gd_rpc_shutdown(gd_rpc_t *rpc, void (*on_idle)(void *ctx));
/* Cancels every call still in flight (used when the drain grace period runs out). */
void gd_rpc_cancel_all(gd_rpc_t *rpc);
/* Joins the thread and frees everything; only after on_idle ran. */
void gd_rpc_destroy(gd_rpc_t *rpc);

/* Counters for status. */
uint64_t gd_rpc_calls_total(const gd_rpc_t *rpc);
uint64_t gd_rpc_calls_failed(const gd_rpc_t *rpc);
uint64_t gd_rpc_inflight(const gd_rpc_t *rpc);
/* Calls finished with status code (0..GD_RPC_CODES-1) by method (an index into the table that
 * gd_rpc_methods returns; the index equal to its count: methods graphd does not have). */
#define GD_RPC_CODES 17
uint64_t gd_rpc_calls_by(const gd_rpc_t *rpc, size_t method, int code);
size_t gd_rpc_methods(const gd_rpc_t *rpc, const gd_method_t **methods);

/* Finishes a call with a reply message (packed here; the caller keeps ownership of reply). */
void gd_call_reply(gd_call_t *call, const ProtobufCMessage *reply);
/* Finishes a call with a non-OK status and a message. */
void gd_call_fail(gd_call_t *call, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *gd_call_method(const gd_call_t *call);

#endif
