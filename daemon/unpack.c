/*
 * Requests decoded with their strings checked (see unpack.h). The embedded-NUL check needs each
 * string's length on the wire, which protobuf-c keeps only as the size of the buffer it
 * allocates for the string (length + 1): the decode runs with an allocator that records the size
 * of every block, and a string whose strlen + 1 is not its block's size held a NUL.
 */
#include "unpack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    void *ptr;
    size_t size;
} block_t;

typedef struct tracker {
    block_t *blocks;
    size_t n, cap;
    int failed; /* a block could not be recorded: the check cannot be made */
} tracker_t;

static void *track_alloc(void *data, size_t size)
{
    tracker_t *t = data;
    void *p = malloc(size);
    if (p == NULL)
        return NULL;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        block_t *b = realloc(t->blocks, cap * sizeof *b);
        if (b == NULL) {
            t->failed = 1;
            return p;
        }
        t->blocks = b, t->cap = cap;
    }
    t->blocks[t->n++] = (block_t){p, size};
    return p;
}

static void track_free(void *data, void *ptr)
{
    (void)data;
    free(ptr); /* blocks freed during the decode are only failed decodes' */
}

int gd_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        unsigned c = *p++;
        if (c < 0x80)
            continue;
        unsigned need, min, cp;
        if ((c & 0xe0) == 0xc0)
            need = 1, min = 0x80, cp = c & 0x1f;
        else if ((c & 0xf0) == 0xe0)
            need = 2, min = 0x800, cp = c & 0x0f;
        else if ((c & 0xf8) == 0xf0)
            need = 3, min = 0x10000, cp = c & 0x07;
        else
            return 0;
        if ((size_t)(end - p) < need)
            return 0;
        for (unsigned i = 0; i < need; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        p += need;
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
    }
    return 1;
}

/* The size the decode allocated for ptr, or 0 when it did not allocate it (a default). */
static size_t block_size(const tracker_t *t, const void *ptr)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->blocks[i].ptr == ptr)
            return t->blocks[i].size;
    return 0;
}

static int check_string(const tracker_t *t, const ProtobufCMessageDescriptor *desc,
                        const ProtobufCFieldDescriptor *f, const char *s, char *why, size_t why_len)
{
    if (s == NULL)
        return 0;
    size_t len = strlen(s), size = block_size(t, s);
    const char *what = NULL;
    if (size != 0 && size != len + 1)
        what = "holds a NUL byte";
    else if (!gd_utf8_valid(s, len))
        what = "is not valid UTF-8";
    if (what == NULL)
        return 0;
    snprintf(why, why_len, "field '%s' of %s %s: strings must be UTF-8 without NUL bytes", f->name,
             desc->name, what);
    return -1;
}

static int check_message(const tracker_t *t, const ProtobufCMessage *m, char *why, size_t why_len)
{
    const ProtobufCMessageDescriptor *desc = m->descriptor;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const char *base = (const char *)m;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t which = *(const uint32_t *)(base + f->quantifier_offset);
            if (which != f->id)
                continue;
        }
        size_t count = 1;
        const void *const *items = (const void *const *)(base + f->offset);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            count = *(const size_t *)(base + f->quantifier_offset);
            items = *(const void *const *const *)(base + f->offset);
        }
        for (size_t k = 0; k < count; k++) {
            const void *v = items[k];
            int rc = f->type == PROTOBUF_C_TYPE_STRING
                         ? check_string(t, desc, f, v, why, why_len)
                         : (v != NULL ? check_message(t, v, why, why_len) : 0);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

ProtobufCMessage *gd_request_unpack(const ProtobufCMessageDescriptor *desc, size_t len,
                                    const uint8_t *data, char *why, size_t why_len)
{
    tracker_t t = {0};
    ProtobufCAllocator alloc = {track_alloc, track_free, &t};
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, &alloc, len, data);
    if (m == NULL) {
        snprintf(why, why_len, "the request message does not decode as %s", desc->name);
    } else if (t.failed) {
        snprintf(why, why_len, "out of memory checking the request's strings");
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
    } else if (check_message(&t, m, why, why_len) != 0) {
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
    }
    free(t.blocks);
    return m;
}
