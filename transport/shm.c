/*
 * shm.c — shared-memory transport between ranks of one host.
 *
 * Every rank owns one segment in /dev/shm: its inbox. For each local sender the inbox holds a channel: a FIFO of
 * ZCCL_SHM_SLOTS slots of ZCCL_SHM_SLOT_BYTES (cache-sized, so the copy in and the copy or reduction out stay in
 * cache), with the sender's and the receiver's counters on separate cache lines. Small messages are copied
 * through the slots, pipelined slot by slot. Messages of ZCCL_CMA_THRESHOLD bytes or more take the single-copy
 * path: the sender posts only a descriptor (pid, address, length) and the receiver pulls the data straight from
 * the sender's buffer with process_vm_readv(2) — into its destination for a copy, or through a cache-sized
 * bounce buffer for a reduction — then acknowledges, which releases the sender's buffer. Whether the kernel lets
 * a rank read its peer (Yama ptrace scope, containers) is probed at init, per pair; without it, slots are used.
 *
 * Waiting: a rank that has nothing to do sleeps on the futex word in its own segment header (its doorbell);
 * whoever changes one of its channels bumps the doorbell and wakes it if it sleeps.
 */
#include <dirent.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include "transport.h"
#include "kernels.h"

extern const zccl_transport_ops_t zccl_transport_shm; /* defined at the end of this file */

#define SEG_MAGIC 0x7a63636c73686d31ull /* "zcclshm1" */
#define SLOT_INLINE 1u
#define SLOT_CMA 2u
#define CMA_UNKNOWN 0
#define CMA_YES 1
#define CMA_NO 2

typedef struct {
    _Alignas(64) uint64_t head;     /* slots posted: written by the sender (for diagnostics; receivers poll seq) */
    _Alignas(64) uint64_t tail;     /* slots consumed: written by the receiver, read by a sender whose view is full */
    _Alignas(64) uint64_t cma_acks; /* single-copy descriptors fully read: written by the receiver */
    _Alignas(64) int32_t cma_ok;    /* receiver's probe of the sender: CMA_* */
} chan_ctl_t;

/* One cache line per slot. The sender fills it and stores seq last; the receiver polls seq of the slot it expects,
 * so a small message costs the receiver one cache-line transfer: flag, length and payload arrive together. */
#define TINY_BYTES 40
typedef struct {
    _Alignas(64) uint64_t seq; /* index of the message in this channel + 1, once the slot is filled */
    uint32_t kind;
    uint32_t len;
    uint64_t addr;             /* SLOT_CMA: the sender's buffer */
    uint8_t tiny[TINY_BYTES];  /* SLOT_INLINE with len <= TINY_BYTES: the payload itself */
} slot_meta_t;
_Static_assert(sizeof(slot_meta_t) == 64, "slot metadata must be one cache line");

typedef struct {
    uint64_t magic; /* written last by the creator */
    uint32_t nlocal, nslots;
    uint64_t slot_bytes, chan_stride, data_offset;
    _Alignas(64) uint32_t doorbell;
    _Alignas(64) uint32_t sleeping;
    uint32_t failed;   /* set when the owner gave up a collective after a lost peer or a timeout: it will not take
                          part in this communicator's collectives again (its peers fail instead of waiting) */
    uint32_t departed; /* set (release) when the owner destroyed its communicator cleanly: every message it sent is
                          already in its peers' inboxes, so its exit is not a loss */
    _Alignas(64) uint8_t reg_area[ZCCL_SHM_REG_AREA_BYTES]; /* written by the owner only: lib/core/regmem.c */
} seg_hdr_t;
_Static_assert(sizeof(seg_hdr_t) <= 4096, "the segment header must fit its page");

typedef struct zccl_shm_comm {
    int nlocal;
    int *local_index;  /* per global rank: index among this host's ranks, -1 if elsewhere */
    uint8_t **seg;     /* per local index: mapped inbox of that rank (own included) */
    size_t seg_bytes;
    char my_name[64];
    bool unlinked;
    uint32_t nslots;
    size_t slot_bytes, chan_stride, data_offset, chan_base;
    size_t cma_threshold; /* SIZE_MAX while the tuner has the single copy off (zccl__shm_single_copy) */
    size_t cma_threshold_cfg; /* ZCCL_CMA_THRESHOLD */
    bool cma_enabled;
    bool cma_auto; /* ZCCL_SHM_CMA=-1: the tuner may turn the single copy off */
    uint64_t *cma_posted; /* per global rank: single-copy descriptors this rank posted to it */
    uint64_t *send_head;  /* per global rank: messages slots this rank posted to it (sender-private copy) */
    uint64_t *tail_seen;  /* per global rank: last value of its `tail` this rank read (refreshed when full) */
    uint64_t *recv_tail;  /* per global rank: slots this rank consumed from it (receiver-private copy) */
} shm_comm_t;
#define SHM_OF(c) ((shm_comm_t *)zccl__tp_state((c), &zccl_transport_shm))

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static seg_hdr_t *hdr_of(shm_comm_t *s, int li) { return (seg_hdr_t *)s->seg[li]; }

/* Channel sender -> owner inside owner's segment. */
static chan_ctl_t *chan(shm_comm_t *s, int owner_li, int sender_li) {
    return (chan_ctl_t *)(s->seg[owner_li] + s->chan_base + (size_t)sender_li * s->chan_stride);
}
static slot_meta_t *metas(chan_ctl_t *c) { return (slot_meta_t *)((uint8_t *)c + sizeof(chan_ctl_t)); }

/* Whether the sender has a free slot; reads the receiver's tail (a remote cache line) only when its cached view
 * says the FIFO is full. */
static bool slot_free(shm_comm_t *s, chan_ctl_t *c, int peer) {
    if (s->send_head[peer] - s->tail_seen[peer] < s->nslots) return true;
    s->tail_seen[peer] = __atomic_load_n(&c->tail, __ATOMIC_ACQUIRE);
    return s->send_head[peer] - s->tail_seen[peer] < s->nslots;
}

static void slot_post(zccl_tp_comm_t *comm, shm_comm_t *s, chan_ctl_t *c, int peer, slot_meta_t *m) {
    uint64_t h = ++s->send_head[peer];
    __atomic_store_n(&m->seq, h, __ATOMIC_RELEASE);
    __atomic_store_n(&c->head, h, __ATOMIC_RELAXED);
    zccl__doorbell_ring(comm, peer);
}
static uint8_t *slot_data(shm_comm_t *s, chan_ctl_t *c, uint64_t idx) {
    return (uint8_t *)c + s->data_offset + (size_t)(idx % s->nslots) * s->slot_bytes;
}

void zccl__doorbell_ring(zccl_tp_comm_t *comm, int peer) {
    uint32_t *bell, *sleeping;
    shm_comm_t *s = SHM_OF(comm);
    if (peer == comm->rank || !s) {
        bell = comm->doorbell;
        sleeping = comm->sleeping;
    } else {
        int li = s->local_index[peer];
        if (li < 0) return;
        bell = &hdr_of(s, li)->doorbell;
        sleeping = &hdr_of(s, li)->sleeping;
    }
    /* Dekker-style pairing with the sleeper in engine.c: it publishes `sleeping` and then re-polls its channels;
     * we published our channel update before this fence and read `sleeping` after it. So either it sees our
     * update, or we see it asleep and bump the bell, which makes its FUTEX_WAIT return. A rank that is awake costs
     * one load here, not a contended atomic. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    const uint32_t how = __atomic_load_n(sleeping, __ATOMIC_RELAXED);
    if (how) {
        __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
        /* 2: it yields between looks and sees the bump without a system call, unless it has just switched to the
         * futex (1, stored before its FUTEX_WAIT; read after our bump, so one of us sees the other). */
        if (how == 1 || __atomic_load_n(sleeping, __ATOMIC_SEQ_CST) == 1)
            syscall(SYS_futex, bell, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

static void seg_name(const zccl_tp_comm_t *comm, int rank, char *buf, size_t len) {
    snprintf(buf, len, "/zccl-%016llx-r%d-p%d", (unsigned long long)comm->comm_id, rank, (int)comm->peers[rank].pid);
}

/* A rank killed between creating its inbox and the init barrier leaves the name behind. The name carries the
 * creator's pid: remove the ones whose creator no longer exists (ESRCH; another user's are EPERM and stay) and
 * that are older than any init could take: containers sharing /dev/shm (--ipc=host) have other pid namespaces, and
 * their live inboxes, unlinked seconds after creation, must not be taken for leftovers. */
static void sweep_stale(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    const time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(d));) {
        const char *p = strstr(e->d_name, "-p");
        if (strncmp(e->d_name, "zccl-", 5) != 0 || !p) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0 || now - st.st_mtime < 3600) continue;
        long pid = strtol(p + 2, NULL, 10);
        if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            if (shm_unlink(name) == 0) ZCCL_INFO(ZCCL_LOG_SHM, "removed %s left by exited process %ld", name, pid);
        }
    }
    closedir(d);
}

static zccl_result_t create_own(zccl_tp_comm_t *comm, shm_comm_t *s) {
    sweep_stale();
    seg_name(comm, comm->rank, s->my_name, sizeof s->my_name);
    int fd = shm_open(s->my_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return zccl__syserror(errno, "shm_open(%s) for this rank's shared-memory inbox", s->my_name);
    if (ftruncate(fd, (off_t)s->seg_bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(s->my_name);
        return zccl__syserror(e, "ftruncate of %s to %zu bytes", s->my_name, s->seg_bytes);
    }
    /* Reserve the pages now: a /dev/shm too small must fail here, with the size, not as SIGBUS mid-collective. */
    int rc = posix_fallocate(fd, 0, (off_t)s->seg_bytes);
    if (rc != 0) {
        close(fd);
        shm_unlink(s->my_name);
        return zccl__error(ZCCL_SYSTEM_ERROR, "/dev/shm has no room for this rank's %zu-byte inbox (%s): %s; "
                           "enlarge /dev/shm (docker: --shm-size), lower ZCCL_SHM_SLOTS/ZCCL_SHM_SLOT_BYTES, or "
                           "set ZCCL_TRANSPORT=tcp", s->seg_bytes, s->my_name, strerror(rc));
    }
    void *p = mmap(NULL, s->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(s->my_name);
        return zccl__syserror(errno, "mmap of %s (%zu bytes)", s->my_name, s->seg_bytes);
    }
    int me = s->local_index[comm->rank];
    s->seg[me] = p;
    seg_hdr_t *h = p;
    h->nlocal = (uint32_t)s->nlocal;
    h->nslots = s->nslots;
    h->slot_bytes = s->slot_bytes;
    h->chan_stride = s->chan_stride;
    h->data_offset = s->data_offset;
    comm->doorbell = &h->doorbell;
    comm->sleeping = &h->sleeping;
    __atomic_store_n(&h->magic, SEG_MAGIC, __ATOMIC_RELEASE);
    return ZCCL_SUCCESS;
}

static zccl_result_t shm_check_peer(zccl_tp_comm_t *comm, int peer);

static zccl_result_t map_peer(zccl_tp_comm_t *comm, shm_comm_t *s, int rank, uint64_t deadline) {
    char name[64];
    seg_name(comm, rank, name, sizeof name);
    int fd = -1;
    unsigned polls = 0;
    for (;;) { /* the peer creates its inbox concurrently: wait for it to exist, have its size and its magic */
        if (fd < 0) fd = shm_open(name, O_RDWR, 0600);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size == s->seg_bytes) {
                void *p = mmap(NULL, s->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p == MAP_FAILED) {
                    int e = errno;
                    close(fd);
                    return zccl__syserror(e, "mmap of rank %d's inbox %s", rank, name);
                }
                if (__atomic_load_n(&((seg_hdr_t *)p)->magic, __ATOMIC_ACQUIRE) == SEG_MAGIC) {
                    close(fd);
                    s->seg[s->local_index[rank]] = p;
                    return ZCCL_SUCCESS;
                }
                munmap(p, s->seg_bytes);
            }
        } else if (errno != ENOENT) {
            return zccl__syserror(errno, "shm_open of rank %d's inbox %s", rank, name);
        }
        if (zccl__now_ns() > deadline) {
            if (fd >= 0) close(fd);
            return zccl__error(ZCCL_TIMEOUT, "rank %d's shared-memory inbox %s did not appear before the init "
                               "deadline (is rank %d alive? same ZCCL_SHM_* settings on every rank?)", rank, name, rank);
        }
        if (++polls % 16 == 0 && shm_check_peer(comm, rank) != ZCCL_SUCCESS) { /* died before creating it */
            if (fd >= 0) close(fd);
            return ZCCL_REMOTE_ERROR;
        }
        usleep(1000);
    }
}

static zccl_result_t shm_setup(zccl_tp_comm_t *comm) {
    shm_comm_t *s = calloc(1, sizeof *s);
    if (!s) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    zccl__tp_set_state(comm, &zccl_transport_shm, s);
    s->local_index = malloc((size_t)comm->nranks * sizeof(int));
    s->cma_posted = calloc((size_t)comm->nranks, sizeof(uint64_t));
    s->send_head = calloc((size_t)comm->nranks, sizeof(uint64_t));
    s->tail_seen = calloc((size_t)comm->nranks, sizeof(uint64_t));
    s->recv_tail = calloc((size_t)comm->nranks, sizeof(uint64_t));
    if (!s->local_index || !s->cma_posted || !s->send_head || !s->tail_seen || !s->recv_tail)
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    for (int r = 0; r < comm->nranks; r++)
        s->local_index[r] = (comm->tp[r] == &zccl_transport_shm || r == comm->rank) ? s->nlocal++ : -1;
    s->seg = calloc((size_t)s->nlocal, sizeof(uint8_t *));
    if (!s->seg) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory");
    int64_t v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_SHM_SLOT_BYTES, &v));
    s->slot_bytes = align_up((size_t)v, 4096);
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_SHM_SLOTS, &v));
    s->nslots = (uint32_t)v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_CMA_THRESHOLD, &v));
    s->cma_threshold = s->cma_threshold_cfg = (size_t)v;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_SHM_CMA, &v));
    s->cma_enabled = v != 0;
    s->cma_auto = v < 0;
    s->data_offset = align_up(sizeof(chan_ctl_t) + s->nslots * sizeof(slot_meta_t), 4096);
    s->chan_stride = s->data_offset + (size_t)s->nslots * s->slot_bytes;
    s->chan_base = align_up(sizeof(seg_hdr_t), 4096);
    s->seg_bytes = s->chan_base + (size_t)s->nlocal * s->chan_stride;
    if (s->cma_enabled) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* let local peers read our buffers */

    ZCCL_CHECK(create_own(comm, s));
    uint64_t deadline = zccl__now_ns() + (uint64_t)comm->init_timeout_ms * 1000000ull;
    int me = s->local_index[comm->rank];
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank || s->local_index[r] < 0) continue;
        ZCCL_CHECK(map_peer(comm, s, r, deadline));
        /* Probe whether this rank may read rank r's memory; r reads the answer before choosing single copy. */
        int32_t ok = CMA_NO;
        if (s->cma_enabled) {
            uint64_t got = 0;
            struct iovec l = {&got, sizeof got}, rv = {(void *)(uintptr_t)comm->peers[r].cma_probe, sizeof got};
            if (process_vm_readv(comm->peers[r].pid, &l, 1, &rv, 1, 0) == (ssize_t)sizeof got &&
                got == comm->peers[r].cma_probe_value)
                ok = CMA_YES;
            else
                ZCCL_INFO(ZCCL_LOG_SHM, "single-copy reads from rank %d unavailable (%s); using shared-memory slots",
                          r, strerror(errno));
        }
        __atomic_store_n(&chan(s, me, s->local_index[r])->cma_ok, ok, __ATOMIC_RELEASE);
    }
    if (s->cma_enabled)
        ZCCL_INFO(ZCCL_LOG_SHM, "shared memory: %d local ranks, %u slots x %zu bytes per channel; single copy "
                  "(process_vm_readv) for messages from %zu bytes", s->nlocal, s->nslots, s->slot_bytes, s->cma_threshold);
    else
        ZCCL_INFO(ZCCL_LOG_SHM, "shared memory: %d local ranks, %u slots x %zu bytes per channel; single copy disabled "
                  "(ZCCL_SHM_CMA=0)", s->nlocal, s->nslots, s->slot_bytes);
    return ZCCL_SUCCESS;
}

/* Called once every local peer has mapped this rank's inbox: the name is no longer needed, so a crash cannot leak
 * the segment. */
void zccl__shm_unlink_own(zccl_tp_comm_t *comm) {
    shm_comm_t *s = SHM_OF(comm);
    if (s && s->my_name[0] && !s->unlinked) {
        shm_unlink(s->my_name);
        s->unlinked = true;
    }
}

/* Segment size for nlocal ranks with the configured slots (the same computation as shm_setup's). */
static size_t segment_bytes(int nlocal) {
    int64_t slot = 128 << 10, nslots = 8;
    if (zccl__cfg_int(ZCCL_CFG_SHM_SLOT_BYTES, &slot) != ZCCL_SUCCESS) slot = 128 << 10;
    if (zccl__cfg_int(ZCCL_CFG_SHM_SLOTS, &nslots) != ZCCL_SUCCESS) nslots = 8;
    const size_t slot_bytes = align_up((size_t)slot, 4096);
    const size_t data_offset = align_up(sizeof(chan_ctl_t) + (size_t)nslots * sizeof(slot_meta_t), 4096);
    const size_t stride = data_offset + (size_t)nslots * slot_bytes;
    return align_up(sizeof(seg_hdr_t), 4096) + (size_t)nlocal * stride;
}

bool zccl__shm_room(const zccl_tp_comm_t *comm, size_t *need, size_t *avail) {
    const uint64_t host = comm->peers[comm->rank].host_hash;
    int nlocal = 0;
    uint64_t min_free = UINT64_MAX;
    for (int r = 0; r < comm->nranks; r++) {
        if (comm->peers[r].host_hash != host) continue;
        nlocal++;
        if (comm->peers[r].shm_free < min_free) min_free = comm->peers[r].shm_free;
    }
    /* Every rank of the host computes this from the same exchanged numbers, so all of them decide alike. */
    *need = (size_t)nlocal * segment_bytes(nlocal);
    *avail = (size_t)min_free;
    return min_free >= *need;
}

int zccl__shm_single_copy(zccl_tp_comm_t *comm, int on) {
    shm_comm_t *s = SHM_OF(comm);
    if (!s || !s->cma_auto || !s->cma_enabled) return -1;
    /* Called by the thread that runs this communicator's calls, between calls: no send reads the threshold then. */
    const int was = s->cma_threshold != SIZE_MAX;
    if (on >= 0) s->cma_threshold = on ? s->cma_threshold_cfg : SIZE_MAX;
    return was;
}

size_t zccl__shm_ring_bytes(const zccl_tp_comm_t *comm) {
    const shm_comm_t *s = SHM_OF((zccl_tp_comm_t *)comm);
    return s ? (size_t)s->nslots * s->slot_bytes : 0;
}

static bool shm_can_reach(const zccl_tp_comm_t *comm, int peer) {
    if (comm->peers[peer].host_hash != comm->peers[comm->rank].host_hash) return false;
    size_t need, avail;
    return zccl__shm_room(comm, &need, &avail);
}

static zccl_result_t shm_send(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    shm_comm_t *s = SHM_OF(comm);
    const int peer = x->peer;
    chan_ctl_t *c = chan(s, s->local_index[peer], s->local_index[comm->rank]);
    if (!x->started) {
        x->started = true;
        x->t[0] = (s->cma_enabled && x->bytes >= s->cma_threshold &&
                   __atomic_load_n(&c->cma_ok, __ATOMIC_ACQUIRE) == CMA_YES) ? SLOT_CMA : SLOT_INLINE;
        x->t[1] = 0; /* CMA: ack count that completes this send, once posted */
    }
    if (x->t[0] == SLOT_CMA) {
        if (x->t[1] == 0) {
            if (!slot_free(s, c, peer)) return ZCCL_SUCCESS;
            slot_meta_t *m = &metas(c)[s->send_head[peer] % s->nslots];
            m->kind = SLOT_CMA;
            m->len = (uint32_t)ZCCL_MIN(x->bytes, UINT32_MAX);
            m->addr = (uint64_t)(uintptr_t)x->src;
            x->t[1] = ++s->cma_posted[peer];
            slot_post(comm, s, c, peer, m);
            *progressed = true;
        }
        if (__atomic_load_n(&c->cma_acks, __ATOMIC_ACQUIRE) >= x->t[1]) {
            x->done = x->bytes;
            x->complete = true;
            *progressed = true;
        }
        return ZCCL_SUCCESS;
    }
    if (!slot_free(s, c, peer)) return ZCCL_SUCCESS; /* FIFO full: the receiver rings us when it frees a slot */
    const uint64_t idx = s->send_head[peer];
    slot_meta_t *m = &metas(c)[idx % s->nslots];
    size_t len = ZCCL_MIN(s->slot_bytes, x->bytes - x->done);
    zccl_kernel_copy(len <= TINY_BYTES ? m->tiny : slot_data(s, c, idx), x->src + x->done, len);
    m->kind = SLOT_INLINE;
    m->len = (uint32_t)len;
    slot_post(comm, s, c, peer, m);
    x->done += len;
    x->complete = (x->done == x->bytes);
    *progressed = true;
    return ZCCL_SUCCESS;
}

static zccl_result_t shm_recv(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    shm_comm_t *s = SHM_OF(comm);
    const int peer = x->peer;
    chan_ctl_t *c = chan(s, s->local_index[comm->rank], s->local_index[peer]);
    if (x->t[0] == SLOT_CMA) { /* pulling a single-copy message */
        /* A reduction pulls one cache-sized chunk into the bounce buffer and reduces it while it is hot; a plain
         * copy lands in place, so it pulls larger pieces to spend fewer system calls per byte. */
        const void *from = (const void *)(uintptr_t)(x->t[1] + x->done); /* in the sender's address space */
        /* The kernel copies with `rep movsb`, which on some CPUs runs 4-5x slower when the destination's page offset
         * is 1..63 bytes past the source's (kernels.h, zccl_kernel_copy_slow_at): there a plain copy too goes through
         * the bounce buffer, started 128 bytes in if its own start is at such a distance, and from there into place. */
        const bool via_tmp = x->op2 || zccl_kernel_copy_slow_at(x->dst + x->done, from);
        const size_t skew = !x->op2 && via_tmp && zccl_kernel_copy_slow_at(comm->chunk_tmp, from) ? 128 : 0;
        const size_t piece = via_tmp ? comm->chunk_bytes - skew : 8 * comm->chunk_bytes;
        size_t len = ZCCL_MIN(piece, x->bytes - x->done);
        uint8_t *to = via_tmp ? comm->chunk_tmp + skew : x->dst + x->done;
        struct iovec l = {to, len}, r = {(void *)from, len};
        ssize_t got = process_vm_readv(comm->peers[peer].pid, &l, 1, &r, 1, 0);
        if (got != (ssize_t)len) {
            if (got < 0 && errno == ESRCH)
                return zccl__error(ZCCL_REMOTE_ERROR, "rank %d (pid %d) exited during a transfer to rank %d", peer,
                                   comm->peers[peer].pid, comm->rank);
            if (got < 0 && errno == EFAULT) /* the sender gave the call up and its buffer went: its notice says why */
                return zccl__error(ZCCL_REMOTE_ERROR, "rank %d's buffer went away during a single-copy transfer to "
                                   "rank %d (rank %d gave the call up?)", peer, comm->rank, peer);
            return zccl__syserror(got < 0 ? errno : EIO, "process_vm_readv of %zu bytes from rank %d (pid %d)", len,
                                  peer, comm->peers[peer].pid);
        }
        zccl__xfer_deliver(x, to, len);
        if (x->done == x->bytes) {
            __atomic_fetch_add(&c->cma_acks, 1, __ATOMIC_RELEASE);
            zccl__doorbell_ring(comm, peer);
            x->complete = true;
        }
        *progressed = true;
        return ZCCL_SUCCESS;
    }
    const uint64_t idx = s->recv_tail[peer];
    const slot_meta_t *m = &metas(c)[idx % s->nslots];
    if (__atomic_load_n(&m->seq, __ATOMIC_ACQUIRE) != idx + 1) return ZCCL_SUCCESS; /* not posted yet */
    if (m->kind == SLOT_CMA) {
        if (x->done != 0 || m->len != ZCCL_MIN(x->bytes, UINT32_MAX))
            return zccl__error(ZCCL_INVALID_USAGE, "rank %d sent a %u-byte message where rank %d expected %zu: the "
                               "two ranks called collectives with different counts or datatypes", peer, m->len,
                               comm->rank, x->bytes - x->done);
        x->t[0] = SLOT_CMA;
        x->t[1] = m->addr;
        s->recv_tail[peer] = idx + 1;
        __atomic_store_n(&c->tail, idx + 1, __ATOMIC_RELEASE); /* the descriptor is copied: free its slot */
        *progressed = true;
        return shm_recv(comm, x, progressed);
    }
    if (m->kind != SLOT_INLINE || m->len > x->bytes - x->done)
        return zccl__error(ZCCL_INVALID_USAGE, "rank %d sent %u more bytes where rank %d expected %zu: the two "
                           "ranks called collectives with different counts or datatypes", peer, m->len, comm->rank,
                           x->bytes - x->done);
    zccl__xfer_deliver(x, m->len <= TINY_BYTES ? m->tiny : slot_data(s, c, idx), m->len);
    s->recv_tail[peer] = idx + 1;
    __atomic_store_n(&c->tail, idx + 1, __ATOMIC_RELEASE);
    /* Only a sender that found the FIFO full waits for this; it sleeps only after re-reading tail. */
    zccl__doorbell_ring(comm, peer);
    x->complete = (x->done == x->bytes);
    *progressed = true;
    return ZCCL_SUCCESS;
}

static zccl_result_t shm_progress(zccl_tp_comm_t *comm, zccl_xfer_t *x, bool *progressed) {
    return x->is_send ? shm_send(comm, x, progressed) : shm_recv(comm, x, progressed);
}

static int shm_wait_fd(zccl_tp_comm_t *comm, const zccl_xfer_t *x, short *events) { return -1; }

bool zccl__local_pid_exited(int pid) {
    bool dead = (kill(pid, 0) != 0 && errno == ESRCH);
    if (!dead) { /* a killed child that its parent has not reaped yet still answers kill(0): read its state */
        char path[64], buf[256];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            const char *rp = strrchr(buf, ')');
            if (rp && (rp[2] == 'Z' || rp[2] == 'X')) dead = true;
        }
    }
    return dead;
}

void *zccl__shm_reg_area(zccl_tp_comm_t *comm, int rank) {
    shm_comm_t *s = SHM_OF(comm);
    if (!s || !s->seg || s->local_index[rank] < 0 || !s->seg[s->local_index[rank]]) return NULL;
    return hdr_of(s, s->local_index[rank])->reg_area;
}

static zccl_result_t shm_check_peer(zccl_tp_comm_t *comm, int peer) {
    pid_t pid = comm->peers[peer].pid;
    if (zccl__local_pid_exited(pid))
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d (pid %d, same host) has exited; rank %d cannot complete the "
                           "collective", peer, (int)pid, comm->rank);
    const shm_comm_t *s = SHM_OF(comm);
    if (s && s->seg && s->local_index[peer] >= 0 && s->seg[s->local_index[peer]] &&
        __atomic_load_n(&((seg_hdr_t *)s->seg[s->local_index[peer]])->failed, __ATOMIC_ACQUIRE))
        return zccl__error(ZCCL_REMOTE_ERROR, "rank %d gave up on this communicator after an error of its own (a lost "
                           "peer or a timeout); rank %d cannot complete the collective", peer, comm->rank);
    return ZCCL_SUCCESS;
}

static void shm_poison(zccl_tp_comm_t *comm) {
    shm_comm_t *s = SHM_OF(comm);
    if (!s || !s->seg || !s->local_index || !s->seg[s->local_index[comm->rank]]) return;
    __atomic_store_n(&((seg_hdr_t *)s->seg[s->local_index[comm->rank]])->failed, 1, __ATOMIC_RELEASE);
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank && s->local_index[r] >= 0) zccl__doorbell_ring(comm, r);
}

/* Whether peer destroyed its communicator cleanly (zccl_comm_destroy after its last operation). */
static bool shm_departed(const zccl_tp_comm_t *comm, int peer) {
    const shm_comm_t *s = SHM_OF(comm);
    if (!s || !s->seg || s->local_index[peer] < 0 || !s->seg[s->local_index[peer]]) return false;
    return __atomic_load_n(&((seg_hdr_t *)s->seg[s->local_index[peer]])->departed, __ATOMIC_ACQUIRE) != 0;
}

static void shm_teardown(zccl_tp_comm_t *comm) {
    shm_comm_t *s = SHM_OF(comm);
    if (!s) return;
    if (s->seg && s->local_index && s->seg[s->local_index[comm->rank]] &&
        !__atomic_load_n(&comm->aborted, __ATOMIC_ACQUIRE) &&
        __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE) == ZCCL_SUCCESS)
        __atomic_store_n(&((seg_hdr_t *)s->seg[s->local_index[comm->rank]])->departed, 1, __ATOMIC_RELEASE);
    zccl__shm_unlink_own(comm);
    if (s->seg && s->local_index) {
        int me = s->local_index[comm->rank];
        for (int i = 0; i < s->nlocal; i++) {
            if (!s->seg[i]) continue;
            if (i == me) { /* the doorbell lives in our own segment: move it back to the communicator first */
                comm->doorbell = &comm->local_doorbell[0];
                comm->sleeping = &comm->local_doorbell[1];
            }
            munmap(s->seg[i], s->seg_bytes);
        }
    }
    free(s->seg);
    free(s->local_index);
    free(s->cma_posted);
    free(s->send_head);
    free(s->tail_seen);
    free(s->recv_tail);
    free(s);
    zccl__tp_set_state(comm, &zccl_transport_shm, NULL);
}

static zccl_result_t shm_why_unreachable(const zccl_tp_comm_t *comm, int peer, char *buf, size_t len) {
    size_t need, avail;
    if (comm->peers[peer].host_hash == comm->peers[comm->rank].host_hash && !zccl__shm_room(comm, &need, &avail)) {
        snprintf(buf, len, "/dev/shm has %zu bytes free but the ranks of this host need %zu; enlarge it (docker: "
                 "--shm-size), lower ZCCL_SHM_SLOTS / ZCCL_SHM_SLOT_BYTES, or allow TCP", avail, need);
        return ZCCL_SYSTEM_ERROR;
    }
    snprintf(buf, len, "another host");
    return ZCCL_INVALID_ARGUMENT;
}

const zccl_transport_ops_t zccl_transport_shm = {
    .name = "shm",
    .link = ZCCL_LINK_MEMORY,
    .why_unreachable = shm_why_unreachable,
    .comm_setup = shm_setup,
    .can_reach = shm_can_reach,
    .progress = shm_progress,
    .wait_fd = shm_wait_fd,
    .check_peer = shm_check_peer,
    .comm_teardown = shm_teardown,
    .departed = shm_departed,
    .poison = shm_poison,
};
