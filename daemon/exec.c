/* Executors, the daemon's side: processes per (uid, device), their channel, bounds and objects. */
#include "exec.h"
#include "cgroup.h"
#include "exec_proto.h"
#include "daemon.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define READY_MS 60000        /* an executor's start-up, libtorch included */
#define MAX_REPLY (64u << 20) /* the biggest answer taken from an executor */
#define SPIN_NS 50000         /* how long a caller polls for an answer before it sleeps */

typedef enum { KILL_NONE, KILL_TIME, KILL_MEMORY, KILL_STOP } kill_reason_t;

struct gd_exec {
    gd_exec_host_t *host;
    uid_t uid;
    char device[GR_DEVICE_MAX];
    pthread_mutex_t mu; /* one caller at a time; held across a call */
    /* The process; written by the caller holding mu, read by the watchdog under host->mu. */
    int pid, pidfd, sock, urgent;
    uint64_t gen; /* process generation: objects of an older one are gone */
    uint64_t seq;
    atomic_int kill_reason;
    atomic_uint_fast64_t rss;
    /* The state page (exec_proto.h), one memfd for every process of x: sealed, so an executor
     * cannot shrink it under the daemon's mapping. Slots are handed out under host->mu. */
    int state_fd;
    gx_state_t *state;
    uint64_t slots[GX_STATE_SLOTS / 64]; /* bit set: slot in use */
    /* Under host->mu: whether the process of gen runs (started and not reaped), what the
     * watchdog killed it for, and how the last lost process went (lose()). */
    bool live;
    char kill_desc[256];
    uint64_t lost_gen;
    int lost_rc;
    char lost_msg[1024];
    gx_wbuf_t rbuf; /* the last reply's payload */
    char sandbox[160];
    /* Under memory.max in its cgroup (cgroup.h), the oom_kill count there when it started, and
     * whether the kernel killed the last process for memory (seen when reaped). */
    bool in_cgroup, cgroup_oom;
    uint64_t cgroup_ooms;
    uint32_t starts, killed_time, killed_memory, died;
    /* Remote module ids to release at the next call (gd_exec_module_release never blocks). */
    pthread_mutex_t pending_mu;
    uint64_t *pending;
    size_t npending, cap_pending;
    pthread_mutex_t urgent_mu;
    gd_exec_t *next;
};

/* One posix_spawn for the spawner thread. */
typedef struct spawn_req {
    const posix_spawn_file_actions_t *fa;
    const posix_spawnattr_t *sa;
    char *const *argv;
    pid_t pid;
    int rc;
    bool done;
    struct spawn_req *next;
} spawn_req_t;

struct gd_exec_host {
    pthread_mutex_t mu; /* the list, each executor's pid/pidfd for the watchdog, opts' bounds */
    gd_exec_opts_t o;
    char path[4096];
    gd_exec_t *list;
    char off[256];
    /* The spawner: a thread that lives as long as the host and makes every executor process.
     * An executor's PR_SET_PDEATHSIG (its end when the daemon dies) fires when the thread that
     * made it ends, not the daemon: made by a worker, whose thread exits when idle (worker.h),
     * an executor would be SIGKILLed with that thread. */
    pthread_t spawner;
    pthread_mutex_t spawn_mu;
    pthread_cond_t spawn_cond; /* a request came, or spawn_stop */
    pthread_cond_t spawn_done; /* a request was served */
    spawn_req_t *spawn_q;
    bool spawn_stop;
};

/* An object in one executor's process. */
typedef struct ref {
    gd_exec_t *x;
    uint64_t gen, id;
} ref_t;

struct gd_xpool {
    ref_t r;
};
struct gd_xevent {
    ref_t r;
};
struct gd_xseq {
    ref_t r;
};
struct gd_xblock {
    ref_t r; /* id: the device pointer in the executor */
};
struct gd_xcapture {
    ref_t r;
    size_t n;
    uint64_t count[GX_MAX_FDS], total[GX_MAX_FDS];
};
struct gd_xgraph {
    ref_t r;
    uint32_t slot; /* in the state page (GX_NO_SLOT: none) */
    gr_graph_info_t info;
    size_t count, next;
    gr_tensor_desc_t *descs;
    char *names; /* the descs' names, back to back */
    gr_external_t *ext;
};

#define MODULE_AT_MAX 16
struct gd_xmodule {
    pthread_mutex_t mu;
    uint8_t *bytes;
    size_t len;
    struct {
        gd_exec_t *x;
        uint64_t gen, id;
    } at[MODULE_AT_MAX];
    size_t nat;
};

/* ---- errors ------------------------------------------------------------------------------ */

static _Thread_local char last_error[1024];

const char *gd_exec_last_error(void)
{
    return last_error;
}

__attribute__((format(printf, 2, 3))) static int fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return rc;
}

static const char *op_name(uint32_t op)
{
    switch (op) {
#define GX_OP_NAME(name, value)                                                                    \
    case value:                                                                                    \
        return #name;
        GX_OP_MAP(GX_OP_NAME)
#undef GX_OP_NAME
    }
    return "?";
}

/* ---- the host ---------------------------------------------------------------------------- */

static void *spawner_main(void *arg)
{
    gd_exec_host_t *h = arg;
    pthread_setname_np(pthread_self(), "graphd-spawn");
    pthread_mutex_lock(&h->spawn_mu);
    for (;;) {
        while (h->spawn_q == NULL && !h->spawn_stop)
            pthread_cond_wait(&h->spawn_cond, &h->spawn_mu);
        if (h->spawn_q == NULL)
            break;
        spawn_req_t *r = h->spawn_q;
        h->spawn_q = r->next;
        pthread_mutex_unlock(&h->spawn_mu);
        r->rc = posix_spawn(&r->pid, h->path, r->fa, r->sa, r->argv, environ);
        pthread_mutex_lock(&h->spawn_mu);
        r->done = true;
        pthread_cond_broadcast(&h->spawn_done);
    }
    pthread_mutex_unlock(&h->spawn_mu);
    return NULL;
}

/* posix_spawn of the executor binary, made by the spawner thread; its error number or 0. */
static int spawn(gd_exec_host_t *h, const posix_spawn_file_actions_t *fa,
                 const posix_spawnattr_t *sa, char *const *argv, pid_t *pid)
{
    spawn_req_t r = {.fa = fa, .sa = sa, .argv = argv};
    pthread_mutex_lock(&h->spawn_mu);
    spawn_req_t **pp = &h->spawn_q;
    while (*pp)
        pp = &(*pp)->next;
    *pp = &r;
    pthread_cond_signal(&h->spawn_cond);
    while (!r.done)
        pthread_cond_wait(&h->spawn_done, &h->spawn_mu);
    pthread_mutex_unlock(&h->spawn_mu);
    *pid = r.pid;
    return r.rc;
}

int gd_exec_host_create(const gd_exec_opts_t *opts, gd_exec_host_t **out)
{
    gd_exec_host_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return -1;
    pthread_mutex_init(&h->mu, NULL);
    h->o = *opts;
    snprintf(h->path, sizeof h->path, "%s", opts->path);
    h->o.path = h->path;
    if (access(h->path, X_OK) != 0) {
        gd_error("executor binary %s: %s (set executor_path)", h->path, strerror(errno));
        pthread_mutex_destroy(&h->mu);
        free(h);
        return -1;
    }
    pthread_mutex_init(&h->spawn_mu, NULL);
    pthread_cond_init(&h->spawn_cond, NULL);
    pthread_cond_init(&h->spawn_done, NULL);
    if (pthread_create(&h->spawner, NULL, spawner_main, h) != 0) {
        gd_error("cannot start the executors' spawner thread");
        pthread_cond_destroy(&h->spawn_done);
        pthread_cond_destroy(&h->spawn_cond);
        pthread_mutex_destroy(&h->spawn_mu);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

void gd_exec_host_bounds(gd_exec_host_t *h, uint64_t load_ms, uint64_t capture_ms,
                         uint64_t replay_ms, uint64_t memory_bytes)
{
    pthread_mutex_lock(&h->mu);
    h->o.load_ms = load_ms;
    h->o.capture_ms = capture_ms;
    h->o.replay_ms = replay_ms;
    h->o.memory_bytes = memory_bytes;
    gd_cgroup_set_max(h->o.cgroup, memory_bytes);
    pthread_mutex_unlock(&h->mu);
}

/* x's state page: a sealed memfd of sizeof(gx_state_t), mapped here. 0 or -1. */
static int state_make(gd_exec_t *x)
{
    int fd = memfd_create("graphd-executor-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    void *p = MAP_FAILED;
    if (ftruncate(fd, sizeof(gx_state_t)) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        p = mmap(NULL, sizeof(gx_state_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return -1;
    }
    x->state_fd = fd;
    x->state = p;
    return 0;
}

gd_exec_t *gd_exec_get(gd_exec_host_t *h, uid_t uid, const char *device)
{
    pthread_mutex_lock(&h->mu);
    gd_exec_t *x = h->list;
    while (x && !(x->uid == uid && strcmp(x->device, device) == 0))
        x = x->next;
    if (x == NULL && (x = calloc(1, sizeof *x)) != NULL && state_make(x) != 0) {
        free(x);
        x = NULL;
    } else if (x != NULL && x->host == NULL) {
        x->host = h;
        x->uid = uid;
        snprintf(x->device, sizeof x->device, "%s", device);
        pthread_mutex_init(&x->mu, NULL);
        pthread_mutex_init(&x->pending_mu, NULL);
        pthread_mutex_init(&x->urgent_mu, NULL);
        x->pidfd = x->sock = x->urgent = -1;
        x->next = h->list;
        h->list = x;
    }
    pthread_mutex_unlock(&h->mu);
    return x;
}

static void signal_exec(gd_exec_t *x, int sig)
{
    if (x->pidfd >= 0)
        syscall(SYS_pidfd_send_signal, x->pidfd, sig, NULL, 0);
}

/* Reaps x's process (it has exited or been killed) and forgets it; with mu held. *status gets
 * its wait status. */
static void reap(gd_exec_t *x, int *status)
{
    int st = 0;
    if (x->pid > 0)
        while (waitpid(x->pid, &st, 0) < 0 && errno == EINTR)
            ;
    if (status)
        *status = st;
    pthread_mutex_lock(&x->host->mu);
    if (x->pidfd >= 0)
        close(x->pidfd);
    x->pidfd = -1;
    x->pid = 0;
    x->live = false;
    if (x->in_cgroup) { /* emptied by the reap */
        gd_cgroup_t *cg = x->host->o.cgroup;
        x->cgroup_oom = gd_cgroup_exec_ooms(cg, x->uid, x->device) > x->cgroup_ooms;
        gd_cgroup_exec_remove(cg, x->uid, x->device);
        x->in_cgroup = false;
    }
    pthread_mutex_unlock(&x->host->mu);
    pthread_mutex_lock(&x->urgent_mu);
    if (x->urgent >= 0)
        close(x->urgent);
    x->urgent = -1;
    pthread_mutex_unlock(&x->urgent_mu);
    if (x->sock >= 0)
        close(x->sock);
    x->sock = -1;
    pthread_mutex_lock(&x->pending_mu);
    x->npending = 0; /* the process that held them is gone */
    pthread_mutex_unlock(&x->pending_mu);
    atomic_store(&x->rss, 0);
}

void gd_exec_host_destroy(gd_exec_host_t *h, uint64_t grace_ms)
{
    if (h == NULL)
        return;
    /* EOF first: an executor exits on its own once it has answered what it was doing. */
    for (gd_exec_t *x = h->list; x; x = x->next)
        if (x->sock >= 0) {
            shutdown(x->sock, SHUT_RDWR);
            atomic_store(&x->kill_reason, KILL_STOP);
        }
    uint64_t until = gd_now_ns() + grace_ms * 1000000ull;
    for (gd_exec_t *x = h->list; x; x = x->next) {
        while (x->pid > 0 && gd_now_ns() < until) {
            if (waitpid(x->pid, NULL, WNOHANG) == x->pid) {
                x->pid = 0;
                break;
            }
            usleep(2000);
        }
        if (x->pid > 0)
            signal_exec(x, SIGKILL);
        reap(x, NULL);
    }
    while (h->list) {
        gd_exec_t *x = h->list;
        h->list = x->next;
        gx_wbuf_free(&x->rbuf);
        munmap(x->state, sizeof(gx_state_t));
        close(x->state_fd);
        free(x->pending);
        pthread_mutex_destroy(&x->mu);
        pthread_mutex_destroy(&x->pending_mu);
        pthread_mutex_destroy(&x->urgent_mu);
        free(x);
    }
    /* After every executor is reaped: the spawner's end would SIGKILL those still running. */
    pthread_mutex_lock(&h->spawn_mu);
    h->spawn_stop = true;
    pthread_cond_signal(&h->spawn_cond);
    pthread_mutex_unlock(&h->spawn_mu);
    pthread_join(h->spawner, NULL);
    pthread_cond_destroy(&h->spawn_done);
    pthread_cond_destroy(&h->spawn_cond);
    pthread_mutex_destroy(&h->spawn_mu);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void gd_exec_host_kill_all(gd_exec_host_t *h)
{
    pthread_mutex_lock(&h->mu);
    for (gd_exec_t *x = h->list; x; x = x->next)
        if (x->pidfd >= 0) {
            atomic_store(&x->kill_reason, KILL_STOP);
            signal_exec(x, SIGKILL);
        }
    pthread_mutex_unlock(&h->mu);
}

/* A replay that came straight from a client (the state page's busy_since_ns) and has run past
 * max_replay_ms: x is killed as a call past its bound would be. With h->mu held. The time comes
 * from the executor, which a module that took it over could forge; it would only keep its own
 * uid's replays waiting (other uids' replays run in their own executors). */
static void watch_busy(gd_exec_t *x, uint64_t now)
{
    uint64_t bound = x->host->o.replay_ms;
    uint64_t since = atomic_load(&x->state->busy_since_ns);
    if (bound == 0 || since == 0 || now <= since || now - since <= bound * 1000000ull ||
        atomic_load(&x->kill_reason) != KILL_NONE)
        return;
    uint64_t graph = atomic_load(&x->state->busy_graph);
    snprintf(x->kill_desc, sizeof x->kill_desc,
             "a replay of graph %llu took longer than max_replay_ms (%llu ms)",
             (unsigned long long)graph, (unsigned long long)bound);
    atomic_store(&x->kill_reason, KILL_TIME);
    gd_warn("executor of uid %u on %s (pid %d): %s; killed", (unsigned)x->uid, x->device, x->pid,
            x->kill_desc);
    signal_exec(x, SIGKILL);
}

void gd_exec_host_watch(gd_exec_host_t *h)
{
    pthread_mutex_lock(&h->mu);
    uint64_t bound = h->o.memory_bytes;
    long page = sysconf(_SC_PAGESIZE);
    uint64_t now = gd_now_ns();
    for (gd_exec_t *x = h->list; x; x = x->next) {
        if (x->pid <= 0)
            continue;
        watch_busy(x, now);
        char path[64], buf[128];
        snprintf(path, sizeof path, "/proc/%d/statm", x->pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        unsigned long long size = 0, resident = 0;
        if (n <= 0)
            continue;
        buf[n] = 0;
        if (sscanf(buf, "%llu %llu", &size, &resident) != 2)
            continue;
        uint64_t rss = (uint64_t)resident * (uint64_t)page;
        atomic_store(&x->rss, rss);
        /* Under memory.max the kernel holds the bound, on what is charged to the executor. RSS
         * also counts the shared libraries' pages, charged to whoever read them first (the
         * daemon's cgroup, an earlier executor), so it runs ahead of the cgroup's count and the
         * watchdog would kill first with a figure the kernel does not use: it only reports. */
        if (bound && !x->in_cgroup && rss > bound && atomic_load(&x->kill_reason) == KILL_NONE) {
            atomic_store(&x->kill_reason, KILL_MEMORY);
            gd_warn("executor of uid %u on %s (pid %d) holds %llu bytes, over "
                    "max_executor_memory_bytes (%llu): killing it",
                    (unsigned)x->uid, x->device, x->pid, (unsigned long long)rss,
                    (unsigned long long)bound);
            signal_exec(x, SIGKILL);
        }
    }
    pthread_mutex_unlock(&h->mu);
}

size_t gd_exec_host_list(gd_exec_host_t *h, gd_exec_info_t *items, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&h->mu);
    for (gd_exec_t *x = h->list; x; x = x->next, n++) {
        if (items == NULL || n >= max)
            continue;
        gd_exec_info_t *e = &items[n];
        memset(e, 0, sizeof *e);
        e->uid = x->uid;
        snprintf(e->device, sizeof e->device, "%s", x->device);
        e->pid = x->pid;
        e->rss = atomic_load(&x->rss);
        e->starts = x->starts;
        e->killed_time = x->killed_time;
        e->killed_memory = x->killed_memory;
        e->died = x->died;
        if (x->sandbox[0] && x->in_cgroup)
            snprintf(e->sandbox, sizeof e->sandbox, "%s; memory: cgroup memory.max", x->sandbox);
        else if (x->sandbox[0])
            snprintf(e->sandbox, sizeof e->sandbox, "%s; memory: RSS watchdog only (cgroup: %s)",
                     x->sandbox,
                     gd_cgroup_on(h->o.cgroup) ? "could not be set up, see the log"
                                               : gd_cgroup_why(h->o.cgroup));
    }
    pthread_mutex_unlock(&h->mu);
    return n;
}

void gd_exec_host_off(gd_exec_host_t *h, char *buf, size_t len)
{
    pthread_mutex_lock(&h->mu);
    snprintf(buf, len, "%s", h->off);
    pthread_mutex_unlock(&h->mu);
}

/* ---- the channel -------------------------------------------------------------------------- */

/* Waits until fd is ready for events or the deadline (gd_now_ns) passes; 1, 0 at the deadline,
 * -1 on a poll error. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = gd_now_ns();
        if (deadline && now >= deadline)
            return 0;
        int ms = deadline ? (int)((deadline - now + 999999) / 1000000) : -1;
        if (ms > 1000 || ms < 0)
            ms = 1000; /* wake now and then: the watchdog may have killed the process */
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, ms);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

/* Sends all of buf (the first chunk with fds); 0, -1 on a broken channel, 1 at the deadline. */
static int send_all(int fd, const void *buf, size_t len, const int *fds, size_t nfds,
                    uint64_t deadline)
{
    const char *p = buf;
    bool fds_sent = nfds == 0;
    while (len > 0) {
        struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        char cbuf[CMSG_SPACE(sizeof(int) * GX_MAX_FDS)];
        if (!fds_sent) {
            memset(cbuf, 0, sizeof cbuf);
            m.msg_control = cbuf;
            m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
        }
        ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            fds_sent = true;
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w <= 0)
                return w == 0 ? 1 : -1;
            continue;
        }
        return -1;
    }
    return 0;
}

/* Reads exactly len bytes; 0, -1 on EOF or error, 1 at the deadline. spin_until: poll without
 * sleeping until then. */
static int recv_all(int fd, void *buf, size_t len, uint64_t deadline, uint64_t spin_until)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return -1;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        if (spin_until && gd_now_ns() < spin_until)
            continue;
        int w = wait_fd(fd, POLLIN, deadline);
        if (w <= 0)
            return w == 0 ? 1 : -1;
    }
    return 0;
}

static void describe_status(int st, char *buf, size_t len)
{
    if (WIFSIGNALED(st))
        snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else if (WIFEXITED(st))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
    else
        snprintf(buf, len, "stopped");
}

/* The error, logged, for x's process gone (how: what the caller saw; what: its wait status). */
static int lost_error(gd_exec_t *x, int reason, uint32_t op, const char *how, uint64_t bound_ms,
                      const char *bound_name, const char *what, uint64_t mem, int pid)
{
    if (reason == KILL_TIME && x->kill_desc[0]) /* the watchdog's, for a direct replay */
        return fail(GR_ETIMEDOUT,
                    "%s: the executor of uid %u on %s was killed, and that uid's graphs on %s are "
                    "gone; capture them again",
                    x->kill_desc, (unsigned)x->uid, x->device, x->device);
    if (reason == KILL_TIME) {
        gd_warn("executor of uid %u on %s (pid %d): %s took longer than %s (%llu ms); killed",
                (unsigned)x->uid, x->device, pid, op_name(op), bound_name,
                (unsigned long long)bound_ms);
        return fail(GR_ETIMEDOUT,
                    "%s took longer than %s (%llu ms): the executor of uid %u on %s was killed, "
                    "and that uid's graphs on %s are gone; capture them again",
                    op_name(op), bound_name, (unsigned long long)bound_ms, (unsigned)x->uid,
                    x->device, x->device);
    }
    if (reason == KILL_MEMORY)
        return fail(GR_ENOMEM,
                    "the executor of uid %u on %s used more than max_executor_memory_bytes "
                    "(%llu) and was killed; that uid's graphs on %s are gone",
                    (unsigned)x->uid, x->device, (unsigned long long)mem, x->device);
    if (reason == KILL_STOP)
        return fail(GR_ELOST, "the daemon is stopping");
    gd_warn("executor of uid %u on %s (pid %d) %s during %s (%s)", (unsigned)x->uid, x->device, pid,
            what, op_name(op), how);
    return fail(GR_ELOST,
                "the executor of uid %u on %s %s (seen during %s); that uid's graphs on %s are "
                "gone",
                (unsigned)x->uid, x->device, what, op_name(op), x->device);
}

/* The process is gone or must go: kills it, reaps it, counts why, and fails the call with the
 * error that says so (kept as x's last loss). With mu held. */
static int lose(gd_exec_t *x, uint32_t op, const char *how, uint64_t bound_ms,
                const char *bound_name)
{
    int reason = atomic_load(&x->kill_reason);
    signal_exec(x, SIGKILL);
    int st = 0;
    int pid = x->pid;
    reap(x, &st);
    char what[96];
    describe_status(st, what, sizeof what);
    pthread_mutex_lock(&x->host->mu);
    uint64_t mem = x->host->o.memory_bytes;
    if (x->cgroup_oom && (reason == KILL_NONE || reason == KILL_MEMORY)) {
        if (reason == KILL_NONE)
            gd_warn("executor of uid %u on %s (pid %d) was killed by the kernel's OOM killer "
                    "in its cgroup (memory.max = max_executor_memory_bytes, %llu)",
                    (unsigned)x->uid, x->device, pid, (unsigned long long)mem);
        reason = KILL_MEMORY;
    }
    x->cgroup_oom = false;
    if (reason == KILL_TIME)
        x->killed_time++;
    else if (reason == KILL_MEMORY)
        x->killed_memory++;
    else
        x->died++;
    pthread_mutex_unlock(&x->host->mu);
    atomic_store(&x->kill_reason, KILL_NONE);
    int rc = lost_error(x, reason, op, how, bound_ms, bound_name, what, mem, pid);
    pthread_mutex_lock(&x->host->mu);
    x->lost_gen = x->gen;
    x->lost_rc = rc;
    snprintf(x->lost_msg, sizeof x->lost_msg, "%s", last_error);
    x->kill_desc[0] = 0;
    pthread_mutex_unlock(&x->host->mu);
    return rc;
}

/* Reads one message into x->rbuf; 0, -1 broken, 1 at the deadline. */
static int read_msg(gd_exec_t *x, gx_msg_hdr_t *h, uint64_t deadline, uint64_t spin_until)
{
    int rc = recv_all(x->sock, h, sizeof *h, deadline, spin_until);
    if (rc != 0)
        return rc;
    if (h->magic != GX_MAGIC || h->len > MAX_REPLY || h->nfds != 0)
        return -1;
    x->rbuf.len = 0;
    gx_put(&x->rbuf, NULL, 0);
    if (h->len) {
        if (x->rbuf.cap < h->len) {
            uint8_t *grown = realloc(x->rbuf.data, h->len);
            if (grown == NULL)
                return -1;
            x->rbuf.data = grown;
            x->rbuf.cap = h->len;
        }
        rc = recv_all(x->sock, x->rbuf.data, h->len, deadline, 0);
        if (rc != 0)
            return rc;
    }
    x->rbuf.len = h->len;
    return 0;
}

/* Starts x's process and waits for READY; with mu held. GR_OK or an error. */
static int start(gd_exec_t *x)
{
    gd_exec_host_t *h = x->host;
    int ch[2] = {-1, -1}, ur[2] = {-1, -1};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ch) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ur) != 0) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (ch[i] >= 0)
                close(ch[i]);
            if (ur[i] >= 0)
                close(ur[i]);
        }
        return fail(GR_EINTERNAL, "cannot make the executor's channel: %s", strerror(e));
    }
    pthread_mutex_lock(&h->mu);
    gd_exec_opts_t o = h->o;
    /* Under h->mu: a SIGHUP's new memory.max reaches this cgroup too. */
    bool cgroup =
        gd_cgroup_on(o.cgroup) &&
        gd_cgroup_exec_make(o.cgroup, x->uid, x->device, o.memory_bytes, &x->cgroup_ooms) == 0;
    pthread_mutex_unlock(&h->mu);
    char threads[24], cpus[24], unpacked[24], callmem[24], replymax[24], spinus[24], queues[24],
        slice[24];
    snprintf(threads, sizeof threads, "%d", o.intra_op_threads);
    snprintf(cpus, sizeof cpus, "%d", o.cpu_devices);
    snprintf(unpacked, sizeof unpacked, "%llu", (unsigned long long)o.max_unpacked);
    snprintf(callmem, sizeof callmem, "%llu", (unsigned long long)o.call_memory);
    snprintf(replymax, sizeof replymax, "%llu", (unsigned long long)o.reply_max);
    snprintf(spinus, sizeof spinus, "%llu", (unsigned long long)(o.spin ? o.replay_spin_us : 0));
    snprintf(queues, sizeof queues, "%llu", (unsigned long long)o.cuda_queues);
    snprintf(slice, sizeof slice, "%llu", (unsigned long long)o.spin_slice_us);
    char *argv[24];
    int a = 0;
    argv[a++] = (char *)h->path;
    argv[a++] = "--device";
    argv[a++] = x->device;
    argv[a++] = "--intra-op-threads";
    argv[a++] = threads;
    argv[a++] = "--cpu-devices";
    argv[a++] = cpus;
    argv[a++] = "--max-unpacked";
    argv[a++] = unpacked;
    argv[a++] = "--call-memory";
    argv[a++] = callmem;
    argv[a++] = "--reply-max";
    argv[a++] = replymax;
    argv[a++] = "--spin-us";
    argv[a++] = spinus;
    argv[a++] = "--spin-slice-us";
    argv[a++] = slice;
    argv[a++] = "--cuda-queues";
    argv[a++] = queues;
    if (!o.sandbox)
        argv[a++] = "--no-sandbox";
    argv[a] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, ch[1], GX_CHANNEL_FD);
    posix_spawn_file_actions_adddup2(&fa, ur[1], GX_URGENT_FD);
    posix_spawn_file_actions_adddup2(&fa, x->state_fd, GX_STATE_FD);
    atomic_store(&x->state->busy_since_ns, 0);
    /* Its own process group: a signal to the daemon's group (Ctrl-C) reaches the daemon, which
     * then ends its executors in order. */
    posix_spawnattr_t sa;
    posix_spawnattr_init(&sa);
    posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&sa, &none);
    pid_t pid = 0;
    int rc = spawn(h, &fa, &sa, argv, &pid);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&sa);
    close(ch[1]);
    close(ur[1]);
    if (rc != 0) {
        close(ch[0]);
        close(ur[0]);
        return fail(GR_EINTERNAL, "cannot start the executor %s: %s", h->path, strerror(rc));
    }
    /* Into its cgroup before it is sent anything: it loads module code only when asked. What
     * it allocated before the move stays charged to the daemon's cgroup (libtorch's start). */
    if (cgroup)
        cgroup = gd_cgroup_exec_enter(o.cgroup, x->uid, x->device, pid) == 0;
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    pthread_mutex_lock(&h->mu);
    x->in_cgroup = cgroup;
    x->pid = pid;
    x->pidfd = pidfd;
    x->sock = ch[0];
    x->gen++;
    x->starts++;
    x->live = true;
    x->kill_desc[0] = 0;
    pthread_mutex_unlock(&h->mu);
    /* Releases queued for the old process since it was reaped name its ids, not this one's. */
    pthread_mutex_lock(&x->pending_mu);
    x->npending = 0;
    pthread_mutex_unlock(&x->pending_mu);
    pthread_mutex_lock(&x->urgent_mu);
    x->urgent = ur[0];
    pthread_mutex_unlock(&x->urgent_mu);
    atomic_store(&x->kill_reason, KILL_NONE);

    gx_msg_hdr_t hd;
    rc = read_msg(x, &hd, gd_now_ns() + READY_MS * 1000000ull, 0);
    if (rc != 0 || hd.op != GX_OP_READY || hd.rc != GR_OK) {
        if (rc == 0 && hd.rc != GR_OK) /* it said why */
            gd_error("executor of uid %u on %s did not start: %.*s", (unsigned)x->uid, x->device,
                     (int)x->rbuf.len, (const char *)x->rbuf.data);
        return lose(x, GX_OP_READY, "starting", 0, "");
    }
    gx_rbuf_t r = {.p = x->rbuf.data, .len = x->rbuf.len};
    char version[64], off[128];
    gx_get_str(&r, version, sizeof version);
    uint32_t nnp = gx_get_u32(&r), landlock = gx_get_u32(&r), seccomp = gx_get_u32(&r);
    gx_get_str(&r, off, sizeof off);
    if (r.bad)
        return lose(x, GX_OP_READY, "a malformed READY", 0, "");
    char sandbox[160];
    if (landlock || seccomp)
        snprintf(sandbox, sizeof sandbox, "%s%s%s%s", nnp ? "no_new_privs" : "",
                 landlock ? ", landlock" : "", seccomp ? ", seccomp" : "", off[0] ? "; off: " : "");
    else
        snprintf(sandbox, sizeof sandbox, "%s; off: ", nnp ? "no_new_privs" : "nothing");
    snprintf(sandbox + strlen(sandbox), sizeof sandbox - strlen(sandbox), "%s", off);
    pthread_mutex_lock(&h->mu);
    snprintf(x->sandbox, sizeof x->sandbox, "%s", sandbox);
    if (off[0])
        snprintf(h->off, sizeof h->off, "%s", off);
    pthread_mutex_unlock(&h->mu);
    if (x->starts == 1 || off[0])
        gd_info("executor of uid %u on %s started (pid %d, libtorch %s): %s", (unsigned)x->uid,
                x->device, pid, version, sandbox);
    return GR_OK;
}

typedef enum { BOUND_LOAD, BOUND_CAPTURE, BOUND_REPLAY } bound_t;

static void bound_of(gd_exec_t *x, bound_t b, uint64_t *ms, const char **name)
{
    pthread_mutex_lock(&x->host->mu);
    const gd_exec_opts_t *o = &x->host->o;
    *ms = b == BOUND_LOAD ? o->load_ms : b == BOUND_REPLAY ? o->replay_ms : o->capture_ms;
    *name = b == BOUND_LOAD     ? "max_load_ms"
            : b == BOUND_REPLAY ? "max_replay_ms"
                                : "max_capture_ms";
    pthread_mutex_unlock(&x->host->mu);
}

static int call_raw(gd_exec_t *x, uint32_t op, const gx_wbuf_t *req, const int *fds, size_t nfds,
                    bound_t bound, gx_rbuf_t *rep);

/* Sends the module releases queued by gd_exec_module_release; with mu held. */
static void flush_pending(gd_exec_t *x)
{
    pthread_mutex_lock(&x->pending_mu);
    size_t n = x->npending;
    gx_wbuf_t b = {0};
    gx_put_u32(&b, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        gx_put_u64(&b, x->pending[i]);
    x->npending = 0;
    pthread_mutex_unlock(&x->pending_mu);
    if (n && !b.oom) {
        gx_rbuf_t r;
        if (call_raw(x, GX_OP_MODULE_RELEASE, &b, NULL, 0, BOUND_CAPTURE, &r) != GR_OK)
            gd_warn("releasing modules in the executor of uid %u on %s: %s", (unsigned)x->uid,
                    x->device, last_error);
    }
    gx_wbuf_free(&b);
}

/* One request and its answer; with mu held. GR_OK with rep over the answer's payload (valid
 * until the next call on x), or the executor's error (its message in last_error), or the error
 * of a lost, killed or unstartable executor. */
static int call_raw(gd_exec_t *x, uint32_t op, const gx_wbuf_t *req, const int *fds, size_t nfds,
                    bound_t bound, gx_rbuf_t *rep)
{
    if (req->oom)
        return fail(GR_ENOMEM, "out of memory building a request to the executor");
    if (x->sock < 0) {
        int rc = start(x);
        if (rc != GR_OK)
            return rc;
    }
    uint64_t ms;
    const char *bname;
    bound_of(x, bound, &ms, &bname);
    uint64_t t0 = gd_now_ns();
    uint64_t deadline = ms ? t0 + ms * 1000000ull : 0;
    gx_msg_hdr_t h = {
        .magic = GX_MAGIC, .op = op, .seq = ++x->seq, .len = req->len, .nfds = (uint32_t)nfds};
    int rc = send_all(x->sock, &h, sizeof h, fds, nfds, deadline);
    if (rc == 0 && req->len)
        rc = send_all(x->sock, req->data, req->len, NULL, 0, deadline);
    gx_msg_hdr_t a;
    if (rc == 0) {
        bool spin = x->host->o.spin;
        rc = read_msg(x, &a, deadline, spin ? gd_now_ns() + SPIN_NS : 0);
    }
    if (rc == 1) {
        atomic_store(&x->kill_reason, KILL_TIME);
        return lose(x, op, "deadline", ms, bname);
    }
    if (rc != 0 || a.op != op || a.seq != h.seq)
        return lose(x, op, rc != 0 ? "channel closed" : "a reply out of order", ms, bname);
    if (a.rc != GR_OK) {
        int len = (int)(x->rbuf.len < sizeof last_error - 1 ? x->rbuf.len : sizeof last_error - 1);
        /* The executor's message: printable bytes only, it is untrusted text. */
        for (int i = 0; i < len; i++) {
            unsigned char c = x->rbuf.data[i];
            last_error[i] = (char)(c >= 0x20 && c != 0x7f ? c : '?');
        }
        last_error[len] = 0;
        return a.rc < 0 && a.rc >= GR_ELOST ? a.rc : GR_EINTERNAL;
    }
    *rep = (gx_rbuf_t){.p = x->rbuf.data, .len = x->rbuf.len};
    return GR_OK;
}

/* x's process has died or been killed since the last call (its direct replays do not pass
 * through here): reaps it now, so that the call starts a fresh one, or finds its object gone.
 * With mu held. */
static void reap_if_gone(gd_exec_t *x)
{
    if (x->sock < 0)
        return;
    struct pollfd p = {.fd = x->pidfd, .events = POLLIN};
    if (atomic_load(&x->kill_reason) == KILL_NONE &&
        (x->pidfd < 0 || poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN)))
        return;
    char saved[sizeof last_error];
    memcpy(saved, last_error, sizeof saved);
    (void)lose(x, GX_OP_READY, "found gone at the next call", 0, "");
    memcpy(last_error, saved, sizeof saved);
}

static int call(gd_exec_t *x, uint32_t op, const gx_wbuf_t *req, const int *fds, size_t nfds,
                bound_t bound, gx_rbuf_t *rep)
{
    reap_if_gone(x);
    if (x->sock >= 0) {
        pthread_mutex_lock(&x->pending_mu);
        size_t n = x->npending;
        pthread_mutex_unlock(&x->pending_mu);
        if (n)
            flush_pending(x);
    }
    return call_raw(x, op, req, fds, nfds, bound, rep);
}

/* A reply that does not parse: the executor is not to be trusted any more. */
static int malformed(gd_exec_t *x, uint32_t op)
{
    signal_exec(x, SIGKILL);
    int rc = lose(x, op, "a malformed reply", 0, "");
    (void)rc;
    return fail(GR_ELOST,
                "the executor of uid %u on %s sent a malformed answer to %s and was "
                "killed; that uid's graphs on %s are gone",
                (unsigned)x->uid, x->device, op_name(op), x->device);
}

/* Locks the object's executor; GR_ELOST (unlocked) when the object's process is gone. */
static int lock_ref(const ref_t *r, const char *what)
{
    pthread_mutex_lock(&r->x->mu);
    reap_if_gone(r->x);
    if (r->gen != r->x->gen || r->x->sock < 0) {
        pthread_mutex_unlock(&r->x->mu);
        return fail(GR_ELOST,
                    "this %s was in the executor of uid %u on %s, which was restarted since (it "
                    "was killed or died); capture again",
                    what, (unsigned)r->x->uid, r->x->device);
    }
    return GR_OK;
}

/* A call on one object (an id in, nothing or rep out). */
static int ref_call(const ref_t *r, const char *what, uint32_t op, gx_wbuf_t *b, bound_t bound,
                    gx_rbuf_t *rep)
{
    int rc = lock_ref(r, what);
    if (rc != GR_OK) {
        gx_wbuf_free(b);
        return rc;
    }
    gx_rbuf_t dummy;
    rc = call(r->x, op, b, NULL, 0, bound, rep ? rep : &dummy);
    pthread_mutex_unlock(&r->x->mu);
    gx_wbuf_free(b);
    return rc;
}

/* Destroying an object whose process is gone succeeds: there is nothing left to free. */
static int ref_destroy(ref_t *r, const char *what, uint32_t op)
{
    gx_wbuf_t b = {0};
    gx_put_u64(&b, r->id);
    int rc = ref_call(r, what, op, &b, BOUND_CAPTURE, NULL);
    return rc == GR_ELOST ? GR_OK : rc;
}

/* ---- modules ------------------------------------------------------------------------------ */

/* The module's id in x, loading it there first; with x->mu held. */
static int module_in(gd_xmodule_t *m, gd_exec_t *x, uint64_t *id, gr_module_info_t *info)
{
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nat; i++)
        if (m->at[i].x == x && m->at[i].gen == x->gen && x->sock >= 0 && info == NULL) {
            *id = m->at[i].id;
            pthread_mutex_unlock(&m->mu);
            return GR_OK;
        }
    pthread_mutex_unlock(&m->mu);
    gx_wbuf_t b = {0};
    gx_put_bytes(&b, m->bytes, m->len);
    gx_rbuf_t r;
    int rc = call(x, GX_OP_MODULE_LOAD, &b, NULL, 0, BOUND_LOAD, &r);
    gx_wbuf_free(&b);
    if (rc != GR_OK)
        return rc;
    *id = gx_get_u64(&r);
    gr_module_info_t mi;
    gx_get(&r, &mi, sizeof mi);
    if (r.bad)
        return malformed(x, GX_OP_MODULE_LOAD);
    if (info)
        *info = mi;
    pthread_mutex_lock(&m->mu);
    size_t i = 0;
    while (i < m->nat && m->at[i].x != x)
        i++;
    if (i == MODULE_AT_MAX) { /* more devices than slots: drop the oldest's record */
        memmove(&m->at[0], &m->at[1], (MODULE_AT_MAX - 1) * sizeof m->at[0]);
        i = MODULE_AT_MAX - 1;
    } else if (i == m->nat) {
        m->nat++;
    }
    m->at[i].x = x;
    m->at[i].gen = x->gen;
    m->at[i].id = *id;
    pthread_mutex_unlock(&m->mu);
    return GR_OK;
}

int gd_exec_module_load(gd_exec_t *x, const void *bytes, size_t len, gd_xmodule_t **out,
                        gr_module_info_t *info)
{
    gd_xmodule_t *m = calloc(1, sizeof *m);
    if (m == NULL || (m->bytes = malloc(len ? len : 1)) == NULL) {
        free(m);
        return fail(GR_ENOMEM, "out of memory keeping a module of %zu bytes", len);
    }
    memcpy(m->bytes, bytes, len);
    m->len = len;
    pthread_mutex_init(&m->mu, NULL);
    uint64_t id;
    pthread_mutex_lock(&x->mu);
    int rc = module_in(m, x, &id, info);
    pthread_mutex_unlock(&x->mu);
    if (rc != GR_OK) {
        pthread_mutex_destroy(&m->mu);
        free(m->bytes);
        free(m);
        return rc;
    }
    *out = m;
    return GR_OK;
}

void gd_exec_module_release(gd_xmodule_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->nat; i++) {
        gd_exec_t *x = m->at[i].x;
        pthread_mutex_lock(&x->pending_mu);
        /* gen is read without mu: a stale id is harmless (the executor answers not found) */
        if (m->at[i].gen == x->gen) {
            if (x->npending == x->cap_pending) {
                size_t cap = x->cap_pending ? 2 * x->cap_pending : 16;
                uint64_t *grown = realloc(x->pending, cap * sizeof *grown);
                if (grown) {
                    x->pending = grown;
                    x->cap_pending = cap;
                }
            }
            if (x->npending < x->cap_pending)
                x->pending[x->npending++] = m->at[i].id;
        }
        pthread_mutex_unlock(&x->pending_mu);
    }
    pthread_mutex_destroy(&m->mu);
    free(m->bytes);
    free(m);
}

/* ---- pools ----------------------------------------------------------------------------- */

static int new_ref(gd_exec_t *x, gx_rbuf_t *r, uint32_t op, size_t size, void **out)
{
    uint64_t id = gx_get_u64(r);
    if (r->bad)
        return malformed(x, op);
    ref_t *o = calloc(1, size);
    if (o == NULL)
        return fail(GR_ENOMEM, "out of memory");
    *o = (ref_t){.x = x, .gen = x->gen, .id = id};
    *out = o;
    return GR_OK;
}

int gd_exec_pool_create(gd_exec_t *x, const char *device, gd_xpool_t **out)
{
    gx_wbuf_t b = {0};
    gx_put_str(&b, device);
    pthread_mutex_lock(&x->mu);
    gx_rbuf_t r;
    int rc = call(x, GX_OP_POOL_CREATE, &b, NULL, 0, BOUND_CAPTURE, &r);
    if (rc == GR_OK)
        rc = new_ref(x, &r, GX_OP_POOL_CREATE, sizeof **out, (void **)out);
    pthread_mutex_unlock(&x->mu);
    gx_wbuf_free(&b);
    return rc;
}

int gd_exec_pool_destroy(gd_xpool_t *p)
{
    if (p == NULL)
        return GR_OK;
    int rc = ref_destroy(&p->r, "pool", GX_OP_POOL_DESTROY);
    if (rc != GR_EBUSY)
        free(p);
    return rc;
}

int gd_exec_pool_memory(gd_xpool_t *p, uint64_t *reserved, uint64_t *in_use)
{
    gx_wbuf_t b = {0};
    gx_put_u64(&b, p->r.id);
    int rc = lock_ref(&p->r, "pool");
    if (rc != GR_OK) {
        gx_wbuf_free(&b);
        *reserved = *in_use = 0;
        return GR_OK; /* nothing left of it */
    }
    gx_rbuf_t r;
    rc = call(p->r.x, GX_OP_POOL_MEMORY, &b, NULL, 0, BOUND_CAPTURE, &r);
    if (rc == GR_OK) {
        *reserved = gx_get_u64(&r);
        *in_use = gx_get_u64(&r);
        if (r.bad)
            rc = malformed(p->r.x, GX_OP_POOL_MEMORY);
    }
    pthread_mutex_unlock(&p->r.x->mu);
    gx_wbuf_free(&b);
    return rc;
}

bool gd_exec_pool_lost(const gd_xpool_t *p)
{
    pthread_mutex_lock(&p->r.x->host->mu);
    bool lost = p->r.gen != p->r.x->gen || p->r.x->pid == 0;
    pthread_mutex_unlock(&p->r.x->host->mu);
    return lost;
}

/* ---- capture ------------------------------------------------------------------------------ */

int gd_exec_capture_prepare(gd_exec_t *x, const char *device, size_t n, const gd_xcallable_t *specs,
                            const gd_xcapture_opts_t *opts, gd_xcapture_t **out)
{
    if (n == 0 || n > GX_MAX_FDS)
        return fail(GR_EINVAL, "%zu callables: give 1 to %d", n, GX_MAX_FDS);
    pthread_mutex_lock(&x->mu);
    if (opts->pool && (opts->pool->r.x != x || opts->pool->r.gen != x->gen || x->sock < 0)) {
        pthread_mutex_unlock(&x->mu);
        return fail(GR_ELOST,
                    "the graph pool of this session on %s was in an executor that was "
                    "restarted; capture again",
                    device);
    }
    uint64_t mids[GX_MAX_FDS];
    for (size_t i = 0; i < n; i++) {
        int rc = module_in(specs[i].module, x, &mids[i], NULL);
        if (rc != GR_OK) {
            pthread_mutex_unlock(&x->mu);
            return rc;
        }
    }
    gx_wbuf_t b = {0};
    gx_put_str(&b, device);
    gx_put_i32(&b, opts->num_warmup_iters);
    gx_put_i32(&b, opts->allow_unused_input);
    gx_put_u64(&b, opts->pool ? opts->pool->r.id : 0);
    gx_put_i32(&b, opts->resident);
    gx_put_i32(&b, opts->copy_param_grads);
    gx_put_i32(&b, opts->reuse_warmup);
    gx_put_u32(&b, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        gx_put_u64(&b, mids[i]);
        gx_put_str(&b, specs[i].method ? specs[i].method : "");
        gx_put_u32(&b, (uint32_t)specs[i].n_args);
        for (size_t k = 0; k < specs[i].n_args; k++) {
            const gr_arg_spec_t *a = &specs[i].args[k];
            gx_put_i32(&b, a->dtype);
            gx_put_u32(&b, a->ndim);
            uint64_t numel = 1;
            for (uint32_t d = 0; d < a->ndim && d < GR_MAX_DIMS; d++) {
                gx_put_i64(&b, a->shape[d]);
                numel *= (uint64_t)a->shape[d];
            }
            gx_put_i32(&b, a->requires_grad);
            gx_put_bytes(&b, a->data, a->data ? numel * gr_dtype_size(a->dtype) : 0);
        }
    }
    gx_rbuf_t r;
    int rc = call(x, GX_OP_CAPTURE_PREPARE, &b, NULL, 0, BOUND_CAPTURE, &r);
    gx_wbuf_free(&b);
    if (rc == GR_OK) {
        gd_xcapture_t *c = NULL;
        rc = new_ref(x, &r, GX_OP_CAPTURE_PREPARE, sizeof *c, (void **)&c);
        if (rc == GR_OK) {
            c->n = gx_get_u32(&r);
            for (size_t i = 0; i < c->n && i < GX_MAX_FDS; i++) {
                c->count[i] = gx_get_u64(&r);
                c->total[i] = gx_get_u64(&r);
            }
            if (r.bad || c->n != n) {
                free(c);
                rc = malformed(x, GX_OP_CAPTURE_PREPARE);
            } else {
                *out = c;
            }
        }
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int gd_exec_capture_layout(const gd_xcapture_t *c, size_t i, size_t *count, uint64_t *total)
{
    if (c == NULL || i >= c->n)
        return fail(GR_EINVAL, "no callable %zu in this capture", i);
    *count = (size_t)c->count[i];
    if (total)
        *total = c->total[i];
    return GR_OK;
}

int gd_exec_capture_abort(gd_xcapture_t *c)
{
    if (c == NULL)
        return GR_OK;
    int rc = ref_destroy(&c->r, "capture", GX_OP_CAPTURE_ABORT);
    free(c);
    return rc;
}

static void graph_free(gd_xgraph_t *g)
{
    if (g == NULL)
        return;
    free(g->descs);
    free(g->names);
    free(g->ext);
    free(g);
}

/* One graph of a CAPTURE_FINISH answer. */
static gd_xgraph_t *read_graph(gd_exec_t *x, gx_rbuf_t *r)
{
    gd_xgraph_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        return NULL;
    g->slot = GX_NO_SLOT;
    g->r = (ref_t){.x = x, .gen = x->gen, .id = gx_get_u64(r)};
    gx_get(r, &g->info, sizeof g->info);
    g->info.device[GR_DEVICE_MAX - 1] = 0;
    (void)gx_get_u64(r); /* total_bytes: info has it too */
    g->count = gx_get_u32(r);
    if (r->bad || g->count > r->len / 16) { /* a tensor takes more than 16 bytes */
        r->bad = true;
        graph_free(g);
        return NULL;
    }
    g->descs = calloc(g->count ? g->count : 1, sizeof *g->descs);
    size_t cap = 64 * g->count + 1, used = 0;
    g->names = malloc(cap);
    size_t *offs = calloc(g->count ? g->count : 1, sizeof *offs);
    if (g->descs == NULL || g->names == NULL || offs == NULL) {
        free(offs);
        graph_free(g);
        return NULL;
    }
    for (size_t i = 0; i < g->count && !r->bad; i++) {
        gr_tensor_desc_t *t = &g->descs[i];
        t->role = gx_get_i32(r);
        t->index = gx_get_u32(r);
        char name[256];
        gx_get_str(r, name, sizeof name);
        size_t nl = strlen(name) + 1;
        if (used + nl > cap) {
            char *grown = realloc(g->names, cap = 2 * (used + nl));
            if (grown == NULL) {
                r->bad = true;
                break;
            }
            g->names = grown;
        }
        memcpy(g->names + used, name, nl);
        offs[i] = used;
        used += nl;
        t->dtype = gx_get_i32(r);
        t->ndim = gx_get_u32(r);
        if (t->ndim > GR_MAX_DIMS || t->role < 0 || t->role >= GR_ROLE_COUNT) {
            r->bad = true;
            break;
        }
        for (uint32_t d = 0; d < t->ndim; d++)
            t->shape[d] = gx_get_i64(r);
        for (uint32_t d = 0; d < t->ndim; d++)
            t->strides[d] = gx_get_i64(r);
        t->offset = gx_get_u64(r);
        t->nbytes = gx_get_u64(r);
        t->flags = gx_get_u32(r);
    }
    for (size_t i = 0; i < g->count && !r->bad; i++)
        g->descs[i].name = g->names + offs[i];
    free(offs);
    g->next = gx_get_u32(r);
    if (!r->bad && g->next <= g->count) {
        g->ext = calloc(g->next ? g->next : 1, sizeof *g->ext);
        for (size_t i = 0; g->ext && i < g->next; i++) {
            gr_external_t *e = &g->ext[i];
            e->tensor = (size_t)gx_get_u64(r);
            e->base = (void *)(uintptr_t)gx_get_u64(r);
            e->size = gx_get_u64(r);
            e->offset = gx_get_u64(r);
            gx_get(r, e->handle, GR_IPC_HANDLE_SIZE);
            if (e->tensor >= g->count)
                r->bad = true;
        }
        if (g->ext == NULL)
            r->bad = true;
    } else {
        r->bad = true;
    }
    if (r->bad) {
        graph_free(g);
        return NULL;
    }
    return g;
}

int gd_exec_capture_finish(gd_xcapture_t *c, const gd_xbase_t *bases, gd_xgraph_t **graphs)
{
    int rc = lock_ref(&c->r, "capture");
    if (rc != GR_OK) {
        free(c);
        return rc;
    }
    gd_exec_t *x = c->r.x;
    gx_wbuf_t b = {0};
    int fds[GX_MAX_FDS];
    size_t nfds = 0;
    gx_put_u64(&b, c->r.id);
    gx_put_u32(&b, (uint32_t)c->n);
    for (size_t i = 0; i < c->n; i++) {
        if (bases[i].block) {
            gx_put_u32(&b, GX_BLOCK_DEVICE);
            gx_put_u64(&b, bases[i].block->r.id);
        } else {
            gx_put_u32(&b, GX_BLOCK_HOST);
            gx_put_u64(&b, bases[i].len);
            fds[nfds++] = bases[i].fd;
        }
    }
    gx_rbuf_t r;
    rc = call(x, GX_OP_CAPTURE_FINISH, &b, fds, nfds, BOUND_CAPTURE, &r);
    gx_wbuf_free(&b);
    size_t made = 0;
    if (rc == GR_OK) {
        uint32_t n = gx_get_u32(&r);
        if (n != c->n)
            r.bad = true;
        for (; made < c->n && !r.bad; made++)
            if ((graphs[made] = read_graph(x, &r)) == NULL)
                break;
        if (made != c->n || r.bad) {
            while (made > 0)
                graph_free(graphs[--made]);
            rc = r.bad ? malformed(x, GX_OP_CAPTURE_FINISH) : fail(GR_ENOMEM, "out of memory");
        }
    }
    pthread_mutex_unlock(&x->mu);
    free(c);
    return rc;
}

/* ---- graphs ------------------------------------------------------------------------------- */

void gd_exec_graph_info(const gd_xgraph_t *g, gr_graph_info_t *out)
{
    *out = g->info;
}

size_t gd_exec_graph_layout(const gd_xgraph_t *g, const gr_tensor_desc_t **descs)
{
    *descs = g->descs;
    return g->count;
}

size_t gd_exec_graph_external(const gd_xgraph_t *g, const gr_external_t **items)
{
    *items = g->ext;
    return g->next;
}

int gd_exec_graph_replay(gd_xgraph_t *g, int phase, gd_xevent_t *wait, gd_xevent_t *done,
                         gd_xseq_t *seq, uint64_t n, uint64_t *elapsed_ns)
{
    gx_wbuf_t b = {0};
    gx_put_u64(&b, g->r.id);
    gx_put_i32(&b, phase);
    if (seq) {
        gx_put_u32(&b, GX_REPLAY_POSTED);
        gx_put_u64(&b, seq->r.id);
        gx_put_u64(&b, n);
    } else if (wait && done) {
        gx_put_u32(&b, GX_REPLAY_ORDERED);
        gx_put_u64(&b, wait->r.id);
        gx_put_u64(&b, done->r.id);
    } else {
        gx_put_u32(&b, GX_REPLAY_PLAIN);
    }
    gx_rbuf_t r;
    int rc = lock_ref(&g->r, "graph");
    if (rc != GR_OK) {
        gx_wbuf_free(&b);
        return rc;
    }
    rc = call(g->r.x, GX_OP_GRAPH_REPLAY, &b, NULL, 0, BOUND_REPLAY, &r);
    if (rc == GR_OK) {
        uint64_t ns = gx_get_u64(&r);
        if (r.bad)
            rc = malformed(g->r.x, GX_OP_GRAPH_REPLAY);
        else if (elapsed_ns)
            *elapsed_ns = ns;
    }
    pthread_mutex_unlock(&g->r.x->mu);
    gx_wbuf_free(&b);
    return rc;
}

int gd_exec_graph_destroy(gd_xgraph_t *g, gd_xstats_t *last)
{
    if (g == NULL)
        return GR_OK;
    int rc = ref_destroy(&g->r, "graph", GX_OP_GRAPH_DESTROY);
    if (last)
        gd_exec_graph_stats(g, last);
    if (g->slot != GX_NO_SLOT) {
        pthread_mutex_lock(&g->r.x->host->mu);
        g->r.x->slots[g->slot / 64] &= ~(UINT64_C(1) << (g->slot % 64));
        pthread_mutex_unlock(&g->r.x->host->mu);
    }
    graph_free(g);
    return rc;
}

/* ---- the direct data plane ------------------------------------------------------------------ */

int gd_exec_conn_open(gd_xgraph_t *g, uint64_t session, int fd)
{
    gx_wbuf_t b = {0};
    gx_put_u64(&b, session);
    int rc = lock_ref(&g->r, "graph");
    if (rc != GR_OK) {
        gx_wbuf_free(&b);
        return rc;
    }
    gx_rbuf_t r;
    rc = call(g->r.x, GX_OP_CONN_OPEN, &b, &fd, 1, BOUND_CAPTURE, &r);
    pthread_mutex_unlock(&g->r.x->mu);
    gx_wbuf_free(&b);
    return rc;
}

/* A free slot of x's state page, zeroed and taken; GX_NO_SLOT when all are in use. */
static uint32_t slot_take(gd_exec_t *x)
{
    uint32_t slot = GX_NO_SLOT;
    pthread_mutex_lock(&x->host->mu);
    for (uint32_t w = 0; w < GX_STATE_SLOTS / 64 && slot == GX_NO_SLOT; w++)
        if (~x->slots[w]) {
            unsigned bit = (unsigned)__builtin_ctzll(~x->slots[w]);
            x->slots[w] |= UINT64_C(1) << bit;
            slot = w * 64 + bit;
        }
    pthread_mutex_unlock(&x->host->mu);
    if (slot != GX_NO_SLOT)
        memset(&x->state->slot[slot], 0, sizeof x->state->slot[slot]);
    return slot;
}

int gd_exec_graph_bind(gd_xgraph_t *g, uint64_t session, uint64_t handle)
{
    gd_exec_t *x = g->r.x;
    if (g->slot == GX_NO_SLOT && (g->slot = slot_take(x)) == GX_NO_SLOT)
        gd_warn("the executor of uid %u on %s has %d graphs with figures: graph %llu's direct "
                "replays go uncounted in status",
                (unsigned)x->uid, x->device, GX_STATE_SLOTS, (unsigned long long)handle);
    gx_wbuf_t b = {0};
    gx_put_u64(&b, g->r.id);
    gx_put_u64(&b, session);
    gx_put_u64(&b, handle);
    gx_put_u32(&b, g->slot);
    return ref_call(&g->r, "graph", GX_OP_GRAPH_BIND, &b, BOUND_CAPTURE, NULL);
}

static int session_bind(const ref_t *r, const char *what, uint64_t session, uint32_t kind)
{
    gx_wbuf_t b = {0};
    gx_put_u64(&b, session);
    gx_put_u32(&b, kind);
    gx_put_u64(&b, r->id);
    return ref_call(r, what, GX_OP_SESSION_BIND, &b, BOUND_CAPTURE, NULL);
}

int gd_exec_seq_bind(gd_xseq_t *s, uint64_t session)
{
    return session_bind(&s->r, "sequence counter", session, GX_BIND_SEQ);
}

int gd_exec_events_bind(gd_xevent_t *wait, gd_xevent_t *done, uint64_t session)
{
    int rc = session_bind(&wait->r, "event", session, GX_BIND_WAIT);
    return rc == GR_OK ? session_bind(&done->r, "event", session, GX_BIND_DONE) : rc;
}

gd_exec_t *gd_exec_graph_exec(const gd_xgraph_t *g, uint64_t *gen)
{
    *gen = g->r.gen;
    return g->r.x;
}

void gd_exec_graph_stats(const gd_xgraph_t *g, gd_xstats_t *out)
{
    memset(out, 0, sizeof *out);
    if (g->slot == GX_NO_SLOT)
        return;
    const gx_slot_t *s = &g->r.x->state->slot[g->slot];
    out->forward = atomic_load_explicit(&s->forward, memory_order_relaxed);
    out->backward = atomic_load_explicit(&s->backward, memory_order_relaxed);
    out->errors = atomic_load_explicit(&s->errors, memory_order_relaxed);
    gx_hist_merge(&out->latency, &s->latency);
}

bool gd_exec_lost(gd_exec_t *x, uint64_t gen, int *rc, char *msg, size_t len)
{
    bool lost = true;
    pthread_mutex_lock(&x->host->mu);
    int reason = atomic_load(&x->kill_reason);
    struct pollfd p = {.fd = x->pidfd, .events = POLLIN};
    if (x->gen != gen || !x->live) {
        if (x->lost_gen == gen) {
            *rc = x->lost_rc;
            snprintf(msg, len, "%s", x->lost_msg);
        } else {
            *rc = GR_ELOST;
            snprintf(msg, len,
                     "the executor of uid %u on %s was restarted since (it was killed or died); "
                     "capture again",
                     (unsigned)x->uid, x->device);
        }
    } else if (reason == KILL_TIME && x->kill_desc[0]) {
        *rc = GR_ETIMEDOUT;
        snprintf(msg, len,
                 "%s: the executor of uid %u on %s was killed, and that uid's graphs on %s are "
                 "gone; capture them again",
                 x->kill_desc, (unsigned)x->uid, x->device, x->device);
    } else if (reason == KILL_MEMORY ||
               (x->in_cgroup && x->pidfd >= 0 && poll(&p, 1, 0) > 0 &&
                gd_cgroup_exec_ooms(x->host->o.cgroup, x->uid, x->device) > x->cgroup_ooms)) {
        /* The watchdog's kill, or the kernel's in the executor's cgroup (memory.max). */
        *rc = GR_ENOMEM;
        snprintf(msg, len,
                 "the executor of uid %u on %s used more than max_executor_memory_bytes (%llu) "
                 "and was killed; that uid's graphs on %s are gone",
                 (unsigned)x->uid, x->device, (unsigned long long)x->host->o.memory_bytes,
                 x->device);
    } else if (reason != KILL_NONE || (x->pidfd >= 0 && poll(&p, 1, 0) > 0)) {
        *rc = GR_ELOST;
        snprintf(msg, len, "the executor of uid %u on %s %s; that uid's graphs on %s are gone",
                 (unsigned)x->uid, x->device, reason == KILL_STOP ? "was stopped" : "died",
                 x->device);
    } else {
        lost = false;
    }
    pthread_mutex_unlock(&x->host->mu);
    return lost;
}

void gd_exec_host_direct(gd_exec_host_t *h, uint64_t *replays_dropped, uint64_t *dropped_conns)
{
    *replays_dropped = *dropped_conns = 0;
    pthread_mutex_lock(&h->mu);
    for (gd_exec_t *x = h->list; x; x = x->next) {
        *replays_dropped += atomic_load(&x->state->replays_dropped);
        *dropped_conns += atomic_load(&x->state->dropped_conns);
    }
    pthread_mutex_unlock(&h->mu);
}

/* ---- device memory and ordering objects ---------------------------------------------------- */

/* A call that makes an object on device, with an IPC handle in (open) or out (create). */
static int make_obj(gd_exec_t *x, uint32_t op, const char *device, uint64_t bytes,
                    const uint8_t *handle_in, uint8_t *handle_out, size_t size, void **out)
{
    gx_wbuf_t b = {0};
    gx_put_str(&b, device);
    if (op == GX_OP_DEVICE_ALLOC)
        gx_put_u64(&b, bytes);
    if (handle_in)
        gx_put(&b, handle_in, GR_IPC_HANDLE_SIZE);
    pthread_mutex_lock(&x->mu);
    gx_rbuf_t r;
    int rc = call(x, op, &b, NULL, 0, BOUND_CAPTURE, &r);
    gx_wbuf_free(&b);
    if (rc == GR_OK) {
        uint64_t id = gx_get_u64(&r);
        if (handle_out)
            gx_get(&r, handle_out, GR_IPC_HANDLE_SIZE);
        ref_t *o = r.bad ? NULL : calloc(1, size);
        if (r.bad)
            rc = malformed(x, op);
        else if (o == NULL)
            rc = fail(GR_ENOMEM, "out of memory");
        else {
            *o = (ref_t){.x = x, .gen = x->gen, .id = id};
            *out = o;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int gd_exec_device_alloc(gd_exec_t *x, const char *device, uint64_t bytes, gd_xblock_t **out,
                         uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    return make_obj(x, GX_OP_DEVICE_ALLOC, device, bytes, NULL, handle, sizeof **out, (void **)out);
}

gd_exec_t *gd_exec_block_exec(const gd_xblock_t *b)
{
    return b->r.x;
}

int gd_exec_device_free(gd_xblock_t *blk)
{
    if (blk == NULL)
        return GR_OK;
    gx_wbuf_t b = {0};
    gx_put_str(&b, blk->r.x->device);
    gx_put_u64(&b, blk->r.id);
    int rc = ref_call(&blk->r, "device block", GX_OP_DEVICE_FREE, &b, BOUND_CAPTURE, NULL);
    free(blk);
    return rc == GR_ELOST ? GR_OK : rc;
}

int gd_exec_event_create(gd_exec_t *x, const char *device, gd_xevent_t **out,
                         uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    return make_obj(x, GX_OP_EVENT_CREATE, device, 0, NULL, handle, sizeof **out, (void **)out);
}

int gd_exec_event_open(gd_exec_t *x, const char *device, const uint8_t handle[GR_IPC_HANDLE_SIZE],
                       gd_xevent_t **out)
{
    return make_obj(x, GX_OP_EVENT_OPEN, device, 0, handle, NULL, sizeof **out, (void **)out);
}

int gd_exec_event_destroy(gd_xevent_t *e)
{
    if (e == NULL)
        return GR_OK;
    int rc = ref_destroy(&e->r, "event", GX_OP_EVENT_DESTROY);
    free(e);
    return rc;
}

int gd_exec_seq_create(gd_exec_t *x, const char *device, gd_xseq_t **out,
                       uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    return make_obj(x, GX_OP_SEQ_CREATE, device, 0, NULL, handle, sizeof **out, (void **)out);
}

/* One request on the urgent socket, which the executor serves at once on a thread of its own
 * and does not answer; never blocks. A stale generation: the counters' process is gone, and
 * its waits with it. */
static int urgent(const gd_xseq_t *s, uint32_t op, uint64_t n)
{
    gd_exec_t *x = s->r.x;
    struct {
        gx_msg_hdr_t h;
        uint64_t id, n;
    } m = {.h = {.magic = GX_MAGIC, .op = op, .len = op == GX_OP_SEQ_SKIP ? 16 : 8},
           .id = s->r.id,
           .n = n};
    size_t len = sizeof m.h + m.h.len;
    int rc = GR_OK;
    pthread_mutex_lock(&x->urgent_mu);
    if (x->urgent >= 0 && s->r.gen == x->gen &&
        send(x->urgent, &m, len, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)len)
        rc = fail(GR_EINTERNAL, "cannot reach the executor of uid %u on %s: %s", (unsigned)x->uid,
                  x->device, strerror(errno));
    pthread_mutex_unlock(&x->urgent_mu);
    return rc;
}

int gd_exec_seq_skip(gd_xseq_t *s, uint64_t n)
{
    return urgent(s, GX_OP_SEQ_SKIP, n);
}

int gd_exec_seq_release(gd_xseq_t *s)
{
    return urgent(s, GX_OP_SEQ_RELEASE, 0);
}

int gd_exec_seq_destroy(gd_xseq_t *s)
{
    if (s == NULL)
        return GR_OK;
    int rc = ref_destroy(&s->r, "sequence counter", GX_OP_SEQ_DESTROY);
    free(s);
    return rc;
}
