/*
 * Device regions in the client: the CUDA runtime, loaded at run time only when the daemon hands
 * out device memory (a MAP reply carrying a CUDA IPC handle), so that libgraphd neither links
 * against CUDA nor opens a CUDA context for host regions. In a process that already uses CUDA
 * (PyTorch), dlopen finds the runtime it has loaded, so the handle opens in the same context.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd_int.h"

/* cudaIpcMemHandle_t: 64 opaque bytes, passed by value. */
typedef struct {
    char reserved[GRAPHD__IPC_HANDLE_SIZE];
} ipc_handle_t;

static struct {
    pthread_once_t once;
    char error[256];
    int (*set_device)(int);
    int (*get_device)(int *);
    int (*ipc_open)(void **, ipc_handle_t, unsigned int);
    int (*ipc_close)(void *);
    int (*device_synchronize)(void);
    const char *(*error_string)(int);
} rt = {.once = PTHREAD_ONCE_INIT};

#define CUDA_IPC_LAZY_ENABLE_PEER_ACCESS 1u /* cudaIpcMemLazyEnablePeerAccess */

static void load_runtime(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && h == NULL; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        const char *why = dlerror();
        snprintf(rt.error, sizeof(rt.error),
                 "cannot load the CUDA runtime (libcudart.so.13, .12 or .so): %s",
                 why ? why : "not found");
        return;
    }
    rt.set_device = (int (*)(int))dlsym(h, "cudaSetDevice");
    rt.get_device = (int (*)(int *))dlsym(h, "cudaGetDevice");
    rt.ipc_open = (int (*)(void **, ipc_handle_t, unsigned int))dlsym(h, "cudaIpcOpenMemHandle");
    rt.ipc_close = (int (*)(void *))dlsym(h, "cudaIpcCloseMemHandle");
    rt.device_synchronize = (int (*)(void))dlsym(h, "cudaDeviceSynchronize");
    rt.error_string = (const char *(*)(int))dlsym(h, "cudaGetErrorString");
    if (!rt.set_device || !rt.get_device || !rt.ipc_open || !rt.ipc_close ||
        !rt.device_synchronize) {
        snprintf(rt.error, sizeof(rt.error), "the CUDA runtime lacks cudaIpcOpenMemHandle & co.");
        rt.ipc_open = NULL;
    }
}

static const char *cuda_str(int err)
{
    return rt.error_string ? rt.error_string(err) : "CUDA error";
}

int graphd__cuda_index(const char *device)
{
    if (device == NULL || strncmp(device, "cuda", 4) != 0)
        return -1;
    if (device[4] == '\0')
        return 0;
    if (device[4] != ':' || device[5] < '0' || device[5] > '9')
        return -1;
    char *end = NULL;
    long n = strtol(device + 5, &end, 10);
    return (*end == '\0' && n >= 0 && n < 65536) ? (int)n : -1;
}

int graphd__cuda_open(graphd_client_t *c, int device, const uint8_t *handle, void **ptr)
{
    pthread_once(&rt.once, load_runtime);
    if (rt.ipc_open == NULL)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "device region: %s", rt.error);
    ipc_handle_t h;
    memcpy(h.reserved, handle, sizeof(h.reserved));
    int prev = -1;
    if (rt.get_device(&prev) != 0)
        prev = -1;
    if (device < 0)
        device = prev >= 0 ? prev : 0;
    int err = prev == device ? 0 : rt.set_device(device);
    if (err != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "cudaSetDevice(%d): %s", device,
                            cuda_str(err));
    void *p = NULL;
    err = rt.ipc_open(&p, h, CUDA_IPC_LAZY_ENABLE_PEER_ACCESS);
    if (prev >= 0 && prev != device)
        (void)rt.set_device(prev);
    if (err != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                            "cudaIpcOpenMemHandle on cuda:%d: %s (is this process on the daemon's "
                            "machine, with that GPU visible?)",
                            device, cuda_str(err));
    *ptr = p;
    return GRAPHD_OK;
}

void graphd__cuda_close(int device, void *ptr)
{
    if (ptr == NULL || rt.ipc_close == NULL)
        return;
    int prev = -1;
    if (rt.get_device(&prev) != 0)
        prev = -1;
    if (prev != device)
        (void)rt.set_device(device);
    /* Work the caller queued on the memory (an optimizer step) must finish before it goes. */
    (void)rt.device_synchronize();
    (void)rt.ipc_close(ptr);
    if (prev >= 0 && prev != device)
        (void)rt.set_device(prev);
}
