/*
 * A bound on the host memory one call into a module may hold (gr_call_memory_max): captures and
 * replays run a client's code, and `torch.ones(6 << 28)` in a forward would otherwise take the
 * whole machine and get the process OOM-killed, with every other tenant's work in it.
 *
 * libtorch takes its CPU memory from one replaceable allocator. The runtime installs a wrapper
 * around it that does nothing unless the calling thread is inside a bounded call (CallMemoryBound,
 * an RAII guard at the capture and replay entry points). Inside one, each allocation is charged to
 * the call's budget and refused past the bound, as an allocation failure whose message names the
 * bound; each charged block carries its budget until it is freed, whenever and on whichever thread
 * that happens (activations saved by a FORWARD are freed by its BACKWARD), so the figure is what
 * the call's allocations still hold.
 *
 * Only the thread that makes the call is charged: kernels running on libtorch's intra-op threads
 * allocate rarely and are not. Device memory (CUDA) is bounded by pool limits, not here.
 */
#include "engine_int.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

/* libtorch 2.3 made Allocator::allocate non-const and added a pure copy_data. */
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define GR_ALLOCATE_CONST
#else
#define GR_ALLOCATE_CONST const
#endif

namespace
{

struct Budget {
    std::atomic<uint64_t> held{0};
    uint64_t limit = 0;
};

std::atomic<uint64_t> call_memory_max{0};
thread_local std::shared_ptr<Budget> current_budget;

/* Charged blocks, by address: the deleter finds its budget here. The blocks keep the base
 * allocator's layout (data pointer == context), so raw_allocate/raw_deallocate work on them. */
struct Charges {
    std::mutex mu;
    std::unordered_map<void *, std::pair<std::shared_ptr<Budget>, uint64_t>> blocks;
};

Charges &charges()
{
    static Charges *c = new Charges; /* never destroyed: blocks may be freed during exit */
    return *c;
}

c10::Allocator *base_allocator = nullptr;

void release_charged(void *ptr)
{
    if (ptr == nullptr)
        return;
    {
        Charges &c = charges();
        std::lock_guard<std::mutex> lock(c.mu);
        auto it = c.blocks.find(ptr);
        if (it != c.blocks.end()) {
            it->second.first->held.fetch_sub(it->second.second, std::memory_order_relaxed);
            c.blocks.erase(it);
        }
    }
    base_allocator->raw_deleter()(ptr);
}

class BoundedCPUAllocator final : public c10::Allocator
{
  public:
    c10::DataPtr allocate(size_t n) GR_ALLOCATE_CONST override
    {
        const std::shared_ptr<Budget> &b = current_budget;
        if (!b || n == 0)
            return base_allocator->allocate(n);
        uint64_t held = b->held.fetch_add(n, std::memory_order_relaxed) + n;
        if (held > b->limit) {
            b->held.fetch_sub(n, std::memory_order_relaxed);
            throw gr::Error(GR_ENOMEM, "not enough memory under the bound: this call would hold " +
                                           std::to_string(held) + " bytes of host memory, over " +
                                           std::to_string(b->limit) +
                                           " (max_call_memory_bytes); allocate less per call");
        }
        c10::DataPtr inner = base_allocator->allocate(n);
        if (inner.get() != inner.get_context() ||
            inner.get_deleter() != base_allocator->raw_deleter()) {
            b->held.fetch_sub(n, std::memory_order_relaxed); /* a layout we cannot follow */
            return inner;
        }
        void *data = inner.release_context();
        {
            Charges &c = charges();
            std::lock_guard<std::mutex> lock(c.mu);
            c.blocks[data] = {b, n};
        }
        return {data, data, &release_charged, c10::Device(c10::DeviceType::CPU)};
    }

    c10::DeleterFnPtr raw_deleter() const override
    {
        return &release_charged;
    }

    /* Pure in libtorch >= 2.3 (an override there), a plain member before. */
    void copy_data(void *dest, const void *src, std::size_t count) const
    {
        std::memcpy(dest, src, count);
    }
};

BoundedCPUAllocator bounded_allocator;

void install_once()
{
    static std::once_flag once;
    std::call_once(once, [] {
        base_allocator = c10::GetCPUAllocator();
        c10::SetCPUAllocator(&bounded_allocator, /*priority=*/10);
    });
}

} // namespace

namespace gr
{

CallMemoryBound::CallMemoryBound()
{
    uint64_t limit = call_memory_max.load(std::memory_order_relaxed);
    if (limit == 0 || current_budget) /* no bound, or inside a bounded call already */
        return;
    auto b = std::make_shared<Budget>();
    b->limit = limit;
    current_budget = std::move(b);
    active_ = true;
}

CallMemoryBound::~CallMemoryBound()
{
    if (active_)
        current_budget.reset();
}

} // namespace gr

extern "C" int gr_call_memory_max(uint64_t bytes)
{
    try {
        if (bytes != 0)
            install_once();
        call_memory_max.store(bytes, std::memory_order_relaxed);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_call_memory_max");
    }
}
