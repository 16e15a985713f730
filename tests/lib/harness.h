/*
 * Integration-test harness: runs the real build/graphd on a socket in a
 * temporary directory, runs build/graphctl and other programs with their
 * output captured, makes raw gRPC calls (for bytes libgraphd would never
 * send), and reads the daemon's status as JSON.
 *
 * Binaries come from $GRAPHD_BUILD (default: the build directory this test
 * binary lives in, else "build").
 */
#ifndef GRAPHD_TEST_HARNESS_H
#define GRAPHD_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "graphd.h"

#define HARNESS_PATH_MAX 256

typedef struct harness {
    char dir[64];                       /* the temporary directory */
    char sock_path[HARNESS_PATH_MAX];   /* control socket path */
    char address[HARNESS_PATH_MAX + 8]; /* "unix:" + sock_path */
    char log_path[HARNESS_PATH_MAX];    /* the daemon's stderr */
    pid_t pid;                          /* the daemon, 0 when not running */
    char cgroup[HARNESS_PATH_MAX];      /* the daemon's own cgroup v2 directory, or "" */
} harness_t;

/* The build directory (see above); a static string. */
const char *harness_build_dir(void);

/*
 * Starts graphd with --listen unix:<tmp>/graphd.sock --log-level debug
 * --config /dev/null plus extra_args (NULL-terminated, optional), and waits
 * up to 10 s until it answers ListDevices. 0 on success; on failure prints
 * why (and the daemon's log) to stderr, cleans up and returns -1.
 * With $GRAPHD_TEST_CGROUP set (a cgroup v2 directory with +memory in its
 * cgroup.subtree_control and no processes, e.g. made by root on a machine
 * with cgroup v2), the daemon starts alone in a new child cgroup of it, as
 * systemd's Delegate= would start it, so that executors' memory.max (the
 * kernel path of daemon/cgroup.c) can be tested; harness_stop removes it.
 */
int harness_start(harness_t *h, const char *const *extra_args);
/*
 * Sends SIGTERM and waits up to 10 s: returns the exit status (0 for a clean
 * exit), 128+signal when it died of a signal, -1 when it had to be killed.
 * Prints the log when the exit was not clean. Removes the temporary
 * directory. NULL, or a harness that is not running, returns 0.
 */
int harness_stop(harness_t *h);
/* Prints the daemon's log to stderr (for failing tests). */
void harness_dump_log(const harness_t *h);

/* A connected client with an open session named name; NULL (and a message) on failure. */
graphd_client_t *harness_client(const harness_t *h, const char *name);

/* Status as parsed JSON (json_decref it); NULL (and a message) on failure. */
json_t *harness_status(graphd_client_t *c);
/* The entry of Status's array section whose "id" is id (a new reference; NULL when not listed).
 * Fails the running cmocka test when Status fails; so does harness_daemon_counter. */
json_t *harness_status_entry(graphd_client_t *c, const char *section, uint64_t id);
/* A counter of Status's daemon section. */
long long harness_daemon_counter(graphd_client_t *c, const char *key);
/* The element of array whose member key is the string value (or integer, for *_int). */
json_t *harness_find(json_t *array, const char *key, const char *value);
json_t *harness_find_int(json_t *array, const char *key, uint64_t value);
/* Integer member key of obj, or -1 (and a message) when missing. */
long long harness_int(const json_t *obj, const char *key);

/*
 * Runs argv (argv[0] a path) with stdout and stderr captured into the
 * caller's buffers (NUL-terminated, truncated to size), waits at most
 * timeout_ms. Returns the exit status, 128+signal, or -1 when it could not
 * run or timed out (then it is killed).
 */
int harness_run(const char *const *argv, char *out, size_t out_size, char *err, size_t err_size,
                int timeout_ms);

/*
 * One unary gRPC call with raw request bytes to method ("/graphd.v1.Graphd/X").
 * Returns the gRPC status code (or -1 on local failure); details (optional)
 * gets the status message; reply/reply_len (optional) get the reply bytes.
 */
int harness_raw_call(const char *address, const char *method, const void *req, size_t req_len,
                     char *details, size_t details_size, uint8_t *reply, size_t *reply_len);

/* Milliseconds on the monotonic clock. */
int64_t harness_now_ms(void);

/* ---- test models and captured graphs (models.c) ------------------------------------------- */

typedef struct harness_ref {
    char *key;
    size_t n;
    double *v;
} harness_ref_t;

/* The archives and references tests/models/make_models.py writes into dir. */
typedef struct harness_models {
    char dir[64];
    harness_ref_t *refs; /* ref.txt: "<key> <count> <values...>" per line */
    size_t n_refs;
} harness_models_t;

/*
 * Runs tests/models/make_models.py into a fresh temporary directory and loads
 * its ref.txt. The interpreter is $GRAPHD_PYTHON (default /usr/bin/python3,
 * with Debian's python3-torch); the script comes from $GRAPHD_SRC, else the
 * current directory, else the source tree above the build directory. 0, or
 * -1 with a message on stderr.
 */
int harness_models_make(harness_models_t *m);
/* Removes the directory and frees the references. */
void harness_models_remove(harness_models_t *m);

/* The models and a daemon, as integration tests' group fixtures hold them. */
typedef struct harness_fixture {
    harness_t h;
    harness_models_t m;
} harness_fixture_t;
/* harness_models_make, then harness_start with extra_args (NULL: none); on failure nothing is
 * left behind. 0 or -1. */
int harness_fixture_start(harness_fixture_t *f, const char *const *extra_args);
/* harness_stop, then harness_models_remove. 0, or -1 when the daemon did not stop cleanly. */
int harness_fixture_stop(harness_fixture_t *f);
/* harness_fixture_start, then opens the daemon's directory and the models to other uids (a
 * tenant run with setresuid must reach the sockets and read the models); on failure nothing is
 * left behind. 0 or -1. */
int harness_fixture_start_shared(harness_fixture_t *f, const char *const *extra_args);
/* In a process the test started again (execl of /proc/self/exe) to act as another tenant: a
 * fixture that names the parent's daemon address and models directory, nothing to stop. */
void harness_fixture_attach(harness_fixture_t *f, const char *address, const char *models_dir);
/* cmocka group setup and teardown for a suite that runs on one daemon started with no extra
 * arguments: *state gets the harness_t (harness_group_*) or the harness_fixture_t, models
 * included (harness_fixture_group_*). Each binary has one such group. */
int harness_group_setup(void **state);
int harness_group_teardown(void **state);
int harness_fixture_group_setup(void **state);
int harness_fixture_group_teardown(void **state);
/* harness_models_ref of the fixture's models, failing the running cmocka test when missing. */
const double *harness_fixture_ref(const harness_fixture_t *f, const char *key, size_t n);
/* The path of a file in the models directory (a buffer of the calling thread's, overwritten by
 * its next call). */
const char *harness_models_path(const harness_models_t *m, const char *name);
/* The bytes of a file in the models directory (free them); NULL with a message on failure. */
void *harness_models_read(const harness_models_t *m, const char *name, size_t *len);
/* Reference vector key; NULL with a message when missing or when n (if not 0) differs. */
const double *harness_models_ref(const harness_models_t *m, const char *key, size_t n);
/* Registers a model file for c's session (graphd_module_register); 0 with a message on failure. */
uint64_t harness_models_register(graphd_client_t *c, const harness_models_t *m, const char *name);

/* A captured graph with a copy of its tensor list. */
typedef struct harness_graph {
    graphd_client_t *c; /* the client that captured it */
    graphd_graph_t *g;
    graphd_tensor_t *t;
    size_t n;
} harness_graph_t;

/* Registers model and captures it for c with one [rows, cols] float32 input and no warm-up, into
 * out (harness_graph_load). 0, or -1 with a message on stderr. */
int harness_capture_matrix(graphd_client_t *c, const harness_models_t *m, const char *model,
                           int64_t rows, int64_t cols, harness_graph_t *out);
/* Reads the tensors of c's graph g into hg (two-call graphd_graph_tensors). 0, or -1. */
int harness_graph_load(harness_graph_t *hg, graphd_client_t *c, graphd_graph_t *g);
/* Releases the graph (graphd_graph_release) and frees the copy; returns the release's code. */
int harness_graph_release(harness_graph_t *hg);
/* The tensor with role and index, or NULL. */
const graphd_tensor_t *harness_tensor(const harness_graph_t *hg, int role, uint32_t index);
/* How many tensors have role. */
size_t harness_count_role(const harness_graph_t *hg, int role);
/* Elements of t. */
size_t harness_numel(const graphd_tensor_t *t);

#endif
