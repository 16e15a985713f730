/*
 * Device regions and ordered replays in the client: the CUDA runtime, loaded at run time only
 * when the daemon hands out device memory (a MAP reply carrying a CUDA IPC handle) or the caller
 * asks for stream-ordered replays, so that libgraphd neither links against CUDA nor opens a CUDA
 * context for host regions. In a process that already uses CUDA
 * (PyTorch), dlopen finds the runtime it has loaded, so the handle opens in the same context.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graphd_int.h"

/* cudaIpcMemHandle_t: 64 opaque bytes, passed by value. */
typedef struct {
    char reserved[GRAPHD__IPC_HANDLE_SIZE];
} ipc_handle_t;

static struct {
    pthread_once_t once;
    char error[256];
    int (*set_device)(int);
    int (*get_device)(int *);
    int (*ipc_open)(void **, ipc_handle_t, unsigned int);
    int (*ipc_close)(void *);
    int (*device_synchronize)(void);
    int (*memcpy)(void *, const void *, size_t, int); /* cudaMemcpy */
    const char *(*error_string)(int);
    /* events (NULL when the runtime lacks them: ordered replays are then refused) */
    int (*event_create)(void **, unsigned int);
    int (*event_destroy)(void *);
    int (*event_record)(void *, void *);
    int (*stream_wait_event)(void *, void *, unsigned int);
    int (*ipc_get_event)(ipc_handle_t *, void *);
    int (*ipc_open_event)(void **, ipc_handle_t);
    int (*stream_create)(void **, unsigned int);
    int (*stream_destroy)(void *);
    /* the driver's stream memory operations (NULL when it has none: posted replays are then
     * off), on the runtime's current context: CUstream, CUdeviceptr, value, flags */
    int (*wait_value64)(void *, unsigned long long, unsigned long long, unsigned int);
    int (*write_value64)(void *, unsigned long long, unsigned long long, unsigned int);
    /* cuStreamBatchMemOp (CUstream, count, CUstreamBatchMemOpParams *, flags): a posted
     * replay's three operations in one driver call; NULL: one call each */
    int (*batch_mem_op)(void *, unsigned int, void *, unsigned int);
} rt = {.once = PTHREAD_ONCE_INIT};

/* CUstreamBatchMemOpParams: a 48-byte union; a wait or write of a 64-bit value is its
 * waitValue/writeValue member (the operation, the address, the value, the flags, a word the
 * driver may use). */
typedef union {
    struct {
        unsigned int operation;
        unsigned long long address;
        unsigned long long value64;
        unsigned int flags;
        unsigned long long alias;
    } value;
    unsigned long long pad[6];
} mem_op_t;
_Static_assert(sizeof(mem_op_t) == 48, "CUstreamBatchMemOpParams is 48 bytes");
#define CU_STREAM_MEM_OP_WAIT_VALUE_64 4
#define CU_STREAM_MEM_OP_WRITE_VALUE_64 5

/* GRAPHD_REPLAY_PROFILE=1 (read once, with the runtime): the host time of each part of the
 * posted replay calls, summed over the process and printed to stderr when it exits, so that a
 * profile can say where a replay call's time goes inside a training step (docs/BENCHMARKS.md,
 * "Step profile"). Off, it costs one branch per call. The sums are plain counters: with replays
 * from several threads at once they are approximate. */
static struct {
    int on;
    unsigned long long calls, drain_ns, frame_ns, ops_ns, whole_ns; /* of the counted calls */
} prof;

static unsigned long long prof_now(void)
{
    if (!prof.on)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

__attribute__((destructor)) static void prof_report(void)
{
    if (!prof.on || prof.calls == 0)
        return;
    double n = (double)prof.calls;
    /* the rest of the call: making the device current, the counters' lookup, the frame's
     * building */
    unsigned long long device_ns = prof.whole_ns - prof.drain_ns - prof.frame_ns - prof.ops_ns;
    fprintf(stderr,
            "graphd: GRAPHD_REPLAY_PROFILE: %llu posted replays, mean host ns per call: drain "
            "%.0f, device and counters %.0f, frame %.0f, stream operations %.0f, whole call "
            "%.0f\n",
            prof.calls, (double)prof.drain_ns / n, (double)device_ns / n, (double)prof.frame_ns / n,
            (double)prof.ops_ns / n, (double)prof.whole_ns / n);
}

#define CUDA_IPC_LAZY_ENABLE_PEER_ACCESS 1u /* cudaIpcMemLazyEnablePeerAccess */
#define CUDA_EVENT_DISABLE_TIMING 0x2u      /* cudaEventDisableTiming */
#define CUDA_EVENT_INTERPROCESS 0x4u        /* cudaEventInterprocess */
#define CUDA_STREAM_NON_BLOCKING 0x1u       /* cudaStreamNonBlocking */
#define CUDA_MEMCPY_HOST_TO_DEVICE 1
#define CUDA_MEMCPY_DEVICE_TO_HOST 2
#define CU_STREAM_WAIT_VALUE_GEQ 0x0u
#define CU_STREAM_WRITE_VALUE_DEFAULT 0x0u /* a memory barrier before the write */

/* name, else its unversioned fallback, from the driver library h. */
static void *driver_sym(void *h, const char *name, const char *fallback)
{
    void *f = dlsym(h, name);
    return f != NULL ? f : dlsym(h, fallback);
}

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == NULL)
        return;
    rt.wait_value64 =
        (int (*)(void *, unsigned long long, unsigned long long, unsigned int))driver_sym(
            h, "cuStreamWaitValue64_v2", "cuStreamWaitValue64");
    rt.write_value64 =
        (int (*)(void *, unsigned long long, unsigned long long, unsigned int))driver_sym(
            h, "cuStreamWriteValue64_v2", "cuStreamWriteValue64");
    rt.batch_mem_op = (int (*)(void *, unsigned int, void *, unsigned int))driver_sym(
        h, "cuStreamBatchMemOp_v2", "cuStreamBatchMemOp");
    if (rt.wait_value64 == NULL || rt.write_value64 == NULL || rt.stream_create == NULL ||
        rt.stream_destroy == NULL)
        rt.wait_value64 = rt.write_value64 = NULL;
}

static void load_runtime(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && h == NULL; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        const char *why = dlerror();
        snprintf(rt.error, sizeof(rt.error),
                 "cannot load the CUDA runtime (libcudart.so.13, .12 or .so): %s",
                 why ? why : "not found");
        return;
    }
    rt.set_device = (int (*)(int))dlsym(h, "cudaSetDevice");
    rt.get_device = (int (*)(int *))dlsym(h, "cudaGetDevice");
    rt.ipc_open = (int (*)(void **, ipc_handle_t, unsigned int))dlsym(h, "cudaIpcOpenMemHandle");
    rt.ipc_close = (int (*)(void *))dlsym(h, "cudaIpcCloseMemHandle");
    rt.device_synchronize = (int (*)(void))dlsym(h, "cudaDeviceSynchronize");
    rt.memcpy = (int (*)(void *, const void *, size_t, int))dlsym(h, "cudaMemcpy");
    rt.error_string = (const char *(*)(int))dlsym(h, "cudaGetErrorString");
    rt.event_create = (int (*)(void **, unsigned int))dlsym(h, "cudaEventCreateWithFlags");
    rt.event_destroy = (int (*)(void *))dlsym(h, "cudaEventDestroy");
    rt.event_record = (int (*)(void *, void *))dlsym(h, "cudaEventRecord");
    rt.stream_wait_event = (int (*)(void *, void *, unsigned int))dlsym(h, "cudaStreamWaitEvent");
    rt.ipc_get_event = (int (*)(ipc_handle_t *, void *))dlsym(h, "cudaIpcGetEventHandle");
    rt.ipc_open_event = (int (*)(void **, ipc_handle_t))dlsym(h, "cudaIpcOpenEventHandle");
    rt.stream_create = (int (*)(void **, unsigned int))dlsym(h, "cudaStreamCreateWithFlags");
    rt.stream_destroy = (int (*)(void *))dlsym(h, "cudaStreamDestroy");
    load_driver();
    unsigned long on = 0;
    char err[GRAPHD__ERRMSG_MAX];
    if (graphd__setting_uint("GRAPHD_REPLAY_PROFILE", &on, err, sizeof(err)) != GRAPHD_OK)
        fprintf(stderr, "graphd: %s; the replay profile stays off\n", err);
    prof.on = on != 0;
    if (!rt.event_create || !rt.event_destroy || !rt.event_record || !rt.stream_wait_event ||
        !rt.ipc_get_event || !rt.ipc_open_event)
        rt.event_create = NULL;
    if (!rt.set_device || !rt.get_device || !rt.ipc_open || !rt.ipc_close ||
        !rt.device_synchronize) {
        snprintf(rt.error, sizeof(rt.error), "the CUDA runtime lacks cudaIpcOpenMemHandle & co.");
        rt.ipc_open = NULL;
    }
}

static const char *cuda_str(int err)
{
    return rt.error_string ? rt.error_string(err) : "CUDA error";
}

/* Makes device current for its scope (restored by device_restore); the previous one, or -1. */
static int device_enter(int device, int *err)
{
    int prev = -1;
    if (rt.get_device(&prev) != 0)
        prev = -1;
    *err = prev == device ? 0 : rt.set_device(device);
    return prev;
}

static void device_restore(int prev, int device)
{
    if (prev >= 0 && prev != device)
        (void)rt.set_device(prev);
}

/* cudaIpcOpenMemHandle of a 64-byte handle on device (< 0: the current one); restores the
 * caller's current device. GRAPHD_EFAILED_PRECONDITION without a CUDA runtime or on failure. */
static int cuda_open_handle(graphd_client_t *c, int device, const uint8_t *handle, void **ptr)
{
    pthread_once(&rt.once, load_runtime);
    if (rt.ipc_open == NULL)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "device region: %s", rt.error);
    ipc_handle_t h;
    memcpy(h.reserved, handle, sizeof(h.reserved));
    if (device < 0 && rt.get_device(&device) != 0)
        device = 0;
    int err;
    int prev = device_enter(device, &err);
    if (err != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "cudaSetDevice(%d): %s", device,
                            cuda_str(err));
    void *p = NULL;
    err = rt.ipc_open(&p, h, CUDA_IPC_LAZY_ENABLE_PEER_ACCESS);
    device_restore(prev, device);
    if (err != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                            "cudaIpcOpenMemHandle on cuda:%d: %s (is this process on the daemon's "
                            "machine, with that GPU visible?)",
                            device, cuda_str(err));
    *ptr = p;
    return GRAPHD_OK;
}

/* Waits for the device, then cudaIpcCloseMemHandle. */
static void cuda_close(int device, void *ptr)
{
    if (ptr == NULL || rt.ipc_close == NULL)
        return;
    int err;
    int prev = device_enter(device, &err);
    /* Work the caller queued on the memory (an optimizer step) must finish before it goes. */
    (void)rt.device_synchronize();
    (void)rt.ipc_close(ptr);
    device_restore(prev, device);
}

/* ---- ordered replays -------------------------------------------------------------------- */

/* The session's events for device: on first use, creates ours, sends its handle in an EVENTS
 * frame and opens the daemon's from the reply. The caller has made device current. */
static int events_for(graphd_client_t *c, int device, struct graphd__events **out)
{
    for (size_t i = 0; i < c->nevents; i++)
        if (c->events[i].device == device) {
            *out = &c->events[i];
            return GRAPHD_OK;
        }
    if (c->nevents == GRAPHD__MAX_EVENT_DEVICES)
        return graphd__fail(c, GRAPHD_ERESOURCE_EXHAUSTED,
                            "ordered replays on more than %d devices", GRAPHD__MAX_EVENT_DEVICES);
    void *ready = NULL, *done = NULL;
    int rc;
    ipc_handle_t ours, theirs;
    int err = rt.event_create(&ready, CUDA_EVENT_DISABLE_TIMING | CUDA_EVENT_INTERPROCESS);
    if (err == 0)
        err = rt.ipc_get_event(&ours, ready);
    if (err != 0) {
        rc = graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "interprocess event on cuda:%d: %s",
                          device, cuda_str(err));
        goto fail;
    }
    size_t len = sizeof(theirs.reserved);
    rc = graphd__dp_exchange(c, GRAPHD_FRAME_EVENTS, GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, device),
                             0, ours.reserved, sizeof(ours.reserved), NULL, NULL, theirs.reserved,
                             &len);
    if (rc != GRAPHD_OK)
        goto fail;
    if (len != sizeof(theirs.reserved)) {
        rc = graphd__fail(c, GRAPHD_EPROTO, "EVENTS reply with %zu bytes of handle, not %zu", len,
                          sizeof(theirs.reserved));
        goto fail;
    }
    err = rt.ipc_open_event(&done, theirs);
    if (err != 0) {
        rc = graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                          "cudaIpcOpenEventHandle on cuda:%d: %s (is this process on the daemon's "
                          "machine, with that GPU visible?)",
                          device, cuda_str(err));
        goto fail;
    }
    c->events[c->nevents] = (struct graphd__events){.device = device, .ready = ready, .done = done};
    *out = &c->events[c->nevents++];
    return GRAPHD_OK;
fail:
    /* The daemon may hold events of this session for the device now; a retry is refused with
     * ALREADY_EXISTS, which says as much. */
    if (ready != NULL)
        (void)rt.event_destroy(ready);
    return rc;
}

/* ---- posted replays ---------------------------------------------------------------------- */

/* The session's sequence counters for device: on first use a SEQ frame, and the reply's handle
 * mapped. GRAPHD_EUNIMPLEMENTED when the daemon cannot make them (its driver has no stream memory
 * operations): the caller falls back to events. The caller has made device current. */
static int seqs_for(graphd_client_t *c, int device, struct graphd__seqs **out)
{
    for (size_t i = 0; i < c->nseqs; i++)
        if (c->seqs[i].device == device) {
            *out = &c->seqs[i];
            return GRAPHD_OK;
        }
    if (c->nseqs == GRAPHD__MAX_EVENT_DEVICES)
        return graphd__fail(c, GRAPHD_ERESOURCE_EXHAUSTED, "posted replays on more than %d devices",
                            GRAPHD__MAX_EVENT_DEVICES);
    uint8_t handle[GRAPHD__IPC_HANDLE_SIZE];
    size_t len = sizeof(handle);
    int rc =
        graphd__dp_exchange(c, GRAPHD_FRAME_SEQ, GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, device), 0,
                            NULL, 0, NULL, NULL, handle, &len);
    if (rc != GRAPHD_OK)
        return rc;
    if (len != sizeof(handle))
        return graphd__fail(c, GRAPHD_EPROTO, "SEQ reply with %zu bytes of handle, not %zu", len,
                            sizeof(handle));
    void *mem = NULL;
    rc = cuda_open_handle(c, device, handle, &mem);
    if (rc != GRAPHD_OK)
        return rc;
    c->seqs[c->nseqs] = (struct graphd__seqs){.device = device, .mem = mem, .last = 0};
    *out = &c->seqs[c->nseqs++];
    return GRAPHD_OK;
}

/* Queues ops (waits and writes of 64-bit values) on stream: one cuStreamBatchMemOp where the
 * driver has it, else one call each. 0 or the first CUresult. */
static int stream_mem_ops(void *stream, mem_op_t *ops, unsigned int n)
{
    if (rt.batch_mem_op != NULL)
        return rt.batch_mem_op(stream, n, ops, 0);
    for (unsigned int i = 0; i < n; i++) {
        const mem_op_t *op = &ops[i];
        int err =
            op->value.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64
                ? rt.wait_value64(stream, op->value.address, op->value.value64, op->value.flags)
                : rt.write_value64(stream, op->value.address, op->value.value64, op->value.flags);
        if (err != 0)
            return err;
    }
    return 0;
}

static mem_op_t mem_op(unsigned int operation, unsigned long long address, unsigned long long value,
                       unsigned int flags)
{
    return (mem_op_t){
        .value = {.operation = operation, .address = address, .value64 = value, .flags = flags}};
}

/* A posted REPLAY: the frame (or its slot in the connection's replay ring,
 * graphd__dp_replay_post), then on stream a wait for ready >= n - 1, ready = n and a wait
 * for done >= n, in one driver call; no answer is read (a failure comes back later,
 * graphd__dp_drain). Inside a training step a posted replay call has cost several times what
 * it costs alone (docs/BENCHMARKS.md, "Step profile"): one driver call instead of three is one
 * part of that cost fewer (GRAPHD_REPLAY_PROFILE times the parts).
 *
 * The frame goes first: were the stream operations queued first and the frame then lost, this
 * stream would wait for a done that never comes, while the daemon, had it taken the frame,
 * only waits on the device for a ready >= n, as it does for any client that is slow to write
 * it, and ends that wait when the session ends. */
static int replay_posted(graphd_client_t *c, struct graphd__seqs *q, void *stream,
                         graphd_graph_t *g, int phase)
{
    uint64_t n = q->last + 1;
    if (n > GRAPHD_REPLAY_SEQ_MAX)
        return graphd__fail(c, GRAPHD_ERESOURCE_EXHAUSTED,
                            "the session has posted 2^40 replays on cuda:%d: open a new one",
                            q->device);
    uint64_t arg =
        ((uint64_t)(int64_t)phase & GRAPHD_REPLAY_PHASE_MASK) | GRAPHD_REPLAY_POSTED |
        (GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, q->device) << GRAPHD_REPLAY_DEVICE_SHIFT) |
        (n << GRAPHD_REPLAY_SEQ_SHIFT);
    unsigned long long t0 = prof_now();
    int rc = graphd__dp_replay_post(c, g, arg);
    if (rc != GRAPHD_OK)
        return rc;
    q->last = n;
    unsigned long long t1 = prof_now();
    unsigned long long mem = (unsigned long long)(uintptr_t)q->mem;
    /* ready only grows: were the last replay posted from another stream, that stream's write of
     * n - 1 comes first, else this write could let the daemon start replay n - 1 early. */
    mem_op_t ops[] = {
        mem_op(CU_STREAM_MEM_OP_WAIT_VALUE_64, mem + GRAPHD_SEQ_READY_OFFSET, n - 1,
               CU_STREAM_WAIT_VALUE_GEQ),
        mem_op(CU_STREAM_MEM_OP_WRITE_VALUE_64, mem + GRAPHD_SEQ_READY_OFFSET, n,
               CU_STREAM_WRITE_VALUE_DEFAULT),
        mem_op(CU_STREAM_MEM_OP_WAIT_VALUE_64, mem + GRAPHD_SEQ_DONE_OFFSET, n,
               CU_STREAM_WAIT_VALUE_GEQ),
    };
    int err = stream_mem_ops(stream, ops, sizeof(ops) / sizeof(ops[0]));
    if (prof.on && err == 0) {
        prof.frame_ns += t1 - t0;
        prof.ops_ns += prof_now() - t1;
    }
    if (err != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                            "queuing the posted replay's counter operations on cuda:%d: "
                            "CUresult %d; the replay sent to the daemon waits for its ready "
                            "counter until a later replay writes it or the session ends",
                            q->device, err);
    return GRAPHD_OK;
}

/* Ends every wait of this process's streams on the session's counters (the session ended: its
 * daemon may never write done again), then unmaps them. */
static void seqs_release(graphd_client_t *c)
{
    for (size_t i = 0; i < c->nseqs; i++) {
        struct graphd__seqs *q = &c->seqs[i];
        int err;
        int prev = device_enter(q->device, &err);
        void *stream = NULL;
        if (err == 0 && rt.stream_create(&stream, CUDA_STREAM_NON_BLOCKING) == 0) {
            unsigned long long mem = (unsigned long long)(uintptr_t)q->mem;
            (void)rt.write_value64(stream, mem + GRAPHD_SEQ_DONE_OFFSET, GRAPHD_SEQ_RELEASED,
                                   CU_STREAM_WRITE_VALUE_DEFAULT);
            (void)rt.stream_destroy(stream);
        }
        device_restore(prev, q->device);
        cuda_close(q->device, q->mem);
    }
    c->nseqs = 0;
}

/* An ordered REPLAY (GRAPHD_REPLAY_ORDERED) of g on device, in the order of stream (a
 * cudaStream_t): see graphd_replay_stream. */
static int cuda_replay_ordered(graphd_client_t *c, int device, void *stream, graphd_graph_t *g,
                               int phase, uint64_t *launch_ns)
{
    pthread_once(&rt.once, load_runtime);
    unsigned long long t0 = prof_now();
    int rc = graphd__dp_drain(c); /* a posted replay that failed is reported now */
    if (rc != GRAPHD_OK)
        return rc;
    if (c->posted && rt.wait_value64 != NULL) {
        unsigned long long t1 = prof_now();
        int err;
        int prev = device_enter(device, &err);
        if (err != 0)
            return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "cudaSetDevice(%d): %s", device,
                                cuda_str(err));
        struct graphd__seqs *q = NULL;
        rc = seqs_for(c, device, &q);
        if (rc == GRAPHD_OK) {
            rc = replay_posted(c, q, stream, g, phase);
            if (launch_ns != NULL)
                *launch_ns = 0; /* not known: nothing is answered */
        }
        device_restore(prev, device);
        if (prof.on && rc == GRAPHD_OK) {
            unsigned long long t2 = prof_now();
            prof.calls++;
            prof.drain_ns += t1 - t0;
            prof.whole_ns += t2 - t0;
        }
        if (rc != GRAPHD_EUNIMPLEMENTED)
            return rc;
        c->posted = 0; /* the daemon cannot: order by events from now on */
    }
    if (rt.event_create == NULL)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "ordered replay: %s",
                            rt.error[0] ? rt.error : "the CUDA runtime lacks interprocess events");
    int err;
    int prev = device_enter(device, &err);
    if (err != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "cudaSetDevice(%d): %s", device,
                            cuda_str(err));
    struct graphd__events *ev = NULL;
    rc = events_for(c, device, &ev);
    if (rc != GRAPHD_OK)
        goto out;
    /* The work queued on stream so far (the writes into the static tensors) comes first... */
    err = rt.event_record(ev->ready, stream);
    if (err != 0) {
        rc = graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "cudaEventRecord on cuda:%d: %s", device,
                          cuda_str(err));
        goto out;
    }
    rc = graphd__dp_replay(
        c, g, ((uint64_t)(int64_t)phase & GRAPHD_REPLAY_PHASE_MASK) | GRAPHD_REPLAY_ORDERED,
        launch_ns);
    if (rc != GRAPHD_OK)
        goto out;
    /* ...and the work queued after this call waits for the replay. */
    err = rt.stream_wait_event(stream, ev->done, 0);
    if (err != 0)
        rc = graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "cudaStreamWaitEvent on cuda:%d: %s",
                          device, cuda_str(err));
out:
    device_restore(prev, device);
    return rc;
}

/* Destroys the session's ordering events and releases its sequence counters, ending any wait of
 * this process's streams on them (the session ended). */
static void cuda_session_end(graphd_client_t *c)
{
    seqs_release(c);
    for (size_t i = 0; i < c->nevents; i++) {
        /* cudaEventDestroy returns at once; work still waiting on an event is not disturbed. */
        (void)rt.event_destroy(c->events[i].ready);
        (void)rt.event_destroy(c->events[i].done);
    }
    c->nevents = 0;
}

/* ---- the cuda row ------------------------------------------------------------------------ */

static int cuda_open(graphd_client_t *c, int index, const uint8_t *handle, int *fd, uint64_t size,
                     void **ptr)
{
    (void)size;
    if (*fd >= 0)
        close(*fd); /* CUDA IPC needs none; a daemon that sends one is not refused for it */
    *fd = -1;
    return cuda_open_handle(c, index, handle, ptr);
}

static int cuda_copy(graphd_client_t *c, int index, void *dev, void *host, size_t n, int to_device)
{
    pthread_once(&rt.once, load_runtime);
    if (rt.ipc_open == NULL || rt.memcpy == NULL)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "device region copy: %s",
                            rt.error[0] ? rt.error : "the CUDA runtime lacks cudaMemcpy");
    int err;
    int prev = device_enter(index, &err);
    if (err == 0)
        err = to_device ? rt.memcpy(dev, host, n, CUDA_MEMCPY_HOST_TO_DEVICE)
                        : rt.memcpy(host, dev, n, CUDA_MEMCPY_DEVICE_TO_HOST);
    device_restore(prev, index);
    if (err != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "cudaMemcpy %s cuda:%d (%zu bytes): %s",
                            to_device ? "to" : "from", index, n, cuda_str(err));
    return GRAPHD_OK;
}

const graphd__kind_t graphd__kind_cuda = {
    .name = "cuda",
    .family = GRAPHD_DEVICE_CUDA,
    .map_fd = 0,
    .open = cuda_open,
    .close = cuda_close,
    .copy = cuda_copy,
    .replay_ordered = cuda_replay_ordered,
    .session_end = cuda_session_end,
};
