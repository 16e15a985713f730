/* Executor memory bounds through a delegated cgroup v2 (see cgroup.h). */
#include "cgroup.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

#define EXEC_PREFIX "exec-"

struct gd_cgroup {
    bool on;
    int (*remove_dir)(const char *path);
    char own[2048]; /* the daemon's delegated cgroup, a directory under the root */
    char why[2400];
};

static bool statfs_cgroup2(const char *root)
{
    struct statfs s;
    return statfs(root, &s) == 0 && (unsigned long)s.f_type == CGROUP2_SUPER_MAGIC;
}

/* The whole of a small file, NUL-terminated; its length, or -1 with errno. */
static ssize_t read_text(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t used = 0;
    while (used + 1 < len) {
        ssize_t n = read(fd, buf + used, len - 1 - used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        used += (size_t)n;
    }
    int e = errno;
    close(fd);
    errno = e;
    buf[used] = 0;
    return (ssize_t)used;
}

/* One write of text (a cgroup file takes each write as one command); 0 or -1 with errno.
 * O_CREAT|O_TRUNC: the files exist on cgroupfs, and a stand-in directory gets them made. */
static int write_text(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    int e = errno;
    if (close(fd) != 0 && n == (ssize_t)len)
        return -1;
    errno = e;
    if (n != (ssize_t)len) {
        if (n >= 0)
            errno = EIO;
        return -1;
    }
    return 0;
}

/* Whether a whitespace-separated list holds word. */
static bool has_word(const char *list, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += wl) {
        bool start = p == list || p[-1] == ' ' || p[-1] == '\n' || p[-1] == '\t';
        char end = p[wl];
        if (start && (end == 0 || end == ' ' || end == '\n' || end == '\t'))
            return true;
    }
    return false;
}

__attribute__((format(printf, 2, 3))) static gd_cgroup_t *off(gd_cgroup_t *cg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cg->why, sizeof cg->why, fmt, ap);
    va_end(ap);
    cg->on = false;
    return cg;
}

/* The directory of (uid, device): <own>/exec-<uid>-<device>, ':' and '/' as '-'. */
static void exec_dir(const gd_cgroup_t *cg, uid_t uid, const char *device, char *buf, size_t len)
{
    char dev[64];
    snprintf(dev, sizeof dev, "%s", device);
    for (char *p = dev; *p; p++)
        if (*p == ':' || *p == '/' || *p == '.')
            *p = '-';
    snprintf(buf, len, "%s/" EXEC_PREFIX "%u-%s", cg->own, (unsigned)uid, dev);
}

/* Removes every empty executor cgroup under own (those of a daemon that died, or ours). */
static void remove_exec_dirs(const gd_cgroup_t *cg)
{
    DIR *d = opendir(cg->own);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, EXEC_PREFIX, strlen(EXEC_PREFIX)) != 0)
            continue;
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", cg->own, e->d_name);
        if (cg->remove_dir(path) != 0)
            gd_warn("cannot remove the executor cgroup %s: %s", path, strerror(errno));
    }
    closedir(d);
}

gd_cgroup_t *gd_cgroup_open(const gd_cgroup_opts_t *opts)
{
    gd_cgroup_t *cg = calloc(1, sizeof *cg);
    if (cg == NULL)
        return NULL;
    const char *root = opts && opts->root ? opts->root : "/sys/fs/cgroup";
    const char *self = opts && opts->self_file ? opts->self_file : "/proc/self/cgroup";
    bool (*is2)(const char *) = opts && opts->is_cgroup2 ? opts->is_cgroup2 : statfs_cgroup2;
    int pid = opts && opts->pid ? opts->pid : (int)getpid();
    cg->remove_dir = opts && opts->remove_dir ? opts->remove_dir : rmdir;

    if (!is2(root))
        return off(cg, "no cgroup2 at %s (cgroup v1 or hybrid)", root);
    char text[8192];
    if (read_text(self, text, sizeof text) < 0)
        return off(cg, "cannot read %s: %s", self, strerror(errno));
    const char *line = strncmp(text, "0::", 3) == 0 ? text : strstr(text, "\n0::");
    if (line == NULL)
        return off(cg, "no cgroup v2 entry (0::) in %s", self);
    line += line[0] == '\n' ? 4 : 3;
    char path[1024];
    size_t n = strcspn(line, "\n");
    if (n >= sizeof path)
        return off(cg, "the daemon's cgroup path in %s is too long", self);
    memcpy(path, line, n);
    path[n] = 0;
    if (strcmp(path, "/") == 0 || path[0] != '/')
        return off(cg, "not delegated: the daemon runs in the root cgroup");
    snprintf(cg->own, sizeof cg->own, "%s%s", root, path);

    char file[2400];
    snprintf(file, sizeof file, "%s/cgroup.controllers", cg->own);
    if (read_text(file, text, sizeof text) < 0)
        return off(cg, "cannot read %s: %s", file, strerror(errno));
    if (!has_word(text, "memory"))
        return off(cg,
                   "no memory controller in %s (its parent does not delegate it: systemd "
                   "Delegate=memory or Delegate=yes)",
                   cg->own);
    const char *need[] = {"", "/cgroup.procs", "/cgroup.subtree_control"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        snprintf(file, sizeof file, "%s%s", cg->own, need[i]);
        if (access(file, W_OK) != 0)
            return off(cg,
                       "not delegated: %s is not writable by the daemon (%s; systemd "
                       "Delegate=yes)",
                       file, strerror(errno));
    }
    bool systemd = opts && opts->systemd ? opts->systemd > 0 : getenv("INVOCATION_ID") != NULL;
    char mark[8];
    if (systemd && getxattr(cg->own, "trusted.delegate", mark, sizeof mark) < 0 &&
        getxattr(cg->own, "user.delegate", mark, sizeof mark) < 0)
        return off(cg,
                   "not delegated: systemd runs graphd but %s has no delegation mark (set "
                   "Delegate=memory in the unit; systemd 251 or later)",
                   cg->own);
    /* Controllers for children only in a cgroup without processes: the daemon must be alone in
     * it, so that moving itself out empties it. */
    snprintf(file, sizeof file, "%s/cgroup.procs", cg->own);
    if (read_text(file, text, sizeof text) < 0)
        return off(cg, "cannot read %s: %s", file, strerror(errno));
    for (char *p = text, *end; *p; p = end) {
        long other = strtol(p, &end, 10);
        if (end == p) {
            end = p + 1;
            continue;
        }
        if (other != pid)
            return off(cg,
                       "%s holds processes other than the daemon (pid %ld): run graphd in a "
                       "cgroup of its own (systemd Delegate=yes)",
                       cg->own, other);
    }

    char leaf[2100], pidtext[24];
    snprintf(leaf, sizeof leaf, "%s/daemon", cg->own);
    snprintf(pidtext, sizeof pidtext, "%d\n", pid);
    if (mkdir(leaf, 0755) != 0 && errno != EEXIST)
        return off(cg, "cannot make %s: %s", leaf, strerror(errno));
    snprintf(file, sizeof file, "%s/cgroup.procs", leaf);
    if (write_text(file, pidtext) != 0) {
        int e = errno;
        cg->remove_dir(leaf);
        return off(cg, "cannot move the daemon into %s: %s", leaf, strerror(e));
    }
    snprintf(file, sizeof file, "%s/cgroup.subtree_control", cg->own);
    if (write_text(file, "+memory\n") != 0) {
        int e = errno;
        char back[2400];
        snprintf(back, sizeof back, "%s/cgroup.procs", cg->own);
        if (write_text(back, pidtext) == 0)
            cg->remove_dir(leaf);
        return off(cg, "cannot enable the memory controller in %s: %s", file, strerror(e));
    }
    remove_exec_dirs(cg);
    cg->on = true;
    snprintf(cg->why, sizeof cg->why, "memory.max per executor under %s", cg->own);
    return cg;
}

void gd_cgroup_close(gd_cgroup_t *cg)
{
    if (cg == NULL)
        return;
    if (cg->on)
        remove_exec_dirs(cg);
    free(cg);
}

bool gd_cgroup_on(const gd_cgroup_t *cg)
{
    return cg != NULL && cg->on;
}

const char *gd_cgroup_why(const gd_cgroup_t *cg)
{
    return cg == NULL ? "not used (executor_cgroup = 0)" : cg->why;
}

static void max_text(uint64_t max_bytes, char *buf, size_t len)
{
    if (max_bytes)
        snprintf(buf, len, "%llu\n", (unsigned long long)max_bytes);
    else
        snprintf(buf, len, "max\n");
}

int gd_cgroup_exec_make(gd_cgroup_t *cg, uid_t uid, const char *device, uint64_t max_bytes,
                        uint64_t *ooms)
{
    if (!gd_cgroup_on(cg))
        return -1;
    char dir[2200], file[2400], value[32];
    exec_dir(cg, uid, device, dir, sizeof dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        gd_error("cannot make the executor cgroup %s: %s", dir, strerror(errno));
        return -1;
    }
    max_text(max_bytes, value, sizeof value);
    snprintf(file, sizeof file, "%s/memory.max", dir);
    if (write_text(file, value) != 0) {
        gd_error("cannot set %s to %s: %s", file, value, strerror(errno));
        return -1;
    }
    /* Swap would let an executor hold more than memory.max; the file exists only with swap
     * accounting. */
    snprintf(file, sizeof file, "%s/memory.swap.max", dir);
    if (access(file, F_OK) == 0 && write_text(file, "0\n") != 0)
        gd_warn("cannot set %s to 0: %s", file, strerror(errno));
    if (ooms)
        *ooms = gd_cgroup_exec_ooms(cg, uid, device);
    return 0;
}

int gd_cgroup_exec_enter(gd_cgroup_t *cg, uid_t uid, const char *device, int pid)
{
    if (!gd_cgroup_on(cg))
        return -1;
    char dir[2200], file[2400], text[24];
    exec_dir(cg, uid, device, dir, sizeof dir);
    snprintf(file, sizeof file, "%s/cgroup.procs", dir);
    snprintf(text, sizeof text, "%d\n", pid);
    if (write_text(file, text) != 0) {
        gd_error("cannot move executor pid %d into %s: %s", pid, file, strerror(errno));
        return -1;
    }
    return 0;
}

uint64_t gd_cgroup_exec_ooms(gd_cgroup_t *cg, uid_t uid, const char *device)
{
    if (!gd_cgroup_on(cg))
        return 0;
    char dir[2200], file[2400], text[1024];
    exec_dir(cg, uid, device, dir, sizeof dir);
    snprintf(file, sizeof file, "%s/memory.events", dir);
    if (read_text(file, text, sizeof text) < 0)
        return 0;
    const char *p = strncmp(text, "oom_kill ", 9) == 0 ? text : strstr(text, "\noom_kill ");
    if (p == NULL)
        return 0;
    p += p[0] == '\n' ? 10 : 9;
    return strtoull(p, NULL, 10);
}

void gd_cgroup_exec_remove(gd_cgroup_t *cg, uid_t uid, const char *device)
{
    if (!gd_cgroup_on(cg))
        return;
    char dir[2200];
    exec_dir(cg, uid, device, dir, sizeof dir);
    if (cg->remove_dir(dir) != 0 && errno != ENOENT)
        gd_debug("cannot remove the executor cgroup %s yet: %s", dir, strerror(errno));
}

int gd_cgroup_set_max(gd_cgroup_t *cg, uint64_t max_bytes)
{
    if (!gd_cgroup_on(cg))
        return 0;
    DIR *d = opendir(cg->own);
    if (d == NULL) {
        gd_error("cannot list %s: %s", cg->own, strerror(errno));
        return -1;
    }
    char value[32];
    max_text(max_bytes, value, sizeof value);
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, EXEC_PREFIX, strlen(EXEC_PREFIX)) != 0)
            continue;
        char file[2400];
        snprintf(file, sizeof file, "%s/%s/memory.max", cg->own, e->d_name);
        if (write_text(file, value) != 0) {
            gd_error("cannot set %s to %s: %s", file, value, strerror(errno));
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}
