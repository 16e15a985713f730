/*
 * graph_runtime: the capture/replay engine. It loads TorchScript modules (content-addressed by
 * SHA-256, shared process-wide), captures one callable or an ordered list of callables with the
 * semantics of torch.cuda.make_graphed_callables, and replays their forward and backward over
 * static tensors that live in caller-allocated memory (the daemon's shared regions), so a client
 * reads outputs and grads, and writes inputs, grad-outputs and parameters, in place.
 *
 * Plain C11 over a C++17 libtorch shim: no C++ type or exception crosses this header. Every
 * function that can fail returns 0 or a negative gr_err_t and keeps a message for the calling
 * thread, read back with gr_last_error(). Modules may be loaded and released from any thread; a
 * capture, and each graph, is used by one thread at a time (its device's worker).
 *
 * Capture is two-phase so the caller can place the static tensors: gr_capture_prepare() warms up
 * and works out each callable's static block layout, the caller allocates the blocks, and
 * gr_capture_finish() builds the static tensors over them and captures.
 */
#ifndef GRAPHD_RUNTIME_H
#define GRAPHD_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors: name, value, message, and the gRPC status code the daemon answers them with (the
 * numbers of grpc_status_code; graph_runtime itself does not depend on gRPC). */
#define GR_ERR_MAP(X)                                                                              \
    X(OK, 0, "success", 0)                                                                         \
    X(EINVAL, -1, "invalid argument", 3)                                                           \
    X(ENOTFOUND, -2, "not found", 5)                                                               \
    X(EPRECOND, -3, "failed precondition", 9)                                                      \
    X(EINTERNAL, -4, "internal error", 13)                                                         \
    X(ENOMEM, -5, "out of memory", 8)                                                              \
    X(EUNSUPPORTED, -6, "not supported", 12)                                                       \
    X(EBUSY, -7, "still in use", 9)                                                                \
    X(ETIMEDOUT, -8, "time bound exceeded", 4)                                                     \
    X(ELOST, -9, "executor lost", 10)

typedef enum {
#define GR_ERR_ENUM(name, value, msg, grpc) GR_##name = value,
    GR_ERR_MAP(GR_ERR_ENUM)
#undef GR_ERR_ENUM
} gr_err_t;

/* Static text for an error code ("unknown error" for codes outside the map). */
const char *gr_strerror(int err);
/* "GR_EINVAL" etc.; "GR_UNKNOWN" for codes outside the map. */
const char *gr_err_name(int err);
/* The gRPC status code for an error (the table's last column; INTERNAL outside the map). */
int gr_err_grpc(int err);
/* The message of the last failing gr_ call on this thread ("" if none); successful calls leave it
 * alone. Valid until the next gr_ call on this thread. */
const char *gr_last_error(void);

/* Optional, once per process before any other call: intra_op_threads > 0 sets libtorch's
 * intra-op thread count, 0 leaves the default. GR_EINVAL when negative. */
int gr_runtime_init(int intra_op_threads);
/* Optional, once per process before any pool or capture: splits the CPU into n logical devices,
 * "cpu:0" to "cpu:<n-1>" (default 1), which gr_pool_create and gr_capture_prepare then accept.
 * They all compute on the one libtorch CPU device and share its intra-op threading: a logical
 * device is a separate queue for the caller (one thread each), not a share of the cores. Pools and
 * graphs made before a later call keep working. GR_EINVAL for n outside [1, 64]. */
int gr_cpu_devices(int n);
/* Optional, process-wide: gr_module_load refuses (GR_EINVAL) an archive whose files would unpack
 * to more than bytes in all, as its ZIP directory says, before libtorch inflates anything (a
 * small archive can inflate to gigabytes). 0: no bound. Default 4 GiB. */
int gr_module_max_unpacked(uint64_t bytes);
/* Optional, process-wide: host memory that one capture or replay may hold at once through
 * libtorch's CPU allocator, counting what its allocations still hold until they are freed (the
 * activations a FORWARD saves are freed by its BACKWARD). An allocation past it fails that call
 * with GR_ENOMEM and a message naming max_call_memory_bytes; the process and other calls go on.
 * 0: no bound (the default). Device memory is not counted. */
int gr_call_memory_max(uint64_t bytes);
/* The libtorch version this runtime was built against, e.g. "1.13.0". */
const char *gr_runtime_torch_version(void);

/* Element types. Values are stable (the daemon maps them to the wire); 0 is never valid. */
#define GR_DTYPE_MAP(X)                                                                            \
    X(F32, 1, 4, "float32")                                                                        \
    X(F64, 2, 8, "float64")                                                                        \
    X(F16, 3, 2, "float16")                                                                        \
    X(BF16, 4, 2, "bfloat16")                                                                      \
    X(I64, 5, 8, "int64")                                                                          \
    X(I32, 6, 4, "int32")                                                                          \
    X(I16, 7, 2, "int16")                                                                          \
    X(I8, 8, 1, "int8")                                                                            \
    X(U8, 9, 1, "uint8")                                                                           \
    X(BOOL, 10, 1, "bool")

typedef enum {
    GR_DTYPE_INVALID = 0,
#define GR_DTYPE_ENUM(name, value, size, str) GR_DTYPE_##name = value,
    GR_DTYPE_MAP(GR_DTYPE_ENUM)
#undef GR_DTYPE_ENUM
} gr_dtype_t;

/* Bytes per element; 0 for a value that is not a gr_dtype_t. */
size_t gr_dtype_size(int dtype);
/* "float32" etc. (PyTorch's names); NULL for a value that is not a gr_dtype_t. */
const char *gr_dtype_name(int dtype);
/* The dtype named name ("float32", ...); GR_DTYPE_INVALID when unknown. */
gr_dtype_t gr_dtype_from_name(const char *name);
/* 1 for F32, F64, F16, BF16 (the dtypes that may require grad), else 0. */
int gr_dtype_is_floating(int dtype);

/* Roles of the static tensors of a captured callable. */
#define GR_ROLE_MAP(X)                                                                             \
    X(INPUT, 0, "input")             /* a sample arg: the client writes it before FORWARD */       \
    X(OUTPUT, 1, "output")           /* written by FORWARD */                                      \
    X(GRAD_OUTPUT, 2, "grad_output") /* d loss / d output: the client writes it before BACKWARD */ \
    X(GRAD_INPUT, 3, "grad_input")   /* written by BACKWARD */                                     \
    X(PARAM, 4, "param")             /* the module's parameter: the client may update it */        \
    X(PARAM_GRAD, 5, "param_grad")   /* written by BACKWARD */                                     \
    X(BUFFER, 6, "buffer")           /* a module buffer: FORWARD updates it, the client may too */ \
    /* the random generator state the graph's random ops draw from: the client writes its          \
     * generator's state before FORWARD and reads the advanced state back after it */              \
    X(RNG_STATE, 7, "rng_state")

typedef enum {
#define GR_ROLE_ENUM(name, value, str) GR_ROLE_##name = value,
    GR_ROLE_MAP(GR_ROLE_ENUM)
#undef GR_ROLE_ENUM
        GR_ROLE_COUNT
} gr_role_t;

/* "input" etc.; NULL for a value that is not a gr_role_t. */
const char *gr_role_name(int role);

#define GR_MAX_DIMS 8    /* most dimensions of a static tensor */
#define GR_ALIGN 64      /* alignment of every static tensor and of each static block */
#define GR_DEVICE_MAX 32 /* bytes of a device name, NUL included */
#define GR_SHA256_LEN 32

/* SHA-256 of data (OpenSSL). GR_EINVAL when data is NULL with len > 0, or out is NULL. */
int gr_sha256(const void *data, size_t len, uint8_t out[GR_SHA256_LEN]);

/* ---- devices ---------------------------------------------------------------------------- */

/* One accelerator this runtime can capture on, as its family describes it. */
typedef struct gr_device_info {
    char device[GR_DEVICE_MAX];  /* what gr_pool_create and gr_capture_prepare take ("cuda:0") */
    char name[128];              /* the driver's name ("NVIDIA H200") */
    char compute_capability[16]; /* the family's version of the device ("9.0" for CUDA) */
    uint64_t total_bytes;        /* device memory */
    uint64_t free_bytes;         /* free at the call */
    int mps;                     /* CUDA: contexts go through an MPS server (gr_cuda_mps_pipe) */
} gr_device_info_t;

/* Two-call pattern: with items NULL, *count gets the number of accelerators; else fills up to
 * *count of them and sets *count to the number filled. Walks the families built in, in table
 * order, each listing its devices: CUDA lists its GPUs (and creates a context on each to read
 * its free memory, cudaMemGetInfo); XPU lists none (the daemon discovers XPU devices through
 * Level Zero, ze_layer.h); the CPU devices, "cpu:0" and any gr_cpu_devices adds, always exist
 * and are not listed. Zero devices, and GR_OK, when no family that lists devices is built in,
 * or there is no driver or no device; never aborts. Safe before any other gr_ call. GR_EINVAL
 * for a NULL count. */
int gr_devices(size_t *count, gr_device_info_t *items /* [optional] */);

/* The CUDA family's MPS look-up, which the daemon shows in its status (a CUDA fact, kept here
 * because it needs no CUDA). Whether this process's CUDA contexts go through an NVIDIA MPS
 * server, found as CUDA clients find one: the pipe directory is $CUDA_MPS_PIPE_DIRECTORY (when
 * set and not empty), else /tmp/nvidia-mps, and a control daemon listens there when
 * "<dir>/control" exists. 1 when it does, 0 when not; dir gets the directory (truncated to
 * len - 1 bytes). A heuristic: it says a control daemon is reachable from this process's
 * environment, not a query of a context (a context made before the control daemon started runs
 * without it). Needs no CUDA (the CPU-only build has it) and creates no context. GR_EINVAL when
 * dir is NULL with len > 0. */
int gr_cuda_mps_pipe(char *dir /* [out][optional] */, size_t len);

/* ---- modules ---------------------------------------------------------------------------- */

typedef struct gr_module gr_module_t;

typedef struct gr_module_info {
    uint8_t sha256[GR_SHA256_LEN];
    uint64_t archive_bytes;   /* size of the archive it was loaded from */
    int is_training;          /* module.training as saved */
    uint32_t n_parameters;    /* recursive, as module.parameters() */
    uint32_t n_trainable;     /* those with requires_grad */
    uint32_t n_buffers;       /* recursive, as module.buffers() */
    uint64_t parameter_bytes; /* sum over all parameters */
    uint32_t refcount;        /* loads not yet released */
} gr_module_info_t;

/* Loads a TorchScript archive (torch.jit.save) from memory onto the CPU; the bytes are only read
 * during the call. The same bytes loaded again return the same module with its refcount raised,
 * without parsing. GR_EINVAL (the libtorch error in the message) when the archive does not load. */
int gr_module_load(const void *bytes, size_t len, gr_module_t **out);
/* gr_module_load with a cache of its own per scope (e.g. a tenant's uid): the same bytes loaded
 * under another scope are a separate module (own refcount, own parse), so a load never shares an
 * object, or a refcount that tells it was loaded, across scopes. gr_module_load is scope 0. */
int gr_module_load_keyed(const void *bytes, size_t len, uint64_t scope, gr_module_t **out);
/* Drops one reference; the last one frees the module. Graphs captured from it stay valid (they
 * own a deep copy). GR_EINVAL for NULL. */
int gr_module_release(gr_module_t *m);
int gr_module_sha256(const gr_module_t *m, uint8_t out[GR_SHA256_LEN]);
int gr_module_info(const gr_module_t *m, gr_module_info_t *out);
/* 1 when the module has a method called name, 0 when not, GR_EINVAL for NULL arguments. */
int gr_module_has_method(const gr_module_t *m, const char *name);
/* Number of distinct modules (per scope) loaded and not yet released (for status and leak
 * checks). */
size_t gr_module_loaded_count(void);

/* ---- pools ------------------------------------------------------------------------------ */

/* A graph memory pool on one device (upstream's graph_pool_handle()). The callables of one
 * capture always share a pool; passing the same pool to several captures shares it further. On
 * the CPU device a pool holds no memory: static tensors live in the caller's blocks. */
typedef struct gr_pool gr_pool_t;

/* GR_EINVAL for a malformed device, GR_EUNSUPPORTED for a device family not built in,
 * GR_ENOTFOUND for a device index that does not exist. */
int gr_pool_create(const char *device, gr_pool_t **out);
/* GR_EBUSY, and nothing freed, while a capture or a graph uses the pool. */
int gr_pool_destroy(gr_pool_t *p);
/* The device memory of the pool's graph mempool, as its family counts it: *reserved gets the
 * bytes the mempool holds (free or not), *in_use the bytes of those held by live allocations.
 * Static blocks are not in it: they are the caller's (gr_device_alloc). GR_OK with 0 and 0 for
 * a pool that holds no memory of its own (cpu) or that has not captured yet. CUDA: the caching
 * allocator's segments the mempool owns, walked under the allocator's locks
 * (c10::cuda::CUDACachingAllocator::snapshot): thread-safe, but it may take milliseconds on a
 * busy device, so call it on the device's worker rather than on a thread that must not block;
 * GR_EINTERNAL when the allocator cannot say (another CUDA allocator backend, e.g.
 * cudaMallocAsync). GR_EINVAL for NULL arguments. */
int gr_pool_memory(const gr_pool_t *p, uint64_t *reserved /* [out] */,
                   uint64_t *in_use /* [out] */);

/* ---- capture ---------------------------------------------------------------------------- */

typedef struct gr_capture gr_capture_t;
typedef struct gr_graph gr_graph_t;

/* One sample arg: what make_graphed_callables' sample_args tensor would be. */
typedef struct gr_arg_spec {
    int dtype; /* gr_dtype_t */
    uint32_t ndim;
    int64_t shape[GR_MAX_DIMS];
    int requires_grad; /* floating dtypes only */
    /* [optional] the sample values, contiguous, numel * gr_dtype_size bytes. NULL: random normal
     * for floating dtypes, zeros otherwise (the values only matter to modules with state that
     * warm-up updates, such as BatchNorm running stats). */
    const void *data;
} gr_arg_spec_t;

typedef struct gr_callable_spec {
    gr_module_t *module; /* the capture clones it; the caller keeps its reference */
    const char *method;  /* NULL: "forward" */
    size_t n_args;
    const gr_arg_spec_t *args;
} gr_callable_spec_t;

typedef struct gr_capture_opts {
    int num_warmup_iters;   /* < 0: 3, upstream's default */
    int allow_unused_input; /* 0: an input that no output depends on is an error, as upstream */
    gr_pool_t *pool;        /* [optional] NULL: a pool private to this capture's graphs */
    /* 1: the blocks given to gr_capture_finish are device memory on the capture's device
     * (gr_device_alloc): the static tensors are views of them on the device, with no host copy
     * and no host<->device transfer (device-resident). Only where the family's device memory can
     * be shared with another process: GR_EINVAL on a device without memory of its own (cpu),
     * GR_EUNSUPPORTED on xpu (torch 2.11 has no XPU IPC). 0: the blocks are host memory (a
     * family with device memory stages through them). */
    int resident;
    /* Device-resident captures only (ignored otherwise). 1: every PARAM_GRAD is in the static
     * block, and BACKWARD copies each parameter gradient there from where autograd computed it.
     * 0: each PARAM_GRAD stays where the backward graph computes it, in the pool's graph mempool,
     * and BACKWARD copies nothing: its desc has GR_TENSOR_EXTERNAL, takes no room in the block,
     * and gr_graph_external says where it is. Any graph replayed in the pool may overwrite that
     * memory afterwards (upstream's graphs of one pool do the same to their static gradients):
     * read it before the next replay. */
    int copy_param_grads;
    /* 1: a callable whose warm-up can change nothing but what this process has already set up
     * skips it, where this process has warmed up the same module, method and sample specs before
     * (see gr_capture_prepare). 0: every capture warms up. */
    int reuse_warmup;
} gr_capture_opts_t;

/* Fills o with the defaults (3 warm-up iterations, unused inputs an error, a private pool, host
 * blocks, parameter gradients copied into the block, warm-ups reused). */
void gr_capture_opts_init(gr_capture_opts_t *o);

/* Flags of a gr_tensor_desc_t. */
#define GR_TENSOR_REQUIRES_GRAD 0x1u /* INPUT, OUTPUT, PARAM: requires grad */
/* GRAD_INPUT, PARAM_GRAD: autograd gave no gradient (upstream returns None: an unused input
 * under allow_unused_input). The tensor exists and BACKWARD fills it with zeros. */
#define GR_TENSOR_ABSENT 0x2u
/* PARAM_GRAD of a capture with copy_param_grads 0: not in the static block. Before
 * gr_capture_finish its offset is 0; afterwards it is the offset in the device allocation that
 * gr_graph_external gives for it. */
#define GR_TENSOR_EXTERNAL 0x4u

/* One static tensor of a callable: a contiguous tensor at base + offset of its static block.
 *  - index: position in the callable's list for the role: INPUT, GRAD_INPUT: the sample arg;
 *    OUTPUT, GRAD_OUTPUT: the flattened output; PARAM, PARAM_GRAD: module.parameters();
 *    BUFFER: module.buffers() of the dtypes above (float or not; a buffer of another dtype
 *    stays private to the graph).
 *    GRAD_OUTPUT exists only for outputs that require grad, GRAD_INPUT only for inputs that do,
 *    PARAM_GRAD only for parameters that do.
 *  - name: INPUT/GRAD_INPUT: the arg index ("0"); OUTPUT/GRAD_OUTPUT: the path in the returned
 *    structure, outputs flattened depth-first, dict values in insertion order ("" for a bare
 *    tensor, "1.loss" for element 1's key "loss"); PARAM/PARAM_GRAD: the parameter's name
 *    ("0.weight"); BUFFER: the buffer's name ("1.running_mean"); RNG_STATE: the generator's
 *    device kind ("cpu"). Owned by the capture or graph it came from.
 *  - RNG_STATE: at most one (index 0), last in the block, and only when the method uses random
 *    ops (some node of its inlined graph is nondeterministic: dropout in training mode,
 *    rand_like, bernoulli, ...) on a device family that carries the state for the client. On the
 *    CPU it is uint8[N], N the bytes of torch.get_rng_state() (5056 in torch 1.13 to 2.11): the
 *    default CPU generator's state, in its get_state() format. FORWARD draws the method's random
 *    numbers from it, as eager PyTorch would from a generator in that state, and writes the
 *    generator's advanced state back; BACKWARD neither reads nor writes it. gr_capture_finish
 *    fills it with the daemon's generator state, so a client that never writes it still gets
 *    valid, advancing random numbers. */
typedef struct gr_tensor_desc {
    int role; /* gr_role_t */
    uint32_t index;
    const char *name;
    int dtype; /* gr_dtype_t */
    uint32_t ndim;
    int64_t shape[GR_MAX_DIMS];
    int64_t strides[GR_MAX_DIMS]; /* in elements; always contiguous */
    uint64_t offset;              /* bytes from the block's base, a multiple of GR_ALIGN */
    uint64_t nbytes;
    uint32_t flags; /* GR_TENSOR_* */
} gr_tensor_desc_t;

/* What a capture or graph reports about one callable. */
typedef struct gr_graph_info {
    char device[GR_DEVICE_MAX];     /* "cpu:0" */
    int is_training;                /* module.training at capture */
    int has_backward;               /* some output requires grad: BACKWARD is available */
    uint32_t counts[GR_ROLE_COUNT]; /* static tensors per role */
    uint64_t total_bytes;           /* size of the static block */
    uint64_t forward_replays;       /* successful replays (0 for a capture) */
    uint64_t backward_replays;
    uint64_t failed_replays;
    int forward_pending; /* a FORWARD waits for its BACKWARD */
    int warmup_reused;   /* the capture skipped its warm-up (gr_capture_opts_t.reuse_warmup) */
} gr_graph_info_t;

/* Phase 1. For each callable: deep-copies the module onto device ("cpu:0"), checks that buffers
 * do not require grad, builds sample args, runs num_warmup_iters warm-up iterations (forward,
 * then autograd.grad over the outputs that require grad w.r.t. the inputs and parameters that do)
 * and works out the static block layout. Module errors (shape mismatch, unused input without
 * allow_unused_input, a forward that raises) are GR_EINVAL with libtorch's message; a device
 * family not built in is GR_EUNSUPPORTED; an unknown device index GR_ENOTFOUND.
 * Reused warm-ups (opts->reuse_warmup): a warm-up sets up what the device needs (kernels,
 * library handles and workspaces, autotuned algorithms), learns the outputs and which gradients
 * are absent, and may change state the capture then starts from. A callable skips it, taking
 * what it learned from the last warm-up, when this process has warmed up the same module (the
 * same archive, loaded under the same scope), method, device, sample specs and options before,
 * and its warm-up could change no state nor depend on the sample values: no random ops, no
 * buffers, a straight-line method (no branch or loop, as every traced one) that writes to none of
 * its args, parameters or attributes, and only floating-point args (whose values cannot pick
 * what runs, as indices can). The graph captured is the same either way. */
int gr_capture_prepare(const char *device, size_t n, const gr_callable_spec_t *specs,
                       const gr_capture_opts_t *opts /* [optional] */, gr_capture_t **out);
/* Two-call pattern for callable i: with items NULL, *count gets the number of static tensors;
 * else fills up to *count of them (in block order) and sets *count to the number filled.
 * total_bytes gets the block size. GR_EINVAL for i out of range. */
int gr_capture_layout(const gr_capture_t *c, size_t i, size_t *count,
                      gr_tensor_desc_t *items /* [optional] */,
                      uint64_t *total_bytes /* [out][optional] */);
int gr_capture_info(const gr_capture_t *c, size_t i, gr_graph_info_t *out);
/* Phase 2. bases[i] is callable i's static block: total_bytes, GR_ALIGN-aligned, valid until
 * gr_graph_destroy of graphs[i]; it is zeroed, then the sample args and the current parameter
 * and buffer values (buffers as warm-up left them) are copied in, and any RNG_STATE gets the
 * daemon generator's current state; the module's parameters and buffers are rebound to the PARAM
 * and BUFFER tensors (writes to them change what the next replay computes). Captures forwards in
 * order and backwards in reverse order, leaving the buffers as they were, then fills
 * graphs[0..n-1]. c is consumed whether or not it succeeds. */
int gr_capture_finish(gr_capture_t *c, void *const *bases, gr_graph_t **graphs /* [out] */);
/* Frees a prepared capture that will not be finished. */
int gr_capture_abort(gr_capture_t *c);

/* ---- device memory ---------------------------------------------------------------------- */
/* Device memory and the ordering primitives below are device-neutral entry points: each
 * resolves its device ("cuda:0", say) through the family table and does what that family does,
 * as each function's comment says per family. A device of a kind this build lacks is
 * GR_EUNSUPPORTED ("this graphd was built without a ... libtorch"), an unknown kind or a
 * malformed name GR_EINVAL, an index past the family's devices GR_ENOTFOUND; a family without
 * device memory of its own (cpu), or without the primitive, answers GR_EUNSUPPORTED naming the
 * family. Families: CUDA has all of them; XPU (torch >= 2.11) has none, as XPU memory cannot be
 * shared with another process there. */

/* Bytes of an IPC handle a family gives another process (CUDA: a cudaIpcMemHandle_t or
 * cudaIpcEventHandle_t; Level Zero's ze_ipc_mem_handle_t has the same size). */
#define GR_IPC_HANDLE_SIZE 64

/* Allocates bytes (> 0) of device memory on device, in an allocation of its own (not the
 * caching allocator's, so that it can be exported whole), and exports it: handle gets the IPC
 * handle another process opens. At least 256-byte aligned, contents undefined. For
 * gr_capture_opts_t.resident blocks. CUDA: plain cudaMalloc and cudaIpcGetMemHandle (the other
 * process opens it with cudaIpcOpenMemHandle); the caller's current CUDA device is left as it
 * was. GR_EINVAL for 0 bytes, GR_ENOMEM when the device is full; otherwise the errors above. */
int gr_device_alloc(const char *device, uint64_t bytes, void **ptr /* [out] */,
                    uint8_t handle[GR_IPC_HANDLE_SIZE] /* [out] */);
/* Frees a gr_device_alloc block of device. Graphs captured over it must not be replayed
 * afterwards. NULL ptr: no-op. CUDA: the free is deferred (cudaFree waits for every stream of
 * the process, some of which may wait for another client's counters): events are recorded on the
 * family's streams now, and gr_device_reclaim frees the block once they are done and no stream
 * of the device has work queued. */
int gr_device_free(const char *device, void *ptr);
/* Frees what gr_device_free (and gr_seq_destroy) deferred on device and may be freed now without
 * waiting (CUDA: its events are done and every stream of the device is idle); wait: frees all of
 * it, waiting for their streams' events and then, through cudaFree, for the device (counted as a
 * device-wide wait: for exit and a full device only). *pending (optional) gets the frees still
 * deferred on device. GR_OK (a family without device memory: nothing deferred). For a caller's
 * idle time, never a replay's path. */
int gr_device_reclaim(const char *device, int wait, uint64_t *pending /* [out][optional] */);

/* Host waits for device work the runtime made since the process started, by scope: the
 * engine's rule is that captures, warm-ups, replays, graph destruction and frees wait only for
 * their own streams (stream_waits), never for the whole device (device_waits; a cudaFree with
 * work in flight counts as one). Frees deferred by gr_device_free and gr_seq_destroy, and how
 * many of them are still deferred. For tests and status; counted with relaxed atomics. */
typedef struct gr_sync_stats {
    uint64_t device_waits;
    uint64_t stream_waits;
    uint64_t frees_deferred;
    uint64_t frees_pending;
} gr_sync_stats_t;
int gr_sync_stats(gr_sync_stats_t *out);

/* Where a GR_TENSOR_EXTERNAL static tensor of a graph lives: in a device allocation of the
 * pool's graph mempool (CUDA: a segment of libtorch's caching allocator, cudaMalloc'd), which
 * another process maps whole from handle (CUDA: cudaIpcOpenMemHandle) and finds the tensor at
 * offset. Several tensors, of one graph or of several graphs of one pool, may share an
 * allocation (the same base and handle). The allocation stays while the graph does. */
typedef struct gr_external {
    size_t tensor; /* index in gr_graph_layout's order */
    void *base;    /* the allocation's device pointer */
    uint64_t size; /* its bytes */
    uint64_t offset;
    uint8_t handle[GR_IPC_HANDLE_SIZE]; /* the allocation's IPC handle */
} gr_external_t;

/* Two-call pattern, as gr_graph_layout: the graph's GR_TENSOR_EXTERNAL tensors in layout order
 * (none for a graph that has none). GR_EINVAL for NULL g or count. */
int gr_graph_external(const gr_graph_t *g, size_t *count, gr_external_t *items /* [optional] */);

/* ---- ordering across processes (interprocess events) ------------------------------------ */
/* An event shared between two processes, so that each side's stream can wait for the other's
 * work without a host synchronisation. Each side records only the events it created and waits on
 * the ones it opened. */
typedef struct gr_event gr_event_t;
/* Creates an interprocess event on device; handle gets its IPC handle for the other process.
 * CUDA: cudaEventInterprocess | cudaEventDisableTiming and cudaIpcGetEventHandle; the caller's
 * current CUDA device is left as it was. Errors as the section's. */
int gr_event_create(const char *device, gr_event_t **out,
                    uint8_t handle[GR_IPC_HANDLE_SIZE] /* [out] */);
/* Opens another process's interprocess event on device from its IPC handle. Errors as
 * gr_event_create; GR_EINVAL when the handle does not open (not an event handle, or, CUDA, from
 * this process: CUDA refuses to open a process's own handles). */
int gr_event_open(const char *device, const uint8_t handle[GR_IPC_HANDLE_SIZE], gr_event_t **out);
/* Destroys the event (an opened one is only closed here; its owner's copy lives on). NULL:
 * no-op. */
int gr_event_destroy(gr_event_t *e);

/* ---- ordering across processes (sequence counters) ---------------------------------------- */
/* Two 64-bit counters in device memory (GR_SEQ_BYTES, exported with the family's IPC) that order
 * one client's replays on one device by stream memory operations, with no reply needed: the
 * client's stream writes ready = n after the work a replay must follow and waits for done >= n
 * before the work that must follow it; a replay ordered by them (gr_order_t.seq) makes the
 * graph's stream wait for ready >= n and write done = n. Counters start at 0, n at 1. */
typedef struct gr_seq gr_seq_t;
#define GR_SEQ_BYTES 256
#define GR_SEQ_READY_OFFSET 0
#define GR_SEQ_DONE_OFFSET 128
/* Allocates and zeroes the counters on device, with a stream of their own; handle gets their IPC
 * handle (as gr_device_alloc). CUDA: cuStreamWaitValue64/cuStreamWriteValue64, GR_EUNSUPPORTED
 * where the driver lacks 64-bit stream memory operations. Otherwise errors as the section's. */
int gr_seq_create(const char *device, gr_seq_t **out,
                  uint8_t handle[GR_IPC_HANDLE_SIZE] /* [out] */);
/* For a posted replay n that will not run (refused, or failed before its graph): the counters'
 * stream waits for done >= n - 1 and writes done = n, so that the client's wait ends in order. */
int gr_seq_skip(gr_seq_t *s, uint64_t n);
/* Ends every wait on the counters at once, whoever's: writes GR_SEQ_RELEASED to both from a
 * stream ordered after nothing. For a client that is gone (its stream will never write ready,
 * and a graph's stream would wait for it forever). Callable from any thread. */
#define GR_SEQ_RELEASED (UINT64_C(1) << 62)
int gr_seq_release(gr_seq_t *s);
/* Frees the counters once their stream is idle (CUDA: the memory itself is freed later, as
 * gr_device_free's). NULL: no-op. */
int gr_seq_destroy(gr_seq_t *s);

/* ---- replay ----------------------------------------------------------------------------- */

#define GR_PHASE_FORWARD 0
#define GR_PHASE_BACKWARD 1

/* How a replay is ordered against a client's stream in another process: events (wait and done,
 * seq NULL) or sequence counters (seq and n, wait and done NULL). Both need a device-resident
 * graph, with the objects on the graph's device. */
typedef struct gr_order {
    gr_event_t *wait; /* recorded by the client after it wrote the inputs */
    gr_event_t *done; /* recorded after the graph; the client's stream waits on it */
    gr_seq_t *seq;    /* the session's counters on the graph's device */
    uint64_t n;       /* this replay's sequence number (1, 2, ...) */
} gr_order_t;

/* Replays phase of g.
 *
 * FORWARD computes the method on the INPUT tensors into the OUTPUT tensors (module buffers update
 * in the BUFFER tensors, as in PyTorch; random ops draw from the RNG_STATE tensor, which then
 * holds the advanced state). BACKWARD computes, from the GRAD_OUTPUT tensors, the GRAD_INPUT and
 * PARAM_GRAD tensors of the last FORWARD. GR_EPRECOND for BACKWARD without a FORWARD since the
 * last BACKWARD, or on a graph without backward; GR_EINVAL for a FORWARD whose RNG_STATE is not
 * a valid generator state (nothing runs; the graph stays usable); GR_EINTERNAL with the module's
 * message when it throws (the graph stays usable: the next FORWARD starts afresh, and RNG_STATE
 * is left as the caller wrote it).
 *
 * order NULL: synchronous; the static tensors hold the results when it returns, and elapsed_ns
 * is the time spent in the replay. Otherwise the call returns without waiting for the device
 * (elapsed_ns: the host time of the launch), and g must be device-resident (a host-staged
 * graph's caller reads host memory as soon as the replay returns): GR_EINVAL for a graph that is
 * not, for an order that names neither events nor counters or both, or for objects on another
 * device than the graph's.
 *  - Events: the graph's stream waits for wait, the graph is launched after it, and done is
 *    recorded after the graph.
 *  - Counters: the graph's stream waits for ready >= n and for done >= n - 1 (so that done only
 *    grows, whatever stream the previous replay used), replays, and writes done = n. On any
 *    failure but n == 0, done = n is still written (gr_seq_skip) before the error returns. */
int gr_graph_replay(gr_graph_t *g, int phase, const gr_order_t *order /* [optional] */,
                    uint64_t *elapsed_ns /* [out][optional] */);

/* Frees the graph; its static block is the caller's again. */
int gr_graph_destroy(gr_graph_t *g);
int gr_graph_info(const gr_graph_t *g, gr_graph_info_t *out);
/* The graph's static tensors, as gr_capture_layout gave them at capture. */
int gr_graph_layout(const gr_graph_t *g, size_t *count, gr_tensor_desc_t *items /* [optional] */,
                    uint64_t *total_bytes /* [out][optional] */);

#ifdef __cplusplus
}
#endif

#endif
