/*
 * One client cannot freeze or starve the others (issue 14): a client that sends replays and never
 * reads the replies is disconnected at reply_buffer_max_bytes while another session's replays
 * keep their pace; sessions sharing a device are served round-robin, so one with a full queue
 * of slow replays delays another by a few of its jobs, not all of them; a session that queues
 * 20,000 slow replays and exits has them dropped, not run; and max_queued_replays answers the
 * replay past it RESOURCE_EXHAUSTED.
 *
 * Each test starts its own daemon (the bounds differ); the models come from
 * tests/models/make_models.py: mlp.pt (fast) and slow.pt (64 rounds of tanh(x @ w) over a
 * [rows, 256] input, so its cost grows with rows).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/wire.h"
#include "graphd_frame.h"

typedef struct {
    harness_models_t m;
    harness_t h;
} fixture_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void start(fixture_t *f, const char *const *args)
{
    if (harness_start(&f->h, args) != 0)
        fail_msg("cannot start graphd");
}

/* Captures model with one [rows, cols] float32 input and no warm-up; fails the test on error. */
static void capture(graphd_client_t *c, const fixture_t *f, const char *model, int64_t rows,
                    int64_t cols, harness_graph_t *out)
{
    if (harness_capture_matrix(c, &f->m, model, rows, cols, out) != 0)
        fail_msg("cannot capture %s", model);
}

/* One FORWARD replay through libgraphd; its round trip in ns. */
static uint64_t replay_ns(const harness_graph_t *g)
{
    uint64_t t0 = now_ns();
    int rc = graphd_replay(g->g, GRAPHD_PHASE_FORWARD, NULL);
    if (rc != GRAPHD_OK)
        fail_msg("replay of graph %llu: %s: %s", (unsigned long long)graphd_graph_id(g->g),
                 graphd_err_name(rc), graphd_last_error(g->c));
    return now_ns() - t0;
}

/* Sends n FORWARD REPLAY frames of graph id (seq from 1) on fd in one go; stops early when the
 * daemon has closed the socket or after 10 s (a daemon that stopped reading). Returns how many
 * bytes went. */
static size_t flood(int fd, uint64_t id, size_t n)
{
    const int64_t deadline = harness_now_ms() + 10000;
    uint8_t *buf = malloc(n * GRAPHD_FRAME_SIZE);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++) {
        graphd_frame_t fr = {.magic = GRAPHD_FRAME_MAGIC,
                             .version = GRAPHD_FRAME_VERSION,
                             .type = GRAPHD_FRAME_REPLAY,
                             .seq = i + 1,
                             .id = id,
                             .arg = GRAPHD_PHASE_FORWARD};
        graphd_frame_encode(&fr, buf + i * GRAPHD_FRAME_SIZE);
    }
    size_t off = 0, len = n * GRAPHD_FRAME_SIZE;
    while (off < len) {
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {fd, POLLOUT, 0};
            int64_t left = deadline - harness_now_ms();
            if (left > 0 && poll(&p, 1, (int)left) >= 0)
                continue;
            print_message("the daemon stopped reading after %zu frames\n", off / GRAPHD_FRAME_SIZE);
            break;
        }
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    free(buf);
    return off;
}

/* ---- a client that never reads ---------------------------------------------------------- */

typedef struct {
    const harness_graph_t *g;
    volatile int stop;
    uint64_t worst_ns, count;
    int rc;
} pacer_t;

/* B's replays, one after another until told to stop: the worst round trip. */
static void *pacer_main(void *arg)
{
    pacer_t *p = arg;
    while (!p->stop) {
        uint64_t t0 = now_ns();
        int rc = graphd_replay(p->g->g, GRAPHD_PHASE_FORWARD, NULL);
        uint64_t dt = now_ns() - t0;
        if (rc != GRAPHD_OK) {
            p->rc = rc;
            break;
        }
        p->worst_ns = dt > p->worst_ns ? dt : p->worst_ns;
        p->count++;
    }
    return NULL;
}

/* A sends 20,000 REPLAY frames of a fast graph on its raw session socket and reads nothing; the
 * daemon must disconnect it once more than reply_buffer_max_bytes of replies wait, and end its
 * session, while B's replays on the same device go on. Today's daemon waited up to 1 s per reply
 * on the device worker, and B waited with it. */
static void a_client_that_never_reads_is_disconnected(void **state)
{
    fixture_t *f = *state;
    static const char *const args[] = {"--reply-buffer-max-bytes", "64Ki", NULL};
    start(f, args);
    int fd;
    graphd_client_t *a = dp_client_with_fd(&f->h, "never-reads", &fd);
    graphd_client_t *b = harness_client(&f->h, "reads");
    assert_non_null(b);
    harness_graph_t ga, gb;
    capture(a, f, "mlp.pt", 16, 16, &ga);
    capture(b, f, "mlp.pt", 16, 16, &gb);
    uint64_t alone = 0;
    for (int i = 0; i < 20; i++) {
        uint64_t dt = replay_ns(&gb);
        alone = dt > alone ? dt : alone;
    }

    pacer_t p = {.g = &gb};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pacer_main, &p), 0);
    usleep(100000);
    uint64_t sid = graphd_session_id(a);
    size_t sent = flood(fd, graphd_graph_id(ga.g), 20000);
    /* A's session goes within a few seconds (the daemon works through what A sent first). */
    json_t *s = NULL;
    int64_t deadline = harness_now_ms() + 10000;
    while ((s = harness_status_entry(b, "sessions", sid)) != NULL && harness_now_ms() < deadline) {
        json_decref(s);
        usleep(20000);
    }
    usleep(200000); /* B goes on a while after A is gone */
    p.stop = 1;
    pthread_join(t, NULL);
    print_message("never-reading client: %zu of %d frames went in; the other session's worst "
                  "replay round trip %.2f ms over %llu replays meanwhile (%.2f ms alone)\n",
                  sent / GRAPHD_FRAME_SIZE, 20000, p.worst_ns / 1e6, (unsigned long long)p.count,
                  alone / 1e6);
    if (s != NULL) {
        json_decref(s);
        fail_msg("the session of a client that never reads was not ended");
    }
    assert_int_equal(p.rc, GRAPHD_OK);
    assert_true(p.count > 0);
    /* Generous: the bound is a missing 1 s stall per reply, not a latency target. */
    if (p.worst_ns > 500000000u)
        fail_msg("the reading session paused %.1f ms while the other one did not read",
                 p.worst_ns / 1e6);
    assert_int_equal(harness_daemon_counter(b, "clients_disconnected"), 1);
    /* The reader still works, and the daemon said why in its log. */
    replay_ns(&gb);
    harness_graph_release(&gb);
    harness_graph_release(&ga); /* its session is over: frees the handle */
    graphd_close(b);
    graphd_close(a);
    assert_int_equal(harness_stop(&f->h), 0);
}

/* ---- round-robin and dropping --------------------------------------------------------- */

#define QUEUED 20000

/* Session A queues 20,000 slow replays (each a few ms: a minute of work in all) on its raw
 * session socket; meanwhile session B's replays on the same device are served within a few of
 * A's jobs (round-robin), not after all of them; then A exits (closes its socket) and within a
 * second B's next replay completes and status shows A's queue dropped. */
static void a_full_queue_delays_others_by_a_few_jobs_and_is_dropped_at_exit(void **state)
{
    fixture_t *f = *state;
    static const char *const args[] = {"--max-queued-replays", "30000", NULL};
    start(f, args);
    int fd;
    graphd_client_t *a = dp_client_with_fd(&f->h, "hog", &fd);
    graphd_client_t *b = harness_client(&f->h, "neighbour");
    assert_non_null(b);
    harness_graph_t ga, gb;
    capture(a, f, "slow.pt", 4, 256, &ga);
    capture(b, f, "mlp.pt", 16, 16, &gb);
    uint64_t slow = replay_ns(&ga);
    for (int i = 0; i < 4; i++) {
        uint64_t dt = replay_ns(&ga);
        slow = dt < slow ? dt : slow;
    }
    uint64_t fast = replay_ns(&gb);

    uint64_t sid = graphd_session_id(a);
    assert_int_equal(flood(fd, graphd_graph_id(ga.g), QUEUED), (size_t)QUEUED * GRAPHD_FRAME_SIZE);
    /* Wait until the daemon has queued them all (a session's replays count at submission). */
    int64_t deadline = harness_now_ms() + 20000;
    long long queued = 0;
    for (;;) {
        json_t *s = harness_status_entry(b, "sessions", sid);
        assert_non_null(s);
        queued = harness_int(s, "replays");
        json_decref(s);
        if (queued >= 5 + QUEUED || harness_now_ms() > deadline)
            break;
        usleep(10000);
    }
    assert_int_equal(queued, 5 + QUEUED);

    /* B, while A's queue holds thousands of jobs. */
    uint64_t worst = 0;
    for (int i = 0; i < 20; i++) {
        uint64_t dt = replay_ns(&gb);
        worst = dt > worst ? dt : worst;
    }
    print_message("one slow replay %.2f ms, one fast %.2f ms; with %d slow ones queued by another "
                  "session the fast one's worst round trip was %.2f ms\n",
                  slow / 1e6, fast / 1e6, QUEUED, worst / 1e6);
    /* FIFO would put B behind thousands of A's jobs; round-robin behind one (a few, at most). */
    if (worst > 10 * slow + 100000000u)
        fail_msg("a session waited %.1f ms behind another's queue of slow replays (%.2f ms each)",
                 worst / 1e6, slow / 1e6);

    /* A exits: its session ends and its queued replays go unrun. */
    long long dropped_before = harness_daemon_counter(b, "replays_dropped");
    assert_int_equal(dropped_before, 0);
    uint64_t t0 = now_ns();
    shutdown(fd, SHUT_RDWR);
    json_t *s;
    while ((s = harness_status_entry(b, "sessions", sid)) != NULL) {
        json_decref(s);
        if (now_ns() - t0 > 5000000000u)
            fail_msg("the exited session did not end");
        usleep(5000);
    }
    replay_ns(&gb);
    uint64_t took = now_ns() - t0;
    long long dropped = harness_daemon_counter(b, "replays_dropped");
    print_message("after the exit: another session's replay completed in %.1f ms; %lld of %d "
                  "queued replays dropped\n",
                  took / 1e6, dropped, QUEUED);
    if (took > 1000000000u)
        fail_msg("another session's replay took %.0f ms after the exit", took / 1e6);
    /* All but those that ran before the exit (a few seconds' worth at most). */
    assert_true(dropped >= QUEUED / 2);
    harness_graph_release(&gb);
    harness_graph_release(&ga); /* its session is over: frees the handle */
    graphd_close(b);
    graphd_close(a);
    assert_int_equal(harness_stop(&f->h), 0);
}

/* ---- max_queued_replays ------------------------------------------------------------------ */

/* With max_queued_replays 8, twenty slow REPLAY frames sent at once: the first ones are queued
 * and run, those past the bound are answered RESOURCE_EXHAUSTED naming the setting, and the
 * session carries on. */
static void replays_past_max_queued_replays_are_refused(void **state)
{
    fixture_t *f = *state;
    static const char *const args[] = {"--max-queued-replays", "8", NULL};
    start(f, args);
    int fd;
    graphd_client_t *a = dp_client_with_fd(&f->h, "bounded", &fd);
    harness_graph_t ga;
    capture(a, f, "slow.pt", 32, 256, &ga);
    const size_t n = 20;
    assert_int_equal(flood(fd, graphd_graph_id(ga.g), n), n * GRAPHD_FRAME_SIZE);
    size_t ok = 0, refused = 0;
    for (size_t i = 0; i < n; i++) {
        graphd_frame_t r;
        char msg[GRAPHD_FRAME_MAX_MSG + 1];
        dp_recv_frame(fd, &r, msg, sizeof msg);
        assert_int_equal(r.type, GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY);
        if (r.status == 0) {
            ok++;
        } else {
            assert_int_equal(r.status, 8 /* RESOURCE_EXHAUSTED */);
            assert_non_null(strstr(msg, "max_queued_replays"));
            if (refused++ == 0)
                print_message("past the bound: %s\n", msg);
        }
    }
    print_message("%zu queued and run, %zu refused\n", ok, refused);
    assert_true(refused >= 1);
    assert_true(ok >= 8);
    assert_int_equal(ok + refused, n);
    /* The session goes on. */
    replay_ns(&ga);
    harness_graph_release(&ga);
    graphd_close(a);
    assert_int_equal(harness_stop(&f->h), 0);
}

/* ---- main ------------------------------------------------------------------------------- */

static int group_setup(void **state)
{
    static fixture_t f;
    *state = &f;
    return harness_models_make(&f.m);
}

static int group_teardown(void **state)
{
    fixture_t *f = *state;
    harness_stop(&f->h);
    harness_models_remove(&f->m);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_client_that_never_reads_is_disconnected),
        cmocka_unit_test(a_full_queue_delays_others_by_a_few_jobs_and_is_dropped_at_exit),
        cmocka_unit_test(replays_past_max_queued_replays_are_refused),
    };
    return cmocka_run_group_tests_name("fairness", tests, group_setup, group_teardown);
}
