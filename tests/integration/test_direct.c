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
 *   another session of the same executor keeps replaying;
 * - a replay ring (RING) is checked before the executor maps it (a sealed memfd of the ring's
 *   size; a refusal leaves the connection on frames), a slot is run as the REPLAY frame it stands
 *   for once the executor wakes (WAKE, sent because it said it was asleep), a failed posted slot
 *   is answered on the socket and counted in the ring, and a slot that is not a posted replay or
 *   a head out of reach ends that connection alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
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
    assert_non_null(strstr(msg, "takes REPLAY"));
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

/* ---- replay rings ------------------------------------------------------------------------- */

/* A memfd of size bytes, sealed against shrinking when sealed. */
static int ring_memfd(size_t size, bool sealed)
{
    int fd = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    if (sealed)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    return fd;
}

/* A RING frame on conn with ring_fd (-1: none) as SCM_RIGHTS; its answer into *r and msg. */
static void ring_ask(int conn, uint64_t seq, int ring_fd, graphd_frame_t *r, char *msg, size_t size)
{
    uint8_t raw[GRAPHD_FRAME_SIZE];
    graphd_frame_t fr = {.magic = GRAPHD_FRAME_MAGIC,
                         .version = GRAPHD_FRAME_VERSION,
                         .type = GRAPHD_FRAME_RING,
                         .seq = seq};
    graphd_frame_encode(&fr, raw);
    graphd_fd_control_t control;
    struct iovec iov = {.iov_base = raw, .iov_len = sizeof raw};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (ring_fd >= 0)
        graphd_attach_fd(&mh, &control, ring_fd);
    assert_int_equal(sendmsg(conn, &mh, MSG_NOSIGNAL), (ssize_t)sizeof raw);
    recv_answer(conn, r, msg, size);
    assert_int_equal(r->type, GRAPHD_FRAME_RING | GRAPHD_FRAME_REPLY);
    assert_int_equal(r->seq, seq);
}

/* A new replay connection of session fd for graph id, with a ring mapped at *ring. */
static int ringed_conn(int fd, uint64_t seq, uint64_t id, graphd_ring_t **ring)
{
    graphd_frame_t r;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    int conn = dp_direct(fd, seq, id, GRAPHD_DIRECT_RENEW, &r, msg, sizeof msg);
    assert_true(conn >= 0);
    int mfd = ring_memfd(GRAPHD_RING_BYTES, true);
    *ring = mmap(NULL, GRAPHD_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    assert_true(*ring != MAP_FAILED);
    ring_ask(conn, 1, mfd, &r, msg, sizeof msg);
    close(mfd);
    if (r.status != 0)
        fail_msg("RING refused: %s", msg);
    assert_int_equal(r.arg, GRAPHD_RING_SLOTS);
    return conn;
}

/* Puts one slot into ring as a client does (graphd_ring_t): the slot, head, then WAKE on conn
 * when the executor is asleep. true when it was (a WAKE went). */
static bool ring_put(int conn, graphd_ring_t *ring, uint64_t seq, uint64_t id, uint64_t arg)
{
    uint64_t head = ring->head;
    graphd_ring_slot_t *slot = &ring->slot[head % GRAPHD_RING_SLOTS];
    slot->seq = seq;
    slot->id = id;
    slot->arg = arg;
    __atomic_store_n(&ring->head, head + 1, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&ring->asleep, __ATOMIC_RELAXED))
        return false;
    dp_send_frame(conn, GRAPHD_FRAME_WAKE, 0, 0, 0);
    return true;
}

/* A ring is checked before it is mapped; a refused RING leaves the connection on frames. */
static void a_replay_ring_is_checked_before_it_is_mapped(void **state)
{
    harness_fixture_t *f = *state;
    int fa;
    graphd_client_t *a = dp_client_with_fd(&f->h, "ring-check", &fa);
    harness_graph_t ga;
    capture(a, &f->m, "mlp.pt", 4, 16, &ga);
    uint64_t id = graphd_graph_id(ga.g);
    graphd_frame_t r;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    int conn = dp_direct(fa, 9401, id, GRAPHD_DIRECT_RENEW, &r, msg, sizeof msg);
    assert_true(conn >= 0);

    static const struct {
        size_t size;
        bool sealed, fd;
        const char *says;
    } bad[] = {
        {GRAPHD_RING_BYTES, true, false, "memfd (SCM_RIGHTS)"},
        {GRAPHD_RING_BYTES, false, true, "F_SEAL_SHRINK"},
        {4096, true, true, "exactly GRAPHD_RING_BYTES"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int mfd = bad[i].fd ? ring_memfd(bad[i].size, bad[i].sealed) : -1;
        ring_ask(conn, 10 + i, mfd, &r, msg, sizeof msg);
        if (mfd >= 0)
            close(mfd);
        assert_int_equal(r.status, 3 /* INVALID_ARGUMENT */);
        if (strstr(msg, bad[i].says) == NULL)
            fail_msg("RING case %zu: '%s' does not say '%s'", i, msg, bad[i].says);
        /* The connection goes on, with frames. */
        dp_send_frame(conn, GRAPHD_FRAME_REPLAY, 20 + i, id, GRAPHD_PHASE_FORWARD);
        recv_answer(conn, &r, msg, sizeof msg);
        assert_int_equal(r.type, GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY);
        assert_int_equal(r.status, 0);
    }
    /* WAKE before a ring is a frame the connection does not take. */
    dp_send_frame(conn, GRAPHD_FRAME_WAKE, 30, 0, 0);
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.type, GRAPHD_FRAME_ERROR);
    assert_non_null(strstr(msg, "(with a ring) WAKE"));
    close(conn);

    /* A good one, then a second: ALREADY_EXISTS, and the first stays. */
    graphd_ring_t *ring;
    conn = ringed_conn(fa, 9402, id, &ring);
    int mfd = ring_memfd(GRAPHD_RING_BYTES, true);
    ring_ask(conn, 2, mfd, &r, msg, sizeof msg);
    close(mfd);
    assert_int_equal(r.status, 6 /* ALREADY_EXISTS */);
    dp_send_frame(conn, GRAPHD_FRAME_WAKE, 3, 0, 0); /* a ring now: taken, not answered */
    dp_send_frame(conn, GRAPHD_FRAME_REPLAY, 4, id, GRAPHD_PHASE_FORWARD);
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.seq, 4);
    assert_int_equal(r.status, 0);
    close(conn);
    munmap(ring, GRAPHD_RING_BYTES);
    harness_graph_release(&ga);
    graphd_close(a);
}

/* Waits up to 5 s for ring's failed count to reach n. */
static void wait_failed(graphd_ring_t *ring, uint64_t n)
{
    for (int i = 0; i < 5000 && __atomic_load_n(&ring->failed, __ATOMIC_ACQUIRE) < n; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&ring->failed, __ATOMIC_ACQUIRE), n);
}

/* Slots are run as their frames, woken by WAKE; a slot the ring does not take, or a head out of
 * reach, ends that connection and no other session's work. */
static void a_replay_rings_slots_are_frames_and_a_bad_one_ends_its_connection(void **state)
{
    harness_fixture_t *f = *state;
    int fa, fb;
    graphd_client_t *a = dp_client_with_fd(&f->h, "ring-slots", &fa);
    graphd_client_t *b = dp_client_with_fd(&f->h, "ring-neighbour", &fb);
    harness_graph_t ga, gb;
    capture(a, &f->m, "mlp.pt", 4, 16, &ga);
    capture(b, &f->m, "mlp.pt", 4, 16, &gb);
    uint64_t id = graphd_graph_id(ga.g);
    graphd_frame_t r;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    uint8_t byte;

    /* A posted slot for cuda:0 on cpu:0's executor: run as that frame would be (refused, with
     * both devices named), answered on the socket, counted in failed. The cpu executor never
     * polls after a replay, so it was asleep: the slot needed the WAKE. */
    graphd_ring_t *ring;
    int conn = ringed_conn(fa, 9501, id, &ring);
    usleep(20000); /* let it go to sleep */
    const uint64_t code = GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, 0);
    assert_true(ring_put(conn, ring, 41, id,
                         GRAPHD_PHASE_FORWARD | GRAPHD_REPLAY_POSTED |
                             (code << GRAPHD_REPLAY_DEVICE_SHIFT) |
                             (1ull << GRAPHD_REPLAY_SEQ_SHIFT)));
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.type, GRAPHD_FRAME_ERROR);
    assert_int_equal(r.seq, 41);
    if (strstr(msg, "posted REPLAY for cuda:0 on the connection of cpu:0") == NULL)
        fail_msg("posted slot for cuda:0: '%s'", msg);
    wait_failed(ring, 1);
    assert_int_equal(__atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(dp_read(conn, &byte, 1), 0);
    close(conn);
    munmap(ring, GRAPHD_RING_BYTES);

    /* A slot that is not a posted replay. */
    conn = ringed_conn(fa, 9502, id, &ring);
    ring_put(conn, ring, 42, id, GRAPHD_PHASE_FORWARD);
    dp_send_frame(conn, GRAPHD_FRAME_WAKE, 0, 0, 0); /* asleep or not */
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.type, GRAPHD_FRAME_ERROR);
    assert_non_null(strstr(msg, "posted replays only"));
    wait_failed(ring, 1);
    assert_int_equal(dp_read(conn, &byte, 1), 0);
    close(conn);
    munmap(ring, GRAPHD_RING_BYTES);

    /* A head more than a ring ahead of what the executor took. */
    conn = ringed_conn(fa, 9503, id, &ring);
    __atomic_store_n(&ring->head, GRAPHD_RING_SLOTS + 1, __ATOMIC_RELEASE);
    dp_send_frame(conn, GRAPHD_FRAME_WAKE, 0, 0, 0);
    recv_answer(conn, &r, msg, sizeof msg);
    assert_int_equal(r.type, GRAPHD_FRAME_ERROR);
    assert_non_null(strstr(msg, "out of step"));
    assert_int_equal(dp_read(conn, &byte, 1), 0);
    close(conn);
    munmap(ring, GRAPHD_RING_BYTES);

    /* Neither session lost anything: both replay, a's on a new connection. */
    fill_input(&ga, 1.0f);
    assert_int_equal(graphd_replay(ga.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
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
        cmocka_unit_test(a_replay_ring_is_checked_before_it_is_mapped),
        cmocka_unit_test(a_replay_rings_slots_are_frames_and_a_bad_one_ends_its_connection),
    };
    return cmocka_run_group_tests_name("direct", tests, setup, teardown);
}
