/*
 * The error table: GRAPHD_ERR_MAP backs graphd_strerror, graphd_err_name and
 * the mapping between gRPC status codes and the error enum.
 */
#include "graphd.h"

const char *graphd_strerror(int err)
{
    switch (err) {
#define GRAPHD_ERR_STR(name, value, grpc, msg)                                                     \
    case GRAPHD_##name:                                                                            \
        return msg;
        GRAPHD_ERR_MAP(GRAPHD_ERR_STR)
#undef GRAPHD_ERR_STR
    }
    return "unknown error code";
}

const char *graphd_err_name(int err)
{
    /* gRPC-backed names drop the leading 'E' so they read like gRPC's own. */
    switch (err) {
#define GRAPHD_ERR_NAME(name, value, grpc, msg)                                                    \
    case GRAPHD_##name:                                                                            \
        return (grpc) > 0 ? &(#name)[1] : #name;
        GRAPHD_ERR_MAP(GRAPHD_ERR_NAME)
#undef GRAPHD_ERR_NAME
    }
    return "EUNKNOWN_CODE";
}

int graphd_err_from_grpc(int grpc_status)
{
    /* Codes are -status for every gRPC status the map knows; check rather than assume. */
    static const struct {
        int grpc, err;
    } table[] = {
#define GRAPHD_ERR_FROM(name, value, grpc, msg) {grpc, GRAPHD_##name},
        GRAPHD_ERR_MAP(GRAPHD_ERR_FROM)
#undef GRAPHD_ERR_FROM
    };
    if (grpc_status < 0)
        return GRAPHD_EUNKNOWN;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (table[i].grpc == grpc_status)
            return table[i].err;
    return GRAPHD_EUNKNOWN;
}

int graphd_err_to_grpc(int err)
{
    switch (err) {
#define GRAPHD_ERR_TO(name, value, grpc, msg)                                                      \
    case GRAPHD_##name:                                                                            \
        return grpc;
        GRAPHD_ERR_MAP(GRAPHD_ERR_TO)
#undef GRAPHD_ERR_TO
    }
    return -1;
}
