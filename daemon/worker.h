/*
 * Workers: one per executor (tenant uid, device), a thread that makes that executor's blocking
 * calls - captures, graph destroys, runtime pools, device memory, CUDA ordering objects, replays
 * sent on the session socket, the CONN_OPEN of replay connections. A stuck executor (a module
 * that never returns) so holds up its own uid's jobs only: another uid's jobs on the same device
 * go to another worker. Jobs come from the loop through mutex-protected queues; a job's done
 * callback runs back on the loop, woken by the one uv_async_t of the set (gd_workers_t).
 *
 * Threads. A worker is made at its executor's first job (gd_workers_get) and kept for the
 * daemon's life (a few hundred bytes, like the executor's own record in exec.c), but its thread
 * is not: the thread starts at the first job submitted to a worker that has none, and exits after
 * idle_ms without a job. A daemon that has served 1000 uids keeps threads only for those busy in
 * the last idle_ms. An idle thread polls a counter of submitted jobs for a short while (spin_us,
 * and while kept hot by gd_worker_keep_hot) before it sleeps on its condition variable: in a
 * training loop the next REPLAY comes within tens of microseconds, and a futex wake-up costs
 * about as much; past that it sleeps, so only recently busy workers ever poll.
 *
 * Queues and order, per worker. A worker holds one FIFO queue per session that has jobs queued
 * (job->session) and one for the daemon's own jobs (session 0). It serves the session queues
 * round-robin, one job per queue in turn, so a session with thousands of queued replays delays
 * another session of the same uid by at most one job per other busy session. A session's jobs
 * all go to the workers of its own uid (one per device). The rule for where a job goes:
 *   - a session's queue: everything done for that session - its replays (frame and RPC), capture
 *     steps, the destroy of each of its graphs (after that graph's queued replays), the making and
 *     destroying of its CUDA ordering objects (events.c: after the replays that use them). One
 *     session's jobs run in the order it submitted them, which is what lets the graphs a session
 *     captured in one pool share intermediates.
 *   - the daemon's queue (session 0) of the worker of the executor the job calls: work that may
 *     depend on any of that executor's jobs - freeing a device block (lifetime.c device_free_hook,
 *     handlers.c) on the worker of the executor that allocated it, after every job there that may
 *     use that memory (no other executor can: the block lives in that one's address space); and
 *     destroying a deleted pool's runtime pools, each on its uid's worker after that uid's graph
 *     destroys. A daemon job runs only after every job submitted before it to its worker, in any
 *     queue, has run; it never holds back a job submitted after it. Nothing needs to follow the
 *     jobs of every uid on a device: each executor's objects are its own.
 * A job with a drop callback (a replay) is removed from its queue, not run, when its session ends
 * (gd_workers_session_ended reaches every worker of the session's uid); every other job still
 * runs. At most max_queued_replays droppable jobs wait in one session's queue on one worker;
 * gd_worker_submit refuses the next.
 */
#ifndef GD_WORKER_H
#define GD_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

typedef struct gd_job gd_job_t;
struct gd_job {
    void (*run)(gd_job_t *job);  /* on the worker thread */
    void (*done)(gd_job_t *job); /* on the loop thread; NULL: none (run owns the job) */
    /* On the loop thread, instead of run and done, when the job's session ended before the job
     * ran; frees the job. NULL: the job runs whatever happens (destroys, frees). */
    void (*drop)(gd_job_t *job);
    uint64_t session; /* the queue it goes to: its session's id, or 0 for the daemon's */
    uint64_t ticket;  /* submission order on its worker (set by gd_worker_submit) */
    gd_job_t *next;
};

typedef struct gd_jobq gd_jobq_t; /* one queue (worker.c) */
typedef struct gd_workers gd_workers_t;
#define GD_WORKER_BUCKETS 64

typedef struct gd_worker {
    gd_workers_t *set;
    const void *key; /* its executor (gd_exec_t), by which the set finds it */
    uid_t uid;
    char device[32];
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool has_thread;     /* thread was created and is not joined yet (under lock) */
    bool running;        /* thread serves the queues: it has not exited for idleness (under lock) */
    gd_jobq_t *daemon_q; /* session 0's queue, always there */
    gd_jobq_t *ring;     /* session queues with jobs; the next one to serve */
    gd_jobq_t *buckets[GD_WORKER_BUCKETS]; /* the same queues by session id */
    gd_jobq_t *spare;                      /* emptied queues kept for reuse */
    size_t nspare;
    uint64_t tickets;            /* jobs ever submitted, under lock */
    uint64_t max_queued_replays; /* set by the loop; read by gd_worker_submit */
    bool stopping;
    atomic_uint_fast64_t submitted; /* jobs ever queued: what an idle worker polls */
    atomic_uint_fast64_t hot_until; /* gd_now_ns() before which an idle worker keeps polling */
    struct gd_worker *hash_next;    /* in the set's bucket */
    struct gd_worker *next;         /* every worker of the set */
} gd_worker_t;

#define GD_WORKERS_BUCKETS 256

/* Every worker of a daemon, and what they share: the loop's wake-up for done callbacks. Owned by
 * the loop thread, but for the done list (lock) and threads (atomic). */
struct gd_workers {
    uv_loop_t *loop;
    uv_async_t async; /* done callbacks of every worker */
    pthread_mutex_t lock;
    gd_job_t *done_head, *done_tail; /* ran, waiting for their done callback (under lock) */
    gd_worker_t *buckets[GD_WORKERS_BUCKETS];
    gd_worker_t *all;
    size_t count;
    bool can_spin;       /* polling allowed at all: 4 CPUs or more */
    uint64_t spin_ns;    /* how long an idle worker polls before sleeping */
    uint64_t idle_ns;    /* how long a thread waits for a job before it exits (0: never exits) */
    bool open;           /* between gd_workers_init and gd_workers_close */
    bool stopping;       /* gd_workers_stop_begin: no new worker, no new thread */
    atomic_uint threads; /* worker threads running now */
};

/* On the loop: an empty set; an idle worker polls for spin_us before it sleeps on its queue (0:
 * never polls; so with fewer than 4 CPUs) and its thread exits after idle_ms without a job (0:
 * never). 0 or -1 (logged). */
int gd_workers_init(gd_workers_t *s, uv_loop_t *loop, uint64_t spin_us, uint64_t idle_ms);
/* The worker of key (an executor, of uid on device), made on first use; its thread starts at its
 * first job. NULL when out of memory (logged) or after gd_workers_stop_begin. Loop thread. */
gd_worker_t *gd_workers_get(gd_workers_t *s, const void *key, uid_t uid, const char *device);
/* The worker of key, or NULL when it has none or the set is closed. Loop thread. */
gd_worker_t *gd_workers_find(gd_workers_t *s, const void *key);
/* gd_worker_session_ended on every worker of uid (the only ones the session's jobs go to);
 * returns how many jobs were dropped. Loop thread. */
uint64_t gd_workers_session_ended(gd_workers_t *s, uid_t uid, uint64_t session);
/* Asks every worker to stop once it has run what it holds; no thread starts after this. */
void gd_workers_stop_begin(gd_workers_t *s);
/* Joins the workers' threads, waiting at most wait_ms in all (0: for ever). NULL once every
 * thread is joined; else the first worker still in a job (a module that never returns: its
 * executor must be killed, or the process exit around it), whose thread is left as it is. */
gd_worker_t *gd_workers_join(gd_workers_t *s, uint64_t wait_ms);
/* After gd_workers_join returned NULL: runs the last done callbacks, and on the loop thread the
 * jobs those submitted, closes the async handle and frees the workers. */
void gd_workers_close(gd_workers_t *s);

/* Keeps the worker polling, not sleeping, while idle until gd_now_ns() reaches until (a later
 * until than the one set wins). Any thread; polling still needs 4 CPUs (gd_workers_init). */
void gd_worker_keep_hot(gd_worker_t *w, uint64_t until);
/* Queues a job on the queue of job->session (see above), starting the worker's thread when it has
 * none; loop thread only. 0, or -1 when the job has a drop callback and its session already has
 * max_queued_replays such jobs queued here (the job is not queued then, and stays the caller's).
 * Out of memory for a new queue, the job goes to the daemon's queue (logged): it still runs after
 * everything submitted before it. */
int gd_worker_submit(gd_worker_t *w, gd_job_t *job);
/* Removes the session's queued jobs that have a drop callback and calls it for each (on the loop
 * thread); returns how many. Its other jobs stay queued and run. */
uint64_t gd_worker_session_ended(gd_worker_t *w, uint64_t session);

#endif
