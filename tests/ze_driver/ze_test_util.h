/*
 * What the Level Zero tests share (test_ze_loader, test_ze_layer, test_client_xpu, test_xpu,
 * test_xpu_client): running a suite once per loader mode, re-executing the test binary as a
 * "role", and passing an export (its bytes and its fd) over a unix socket. Test code only.
 */
#ifndef GRAPHD_ZE_TEST_UTIL_H
#define GRAPHD_ZE_TEST_UTIL_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Runs the test binary self_exe once per loader mode, each in a fresh process (the loader reads
 * its environment once): passing calls through, then with ZE_ENABLE_LOADER_INTERCEPT=1. Before,
 * it clears every GRAPHD_ZE_TEST_* knob and the variables that change what the loader or
 * libgraphd load (layers, ZE_AFFINITY_MASK, GRAPHD_ZE_LOADER, ZES_ENABLE_SYSMAN), points
 * ZE_ENABLE_ALT_DRIVERS at the test driver (../ze_driver/libze_graphd_test.so beside self_exe's
 * directory), copies its absolute path to driver (PATH_MAX bytes; may be NULL) and to ZT_DRIVER
 * in the environment (so that the suite's processes find it), and applies env
 * ("NAME=value" sets, "NAME" unsets; NULL-terminated, may be NULL). Each mode's process has
 * suite_env=1 set: the binary runs its suite when it sees it. name is the binary's, for messages.
 * 0 when both modes passed, 1 when one failed, 2 when there is no driver.
 */
int zt_run_modes(const char *self_exe, const char *name, const char *suite_env,
                 const char *const *env, char *driver);

/* Starts self_exe as "--role role [arg]" (arg may be NULL) with env applied as above; keep_fd
 * (-1: none) stays open in it; stderr_fd (-1: none) becomes its stderr. The child's pid. */
pid_t zt_spawn_role(const char *self_exe, const char *role, const char *arg, const char *const *env,
                    int keep_fd, int stderr_fd);
/* Applies env ("NAME=value" sets, "NAME" unsets; NULL-terminated, may be NULL) to this process. */
void zt_apply_env(const char *const *env);
/* Starts argv[0] with argv, its stdout a pipe read here, and waits up to timeout_ms for what it
 * writes there to contain word (a child that says it is ready). The pid, or -1 (the child
 * killed and reaped) when it did not say it. */
pid_t zt_spawn_until(char *const argv[], const char *word, int timeout_ms);
/* Waits for pid: its exit status, 128 + the signal that ended it, or -1. */
int zt_wait_role(pid_t pid);

/* Sends len bytes of data and fd (SCM_RIGHTS) in one message; 0 or -1. */
int zt_send_fd(int sock, int fd, const void *data, size_t len);
/* Receives such a message: len bytes into data, the fd (CLOEXEC) into *fd; 0 or -1. */
int zt_recv_fd(int sock, int *fd, void *data, size_t len);

#endif
