/*
 * The daemon's settings: one table (config.c) names each setting once with its
 * type, bounds, default, field and whether SIGHUP may change it. The INI file
 * (parsed by inih), the command-line flags, `graphctl status` and the Status
 * RPC all read that table.
 */
#ifndef GD_CONFIG_H
#define GD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GD_DEFAULT_CONFIG "/etc/graphd/graphd.conf"
#define GD_DEFAULT_LISTEN "unix:/run/graphd/graphd.sock"

typedef struct gd_config {
    char *listen;
    char *session_socket;
    char *socket_group;
    uint64_t socket_mode;
    char *tls_cert;
    char *tls_key;
    char *metrics_listen;
    uint64_t log_level;
    uint64_t max_message_bytes;
    uint64_t max_region_bytes;
    uint64_t default_pool_limit;
    char *default_pool;
    uint64_t max_sessions;
    uint64_t max_sessions_per_uid;
    uint64_t max_pools_per_uid;
    uint64_t max_graphs_per_session;
    uint64_t max_regions_per_session;
    uint64_t attach_timeout_ms;
    uint64_t shutdown_grace_ms;
    uint64_t inline_module_max_bytes;
    uint64_t max_module_unpacked_bytes;
    uint64_t max_call_memory_bytes;
    char *executor_path;
    uint64_t executor_sandbox;
    uint64_t max_load_ms;
    uint64_t max_capture_ms;
    uint64_t reuse_warmup;
    uint64_t max_replay_ms;
    uint64_t max_executor_memory_bytes;
    uint64_t executor_cgroup;
    uint64_t cpu_devices;
    uint64_t intra_op_threads;
    uint64_t worker_spin_us;
    uint64_t worker_idle_ms;
    uint64_t replay_spin_us;
    uint64_t replay_spin_slice_us;
    uint64_t executor_cuda_queues;
    uint64_t reply_buffer_max_bytes;
    uint64_t max_queued_replays;
    uint64_t xpu; /* GD_XPU_AUTO or GD_XPU_OFF */
} gd_config_t;

enum { GD_XPU_AUTO = 0, GD_XPU_OFF = 1 };

typedef enum {
    GD_CFG_STRING,
    GD_CFG_UINT,
    GD_CFG_BYTES,
    GD_CFG_OCTAL,
    GD_CFG_LOG_LEVEL,
    GD_CFG_CHOICE /* one word of the setting's choices, stored as its index */
} gd_cfg_type_t;

typedef struct gd_setting {
    const char *name; /* INI key and --flag (underscores become dashes) */
    gd_cfg_type_t type;
    size_t offset;
    const char *def;
    uint64_t min, max; /* numeric bounds, inclusive */
    bool reloadable;
    const char *help;
    const char *choices; /* GD_CFG_CHOICE: the words, '|'-separated ("auto|off") */
} gd_setting_t;

/* Command-line values, kept so that a reload applies them over the file again. */
#define GD_MAX_SETTINGS 128 /* most settings the table may have (flags, overrides) */

typedef struct gd_overrides {
    size_t count;
    const gd_setting_t *setting[GD_MAX_SETTINGS];
    char *value[GD_MAX_SETTINGS];
} gd_overrides_t;

extern const gd_setting_t gd_settings[];
extern const size_t gd_settings_count;

const gd_setting_t *gd_setting_find(const char *name);

/* Sets one setting from text. 0, or -1 with a message in err. */
int gd_config_set(gd_config_t *cfg, const gd_setting_t *s, const char *value, char *err,
                  size_t errlen);
/* Builds a config: defaults, then the file at path (a missing file is an error only when
 * required), then the overrides, then derived values. 0, or -1 with a message in err. */
int gd_config_load(gd_config_t *cfg, const char *path, bool required, const gd_overrides_t *ov,
                   char *err, size_t errlen);
/* Formats a setting's current value into buf. */
void gd_config_format(const gd_config_t *cfg, const gd_setting_t *s, char *buf, size_t len);
void gd_config_free(gd_config_t *cfg);
/* Copies from next into cur every reloadable setting; for each non-reloadable one that differs,
 * calls warn(name). Returns how many settings changed. */
int gd_config_apply_reload(gd_config_t *cur, const gd_config_t *next,
                           void (*warn)(const char *name));

/* Parses "4096", "64K", "1M", "2Gi", ... into bytes. 0 or -1. */
int gd_parse_bytes(const char *s, uint64_t *out);

void gd_overrides_free(gd_overrides_t *ov);

#endif
