/*
 * Device workers: one thread per device runs every load, capture and replay
 * for that device, in submission order (which is what lets the graphs one
 * session captured in a pool share intermediates). Jobs come from the loop through a
 * mutex-protected queue; a job's done callback runs back on the loop, woken by a uv_async_t. An
 * idle worker polls a counter of submitted jobs for a short while before it sleeps on the condition
 * variable: in a training loop the next REPLAY comes within tens of microseconds, and a futex
 * wake-up costs about as much.
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
    gd_job_t *next;
};

typedef struct gd_worker {
    char device[32];
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    gd_job_t *head, *tail;           /* to run */
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
/* Queues a job; safe from the loop thread only. */
void gd_worker_submit(gd_worker_t *w, gd_job_t *job);
/* Runs the jobs already queued, then stops and joins the thread and closes the async handle. */
void gd_worker_stop(gd_worker_t *w);

#endif
