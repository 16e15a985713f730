/*
 * graph_runtime CPU family: libtorch on the host. There is no graph object on the CPU: capture
 * runs the engine's eager forward and backward once over the static tensors (so a capture fails
 * early when the static tensors do not work), and every replay runs them again.
 */
#include "engine_int.h"

namespace gr
{

namespace
{

class CpuFamily final : public Family
{
  public:
    const char *kind() const override
    {
        return "cpu";
    }
    int device_count() const override
    {
        return 1;
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
    void replay_forward(Callable &c) const override
    {
        run_forward(c);
    }
    void replay_backward(Callable &c) const override
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
