/*
 * graph_runtime CPU family: libtorch on the host. There is no graph object on the CPU: capture
 * runs the engine's eager forward and backward once over the static tensors (so a capture fails
 * early when the static tensors do not work), and every replay runs them again.
 *
 * The CPU may be split into logical devices cpu:0..cpu:N-1 (gr_cpu_devices): each is the one c10
 * CPU device, so the split only names separate queues for the caller (the daemon runs one worker
 * thread per device); the cores and libtorch's intra-op threading stay shared.
 *
 * Random ops draw from libtorch's one default CPU generator. A callable that uses them carries
 * the client's generator state in its RNG_STATE tensor: each FORWARD swaps that state into the
 * generator, runs, writes the advanced state back and restores the daemon's own, all under
 * cpu_generator_mutex(), which every other draw of the runtime (warm-up and capture of such
 * callables, random sample args) holds too, so that no other device's worker draws in between.
 */
#include "engine_int.h"

#include <atomic>
#include <cstddef>
#include <cstring>

#include <ATen/CPUGeneratorImpl.h>

namespace gr
{

namespace
{

const int CPU_DEVICES_MAX = 64;
std::atomic<int> cpu_devices{1}; /* gr_cpu_devices */

/* The CPU generator's state as get_state() writes it and set_state() reads it (libtorch's
 * CPUGeneratorImplState, private to ATen/CPUGeneratorImpl.cpp and the same from torch 1.x to
 * 2.11): mirrored here to check a client's state before set_state reads it. */
struct CpuGeneratorState {
    uint64_t the_initial_seed;
    int left; /* draws until the next twist, 1..624 */
    int seeded;
    uint64_t next; /* index of the next word of state[] to read */
    uint64_t state[at::MERSENNE_STATE_N];
    double normal_x;
    double normal_y;
    double normal_rho;
    int normal_is_valid;
    float next_float_normal_sample;
    bool is_next_float_normal_sample_valid;
};

/* Bytes of the default CPU generator's state; GR_EUNSUPPORTED when this libtorch's layout is
 * not CpuGeneratorState (a client's state could not be checked). */
int64_t generator_state_bytes()
{
    static const int64_t bytes = [] {
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(gen.mutex());
        return gen.get_state().numel();
    }();
    if (bytes != static_cast<int64_t>(sizeof(CpuGeneratorState)))
        throw Error(GR_EUNSUPPORTED,
                    "this libtorch's CPU generator state has " + std::to_string(bytes) +
                        " bytes, not the " + std::to_string(sizeof(CpuGeneratorState)) +
                        " graphd can check: random ops cannot follow the client's generator");
    return bytes;
}

/* Why the bytes of state (a private copy of the client's RNG_STATE) would not make a valid
 * generator, or "" when they do. libtorch's set_state checks the size and that the mt19937
 * engine is seeded with left in [1, 624] and next <= 624, but not that left + next <= 625:
 * without that the engine reads past its 624 words before it next twists. Nor does it check the
 * bool it reads. */
std::string invalid_state(const at::Tensor &state)
{
    if (state.numel() != static_cast<int64_t>(sizeof(CpuGeneratorState)))
        return "it has " + std::to_string(state.numel()) + " bytes, not " +
               std::to_string(sizeof(CpuGeneratorState));
    const auto *bytes = static_cast<const uint8_t *>(state.data_ptr());
    CpuGeneratorState s;
    std::memcpy(&s, bytes, sizeof s); /* the bool member is read from bytes below, never from s */
    const int64_t n = at::MERSENNE_STATE_N;
    if (s.seeded == 0)
        return "the engine is not seeded";
    if (s.left < 1 || s.left > n || s.next > static_cast<uint64_t>(n) ||
        s.left + static_cast<int64_t>(s.next) > n + 1)
        return "the mt19937 position (left " + std::to_string(s.left) + ", next " +
               std::to_string(s.next) + ") is out of range";
    if (bytes[offsetof(CpuGeneratorState, is_next_float_normal_sample_valid)] > 1)
        return "the cached normal sample's flag is not a bool";
    return "";
}

/* The client's state swapped into the default CPU generator for the lifetime of the object,
 * the daemon's own put back at its end; the caller holds cpu_generator_mutex(). The generator's
 * own mutex is held around get_state and set_state, as libtorch's Python bindings do, and not
 * in between: the random ops take it themselves. */
class GeneratorSwap
{
  public:
    /* GR_EINVAL, the generator untouched, when state is not valid (what names the tensor). */
    GeneratorSwap(const at::Tensor &state, const std::string &what)
        : gen_(at::detail::getDefaultCPUGenerator())
    {
        std::string why = invalid_state(state);
        if (!why.empty())
            throw Error(GR_EINVAL, what + " is not a valid CPU generator state: " + why);
        std::lock_guard<std::mutex> lock(gen_.mutex());
        saved_ = gen_.get_state();
        try {
            gen_.set_state(state);
        } catch (const std::exception &e) {
            throw Error(GR_EINVAL, what + " is not a valid CPU generator state: " + message_of(e));
        }
    }
    ~GeneratorSwap()
    {
        try {
            std::lock_guard<std::mutex> lock(gen_.mutex());
            gen_.set_state(saved_);
        } catch (...) { /* saved_ came from get_state: set_state does not refuse it */
        }
    }
    GeneratorSwap(const GeneratorSwap &) = delete;
    GeneratorSwap &operator=(const GeneratorSwap &) = delete;
    /* The generator's state now (the client's, advanced by what ran since). */
    at::Tensor state()
    {
        std::lock_guard<std::mutex> lock(gen_.mutex());
        return gen_.get_state();
    }

  private:
    at::Generator gen_;
    at::Tensor saved_;
};

/* A callable with an RNG_STATE: where a FORWARD copies the client's state before checking it
 * (the client's memory may change while libtorch reads it). Made once: a clone per replay cost
 * microseconds. */
struct CpuCallable final : FamilyState {
    at::Tensor state;
};

/* Holds cpu_generator_mutex() when the callable (or capture) draws random numbers. */
std::unique_lock<std::mutex> lock_if(bool random)
{
    return random ? std::unique_lock<std::mutex>(cpu_generator_mutex())
                  : std::unique_lock<std::mutex>();
}

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
    std::optional<RngStateSpec> rng_state() const override
    {
        return RngStateSpec{"cpu", at::kByte, {generator_state_bytes()}};
    }
    /* The RNG_STATE tensor starts as the daemon generator's state: valid, so that a client that
     * never writes it still gets random numbers that advance from FORWARD to FORWARD. */
    void bind(Callable &c, void * /*base*/, uint64_t /*bytes*/) const override
    {
        if (!c.rng_state.defined())
            return;
        auto st = std::make_unique<CpuCallable>();
        st->state = at::empty_like(c.rng_state);
        c.family_state = std::move(st);
        std::lock_guard<std::mutex> lock(cpu_generator_mutex());
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> gen_lock(gen.mutex());
        c.rng_state.copy_(gen.get_state());
    }
    /* Warm-up and capture draw from the daemon's generator (their random numbers are never
     * seen), under the lock all the same, so as not to draw inside another device's replay. */
    void warmup(int /*index*/, bool random, const std::function<void()> &body) const override
    {
        auto lock = lock_if(random);
        body();
    }
    void capture_forward(Callable &c, PoolState * /*pool*/) const override
    {
        auto lock = lock_if(c.random);
        run_forward(c);
    }
    void capture_backward(Callable &c, PoolState * /*pool*/) const override
    {
        run_backward(c);
    }
    void replay_forward(Callable &c, const Order * /*order*/) const override
    {
        if (!c.rng_state.defined()) {
            run_forward(c);
            return;
        }
        auto *st = dynamic_cast<CpuCallable *>(c.family_state.get());
        if (st == nullptr)
            throw Error(GR_EINTERNAL, "CPU callable with an rng_state but no family state");
        const size_t bytes = c.rng_state.nbytes();
        std::lock_guard<std::mutex> lock(cpu_generator_mutex());
        std::memcpy(st->state.data_ptr(), c.rng_state.data_ptr(), bytes);
        GeneratorSwap swap(st->state, "rng_state tensor '" + c.rng->name + "'");
        run_forward(c);
        const at::Tensor advanced = swap.state();
        if (advanced.nbytes() != bytes)
            throw Error(GR_EINTERNAL, "the generator's state changed size during the replay");
        std::memcpy(c.rng_state.data_ptr(), advanced.data_ptr(), bytes);
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

std::mutex &cpu_generator_mutex()
{
    static std::mutex mu;
    return mu;
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
