/*
 * graph_runtime XPU family: Intel GPUs through PyTorch's XPU graphs (at::xpu::XPUGraph, torch >=
 * 2.11: SYCL command graphs recorded from the pool's stream into its graph mempool). It mirrors
 * family_cuda.cpp's host-staged path line for line: the caller's static blocks are host memory
 * (the daemon's memfd regions); each static tensor has a device twin, and the captured graphs
 * copy between the two. FORWARD: INPUT, PARAM and BUFFER host-to-device, the method, OUTPUT and
 * BUFFER device-to-host. BACKWARD: GRAD_OUTPUT host-to-device, autograd.grad, GRAD_INPUT and
 * PARAM_GRAD device-to-host. A replay runs the graph on its pool's stream and waits for it:
 * replays are synchronous, and the caller reads the block as soon as the replay returns.
 *
 * What it does not do, and why:
 *  - Device-resident captures: torch 2.11 cannot share XPU memory or tensors with another
 *    process (no XPU IPC), so check_sharing refuses them, and gr_device_alloc, events and
 *    sequence counters stay the Family defaults (GR_EUNSUPPORTED naming xpu). The daemon's XPU
 *    regions go through Level Zero directly (ze_layer.h), not through this family.
 *  - Discovery: devices() lists none; the daemon discovers XPU devices, with UUIDs and
 *    telemetry, through Level Zero (ze_layer.h), and listing them here too would list them twice.
 *  - Pinning: CUDA page-locks the blocks (cudaHostRegister) so its copies are DMA a graph can
 *    record; here the copies are the stream queue's memcpy from the block as it is. Whether the
 *    SYCL graph records a copy from pageable memory, or needs the block prepared for device copies
 *    (sycl_ext_oneapi_copy_optimize), is one of the things nobody has run.
 *  - Random ops: no RNG_STATE (rng_state() stays nullopt); they draw from the daemon's generator.
 *
 * NEVER COMPILED: no XPU build of libtorch, no SYCL compiler and no Intel GPU exist where this was
 * written. Built only with -DGR_HAVE_XPU (the Makefile's TORCH=python on a torch whose
 * torch.version.xpu is set, with ATen/xpu headers and libtorch_xpu); docs/XPU.md lists it under
 * "never run". The at::xpu calls follow torch 2.11's ATen/xpu/XPUGraph.h and c10/xpu/XPUStream.h
 * (checked against the GPU machine's torch 2.11 headers, which have no SYCL headers to compile
 * with); streams are set with c10::StreamGuard, as torch 2.11 has no c10::xpu::XPUStreamGuard
 * (later torch adds one).
 */
#ifdef GR_HAVE_XPU

#include "engine_int.h"

#include <algorithm>
#include <cstring>

#include <ATen/xpu/XPUGraph.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/xpu/XPUFunctions.h>
#include <c10/xpu/XPUStream.h>

namespace gr
{

namespace
{

/* The torch version that lacks what device-resident captures need. */
const char *const XPU_IPC_MISSING = "torch 2.11 cannot share XPU memory with another process "
                                    "(no XPU IPC)";

using PoolId = decltype(at::xpu::graph_pool_handle());

struct XpuPool final : PoolState {
    int index;
    PoolId id;
    c10::xpu::XPUStream stream;
    XpuPool(int index_, PoolId id_, c10::xpu::XPUStream stream_)
        : index(index_), id(id_), stream(stream_)
    {
    }
};

struct XpuCallable final : FamilyState {
    uint8_t *block = nullptr; /* the caller's block: what the graphs copy from and to */
    std::optional<c10::xpu::XPUStream> stream;
    std::unique_ptr<at::xpu::XPUGraph> fwd, bwd;

    ~XpuCallable() override
    {
        try {
            if (stream)
                stream->synchronize();
        } catch (...) {
        }
        fwd.reset();
        bwd.reset();
    }
};

XpuCallable &state_of(Callable &c)
{
    auto *s = dynamic_cast<XpuCallable *>(c.family_state.get());
    if (s == nullptr)
        throw Error(GR_EINTERNAL, "XPU callable without its family state");
    return *s;
}

bool role_in(int role, std::initializer_list<int> roles)
{
    return std::find(roles.begin(), roles.end(), role) != roles.end();
}

/* Records (at capture) the copies of the static tensors of the given roles between the block and
 * the device twins, on the current stream (its queue records into the graph). */
void stage(Callable &c, XpuCallable &st, bool to_device, std::initializer_list<int> roles)
{
    sycl::queue &queue = c10::xpu::getCurrentXPUStream().queue();
    for (size_t k = 0; k < c.layout.size(); k++) {
        const gr_tensor_desc_t &d = c.layout[k];
        if (!role_in(d.role, roles) || d.nbytes == 0)
            continue;
        void *host = st.block + d.offset;
        void *dev = c.dev_views[k].data_ptr();
        if (to_device)
            queue.memcpy(dev, host, d.nbytes);
        else
            queue.memcpy(host, dev, d.nbytes);
    }
}

template <typename F>
std::unique_ptr<at::xpu::XPUGraph> capture_graph(const XpuPool &pool, F &&body)
{
    auto graph = std::make_unique<at::xpu::XPUGraph>();
    c10::StreamGuard guard(pool.stream);
    /* Device-wide, but every XPU call is synchronous and on one thread: only the preparation
     * (the engine's copies) is in flight, no other session's work. */
    c10::xpu::syncStreamsOnDevice(static_cast<c10::DeviceIndex>(pool.index)); /* sync-ok: above */
    graph->capture_begin(pool.id);
    try {
        body();
    } catch (...) {
        try {
            graph->capture_end();
        } catch (...) {
        }
        throw;
    }
    graph->capture_end();
    return graph;
}

const XpuPool &pool_of(PoolState *p)
{
    auto *pool = dynamic_cast<XpuPool *>(p);
    if (pool == nullptr)
        throw Error(GR_EINTERNAL, "XPU capture without an XPU pool");
    return *pool;
}

class XpuFamily final : public Family
{
  public:
    const char *kind() const override
    {
        return "xpu";
    }
    int device_count() const override
    {
        return static_cast<int>(c10::xpu::device_count());
    }
    c10::Device device(int index) const override
    {
        return c10::Device(c10::kXPU, static_cast<c10::DeviceIndex>(index));
    }
    std::unique_ptr<PoolState> make_pool(int index) const override
    {
        auto dev = static_cast<c10::DeviceIndex>(index);
        c10::DeviceGuard guard(c10::Device(c10::kXPU, dev));
        return std::make_unique<XpuPool>(index, at::xpu::graph_pool_handle(),
                                         c10::xpu::getStreamFromPool(false, dev));
    }
    /* Host-staged only: see the header comment. */
    void check_sharing(const std::string &device) const override
    {
        throw Error(GR_EUNSUPPORTED, "device-resident static tensors on " + device + ": " +
                                         XPU_IPC_MISSING + "; capture host-staged instead");
    }
    bool staged() const override
    {
        return true;
    }
    void bind(Callable &c, void *base, uint64_t /*bytes*/) const override
    {
        if (c.resident) /* check_sharing refused it at prepare */
            throw Error(GR_EINTERNAL, "device-resident XPU callable");
        auto st = std::make_unique<XpuCallable>();
        st->block = static_cast<uint8_t *>(base);
        c.family_state = std::move(st);
    }
    void warmup(int index, bool /*random*/, const std::function<void()> &body) const override
    {
        auto dev = static_cast<c10::DeviceIndex>(index);
        c10::DeviceGuard guard(c10::Device(c10::kXPU, dev));
        /* Device-wide (both), but every XPU call is synchronous and on one thread (replays wait for
         * their stream, no ordered replays), so the device runs this warm-up's work alone. */
        c10::xpu::syncStreamsOnDevice(dev); /* sync-ok: above */
        {
            c10::StreamGuard side(c10::xpu::getStreamFromPool(false, dev));
            body();
        }
        c10::xpu::syncStreamsOnDevice(dev); /* sync-ok: above */
    }
    void capture_forward(Callable &c, PoolState *pool) const override
    {
        const XpuPool &p = pool_of(pool);
        XpuCallable &st = state_of(c);
        st.stream = p.stream;
        st.fwd = capture_graph(p, [&] {
            stage(c, st, true, {GR_ROLE_INPUT, GR_ROLE_PARAM, GR_ROLE_BUFFER});
            run_forward(c);
            stage(c, st, false, {GR_ROLE_OUTPUT, GR_ROLE_BUFFER});
        });
    }
    void capture_backward(Callable &c, PoolState *pool) const override
    {
        const XpuPool &p = pool_of(pool);
        XpuCallable &st = state_of(c);
        st.bwd = capture_graph(p, [&] {
            stage(c, st, true, {GR_ROLE_GRAD_OUTPUT});
            run_backward(c);
            stage(c, st, false, {GR_ROLE_GRAD_INPUT, GR_ROLE_PARAM_GRAD});
        });
    }
    void replay_forward(Callable &c, const Order *order) const override
    {
        XpuCallable &st = state_of(c);
        replay(st, *st.fwd, order);
    }
    void replay_backward(Callable &c, const Order *order) const override
    {
        XpuCallable &st = state_of(c);
        if (!st.bwd)
            throw Error(GR_EPRECOND, "no backward graph");
        replay(st, *st.bwd, order);
    }

  private:
    /* Runs the graph on the pool's stream and waits for it. The engine lets no order through
     * (graphs are never device-resident here); one would be a bug. */
    static void replay(XpuCallable &st, at::xpu::XPUGraph &graph, const Order *order)
    {
        if (order != nullptr)
            throw Error(GR_EINTERNAL, "an ordered replay of a host-staged XPU graph");
        c10::StreamGuard guard(*st.stream);
        graph.replay();
        st.stream->synchronize();
    }
};

} // namespace

const Family &family_xpu()
{
    static const XpuFamily family;
    return family;
}

} // namespace gr

#endif /* GR_HAVE_XPU */
