/*
 * regmem.c — shareable buffers and the one-pass collectives over them.
 *
 * zccl_mem_alloc puts the memory in a named POSIX shared-memory object ("/zccl-mem-<id>-p<pid>", so the stale-name
 * sweep of transport/shm.c recognises it if the process dies), mapped MAP_SHARED and pre-faulted. Any other process
 * of the host may open the name and map the same pages: that is what lets a peer read the buffer in place.
 * zccl_comm_register records, per communicator, a range the caller will pass to collectives. Neither call talks
 * to the peers (ncclCommRegister's shape: local, any order between ranks).
 *
 * At a collective, the ranks agree on the path through their shm segment headers: each rank writes a descriptor
 * (the call's sequence number, and for its send and receive buffers the region id and offset, or 0 when they are
 * not inside a registered zccl_mem_alloc region) and reads every peer's. All ranks then see the same descriptors
 * and decide alike: if every rank's buffers are registered, the call runs here in one pass over the data —
 *
 *   all-reduce      rank i reduces block i of every rank's send buffer, in rank order, through a cache-sized
 *                   buffer, and writes the result into block i of every rank's receive buffer;
 *   reduce-scatter  rank i reduces block i of every rank's send buffer into its own receive buffer;
 *   all-gather      rank i copies every rank's send buffer into its own receive buffer;
 *
 * then an exit barrier (a rank may reuse its buffers when its call returns, so every peer must be done with
 * them). Otherwise the call takes the normal schedule. The descriptor of call k is not overwritten before every
 * peer read it: these three collectives cannot finish on any rank before every rank has contributed, and a rank
 * contributes only after reading the descriptors.
 *
 * In place is safe in all three: the blocks a rank writes are ones no other rank reads in the same call.
 */

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kernels.h"
#include "regmem.h"

ZCCL_SETTING(zccl__set_shm_reg_min_bytes) = {
    .name = "ZCCL_SHM_REG_MIN_BYTES", .deflt = "32K",
    .help = "all-reduce / reduce-scatter / all-gather of at least this many bytes (the whole vector) on one host look "
            "for buffers registered on every rank (zccl_comm_register) and then reduce straight from the peers' "
            "buffers; 0 disables the check",
    .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = INT64_MAX, .must_match = true};

typedef struct region {
    struct region *next;
    uint8_t *base;
    size_t bytes;  /* mapped bytes (whole pages) */
    uint64_t id;
} region_t;

typedef struct reg {
    struct reg *next;
    struct zccl_comm *comm;
    const uint8_t *buf;
    size_t bytes;
} reg_t;

typedef struct pmap {
    struct pmap *next;
    struct zccl_comm *comm;
    int peer;
    uint64_t id;
    uint8_t *base;
    size_t bytes;
} pmap_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static region_t *regions;
static reg_t *regs;
static pmap_t *pmaps;
static uint64_t next_id = 1;

static void region_name(char *buf, size_t len, uint64_t id, int pid) {
    snprintf(buf, len, "/zccl-mem-%llu-p%d", (unsigned long long)id, pid);
}

zccl_result_t zccl__mem_alloc(void **ptr, size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sz = (bytes + page - 1) / page * page;
    pthread_mutex_lock(&mu);
    const uint64_t id = next_id++;
    pthread_mutex_unlock(&mu);
    char name[64];
    region_name(name, sizeof name, id, (int)getpid());
    region_t *r = calloc(1, sizeof *r);
    if (!r) return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_mem_alloc: out of memory for the region record");
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        free(r);
        return zccl__syserror(errno, "zccl_mem_alloc: shm_open(%s) for %zu bytes", name, bytes);
    }
    if (ftruncate(fd, (off_t)sz) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        free(r);
        return zccl__syserror(e, "zccl_mem_alloc: sizing %s to %zu bytes (is /dev/shm large enough?)", name, sz);
    }
    /* MAP_POPULATE: the pages are faulted in now, not in the first collective. */
    void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        free(r);
        return zccl__syserror(e, "zccl_mem_alloc: mapping %zu bytes of %s", sz, name);
    }
    r->base = p;
    r->bytes = sz;
    r->id = id;
    pthread_mutex_lock(&mu);
    r->next = regions;
    regions = r;
    pthread_mutex_unlock(&mu);
    *ptr = p;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__mem_free(void *ptr) {
    pthread_mutex_lock(&mu);
    region_t **pp = &regions;
    while (*pp && (*pp)->base != ptr) pp = &(*pp)->next;
    region_t *r = *pp;
    if (r) *pp = r->next;
    pthread_mutex_unlock(&mu);
    if (!r)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_mem_free: argument 'ptr' = %p is not a pointer returned by "
                           "zccl_mem_alloc (or was freed already)", ptr);
    char name[64];
    region_name(name, sizeof name, r->id, (int)getpid());
    shm_unlink(name);
    munmap(r->base, r->bytes);
    free(r);
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__comm_register(struct zccl_comm *comm, void *buf, size_t bytes, void **handle) {
    reg_t *g = calloc(1, sizeof *g);
    if (!g) return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_comm_register: out of memory for the registration record");
    g->comm = comm;
    g->buf = buf;
    g->bytes = bytes;
    pthread_mutex_lock(&mu);
    g->next = regs;
    regs = g;
    pthread_mutex_unlock(&mu);
    *handle = g;
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__comm_deregister(struct zccl_comm *comm, void *handle) {
    pthread_mutex_lock(&mu);
    reg_t **pp = &regs;
    while (*pp && (*pp != handle || (*pp)->comm != comm)) pp = &(*pp)->next;
    reg_t *g = *pp;
    if (g) *pp = g->next;
    pthread_mutex_unlock(&mu);
    if (!g)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_deregister: argument 'handle' = %p is not a registration "
                           "of this communicator (rank %d) or was deregistered already", handle, comm->rank);
    free(g);
    return ZCCL_SUCCESS;
}

void zccl__reg_comm_gone(struct zccl_comm *comm) {
    pthread_mutex_lock(&mu);
    for (reg_t **pp = &regs; *pp;) {
        reg_t *g = *pp;
        if (g->comm == comm) { *pp = g->next; free(g); } else pp = &g->next;
    }
    for (pmap_t **pp = &pmaps; *pp;) {
        pmap_t *m = *pp;
        if (m->comm == comm) { *pp = m->next; munmap(m->base, m->bytes); free(m); } else pp = &m->next;
    }
    pthread_mutex_unlock(&mu);
}

/* Region id and offset of [p, p+bytes) when comm registered a range holding it and it lies in one zccl_mem_alloc
 * region; id 0 otherwise. Caller holds mu. */
static uint64_t locate(struct zccl_comm *comm, const void *p, size_t bytes, uint64_t *off) {
    const uint8_t *b = p;
    bool registered = false;
    for (const reg_t *g = regs; g && !registered; g = g->next)
        registered = g->comm == comm && b >= g->buf && bytes <= g->bytes && (size_t)(b - g->buf) <= g->bytes - bytes;
    if (!registered) return 0;
    for (const region_t *r = regions; r; r = r->next)
        if (b >= r->base && bytes <= r->bytes && (size_t)(b - r->base) <= r->bytes - bytes) {
            *off = (uint64_t)(b - r->base);
            return r->id;
        }
    return 0;
}

/* The peer's region `id`, mapped once per communicator. Caller holds mu. */
static zccl_result_t peer_region(struct zccl_comm *comm, int peer, uint64_t id, uint64_t off, size_t bytes,
                                 uint8_t **out) {
    pmap_t *m = pmaps;
    while (m && !(m->comm == comm && m->peer == peer && m->id == id)) m = m->next;
    if (!m) {
        char name[64];
        region_name(name, sizeof name, id, comm->tc.peers[peer].pid);
        int fd = shm_open(name, O_RDWR, 0);
        if (fd < 0)
            return zccl__syserror(errno, "rank %d: opening rank %d's registered buffer %s (freed while registered?)",
                                  comm->rank, peer, name);
        struct stat st;
        if (fstat(fd, &st) != 0) {
            int e = errno;
            close(fd);
            return zccl__syserror(e, "rank %d: fstat of rank %d's registered buffer %s", comm->rank, peer, name);
        }
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int e = errno;
        close(fd);
        if (p == MAP_FAILED)
            return zccl__syserror(e, "rank %d: mapping rank %d's registered buffer %s (%lld bytes)", comm->rank, peer,
                                  name, (long long)st.st_size);
        m = calloc(1, sizeof *m);
        if (!m) {
            munmap(p, (size_t)st.st_size);
            return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: out of memory for a peer mapping", comm->rank);
        }
        *m = (pmap_t){.next = pmaps, .comm = comm, .peer = peer, .id = id, .base = p, .bytes = (size_t)st.st_size};
        pmaps = m;
    }
    if (off > m->bytes || bytes > m->bytes - off)
        return zccl__error(ZCCL_INTERNAL_ERROR, "rank %d: rank %d's registered range [%llu, +%zu) lies outside its "
                           "region of %zu bytes", comm->rank, peer, (unsigned long long)off, bytes, m->bytes);
    *out = m->base + off;
    return ZCCL_SUCCESS;
}

/* ---- the descriptors in the shm segment headers ---- */

typedef struct {
    _Alignas(64) uint64_t seq; /* the call these fields describe; stored last (release) */
    uint64_t send_id, send_off, recv_id, recv_off;
    _Alignas(64) uint64_t done; /* the last call whose direct path this rank finished */
} desc_t;
_Static_assert(sizeof(desc_t) <= ZCCL_SHM_REG_AREA_BYTES, "descriptor must fit the shm header's area");

/* Whether every rank's word at `field` of its descriptor area has reached `want`. */
static bool all_reached(struct zccl_comm *comm, size_t field, uint64_t want) {
    for (int r = 0; r < comm->nranks; r++) {
        const uint8_t *a = zccl__shm_reg_area(&comm->tc, r);
        if (__atomic_load_n((const uint64_t *)(a + field), __ATOMIC_ACQUIRE) < want) return false;
    }
    return true;
}

static bool reached(struct zccl_comm *comm, int r, size_t field, uint64_t want) {
    const uint8_t *a = zccl__shm_reg_area(&comm->tc, r);
    return __atomic_load_n((const uint64_t *)(a + field), __ATOMIC_ACQUIRE) >= want;
}

/* Waits until every local peer's word at `field` reaches `want`; sleeps on the doorbell as the engine does, and
 * every 50 ms checks that the peers it still waits for are alive, and the ZCCL_TIMEOUT_MS deadline. */
static zccl_result_t wait_all(struct zccl_comm *comm, size_t field, uint64_t want, const char *what) {
    uint64_t idle_since = zccl__now_ns(), last_check = idle_since;
    for (unsigned spin = 0;; spin++) {
        if (all_reached(comm, field, want)) return ZCCL_SUCCESS;
        if ((spin & 63) != 0 || zccl__now_ns() - idle_since < comm->spin_ns) {
            __builtin_ia32_pause();
            continue;
        }
        uint32_t seen = __atomic_load_n(comm->tc.doorbell, __ATOMIC_SEQ_CST);
        __atomic_store_n(comm->tc.sleeping, 1, __ATOMIC_SEQ_CST);
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* pairs with the fence in zccl__doorbell_ring */
        if (!all_reached(comm, field, want)) zccl__doorbell_wait(&comm->tc, seen, 50);
        __atomic_store_n(comm->tc.sleeping, 0, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
            return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: communicator aborted during collective #%llu", comm->rank,
                               (unsigned long long)comm->seq);
        /* Look again before judging the peers: one that set its word, woke us and then left (its call done, its
         * communicator destroyed) is not lost. */
        if (all_reached(comm, field, want)) return ZCCL_SUCCESS;
        const uint64_t now = zccl__now_ns();
        if (now - last_check < 50000000ull) continue;
        last_check = now;
        for (int r = 0; r < comm->nranks; r++) {
            const zccl_transport_ops_t *tp = comm->tc.tp[r];
            if (r == comm->rank || reached(comm, r, field, want) || (tp->departed && tp->departed(&comm->tc, r)))
                continue; /* only a peer still awaited can be lost to this wait */
            const zccl_result_t res = tp->check_peer(&comm->tc, r);
            if (res != ZCCL_SUCCESS && !reached(comm, r, field, want)) return res; /* it did not finish first */
        }
        if (comm->timeout_ms > 0 && now - idle_since > (uint64_t)comm->timeout_ms * 1000000ull)
            return zccl__error(ZCCL_TIMEOUT, "rank %d: waited %lld ms for the peers' %s of %s (collective #%llu)",
                               comm->rank, (long long)comm->timeout_ms, what, comm->op_name,
                               (unsigned long long)comm->seq);
    }
}

static void ring_all(struct zccl_comm *comm) {
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank) zccl__doorbell_ring(&comm->tc, r);
}

/* Reduces, in rank order, `count` elements at element src_off of every rank's src[r] into element dst_off of every
 * dst[d] (ndst of them), through the cache-sized bounce buffer, so a destination may alias a source. */
static void reduce_blocks(struct zccl_comm *comm, uint8_t *const *src, size_t src_off, uint8_t *const *dst, int ndst,
                          size_t dst_off, size_t count, zccl_datatype_t dt, zccl_redop_t op) {
    const int n = comm->nranks;
    const size_t es = zccl_type_size(dt);
    const zccl_redop_t kop = op == ZCCL_AVG ? ZCCL_SUM : op;
    const size_t step = ZCCL_MIN((size_t)32768, comm->tc.chunk_bytes) / es;
    uint8_t *tmp = comm->tc.chunk_tmp;
    for (size_t k = 0; k < count; k += step) {
        const size_t c = ZCCL_MIN(step, count - k), at = (src_off + k) * es, to = (dst_off + k) * es;
        for (int r = 1; r < n; r++)
            zccl_kernel_reduce(tmp, r == 1 ? src[0] + at : tmp, src[r] + at, c, dt, kop,
                               (r == n - 1 && op == ZCCL_AVG) ? (uint32_t)n : 1);
        for (int d = 0; d < ndst; d++) memcpy(dst[d] + to, tmp, c * es);
    }
}

zccl_result_t zccl__reg_try_run(struct zccl_comm *comm, const zccl_op_t *o, bool *done, bool *started) {
    *done = *started = false;
    const int n = comm->nranks;
    if (n < 2 || o->vcounts || o->barrier || o->count == 0) return ZCCL_SUCCESS;
    if (o->coll != ZCCL_COLL_ALLREDUCE && o->coll != ZCCL_COLL_REDUCE_SCATTER && o->coll != ZCCL_COLL_ALLGATHER)
        return ZCCL_SUCCESS;
    const int64_t min_bytes = comm->reg_min_bytes; /* read at init (lib/api/comm_init.c) */
    const size_t es = zccl_type_size(o->dt);
    const size_t mult = o->coll == ZCCL_COLL_ALLREDUCE ? 1 : (size_t)n;
    const size_t total = o->count * es * mult; /* the whole vector, the same on every rank */
    if (min_bytes == 0 || total < (size_t)min_bytes) return ZCCL_SUCCESS;
    for (int r = 0; r < n; r++) /* the same on every rank: the transport table agrees */
        if (!zccl__shm_reg_area(&comm->tc, r)) return ZCCL_SUCCESS;

    /* Publish this rank's descriptor. */
    const size_t sbytes = o->coll == ZCCL_COLL_ALLGATHER ? o->count * es : total;
    const size_t rbytes = o->coll == ZCCL_COLL_REDUCE_SCATTER ? o->count * es : total;
    desc_t *me = zccl__shm_reg_area(&comm->tc, comm->rank);
    pthread_mutex_lock(&mu);
    uint64_t soff = 0, roff = 0;
    const uint64_t sid = locate(comm, o->sendbuf, sbytes, &soff);
    const uint64_t rid = locate(comm, o->recvbuf, rbytes, &roff);
    pthread_mutex_unlock(&mu);
    me->send_id = sid;
    me->send_off = soff;
    me->recv_id = rid;
    me->recv_off = roff;
    __atomic_store_n(&me->seq, comm->seq, __ATOMIC_RELEASE);
    *started = true;
    ring_all(comm);
    /* A rank whose own buffers are not registered knows the answer already (every rank will read its descriptor and
     * fall back): it does not wait for the others' descriptors, so unregistered programs pay one cache-line write. */
    const bool need_recv = o->coll == ZCCL_COLL_ALLREDUCE;
    if (sid == 0 || (need_recv && rid == 0)) return ZCCL_SUCCESS;
    ZCCL_CHECK(wait_all(comm, offsetof(desc_t, seq), comm->seq, "buffer descriptors"));

    /* The decision, from descriptors every rank reads alike. */
    for (int r = 0; r < n; r++) {
        const desc_t *d = zccl__shm_reg_area(&comm->tc, r);
        if (d->send_id == 0 || (need_recv && d->recv_id == 0)) return ZCCL_SUCCESS; /* the normal path */
    }
    uint8_t *src[64], *dst[64], **srcv = src, **dstv = dst;
    if (n > 64) {
        srcv = malloc((size_t)n * sizeof *srcv);
        dstv = malloc((size_t)n * sizeof *dstv);
        if (!srcv || !dstv) {
            free(srcv == src ? NULL : srcv);
            free(dstv == dst ? NULL : dstv);
            return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: out of memory for %d buffer pointers", comm->rank, n);
        }
    }
    zccl_result_t res = ZCCL_SUCCESS;
    pthread_mutex_lock(&mu);
    for (int r = 0; r < n && res == ZCCL_SUCCESS; r++) {
        const desc_t *d = zccl__shm_reg_area(&comm->tc, r);
        if (r == comm->rank) {
            srcv[r] = (uint8_t *)o->sendbuf;
            dstv[r] = o->recvbuf;
            continue;
        }
        res = peer_region(comm, r, d->send_id, d->send_off, sbytes, &srcv[r]);
        if (res == ZCCL_SUCCESS && need_recv) res = peer_region(comm, r, d->recv_id, d->recv_off, rbytes, &dstv[r]);
    }
    pthread_mutex_unlock(&mu);
    if (res == ZCCL_SUCCESS) {
        const int i = comm->rank;
        if (o->coll == ZCCL_COLL_ALLREDUCE) {
            const size_t per = (o->count + (size_t)n - 1) / (size_t)n;
            const size_t off = ZCCL_MIN((size_t)i * per, o->count), len = ZCCL_MIN(per, o->count - off);
            reduce_blocks(comm, srcv, off, dstv, n, off, len, o->dt, o->op);
        } else if (o->coll == ZCCL_COLL_REDUCE_SCATTER) {
            uint8_t *mine = o->recvbuf;
            reduce_blocks(comm, srcv, (size_t)i * o->count, &mine, 1, 0, o->count, o->dt, o->op);
        } else {
            for (int r = 0; r < n; r++) {
                uint8_t *to = (uint8_t *)o->recvbuf + (size_t)r * o->count * es;
                if (to != srcv[r]) memcpy(to, srcv[r], o->count * es);
            }
        }
        /* Exit barrier: peers read our send buffer and write our receive buffer until they are done. */
        __atomic_store_n(&me->done, comm->seq, __ATOMIC_RELEASE);
        ring_all(comm);
        res = wait_all(comm, offsetof(desc_t, done), comm->seq, "completion");
        if (res == ZCCL_SUCCESS) *done = true;
    }
    if (srcv != src) free(srcv);
    if (dstv != dst) free(dstv);
    return res;
}
