/*
 * The device families the daemon knows, one row each: what the daemon does differently per
 * family is read from here (daemon.h, gd_family_t), so that adding a family is one row plus its
 * device layer. The wire codes are graphd_frame.h's.
 */
#include "daemon.h"

#include <stdio.h>
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
