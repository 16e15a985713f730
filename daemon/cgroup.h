/*
 * Executor memory bounds through cgroup v2 (memory.max per executor), where the daemon has a
 * delegated cgroup (systemd Delegate=yes or Delegate=memory). cgroup v2 lets a cgroup that
 * holds processes have no controlled children, so the daemon first moves itself into a leaf
 * child, <own>/daemon, then enables +memory in <own>/cgroup.subtree_control and makes one child
 * per executor, <own>/exec-<uid>-<device> (':' as '-'). Where any of that is not possible the
 * handle is off, says why, and the RSS watchdog (exec.c) is the only memory bound.
 *
 * The root and the "is it cgroup2" check are injectable so that tests can point the code at a
 * plain directory standing in for /sys/fs/cgroup.
 */
#ifndef GRAPHD_CGROUP_H
#define GRAPHD_CGROUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct gd_cgroup gd_cgroup_t;

typedef struct gd_cgroup_opts {
    const char *root;      /* the cgroup2 mount; NULL: /sys/fs/cgroup */
    const char *self_file; /* the daemon's cgroup membership; NULL: /proc/self/cgroup */
    bool (*is_cgroup2)(const char *root); /* NULL: statfs magic CGROUP2_SUPER_MAGIC */
    int pid;                              /* the daemon's pid; 0: getpid() */
    int (*remove_dir)(const char *path);  /* NULL: rmdir (a stand-in's files stop rmdir) */
    /* Whether systemd runs the daemon (0: INVOCATION_ID is set; 1: yes; -1: no). Under systemd
     * the cgroup must carry its delegation mark (xattr trusted.delegate or user.delegate, set
     * for Delegate= since systemd 251): root may write any cgroup, and one systemd did not
     * hand over is systemd's to manage. */
    int systemd;
} gd_cgroup_opts_t;

/* Finds whether executors can be put under memory.max, and sets the daemon's cgroup up for it
 * (moves the daemon into <own>/daemon, enables +memory for children, removes stale empty
 * executor cgroups). Always returns a handle (NULL only when out of memory); gd_cgroup_on says
 * whether it applies and gd_cgroup_why says why or why not. */
gd_cgroup_t *gd_cgroup_open(const gd_cgroup_opts_t *opts);
/* Removes every (empty) executor cgroup and frees cg. NULL: no-op. */
void gd_cgroup_close(gd_cgroup_t *cg);
/* Whether executors are under memory.max. NULL: false. */
bool gd_cgroup_on(const gd_cgroup_t *cg);
/* On: "memory.max per executor under <own>"; off: the reason ("no cgroup2 at ..."); NULL:
 * "not used (executor_cgroup = 0)". */
const char *gd_cgroup_why(const gd_cgroup_t *cg);

/* Makes (or reuses) the cgroup of executor (uid, device) with memory.max = max_bytes (0:
 * "max") and memory.swap.max = 0 where the kernel has swap accounting. *ooms gets its
 * memory.events oom_kill count so far. 0, or -1 (logged; the executor then runs without it). */
int gd_cgroup_exec_make(gd_cgroup_t *cg, uid_t uid, const char *device, uint64_t max_bytes,
                        uint64_t *ooms);
/* Moves pid into the cgroup of (uid, device). 0, or -1 (logged). */
int gd_cgroup_exec_enter(gd_cgroup_t *cg, uid_t uid, const char *device, int pid);
/* The oom_kill count in memory.events of (uid, device)'s cgroup (0 when unreadable). */
uint64_t gd_cgroup_exec_ooms(gd_cgroup_t *cg, uid_t uid, const char *device);
/* Removes the (empty) cgroup of (uid, device); after its process was reaped. */
void gd_cgroup_exec_remove(gd_cgroup_t *cg, uid_t uid, const char *device);
/* Rewrites memory.max of every executor cgroup (SIGHUP). 0, or -1 (logged) when one failed. */
int gd_cgroup_set_max(gd_cgroup_t *cg, uint64_t max_bytes);

#endif
