/*
 * Unit tests for the executor sandbox (graph_runtime/sandbox.h). Each case forks a child that
 * enters the sandbox and checks what it may and may not do, reporting through its exit status
 * (0 pass, 77 skip, anything else a failure it explains on stderr). Where the kernel has no
 * Landlock, the file-system cases say so and skip.
 *
 * The last case is the executor's real life: libtorch initialised and used, then the sandbox,
 * then a module load and a CPU capture and replay. Its archive is made at group setup by
 * /usr/bin/python3 (GRAPHD_PYTHON overrides) into a temporary directory under /tmp, which the
 * sandbox does not allow: the child reads it before entering.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime.h"
#include "sandbox.h"

#define SKIP 77

static struct {
    char dir[64];     /* /tmp/graphd-sandbox-XXXXXX: outside the sandbox */
    char allowed[96]; /* dir/allowed: a read path the tests add */
    char ok_file[128];
    char secret[128];
    char model[128];
    int landlock; /* the kernel has Landlock */
} G;

/* ---- helpers ---------------------------------------------------------------------------- */

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* "<what>: want errno <want>, got <rc>/<errno>" on stderr; 1 when it does not match. */
static int expect_errno(const char *what, long rc, int want)
{
    int err = errno;
    if (want == 0 && rc >= 0)
        return 0;
    if (want != 0 && rc < 0 && err == want)
        return 0;
    fprintf(stderr, "child: %s: want %s, got rc %ld (%s)\n", what,
            want ? strerror(want) : "success", rc, rc < 0 ? strerror(err) : "no error");
    return 1;
}

static int open_errno(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC, 0600);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    return -1;
}

/* The test's options: the cpu defaults plus G.allowed as a read path. */
static void test_opts(gr_sandbox_opts_t *o)
{
    if (gr_sandbox_default_paths("cpu", o) != 0 || gr_sandbox_paths_add(o, 'r', G.allowed) != 0) {
        fprintf(stderr, "child: default paths: %s\n", strerror(errno));
        _exit(101);
    }
}

static void enter_or_exit(gr_sandbox_opts_t *o)
{
    gr_sandbox_report_t rep;
    if (gr_sandbox_enter(o, &rep) != 0) {
        fprintf(stderr, "child: gr_sandbox_enter: %s\n", rep.off);
        _exit(100);
    }
    gr_sandbox_paths_free(o);
}

/* Runs fn in a forked child and checks its exit status (SKIP: the test is skipped). */
static void in_child(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn(arg));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        fail_msg("child killed by signal %d", WTERMSIG(status));
    if (WEXITSTATUS(status) == SKIP)
        skip();
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void skip_without_landlock(void)
{
    if (!G.landlock) {
        print_message("skipped: the kernel has no Landlock (landlock_create_ruleset: ENOSYS or "
                      "EOPNOTSUPP); the file-system layer is off\n");
        skip();
    }
}

/* ---- group setup ------------------------------------------------------------------------ */

static const char *const make_model_py = "import sys, torch\n"
                                         "m = torch.nn.Linear(4, 3)\n"
                                         "with torch.no_grad():\n"
                                         "    m.weight.copy_(torch.arange(12.0).view(3, 4) * 0.1)\n"
                                         "    m.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))\n"
                                         "torch.jit.trace(m, torch.ones(2, 4)).save(sys.argv[1])\n";

static int make_model(const char *path)
{
    const char *python = getenv("GRAPHD_PYTHON");
    if (python == NULL || *python == '\0')
        python = "/usr/bin/python3";
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execl(python, python, "-c", make_model_py, path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0)
        return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(G.dir, sizeof G.dir, "/tmp/graphd-sandbox-XXXXXX");
    if (mkdtemp(G.dir) == NULL)
        return -1;
    snprintf(G.allowed, sizeof G.allowed, "%s/allowed", G.dir);
    snprintf(G.ok_file, sizeof G.ok_file, "%s/ok.txt", G.allowed);
    snprintf(G.secret, sizeof G.secret, "%s/secret.txt", G.dir);
    snprintf(G.model, sizeof G.model, "%s/linear.pt", G.dir);
    if (mkdir(G.allowed, 0700) != 0 || write_text(G.ok_file, "fine\n") != 0 ||
        write_text(G.secret, "secret\n") != 0)
        return -1;
    if (make_model(G.model) != 0) {
        fprintf(stderr, "making %s with python failed (GRAPHD_PYTHON)\n", G.model);
        return -1;
    }
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1U /* VERSION */);
    G.landlock = abi > 0;
    if (!G.landlock)
        print_message("note: the kernel has no Landlock: its cases are skipped\n");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    unlink(G.ok_file);
    unlink(G.secret);
    unlink(G.model);
    char path[160];
    snprintf(path, sizeof path, "%s/new.txt", G.dir);
    unlink(path);
    rmdir(G.allowed);
    rmdir(G.dir);
    return 0;
}

/* ---- files (Landlock) ------------------------------------------------------------------- */

static int child_read(void *arg)
{
    (void)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    enter_or_exit(&o);
    int bad = 0;
    char buf[16] = {0};
    int fd = open(G.ok_file, O_RDONLY | O_CLOEXEC);
    bad |= expect_errno("open an allowed file", fd, 0);
    if (fd >= 0) {
        bad |= read(fd, buf, sizeof buf - 1) != 5 || strcmp(buf, "fine\n") != 0;
        close(fd);
    }
    bad |= expect_errno("open a library directory", open_errno("/usr/lib", O_RDONLY), 0);
    bad |= expect_errno("read /proc/self/status", open_errno("/proc/self/status", O_RDONLY), 0);
    bad |= expect_errno("open a file outside", open_errno(G.secret, O_RDONLY), EACCES);
    bad |= expect_errno("open /etc/passwd", open_errno("/etc/passwd", O_RDONLY), EACCES);
    bad |= expect_errno("list /tmp", open_errno("/tmp", O_RDONLY | O_DIRECTORY), EACCES);
    /* Another process's /proc directory (here the parent's). */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)getppid());
    bad |= expect_errno("read the parent's /proc environ", open_errno(path, O_RDONLY), EACCES);
    return bad;
}

static void test_read_only_allowed_paths(void **state)
{
    (void)state;
    skip_without_landlock();
    in_child(child_read, NULL);
}

static int child_write(void *arg)
{
    (void)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    enter_or_exit(&o);
    int bad = 0;
    char path[160];
    snprintf(path, sizeof path, "%s/new.txt", G.dir);
    bad |= expect_errno("create a file under /tmp", open_errno(path, O_WRONLY | O_CREAT), EACCES);
    bad |= expect_errno("write a file outside", open_errno(G.secret, O_WRONLY), EACCES);
    bad |= expect_errno("write an allowed read file", open_errno(G.ok_file, O_WRONLY), EACCES);
    bad |= expect_errno("truncate an allowed read file", truncate(G.ok_file, 0), EACCES);
    bad |= expect_errno("remove an allowed read file", unlink(G.ok_file), EACCES);
    bad |= expect_errno("mkdir under /tmp", mkdir(path, 0700), EACCES);
    bad |= expect_errno("write /dev/null", open_errno("/dev/null", O_WRONLY), 0);
    /* mknodat is refused by seccomp first (EPERM); Landlock would refuse it too (EACCES). */
    bad |= expect_errno("make a fifo", mkfifo(path, 0600), EPERM);
    return bad;
}

static void test_nothing_writable(void **state)
{
    (void)state;
    skip_without_landlock();
    in_child(child_write, NULL);
    struct stat st;
    char path[160];
    snprintf(path, sizeof path, "%s/new.txt", G.dir);
    assert_int_equal(stat(path, &st), -1);
    assert_int_equal(stat(G.ok_file, &st), 0);
    assert_int_equal(st.st_size, 5);
}

/* ---- processes, threads, signals (seccomp) ---------------------------------------------- */

static void *thread_ok(void *arg)
{
    *(int *)arg = 42;
    return NULL;
}

static int child_processes(void *arg)
{
    (void)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    enter_or_exit(&o);
    int bad = 0;
    /* false: if execve worked, the child would exit 1 and the case fail. */
    char *const argv[] = {"/usr/bin/false", NULL}, *const envp[] = {NULL};
    bad |= expect_errno("execve /usr/bin/false", execve("/usr/bin/false", argv, envp), EPERM);
    pid_t pid = fork();
    if (pid == 0)
        _exit(0); /* fork must not have worked */
    bad |= expect_errno("fork", pid, EPERM);
    if (system("true") == 0) {
        fprintf(stderr, "child: system(\"true\") ran a command\n");
        bad = 1;
    }
    bad |= expect_errno("ptrace attach to the parent",
                        syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, getppid(), 0, 0), EPERM);
    bad |= expect_errno("unshare", unshare(CLONE_NEWUSER), EPERM);
    pthread_t t;
    int v = 0;
    if (pthread_create(&t, NULL, thread_ok, &v) != 0 || pthread_join(t, NULL) != 0 || v != 42) {
        fprintf(stderr, "child: pthread_create after entering failed\n");
        bad = 1;
    }
    return bad;
}

static void test_no_exec_no_fork_threads_work(void **state)
{
    (void)state;
    in_child(child_processes, NULL);
}

static int child_signals(void *arg)
{
    (void)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    enter_or_exit(&o);
    int bad = 0;
    bad |= expect_errno("kill(getppid(), 0)", kill(getppid(), 0), EPERM);
    bad |= expect_errno("kill(-1, 0)", kill(-1, 0), EPERM);
    bad |= expect_errno("kill(0, 0)", kill(0, 0), EPERM);
    bad |= expect_errno("kill(getpid(), 0)", kill(getpid(), 0), 0);
    signal(SIGUSR1, SIG_IGN);
    bad |= expect_errno("raise(SIGUSR1)", raise(SIGUSR1), 0);
    bad |= expect_errno("tgkill to itself", syscall(SYS_tgkill, getpid(), gettid(), 0), 0);
    bad |=
        expect_errno("tgkill to the parent", syscall(SYS_tgkill, getppid(), getppid(), 0), EPERM);
    return bad;
}

static void test_signals_only_to_itself(void **state)
{
    (void)state;
    in_child(child_signals, NULL);
}

static int child_sockets(void *arg)
{
    int allow_unix = *(int *)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    o.allow_unix_sockets = allow_unix;
    enter_or_exit(&o);
    int bad = 0;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    bad |= expect_errno("socket(AF_INET)", s, EPERM);
    s = socket(AF_INET6, SOCK_DGRAM, 0);
    bad |= expect_errno("socket(AF_INET6)", s, EPERM);
    s = socket(AF_NETLINK, SOCK_RAW, 0);
    bad |= expect_errno("socket(AF_NETLINK)", s, EPERM);
    s = socket(AF_UNIX, SOCK_STREAM, 0);
    bad |= expect_errno("socket(AF_UNIX)", s, allow_unix ? 0 : EPERM);
    if (s >= 0)
        close(s);
    int sv[2];
    bad |= expect_errno("socketpair(AF_UNIX)", socketpair(AF_UNIX, SOCK_STREAM, 0, sv),
                        allow_unix ? 0 : EPERM);
    return bad;
}

static void test_no_network_sockets(void **state)
{
    (void)state;
    int allow = 0;
    in_child(child_sockets, &allow);
    allow = 1;
    in_child(child_sockets, &allow);
}

static int child_memfd(void *arg)
{
    (void)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    enter_or_exit(&o);
    int fd = memfd_create("graphd-test", MFD_CLOEXEC);
    if (expect_errno("memfd_create", fd, 0) || expect_errno("ftruncate", ftruncate(fd, 4096), 0))
        return 1;
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "child: mmap of a memfd: %s\n", strerror(errno));
        return 1;
    }
    strcpy(p, "in the region");
    char buf[32] = {0};
    int bad = pread(fd, buf, sizeof buf - 1, 0) <= 0 || strcmp(buf, "in the region") != 0;
    munmap(p, 4096);
    close(fd);
    return bad;
}

static void test_memfd_and_mmap_work(void **state)
{
    (void)state;
    in_child(child_memfd, NULL);
}

/* ---- threads that exist before entering ------------------------------------------------- */

typedef struct early {
    int go[2];   /* main -> thread: "try now" */
    int done[2]; /* thread -> main: the result, 0 when everything was refused */
} early_t;

static void *early_thread(void *arg)
{
    early_t *e = arg;
    char c;
    if (read(e->go[0], &c, 1) != 1)
        return NULL;
    int bad = 0;
    if (G.landlock)
        bad |= expect_errno("early thread: open a file outside", open_errno(G.secret, O_RDONLY),
                            EACCES);
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    bad |= expect_errno("early thread: fork", pid, EPERM);
    bad |= expect_errno("early thread: socket(AF_INET)", socket(AF_INET, SOCK_STREAM, 0), EPERM);
    c = (char)bad;
    if (write(e->done[1], &c, 1) != 1)
        return NULL;
    return NULL;
}

static int child_early_thread(void *arg)
{
    (void)arg;
    early_t e;
    if (pipe(e.go) != 0 || pipe(e.done) != 0)
        return 1;
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        if (pthread_create(&t[i], NULL, early_thread, &e) != 0)
            return 1;
    gr_sandbox_opts_t o;
    test_opts(&o);
    gr_sandbox_report_t rep;
    if (gr_sandbox_enter(&o, &rep) != 0) {
        fprintf(stderr, "child: gr_sandbox_enter: %s\n", rep.off);
        return 100;
    }
    gr_sandbox_paths_free(&o);
    int bad = 0;
    if (G.landlock && rep.threads != 3) {
        fprintf(stderr, "child: %d threads restricted, want 3\n", rep.threads);
        bad = 1;
    }
    if (write(e.go[1], "xxx", 3) != 3)
        return 1;
    for (int i = 0; i < 3; i++) {
        char c = 1;
        if (read(e.done[0], &c, 1) != 1 || c != 0)
            bad = 1;
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    return bad;
}

static void test_threads_from_before_are_restricted(void **state)
{
    (void)state;
    in_child(child_early_thread, NULL);
}

/* ---- report ----------------------------------------------------------------------------- */

static int child_report(void *arg)
{
    int which = *(int *)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    o.landlock = which != 1;
    o.seccomp = which != 2;
    gr_sandbox_report_t rep;
    if (gr_sandbox_enter(&o, &rep) != 0) {
        fprintf(stderr, "child: gr_sandbox_enter: %s\n", rep.off);
        return 100;
    }
    gr_sandbox_paths_free(&o);
    int bad = rep.no_new_privs != 1;
    char line[256];
    int nnp = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "NoNewPrivs: %d", &nnp) == 1)
            break;
    if (f)
        fclose(f);
    bad |= nnp != 1;
    switch (which) {
    case 0:
        bad |= rep.seccomp != 1;
        bad |= G.landlock ? rep.landlock_abi < 1 || rep.off[0] != '\0'
                          : rep.landlock_abi != 0 || strstr(rep.off, "no Landlock") == NULL;
        break;
    case 1:
        bad |= rep.seccomp != 1 || rep.landlock_abi != 0 ||
               strcmp(rep.off, "landlock: not asked for") != 0;
        bad |= expect_errno("open a file outside with Landlock off", open_errno(G.secret, O_RDONLY),
                            0);
        /* seccomp alone refuses signals to others. */
        bad |= expect_errno("kill(getppid(), 0) with Landlock off", kill(getppid(), 0), EPERM);
        break;
    case 2:
        bad |= rep.seccomp != 0 || strcmp(rep.off, "seccomp: not asked for") != 0;
        int s = socket(AF_INET, SOCK_STREAM, 0);
        bad |= expect_errno("socket(AF_INET) with seccomp off", s, 0);
        if (s >= 0)
            close(s);
        /* Landlock alone (ABI >= 6: signals scoped to the sandbox) refuses them too. */
        if (rep.landlock_abi >= 6)
            bad |= expect_errno("kill(getppid(), 0) with seccomp off", kill(getppid(), 0), EPERM);
        break;
    }
    if (bad)
        fprintf(stderr,
                "child: report %d: /proc NoNewPrivs %d, nnp %d abi %d seccomp %d off '%s'\n", which,
                nnp, rep.no_new_privs, rep.landlock_abi, rep.seccomp, rep.off);
    return bad;
}

static void test_report_says_what_is_on(void **state)
{
    (void)state;
    for (int which = 0; which < 3; which++)
        in_child(child_report, &which);
}

/* As an executor that runs as an unprivileged uid: nobody (65534) when the test runs as root. */
static int child_unprivileged(void *arg)
{
    (void)arg;
    gr_sandbox_opts_t o;
    test_opts(&o);
    if (getuid() == 0 && (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                          setresuid(65534, 65534, 65534) != 0)) {
        fprintf(stderr, "child: cannot become nobody: %s\n", strerror(errno));
        return SKIP;
    }
    enter_or_exit(&o);
    int bad = 0;
    bad |= expect_errno("unprivileged: read /etc/ld.so.cache",
                        open_errno("/etc/ld.so.cache", O_RDONLY), 0);
    if (G.landlock)
        bad |= expect_errno("unprivileged: open /etc/hostname",
                            open_errno("/etc/hostname", O_RDONLY), EACCES);
    bad |= expect_errno("unprivileged: socket(AF_INET)", socket(AF_INET, SOCK_STREAM, 0), EPERM);
    return bad;
}

static void test_unprivileged_uid(void **state)
{
    (void)state;
    in_child(child_unprivileged, NULL);
}

static void test_default_paths(void **state)
{
    (void)state;
    gr_sandbox_opts_t o;
    assert_int_equal(gr_sandbox_default_paths("rocm", &o), -1);
    assert_int_equal(errno, EINVAL);
    assert_int_equal(gr_sandbox_default_paths("cpu", &o), 0);
    assert_true(o.landlock && o.seccomp && !o.allow_unix_sockets && o.owned);
    int usr = 0, proc = 0, etc = 0;
    for (size_t i = 0; i < o.n_read; i++) {
        usr |= strcmp(o.read_paths[i], "/usr") == 0;
        proc |= strcmp(o.read_paths[i], "/proc/self") == 0;
        etc |= strcmp(o.read_paths[i], "/etc") == 0;
    }
    assert_true(usr && proc && !etc);
    assert_int_equal(o.n_rw, 1);
    assert_string_equal(o.rw_paths[0], "/dev/null");
    assert_int_equal(o.n_tmp, 0);
    assert_int_equal(gr_sandbox_paths_add(&o, 'x', "/x"), -1);
    assert_int_equal(gr_sandbox_paths_add(&o, 't', "/dev/shm"), 0);
    assert_int_equal(o.n_tmp, 1);
    gr_sandbox_paths_free(&o);
    assert_int_equal(o.n_read, 0);
    assert_null(o.read_paths);

    assert_int_equal(gr_sandbox_default_paths("cuda", &o), 0);
    assert_true(o.allow_unix_sockets);
    assert_int_equal(o.n_tmp, 1);
    assert_string_equal(o.tmp_paths[0], "/dev/shm");
    gr_sandbox_paths_free(&o);
}

static int has(const char *const *list, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], path) == 0)
            return 1;
    return 0;
}

/* The lists come from the device's family row (named by a device as the executor gets it): an
 * xpu executor gets /dev/dri and nothing of CUDA's; a cuda one CUDA's; a kind with no row is
 * refused rather than given the CPU's lists. */
static void test_default_paths_by_family(void **state)
{
    (void)state;
    gr_sandbox_opts_t o;
    assert_int_equal(gr_sandbox_default_paths("xpu:0", &o), 0);
    assert_true(has(o.rw_paths, o.n_rw, "/dev/dri"));
    assert_true(has(o.rw_paths, o.n_rw, "/dev/null"));
    assert_false(has(o.rw_paths, o.n_rw, "/proc/self/task"));
    assert_false(has(o.read_paths, o.n_read, "/proc/driver/nvidia"));
    for (size_t i = 0; i < o.n_rw; i++)
        assert_null(strstr(o.rw_paths[i], "nvidia"));
    assert_false(o.allow_unix_sockets);
    assert_int_equal(o.n_tmp, 0);
    gr_sandbox_paths_free(&o);

    assert_int_equal(gr_sandbox_default_paths("cuda:1", &o), 0);
    assert_true(has(o.read_paths, o.n_read, "/proc/driver/nvidia"));
    assert_true(has(o.rw_paths, o.n_rw, "/proc/self/task"));
    assert_false(has(o.rw_paths, o.n_rw, "/dev/dri"));
    assert_true(o.allow_unix_sockets);
    assert_int_equal(o.n_tmp, 1);
    gr_sandbox_paths_free(&o);

    assert_int_equal(gr_sandbox_default_paths("cpu:0", &o), 0);
    assert_int_equal(o.n_rw, 1);
    assert_string_equal(o.rw_paths[0], "/dev/null");
    assert_false(o.allow_unix_sockets);
    gr_sandbox_paths_free(&o);

    assert_int_equal(gr_sandbox_default_paths("cudax:0", &o), -1);
    assert_int_equal(errno, EINVAL);
    assert_int_equal(gr_sandbox_default_paths(NULL, &o), -1);
}

/* ---- libtorch after entering ------------------------------------------------------------ */

static int count_threads(void)
{
    int n = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

/* Loads the module, captures it on cpu:0 and replays a forward of ones(2, 4): out must be
 * (1.6, 4.2, 6.8) per row. 0 on success. */
static int capture_and_replay(const void *bytes, size_t len)
{
    gr_module_t *m = NULL;
    if (gr_module_load(bytes, len, &m) != GR_OK) {
        fprintf(stderr, "child: gr_module_load: %s\n", gr_last_error());
        return 1;
    }
    gr_arg_spec_t arg = {.dtype = GR_DTYPE_F32, .ndim = 2, .shape = {2, 4}};
    gr_callable_spec_t spec = {.module = m, .n_args = 1, .args = &arg};
    gr_capture_t *c = NULL;
    gr_graph_t *g = NULL;
    if (gr_capture_prepare("cpu:0", 1, &spec, NULL, &c) != GR_OK) {
        fprintf(stderr, "child: gr_capture_prepare: %s\n", gr_last_error());
        return 1;
    }
    size_t count = 0;
    uint64_t total = 0;
    gr_capture_layout(c, 0, &count, NULL, &total);
    gr_tensor_desc_t descs[16];
    if (count > 16 || gr_capture_layout(c, 0, &count, descs, NULL) != GR_OK)
        return 1;
    void *block = aligned_alloc(GR_ALIGN, (total + GR_ALIGN - 1) / GR_ALIGN * GR_ALIGN);
    if (block == NULL || gr_capture_finish(c, &block, &g) != GR_OK) {
        fprintf(stderr, "child: gr_capture_finish: %s\n", gr_last_error());
        return 1;
    }
    float *in = NULL, *out = NULL;
    for (size_t i = 0; i < count; i++) {
        if (descs[i].role == GR_ROLE_INPUT)
            in = (float *)(void *)((uint8_t *)block + descs[i].offset);
        if (descs[i].role == GR_ROLE_OUTPUT)
            out = (float *)(void *)((uint8_t *)block + descs[i].offset);
    }
    if (in == NULL || out == NULL)
        return 1;
    for (int i = 0; i < 8; i++)
        in[i] = 1.0f;
    if (gr_graph_replay(g, GR_PHASE_FORWARD, NULL, NULL) != GR_OK) {
        fprintf(stderr, "child: gr_graph_replay: %s\n", gr_last_error());
        return 1;
    }
    static const float want[3] = {1.6f, 4.2f, 6.8f};
    int bad = 0;
    for (int i = 0; i < 6; i++)
        if (out[i] < want[i % 3] - 1e-4f || out[i] > want[i % 3] + 1e-4f) {
            fprintf(stderr, "child: out[%d] = %g, want %g\n", i, out[i], want[i % 3]);
            bad = 1;
        }
    gr_graph_destroy(g);
    gr_module_release(m);
    free(block);
    return bad;
}

static int child_torch(void *arg)
{
    (void)arg;
    FILE *f = fopen(G.model, "rb");
    if (f == NULL)
        return 1;
    static char bytes[1 << 16];
    size_t len = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    /* As the executor: libtorch initialised and used (its intra-op pool started), then the
     * sandbox, then the tenant's module. */
    if (gr_runtime_init(2) != GR_OK || capture_and_replay(bytes, len) != 0)
        return 1;
    int before = count_threads();
    gr_sandbox_opts_t o;
    test_opts(&o);
    gr_sandbox_report_t rep;
    if (gr_sandbox_enter(&o, &rep) != 0) {
        fprintf(stderr, "child: gr_sandbox_enter: %s\n", rep.off);
        return 100;
    }
    gr_sandbox_paths_free(&o);
    fprintf(stderr, "child: %d threads at entry, %d others restricted by Landlock\n", before,
            rep.threads);
    int bad = 0;
    if (G.landlock && rep.threads != before - 1) {
        fprintf(stderr, "child: libtorch's other threads were not all restricted\n");
        bad = 1;
    }
    bad |= capture_and_replay(bytes, len);
    bad |= expect_errno("libtorch process: open a file outside", open_errno(G.secret, O_RDONLY),
                        G.landlock ? EACCES : 0);
    return bad;
}

static void test_libtorch_works_inside(void **state)
{
    (void)state;
    in_child(child_torch, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_paths),
        cmocka_unit_test(test_default_paths_by_family),
        cmocka_unit_test(test_read_only_allowed_paths),
        cmocka_unit_test(test_nothing_writable),
        cmocka_unit_test(test_no_exec_no_fork_threads_work),
        cmocka_unit_test(test_signals_only_to_itself),
        cmocka_unit_test(test_no_network_sockets),
        cmocka_unit_test(test_memfd_and_mmap_work),
        cmocka_unit_test(test_threads_from_before_are_restricted),
        cmocka_unit_test(test_report_says_what_is_on),
        cmocka_unit_test(test_unprivileged_uid),
        cmocka_unit_test(test_libtorch_works_inside),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
