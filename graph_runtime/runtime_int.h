/*
 * graph_runtime internals shared by the C part (runtime.c) and the C++ shim: the per-thread
 * error message. C-compatible; the C++-only engine internals (device families, the bodies of
 * gr_event_t and gr_seq_t) are in engine_int.h.
 */
#ifndef GRAPHD_RUNTIME_INT_H
#define GRAPHD_RUNTIME_INT_H

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GR__MSG_MAX 1024 /* bytes kept of a per-thread message, NUL included */

/* Stores msg (truncated to GR__MSG_MAX - 1 bytes) as this thread's last error; returns err. */
int gr__set_error(int err, const char *msg);
/* printf-style gr__set_error. */
int gr__set_errorf(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif
