/*
 * Shared regions: AllocRegion/FreeRegion over gRPC, the memfd over the
 * session socket (MAP frame), and the caller's mapping. A device region's MAP
 * reply carries an IPC handle (and for xpu the allocation's fd); it is opened
 * through the row of its device's kind (kinds.c: cuda.c, xpu.c). Every handle is on its client's
 * list and holds a reference on it, so that the client outlives graphd_close until the last handle
 * is released.
 */
#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graphd.pb-c.h"
#include "graphd_int.h"

static void link_region(graphd_client_t *c, graphd_region_t *r)
{
    r->client = c;
    r->prev = NULL;
    r->next = c->regions;
    if (c->regions != NULL)
        c->regions->prev = r;
    c->regions = r;
    graphd__client_ref(c);
}

static void unlink_region(graphd_region_t *r)
{
    graphd_client_t *c = r->client;
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        c->regions = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
}

/* A device region: the IPC handle (and fd, consumed) of a MAP reply opened through its kind's
 * row on device; NULL device: CUDA on the current device, as before devices were named. */
static int map_device_region(graphd_client_t *c, uint64_t region_id, uint64_t size,
                             const char *device, const uint8_t *handle, int fd,
                             graphd_region_t **out)
{
    int index = -1;
    const graphd__kind_t *kind = &graphd__kind_cuda;
    if (device != NULL && (kind = graphd__kind_of(device, &index)) == NULL) {
        if (fd >= 0)
            close(fd);
        return graphd__fail(c, GRAPHD_EPROTO, "region %llu is device memory, but its device is %s",
                            (unsigned long long)region_id, device);
    }
    if (device == NULL && fd >= 0) {
        close(fd);
        return graphd__fail(c, GRAPHD_EPROTO,
                            "region %llu is device memory that comes with a descriptor (xpu): "
                            "map it through graphd_region_alloc_device or its graph, which name "
                            "its device",
                            (unsigned long long)region_id);
    }
    if (size == 0) {
        if (fd >= 0)
            close(fd);
        return graphd__fail(c, GRAPHD_EPROTO, "MAP reply for device region %llu of 0 bytes",
                            (unsigned long long)region_id);
    }
    graphd_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        if (fd >= 0)
            close(fd);
        return graphd__fail(c, GRAPHD_ENOMEM, "out of memory");
    }
    int rc = kind->open(c, index, handle, &fd, size, &r->ptr);
    if (rc != GRAPHD_OK) {
        if (fd >= 0)
            close(fd);
        free(r);
        return rc;
    }
    r->id = region_id;
    r->size = size;
    r->mapped_size = size;
    r->kind = kind;
    r->device = index >= 0 ? index : 0;
    r->fd = fd;
    link_region(c, r);
    *out = r;
    return GRAPHD_OK;
}

int graphd__region_map(graphd_client_t *c, uint64_t region_id, const char *device,
                       graphd_region_t **out)
{
    uint64_t mapped_size = 0;
    int fd = -1;
    uint8_t handle[GRAPHD_MAP_DEVICE_PAYLOAD];
    size_t handle_len = sizeof(handle);
    int rc = graphd__dp_exchange(c, GRAPHD_FRAME_MAP, region_id, GRAPHD_MAP_NAME_DEVICE, NULL, 0,
                                 &mapped_size, &fd, handle, &handle_len);
    if (rc != GRAPHD_OK)
        return rc;
    char named[32];
    if (handle_len == GRAPHD_MAP_DEVICE_PAYLOAD) {
        /* The daemon named the region's device: what the caller gave (the pool's or the graph's
         * device) must be it; without one, it is the device to open on. */
        uint64_t code;
        memcpy(&code, handle + GRAPHD__IPC_HANDLE_SIZE, sizeof(code));
        code = le64toh(code);
        int index = -1;
        const graphd__kind_t *kind = graphd__kind_of_code(code, &index);
        if (kind == NULL) {
            if (fd >= 0)
                close(fd);
            return graphd__fail(c, GRAPHD_EPROTO,
                                "MAP reply for device region %llu names device code %llu, of no "
                                "device kind this libgraphd knows",
                                (unsigned long long)region_id, (unsigned long long)code);
        }
        snprintf(named, sizeof(named), "%s:%d", kind->name, index);
        if (device != NULL) {
            int want = -1;
            if (graphd__kind_of(device, &want) != kind || want != index) {
                if (fd >= 0)
                    close(fd);
                return graphd__fail(c, GRAPHD_EPROTO,
                                    "region %llu: expected on %s, the daemon says %s",
                                    (unsigned long long)region_id, device, named);
            }
        }
        device = named;
        handle_len = GRAPHD__IPC_HANDLE_SIZE;
    }
    if (handle_len != 0) {
        if (handle_len != GRAPHD__IPC_HANDLE_SIZE) {
            if (fd >= 0)
                close(fd);
            return graphd__fail(c, GRAPHD_EPROTO, "MAP reply for region %llu with %zu bytes",
                                (unsigned long long)region_id, handle_len);
        }
        return map_device_region(c, region_id, mapped_size, device, handle, fd, out);
    }
    if (fd < 0)
        return graphd__fail(c, GRAPHD_EPROTO, "MAP reply for region %llu without a descriptor",
                            (unsigned long long)region_id);

    /* Never map past the end of the memfd: touching such pages would raise SIGBUS. */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = graphd__fail_sys(c, "fstat of region %llu", (unsigned long long)region_id);
        goto out;
    }
    if (mapped_size == 0 || (uint64_t)st.st_size < mapped_size || mapped_size > SIZE_MAX) {
        rc = graphd__fail(
            c, GRAPHD_EPROTO, "region %llu: MAP says %llu bytes but the memfd has %lld",
            (unsigned long long)region_id, (unsigned long long)mapped_size, (long long)st.st_size);
        goto out;
    }
    graphd_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        rc = graphd__fail(c, GRAPHD_ENOMEM, "out of memory");
        goto out;
    }
    r->ptr = mmap(NULL, (size_t)mapped_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->ptr == MAP_FAILED) {
        rc = graphd__fail_sys(c, "mmap of region %llu (%llu bytes)", (unsigned long long)region_id,
                              (unsigned long long)mapped_size);
        free(r);
        goto out;
    }
    r->id = region_id;
    r->size = mapped_size;
    r->mapped_size = mapped_size;
    r->kind = NULL;
    r->device = -1;
    r->fd = -1;
    link_region(c, r);
    *out = r;
out:
    close(fd);
    return rc;
}

/* AllocRegion (host or device memory), then MAP; on a failure after the RPC the region is freed
 * again. */
static int region_alloc(graphd_client_t *c, const char *pool, uint64_t size, int device,
                        graphd_region_t **out)
{
    c->last_error[0] = '\0';
    if (out == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (c->session_id == 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "no session: call graphd_hello first");

    Graphd__V1__SessionRef ref = GRAPHD__V1__SESSION_REF__INIT;
    ref.id = c->session_id;
    ref.token = c->session_token;
    Graphd__V1__AllocRegionRequest req = GRAPHD__V1__ALLOC_REGION_REQUEST__INIT;
    req.session = &ref;
    req.pool = (char *)(pool != NULL ? pool : "");
    req.size = size;
    req.device = device != 0;
    Graphd__V1__AllocRegionReply *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("AllocRegion"), &req.base,
                          &graphd__v1__alloc_region_reply__descriptor, (ProtobufCMessage **)&rep);
    if (rc != GRAPHD_OK)
        return rc;
    uint64_t id = rep->region_id, got_size = rep->size, mapped = rep->mapped_size;
    char dev[64];
    graphd__strlcpy(dev, rep->device, sizeof(dev));
    protobuf_c_message_free_unpacked(&rep->base, NULL);

    graphd_region_t *r = NULL;
    /* A device region opens on the pool's device; the reply of an older daemon names none. */
    rc = graphd__region_map(c, id, device && dev[0] != '\0' ? dev : NULL, &r);
    if (rc == GRAPHD_OK && device && r->kind == NULL)
        rc = graphd__fail(c, GRAPHD_EPROTO, "region %llu: asked for device memory, got a memfd",
                          (unsigned long long)id);
    else if (rc == GRAPHD_OK && (mapped != r->mapped_size || got_size > r->mapped_size))
        rc = graphd__fail(
            c, GRAPHD_EPROTO, "region %llu: AllocRegion said %llu bytes mapped, MAP said %llu",
            (unsigned long long)id, (unsigned long long)mapped, (unsigned long long)r->mapped_size);
    if (rc != GRAPHD_OK && r != NULL)
        graphd_region_release(r);
    if (rc != GRAPHD_OK) {
        /* The daemon holds a region this caller will never see: give it back. */
        char saved[GRAPHD__ERRMSG_MAX];
        memcpy(saved, c->last_error, sizeof(saved));
        if (c->session_id != 0)
            (void)graphd_region_free_id(c, id);
        memcpy(c->last_error, saved, sizeof(saved));
        return rc;
    }
    r->size = got_size;
    *out = r;
    return GRAPHD_OK;
}

int graphd_region_alloc(graphd_client_t *c, const char *pool, uint64_t size, graphd_region_t **out)
{
    return region_alloc(c, pool, size, 0, out);
}

int graphd_region_alloc_device(graphd_client_t *c, const char *pool, uint64_t size,
                               graphd_region_t **out)
{
    return region_alloc(c, pool, size, 1, out);
}

int graphd_region_map(graphd_client_t *c, uint64_t region_id, graphd_region_t **out)
{
    c->last_error[0] = '\0';
    if (out == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    return graphd__region_map(c, region_id, NULL, out);
}

int graphd_region_free_id(graphd_client_t *c, uint64_t region_id)
{
    c->last_error[0] = '\0';
    if (c->session_id == 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "no session: call graphd_hello first");
    Graphd__V1__SessionRef ref = GRAPHD__V1__SESSION_REF__INIT;
    ref.id = c->session_id;
    ref.token = c->session_token;
    Graphd__V1__FreeRegionRequest req = GRAPHD__V1__FREE_REGION_REQUEST__INIT;
    req.session = &ref;
    req.region_id = region_id;
    ProtobufCMessage *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("FreeRegion"), &req.base,
                          &graphd__v1__free_region_reply__descriptor, &rep);
    if (rc == GRAPHD_OK)
        protobuf_c_message_free_unpacked(rep, NULL);
    return rc;
}

int graphd_region_free(graphd_client_t *c, graphd_region_t *r)
{
    c->last_error[0] = '\0';
    if (r == NULL || r->client != c)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT,
                            "region handle is NULL or not this "
                            "client's");
    uint64_t id = r->id;
    graphd__client_ref(c); /* r's reference may be the last */
    int rc;
    if (r->kind != NULL) { /* the daemon's free must not come before this process's close */
        graphd_region_release(r);
        rc = graphd_region_free_id(c, id);
    } else {
        rc = graphd_region_free_id(c, id);
        graphd_region_release(r);
    }
    graphd__client_unref(c);
    return rc;
}

void graphd_region_release(graphd_region_t *r)
{
    if (r == NULL)
        return;
    graphd_client_t *c = r->client;
    if (r->kind != NULL) {
        r->kind->close(r->device, r->ptr); /* NULL once closed at Goodbye */
        if (r->fd >= 0)
            close(r->fd);
    } else {
        munmap(r->ptr, (size_t)r->mapped_size);
    }
    unlink_region(r);
    free(r);
    graphd__client_unref(c);
}

void graphd__regions_close_device(graphd_client_t *c)
{
    for (graphd_region_t *r = c->regions; r != NULL; r = r->next)
        if (r->kind != NULL && r->ptr != NULL) {
            r->kind->close(r->device, r->ptr);
            r->ptr = NULL;
            if (r->fd >= 0)
                close(r->fd);
            r->fd = -1;
        }
}

int graphd_region_is_device(const graphd_region_t *r)
{
    return r->kind != NULL;
}

/* The checks of graphd_region_read/write; then the copy through the region's kind or memcpy. */
static int region_copy(graphd_region_t *r, uint64_t offset, void *host, size_t n, int to_region,
                       const char *fn)
{
    if (r == NULL)
        return graphd__fail_thread(GRAPHD_EINVALID_ARGUMENT, "%s: region is NULL", fn);
    graphd_client_t *c = r->client;
    c->last_error[0] = '\0';
    if (host == NULL && n > 0)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "%s: buffer is NULL", fn);
    if (offset > r->mapped_size || n > r->mapped_size - offset)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT,
                            "%s: %zu bytes at offset %llu pass the end of region %llu (%llu bytes "
                            "mapped)",
                            fn, n, (unsigned long long)offset, (unsigned long long)r->id,
                            (unsigned long long)r->mapped_size);
    if (r->ptr == NULL)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                            "%s: region %llu is unmapped (its session ended)", fn,
                            (unsigned long long)r->id);
    if (n == 0)
        return GRAPHD_OK;
    char *at = (char *)r->ptr + offset;
    if (r->kind != NULL)
        return r->kind->copy(c, r->device, at, host, n, to_region);
    if (to_region)
        memcpy(at, host, n);
    else
        memcpy(host, at, n);
    return GRAPHD_OK;
}

int graphd_region_write(graphd_region_t *r, uint64_t offset, const void *src, size_t n)
{
    return region_copy(r, offset, (void *)src, n, 1, "graphd_region_write");
}

int graphd_region_read(graphd_region_t *r, uint64_t offset, void *dst, size_t n)
{
    return region_copy(r, offset, dst, n, 0, "graphd_region_read");
}

uint64_t graphd_region_id(const graphd_region_t *r)
{
    return r->id;
}

void *graphd_region_ptr(const graphd_region_t *r)
{
    return r->ptr;
}

uint64_t graphd_region_size(const graphd_region_t *r)
{
    return r->size;
}

uint64_t graphd_region_mapped_size(const graphd_region_t *r)
{
    return r->mapped_size;
}
