/*
 * graph_runtime CUDA family. Device-resident captures (gr_capture_opts_t.resident): the caller's
 * static blocks are device memory (gr_device_alloc, exported to the client with CUDA IPC), the
 * static tensors are views of them, and the graphs hold only the method: nothing is copied.
 *
 * Host-staged captures (the default): the caller's static blocks are host memory (the
 * daemon's memfd regions); each static tensor has a device twin, and the captured graphs copy
 * between the two. FORWARD: INPUT, PARAM and BUFFER host-to-device, the method, OUTPUT and BUFFER
 * device-to-host. BACKWARD: GRAD_OUTPUT host-to-device, autograd.grad, GRAD_INPUT and PARAM_GRAD
 * device-to-host. Parameters and buffers are copied in on every FORWARD, so a client's host-side
 * optimizer step (or buffer write) is always seen, and buffers copied out, so the client sees the
 * running stats the FORWARD updated. A replay launches the graph on its pool's stream and waits
 * for it: the caller reads the block as soon as the replay returns.
 *
 * The blocks are page-locked with cudaHostRegister so the copies are real asynchronous DMA that a
 * graph can record. Registrations are page ranges counted process-wide (PinnedRanges). Where a
 * block cannot be registered (it shares pages with another block but is not inside that one's
 * registration, or the system refuses), the callable stages through a pinned bounce buffer of its
 * own, copied on the host around each replay: correct, one host memcpy slower.
 *
 * Random ops: a forward graph with random ops is captured with the device's default generator
 * drawing from a generator state of the graph's own (CUDAGeneratorState), so its kernels read
 * their Philox seed and offset from that state's two device words, as upstream's graphs read the
 * default generator's. Its RNG_STATE tensor is int64 (seed, offset, increment): the client
 * writes seed and offset, the replay copies them into those words on the stream and launches
 * the graph's executable itself (CUDAGraph::replay would first fill them from the host state),
 * and the capture writes the graph's whole offset increment, by which the client advances its
 * own generator. Each graph having its own words, replays of several sessions on several
 * streams never read each other's seeds.
 *
 * The family also owns what is CUDA-specific in the rest of the runtime's API (engine_int.h's
 * Family members): discovery (gr_devices: cudaGetDeviceProperties, cudaMemGetInfo), the graph
 * mempool's figures (gr_pool_memory: the caching allocator's snapshot), exportable device memory
 * (gr_device_alloc/free: plain cudaMalloc and CUDA IPC), interprocess events (gr_event_*) and
 * sequence counters (gr_seq_*: cuStreamWaitValue64/cuStreamWriteValue64). Its memory and tensors
 * can be shared with another process (CUDA IPC), so device-resident captures are allowed.
 *
 * Built only with -DGR_HAVE_CUDA (the Makefile's TORCH=python on a torch with CUDA).
 */
#ifdef GR_HAVE_CUDA

#include "engine_int.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <new>
#include <unistd.h>

namespace gr
{

namespace
{

void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        (void)cudaGetLastError(); /* clear a sticky-free error so later calls do not see it */
        throw Error(err == cudaErrorMemoryAllocation ? GR_ENOMEM : GR_EINTERNAL,
                    std::string(what) + ": " + cudaGetErrorString(err));
    }
}

/* For a CUresult from the driver's stream memory operations (-1: the driver has none). */
void check_cu(int err, const char *what)
{
    if (err != 0)
        throw Error(GR_EINTERNAL, std::string(what) + ": CUresult " + std::to_string(err));
}

/* Page ranges registered with cudaHostRegister, reference-counted: blocks that share pages
 * share registrations. Process-wide (the one place the CUDA family keeps global state, as the
 * driver's registration table is process-wide too). */
class PinnedRanges
{
  public:
    /* Registers [p, p + len) rounded out to pages; returns the start of the range it holds. A
     * block inside one range already registered shares it; a block that overlaps registered
     * pages only in part cannot be pinned (a copy must not span two registrations): GR_EBUSY,
     * and the caller stages through a bounce buffer. */
    std::vector<uintptr_t> pin(const void *p, size_t len)
    {
        const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
        const uintptr_t start = reinterpret_cast<uintptr_t>(p) / page * page;
        const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + len + page - 1) / page * page;
        std::lock_guard<std::mutex> lock(mu_);
        auto it = ranges_.upper_bound(start);
        if (it != ranges_.begin() && std::prev(it)->second.end > start) {
            auto prev = std::prev(it);
            if (prev->second.end < end)
                throw Error(GR_EBUSY, "block shares pages with another pinned block");
            prev->second.refs++;
            return {prev->first};
        }
        if (it != ranges_.end() && it->first < end)
            throw Error(GR_EBUSY, "block shares pages with another pinned block");
        cudaError_t err =
            cudaHostRegister(reinterpret_cast<void *>(start), end - start, cudaHostRegisterDefault);
        bool owned = true;
        if (err == cudaErrorHostMemoryAlreadyRegistered) {
            (void)cudaGetLastError();
            owned = false; /* pinned by someone else (the caller itself): borrow it */
        } else {
            check(err, "cudaHostRegister");
        }
        ranges_.emplace(start, Range{end, 1, owned});
        return {start};
    }

    void unpin(const std::vector<uintptr_t> &held)
    {
        std::lock_guard<std::mutex> lock(mu_);
        release_locked(held);
    }

  private:
    struct Range {
        uintptr_t end;
        int refs;
        bool owned;
    };

    void release_locked(const std::vector<uintptr_t> &held)
    {
        for (uintptr_t start : held) {
            auto it = ranges_.find(start);
            if (it == ranges_.end() || --it->second.refs > 0)
                continue;
            if (it->second.owned &&
                cudaHostUnregister(reinterpret_cast<void *>(start)) != cudaSuccess)
                (void)cudaGetLastError();
            ranges_.erase(it);
        }
    }

    std::mutex mu_;
    std::map<uintptr_t, Range> ranges_;
};

PinnedRanges &pinned()
{
    static PinnedRanges *r = new PinnedRanges; /* never destroyed: outlives static teardown */
    return *r;
}

/* ---- streams, host waits and deferred frees (docs/ARCHITECTURE.md, "Synchronisation") ----
 * The family queues device work only on streams of its own: one per pool (its graphs' captures
 * and replays, and the waits of their posted replays on that session's counters), one per
 * device for warm-ups, one per sequence counters, and this thread's current stream for the
 * engine's preparation (module copies, static block fills). Each is registered here by device.
 * The host only ever waits for one of them (sync_stream, counted as a stream wait), never for
 * the device: a device-wide wait (cudaDeviceSynchronize, and cudaFree, which waits for every
 * stream of the process) would also wait for streams that wait for another client's counters.
 * So device memory the family frees (gr_device_free, gr_seq_destroy) is only handed to
 * DeferredFrees: events recorded on every registered stream of its device then, and cudaFree
 * once those are done and no registered stream has work queued, which gr_device_reclaim checks
 * from the caller's idle time (the executor's loop). */

/* Host wait for one stream of the family's own. */
void sync_stream(cudaStream_t stream, const char *what)
{
    note_sync(SyncScope::stream);
    check(cudaStreamSynchronize(stream), what);
}

/* Makes index the current device for its lifetime, restoring the previous one after. */
struct DeviceScope {
    int prev = -1;
    cudaError_t err = cudaSuccess;
    explicit DeviceScope(int index)
    {
        if (cudaGetDevice(&prev) != cudaSuccess) {
            (void)cudaGetLastError();
            prev = -1;
        }
        if (prev != index)
            err = cudaSetDevice(index);
    }
    ~DeviceScope()
    {
        if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess)
            (void)cudaGetLastError();
    }
};

class Streams
{
  public:
    void add(int device, cudaStream_t s)
    {
        std::lock_guard<std::mutex> lock(mu_);
        by_device_[device].push_back(s);
    }
    void remove(int device, cudaStream_t s)
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto &v = by_device_[device];
        v.erase(std::remove(v.begin(), v.end(), s), v.end());
    }
    /* The registered streams of device, and the legacy default stream (the engine's
     * preparation runs there). */
    std::vector<cudaStream_t> of(int device)
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<cudaStream_t> out = by_device_[device];
        out.push_back(cudaStreamLegacy);
        return out;
    }
    /* true when none of them has work queued (the current device must be device). */
    bool idle(int device)
    {
        for (cudaStream_t s : of(device)) {
            cudaError_t err = cudaStreamQuery(s);
            if (err == cudaSuccess)
                continue;
            (void)cudaGetLastError();
            return false;
        }
        return true;
    }

  private:
    std::mutex mu_;
    std::map<int, std::vector<cudaStream_t>> by_device_;
};

Streams &streams()
{
    static Streams *s = new Streams; /* never destroyed: outlives static teardown */
    return *s;
}

/* A non-blocking stream of the family's own on device index (current), registered. */
cudaStream_t new_stream(int index)
{
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    streams().add(index, s);
    return s;
}

/* Unregisters and destroys s: returns at once, work still queued on s runs to its end. */
void destroy_stream(int index, cudaStream_t s)
{
    streams().remove(index, s);
    if (cudaStreamDestroy(s) != cudaSuccess)
        (void)cudaGetLastError(); /* the context may be gone at exit */
}

/* The warm-up stream of device index (created on first use, never destroyed): only warm-ups run
 * there, so none waits behind a posted replay's counters. */
c10::cuda::CUDAStream warmup_stream(int index)
{
    static std::mutex mu;
    static std::map<int, cudaStream_t> *made = new std::map<int, cudaStream_t>;
    std::lock_guard<std::mutex> lock(mu);
    auto it = made->find(index);
    if (it == made->end())
        it = made->emplace(index, new_stream(index)).first;
    return c10::cuda::getStreamFromExternal(it->second, static_cast<c10::DeviceIndex>(index));
}

class DeferredFrees
{
  public:
    /* Takes ptr (device index's cudaMalloc memory) to free later; never waits. */
    void defer(int index, void *ptr)
    {
        DeviceScope scope(index);
        Entry e{index, ptr, {}};
        for (cudaStream_t s : streams().of(index)) {
            cudaEvent_t ev = nullptr;
            if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
                (void)cudaGetLastError();
                continue; /* reclaim then also waits for the device to be idle */
            }
            if (cudaEventRecord(ev, s) != cudaSuccess) {
                (void)cudaGetLastError();
                (void)cudaEventDestroy(ev);
                continue;
            }
            e.events.push_back(ev);
        }
        note_free_deferred();
        std::lock_guard<std::mutex> lock(mu_);
        pending_.push_back(std::move(e));
    }

    /* Frees the entries of device index whose events are done while every registered stream of
     * the device is idle (so that cudaFree waits for nothing); wait: all of them, waiting for
     * their events (stream-scoped) and then for the device (counted as device-wide when some
     * stream still has work). Returns the entries of index still pending. */
    uint64_t reclaim(int index, bool wait)
    {
        std::lock_guard<std::mutex> lock(mu_);
        DeviceScope scope(index);
        uint64_t left = 0, freed = 0;
        for (auto it = pending_.begin(); it != pending_.end();) {
            if (it->device != index) {
                ++it;
                continue;
            }
            bool done = true;
            for (cudaEvent_t ev : it->events) {
                cudaError_t err;
                if (wait) {
                    note_sync(SyncScope::stream);
                    err = cudaEventSynchronize(ev);
                } else {
                    err = cudaEventQuery(ev);
                }
                if (err != cudaSuccess) {
                    (void)cudaGetLastError();
                    done = err != cudaErrorNotReady; /* an error: the context is gone */
                    if (!done)
                        break;
                }
            }
            const bool idle = streams().idle(index);
            if (!wait && !(done && idle)) {
                left++;
                ++it;
                continue;
            }
            if (!idle)
                note_sync(SyncScope::device); /* cudaFree below waits for the device */
            for (cudaEvent_t ev : it->events)
                if (cudaEventDestroy(ev) != cudaSuccess)
                    (void)cudaGetLastError();
            if (cudaFree(it->ptr) != cudaSuccess) /* sync-ok: idle device, or wait */
                (void)cudaGetLastError();
            freed++;
            it = pending_.erase(it);
        }
        note_free_done(freed);
        return left;
    }

  private:
    struct Entry {
        int device;
        void *ptr;
        std::vector<cudaEvent_t> events;
    };
    std::mutex mu_;
    std::vector<Entry> pending_;
};

DeferredFrees &deferred_frees()
{
    static DeferredFrees *d = new DeferredFrees; /* never destroyed: outlives static teardown */
    return *d;
}

using PoolId = decltype(at::cuda::graph_pool_handle());

/* A pool's stream is its own (never one of libtorch's pooled streams, which other pools would
 * share): a posted replay of this pool's session that waits for its client's counters holds up
 * nothing but that session's later work. */
struct CudaPool final : PoolState {
    int index;
    PoolId id;
    c10::cuda::CUDAStream stream;
    uint64_t serial; /* the stream's, never reused (a new stream may get a freed one's handle) */
    CudaPool(int index_, PoolId id_, cudaStream_t own)
        : index(index_), id(id_),
          stream(c10::cuda::getStreamFromExternal(own, static_cast<c10::DeviceIndex>(index_))),
          serial(next_serial())
    {
    }
    static uint64_t next_serial()
    {
        static std::atomic<uint64_t> n{0};
        return ++n;
    }
    ~CudaPool() override
    {
        destroy_stream(index, stream.stream());
    }
};

struct CudaCallable final : FamilyState {
    bool resident = false;       /* block is device memory: no staging at all */
    uint8_t *block = nullptr;    /* the caller's block */
    uint8_t *staging = nullptr;  /* what the graphs copy from and to: block, or bounce */
    void *bounce = nullptr;      /* pinned copy of the block where registration failed */
    std::vector<uintptr_t> held; /* pinned page ranges */
    std::optional<c10::cuda::CUDAStream> stream;
    uint64_t stream_serial = 0; /* CudaPool::serial of stream */
    std::unique_ptr<at::cuda::CUDAGraph> fwd, bwd;
    /* A forward graph with random ops: the generator state its kernels read seed and offset
     * from, and where the client's (seed, offset) are (the RNG_STATE tensor in device memory or
     * in the staging memory). */
    c10::intrusive_ptr<at::CUDAGeneratorState> rng;
    const uint8_t *rng_src = nullptr;

    ~CudaCallable() override
    {
        try {
            if (stream) /* its own pool's stream: the graphs and the pinned block are in use */
                sync_stream(stream->stream(), "cudaStreamSynchronize (graph destroy)");
        } catch (...) {
        }
        fwd.reset();
        bwd.reset();
        pinned().unpin(held);
        if (bounce != nullptr && cudaFreeHost(bounce) != cudaSuccess)
            (void)cudaGetLastError();
    }
};

CudaCallable &state_of(Callable &c)
{
    auto *s = dynamic_cast<CudaCallable *>(c.family_state.get());
    if (s == nullptr)
        throw Error(GR_EINTERNAL, "CUDA callable without its family state");
    return *s;
}

bool role_in(int role, std::initializer_list<int> roles)
{
    return std::find(roles.begin(), roles.end(), role) != roles.end();
}

/* Records (at capture) the copies of the static tensors of the given roles between the staging
 * memory and the device twins, on the current stream. */
void stage(Callable &c, CudaCallable &st, bool to_device, std::initializer_list<int> roles)
{
    if (st.resident)
        return; /* the method reads and writes the block itself */
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    for (size_t k = 0; k < c.layout.size(); k++) {
        const gr_tensor_desc_t &d = c.layout[k];
        if (!role_in(d.role, roles) || d.nbytes == 0)
            continue;
        void *host = st.staging + d.offset;
        void *dev = c.dev_views[k].data_ptr();
        check(to_device ? cudaMemcpyAsync(dev, host, d.nbytes, cudaMemcpyHostToDevice, stream)
                        : cudaMemcpyAsync(host, dev, d.nbytes, cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync");
    }
}

/* With a bounce buffer: the host-side copies around a replay. */
void bounce(Callable &c, CudaCallable &st, bool in, std::initializer_list<int> roles)
{
    if (st.bounce == nullptr)
        return;
    for (const gr_tensor_desc_t &d : c.layout) {
        if (!role_in(d.role, roles))
            continue;
        if (in)
            std::memcpy(st.staging + d.offset, st.block + d.offset, d.nbytes);
        else
            std::memcpy(st.block + d.offset, st.staging + d.offset, d.nbytes);
    }
}

template <typename F>
std::unique_ptr<at::cuda::CUDAGraph> capture_graph(const CudaPool &pool, F &&body)
{
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    /* What the engine queued on this thread's current stream (the module's copy, the static
     * block's fills and copies) is done before the graph is captured (so before any replay on
     * the pool's stream, and before the caller reads the block): that stream alone is waited
     * for, not the device (torch.cuda.graph synchronises the device here). */
    sync_stream(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(pool.index)).stream(),
                "cudaStreamSynchronize (before capture)");
    c10::cuda::CUDAStreamGuard guard(pool.stream);
    /* Thread-local capture mode: only this thread's unsafe calls may break the capture, not
     * another thread's (the executor's urgent thread releasing or skipping counters). */
    graph->capture_begin(pool.id, cudaStreamCaptureModeThreadLocal);
    try {
        body();
    } catch (...) {
        try {
            graph->capture_end();
        } catch (...) {
        }
        (void)cudaGetLastError();
        throw;
    }
    graph->capture_end();
    return graph;
}

/* The layout entry of c's RNG_STATE tensor, or nullptr. */
const gr_tensor_desc_t *rng_desc(const Callable &c)
{
    for (const gr_tensor_desc_t &d : c.layout)
        if (d.role == GR_ROLE_RNG_STATE)
            return &d;
    return nullptr;
}

/* Runs capture (which captures a graph) with the default generator of device index drawing from
 * state, and gives the generator its own state back afterwards, whatever happens. */
template <typename F>
void with_generator_state(int index, const c10::intrusive_ptr<at::CUDAGeneratorState> &state,
                          F &&capture)
{
    const at::Generator &gen =
        at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
    auto *impl = gen.get<at::CUDAGeneratorImpl>();
    c10::intrusive_ptr<c10::GeneratorImpl> saved;
    {
        std::lock_guard<std::mutex> lock(impl->mutex_);
        saved = impl->graphsafe_get_state();
        impl->graphsafe_set_state(c10::make_intrusive<at::CUDAGeneratorImpl>(
            static_cast<c10::DeviceIndex>(index), state));
    }
    struct Restore {
        at::CUDAGeneratorImpl *impl;
        c10::intrusive_ptr<c10::GeneratorImpl> &saved;
        ~Restore()
        {
            std::lock_guard<std::mutex> lock(impl->mutex_);
            impl->graphsafe_set_state(saved);
        }
    } restore{impl, saved};
    capture();
}

/* After the backward capture: where each external PARAM_GRAD is (the caching-allocator segment
 * of the pool's mempool that holds it) and that segment's IPC handle, into c.external and the
 * descs' offsets. A segment that cudaIpcGetMemHandle refuses (expandable segments) fails the
 * capture with a hint. */
void export_external(Callable &c, const CudaPool &pool)
{
    c.external.clear();
    if (c.external_slots.empty())
        return;
    const auto snap = c10::cuda::CUDACachingAllocator::snapshot(pool.id, false);
    for (const auto &slot : c.external_slots) {
        gr_tensor_desc_t &d = c.layout[slot.first];
        const at::Tensor &t = c.grad_views[slot.second];
        if (!t.defined())
            throw Error(GR_EINTERNAL, std::string("parameter gradient '") + d.name +
                                          "' got no memory at the backward capture");
        const auto ptr = reinterpret_cast<uintptr_t>(t.data_ptr());
        gr_external_t e{};
        e.tensor = slot.first;
        for (const auto &seg : snap.segments) {
            if (seg.owner_private_pool_id != pool.id || seg.device != pool.index)
                continue;
            const auto base = static_cast<uintptr_t>(seg.address);
            if (ptr >= base && ptr + d.nbytes <= base + seg.total_size) {
                e.base = reinterpret_cast<void *>(base);
                e.size = seg.total_size;
                e.offset = ptr - base;
                break;
            }
        }
        if (e.base == nullptr)
            throw Error(GR_EINTERNAL, std::string("parameter gradient '") + d.name +
                                          "' is not in the pool's graph mempool");
        cudaIpcMemHandle_t h;
        cudaError_t err = cudaIpcGetMemHandle(&h, e.base);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            throw Error(GR_EUNSUPPORTED,
                        std::string("cudaIpcGetMemHandle of the graph mempool segment holding '") +
                            d.name + "': " + cudaGetErrorString(err) +
                            " (expandable segments cannot be shared; capture with "
                            "copy_param_grads)");
        }
        static_assert(sizeof h == GR_IPC_HANDLE_SIZE, "CUDA IPC handle size");
        std::memcpy(e.handle, &h, sizeof h);
        d.offset = e.offset;
        c.external.push_back(e);
    }
}

/* ---- device memory, events and sequence counters (gr_device_alloc, gr_event_*, gr_seq_*) ----
 * Plain cudaMalloc (never libtorch's caching allocator: a block carved out of a larger cached
 * segment could not be exported at offset 0, and would outlive our free) and a CUDA IPC handle
 * for the client. */

int cuda_fail(cudaError_t err, const char *what, const char *device)
{
    (void)cudaGetLastError(); /* clear it, so later calls on this thread do not see it */
    return gr__set_errorf(err == cudaErrorMemoryAllocation ? GR_ENOMEM
                          : err == cudaErrorInvalidDevice  ? GR_ENOTFOUND
                                                           : GR_EINTERNAL,
                          "%s on %s: %s", what, device, cudaGetErrorString(err));
}

/* GR_OK when the runtime sees device index, else GR_ENOTFOUND (set) for fn. */
int cuda_device_exists(const char *fn, const char *device, int index)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || index >= count) {
        (void)cudaGetLastError();
        return gr__set_errorf(GR_ENOTFOUND, "%s: no device %s", fn, device);
    }
    return GR_OK;
}

int cuda_alloc(int index, const char *device, uint64_t bytes, void **ptr, uint8_t *handle)
{
    static_assert(sizeof(cudaIpcMemHandle_t) == GR_IPC_HANDLE_SIZE, "IPC handle size");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || index >= count) {
        (void)cudaGetLastError();
        return gr__set_errorf(GR_ENOTFOUND, "no device %s", device);
    }
    DeviceScope scope(index);
    if (scope.err != cudaSuccess)
        return cuda_fail(scope.err, "cudaSetDevice", device);
    void *p = nullptr;
    cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (err == cudaErrorMemoryAllocation) { /* the device is full: deferred frees first */
        (void)cudaGetLastError();
        if (deferred_frees().reclaim(index, true) == 0)
            err = cudaMalloc(&p, static_cast<size_t>(bytes));
    }
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaMalloc", device);
    cudaIpcMemHandle_t h;
    err = cudaIpcGetMemHandle(&h, p);
    if (err != cudaSuccess) {
        int rc = cuda_fail(err, "cudaIpcGetMemHandle", device);
        deferred_frees().defer(index, p);
        return rc;
    }
    std::memcpy(handle, &h, GR_IPC_HANDLE_SIZE);
    *ptr = p;
    return GR_OK;
}

int cuda_free(int index, const char *device, void *ptr)
{
    DeviceScope scope(index);
    if (scope.err != cudaSuccess)
        return cuda_fail(scope.err, "cudaSetDevice", device);
    deferred_frees().defer(index, ptr); /* never cudaFree here: it waits for the device */
    return GR_OK;
}

/* *out = a new gr_event_t owning ev, which is destroyed if that fails. */
int wrap_event(const char *fn, int index, cudaEvent_t ev, int opened, gr_event_t **out)
{
    auto *e = new (std::nothrow) gr_event_t{&family_cuda(), index, ev, opened};
    if (e == nullptr) {
        (void)cudaEventDestroy(ev);
        return gr__set_errorf(GR_ENOMEM, "%s: out of memory", fn);
    }
    *out = e;
    return GR_OK;
}

int cuda_event_create(int index, const char *device, gr_event_t **out, uint8_t *handle)
{
    int rc = cuda_device_exists("gr_event_create", device, index);
    if (rc != GR_OK)
        return rc;
    static_assert(sizeof(cudaIpcEventHandle_t) == GR_IPC_HANDLE_SIZE, "IPC handle size");
    DeviceScope scope(index);
    if (scope.err != cudaSuccess)
        return cuda_fail(scope.err, "cudaSetDevice", device);
    cudaEvent_t ev = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaEventCreateWithFlags", device);
    cudaIpcEventHandle_t h;
    err = cudaIpcGetEventHandle(&h, ev);
    if (err != cudaSuccess) {
        int rc = cuda_fail(err, "cudaIpcGetEventHandle", device);
        (void)cudaEventDestroy(ev);
        return rc;
    }
    rc = wrap_event("gr_event_create", index, ev, 0, out);
    if (rc == GR_OK)
        std::memcpy(handle, &h, GR_IPC_HANDLE_SIZE);
    return rc;
}

int cuda_event_open(int index, const char *device, const uint8_t *handle, gr_event_t **out)
{
    int rc = cuda_device_exists("gr_event_open", device, index);
    if (rc != GR_OK)
        return rc;
    DeviceScope scope(index);
    if (scope.err != cudaSuccess)
        return cuda_fail(scope.err, "cudaSetDevice", device);
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle, GR_IPC_HANDLE_SIZE);
    cudaEvent_t ev = nullptr;
    cudaError_t err = cudaIpcOpenEventHandle(&ev, h);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return gr__set_errorf(GR_EINVAL, "cudaIpcOpenEventHandle on %s: %s", device,
                              cudaGetErrorString(err));
    }
    return wrap_event("gr_event_open", index, ev, 1, out);
}

void cuda_event_destroy(gr_event_t *e)
{
    {
        DeviceScope scope(e->device);
        if (cudaEventDestroy(static_cast<cudaEvent_t>(e->event)) != cudaSuccess)
            (void)cudaGetLastError(); /* the context may be gone at exit: nothing to free */
    }
    delete e;
}

/* The driver's cuStreamWaitValue64 / cuStreamWriteValue64 (CUstream, CUdeviceptr, cuuint64_t,
 * unsigned int) -> CUresult, looked up in the driver the runtime has loaded, so that
 * graph_runtime need not link against libcuda. */
using StreamValueFn = int (*)(void *, unsigned long long, unsigned long long, unsigned int);
struct StreamOps {
    StreamValueFn wait = nullptr, write = nullptr;
    StreamOps()
    {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h == nullptr)
            h = dlopen("libcuda.so.1", RTLD_NOW);
        if (h == nullptr)
            return;
        wait = resolve(h, "cuStreamWaitValue64_v2", "cuStreamWaitValue64");
        write = resolve(h, "cuStreamWriteValue64_v2", "cuStreamWriteValue64");
        if (wait == nullptr || write == nullptr)
            wait = write = nullptr;
    }
    static StreamValueFn resolve(void *h, const char *name, const char *fallback)
    {
        void *f = dlsym(h, name);
        if (f == nullptr)
            f = dlsym(h, fallback);
        return reinterpret_cast<StreamValueFn>(f);
    }
};

const StreamOps &stream_ops()
{
    static const StreamOps ops;
    return ops;
}

const unsigned CU_STREAM_WAIT_VALUE_GEQ_ = 0x0;      /* CU_STREAM_WAIT_VALUE_GEQ */
const unsigned CU_STREAM_WRITE_VALUE_DEFAULT_ = 0x0; /* with a memory barrier before the write */

/* CUDA stream memory operations on 64-bit values (the driver's cuStreamWaitValue64 with
 * CU_STREAM_WAIT_VALUE_GEQ, and cuStreamWriteValue64), resolved once: 0, or a CUresult (-1 when
 * the driver has none). stream is a cudaStream_t. */
int stream_wait_geq(void *stream, const void *addr, uint64_t value)
{
    const StreamOps &ops = stream_ops();
    if (ops.wait == nullptr)
        return -1;
    return ops.wait(stream, reinterpret_cast<uintptr_t>(addr), value, CU_STREAM_WAIT_VALUE_GEQ_);
}

int stream_write(void *stream, void *addr, uint64_t value)
{
    const StreamOps &ops = stream_ops();
    if (ops.write == nullptr)
        return -1;
    return ops.write(stream, reinterpret_cast<uintptr_t>(addr), value,
                     CU_STREAM_WRITE_VALUE_DEFAULT_);
}

uint8_t *seq_bytes(const gr_seq_t *s)
{
    return static_cast<uint8_t *>(s->mem);
}

int cuda_seq_create(int index, const char *device, gr_seq_t **out, uint8_t *handle)
{
    int rc = cuda_device_exists("gr_seq_create", device, index);
    if (rc != GR_OK)
        return rc;
    if (stream_ops().wait == nullptr)
        return gr__set_errorf(GR_EUNSUPPORTED,
                              "gr_seq_create: the CUDA driver has no cuStreamWaitValue64");
    void *mem = nullptr;
    rc = cuda_alloc(index, device, GR_SEQ_BYTES, &mem, handle);
    if (rc != GR_OK)
        return rc;
    DeviceScope scope(index);
    cudaStream_t stream = nullptr;
    cudaError_t err = scope.err;
    if (err == cudaSuccess)
        err = cudaMemset(mem, 0, GR_SEQ_BYTES);
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        rc = cuda_fail(err, "sequence counters", device);
        deferred_frees().defer(index, mem);
        return rc;
    }
    streams().add(index, stream);
    auto *s = new (std::nothrow) gr_seq_t{&family_cuda(), index, mem, stream, 0, 0};
    if (s == nullptr) {
        destroy_stream(index, stream);
        deferred_frees().defer(index, mem);
        return gr__set_error(GR_ENOMEM, "gr_seq_create: out of memory");
    }
    *out = s;
    return GR_OK;
}

int cuda_seq_skip(gr_seq_t *s, uint64_t n)
{
    DeviceScope scope(s->device);
    int err = stream_wait_geq(s->stream, seq_bytes(s) + GR_SEQ_DONE_OFFSET, n - 1);
    if (err == 0)
        err = stream_write(s->stream, seq_bytes(s) + GR_SEQ_DONE_OFFSET, n);
    if (err != 0)
        return gr__set_errorf(GR_EINTERNAL, "gr_seq_skip on cuda:%d: CUresult %d", s->device, err);
    return GR_OK;
}

int cuda_seq_release(gr_seq_t *s)
{
    /* A stream of its own: the counters' stream may itself wait (gr_seq_skip) behind the very
     * replay this is to unblock. */
    DeviceScope scope(s->device);
    cudaStream_t stream = nullptr;
    cudaError_t cerr = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (cerr != cudaSuccess)
        return cuda_fail(cerr, "gr_seq_release: cudaStreamCreateWithFlags", "the counters' device");
    int err = stream_write(stream, seq_bytes(s) + GR_SEQ_READY_OFFSET, GR_SEQ_RELEASED);
    if (err == 0)
        err = stream_write(stream, seq_bytes(s) + GR_SEQ_DONE_OFFSET, GR_SEQ_RELEASED);
    (void)cudaStreamDestroy(stream); /* returns at once; the writes still run */
    if (err != 0)
        return gr__set_errorf(GR_EINTERNAL, "gr_seq_release on cuda:%d: CUresult %d", s->device,
                              err);
    return GR_OK;
}

void cuda_seq_destroy(gr_seq_t *s)
{
    {
        DeviceScope scope(s->device);
        auto stream = static_cast<cudaStream_t>(s->stream);
        note_sync(SyncScope::stream); /* the counters' own stream: its skips are done */
        if (cudaStreamSynchronize(stream) != cudaSuccess)
            (void)cudaGetLastError(); /* the context may be gone at exit */
        destroy_stream(s->device, stream);
        /* The graphs' streams may still wait on the counters (released by now): the memory goes
         * when they are done, never with a cudaFree that waits for the device. */
        deferred_frees().defer(s->device, s->mem);
    }
    delete s;
}

const CudaPool &pool_of(PoolState *p)
{
    auto *pool = dynamic_cast<CudaPool *>(p);
    if (pool == nullptr)
        throw Error(GR_EINTERNAL, "CUDA capture without a CUDA pool");
    return *pool;
}

/* ---- discovery and pool memory (gr_devices, gr_pool_memory) ---- */

std::vector<gr_device_info_t> cuda_devices()
{
    std::vector<gr_device_info_t> out;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { /* no driver, no GPU: no devices */
        (void)cudaGetLastError();
        return out;
    }
    int prev = 0;
    bool restore = cudaGetDevice(&prev) == cudaSuccess;
    const int mps = gr_cuda_mps_pipe(nullptr, 0) == 1; /* one server for every device, or none */
    for (int i = 0; i < n; i++) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        gr_device_info_t d{};
        std::snprintf(d.device, sizeof d.device, "cuda:%d", i);
        size_t len = std::min(strnlen(prop.name, sizeof prop.name), sizeof d.name - 1);
        std::memcpy(d.name, prop.name, len); /* d is zeroed: NUL-terminated */
        std::snprintf(d.compute_capability, sizeof d.compute_capability, "%d.%d", prop.major,
                      prop.minor);
        d.total_bytes = prop.totalGlobalMem;
        d.mps = mps;
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
            d.free_bytes = free_b;
            d.total_bytes = total_b;
        } else {
            (void)cudaGetLastError();
        }
        out.push_back(d);
    }
    if (restore)
        (void)cudaSetDevice(prev);
    return out;
}

void cuda_pool_memory(const PoolState *state, uint64_t *reserved, uint64_t *in_use)
{
    const auto *pool = dynamic_cast<const CudaPool *>(state);
    if (pool == nullptr)
        throw Error(GR_EINTERNAL, "CUDA pool without its family state");
    /* Asking for the mempool makes libtorch walk only that pool's segments; the owner check keeps
     * the sum right on a libtorch that ignores the filter and returns every segment. No traces:
     * only the sizes are read. */
    const auto snap = c10::cuda::CUDACachingAllocator::snapshot(pool->id, false);
    uint64_t total = 0, allocated = 0;
    for (const auto &seg : snap.segments) {
        if (seg.owner_private_pool_id != pool->id || seg.device != pool->index)
            continue;
        total += seg.total_size;
        allocated += seg.allocated_size;
    }
    *reserved = total;
    *in_use = allocated;
}

class CudaFamily final : public Family
{
  public:
    const char *kind() const override
    {
        return "cuda";
    }
    int device_count() const override
    {
        return static_cast<int>(c10::cuda::device_count());
    }
    c10::Device device(int index) const override
    {
        return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
    }
    std::unique_ptr<PoolState> make_pool(int index) const override
    {
        auto dev = static_cast<c10::DeviceIndex>(index);
        c10::cuda::CUDAGuard guard(dev);
        cudaStream_t own = new_stream(index);
        try {
            return std::make_unique<CudaPool>(index, at::cuda::graph_pool_handle(), own);
        } catch (...) {
            destroy_stream(index, own);
            throw;
        }
    }
    std::vector<gr_device_info_t> devices() const override
    {
        return cuda_devices();
    }
    void pool_memory(const PoolState *state, uint64_t *reserved, uint64_t *in_use) const override
    {
        cuda_pool_memory(state, reserved, in_use);
    }
    /* CUDA memory and tensors are shared through CUDA IPC: device-resident captures work. */
    void check_sharing(const std::string & /*device*/) const override
    {
    }
    int alloc(int index, const char *device, uint64_t bytes, void **ptr,
              uint8_t *handle) const override
    {
        return cuda_alloc(index, device, bytes, ptr, handle);
    }
    int free(int index, const char *device, void *ptr) const override
    {
        return cuda_free(index, device, ptr);
    }
    uint64_t reclaim(int index, bool wait) const override
    {
        return deferred_frees().reclaim(index, wait);
    }
    int event_create(int index, const char *device, gr_event_t **out,
                     uint8_t *handle) const override
    {
        return cuda_event_create(index, device, out, handle);
    }
    int event_open(int index, const char *device, const uint8_t *handle,
                   gr_event_t **out) const override
    {
        return cuda_event_open(index, device, handle, out);
    }
    void event_destroy(gr_event_t *e) const override
    {
        cuda_event_destroy(e);
    }
    int seq_create(int index, const char *device, gr_seq_t **out, uint8_t *handle) const override
    {
        return cuda_seq_create(index, device, out, handle);
    }
    int seq_skip(gr_seq_t *s, uint64_t n) const override
    {
        return cuda_seq_skip(s, n);
    }
    int seq_release(gr_seq_t *s) const override
    {
        return cuda_seq_release(s);
    }
    void seq_destroy(gr_seq_t *s) const override
    {
        cuda_seq_destroy(s);
    }
    bool staged() const override
    {
        return true;
    }
    void bind(Callable &c, void *base, uint64_t bytes) const override
    {
        auto st = std::make_unique<CudaCallable>();
        st->block = static_cast<uint8_t *>(base);
        st->staging = st->block;
        st->resident = c.resident;
        if (bytes > 0 && !c.resident) {
            try {
                st->held = pinned().pin(base, bytes);
            } catch (const Error &e) {
                /* Registration refused: stage through a pinned buffer of our own. */
                check(cudaHostAlloc(&st->bounce, bytes, cudaHostAllocDefault), "cudaHostAlloc");
                st->staging = static_cast<uint8_t *>(st->bounce);
                std::memcpy(st->staging, st->block, bytes);
                std::fprintf(stderr, "graph_runtime: %s; staging through a bounce buffer\n",
                             e.what());
            }
        }
        c.family_state = std::move(st);
    }
    void warmup(int index, bool /*random*/, const std::function<void()> &body) const override
    {
        auto dev = static_cast<c10::DeviceIndex>(index);
        c10::cuda::CUDAGuard guard(dev);
        /* As torch.cuda.graph's warm-up on a side stream, but waiting only for the streams it
         * uses: this thread's current one (the module's copy, the sample args), then the
         * device's warm-up stream, which nothing else uses. */
        sync_stream(c10::cuda::getCurrentCUDAStream(dev).stream(),
                    "cudaStreamSynchronize (before warm-up)");
        c10::cuda::CUDAStream side = warmup_stream(index);
        {
            c10::cuda::CUDAStreamGuard on_side(side);
            body();
        }
        sync_stream(side.stream(), "cudaStreamSynchronize (after warm-up)");
    }
    /* Philox (seed, offset, increment): see the header comment. */
    std::optional<RngStateSpec> rng_state() const override
    {
        return RngStateSpec{"cuda", at::kLong, {3}};
    }
    void capture_forward(Callable &c, PoolState *pool) const override
    {
        const CudaPool &p = pool_of(pool);
        CudaCallable &st = state_of(c);
        st.stream = p.stream;
        st.stream_serial = p.serial;
        auto capture = [&] {
            st.fwd = capture_graph(p, [&] {
                stage(c, st, true, {GR_ROLE_INPUT, GR_ROLE_PARAM, GR_ROLE_BUFFER});
                run_forward(c);
                stage(c, st, false, {GR_ROLE_OUTPUT, GR_ROLE_BUFFER});
            });
        };
        const gr_tensor_desc_t *rng = rng_desc(c);
        if (rng == nullptr) {
            capture();
            return;
        }
        st.rng = c10::make_intrusive<at::CUDAGeneratorState>();
        with_generator_state(p.index, st.rng, capture);
        /* The offset the graph's kernels advanced by in all (capture_epilogue's total). */
        const int64_t increment = static_cast<int64_t>(st.rng->offset_intragraph_);
        st.rng_src = st.staging + rng->offset;
        uint8_t *inc = st.block + rng->offset + 2 * sizeof(int64_t);
        if (st.resident)
            check(cudaMemcpy(inc, &increment, sizeof increment, cudaMemcpyHostToDevice),
                  "cudaMemcpy (rng increment)");
        else
            std::memcpy(inc, &increment, sizeof increment);
    }
    void capture_backward(Callable &c, PoolState *pool) const override
    {
        const CudaPool &p = pool_of(pool);
        CudaCallable &st = state_of(c);
        st.bwd = capture_graph(p, [&] {
            stage(c, st, true, {GR_ROLE_GRAD_OUTPUT});
            run_backward(c);
            stage(c, st, false, {GR_ROLE_GRAD_INPUT, GR_ROLE_PARAM_GRAD});
        });
        export_external(c, p);
    }
    void replay_forward(Callable &c, const Order *order) const override
    {
        CudaCallable &st = state_of(c);
        bounce(c, st, true, {GR_ROLE_INPUT, GR_ROLE_PARAM, GR_ROLE_BUFFER, GR_ROLE_RNG_STATE});
        replay(st, *st.fwd, order, st.rng.get());
        bounce(c, st, false, {GR_ROLE_OUTPUT, GR_ROLE_BUFFER});
    }
    void replay_backward(Callable &c, const Order *order) const override
    {
        CudaCallable &st = state_of(c);
        if (!st.bwd)
            throw Error(GR_EPRECOND, "no backward graph");
        bounce(c, st, true, {GR_ROLE_GRAD_OUTPUT});
        replay(st, *st.bwd, order, nullptr);
        bounce(c, st, false, {GR_ROLE_GRAD_INPUT, GR_ROLE_PARAM_GRAD});
    }

  private:
    /* Launches the graph on the pool's stream. Unordered: waits for it, so the caller may read
     * the block at once. Ordered: the stream waits on the client's event first and records the
     * completion event after, and nothing on the host waits. */
    /* Launches graph on stream (the current one). With rng, the client's seed and offset are
     * copied first into the words the graph's kernels read them from, and the executable is
     * launched directly: CUDAGraph::replay would fill those words from the host state. */
    static void launch(const CudaCallable &st, at::cuda::CUDAGraph &graph,
                       at::CUDAGeneratorState *rng, cudaStream_t stream)
    {
        if (rng == nullptr) {
            /* Not CUDAGraph::replay: it would refresh the default generator's seed and offset
             * words first (two kernels) for a graph whose kernels do not read them (a graph
             * with random ops has rng), and on drivers before 11.4 synchronise the device. */
            check(cudaGraphLaunch(graph.raw_cuda_graph_exec(), stream), "cudaGraphLaunch");
            return;
        }
        check(cudaMemcpyAsync(rng->seed_extragraph_.data_ptr(), st.rng_src, sizeof(int64_t),
                              cudaMemcpyDefault, stream),
              "cudaMemcpyAsync (rng seed)");
        check(cudaMemcpyAsync(rng->offset_extragraph_.data_ptr(), st.rng_src + sizeof(int64_t),
                              sizeof(int64_t), cudaMemcpyDefault, stream),
              "cudaMemcpyAsync (rng offset)");
        check(cudaGraphLaunch(graph.raw_cuda_graph_exec(), stream), "cudaGraphLaunch");
    }
    static void replay(CudaCallable &st, at::cuda::CUDAGraph &graph, const Order *order,
                       at::CUDAGeneratorState *rng)
    {
        c10::cuda::CUDAStreamGuard guard(*st.stream);
        cudaStream_t stream = st.stream->stream();
        if (order != nullptr && order->seq != nullptr) {
            gr_seq_t &seq = *order->seq;
            uint8_t *mem = static_cast<uint8_t *>(seq.mem);
            /* Replay n - 1 queued its "done = n - 1" on this stream: the stream's order is the
             * wait (one fewer device-side poll and driver call on every step's path). */
            const bool chained =
                seq.chained_serial == st.stream_serial && seq.chained_n + 1 == order->n;
            check_cu(stream_wait_geq(stream, mem + GR_SEQ_READY_OFFSET, order->n),
                     "cuStreamWaitValue64 (ready)");
            if (!chained)
                check_cu(stream_wait_geq(stream, mem + GR_SEQ_DONE_OFFSET, order->n - 1),
                         "cuStreamWaitValue64 (done)");
            launch(st, graph, rng, stream);
            check_cu(stream_write(stream, mem + GR_SEQ_DONE_OFFSET, order->n),
                     "cuStreamWriteValue64");
            seq.chained_serial = st.stream_serial;
            seq.chained_n = order->n;
            return;
        }
        if (order != nullptr)
            check(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(order->wait), 0),
                  "cudaStreamWaitEvent");
        launch(st, graph, rng, stream);
        if (order != nullptr)
            check(cudaEventRecord(static_cast<cudaEvent_t>(order->done), stream),
                  "cudaEventRecord");
        else
            sync_stream(stream, "cudaStreamSynchronize (replay)");
    }
};

} // namespace

const Family &family_cuda()
{
    static const CudaFamily family;
    return family;
}

} // namespace gr

#endif /* GR_HAVE_CUDA */
