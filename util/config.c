/*
 * config.c — the one table of ZCCL_* environment settings: its machinery (each layer defines its own rows with
 * ZCCL_SETTING; the linker gathers them) and the bottom layer's rows. `zccl-bench --env` prints the table with the
 * values in force. `.nccl` names NCCL's variable of the same meaning and value grammar: a job set up for NCCL keeps
 * its settings, the ZCCL_* name winning when both are set. NCCL variables without such a counterpart are ignored
 * (docs/configuration.md lists them).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bytes.h"
#include "core.h"

ZCCL_SETTING(zccl__set_debug) = {.name = "ZCCL_DEBUG", .deflt = "", .help = "log level on stderr: NONE, WARN, INFO or TRACE", .nccl = "NCCL_DEBUG"};
ZCCL_SETTING(zccl__set_debug_subsys) = {.name = "ZCCL_DEBUG_SUBSYS", .deflt = "",
                               .help = "log subsystems: INIT,BOOT,SHM,TCP,COLL,ENV,TOPO,TUNE,IB,ALL; ^ excludes", .nccl = "NCCL_DEBUG_SUBSYS"};
ZCCL_SETTING(zccl__set_socket_ifname) = {.name = "ZCCL_SOCKET_IFNAME", .deflt = "",
                                .help = "interfaces for sockets, NCCL grammar: prefixes a,b; ^ excludes; = exact", .nccl = "NCCL_SOCKET_IFNAME"};

/* The table: the linker gathers every layer's ZCCL_SETTING rows into one section and marks its bounds. */
extern const zccl_cfg_desc_t *const __start_zccl_settings[] __attribute__((visibility("hidden")));
extern const zccl_cfg_desc_t *const __stop_zccl_settings[] __attribute__((visibility("hidden")));

size_t zccl__cfg_count(void) { return (size_t)(__stop_zccl_settings - __start_zccl_settings); }
zccl_cfg_id_t zccl__cfg_at(size_t i) { return i < zccl__cfg_count() ? __start_zccl_settings[i] : NULL; }
zccl_cfg_id_t zccl__cfg_find(const char *name, size_t n) {
    for (size_t i = 0; i < zccl__cfg_count(); i++) {
        const char *r = __start_zccl_settings[i]->name;
        if (n ? strlen(r) == n && !strncmp(r, name, n) : !strcmp(r, name)) return __start_zccl_settings[i];
    }
    return NULL;
}

const char *zccl__cfg_source(zccl_cfg_id_t id) {
    if (!id) return NULL;
    const char *v = getenv(id->name);
    if (v && *v) return id->name;
    v = id->nccl ? getenv(id->nccl) : NULL;
    return (v && *v) ? id->nccl : NULL;
}

const char *zccl__cfg_str(zccl_cfg_id_t id) {
    if (!id) return "";
    const char *src = zccl__cfg_source(id);
    return src ? getenv(src) : id->deflt;
}

zccl_result_t zccl__cfg_int(zccl_cfg_id_t id, int64_t *out) {
    const zccl_cfg_desc_t *d = id;
    const char *v = zccl__cfg_str(id);
    const char *name = zccl__cfg_source(id) ? zccl__cfg_source(id) : d->name; /* the variable to blame */
    /* a leading '-' for settings that allow negative values; the rest is bytes.c's grammar (K, M, G, T; KiB; KB) */
    const bool neg = v[0] == '-';
    uint64_t u;
    if (d->kind == ZCCL_CFG_TEXT) return zccl__error(ZCCL_INTERNAL_ERROR, "%s is not a numeric setting", d->name);
    if (zccl__parse_bytes(v + neg, &u) != 0 || u > (uint64_t)INT64_MAX) goto bad;
    if (d->kind == ZCCL_CFG_INT && strpbrk(v, "kKmMgGtTbB")) goto bad; /* counts, switches and times: plain numbers */
    *out = neg ? -(int64_t)u : (int64_t)u;
    if (*out < d->lo || *out > d->hi) goto bad;
    return ZCCL_SUCCESS;
bad:
    if (d->kind == ZCCL_CFG_BYTES)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=\"%s\" is not a byte count in [%lld, %lld] (suffixes "
                           "K, M, G, T allowed, also as KiB or KB: powers of 1024)", name, v, (long long)d->lo,
                           (long long)d->hi);
    if (d->lo == 0 && d->hi == 1)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=\"%s\" is not 0 or 1", name, v);
    return zccl__error(ZCCL_INVALID_ARGUMENT, "environment %s=\"%s\" is not an integer in [%lld, %lld]", name, v,
                       (long long)d->lo, (long long)d->hi);
}
