/*
 * graph_runtime CPU family: libtorch on the host. There is no graph object on the CPU: capture
 * runs the engine's eager forward and backward once over the static tensors (so a capture fails
 * early when the static tensors do not work), and every replay runs them again.
 *
 * The CPU may be split into logical devices cpu:0..cpu:N-1 (gr_cpu_devices): each is the one c10
 * CPU device, so the split only names separate queues for the caller (the daemon runs one worker
 * thread per device); the cores and libtorch's intra-op threading stay shared.
 */
#include "engine_int.h"

#include <atomic>

namespace gr
{

namespace
{

const int CPU_DEVICES_MAX = 64;
std::atomic<int> cpu_devices{1}; /* gr_cpu_devices */

class CpuFamily final : public Family
{
  public:
    const char *kind() const override
    {
        return "cpu";
    }
    int device_count() const override
    {
        return cpu_devices.load(std::memory_order_relaxed);
    }
    c10::Device device(int /*index*/) const override
    {
        return c10::Device(c10::kCPU);
    }
    std::unique_ptr<PoolState> make_pool(int /*index*/) const override
    {
        return nullptr; /* static tensors live in the caller's blocks; intermediates on the heap */
    }
    void warmup(int /*index*/, const std::function<void()> &body) const override
    {
        body();
    }
    void capture_forward(Callable &c, PoolState * /*pool*/) const override
    {
        run_forward(c);
    }
    void capture_backward(Callable &c, PoolState * /*pool*/) const override
    {
        run_backward(c);
    }
    void replay_forward(Callable &c, const Order * /*order*/) const override
    {
        run_forward(c);
    }
    void replay_backward(Callable &c, const Order * /*order*/) const override
    {
        run_backward(c);
    }
};

} // namespace

const Family &family_cpu()
{
    static const CpuFamily family;
    return family;
}

} // namespace gr

extern "C" int gr_cpu_devices(int n)
{
    try {
        if (n < 1 || n > gr::CPU_DEVICES_MAX)
            return gr__set_errorf(GR_EINVAL, "gr_cpu_devices: %d is outside [1, %d]", n,
                                  gr::CPU_DEVICES_MAX);
        gr::cpu_devices.store(n, std::memory_order_relaxed);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_cpu_devices");
    }
}
