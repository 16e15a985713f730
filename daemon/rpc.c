/*
 * gRPC server glue (see rpc.h). The completion-queue thread owns every
 * grpc_call until it is decoded and queued for the loop; the loop thread owns
 * it from dispatch until it starts the final batch; the completion of that
 * batch, back on the completion-queue thread, frees it.
 */
#include "rpc.h"
#include "log.h"
#include "unpack.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REQUESTS_OUTSTANDING 8

enum stage { STAGE_NEW, STAGE_RECV, STAGE_DONE, STAGE_SHUTDOWN };

struct gd_call {
    enum stage stage;
    gd_rpc_t *rpc;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array request_md;
    grpc_byte_buffer *request_payload;
    grpc_byte_buffer *reply_payload;
    grpc_slice status_details;
    int cancelled;
    const gd_method_t *method;
    ProtobufCMessage *request;
    char path[96];
    gd_call_t *next;
};

struct gd_rpc {
    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t thread;
    bool thread_started;
    const gd_method_t *methods;
    size_t nmethods;
    void *ctx;
    uv_loop_t *loop;
    uv_async_t async;

    pthread_mutex_t lock; /* guards queue_head/queue_tail */
    gd_call_t *queue_head, *queue_tail;

    struct gd_call shutdown_tag;
    atomic_bool accepting;
    atomic_bool server_down;
    atomic_uint_fast64_t inflight; /* decoded or being decoded, not yet freed */
    atomic_uint_fast64_t calls_total, calls_failed;
    /* finished calls by [method][status code]; row nmethods: methods graphd does not have */
    atomic_uint_fast64_t (*calls_by)[GD_RPC_CODES];
    void (*on_idle)(void *ctx);
    bool idle_reported;
    bool cancelled;
};

static const char *const status_names[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

const char *gd_status_name(int code)
{
    return code >= 0 && code <= 16 ? status_names[code] : "UNKNOWN";
}

static void call_free(gd_call_t *c)
{
    if (c->request)
        protobuf_c_message_free_unpacked(c->request, NULL);
    if (c->request_payload)
        grpc_byte_buffer_destroy(c->request_payload);
    if (c->reply_payload)
        grpc_byte_buffer_destroy(c->reply_payload);
    grpc_slice_unref(c->status_details);
    grpc_metadata_array_destroy(&c->request_md);
    grpc_call_details_destroy(&c->details);
    if (c->call)
        grpc_call_unref(c->call);
    free(c);
}

static void request_one(gd_rpc_t *rpc)
{
    if (!atomic_load(&rpc->accepting))
        return;
    gd_call_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        gd_error("rpc: out of memory requesting a call");
        return;
    }
    c->rpc = rpc;
    c->stage = STAGE_NEW;
    c->status_details = grpc_empty_slice();
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->request_md);
    grpc_call_error e = grpc_server_request_call(rpc->server, &c->call, &c->details, &c->request_md,
                                                 rpc->cq, rpc->cq, c);
    if (e != GRPC_CALL_OK) {
        gd_error("rpc: grpc_server_request_call failed: %d", (int)e);
        call_free(c);
    }
}

/* Starts the final batch: status (and a reply message when there is one). */
static void finish(gd_call_t *c, int status, const char *msg)
{
    gd_rpc_t *rpc = c->rpc;
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = 0;
    n++;
    if (status == GRPC_STATUS_OK && c->reply_payload) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->reply_payload;
        n++;
    }
    grpc_slice_unref(c->status_details);
    c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)status;
    ops[n].data.send_status_from_server.status_details = &c->status_details;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
    atomic_fetch_add(&rpc->calls_total, 1);
    if (status != GRPC_STATUS_OK)
        atomic_fetch_add(&rpc->calls_failed, 1);
    size_t row = c->method ? (size_t)(c->method - rpc->methods) : rpc->nmethods;
    atomic_fetch_add(&rpc->calls_by[row][status >= 0 && status < GD_RPC_CODES ? status : 2], 1);
    c->stage = STAGE_DONE;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        gd_error("rpc: %s: cannot send the reply (grpc_call_error %d)", c->path, (int)e);
        /* No completion will come: account for the call here. The loop may be the caller,
         * so the free has to be safe off the completion-queue thread, and it is. */
        call_free(c);
        atomic_fetch_sub(&rpc->inflight, 1);
        uv_async_send(&rpc->async);
    }
}

void gd_call_reply(gd_call_t *c, const ProtobufCMessage *reply)
{
    size_t len = protobuf_c_message_get_packed_size(reply);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(reply, GRPC_SLICE_START_PTR(s));
    c->reply_payload = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    gd_debug("rpc: %s -> OK (%zu bytes)", c->path, len);
    finish(c, GRPC_STATUS_OK, NULL);
}

void gd_call_fail(gd_call_t *c, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gd_debug("rpc: %s -> %s: %s", c->path, gd_status_name(status), msg);
    finish(c, status, msg);
}

const char *gd_call_method(const gd_call_t *c)
{
    return c->path;
}

static void on_new_call(gd_rpc_t *rpc, gd_call_t *c)
{
    request_one(rpc); /* keep the number of outstanding requests constant */
    atomic_fetch_add(&rpc->inflight, 1);
    size_t len = GRPC_SLICE_LENGTH(c->details.method);
    if (len >= sizeof c->path)
        len = sizeof c->path - 1;
    memcpy(c->path, GRPC_SLICE_START_PTR(c->details.method), len);
    c->path[len] = 0;
    for (size_t i = 0; i < rpc->nmethods; i++)
        if (strcmp(rpc->methods[i].path, c->path) == 0)
            c->method = &rpc->methods[i];
    if (c->method == NULL) {
        finish(c, GRPC_STATUS_UNIMPLEMENTED, "graphd does not implement this method");
        return;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->request_payload;
    c->stage = STAGE_RECV;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, c, NULL);
    if (e != GRPC_CALL_OK) {
        gd_error("rpc: %s: cannot receive the request (grpc_call_error %d)", c->path, (int)e);
        call_free(c);
        atomic_fetch_sub(&rpc->inflight, 1);
    }
}

static void on_received(gd_rpc_t *rpc, gd_call_t *c)
{
    if (c->request_payload == NULL) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, "the call carried no request message");
        return;
    }
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, c->request_payload)) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, "cannot read the request message");
        return;
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    char why[256];
    c->request = gd_request_unpack(c->method->request, GRPC_SLICE_LENGTH(s),
                                   GRPC_SLICE_START_PTR(s), why, sizeof why);
    grpc_slice_unref(s);
    if (c->request == NULL) {
        finish(c, GRPC_STATUS_INVALID_ARGUMENT, why);
        return;
    }
    pthread_mutex_lock(&rpc->lock);
    if (rpc->queue_tail)
        rpc->queue_tail->next = c;
    else
        rpc->queue_head = c;
    rpc->queue_tail = c;
    pthread_mutex_unlock(&rpc->lock);
    uv_async_send(&rpc->async);
}

static void *cq_thread(void *arg)
{
    gd_rpc_t *rpc = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(rpc->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        gd_call_t *c = ev.tag;
        switch (c->stage) {
        case STAGE_SHUTDOWN:
            atomic_store(&rpc->server_down, true);
            uv_async_send(&rpc->async);
            break;
        case STAGE_NEW:
            if (ev.success)
                on_new_call(rpc, c);
            else
                call_free(c); /* the server is shutting down */
            break;
        case STAGE_RECV:
            if (ev.success) {
                on_received(rpc, c);
            } else {
                call_free(c);
                atomic_fetch_sub(&rpc->inflight, 1);
                uv_async_send(&rpc->async);
            }
            break;
        case STAGE_DONE:
            call_free(c);
            atomic_fetch_sub(&rpc->inflight, 1);
            uv_async_send(&rpc->async);
            break;
        }
    }
    return NULL;
}

static void check_idle(gd_rpc_t *rpc)
{
    /* Once no call is in flight, stop waiting for idle client connections to go away: the
     * shutdown only completes when gRPC has torn them down. */
    if (rpc->on_idle && !atomic_load(&rpc->accepting) && atomic_load(&rpc->inflight) == 0 &&
        !atomic_load(&rpc->server_down) && !rpc->cancelled) {
        rpc->cancelled = true;
        grpc_server_cancel_all_calls(rpc->server);
    }
    if (rpc->on_idle && !rpc->idle_reported && atomic_load(&rpc->server_down) &&
        atomic_load(&rpc->inflight) == 0) {
        rpc->idle_reported = true;
        rpc->on_idle(rpc->ctx);
    }
}

static void on_async(uv_async_t *h)
{
    gd_rpc_t *rpc = h->data;
    pthread_mutex_lock(&rpc->lock);
    gd_call_t *c = rpc->queue_head;
    rpc->queue_head = rpc->queue_tail = NULL;
    pthread_mutex_unlock(&rpc->lock);
    while (c) {
        gd_call_t *next = c->next;
        c->next = NULL;
        gd_debug("rpc: %s", c->path);
        c->method->handler(rpc->ctx, c, c->request);
        c = next;
    }
    check_idle(rpc);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[4096];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (buf)
        buf[len] = 0;
    return buf;
}

static grpc_server_credentials *make_credentials(const gd_rpc_opts_t *opts)
{
    if (strncmp(opts->listen, "unix:", 5) == 0)
        return grpc_insecure_server_credentials_create();
    char *cert = read_file(opts->tls_cert), *key = read_file(opts->tls_key);
    if (cert == NULL || key == NULL) {
        gd_error("rpc: cannot read tls_cert %s or tls_key %s", opts->tls_cert, opts->tls_key);
        free(cert);
        free(key);
        return NULL;
    }
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    grpc_server_credentials *creds = grpc_ssl_server_credentials_create(NULL, &pair, 1, 0, NULL);
    free(cert);
    free(key);
    return creds;
}

int gd_rpc_start(uv_loop_t *loop, const gd_rpc_opts_t *opts, const gd_method_t *methods,
                 size_t nmethods, void *ctx, gd_rpc_t **out)
{
    gd_rpc_t *rpc = calloc(1, sizeof *rpc);
    if (rpc == NULL)
        return -1;
    rpc->methods = methods;
    rpc->nmethods = nmethods;
    rpc->calls_by = calloc(nmethods + 1, sizeof *rpc->calls_by);
    if (rpc->calls_by == NULL) {
        free(rpc);
        return -1;
    }
    rpc->ctx = ctx;
    rpc->loop = loop;
    rpc->shutdown_tag.stage = STAGE_SHUTDOWN;
    pthread_mutex_init(&rpc->lock, NULL);
    atomic_store(&rpc->accepting, true);

    grpc_init();
    grpc_arg args[2];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)opts->max_message_bytes;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = -1;
    grpc_channel_args chargs = {2, args};
    rpc->server = grpc_server_create(&chargs, NULL);
    rpc->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(rpc->server, rpc->cq, NULL);

    grpc_server_credentials *creds = opts->no_port ? NULL : make_credentials(opts);
    int port = creds ? grpc_server_add_http2_port(rpc->server, opts->listen, creds) : 0;
    if (creds)
        grpc_server_credentials_release(creds);
    if (port == 0 && !opts->no_port) {
        gd_error("rpc: cannot listen on %s", opts->listen);
        grpc_server_destroy(rpc->server);
        grpc_completion_queue_shutdown(rpc->cq);
        grpc_completion_queue_destroy(rpc->cq);
        grpc_shutdown();
        pthread_mutex_destroy(&rpc->lock);
        free(rpc->calls_by);
        free(rpc);
        return -1;
    }
    uv_async_init(loop, &rpc->async, on_async);
    rpc->async.data = rpc;
    grpc_server_start(rpc->server);
    for (int i = 0; i < REQUESTS_OUTSTANDING; i++)
        request_one(rpc);
    if (pthread_create(&rpc->thread, NULL, cq_thread, rpc) != 0) {
        gd_error("rpc: cannot start the completion-queue thread");
        abort(); /* nothing sensible to unwind to at start-up */
    }
    rpc->thread_started = true;
    *out = rpc;
    return 0;
}

void gd_rpc_add_fd(gd_rpc_t *rpc, int fd)
{
    if (!atomic_load(&rpc->accepting)) {
        close(fd);
        return;
    }
    /* gRPC 1.51 takes only insecure credentials here (it logs and returns otherwise, leaving the
     * fd open), which is all a unix socket has. */
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    grpc_server_add_channel_from_fd(rpc->server, fd, creds);
    grpc_server_credentials_release(creds);
}

void gd_rpc_shutdown(gd_rpc_t *rpc, void (*on_idle)(void *ctx))
{
    rpc->on_idle = on_idle;
    if (atomic_exchange(&rpc->accepting, false)) {
        grpc_server_shutdown_and_notify(rpc->server, rpc->cq, &rpc->shutdown_tag);
    }
    check_idle(rpc);
}

void gd_rpc_cancel_all(gd_rpc_t *rpc)
{
    grpc_server_cancel_all_calls(rpc->server);
}

static void on_async_closed(uv_handle_t *h)
{
    gd_rpc_t *rpc = h->data;
    pthread_mutex_destroy(&rpc->lock);
    free(rpc->calls_by);
    free(rpc);
}

void gd_rpc_destroy(gd_rpc_t *rpc)
{
    grpc_completion_queue_shutdown(rpc->cq);
    if (rpc->thread_started)
        pthread_join(rpc->thread, NULL);
    grpc_server_destroy(rpc->server);
    grpc_completion_queue_destroy(rpc->cq);
    grpc_shutdown();
    uv_close((uv_handle_t *)&rpc->async, on_async_closed);
}

uint64_t gd_rpc_calls_total(const gd_rpc_t *rpc)
{
    return atomic_load(&rpc->calls_total);
}

uint64_t gd_rpc_calls_failed(const gd_rpc_t *rpc)
{
    return atomic_load(&rpc->calls_failed);
}

uint64_t gd_rpc_inflight(const gd_rpc_t *rpc)
{
    return atomic_load(&rpc->inflight);
}

uint64_t gd_rpc_calls_by(const gd_rpc_t *rpc, size_t method, int code)
{
    if (method > rpc->nmethods || code < 0 || code >= GD_RPC_CODES)
        return 0;
    return atomic_load(&rpc->calls_by[method][code]);
}

size_t gd_rpc_methods(const gd_rpc_t *rpc, const gd_method_t **methods)
{
    *methods = rpc->methods;
    return rpc->nmethods;
}
