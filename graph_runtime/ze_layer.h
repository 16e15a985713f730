/*
 * ze_layer: the Level Zero device layer, graphd's view of Intel GPUs ("xpu:N"), in plain C over
 * the Level Zero loader (-lze_loader; Debian's libze1 1.8.12 implements spec 1.4). It finds the
 * GPU devices of every driver, reports their properties and Sysman telemetry, allocates device
 * memory that another process can map (regions), maps such memory in a client's own context, and
 * offers IPC event pools for ordering. No Level Zero type crosses this header.
 *
 * Numbering: xpu:N counts the GPU devices of every driver, drivers in zeDriverGet order, devices
 * in zeDeviceGet order. The layer makes one context per driver and does everything in it.
 *
 * Errors: every call that can fail returns 0 or a negative gr_err_t (runtime.h) and keeps a
 * message for the calling thread, read back with gr_last_error(), that names the call, the
 * ze_result_t, the device ("xpu:0 (name)") or driver, and what to do. The map:
 *   ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY, _OUT_OF_HOST_MEMORY   -> GR_ENOMEM (device and sizes)
 *   ZE_RESULT_ERROR_DEVICE_LOST                                -> GR_ELOST (the device named)
 *   ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, _UNSUPPORTED_VERSION  -> GR_EUNSUPPORTED
 *   ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE                       -> GR_EBUSY
 *   ZE_RESULT_NOT_READY (a wait that timed out)                -> GR_ETIMEDOUT
 *   ZE_RESULT_ERROR_UNINITIALIZED                              -> GR_EPRECOND
 *   ZE_RESULT_ERROR_INVALID_*, _UNSUPPORTED_SIZE/_ALIGNMENT    -> GR_EINVAL
 *   anything else                                              -> GR_EINTERNAL
 * Bad arguments caught by the layer itself (index out of range, NULL, unknown pointer) are
 * GR_EINVAL before any Level Zero call.
 *
 * Threads: every call may be made from any thread, concurrently, except gr_ze_open and
 * gr_ze_close: gr_ze_open may setenv() (ZES_ENABLE_SYSMAN), which races with any getenv() in the
 * process, so call it early, before other threads start; gr_ze_close must be the last call on
 * its gr_ze_t. The layer's own lists are under one mutex, never held across a driver call; device
 * copies and fills go through one immediate command list per device, serialised by a per-device
 * mutex held for the whole copy (a command list is not thread-safe), which nothing else takes; an
 * event pool may be used from several threads (Level Zero events are), but gr_ze_event_pool_close
 * must not race with other calls on the same pool.
 *
 * IPC model (memory and event pools). An exporter gets a gr_ze_ipc_t (the 64 bytes of the
 * driver's IPC handle) and an fd it owns (a CLOEXEC dup of the dma-buf/memfd fd the handle
 * carries). It sends both to the importer over a unix socket, the fd with SCM_RIGHTS, as graphd
 * already passes host regions. The importer writes the fd number it received into the handle's
 * first 4 bytes and opens the handle in its own context. This is the contract of Intel's older
 * drivers (and of tests/ze_driver). Intel's newer drivers instead put the exporter's pid and fd
 * number in the handle and have the importer fetch the fd with pidfd_getfd(2), which needs
 * ptrace access to the exporter and so fails across uids (a client is never allowed to ptrace
 * graphd): graphd does not use that mode; with such a driver gr_ze_alloc still works, and the
 * fd it passes is the one the handle names, but whether the driver's open accepts a handle
 * rewritten this way has never been run (docs/ARCHITECTURE.md, "Level Zero device layer").
 *
 * Lifetimes: memory stays mapped in an importer until gr_ze_unimport, even after the exporter's
 * gr_ze_free (the importer's mapping, like a dma-buf, keeps it); the device's accounting of that
 * memory is the driver's. Pool accounting is the caller's: gr_ze_telemetry's free/total let a
 * pool manager refuse early.
 */
#ifndef GRAPHD_ZE_LAYER_H
#define GRAPHD_ZE_LAYER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gr_ze gr_ze_t;
typedef struct gr_ze_event_pool gr_ze_event_pool_t;

#define GR_ZE_IPC_SIZE 64     /* bytes of a Level Zero IPC handle (ZE_MAX_IPC_HANDLE_SIZE) */
#define GR_ZE_EVENTS_MAX 4096 /* most events in one gr_ze_event_pool_t */
#define GR_ZE_DEVICES_MAX 64  /* most devices the layer lists (more are left out) */

/* The bytes of an exported allocation's or event pool's IPC handle, to send with the fd. */
typedef struct gr_ze_ipc {
    uint8_t data[GR_ZE_IPC_SIZE];
} gr_ze_ipc_t;

/*
 * Opens the layer: sets ZES_ENABLE_SYSMAN=1 unless it is set already (a "0" the caller set is
 * kept: Sysman is then absent), calls zeInit(ZE_INIT_FLAG_GPU_ONLY), lists the GPU devices of
 * every driver and creates one context per driver that has any. On failure *out is NULL, a
 * one-line reason is written to why (n bytes; may be NULL), also kept as gr_last_error(), and:
 *   - GR_EUNSUPPORTED when zeInit fails, reason "no Level Zero driver: zeInit answered
 *     ZE_RESULT_ERROR_UNINITIALIZED" (no driver installed, or none with a usable device). After
 *     a failed zeInit nothing else is called (the 1.8.12 loader may have unloaded the driver
 *     yet still point into it); a later gr_ze_open fails the same way.
 *   - GR_ENOTFOUND when the drivers list no GPU device ("no Level Zero GPU device: ...").
 *   - the mapped error of the first failing call otherwise (e.g. GR_ELOST when a context cannot
 *     be created on a lost device), the reason naming the call and driver.
 * The daemon logs the reason once, at info level, and lists no xpu device.
 */
int gr_ze_open(gr_ze_t **out, char *why, size_t n);
/* Destroys the contexts and command lists and frees ze. GR_EBUSY, and nothing released, while
 * allocations, imports or event pools of it live (free them first). NULL is a no-op. */
int gr_ze_close(gr_ze_t *ze);

/* Number of devices (xpu:0 .. xpu:count-1); 0 for NULL. */
unsigned gr_ze_count(const gr_ze_t *ze);

typedef struct gr_ze_device_info {
    char device[32];         /* "xpu:0" */
    char name[256];          /* the driver's name for it */
    uint8_t uuid[16];        /* ze_device_uuid_t */
    char uuid_hex[33];       /* the UUID as 32 lower-case hex digits */
    uint32_t vendor_id;      /* PCI vendor, 0x8086 for Intel */
    uint32_t device_id;      /* PCI device id */
    uint64_t total_bytes;    /* sum of totalSize over zeDeviceGetMemoryProperties */
    uint32_t compute_units;  /* slices x subslices per slice x EUs per subslice */
    uint32_t max_clock_mhz;  /* coreClockRate */
    uint32_t driver_index;   /* which driver (zeDriverGet order) */
    uint32_t driver_version; /* zeDriverGetProperties' driverVersion (driver-specific encoding) */
    uint32_t api_major;      /* the driver's API version (zeDriverGetApiVersion) */
    uint32_t api_minor;
    int ipc_memory;     /* 1: the driver exports memory (zeDriverGetIpcProperties) */
    int ipc_event_pool; /* 1: the driver exports event pools */
    int ipc_put;        /* 1: zeMemPutIpcHandle (spec 1.6) was found as an extension */
} gr_ze_device_info_t;

/* Copies device i's properties (read once at gr_ze_open) into *info. GR_EINVAL for i out of range
 * or a NULL argument. */
int gr_ze_info(const gr_ze_t *ze, unsigned i, gr_ze_device_info_t *info);

/* Values that Sysman has; each have_* is 1 when its value was read at this call, 0 when absent
 * (never a 0 standing in for "unknown"). */
typedef struct gr_ze_telemetry {
    int have_memory; /* free/total: zesMemoryGetState summed over the memory modules */
    uint64_t mem_free_bytes;
    uint64_t mem_total_bytes;
    int have_health;             /* the worst zes_mem_health_t of the modules, when one is known */
    int mem_health;              /* 1 ok, 2 degraded, 3 critical, 4 replace (zes_mem_health_t) */
    const char *mem_health_name; /* "ok", "degraded", "critical", "replace" */
    int have_engine;             /* engine group ALL (else COMPUTE_ALL): cumulative busy time */
    uint64_t engine_active_us;
    int have_utilisation; /* busy fraction of the engine between the previous call and this one */
    double utilisation;   /* 0..1; absent at the first call for a device */
    int have_reset;       /* zesDeviceGetState */
    int wedged;           /* 1: the device needs a reset (ZES_RESET_REASON_FLAG_WEDGED) */
} gr_ze_telemetry_t;

/* Reads device i's telemetry. It never waits for a copy or fill in flight, but Sysman reads
 * sysfs on real drivers (milliseconds): call it from a worker or a timer, not per request on the
 * daemon's loop. Sysman absent (the driver has none, or ZES_ENABLE_SYSMAN was not 1
 * at zeInit) leaves every value absent and returns 0; a Sysman call that fails only leaves its
 * value absent. GR_EINVAL for i out of range or NULL out. */
int gr_ze_telemetry(gr_ze_t *ze, unsigned i, gr_ze_telemetry_t *out);

/*
 * Exporter side of a region: zeMemAllocDevice of size bytes (64-byte aligned) on device i in the
 * layer's context, exported with zeMemGetIpcHandle. *ptr gets the device address, *ipc the
 * handle's bytes and *fd a CLOEXEC dup of the fd the handle carries (found with spec 1.6's
 * zeMemGetFileDescriptorFromIpcHandleExp where the driver offers it, else read from the handle's
 * first 4 bytes): the caller owns *fd, sends it with SCM_RIGHTS and closes it. Errors, nothing
 * left allocated: GR_EINVAL (i out of range, size 0, or size above what one allocation of the
 * device may be), GR_ENOMEM (the device is full: the message names the device, the size asked,
 * and free/total where Sysman has them), GR_ELOST, GR_EUNSUPPORTED (the driver has no memory
 * IPC, or its handle carries no fd here: the message names the driver).
 */
int gr_ze_alloc(gr_ze_t *ze, unsigned i, uint64_t size, void **ptr, int *fd, gr_ze_ipc_t *ipc);
/*
 * Frees an allocation of gr_ze_alloc: releases its IPC handle with zeMemPutIpcHandle (spec 1.6,
 * reached through zeDriverGetExtensionFunctionAddress, the context translated with
 * zelLoaderTranslateHandle when the loader intercepts), then zeMemFree. Without that extension
 * the handle is left to zeMemFree: drivers that close the handle's fd at free (tests/ze_driver,
 * Intel's drivers) leak nothing; one that does not would keep one fd per allocation, which the
 * layer cannot close itself (the fd is the driver's). Importers' mappings stay valid. GR_EINVAL
 * for a pointer that is not a live gr_ze_alloc allocation (freed twice, an import). When the put
 * fails the memory is still freed, and the put's error is returned.
 */
int gr_ze_free(gr_ze_t *ze, void *ptr);

/*
 * Importer side: maps an allocation another process exported, in this process's own context on
 * device i: fd is the fd received with SCM_RIGHTS (written into the handle's first 4 bytes),
 * size the allocation's size as the exporter sent it (checked against what the driver maps).
 * The caller keeps owning fd and may close it once this returns. GR_EINVAL for an fd that is not
 * open or not an exported allocation, or a size that does not match; GR_EUNSUPPORTED when the
 * driver has no memory IPC; GR_ELOST.
 */
int gr_ze_import(gr_ze_t *ze, unsigned i, const gr_ze_ipc_t *ipc, int fd, uint64_t size,
                 void **ptr);
/* Unmaps an import (zeMemCloseIpcHandle). GR_EINVAL for a pointer that is not a live import. */
int gr_ze_unimport(gr_ze_t *ze, void *ptr);

/* Synchronous copy and byte fill on device i through its immediate command list; either pointer
 * may be device memory (an allocation or an import of this layer) or host memory. The way to read
 * and write device memory, which the host cannot touch on real hardware. GR_EINVAL for NULL or
 * i out of range, GR_ELOST, and the driver's other errors mapped. */
int gr_ze_copy(gr_ze_t *ze, unsigned i, void *dst, const void *src, size_t size);
int gr_ze_fill(gr_ze_t *ze, unsigned i, void *dst, uint8_t byte, size_t size);

/*
 * IPC event pools: count events (1..GR_ZE_EVENTS_MAX) on device i, host-visible and exportable
 * (ZE_EVENT_POOL_FLAG_IPC | ZE_EVENT_POOL_FLAG_HOST_VISIBLE), all created at once. *fd and *ipc
 * as for gr_ze_alloc (the fd read from the handle's first 4 bytes; the caller owns the dup).
 * GR_EUNSUPPORTED when the driver has no event-pool IPC (named), GR_EINVAL, GR_ELOST, GR_ENOMEM.
 */
int gr_ze_event_pool_create(gr_ze_t *ze, unsigned i, uint32_t count, gr_ze_event_pool_t **out,
                            int *fd, gr_ze_ipc_t *ipc);
/* Opens another process's pool (its handle, the received fd, which the caller keeps owning, and
 * the count the exporter created it with, sent along: the handle's bytes are the driver's) in
 * this process's context on device i and creates its count events here. GR_EINVAL for an fd
 * that is not open or not an exported pool, or count out of range; GR_EUNSUPPORTED, GR_ELOST. */
int gr_ze_event_pool_open(gr_ze_t *ze, unsigned i, const gr_ze_ipc_t *ipc, int fd, uint32_t count,
                          gr_ze_event_pool_t **out);
/* Number of events in the pool; 0 for NULL. */
uint32_t gr_ze_event_pool_count(const gr_ze_event_pool_t *pool);
/* Destroys the events, then releases the pool: zeEventPoolPutIpcHandle (spec 1.6, as for
 * gr_ze_free) and zeEventPoolDestroy for a created pool, zeEventPoolCloseIpcHandle for an opened
 * one. A waiter in another process is not woken: signal first (gr_ze_events_signal_all). */
int gr_ze_event_pool_close(gr_ze_event_pool_t *pool);

/* Host-signals event idx (zeEventHostSignal). GR_EINVAL for idx out of range. */
int gr_ze_event_signal(gr_ze_event_pool_t *pool, uint32_t idx);
/* Host-signals every event of the pool, so no wait on it (in any process) hangs: the daemon calls
 * it at session end. Tries every event; returns the first error. */
int gr_ze_events_signal_all(gr_ze_event_pool_t *pool);
/* Resets event idx to not signalled (zeEventHostReset). */
int gr_ze_event_reset(gr_ze_event_pool_t *pool, uint32_t idx);
/* 1 when event idx is signalled, 0 when not (zeEventQueryStatus), or a negative error. */
int gr_ze_event_query(gr_ze_event_pool_t *pool, uint32_t idx);
/* Waits up to timeout_ns for event idx (zeEventHostSynchronize; UINT64_MAX waits for ever): 0 once
 * it is signalled, GR_ETIMEDOUT when the time ran out, GR_ELOST when the device is lost. */
int gr_ze_event_wait(gr_ze_event_pool_t *pool, uint32_t idx, uint64_t timeout_ns);

#ifdef __cplusplus
}
#endif

#endif
