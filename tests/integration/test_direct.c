/*
 * Replay connections (issue 14: "a client's data plane goes straight to its executor"): REPLAY
 * frames go on a socket to the executor that holds the graph, not through the daemon.
 *
 * - the two paths (a replay connection, GRAPHD_DIRECT=1, and the session socket, =0) give the same
 *   bits, and status counts the replays of both;
 * - a replay connection is its session's alone: the daemon will not hand one out for another
 *   session's graph, and the executor refuses another session's graph on it, and any frame that
 *   is not a REPLAY;
 * - a session's end closes its replay connections;
 * - sessions of one uid (one executor) are served round-robin on their connections: one with a
 *   queue of slow replays delays another by one of them, not by the queue; a client that dies
 *   with replays queued on its connection has them dropped, not run, and the next session of the
 *   same uid is served at once;
 * - a client that never reads its answers is disconnected at reply_buffer_max_bytes while
 *   another session of the same executor keeps replaying.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/wire.h"
#include "graphd_frame.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Captures model with one [rows, cols] float32 input; fails the test on error. */
static void capture(graphd_client_t *c, const harness_models_t *m, const char *model, int64_t rows,
                    int64_t cols, harness_graph_t *out)
{
    if (harness_capture_matrix(c, m, model, rows, cols, out) != 0)
        fail_msg("cannot capture %s", model);
}

static void fill_input(const harness_graph_t *g, float seed)
{
    const graphd_tensor_t *x = harness_tensor(g, GRAPHD_ROLE_INPUT, 0);
    assert_non_null(x);
    float *p = x->data;
    for (size_t i = 0; i < harness_numel(x); i++)
        p[i] = seed + 0.01f * (float)(i % 97);
}

/* One answer on a replay connection: the frame and its message. */
static void recv_answer(int fd, graphd_frame_t *f, char *msg, size_t size)
{
    dp_recv_frame(fd, f, msg, size);
}

/* Sends frames of graph id on fd without blocking until the socket takes no more, or n went;
 * how many went. */
static size_t flood(int fd, uint64_t id, size_t n)
{
    size_t sent = 0;
    uint8_t raw[64 * GRAPHD_FRAME_SIZE];
    while (sent < n) {
        size_t k = n - sent < 64 ? n - sent : 64;
        for (size_t i = 0; i < k; i++) {
            graphd_frame_t fr = {.magic = GRAPHD_FRAME_MAGIC,
                                 .version = GRAPHD_FRAME_VERSION,
                                 .type = GRAPHD_FRAME_REPLAY,
                                 .seq = sent + i + 1,
                                 .id = id,
                                 .arg = GRAPHD_PHASE_FORWARD};
            graphd_frame_encode(&fr, raw + i * GRAPHD_FRAME_SIZE);
        }
        ssize_t w = send(fd, raw, k * GRAPHD_FRAME_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        sent += (size_t)w / GRAPHD_FRAME_SIZE;
        if ((size_t)w % GRAPHD_FRAME_SIZE) { /* finish the frame it cut */
            size_t rest = GRAPHD_FRAME_SIZE - (size_t)w % GRAPHD_FRAME_SIZE;
            struct pollfd p = {fd, POLLOUT, 0};
            poll(&p, 1, 5000);
            dp_send(fd, raw + (size_t)w, rest);
            sent++;
        }
    }
    return sent;
}

/* ---- the two paths agree ------------------------------------------------------------------ */

static void both_paths_give_the_same_bits_and_are_counted(void **state)
{
    harness_fixture_t *f = *state;
    graphd_client_t *direct = harness_client(&f->h, "direct");
    assert_non_null(direct);
    assert_int_equal(setenv("GRAPHD_DIRECT", "0", 1), 0);
    graphd_client_t *hop = harness_client(&f->h, "through-the-daemon");
    unsetenv("GRAPHD_DIRECT");
    assert_non_null(hop);
    harness_graph_t a, b;
    capture(direct, &f->m, "mlp.pt", 4, 16, &a);
    capture(hop, &f->m, "mlp.pt", 4, 16, &b);
    const graphd_tensor_t *ya = harness_tensor(&a, GRAPHD_ROLE_OUTPUT, 0);
    const graphd_tensor_t *yb = harness_tensor(&b, GRAPHD_ROLE_OUTPUT, 0);
    assert_non_null(ya);
    assert_non_null(yb);
    for (int i = 0; i < 5; i++) {
        fill_input(&a, (float)i);
        fill_input(&b, (float)i);
        assert_int_equal(graphd_replay(a.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
        assert_int_equal(graphd_replay(b.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
        assert_int_equal(ya->nbytes, yb->nbytes);
        assert_memory_equal(ya->data, yb->data, ya->nbytes);
    }
    /* An unknown phase is refused on both paths alike. */
    assert_int_equal(graphd_replay(a.g, 7, NULL), GRAPHD_EINVALID_ARGUMENT);
    assert_int_equal(graphd_replay(b.g, 7, NULL), GRAPHD_EINVALID_ARGUMENT);
    harness_graph_t *gs[] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        json_t *g = harness_status_entry(direct, "graphs", graphd_graph_id(gs[k]->g));
        assert_non_null(g);
        assert_int_equal(harness_int(g, "replays_forward"), 5);
        assert_int_equal(harness_int(g, "replay_errors"), 0); /* refused, not run */
        assert_int_equal(harness_int(json_object_get(g, "latency"), "count"), 5);
        json_decref(g);
    }
    harness_graph_release(&a);
    harness_graph_release(&b);
    graphd_close(direct);
    graphd_close(hop);
}

/* ---- a connection is its session's -------------------------------------------------------- */

static void a_replay_connection_is_its_sessions_alone(void **state)
{
    harness_fixture_t *f = *state;
    int fa, fb;
    graphd_client_t *a = dp_client_with_fd(&f->h, "owner", &fa);
    graphd_client_t *b = dp_client_with_fd(&f->h, "neighbour", &fb);
    harness_graph_t ga, gb;
    capture(a, &f->m, "mlp.pt", 4, 16, &ga);
    capture(b, &f->m, "mlp.pt", 4, 16, &gb);
    uint64_t ida = graphd_graph_id(ga.g), idb = graphd_graph_id(gb.g);
    graphd_frame_t r;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];

    /* Not for another session's graph. */
    assert_int_equal(dp_direct(fb, 9001, ida, 0, &r, msg, sizeof msg), -1);
    assert_int_equal(r.status, 7 /* PERMISSION_DENIED */);
    assert_non_null(strstr(msg, "another session"));
    assert_int_equal(dp_direct(fb, 9002, idb, 5, &r, msg, sizeof msg), -1);
    assert_int_equal(r.status, 3 /* INVALID_ARGUMENT */);

    /* B's own: a new connection, then the same one by key. */
    int conn = dp_direct(fb, 9003, idb, GRAPHD_DIRECT_RENEW, &r, msg, sizeof msg);
    assert_int_equal(r.status, 0);
    assert_true(conn >= 0);
    uint64_t key = r.arg;
    assert_int_equal(dp_direct(fb, 9004, idb, 0, &r, msg, sizeof msg), -1);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.arg, key);

    /* On it, B's graph replays and A's is refused by the executor (same uid, same executor). */
    dp_send_frame(conn, GRAPHD_FRAME_REPLAY, 1, idb, GRAPHD_PHASE_FORWARD);
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.type, GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY);
    assert_int_equal(r.seq, 1);
    assert_int_equal(r.status, 0);
    dp_send_frame(conn, GRAPHD_FRAME_REPLAY, 2, ida, GRAPHD_PHASE_FORWARD);
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.status, 7 /* PERMISSION_DENIED */);
    assert_non_null(strstr(msg, "another session"));
    dp_send_frame(conn, GRAPHD_FRAME_REPLAY, 3, 999999, GRAPHD_PHASE_FORWARD);
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.status, 5 /* NOT_FOUND */);
    /* A's own graph still replays for A (its connection, its session). */
    assert_int_equal(graphd_replay(ga.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);

    /* Anything but a REPLAY frame ends the connection, with an ERROR frame saying why. */
    dp_send_frame(conn, GRAPHD_FRAME_MAP, 4, 1, 0);
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.type, GRAPHD_FRAME_ERROR);
    assert_non_null(strstr(msg, "REPLAY frames"));
    uint8_t byte;
    assert_int_equal(dp_read(conn, &byte, 1), 0);
    close(conn);

    /* The session's end closes its connections: EOF within a second. */
    conn = dp_direct(fb, 9005, idb, GRAPHD_DIRECT_RENEW, &r, msg, sizeof msg);
    assert_true(conn >= 0);
    uint64_t t0 = now_ns();
    shutdown(fb, SHUT_RDWR);
    assert_int_equal(dp_read(conn, &byte, 1), 0);
    double took = (double)(now_ns() - t0) / 1e6;
    print_message("the replay connection closed %.1f ms after its session's socket\n", took);
    assert_true(took < 1000);
    close(conn);
    harness_graph_release(&ga);
    harness_graph_release(&gb);
    graphd_close(a);
    graphd_close(b);
}

/* A posted REPLAY names its device by GRAPHD_DEVICE_CODE (frame version 2): the executor of
 * cpu:0 reads the code for cuda:0 as cuda:0 (not as a bare CUDA index), refuses it as another
 * device's, and ends the connection with an ERROR frame that names both devices. */
static void a_posted_replay_names_its_device_by_code(void **state)
{
    harness_fixture_t *f = *state;
    int fa;
    graphd_client_t *a = dp_client_with_fd(&f->h, "posted", &fa);
    harness_graph_t ga;
    capture(a, &f->m, "mlp.pt", 4, 16, &ga);
    graphd_frame_t r;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    int conn = dp_direct(fa, 9301, graphd_graph_id(ga.g), GRAPHD_DIRECT_RENEW, &r, msg, sizeof msg);
    assert_true(conn >= 0);
    const uint64_t code = GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, 0);
    dp_send_frame(conn, GRAPHD_FRAME_REPLAY, 1, graphd_graph_id(ga.g),
                  GRAPHD_PHASE_FORWARD | GRAPHD_REPLAY_POSTED |
                      (code << GRAPHD_REPLAY_DEVICE_SHIFT) | (1ull << GRAPHD_REPLAY_SEQ_SHIFT));
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.type, GRAPHD_FRAME_ERROR);
    if (strstr(msg, "posted REPLAY for cuda:0 on the connection of cpu:0") == NULL)
        fail_msg("posted REPLAY with cuda:0's device code: '%s'", msg);
    uint8_t byte;
    assert_int_equal(dp_read(conn, &byte, 1), 0);
    close(conn);
    harness_graph_release(&ga);
    graphd_close(a);
}

/* ---- a dead client's queue ---------------------------------------------------------------- */

static void a_dead_clients_queued_replays_are_dropped(void **state)
{
    harness_fixture_t *f = *state;
    int fa;
    graphd_client_t *a = dp_client_with_fd(&f->h, "hog", &fa);
    graphd_client_t *b = harness_client(&f->h, "next-door"); /* same uid: same executor */
    assert_non_null(b);
    harness_graph_t ga, gb;
    capture(a, &f->m, "slow.pt", 4, 256, &ga);
    capture(b, &f->m, "mlp.pt", 4, 16, &gb);
    assert_int_equal(graphd_replay(ga.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    assert_int_equal(graphd_replay(gb.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    uint64_t t0 = now_ns();
    assert_int_equal(graphd_replay(ga.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    uint64_t slow = now_ns() - t0;

    graphd_frame_t r;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    int conn = dp_direct(fa, 9101, graphd_graph_id(ga.g), GRAPHD_DIRECT_RENEW, &r, msg, sizeof msg);
    assert_true(conn >= 0);
    long long before = harness_daemon_counter(b, "replays_dropped");
    size_t sent = flood(conn, graphd_graph_id(ga.g), 20000);
    print_message("%zu slow replays (%.2f ms each) went into the connection before it was full\n",
                  sent, slow / 1e6);
    assert_true(sent > 100);
    /* While A's queue holds minutes of work, B (same executor) waits for one of A's replays at a
     * time, not for the queue: the executor serves its connections round-robin. */
    uint64_t worst = 0;
    for (int i = 0; i < 10; i++) {
        t0 = now_ns();
        assert_int_equal(graphd_replay(gb.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
        uint64_t dt = now_ns() - t0;
        worst = dt > worst ? dt : worst;
    }
    print_message("with the queue full, the other session's worst round trip was %.1f ms\n",
                  worst / 1e6);
    if (worst > 10 * slow + 100000000u)
        fail_msg("a session waited %.1f ms behind another's queue of slow replays (%.2f ms each)",
                 worst / 1e6, slow / 1e6);
    /* A dies: its connection and session socket close with the replays queued. */
    t0 = now_ns();
    close(conn);
    shutdown(fa, SHUT_RDWR);
    assert_int_equal(graphd_replay(gb.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    double next = (double)(now_ns() - t0) / 1e6;
    long long dropped = 0;
    while (now_ns() - t0 < 2000000000u) {
        dropped = harness_daemon_counter(b, "replays_dropped") - before;
        if (dropped > 0)
            break;
        usleep(10000);
    }
    print_message("after the death: the same executor's next session replayed in %.1f ms; %lld of "
                  "%zu queued replays dropped\n",
                  next, dropped, sent);
    assert_true(next < 1000);
    assert_true((size_t)dropped >= sent / 2);
    harness_graph_release(&gb);
    harness_graph_release(&ga);
    graphd_close(b);
    graphd_close(a);
}

/* ---- a client that never reads ------------------------------------------------------------ */

static void a_client_that_never_reads_is_disconnected(void **state)
{
    harness_fixture_t *f = *state;
    int fa;
    graphd_client_t *a = dp_client_with_fd(&f->h, "never-reads", &fa);
    graphd_client_t *b = harness_client(&f->h, "reads");
    assert_non_null(b);
    harness_graph_t ga, gb;
    capture(a, &f->m, "mlp.pt", 4, 16, &ga);
    capture(b, &f->m, "mlp.pt", 4, 16, &gb);
    graphd_frame_t r;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    int conn = dp_direct(fa, 9201, graphd_graph_id(ga.g), GRAPHD_DIRECT_RENEW, &r, msg, sizeof msg);
    assert_true(conn >= 0);
    long long before = harness_daemon_counter(b, "clients_disconnected");
    int64_t deadline = harness_now_ms() + 20000;
    size_t sent = 0, replays = 0;
    long long gone = 0;
    while (harness_now_ms() < deadline && gone == 0) {
        sent += flood(conn, graphd_graph_id(ga.g), 2000);
        assert_int_equal(graphd_replay(gb.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
        replays++;
        gone = harness_daemon_counter(b, "clients_disconnected") - before;
        usleep(5000);
    }
    print_message("the never-reading connection was closed after %zu frames; the other session "
                  "replayed %zu times meanwhile\n",
                  sent, replays);
    assert_int_equal(gone, 1);
    /* Its connection is closed (EOF once what was sent is read). */
    uint8_t sink[65536];
    ssize_t n;
    while ((n = recv(conn, sink, sizeof sink, 0)) > 0)
        ;
    assert_int_equal(n, 0);
    close(conn);
    assert_int_equal(graphd_replay(gb.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    harness_graph_release(&ga);
    harness_graph_release(&gb);
    graphd_close(a);
    graphd_close(b);
}

static int setup(void **state)
{
    static harness_fixture_t f;
    static const char *const args[] = {"--reply-buffer-max-bytes", "64Ki", NULL};
    *state = &f; /* the teardown runs even when this fails: harness_fixture_stop copes */
    if (harness_fixture_start(&f, args) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    return harness_fixture_stop(*state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(both_paths_give_the_same_bits_and_are_counted),
        cmocka_unit_test(a_replay_connection_is_its_sessions_alone),
        cmocka_unit_test(a_posted_replay_names_its_device_by_code),
        cmocka_unit_test(a_dead_clients_queued_replays_are_dropped),
        cmocka_unit_test(a_client_that_never_reads_is_disconnected),
    };
    return cmocka_run_group_tests_name("direct", tests, setup, teardown);
}
