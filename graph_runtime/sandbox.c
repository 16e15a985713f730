/*
 * The executor sandbox (sandbox.h): no_new_privs, then Landlock through its raw syscalls (Debian
 * 12's headers know only ABI 2; the rights of later ABIs are defined here and handled only when
 * the running kernel's ABI has them), then a libseccomp filter that allows by default and denies
 * what a module never needs. Owns nothing after gr_sandbox_enter returns.
 */
#include "sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <linux/landlock.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- Landlock: rights by ABI ------------------------------------------------------------ */

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_ABI1 ((1ULL << 13) - 1) /* EXECUTE .. MAKE_SYM */
#define LL_FS_REFER (1ULL << 13)      /* ABI 2 */
#define LL_FS_TRUNCATE (1ULL << 14)   /* ABI 3 */
#define LL_FS_IOCTL_DEV (1ULL << 15)  /* ABI 5 */
/* The rights a rule on a file (not a directory) may carry. */
#define LL_FS_FILE_RIGHTS                                                                          \
    (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)
#define LL_NET_BIND_TCP (1ULL << 0)               /* ABI 4 */
#define LL_NET_CONNECT_TCP (1ULL << 1)            /* ABI 4 */
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define LL_SCOPE_SIGNAL (1ULL << 1)               /* ABI 6 */

/* struct landlock_ruleset_attr as of ABI 6; the size passed says which fields the kernel reads. */
struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net; /* ABI 4 */
    uint64_t scoped;             /* ABI 6 */
};

#define BCAST_MAX_THREADS 4096
#define BCAST_WAIT_NS (2ULL * 1000 * 1000 * 1000)

/* What the signal handler of the thread broadcast reads and writes. A signal handler can reach
 * nothing else, so this one is process-wide; gr_sandbox_enter is called once per process. */
static struct {
    int ruleset_fd;
    atomic_int n_done;
    atomic_int failed_errno;
    pid_t done[BCAST_MAX_THREADS];
} bcast;

static void report_off(gr_sandbox_report_t *rep, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void report_off(gr_sandbox_report_t *rep, const char *fmt, ...)
{
    size_t len = strlen(rep->off);
    if (len + 3 >= sizeof rep->off)
        return;
    if (len > 0) {
        memcpy(rep->off + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->off + len, sizeof rep->off - len, fmt, ap);
    va_end(ap);
}

static int ll_abi(void)
{
    return (int)syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
}

static uint64_t ll_handled_fs(int abi)
{
    uint64_t fs = LL_FS_ABI1;
    if (abi >= 2)
        fs |= LL_FS_REFER;
    if (abi >= 3)
        fs |= LL_FS_TRUNCATE;
    if (abi >= 5)
        fs |= LL_FS_IOCTL_DEV;
    return fs;
}

/* Allows access beneath path (or to the file path). A path that does not exist, or that this
 * process may not reach anyway, is skipped. 0, or -1 with the reason in rep. */
static int ll_allow(int ruleset, const char *path, uint64_t access, uint64_t handled,
                    gr_sandbox_report_t *rep)
{
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR || errno == EACCES || errno == ELOOP)
            return 0;
        report_off(rep, "landlock: open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        report_off(rep, "landlock: stat %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        access &= LL_FS_FILE_RIGHTS;
    struct landlock_path_beneath_attr pb = {.allowed_access = access & handled, .parent_fd = fd};
    long rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
    int err = errno;
    close(fd);
    if (rc != 0) {
        report_off(rep, "landlock: rule for %s: %s", path, strerror(err));
        return -1;
    }
    return 0;
}

static void bcast_handler(int sig)
{
    (void)sig;
    int saved = errno;
    /* landlock_restrict_self needs no_new_privs on the calling thread, and it is per thread. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_landlock_restrict_self, bcast.ruleset_fd, 0) != 0) {
        atomic_store(&bcast.failed_errno, errno);
    } else {
        int i = atomic_fetch_add(&bcast.n_done, 1);
        if (i < BCAST_MAX_THREADS)
            bcast.done[i] = gettid();
    }
    errno = saved;
}

static int bcast_is_done(pid_t tid)
{
    int n = atomic_load(&bcast.n_done);
    for (int i = 0; i < n && i < BCAST_MAX_THREADS; i++)
        if (bcast.done[i] == tid)
            return 1;
    return 0;
}

static int task_alive(pid_t tid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d", (int)tid);
    return access(path, F_OK) == 0;
}

/* Makes every other thread of the process apply the ruleset to itself, from a signal handler,
 * until a listing of /proc/self/task finds none left. 0, or -1 with the reason in rep. */
static int ll_restrict_others(int ruleset, int sig, gr_sandbox_report_t *rep)
{
    pid_t self = gettid(), pid = getpid();
    struct sigaction sa = {.sa_handler = bcast_handler, .sa_flags = SA_RESTART}, old;
    sigemptyset(&sa.sa_mask);
    bcast.ruleset_fd = ruleset;
    atomic_store(&bcast.n_done, 0);
    atomic_store(&bcast.failed_errno, 0);
    if (sigaction(sig, &sa, &old) != 0) {
        report_off(rep, "landlock: sigaction: %s", strerror(errno));
        return -1;
    }
    int rc = -1;
    static pid_t signalled[BCAST_MAX_THREADS];
    int n_signalled = 0;
    for (int round = 0; round < 16; round++) {
        DIR *d = opendir("/proc/self/task");
        if (d == NULL) {
            report_off(rep, "landlock: /proc/self/task: %s", strerror(errno));
            goto out;
        }
        int sent = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            pid_t tid = (pid_t)atoi(e->d_name);
            if (tid <= 0 || tid == self || bcast_is_done(tid))
                continue;
            int already = 0;
            for (int i = 0; i < n_signalled; i++)
                already |= signalled[i] == tid;
            if (already)
                continue;
            if (n_signalled == BCAST_MAX_THREADS) {
                closedir(d);
                report_off(rep, "landlock: more than %d threads", BCAST_MAX_THREADS);
                goto out;
            }
            if (syscall(SYS_tgkill, pid, tid, sig) != 0) {
                if (errno == ESRCH)
                    continue; /* it has exited */
                closedir(d);
                report_off(rep, "landlock: signal thread %d: %s", (int)tid, strerror(errno));
                goto out;
            }
            signalled[n_signalled++] = tid;
            sent++;
        }
        closedir(d);
        if (sent == 0) {
            rc = 0;
            break;
        }
        /* Wait until every signalled thread has restricted itself or exited. */
        struct timespec start, now, nap = {0, 200 * 1000};
        clock_gettime(CLOCK_MONOTONIC, &start);
        for (;;) {
            if (atomic_load(&bcast.failed_errno) != 0) {
                report_off(rep, "landlock: a thread could not restrict itself: %s",
                           strerror(atomic_load(&bcast.failed_errno)));
                goto out;
            }
            pid_t waiting = 0;
            for (int i = 0; i < n_signalled && waiting == 0; i++)
                if (!bcast_is_done(signalled[i]) && task_alive(signalled[i]))
                    waiting = signalled[i];
            if (waiting == 0)
                break;
            clock_gettime(CLOCK_MONOTONIC, &now);
            uint64_t ns = (uint64_t)(now.tv_sec - start.tv_sec) * 1000000000ULL +
                          (uint64_t)now.tv_nsec - (uint64_t)start.tv_nsec;
            if (ns > BCAST_WAIT_NS) {
                report_off(rep,
                           "landlock: thread %d did not restrict itself within 2 s (does it block "
                           "signal %d?)",
                           (int)waiting, sig);
                goto out;
            }
            nanosleep(&nap, NULL);
        }
    }
    if (rc != 0)
        report_off(rep, "landlock: threads kept appearing while restricting them");
out:
    sigaction(sig, &old, NULL);
    rep->threads = atomic_load(&bcast.n_done);
    return rc;
}

/* 0 when applied or not available (said in rep->off), -1 on failure. */
static int apply_landlock(const gr_sandbox_opts_t *o, gr_sandbox_report_t *rep)
{
    int abi = ll_abi();
    if (abi < 0) {
        if (errno == ENOSYS || errno == EOPNOTSUPP) {
            report_off(rep, "landlock: the kernel has no Landlock (%s)",
                       errno == ENOSYS ? "ENOSYS" : "EOPNOTSUPP: disabled at boot");
            return 0;
        }
        report_off(rep, "landlock: ABI query: %s", strerror(errno));
        return -1;
    }
    struct ll_ruleset_attr attr = {.handled_access_fs = ll_handled_fs(abi)};
    size_t attr_size = sizeof attr.handled_access_fs;
    if (abi >= 4) {
        attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP; /* no rule: no TCP */
        attr_size = offsetof(struct ll_ruleset_attr, scoped);
    }
    if (abi >= 6) {
        /* No signals to processes outside the sandbox; no connecting to abstract unix sockets
         * made outside it unless unix sockets are allowed (MPS). */
        attr.scoped = LL_SCOPE_SIGNAL | (o->allow_unix_sockets ? 0 : LL_SCOPE_ABSTRACT_UNIX_SOCKET);
        attr_size = sizeof attr;
    }
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0);
    if (ruleset < 0) {
        report_off(rep, "landlock: create ruleset (ABI %d): %s", abi, strerror(errno));
        return -1;
    }
    const uint64_t h = attr.handled_access_fs;
    const uint64_t read = LL_FS_READ_FILE | LL_FS_READ_DIR | LL_FS_EXECUTE;
    const uint64_t rw =
        LL_FS_READ_FILE | LL_FS_READ_DIR | LL_FS_WRITE_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV;
    const uint64_t tmp = rw | LL_FS_MAKE_REG | LL_FS_REMOVE_FILE;
    int rc = 0;
    for (size_t i = 0; i < o->n_read && rc == 0; i++)
        rc = ll_allow(ruleset, o->read_paths[i], read, h, rep);
    for (size_t i = 0; i < o->n_rw && rc == 0; i++)
        rc = ll_allow(ruleset, o->rw_paths[i], rw, h, rep);
    for (size_t i = 0; i < o->n_tmp && rc == 0; i++)
        rc = ll_allow(ruleset, o->tmp_paths[i], tmp, h, rep);
    if (rc == 0 && syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
        report_off(rep, "landlock: restrict_self: %s", strerror(errno));
        rc = -1;
    }
    if (rc == 0)
        rc = ll_restrict_others(ruleset, SIGRTMIN + 7, rep);
    close(ruleset);
    if (rc == 0)
        rep->landlock_abi = abi;
    return rc;
}

/* ---- seccomp ---------------------------------------------------------------------------- */

/* Denied with EPERM: process creation and replacement, other processes' memory, kernel and
 * system administration, namespaces and mounts, identity changes, and kernel interfaces with a
 * history of exploitable bugs that no libtorch or CUDA code path uses. */
/* clang-format off */
static const char *const deny_always[] = {
    "execve", "execveat", "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev",
    "process_madvise", "pidfd_getfd", "pidfd_send_signal", "kcmp", "mount", "umount2",
    "pivot_root", "chroot", "setns", "unshare", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "bpf", "perf_event_open", "keyctl", "add_key",
    "request_key", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "acct", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "setuid", "setgid", "setreuid", "setregid",
    "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups", "capset", "mknod", "mknodat",
    "fanotify_init", "quotactl", "quotactl_fd", "syslog", "vhangup", "iopl", "ioperm", "uselib",
    "sethostname", "setdomainname", "lookup_dcookie",
};
/* clang-format on */

/* Signal calls whose first argument is a pid (or the tgid): allowed only for this process. */
static const char *const own_pid_only[] = {"kill", "tkill", "tgkill", "rt_sigqueueinfo",
                                           "rt_tgsigqueueinfo"};

static int sc_rule(scmp_filter_ctx ctx, uint32_t action, const char *name, unsigned n,
                   const struct scmp_arg_cmp *cmp, gr_sandbox_report_t *rep)
{
    int nr = seccomp_syscall_resolve_name(name);
    if (nr < 0)
        return 0; /* not a syscall on this architecture */
    int rc = seccomp_rule_add_array(ctx, action, nr, n, cmp);
    if (rc != 0) {
        report_off(rep, "seccomp: rule for %s: %s", name, strerror(-rc));
        return -1;
    }
    return 0;
}

static int apply_seccomp(const gr_sandbox_opts_t *o, gr_sandbox_report_t *rep)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (ctx == NULL) {
        report_off(rep, "seccomp: seccomp_init failed");
        return -1;
    }
    const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
    int rc = 0;
    for (size_t i = 0; i < sizeof deny_always / sizeof *deny_always && rc == 0; i++)
        rc = sc_rule(ctx, eperm, deny_always[i], 0, NULL, rep);
    /* Threads only: a clone without CLONE_THREAD is a new process. */
    struct scmp_arg_cmp no_thread = SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0);
    if (rc == 0)
        rc = sc_rule(ctx, eperm, "clone", 1, &no_thread, rep);
    /* clone3 passes its flags in memory, out of a filter's reach: ENOSYS makes glibc fall back to
     * clone, which the rule above checks. */
    if (rc == 0)
        rc = sc_rule(ctx, SCMP_ACT_ERRNO(ENOSYS), "clone3", 0, NULL, rep);
    struct scmp_arg_cmp other_pid = SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)getpid());
    for (size_t i = 0; i < sizeof own_pid_only / sizeof *own_pid_only && rc == 0; i++)
        rc = sc_rule(ctx, eperm, own_pid_only[i], 1, &other_pid, rep);
    /* Sockets: AF_UNIX only, and only when asked for (the executor's own socket is inherited). */
    struct scmp_arg_cmp not_unix = SCMP_A0(SCMP_CMP_NE, AF_UNIX);
    unsigned n_cmp = o->allow_unix_sockets ? 1 : 0;
    if (rc == 0)
        rc = sc_rule(ctx, eperm, "socket", n_cmp, &not_unix, rep);
    if (rc == 0)
        rc = sc_rule(ctx, eperm, "socketpair", n_cmp, &not_unix, rep);
    /* personality: querying (0xffffffff) is fine; changing the execution domain is not. */
    struct scmp_arg_cmp persona = SCMP_A0(SCMP_CMP_NE, 0xffffffffUL);
    if (rc == 0)
        rc = sc_rule(ctx, eperm, "personality", 1, &persona, rep);
    if (rc == 0) {
        int err = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1);
        if (err == 0)
            err = seccomp_load(ctx);
        if (err != 0) {
            report_off(rep, "seccomp: load: %s", strerror(-err));
            rc = -1;
        }
    }
    seccomp_release(ctx);
    if (rc == 0)
        rep->seccomp = 1;
    return rc;
}

/* ---- entry ------------------------------------------------------------------------------ */

int gr_sandbox_enter(const gr_sandbox_opts_t *o, gr_sandbox_report_t *rep)
{
    if (rep == NULL)
        return -1;
    memset(rep, 0, sizeof *rep);
    if (o == NULL) {
        report_off(rep, "sandbox: no options");
        return -1;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        report_off(rep, "no_new_privs: %s", strerror(errno));
        return -1;
    }
    rep->no_new_privs = 1;
    if (!o->landlock)
        report_off(rep, "landlock: not asked for");
    else if (apply_landlock(o, rep) != 0)
        return -1;
    if (!o->seccomp)
        report_off(rep, "seccomp: not asked for");
    else if (apply_seccomp(o, rep) != 0)
        return -1;
    return 0;
}

/* ---- default paths ---------------------------------------------------------------------- */

typedef struct path_list {
    char **v;
    size_t n;
} path_list_t;

static int under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/' || dir[n - 1] == '/');
}

static int list_add(path_list_t *l, const char *path, size_t len)
{
    for (size_t i = 0; i < l->n; i++)
        if (strlen(l->v[i]) == len && strncmp(l->v[i], path, len) == 0)
            return 0;
    char **grown = realloc(l->v, (l->n + 1) * sizeof *grown);
    if (grown == NULL)
        return -1;
    l->v = grown;
    char *copy = strndup(path, len);
    if (copy == NULL)
        return -1;
    l->v[l->n++] = copy;
    return 0;
}

static int list_add_str(path_list_t *l, const char *path)
{
    return list_add(l, path, strlen(path));
}

/* The directory of every mapped shared object that the list does not cover yet; a library in a
 * Python package named torch or nvidia brings in that whole package (libraries dlopen'd later). */
static int add_mapped_dirs(path_list_t *l)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (f == NULL)
        return 0;
    char line[4096];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        char *path = strchr(line, '/');
        if (path == NULL)
            continue;
        path[strcspn(path, "\n")] = '\0';
        if (strstr(path, " (deleted)") != NULL)
            continue;
        const char *base = strrchr(path, '/') + 1;
        if (strstr(base, ".so") == NULL)
            continue;
        int covered = 0;
        for (size_t i = 0; i < l->n && !covered; i++)
            covered = under(path, l->v[i]);
        if (covered)
            continue;
        size_t len = (size_t)(base - path) - 1;
        static const char *const pkgs[] = {"/site-packages/torch/", "/dist-packages/torch/",
                                           "/site-packages/nvidia/", "/dist-packages/nvidia/"};
        for (size_t i = 0; i < sizeof pkgs / sizeof *pkgs; i++) {
            const char *p = strstr(path, pkgs[i]);
            if (p != NULL) {
                len = (size_t)(p - path) + strlen(pkgs[i]) - 1;
                break;
            }
        }
        rc = list_add(l, path, len > 0 ? len : 1);
    }
    fclose(f);
    return rc;
}

/* What an executor of each device family may touch beyond the common lists, one row per family:
 * the family is read from the row, never from a "cuda" string test (adding a family: one row
 * here; docs/ARCHITECTURE.md, "Adding a device family"). Lists end with NULL. */
typedef struct sandbox_family {
    const char *kind;
    const char *const *read;     /* read only */
    const char *const *rw;       /* read and write: files or directories (device nodes beneath) */
    const char *const *rw_globs; /* read and write: the device nodes that match, at call time */
    int mps;                     /* rw: the CUDA MPS pipe directory, when it exists */
    const char *const *tmp;      /* files may be created and removed beneath */
    int unix_sockets;            /* socket(AF_UNIX) (an MPS client connects to its pipe) */
} sandbox_family_t;

static const char *const cuda_read[] = {"/proc/driver/nvidia", "/proc/sys/vm/mmap_min_addr",
                                        "/proc/devices", NULL};
/* CUDA names the threads it starts by writing /proc/self/task/<tid>/comm, and its
 * initialisation fails (cudaErrorOperatingSystem, 304) when that is refused
 * (bench/exec_probe.py with bench/eacces_log.c on the H200). Only this process's own
 * threads: /proc/self resolves to this pid when the rule is made. */
static const char *const cuda_rw[] = {"/proc/self/task", NULL};
static const char *const cuda_nodes[] = {"/dev/nvidia*", NULL};
static const char *const shm[] = {"/dev/shm", NULL};
/* Level Zero (Intel's compute runtime) opens the GPU's DRM render nodes (/dev/dri/renderD*,
 * and card* on some drivers); it reads the device's sysfs, which /sys covers. Never run on an
 * Intel GPU (docs/XPU.md). */
static const char *const xpu_rw[] = {"/dev/dri", NULL};

static const sandbox_family_t sandbox_families[] = {
    {.kind = "cpu"},
    {.kind = "cuda",
     .read = cuda_read,
     .rw = cuda_rw,
     .rw_globs = cuda_nodes,
     .mps = 1,
     .tmp = shm,
     .unix_sockets = 1},
    {.kind = "xpu", .rw = xpu_rw},
};

static const sandbox_family_t *sandbox_family_of(const char *device)
{
    size_t n = strcspn(device, ":");
    for (size_t i = 0; i < sizeof sandbox_families / sizeof *sandbox_families; i++)
        if (strlen(sandbox_families[i].kind) == n &&
            strncmp(sandbox_families[i].kind, device, n) == 0)
            return &sandbox_families[i];
    return NULL;
}

static int list_add_all(path_list_t *l, const char *const *paths)
{
    int rc = 0;
    for (size_t i = 0; paths != NULL && paths[i] != NULL && rc == 0; i++)
        rc = list_add_str(l, paths[i]);
    return rc;
}

int gr_sandbox_default_paths(const char *family, gr_sandbox_opts_t *o)
{
    const sandbox_family_t *fam = family != NULL ? sandbox_family_of(family) : NULL;
    if (o == NULL || fam == NULL) {
        errno = EINVAL;
        return -1;
    }
    path_list_t r = {0}, w = {0}, t = {0};
    static const char *const read_common[] = {
        "/usr",
        "/lib",
        "/lib64",
        "/etc/ld.so.cache",
        "/proc/self",
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/proc/stat",
        "/proc/sys/vm/overcommit_memory",
        "/sys",
        "/dev/urandom",
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof read_common / sizeof *read_common && rc == 0; i++)
        rc = list_add_str(&r, read_common[i]);
    if (rc == 0)
        rc = add_mapped_dirs(&r);
    if (rc == 0)
        rc = list_add_all(&r, fam->read);
    if (rc == 0)
        rc = list_add_str(&w, "/dev/null");
    if (rc == 0)
        rc = list_add_all(&w, fam->rw);
    for (size_t i = 0; fam->rw_globs != NULL && fam->rw_globs[i] != NULL && rc == 0; i++) {
        glob_t g;
        if (glob(fam->rw_globs[i], 0, NULL, &g) == 0) {
            for (size_t k = 0; k < g.gl_pathc && rc == 0; k++)
                rc = list_add_str(&w, g.gl_pathv[k]);
            globfree(&g);
        }
    }
    if (rc == 0 && fam->mps) {
        const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
        if (mps == NULL || *mps == '\0')
            mps = "/tmp/nvidia-mps";
        if (access(mps, F_OK) == 0)
            rc = list_add_str(&w, mps);
    }
    if (rc == 0)
        rc = list_add_all(&t, fam->tmp);
    *o = (gr_sandbox_opts_t){
        .read_paths = (const char *const *)r.v,
        .n_read = r.n,
        .rw_paths = (const char *const *)w.v,
        .n_rw = w.n,
        .tmp_paths = (const char *const *)t.v,
        .n_tmp = t.n,
        .landlock = 1,
        .seccomp = 1,
        .allow_unix_sockets = fam->unix_sockets,
        .owned = 1,
    };
    if (rc != 0) {
        gr_sandbox_paths_free(o);
        errno = ENOMEM;
        return -1;
    }
    return 0;
}

int gr_sandbox_paths_add(gr_sandbox_opts_t *o, int kind, const char *path)
{
    if (o == NULL || !o->owned || path == NULL || *path == '\0') {
        errno = EINVAL;
        return -1;
    }
    const char *const **v;
    size_t *n;
    switch (kind) {
    case 'r':
        v = &o->read_paths, n = &o->n_read;
        break;
    case 'w':
        v = &o->rw_paths, n = &o->n_rw;
        break;
    case 't':
        v = &o->tmp_paths, n = &o->n_tmp;
        break;
    default:
        errno = EINVAL;
        return -1;
    }
    path_list_t l = {(char **)*v, *n};
    if (list_add_str(&l, path) != 0) {
        *v = (const char *const *)l.v;
        errno = ENOMEM;
        return -1;
    }
    *v = (const char *const *)l.v;
    *n = l.n;
    return 0;
}

static void free_list(const char *const **v, size_t *n)
{
    char **l = (char **)*v;
    for (size_t i = 0; i < *n; i++)
        free(l[i]);
    free(l);
    *v = NULL;
    *n = 0;
}

void gr_sandbox_paths_free(gr_sandbox_opts_t *o)
{
    if (o == NULL || !o->owned)
        return;
    free_list(&o->read_paths, &o->n_read);
    free_list(&o->rw_paths, &o->n_rw);
    free_list(&o->tmp_paths, &o->n_tmp);
}
