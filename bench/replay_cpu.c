/*
 * bench/replay_cpu: what a replay costs a client on the CPU device. A trivial
 * TorchScript module (x * 2 on a float32 [4] tensor, traced at run time) is
 * registered and captured in graphd, then replayed (FORWARD) through the
 * fast path (REPLAY frame on the session socket) and through gRPC Replay;
 * the same module is also called in-process through graph_runtime
 * (gr_module_load, gr_capture_prepare/finish, gr_graph_replay on malloc'd
 * blocks: the libtorch call with no daemon in between). Prints p50 and p99
 * of each and the ratios to the in-process call; the targets are fast path
 * <= 3x and gRPC <= 10x at p50. For scale it also times the floor of any
 * daemon on this machine: a 40-byte ping-pong with another process over a
 * Unix socketpair, no work at all. A benchmark, not a test: it exits 0
 * whether or not the targets are met.
 *
 * Usage: replay_cpu [--iters N] [--warmup N]   (defaults 10000 and 1000)
 * Environment: GRAPHD_ADDRESS (a running daemon; else build/graphd, next to
 * this binary's directory, is started on a socket in a temporary directory),
 * GRAPHD_PYTHON (the python with torch; default /usr/bin/python3).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "graphd.h"
#include "runtime.h"

extern char **environ;

#define BLOCK 1000 /* replays per path before switching to the next one */
#define NUMEL 4

static const char TRACE_PY[] = "import sys, torch\n"
                               "class Twice(torch.nn.Module):\n"
                               "    def forward(self, x):\n"
                               "        return x * 2\n"
                               "torch.jit.trace(Twice(), torch.zeros(4)).save(sys.argv[1])\n";

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static char tmpdir[64];
static pid_t daemon_pid;

static void cleanup(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = 0;
    }
    if (tmpdir[0] != '\0') {
        const char *names[] = {"twice.pt", "graphd.log", "graphd.sock", "graphd.sock.session"};
        char path[128];
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            snprintf(path, sizeof(path), "%s/%s", tmpdir, names[i]);
            unlink(path);
        }
        rmdir(tmpdir);
        tmpdir[0] = '\0';
    }
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "replay_cpu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    cleanup();
    exit(1);
}

static int run_wait(const char *const *argv, int out_fd)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (out_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
        posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
    }
    pid_t pid;
    int err = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0)
        die("cannot run %s: %s", argv[0], strerror(err));
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            die("waitpid: %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die("%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n)
        die("cannot read %s", path);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* The traced module's archive, made by python in tmpdir. */
static void *make_module(size_t *len)
{
    const char *python = getenv("GRAPHD_PYTHON");
    if (python == NULL || python[0] == '\0')
        python = "/usr/bin/python3";
    char path[128];
    snprintf(path, sizeof(path), "%s/twice.pt", tmpdir);
    const char *argv[] = {python, "-c", TRACE_PY, path, NULL};
    if (run_wait(argv, -1) != 0)
        die("%s could not trace the module (GRAPHD_PYTHON picks the python with torch)", python);
    return read_all(path, len);
}

/* Starts build/graphd (the directory above this binary's) on a socket in tmpdir. */
static void start_daemon(char *address, size_t size)
{
    char exe[PATH_MAX], graphd[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        die("readlink /proc/self/exe: %s", strerror(errno));
    exe[n] = '\0';
    snprintf(graphd, sizeof(graphd), "%s/graphd", dirname(dirname(exe)));
    snprintf(address, size, "unix:%s/graphd.sock", tmpdir);
    char log[128];
    snprintf(log, sizeof(log), "%s/graphd.log", tmpdir);
    const char *argv[] = {graphd,  "--config",    "/dev/null", "--listen",
                          address, "--log-level", "warn",      NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    int err = posix_spawn(&daemon_pid, graphd, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0) {
        daemon_pid = 0;
        die("cannot start %s: %s", graphd, strerror(err));
    }
    for (uint64_t t0 = now_ns(); now_ns() - t0 < 10000000000u; usleep(20000)) {
        if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid) {
            daemon_pid = 0;
            die("graphd exited at start; see %s", log);
        }
        graphd_client_t *c;
        size_t count = 0;
        if (graphd_connect(address, &c) != GRAPHD_OK)
            continue;
        int rc = graphd_list_devices(c, &count, NULL);
        graphd_close(c);
        if (rc == GRAPHD_OK)
            return;
    }
    die("graphd did not answer on %s within 10 s", address);
}

/*
 * The round trip of a 40-byte message to a child process that echoes it over a socketpair: what
 * any out-of-process call costs here before it does any work. Runs before gRPC or libtorch start
 * threads, so that the fork is plain.
 */
static void ipc_floor(uint64_t *ns, size_t iters, size_t warmup)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        char b[40];
        close(sv[0]);
        while (recv(sv[1], b, sizeof(b), MSG_WAITALL) == (ssize_t)sizeof(b))
            if (send(sv[1], b, sizeof(b), MSG_NOSIGNAL) != (ssize_t)sizeof(b))
                break;
        _exit(0);
    }
    close(sv[1]);
    char b[40] = {0};
    for (size_t i = 0; i < warmup + iters; i++) {
        uint64_t t0 = now_ns();
        if (send(sv[0], b, sizeof(b), MSG_NOSIGNAL) != (ssize_t)sizeof(b) ||
            recv(sv[0], b, sizeof(b), MSG_WAITALL) != (ssize_t)sizeof(b))
            die("ping-pong: %s", strerror(errno));
        if (i >= warmup)
            ns[i - warmup] = now_ns() - t0;
    }
    close(sv[0]);
    waitpid(pid, NULL, 0);
}

typedef struct path {
    const char *name;
    uint64_t *ns; /* per call, round trip as the caller sees it */
    size_t n;
} path_t;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank quantile of sorted v[0..n-1]. */
static double quantile_us(const uint64_t *v, size_t n, double q)
{
    size_t rank = (size_t)ceil(q * (double)n);
    if (rank < 1)
        rank = 1;
    return (double)v[rank - 1] / 1000.0;
}

typedef struct inproc {
    gr_graph_t *g;
    void *block;
    float *in, *out;
} inproc_t;

static void inproc_setup(inproc_t *ip, const void *bytes, size_t len)
{
    gr_module_t *m;
    if (gr_runtime_init(0) != GR_OK || gr_module_load(bytes, len, &m) != GR_OK)
        die("graph_runtime: %s", gr_last_error());
    gr_arg_spec_t arg = {.dtype = GR_DTYPE_F32, .ndim = 1, .shape = {NUMEL}};
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_t *cap;
    if (gr_capture_prepare("cpu:0", 1, &spec, NULL, &cap) != GR_OK)
        die("gr_capture_prepare: %s", gr_last_error());
    size_t count = 0;
    uint64_t total = 0;
    gr_capture_layout(cap, 0, &count, NULL, &total);
    gr_tensor_desc_t descs[8];
    if (count > 8)
        die("unexpected layout of %zu tensors", count);
    gr_capture_layout(cap, 0, &count, descs, NULL);
    ip->block = aligned_alloc(GR_ALIGN, total);
    if (ip->block == NULL)
        die("out of memory");
    if (gr_capture_finish(cap, &ip->block, &ip->g) != GR_OK)
        die("gr_capture_finish: %s", gr_last_error());
    gr_module_release(m);
    for (size_t k = 0; k < count; k++) {
        if (descs[k].role == GR_ROLE_INPUT)
            ip->in = (void *)((uint8_t *)ip->block + descs[k].offset);
        if (descs[k].role == GR_ROLE_OUTPUT)
            ip->out = (void *)((uint8_t *)ip->block + descs[k].offset);
    }
    if (ip->in == NULL || ip->out == NULL)
        die("no input or output in the in-process layout");
}

int main(int argc, char **argv)
{
    size_t iters = 10000, warmup = 1000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
            warmup = strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: replay_cpu [--iters N] [--warmup N]\n");
            return 2;
        }
    }
    if (iters < BLOCK)
        iters = BLOCK;
    iters -= iters % BLOCK;

    uint64_t *floor_ns = calloc(iters, sizeof(uint64_t));
    if (floor_ns == NULL)
        die("out of memory");
    ipc_floor(floor_ns, iters, warmup);

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/graphd-bench-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        die("mkdtemp: %s", strerror(errno));
    size_t len = 0;
    void *bytes = make_module(&len);

    char address[256];
    const char *env = getenv("GRAPHD_ADDRESS");
    if (env != NULL && env[0] != '\0')
        snprintf(address, sizeof(address), "%s", env);
    else
        start_daemon(address, sizeof(address));

    /* graphd: register, capture, find the static input and output. */
    graphd_client_t *c;
    uint64_t mid;
    graphd_graph_t *g;
    if (graphd_connect(address, &c) != GRAPHD_OK)
        die("graphd_connect %s failed", address);
    int rc = graphd_hello(c, "bench-replay-cpu");
    if (rc == GRAPHD_OK)
        rc = graphd_module_register(c, bytes, len, "twice", &mid);
    graphd_tensor_spec_t spec = {.dtype = GRAPHD_FLOAT32, .ndim = 1, .shape = {NUMEL}};
    graphd_callable_t callable = {mid, NULL, 1, &spec};
    if (rc == GRAPHD_OK)
        rc = graphd_capture(c, 1, &callable, NULL, &g);
    if (rc != GRAPHD_OK)
        die("graphd: %s: %s", graphd_err_name(rc), graphd_last_error(c));
    graphd_tensor_t t[8];
    size_t count = 8;
    if (graphd_graph_tensors(g, &count, t) != GRAPHD_OK)
        die("graphd_graph_tensors: %s", graphd_last_error(c));
    float *gin = NULL, *gout = NULL;
    for (size_t k = 0; k < count; k++) {
        if (t[k].role == GRAPHD_ROLE_INPUT)
            gin = t[k].data;
        if (t[k].role == GRAPHD_ROLE_OUTPUT)
            gout = t[k].data;
    }
    if (gin == NULL || gout == NULL)
        die("the graph has no input or output");

    inproc_t ip = {0};
    inproc_setup(&ip, bytes, len);
    free(bytes);
    for (int i = 0; i < NUMEL; i++)
        gin[i] = ip.in[i] = (float)i + 0.5f;

    enum { INPROC, FAST, RPC, NPATHS };
    path_t paths[NPATHS] = {{"in-process (graph_runtime)", NULL, 0},
                            {"fast path (REPLAY frame)", NULL, 0},
                            {"gRPC Replay", NULL, 0}};
    uint64_t *device_ns = calloc(iters, sizeof(uint64_t));
    size_t n_device = 0;
    for (int p = 0; p < NPATHS; p++) {
        paths[p].ns = calloc(iters, sizeof(uint64_t));
        if (paths[p].ns == NULL || device_ns == NULL)
            die("out of memory");
    }

    /* Warm-up, then blocks of BLOCK calls per path in turn, so that a noisy spell on this
     * machine is shared by all three rather than landing on one. */
    for (size_t i = 0; i < warmup; i++) {
        uint64_t ns;
        if (gr_graph_replay(ip.g, GR_PHASE_FORWARD, NULL, NULL) != GR_OK ||
            graphd_replay(g, GRAPHD_PHASE_FORWARD, &ns) != GRAPHD_OK ||
            graphd_replay_rpc(g, GRAPHD_PHASE_FORWARD, &ns) != GRAPHD_OK)
            die("warm-up replay failed: %s %s", gr_last_error(), graphd_last_error(c));
    }
    for (size_t done = 0; done < iters; done += BLOCK) {
        for (int p = 0; p < NPATHS; p++) {
            for (size_t i = 0; i < BLOCK; i++) {
                uint64_t dev = 0, t0 = now_ns();
                if (p == INPROC)
                    rc = gr_graph_replay(ip.g, GR_PHASE_FORWARD, NULL, NULL);
                else if (p == FAST)
                    rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, &dev);
                else
                    rc = graphd_replay_rpc(g, GRAPHD_PHASE_FORWARD, &dev);
                uint64_t t1 = now_ns();
                if (rc != 0)
                    die("%s: replay failed (%d): %s %s", paths[p].name, rc, gr_last_error(),
                        graphd_last_error(c));
                paths[p].ns[paths[p].n++] = t1 - t0;
                if (p == FAST)
                    device_ns[n_device++] = dev;
            }
        }
    }
    for (int i = 0; i < NUMEL; i++)
        if (gout[i] != 2 * gin[i] || ip.out[i] != 2 * ip.in[i])
            die("wrong result: graphd %g, in-process %g, want %g", gout[i], ip.out[i], 2 * gin[i]);

    char cpu[128] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    for (char line[256]; f != NULL && fgets(line, sizeof(line), f) != NULL;) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
            snprintf(cpu, sizeof(cpu), "%s", colon + 2);
            cpu[strcspn(cpu, "\n")] = '\0';
            break;
        }
    }
    if (f != NULL)
        fclose(f);
    printf("graphd replay round trip on the CPU device: x * 2 on float32[%d] (FORWARD)\n", NUMEL);
    printf("%zu replays per path after %zu warm-up, in blocks of %d; libtorch %s; %ld CPUs (%s)\n",
           iters, warmup, BLOCK, gr_runtime_torch_version(), sysconf(_SC_NPROCESSORS_ONLN), cpu);
    printf("daemon: %s\n\n", daemon_pid > 0 ? "started by the benchmark" : address);
    printf("%-28s %10s %10s %12s %8s\n", "path", "p50 (us)", "p99 (us)", "p50 / inproc", "target");
    double base = 0;
    const char *targets[NPATHS] = {"", "<= 3x", "<= 10x"};
    const double limits[NPATHS] = {0, 3, 10};
    for (int p = 0; p < NPATHS; p++) {
        qsort(paths[p].ns, paths[p].n, sizeof(uint64_t), cmp_u64);
        double p50 = quantile_us(paths[p].ns, paths[p].n, 0.50);
        double p99 = quantile_us(paths[p].ns, paths[p].n, 0.99);
        if (p == INPROC)
            base = p50;
        double ratio = p50 / base;
        printf("%-28s %10.2f %10.2f %11.2fx %8s%s\n", paths[p].name, p50, p99, ratio, targets[p],
               p == INPROC ? "" : (ratio <= limits[p] ? "  met" : "  MISSED"));
    }
    qsort(device_ns, n_device, sizeof(uint64_t), cmp_u64);
    printf("%-28s %10.2f %10.2f   (the daemon's device_ns on the fast path)\n",
           "  of which in the replay", quantile_us(device_ns, n_device, 0.50),
           quantile_us(device_ns, n_device, 0.99));
    qsort(floor_ns, iters, sizeof(uint64_t), cmp_u64);
    double floor50 = quantile_us(floor_ns, iters, 0.50);
    printf("%-28s %10.2f %10.2f %11.2fx   (no work: the floor of any out-of-process call)\n",
           "socketpair ping-pong", floor50, quantile_us(floor_ns, iters, 0.99), floor50 / base);
    free(floor_ns);

    for (int p = 0; p < NPATHS; p++)
        free(paths[p].ns);
    free(device_ns);
    gr_graph_destroy(ip.g);
    free(ip.block);
    graphd_graph_release(g);
    graphd_module_release(c, mid);
    graphd_close(c);
    cleanup();
    return 0;
}
