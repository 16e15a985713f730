/*
 * libze_graphd_test.so: a Level Zero driver for tests, backed by host memory, that Debian's real
 * loader (libze_loader.so.1, 1.8.12, spec 1.4) loads with
 *     ZE_ENABLE_ALT_DRIVERS=/abs/path/libze_graphd_test.so
 * Test code only: never installed, never linked directly (programs link -lze_loader).
 *
 * Memory. Every allocation (device, host, shared) is a memfd mapped MAP_SHARED, so another
 * process that maps the same file sees the same bytes. Device allocations count against the
 * device's memory (GRAPHD_ZE_TEST_MEM_MB); the count is per process, like a driver instance.
 *
 * IPC contract (memory and event pools), in the spirit of Intel's older drivers that put a
 * dma-buf fd number in the handle:
 *   - zeMemGetIpcHandle / zeEventPoolGetIpcHandle dup() the allocation's memfd and put the new
 *     fd number in the handle's first 4 bytes (gzt_ipc_handle_t below). That fd belongs to the
 *     handle: zeMemPutIpcHandle (spec 1.6, through zeDriverGetExtensionFunctionAddress) or
 *     zeEventPoolPutIpcHandle (idem) closes it; freeing the allocation or destroying the pool
 *     closes every fd its handles still hold.
 *   - An fd number means nothing in another process. The exporter passes the fd itself over a
 *     unix socket (SCM_RIGHTS) together with the 64 handle bytes; the importer writes the fd
 *     number it received into the handle's first 4 bytes and calls zeMemOpenIpcHandle /
 *     zeEventPoolOpenIpcHandle in its own context.
 *   - Open maps the fd and neither keeps nor closes it: the importer still owns the fd it
 *     received and may close it right after Open (the mapping keeps the memory alive).
 *     zeMemCloseIpcHandle / zeEventPoolCloseIpcHandle unmap.
 * Events live in their pool's memfd (one 32-bit word each), so a host signal in one process is
 * seen by a host synchronize in the other (futex on the shared page).
 *
 * Command lists are recorded and run synchronously on the host by zeCommandQueueExecuteCommandLists
 * (immediate lists run at append). A wait on an event nobody signals within GRAPHD_ZE_TEST_HANG_MS
 * ends the execute with ZE_RESULT_ERROR_DEVICE_LOST, as a hang check would.
 *
 * Knobs are environment variables read once, at the first zeInit (or the first table fetch, which
 * the loader does inside that zeInit); tests/ze_driver/README.md lists them.
 */
#ifndef ZE_GRAPHD_TEST_H
#define ZE_GRAPHD_TEST_H

#include <stdint.h>

#include <level_zero/ze_api.h>

/* The bytes of a ze_ipc_mem_handle_t / ze_ipc_event_pool_handle_t this driver produces. */
typedef struct {
    int32_t fd;      /* the memfd: the exporter's dup, or the importer's received fd */
    uint32_t magic;  /* GZT_IPC_MAGIC_MEM or GZT_IPC_MAGIC_POOL */
    uint64_t size;   /* bytes of the allocation (memory) or event count (pool) */
    uint32_t device; /* device index of the allocation; UINT32_MAX when unknown */
    uint32_t reserved;
    uint64_t id; /* allocation id in the exporting process */
} gzt_ipc_handle_t;

#define GZT_IPC_MAGIC_MEM 0x4d5a4447u  /* "GDZM" */
#define GZT_IPC_MAGIC_POOL 0x505a4447u /* "GDZP" */

/* Extension reachable only through zeDriverGetExtensionFunctionAddress, besides the spec 1.6
 * calls zeMemPutIpcHandle, zeEventPoolPutIpcHandle, zeMemGetFileDescriptorFromIpcHandleExp and
 * zeMemGetIpcHandleFromFileDescriptorExp: copies the device's index into *index. Under loader
 * interception hDevice must be translated with zelLoaderTranslateHandle(ZEL_HANDLE_DEVICE). */
#define GZT_EXT_DEVICE_INDEX "zexGraphdTestDeviceIndex"
typedef ze_result_t(ZE_APICALL *gzt_device_index_fn)(ze_device_handle_t hDevice, uint32_t *index);

#endif
