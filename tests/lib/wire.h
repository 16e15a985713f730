/*
 * Raw protobuf encoding and session-socket frame I/O for the integration
 * tests (tests/lib/wire.c). Every function asserts with cmocka.
 */
#ifndef GRAPHD_TEST_WIRE_H
#define GRAPHD_TEST_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "graphd_frame.h"

typedef struct pb {
    uint8_t buf[256];
    size_t len;
} pb_t;

void pb_varint(pb_t *p, uint64_t v);
void pb_uint(pb_t *p, unsigned field, uint64_t v);
void pb_fixed64(pb_t *p, unsigned field, uint64_t v);
void pb_bytes(pb_t *p, unsigned field, const void *data, size_t n);
/* SessionRef{id, token} as field 1 of the enclosing message. */
void pb_session(pb_t *p, uint64_t id, uint64_t token);

int dp_connect(const char *path);
/* The descriptors of this process connected to the Unix socket at path (at most max): with the
 * set from before a client connected, they find that client's own session socket. */
size_t dp_fds_to(const char *path, int *fds, size_t max);
/* A libgraphd client (harness_client) and the descriptor of its session socket in this process,
 * for tests that write raw frames on a client's own connection. */
typedef struct harness harness_t;
typedef struct graphd_client graphd_client_t;
graphd_client_t *dp_client_with_fd(const harness_t *h, const char *name, int *fd);
void dp_send(int fd, const void *buf, size_t n);
void dp_send_frame(int fd, uint16_t type, uint64_t seq, uint64_t id, uint64_t arg);
/* Reads exactly n bytes within 5 s; returns bytes read (< n at EOF), closing passed fds. */
size_t dp_read(int fd, void *buf, size_t n);
/* Reads one frame (and its message) and checks magic and version. */
void dp_recv_frame(int fd, graphd_frame_t *f, char *msg, size_t msg_size);
/* A DIRECT frame for graph_id with arg on the session socket fd, and its reply into *rep and msg:
 * the replay connection that came with it, or -1 (an error reply, or one the session has). */
int dp_direct(int fd, uint64_t seq, uint64_t graph_id, uint64_t arg, graphd_frame_t *rep, char *msg,
              size_t msg_size);
/* The daemon must answer with one ERROR frame (INVALID_ARGUMENT) and then close; fd stays open. */
void expect_error_then_close(int fd, const char *what);

#endif
