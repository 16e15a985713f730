/*
 * graph_runtime device memory and ordering primitives, device-neutral: gr_device_alloc/free,
 * gr_event_* and gr_seq_* resolve their device through the family table (gr::parse_device) and
 * call that family's member; an event or counters object carries its family for the calls that
 * take it. What each family does is in its family_<kind>.cpp (CUDA: family_cuda.cpp); a family
 * without device memory of its own answers GR_EUNSUPPORTED (the Family defaults, engine.cpp).
 */
#include "engine_int.h"

namespace
{

/* Runs body (which returns a gr_err_t) with device resolved; a device that does not resolve, or
 * an exception, comes back as its code with the message set. */
template <typename F> int on_device(const char *fn, const char *device, F &&body)
{
    try {
        if (device == nullptr)
            return gr__set_errorf(GR_EINVAL, "%s: NULL device", fn);
        gr::DeviceRef d = gr::parse_device(device);
        return body(d);
    } catch (const gr::Error &e) {
        return gr__set_errorf(e.code, "%s: %s", fn, e.what());
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown(fn);
    }
}

} // namespace

extern "C" int gr_device_alloc(const char *device, uint64_t bytes, void **ptr,
                               uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    if (ptr == nullptr || handle == nullptr)
        return gr__set_error(GR_EINVAL, "gr_device_alloc: NULL argument");
    *ptr = nullptr;
    return on_device("gr_device_alloc", device, [&](const gr::DeviceRef &d) {
        if (bytes == 0)
            return gr__set_error(GR_EINVAL, "gr_device_alloc: 0 bytes");
        return d.family->alloc(d.index, d.name.c_str(), bytes, ptr, handle);
    });
}

extern "C" int gr_device_free(const char *device, void *ptr)
{
    if (ptr == nullptr)
        return GR_OK;
    return on_device("gr_device_free", device, [&](const gr::DeviceRef &d) {
        return d.family->free(d.index, d.name.c_str(), ptr);
    });
}

extern "C" int gr_event_create(const char *device, gr_event_t **out,
                               uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    if (out != nullptr)
        *out = nullptr;
    if (handle == nullptr || out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_event_create: NULL argument");
    return on_device("gr_event_create", device, [&](const gr::DeviceRef &d) {
        return d.family->event_create(d.index, d.name.c_str(), out, handle);
    });
}

extern "C" int gr_event_open(const char *device, const uint8_t handle[GR_IPC_HANDLE_SIZE],
                             gr_event_t **out)
{
    if (out != nullptr)
        *out = nullptr;
    if (handle == nullptr || out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_event_open: NULL argument");
    return on_device("gr_event_open", device, [&](const gr::DeviceRef &d) {
        return d.family->event_open(d.index, d.name.c_str(), handle, out);
    });
}

extern "C" int gr_event_destroy(gr_event_t *e)
{
    if (e == nullptr)
        return GR_OK;
    e->family->event_destroy(e);
    return GR_OK;
}

extern "C" int gr_seq_create(const char *device, gr_seq_t **out, uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    if (out != nullptr)
        *out = nullptr;
    if (handle == nullptr || out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_seq_create: NULL argument");
    return on_device("gr_seq_create", device, [&](const gr::DeviceRef &d) {
        return d.family->seq_create(d.index, d.name.c_str(), out, handle);
    });
}

extern "C" int gr_seq_skip(gr_seq_t *s, uint64_t n)
{
    if (s == nullptr || n == 0)
        return gr__set_error(GR_EINVAL, "gr_seq_skip: NULL counters or sequence 0");
    return s->family->seq_skip(s, n);
}

extern "C" int gr_seq_release(gr_seq_t *s)
{
    if (s == nullptr)
        return gr__set_error(GR_EINVAL, "gr_seq_release: NULL counters");
    return s->family->seq_release(s);
}

extern "C" int gr_seq_destroy(gr_seq_t *s)
{
    if (s == nullptr)
        return GR_OK;
    s->family->seq_destroy(s);
    return GR_OK;
}
