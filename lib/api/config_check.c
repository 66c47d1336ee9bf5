/*
 * config_check.c — zccl_config_check: every ZCCL_* setting in the environment checked the way communicator creation
 * reads it (numbers against the table's ranges, names against their lists, ZCCL_ALGO with the tuner's parser),
 * plus the ZCCL_* variables the library does not know (likely typos, which it would otherwise ignore silently), the
 * NCCL_* variables it reads for their ZCCL_* counterparts and those it ignores. `zccl-bench --env` prints the result;
 * communicator creation prints its "unknown:" lines once per job (zccl__config_warn_unknown).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "api.h"
#include "comm.h"
#include "tuner.h"
#include "gdr.h"

extern char **environ;

typedef struct {
    char *buf;
    size_t len, need;
} out_t;

static void put(out_t *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf && o->need < o->len ? o->buf + o->need : NULL, o->buf && o->need < o->len ? o->len - o->need : 0,
                      fmt, ap);
    va_end(ap);
    if (n > 0) o->need += (size_t)n;
}

/* ZCCL_* variables that are not settings of the library but are known, so not reported as misspellings: what zcclrun
 * hands its ranks besides the settings, and the test scripts' own switches (tests/rdma, tests/faults, tests/fuzz). */
static const char *const tool_vars =
    "ZCCL_LOCAL_BIND,ZCCL_LAUNCH_STATUS_FD,ZCCL_VM,ZCCL_VM_ADDR0,ZCCL_VM_ADDR1,ZCCL_VM_ADDR2,ZCCL_VM_ADDR3,"
    "ZCCL_VM_DEV0,ZCCL_VM_DEV1,ZCCL_VM_DEV2,ZCCL_VM_DEV3,ZCCL_VM_EXIT,ZCCL_VM_CACHE,ZCCL_RAILS_SKIP_MATRIX,"
    "ZCCL_RAILS_SKIP_STRIPING,ZCCL_RAILS_FO_TRIALS,ZCCL_RAILS_FO_CHECKS,"
    "ZCCL_IB_SUITES,ZCCL_IB_BENCH_OPS,ZCCL_FAULT_MARGIN_S,ZCCL_FAULT_TRIAL,ZCCL_FUZZ_MAKE_SEEDS,ZCCL_FUZZ_SKIP_RC,"
    "ZCCL_TEST_FULL,ZCCL_TEST_SHARD,ZCCL_TEST_VERBOSE,ZCCL_TEST_TIMEOUT_MS,ZCCL_SHARED_DIR,ZCCL_BUILD_DIR,"
    "ZCCL_TORCH_ANY_SOURCE,ZCCL_TORCH_SPIN_US";

/* Whether v (non-empty) is one of the comma-separated names in list (case-insensitive). */
static bool one_of(const char *v, const char *list) {
    const size_t n = strlen(v);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && !strncasecmp(p, v, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* The problem with a text setting's value, or NULL. */
static const char *text_problem(zccl_cfg_id_t id, const char *v, char *why, size_t wlen) {
    if (id == ZCCL_CFG_DEBUG) return zccl__log_level_of(v) >= 0 ? NULL : "not one of NONE, WARN, INFO, TRACE";
    if (id == ZCCL_CFG_DEBUG_SUBSYS) {
        char tmp[256];
        if (strcmp(zccl__cfg_source(id), "ZCCL_DEBUG_SUBSYS")) return NULL; /* NCCL's names are skipped (log.c) */
        snprintf(tmp, sizeof tmp, "%s", v + (v[0] == '^'));
        for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int i = 0;
            while (i < ZCCL_LOG_NSUBSYS && strcasecmp(tok, zccl__log_subsys[i].name)) i++;
            if (i < ZCCL_LOG_NSUBSYS) continue;
            int w = snprintf(why, wlen, "'%s' is not a subsystem (", tok);
            for (i = 0; i < ZCCL_LOG_NSUBSYS && w > 0 && (size_t)w < wlen; i++)
                w += snprintf(why + w, wlen - (size_t)w, "%s%s", zccl__log_subsys[i].name,
                              i + 1 < ZCCL_LOG_NSUBSYS ? ", " : ")");
            return why;
        }
        return NULL;
    }
    if (id == ZCCL_CFG_TRANSPORT) {
        if (zccl__transport_by_name(v)) return NULL;
        int w = snprintf(why, wlen, "not one of");
        for (size_t t = 0; zccl__transports[t] && w > 0 && (size_t)w < wlen; t++)
            w += snprintf(why + w, wlen - (size_t)w, "%s %s", t ? "," : "", zccl__transports[t]->name);
        return why;
    }
    if (id == ZCCL_CFG_RING_ORDER) {
        if (one_of(v, "topo,rank") || strspn(v, "0123456789,") == strlen(v)) return NULL;
        return "not topo, rank or a permutation of the ranks such as 3,1,0,2";
    }
    if (id == ZCCL_CFG_SECRET) {
        if (strlen(v) == 32 && strspn(v, "0123456789abcdefABCDEF") == 32) return NULL;
        return "not 32 hex digits";
    }
    if (id == ZCCL_CFG_ALGO) {
        zccl_algo_filter_t f;
        if (zccl__algo_filter_parse(v, "ZCCL_ALGO", &f) == ZCCL_SUCCESS) return NULL;
        snprintf(why, wlen, "%s", zccl__last_error());
        return why;
    }
    return NULL; /* interface and device lists, file names: checked against the machine at init */
}

/* Called once per job at communicator creation (rank 0 of the first communicator of a process): the ZCCL_* names the
 * library does not know, which it would otherwise ignore silently, on stderr whatever ZCCL_DEBUG says; what it
 * reads from NCCL_* variables and which of those it ignores at INFO (ENV). Invalid values fail the creation itself. */
void zccl__config_warn_unknown(void) {
    size_t need = zccl_config_check(NULL, 0, NULL);
    char *text = malloc(need + 1);
    if (!text) return;
    zccl_config_check(text, need + 1, NULL);
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "unknown: ", 9)) fprintf(stderr, "zccl: warning: environment %s\n", line + 9);
        else if (!strncmp(line, "nccl: ", 6) || !strncmp(line, "ignored: ", 9)) ZCCL_INFO(ZCCL_LOG_ENV, "%s", line);
    }
    free(text);
}

ZCCL_API size_t zccl_config_check(char *buf, size_t len, int *ninvalid) {
    out_t o = {buf, len, 0};
    if (buf && len) buf[0] = '\0';
    int bad = 0;
    char why[600];
    for (size_t i = 0; i < zccl__cfg_count(); i++) {
        const zccl_cfg_desc_t *d = zccl__cfg_at(i);
        const char *src = zccl__cfg_source(d);
        if (!src) continue; /* defaults are valid */
        const char *v = getenv(src);
        const char *problem = NULL;
        if (d->kind != ZCCL_CFG_TEXT) {
            int64_t x;
            if (zccl__cfg_int(d, &x) != ZCCL_SUCCESS) problem = zccl__last_error();
        } else {
            problem = text_problem(d, v, why, sizeof why);
        }
        if (problem) {
            bad++;
            if (strstr(problem, src)) put(&o, "invalid: %s\n", problem); /* the message names it already */
            else put(&o, "invalid: %s=\"%s\": %s\n", src, v, problem);
        }
        if (src == d->nccl) put(&o, "nccl: %s=%s is read as %s (which is unset)\n", src, v, d->name);
    }
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "ZCCL_", 5)) continue;
        const char *eq = strchr(*e, '=');
        const size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        bool known = zccl__cfg_find(*e, n) != NULL;
        char name[128];
        if (!known && n < sizeof name) {
            memcpy(name, *e, n);
            name[n] = '\0';
            known = strchr(name, ',') == NULL && one_of(name, tool_vars);
        }
        if (!known) put(&o, "unknown: %s: not a setting of the library, which ignores it (a misspelling?)\n", *e);
    }
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "NCCL_", 5)) continue;
        const char *eq = strchr(*e, '=');
        const size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        bool mapped = false;
        for (size_t i = 0; i < zccl__cfg_count() && !mapped; i++) {
            const char *nc = zccl__cfg_at(i)->nccl;
            mapped = nc && strlen(nc) == n && !strncmp(nc, *e, n);
        }
        if (!mapped) put(&o, "ignored: %s: NCCL setting without a zccl counterpart (docs/configuration.md)\n", *e);
    }
    if (ninvalid) *ninvalid = bad;
    return o.need;
}

ZCCL_API size_t zccl_config_describe(char *buf, size_t len) {
    size_t need = 0;
    for (size_t i = 0; i < zccl__cfg_count(); i++) {
        const zccl_cfg_desc_t *d = zccl__cfg_at(i);
        const char *v = zccl__cfg_str(d), *src = zccl__cfg_source(d);
        char from[80] = "", also[80] = "";
        if (src && src == d->nccl) snprintf(from, sizeof from, " (from %s)", src);
        if (d->nccl) snprintf(also, sizeof also, "; NCCL name %s", d->nccl);
        int n = snprintf(buf && need < len ? buf + need : NULL, buf && need < len ? len - need : 0,
                         "%s=%s%s (default %s%s): %s\n", d->name, *v ? v : "(unset)", from,
                         *d->deflt ? d->deflt : "unset", also, d->help);
        if (n > 0) need += (size_t)n;
    }
    /* Not a setting, but what decides whether the ZCCL_IB_* settings mean anything. */
    int n = snprintf(buf && need < len ? buf + need : NULL, buf && need < len ? len - need : 0, "%s\n",
                     zccl__ib_built() ? "IB transport: built (libibverbs, librdmacm)"
                                      : "IB transport: absent (built without libibverbs/librdmacm)");
    if (n > 0) need += (size_t)n;
    need += zccl__gdr_describe(buf && need < len ? buf + need : NULL, buf && need < len ? len - need : 0);
    return need;
}
