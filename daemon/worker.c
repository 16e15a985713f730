/* Workers, one per executor, their threads and their per-session queues (see worker.h). */
#include "worker.h"
#include "daemon.h"
#include "log.h"

#include <errno.h>
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

/* Polls for a job submitted after seen, for at most spin_ns or until w->hot_until, whichever
 * is later; called without the lock. */
static void spin_for_work(gd_worker_t *w, uint_fast64_t seen)
{
    if (!w->set->can_spin)
        return;
    uint64_t until = gd_now_ns() + w->set->spin_ns;
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

/* Waits on the condition variable for work or a stop, under the lock; false when idle_ns passed
 * without either (the thread should exit). */
static bool wait_for_work(gd_worker_t *w)
{
    uint64_t idle_ns = w->set->idle_ns;
    if (idle_ns == 0) {
        while (!has_work(w) && !w->stopping)
            pthread_cond_wait(&w->cond, &w->lock);
        return true;
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + idle_ns % 1000000000u;
    until.tv_sec += (time_t)(idle_ns / 1000000000u + ns / 1000000000u);
    until.tv_nsec = (long)(ns % 1000000000u);
    while (!has_work(w) && !w->stopping)
        if (pthread_cond_timedwait(&w->cond, &w->lock, &until) == ETIMEDOUT)
            return has_work(w) || w->stopping;
    return true;
}

/* Hands a job that ran to the loop for its done callback. */
static void done_push(gd_workers_t *s, gd_job_t *job)
{
    job->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->done_tail)
        s->done_tail->next = job;
    else
        s->done_head = job;
    s->done_tail = job;
    pthread_mutex_unlock(&s->lock);
    uv_async_send(&s->async);
}

static void *worker_main(void *arg)
{
    gd_worker_t *w = arg;
    char name[16]; /* "gd<uid>/<device>", as much as fits */
    char full[64];
    snprintf(full, sizeof full, "gd%u/%s", (unsigned)w->uid, w->device);
    snprintf(name, sizeof name, "%.15s", full);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&w->lock);
    for (;;) {
        if (!has_work(w) && !w->stopping && w->set->can_spin) {
            uint_fast64_t seen = atomic_load_explicit(&w->submitted, memory_order_relaxed);
            pthread_mutex_unlock(&w->lock);
            spin_for_work(w, seen);
            pthread_mutex_lock(&w->lock);
        }
        if (!wait_for_work(w) || !has_work(w)) { /* idle for idle_ns, or stopping */
            w->running = false; /* the next job starts a thread again (not once stopping) */
            break;
        }
        gd_job_t *job = take_next(w);
        pthread_mutex_unlock(&w->lock);

        bool has_done = job->done != NULL;
        job->run(job); /* may free the job when it has no done callback */
        if (has_done)
            done_push(w->set, job);

        pthread_mutex_lock(&w->lock);
    }
    atomic_fetch_sub(&w->set->threads, 1);
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

/* Runs the done callbacks of the jobs that ran (on the loop). */
static void on_done(uv_async_t *h)
{
    gd_workers_t *s = h->data;
    pthread_mutex_lock(&s->lock);
    gd_job_t *job = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->lock);
    while (job) {
        gd_job_t *next = job->next;
        job->done(job);
        job = next;
    }
}

int gd_workers_init(gd_workers_t *s, uv_loop_t *loop, uint64_t spin_us, uint64_t idle_ms)
{
    memset(s, 0, sizeof *s);
    s->loop = loop;
    /* With fewer than 4 CPUs a polling worker takes the core that the loop thread or the client
     * needs to produce the next job, and polling would slow replays down instead. */
    s->can_spin = get_nprocs() >= 4;
    s->spin_ns = s->can_spin ? spin_us * 1000u : 0;
    s->idle_ns = idle_ms * 1000000u;
    atomic_init(&s->threads, 0);
    pthread_mutex_init(&s->lock, NULL);
    if (uv_async_init(loop, &s->async, on_done) != 0) {
        gd_error("cannot make the workers' wake-up");
        pthread_mutex_destroy(&s->lock);
        return -1;
    }
    s->async.data = s;
    s->open = true;
    return 0;
}

static gd_worker_t **worker_bucket(gd_workers_t *s, const void *key)
{
    return &s->buckets[((uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull) >> 56];
}

gd_worker_t *gd_workers_find(gd_workers_t *s, const void *key)
{
    if (!s->open)
        return NULL;
    for (gd_worker_t *w = *worker_bucket(s, key); w; w = w->hash_next)
        if (w->key == key)
            return w;
    return NULL;
}

gd_worker_t *gd_workers_get(gd_workers_t *s, const void *key, uid_t uid, const char *device)
{
    if (!s->open || s->stopping)
        return NULL;
    gd_worker_t *w = gd_workers_find(s, key);
    if (w != NULL)
        return w;
    if ((w = calloc(1, sizeof *w)) == NULL ||
        (w->daemon_q = calloc(1, sizeof *w->daemon_q)) == NULL) {
        gd_error("out of memory making the worker of uid %u on %s", (unsigned)uid, device);
        free(w);
        return NULL;
    }
    w->set = s;
    w->key = key;
    w->uid = uid;
    snprintf(w->device, sizeof w->device, "%s", device);
    w->max_queued_replays = UINT64_MAX;
    atomic_init(&w->submitted, 0);
    atomic_init(&w->hot_until, 0);
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* for the idle timeout */
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    gd_worker_t **b = worker_bucket(s, key);
    w->hash_next = *b;
    *b = w;
    w->next = s->all;
    s->all = w;
    s->count++;
    return w;
}

/* Starts w's thread when it has none running (under w->lock): joins one that exited for
 * idleness (it has, or is about to: it let go of the lock for the last time). */
static void thread_ensure(gd_worker_t *w)
{
    if (w->running || w->set->stopping)
        return;
    if (w->has_thread) {
        pthread_join(w->thread, NULL);
        w->has_thread = false;
    }
    atomic_fetch_add(&w->set->threads, 1);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        atomic_fetch_sub(&w->set->threads, 1);
        /* The job stays queued: the next submit tries again. */
        gd_error("cannot start the worker thread of uid %u on %s", (unsigned)w->uid, w->device);
        return;
    }
    w->has_thread = w->running = true;
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
    thread_ensure(w);
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

uint64_t gd_workers_session_ended(gd_workers_t *s, uid_t uid, uint64_t session)
{
    uint64_t n = 0;
    for (gd_worker_t *w = s->open ? s->all : NULL; w; w = w->next)
        if (w->uid == uid)
            n += gd_worker_session_ended(w, session);
    return n;
}

void gd_workers_stop_begin(gd_workers_t *s)
{
    s->stopping = true;
    for (gd_worker_t *w = s->open ? s->all : NULL; w; w = w->next) {
        pthread_mutex_lock(&w->lock);
        w->stopping = true;
        pthread_cond_signal(&w->cond);
        pthread_mutex_unlock(&w->lock);
    }
}

gd_worker_t *gd_workers_join(gd_workers_t *s, uint64_t wait_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(wait_ms / 1000);
    until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    for (gd_worker_t *w = s->open ? s->all : NULL; w; w = w->next) {
        /* No thread starts any more (stopping), so has_thread changes only here. */
        if (!w->has_thread)
            continue;
        if (wait_ms == 0)
            pthread_join(w->thread, NULL);
        else if (pthread_timedjoin_np(w->thread, NULL, &until) != 0)
            return w; /* still in a job: left as it is, for the caller to kill or exit around */
        w->has_thread = false;
    }
    return NULL;
}

/* Runs w's queued jobs here, on the loop thread (its thread is gone): what done callbacks
 * submitted after the stop. false when it had none. */
static bool run_left(gd_worker_t *w)
{
    bool ran = false;
    while (has_work(w)) {
        gd_job_t *job = take_next(w);
        bool has_done = job->done != NULL;
        job->run(job);
        if (has_done)
            job->done(job);
        ran = true;
    }
    return ran;
}

void gd_workers_close(gd_workers_t *s)
{
    if (!s->open)
        return;
    bool more = true;
    while (more) {
        on_done(&s->async); /* the done callbacks of the last jobs */
        more = false;
        for (gd_worker_t *w = s->all; w; w = w->next)
            more = run_left(w) || more;
    }
    uv_close((uv_handle_t *)&s->async, NULL);
    while (s->all) {
        gd_worker_t *w = s->all;
        s->all = w->next;
        while (w->spare) {
            gd_jobq_t *q = w->spare;
            w->spare = q->bucket_next;
            free(q);
        }
        free(w->daemon_q);
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
    }
    memset(s->buckets, 0, sizeof s->buckets);
    s->count = 0;
    pthread_mutex_destroy(&s->lock);
    s->open = false;
}
