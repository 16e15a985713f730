/*
 * Training-step benchmark of the graph_runtime CUDA family, host-staged, called in-process from C
 * (no daemon, no sockets): one MLP captured on cuda:0 over a static block in a memfd mapping (as
 * the daemon's shared regions are), then STEPS training steps: write the input, FORWARD replay,
 * MSE loss and its gradient on the host, BACKWARD replay, SGD on the host over the PARAM tensors.
 * bench/train_cuda.py runs it beside eager PyTorch and torch.cuda.make_graphed_callables.
 *
 * Usage: train_cuda_graphd MODEL.pt BATCH WIDTH [STEPS]   (MODEL: TorchScript, input BATCH x WIDTH)
 * Prints one line: "graphd_host_staged step_ms=... replay_ms=... loss0=... loss=...". Exits 0
 * with a note when gr_devices lists no CUDA device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

#define LR 1e-3f

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int die(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", what, gr_err_name(rc), gr_last_error());
    return 1;
}

static size_t numel(const gr_tensor_desc_t *d)
{
    size_t n = 1;
    for (uint32_t k = 0; k < d->ndim; k++)
        n *= (size_t)d->shape[k];
    return n;
}

static const gr_tensor_desc_t *find(const gr_tensor_desc_t *l, size_t n, int role, uint32_t i)
{
    for (size_t k = 0; k < n; k++)
        if (l[k].role == role && l[k].index == i)
            return &l[k];
    return NULL;
}

/* The float tensor at offset of the block. */
static float *f32_at(uint8_t *block, uint64_t offset)
{
    void *p = block + offset;
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.pt BATCH WIDTH [STEPS]\n", argv[0]);
        return 2;
    }
    int64_t batch = atoll(argv[2]), width = atoll(argv[3]);
    int steps = argc > 4 ? atoi(argv[4]) : 200;
    size_t ndev = 0;
    if (gr_devices(&ndev, NULL) != GR_OK || ndev == 0) {
        printf("graphd_host_staged skipped: no CUDA device\n");
        return 0;
    }
    size_t len = 0;
    void *bytes = read_all(argv[1], &len);
    if (bytes == NULL) {
        perror(argv[1]);
        return 1;
    }
    gr_module_t *m = NULL;
    int rc = gr_module_load(bytes, len, &m);
    free(bytes);
    if (rc != GR_OK)
        return die("load", rc);

    gr_arg_spec_t arg;
    memset(&arg, 0, sizeof arg);
    arg.dtype = GR_DTYPE_F32;
    arg.ndim = 2;
    arg.shape[0] = batch;
    arg.shape[1] = width;
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    double t0 = now_ms();
    gr_capture_t *cap = NULL;
    if ((rc = gr_capture_prepare("cuda:0", 1, &spec, NULL, &cap)) != GR_OK)
        return die("prepare", rc);
    size_t count = 0;
    uint64_t total = 0;
    gr_capture_layout(cap, 0, &count, NULL, &total);
    gr_tensor_desc_t *l = calloc(count, sizeof *l);
    gr_capture_layout(cap, 0, &count, l, NULL);
    int fd = memfd_create("graphd-bench", 0);
    if (fd < 0 || ftruncate(fd, (off_t)total) != 0) {
        perror("memfd");
        return 1;
    }
    uint8_t *block = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (block == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    void *bases[1] = {block};
    gr_graph_t *g = NULL;
    if ((rc = gr_capture_finish(cap, bases, &g)) != GR_OK)
        return die("finish", rc);
    double capture_ms = now_ms() - t0;

    const gr_tensor_desc_t *in = find(l, count, GR_ROLE_INPUT, 0);
    const gr_tensor_desc_t *out = find(l, count, GR_ROLE_OUTPUT, 0);
    const gr_tensor_desc_t *gout = find(l, count, GR_ROLE_GRAD_OUTPUT, 0);
    size_t n_in = numel(in), n_out = numel(out);
    float *x = malloc(n_in * sizeof *x), *y = malloc(n_out * sizeof *y);
    srand(1);
    for (size_t i = 0; i < n_in; i++)
        x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < n_out; i++)
        y[i] = (float)rand() / RAND_MAX - 0.5f;

    double loss0 = 0, loss = 0, replay_ms = 0, step_ms = 0;
    int warm = 20;
    for (int s = 0; s < warm + steps; s++) {
        double s0 = now_ms();
        memcpy(block + in->offset, x, n_in * sizeof *x);
        uint64_t ns_f = 0, ns_b = 0;
        if ((rc = gr_graph_replay(g, GR_PHASE_FORWARD, NULL, &ns_f)) != GR_OK)
            return die("forward", rc);
        const float *o = f32_at(block, out->offset);
        float *go = f32_at(block, gout->offset);
        double acc = 0;
        for (size_t i = 0; i < n_out; i++) {
            float d = o[i] - y[i];
            acc += (double)d * d;
            go[i] = 2.0f / (float)n_out * d;
        }
        loss = acc / (double)n_out;
        if ((rc = gr_graph_replay(g, GR_PHASE_BACKWARD, NULL, &ns_b)) != GR_OK)
            return die("backward", rc);
        for (size_t k = 0; k < count; k++) {
            if (l[k].role != GR_ROLE_PARAM_GRAD)
                continue;
            const gr_tensor_desc_t *p = find(l, count, GR_ROLE_PARAM, l[k].index);
            float *pv = f32_at(block, p->offset);
            const float *gv = f32_at(block, l[k].offset);
            for (size_t i = 0, n = numel(p); i < n; i++)
                pv[i] -= LR * gv[i];
        }
        if (s == 0)
            loss0 = loss;
        if (s >= warm) {
            step_ms += now_ms() - s0;
            replay_ms += (double)(ns_f + ns_b) / 1e6;
        }
    }
    printf("graphd_host_staged step_ms=%.4f replay_ms=%.4f capture_ms=%.1f block_bytes=%llu "
           "loss0=%.6g loss=%.6g\n",
           step_ms / steps, replay_ms / steps, capture_ms, (unsigned long long)total, loss0, loss);
    gr_graph_destroy(g);
    munmap(block, total);
    close(fd);
    gr_module_release(m);
    free(l);
    free(x);
    free(y);
    return 0;
}
