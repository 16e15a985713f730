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
/* Adds src's samples to dst. */
void gd_hist_merge(gd_hist_t *dst, const gd_hist_t *src);

#endif
