/*
 * The device families the daemon knows, one row each: what the daemon does differently per
 * family is read from here (daemon.h, gd_family_t), so that adding a family is one row plus its
 * device layer. The wire codes are graphd_frame.h's.
 */
#include "daemon.h"

#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const gd_family_t families[] = {
    {.kind = "cpu",
     .wire = GRAPHD_DEVICE_CPU,
     .graphs = true,
     .resident = false,
     .memory = GD_DEVMEM_NONE,
     .ordering = false,
     .mps_check = false},
    {.kind = "cuda",
     .wire = GRAPHD_DEVICE_CUDA,
     .graphs = true,
     .resident = true,
     .memory = GD_DEVMEM_EXECUTOR,
     .ordering = true,
     .mps_check = true},
    /* No XPU libtorch is found by this build (graph_runtime has no xpu family): device regions
     * through the Level Zero layer only. */
    {.kind = "xpu",
     .wire = GRAPHD_DEVICE_XPU,
     .graphs = false,
     .no_graphs = "this graphd was built without an XPU libtorch; xpu:N supports device regions "
                  "only",
     .resident = false,
     .memory = GD_DEVMEM_ZE,
     .ordering = false,
     .ze_events = true,
     .mps_check = false},
};

const gd_family_t *gd_family_of(const char *kind_or_device)
{
    if (kind_or_device == NULL)
        return NULL;
    size_t n = strcspn(kind_or_device, ":");
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strlen(families[i].kind) == n && strncmp(families[i].kind, kind_or_device, n) == 0)
            return &families[i];
    return NULL;
}

const gd_family_t *gd_family_of_wire(unsigned wire)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].wire == wire)
            return &families[i];
    return NULL;
}

bool gd_device_code_name(uint64_t code, char *buf, size_t len, const gd_family_t **fam)
{
    const gd_family_t *f = code > 0xff ? NULL : gd_family_of_wire(GRAPHD_DEVICE_CODE_FAMILY(code));
    if (fam)
        *fam = f;
    if (f == NULL) {
        snprintf(buf, len, "device code %llu (not GRAPHD_DEVICE_CODE of a known family)",
                 (unsigned long long)code);
        return false;
    }
    snprintf(buf, len, "%s:%u", f->kind, GRAPHD_DEVICE_CODE_INDEX(code));
    return true;
}

size_t gd_map_device_payload(const pm_region_t *r, uint8_t *msg)
{
    pm_pool_info_t info;
    pm_pool_info(pm_region_pool(r), &info);
    const gd_family_t *f = gd_family_of(info.device);
    const char *colon = info.device ? strchr(info.device, ':') : NULL;
    if (f == NULL || colon == NULL)
        return PM_IPC_HANDLE_SIZE;
    unsigned long index = strtoul(colon + 1, NULL, 10);
    if (index > GRAPHD_DEVICE_INDEX_MAX)
        return PM_IPC_HANDLE_SIZE;
    uint64_t code = htole64(GRAPHD_DEVICE_CODE(f->wire, index));
    memcpy(msg + PM_IPC_HANDLE_SIZE, &code, sizeof code);
    return GRAPHD_MAP_DEVICE_PAYLOAD;
}
