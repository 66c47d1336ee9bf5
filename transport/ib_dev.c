/*
 * ib_dev.c — choosing the RDMA device, port and GID, and reading the ZCCL_IB_* knobs.
 *
 * ZCCL_IB_HCA follows NCCL's grammar (NCCL documentation, "Environment Variables", NCCL_IB_HCA):
 * "[^][=]hca[:port],...". The GID default follows NCCL too: on RoCE the first RoCE v2 GID whose address is an
 * IPv4-mapped one (routable between subnets, and the one rdma_cm uses for the interface's IPv4 address).
 * The parsing and choice functions are pure (tested in tests/test_ib.cpp); the verbs queries below them are built
 * only with libibverbs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ib.h"
#include "transport.h"

/* ---- ZCCL_IB_HCA -------------------------------------------------------------------------------------------- */

zccl_result_t zccl__ib_hca_parse(const char *spec, zccl_ib_hca_filter_t *f) {
    memset(f, 0, sizeof *f);
    if (!spec || !*spec) return ZCCL_SUCCESS;
    const char *p = spec;
    if (*p == '^') f->exclude = true, p++;
    if (*p == '=') f->exact = true, p++;
    for (;;) {
        const char *end = p + strcspn(p, ",");
        const char *colon = memchr(p, ':', (size_t)(end - p));
        const size_t nlen = (size_t)((colon ? colon : end) - p);
        if (nlen == 0)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_IB_HCA=\"%s\": empty device name at offset %d (grammar: "
                               "[^][=]hca[:port],...)", spec, (int)(p - spec));
        if (nlen >= ZCCL_IB_NAME_LEN)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_IB_HCA=\"%s\": device name at offset %d is longer than "
                               "%d bytes", spec, (int)(p - spec), ZCCL_IB_NAME_LEN - 1);
        if (f->n == ZCCL_IB_MAX_HCA)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_IB_HCA=\"%s\": more than %d entries", spec, ZCCL_IB_MAX_HCA);
        memcpy(f->name[f->n], p, nlen);
        f->name[f->n][nlen] = '\0';
        f->port[f->n] = -1;
        if (colon) {
            char *e;
            errno = 0;
            long v = strtol(colon + 1, &e, 10);
            if (e == colon + 1 || e != end || errno || v < 1 || v > 255)
                return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_IB_HCA=\"%s\": port of \"%s\" is not an integer in "
                                   "[1, 255]", spec, f->name[f->n]);
            f->port[f->n] = (int)v;
        }
        f->n++;
        if (!*end) break;
        p = end + 1;
        if (!*p)
            return zccl__error(ZCCL_INVALID_ARGUMENT, "ZCCL_IB_HCA=\"%s\": trailing ',' (empty entry)", spec);
    }
    return ZCCL_SUCCESS;
}

bool zccl__ib_hca_match(const zccl_ib_hca_filter_t *f, const char *dev, int port) {
    if (f->n == 0) return true;
    bool listed = false;
    for (int i = 0; i < f->n && !listed; i++) {
        const bool name_ok = f->exact ? !strcmp(dev, f->name[i]) : !strncmp(dev, f->name[i], strlen(f->name[i]));
        listed = name_ok && (f->port[i] < 0 || f->port[i] == port);
    }
    return f->exclude ? !listed : listed;
}

/* ---- GID choice --------------------------------------------------------------------------------------------- */

bool zccl__ib_gid_is_ipv4(const uint8_t raw[16]) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(raw, prefix, sizeof prefix);
}

zccl_result_t zccl__ib_gid_pick(const zccl_ib_gid_t *g, size_t n, bool roce, int forced, size_t *out, char *why,
                                size_t why_len) {
    if (why_len) why[0] = '\0';
    if (n == 0) {
        snprintf(why, why_len, "the port's GID table is empty (no IP address on its interface?)");
        return ZCCL_INVALID_ARGUMENT;
    }
    if (forced >= 0) {
        for (size_t i = 0; i < n; i++)
            if (g[i].index == forced) { *out = i; return ZCCL_SUCCESS; }
        size_t w = (size_t)snprintf(why, why_len, "ZCCL_IB_GID_INDEX=%d is not in the port's GID table; present:",
                                    forced);
        for (size_t i = 0; i < n && w < why_len; i++)
            w += (size_t)snprintf(why + w, why_len - w, " %d(%s)", g[i].index,
                                  g[i].type == ZCCL_IB_GID_ROCE_V2 ? "RoCEv2" : g[i].type == ZCCL_IB_GID_ROCE_V1 ? "RoCEv1" : "IB");
        return ZCCL_INVALID_ARGUMENT;
    }
    if (roce) {
        for (size_t i = 0; i < n; i++)
            if (g[i].type == ZCCL_IB_GID_ROCE_V2 && zccl__ib_gid_is_ipv4(g[i].raw)) { *out = i; return ZCCL_SUCCESS; }
        for (size_t i = 0; i < n; i++)
            if (g[i].type == ZCCL_IB_GID_ROCE_V2) { *out = i; return ZCCL_SUCCESS; }
    }
    *out = 0;
    return ZCCL_SUCCESS;
}

/* ---- rails ------------------------------------------------------------------------------------------------- */

zccl_ib_rail_plan_t zccl__ib_rail_plan(int my_rails, int their_rails, int qps, int my_li, int their_li) {
    zccl_ib_rail_plan_t p;
    p.nrails = ZCCL_MIN(my_rails, their_rails);
    if (p.nrails < 1) p.nrails = 1;
    p.nqp = p.nrails * qps;
    p.off_tx = qps * (my_li % p.nrails);
    p.off_rx = qps * (their_li % p.nrails);
    return p;
}

int zccl__ib_grant_qp(uint32_t seq, int off, int nqp, int qps, const bool *dead) {
    int q = (int)((seq + (uint32_t)off) % (uint32_t)nqp);
    for (int n = 0; n < nqp / qps; n++, q = (q + qps) % nqp)
        if (!dead || !dead[q / qps]) return q;
    return -1;
}

/* ---- knobs -------------------------------------------------------------------------------------------------- */

zccl_result_t zccl__ib_knobs(zccl_ib_knobs_t *k) {
    int64_t v;
    memset(k, 0, sizeof *k);
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_IB_DISABLE, &v));
    k->disable = v != 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_IB_GID_INDEX, &v));
    k->gid_index = (int)v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_IB_TIMEOUT, &v));
    k->timeout = (int)v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_IB_RETRY_CNT, &v));
    k->retry_cnt = (int)v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_IB_QPS_PER_CONN, &v));
    k->qps_per_conn = (int)v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_IB_ZCOPY_BYTES, &v));
    k->zcopy_bytes = (size_t)v;
    ZCCL_CHECK(zccl__ib_hca_parse(zccl__cfg_str(ZCCL_CFG_IB_HCA), &k->hca));
    return ZCCL_SUCCESS;
}
