/*
 * graph_runtime internals shared by the C part (runtime.c) and the C++ shim: the per-thread
 * error message. C-compatible; the C++-only engine internals are in engine_int.h.
 */
#ifndef GRAPHD_RUNTIME_INT_H
#define GRAPHD_RUNTIME_INT_H

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA IPC event (device_mem.cpp): event is the cudaEvent_t, held as a pointer so that the
 * engine needs no CUDA headers. */
struct gr_event {
    int device; /* CUDA device index */
    void *event;
    int opened; /* opened from another process's handle, not created here */
};

/* Sequence counters (device_mem.cpp): mem is their device memory, stream a cudaStream_t of
 * their own (non-blocking). */
struct gr_seq {
    int device;
    void *mem;
    void *stream;
};

/* CUDA stream memory operations on 64-bit values (the driver's cuStreamWaitValue64 with
 * CU_STREAM_WAIT_VALUE_GEQ, and cuStreamWriteValue64), resolved once: 0, or a CUresult (-1 when
 * the driver has none). stream is a cudaStream_t. */
int gr__stream_wait_geq(void *stream, const void *addr, uint64_t value);
int gr__stream_write(void *stream, void *addr, uint64_t value);

#define GR__MSG_MAX 1024 /* bytes kept of a per-thread message, NUL included */

/* Stores msg (truncated to GR__MSG_MAX - 1 bytes) as this thread's last error; returns err. */
int gr__set_error(int err, const char *msg);
/* printf-style gr__set_error. */
int gr__set_errorf(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif
