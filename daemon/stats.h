/*
 * Latency histograms that device workers update and the loop reads, without
 * locks: log-linear buckets (four per power of two, so a percentile is within
 * about 19% of the truth) of atomic counters.
 */
#ifndef GD_STATS_H
#define GD_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#define GD_HIST_BUCKETS 160

typedef struct gd_hist {
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t bucket[GD_HIST_BUCKETS];
} gd_hist_t;

void gd_hist_add(gd_hist_t *h, uint64_t ns);
/* The value below which a fraction q (0..1) of the samples fall; 0 when empty. */
uint64_t gd_hist_quantile(const gd_hist_t *h, double q);
uint64_t gd_hist_count(const gd_hist_t *h);

#endif
