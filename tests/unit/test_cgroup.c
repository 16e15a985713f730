/*
 * Unit tests for executor cgroups (daemon/cgroup.h). The code is pointed at a plain temporary
 * directory standing in for /sys/fs/cgroup: cgroup.controllers, cgroup.procs, memory.max and
 * the rest are ordinary files there, the "is cgroup2" check and rmdir are the test's own. The
 * tests check what the code writes and what it reports when it cannot apply. The real cgroupfs
 * is never touched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cgroup.h"
#include "exec.h"
#include "runtime.h"

#include <errno.h>
#include <signal.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#define PID 1234

static struct {
    char root[64];  /* the stand-in for /sys/fs/cgroup */
    char own[128];  /* root/graphd.service: the daemon's cgroup */
    char self[128]; /* stands in for /proc/self/cgroup */
    char removed[8][256];
    size_t nremoved;
} G;

static bool yes_cgroup2(const char *root)
{
    (void)root;
    return true;
}

static bool no_cgroup2(const char *root)
{
    (void)root;
    return false;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)f;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void rm_tree(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The stand-in for rmdir: records the path, and removes the directory with the plain files the
 * kernel's control files stand for. */
static int record_remove(const char *path)
{
    if (G.nremoved < 8)
        snprintf(G.removed[G.nremoved++], sizeof G.removed[0], "%s", path);
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    rm_tree(path);
    return 0;
}

static bool was_removed(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", G.own, name);
    for (size_t i = 0; i < G.nremoved; i++)
        if (strcmp(G.removed[i], path) == 0)
            return true;
    return false;
}

static void put(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The content of dir/name ("" when absent), in a static buffer. */
static const char *get(const char *dir, const char *name)
{
    static char buf[4][256];
    static int next;
    char *b = buf[next++ % 4];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    b[0] = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(b, 1, 255, f);
        b[n] = 0;
        fclose(f);
    }
    return b;
}

static bool exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* A delegated cgroup: graphd.service with the memory controller and only the daemon in it. */
static int setup(void **state)
{
    (void)state;
    memset(&G, 0, sizeof G);
    snprintf(G.root, sizeof G.root, "/tmp/graphd-cgroup-XXXXXX");
    if (mkdtemp(G.root) == NULL || chmod(G.root, 0755) != 0)
        return -1;
    snprintf(G.own, sizeof G.own, "%s/graphd.service", G.root);
    snprintf(G.self, sizeof G.self, "%s/self-cgroup", G.root);
    if (mkdir(G.own, 0755) != 0)
        return -1;
    put(G.root, "self-cgroup", "0::/graphd.service\n");
    put(G.own, "cgroup.controllers", "cpuset cpu io memory pids\n");
    put(G.own, "cgroup.subtree_control", "");
    put(G.own, "cgroup.procs", "1234\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_tree(G.root);
    return 0;
}

static gd_cgroup_t *open_fake(bool (*is2)(const char *))
{
    gd_cgroup_opts_t o = {.root = G.root,
                          .self_file = G.self,
                          .is_cgroup2 = is2 ? is2 : yes_cgroup2,
                          .pid = PID,
                          .remove_dir = record_remove,
                          .systemd = -1};
    gd_cgroup_t *cg = gd_cgroup_open(&o);
    assert_non_null(cg);
    return cg;
}

/* Off, with a reason holding want, and nothing written: the daemon was not moved. */
static void expect_off(gd_cgroup_t *cg, const char *want)
{
    assert_false(gd_cgroup_on(cg));
    if (strstr(gd_cgroup_why(cg), want) == NULL)
        fail_msg("reason \"%s\" lacks \"%s\"", gd_cgroup_why(cg), want);
    assert_false(exists(G.own, "daemon"));
    assert_string_equal(get(G.own, "cgroup.subtree_control"), "");
    assert_int_equal(gd_cgroup_exec_make(cg, 1000, "cpu:0", 1 << 20, NULL), -1);
    assert_false(exists(G.own, "exec-1000-cpu-0"));
    gd_cgroup_close(cg);
}

static void off_without_cgroup2(void **state)
{
    (void)state;
    expect_off(open_fake(no_cgroup2), "no cgroup2 at");
}

static void off_in_the_root_cgroup(void **state)
{
    (void)state;
    put(G.root, "self-cgroup", "0::/\n");
    expect_off(open_fake(NULL), "root cgroup");
}

static void off_without_a_v2_entry(void **state)
{
    (void)state;
    put(G.root, "self-cgroup", "4:memory:/graphd.service\n1:name=systemd:/graphd.service\n");
    expect_off(open_fake(NULL), "no cgroup v2 entry");
}

static void off_without_the_memory_controller(void **state)
{
    (void)state;
    put(G.own, "cgroup.controllers", "cpuset cpu io pids\n");
    expect_off(open_fake(NULL), "no memory controller");
}

static void off_with_other_processes(void **state)
{
    (void)state;
    put(G.own, "cgroup.procs", "1234\n777\n");
    expect_off(open_fake(NULL), "other than the daemon (pid 777)");
}

/* Not writable: as a uid that does not own the stand-in (root may write anything). */
static void off_when_not_writable(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* the stand-in is the test's own, hence writable */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(2);
        gd_cgroup_opts_t o = {.root = G.root,
                              .self_file = G.self,
                              .is_cgroup2 = yes_cgroup2,
                              .pid = PID,
                              .remove_dir = record_remove,
                              .systemd = -1};
        gd_cgroup_t *cg = gd_cgroup_open(&o);
        int rc = cg && !gd_cgroup_on(cg) && strstr(gd_cgroup_why(cg), "not writable") ? 0 : 1;
        if (rc)
            fprintf(stderr, "as uid 65534: %s\n", cg ? gd_cgroup_why(cg) : "NULL");
        _exit(rc);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_false(exists(G.own, "daemon"));
}

/* Under systemd, a cgroup without systemd's delegation mark is not the daemon's; with it, it is. */
static void under_systemd_only_with_its_mark(void **state)
{
    (void)state;
    gd_cgroup_opts_t o = {.root = G.root,
                          .self_file = G.self,
                          .is_cgroup2 = yes_cgroup2,
                          .pid = PID,
                          .remove_dir = record_remove,
                          .systemd = 1};
    gd_cgroup_t *cg = gd_cgroup_open(&o);
    assert_non_null(cg);
    expect_off(cg, "has no delegation mark (set Delegate=memory");
    if (setxattr(G.own, "trusted.delegate", "1", 1, 0) != 0 &&
        setxattr(G.own, "user.delegate", "1", 1, 0) != 0) {
        printf("    no xattrs on %s (%s): the marked case is not checked here\n", G.own,
               strerror(errno));
        return;
    }
    cg = gd_cgroup_open(&o);
    assert_non_null(cg);
    assert_true(gd_cgroup_on(cg));
    gd_cgroup_close(cg);
}

/* Enabling +memory fails: the daemon goes back where it was, and the leaf goes. */
static void off_when_the_controller_cannot_be_enabled(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/cgroup.subtree_control", G.own);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0); /* open(O_WRONLY) fails: EISDIR */
    gd_cgroup_t *cg = open_fake(NULL);
    assert_false(gd_cgroup_on(cg));
    assert_non_null(strstr(gd_cgroup_why(cg), "cannot enable the memory controller"));
    assert_string_equal(get(G.own, "cgroup.procs"), "1234\n");
    assert_true(was_removed("daemon"));
    gd_cgroup_close(cg);
}

static void delegated(void **state)
{
    (void)state;
    /* A stale executor cgroup of an earlier daemon: removed at start. */
    char stale[256];
    snprintf(stale, sizeof stale, "%s/exec-5-cpu-0", G.own);
    assert_int_equal(mkdir(stale, 0755), 0);

    gd_cgroup_t *cg = open_fake(NULL);
    assert_true(gd_cgroup_on(cg));
    assert_non_null(strstr(gd_cgroup_why(cg), "memory.max per executor under"));
    assert_non_null(strstr(gd_cgroup_why(cg), G.own));
    /* The daemon in its leaf, and +memory for the children. */
    char leaf[256];
    snprintf(leaf, sizeof leaf, "%s/daemon", G.own);
    assert_string_equal(get(leaf, "cgroup.procs"), "1234\n");
    assert_string_equal(get(G.own, "cgroup.subtree_control"), "+memory\n");
    assert_true(was_removed("exec-5-cpu-0"));

    /* An executor: its own cgroup, memory.max, its pid. ':' is '-' in the name. */
    uint64_t ooms = 99;
    assert_int_equal(gd_cgroup_exec_make(cg, 1000, "cuda:1", 1ull << 30, &ooms), 0);
    assert_int_equal(ooms, 0);
    char x1[256], x2[256];
    snprintf(x1, sizeof x1, "%s/exec-1000-cuda-1", G.own);
    assert_string_equal(get(x1, "memory.max"), "1073741824\n");
    assert_false(exists(x1, "memory.swap.max")); /* no swap accounting: not made */
    assert_int_equal(gd_cgroup_exec_enter(cg, 1000, "cuda:1", 4242), 0);
    assert_string_equal(get(x1, "cgroup.procs"), "4242\n");

    /* Where the kernel has swap accounting, swap is off for executors. */
    snprintf(x2, sizeof x2, "%s/exec-1001-cpu-0", G.own);
    assert_int_equal(mkdir(x2, 0755), 0);
    put(x2, "memory.swap.max", "max\n");
    put(x2, "memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n");
    assert_int_equal(gd_cgroup_exec_make(cg, 1001, "cpu:0", 5000000, &ooms), 0);
    assert_int_equal(ooms, 1);
    assert_string_equal(get(x2, "memory.max"), "5000000\n");
    assert_string_equal(get(x2, "memory.swap.max"), "0\n");

    /* An OOM kill in its cgroup counts up. */
    put(x2, "memory.events", "low 0\nhigh 0\nmax 9\noom 3\noom_kill 2\noom_group_kill 0\n");
    assert_int_equal(gd_cgroup_exec_ooms(cg, 1001, "cpu:0"), 2);
    assert_int_equal(gd_cgroup_exec_ooms(cg, 1000, "cuda:1"), 0); /* no memory.events */

    /* A reload rewrites every executor's memory.max; 0 is no bound. */
    assert_int_equal(gd_cgroup_set_max(cg, 2ull << 30), 0);
    assert_string_equal(get(x1, "memory.max"), "2147483648\n");
    assert_string_equal(get(x2, "memory.max"), "2147483648\n");
    assert_int_equal(gd_cgroup_set_max(cg, 0), 0);
    assert_string_equal(get(x1, "memory.max"), "max\n");
    assert_string_equal(get(leaf, "memory.max"), ""); /* the daemon's own is not bounded */

    /* Reaped: its cgroup goes; the rest go at stop. */
    gd_cgroup_exec_remove(cg, 1000, "cuda:1");
    assert_true(was_removed("exec-1000-cuda-1"));
    assert_false(exists(G.own, "exec-1000-cuda-1"));
    assert_false(was_removed("exec-1001-cpu-0"));
    gd_cgroup_close(cg);
    assert_true(was_removed("exec-1001-cpu-0"));
    assert_false(was_removed("daemon")); /* the daemon is still in it */
}

/* The executor binary: $BUILD/graphd-executor, else beside this test's build directory. */
static void executor_path(char *buf, size_t len)
{
    const char *build = getenv("BUILD");
    if (build && *build) {
        snprintf(buf, len, "%s/graphd-executor", build);
        return;
    }
    char self[2048];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    for (int up = 0; up < 3; up++) { /* build/tests/unit/test_cgroup => build */
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = 0;
    }
    snprintf(buf, len, "%s/graphd-executor", self);
}

/* Whether pid has exited (a zombie: exec.c reaps it). */
static bool exited(int pid)
{
    char path[64], text[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return true;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *p = strrchr(text, ')');
    return p && p[1] == ' ' && p[2] == 'Z';
}

/* exec.c with a (stand-in) cgroup: the executor's pid goes into its cgroup, a reload rewrites
 * memory.max, and an executor the kernel killed there (memory.events oom_kill went up) is
 * reported like the watchdog's kill: GR_ENOMEM naming max_executor_memory_bytes, counted in
 * killed_memory; its cgroup goes when it is reaped. */
static void executor_killed_in_its_cgroup(void **state)
{
    (void)state;
    char exe[2100];
    executor_path(exe, sizeof exe);
    if (access(exe, X_OK) != 0)
        fail_msg("no executor at %s (make all first)", exe);
    gd_cgroup_t *cg = open_fake(NULL);
    assert_true(gd_cgroup_on(cg));
    gd_exec_opts_t o = {.path = exe,
                        .capture_ms = 60000,
                        .cpu_devices = 1,
                        .max_unpacked = 1ull << 30,
                        .call_memory = 1ull << 30,
                        .reply_max = 1 << 20,
                        .sandbox = true,
                        .cgroup = cg};
    gd_exec_host_t *h = NULL;
    assert_int_equal(gd_exec_host_create(&o, &h), 0);
    gd_exec_host_bounds(h, 0, 60000, 60000, 3000000000ull);
    gd_exec_t *x = gd_exec_get(h, 1000, "cpu:0");
    assert_non_null(x);
    gd_xpool_t *p = NULL;
    if (gd_exec_pool_create(x, "cpu:0", &p) != GR_OK)
        fail_msg("pool: %s", gd_exec_last_error());
    char dir[256];
    snprintf(dir, sizeof dir, "%s/exec-1000-cpu-0", G.own);
    gd_exec_info_t info;
    assert_int_equal(gd_exec_host_list(h, &info, 1), 1);
    assert_true(info.pid > 0);
    char pid[24];
    snprintf(pid, sizeof pid, "%d\n", info.pid);
    assert_string_equal(get(dir, "cgroup.procs"), pid);
    assert_string_equal(get(dir, "memory.max"), "3000000000\n");
    if (strstr(info.sandbox, "memory: cgroup memory.max") == NULL)
        fail_msg("status: %s", info.sandbox);
    gd_exec_host_bounds(h, 0, 60000, 60000, 2000000000ull); /* SIGHUP */
    assert_string_equal(get(dir, "memory.max"), "2000000000\n");

    /* The kernel's OOM kill, as the cgroup shows it. */
    int rc = 0;
    put(dir, "memory.events", "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n");
    kill(info.pid, SIGKILL);
    for (int i = 0; i < 500 && !exited(info.pid); i++)
        usleep(10000);
    /* Before any call (as a direct replay's client asks): the loss is already the bound's, once
     * the whole process is gone (its pidfd readable, which can follow the leader's zombie). */
    char early[1024];
    bool lost_early = false;
    for (int i = 0; i < 500 && !(lost_early = gd_exec_lost(x, 1, &rc, early, sizeof early)); i++)
        usleep(10000);
    assert_true(lost_early);
    assert_int_equal(rc, GR_ENOMEM);
    /* The next call finds it gone and starts another, or (its exit not yet seen) fails with
     * the loss itself; the one after that gets a fresh process. */
    gd_xpool_t *p2 = NULL;
    rc = gd_exec_pool_create(x, "cpu:0", &p2);
    if (rc != GR_OK) {
        assert_int_equal(rc, GR_ENOMEM);
        if (strstr(gd_exec_last_error(), "max_executor_memory_bytes (2000000000)") == NULL)
            fail_msg("pool after the kill: %s", gd_exec_last_error());
        if ((rc = gd_exec_pool_create(x, "cpu:0", &p2)) != GR_OK)
            fail_msg("pool after the loss: %s", gd_exec_last_error());
    }
    assert_true(gd_exec_pool_lost(p));
    char msg[1024];
    assert_true(gd_exec_lost(x, 1 /* the first process */, &rc, msg, sizeof msg));
    assert_int_equal(rc, GR_ENOMEM);
    if (strstr(msg, "max_executor_memory_bytes (2000000000)") == NULL)
        fail_msg("the loss says: %s", msg);
    assert_int_equal(gd_exec_host_list(h, &info, 1), 1);
    assert_int_equal(info.killed_memory, 1);
    assert_int_equal(info.died, 0);
    assert_true(was_removed("exec-1000-cpu-0")); /* reaped, then made again for the new one */
    snprintf(pid, sizeof pid, "%d\n", info.pid);
    assert_string_equal(get(dir, "cgroup.procs"), pid);

    gd_exec_pool_destroy(p2);
    gd_exec_pool_destroy(p);
    gd_exec_host_destroy(h, 5000);
    gd_cgroup_close(cg);
}

/* The cgroup2 entry need not come first (hybrid layouts list v1 hierarchies too). */
static void v2_entry_among_others(void **state)
{
    (void)state;
    put(G.root, "self-cgroup", "1:name=systemd:/x\n0::/graphd.service\n");
    gd_cgroup_t *cg = open_fake(NULL);
    assert_true(gd_cgroup_on(cg));
    gd_cgroup_close(cg);
}

static void null_is_off(void **state)
{
    (void)state;
    assert_false(gd_cgroup_on(NULL));
    assert_non_null(strstr(gd_cgroup_why(NULL), "executor_cgroup = 0"));
    assert_int_equal(gd_cgroup_set_max(NULL, 1), 0);
    gd_cgroup_close(NULL);
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(off_without_cgroup2),
        T(off_in_the_root_cgroup),
        T(off_without_a_v2_entry),
        T(off_without_the_memory_controller),
        T(off_with_other_processes),
        T(off_when_not_writable),
        T(off_when_the_controller_cannot_be_enabled),
        T(under_systemd_only_with_its_mark),
        T(delegated),
        T(v2_entry_among_others),
        T(executor_killed_in_its_cgroup),
        T(null_is_off),
    };
#undef T
    return cmocka_run_group_tests_name("cgroup", tests, NULL, NULL);
}
