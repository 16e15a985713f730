/* Device worker threads (see worker.h). */
#include "worker.h"
#include "daemon.h"
#include "log.h"

#include <stdio.h>
#include <string.h>
#include <sys/sysinfo.h>

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
        if (w->head == NULL && !w->stopping && w->can_spin) {
            uint_fast64_t seen = atomic_load_explicit(&w->submitted, memory_order_relaxed);
            pthread_mutex_unlock(&w->lock);
            spin_for_work(w, seen);
            pthread_mutex_lock(&w->lock);
        }
        while (w->head == NULL && !w->stopping)
            pthread_cond_wait(&w->cond, &w->lock);
        if (w->head == NULL && w->stopping)
            break;
        gd_job_t *job = w->head;
        w->head = job->next;
        if (w->head == NULL)
            w->tail = NULL;
        pthread_mutex_unlock(&w->lock);

        job->next = NULL;
        bool has_done = job->done != NULL;
        job->run(job); /* may free the job when it has no done callback */

        pthread_mutex_lock(&w->lock);
        if (has_done) {
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
        return -1;
    }
    return 0;
}

void gd_worker_submit(gd_worker_t *w, gd_job_t *job)
{
    job->next = NULL;
    pthread_mutex_lock(&w->lock);
    if (w->tail)
        w->tail->next = job;
    else
        w->head = job;
    w->tail = job;
    atomic_fetch_add_explicit(&w->submitted, 1, memory_order_release);
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

void gd_worker_stop(gd_worker_t *w)
{
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    on_done(&w->async); /* run the done callbacks of the last jobs */
    uv_close((uv_handle_t *)&w->async, NULL);
}
