/*
 * graph_runtime internals of the C++ shim (C++17 only): how exceptions become error codes at the
 * C ABI, dtype mapping, the module registry's clone hook, the state of one captured callable,
 * and the device-family interface that each family_<kind>.cpp implements.
 *
 * The engine (engine.cpp) owns the make_graphed_callables logic and is the same for every
 * family: argument checks, warm-up, layout, static tensors, the FORWARD/BACKWARD protocol. A
 * family decides only where work runs and whether a graph object records it: the CPU family runs
 * run_forward()/run_backward() eagerly both at capture and at every replay; a CUDA family runs
 * them once inside at::cuda::CUDAGraph capture and replays the graphs.
 */
#ifndef GRAPHD_ENGINE_INT_H
#define GRAPHD_ENGINE_INT_H

#ifndef __cplusplus
#error "engine_int.h is for the C++ shim only"
#endif

#include "runtime_int.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/script.h>

namespace gr
{

/* An error with a gr_err_t code, thrown inside the shim and returned as that code at the ABI. */
struct Error : std::runtime_error {
    int code;
    Error(int code_, const std::string &msg) : std::runtime_error(msg), code(code_)
    {
    }
};

/* libtorch's message for e, on one line: the raised error of a TorchScript traceback, else the
 * first line; at most about 480 bytes. */
std::string message_of(const std::exception &e);
/* GR_ENOMEM when e is an allocation failure, else default_code. */
int code_of(const std::exception &e, int default_code);
/* For the catch (const std::exception &) of an extern "C" function: keeps the message for this
 * thread and returns the code (gr::Error's own, GR_ENOMEM for allocation failures, else
 * default_code). */
int fail_with(const std::exception &e, int default_code);
/* For the catch (...) of an extern "C" function. */
int fail_unknown(const char *fn);

/* While one lives on a thread, host memory that thread allocates through libtorch is charged to
 * the call and refused past gr_call_memory_max (memory_bound.cpp). At the entry points that run a
 * module's code: captures and replays. Nested guards charge the outermost call. */
class CallMemoryBound
{
  public:
    CallMemoryBound();
    ~CallMemoryBound();
    CallMemoryBound(const CallMemoryBound &) = delete;
    CallMemoryBound &operator=(const CallMemoryBound &) = delete;

  private:
    bool active_ = false;
};

/* Runs f; an exception comes out as gr::Error whose message starts with "ctx: ". */
template <typename F> auto in_context(const std::string &ctx, int default_code, F &&f)
{
    try {
        return f();
    } catch (const Error &e) {
        throw Error(e.code, ctx + ": " + e.what());
    } catch (const std::exception &e) {
        throw Error(code_of(e, default_code), ctx + ": " + message_of(e));
    }
}

/* The two-call pattern of the C API: with items NULL, *count gets all.size(); else up to *count of
 * them are copied to items and *count gets how many. */
template <typename T> void copy_out(const std::vector<T> &all, size_t *count, T *items)
{
    if (items == nullptr) {
        *count = all.size();
        return;
    }
    size_t n = std::min(*count, all.size());
    std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), items);
    *count = n;
}

/* gr_dtype_t <-> ScalarType; from_scalar gives GR_DTYPE_INVALID for types graphd does not carry. */
c10::ScalarType to_scalar(int dtype);
int from_scalar(c10::ScalarType t);

/* A deep copy of a loaded module on device: its own parameters (leaves, requires_grad as in the
 * original) and buffers. Serialised per module (module.cpp). */
torch::jit::Module module_clone(gr_module_t *m, c10::Device device);
/* What names a loaded module: the scope it was loaded under and its archive's SHA-256. */
const std::string &module_key(const gr_module_t *m);

/* What a family keeps per callable (a CUDA family: the forward and backward graphs). */
struct FamilyState {
    virtual ~FamilyState() = default;
};

/* What a family keeps per pool (a CUDA family: the graph mempool id). */
struct PoolState {
    virtual ~PoolState() = default;
};

/* The generator state a family's random ops draw from, as the static tensor (GR_ROLE_RNG_STATE)
 * that carries it for the client: its name (the device kind, "cpu"), dtype and shape. */
struct RngStateSpec {
    std::string name;
    c10::ScalarType dtype;
    std::vector<int64_t> shape;
};

struct OutputMeta {
    std::string name; /* path in the returned structure */
    c10::ScalarType dtype;
    std::vector<int64_t> shape;
    bool requires_grad;
};

/* One callable of a capture, then of its graph. */
struct Callable {
    torch::jit::Module module; /* the daemon's own deep copy */
    std::string method_name;
    std::optional<torch::jit::Method> method;
    c10::Device device{c10::kCPU};
    bool is_training = false;
    bool allow_unused = false;
    bool resident = false; /* the static block is device memory (gr_capture_opts_t.resident) */
    /* PARAM_GRAD tensors stay in the graph mempool (gr_capture_opts_t.copy_param_grads 0) */
    bool external_param_grads = false;
    uint8_t *block = nullptr; /* the static block, after finish */

    std::vector<at::Tensor> args; /* sample args; after finish, the INPUT tensors */
    std::vector<std::string> param_names;
    std::vector<at::Tensor> params; /* the module's parameters; after finish backed by PARAM */
    /* The module's buffers, restored after probe and capture: those graphd carries (after finish
     * backed by BUFFER), then the others (other dtypes), which stay private to the daemon. */
    std::vector<std::string> buffer_names; /* of the first n_static_buffers */
    std::vector<at::Tensor> buffers;
    size_t n_static_buffers = 0;
    std::vector<OutputMeta> outputs;
    bool has_backward = false;  /* some output requires grad */
    bool warmup_reused = false; /* prepare skipped the warm-up (gr_capture_opts_t.reuse_warmup) */
    /* The method uses random ops (engine: uses_random_ops); rng is then the family's state spec,
     * when it carries one, and after finish rng_state is its RNG_STATE tensor (a dev_view). */
    bool random = false;
    std::optional<RngStateSpec> rng;
    at::Tensor rng_state;

    /* autograd.grad's inputs: the args, then the parameters, that require grad */
    std::vector<at::Tensor> grad_targets;
    std::vector<bool> grad_absent; /* per grad target: no gradient at probe */

    std::vector<gr_tensor_desc_t> layout;
    std::deque<std::string> names; /* storage for layout[].name */
    uint64_t total_bytes = 0;

    /* Static tensors, after finish. host_views[k] is layout[k] over the caller's block;
     * dev_views[k] is the tensor the method reads or writes for it: the same tensor for a family
     * that runs on the block directly, a device twin for a host-staged family (which copies
     * between the two inside its graphs). The vectors below are dev_views. */
    std::vector<at::Tensor> host_views;
    std::vector<at::Tensor> dev_views;
    std::vector<at::Tensor> out_views;      /* per output */
    std::vector<at::Tensor> grad_out_views; /* per output that requires grad */
    std::vector<at::Tensor> grad_views;     /* GRAD_INPUT then PARAM_GRAD, as grad_targets */

    /* External PARAM_GRADs: their layout index and grad_views index. Until the backward
     * capture gives them memory, their host_views, dev_views and grad_views are undefined;
     * afterwards external[] says where each one is (the family fills it). */
    std::vector<std::pair<size_t, size_t>> external_slots;
    std::vector<gr_external_t> external;

    std::vector<at::Tensor> live; /* outputs of the last forward that require grad */
    std::unique_ptr<FamilyState> family_state;
};

/* The engine's eager steps. run_forward: the method on the INPUT tensors, results copied into
 * the OUTPUT tensors, the outputs that require grad kept for run_backward. run_backward:
 * autograd.grad of the kept outputs with the GRAD_OUTPUT tensors, into GRAD_INPUT and PARAM_GRAD
 * (zeros where autograd gives none); the kept outputs are dropped. */
void run_forward(Callable &c);
/* At the backward capture of external PARAM_GRADs, run_backward gives each its memory: the
 * gradient autograd computed, where that is a dense tensor of its own in the graph mempool (not
 * in the static block, not overlapping another), else a copy of it (zeros where autograd gives
 * none) made inside the capture. */
void run_backward(Callable &c);

/* How a replay is ordered against another process's stream, returning without waiting for the
 * device (gr_order_t, resolved by the engine). By events: the family's stream waits for wait
 * before the graph and records done after it (the family's own event objects, e.g. a
 * cudaEvent_t). By sequence counters (wait and done NULL): it waits for ready >= n and
 * done >= n - 1 before the graph and writes done = n after it. */
struct Order {
    void *wait = nullptr;
    void *done = nullptr;
    gr_seq *seq = nullptr; /* the replay updates its chained_* */
    uint64_t n = 0;
};

class Family;

} // namespace gr

/* An interprocess event (gr_event_create/open): event is the family's object (a CUDA family: the
 * cudaEvent_t), held as a pointer so that the engine needs no device headers. */
struct gr_event {
    const gr::Family *family;
    int device; /* the index within the family */
    void *event;
    int opened; /* opened from another process's handle, not created here */
};

/* Sequence counters (gr_seq_create): mem is their device memory, stream the family's stream of
 * their own (a CUDA family: a non-blocking cudaStream_t). */
struct gr_seq {
    const gr::Family *family;
    int device; /* the index within the family */
    void *mem;
    void *stream;
    /* The last posted replay whose "done = n" was queued on a replay stream (chained_n), and
     * that stream's serial (a family's own numbering; 0: none): the next replay on the same
     * stream is ordered after it already, and need not wait for done >= n - 1 on the device.
     * Read and written by the replaying thread only. */
    uint64_t chained_serial, chained_n;
};

namespace gr
{

/* A device family: one row of the table in engine.cpp (family_table), one file
 * family_<kind>.cpp. The engine calls capture_forward for every callable in order, then
 * capture_backward in reverse order for those with a backward; afterwards replay_* must compute
 * what run_forward/run_backward would on the static tensors. All calls for one device come from
 * one thread at a time.
 *
 * Besides capture and replay, a family owns what is device-specific in the rest of the API:
 * discovery (devices), pool memory figures (pool_memory), exportable device memory
 * (alloc/free), the ordering primitives (event_*, seq_*) and the sharing check
 * (check_sharing). The members that return int answer GR_OK or an error code with the message
 * set (gr__set_error); the defaults (engine.cpp) are for a family without device memory of its
 * own and answer GR_EUNSUPPORTED with a message naming the family. index is the device's index
 * within the family and device its canonical name ("cuda:1"), both checked by the caller. */
class Family
{
  public:
    virtual ~Family() = default;
    virtual const char *kind() const = 0; /* "cpu" */
    virtual int device_count() const = 0;
    virtual c10::Device device(int index) const = 0;
    virtual std::unique_ptr<PoolState> make_pool(int index) const = 0;

    /* gr_devices: the family's devices (none, and no error, without a driver or a device).
     * Default: none (the CPU devices always exist and are not listed). */
    virtual std::vector<gr_device_info_t> devices() const;
    /* gr_pool_memory of one of this family's pools (state: make_pool's, may be nullptr).
     * Default: 0 and 0, a pool that holds no memory of its own. */
    virtual void pool_memory(const PoolState *state, uint64_t *reserved, uint64_t *in_use) const;
    /* The sharing check, before a device-resident capture on device: returns when the family's
     * device memory and tensors can be shared with another process, else throws gr::Error
     * saying why (default: GR_EINVAL, the family has no device memory of its own). */
    virtual void check_sharing(const std::string &device) const;

    /* gr_device_alloc / gr_device_free: bytes (> 0) of device memory that starts its own
     * allocation, and its IPC handle (GR_IPC_HANDLE_SIZE bytes) for another process. */
    virtual int alloc(int index, const char *device, uint64_t bytes, void **ptr,
                      uint8_t *handle) const;
    virtual int free(int index, const char *device, void *ptr) const;
    /* gr_device_reclaim: frees what free deferred on device index and may be freed now (wait:
     * all of it); returns how many are still deferred. Default: none deferred, 0. */
    virtual uint64_t reclaim(int index, bool wait) const;
    /* gr_event_*: an interprocess event; *out gets a gr_event_t whose family is this one. */
    virtual int event_create(int index, const char *device, gr_event_t **out,
                             uint8_t *handle) const;
    virtual int event_open(int index, const char *device, const uint8_t *handle,
                           gr_event_t **out) const;
    /* Frees the family's object and e itself. */
    virtual void event_destroy(gr_event_t *e) const;
    /* gr_seq_*: sequence counters; *out gets a gr_seq_t whose family is this one. */
    virtual int seq_create(int index, const char *device, gr_seq_t **out, uint8_t *handle) const;
    virtual int seq_skip(gr_seq_t *s, uint64_t n) const;
    virtual int seq_release(gr_seq_t *s) const;
    /* Frees the counters and s itself. */
    virtual void seq_destroy(gr_seq_t *s) const;

    /* true: the caller's blocks are host memory and the method runs on device twins of the
     * static tensors (host-staged), unless the capture is resident (the blocks are then device
     * memory and the method runs on views of them); false: the method runs on views of the
     * blocks, and resident captures are refused (check_sharing). */
    virtual bool staged() const
    {
        return false;
    }
    /* Called once per callable after the engine has built its static tensors over base (bytes
     * long), before any capture: a host-staged family pins the block here. */
    virtual void bind(Callable & /*c*/, void * /*base*/, uint64_t /*bytes*/) const
    {
    }
    /* Runs the warm-up iterations (a CUDA family: on a side stream, synchronised around). random:
     * some callable's method uses random ops. */
    virtual void warmup(int index, bool random, const std::function<void()> &body) const = 0;
    /* The RNG_STATE tensor a callable whose method uses random ops gets: where its random ops
     * draw from at FORWARD (replay_forward swaps it in and writes the advanced state back; bind
     * fills it with a valid state). nullopt: the family carries no state for the client, the
     * ops draw from the daemon's own generator, and callables get no RNG_STATE. */
    virtual std::optional<RngStateSpec> rng_state() const
    {
        return std::nullopt;
    }
    virtual void capture_forward(Callable &c, PoolState *pool) const = 0;
    virtual void capture_backward(Callable &c, PoolState *pool) const = 0;
    /* order: nullptr for a synchronous replay (the static tensors hold the results when it
     * returns); else only for resident captures of a family that keeps device memory. */
    virtual void replay_forward(Callable &c, const Order *order) const = 0;
    virtual void replay_backward(Callable &c, const Order *order) const = 0;
};

/* Synchronisation accounting (sync.cpp, gr_sync_stats). Every host wait for device work in
 * graph_runtime is counted here by its scope before it waits: SyncScope::stream for one stream
 * or event of the runtime's own, SyncScope::device for anything that waits for every stream of
 * the process (cudaDeviceSynchronize, a cudaFree with work queued). Captures, warm-ups, replays,
 * graph destruction and frees must never make a device-wide wait (docs/ARCHITECTURE.md,
 * "Synchronisation"); tests/unit/test_sync.c and tests/python/test_sync_paths.py hold to it. */
enum class SyncScope { stream, device };
void note_sync(SyncScope scope);
/* A device free deferred (note_free_deferred), and one of them done (note_free_done). */
void note_free_deferred();
void note_free_done(uint64_t n);

/* The families: one function per family_<kind>.cpp. A family that is not built has its
 * GR_FAMILY_<KIND> nullptr instead, so that engine.cpp's table names every family graphd knows
 * without an #ifdef of its own. */
const Family &family_cpu();
/* Held around every draw this process makes from libtorch's default CPU generator (one per
 * process, shared by the CPU devices' worker threads): a CPU replay swaps a client's state into
 * that generator, and no other draw may land in between. */
std::mutex &cpu_generator_mutex();
#ifdef GR_HAVE_CUDA
const Family &family_cuda();
#define GR_FAMILY_CUDA (&gr::family_cuda)
#else
#define GR_FAMILY_CUDA nullptr
#endif
#ifdef GR_HAVE_XPU
const Family &family_xpu();
#define GR_FAMILY_XPU (&gr::family_xpu)
#else
#define GR_FAMILY_XPU nullptr
#endif

/* A device name resolved through the family table (engine.cpp). */
struct DeviceRef {
    const Family *family;
    int index;
    std::string name; /* canonical: "cpu:0" */
};
/* "cpu", "cpu:0", "xpu:1" => family and index. gr::Error GR_EINVAL for a malformed name or an
 * unknown kind, GR_EUNSUPPORTED for a kind graphd knows but this build lacks ("this graphd was
 * built without a ... libtorch"), GR_ENOTFOUND for an index past the family's devices. */
DeviceRef parse_device(const char *device);

} // namespace gr

#endif
