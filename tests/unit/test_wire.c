/* Unit tests for the session socket's write side (daemon/wire.c) and the device workers' queues
 * (daemon/worker.c): replies that the socket does not take wait in order, a passed descriptor
 * keeps to its frame, a client past the bound fails the wire once; session queues are served
 * round-robin, a daemon job waits for every earlier job, replays are dropped and bounded; one
 * worker per executor: a stuck one holds up no other's jobs, and an idle one's thread exits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <semaphore.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- wire ------------------------------------------------------------------------------- */

static void on_fail(void *ctx)
{
    (*(int *)ctx)++;
}

static void frame(uint64_t seq, graphd_frame_t *f)
{
    memset(f, 0, sizeof *f);
    f->magic = GRAPHD_FRAME_MAGIC;
    f->version = GRAPHD_FRAME_VERSION;
    f->type = GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY;
    f->seq = seq;
}

/* A socketpair whose daemon end has a small send buffer; the peer end non-blocking. */
static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
}

/* Reads the peer's next frame and message, never past it, across calls (a frame may arrive in
 * parts while the rest waits in the wire): 1 once whole, 0 when nothing more is there now. *fd
 * gets a descriptor passed with any part of it. */
static uint8_t rbuf[GRAPHD_FRAME_SIZE + GRAPHD_FRAME_MAX_MSG];
static size_t rhave;
static int rfd = -1;

static int read_frame(int sock, graphd_frame_t *f, int *fd)
{
    for (;;) {
        size_t want = GRAPHD_FRAME_SIZE;
        if (rhave >= GRAPHD_FRAME_SIZE) {
            graphd_frame_decode(rbuf, f);
            want += f->msg_len;
        }
        if (rhave == want) {
            *fd = rfd;
            rfd = -1;
            rhave = 0;
            return 1;
        }
        union {
            char b[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } ctl;
        struct iovec iov = {rbuf + rhave, want - rhave};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
        ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        assert_true(n > 0);
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_type == SCM_RIGHTS) {
                assert_int_equal(rfd, -1);
                memcpy(&rfd, CMSG_DATA(cm), sizeof(int));
            }
        rhave += (size_t)n;
    }
}

static void replies_wait_in_order_and_a_descriptor_keeps_to_its_frame(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    int sv[2], failed = 0;
    pair(sv);
    gd_wire_t *w = gd_wire_create(&loop, sv[0], 1 << 20, on_fail, &failed);
    assert_non_null(w);
    const uint64_t before = 3000, after = 10;
    graphd_frame_t f;
    for (uint64_t i = 0; i < before; i++) {
        frame(i, &f);
        assert_int_equal(gd_wire_send(w, &f, NULL, -1), 0); /* never waits */
    }
    int mfd = memfd_create("wire-test", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    assert_int_equal(ftruncate(mfd, 12345), 0);
    frame(before, &f);
    assert_int_equal(gd_wire_send(w, &f, NULL, mfd), 0);
    close(mfd); /* the wire keeps its own dup until the frame goes */
    for (uint64_t i = before + 1; i <= before + after; i++) {
        frame(i, &f);
        assert_int_equal(gd_wire_send(w, &f, "with a message", -1), 0);
    }
    /* Before the loop runs only what the kernel took is there: the rest is buffered. */
    uint64_t next = 0;
    int fd = -1, got_fd = -1;
    while (read_frame(sv[1], &f, &fd) == 1) {
        assert_int_equal(f.seq, next);
        assert_int_equal(fd, -1);
        next++;
    }
    assert_true(next < before);
    /* The loop flushes as the peer reads. */
    for (int spins = 0; next <= before + after && spins < 100000; spins++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        while (read_frame(sv[1], &f, &fd) == 1) {
            assert_int_equal(f.seq, next);
            if (fd >= 0) {
                assert_int_equal(f.seq, before);
                got_fd = fd;
            }
            if (f.seq > before) {
                assert_int_equal(f.msg_len, strlen("with a message"));
                assert_memory_equal(rbuf + GRAPHD_FRAME_SIZE, "with a message", f.msg_len);
            }
            next++;
        }
    }
    assert_int_equal(next, before + after + 1);
    assert_true(got_fd >= 0);
    struct stat st;
    assert_int_equal(fstat(got_fd, &st), 0);
    assert_int_equal(st.st_size, 12345);
    close(got_fd);
    assert_int_equal(failed, 0);
    gd_wire_close(w);
    frame(0, &f);
    assert_int_equal(gd_wire_send(w, &f, NULL, -1), -1); /* closed: fails quietly */
    gd_wire_unref(w);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    close(sv[0]);
    close(sv[1]);
}

static void a_peer_that_does_not_read_fails_the_wire_once(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    int sv[2], failed = 0;
    pair(sv);
    gd_wire_t *w = gd_wire_create(&loop, sv[0], 4096, on_fail, &failed);
    assert_non_null(w);
    graphd_frame_t f;
    uint64_t i = 0;
    for (; i < 100000; i++) {
        frame(i, &f);
        if (gd_wire_send(w, &f, NULL, -1) != 0)
            break;
    }
    assert_true(i < 100000);
    assert_int_equal(gd_wire_state(w), GD_WIRE_OVERFLOW);
    assert_int_equal(gd_wire_send(w, &f, NULL, -1), -1);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(failed, 1);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(failed, 1);
    gd_wire_close(w);
    gd_wire_unref(w);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    close(sv[0]);
    close(sv[1]);
}

/* ---- worker queues ---------------------------------------------------------------------- */

typedef struct {
    gd_job_t job;
    char name[8];
} tjob_t;

static sem_t gate;
static char order[64][8];
static int norder, ndropped;

static void record_run(gd_job_t *job)
{
    snprintf(order[norder++], 8, "%s", ((tjob_t *)job)->name);
}

static void gate_run(gd_job_t *job)
{
    (void)job;
    sem_wait(&gate);
}

static void drop_cb(gd_job_t *job)
{
    (void)job;
    ndropped++;
}

static void tjob(tjob_t *j, const char *name, uint64_t session, bool droppable)
{
    memset(j, 0, sizeof *j);
    snprintf(j->name, sizeof j->name, "%s", name);
    j->job.run = record_run;
    j->job.session = session;
    j->job.drop = droppable ? drop_cb : NULL;
}

static gd_workers_t set;

/* A set on a fresh loop, threads exiting after idle_ms (0: never). */
static void set_init(uv_loop_t *loop, uint64_t idle_ms)
{
    uv_loop_init(loop);
    sem_init(&gate, 0, 0);
    norder = ndropped = 0;
    assert_int_equal(gd_workers_init(&set, loop, 0, idle_ms), 0);
}

/* Holds w in a job until sem_post(&gate). */
static void hold(gd_worker_t *w, tjob_t *g)
{
    memset(g, 0, sizeof *g);
    g->job.run = gate_run;
    g->job.session = 99;
    uint64_t before = atomic_load(&w->submitted);
    assert_int_equal(gd_worker_submit(w, &g->job), 0);
    while (atomic_load(&w->submitted) == before)
        ;
    usleep(20000); /* the worker has taken the gate job */
}

/* Starts a set with one worker (executor key k) and holds it in a job until sem_post(&gate). */
static gd_worker_t *start_held(uv_loop_t *loop, tjob_t *g)
{
    static int k;
    set_init(loop, 0);
    gd_worker_t *w = gd_workers_get(&set, &k, 1000, "cpu:0");
    assert_non_null(w);
    assert_ptr_equal(gd_workers_get(&set, &k, 1000, "cpu:0"), w);
    hold(w, g);
    return w;
}

static void stop(uv_loop_t *loop)
{
    gd_workers_stop_begin(&set);
    assert_null(gd_workers_join(&set, 0));
    gd_workers_close(&set);
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(loop), 0);
    sem_destroy(&gate);
}

static void sessions_take_turns_and_a_daemon_job_waits_for_earlier_ones(void **state)
{
    (void)state;
    uv_loop_t loop;
    tjob_t g, j[7];
    gd_worker_t *w = start_held(&loop, &g);
    tjob(&j[0], "A1", 1, true);
    tjob(&j[1], "A2", 1, true);
    tjob(&j[2], "A3", 1, false);
    tjob(&j[3], "B1", 2, true);
    tjob(&j[4], "D", 0, false);
    tjob(&j[5], "B2", 2, true);
    tjob(&j[6], "C1", 3, true);
    for (int i = 0; i < 7; i++)
        assert_int_equal(gd_worker_submit(w, &j[i].job), 0);
    sem_post(&gate);
    stop(&loop);
    static const char *want[] = {"A1", "B1", "C1", "A2", "B2", "A3", "D"};
    assert_int_equal(norder, 7);
    for (int i = 0; i < 7; i++)
        assert_string_equal(order[i], want[i]);
}

static void an_ended_sessions_replays_are_dropped_and_bounded(void **state)
{
    (void)state;
    uv_loop_t loop;
    tjob_t g, j[5];
    gd_worker_t *w = start_held(&loop, &g);
    w->max_queued_replays = 2;
    tjob(&j[0], "R1", 1, true);
    tjob(&j[1], "X", 1, false);
    tjob(&j[2], "R2", 1, true);
    tjob(&j[3], "R3", 1, true); /* past the bound */
    tjob(&j[4], "S1", 2, true);
    for (int i = 0; i < 3; i++)
        assert_int_equal(gd_worker_submit(w, &j[i].job), 0);
    assert_int_equal(gd_worker_submit(w, &j[3].job), -1);
    assert_int_equal(gd_worker_submit(w, &j[4].job), 0); /* another session's bound */
    assert_int_equal(gd_workers_session_ended(&set, 1000, 1), 2);
    assert_int_equal(ndropped, 2);
    sem_post(&gate);
    stop(&loop);
    assert_int_equal(norder, 2);
    assert_string_equal(order[0], "X");
    assert_string_equal(order[1], "S1");
}

/* ---- one worker per executor ------------------------------------------------------------- */

static int ndone;

static void count_done(gd_job_t *job)
{
    (void)job;
    ndone++;
}

/* Waits (running the loop) until n jobs have run, for at most 2 s. */
static bool ran_within(uv_loop_t *loop, int n)
{
    for (int i = 0; i < 2000 && __atomic_load_n(&norder, __ATOMIC_ACQUIRE) < n; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    return __atomic_load_n(&norder, __ATOMIC_ACQUIRE) >= n;
}

/* A worker held in a job (an executor that does not answer) holds up only its own jobs: another
 * executor's - another uid's on the same device - run meanwhile, their done callbacks come back
 * through the set's one wake-up, and the ended session's replays are dropped on every worker of
 * its uid. */
static void a_stuck_worker_holds_up_only_its_own_executors_jobs(void **state)
{
    (void)state;
    uv_loop_t loop;
    tjob_t g, j[5];
    static int kb, kc;
    gd_worker_t *a = start_held(&loop, &g); /* uid 1000 on cpu:0, stuck */
    gd_worker_t *b = gd_workers_get(&set, &kb, 2000, "cpu:0");
    gd_worker_t *c = gd_workers_get(&set, &kc, 1000, "cpu:1");
    assert_non_null(b);
    assert_non_null(c);
    assert_true(a != b && b != c);
    ndone = 0;
    tjob(&j[0], "A1", 1, true);
    tjob(&j[1], "B1", 2, false);
    tjob(&j[2], "B2", 2, false);
    tjob(&j[3], "C1", 1, true);
    tjob(&j[4], "C2", 1, true);
    j[1].job.done = j[2].job.done = count_done;
    assert_int_equal(gd_worker_submit(a, &j[0].job), 0);
    assert_int_equal(gd_worker_submit(b, &j[1].job), 0);
    assert_int_equal(gd_worker_submit(b, &j[2].job), 0);
    assert_true(ran_within(&loop, 2)); /* B's, while A's worker is still in its job */
    for (int i = 0; i < 100 && ndone < 2; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(ndone, 2);
    assert_string_equal(order[0], "B1");
    assert_string_equal(order[1], "B2");
    /* Session 1 (uid 1000) has a replay queued behind the stuck job and one on cpu:1's worker,
     * held there too. */
    tjob_t g2;
    hold(c, &g2);
    assert_int_equal(gd_worker_submit(c, &j[3].job), 0);
    assert_int_equal(gd_workers_session_ended(&set, 2000, 1), 0); /* not uid 2000's session */
    assert_int_equal(gd_workers_session_ended(&set, 1000, 1), 2);
    assert_int_equal(ndropped, 2);
    sem_post(&gate);
    sem_post(&gate);
    stop(&loop);
    assert_int_equal(norder, 2);
}

/* A worker's thread exits after idle_ms without a job, and the next job starts one again. */
static void an_idle_workers_thread_exits_and_comes_back(void **state)
{
    (void)state;
    uv_loop_t loop;
    tjob_t j[2];
    static int k;
    set_init(&loop, 30);
    gd_worker_t *w = gd_workers_get(&set, &k, 1000, "cpu:0");
    assert_non_null(w);
    assert_int_equal(atomic_load(&set.threads), 0); /* none before its first job */
    tjob(&j[0], "J1", 1, false);
    tjob(&j[1], "J2", 1, false);
    assert_int_equal(gd_worker_submit(w, &j[0].job), 0);
    assert_true(ran_within(&loop, 1));
    assert_int_equal(atomic_load(&set.threads), 1);
    for (int i = 0; i < 200 && atomic_load(&set.threads) > 0; i++)
        usleep(5000);
    assert_int_equal(atomic_load(&set.threads), 0);
    assert_int_equal(gd_worker_submit(w, &j[1].job), 0);
    assert_true(ran_within(&loop, 2));
    assert_int_equal(atomic_load(&set.threads), 1);
    stop(&loop);
    assert_string_equal(order[1], "J2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replies_wait_in_order_and_a_descriptor_keeps_to_its_frame),
        cmocka_unit_test(a_peer_that_does_not_read_fails_the_wire_once),
        cmocka_unit_test(sessions_take_turns_and_a_daemon_job_waits_for_earlier_ones),
        cmocka_unit_test(an_ended_sessions_replays_are_dropped_and_bounded),
        cmocka_unit_test(a_stuck_worker_holds_up_only_its_own_executors_jobs),
        cmocka_unit_test(an_idle_workers_thread_exits_and_comes_back),
    };
    return cmocka_run_group_tests_name("wire", tests, NULL, NULL);
}
