/* Device worker threads and their per-session queues (see worker.h). */
#include "worker.h"
#include "daemon.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/sysinfo.h>

#define MAX_SPARE 16

struct gd_jobq {
    uint64_t session;
    gd_job_t *head, *tail;
    uint64_t droppable;               /* queued jobs with a drop callback */
    gd_jobq_t *ring_next, *ring_prev; /* circular, while it holds jobs (session queues only) */
    gd_jobq_t *bucket_next;
};

static gd_jobq_t **bucket_of(gd_worker_t *w, uint64_t session)
{
    return &w->buckets[(session * 0x9E3779B97F4A7C15ull) >> 58];
}

static gd_jobq_t *queue_find(gd_worker_t *w, uint64_t session)
{
    for (gd_jobq_t *q = *bucket_of(w, session); q; q = q->bucket_next)
        if (q->session == session)
            return q;
    return NULL;
}

/* The session's queue, made (and put last in the ring) when it has none; NULL without memory. */
static gd_jobq_t *queue_get(gd_worker_t *w, uint64_t session)
{
    gd_jobq_t *q = queue_find(w, session);
    if (q)
        return q;
    if (w->spare) {
        q = w->spare;
        w->spare = q->bucket_next;
        w->nspare--;
    } else if ((q = malloc(sizeof *q)) == NULL) {
        return NULL;
    }
    memset(q, 0, sizeof *q);
    q->session = session;
    gd_jobq_t **b = bucket_of(w, session);
    q->bucket_next = *b;
    *b = q;
    if (w->ring) {
        q->ring_next = w->ring;
        q->ring_prev = w->ring->ring_prev;
        q->ring_prev->ring_next = q;
        w->ring->ring_prev = q;
    } else {
        w->ring = q->ring_next = q->ring_prev = q;
    }
    return q;
}

/* Forgets an emptied session queue (it is kept for reuse). */
static void queue_retire(gd_worker_t *w, gd_jobq_t *q)
{
    gd_jobq_t **pp = bucket_of(w, q->session);
    while (*pp != q)
        pp = &(*pp)->bucket_next;
    *pp = q->bucket_next;
    if (q->ring_next == q) {
        w->ring = NULL;
    } else {
        q->ring_prev->ring_next = q->ring_next;
        q->ring_next->ring_prev = q->ring_prev;
        if (w->ring == q)
            w->ring = q->ring_next;
    }
    if (w->nspare < MAX_SPARE) {
        q->bucket_next = w->spare;
        w->spare = q;
        w->nspare++;
    } else {
        free(q);
    }
}

static void queue_push(gd_jobq_t *q, gd_job_t *job)
{
    job->next = NULL;
    if (q->tail)
        q->tail->next = job;
    else
        q->head = job;
    q->tail = job;
    if (job->drop)
        q->droppable++;
}

static gd_job_t *queue_pop(gd_jobq_t *q)
{
    gd_job_t *job = q->head;
    q->head = job->next;
    if (q->head == NULL)
        q->tail = NULL;
    if (job->drop)
        q->droppable--;
    job->next = NULL;
    return job;
}

static bool has_work(const gd_worker_t *w)
{
    return w->ring != NULL || w->daemon_q->head != NULL;
}

/* The next job to run, under the lock (has_work): the daemon queue's first job once every job
 * submitted before it has run, else the next session queue's first, round-robin. */
static gd_job_t *take_next(gd_worker_t *w)
{
    gd_job_t *dj = w->daemon_q->head;
    if (dj != NULL) {
        bool earlier = false;
        for (gd_jobq_t *q = w->ring; q && !earlier;
             q = q->ring_next == w->ring ? NULL : q->ring_next)
            earlier = q->head->ticket < dj->ticket;
        if (!earlier)
            return queue_pop(w->daemon_q);
    }
    gd_jobq_t *q = w->ring;
    gd_job_t *job = queue_pop(q);
    w->ring = q->ring_next;
    if (q->head == NULL)
        queue_retire(w, q);
    return job;
}

/* Polls for a job submitted after seen, for at most w->spin_ns or until w->hot_until, whichever
 * is later; called without the lock. */
static void spin_for_work(gd_worker_t *w, uint_fast64_t seen)
{
    if (!w->can_spin)
        return;
    uint64_t until = gd_now_ns() + w->spin_ns;
    do {
        uint64_t hot = atomic_load_explicit(&w->hot_until, memory_order_relaxed);
        if (hot > until)
            until = hot;
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(&w->submitted, memory_order_acquire) != seen)
                return;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
    } while (gd_now_ns() < until);
}

static void *worker_main(void *arg)
{
    gd_worker_t *w = arg;
    char name[16];
    snprintf(name, sizeof name, "gd-%.12s", w->device);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&w->lock);
    for (;;) {
        if (!has_work(w) && !w->stopping && w->can_spin) {
            uint_fast64_t seen = atomic_load_explicit(&w->submitted, memory_order_relaxed);
            pthread_mutex_unlock(&w->lock);
            spin_for_work(w, seen);
            pthread_mutex_lock(&w->lock);
        }
        while (!has_work(w) && !w->stopping)
            pthread_cond_wait(&w->cond, &w->lock);
        if (!has_work(w) && w->stopping)
            break;
        gd_job_t *job = take_next(w);
        pthread_mutex_unlock(&w->lock);

        bool has_done = job->done != NULL;
        job->run(job); /* may free the job when it has no done callback */

        pthread_mutex_lock(&w->lock);
        if (has_done) {
            job->next = NULL;
            if (w->done_tail)
                w->done_tail->next = job;
            else
                w->done_head = job;
            w->done_tail = job;
            uv_async_send(&w->async);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

void gd_worker_keep_hot(gd_worker_t *w, uint64_t until)
{
    uint_fast64_t cur = atomic_load_explicit(&w->hot_until, memory_order_relaxed);
    while (cur < until &&
           !atomic_compare_exchange_weak_explicit(&w->hot_until, &cur, until, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

static void on_done(uv_async_t *h)
{
    gd_worker_t *w = h->data;
    pthread_mutex_lock(&w->lock);
    gd_job_t *job = w->done_head;
    w->done_head = w->done_tail = NULL;
    pthread_mutex_unlock(&w->lock);
    while (job) {
        gd_job_t *next = job->next;
        job->done(job);
        job = next;
    }
}

int gd_worker_start(gd_worker_t *w, uv_loop_t *loop, const char *device, uint64_t spin_us)
{
    memset(w, 0, sizeof *w);
    snprintf(w->device, sizeof w->device, "%s", device);
    w->daemon_q = calloc(1, sizeof *w->daemon_q);
    if (w->daemon_q == NULL) {
        gd_error("out of memory starting the worker for %s", device);
        return -1;
    }
    w->max_queued_replays = UINT64_MAX;
    /* With fewer than 4 CPUs a polling worker takes the core that the loop thread or the client
     * needs to produce the next job, and polling would slow replays down instead. */
    w->can_spin = get_nprocs() >= 4;
    w->spin_ns = w->can_spin ? spin_us * 1000u : 0;
    atomic_init(&w->submitted, 0);
    atomic_init(&w->hot_until, 0);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    uv_async_init(loop, &w->async, on_done);
    w->async.data = w;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        gd_error("cannot start the worker thread for %s", device);
        uv_close((uv_handle_t *)&w->async, NULL);
        free(w->daemon_q);
        w->daemon_q = NULL;
        return -1;
    }
    return 0;
}

int gd_worker_submit(gd_worker_t *w, gd_job_t *job)
{
    pthread_mutex_lock(&w->lock);
    gd_jobq_t *q = job->session != 0 ? queue_get(w, job->session) : w->daemon_q;
    if (q == NULL) {
        gd_error("out of memory for session %llu's queue on %s; its job goes to the daemon's",
                 (unsigned long long)job->session, w->device);
        q = w->daemon_q;
    } else if (job->drop != NULL && q->droppable >= w->max_queued_replays) {
        if (q->head == NULL)
            queue_retire(w, q);
        pthread_mutex_unlock(&w->lock);
        return -1;
    }
    job->ticket = w->tickets++;
    queue_push(q, job);
    atomic_fetch_add_explicit(&w->submitted, 1, memory_order_release);
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

uint64_t gd_worker_session_ended(gd_worker_t *w, uint64_t session)
{
    gd_job_t *dropped = NULL, **tail = &dropped;
    uint64_t n = 0;
    pthread_mutex_lock(&w->lock);
    gd_jobq_t *q = session != 0 ? queue_find(w, session) : NULL;
    if (q != NULL && q->droppable > 0) {
        gd_job_t *keep = NULL, **ktail = &keep, *job = q->head;
        q->tail = NULL;
        while (job) {
            gd_job_t *next = job->next;
            job->next = NULL;
            if (job->drop) {
                *tail = job;
                tail = &job->next;
                n++;
            } else {
                *ktail = job;
                ktail = &job->next;
                q->tail = job;
            }
            job = next;
        }
        q->head = keep;
        q->droppable = 0;
        if (q->head == NULL)
            queue_retire(w, q);
    }
    pthread_mutex_unlock(&w->lock);
    while (dropped) {
        gd_job_t *next = dropped->next;
        dropped->drop(dropped);
        dropped = next;
    }
    return n;
}

void gd_worker_stop(gd_worker_t *w)
{
    (void)gd_worker_stop_within(w, 0);
}

bool gd_worker_stop_within(gd_worker_t *w, uint64_t wait_ms)
{
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    if (wait_ms == 0) {
        pthread_join(w->thread, NULL);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += (time_t)(wait_ms / 1000);
        until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (pthread_timedjoin_np(w->thread, NULL, &until) != 0)
            return false; /* still in a job: left as it is, for the process to exit */
    }
    on_done(&w->async); /* run the done callbacks of the last jobs */
    uv_close((uv_handle_t *)&w->async, NULL);
    while (w->spare) {
        gd_jobq_t *q = w->spare;
        w->spare = q->bucket_next;
        free(q);
    }
    free(w->daemon_q);
    w->daemon_q = NULL;
    return true;
}
