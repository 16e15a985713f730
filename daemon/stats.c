/* Lock-free latency histograms (see stats.h). */
#include "stats.h"

/* Bucket 4k+s covers [2^k * (4+s)/4, 2^k * (5+s)/4) for k >= 2; values below 4 share bucket 0. */
static unsigned bucket_of(uint64_t v)
{
    if (v < 4)
        return 0;
    unsigned k = 63u - (unsigned)__builtin_clzll(v);
    unsigned sub = (unsigned)((v >> (k - 2)) & 3u);
    unsigned b = (k - 1) * 4 + sub;
    return b < GD_HIST_BUCKETS ? b : GD_HIST_BUCKETS - 1;
}

static uint64_t bucket_mid(unsigned b)
{
    if (b < 4)
        return 2;
    unsigned k = b / 4 + 1, sub = b % 4;
    uint64_t lo = (uint64_t)(4 + sub) << (k - 2);
    uint64_t width = 1ull << (k - 2);
    return lo + width / 2;
}

void gd_hist_add(gd_hist_t *h, uint64_t ns)
{
    atomic_fetch_add_explicit(&h->bucket[bucket_of(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

uint64_t gd_hist_count(const gd_hist_t *h)
{
    return atomic_load_explicit(&h->count, memory_order_relaxed);
}

uint64_t gd_hist_quantile(const gd_hist_t *h, double q)
{
    uint64_t counts[GD_HIST_BUCKETS], total = 0;
    for (unsigned b = 0; b < GD_HIST_BUCKETS; b++) {
        counts[b] = atomic_load_explicit(&h->bucket[b], memory_order_relaxed);
        total += counts[b];
    }
    if (total == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)total);
    if (rank >= total)
        rank = total - 1;
    uint64_t seen = 0;
    for (unsigned b = 0; b < GD_HIST_BUCKETS; b++) {
        seen += counts[b];
        if (seen > rank)
            return bucket_mid(b);
    }
    return bucket_mid(GD_HIST_BUCKETS - 1);
}
