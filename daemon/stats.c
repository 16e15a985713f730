/* Lock-free latency histograms (see stats.h); bucket_mid inverts gx_hist_bucket. */
#include "stats.h"

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
    gx_hist_add(h, ns);
}

void gd_hist_merge(gd_hist_t *dst, const gd_hist_t *src)
{
    gx_hist_merge(dst, src);
}

uint64_t gd_hist_count(const gd_hist_t *h)
{
    return atomic_load_explicit(&h->count, memory_order_relaxed);
}

uint64_t gd_hist_sum(const gd_hist_t *h)
{
    return atomic_load_explicit(&h->sum, memory_order_relaxed);
}

uint64_t gd_hist_below_pow2(const gd_hist_t *h, unsigned k)
{
    /* 2^k is where bucket (k-1)*4 starts (gx_hist_bucket); below it lie the buckets before. */
    unsigned end = k < 2 ? 0 : (k - 1) * 4;
    if (end > GD_HIST_BUCKETS)
        end = GD_HIST_BUCKETS;
    uint64_t n = 0;
    for (unsigned b = 0; b < end; b++)
        n += atomic_load_explicit(&h->bucket[b], memory_order_relaxed);
    return n;
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
