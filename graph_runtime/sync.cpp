/*
 * graph_runtime synchronisation accounting: how many host waits for device work the runtime made,
 * by scope (engine_int.h's note_sync), and the device frees it deferred; gr_sync_stats reads
 * them and gr_device_reclaim runs the deferred frees of one device (Family::reclaim).
 *
 * The rule it lets tests check: a capture, warm-up, replay, graph destruction or free waits only
 * for streams of its own, never for the whole device, whose other streams may be waiting for
 * another client's counters (docs/ARCHITECTURE.md, "Synchronisation").
 */
#include "engine_int.h"

#include <atomic>

namespace gr
{

namespace
{

std::atomic<uint64_t> device_waits{0}, stream_waits{0}, frees_deferred{0}, frees_done{0};

} // namespace

void note_sync(SyncScope scope)
{
    (scope == SyncScope::device ? device_waits : stream_waits)
        .fetch_add(1, std::memory_order_relaxed);
}

void note_free_deferred()
{
    frees_deferred.fetch_add(1, std::memory_order_relaxed);
}

void note_free_done(uint64_t n)
{
    frees_done.fetch_add(n, std::memory_order_relaxed);
}

} // namespace gr

extern "C" int gr_sync_stats(gr_sync_stats_t *out)
{
    if (out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_sync_stats: NULL out");
    out->device_waits = gr::device_waits.load(std::memory_order_relaxed);
    out->stream_waits = gr::stream_waits.load(std::memory_order_relaxed);
    out->frees_deferred = gr::frees_deferred.load(std::memory_order_relaxed);
    const uint64_t done = gr::frees_done.load(std::memory_order_relaxed);
    out->frees_pending = out->frees_deferred > done ? out->frees_deferred - done : 0;
    return GR_OK;
}

extern "C" int gr_device_reclaim(const char *device, int wait, uint64_t *pending)
{
    if (pending != nullptr)
        *pending = 0;
    try {
        if (device == nullptr)
            return gr__set_error(GR_EINVAL, "gr_device_reclaim: NULL device");
        gr::DeviceRef d = gr::parse_device(device);
        uint64_t left = d.family->reclaim(d.index, wait != 0);
        if (pending != nullptr)
            *pending = left;
        return GR_OK;
    } catch (const gr::Error &e) {
        return gr__set_errorf(e.code, "gr_device_reclaim: %s", e.what());
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_device_reclaim");
    }
}
