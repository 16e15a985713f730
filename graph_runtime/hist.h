/*
 * Latency histograms without locks: log-linear buckets (four per power of two, so a percentile is
 * within about 19% of the truth) of atomic counters. Header only: the daemon keeps them for the
 * replays it runs (daemon/stats.h), and an executor writes them into its shared state page for
 * the replays that come to it straight from the client (exec_proto.h), which the daemon reads.
 */
#ifndef GR_HIST_H
#define GR_HIST_H

#include <stdatomic.h>
#include <stdint.h>

#define GX_HIST_BUCKETS 160

typedef struct gx_hist {
    _Atomic uint64_t count;
    _Atomic uint64_t bucket[GX_HIST_BUCKETS];
    _Atomic uint64_t sum; /* of the samples, in ns (a Prometheus histogram's _sum) */
} gx_hist_t;

/* Bucket 4k+s covers [2^k * (4+s)/4, 2^k * (5+s)/4) for k >= 2; values below 4 share bucket 0. */
static inline unsigned gx_hist_bucket(uint64_t v)
{
    if (v < 4)
        return 0;
    unsigned k = 63u - (unsigned)__builtin_clzll(v);
    unsigned sub = (unsigned)((v >> (k - 2)) & 3u);
    unsigned b = (k - 1) * 4 + sub;
    return b < GX_HIST_BUCKETS ? b : GX_HIST_BUCKETS - 1;
}

static inline void gx_hist_add(gx_hist_t *h, uint64_t ns)
{
    atomic_fetch_add_explicit(&h->bucket[gx_hist_bucket(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

/* Adds what src holds to dst (either may be updated meanwhile: the sum is as of some moment). */
static inline void gx_hist_merge(gx_hist_t *dst, const gx_hist_t *src)
{
    for (unsigned b = 0; b < GX_HIST_BUCKETS; b++) {
        uint64_t n = atomic_load_explicit(&src->bucket[b], memory_order_relaxed);
        if (n)
            atomic_fetch_add_explicit(&dst->bucket[b], n, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&dst->sum, atomic_load_explicit(&src->sum, memory_order_relaxed),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&dst->count, atomic_load_explicit(&src->count, memory_order_relaxed),
                              memory_order_relaxed);
}

#endif
