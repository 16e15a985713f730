/*
 * Device workers: one thread per device runs every load, capture and replay for that device.
 * Jobs come from the loop through mutex-protected queues; a job's done callback runs back on the
 * loop, woken by a uv_async_t. An idle worker polls a counter of submitted jobs for a short while
 * before it sleeps on the condition variable: in a training loop the next REPLAY comes within
 * tens of microseconds, and a futex wake-up costs about as much.
 *
 * Queues and order. A worker holds one FIFO queue per session that has jobs queued (job->session)
 * and one for the daemon's own jobs (session 0). It serves the session queues round-robin, one
 * job per queue in turn, so a session with thousands of queued replays delays another session's
 * next job by at most one job per other busy session. The rule for where a job goes:
 *   - a session's queue: everything done for that session - its replays (frame and RPC), capture
 *     steps, the destroy of each of its graphs (after that graph's queued replays), the making and
 *     destroying of its CUDA ordering objects (events.c: after the replays that use them). One
 *     session's jobs run in the order it submitted them, which is what lets the graphs a session
 *     captured in one pool share intermediates.
 *   - the daemon's queue (session 0): work that may depend on any session's jobs - freeing a
 *     device block (lifetime.c device_free_hook, handlers.c) after every job that may use that
 *     memory, and destroying a deleted pool's runtime pools after its graphs. A daemon job runs
 *     only after every job submitted before it, in any queue, has run; it never holds back a job
 *     submitted after it.
 * A job with a drop callback (a replay) is removed from its queue, not run, when its session ends
 * (gd_worker_session_ended); every other job still runs. At most max_queued_replays droppable jobs
 * wait in one session's queue on one worker; gd_worker_submit refuses the next.
 */
#ifndef GD_WORKER_H
#define GD_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
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
#define GD_WORKER_BUCKETS 64

typedef struct gd_worker {
    char device[32];
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    gd_jobq_t *daemon_q;                   /* session 0's queue, always there */
    gd_jobq_t *ring;                       /* session queues with jobs; the next one to serve */
    gd_jobq_t *buckets[GD_WORKER_BUCKETS]; /* the same queues by session id */
    gd_jobq_t *spare;                      /* emptied queues kept for reuse */
    size_t nspare;
    uint64_t tickets;                /* jobs ever submitted, under lock */
    uint64_t max_queued_replays;     /* set by the loop; read by gd_worker_submit */
    gd_job_t *done_head, *done_tail; /* ran, waiting for their done callback */
    bool stopping;
    atomic_uint_fast64_t submitted; /* jobs ever queued: what an idle worker polls */
    bool can_spin;                  /* polling allowed at all: 4 CPUs or more */
    uint64_t spin_ns;               /* how long an idle worker polls before sleeping */
    atomic_uint_fast64_t hot_until; /* gd_now_ns() before which an idle worker keeps polling */
    uv_async_t async;
} gd_worker_t;

/* Starts the thread; an idle worker polls for spin_us before it sleeps on the queue (0: never
 * polls). 0 or -1 (logged). */
int gd_worker_start(gd_worker_t *w, uv_loop_t *loop, const char *device, uint64_t spin_us);
/* Keeps the worker polling, not sleeping, while idle until gd_now_ns() reaches until (a later
 * until than the one set wins). Any thread; polling still needs 4 CPUs (gd_worker_start). */
void gd_worker_keep_hot(gd_worker_t *w, uint64_t until);
/* Queues a job on the queue of job->session (see above); loop thread only. 0, or -1 when the job
 * has a drop callback and its session already has max_queued_replays such jobs queued here (the
 * job is not queued then, and stays the caller's). Out of memory for a new queue, the job goes to
 * the daemon's queue (logged): it still runs after everything submitted before it. */
int gd_worker_submit(gd_worker_t *w, gd_job_t *job);
/* Removes the session's queued jobs that have a drop callback and calls it for each (on the loop
 * thread); returns how many. Its other jobs stay queued and run. */
uint64_t gd_worker_session_ended(gd_worker_t *w, uint64_t session);
/* Runs the jobs already queued, then stops and joins the thread and closes the async handle. */
void gd_worker_stop(gd_worker_t *w);
/* The same, waiting at most wait_ms (0: for ever) for the job the worker is in. false when it is
 * still in it (a module that never returns): the thread and the worker are left as they are, and
 * the caller must not free what the job may touch; the process should exit. */
bool gd_worker_stop_within(gd_worker_t *w, uint64_t wait_ms);

#endif
