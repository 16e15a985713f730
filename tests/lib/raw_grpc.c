/*
 * A unary gRPC call with raw request bytes, for the tests that send what
 * libgraphd never would (undecodable or hand-made messages).
 */
#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "harness.h"

int harness_raw_call(const char *address, const char *method, const void *req, size_t req_len,
                     char *details, size_t details_size, uint8_t *reply, size_t *reply_len)
{
    grpc_init();
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(address, creds, NULL);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);

    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(10000, GPR_TIMESPAN));
    grpc_slice method_slice = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method_slice,
                                               NULL, deadline, NULL);
    grpc_slice_unref(method_slice);

    grpc_slice req_slice = grpc_slice_from_copied_buffer(req, req_len);
    grpc_byte_buffer *send_bb = grpc_raw_byte_buffer_create(&req_slice, 1);
    grpc_slice_unref(req_slice);
    grpc_metadata_array md_in, md_trail;
    grpc_metadata_array_init(&md_in);
    grpc_metadata_array_init(&md_trail);
    grpc_byte_buffer *recv_bb = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice status_details = grpc_empty_slice();

    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_in;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &md_trail;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &status_details;

    int rc = -1;
    if (grpc_call_start_batch(call, ops, 6, call, NULL) == GRPC_CALL_OK) {
        grpc_event ev =
            grpc_completion_queue_pluck(cq, call, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            rc = (int)status;
    }
    if (details != NULL && details_size > 0) {
        char *s = grpc_slice_to_c_string(status_details);
        snprintf(details, details_size, "%s", s);
        gpr_free(s);
    }
    if (reply_len != NULL) {
        size_t room = *reply_len;
        *reply_len = 0;
        grpc_byte_buffer_reader r;
        if (recv_bb != NULL && grpc_byte_buffer_reader_init(&r, recv_bb)) {
            grpc_slice all = grpc_byte_buffer_reader_readall(&r);
            grpc_byte_buffer_reader_destroy(&r);
            *reply_len = GRPC_SLICE_LENGTH(all);
            if (reply != NULL)
                memcpy(reply, GRPC_SLICE_START_PTR(all), *reply_len < room ? *reply_len : room);
            grpc_slice_unref(all);
        }
    }

    grpc_slice_unref(status_details);
    grpc_metadata_array_destroy(&md_in);
    grpc_metadata_array_destroy(&md_trail);
    if (recv_bb != NULL)
        grpc_byte_buffer_destroy(recv_bb);
    grpc_byte_buffer_destroy(send_bb);
    grpc_call_unref(call);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    grpc_shutdown();
    return rc;
}
