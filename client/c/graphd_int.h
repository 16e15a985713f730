/*
 * libgraphd internals shared by the files of client/c/: the client, region
 * and graph bodies, the unary gRPC call helper (rpc.c), the data-plane frame
 * I/O (dataplane.c) and the protobuf-to-JSON walker (json.c).
 */
#ifndef GRAPHD_INT_H
#define GRAPHD_INT_H

#include <stdarg.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "graphd.h"
#include "graphd_frame.h"

#define GRAPHD__ERRMSG_MAX 1024
#define GRAPHD__SETTING_MAX 4096 /* longest value of a setting, NUL included */
#define GRAPHD__METHOD(name) "/graphd.v1.Graphd/" name
#define GRAPHD__IPC_HANDLE_SIZE 64 /* a MAP reply's payload for a device region */
#define GRAPHD__MAX_EVENT_DEVICES 16
#define GRAPHD__MAX_DIRECT 64 /* replay connections of a session: one per executor it uses */

/*
 * A device kind (kinds.c): how libgraphd maps and touches a device region of one family, and
 * orders replays on it. The row's library is loaded at run time, the first time a region of the
 * kind is mapped, so that host-only clients load no device library. Adding a kind = one file
 * (cuda.c, xpu.c) + one row.
 */
typedef struct graphd__kind {
    const char *name; /* "cuda", "xpu": the device string's prefix */
    unsigned family;  /* GRAPHD_DEVICE_*: the frames' code (GRAPHD_DEVICE_CODE) */
    /* 1: the MAP reply carries the allocation's fd (SCM_RIGHTS) beside the handle (xpu). */
    int map_fd;
    /* Opens a MAP reply's GRAPHD__IPC_HANDLE_SIZE-byte handle (and *fd, -1 for none) of size
     * bytes on device index (< 0: the kind's default) in this process; *ptr the mapping. A row
     * that needs no fd closes it and sets *fd to -1; else the region keeps it until after close. */
    int (*open)(graphd_client_t *c, int index, const uint8_t *handle, int *fd, uint64_t size,
                void **ptr);
    /* Waits for the device's work on ptr, then closes the mapping (NULL: no-op). */
    void (*close)(int index, void *ptr);
    /* Copies n bytes between host memory and the device memory at dev (to_device: host src to
     * dev), synchronously. */
    int (*copy)(graphd_client_t *c, int index, void *dev, void *host, size_t n, int to_device);
    /* An ordered REPLAY of g in the order of stream (graphd_replay_stream); NULL: the kind has no
     * ordering primitives in libgraphd (GRAPHD_EUNIMPLEMENTED). */
    int (*replay_ordered)(graphd_client_t *c, int index, void *stream, graphd_graph_t *g, int phase,
                          uint64_t *launch_ns);
    /* Drops the session's ordering objects (the session ended); NULL: none. */
    void (*session_end)(graphd_client_t *c);
} graphd__kind_t;

/* The kind and index of a device string ("cuda:0", "xpu:1"; a bare "cuda" is index 0); NULL for
 * a host device or an unknown or malformed name. */
const graphd__kind_t *graphd__kind_of(const char *device, int *index);
/* The kind and index of a frame's GRAPHD_DEVICE_CODE; NULL for a host device or no known kind. */
const graphd__kind_t *graphd__kind_of_code(uint64_t code, int *index);
/* Calls every kind's session_end (the session ended). */
void graphd__kinds_session_end(graphd_client_t *c);
extern const graphd__kind_t graphd__kind_cuda; /* cuda.c */
extern const graphd__kind_t graphd__kind_xpu;  /* xpu.c */

struct graphd_region {
    graphd_client_t *client;
    graphd_region_t *prev, *next; /* the client's list of open handles */
    uint64_t id;
    void *ptr;
    uint64_t size;
    uint64_t mapped_size;
    /* NULL: host (ptr is an mmap); else ptr is an IPC mapping on device index `device` of kind */
    const graphd__kind_t *kind;
    int device; /* -1 for a host region */
    int fd;     /* a device region's fd its kind keeps with the mapping (xpu), else -1 */
    /* Graphs holding this mapping: a daemon's graph mempool segment is mapped once per process
     * (CUDA IPC opens a handle once) and shared by the graphs whose tensors lie in it. */
    unsigned shared_refs;
};

struct graphd_graph {
    graphd_client_t *client;
    graphd_graph_t *prev, *next; /* the client's list of open handles */
    uint64_t id;
    graphd_region_t *region; /* the static region, mapped here (also on the client's list) */
    /* Other regions its tensors lie in (parameter gradients left in the daemon's graph mempool),
     * each shared with the client's other graphs that use it (shared_refs). */
    graphd_region_t **extra;
    size_t n_extra;
    int training;
    int has_backward;
    int warmup_reused;
    uint64_t direct_key; /* the replay connection its REPLAY frames go on (0: not asked yet) */
    size_t n_tensors;
    graphd_tensor_t tensors[]; /* data points into region */
};

struct graphd_client {
    /* The caller's reference (until graphd_close) and one per open region or graph handle (the
     * lists below): the body, and with it every mapping, goes with the last. */
    unsigned refs;
    int closed;      /* graphd_close has ended the session and released the channel */
    int grpc_inited; /* grpc_init done, grpc_shutdown owed */
    char *address;
    grpc_channel *channel;
    grpc_completion_queue *cq;
    int timeout_ms;
    int spin_us; /* how long a frame exchange polls for the reply before blocking */

    /* The session, when session_fd >= 0 or session_id != 0. */
    uint64_t session_id;
    uint64_t session_token;
    int session_fd;
    uint64_t seq; /* last data-plane frame sequence number */
    char session_socket[108];
    char daemon_version[64];

    /* Per CUDA device, the events that order graphd_replay_stream (cuda.c), made on first use
     * and exchanged with the daemon in an EVENTS frame; they belong to the session. */
    struct graphd__events {
        int device;
        void *ready; /* ours: recorded on the caller's stream before an ordered REPLAY */
        void *done;  /* the daemon's, opened here: the caller's stream waits on it after */
    } events[GRAPHD__MAX_EVENT_DEVICES];
    size_t nevents;
    /* Per CUDA device, the session's sequence counters for posted replays (cuda.c), mapped from
     * the daemon's SEQ reply on first use. */
    struct graphd__seqs {
        int device;
        void *mem;     /* the counters (GRAPHD_SEQ_*), a CUDA IPC mapping */
        uint64_t last; /* the sequence number of the last posted replay */
    } seqs[GRAPHD__MAX_EVENT_DEVICES];
    size_t nseqs;
    /* Replay connections (DIRECT frames): REPLAY frames straight to the executor that holds the
     * graph, one socket per executor, named by the daemon's key. direct_on: GRAPHD_DIRECT. With
     * ring_on (GRAPHD_REPLAY_RING) posted replays go into a replay ring shared with the executor
     * (RING frame, graphd_ring_t), set up on a connection's first posted replay (ring_tried). */
    struct graphd__direct {
        uint64_t key;
        int fd;
        graphd_ring_t *ring; /* NULL: REPLAY frames */
        uint64_t head;       /* slots this client wrote */
        uint64_t failed;     /* the ring's failed count when the socket was last read */
        int ring_tried;
    } direct[GRAPHD__MAX_DIRECT];
    size_t ndirect;
    int direct_on;
    int ring_on;
    int64_t drained_us; /* when graphd__dp_drain last read the sockets (CLOCK_MONOTONIC) */
    /* 1: graphd_replay_stream posts its replays (GRAPHD_REPLAY_POSTED); 0: it orders them by
     * events and waits for the daemon's answer (GRAPHD_REPLAY_ORDER=events, or a daemon or
     * driver without stream memory operations). */
    int posted;
    /* The first failure of a posted replay, not reported yet (the next replay call returns it). */
    int posted_err;
    char posted_msg[GRAPHD__ERRMSG_MAX];

    graphd_region_t *regions; /* open region handles, newest first */
    graphd_graph_t *graphs;   /* open graph handles, newest first */
    char last_error[GRAPHD__ERRMSG_MAX];
};

/* Sets the calling thread's error (graphd_last_error(NULL)) to the formatted message and returns
 * err: for the calls that have no client (graphd_connect, graphd_setting). */
int graphd__fail_thread(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void graphd__clear_thread_error(void);

/* One more reference on c (a new handle, or a call that may drop the last one). */
void graphd__client_ref(graphd_client_t *c);
/* Drops a reference; the last one frees the body (graphd_close has released the rest). */
void graphd__client_unref(graphd_client_t *c);

/*
 * settings.c: the effective value of the client setting name (its environment variable, else
 * its default), checked and normalized, into buf[size]. On GRAPHD_ENOT_FOUND (a name not in the
 * table), GRAPHD_EINVALID_ARGUMENT (a value the table does not accept) and GRAPHD_ETRUNC, err
 * gets the message.
 */
int graphd__setting(const char *name, char *buf, size_t size, char *err, size_t errlen);
/* The same for an integer setting. */
int graphd__setting_uint(const char *name, unsigned long *out, char *err, size_t errlen);
/* The target for address, normalized as GRAPHD_ADDRESS is (NULL or "": GRAPHD_ADDRESS). */
int graphd__address(const char *address, char *buf, size_t size, char *err, size_t errlen);

/* Sets c's last error to the formatted message and returns err. */
int graphd__fail(graphd_client_t *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Same with ": strerror(errno)" appended (errno read on entry); returns GRAPHD_ESYS. */
int graphd__fail_sys(graphd_client_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * One unary call of method (a GRAPHD__METHOD literal, which must outlive the
 * call) with req; on success *reply is the unpacked answer (free it with
 * protobuf_c_message_free_unpacked). A non-OK status maps to the error enum
 * and its details become the last error.
 */
int graphd__call(graphd_client_t *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply);

/*
 * One data-plane exchange on the session socket: sends a request frame of
 * type with id and arg, waits (up to the client's timeout) for the reply
 * with the same seq, and returns its arg in *arg_out. A file descriptor that
 * comes with an OK reply goes to *fd_out (-1 when none; close it), or is
 * closed when fd_out is NULL. A reply with a non-zero status maps the gRPC
 * code and keeps the message as last error. An ERROR frame, EOF, a
 * malformed reply or a timeout leaves the stream out of step: the session
 * ends (graphd__session_end) and the error says why. It allocates nothing
 * and makes one send and one receive (two for an error reply's message):
 * REPLAY frames are the data plane's hot path.
 */
int graphd__dp_request(graphd_client_t *c, uint16_t type, uint64_t id, uint64_t arg,
                       uint64_t *arg_out /* [out][optional] */, int *fd_out /* [out][optional] */);
/*
 * The general exchange: the request carries send_len bytes of message after the frame (an
 * EVENTS request's event handle); up to *payload_len bytes of an OK reply's payload (the bytes
 * after the frame, e.g. a device region's IPC handle in a MAP reply) go to payload, and
 * *payload_len gets the reply's msg_len (0 when none). send and payload may be NULL (0 bytes).
 */
int graphd__dp_exchange(graphd_client_t *c, uint16_t type, uint64_t id, uint64_t arg,
                        const void *send, size_t send_len, uint64_t *arg_out, int *fd_out,
                        void *payload, size_t *payload_len /* [in,out] */);
/*
 * Applies the client's timeout to the blocking session socket fd (SO_RCVTIMEO,
 * SO_SNDTIMEO), so that a frame exchange is a plain send and receive.
 */
int graphd__dp_set_timeouts(graphd_client_t *c, int fd);
/* Sends a request frame without waiting for a reply (a posted REPLAY, answered only when it
 * fails). A send failure ends the session, as in graphd__dp_exchange. */
int graphd__dp_post(graphd_client_t *c, uint16_t type, uint64_t id, uint64_t arg);
/* Reads, without blocking, the answers to posted replays that have come, and returns the first
 * failure among them and any kept from before (then forgotten) as an error, else GRAPHD_OK. */
int graphd__dp_drain(graphd_client_t *c);
/* A REPLAY frame of g with arg and its answer (its arg to *arg_out), on g's replay connection
 * (made on first use; GRAPHD_DIRECT=0: the session socket). A replay connection that closes under
 * it is closed here, and the daemon asked why (the bound the replay passed, how the executor
 * died), which becomes the error. */
int graphd__dp_replay(graphd_client_t *c, graphd_graph_t *g, uint64_t arg, uint64_t *arg_out);
/* A posted REPLAY of g (no answer unless it fails), on g's replay connection. */
int graphd__dp_replay_post(graphd_client_t *c, graphd_graph_t *g, uint64_t arg);
/* Closes the replay connections and the session socket. */
void graphd__dp_close(graphd_client_t *c);
/* Forgets the session (closing its socket, which ends it in the daemon too). */
void graphd__session_end(graphd_client_t *c);

/*
 * Maps region_id (MAP frame): a host region's memfd with mmap, or a device region's IPC handle
 * through its kind's row on device ("cuda:N", "xpu:N"; NULL: a handle without an fd is CUDA's, on
 * the calling thread's current device; one with an fd needs the device named).
 */
int graphd__region_map(graphd_client_t *c, uint64_t region_id, const char *device,
                       graphd_region_t **out);
/* Closes the IPC mapping of every device region of c (before the daemon frees the memory). */
void graphd__regions_close_device(graphd_client_t *c);

/* Unmaps and frees a graph handle without telling the daemon, dropping its reference on the
 * client. */
void graphd__graph_forget(graphd_graph_t *g);

/* Renders msg as a JSON value by walking its descriptor (see graphd_status_json). */
json_t *graphd__pb_to_json(const ProtobufCMessage *msg);

/* Copies src into a fixed char array, truncating, always NUL-terminated. */
void graphd__strlcpy(char *dst, const char *src, size_t size);

#endif
