/*
 * Executors: the processes that run module code. The daemon starts one per (tenant uid, device)
 * the first time that tenant needs the device, and talks to it over the channel of
 * graph_runtime/exec_proto.h. This file is the daemon's side: it starts, bounds, kills and
 * restarts executors, and mirrors graph_runtime's C ABI with handles that name an object in one
 * executor (gd_exec_* for gr_*). The daemon never loads libtorch modules itself.
 *
 * Threads. Each call waits for its executor's answer, one caller at a time per executor (x->mu).
 * The daemon makes every call on the executor's own worker (worker.h: one per executor, so a
 * stuck executor holds up no other executor's calls): module loads on the uid's cpu:0 worker,
 * and every call on an object on the worker of the object's executor (gd_exec_graph_exec,
 * gd_exec_block_exec). None may be made on the loop thread, except those marked "never blocks"
 * (and at shutdown, once the workers are joined). A call that takes longer than its bound kills
 * the executor (SIGKILL) and fails with GR_ETIMEDOUT; so does one whose executor dies (GR_ELOST)
 * or is killed by the memory watchdog (GR_ENOMEM). The next call to that (uid, device) starts a
 * fresh executor; objects of the old one fail with GR_ELOST (destroying them succeeds and does
 * nothing).
 */
#ifndef GD_EXEC_H
#define GD_EXEC_H

#include "hist.h"
#include "runtime.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct gd_exec_host gd_exec_host_t; /* every executor of a daemon */
typedef struct gd_exec gd_exec_t;           /* one executor: (uid, device) */

typedef struct gd_exec_opts {
    const char *path;      /* the graphd-executor binary */
    uint64_t load_ms;      /* bound on loading a module (0: none) */
    uint64_t capture_ms;   /* on each capture step, and every call but loads and replays */
    uint64_t replay_ms;    /* on one replay */
    uint64_t memory_bytes; /* executor resident memory; over it the watchdog kills (0: none) */
    int intra_op_threads;
    int cpu_devices;
    uint64_t max_unpacked;   /* gr_module_max_unpacked in each executor */
    uint64_t call_memory;    /* gr_call_memory_max in each executor */
    bool sandbox;            /* false: executors skip Landlock and seccomp (logged) */
    bool spin;               /* poll for answers briefly before sleeping (4 CPUs or more) */
    uint64_t replay_spin_us; /* with spin: an executor polls this long after a device replay */
    uint64_t spin_slice_us;  /* while it polls: user-space ring watch between polls */
    uint64_t reply_max;      /* bytes of answers a direct connection may leave unread */
    uint64_t cuda_queues;    /* CUDA_DEVICE_MAX_CONNECTIONS of a CUDA executor (0: unset) */
    /* [optional] memory.max per executor where it is on (cgroup.h); not owned. The RSS
     * watchdog bounds executors that are not under it, and reports the RSS of all. */
    struct gd_cgroup *cgroup;
} gd_exec_opts_t;

/* What status shows of one executor. */
typedef struct gd_exec_info {
    uid_t uid;
    char device[GR_DEVICE_MAX];
    int pid;         /* 0 when not running */
    uint64_t rss;    /* bytes, as the watchdog last read it */
    uint32_t starts; /* processes started for it */
    uint32_t killed_time, killed_memory, died;
    char sandbox[512]; /* "landlock ABI 7, seccomp" or what is off; then its memory bound */
} gd_exec_info_t;

/* opts is copied. 0 or -1 (logged). */
int gd_exec_host_create(const gd_exec_opts_t *opts, gd_exec_host_t **out);
/* Ends every executor (EOF, then SIGKILL after grace_ms) and frees the host. No call may be in
 * flight. */
void gd_exec_host_destroy(gd_exec_host_t *h, uint64_t grace_ms);
/* Changes the time and memory bounds (SIGHUP). Never blocks. */
void gd_exec_host_bounds(gd_exec_host_t *h, uint64_t load_ms, uint64_t capture_ms,
                         uint64_t replay_ms, uint64_t memory_bytes);
/* The executor of (uid, device), made on first use (its process starts at its first call).
 * Never blocks; NULL only when out of memory. */
gd_exec_t *gd_exec_get(gd_exec_host_t *h, uid_t uid, const char *device);
/* SIGKILLs every executor (a stop that cannot wait for them). Never blocks. */
void gd_exec_host_kill_all(gd_exec_host_t *h);
/* The memory watchdog: reads each executor's resident memory and kills one over the bound.
 * Never blocks (reads /proc); for a timer on the loop. */
void gd_exec_host_watch(gd_exec_host_t *h);
/* Two-call pattern over the executors. Never blocks. */
size_t gd_exec_host_list(gd_exec_host_t *h, gd_exec_info_t *items, size_t max);
/* Which protections the executors started so far lacked ("" when none). Never blocks. */
void gd_exec_host_off(gd_exec_host_t *h, char *buf, size_t len);

/* This thread's message of its last failed gd_exec_ call. */
const char *gd_exec_last_error(void);

/* ---- modules ----------------------------------------------------------------------------- */
/* A module holds its archive's bytes, so that each executor that needs it can load it there. */
typedef struct gd_xmodule gd_xmodule_t;
/* Loads in x (the registration's check: it runs the module's unpickling there). */
int gd_exec_module_load(gd_exec_t *x, const void *bytes, size_t len, gd_xmodule_t **out,
                        gr_module_info_t *info /* [out] */);
/* Drops the module; its copies in executors are released at their next call. Never blocks. */
void gd_exec_module_release(gd_xmodule_t *m);

/* ---- pools, captures, graphs -------------------------------------------------------------- */
typedef struct gd_xpool gd_xpool_t;
typedef struct gd_xcapture gd_xcapture_t;
typedef struct gd_xgraph gd_xgraph_t;
typedef struct gd_xblock gd_xblock_t; /* device memory (gr_device_alloc) */
typedef struct gd_xevent gd_xevent_t;
typedef struct gd_xseq gd_xseq_t;

int gd_exec_pool_create(gd_exec_t *x, const char *device, gd_xpool_t **out);
int gd_exec_pool_destroy(gd_xpool_t *p); /* NULL: no-op */
int gd_exec_pool_memory(gd_xpool_t *p, uint64_t *reserved, uint64_t *in_use);
/* true when p's executor was restarted since p was made. Never blocks. */
bool gd_exec_pool_lost(const gd_xpool_t *p);

typedef struct gd_xcallable {
    gd_xmodule_t *module;
    const char *method;
    size_t n_args;
    const gr_arg_spec_t *args;
} gd_xcallable_t;

typedef struct gd_xcapture_opts {
    int num_warmup_iters, allow_unused_input;
    gd_xpool_t *pool;
    int resident, copy_param_grads, reuse_warmup;
} gd_xcapture_opts_t;

/* gr_capture_prepare in x; the modules are loaded there first where they are not yet. */
int gd_exec_capture_prepare(gd_exec_t *x, const char *device, size_t n, const gd_xcallable_t *specs,
                            const gd_xcapture_opts_t *opts, gd_xcapture_t **out);
/* Callable i's static tensor count and block size. Never blocks. */
int gd_exec_capture_layout(const gd_xcapture_t *c, size_t i, size_t *count, uint64_t *total);
/* Where callable i's static block is: a host region's memfd (fd, mapped length) or a device
 * block. */
typedef struct gd_xbase {
    int fd;
    uint64_t len;
    gd_xblock_t *block;
} gd_xbase_t;
/* c is consumed either way. */
int gd_exec_capture_finish(gd_xcapture_t *c, const gd_xbase_t *bases, gd_xgraph_t **graphs);
int gd_exec_capture_abort(gd_xcapture_t *c); /* NULL: no-op */

/* The graph's info, layout and external tensors as the capture reported them. Never block. */
void gd_exec_graph_info(const gd_xgraph_t *g, gr_graph_info_t *out);
size_t gd_exec_graph_layout(const gd_xgraph_t *g, const gr_tensor_desc_t **descs);
size_t gd_exec_graph_external(const gd_xgraph_t *g, const gr_external_t **items);
/* One replay: plain, ordered (wait and done events) or posted (seq and n). */
int gd_exec_graph_replay(gd_xgraph_t *g, int phase, gd_xevent_t *wait, gd_xevent_t *done,
                         gd_xseq_t *seq, uint64_t n, uint64_t *elapsed_ns);
/* The figures of the replays that came to g's executor directly (GRAPH_BIND). Never blocks. */
typedef struct gd_xstats {
    uint64_t forward, backward, errors;
    gx_hist_t latency;
} gd_xstats_t;
void gd_exec_graph_stats(const gd_xgraph_t *g, gd_xstats_t *out);
/* NULL: no-op. last (optional) gets g's direct figures as of its end. */
int gd_exec_graph_destroy(gd_xgraph_t *g, gd_xstats_t *last);

/* ---- the direct data plane (exec_proto.h) ------------------------------------------------- */
/* Hands fd, a socket whose other end session's client holds, to g's executor (CONN_OPEN); the
 * caller still closes its fd. */
int gd_exec_conn_open(gd_xgraph_t *g, uint64_t session, int fd);
/* Lets session replay g over its connections as handle (the daemon's graph id). */
int gd_exec_graph_bind(gd_xgraph_t *g, uint64_t session, uint64_t handle);
/* The session's counters / events for its posted / ordered direct replays. */
int gd_exec_seq_bind(gd_xseq_t *s, uint64_t session);
int gd_exec_events_bind(gd_xevent_t *wait, gd_xevent_t *done, uint64_t session);
/* g's executor and the generation of its process. Never blocks. */
gd_exec_t *gd_exec_graph_exec(const gd_xgraph_t *g, uint64_t *gen);
/* Whether the process of gen is gone (killed, dead, or restarted since): then *rc and msg say
 * how, the bound it passed if any. Never blocks. */
bool gd_exec_lost(gd_exec_t *x, uint64_t gen, int *rc, char *msg, size_t len);
/* What every executor counted on its direct connections. Never blocks. */
void gd_exec_host_direct(gd_exec_host_t *h, uint64_t *replays_dropped, uint64_t *dropped_conns);

/* ---- device memory and ordering objects ---------------------------------------------------- */
int gd_exec_device_alloc(gd_exec_t *x, const char *device, uint64_t bytes, gd_xblock_t **out,
                         uint8_t handle[GR_IPC_HANDLE_SIZE]);
int gd_exec_device_free(gd_xblock_t *b); /* NULL: no-op */
/* The executor b lives in (whose worker frees it: worker.h). Never blocks. */
gd_exec_t *gd_exec_block_exec(const gd_xblock_t *b);
int gd_exec_event_create(gd_exec_t *x, const char *device, gd_xevent_t **out,
                         uint8_t handle[GR_IPC_HANDLE_SIZE]);
int gd_exec_event_open(gd_exec_t *x, const char *device, const uint8_t handle[GR_IPC_HANDLE_SIZE],
                       gd_xevent_t **out);
int gd_exec_event_destroy(gd_xevent_t *e); /* NULL: no-op */
int gd_exec_seq_create(gd_exec_t *x, const char *device, gd_xseq_t **out,
                       uint8_t handle[GR_IPC_HANDLE_SIZE]);
/* gr_seq_skip. Never blocks: it goes on the executor's urgent socket. */
int gd_exec_seq_skip(gd_xseq_t *s, uint64_t n);
/* Ends every wait on the counters at once (gr_seq_release). Never blocks: it goes on the
 * executor's urgent socket. */
int gd_exec_seq_release(gd_xseq_t *s);
int gd_exec_seq_destroy(gd_xseq_t *s); /* NULL: no-op */

#endif
