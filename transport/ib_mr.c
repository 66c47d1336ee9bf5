/*
 * ib_mr.c — the IB transport's registration cache: which user memory ranges are registered, bounded in entries and
 * bytes, least recently used first out. Pure bookkeeping: registering and deregistering are the caller's callbacks
 * (ibv_reg_mr / ibv_dereg_mr in ib.c), so tests/test_ib.cpp checks the policy without a device.
 *
 * Ranges are rounded out to whole pages (registration pins pages). A request that overlaps an entry without being
 * covered by it re-registers: the overlapped entries are invalidated first, so no two entries overlap and a stale
 * registration of a reused address range is never handed out once the range has been re-registered.
 *
 * Device memory (the GDR path, ib_gdr.c) is looked up by address AND by the CUDA allocation's buffer id: an address
 * freed and allocated again has a new id, so the entry registered for the old allocation (which maps the old pages,
 * still pinned by the NIC) is deregistered and the range registered again instead of being handed out.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ib.h"

zccl_result_t zccl__ib_mr_cache_init(zccl_ib_mr_cache_t *c, size_t max_entries, size_t max_bytes,
                                     zccl_ib_reg_fn reg, zccl_ib_dereg_fn dereg, void *ctx) {
    memset(c, 0, sizeof *c);
    if (max_entries == 0 || !reg || !dereg)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "registration cache: max_entries must be > 0 and callbacks set");
    if (!(c->e = calloc(max_entries, sizeof *c->e)))
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for a registration cache of %zu entries", max_entries);
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    c->reg = reg;
    c->dereg = dereg;
    c->ctx = ctx;
    return ZCCL_SUCCESS;
}

/* Entries stay where they are (transfers hold pointers to pinned ones); a free slot has live == false. */
static void drop(zccl_ib_mr_cache_t *c, size_t i) {
    c->dereg(c->ctx, c->e[i].handle);
    c->bytes -= c->e[i].end - c->e[i].start;
    memset(&c->e[i], 0, sizeof c->e[i]);
    c->n--;
}

/* Evicts the least recently used unpinned entry; false when all are pinned. */
static bool evict_one(zccl_ib_mr_cache_t *c) {
    size_t best = c->max_entries;
    for (size_t i = 0; i < c->max_entries; i++)
        if (c->e[i].live && c->e[i].pins == 0 && (best == c->max_entries || c->e[i].last_use < c->e[best].last_use))
            best = i;
    if (best == c->max_entries) return false;
    drop(c, best);
    c->evictions++;
    return true;
}

/* dev: buf_id is the allocation's and an entry of another allocation never matches (zccl__ib_mr_get_dev). */
static zccl_ib_mr_entry_t *get(zccl_ib_mr_cache_t *c, const void *addr, size_t len, bool dev, uint64_t buf_id,
                               bool *stale) {
    if (!c->e || len == 0) return NULL;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)addr;
    if (a + len < a) return NULL;
    const uintptr_t start = a & ~(page - 1), end = (a + len + page - 1) & ~(page - 1);
    for (size_t i = 0; i < c->max_entries; i++)
        if (c->e[i].live && c->e[i].start <= start && end <= c->e[i].end && (!dev || c->e[i].buf_id == buf_id)) {
            c->e[i].last_use = ++c->clock;
            c->e[i].pins++;
            c->hits++;
            return &c->e[i];
        }
    c->misses++;
    if (end - start > c->max_bytes) return NULL;
    /* Re-registration: drop unpinned entries the new range overlaps; a pinned one makes us stage instead. */
    for (size_t i = 0; i < c->max_entries; i++)
        if (c->e[i].live && c->e[i].start < end && start < c->e[i].end && c->e[i].pins) return NULL;
    for (size_t i = 0; i < c->max_entries; i++)
        if (c->e[i].live && c->e[i].start < end && start < c->e[i].end) {
            if (dev && c->e[i].buf_id && c->e[i].buf_id != buf_id) { /* another allocation's pages: freed since */
                c->stale++;
                if (stale) *stale = true;
            }
            drop(c, i);
            c->invalidations++;
        }
    while (c->n == c->max_entries || c->bytes + (end - start) > c->max_bytes)
        if (!evict_one(c)) return NULL;
    size_t slot = 0;
    while (c->e[slot].live) slot++; /* n < max_entries here */
    zccl_ib_mr_entry_t e = {start, end, NULL, 0, 0, ++c->clock, 1, true, dev ? buf_id : 0};
    if (c->reg(c->ctx, (void *)start, end - start, &e.handle, &e.lkey, &e.rkey) != 0) return NULL;
    c->e[slot] = e;
    c->bytes += end - start;
    c->n++;
    return &c->e[slot];
}

zccl_ib_mr_entry_t *zccl__ib_mr_get(zccl_ib_mr_cache_t *c, const void *addr, size_t len) {
    return get(c, addr, len, false, 0, NULL);
}

zccl_ib_mr_entry_t *zccl__ib_mr_get_dev(zccl_ib_mr_cache_t *c, const void *addr, size_t len, uint64_t buf_id,
                                        bool *stale) {
    if (stale) *stale = false;
    return get(c, addr, len, true, buf_id, stale);
}

const zccl_ib_mr_entry_t *zccl__ib_mr_find_dev(const zccl_ib_mr_cache_t *c, const void *p) {
    const uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; c->e && i < c->max_entries; i++)
        if (c->e[i].live && c->e[i].buf_id && c->e[i].start <= a && a < c->e[i].end) return &c->e[i];
    return NULL;
}

void zccl__ib_mr_unpin(zccl_ib_mr_cache_t *c, zccl_ib_mr_entry_t *e) {
    if (e && e->pins > 0) e->pins--;
}

void zccl__ib_mr_invalidate(zccl_ib_mr_cache_t *c, const void *addr, size_t len) {
    const uintptr_t a = (uintptr_t)addr, b = a + len;
    for (size_t i = 0; c->e && i < c->max_entries; i++)
        if (c->e[i].live && c->e[i].start < b && a < c->e[i].end && c->e[i].pins == 0) {
            drop(c, i);
            c->invalidations++;
        }
}

void zccl__ib_mr_cache_fini(zccl_ib_mr_cache_t *c) {
    for (size_t i = 0; c->e && i < c->max_entries; i++)
        if (c->e[i].live) drop(c, i);
    free(c->e);
    c->e = NULL;
}
