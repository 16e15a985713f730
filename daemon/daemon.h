/*
 * The daemon's one context. gd_daemon_t holds the loop, the live config, the
 * pools, the sessions and the devices; the loop thread owns all of it (no
 * locks), and every function here is called on the loop thread.
 */
#ifndef GD_DAEMON_H
#define GD_DAEMON_H

#include "config.h"
#include "graphd_frame.h"
#include "pool.h"
#include "rpc.h"
#include "stats.h"
#include "worker.h"
#include "ze_layer.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define GD_PROTOCOL_VERSION 1
#define GD_MAX_DEVICES 16
#define GD_NAME_MAX 63

typedef struct gd_device {
    char id[32];   /* "cpu:0" */
    char kind[16]; /* "cpu" */
    uint32_t ordinal;
    char name[128];
    uint64_t memory_total, memory_free;
    char compute_capability[16];
    bool mps;      /* CUDA: the daemon's contexts go through an MPS server (gr_cuda_mps_pipe) */
    char uuid[33]; /* xpu: 32 hex digits */
    uint32_t compute_units, max_clock_mhz;
    char driver[96];
    bool telemetry;        /* the family reads telemetry (xpu): tel is what was last read */
    uint64_t tel_unix_ms;  /* when tel was read; 0: not yet */
    gr_ze_telemetry_t tel; /* read off the loop (xpu.c), copied here on the loop */
    bool warned_wedged, warned_health;
} gd_device_t;

/*
 * A device family as the daemon sees it (family.c): one row per kind, so that adding a family is
 * one row here plus its device layer. What differs between families is read from the row, never
 * from a "cuda" string test.
 */
typedef enum {
    GD_DEVMEM_NONE,     /* no device memory regions (cpu) */
    GD_DEVMEM_EXECUTOR, /* allocated in the tenant's executor (gr_device_alloc; cuda) */
    GD_DEVMEM_ZE        /* allocated by the daemon through the Level Zero layer (xpu) */
} gd_devmem_t;
typedef struct gd_family {
    const char *kind;      /* "cuda" */
    unsigned wire;         /* enum graphd_device_family: its code in frames */
    bool graphs;           /* this build captures and replays graphs on it */
    const char *no_graphs; /* !graphs: why, for the UNIMPLEMENTED answer */
    bool resident;         /* device_resident captures (static tensors in device memory) */
    gd_devmem_t memory;    /* who allocates AllocRegion's device memory */
    bool ordering;         /* EVENTS / SEQ frames, ordered and posted replays */
    bool ze_events;        /* EVENTS: a Level Zero IPC event pool the daemon makes (xpu_events.c) */
    bool mps_check;        /* warn at start when no MPS server serves the daemon's contexts */
} gd_family_t;
/* The row of a kind ("cuda") or device ("cuda:0"); NULL for a family the daemon does not know. */
const gd_family_t *gd_family_of(const char *kind_or_device);
/* The row whose wire code is wire; NULL for none. */
const gd_family_t *gd_family_of_wire(unsigned wire);
/* A frame's GRAPHD_DEVICE_CODE as "kind:index" into buf; *fam gets the family's row. false (buf
 * holds a description for the error message) for a code of no known family or above one byte. */
bool gd_device_code_name(uint64_t code, char *buf, size_t len, const gd_family_t **fam);
/* The MAP reply's message for device region r that names its device (GRAPHD_MAP_NAME_DEVICE):
 * msg holds the handle's PM_IPC_HANDLE_SIZE bytes; its pool's device's code is written after
 * them, and GRAPHD_MAP_DEVICE_PAYLOAD returned (the handle's size alone for a device of no
 * family, which the client then refuses as before). */
size_t gd_map_device_payload(const pm_region_t *r, uint8_t *msg);

typedef struct gd_conn gd_conn_t;
typedef struct gd_wire gd_wire_t;
typedef struct gd_graph gd_graph_t;
typedef struct gd_module gd_module_t;
typedef struct gd_gpool gd_gpool_t;
typedef struct gd_order gd_order_t;
typedef struct gd_link gd_link_t;
typedef struct gd_xpu_events gd_xpu_events_t;

typedef struct gd_session {
    uint64_t id;
    uint64_t token;
    char name[GD_NAME_MAX + 1];
    pid_t hello_pid; /* what Hello claimed */
    uid_t uid;       /* from SO_PEERCRED once attached */
    pid_t pid;       /* from SO_PEERCRED once attached */
    gid_t gid;
    bool attached;
    uint64_t created_unix_ms;
    uint64_t created_mono_ms;
    gd_conn_t *conn; /* the attached session-socket connection, or NULL */
    uint32_t graphs, modules;
    uint32_t capturing; /* graphs of captures in flight, counted against max_graphs_per_session */
    uint64_t capturing_since_unix_ms; /* when capturing last went from 0 up; 0 while it is 0 */
    uint64_t replays;
    gd_order_t *orders;          /* per CUDA device, events and sequence counters (events.c) */
    gd_link_t *links;            /* replay connections, one per executor it replays in (direct.c) */
    gd_xpu_events_t *xpu_events; /* per xpu device, its Level Zero IPC event pool (xpu_events.c) */
    struct gd_session *next;
} gd_session_t;

typedef struct gd_daemon {
    uv_loop_t *loop;
    gd_config_t cfg;
    const char *config_path;
    bool config_required;
    gd_overrides_t overrides;

    pm_manager_t *pools;
    gd_rpc_t *rpc;

    gd_device_t devices[GD_MAX_DEVICES];
    size_t ndevices;
    gr_ze_t *ze;         /* the Level Zero layer (xpu.c); NULL: xpu = off, or no driver */
    uv_timer_t xpu_tick; /* reads xpu telemetry off the loop */
    bool xpu_tick_on;
    bool xpu_reading;     /* a telemetry read is in flight */
    gd_workers_t workers; /* one per executor: (uid, device) */

    struct gd_exec_host *exec; /* the executors that run module code (exec.h) */
    uv_timer_t exec_watch;     /* their memory watchdog */
    struct gd_cgroup *cgroup;  /* their memory.max (cgroup.h); NULL: executor_cgroup = 0 */

    gd_graph_t *graphs;   /* every live graph */
    gd_module_t *modules; /* every session's module handles */
    gd_gpool_t *gpools;   /* runtime state of pools that have held graphs */
    uint64_t next_graph_id, next_module_id, next_link_key;

    gd_session_t *sessions;
    uint32_t nsessions;
    /* what the last STATUS= to systemd said (main.c) */
    uint32_t notified_sessions, notified_graphs, notified_capturing;
    bool notified_once;
    uint64_t next_session_id;

    uv_pipe_t session_listener;
    bool session_listener_open;
    gd_conn_t *conns; /* every open session-socket connection, attached or not */

    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t tick;
    uv_timer_t grace;
    /* While device-resident replays keep coming, the loop polls instead of sleeping in epoll
     * (replay_spin_us): active until replay_hot_until, a gd_now_ns() time. */
    uv_idle_t replay_spin;
    uint64_t replay_spin_ns, replay_hot_until;

    uint64_t started_unix_ms;
    uint64_t started_mono_ms;
    uint64_t reloads;
    uint64_t replays_dropped;      /* queued replays of ended sessions, removed unrun */
    uint64_t clients_disconnected; /* sessions ended for not reading (reply_buffer_max_bytes) */
    /* captures that started (their first step queued), how many failed, and how long each took
     * from then to its end (capture.c's capture_op_free), for the metrics */
    uint64_t captures, captures_failed;
    uint64_t warmups_reused; /* callables whose capture skipped its warm-up (reuse_warmup) */
    gd_hist_t capture_latency;
    struct gd_metrics *metrics; /* the /metrics endpoint (metrics.h); NULL: metrics_listen off */
    bool stopping;
    bool calls_cancelled; /* the grace period after SIGTERM ran out once */
    int exit_code;
} gd_daemon_t;

uint64_t gd_now_unix_ms(void);
uint64_t gd_now_mono_ms(void);
uint64_t gd_now_ns(void);

/* wire.c: the write side of a session-socket connection, shared with device workers. Sends never
 * wait: what the socket does not take now waits in the wire's buffer for the loop to flush. */
typedef enum {
    GD_WIRE_OK,
    GD_WIRE_OVERFLOW, /* the client left more than max_buffered bytes of replies unread */
    GD_WIRE_BROKEN    /* the socket failed */
} gd_wire_state_t;
/* On the loop: a wire over a dup of sock holding at most max_buffered unsent bytes. Once it fails
 * (gd_wire_state), on_fail(ctx) runs once on the loop, unless gd_wire_close came first. The caller
 * holds one reference. NULL (logged) on failure. */
gd_wire_t *gd_wire_create(uv_loop_t *loop, int sock, uint64_t max_buffered,
                          void (*on_fail)(void *ctx), void *ctx);
void gd_wire_ref(gd_wire_t *w);
void gd_wire_unref(gd_wire_t *w);
/* On the loop, once: closes the socket and drops what is buffered; later sends fail quietly. */
void gd_wire_close(gd_wire_t *w);
gd_wire_state_t gd_wire_state(gd_wire_t *w);
/* Sends one frame, its message text and optionally a descriptor (kept, as a dup, until the frame
 * starts to go out). 0, or -1 when the wire is closed or has failed. Safe from any thread. */
int gd_wire_send(gd_wire_t *w, const graphd_frame_t *f, const char *msg, int pass_fd);
/* The same with mlen bytes of payload after the frame (binary; at most GRAPHD_FRAME_MAX_MSG),
 * e.g. the IPC handle of a device region in a MAP reply. */
int gd_wire_send_bytes(gd_wire_t *w, const graphd_frame_t *f, const void *msg, size_t mlen,
                       int pass_fd);

/* lifetime.c, modules.c, capture.c, replay.c: modules, captures, graphs and replays. */
int gd_graphs_start(gd_daemon_t *d);
/* Applies the reloadable executor bounds (max_*_ms, max_executor_memory_bytes) after SIGHUP. */
void gd_graphs_reload(gd_daemon_t *d);
/* Exits the process now, with d->exit_code, leaving a thread stuck in a module's code as it is
 * (nothing can stop it, and freeing what it uses would crash): removes the socket file and
 * flushes the log first. For the stop path only. */
_Noreturn void gd_exit_around_stuck_work(gd_daemon_t *d);
/* Stops the workers (after running what they hold) and frees the runtime state. */
void gd_graphs_stop(gd_daemon_t *d);
/* Releases a session's graphs and modules (their regions go with the session's). */
void gd_graphs_session_ended(gd_daemon_t *d, gd_session_t *s);
/* A REPLAY frame from an attached session; the reply goes out on wire. */
void gd_replay_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f);
/* The worker of uid's executor on device ("cuda:0"), and that executor in *x (optional); both made
 * on first use. NULL when the device is not there, the workers are stopping, or out of memory
 * (logged). */
struct gd_exec;
gd_worker_t *gd_worker_for(gd_daemon_t *d, uid_t uid, const char *device, struct gd_exec **x);
/* Whether a pool holds graphs (it cannot be deleted then), and forgetting a deleted pool. */
void gd_graphs_pool_deleted(gd_daemon_t *d, const char *pool);
/* Status sections for graphs and per-pool graph figures (graphd.pb-c.h types; status.c): the
 * graphs viewer may see (gd_sees_session of their session; NULL: none), the others counted in
 * rep->others. */
struct Graphd__V1__StatusReply;
void gd_graphs_status(gd_daemon_t *d, const gd_session_t *viewer,
                      struct Graphd__V1__StatusReply *rep);
void gd_graphs_status_free(struct Graphd__V1__StatusReply *rep);
/* A pool's graph figures without latency (graphs, replays, graph mempool bytes), for ListPools;
 * left as they are for a pool that has held no graph. */
struct Graphd__V1__Pool;
void gd_graphs_pool_fill(gd_daemon_t *d, struct Graphd__V1__Pool *pool);

/* events.c: what orders a session's device-resident replays on a CUDA device against its
 * client's stream: CUDA IPC events (EVENTS frame, ordered replays) or sequence counters (SEQ
 * frame, posted replays), at most one of each per session and device. */
struct gr_event;
struct gr_seq;
typedef enum { GD_ORDER_EVENTS, GD_ORDER_SEQ } gd_order_kind_t;
/* An EVENTS frame (payload: the client's event handle) or a SEQ frame; the reply goes out on
 * wire. */
void gd_order_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f,
                    const uint8_t *payload);
/* The session's object of that kind for device, or NULL when it sent no such frame for it. */
gd_order_t *gd_order_find(const gd_session_t *s, const char *device, gd_order_kind_t kind);
struct gd_xevent *gd_order_wait(const gd_order_t *o);   /* EVENTS: the client's */
struct gd_xevent *gd_order_done(const gd_order_t *o);   /* EVENTS: the daemon's */
struct gd_xseq *gd_order_counters(const gd_order_t *o); /* SEQ */
/* SEQ: takes n when it is the next sequence number (the last taken plus one); false, taking
 * nothing, otherwise. */
bool gd_order_take(gd_order_t *o, uint64_t n);
uint64_t gd_order_last(const gd_order_t *o);
/* Releases the session's counters at once (every wait on them ends) and destroys its objects on
 * their workers after the replays queued there. Call before the session's graphs go. */
void gd_order_session_ended(gd_session_t *s);

/* direct.c: replay connections straight to the executors. A DIRECT frame: the session's
 * connection to the executor of graph f->id (made on its worker); the reply goes out on wire. */
void gd_direct_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f);
/* Ends the session's connections (their executors drop what they still hold of them). */
void gd_direct_session_ended(gd_session_t *s);
/* For the watchdog's tick: shuts down the connections whose executor was killed or died. */
void gd_direct_watch(gd_daemon_t *d);

/* xpu.c: xpu:N devices through the Level Zero layer (graph_runtime/ze_layer.h). */
/* In main, before any thread starts (gr_ze_open may setenv): opens the layer unless xpu = off;
 * without a driver logs one info line saying why no xpu device is listed. */
void gd_xpu_open(gd_daemon_t *d);
/* Appends the layer's devices to d->devices (gd_devices_discover). */
void gd_xpu_discover(gd_daemon_t *d);
/* Starts reading telemetry every GD_XPU_TELEMETRY_MS on libuv's thread pool. */
void gd_xpu_start(gd_daemon_t *d);
/* After the loop has ended: closes the layer. */
void gd_xpu_close(gd_daemon_t *d);
/* Allocates size bytes on xpu device index off the loop (gr_ze_alloc), zero-filled before it is
 * handed out (fresh device memory may hold another tenant's data); done runs on the loop with
 * rc (a gr_err_t), the layer's message, and on success the pointer, the export's fd (the callee
 * owns it) and handle. -1 when the work could not be queued (nothing runs). */
typedef void (*gd_xpu_alloc_done_fn)(void *ctx, int rc, const char *msg, void *ptr, int fd,
                                     const uint8_t *ipc);
int gd_xpu_alloc(gd_daemon_t *d, unsigned index, uint64_t size, gd_xpu_alloc_done_fn done,
                 void *ctx);
/* Frees an allocation of gd_xpu_alloc off the loop, and closes fd (-1: none). */
void gd_xpu_free(gd_daemon_t *d, const char *device, void *ptr, int fd);
/* The gRPC status for a layer error: RESOURCE_EXHAUSTED for GR_ENOMEM, UNAVAILABLE for GR_ELOST,
 * FAILED_PRECONDITION for GR_EUNSUPPORTED, else gr_err_grpc's. */
int gd_xpu_grpc(int rc);

/* xpu_events.c: a session's ordering events on an xpu device, one Level Zero IPC event pool per
 * session and device, host-signalled at the session's end. */
#define GD_XPU_EVENTS_DEFAULT 64 /* events in a pool when the EVENTS frame's arg is 0 */
/* An EVENTS frame for device ("xpu:0", a family with ze_events; f->arg: the number of events, 0
 * for GD_XPU_EVENTS_DEFAULT): the pool is made off the loop and the reply (handle and fd, or an
 * error) goes out on wire. */
void gd_xpu_events_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f,
                         const char *device);
/* The session's pool on device, or NULL. */
gd_xpu_events_t *gd_xpu_events_find(const gd_session_t *s, const char *device);
/* The session ended: every event of its pools is host-signalled, then the pools are destroyed,
 * off the loop. */
void gd_xpu_events_session_ended(gd_daemon_t *d, gd_session_t *s);

/* devices.c: devices[0..cpu_devices-1] are cpu:0..cpu:N-1, then come the accelerators. */
void gd_devices_discover(gd_daemon_t *d);
void gd_devices_refresh(gd_daemon_t *d);
const gd_device_t *gd_device_find(const gd_daemon_t *d, const char *id);

/* session.c: bookkeeping and the data-plane socket. */
int gd_sessions_listen(gd_daemon_t *d);
void gd_sessions_close_listener(gd_daemon_t *d);
gd_session_t *gd_session_create(gd_daemon_t *d, const char *name, pid_t pid);
gd_session_t *gd_session_find(gd_daemon_t *d, uint64_t id);
/* Ends a session: closes its connection and frees everything it owns. */
void gd_session_end(gd_daemon_t *d, gd_session_t *s, const char *why);
void gd_sessions_end_all(gd_daemon_t *d);
/* Ends sessions that did not attach within attach_timeout_ms, and closes session-socket
 * connections that sent no ATTACH within it. */
void gd_sessions_expire(gd_daemon_t *d);

/* Creates the socket's directory and removes a stale socket file; -1 (logged) if in use. */
int gd_socket_prepare(const char *path);
/* Applies socket_mode and socket_group to a socket file. */
void gd_socket_permissions(const gd_daemon_t *d, const char *path);

/* status.c: the messages for devices and pools. gd_status_devices fills storage (d->ndevices
 * entries) and returns the list (free it); gd_status_pools returns the pools viewer may use
 * (gd_may_use_pool; NULL: none), *n the count, *hidden how many it left out (free with
 * gd_status_pools_free). */
struct Graphd__V1__Device;
struct Graphd__V1__Device **gd_status_devices(gd_daemon_t *d, struct Graphd__V1__Device *storage);
void gd_status_pool(struct Graphd__V1__Pool *m, const pm_pool_t *p);
struct Graphd__V1__Pool **gd_status_pools(gd_daemon_t *d, const gd_session_t *viewer, size_t *n,
                                          uint32_t *hidden);
void gd_status_pools_free(struct Graphd__V1__Pool **list, size_t n);
void gd_rpc_status(void *ctx, gd_call_t *call, const ProtobufCMessage *req);

/* handlers.c */
extern const gd_method_t gd_methods[];
extern const size_t gd_methods_count;
/* Finds the caller's session; on failure finishes the call and returns NULL. */
struct Graphd__V1__SessionRef;
gd_session_t *gd_session_of(gd_daemon_t *d, gd_call_t *call,
                            const struct Graphd__V1__SessionRef *ref);
/* As gd_session_of, and FAILED_PRECONDITION (naming what) for a session whose socket is not
 * attached: it has no owner yet and may only attach. For every session call but Goodbye. */
gd_session_t *gd_attached_session_of(gd_daemon_t *d, gd_call_t *call,
                                     const struct Graphd__V1__SessionRef *ref, const char *what);

/* Status and ListPools: the caller's session when the request names one (it must be attached),
 * else *out NULL (an anonymous caller). false when the call failed. */
bool gd_viewer_of(gd_daemon_t *d, gd_call_t *call, const struct Graphd__V1__SessionRef *ref,
                  gd_session_t **out);

/* tenants.c: ownership and visibility (docs/PROTOCOL.md). An admin is an attached session of uid
 * 0 or of the daemon's uid. */
bool gd_is_admin(const gd_session_t *s);
/* Whether s may allocate regions and capture in p (its mode, or s is an admin). */
bool gd_may_use_pool(const gd_session_t *s, const pm_pool_t *p);
/* Whether viewer (NULL: anonymous) sees session s in full: an admin, or the same uid. */
bool gd_sees_session(const gd_session_t *viewer, const gd_session_t *s);
/* gd_may_use_pool, else fails the call with PERMISSION_DENIED naming the pool's owner and mode. */
bool gd_pool_use_check(gd_call_t *call, const gd_session_t *s, const pm_pool_t *p);
/* Whether s owns p or is an admin, else fails the call (PERMISSION_DENIED); what: "delete". */
bool gd_pool_owner_check(gd_call_t *call, const gd_session_t *s, const pm_pool_t *p,
                         const char *what);
/* A wire PoolMode as pm_mode_t (unspecified: private); -1 for an unknown value. */
int gd_pool_mode_from_wire(int wire);
const char *gd_pool_mode_name(int mode);
/* Attached sessions of uid; pools owned by uid (the default pool not counted). */
uint32_t gd_uid_sessions(const gd_daemon_t *d, uid_t uid);
uint32_t gd_uid_pools(const gd_daemon_t *d, uid_t uid);
/* Deletes an empty pool and forgets its graph state: pm_pool_delete's code. */
int gd_pool_delete(gd_daemon_t *d, const char *name);
/* Deletes the pools whose session (pm_pool_owner_t.session) has ended and that are empty. */
void gd_pools_session_ended(gd_daemon_t *d);

/* RPC handlers in modules.c, capture.c, replay.c and lifetime.c */
void gd_rpc_register_module(void *ctx, gd_call_t *call, const ProtobufCMessage *req);
void gd_rpc_release_module(void *ctx, gd_call_t *call, const ProtobufCMessage *req);
void gd_rpc_capture(void *ctx, gd_call_t *call, const ProtobufCMessage *req);
void gd_rpc_replay(void *ctx, gd_call_t *call, const ProtobufCMessage *req);
void gd_rpc_release_graph(void *ctx, gd_call_t *call, const ProtobufCMessage *req);

/* pm_region_tag of a device region AllocRegion made: the session's own buffer, which FreeRegion
 * may free (a device-resident graph's region, tag 0, goes only with its graph). */
#define GD_REGION_TAG_DEVICE_BUFFER 1u

#endif
