/*
 * The one grammar of byte sizes, shared by graphd's settings (daemon/config.c) and graphctl's
 * --limit (client/c/graphctl.c), so that a size written for one reads the same in the other:
 * digits, optional spaces, then an optional unit, case-insensitive: none or B (bytes);
 * K, M, G, T (or KB, MB, GB, TB): powers of 1000; Ki, Mi, Gi, Ti (or KiB, MiB, GiB, TiB): powers
 * of 1024. "64Mi", "5 MiB", "2gib", "1000000" are all fine. Header only, no dependencies beyond
 * libc; not installed.
 */
#ifndef GRAPHD_BYTES_H
#define GRAPHD_BYTES_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <strings.h>

/* 0 and *out set, or -1 (not a size, or more than 2^64 - 1 bytes). */
static inline int graphd_parse_bytes(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {{"", 1},
                 {"b", 1},
                 {"k", 1000ull},
                 {"kb", 1000ull},
                 {"ki", 1ull << 10},
                 {"kib", 1ull << 10},
                 {"m", 1000000ull},
                 {"mb", 1000000ull},
                 {"mi", 1ull << 20},
                 {"mib", 1ull << 20},
                 {"g", 1000000000ull},
                 {"gb", 1000000000ull},
                 {"gi", 1ull << 30},
                 {"gib", 1ull << 30},
                 {"t", 1000000000000ull},
                 {"tb", 1000000000000ull},
                 {"ti", 1ull << 40},
                 {"tib", 1ull << 40}};
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            if (v != 0 && units[i].mult > UINT64_MAX / v)
                return -1;
            *out = (uint64_t)v * units[i].mult;
            return 0;
        }
    }
    return -1;
}

#endif
