/* Unit tests for the daemon's latency histograms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "stats.h"

#include <string.h>

static void empty(void **state)
{
    (void)state;
    gd_hist_t h;
    memset(&h, 0, sizeof h);
    assert_int_equal(gd_hist_count(&h), 0);
    assert_int_equal(gd_hist_quantile(&h, 0.5), 0);
}

static void within_a_bucket_of_the_truth(void **state)
{
    (void)state;
    static gd_hist_t h;
    memset(&h, 0, sizeof h);
    /* 1..10000 us, uniformly: p50 ~ 5 ms, p99 ~ 9.9 ms. */
    for (uint64_t us = 1; us <= 10000; us++)
        gd_hist_add(&h, us * 1000);
    assert_int_equal(gd_hist_count(&h), 10000);
    double p50 = (double)gd_hist_quantile(&h, 0.50), p99 = (double)gd_hist_quantile(&h, 0.99);
    assert_true(p50 > 5e6 * 0.8 && p50 < 5e6 * 1.2);
    assert_true(p99 > 9.9e6 * 0.8 && p99 < 9.9e6 * 1.2);
    assert_true(gd_hist_quantile(&h, 0.0) <= gd_hist_quantile(&h, 0.5));
    assert_true(gd_hist_quantile(&h, 0.5) <= gd_hist_quantile(&h, 1.0));
}

static void extremes(void **state)
{
    (void)state;
    static gd_hist_t h;
    memset(&h, 0, sizeof h);
    gd_hist_add(&h, 0);
    gd_hist_add(&h, UINT64_MAX); /* lands in the last bucket, does not overflow */
    assert_int_equal(gd_hist_count(&h), 2);
    assert_true(gd_hist_quantile(&h, 0.0) < 4);
    assert_true(gd_hist_quantile(&h, 1.0) > 1000000000ull);
}

static void a_single_value(void **state)
{
    (void)state;
    static gd_hist_t h;
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 100; i++)
        gd_hist_add(&h, 20000);
    uint64_t q = gd_hist_quantile(&h, 0.99);
    assert_true(q >= 16384 && q <= 24576); /* the bucket holding 20000 */
}

/* The figures of a Prometheus histogram: _sum, and the counts below each power of two. */
static void sum_and_power_of_two_bounds(void **state)
{
    (void)state;
    static gd_hist_t h, m;
    memset(&h, 0, sizeof h);
    memset(&m, 0, sizeof m);
    gd_hist_add(&h, 1023); /* below 2^10 */
    gd_hist_add(&h, 1024); /* 2^10 itself: not below it, below 2^11 */
    gd_hist_add(&h, 2047);
    gd_hist_add(&h, 3000000); /* below 2^22 = 4194304, not below 2^21 */
    assert_int_equal(gd_hist_sum(&h), 1023 + 1024 + 2047 + 3000000);
    assert_int_equal(gd_hist_below_pow2(&h, 10), 1);
    assert_int_equal(gd_hist_below_pow2(&h, 11), 3);
    assert_int_equal(gd_hist_below_pow2(&h, 21), 3);
    assert_int_equal(gd_hist_below_pow2(&h, 22), 4);
    assert_int_equal(gd_hist_below_pow2(&h, 40), 4);
    gd_hist_merge(&m, &h);
    gd_hist_merge(&m, &h);
    assert_int_equal(gd_hist_sum(&m), 2 * gd_hist_sum(&h));
    assert_int_equal(gd_hist_below_pow2(&m, 11), 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(empty),
        cmocka_unit_test(within_a_bucket_of_the_truth),
        cmocka_unit_test(extremes),
        cmocka_unit_test(a_single_value),
        cmocka_unit_test(sum_and_power_of_two_bounds),
    };
    return cmocka_run_group_tests_name("stats", tests, NULL, NULL);
}
