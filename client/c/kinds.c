/*
 * The device kinds of libgraphd, one row each (cuda.c, xpu.c): the one place that maps a device
 * string ("cuda:0", "xpu:1") to the row that maps, copies and orders its regions.
 */
#include <stdlib.h>
#include <string.h>

#include "graphd_int.h"

static const graphd__kind_t *const kinds[] = {&graphd__kind_cuda, &graphd__kind_xpu};

const graphd__kind_t *graphd__kind_of(const char *device, int *index)
{
    if (device == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        size_t n = strlen(kinds[i]->name);
        if (strncmp(device, kinds[i]->name, n) != 0)
            continue;
        const char *rest = device + n;
        if (*rest == '\0') {
            *index = 0;
            return kinds[i];
        }
        if (rest[0] != ':' || rest[1] < '0' || rest[1] > '9')
            return NULL;
        char *end = NULL;
        long v = strtol(rest + 1, &end, 10);
        if (*end != '\0' || v < 0 || v > (long)GRAPHD_DEVICE_INDEX_MAX)
            return NULL;
        *index = (int)v;
        return kinds[i];
    }
    return NULL;
}

const graphd__kind_t *graphd__kind_of_code(uint64_t code, int *index)
{
    if (code > 0xff)
        return NULL;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (kinds[i]->family == GRAPHD_DEVICE_CODE_FAMILY(code)) {
            *index = (int)GRAPHD_DEVICE_CODE_INDEX(code);
            return kinds[i];
        }
    return NULL;
}

void graphd__kinds_session_end(graphd_client_t *c)
{
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (kinds[i]->session_end != NULL)
            kinds[i]->session_end(c);
}
