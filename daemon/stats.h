/*
 * Latency histograms that device workers update and the loop reads, without locks: graph_runtime's
 * (hist.h), which executors also write for the replays that reach them directly.
 */
#ifndef GD_STATS_H
#define GD_STATS_H

#include "hist.h"

#include <stdint.h>

#define GD_HIST_BUCKETS GX_HIST_BUCKETS

typedef gx_hist_t gd_hist_t;

void gd_hist_add(gd_hist_t *h, uint64_t ns);
/* The value below which a fraction q (0..1) of the samples fall; 0 when empty. */
uint64_t gd_hist_quantile(const gd_hist_t *h, double q);
uint64_t gd_hist_count(const gd_hist_t *h);
/* The sum of the samples in ns (wraps after 584 years of latency). */
uint64_t gd_hist_sum(const gd_hist_t *h);
/* How many samples are below 2^k ns (k 2..40): the buckets' boundaries are exact there. */
uint64_t gd_hist_below_pow2(const gd_hist_t *h, unsigned k);
/* Adds src's samples to dst. */
void gd_hist_merge(gd_hist_t *dst, const gd_hist_t *src);

#endif
