/*
 * The one unary gRPC call of libgraphd: pack a protobuf-c request, run one
 * batch (send metadata, message and close; receive metadata, message and
 * status) on the client's pluck queue, unpack the reply.
 */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "graphd_int.h"

/* Slack past the call deadline before pluck gives up on a call gRPC failed to end. */
#define PLUCK_SLACK_MS 5000

/*
 * Why a unix socket address cannot be reached, in words a user can act on, when the cause is on
 * this side: the socket is not there (no daemon), or this user may not open it (not in the
 * socket's group). 0 when neither: gRPC's own message then stands.
 */
static int unix_socket_hint(const char *address, char *hint, size_t len)
{
    if (strncmp(address, "unix:", 5) != 0)
        return 0;
    const char *path = address + 5;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return 0;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int err = errno;
    close(fd);
    if (rc == 0)
        return 0;
    struct stat st;
    if (err == ENOENT) {
        snprintf(hint, len,
                 "no socket at %s: is graphd running there? (systemctl status graphd; or set "
                 "GRAPHD_ADDRESS to the daemon's listen address)",
                 path);
        return 1;
    }
    if (err == EACCES || err == EPERM) {
        char group[64] = "?";
        if (stat(path, &st) != 0) { /* a directory on the way is closed to this uid */
            snprintf(hint, len,
                     "permission denied: uid %u may not reach %s (a directory on its path is "
                     "closed to it: %s); ask the operator",
                     (unsigned)getuid(), path, strerror(errno));
            return 1;
        }
        if (st.st_gid == 0) { /* joining root's group is no advice to give */
            snprintf(hint, len,
                     "permission denied: uid %u may not open %s: its group is root; ask the "
                     "operator to create the group that socket_group in graphd.conf names "
                     "(graphd unless set; graphd warns at start when it does not exist), to "
                     "restart graphd, and to add you to that group",
                     (unsigned)getuid(), path);
            return 1;
        }
        struct group *g = getgrgid(st.st_gid);
        if (g != NULL)
            snprintf(group, sizeof(group), "%s", g->gr_name);
        else
            snprintf(group, sizeof(group), "%u", (unsigned)st.st_gid);
        snprintf(hint, len,
                 "permission denied: uid %u may not open %s (or its directory); join its group "
                 "'%s' (sudo usermod -aG %s $USER, then log in again) or ask the operator",
                 (unsigned)getuid(), path, group, group);
        return 1;
    }
    return 0;
}

static int unpack_reply(graphd_client_t *c, const char *method, grpc_byte_buffer *bb,
                        const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply)
{
    grpc_byte_buffer_reader reader;
    if (bb == NULL)
        return graphd__fail(c, GRAPHD_EPROTO, "%s: OK status without a reply message", method);
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return graphd__fail(c, GRAPHD_EPROTO, "%s: cannot read the reply message", method);
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    *reply =
        protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    if (*reply == NULL)
        return graphd__fail(c, GRAPHD_EPROTO, "%s: reply does not decode as %s", method,
                            desc->name);
    return GRAPHD_OK;
}

int graphd__call(graphd_client_t *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply)
{
    *reply = NULL;
    if (c->channel == NULL)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "%s: the client is closed", method);

    size_t len = protobuf_c_message_get_packed_size(req);
    grpc_slice req_slice = grpc_slice_malloc(len);
    protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(req_slice));
    grpc_byte_buffer *send_bb = grpc_raw_byte_buffer_create(&req_slice, 1);
    grpc_slice_unref(req_slice);

    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(c->timeout_ms, GPR_TIMESPAN));
    grpc_call *call =
        grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                 grpc_slice_from_static_string(method), NULL, deadline, NULL);
    if (call == NULL) {
        grpc_byte_buffer_destroy(send_bb);
        return graphd__fail(c, GRAPHD_EINTERNAL, "%s: grpc_channel_create_call failed", method);
    }

    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_byte_buffer *recv_bb = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;

    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;

    int rc = GRAPHD_OK;
    void *tag = call; /* unique while the call lives */
    grpc_call_error ce = grpc_call_start_batch(call, ops, 6, tag, NULL);
    if (ce != GRPC_CALL_OK) {
        rc = graphd__fail(c, GRAPHD_EINTERNAL, "%s: grpc_call_start_batch: error %d", method,
                          (int)ce);
        goto out;
    }
    gpr_timespec pluck_deadline =
        gpr_time_add(deadline, gpr_time_from_millis(PLUCK_SLACK_MS, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(c->cq, tag, pluck_deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
        /* Should not happen: the call's own deadline ends it first. Cancel and wait for it. */
        grpc_call_cancel(call, NULL);
        grpc_completion_queue_pluck(c->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        rc = graphd__fail(c, GRAPHD_EDEADLINE_EXCEEDED, "%s: no completion from gRPC", method);
        goto out;
    }

    if (status != GRPC_STATUS_OK) {
        char *msg = grpc_slice_to_c_string(details);
        char hint[512];
        if (status == GRPC_STATUS_UNAVAILABLE && unix_socket_hint(c->address, hint, sizeof(hint)))
            rc = graphd__fail(c, GRAPHD_EUNAVAILABLE, "%s; %s",
                              msg[0]         ? msg
                              : error_string ? error_string
                                             : "unavailable",
                              hint);
        else if (msg[0] != '\0')
            rc = graphd__fail(c, graphd_err_from_grpc(status), "%s", msg);
        else if (error_string != NULL)
            rc = graphd__fail(c, graphd_err_from_grpc(status), "%s", error_string);
        else
            rc = graphd__fail(c, graphd_err_from_grpc(status), "%s",
                              graphd_strerror(graphd_err_from_grpc(status)));
        gpr_free(msg);
        goto out;
    }
    rc = unpack_reply(c, method, recv_bb, reply_desc, reply);

out:
    if (error_string != NULL)
        gpr_free((void *)error_string);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    if (recv_bb != NULL)
        grpc_byte_buffer_destroy(recv_bb);
    grpc_byte_buffer_destroy(send_bb);
    grpc_call_unref(call);
    return rc;
}
