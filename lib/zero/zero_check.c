/*
 * zero_check.c — ZCCL_BUCKET_CHECK=1: catches writes into a gradient region through a pointer kept past
 * zccl_bucket_mark_ready (include/zccl_zero.h: the region belongs to the collective from mark_ready to finish).
 *
 * mark_ready / mark_unused checksum the parameter's region. When the bucket launches, every region is checksummed
 * again and the bucket's padding must still be zero: a difference is a write after mark_ready. When the bucket's
 * collective completes, its regions (ALLREDUCE mode) or its whole buffer (REDUCE_SCATTER mode, where the buffer
 * is handed to bucket b+K next) are checksummed once more; at finish (ALLREDUCE) or when the buffer is handed to
 * the next bucket (REDUCE_SCATTER) they must be unchanged: a difference is a write after the collective. A write
 * during the collective itself is not caught (it would take a copy of the bucket). The call that finds a
 * difference fails with ZCCL_INVALID_USAGE naming the parameter (its index in numel[]) and the bucket; the bucket's
 * collective is refused on this rank, so the other ranks fail too instead of waiting (zccl.h "Invalid calls").
 * Off by default: it reads every gradient byte two or three times more per micro-step (cost in docs/zero.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zero.h"

/* 64-bit checksum over four independent lanes (so it runs near memory speed), tail bytes folded in last. */
static uint64_t checksum(const void *data, size_t bytes) {
    const uint8_t *p = data;
    uint64_t a = 0x9e3779b97f4a7c15ull, b = 0xc2b2ae3d27d4eb4full, c = 0x165667b19e3779f9ull, d = 0x27d4eb2f165667c5ull;
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        a = (a ^ w[0]) * 0x100000001b3ull;
        b = (b ^ w[1]) * 0x100000001b3ull;
        c = (c ^ w[2]) * 0x100000001b3ull;
        d = (d ^ w[3]) * 0x100000001b3ull;
    }
    uint64_t h = a ^ (b << 1) ^ (c << 2) ^ (d << 3) ^ bytes;
    for (; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void *region(const struct zccl_bucket_plan *p, int param) {
    const int b = p->p_bucket[param];
    void *base = p->o.mode == ZCCL_BUCKET_ALLREDUCE ? p->buf[b] : p->buf[b % p->nslots];
    return (char *)base + p->p_off[param] * p->es;
}

zccl_result_t zccl__bucket_check_init(struct zccl_bucket_plan *p) {
    int64_t on = 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_BUCKET_CHECK, &on));
    p->check = on != 0;
    if (!p->check) return ZCCL_SUCCESS;
    p->ck_mark = calloc((size_t)p->nparams, sizeof *p->ck_mark);
    p->ck_post = calloc((size_t)p->nparams, sizeof *p->ck_post);
    p->ck_state = calloc((size_t)p->nparams, 1);
    p->ck_slot = calloc((size_t)p->nslots, sizeof *p->ck_slot);
    p->ck_slot_bucket = calloc((size_t)p->nslots, sizeof *p->ck_slot_bucket);
    if (!p->ck_mark || !p->ck_post || !p->ck_state || !p->ck_slot || !p->ck_slot_bucket)
        return zccl__error(ZCCL_SYSTEM_ERROR, "ZCCL_BUCKET_CHECK: out of memory for %d checksums", p->nparams);
    for (int s = 0; s < p->nslots; s++) p->ck_slot_bucket[s] = -1;
    return ZCCL_SUCCESS;
}

void zccl__bucket_check_free(struct zccl_bucket_plan *p) {
    free(p->ck_mark);
    free(p->ck_post);
    free(p->ck_state);
    free(p->ck_slot);
    free(p->ck_slot_bucket);
}

void zccl__bucket_check_begin(struct zccl_bucket_plan *p) {
    if (!p->check) return;
    memset(p->ck_state, 0, (size_t)p->nparams);
    for (int s = 0; s < p->nslots; s++) p->ck_slot_bucket[s] = -1;
}

/* Under p->mu, at mark_ready / mark_unused. A REDUCE_SCATTER region whose buffer was not handed to its bucket yet
 * (an unused parameter of a bucket nobody asked a pointer for) belongs to an earlier bucket: nothing to record. */
void zccl__bucket_check_mark(struct zccl_bucket_plan *p, int param) {
    if (!p->check) return;
    const int b = p->p_bucket[param];
    if (p->o.mode == ZCCL_BUCKET_REDUCE_SCATTER && p->slot_owner[b % p->nslots] != b) return;
    p->ck_mark[param] = checksum(region(p, param), p->numel[param] * p->es);
    p->ck_state[param] = 1;
}

static zccl_result_t changed(const struct zccl_bucket_plan *p, int param, const char *when) {
    return zccl__error(ZCCL_INVALID_USAGE, "ZCCL_BUCKET_CHECK: the gradient region of parameter %d (numel[%d] = %zu, "
                       "bucket %d) was written %s: a pointer from zccl_bucket_grad_ptr was used after "
                       "zccl_bucket_mark_ready (the region belongs to the collective until zccl_bucket_finish)",
                       param, param, p->numel[param], p->p_bucket[param], when);
}

/* Under p->mu, before bucket b's collective is issued. */
zccl_result_t zccl__bucket_check_launch(struct zccl_bucket_plan *p, int b) {
    if (!p->check) return ZCCL_SUCCESS;
    const zb_bucket_t *bk = &p->b[b];
    for (int k = 0; k < bk->nparams; k++) {
        const int i = bk->first_param - k;
        if (p->ck_state[i] == 1 && checksum(region(p, i), p->numel[i] * p->es) != p->ck_mark[i])
            return changed(p, i, "between zccl_bucket_mark_ready and the bucket's launch");
    }
    const char *base = p->o.mode == ZCCL_BUCKET_ALLREDUCE ? p->buf[b] : p->buf[b % p->nslots];
    for (size_t e = bk->used * p->es; e < bk->elems * p->es; e++)
        if (base[e] != 0)
            return zccl__error(ZCCL_INVALID_USAGE, "ZCCL_BUCKET_CHECK: the padding of bucket %d (elements %zu..%zu of "
                               "its buffer, after its last parameter) is not zero at its launch (byte %zu): a stale "
                               "gradient pointer wrote past its parameter, or into a buffer another bucket reuses",
                               b, bk->used, bk->elems, e);
    return ZCCL_SUCCESS;
}

/* Under p->mu, once bucket b's collective has completed (before its shard is accumulated). */
void zccl__bucket_check_retire(struct zccl_bucket_plan *p, int b) {
    if (!p->check) return;
    const zb_bucket_t *bk = &p->b[b];
    if (p->o.mode == ZCCL_BUCKET_ALLREDUCE) {
        for (int k = 0; k < bk->nparams; k++) {
            const int i = bk->first_param - k;
            p->ck_post[i] = checksum(region(p, i), p->numel[i] * p->es);
            p->ck_state[i] = 2;
        }
    } else {
        const int s = b % p->nslots;
        p->ck_slot[s] = checksum(p->buf[s], bk->elems * p->es);
        p->ck_slot_bucket[s] = b;
    }
}

/* Under p->mu, REDUCE_SCATTER: before buffer `slot` is zeroed for the next bucket. */
zccl_result_t zccl__bucket_check_reuse(struct zccl_bucket_plan *p, int slot) {
    if (!p->check || p->ck_slot_bucket[slot] < 0) return ZCCL_SUCCESS;
    const int b = p->ck_slot_bucket[slot];
    p->ck_slot_bucket[slot] = -1;
    if (checksum(p->buf[slot], p->b[b].elems * p->es) == p->ck_slot[slot]) return ZCCL_SUCCESS;
    /* Name the parameter whose region changed: the first whose bytes differ is not known without a copy, so name
     * the bucket's parameters' range. */
    return zccl__error(ZCCL_INVALID_USAGE, "ZCCL_BUCKET_CHECK: the buffer of bucket %d (parameters %d..%d) was "
                       "written after its collective completed and before bucket %d reused it: a pointer from "
                       "zccl_bucket_grad_ptr for one of those parameters was used after zccl_bucket_mark_ready",
                       b, p->b[b].first_param - p->b[b].nparams + 1, p->b[b].first_param, b + p->nslots);
}

/* Under p->mu, ALLREDUCE: at finish, after every bucket completed. */
zccl_result_t zccl__bucket_check_finish(struct zccl_bucket_plan *p) {
    if (!p->check || p->o.mode != ZCCL_BUCKET_ALLREDUCE) return ZCCL_SUCCESS;
    for (int i = 0; i < p->nparams; i++)
        if (p->ck_state[i] == 2 && checksum(region(p, i), p->numel[i] * p->es) != p->ck_post[i])
            return changed(p, i, "after its bucket's collective completed");
    return ZCCL_SUCCESS;
}
