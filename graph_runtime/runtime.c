/*
 * graph_runtime, C part: the error, dtype and role tables, the per-thread error message,
 * SHA-256 (OpenSSL libcrypto) and the MPS pipe look-up. Everything that touches libtorch is in
 * the C++ shim.
 */
#include "runtime_int.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/evp.h>

static _Thread_local char last_error[GR__MSG_MAX];

const char *gr_strerror(int err)
{
    switch (err) {
#define GR_ERR_STR(name, value, msg, grpc)                                                         \
    case GR_##name:                                                                                \
        return msg;
        GR_ERR_MAP(GR_ERR_STR)
#undef GR_ERR_STR
    }
    return "unknown error";
}

const char *gr_err_name(int err)
{
    switch (err) {
#define GR_ERR_NAME(name, value, msg, grpc)                                                        \
    case GR_##name:                                                                                \
        return "GR_" #name;
        GR_ERR_MAP(GR_ERR_NAME)
#undef GR_ERR_NAME
    }
    return "GR_UNKNOWN";
}

int gr_err_grpc(int err)
{
    switch (err) {
#define GR_ERR_GRPC(name, value, msg, grpc)                                                        \
    case GR_##name:                                                                                \
        return grpc;
        GR_ERR_MAP(GR_ERR_GRPC)
#undef GR_ERR_GRPC
    }
    return 13; /* INTERNAL */
}

const char *gr_last_error(void)
{
    return last_error;
}

int gr__set_error(int err, const char *msg)
{
    snprintf(last_error, sizeof(last_error), "%s", msg ? msg : "");
    return err;
}

int gr__set_errorf(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return err;
}

size_t gr_dtype_size(int dtype)
{
    switch (dtype) {
#define GR_DTYPE_SIZE(name, value, size, str)                                                      \
    case GR_DTYPE_##name:                                                                          \
        return size;
        GR_DTYPE_MAP(GR_DTYPE_SIZE)
#undef GR_DTYPE_SIZE
    }
    return 0;
}

const char *gr_dtype_name(int dtype)
{
    switch (dtype) {
#define GR_DTYPE_STR(name, value, size, str)                                                       \
    case GR_DTYPE_##name:                                                                          \
        return str;
        GR_DTYPE_MAP(GR_DTYPE_STR)
#undef GR_DTYPE_STR
    }
    return NULL;
}

gr_dtype_t gr_dtype_from_name(const char *name)
{
    if (name == NULL)
        return GR_DTYPE_INVALID;
#define GR_DTYPE_CMP(n, value, size, str)                                                          \
    if (strcmp(name, str) == 0)                                                                    \
        return GR_DTYPE_##n;
    GR_DTYPE_MAP(GR_DTYPE_CMP)
#undef GR_DTYPE_CMP
    return GR_DTYPE_INVALID;
}

int gr_dtype_is_floating(int dtype)
{
    return dtype == GR_DTYPE_F32 || dtype == GR_DTYPE_F64 || dtype == GR_DTYPE_F16 ||
           dtype == GR_DTYPE_BF16;
}

const char *gr_role_name(int role)
{
    switch (role) {
#define GR_ROLE_STR(name, value, str)                                                              \
    case GR_ROLE_##name:                                                                           \
        return str;
        GR_ROLE_MAP(GR_ROLE_STR)
#undef GR_ROLE_STR
    }
    return NULL;
}

int gr_sha256(const void *data, size_t len, uint8_t out[GR_SHA256_LEN])
{
    unsigned int n = 0;

    if ((data == NULL && len > 0) || out == NULL)
        return gr__set_error(GR_EINVAL, "gr_sha256: NULL data or output");
    if (EVP_Digest(data ? data : "", len, out, &n, EVP_sha256(), NULL) != 1 || n != GR_SHA256_LEN)
        return gr__set_error(GR_EINTERNAL, "gr_sha256: EVP_Digest failed");
    return GR_OK;
}

void gr_capture_opts_init(gr_capture_opts_t *o)
{
    if (o == NULL)
        return;
    o->num_warmup_iters = 3;
    o->allow_unused_input = 0;
    o->pool = NULL;
    o->resident = 0;
    o->copy_param_grads = 1;
    o->reuse_warmup = 1;
}

int gr_cuda_mps_pipe(char *dir, size_t len)
{
    if (dir == NULL && len > 0)
        return gr__set_error(GR_EINVAL, "gr_cuda_mps_pipe: NULL dir");
    const char *path = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (path == NULL || path[0] == '\0')
        path = "/tmp/nvidia-mps"; /* the default of nvidia-cuda-mps-control and of CUDA clients */
    if (len > 0)
        snprintf(dir, len, "%s", path);
    char control[PATH_MAX];
    struct stat st;
    if ((size_t)snprintf(control, sizeof control, "%s/control", path) >= sizeof control)
        return 0; /* no such path can exist */
    return stat(control, &st) == 0 ? 1 : 0;
}
