/*
 * Requests decoded from the wire with their strings checked. protobuf-c hands a string field
 * over as a C string, so a NUL inside it would cut it silently, and it does not check UTF-8,
 * which an invalid client_name then carries into every later StatusReply (which standard
 * protobuf clients refuse to decode). Every string field, in nested and repeated messages too,
 * must be valid UTF-8 without NUL.
 */
#ifndef GRAPHD_UNPACK_H
#define GRAPHD_UNPACK_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* desc's message decoded from data (len bytes), free with protobuf_c_message_free_unpacked(m,
 * NULL). NULL when it does not decode or a string field is invalid: why then says which field
 * and what is wrong (truncated to why_len - 1 bytes). */
ProtobufCMessage *gd_request_unpack(const ProtobufCMessageDescriptor *desc, size_t len,
                                    const uint8_t *data, char *why, size_t why_len);

/* 1 when s[0..len) is valid UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF), else 0. */
int gd_utf8_valid(const char *s, size_t len);

#endif
