/*
 * A client process that dies with live regions (SIGKILL, or exit without
 * Goodbye) has its session and regions reclaimed within a second, seen
 * through Status.
 *
 * The child is this binary run again with "--child ADDRESS MODE": a fresh
 * process rather than a bare fork, because gRPC state does not survive fork.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"

extern char **environ;

#define RECLAIM_WITHIN_MS 1000

/* The child: session, two regions written, one line "ready SESSION_ID" on stdout, then it
 * waits to be killed ("kill") or exits without any goodbye ("exit"). */
static int child_main(const char *address, const char *mode)
{
    graphd_client_t *c;
    graphd_region_t *r1, *r2;
    if (graphd_connect(address, &c) != GRAPHD_OK || graphd_hello(c, "doomed") != GRAPHD_OK ||
        graphd_region_alloc(c, NULL, 1 << 20, &r1) != GRAPHD_OK ||
        graphd_region_alloc(c, NULL, 3 * 4096 + 1, &r2) != GRAPHD_OK) {
        fprintf(stderr, "child: setup failed\n");
        return 1;
    }
    memset(graphd_region_ptr(r1), 0x5a, graphd_region_size(r1));
    memset(graphd_region_ptr(r2), 0xa5, graphd_region_size(r2));
    printf("ready %llu\n", (unsigned long long)graphd_session_id(c));
    fflush(stdout);
    if (strcmp(mode, "exit") == 0)
        _exit(0); /* no Goodbye, no close: only the kernel closes the session socket */
    /* Wait to be killed; should the test itself die first, stdin's EOF ends the child. */
    char b;
    while (read(0, &b, 1) != 0)
        ;
    return 0;
}

typedef struct child {
    pid_t pid;
    int out; /* read end of its stdout */
    int in;  /* write end of its stdin */
    unsigned long long session;
} child_t;

static void spawn_child(const harness_t *h, const char *mode, child_t *ch)
{
    int p[2], q[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    assert_int_equal(pipe2(q, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, q[0], 0);
    char *argv[] = {"/proc/self/exe", "--child", (char *)h->address, (char *)mode, NULL};
    assert_int_equal(posix_spawn(&ch->pid, "/proc/self/exe", &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    close(q[0]);
    ch->out = p[0];
    ch->in = q[1];

    char line[128] = "";
    size_t used = 0;
    int64_t deadline = harness_now_ms() + 10000;
    while (strchr(line, '\n') == NULL && harness_now_ms() < deadline) {
        struct pollfd pf = {.fd = ch->out, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t n = read(ch->out, line + used, sizeof(line) - used - 1);
        if (n <= 0)
            break;
        used += (size_t)n;
        line[used] = '\0';
    }
    assert_int_equal(sscanf(line, "ready %llu", &ch->session), 1);
}

static json_t *session_entry(json_t *st, unsigned long long id)
{
    return harness_find_int(json_object_get(st, "sessions"), "id", id);
}

static void reclaimed_within_a_second(void **state, const char *mode)
{
    harness_t *h = *state;
    graphd_client_t *watch;
    assert_int_equal(graphd_connect(h->address, &watch), GRAPHD_OK);
    /* Root's session: an admin sees every session and pool in full. */
    assert_int_equal(graphd_hello(watch, "it-watch"), GRAPHD_OK);

    json_t *st = harness_status(watch);
    assert_non_null(st);
    json_t *pool = harness_find(json_object_get(st, "pools"), "name", "default");
    long long base_reserved = harness_int(pool, "reserved_bytes");
    long long base_regions = harness_int(pool, "regions");
    long long base_sessions = harness_int(json_object_get(st, "daemon"), "sessions");
    json_decref(st);

    child_t ch;
    spawn_child(h, mode, &ch);

    /* While it lives (or before the daemon notices the exit) the child's regions count. */
    if (strcmp(mode, "kill") == 0) {
        st = harness_status(watch);
        json_t *s = session_entry(st, ch.session);
        assert_non_null(s);
        assert_int_equal(harness_int(s, "regions"), 2);
        assert_int_equal(harness_int(s, "bytes"), (1 << 20) + 4 * 4096);
        pool = harness_find(json_object_get(st, "pools"), "name", "default");
        assert_int_equal(harness_int(pool, "reserved_bytes"), base_reserved + (1 << 20) + 4 * 4096);
        json_decref(st);
        assert_int_equal(kill(ch.pid, SIGKILL), 0);
    }
    int status;
    assert_int_equal(waitpid(ch.pid, &status, 0), ch.pid);
    close(ch.out);
    close(ch.in);
    int64_t died = harness_now_ms();

    int gone = 0;
    long long reserved = -1, regions = -1, sessions = -1;
    while (!gone && harness_now_ms() - died <= RECLAIM_WITHIN_MS) {
        st = harness_status(watch);
        assert_non_null(st);
        pool = harness_find(json_object_get(st, "pools"), "name", "default");
        reserved = harness_int(pool, "reserved_bytes");
        regions = harness_int(pool, "regions");
        sessions = harness_int(json_object_get(st, "daemon"), "sessions");
        gone = session_entry(st, ch.session) == NULL && reserved == base_reserved &&
               regions == base_regions && sessions == base_sessions;
        json_decref(st);
        if (!gone)
            usleep(20000);
    }
    if (!gone)
        fprintf(stderr,
                "after %lld ms: reserved %lld (want %lld), regions %lld (want %lld), "
                "sessions %lld (want %lld)\n",
                (long long)(harness_now_ms() - died), reserved, base_reserved, regions,
                base_regions, sessions, base_sessions);
    assert_true(gone);
    graphd_close(watch);
}

static void sigkill_is_reclaimed(void **state)
{
    reclaimed_within_a_second(state, "kill");
}

static void exit_without_goodbye_is_reclaimed(void **state)
{
    reclaimed_within_a_second(state, "exit");
}

static void many_deaths_leave_nothing(void **state)
{
    harness_t *h = *state;
    child_t ch[4];
    for (int i = 0; i < 4; i++)
        spawn_child(h, "kill", &ch[i]);
    for (int i = 0; i < 4; i++) {
        kill(ch[i].pid, SIGKILL);
        waitpid(ch[i].pid, NULL, 0);
        close(ch[i].out);
        close(ch[i].in);
    }
    graphd_client_t *watch;
    assert_int_equal(graphd_connect(h->address, &watch), GRAPHD_OK);
    assert_int_equal(graphd_hello(watch, "it-watch"), GRAPHD_OK); /* an admin's view */
    int64_t died = harness_now_ms();
    long long sessions = -1, regions = -1;
    while (harness_now_ms() - died <= RECLAIM_WITHIN_MS) {
        json_t *st = harness_status(watch);
        assert_non_null(st);
        sessions = (long long)json_array_size(json_object_get(st, "sessions"));
        regions =
            harness_int(harness_find(json_object_get(st, "pools"), "name", "default"), "regions");
        json_decref(st);
        if (sessions == 1 && regions == 0) /* the watcher's own session is left */
            break;
        usleep(20000);
    }
    assert_int_equal(sessions, 1);
    assert_int_equal(regions, 0);
    graphd_close(watch);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--child") == 0)
        return child_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sigkill_is_reclaimed),
        cmocka_unit_test(exit_without_goodbye_is_reclaimed),
        cmocka_unit_test(many_deaths_leave_nothing),
    };
    return cmocka_run_group_tests_name("reclaim", tests, harness_group_setup,
                                       harness_group_teardown);
}
