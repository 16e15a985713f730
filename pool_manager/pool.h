/*
 * pool_manager: named memory pools on a device and the shared regions carved
 * from them. A host region is one memfd (sealed against shrinking and
 * growing), mapped here and passed to its owner session. A device region is a
 * block of device memory the caller allocated and exported (CUDA IPC, or Level
 * Zero IPC with an fd the region keeps):
 * the manager accounts for it like a host region and hands it back to the
 * manager's device-free hook when it is freed. Pure C, no gRPC and no libuv:
 * the daemon's loop thread is the only caller, so nothing locks.
 */
#ifndef GRAPHD_POOL_H
#define GRAPHD_POOL_H

#include <stddef.h>
#include <stdint.h>

#define PM_NAME_MAX 63
#define PM_IPC_HANDLE_SIZE 64 /* bytes of a device region's IPC handle */

/* Errors: name, value, message, and the gRPC status code the daemon answers them with (the
 * numbers of grpc_status_code). */
#define PM_ERR_MAP(X)                                                                              \
    X(OK, 0, "success", 0)                                                                         \
    X(EINVAL, -1, "invalid argument", 3)                                                           \
    X(ENOENT, -2, "no such pool or region", 5)                                                     \
    X(EEXIST, -3, "pool already exists", 6)                                                        \
    X(ELIMIT, -4, "pool byte limit exceeded", 8)                                                   \
    X(EBUSY, -5, "pool still holds regions", 9)                                                    \
    X(ENOMEM, -6, "out of memory", 8)                                                              \
    X(ESYS, -7, "system call failed", 13)                                                          \
    X(EPERM, -8, "region belongs to another session", 7)

typedef enum {
#define PM_ERR_ENUM(name, value, msg, grpc) PM_##name = value,
    PM_ERR_MAP(PM_ERR_ENUM)
#undef PM_ERR_ENUM
} pm_err_t;

const char *pm_strerror(int err);
/* The gRPC status code for an error (the table's last column; INTERNAL outside the map). */
int pm_err_grpc(int err);
const char *pm_err_name(int err);

typedef struct pm_manager pm_manager_t;
typedef struct pm_pool pm_pool_t;
typedef struct pm_region pm_region_t;

/* Who may use a pool (pm_pool_may_use): its owner's uid, also its gid, or anyone. */
typedef enum { PM_MODE_PRIVATE = 1, PM_MODE_GROUP = 2, PM_MODE_PUBLIC = 3 } pm_mode_t;

/* A pool's owner, as the daemon sets it (pm_pool_set_owner); the manager only keeps it and
 * answers pm_pool_may_use. A new pool has {0, 0, PM_MODE_PUBLIC, 0}. */
typedef struct pm_pool_owner {
    uint32_t uid, gid;
    int mode;         /* pm_mode_t */
    uint64_t session; /* nonzero: the pool goes when that session ends (the caller deletes it) */
} pm_pool_owner_t;

typedef struct pm_pool_info {
    const char *name;        /* owned by the pool */
    const char *device;      /* owned by the pool */
    uint64_t limit_bytes;    /* 0: none */
    uint64_t reserved_bytes; /* page-rounded size of live regions */
    uint64_t used_bytes;     /* sizes asked for by live regions */
    uint32_t regions;
    uint32_t sessions; /* distinct owners with a live region */
    uint64_t created_unix_ms;
    pm_pool_owner_t owner;
} pm_pool_info_t;

typedef struct pm_usage {
    uint32_t regions;
    uint64_t bytes; /* page-rounded */
} pm_usage_t;

/* Creates an empty manager. max_region_bytes bounds a single region (0: no bound). */
int pm_manager_create(uint64_t max_region_bytes, pm_manager_t **out);
/* Frees the manager and its empty pools. PM_EBUSY, and nothing freed, while a region lives. */
int pm_manager_destroy(pm_manager_t *m);
void pm_manager_set_max_region(pm_manager_t *m, uint64_t max_region_bytes);
/* Called once per device region as it is freed (pm_region_free, pm_reclaim_owner), with the
 * pool's device and the region's pointer and size, after the region has left the accounting:
 * the hook owns the memory from then on (the daemon frees it on the device's worker, after the
 * replays queued there). Without a hook, pm_region_alloc_device refuses (PM_EINVAL). */
typedef void (*pm_device_free_fn)(void *ctx, const char *device, void *dev_ptr, uint64_t size);
void pm_manager_set_device_free(pm_manager_t *m, pm_device_free_fn fn, void *ctx);

/* Name: 1..PM_NAME_MAX of [A-Za-z0-9._-]. limit 0: none. PM_EEXIST, PM_EINVAL. */
int pm_pool_create(pm_manager_t *m, const char *name, const char *device, uint64_t limit_bytes,
                   pm_pool_t **out /* [out][optional] */);
/* PM_ENOENT; PM_EBUSY while the pool holds regions. */
int pm_pool_delete(pm_manager_t *m, const char *name);
pm_pool_t *pm_pool_find(pm_manager_t *m, const char *name);
/* Two-call pattern: with items NULL, *count gets the number of pools; else fills up to *count
 * pools (in creation order) and sets *count to the number filled. */
void pm_pool_list(pm_manager_t *m, size_t *count, pm_pool_t **items);
void pm_pool_info(const pm_pool_t *p, pm_pool_info_t *out);
/* PM_EINVAL for a NULL pool or owner, or a mode outside pm_mode_t. */
int pm_pool_set_owner(pm_pool_t *p, const pm_pool_owner_t *owner);
/* 1 when a caller of uid and gid may use p by its mode (owner's uid; group: also owner's gid;
 * public: anyone), else 0. Admins are the caller's business. */
int pm_pool_may_use(const pm_pool_t *p, uint32_t uid, uint32_t gid);
/* limit 0: none. A limit below the bytes already reserved is allowed: live regions stay, new
 * allocations fail with PM_ELIMIT until enough is freed. PM_EINVAL for a NULL pool. */
int pm_pool_set_limit(pm_pool_t *p, uint64_t limit_bytes);
/* Whether a region of size bytes would fit p now: PM_OK, or the PM_EINVAL / PM_ELIMIT that
 * pm_region_alloc would return for its size. For a caller that must do costly work (allocate
 * device memory) before it can allocate the region. */
int pm_pool_check_size(const pm_pool_t *p, uint64_t size);

/* Allocates a region of size bytes for owner (a session id, nonzero). PM_EINVAL for 0 or above
 * the manager's bound, PM_ELIMIT past the pool's limit, PM_ESYS when memfd/mmap fails. */
int pm_region_alloc(pm_pool_t *p, uint64_t owner, uint64_t size, pm_region_t **out);
/* Registers size bytes of device memory at dev_ptr, exported as handle, as a region of owner in
 * p, with the same checks and accounting as pm_region_alloc (page-rounded against the limit). On
 * success the region owns dev_ptr (the device-free hook gets it back when the region is freed);
 * on failure the caller keeps it. PM_EINVAL as pm_region_alloc, or for a NULL dev_ptr or handle,
 * or with no device-free hook set; PM_ELIMIT; PM_ENOMEM. */
int pm_region_alloc_device(pm_pool_t *p, uint64_t owner, uint64_t size, void *dev_ptr,
                           const uint8_t handle[PM_IPC_HANDLE_SIZE], pm_region_t **out);
/* As pm_region_alloc_device, for device memory whose export travels as a descriptor with the
 * handle (Level Zero: the dma-buf/memfd fd the importer needs): on success the region owns fd too
 * (pm_region_fd returns it; it is closed when the region is freed, before the device-free hook
 * runs); on failure the caller keeps both. PM_EINVAL also for fd < 0. */
int pm_region_alloc_device_fd(pm_pool_t *p, uint64_t owner, uint64_t size, void *dev_ptr,
                              const uint8_t handle[PM_IPC_HANDLE_SIZE], int fd, pm_region_t **out);
/* Registers size bytes of device memory at dev_ptr, exported as handle, that the region does
 * not own (a graph mempool's segment, which its graph keeps): a region of owner in p that
 * pm_region_find finds and pm_region_free and pm_reclaim_owner free like any other, but counted
 * in none of the pool's or owner's figures (regions, bytes, limit) and never passed to the
 * device-free hook. PM_EINVAL for a NULL pool, dev_ptr or handle, owner 0 or size 0; PM_ENOMEM. */
int pm_region_borrow_device(pm_pool_t *p, uint64_t owner, uint64_t size, void *dev_ptr,
                            const uint8_t handle[PM_IPC_HANDLE_SIZE], pm_region_t **out);
/* PM_ENOENT for an unknown id, PM_EPERM when owner does not own it. */
int pm_region_free(pm_manager_t *m, uint64_t region_id, uint64_t owner);
pm_region_t *pm_region_find(pm_manager_t *m, uint64_t region_id);
/* Frees every region of owner; *freed (optional) gets what was freed. */
void pm_reclaim_owner(pm_manager_t *m, uint64_t owner, pm_usage_t *freed /* [out][optional] */);
void pm_owner_usage(pm_manager_t *m, uint64_t owner, pm_usage_t *out);

uint64_t pm_region_id(const pm_region_t *r);
uint64_t pm_region_owner(const pm_region_t *r);
uint64_t pm_region_size(const pm_region_t *r);        /* bytes asked for */
uint64_t pm_region_mapped_size(const pm_region_t *r); /* page-rounded */
int pm_region_fd(const pm_region_t *r); /* owned by the region; device: -1, or the export's fd */
void *pm_region_addr(const pm_region_t *r);      /* own mapping; device: the pointer */
int pm_region_is_device(const pm_region_t *r);   /* 1 for pm_region_alloc/borrow_device's */
int pm_region_is_borrowed(const pm_region_t *r); /* 1 for pm_region_borrow_device's */
/* The IPC handle of a device region (PM_IPC_HANDLE_SIZE bytes); NULL for a host region. */
const uint8_t *pm_region_ipc_handle(const pm_region_t *r);
pm_pool_t *pm_region_pool(const pm_region_t *r);
/* A value the caller keeps with the region (0 when allocated), e.g. what its memory is for; the
 * manager never reads it. */
void pm_region_set_tag(pm_region_t *r, uint32_t tag);
uint32_t pm_region_tag(const pm_region_t *r);

#endif
