/*
 * nccl/env.c — NCCL_* environment variables with a zccl counterpart, copied into the ZCCL_* variable when that one
 * is unset, once, when libnccl.so.2 is loaded (before zccl reads its settings). A ZCCL_* variable that is set
 * always wins. The NCCL_* variables zccl does not honour are listed in docs/nccl.md.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void zccl_nccl_env_map(void);

/* NCCL_DEBUG_SUBSYS names -> zccl's ZCCL_DEBUG_SUBSYS names ("" : no zccl counterpart, dropped). */
static const struct { const char *nccl, *zccl; } subsys[] = {
    {"INIT", "INIT"}, {"COLL", "COLL"}, {"P2P", "COLL"},  {"SHM", "SHM"},   {"NET", "TCP,IB"}, {"GRAPH", "TOPO"},
    {"TUNING", "TUNE"}, {"ENV", "ENV"}, {"BOOTSTRAP", "BOOT"}, {"ALL", "ALL"}, {"ALLOC", ""}, {"CALL", ""},
    {"PROXY", ""}, {"NVLS", ""}, {"REG", ""}, {"PROFILE", ""}, {"RAS", ""},
};

/* "INIT,NET" -> "INIT,TCP,IB"; "^NET" -> "^TCP,IB". Returns 0 (and leaves out) when nothing maps. */
static int map_subsys(const char *v, char *out, size_t len) {
    size_t n = 0;
    out[0] = 0;
    if (*v == '^') {
        n += (size_t)snprintf(out, len, "^");
        v++;
    }
    int any = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        for (size_t i = 0; i < sizeof subsys / sizeof subsys[0]; i++)
            if (!strcasecmp(t, subsys[i].nccl) && subsys[i].zccl[0] && n < len) {
                n += (size_t)snprintf(out + n, len - n, "%s%s", any ? "," : "", subsys[i].zccl);
                any = 1;
            }
    }
    return any && n < len;
}

/* NCCL_ALGO is copied only when it names nothing but Ring and Tree (zccl's "ring" and "tree"; the others are
 * GPU-fabric algorithms: NVLS, NVLSTree, CollnetDirect, CollnetChain, PAT), with collective prefixes and '^'. */
static int map_algo(const char *v, char *out, size_t len) {
    size_t n = strlen(v);
    if (n + 1 > len) return 0;
    for (size_t i = 0; i <= n; i++) out[i] = (char)tolower((unsigned char)v[i]);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", out);
    static const char *ok[] = {"ring", "tree", "allreduce", "reducescatter", "allgather", "broadcast", "reduce"};
    for (char *save = NULL, *t = strtok_r(buf, ",;:^ ", &save); t; t = strtok_r(NULL, ",;:^ ", &save)) {
        int known = 0;
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) known |= !strcmp(t, ok[i]);
        if (!known) return 0;
    }
    return 1;
}

static void map_one(const char *nccl, const char *zccl, int (*xlate)(const char *, char *, size_t)) {
    const char *v = getenv(nccl);
    if (!v || getenv(zccl)) return;
    char out[512];
    if (xlate) {
        if (!xlate(v, out, sizeof out)) {
            const char *d = getenv("ZCCL_DEBUG");
            if (!d) d = getenv("NCCL_DEBUG");
            if (d && (!strcasecmp(d, "WARN") || !strcasecmp(d, "INFO") || !strcasecmp(d, "TRACE")))
                fprintf(stderr, "zccl-nccl WARN %s=%s has no zccl counterpart; ignored (docs/nccl.md)\n", nccl, v);
            return;
        }
        v = out;
    }
    setenv(zccl, v, 0);
}

void zccl_nccl_env_map(void) {
    map_one("NCCL_DEBUG", "ZCCL_DEBUG", NULL); /* VERSION, WARN, INFO, TRACE: zccl reads the same words */
    map_one("NCCL_DEBUG_SUBSYS", "ZCCL_DEBUG_SUBSYS", map_subsys);
    map_one("NCCL_SOCKET_IFNAME", "ZCCL_SOCKET_IFNAME", NULL);
    map_one("NCCL_IB_HCA", "ZCCL_IB_HCA", NULL);
    map_one("NCCL_IB_GID_INDEX", "ZCCL_IB_GID_INDEX", NULL);
    map_one("NCCL_IB_TIMEOUT", "ZCCL_IB_TIMEOUT", NULL);
    map_one("NCCL_IB_RETRY_CNT", "ZCCL_IB_RETRY_CNT", NULL);
    map_one("NCCL_IB_DISABLE", "ZCCL_IB_DISABLE", NULL);
    map_one("NCCL_ALGO", "ZCCL_ALGO", map_algo);
    map_one("NCCL_IB_QPS_PER_CONNECTION", "ZCCL_IB_QPS_PER_CONN", NULL);
    map_one("NCCL_TOPO_FILE", "ZCCL_TOPO_FILE", NULL); /* NCCL topology XML: zccl reads that format */
    map_one("NCCL_NSOCKS_PERTHREAD", "ZCCL_NSOCKS_PERTHREAD", NULL); /* TCP lanes per rail (transport/rail.h) */
}

__attribute__((constructor)) static void nccl_env_at_load(void) { zccl_nccl_env_map(); }
