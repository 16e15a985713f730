/*
 * graph_runtime device memory for device-resident captures (gr_device_alloc / gr_device_free)
 * and the interprocess events that order replays against a client's stream (gr_event_*).
 * Plain cudaMalloc (never libtorch's caching allocator: a block carved out of a larger cached
 * segment could not be exported at offset 0, and would outlive our free) and a CUDA IPC handle
 * for the client. Without the CUDA family (the CPU build) both are GR_EUNSUPPORTED.
 */
#include "runtime_int.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <dlfcn.h>

#ifdef GR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace
{

/* "cuda:N" (or "cuda") => N; -1 when device is not a CUDA device name. */
int cuda_index(const char *device)
{
    if (device == nullptr || std::strncmp(device, "cuda", 4) != 0)
        return -1;
    const char *p = device + 4;
    if (*p == '\0')
        return 0;
    if (*p != ':' || p[1] < '0' || p[1] > '9')
        return -1;
    char *end = nullptr;
    long n = std::strtol(p + 1, &end, 10);
    if (*end != '\0' || n < 0 || n > 65535)
        return -1;
    return static_cast<int>(n);
}

#ifdef GR_HAVE_CUDA
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

int cuda_fail(cudaError_t err, const char *what, const char *device)
{
    (void)cudaGetLastError(); /* clear it, so later calls on this thread do not see it */
    return gr__set_errorf(err == cudaErrorMemoryAllocation ? GR_ENOMEM
                          : err == cudaErrorInvalidDevice  ? GR_ENOTFOUND
                                                           : GR_EINTERNAL,
                          "%s on %s: %s", what, device, cudaGetErrorString(err));
}
#endif

} // namespace

extern "C" int gr_device_alloc(const char *device, uint64_t bytes, void **ptr,
                               uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    if (ptr == nullptr || handle == nullptr)
        return gr__set_error(GR_EINVAL, "gr_device_alloc: NULL argument");
    *ptr = nullptr;
    int index = cuda_index(device);
    if (index < 0)
        return gr__set_errorf(GR_EINVAL, "gr_device_alloc: '%s' is not a CUDA device",
                              device ? device : "(null)");
    if (bytes == 0)
        return gr__set_error(GR_EINVAL, "gr_device_alloc: 0 bytes");
#ifdef GR_HAVE_CUDA
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
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaMalloc", device);
    cudaIpcMemHandle_t h;
    err = cudaIpcGetMemHandle(&h, p);
    if (err != cudaSuccess) {
        int rc = cuda_fail(err, "cudaIpcGetMemHandle", device);
        (void)cudaFree(p);
        return rc;
    }
    std::memcpy(handle, &h, GR_IPC_HANDLE_SIZE);
    *ptr = p;
    return GR_OK;
#else
    return gr__set_errorf(GR_EUNSUPPORTED, "gr_device_alloc: the CUDA family is not built into "
                                           "this graph_runtime");
#endif
}

extern "C" int gr_device_free(const char *device, void *ptr)
{
    if (ptr == nullptr)
        return GR_OK;
    int index = cuda_index(device);
    if (index < 0)
        return gr__set_errorf(GR_EINVAL, "gr_device_free: '%s' is not a CUDA device",
                              device ? device : "(null)");
#ifdef GR_HAVE_CUDA
    DeviceScope scope(index);
    if (scope.err != cudaSuccess)
        return cuda_fail(scope.err, "cudaSetDevice", device);
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaFree", device);
    return GR_OK;
#else
    return gr__set_errorf(GR_EUNSUPPORTED, "gr_device_free: the CUDA family is not built into "
                                           "this graph_runtime");
#endif
}

/* ---- interprocess events -------------------------------------------------------------------- */

namespace
{

/* The CUDA index of device for fn into *index: GR_OK, or the error (set). */
int event_device(const char *fn, const char *device, int *index)
{
    *index = cuda_index(device);
    if (*index < 0)
        return gr__set_errorf(GR_EINVAL, "%s: '%s' is not a CUDA device", fn,
                              device ? device : "(null)");
#ifdef GR_HAVE_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || *index >= count) {
        (void)cudaGetLastError();
        return gr__set_errorf(GR_ENOTFOUND, "%s: no device %s", fn, device);
    }
    return GR_OK;
#else
    return gr__set_errorf(GR_EUNSUPPORTED,
                          "%s: the CUDA family is not built into this graph_runtime", fn);
#endif
}

#ifdef GR_HAVE_CUDA
/* *out = a new gr_event_t owning ev, which is destroyed if that fails. */
int wrap_event(const char *fn, int index, cudaEvent_t ev, int opened, gr_event_t **out)
{
    auto *e = new (std::nothrow) gr_event_t{index, ev, opened};
    if (e == nullptr) {
        (void)cudaEventDestroy(ev);
        return gr__set_errorf(GR_ENOMEM, "%s: out of memory", fn);
    }
    *out = e;
    return GR_OK;
}
#endif

} // namespace

extern "C" int gr_event_create(const char *device, gr_event_t **out,
                               uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    if (out != nullptr)
        *out = nullptr;
    if (handle == nullptr || out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_event_create: NULL argument");
    int index = -1;
    int rc = event_device("gr_event_create", device, &index);
    if (rc != GR_OK)
        return rc;
#ifdef GR_HAVE_CUDA
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
#else
    (void)index;
    return GR_EUNSUPPORTED; /* not reached: event_device refused */
#endif
}

extern "C" int gr_event_open(const char *device, const uint8_t handle[GR_IPC_HANDLE_SIZE],
                             gr_event_t **out)
{
    if (out != nullptr)
        *out = nullptr;
    if (handle == nullptr || out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_event_open: NULL argument");
    int index = -1;
    int rc = event_device("gr_event_open", device, &index);
    if (rc != GR_OK)
        return rc;
#ifdef GR_HAVE_CUDA
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
#else
    (void)index;
    return GR_EUNSUPPORTED; /* not reached: event_device refused */
#endif
}

extern "C" int gr_event_destroy(gr_event_t *e)
{
    if (e == nullptr)
        return GR_OK;
#ifdef GR_HAVE_CUDA
    {
        DeviceScope scope(e->device);
        if (cudaEventDestroy(static_cast<cudaEvent_t>(e->event)) != cudaSuccess)
            (void)cudaGetLastError(); /* the context may be gone at exit: nothing to free */
    }
#endif
    delete e;
    return GR_OK;
}

/* ---- sequence counters (CUDA stream memory operations) -------------------------------------- */

namespace
{

#ifdef GR_HAVE_CUDA
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

uint8_t *seq_bytes(const gr_seq_t *s)
{
    return static_cast<uint8_t *>(s->mem);
}
#endif

} // namespace

extern "C" int gr__stream_wait_geq(void *stream, const void *addr, uint64_t value)
{
#ifdef GR_HAVE_CUDA
    const StreamOps &ops = stream_ops();
    if (ops.wait == nullptr)
        return -1;
    return ops.wait(stream, reinterpret_cast<uintptr_t>(addr), value, CU_STREAM_WAIT_VALUE_GEQ_);
#else
    (void)stream, (void)addr, (void)value;
    return -1;
#endif
}

extern "C" int gr__stream_write(void *stream, void *addr, uint64_t value)
{
#ifdef GR_HAVE_CUDA
    const StreamOps &ops = stream_ops();
    if (ops.write == nullptr)
        return -1;
    return ops.write(stream, reinterpret_cast<uintptr_t>(addr), value,
                     CU_STREAM_WRITE_VALUE_DEFAULT_);
#else
    (void)stream, (void)addr, (void)value;
    return -1;
#endif
}

extern "C" int gr_seq_create(const char *device, gr_seq_t **out, uint8_t handle[GR_IPC_HANDLE_SIZE])
{
    if (out != nullptr)
        *out = nullptr;
    if (handle == nullptr || out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_seq_create: NULL argument");
    int index = -1;
    int rc = event_device("gr_seq_create", device, &index);
    if (rc != GR_OK)
        return rc;
#ifdef GR_HAVE_CUDA
    if (stream_ops().wait == nullptr)
        return gr__set_errorf(GR_EUNSUPPORTED,
                              "gr_seq_create: the CUDA driver has no cuStreamWaitValue64");
    void *mem = nullptr;
    rc = gr_device_alloc(device, GR_SEQ_BYTES, &mem, handle);
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
        (void)cudaFree(mem);
        return rc;
    }
    auto *s = new (std::nothrow) gr_seq_t{index, mem, stream};
    if (s == nullptr) {
        (void)cudaStreamDestroy(stream);
        (void)cudaFree(mem);
        return gr__set_error(GR_ENOMEM, "gr_seq_create: out of memory");
    }
    *out = s;
    return GR_OK;
#else
    (void)index;
    return GR_EUNSUPPORTED; /* not reached: event_device refused */
#endif
}

extern "C" int gr_seq_skip(gr_seq_t *s, uint64_t n)
{
    if (s == nullptr || n == 0)
        return gr__set_error(GR_EINVAL, "gr_seq_skip: NULL counters or sequence 0");
#ifdef GR_HAVE_CUDA
    DeviceScope scope(s->device);
    int err = gr__stream_wait_geq(s->stream, seq_bytes(s) + GR_SEQ_DONE_OFFSET, n - 1);
    if (err == 0)
        err = gr__stream_write(s->stream, seq_bytes(s) + GR_SEQ_DONE_OFFSET, n);
    if (err != 0)
        return gr__set_errorf(GR_EINTERNAL, "gr_seq_skip on cuda:%d: CUresult %d", s->device, err);
    return GR_OK;
#else
    return GR_EUNSUPPORTED;
#endif
}

extern "C" int gr_seq_release(gr_seq_t *s)
{
    if (s == nullptr)
        return gr__set_error(GR_EINVAL, "gr_seq_release: NULL counters");
#ifdef GR_HAVE_CUDA
    /* A stream of its own: the counters' stream may itself wait (gr_seq_skip) behind the very
     * replay this is to unblock. */
    DeviceScope scope(s->device);
    cudaStream_t stream = nullptr;
    cudaError_t cerr = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (cerr != cudaSuccess)
        return cuda_fail(cerr, "gr_seq_release: cudaStreamCreateWithFlags", "the counters' device");
    int err = gr__stream_write(stream, seq_bytes(s) + GR_SEQ_READY_OFFSET, GR_SEQ_RELEASED);
    if (err == 0)
        err = gr__stream_write(stream, seq_bytes(s) + GR_SEQ_DONE_OFFSET, GR_SEQ_RELEASED);
    (void)cudaStreamDestroy(stream); /* returns at once; the writes still run */
    if (err != 0)
        return gr__set_errorf(GR_EINTERNAL, "gr_seq_release on cuda:%d: CUresult %d", s->device,
                              err);
    return GR_OK;
#else
    return GR_EUNSUPPORTED;
#endif
}

extern "C" int gr_seq_destroy(gr_seq_t *s)
{
    if (s == nullptr)
        return GR_OK;
#ifdef GR_HAVE_CUDA
    {
        DeviceScope scope(s->device);
        auto stream = static_cast<cudaStream_t>(s->stream);
        if (cudaStreamSynchronize(stream) != cudaSuccess ||
            cudaStreamDestroy(stream) != cudaSuccess)
            (void)cudaGetLastError();
        if (cudaFree(s->mem) != cudaSuccess)
            (void)cudaGetLastError(); /* the context may be gone at exit */
    }
#endif
    delete s;
    return GR_OK;
}
