/*
 * The executor sandbox: what an executor process (module code of one tenant on one device) enters
 * after libtorch is initialised and before it loads any module. Three layers, in order:
 * no_new_privs, Landlock (file system: nothing outside the listed paths is readable, nothing is
 * writable but the listed device nodes; no TCP; on ABI >= 6 no signals or abstract sockets out of
 * the sandbox) and a seccomp filter (no exec, no fork, no ptrace, no network sockets, no mount,
 * no signals to other processes, no kernel-admin calls). docs/SECURITY.md says what each layer
 * blocks and allows, and what is off when the kernel lacks it.
 *
 * Plain C, Linux only, independent of libtorch (libseccomp and the Landlock syscalls).
 */
#ifndef GRAPHD_SANDBOX_H
#define GRAPHD_SANDBOX_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gr_sandbox_opts {
    /* Read (and execute, mmap) only: files, or directories with everything beneath them. */
    const char *const *read_paths;
    size_t n_read;
    /* Read and write existing files (device nodes such as /dev/nvidia*, /dev/null), ioctl on
     * device nodes (Landlock ABI >= 5 handles it); no create, remove, rename or link. */
    const char *const *rw_paths;
    size_t n_rw;
    /* Directories where regular files may also be created and removed (/dev/shm for CUDA);
     * no directories, device nodes, sockets, fifos or symlinks. */
    const char *const *tmp_paths;
    size_t n_tmp;
    int landlock;           /* 1: apply Landlock if the kernel has it */
    int seccomp;            /* 1: apply the seccomp filter */
    int allow_unix_sockets; /* 1: socket(AF_UNIX) allowed (CUDA MPS clients connect to its pipe) */
    int owned;              /* set by gr_sandbox_default_paths: the lists are heap-allocated */
} gr_sandbox_opts_t;

typedef struct gr_sandbox_report {
    int no_new_privs; /* 1 when set */
    int landlock_abi; /* the ABI applied; 0: not applied */
    int seccomp;      /* 1 when the filter is loaded */
    /* Other threads that existed at entry and were restricted by Landlock too (each one restricts
     * itself from a signal handler; see gr_sandbox_enter). */
    int threads;
    /* Which layers are off and why, "" when none ("landlock: the kernel has no Landlock
     * (ENOSYS)"); on failure, what failed. */
    char off[256];
} gr_sandbox_report_t;

/* Enters the sandbox for the rest of the process's life, on every thread.
 * no_new_privs is always set. seccomp is loaded with TSYNC, so it covers every thread. Landlock
 * restricts only the calling thread (and threads it creates later), so threads that exist
 * already (libtorch's intra-op pool once a parallel op ran, a reader thread) are each made to
 * restrict themselves: gr_sandbox_enter sends them a real-time signal (SIGRTMIN + 7, its action
 * restored afterwards) whose handler applies the same ruleset, waits up to 2 s for all of them,
 * and lists the threads again until none is left unrestricted; a thread that blocks that signal
 * makes the call fail. Call it from one thread while the others are quiet.
 * Returns 0, or -1 with the reason in rep->off when a layer that was asked for and is available
 * failed to apply (the caller must then exit: the process may be half-restricted). A layer the
 * kernel lacks is not an error: it is named in rep->off. rep is required.
 * Drop privileges (uid, gid, groups) before: setuid and friends are refused afterwards. Under ASan
 * end the process with _exit or detect_leaks=0: LeakSanitizer needs ptrace at exit. */
int gr_sandbox_enter(const gr_sandbox_opts_t *o, gr_sandbox_report_t *rep);

/* Fills o with the default path lists for an executor of a device family, named by its kind or
 * by a device of it ("cpu", "cuda:1", "xpu:0"), from the family's row in sandbox.c (landlock and
 * seccomp on, allow_unix_sockets on for cuda only):
 *  read: /usr /lib /lib64 /etc/ld.so.cache, the directory of every shared object already mapped
 *        (/proc/self/maps; for one inside a site-packages "torch" or "nvidia" package, that
 *        package's whole directory, for the libraries libtorch and CUDA dlopen later),
 *        /proc/self (this process's pid directory), /proc/cpuinfo /proc/meminfo /proc/stat
 *        /proc/sys/vm/overcommit_memory, /sys, /dev/urandom;
 *        cuda also /proc/driver/nvidia, /proc/sys/vm/mmap_min_addr, /proc/devices
 *  rw:   /dev/null; cuda also /proc/self/task (CUDA writes its threads' names there), every
 *        /dev/nvidia* node and /dev/nvidia-caps, and the MPS pipe directory
 *        (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps) when it exists; xpu also /dev/dri
 *        (the GPUs' DRM render nodes that Level Zero opens)
 *  tmp:  cuda only: /dev/shm
 * Paths that do not exist are left out here or skipped by gr_sandbox_enter. Returns 0, or -1
 * with errno EINVAL for a family with no row, ENOMEM. Free with gr_sandbox_paths_free. */
int gr_sandbox_default_paths(const char *family, gr_sandbox_opts_t *o);
/* Adds path to the list of kind 'r' (read), 'w' (rw) or 't' (tmp) of lists from
 * gr_sandbox_default_paths (o->owned). 0, or -1 with errno EINVAL or ENOMEM. */
int gr_sandbox_paths_add(gr_sandbox_opts_t *o, int kind, const char *path);
/* Frees lists made by gr_sandbox_default_paths and empties them; no-op for o->owned 0 or NULL. */
void gr_sandbox_paths_free(gr_sandbox_opts_t *o);

#ifdef __cplusplus
}
#endif

#endif
