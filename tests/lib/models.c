/*
 * Test models for the graph integration tests: tests/models/make_models.py
 * run at group setup into a temporary directory, its reference vectors, and
 * a copy of a captured graph's tensor list with lookups by role and index.
 */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define SCRIPT "tests/models/make_models.py"

/* The source root holding SCRIPT: $GRAPHD_SRC, ".", or the directory above the build dir. */
static int find_script(char *out, size_t size)
{
    const char *src = getenv("GRAPHD_SRC");
    if (src != NULL && src[0] != '\0') {
        snprintf(out, size, "%s/" SCRIPT, src);
        return 0;
    }
    if (access(SCRIPT, R_OK) == 0) {
        snprintf(out, size, "%s", SCRIPT);
        return 0;
    }
    char build[PATH_MAX];
    if (realpath(harness_build_dir(), build) != NULL) {
        snprintf(out, size, "%s/" SCRIPT, dirname(build));
        if (access(out, R_OK) == 0)
            return 0;
    }
    fprintf(stderr, "harness: cannot find %s (set GRAPHD_SRC to the source tree)\n", SCRIPT);
    return -1;
}

static int run_script(const char *script, const char *dir)
{
    const char *python = getenv("GRAPHD_PYTHON");
    if (python == NULL || python[0] == '\0')
        python = "/usr/bin/python3";
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execl(python, python, script, dir, (char *)NULL);
        fprintf(stderr, "harness: exec %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "harness: %s %s failed (status 0x%x; GRAPHD_PYTHON picks the python)\n",
                python, script, (unsigned)status);
        return -1;
    }
    return 0;
}

static int load_refs(harness_models_t *m)
{
    size_t len = 0;
    char *text = harness_models_read(m, "ref.txt", &len);
    if (text == NULL)
        return -1;
    char *grown = realloc(text, len + 1);
    if (grown == NULL) {
        free(text);
        return -1;
    }
    text = grown;
    text[len] = '\0';
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *p = line, *end;
        char *key = strsep(&p, " ");
        if (p == NULL)
            continue;
        size_t n = strtoul(p, &end, 10);
        harness_ref_t e = {strdup(key), n, calloc(n ? n : 1, sizeof(double))};
        harness_ref_t *refs = realloc(m->refs, (m->n_refs + 1) * sizeof(*m->refs));
        if (e.key == NULL || e.v == NULL || refs == NULL) {
            free(e.key);
            free(e.v);
            if (refs != NULL)
                m->refs = refs;
            free(text);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            e.v[i] = strtod(end, &end);
        m->refs = refs;
        m->refs[m->n_refs++] = e;
    }
    free(text);
    return 0;
}

int harness_models_make(harness_models_t *m)
{
    memset(m, 0, sizeof(*m));
    char script[PATH_MAX + 64];
    if (find_script(script, sizeof(script)) != 0)
        return -1;
    snprintf(m->dir, sizeof(m->dir), "/tmp/graphd-models-XXXXXX");
    if (mkdtemp(m->dir) == NULL) {
        fprintf(stderr, "harness: mkdtemp: %s\n", strerror(errno));
        m->dir[0] = '\0';
        return -1;
    }
    if (run_script(script, m->dir) != 0 || load_refs(m) != 0) {
        harness_models_remove(m);
        return -1;
    }
    return 0;
}

void harness_models_remove(harness_models_t *m)
{
    if (m->dir[0] != '\0') {
        DIR *d = opendir(m->dir);
        if (d != NULL) {
            struct dirent *e;
            while ((e = readdir(d)) != NULL)
                if (e->d_name[0] != '.')
                    unlink(harness_models_path(m, e->d_name));
            closedir(d);
        }
        rmdir(m->dir);
        m->dir[0] = '\0';
    }
    for (size_t i = 0; i < m->n_refs; i++) {
        free(m->refs[i].key);
        free(m->refs[i].v);
    }
    free(m->refs);
    m->refs = NULL;
    m->n_refs = 0;
}

const char *harness_models_path(const harness_models_t *m, const char *name)
{
    /* One per thread: tests read models from several threads at once, and snprintf empties its
     * buffer before it writes, so a shared one gave another thread's fopen "" now and then. */
    static _Thread_local char path[HARNESS_PATH_MAX * 2];
    snprintf(path, sizeof(path), "%s/%s", m->dir, name);
    return path;
}

void *harness_models_read(const harness_models_t *m, const char *name, size_t *len)
{
    const char *path = harness_models_path(m, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "harness: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = n >= 0 ? malloc(n > 0 ? (size_t)n : 1) : NULL;
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf == NULL)
        fprintf(stderr, "harness: cannot read %s\n", path);
    *len = buf != NULL ? (size_t)n : 0;
    return buf;
}

const double *harness_models_ref(const harness_models_t *m, const char *key, size_t n)
{
    for (size_t i = 0; i < m->n_refs; i++) {
        if (strcmp(m->refs[i].key, key) != 0)
            continue;
        if (n != 0 && m->refs[i].n != n) {
            fprintf(stderr, "harness: reference %s has %zu values, not %zu\n", key, m->refs[i].n,
                    n);
            return NULL;
        }
        return m->refs[i].v;
    }
    fprintf(stderr, "harness: no reference %s\n", key);
    return NULL;
}

uint64_t harness_models_register(graphd_client_t *c, const harness_models_t *m, const char *name)
{
    size_t len = 0;
    void *bytes = harness_models_read(m, name, &len);
    if (bytes == NULL)
        return 0;
    uint64_t id = 0;
    int rc = graphd_module_register(c, bytes, len, name, &id);
    free(bytes);
    if (rc != GRAPHD_OK) {
        fprintf(stderr, "harness: register %s: %s: %s\n", name, graphd_err_name(rc),
                graphd_last_error(c));
        return 0;
    }
    return id;
}

int harness_capture_matrix(graphd_client_t *c, const harness_models_t *m, const char *model,
                           int64_t rows, int64_t cols, harness_graph_t *out)
{
    uint64_t mid = harness_models_register(c, m, model);
    if (mid == 0)
        return -1;
    graphd_tensor_spec_t arg;
    memset(&arg, 0, sizeof arg);
    arg.dtype = GRAPHD_FLOAT32;
    arg.ndim = 2;
    arg.shape[0] = rows;
    arg.shape[1] = cols;
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.num_warmup_iters = 0;
    graphd_graph_t *g = NULL;
    int rc = graphd_capture(c, 1, &callable, &opts, &g);
    if (rc != GRAPHD_OK) {
        fprintf(stderr, "harness: capture %s: %s: %s\n", model, graphd_err_name(rc),
                graphd_last_error(c));
        return -1;
    }
    return harness_graph_load(out, c, g);
}

int harness_graph_load(harness_graph_t *hg, graphd_client_t *c, graphd_graph_t *g)
{
    memset(hg, 0, sizeof(*hg));
    hg->c = c;
    hg->g = g;
    size_t n = 0;
    if (graphd_graph_tensors(g, &n, NULL) != GRAPHD_OK)
        return -1;
    hg->t = calloc(n + 1, sizeof(*hg->t));
    if (hg->t == NULL)
        return -1;
    size_t got = n;
    int rc = graphd_graph_tensors(g, &got, hg->t);
    if (rc != GRAPHD_OK || got != n) {
        fprintf(stderr, "harness: graphd_graph_tensors: %s: %s\n", graphd_err_name(rc),
                graphd_last_error(c));
        free(hg->t);
        hg->t = NULL;
        return -1;
    }
    hg->n = n;
    return 0;
}

int harness_graph_release(harness_graph_t *hg)
{
    int rc = graphd_graph_release(hg->g);
    free(hg->t);
    memset(hg, 0, sizeof(*hg));
    return rc;
}

const graphd_tensor_t *harness_tensor(const harness_graph_t *hg, int role, uint32_t index)
{
    for (size_t k = 0; k < hg->n; k++)
        if (hg->t[k].role == role && hg->t[k].index == index)
            return &hg->t[k];
    return NULL;
}

size_t harness_count_role(const harness_graph_t *hg, int role)
{
    size_t n = 0;
    for (size_t k = 0; k < hg->n; k++)
        n += hg->t[k].role == role;
    return n;
}

size_t harness_numel(const graphd_tensor_t *t)
{
    size_t n = 1;
    for (uint32_t k = 0; k < t->ndim; k++)
        n *= (size_t)t->shape[k];
    return n;
}

int harness_fixture_start(harness_fixture_t *f, const char *const *extra_args)
{
    if (harness_models_make(&f->m) != 0)
        return -1;
    if (harness_start(&f->h, extra_args) != 0) {
        harness_models_remove(&f->m);
        return -1;
    }
    return 0;
}

int harness_fixture_start_shared(harness_fixture_t *f, const char *const *extra_args)
{
    if (harness_fixture_start(f, extra_args) != 0)
        return -1;
    if (chmod(f->h.dir, 0755) != 0 || chmod(f->m.dir, 0755) != 0) {
        harness_fixture_stop(f);
        return -1;
    }
    DIR *d = opendir(f->m.dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            chmod(harness_models_path(&f->m, e->d_name), 0644);
    if (d)
        closedir(d);
    return 0;
}

void harness_fixture_attach(harness_fixture_t *f, const char *address, const char *models_dir)
{
    memset(f, 0, sizeof *f);
    snprintf(f->h.address, sizeof f->h.address, "%s", address);
    snprintf(f->m.dir, sizeof f->m.dir, "%s", models_dir);
}

int harness_fixture_stop(harness_fixture_t *f)
{
    int rc = harness_stop(&f->h);
    harness_models_remove(&f->m);
    return rc == 0 ? 0 : -1;
}
