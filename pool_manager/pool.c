/*
 * pool_manager: owns the named pools, every live region and their accounting.
 *
 * A manager holds its pools in a list (creation order) and every live region
 * in an open-addressing hash keyed by region id (linear probing, backward-
 * shift deletion), so lookups by id stay O(1) with thousands of regions. Each
 * pool keeps one entry per owner holding a region in it, and that entry links
 * the owner's regions in the pool: session counts, owner usage and reclaim
 * then walk only what they need. A region owns its memfd and the daemon's
 * mapping of it; a device region owns its device pointer until it goes to the
 * manager's device-free hook; a borrowed device region owns nothing and counts
 * in no figure.
 *
 * Nothing here logs. A function that fails on a system call returns PM_ESYS
 * with errno still set by that call; its caller logs.
 */
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PM_DEVICE_MAX 63
#define PM_HASH_MIN_LOG2 6
#define PM_HASH_MIN (1u << PM_HASH_MIN_LOG2) /* slots */
#define PM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

typedef struct pm_owner_ref pm_owner_ref_t;

struct pm_region {
    uint64_t id;
    uint64_t owner;
    uint64_t size;
    uint64_t mapped;
    int fd;     /* -1 for a device region */
    void *addr; /* the daemon's mapping; for a device region, the device pointer */
    bool device;
    bool borrowed; /* a device window the region does not own (pm_region_borrow_device) */
    uint32_t tag;  /* the caller's (pm_region_set_tag) */
    uint8_t handle[PM_IPC_HANDLE_SIZE];
    pm_pool_t *pool;
    pm_owner_ref_t *ref;
    pm_region_t *prev, *next; /* the owner's regions in this pool */
};

/* One owner with at least one live region in a pool; freed with its last region. */
struct pm_owner_ref {
    uint64_t owner;
    uint32_t regions;  /* on the list below, borrowed ones included */
    uint32_t borrowed; /* of those, borrowed (counted nowhere else) */
    uint64_t bytes;    /* page-rounded */
    pm_region_t *head;
    pm_owner_ref_t *next;
};

struct pm_pool {
    char name[PM_NAME_MAX + 1];
    char device[PM_DEVICE_MAX + 1];
    uint64_t limit;
    uint64_t reserved;
    uint64_t used;
    uint32_t regions;
    uint32_t sessions;
    uint64_t created_unix_ms;
    pm_pool_owner_t owner;
    pm_manager_t *m;
    pm_owner_ref_t *owners;
    pm_pool_t *next;
};

struct pm_manager {
    uint64_t max_region;
    uint64_t page;
    uint64_t next_id;
    pm_pool_t *pools, *pools_tail;
    size_t npools;
    pm_region_t **slots; /* region hash; NULL is an empty slot */
    size_t nslots;       /* a power of two */
    unsigned shift;      /* 64 - log2(nslots) */
    size_t nregions;
    pm_device_free_fn device_free;
    void *device_free_ctx;
};

const char *pm_strerror(int err)
{
    switch (err) {
#define PM_ERR_STR(name, value, msg, grpc)                                                         \
    case value:                                                                                    \
        return msg;
        PM_ERR_MAP(PM_ERR_STR)
#undef PM_ERR_STR
    }
    return "unknown error";
}

const char *pm_err_name(int err)
{
    switch (err) {
#define PM_ERR_NAME(name, value, msg, grpc)                                                        \
    case value:                                                                                    \
        return #name;
        PM_ERR_MAP(PM_ERR_NAME)
#undef PM_ERR_NAME
    }
    return "UNKNOWN";
}

int pm_err_grpc(int err)
{
    switch (err) {
#define PM_ERR_GRPC(name, value, msg, grpc)                                                        \
    case value:                                                                                    \
        return grpc;
        PM_ERR_MAP(PM_ERR_GRPC)
#undef PM_ERR_GRPC
    }
    return 13; /* INTERNAL */
}

/* ---- region hash ---- */

static size_t slot_home(const pm_manager_t *m, uint64_t id)
{
    /* Fibonacci hashing: the top bits of id * 2^64/phi spread sequential ids evenly. */
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> m->shift);
}

static void hash_put(pm_manager_t *m, pm_region_t *r)
{
    size_t i = slot_home(m, r->id);
    while (m->slots[i] != NULL)
        i = (i + 1) & (m->nslots - 1);
    m->slots[i] = r;
    m->nregions++;
}

static size_t hash_slot(const pm_manager_t *m, uint64_t id)
{
    size_t mask = m->nslots - 1;
    for (size_t i = slot_home(m, id);; i = (i + 1) & mask) {
        if (m->slots[i] == NULL || m->slots[i]->id == id)
            return i;
    }
}

static void hash_del(pm_manager_t *m, size_t hole)
{
    size_t mask = m->nslots - 1;
    m->slots[hole] = NULL;
    m->nregions--;
    /* Backward shift: pull up every later entry of the run that may no longer be reachable. */
    for (size_t j = (hole + 1) & mask; m->slots[j] != NULL; j = (j + 1) & mask) {
        size_t home = slot_home(m, m->slots[j]->id);
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!stays) {
            m->slots[hole] = m->slots[j];
            m->slots[j] = NULL;
            hole = j;
        }
    }
}

/* Keeps the load at or below one half once one more region is added. */
static int hash_reserve(pm_manager_t *m)
{
    if ((m->nregions + 1) * 2 <= m->nslots)
        return PM_OK;
    size_t old_n = m->nslots;
    pm_region_t **old = m->slots;
    pm_region_t **slots = calloc(old_n * 2, sizeof(*slots));
    if (slots == NULL)
        return PM_ENOMEM;
    m->slots = slots;
    m->nslots = old_n * 2;
    m->shift--;
    m->nregions = 0;
    for (size_t i = 0; i < old_n; i++) {
        if (old[i] != NULL)
            hash_put(m, old[i]);
    }
    free(old);
    return PM_OK;
}

/* ---- manager ---- */

int pm_manager_create(uint64_t max_region_bytes, pm_manager_t **out)
{
    if (out == NULL)
        return PM_EINVAL;
    *out = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return PM_ESYS;
    pm_manager_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PM_ENOMEM;
    m->slots = calloc(PM_HASH_MIN, sizeof(*m->slots));
    if (m->slots == NULL) {
        free(m);
        return PM_ENOMEM;
    }
    m->nslots = PM_HASH_MIN;
    m->shift = 64 - PM_HASH_MIN_LOG2;
    m->max_region = max_region_bytes;
    m->page = (uint64_t)page;
    m->next_id = 1;
    *out = m;
    return PM_OK;
}

int pm_manager_destroy(pm_manager_t *m)
{
    if (m == NULL)
        return PM_OK;
    if (m->nregions > 0)
        return PM_EBUSY;
    for (pm_pool_t *p = m->pools, *next; p != NULL; p = next) {
        next = p->next;
        free(p);
    }
    free(m->slots);
    free(m);
    return PM_OK;
}

/* Applies to later allocations only; live regions keep their size. */
void pm_manager_set_max_region(pm_manager_t *m, uint64_t max_region_bytes)
{
    m->max_region = max_region_bytes;
}

void pm_manager_set_device_free(pm_manager_t *m, pm_device_free_fn fn, void *ctx)
{
    m->device_free = fn;
    m->device_free_ctx = ctx;
}

/* ---- pools ---- */

static bool name_valid(const char *name)
{
    size_t n = 0;
    for (; name[n] != '\0'; n++) {
        char c = name[n];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok || n >= PM_NAME_MAX)
            return false;
    }
    return n > 0;
}

static uint64_t now_unix_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int pm_pool_create(pm_manager_t *m, const char *name, const char *device, uint64_t limit_bytes,
                   pm_pool_t **out)
{
    if (out != NULL)
        *out = NULL;
    if (m == NULL || name == NULL || device == NULL || !name_valid(name))
        return PM_EINVAL;
    size_t dlen = strlen(device);
    if (dlen == 0 || dlen > PM_DEVICE_MAX)
        return PM_EINVAL;
    if (pm_pool_find(m, name) != NULL)
        return PM_EEXIST;
    pm_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return PM_ENOMEM;
    memcpy(p->name, name, strlen(name) + 1);
    memcpy(p->device, device, dlen + 1);
    p->limit = limit_bytes;
    p->created_unix_ms = now_unix_ms();
    p->owner.mode = PM_MODE_PUBLIC;
    p->m = m;
    if (m->pools_tail != NULL)
        m->pools_tail->next = p;
    else
        m->pools = p;
    m->pools_tail = p;
    m->npools++;
    if (out != NULL)
        *out = p;
    return PM_OK;
}

int pm_pool_delete(pm_manager_t *m, const char *name)
{
    if (m == NULL || name == NULL)
        return PM_EINVAL;
    pm_pool_t *prev = NULL, *p = m->pools;
    while (p != NULL && strcmp(p->name, name) != 0) {
        prev = p;
        p = p->next;
    }
    if (p == NULL)
        return PM_ENOENT;
    if (p->regions > 0 || p->owners != NULL)
        return PM_EBUSY;
    if (prev != NULL)
        prev->next = p->next;
    else
        m->pools = p->next;
    if (m->pools_tail == p)
        m->pools_tail = prev;
    m->npools--;
    free(p);
    return PM_OK;
}

pm_pool_t *pm_pool_find(pm_manager_t *m, const char *name)
{
    if (m == NULL || name == NULL)
        return NULL;
    for (pm_pool_t *p = m->pools; p != NULL; p = p->next) {
        if (strcmp(p->name, name) == 0)
            return p;
    }
    return NULL;
}

void pm_pool_list(pm_manager_t *m, size_t *count, pm_pool_t **items)
{
    if (count == NULL)
        return;
    if (items == NULL) {
        *count = m->npools;
        return;
    }
    size_t n = 0;
    for (pm_pool_t *p = m->pools; p != NULL && n < *count; p = p->next)
        items[n++] = p;
    *count = n;
}

void pm_pool_info(const pm_pool_t *p, pm_pool_info_t *out)
{
    *out = (pm_pool_info_t){
        .name = p->name,
        .device = p->device,
        .limit_bytes = p->limit,
        .reserved_bytes = p->reserved,
        .used_bytes = p->used,
        .regions = p->regions,
        .sessions = p->sessions,
        .created_unix_ms = p->created_unix_ms,
        .owner = p->owner,
    };
}

int pm_pool_set_owner(pm_pool_t *p, const pm_pool_owner_t *owner)
{
    if (p == NULL || owner == NULL || owner->mode < PM_MODE_PRIVATE || owner->mode > PM_MODE_PUBLIC)
        return PM_EINVAL;
    p->owner = *owner;
    return PM_OK;
}

int pm_pool_may_use(const pm_pool_t *p, uint32_t uid, uint32_t gid)
{
    if (p == NULL)
        return 0;
    switch (p->owner.mode) {
    case PM_MODE_PUBLIC:
        return 1;
    case PM_MODE_GROUP:
        return uid == p->owner.uid || gid == p->owner.gid;
    default:
        return uid == p->owner.uid;
    }
}

/* A limit below what the pool already reserves is accepted: live regions stay, and every new
 * allocation fails with PM_ELIMIT until enough is freed. */
int pm_pool_set_limit(pm_pool_t *p, uint64_t limit_bytes)
{
    if (p == NULL)
        return PM_EINVAL;
    p->limit = limit_bytes;
    return PM_OK;
}

/* ---- regions ---- */

static pm_owner_ref_t *owner_ref_find(const pm_pool_t *p, uint64_t owner)
{
    for (pm_owner_ref_t *o = p->owners; o != NULL; o = o->next) {
        if (o->owner == owner)
            return o;
    }
    return NULL;
}

static void owner_ref_unlink(pm_pool_t *p, pm_owner_ref_t *ref)
{
    pm_owner_ref_t **pp = &p->owners;
    while (*pp != ref)
        pp = &(*pp)->next;
    *pp = ref->next;
    p->sessions--;
    free(ref);
}

/* Creates the sealed memfd and maps it; on failure closes what it opened and keeps errno. */
static int region_map(pm_region_t *r)
{
    char name[48];
    snprintf(name, sizeof(name), "graphd-region-%llu", (unsigned long long)r->id);
    r->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r->fd < 0)
        return PM_ESYS;
    if (ftruncate(r->fd, (off_t)r->mapped) == 0 && fcntl(r->fd, F_ADD_SEALS, PM_SEALS) == 0) {
        r->addr = mmap(NULL, (size_t)r->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
        if (r->addr != MAP_FAILED)
            return PM_OK;
    }
    int saved = errno;
    close(r->fd);
    errno = saved;
    return PM_ESYS;
}

int pm_pool_check_size(const pm_pool_t *p, uint64_t size)
{
    if (p == NULL || size == 0)
        return PM_EINVAL;
    const pm_manager_t *m = p->m;
    if (m->max_region != 0 && size > m->max_region)
        return PM_EINVAL;
    /* Page rounding must not wrap, and the result must fit off_t (ftruncate) and size_t. */
    if (size > (uint64_t)INT64_MAX - (m->page - 1) || size > SIZE_MAX - (m->page - 1))
        return PM_EINVAL;
    uint64_t mapped = (size + m->page - 1) & ~(m->page - 1);
    if (p->limit != 0 && (p->reserved > p->limit || mapped > p->limit - p->reserved))
        return PM_ELIMIT;
    return PM_OK;
}

/* The common part of host and device allocation; dev_ptr NULL: a host region (memfd). A
 * borrowed region skips the size checks and counts no bytes. */
static int region_alloc(pm_pool_t *p, uint64_t owner, uint64_t size, void *dev_ptr,
                        const uint8_t *handle, int dev_fd, bool borrowed, pm_region_t **out)
{
    if (out != NULL)
        *out = NULL;
    if (p == NULL || out == NULL || owner == 0)
        return PM_EINVAL;
    int rc = borrowed ? (size == 0 ? PM_EINVAL : PM_OK) : pm_pool_check_size(p, size);
    if (rc != PM_OK)
        return rc;
    pm_manager_t *m = p->m;
    uint64_t mapped = borrowed ? size : (size + m->page - 1) & ~(m->page - 1);

    /* Everything that can fail without a system call comes first, so that rollback is short. */
    int err = hash_reserve(m);
    if (err != PM_OK)
        return err;
    pm_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return PM_ENOMEM;
    pm_owner_ref_t *ref = owner_ref_find(p, owner);
    bool new_ref = ref == NULL;
    if (new_ref) {
        ref = calloc(1, sizeof(*ref));
        if (ref == NULL) {
            free(r);
            return PM_ENOMEM;
        }
        ref->owner = owner;
    }
    r->id = m->next_id;
    r->owner = owner;
    r->size = size;
    r->mapped = mapped;
    r->borrowed = borrowed;
    if (dev_ptr != NULL) {
        r->device = true;
        r->fd = dev_fd;
        r->addr = dev_ptr;
        memcpy(r->handle, handle, PM_IPC_HANDLE_SIZE);
        err = PM_OK;
    } else {
        err = region_map(r);
    }
    if (err != PM_OK) {
        /* free() leaves errno alone on glibc, but keep the failing call's errno regardless. */
        int saved = errno;
        if (new_ref)
            free(ref);
        free(r);
        errno = saved;
        return err;
    }

    m->next_id++;
    hash_put(m, r);
    if (new_ref) {
        ref->next = p->owners;
        p->owners = ref;
        p->sessions++;
    }
    r->pool = p;
    r->ref = ref;
    r->next = ref->head;
    if (ref->head != NULL)
        ref->head->prev = r;
    ref->head = r;
    ref->regions++;
    if (borrowed) {
        ref->borrowed++;
    } else {
        p->regions++;
        ref->bytes += mapped;
        p->reserved += mapped;
        p->used += size;
    }
    *out = r;
    return PM_OK;
}

int pm_region_alloc(pm_pool_t *p, uint64_t owner, uint64_t size, pm_region_t **out)
{
    return region_alloc(p, owner, size, NULL, NULL, -1, false, out);
}

int pm_region_alloc_device(pm_pool_t *p, uint64_t owner, uint64_t size, void *dev_ptr,
                           const uint8_t handle[PM_IPC_HANDLE_SIZE], pm_region_t **out)
{
    if (out != NULL)
        *out = NULL;
    if (p == NULL || dev_ptr == NULL || handle == NULL || p->m->device_free == NULL)
        return PM_EINVAL;
    return region_alloc(p, owner, size, dev_ptr, handle, -1, false, out);
}

int pm_region_alloc_device_fd(pm_pool_t *p, uint64_t owner, uint64_t size, void *dev_ptr,
                              const uint8_t handle[PM_IPC_HANDLE_SIZE], int fd, pm_region_t **out)
{
    if (out != NULL)
        *out = NULL;
    if (p == NULL || dev_ptr == NULL || handle == NULL || fd < 0 || p->m->device_free == NULL)
        return PM_EINVAL;
    return region_alloc(p, owner, size, dev_ptr, handle, fd, false, out);
}

int pm_region_borrow_device(pm_pool_t *p, uint64_t owner, uint64_t size, void *dev_ptr,
                            const uint8_t handle[PM_IPC_HANDLE_SIZE], pm_region_t **out)
{
    if (out != NULL)
        *out = NULL;
    if (p == NULL || dev_ptr == NULL || handle == NULL)
        return PM_EINVAL;
    return region_alloc(p, owner, size, dev_ptr, handle, -1, true, out);
}

/* Unmaps, closes and forgets r (a device region goes to the device-free hook); slot is its index
 * in the region hash. */
static void region_destroy(pm_manager_t *m, pm_region_t *r, size_t slot)
{
    pm_pool_t *p = r->pool;
    pm_owner_ref_t *ref = r->ref;
    hash_del(m, slot);
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        ref->head = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    ref->regions--;
    if (r->borrowed) {
        ref->borrowed--;
    } else {
        p->regions--;
        ref->bytes -= r->mapped;
        p->reserved -= r->mapped;
        p->used -= r->size;
    }
    if (ref->regions == 0)
        owner_ref_unlink(p, ref);
    if (r->borrowed) {
        /* not ours: nothing to free */
    } else if (r->device) {
        if (r->fd >= 0)
            close(
                r->fd); /* the export's fd (pm_region_alloc_device_fd); the memory is the hook's */
        m->device_free(m->device_free_ctx, p->device, r->addr, r->size);
    } else {
        /* Neither can fail for a mapping and memfd we created; a client's own mapping survives. */
        munmap(r->addr, (size_t)r->mapped);
        close(r->fd);
    }
    free(r);
}

int pm_region_free(pm_manager_t *m, uint64_t region_id, uint64_t owner)
{
    if (m == NULL)
        return PM_EINVAL;
    size_t slot = hash_slot(m, region_id);
    pm_region_t *r = m->slots[slot];
    if (r == NULL)
        return PM_ENOENT;
    if (r->owner != owner)
        return PM_EPERM;
    region_destroy(m, r, slot);
    return PM_OK;
}

pm_region_t *pm_region_find(pm_manager_t *m, uint64_t region_id)
{
    if (m == NULL)
        return NULL;
    return m->slots[hash_slot(m, region_id)];
}

void pm_reclaim_owner(pm_manager_t *m, uint64_t owner, pm_usage_t *freed)
{
    pm_usage_t total = {0};
    for (pm_pool_t *p = m->pools; p != NULL; p = p->next) {
        pm_owner_ref_t *ref = owner_ref_find(p, owner);
        if (ref == NULL)
            continue;
        /* The last region_destroy frees ref: count first, never touch ref afterwards. */
        uint32_t n = ref->regions;
        total.regions += n - ref->borrowed;
        total.bytes += ref->bytes;
        pm_region_t *r = ref->head;
        for (uint32_t i = 0; i < n; i++) {
            pm_region_t *next = r->next;
            region_destroy(m, r, hash_slot(m, r->id));
            r = next;
        }
    }
    if (freed != NULL)
        *freed = total;
}

void pm_owner_usage(pm_manager_t *m, uint64_t owner, pm_usage_t *out)
{
    pm_usage_t total = {0};
    for (pm_pool_t *p = m->pools; p != NULL; p = p->next) {
        pm_owner_ref_t *ref = owner_ref_find(p, owner);
        if (ref != NULL) {
            total.regions += ref->regions - ref->borrowed;
            total.bytes += ref->bytes;
        }
    }
    *out = total;
}

uint64_t pm_region_id(const pm_region_t *r)
{
    return r->id;
}

uint64_t pm_region_owner(const pm_region_t *r)
{
    return r->owner;
}

uint64_t pm_region_size(const pm_region_t *r)
{
    return r->size;
}

uint64_t pm_region_mapped_size(const pm_region_t *r)
{
    return r->mapped;
}

int pm_region_fd(const pm_region_t *r)
{
    return r->fd;
}

void *pm_region_addr(const pm_region_t *r)
{
    return r->addr;
}

pm_pool_t *pm_region_pool(const pm_region_t *r)
{
    return r->pool;
}

int pm_region_is_device(const pm_region_t *r)
{
    return r->device ? 1 : 0;
}

int pm_region_is_borrowed(const pm_region_t *r)
{
    return r->borrowed ? 1 : 0;
}

const uint8_t *pm_region_ipc_handle(const pm_region_t *r)
{
    return r->device ? r->handle : NULL;
}

void pm_region_set_tag(pm_region_t *r, uint32_t tag)
{
    r->tag = tag;
}

uint32_t pm_region_tag(const pm_region_t *r)
{
    return r->tag;
}
