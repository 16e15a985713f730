/*
 * protobuf-c message ⇒ jansson value, by walking the message descriptor, so
 * that fields added to graphd.proto show up in graphd_status_json without
 * code here. Rules: field names as in the .proto; every proto3 scalar is
 * written, zero or not; 64-bit integers stay integers (uint64 above INT64_MAX
 * become reals); enums become their value names; bytes become lowercase hex;
 * a repeated message whose type is named *Entry and has a string field
 * "name" or "key" becomes an object keyed by it (a lone remaining field
 * "value" is written bare, as for a proto map).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphd_int.h"

static json_t *message_to_json(const ProtobufCMessage *msg);

static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *d,
                                                  const char *name)
{
    for (unsigned i = 0; i < d->n_fields; i++)
        if (strcmp(d->fields[i].name, name) == 0)
            return &d->fields[i];
    return NULL;
}

static json_t *string_value(const char *s)
{
    json_t *v = json_string(s != NULL ? s : "");
    /* jansson rejects invalid UTF-8; the daemon should never send it, but do not lose the key. */
    return v != NULL ? v : json_string("<invalid utf-8>");
}

/* One value of field f stored at p (a scalar slot or one element of a repeated array). */
static json_t *value_to_json(const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return json_integer(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t u = *(const uint64_t *)p;
        return u <= (uint64_t)INT64_MAX ? json_integer((json_int_t)u) : json_real((double)u);
    }
    case PROTOBUF_C_TYPE_FLOAT:
        return json_real(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return json_real(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)f->descriptor, v);
        return ev != NULL ? json_string(ev->name) : json_integer(v);
    }
    case PROTOBUF_C_TYPE_STRING:
        return string_value(*(char *const *)p);
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        json_t *v;
        char *hex = malloc(b->len * 2 + 1);
        if (hex == NULL)
            return NULL;
        for (size_t i = 0; i < b->len; i++)
            snprintf(hex + 2 * i, 3, "%02x", b->data[i]);
        hex[b->len * 2] = '\0';
        v = json_string(hex);
        free(hex);
        return v;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(const ProtobufCMessage *const *)p;
        return m != NULL ? message_to_json(m) : json_null();
    }
    }
    return json_null();
}

static size_t type_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 0;
}

/* The key field of an *Entry message type, or NULL when the type is not keyed. */
static const ProtobufCFieldDescriptor *entry_key(const ProtobufCFieldDescriptor *f)
{
    if (f->type != PROTOBUF_C_TYPE_MESSAGE)
        return NULL;
    const ProtobufCMessageDescriptor *d = f->descriptor;
    size_t n = strlen(d->short_name);
    if (n < 5 || strcmp(d->short_name + n - 5, "Entry") != 0)
        return NULL;
    const ProtobufCFieldDescriptor *k = find_field(d, "name");
    if (k == NULL)
        k = find_field(d, "key");
    if (k == NULL || k->type != PROTOBUF_C_TYPE_STRING || k->label == PROTOBUF_C_LABEL_REPEATED)
        return NULL;
    return k;
}

/* {key: rest} for one *Entry message; rest is the bare "value" when that is all that is left. */
static int entry_to_json(json_t *obj, const ProtobufCMessage *m, const ProtobufCFieldDescriptor *k)
{
    json_t *whole = message_to_json(m);
    if (whole == NULL)
        return -1;
    const char *key = *(char *const *)((const char *)m + k->offset);
    json_object_del(whole, k->name);
    json_t *value = whole;
    if (json_object_size(whole) == 1 && json_object_get(whole, "value") != NULL) {
        value = json_incref(json_object_get(whole, "value"));
        json_decref(whole);
    }
    return json_object_set_new(obj, key != NULL ? key : "", value);
}

static json_t *repeated_to_json(const ProtobufCFieldDescriptor *f, const ProtobufCMessage *msg)
{
    size_t n = *(const size_t *)((const char *)msg + f->quantifier_offset);
    const char *arr = *(const char *const *)((const char *)msg + f->offset);
    const ProtobufCFieldDescriptor *k = entry_key(f);
    json_t *out = k != NULL ? json_object() : json_array();
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const void *elem = arr + i * type_size(f->type);
        int rc;
        if (k != NULL) {
            rc = entry_to_json(out, *(const ProtobufCMessage *const *)elem, k);
        } else {
            json_t *v = value_to_json(f, elem);
            rc = v != NULL ? json_array_append_new(out, v) : -1;
        }
        if (rc != 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* Whether a singular field holds a value worth writing (presence rules of proto2/proto3). */
static int field_present(const ProtobufCFieldDescriptor *f, const ProtobufCMessage *msg)
{
    const char *base = (const char *)msg;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        return *(const uint32_t *)(base + f->quantifier_offset) == f->id;
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
        if (f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING)
            return *(const void *const *)(base + f->offset) != NULL;
        return *(const protobuf_c_boolean *)(base + f->quantifier_offset);
    }
    return 1;
}

/*
 * Values with a presence flag (protobuf-c 1.4 has no proto3 optional): where the flag is false the
 * values are left out of the JSON, absent rather than a 0 that reads as a reading; the flags
 * stay, for a reader that wants them. A 0 in absent_if_zero is absent too.
 */
static const struct presence {
    const char *message; /* full name */
    const char *flag;
    const char *fields[3];
} presence[] = {
    {"graphd.v1.DeviceTelemetry", "have_memory", {"memory_free", "memory_total", NULL}},
    {"graphd.v1.DeviceTelemetry", "have_engine", {"engine_active_us", NULL}},
    {"graphd.v1.DeviceTelemetry", "have_utilisation", {"utilisation", NULL}},
    {"graphd.v1.DeviceTelemetry", "have_reset", {"wedged", NULL}},
};
static const struct {
    const char *message;
    const char *field;
} absent_if_zero[] = {
    /* A device's family that does not say (cpu, cuda) leaves these 0. (Strings stay: "" is
     * the proto's own "absent", and a table shows it as "-".) */
    {"graphd.v1.Device", "compute_units"},
    {"graphd.v1.Device", "max_clock_mhz"},
};

static void drop_absent(const ProtobufCMessageDescriptor *d, json_t *obj)
{
    for (size_t i = 0; i < sizeof(presence) / sizeof(presence[0]); i++) {
        if (strcmp(presence[i].message, d->name) != 0)
            continue;
        if (!json_is_true(json_object_get(obj, presence[i].flag)))
            for (size_t k = 0; k < 3 && presence[i].fields[k] != NULL; k++)
                json_object_del(obj, presence[i].fields[k]);
    }
    for (size_t i = 0; i < sizeof(absent_if_zero) / sizeof(absent_if_zero[0]); i++) {
        if (strcmp(absent_if_zero[i].message, d->name) != 0)
            continue;
        json_t *v = json_object_get(obj, absent_if_zero[i].field);
        if (json_is_integer(v) && json_integer_value(v) == 0)
            json_object_del(obj, absent_if_zero[i].field);
    }
}

static json_t *message_to_json(const ProtobufCMessage *msg)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    json_t *obj = json_object();
    if (obj == NULL)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        json_t *v;
        if (f->label == PROTOBUF_C_LABEL_REPEATED)
            v = repeated_to_json(f, msg);
        else if (!field_present(f, msg))
            continue;
        else
            v = value_to_json(f, (const char *)msg + f->offset);
        if (v == NULL || json_object_set_new(obj, f->name, v) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    drop_absent(d, obj);
    return obj;
}

json_t *graphd__pb_to_json(const ProtobufCMessage *msg)
{
    return message_to_json(msg);
}
