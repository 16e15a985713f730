/*
 * Device discovery. The CPU (libtorch's CPU backend) is always device cpu:0,
 * split into cpu:0..cpu:N-1 by the cpu_devices setting (one worker and its own
 * pools each, the same cores); accelerator families add theirs here when they
 * are built in.
 */
#include "daemon.h"
#include "log.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

static void cpu_model(char *out, size_t len)
{
    snprintf(out, len, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *colon = strchr(line, ':');
            if (colon) {
                colon++;
                while (*colon == ' ' || *colon == '\t')
                    colon++;
                colon[strcspn(colon, "\n")] = 0;
                snprintf(out, len, "%s", colon);
            }
            break;
        }
    }
    fclose(f);
}

static void cpu_memory(gd_device_t *dev)
{
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb;
    char line[256];
    if (f == NULL)
        return;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            dev->memory_total = kb * 1024;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            dev->memory_free = kb * 1024;
    }
    fclose(f);
}

void gd_devices_discover(gd_daemon_t *d)
{
    gd_device_t *cpu = &d->devices[0];
    memset(cpu, 0, sizeof *cpu);
    snprintf(cpu->id, sizeof cpu->id, "cpu:0");
    snprintf(cpu->kind, sizeof cpu->kind, "cpu");
    char model[96];
    cpu_model(model, sizeof model);
    snprintf(cpu->name, sizeof cpu->name, "%s (%ld cores)", model, sysconf(_SC_NPROCESSORS_ONLN));
    cpu_memory(cpu);
    d->ndevices = 1;
    /* The others describe the same host: same name and memory, their own id and ordinal. */
    for (size_t i = 1; i < d->cfg.cpu_devices && i < GD_MAX_DEVICES; i++) {
        gd_device_t *dev = &d->devices[d->ndevices++];
        *dev = *cpu;
        snprintf(dev->id, sizeof dev->id, "cpu:%zu", i);
        dev->ordinal = (uint32_t)i;
    }

    gr_device_info_t acc[GD_MAX_DEVICES];
    size_t n = GD_MAX_DEVICES - d->ndevices;
    if (gr_devices(&n, acc) != GR_OK) {
        gd_warn("device discovery: %s", gr_last_error());
        n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        gd_device_t *dev = &d->devices[d->ndevices++];
        memset(dev, 0, sizeof *dev);
        snprintf(dev->id, sizeof dev->id, "%.31s", acc[i].device);
        const char *colon = strchr(acc[i].device, ':');
        snprintf(dev->kind, sizeof dev->kind, "%.*s",
                 colon ? (int)(colon - acc[i].device) : (int)strlen(acc[i].device), acc[i].device);
        dev->ordinal = colon ? (uint32_t)strtoul(colon + 1, NULL, 10) : 0;
        snprintf(dev->name, sizeof dev->name, "%.127s", acc[i].name);
        snprintf(dev->compute_capability, sizeof dev->compute_capability, "%.15s",
                 acc[i].compute_capability);
        dev->memory_total = acc[i].total_bytes;
        dev->memory_free = acc[i].free_bytes;
        dev->mps = acc[i].mps != 0;
    }
    gd_xpu_discover(d); /* xpu:N, through the Level Zero layer opened in main */
}

void gd_devices_refresh(gd_daemon_t *d)
{
    cpu_memory(&d->devices[0]);
    size_t ncpu = 1;
    for (; ncpu < d->ndevices && strcmp(d->devices[ncpu].kind, "cpu") == 0; ncpu++)
        d->devices[ncpu].memory_free = d->devices[0].memory_free;
    if (ncpu == d->ndevices)
        return;
    gr_device_info_t acc[GD_MAX_DEVICES];
    size_t n = GD_MAX_DEVICES;
    if (gr_devices(&n, acc) != GR_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        gd_device_t *dev = (gd_device_t *)gd_device_find(d, acc[i].device);
        if (dev)
            dev->memory_free = acc[i].free_bytes;
    }
}

const gd_device_t *gd_device_find(const gd_daemon_t *d, const char *id)
{
    for (size_t i = 0; i < d->ndevices; i++)
        if (strcmp(d->devices[i].id, id) == 0)
            return &d->devices[i];
    /* "cpu" alone names cpu:0, as torch.device("cpu") does. */
    if (strcmp(id, "cpu") == 0)
        return &d->devices[0];
    return NULL;
}
