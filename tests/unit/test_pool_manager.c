/*
 * Unit tests for pool_manager: pools, region lifetimes, accounting, limits, the sealed memfd
 * behind each host region, device regions and their free hook, and reclaim by owner. Every test
 * gets a fresh manager; the teardown reclaims the owners tests use and checks that the manager is
 * then empty.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"

#define OWNER_MAX 16 /* tests use owners 1..OWNER_MAX */

#define assert_pm(call, want)                                                                      \
    do {                                                                                           \
        int got_ = (call);                                                                         \
        if (got_ != (want))                                                                        \
            fail_msg("%s = %s (%d), want %s", #call, pm_err_name(got_), got_, pm_err_name(want));  \
    } while (0)

typedef struct fixture {
    pm_manager_t *m;
    uint64_t page;
} fixture_t;

static int setup(void **state)
{
    static fixture_t f;
    f.page = (uint64_t)sysconf(_SC_PAGESIZE);
    assert_pm(pm_manager_create(0, &f.m), PM_OK);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    for (uint64_t owner = 1; owner <= OWNER_MAX; owner++)
        pm_reclaim_owner(f->m, owner, NULL);
    assert_pm(pm_manager_destroy(f->m), PM_OK);
    return 0;
}

static pm_pool_t *make_pool(fixture_t *f, const char *name, uint64_t limit)
{
    pm_pool_t *p = NULL;
    assert_pm(pm_pool_create(f->m, name, "cpu:0", limit, &p), PM_OK);
    assert_non_null(p);
    return p;
}

static pm_region_t *alloc_ok(pm_pool_t *p, uint64_t owner, uint64_t size)
{
    pm_region_t *r = NULL;
    assert_pm(pm_region_alloc(p, owner, size, &r), PM_OK);
    assert_non_null(r);
    return r;
}

static pm_pool_info_t info_of(const pm_pool_t *p)
{
    pm_pool_info_t info;
    pm_pool_info(p, &info);
    return info;
}

static int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static void test_err_strings(void **state)
{
    (void)state;
    assert_string_equal(pm_strerror(PM_OK), "success");
    assert_string_equal(pm_err_name(PM_OK), "OK");
    assert_string_equal(pm_strerror(PM_ELIMIT), "pool byte limit exceeded");
    assert_string_equal(pm_err_name(PM_ELIMIT), "ELIMIT");
    assert_string_equal(pm_err_name(PM_EPERM), "EPERM");
    assert_string_equal(pm_strerror(PM_EPERM), "region belongs to another session");
    const int unknown[] = {1, -9, -100, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        assert_string_equal(pm_strerror(unknown[i]), "unknown error");
        assert_string_equal(pm_err_name(unknown[i]), "UNKNOWN");
    }
}

static void test_pool_create_find_delete(void **state)
{
    fixture_t *f = *state;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;

    pm_pool_t *p = NULL;
    assert_pm(pm_pool_create(f->m, "train", "cuda:0", 1 << 20, &p), PM_OK);
    assert_ptr_equal(pm_pool_find(f->m, "train"), p);
    pm_pool_info_t info = info_of(p);
    assert_string_equal(info.name, "train");
    assert_string_equal(info.device, "cuda:0");
    assert_int_equal(info.limit_bytes, 1 << 20);
    assert_int_equal(info.reserved_bytes, 0);
    assert_int_equal(info.used_bytes, 0);
    assert_int_equal(info.regions, 0);
    assert_int_equal(info.sessions, 0);
    assert_in_range(info.created_unix_ms, now_ms - 1000, now_ms + 60000);

    assert_pm(pm_pool_create(f->m, "eval", "cpu:0", 0, NULL), PM_OK); /* out is optional */
    assert_non_null(pm_pool_find(f->m, "eval"));
    assert_null(pm_pool_find(f->m, "Train")); /* names are case-sensitive */
    assert_null(pm_pool_find(f->m, "nope"));

    assert_pm(pm_pool_delete(f->m, "train"), PM_OK);
    assert_null(pm_pool_find(f->m, "train"));
    assert_pm(pm_pool_delete(f->m, "train"), PM_ENOENT);
    assert_non_null(pm_pool_find(f->m, "eval"));
    assert_pm(pm_pool_set_limit(NULL, 1), PM_EINVAL);
}

static void test_pool_name_validation(void **state)
{
    fixture_t *f = *state;
    char name[PM_NAME_MAX + 2];
    pm_pool_t *p = (pm_pool_t *)&p; /* must be cleared on failure */

    assert_pm(pm_pool_create(f->m, "", "cpu:0", 0, &p), PM_EINVAL);
    assert_null(p);
    assert_pm(pm_pool_create(f->m, NULL, "cpu:0", 0, NULL), PM_EINVAL);
    const char *bad[] = {"a b", "a/b", "a:b", "pool\n", "caf\xc3\xa9", "-$", "../x/y"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_pm(pm_pool_create(f->m, bad[i], "cpu:0", 0, NULL), PM_EINVAL);

    memset(name, 'n', PM_NAME_MAX + 1);
    name[PM_NAME_MAX + 1] = '\0';
    assert_pm(pm_pool_create(f->m, name, "cpu:0", 0, NULL), PM_EINVAL); /* 64 chars */
    name[PM_NAME_MAX] = '\0';
    assert_pm(pm_pool_create(f->m, name, "cpu:0", 0, NULL), PM_OK); /* 63 chars */
    assert_pm(pm_pool_create(f->m, "Az09._-", "cpu:0", 0, NULL), PM_OK);
    assert_pm(pm_pool_create(f->m, ".", "cpu:0", 0, NULL), PM_OK);

    /* The device string: non-empty, at most 63 chars. */
    assert_pm(pm_pool_create(f->m, "dev", "", 0, NULL), PM_EINVAL);
    assert_pm(pm_pool_create(f->m, "dev", NULL, 0, NULL), PM_EINVAL);
    memset(name, 'd', PM_NAME_MAX + 1);
    name[64] = '\0';
    assert_pm(pm_pool_create(f->m, "dev", name, 0, NULL), PM_EINVAL);
    name[63] = '\0';
    assert_pm(pm_pool_create(f->m, "dev", name, 0, NULL), PM_OK);
    assert_string_equal(info_of(pm_pool_find(f->m, "dev")).device, name);

    size_t n = 0;
    pm_pool_list(f->m, &n, NULL);
    assert_int_equal(n, 4);
}

static void test_pool_duplicate(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "dup", 4096);
    pm_pool_t *q = (pm_pool_t *)&q;
    assert_pm(pm_pool_create(f->m, "dup", "cuda:1", 0, &q), PM_EEXIST);
    assert_null(q);
    assert_ptr_equal(pm_pool_find(f->m, "dup"), p);
    assert_int_equal(info_of(p).limit_bytes, 4096);
    assert_string_equal(info_of(p).device, "cpu:0");
}

static void test_pool_list(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *items[8];
    size_t n = 123;

    pm_pool_list(f->m, &n, NULL);
    assert_int_equal(n, 0);
    pm_pool_t *a = make_pool(f, "a", 0), *b = make_pool(f, "b", 0), *c = make_pool(f, "c", 0);

    pm_pool_list(f->m, &n, NULL);
    assert_int_equal(n, 3);
    n = 2; /* a short buffer gets the first pools, in creation order */
    pm_pool_list(f->m, &n, items);
    assert_int_equal(n, 2);
    assert_ptr_equal(items[0], a);
    assert_ptr_equal(items[1], b);
    n = 8;
    pm_pool_list(f->m, &n, items);
    assert_int_equal(n, 3);
    assert_ptr_equal(items[2], c);

    /* Deleting the middle and the last pool keeps the order, and new pools go at the end. */
    assert_pm(pm_pool_delete(f->m, "b"), PM_OK);
    assert_pm(pm_pool_delete(f->m, "c"), PM_OK);
    pm_pool_t *d = make_pool(f, "d", 0);
    n = 8;
    pm_pool_list(f->m, &n, items);
    assert_int_equal(n, 2);
    assert_ptr_equal(items[0], a);
    assert_ptr_equal(items[1], d);

    assert_pm(pm_pool_delete(f->m, "a"), PM_OK);
    assert_pm(pm_pool_delete(f->m, "d"), PM_OK);
    pm_pool_t *e = make_pool(f, "e", 0);
    n = 8;
    pm_pool_list(f->m, &n, items);
    assert_int_equal(n, 1);
    assert_ptr_equal(items[0], e);
}

static void test_pool_delete_busy(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "busy", 0);
    pm_region_t *r = alloc_ok(p, 1, 100);
    assert_pm(pm_pool_delete(f->m, "busy"), PM_EBUSY);
    assert_ptr_equal(pm_pool_find(f->m, "busy"), p);
    assert_int_equal(info_of(p).regions, 1);
    assert_pm(pm_region_free(f->m, pm_region_id(r), 1), PM_OK);
    assert_pm(pm_pool_delete(f->m, "busy"), PM_OK);
    assert_null(pm_pool_find(f->m, "busy"));
}

static void test_alloc_sizes(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "sizes", 0);
    pm_region_t *r = (pm_region_t *)&r;

    assert_pm(pm_region_alloc(p, 1, 0, &r), PM_EINVAL);
    assert_null(r);
    assert_pm(pm_region_alloc(p, 0, 100, &r), PM_EINVAL); /* owner 0 is no session */
    assert_pm(pm_region_alloc(NULL, 1, 100, &r), PM_EINVAL);
    assert_pm(pm_region_alloc(p, 1, 100, NULL), PM_EINVAL);

    /* Without a bound, sizes whose page rounding wraps or leaves off_t are rejected. */
    const uint64_t huge[] = {UINT64_MAX, UINT64_MAX - f->page + 2, (uint64_t)INT64_MAX,
                             (uint64_t)INT64_MAX + 1};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++)
        assert_pm(pm_region_alloc(p, 1, huge[i], &r), PM_EINVAL);

    pm_manager_set_max_region(f->m, 16 * f->page);
    assert_pm(pm_region_alloc(p, 1, 16 * f->page + 1, &r), PM_EINVAL);
    r = alloc_ok(p, 1, 16 * f->page);
    assert_int_equal(pm_region_size(r), 16 * f->page);
    assert_int_equal(pm_region_mapped_size(r), 16 * f->page);
    pm_manager_set_max_region(f->m, 0);
    alloc_ok(p, 1, 17 * f->page);

    pm_usage_t u;
    pm_owner_usage(f->m, 1, &u);
    assert_int_equal(u.regions, 2);
    assert_int_equal(u.bytes, 33 * f->page);
}

static void test_accounting(void **state)
{
    fixture_t *f = *state;
    uint64_t pg = f->page;
    pm_pool_t *p = make_pool(f, "acct", 0);

    pm_region_t *r1 = alloc_ok(p, 1, 1);
    assert_int_equal(pm_region_size(r1), 1);
    assert_int_equal(pm_region_mapped_size(r1), pg);
    assert_int_equal(pm_region_owner(r1), 1);
    assert_ptr_equal(pm_region_pool(r1), p);
    pm_region_t *r2 = alloc_ok(p, 1, pg + 1);
    assert_int_equal(pm_region_mapped_size(r2), 2 * pg);
    pm_region_t *r3 = alloc_ok(p, 2, pg);
    assert_int_equal(pm_region_mapped_size(r3), pg);

    pm_pool_info_t info = info_of(p);
    assert_int_equal(info.reserved_bytes, 4 * pg);
    assert_int_equal(info.used_bytes, 2 * pg + 2);
    assert_int_equal(info.regions, 3);
    assert_int_equal(info.sessions, 2);

    assert_pm(pm_region_free(f->m, pm_region_id(r2), 1), PM_OK);
    info = info_of(p);
    assert_int_equal(info.reserved_bytes, 2 * pg);
    assert_int_equal(info.used_bytes, pg + 1);
    assert_int_equal(info.regions, 2);
    assert_int_equal(info.sessions, 2);

    assert_pm(pm_region_free(f->m, pm_region_id(r3), 2), PM_OK);
    info = info_of(p);
    assert_int_equal(info.sessions, 1);
    assert_pm(pm_region_free(f->m, pm_region_id(r1), 1), PM_OK);
    info = info_of(p);
    assert_int_equal(info.reserved_bytes, 0);
    assert_int_equal(info.used_bytes, 0);
    assert_int_equal(info.regions, 0);
    assert_int_equal(info.sessions, 0);
}

static void test_limit(void **state)
{
    fixture_t *f = *state;
    uint64_t pg = f->page;
    pm_pool_t *p = make_pool(f, "limited", 2 * pg);

    pm_region_t *r1 = alloc_ok(p, 1, 10);
    pm_pool_info_t before = info_of(p);
    int fds = count_open_fds();

    /* 10 + pg + 1 used bytes would fit, but the check is against page-rounded bytes. */
    pm_region_t *r = (pm_region_t *)&r;
    assert_pm(pm_pool_check_size(p, pg + 1), PM_ELIMIT); /* the same answer, asked beforehand */
    assert_pm(pm_pool_check_size(p, pg), PM_OK);
    assert_pm(pm_pool_check_size(p, 0), PM_EINVAL);
    assert_pm(pm_region_alloc(p, 2, pg + 1, &r), PM_ELIMIT);
    assert_null(r);
    pm_pool_info_t after = info_of(p);
    assert_int_equal(after.reserved_bytes, before.reserved_bytes);
    assert_int_equal(after.used_bytes, before.used_bytes);
    assert_int_equal(after.regions, before.regions);
    assert_int_equal(after.sessions, before.sessions);
    assert_int_equal(count_open_fds(), fds);
    pm_usage_t u;
    pm_owner_usage(f->m, 2, &u);
    assert_int_equal(u.regions, 0);

    /* Filling the limit exactly is allowed; the rejected call used no region id. */
    pm_region_t *r2 = alloc_ok(p, 2, pg);
    assert_int_equal(pm_region_id(r2), pm_region_id(r1) + 1);
    assert_pm(pm_region_alloc(p, 2, 1, &r), PM_ELIMIT);

    /* A limit below what is reserved keeps live regions and blocks new ones. */
    assert_pm(pm_pool_set_limit(p, pg), PM_OK);
    assert_int_equal(info_of(p).limit_bytes, pg);
    assert_int_equal(info_of(p).reserved_bytes, 2 * pg);
    assert_pm(pm_region_alloc(p, 1, 1, &r), PM_ELIMIT);
    assert_pm(pm_region_free(f->m, pm_region_id(r2), 2), PM_OK);
    assert_pm(pm_region_alloc(p, 1, 1, &r), PM_ELIMIT); /* reserved == limit */
    assert_pm(pm_pool_set_limit(p, 0), PM_OK);          /* 0: no limit */
    alloc_ok(p, 1, 64 * pg);
    assert_int_equal(info_of(p).reserved_bytes, 65 * pg);
}

static void test_region_memfd_shared(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "shm", 0);
    uint64_t size = 3 * f->page + 17;
    pm_region_t *r = alloc_ok(p, 1, size);
    size_t mapped = (size_t)pm_region_mapped_size(r);
    int fd = pm_region_fd(r);
    unsigned char *addr = pm_region_addr(r);
    assert_true(fd >= 0);
    assert_non_null(addr);

    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, mapped);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    char link[64], want[64], target[128] = {0};
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    snprintf(want, sizeof(want), "/memfd:graphd-region-%llu", (unsigned long long)pm_region_id(r));
    assert_true(readlink(link, target, sizeof(target) - 1) > 0);
    assert_true(strncmp(target, want, strlen(want)) == 0);

    for (size_t i = 0; i < mapped; i++)
        addr[i] = (unsigned char)(i * 7 + 1);
    unsigned char *view = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(view != MAP_FAILED);
    assert_memory_equal(view, addr, mapped);
    assert_int_equal(view[mapped - 1], (unsigned char)((mapped - 1) * 7 + 1));
    memset(view + 100, 0xab, 50); /* and back the other way */
    assert_int_equal(addr[149], 0xab);

    /* The other side's mapping outlives the region, as a client's does. */
    assert_pm(pm_region_free(f->m, pm_region_id(r), 1), PM_OK);
    assert_int_equal(view[0], 1);
    assert_int_equal(munmap(view, mapped), 0);
}

static void test_region_seals(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "sealed", 0);
    pm_region_t *r = alloc_ok(p, 1, 2 * f->page);
    int fd = pm_region_fd(r);

    assert_int_equal(fcntl(fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    errno = 0;
    assert_int_equal(ftruncate(fd, (off_t)f->page), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(fd, (off_t)(4 * f->page)), -1);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1); /* F_SEAL_SEAL */
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, 2 * f->page);
}

static void test_region_ids(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "ids", 0);
    pm_region_t *r1 = alloc_ok(p, 1, 1);
    pm_region_t *r2 = alloc_ok(p, 1, 1);
    assert_int_equal(pm_region_id(r1), 1);
    assert_int_equal(pm_region_id(r2), 2);
    assert_ptr_equal(pm_region_find(f->m, 1), r1);
    assert_ptr_equal(pm_region_find(f->m, 2), r2);
    assert_null(pm_region_find(f->m, 0));
    assert_null(pm_region_find(f->m, 3));

    assert_pm(pm_region_free(f->m, 2, 1), PM_OK);
    assert_null(pm_region_find(f->m, 2));
    pm_region_t *r3 = alloc_ok(p, 1, 1); /* ids are never reused */
    assert_int_equal(pm_region_id(r3), 3);
    assert_ptr_equal(pm_region_find(f->m, 3), r3);
}

static void test_region_free_errors(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "frees", 0);
    pm_region_t *r = alloc_ok(p, 1, 1);
    uint64_t id = pm_region_id(r);

    assert_pm(pm_region_free(f->m, id, 2), PM_EPERM);
    assert_pm(pm_region_free(f->m, id, 0), PM_EPERM);
    assert_ptr_equal(pm_region_find(f->m, id), r);
    assert_int_equal(info_of(p).regions, 1);
    assert_pm(pm_region_free(f->m, id + 1000, 1), PM_ENOENT);
    assert_pm(pm_region_free(f->m, 0, 1), PM_ENOENT);
    assert_pm(pm_region_free(f->m, id, 1), PM_OK);
    assert_pm(pm_region_free(f->m, id, 1), PM_ENOENT);
    assert_pm(pm_region_free(NULL, id, 1), PM_EINVAL);
}

static void test_reclaim_owner(void **state)
{
    fixture_t *f = *state;
    uint64_t pg = f->page;
    pm_pool_t *a = make_pool(f, "a", 0), *b = make_pool(f, "b", 0), *c = make_pool(f, "c", 0);
    uint64_t mine[5], others[3];
    mine[0] = pm_region_id(alloc_ok(a, 1, 1));
    others[0] = pm_region_id(alloc_ok(a, 2, 1));
    mine[1] = pm_region_id(alloc_ok(a, 1, pg + 1));
    mine[2] = pm_region_id(alloc_ok(b, 1, 3 * pg));
    others[1] = pm_region_id(alloc_ok(b, 3, 1));
    mine[3] = pm_region_id(alloc_ok(b, 1, 1));
    mine[4] = pm_region_id(alloc_ok(a, 1, 1));
    others[2] = pm_region_id(alloc_ok(c, 2, 1));
    assert_int_equal(info_of(a).sessions, 2);
    assert_int_equal(info_of(b).sessions, 2);

    pm_usage_t u;
    pm_owner_usage(f->m, 1, &u);
    assert_int_equal(u.regions, 5);
    assert_int_equal(u.bytes, 8 * pg);
    pm_owner_usage(f->m, 2, &u);
    assert_int_equal(u.regions, 2);
    assert_int_equal(u.bytes, 2 * pg);

    pm_usage_t freed = {99, 99};
    pm_reclaim_owner(f->m, 1, &freed);
    assert_int_equal(freed.regions, 5);
    assert_int_equal(freed.bytes, 8 * pg);
    for (size_t i = 0; i < 5; i++)
        assert_null(pm_region_find(f->m, mine[i]));
    for (size_t i = 0; i < 3; i++)
        assert_non_null(pm_region_find(f->m, others[i]));

    pm_pool_info_t ia = info_of(a), ib = info_of(b), ic = info_of(c);
    assert_int_equal(ia.sessions, 1);
    assert_int_equal(ia.regions, 1);
    assert_int_equal(ia.reserved_bytes, pg);
    assert_int_equal(ia.used_bytes, 1);
    assert_int_equal(ib.sessions, 1);
    assert_int_equal(ib.regions, 1);
    assert_int_equal(ib.reserved_bytes, pg);
    assert_int_equal(ic.sessions, 1);
    pm_owner_usage(f->m, 1, &u);
    assert_int_equal(u.regions, 0);
    assert_int_equal(u.bytes, 0);
    pm_owner_usage(f->m, 2, &u);
    assert_int_equal(u.regions, 2);

    pm_reclaim_owner(f->m, 1, &freed); /* nothing left: a no-op */
    assert_int_equal(freed.regions, 0);
    assert_int_equal(freed.bytes, 0);
    pm_reclaim_owner(f->m, 2, NULL);
    assert_int_equal(info_of(a).sessions, 0);
    assert_int_equal(info_of(c).regions, 0);
    assert_non_null(pm_region_find(f->m, others[1]));
}

static void test_manager_destroy_busy(void **state)
{
    (void)state;
    pm_manager_t *m = NULL;
    pm_pool_t *p = NULL;
    assert_pm(pm_manager_create(0, &m), PM_OK);
    assert_pm(pm_pool_create(m, "p", "cpu:0", 0, &p), PM_OK);
    pm_region_t *r = alloc_ok(p, 7, 1);
    assert_pm(pm_manager_destroy(m), PM_EBUSY);
    /* Nothing was freed: the manager, its pool and the region still work. */
    assert_ptr_equal(pm_pool_find(m, "p"), p);
    assert_ptr_equal(pm_region_find(m, pm_region_id(r)), r);
    ((char *)pm_region_addr(r))[0] = 1;
    pm_reclaim_owner(m, 7, NULL);
    assert_pm(pm_manager_destroy(m), PM_OK); /* empty pools go with it */
    assert_pm(pm_manager_destroy(NULL), PM_OK);
    assert_pm(pm_manager_create(0, NULL), PM_EINVAL);
}

/* Drives the region hash through growth, then through churn whose ids spread far wider than the
 * table (so probe runs form and deletions must repair them), checked against a plain array. */
static void test_many_regions(void **state)
{
    fixture_t *f = *state;
    enum { PEAK = 2000, LAST_ID = 24000 };
    static pm_region_t *live[LAST_ID + 2]; /* by id */
    static uint64_t ids[PEAK];             /* live ids, unordered */
    size_t nlive = 0;
    pm_pool_t *p = make_pool(f, "many", 0);
    memset(live, 0, sizeof(live));

    /* Every region holds a descriptor: raise the soft limit if it is low. */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    lim = old;
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < PEAK + 256) {
        lim.rlim_cur = PEAK + 256;
        if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < lim.rlim_cur)
            skip(); /* the hard limit is too low for this test */
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    }

    uint64_t next = 1;
    uint32_t x = 12345;
    while (next <= LAST_ID) {
        x = x * 1103515245u + 12345u;
        bool grow = next <= PEAK || (nlive < PEAK && (x >> 16) % 2 == 0);
        if (grow) {
            pm_region_t *r = alloc_ok(p, 1 + next % 4, 1);
            assert_int_equal(pm_region_id(r), next);
            live[next++] = r;
            ids[nlive++] = pm_region_id(r);
        } else {
            size_t k = (x >> 8) % nlive;
            uint64_t id = ids[k];
            assert_pm(pm_region_free(f->m, id, 1 + id % 4), PM_OK);
            live[id] = NULL;
            ids[k] = ids[--nlive];
        }
        if (next % 4000 == 0 || next > LAST_ID) {
            for (uint64_t id = 0; id <= LAST_ID + 1; id++)
                assert_ptr_equal(pm_region_find(f->m, id), live[id]);
            assert_int_equal(info_of(p).regions, nlive);
        }
    }
    assert_int_equal(info_of(p).sessions, 4);

    pm_usage_t freed;
    pm_reclaim_owner(f->m, 2, &freed);
    for (uint64_t id = 1; id <= LAST_ID; id++) {
        if (1 + id % 4 == 2) /* id's owner; live[id] itself is freed by now */
            live[id] = NULL;
        assert_ptr_equal(pm_region_find(f->m, id), live[id]);
    }
    assert_int_equal(info_of(p).regions, nlive - freed.regions);
    assert_int_equal(info_of(p).sessions, 3);
    for (uint64_t owner = 1; owner <= 4; owner++)
        pm_reclaim_owner(f->m, owner, NULL);
    assert_int_equal(info_of(p).regions, 0);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
}

/* A failing system call leaves nothing behind, and errno says why. */
static void test_alloc_syscall_failure(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "sys", 0);
    pm_region_t *r1 = alloc_ok(p, 1, 1);
    pm_pool_info_t before = info_of(p);
    int fds = count_open_fds();

    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    int lowest_free = dup(0);
    assert_true(lowest_free >= 0);
    close(lowest_free);
    low = old;
    low.rlim_cur = (rlim_t)lowest_free; /* no new descriptor can be opened */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    pm_region_t *r = (pm_region_t *)&r;
    errno = 0;
    int err = pm_region_alloc(p, 2, 1, &r);
    int saved = errno;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);

    assert_pm(err, PM_ESYS);
    assert_int_equal(saved, EMFILE);
    assert_null(r);
    pm_pool_info_t after = info_of(p);
    assert_int_equal(after.regions, before.regions);
    assert_int_equal(after.reserved_bytes, before.reserved_bytes);
    assert_int_equal(after.sessions, before.sessions);
    assert_int_equal(count_open_fds(), fds);
    pm_region_t *r2 = alloc_ok(p, 2, 1);
    assert_int_equal(pm_region_id(r2), pm_region_id(r1) + 1);
}

/* The device-free hook of the device-region tests: counts calls and keeps the last one. */
static struct {
    int calls;
    void *ctx;
    char device[64];
    void *ptr;
    uint64_t size;
} freed_dev;

static void count_device_free(void *ctx, const char *device, void *dev_ptr, uint64_t size)
{
    freed_dev.calls++;
    freed_dev.ctx = ctx;
    snprintf(freed_dev.device, sizeof freed_dev.device, "%s", device);
    freed_dev.ptr = dev_ptr;
    freed_dev.size = size;
}

static void test_device_regions(void **state)
{
    fixture_t *f = *state;
    uint64_t pg = f->page;
    memset(&freed_dev, 0, sizeof freed_dev);
    pm_pool_t *p = NULL;
    assert_pm(pm_pool_create(f->m, "gpu", "cuda:0", 4 * pg, &p), PM_OK);
    uint8_t handle[PM_IPC_HANDLE_SIZE];
    for (int i = 0; i < PM_IPC_HANDLE_SIZE; i++)
        handle[i] = (uint8_t)(i * 7 + 1);
    void *fake = (void *)(uintptr_t)0x7f0000200000u; /* never dereferenced */
    void *fake2 = (void *)(uintptr_t)0x7f0000400000u;
    pm_region_t *r = (pm_region_t *)&r;

    /* No hook: nobody could free the memory, so no device region. */
    assert_pm(pm_region_alloc_device(p, 1, pg, fake, handle, &r), PM_EINVAL);
    assert_null(r);
    int ctx_tag = 0;
    pm_manager_set_device_free(f->m, count_device_free, &ctx_tag);
    assert_pm(pm_region_alloc_device(p, 1, pg, NULL, handle, &r), PM_EINVAL);
    assert_pm(pm_region_alloc_device(p, 1, pg, fake, NULL, &r), PM_EINVAL);
    assert_pm(pm_region_alloc_device(p, 0, pg, fake, handle, &r), PM_EINVAL);
    assert_pm(pm_region_alloc_device(p, 1, 0, fake, handle, &r), PM_EINVAL);

    int fds = count_open_fds();
    pm_region_t *d1 = NULL;
    assert_pm(pm_region_alloc_device(p, 1, pg + 1, fake, handle, &d1), PM_OK);
    assert_non_null(d1);
    assert_int_equal(count_open_fds(), fds); /* no memfd behind it */
    assert_int_equal(pm_region_is_device(d1), 1);
    assert_int_equal(pm_region_fd(d1), -1);
    assert_ptr_equal(pm_region_addr(d1), fake);
    assert_non_null(pm_region_ipc_handle(d1));
    assert_memory_equal(pm_region_ipc_handle(d1), handle, PM_IPC_HANDLE_SIZE);
    assert_int_equal(pm_region_size(d1), pg + 1);
    assert_int_equal(pm_region_mapped_size(d1), 2 * pg);
    assert_ptr_equal(pm_region_find(f->m, pm_region_id(d1)), d1);

    /* Host and device regions share the pool's accounting and limit. */
    pm_region_t *h = alloc_ok(p, 2, 1);
    assert_int_equal(pm_region_is_device(h), 0);
    assert_null(pm_region_ipc_handle(h));
    /* The caller's tag: 0 at allocation, kept per region. */
    assert_int_equal(pm_region_tag(d1), 0);
    assert_int_equal(pm_region_tag(h), 0);
    pm_region_set_tag(d1, 7);
    assert_int_equal(pm_region_tag(d1), 7);
    assert_int_equal(pm_region_tag(h), 0);
    pm_pool_info_t info = info_of(p);
    assert_int_equal(info.reserved_bytes, 3 * pg);
    assert_int_equal(info.used_bytes, pg + 2);
    assert_int_equal(info.regions, 2);
    assert_int_equal(info.sessions, 2);
    pm_usage_t u;
    pm_owner_usage(f->m, 1, &u);
    assert_int_equal(u.regions, 1);
    assert_int_equal(u.bytes, 2 * pg);

    /* Over the limit: refused, the caller keeps its pointer, the hook is not called. */
    assert_pm(pm_region_alloc_device(p, 1, pg + 1, fake2, handle, &r), PM_ELIMIT);
    assert_null(r);
    assert_int_equal(freed_dev.calls, 0);
    assert_int_equal(info_of(p).regions, 2);
    pm_region_t *d2 = NULL;
    assert_pm(pm_region_alloc_device(p, 1, pg, fake2, handle, &d2), PM_OK);
    assert_int_equal(info_of(p).reserved_bytes, 4 * pg);

    /* Freeing hands the memory to the hook once, with the pool's device, after accounting. */
    uint64_t d1_id = pm_region_id(d1);
    assert_pm(pm_region_free(f->m, d1_id, 2), PM_EPERM);
    assert_int_equal(freed_dev.calls, 0);
    assert_pm(pm_region_free(f->m, d1_id, 1), PM_OK);
    assert_int_equal(freed_dev.calls, 1);
    assert_ptr_equal(freed_dev.ctx, &ctx_tag);
    assert_string_equal(freed_dev.device, "cuda:0");
    assert_ptr_equal(freed_dev.ptr, fake);
    assert_int_equal(freed_dev.size, pg + 1);
    assert_null(pm_region_find(f->m, d1_id));
    info = info_of(p);
    assert_int_equal(info.reserved_bytes, 2 * pg);
    assert_int_equal(info.used_bytes, pg + 1);

    /* Reclaim by owner frees device regions through the hook too; host regions as before. */
    pm_usage_t got;
    pm_reclaim_owner(f->m, 1, &got);
    assert_int_equal(got.regions, 1);
    assert_int_equal(got.bytes, pg);
    assert_int_equal(freed_dev.calls, 2);
    assert_ptr_equal(freed_dev.ptr, fake2);
    assert_int_equal(freed_dev.size, pg);
    pm_reclaim_owner(f->m, 2, NULL);
    assert_int_equal(freed_dev.calls, 2);
    info = info_of(p);
    assert_int_equal(info.reserved_bytes, 0);
    assert_int_equal(info.regions, 0);
    assert_int_equal(info.sessions, 0);
    assert_int_equal(count_open_fds(), fds);
    assert_pm(pm_pool_delete(f->m, "gpu"), PM_OK);
}

/* A device region whose export is a descriptor (xpu: the allocation's fd, passed with the
 * handle): the region owns the fd and closes it when freed or reclaimed, beside the hook; on a
 * refusal the caller keeps it. */
static void test_device_regions_with_fd(void **state)
{
    fixture_t *f = *state;
    uint64_t pg = f->page;
    memset(&freed_dev, 0, sizeof freed_dev);
    pm_pool_t *p = NULL;
    assert_pm(pm_pool_create(f->m, "xpu", "xpu:0", 2 * pg, &p), PM_OK);
    uint8_t handle[PM_IPC_HANDLE_SIZE] = {1, 2, 3};
    void *fake = (void *)(uintptr_t)0x7f0000200000u; /* never dereferenced */
    pm_region_t *r = (pm_region_t *)&r;
    int fds = count_open_fds();
    int fd = memfd_create("xpu-export", MFD_CLOEXEC);
    assert_true(fd >= 0);

    /* No hook, or no fd: refused, the fd still the caller's. */
    assert_pm(pm_region_alloc_device_fd(p, 1, pg, fake, handle, fd, &r), PM_EINVAL);
    assert_null(r);
    int ctx_tag = 0;
    pm_manager_set_device_free(f->m, count_device_free, &ctx_tag);
    assert_pm(pm_region_alloc_device_fd(p, 1, pg, fake, handle, -1, &r), PM_EINVAL);
    assert_pm(pm_region_alloc_device_fd(p, 1, 3 * pg, fake, handle, fd, &r), PM_ELIMIT);
    assert_int_equal(fcntl(fd, F_GETFD), FD_CLOEXEC); /* still open */

    pm_region_t *d1 = NULL;
    assert_pm(pm_region_alloc_device_fd(p, 1, pg, fake, handle, fd, &d1), PM_OK);
    assert_int_equal(pm_region_is_device(d1), 1);
    assert_int_equal(pm_region_fd(d1), fd);
    assert_memory_equal(pm_region_ipc_handle(d1), handle, PM_IPC_HANDLE_SIZE);
    assert_int_equal(info_of(p).reserved_bytes, pg);
    assert_pm(pm_region_free(f->m, pm_region_id(d1), 1), PM_OK);
    assert_int_equal(freed_dev.calls, 1);
    assert_ptr_equal(freed_dev.ptr, fake);
    assert_int_equal(count_open_fds(), fds); /* the region closed it */

    /* Reclaim closes it too. */
    fd = memfd_create("xpu-export", MFD_CLOEXEC);
    assert_pm(pm_region_alloc_device_fd(p, 2, pg, fake, handle, fd, &d1), PM_OK);
    pm_reclaim_owner(f->m, 2, NULL);
    assert_int_equal(freed_dev.calls, 2);
    assert_int_equal(count_open_fds(), fds);
    assert_int_equal(info_of(p).reserved_bytes, 0);
    assert_pm(pm_pool_delete(f->m, "xpu"), PM_OK);
}

/* Borrowed device regions (a graph mempool's segments): found, freed and reclaimed like any
 * region, but counted nowhere, outside the limit, and never handed to the device-free hook. */
static void test_borrowed_regions(void **state)
{
    fixture_t *f = *state;
    uint64_t pg = f->page;
    memset(&freed_dev, 0, sizeof freed_dev);
    int ctx_tag = 0;
    pm_manager_set_device_free(f->m, count_device_free, &ctx_tag);
    pm_pool_t *p = NULL;
    assert_pm(pm_pool_create(f->m, "gpu", "cuda:0", 2 * pg, &p), PM_OK);
    uint8_t handle[PM_IPC_HANDLE_SIZE];
    for (int i = 0; i < PM_IPC_HANDLE_SIZE; i++)
        handle[i] = (uint8_t)(i * 5 + 3);
    void *seg = (void *)(uintptr_t)0x7f0000800000u; /* never dereferenced */
    pm_region_t *r = (pm_region_t *)&r;
    assert_pm(pm_region_borrow_device(NULL, 1, pg, seg, handle, &r), PM_EINVAL);
    assert_pm(pm_region_borrow_device(p, 1, pg, NULL, handle, &r), PM_EINVAL);
    assert_pm(pm_region_borrow_device(p, 1, pg, seg, NULL, &r), PM_EINVAL);
    assert_pm(pm_region_borrow_device(p, 0, pg, seg, handle, &r), PM_EINVAL);
    assert_pm(pm_region_borrow_device(p, 1, 0, seg, handle, &r), PM_EINVAL);
    assert_null(r);

    pm_region_t *d = NULL;
    assert_pm(pm_region_alloc_device(p, 1, pg, (void *)(uintptr_t)0x7f0000200000u, handle, &d),
              PM_OK);
    /* Ten pages in a pool limited to two: the segment is not the pool's memory. */
    pm_region_t *b1 = NULL, *b2 = NULL;
    assert_pm(pm_region_borrow_device(p, 1, 10 * pg + 3, seg, handle, &b1), PM_OK);
    assert_pm(pm_region_borrow_device(p, 2, 10 * pg + 3, seg, handle, &b2), PM_OK);
    assert_int_equal(pm_region_is_device(b1), 1);
    assert_int_equal(pm_region_is_borrowed(b1), 1);
    assert_int_equal(pm_region_is_borrowed(d), 0);
    assert_ptr_equal(pm_region_addr(b1), seg);
    assert_memory_equal(pm_region_ipc_handle(b1), handle, PM_IPC_HANDLE_SIZE);
    assert_int_equal(pm_region_size(b1), 10 * pg + 3); /* what MAP hands out, unrounded */
    assert_int_equal(pm_region_mapped_size(b1), 10 * pg + 3);
    assert_int_equal(pm_region_owner(b2), 2);
    assert_ptr_equal(pm_region_find(f->m, pm_region_id(b1)), b1);
    assert_true(pm_region_id(b2) > pm_region_id(b1));
    pm_pool_info_t info = info_of(p);
    assert_int_equal(info.regions, 1);
    assert_int_equal(info.reserved_bytes, pg);
    assert_int_equal(info.used_bytes, pg);
    pm_usage_t u;
    pm_owner_usage(f->m, 1, &u);
    assert_int_equal(u.regions, 1);
    assert_int_equal(u.bytes, pg);
    pm_owner_usage(f->m, 2, &u);
    assert_int_equal(u.regions, 0);
    assert_int_equal(u.bytes, 0);
    /* While a borrowed region lives, the pool cannot go. */
    assert_pm(pm_region_free(f->m, pm_region_id(d), 1), PM_OK);
    assert_int_equal(freed_dev.calls, 1);
    assert_int_equal(info_of(p).regions, 0);
    assert_pm(pm_pool_delete(f->m, "gpu"), PM_EBUSY);

    /* Freed by its owner only, and never through the hook. */
    uint64_t id1 = pm_region_id(b1), id2 = pm_region_id(b2);
    assert_pm(pm_region_free(f->m, id2, 1), PM_EPERM);
    assert_pm(pm_region_free(f->m, id2, 2), PM_OK);
    assert_null(pm_region_find(f->m, id2));
    pm_usage_t got;
    pm_reclaim_owner(f->m, 1, &got);
    assert_int_equal(got.regions, 0);
    assert_int_equal(got.bytes, 0);
    assert_null(pm_region_find(f->m, id1));
    assert_int_equal(freed_dev.calls, 1);
    info = info_of(p);
    assert_int_equal(info.regions, 0);
    assert_int_equal(info.sessions, 0);
    assert_pm(pm_pool_delete(f->m, "gpu"), PM_OK);
}

/* The owner is the caller's to set; the manager answers who may use the pool by its mode. */
static void test_pool_owner_and_mode(void **state)
{
    fixture_t *f = *state;
    pm_pool_t *p = make_pool(f, "owned", 0);
    pm_pool_info_t info = info_of(p);
    assert_int_equal(info.owner.mode, PM_MODE_PUBLIC); /* until the caller says otherwise */
    assert_int_equal(pm_pool_may_use(p, 7, 7), 1);
    pm_pool_owner_t o = {1001, 100, PM_MODE_PRIVATE, 42};
    assert_pm(pm_pool_set_owner(p, &o), PM_OK);
    info = info_of(p);
    assert_int_equal(info.owner.uid, 1001);
    assert_int_equal(info.owner.gid, 100);
    assert_int_equal(info.owner.session, 42);
    assert_int_equal(pm_pool_may_use(p, 1001, 5), 1);
    assert_int_equal(pm_pool_may_use(p, 1002, 100), 0); /* same group, but private */
    o.mode = PM_MODE_GROUP;
    assert_pm(pm_pool_set_owner(p, &o), PM_OK);
    assert_int_equal(pm_pool_may_use(p, 1002, 100), 1);
    assert_int_equal(pm_pool_may_use(p, 1002, 101), 0);
    o.mode = PM_MODE_PUBLIC;
    assert_pm(pm_pool_set_owner(p, &o), PM_OK);
    assert_int_equal(pm_pool_may_use(p, 1002, 101), 1);
    o.mode = 0;
    assert_pm(pm_pool_set_owner(p, &o), PM_EINVAL);
    o.mode = 4;
    assert_pm(pm_pool_set_owner(p, &o), PM_EINVAL);
    assert_pm(pm_pool_set_owner(NULL, &o), PM_EINVAL);
    assert_int_equal(info_of(p).owner.mode, PM_MODE_PUBLIC); /* unchanged by the refusals */
    assert_int_equal(pm_pool_may_use(NULL, 0, 0), 0);
    assert_pm(pm_pool_delete(f->m, "owned"), PM_OK);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_err_strings),
        T(test_pool_create_find_delete),
        T(test_pool_name_validation),
        T(test_pool_duplicate),
        T(test_pool_list),
        T(test_pool_delete_busy),
        T(test_alloc_sizes),
        T(test_accounting),
        T(test_limit),
        T(test_region_memfd_shared),
        T(test_region_seals),
        T(test_region_ids),
        T(test_region_free_errors),
        T(test_reclaim_owner),
        T(test_manager_destroy_busy),
        T(test_many_regions),
        T(test_alloc_syscall_failure),
        T(test_device_regions),
        T(test_device_regions_with_fd),
        T(test_borrowed_regions),
        T(test_pool_owner_and_mode),
    };
#undef T
    return cmocka_run_group_tests_name("pool_manager", tests, NULL, NULL);
}
