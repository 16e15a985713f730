/*
 * pool_manager: named memory pools on a device and the shared regions carved
 * from them. A host region is one memfd (sealed against shrinking and
 * growing), mapped here and passed to its owner session. Pure C, no gRPC and
 * no libuv: the daemon's loop thread is the only caller, so nothing locks.
 */
#ifndef GRAPHD_POOL_H
#define GRAPHD_POOL_H

#include <stddef.h>
#include <stdint.h>

#define PM_NAME_MAX 63

#define PM_ERR_MAP(X)                                                                              \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOENT, -2, "no such pool or region")                                                        \
    X(EEXIST, -3, "pool already exists")                                                           \
    X(ELIMIT, -4, "pool byte limit exceeded")                                                      \
    X(EBUSY, -5, "pool still holds regions")                                                       \
    X(ENOMEM, -6, "out of memory")                                                                 \
    X(ESYS, -7, "system call failed")                                                              \
    X(EPERM, -8, "region belongs to another session")

typedef enum {
#define PM_ERR_ENUM(name, value, msg) PM_##name = value,
    PM_ERR_MAP(PM_ERR_ENUM)
#undef PM_ERR_ENUM
} pm_err_t;

const char *pm_strerror(int err);
const char *pm_err_name(int err);

typedef struct pm_manager pm_manager_t;
typedef struct pm_pool pm_pool_t;
typedef struct pm_region pm_region_t;

typedef struct pm_pool_info {
    const char *name;        /* owned by the pool */
    const char *device;      /* owned by the pool */
    uint64_t limit_bytes;    /* 0: none */
    uint64_t reserved_bytes; /* page-rounded size of live regions */
    uint64_t used_bytes;     /* sizes asked for by live regions */
    uint32_t regions;
    uint32_t sessions; /* distinct owners with a live region */
    uint64_t created_unix_ms;
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
/* limit 0: none. A limit below the bytes already reserved is allowed: live regions stay, new
 * allocations fail with PM_ELIMIT until enough is freed. PM_EINVAL for a NULL pool. */
int pm_pool_set_limit(pm_pool_t *p, uint64_t limit_bytes);

/* Allocates a region of size bytes for owner (a session id, nonzero). PM_EINVAL for 0 or above
 * the manager's bound, PM_ELIMIT past the pool's limit, PM_ESYS when memfd/mmap fails. */
int pm_region_alloc(pm_pool_t *p, uint64_t owner, uint64_t size, pm_region_t **out);
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
int pm_region_fd(const pm_region_t *r);               /* owned by the region; dup to keep */
void *pm_region_addr(const pm_region_t *r);           /* the daemon's own mapping */
pm_pool_t *pm_region_pool(const pm_region_t *r);

#endif
