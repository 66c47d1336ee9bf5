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
 * and decide alike: if every rank's buffers are registered (and of one memory type), each rank maps the peers'
 * buffers it needs and says in its header whether that worked; if every rank did, the call runs here in one pass
 * over the data —
 *
 *   all-reduce      rank i reduces block i of every rank's send buffer, in rank order, through a bounce buffer
 *                   (cache-sized on the host), and writes the result into block i of every rank's receive buffer;
 *   reduce-scatter  rank i reduces block i of every rank's send buffer into its own receive buffer;
 *   all-gather      rank i copies every rank's send buffer into its own receive buffer;
 *   broadcast       every rank copies the root's send buffer into its own receive buffer;
 *
 * then an exit barrier (a rank may reuse its buffers when its call returns, so every peer must be done with
 * them). Otherwise the call takes the normal schedule.
 *
 * In place is safe in all four: the blocks a rank writes are ones no other rank reads in the same call.
 *
 * Device memory (docs/gpu.md "CUDA IPC"): zccl_comm_register of a device pointer finds the allocation holding it
 * (the memory table's ipc_range, cuMemGetAddressRange) and exports it once per allocation (ipc_export,
 * cuIpcGetMemHandle), a cache keyed by the allocation's base that every registration inside it shares; the handle
 * travels in the descriptor, and a peer opens it once per communicator (ipc_open, cuIpcOpenMemHandle) and closes it
 * when the communicator is destroyed. The one-pass loops below are the same for every memory type: they run the
 * call's memory table (copy, reduce) through a bounce buffer of that type, so on device memory the CUDA kernels
 * read the peers' buffers in place, with no host staging.
 *
 * The descriptors are read as a sequence lock: a rank that gives a call up for the normal schedule may finish it
 * and publish its next call's descriptor (a broadcast root's sends need nobody's reply) while a slower peer still
 * reads; the owner clears seq while it rewrites the fields, and a reader that sees any other number than the
 * call's before or after its read takes the normal schedule too (the owner, having moved on, did).
 */

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "kernels.h"
#include "mem.h"
#include "notice.h"
#include "regmem.h"

ZCCL_SETTING(zccl__set_shm_reg_min_bytes) = {
    .name = "ZCCL_SHM_REG_MIN_BYTES", .deflt = "32K",
    .help = "all-reduce / reduce-scatter / all-gather / broadcast of at least this many bytes (the whole vector) on "
            "one host look for buffers registered on every rank (zccl_comm_register; host or CUDA IPC) and then run "
            "straight from the peers' buffers; 0 disables the check",
    .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = INT64_MAX, .must_match = true};

typedef struct region {
    struct region *next;
    uint8_t *base;
    size_t bytes;  /* mapped bytes (whole pages) */
    uint64_t id;
} region_t;

/* A non-host allocation that registrations of this process lie in, exported once (the registration cache):
 * shared by every registration inside it, dropped with the last of them. Ids share the regions' number space. */
typedef struct dalloc {
    struct dalloc *next;
    zccl_mem_type_t type;
    uint8_t *base;
    size_t bytes;
    uint64_t id;
    bool shareable; /* the export worked */
    bool stale;     /* the memory was freed (and its address reused) since the export: never published again */
    uint64_t buf_id; /* the CUDA allocation's buffer id at the export (zccl__mem_buffer_id); 0 unknown */
    zccl_mem_ipc_handle_t handle;
    int refs;
} dalloc_t;

typedef struct reg {
    struct reg *next;
    struct zccl_comm *comm;
    const uint8_t *buf;
    size_t bytes;
    dalloc_t *da;   /* non-host memory: its allocation */
    int busy;       /* collectives running now that published it (mu) */
    bool published; /* a descriptor named its region or allocation: the peers may have mapped it */
} reg_t;

typedef struct pmap {
    struct pmap *next;
    struct zccl_comm *comm;
    int peer;
    uint64_t id;
    zccl_mem_type_t type;
    bool opened; /* host: munmap at the end; other types: ipc_close (false: this process's own allocation) */
    uint8_t *base;
    size_t bytes;
} pmap_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* Links a new record at the head of one of the lists below (each record's first member is its next pointer). */
#define LINK(head, node)                                                                                      \
    do {                                                                                                      \
        pthread_mutex_lock(&mu);                                                                              \
        (node)->next = (head);                                                                                \
        (head) = (node);                                                                                      \
        pthread_mutex_unlock(&mu);                                                                            \
    } while (0)
static region_t *regions;
static dalloc_t *dallocs;
static reg_t *regs;
static pmap_t *pmaps;
static uint64_t next_id = 1;

static void region_name(char *buf, size_t len, uint64_t id, int pid) {
    snprintf(buf, len, "/zccl-mem-%llu-p%d", (unsigned long long)id, pid);
}

zccl_result_t zccl__mem_alloc(void **ptr, size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sz = (bytes + page - 1) / page * page;
    region_t *r = calloc(1, sizeof *r);
    if (!r) return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_mem_alloc: out of memory for the region record");
    /* A process that died without freeing its regions leaves their names in /dev/shm; one that later gets the same
     * pid finds its first names taken (EEXIST). Those names are another process's (dead here, or alive in another
     * pid namespace sharing /dev/shm): never removed, skipped. */
    char name[64];
    uint64_t id = 0;
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 1024; tries++) {
        pthread_mutex_lock(&mu);
        id = next_id++;
        pthread_mutex_unlock(&mu);
        region_name(name, sizeof name, id, (int)getpid());
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        free(r);
        return zccl__syserror(errno, "zccl_mem_alloc: shm_open(%s) for %zu bytes%s", name, bytes,
                              errno == EEXIST ? " (1024 names of this pid are taken: stale zccl-mem-* files of dead "
                                                "processes in /dev/shm?)" : "");
    }
    if (ftruncate(fd, (off_t)sz) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        free(r);
        return zccl__syserror(e, "zccl_mem_alloc: sizing %s to %zu bytes (is /dev/shm large enough?)", name, sz);
    }
    /* tmpfs accepts any size at ftruncate and raises SIGBUS at the first page it has no room for: reserve the pages
     * now, so a /dev/shm too small for the block is an error here (callers fall back to ordinary memory). */
    int fe;
    do { /* a signal during the reservation (it zeroes every page) interrupts it: start again */
        fe = posix_fallocate(fd, 0, (off_t)sz);
    } while (fe == EINTR);
    if (fe != 0 && fe != EOPNOTSUPP && fe != EINVAL) {
        close(fd);
        shm_unlink(name);
        free(r);
        return zccl__syserror(fe, "zccl_mem_alloc: reserving %zu bytes of %s (is /dev/shm large enough?)", sz, name);
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
    LINK(regions, r);
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

/* The cache entry of the allocation holding buf when buf is memory a table can share (CUDA IPC), taking a
 * reference; NULL for host memory. An allocation that cannot be shared gets an entry too (shareable false), so
 * the registration is kept and simply never enables the direct path, as malloc'd host memory. */
static zccl_result_t dalloc_get(struct zccl_comm *comm, const void *buf, dalloc_t **out) {
    *out = NULL;
    zccl_mem_type_t t = ZCCL_MEM_HOST;
    int dev = -1;
    ZCCL_CHECK(zccl__mem_query(buf, &t, &dev));
    if (t == ZCCL_MEM_HOST) return ZCCL_SUCCESS;
    const zccl_mem_ops_t *m = zccl__mem_ops(t);
    void *base = NULL;
    size_t bytes = 0;
    bool shareable = false;
    char prev[1024]; /* a successful registration leaves the last error as it found it */
    snprintf(prev, sizeof prev, "%s", zccl__last_error());
    zccl_mem_ipc_handle_t h;
    memset(&h, 0, sizeof h);
    uint64_t buf_id = 0;
    if (t == ZCCL_MEM_CUDA && zccl__mem_buffer_id(buf, "device buffer", &buf_id) != ZCCL_SUCCESS) buf_id = 0;
    if (m->ipc_range && m->ipc_range(buf, &base, &bytes) == ZCCL_SUCCESS) {
        pthread_mutex_lock(&mu);
        for (dalloc_t *a = dallocs; a; a = a->next)
            if (a->type == t && a->base == base && a->bytes == bytes && !a->stale && a->buf_id == buf_id) {
                a->refs++;
                *out = a;
                break;
            }
        pthread_mutex_unlock(&mu);
        if (*out) return ZCCL_SUCCESS;
        shareable = m->ipc_export(base, &h) == ZCCL_SUCCESS;
    } else {
        base = (void *)buf;
    }
    if (!shareable) {
        ZCCL_INFO(ZCCL_LOG_COLL, "rank %d: zccl_comm_register(%p): %s memory that cannot be shared with the other "
                  "processes (%s); collectives on it take the staged path", comm->rank, buf, m->name,
                  zccl__last_error());
        zccl__set_last_error(prev);
    }
    dalloc_t *a = calloc(1, sizeof *a);
    if (!a) return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_comm_register: out of memory for the allocation record");
    *a = (dalloc_t){.type = t, .base = base, .bytes = bytes, .shareable = shareable, .buf_id = buf_id, .handle = h,
                    .refs = 1};
    zccl__set_last_error(prev);
    pthread_mutex_lock(&mu);
    a->id = next_id++;
    a->next = dallocs;
    dallocs = a;
    pthread_mutex_unlock(&mu);
    *out = a;
    return ZCCL_SUCCESS;
}

/* Drops a reference to a cache entry. The exporter has nothing to release (CUDA IPC exports are not counted);
 * peers close their mappings when their communicator is destroyed. Caller holds mu. */
static void dalloc_put(dalloc_t *a) {
    if (!a || --a->refs > 0) return;
    for (dalloc_t **pp = &dallocs; *pp; pp = &(*pp)->next)
        if (*pp == a) { *pp = a->next; break; }
    free(a);
}

zccl_result_t zccl__comm_register(struct zccl_comm *comm, void *buf, size_t bytes, void **handle) {
    reg_t *g = calloc(1, sizeof *g);
    if (!g) return zccl__error(ZCCL_SYSTEM_ERROR, "zccl_comm_register: out of memory for the registration record");
    g->comm = comm;
    g->buf = buf;
    g->bytes = bytes;
    const zccl_result_t res = dalloc_get(comm, buf, &g->da);
    if (res != ZCCL_SUCCESS) {
        free(g);
        return res;
    }
    LINK(regs, g);
    *handle = g;
    return ZCCL_SUCCESS;
}

/* Whether [a, a+an) and [b, b+bn) overlap. */
static bool overlaps(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) { return a < b + bn && b < a + an; }

/* The ids of this process's regions and allocations that [buf, buf+bytes) touches, at most `cap`. Caller holds mu. */
static size_t ids_touched(const uint8_t *buf, size_t bytes, uint64_t *ids, size_t cap) {
    size_t n = 0;
    for (const region_t *r = regions; r && n < cap; r = r->next)
        if (overlaps(buf, bytes, r->base, r->bytes)) ids[n++] = r->id;
    for (const dalloc_t *a = dallocs; a && n < cap; a = a->next)
        if (a->shareable && overlaps(buf, bytes, a->base, a->bytes)) ids[n++] = a->id;
    return n;
}

/*
 * Deregistration tells the peers. A peer that ran a direct-path call on this registration keeps the region or
 * allocation mapped (per communicator, to map it once), so freeing the memory afterwards would leave it mapped there
 * (host: pages that never return to the system; CUDA: an allocation another process still has open, which CUDA leaves
 * undefined). So once the registration is gone here (no later call can publish it), every peer is told, over the
 * connection service with an acknowledgement (notice.c, ZCCL_NOTICE_DEREG), to close its mapping of each region or
 * allocation the range touches; the acknowledgement comes after the close, so the memory may be freed when this call
 * returns. A peer maps only during a call that this rank's descriptor takes part in, so none can be mapping it now:
 * a registration that a collective running on another thread or stream publishes is refused instead.
 */
zccl_result_t zccl__comm_deregister(struct zccl_comm *comm, void *handle) {
    pthread_mutex_lock(&mu);
    reg_t **pp = &regs;
    while (*pp && (*pp != handle || (*pp)->comm != comm)) pp = &(*pp)->next;
    reg_t *g = *pp;
    const bool busy = g && g->busy;
    uint64_t ids[8];
    size_t nids = 0;
    if (g && !busy) {
        *pp = g->next;
        if (g->published) nids = ids_touched(g->buf, g->bytes, ids, 8);
        dalloc_put(g->da);
    }
    pthread_mutex_unlock(&mu);
    if (!g)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "zccl_comm_deregister: argument 'handle' = %p is not a registration "
                           "of this communicator (rank %d) or was deregistered already", handle, comm->rank);
    if (busy)
        return zccl__error(ZCCL_INVALID_USAGE, "zccl_comm_deregister: rank %d: the registration %p is in use by a "
                           "collective running now on this communicator (on a stream or another thread); deregister "
                           "it once that call has completed (zccl_stream_synchronize)", comm->rank, handle);
    free(g);
    int missed = 0;
    for (size_t i = 0; i < nids; i++) missed += zccl__notice_send(comm, ZCCL_NOTICE_DEREG, ids[i], "", -1);
    if (missed)
        return zccl__error(ZCCL_REMOTE_ERROR, "zccl_comm_deregister: rank %d: %d peer(s) could not be told to close "
                           "their mapping of the deregistered buffer (the registration is gone; free the memory only "
                           "after destroying the communicator)", comm->rank, missed);
    return ZCCL_SUCCESS;
}

/* A peer's mapping of one region or allocation, closed. Caller holds mu. */
static void pmap_close(pmap_t *m) {
    if (m->type == ZCCL_MEM_HOST) munmap(m->base, m->bytes);
    else if (m->opened) zccl__mem_ops(m->type)->ipc_close(m->base);
    free(m);
}

/* peer -1: every mapping of comm (its destruction). */
void zccl__reg_peer_dropped(struct zccl_comm *comm, int peer, uint64_t id) {
    pthread_mutex_lock(&mu);
    for (pmap_t **pp = &pmaps; *pp;) {
        pmap_t *m = *pp;
        if (m->comm != comm || (peer >= 0 && (m->peer != peer || m->id != id))) { pp = &m->next; continue; }
        *pp = m->next;
        pmap_close(m);
    }
    pthread_mutex_unlock(&mu);
}

static uint64_t direct_calls[ZCCL_MEM_TYPES]; /* calls this process ran on the direct path, per memory type */

void zccl__stg_free(struct zccl_comm *comm);

void zccl__reg_comm_gone(struct zccl_comm *comm) {
    zccl__stg_free(comm);
    const uint64_t dh = __atomic_load_n(&direct_calls[ZCCL_MEM_HOST], __ATOMIC_RELAXED),
                   dd = __atomic_load_n(&direct_calls[ZCCL_MEM_CUDA], __ATOMIC_RELAXED);
    if (dh || dd) /* tools/gpu-check reads this line: the device calls took CUDA IPC */
        ZCCL_INFO(ZCCL_LOG_COLL, "rank %d: direct path (one pass over the peers' registered buffers): %llu calls on "
                  "host memory, %llu on device memory over CUDA IPC in this process", comm->rank,
                  (unsigned long long)dh, (unsigned long long)dd);
    pthread_mutex_lock(&mu);
    for (reg_t **pp = &regs; *pp;) {
        reg_t *g = *pp;
        if (g->comm == comm) { *pp = g->next; dalloc_put(g->da); free(g); } else pp = &g->next;
    }
    pthread_mutex_unlock(&mu);
    zccl__reg_peer_dropped(comm, -1, 0);
}

/* Region id and offset of [p, p+bytes) of memory type t when comm registered a range holding it and it lies in one
 * zccl_mem_alloc region (host) or one shareable allocation (other types; *h gets its handle, *used the registration);
 * id 0 otherwise. Caller holds mu. */
static uint64_t locate(struct zccl_comm *comm, zccl_mem_type_t t, const void *p, size_t bytes, uint64_t *off,
                       zccl_mem_ipc_handle_t *h, reg_t **used) {
    const uint8_t *b = p;
    reg_t *reg = NULL;
    if (!p) return 0;
    for (reg_t *g = regs; g && !reg; g = g->next)
        if (g->comm == comm && b >= g->buf && bytes <= g->bytes && (size_t)(b - g->buf) <= g->bytes - bytes) reg = g;
    if (!reg) return 0;
    if (t != ZCCL_MEM_HOST) {
        for (dalloc_t *a = dallocs; a; a = a->next)
            if (a->type == t && a->shareable && !a->stale && b >= a->base && bytes <= a->bytes &&
                (size_t)(b - a->base) <= a->bytes - bytes) {
                /* The allocation exported may have been freed and its address handed out again: the handle would
                 * give the peers the old memory. Its buffer id says (one driver query per buffer and call). */
                uint64_t now = 0;
                if (a->buf_id && (zccl__mem_buffer_id(p, "device buffer", &now) != ZCCL_SUCCESS || now != a->buf_id)) {
                    a->stale = true;
                    ZCCL_INFO(ZCCL_LOG_COLL, "rank %d: device buffer %p was freed and reallocated since it was "
                              "registered (CUDA buffer id %llu then, %llu now): its registration is not used; register "
                              "the new allocation again (zccl_comm_deregister, zccl_comm_register)", comm->rank, p,
                              (unsigned long long)a->buf_id, (unsigned long long)now);
                    return 0;
                }
                *off = (uint64_t)(b - a->base);
                *h = a->handle;
                *used = reg;
                return a->id;
            }
        return 0;
    }
    for (const region_t *r = regions; r; r = r->next)
        if (b >= r->base && bytes <= r->bytes && (size_t)(b - r->base) <= r->bytes - bytes) {
            *off = (uint64_t)(b - r->base);
            *used = reg;
            return r->id;
        }
    return 0;
}

bool zccl__reg_held_device(struct zccl_comm *comm, const void *p, char *what, size_t len) {
    const uint8_t *b = p;
    bool held = false;
    pthread_mutex_lock(&mu);
    for (const reg_t *g = regs; g && !held; g = g->next)
        if (g->comm == comm && g->da && g->da->type != ZCCL_MEM_HOST && b >= g->buf && b < g->buf + g->bytes) {
            held = true;
            snprintf(what, len, "registered with zccl_comm_register as %s device memory [%p, +%zu bytes) (handle %p)",
                     zccl__mem_ops(g->da->type)->name, (const void *)g->buf, g->bytes, (const void *)g);
        }
    pthread_mutex_unlock(&mu);
    return held;
}

/* A peer's shareable allocation `id` of memory type t (handle h), opened once per communicator: the peer's own
 * pointer when it is this process (ranks as threads; CUDA refuses to open a process's own handle). Caller holds mu. */
static zccl_result_t peer_alloc(struct zccl_comm *comm, int peer, zccl_mem_type_t t, uint64_t id,
                                const zccl_mem_ipc_handle_t *h, pmap_t **out) {
    void *base = NULL;
    size_t bytes = 0;
    bool opened = false;
    if (comm->tc.peers[peer].pid == (int32_t)getpid()) {
        const dalloc_t *a = dallocs;
        while (a && a->id != id) a = a->next;
        if (!a)
            return zccl__error(ZCCL_INTERNAL_ERROR, "rank %d: rank %d (this process) described allocation #%llu, "
                               "which is not registered", comm->rank, peer, (unsigned long long)id);
        base = a->base;
        bytes = a->bytes;
    } else {
        const zccl_result_t res = zccl__mem_ops(t)->ipc_open(h, &base, &bytes);
        if (res != ZCCL_SUCCESS)
            return zccl__error(res, "rank %d: opening rank %d's registered %s buffer: %s", comm->rank, peer,
                               zccl__mem_ops(t)->name, zccl__last_error());
        opened = true;
    }
    pmap_t *m = calloc(1, sizeof *m);
    if (!m) {
        if (opened) zccl__mem_ops(t)->ipc_close(base);
        return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: out of memory for a peer mapping", comm->rank);
    }
    *m = (pmap_t){.next = pmaps, .comm = comm, .peer = peer, .id = id, .type = t, .opened = opened, .base = base,
                  .bytes = bytes};
    pmaps = m;
    *out = m;
    return ZCCL_SUCCESS;
}

/* The peer's region or allocation `id`, mapped once per communicator. Caller holds mu. */
static zccl_result_t peer_region(struct zccl_comm *comm, int peer, zccl_mem_type_t t, uint64_t id,
                                 const zccl_mem_ipc_handle_t *h, uint64_t off, size_t bytes, uint8_t **out) {
    pmap_t *m = pmaps;
    while (m && !(m->comm == comm && m->peer == peer && m->id == id)) m = m->next;
    if (!m && t != ZCCL_MEM_HOST) ZCCL_CHECK(peer_alloc(comm, peer, t, id, h, &m));
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
        *m = (pmap_t){.next = pmaps, .comm = comm, .peer = peer, .id = id, .type = ZCCL_MEM_HOST, .opened = true,
                      .base = p, .bytes = (size_t)st.st_size};
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
    _Alignas(64) uint64_t seq; /* the call these fields describe; 0 while they are rewritten, stored last (release) */
    uint64_t send_id, send_off, recv_id, recv_off;
    uint32_t mem;              /* the call's memory type on this rank (zccl_mem_type_t) */
    _Alignas(64) uint64_t done; /* the last call whose direct path this rank finished */
    uint64_t ready;             /* 2 * seq + 1 once this rank mapped every peer buffer of call seq, 2 * seq if not */
    zccl_call_desc_t call;      /* the call, for the mismatch check (with seq's fields) */
    _Alignas(64) zccl_mem_ipc_handle_t send_h, recv_h; /* non-host memory: the allocations' handles */
} desc_t;
_Static_assert(sizeof(desc_t) <= ZCCL_SHM_REG_AREA_BYTES, "descriptor must fit the shm header's area");

/* Where rank r's words live: its descriptor area in the shm segment header, or the header of its staging region
 * (the staged path below). */
typedef const uint8_t *(*area_fn)(struct zccl_comm *comm, int r);
static const uint8_t *reg_area(struct zccl_comm *comm, int r) { return zccl__shm_reg_area(&comm->tc, r); }

/* Whether every rank's word at `field` of its area has reached `want`. */
static bool all_reached_in(struct zccl_comm *comm, area_fn area, size_t field, uint64_t want) {
    for (int r = 0; r < comm->nranks; r++)
        if (__atomic_load_n((const uint64_t *)(area(comm, r) + field), __ATOMIC_ACQUIRE) < want) return false;
    return true;
}

static bool reached_in(struct zccl_comm *comm, area_fn area, int r, size_t field, uint64_t want) {
    return __atomic_load_n((const uint64_t *)(area(comm, r) + field), __ATOMIC_ACQUIRE) >= want;
}

/* Waits until every local peer's word at `field` of its area reaches `want`; sleeps on the doorbell as the engine
 * does, and every 50 ms checks that the peers it still waits for are alive, and the ZCCL_TIMEOUT_MS deadline. */
static zccl_result_t wait_all_in(struct zccl_comm *comm, area_fn area, size_t field, uint64_t want,
                                 const char *what) {
#define all_reached(c, f, w) all_reached_in(c, area, f, w)
#define reached(c, r, f, w) reached_in(c, area, r, f, w)
    uint64_t idle_since = zccl__now_ns(), last_check = idle_since;
    for (unsigned spin = 0;; spin++) {
        if (all_reached(comm, field, want)) return ZCCL_SUCCESS;
        if ((spin & 63) != 0 || zccl__now_ns() - idle_since < comm->spin_ns) {
            __builtin_ia32_pause();
            continue;
        }
        const uint32_t seen = zccl__doorbell_announce(&comm->tc);
        if (!all_reached(comm, field, want)) zccl__doorbell_wait(&comm->tc, seen, 50);
        zccl__doorbell_awake(&comm->tc);
        if (__atomic_load_n(&comm->tc.aborted, __ATOMIC_ACQUIRE))
            return zccl__error(ZCCL_REMOTE_ERROR, "rank %d: communicator aborted during collective #%llu", comm->rank,
                               zccl__seq_shown(comm, comm->seq));
        /* Look again before judging the peers: one that set its word, woke us and then left (its call done, its
         * communicator destroyed) is not lost. */
        if (all_reached(comm, field, want)) return ZCCL_SUCCESS;
        /* A peer that refused this call or gave it up never sets its word: its notice says so. */
        ZCCL_CHECK(zccl__notice_check(comm, comm->cseq, comm->op_name));
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
                               zccl__seq_shown(comm, comm->seq));
    }
#undef all_reached
#undef reached
}

static zccl_result_t wait_all(struct zccl_comm *comm, size_t field, uint64_t want, const char *what) {
    return wait_all_in(comm, reg_area, field, want, what);
}

static void ring_all(struct zccl_comm *comm) {
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank) zccl__doorbell_ring(&comm->tc, r);
}

/* Reduces, in rank order, `count` elements at element src_off of every rank's src[r] into element dst_off of every
 * dst[d] (ndst of them), through the bounce buffer tmp of `step` elements, so a destination may alias a source. The
 * call's memory table m does the work: CPU kernels on host memory, CUDA kernels reading the peers' device memory. */
static zccl_result_t reduce_blocks(struct zccl_comm *comm, const zccl_mem_ops_t *m, uint8_t *tmp, size_t step,
                                   uint8_t *const *src, size_t src_off, uint8_t *const *dst, int ndst, size_t dst_off,
                                   size_t count, zccl_datatype_t dt, zccl_redop_t op) {
    const int n = comm->nranks;
    const size_t es = zccl_type_size(dt);
    const zccl_redop_t kop = op == ZCCL_AVG ? ZCCL_SUM : op;
    for (size_t k = 0; k < count; k += step) {
        const size_t c = ZCCL_MIN(step, count - k), at = (src_off + k) * es, to = (dst_off + k) * es;
        for (int r = 1; r < n; r++)
            ZCCL_CHECK(m->reduce(tmp, r == 1 ? src[0] + at : tmp, src[r] + at, c, dt, kop,
                                 (r == n - 1 && op == ZCCL_AVG) ? (uint32_t)n : 1));
        for (int d = 0; d < ndst; d++) ZCCL_CHECK(m->copy(dst[d] + to, tmp, c * es));
    }
    return ZCCL_SUCCESS;
}

/* What one rank's descriptor said about the call, read consistently (see the file comment). */
typedef struct {
    uint64_t send_id, send_off, recv_id, recv_off;
    uint32_t mem;
    zccl_call_desc_t call;
    zccl_mem_ipc_handle_t send_h, recv_h;
} snap_t;

/* ZCCL_INVALID_USAGE naming both calls when rank r's call `theirs` differs from this rank's (comm->desc_mine). */
static zccl_result_t call_mismatch(struct zccl_comm *comm, int r, const zccl_call_desc_t *theirs) {
    const zccl_call_desc_t *mine = &comm->desc_mine;
    if (r == comm->rank || memcmp(theirs, mine, sizeof *mine) == 0) return ZCCL_SUCCESS;
    char dm[160], dt[160];
    zccl__desc_describe(mine, comm->cseq_init, dm, sizeof dm);
    zccl__desc_describe(theirs, comm->cseq_init, dt, sizeof dt);
    return zccl__error(ZCCL_INVALID_USAGE, "ranks called different collectives: rank %d called %s, rank %d called %s; "
                       "every rank must make the same calls in the same order with the same count, datatype, op and "
                       "root", comm->rank, dm, r, dt);
}

/* Rank r's descriptor of call seq into *out; false when r has moved past it (it took the normal schedule). */
static bool read_desc(struct zccl_comm *comm, int r, uint64_t seq, snap_t *out) {
    const desc_t *d = zccl__shm_reg_area(&comm->tc, r);
    if (__atomic_load_n(&d->seq, __ATOMIC_ACQUIRE) != seq) return false;
    *out = (snap_t){.send_id = d->send_id, .send_off = d->send_off, .recv_id = d->recv_id, .recv_off = d->recv_off,
                    .mem = d->mem, .call = d->call, .send_h = d->send_h, .recv_h = d->recv_h};
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&d->seq, __ATOMIC_RELAXED) == seq;
}

uint64_t zccl__reg_direct_calls(int mem_type) {
    return (unsigned)mem_type < ZCCL_MEM_TYPES ? __atomic_load_n(&direct_calls[mem_type], __ATOMIC_RELAXED) : 0;
}

/* Elements per step of the one-pass reductions through the bounce buffer. */
static size_t direct_step(const zccl_mem_ops_t *m, size_t es) {
    const size_t step = m->direct_step_bytes / es;
    return step ? step : 1;
}

/* Runs the one-pass algorithm of o on the buffers srcv/dstv (every rank's, already mapped here). */
static zccl_result_t run_direct(struct zccl_comm *comm, const zccl_op_t *o, uint8_t *const *srcv,
                                uint8_t *const *dstv, void *tmp) {
    const int n = comm->nranks, i = comm->rank;
    const size_t es = zccl_type_size(o->dt);
    const zccl_mem_ops_t *m = zccl__mem_ops(o->mem);
    if (o->coll == ZCCL_COLL_ALLGATHER) {
        for (int r = 0; r < n; r++) {
            uint8_t *to = (uint8_t *)o->recvbuf + (size_t)r * o->count * es;
            if (to != srcv[r]) ZCCL_CHECK(m->copy(to, srcv[r], o->count * es));
        }
        return ZCCL_SUCCESS;
    }
    if (o->coll == ZCCL_COLL_BROADCAST) {
        if (o->recvbuf != srcv[o->root]) ZCCL_CHECK(m->copy(o->recvbuf, srcv[o->root], o->count * es));
        return ZCCL_SUCCESS;
    }
    const size_t step = direct_step(m, es);
    if (o->coll == ZCCL_COLL_ALLREDUCE) {
        const size_t per = (o->count + (size_t)n - 1) / (size_t)n;
        const size_t off = ZCCL_MIN((size_t)i * per, o->count), len = ZCCL_MIN(per, o->count - off);
        return reduce_blocks(comm, m, tmp, step, srcv, off, dstv, n, off, len, o->dt, o->op);
    }
    uint8_t *mine = o->recvbuf; /* reduce-scatter */
    return reduce_blocks(comm, m, tmp, step, srcv, (size_t)i * o->count, &mine, 1, 0, o->count, o->dt, o->op);
}

static zccl_result_t reg_try_run(struct zccl_comm *comm, const zccl_op_t *o, bool *done, bool *started,
                                 reg_t **used);

/* The registrations a call publishes are busy until it returns: zccl_comm_deregister refuses them meanwhile. */
zccl_result_t zccl__reg_try_run(struct zccl_comm *comm, const zccl_op_t *o, bool *done, bool *started) {
    reg_t *used[2] = {NULL, NULL};
    const zccl_result_t res = reg_try_run(comm, o, done, started, used);
    if (used[0] || used[1]) {
        pthread_mutex_lock(&mu);
        for (int k = 0; k < 2; k++)
            if (used[k]) used[k]->busy--;
        pthread_mutex_unlock(&mu);
    }
    return res;
}

static zccl_result_t reg_try_run(struct zccl_comm *comm, const zccl_op_t *o, bool *done, bool *started,
                                 reg_t **used) {
    *done = *started = false;
    const int n = comm->nranks;
    if (n < 2 || o->vcounts || o->barrier || o->count == 0) return ZCCL_SUCCESS;
    const bool bcast = o->coll == ZCCL_COLL_BROADCAST;
    if (o->coll != ZCCL_COLL_ALLREDUCE && o->coll != ZCCL_COLL_REDUCE_SCATTER && o->coll != ZCCL_COLL_ALLGATHER &&
        !bcast)
        return ZCCL_SUCCESS;
    if ((unsigned)o->mem >= ZCCL_MEM_TYPES) return ZCCL_SUCCESS;
    const int64_t min_bytes = comm->reg_min_bytes; /* read at init (lib/api/comm_init.c) */
    const size_t es = zccl_type_size(o->dt);
    const size_t mult = o->coll == ZCCL_COLL_REDUCE_SCATTER || o->coll == ZCCL_COLL_ALLGATHER ? (size_t)n : 1;
    const size_t total = o->count * es * mult; /* the whole vector, the same on every rank */
    if (min_bytes == 0 || total < (size_t)min_bytes) return ZCCL_SUCCESS;
    for (int r = 0; r < n; r++) /* the same on every rank: the transport table agrees */
        if (!zccl__shm_reg_area(&comm->tc, r)) return ZCCL_SUCCESS;

    /* Which buffers the peers need: every rank's send buffer (the root's for broadcast); every rank's receive
     * buffer for all-reduce (peers write their blocks into it); a broadcast's receive buffers stay local, but each
     * rank must have registered its own so that unregistered programs decide without waiting (below). */
    const bool need_send = !bcast || o->root == comm->rank;
    const bool need_recv = o->coll == ZCCL_COLL_ALLREDUCE || bcast;
    const size_t sbytes = o->coll == ZCCL_COLL_ALLGATHER || bcast ? o->count * es : total;
    const size_t rbytes = o->coll == ZCCL_COLL_REDUCE_SCATTER ? o->count * es : total;
    const zccl_mem_ops_t *mops = zccl__mem_ops(o->mem);
    desc_t *me = zccl__shm_reg_area(&comm->tc, comm->rank);
    zccl_mem_ipc_handle_t sh, rh;
    memset(&sh, 0, sizeof sh);
    memset(&rh, 0, sizeof rh);
    pthread_mutex_lock(&mu);
    uint64_t soff = 0, roff = 0;
    uint64_t sid = need_send ? locate(comm, o->mem, o->sendbuf, sbytes, &soff, &sh, &used[0]) : 0;
    uint64_t rid = need_recv ? locate(comm, o->mem, o->recvbuf, rbytes, &roff, &rh, &used[1]) : 0;
    for (int k = 0; k < 2; k++)
        if (used[k]) {
            used[k]->busy++;
            used[k]->published = true;
        }
    pthread_mutex_unlock(&mu);
    /* A rank whose own buffers are not registered knows the answer already (every rank will read its descriptor and
     * fall back): it does not wait for the others' descriptors, so unregistered programs pay one cache-line write. */
    const bool mine_ok = (!need_send || sid != 0) && (!need_recv || rid != 0);
    /* Peers read this rank's buffers as soon as they see its descriptor: the work the caller queued on the device
     * that writes them must be done first (CUDA: the call's cuCtxSynchronize, run here instead of in the engine). */
    zccl_result_t begin = ZCCL_SUCCESS;
    if (mine_ok && mops->call_begin && (begin = mops->call_begin()) != ZCCL_SUCCESS) sid = rid = 0;
    __atomic_store_n(&me->seq, 0, __ATOMIC_RELAXED); /* rewriting (read_desc) */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    me->send_id = sid;
    me->send_off = soff;
    me->recv_id = rid;
    me->recv_off = roff;
    me->mem = (uint32_t)o->mem;
    me->call = comm->desc_mine;
    if (o->mem != ZCCL_MEM_HOST) {
        me->send_h = sh;
        me->recv_h = rh;
    }
    __atomic_store_n(&me->seq, comm->seq, __ATOMIC_RELEASE);
    *started = true;
    ring_all(comm);
    if (begin != ZCCL_SUCCESS) return begin; /* the peers fall back and meet this rank's failure there */
    if (!mine_ok) return ZCCL_SUCCESS;
    ZCCL_CHECK(wait_all(comm, offsetof(desc_t, seq), comm->seq, "buffer descriptors"));

    /* The decision, from descriptors every rank reads alike. */
    snap_t one[8], *snaps = n <= 8 ? one : malloc((size_t)n * sizeof *snaps);
    uint8_t *src[64], *dst[64], **srcv = n <= 64 ? src : malloc((size_t)n * sizeof *srcv);
    uint8_t **dstv = n <= 64 ? dst : malloc((size_t)n * sizeof *dstv);
    zccl_result_t res = ZCCL_SUCCESS;
    bool direct = true;
    void *tmp = NULL; /* the bounce buffer of the reductions */
    if (!snaps || !srcv || !dstv) {
        res = zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: out of memory for %d buffer descriptors", comm->rank, n);
        direct = false;
    }
    /* Calls that differ (a broadcast's root, above all: each rank would read another root's buffer) fail on every
     * rank that reads the descriptors, naming both; the others meet it in the schedule's descriptors. */
    for (int r = 0; r < n && direct; r++) {
        snap_t *d = &snaps[r];
        direct = read_desc(comm, r, comm->seq, d);
        if (direct && (res = call_mismatch(comm, r, &d->call)) != ZCCL_SUCCESS) direct = false;
        direct = direct && d->mem == (uint32_t)o->mem && ((bcast && r != o->root) || d->send_id != 0) &&
                 (!need_recv || d->recv_id != 0);
    }
    if (direct) {
        zccl_result_t mres = ZCCL_SUCCESS;
        pthread_mutex_lock(&mu);
        for (int r = 0; r < n && mres == ZCCL_SUCCESS; r++) {
            const snap_t *d = &snaps[r];
            srcv[r] = dstv[r] = NULL;
            if (r == comm->rank) {
                srcv[r] = (uint8_t *)o->sendbuf;
                dstv[r] = o->recvbuf;
                continue;
            }
            if (!bcast || r == o->root)
                mres = peer_region(comm, r, o->mem, d->send_id, &d->send_h, d->send_off, sbytes, &srcv[r]);
            if (mres == ZCCL_SUCCESS && need_recv && !bcast)
                mres = peer_region(comm, r, o->mem, d->recv_id, &d->recv_h, d->recv_off, rbytes, &dstv[r]);
        }
        pthread_mutex_unlock(&mu);
        if (mres == ZCCL_SUCCESS && (o->coll == ZCCL_COLL_ALLREDUCE || o->coll == ZCCL_COLL_REDUCE_SCATTER))
            mres = zccl__mem_stage_direct(&comm->mem_stage, o->mem, direct_step(mops, es) * es, &tmp);
        /* Mapping (and the bounce buffer) can fail where registering worked (GPUs without peer access, a name removed): every rank says
         * whether it mapped all it needs, and the call takes the normal schedule on every rank unless all did. */
        if (mres != ZCCL_SUCCESS) /* the WARN of the failure names it; the call itself will succeed */
            ZCCL_INFO(ZCCL_LOG_COLL, "rank %d: %s #%llu takes the normal path: %s", comm->rank, comm->op_name,
                      zccl__seq_shown(comm, comm->seq), zccl__last_error());
        __atomic_store_n(&me->ready, 2 * comm->seq + (mres == ZCCL_SUCCESS), __ATOMIC_RELEASE);
        ring_all(comm);
        res = wait_all(comm, offsetof(desc_t, ready), 2 * comm->seq, "buffer mappings");
        for (int r = 0; r < n && res == ZCCL_SUCCESS && direct; r++) {
            const desc_t *d = zccl__shm_reg_area(&comm->tc, r);
            direct = __atomic_load_n(&d->ready, __ATOMIC_ACQUIRE) == 2 * comm->seq + 1; /* larger: r moved on */
        }
    }
    if (direct && res == ZCCL_SUCCESS) {
        res = run_direct(comm, o, srcv, dstv, tmp);
        if (res == ZCCL_SUCCESS) {
            /* Exit barrier: peers read our send buffer and write our receive buffer until they are done. */
            __atomic_store_n(&me->done, comm->seq, __ATOMIC_RELEASE);
            ring_all(comm);
            res = wait_all(comm, offsetof(desc_t, done), comm->seq, "completion");
            if (res == ZCCL_SUCCESS) {
                *done = true;
                __atomic_fetch_add(&direct_calls[o->mem], 1, __ATOMIC_RELAXED);
                ZCCL_TRACE(ZCCL_LOG_COLL, "%s #%llu: one pass over the peers' registered %s buffers", comm->op_name,
                           zccl__seq_shown(comm, comm->seq), mops->name);
            }
        }
    }
    if (snaps != one) free(snaps);
    if (srcv != src) free(srcv);
    if (dstv != dst) free(dstv);
    return res;
}

/* ---- the staged one-pass path for unregistered host buffers ----------------------------------------------------
 *
 * When every rank of the communicator is on this host, init gives each rank a staging region of its own
 * (zccl_mem_alloc, so the peers map it; 4 KiB of header, then a send area and a receive area of
 * ZCCL_SHM_STAGED_MAX_BYTES each) and maps every peer's. An all-reduce, reduce-scatter or all-gather on ordinary
 * host buffers whose whole vector is within [ZCCL_SHM_STAGED_MIN_BYTES, ZCCL_SHM_STAGED_MAX_BYTES] then runs with
 * one copy into the staging area and one pass out of the peers' areas, and one or two barriers instead of a
 * schedule's steps:
 *
 *   all-reduce      copy in the blocks the peers reduce (every block but this rank's own), barrier; reduce block i
 *                   from the own input and the peers' send areas (in rank order, as the registered path and the
 *                   direct schedule) into the own output, a cache-sized piece at a time, each piece then copied
 *                   into the own receive area; barrier; copy every other block j from rank j's receive area into
 *                   the output.
 *   reduce-scatter  copy in every block but the own, barrier; reduce block i into the output.
 *   all-gather      copy in the input, barrier; copy every rank's block into the output.
 *
 * Per rank and byte of vector on 2 ranks that is 2 reads and 2 writes for an all-reduce (the ring through slots:
 * 2.5 and 2), and it stays near that as ranks are added (the ring grows towards 5 and 4), with two barriers
 * whatever the rank count (the ring: 2(n-1) steps, each waiting for a peer that may not have a core).
 *
 * Reuse: a rank rewrites its areas only in its next staged call, after it saw every peer's `fin` of this one (the
 * peers are done reading). The user's buffers are never touched by a peer, so a call returns without an exit
 * barrier. The call's descriptor (count, datatype, op, root, sequence) travels in the header and every rank compares
 * all of them after the first barrier: calls that differ fail on every rank, naming both. Decisions use only values
 * every rank shares (the settings must match; the vector's size), so all ranks take this path or none.
 */

static uint64_t staged_calls; /* calls this process ran on the staged path (tests, the destroy-time INFO line) */

typedef struct {
    _Alignas(64) uint64_t in;  /* staged call k: this rank's send area holds its input */
    _Alignas(64) uint64_t red; /* all-reduce: this rank's reduced block is in its receive area */
    _Alignas(64) uint64_t fin; /* this rank read everything it needed from the peers' areas */
    _Alignas(64) zccl_call_desc_t desc; /* the call, for the mismatch check */
} stg_hdr_t;
#define STG_HDR_BYTES 4096u
_Static_assert(sizeof(stg_hdr_t) <= STG_HDR_BYTES, "staging header");

ZCCL_SETTING(zccl__set_shm_staged) = {
    .name = "ZCCL_SHM_STAGED", .deflt = "-1",
    .help = "the staged one-pass path for unregistered host buffers when every rank is on one host: 1 on, 0 off, "
            "-1 on when the host has more ranks than cores on some rank (where it waits for its peers twice instead "
            "of at every ring step), else off (where the single copy of ZCCL_SHM_CMA is faster)",
    .kind = ZCCL_CFG_INT, .lo = -1, .hi = 1, .must_match = true};
ZCCL_SETTING(zccl__set_shm_staged_max_bytes) = {
    .name = "ZCCL_SHM_STAGED_MAX_BYTES", .deflt = "4M",
    .help = "largest all-reduce / reduce-scatter / all-gather (whole vector, bytes) that runs through the staging "
            "areas when every rank is on one host (lib/core/regmem.c, the staged one-pass path); each rank maps 2x "
            "this in /dev/shm at init; 0 disables the path",
    .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = (int64_t)1 << 32, .must_match = true};
ZCCL_SETTING(zccl__set_shm_staged_min_bytes) = {
    .name = "ZCCL_SHM_STAGED_MIN_BYTES", .deflt = "32K",
    .help = "smallest vector (bytes) that takes the staged one-pass path (smaller ones take the tuned schedule)",
    .kind = ZCCL_CFG_BYTES, .lo = 0, .hi = INT64_MAX, .must_match = true};

static const uint8_t *stg_area(struct zccl_comm *comm, int r) { return comm->stg.base[r]; }
#define STG_HDR(comm, r) ((stg_hdr_t *)(comm)->stg.base[r])
#define STG_SEND(comm, r) ((comm)->stg.base[r] + STG_HDR_BYTES)
#define STG_RECV(comm, r) ((comm)->stg.base[r] + STG_HDR_BYTES + (comm)->stg.cap)

zccl_result_t zccl__stg_setup(struct zccl_comm *comm) {
    const int n = comm->nranks;
    int64_t cap = 0, lo = 0, mode = -1;
    ZCCL_CHECK(zccl__cfg_int(&zccl__set_shm_staged, &mode));
    ZCCL_CHECK(zccl__cfg_int(&zccl__set_shm_staged_max_bytes, &cap));
    ZCCL_CHECK(zccl__cfg_int(&zccl__set_shm_staged_min_bytes, &lo));
    if (n < 2 || cap <= 0 || mode == 0) return ZCCL_SUCCESS; /* settings that must match: the same on every rank */
    for (int r = 0; r < n; r++) /* every rank sees the same answer: the transport table agrees */
        if (!zccl__shm_reg_area(&comm->tc, r)) return ZCCL_SUCCESS;
    /* Automatic: wanted where a rank sees more ranks than cores (its affinity mask); the all-reduce turns the ranks'
     * votes into one answer, on when any rank wants it. */
    int sharing = n; /* with ZCCL_MACHINE_RANKS: the ranks of every host on this machine */
    ZCCL_CHECK(zccl__cpu_ranks(n, &sharing));
    uint64_t want = mode == 1 || sharing > zccl__cpus_for_ranks(sharing), any_want = 0;
    ZCCL_CHECK(zccl_allreduce(&want, &any_want, 1, ZCCL_UINT64, ZCCL_MAX, comm, NULL));
    if (!any_want) return ZCCL_SUCCESS;
    const size_t region = STG_HDR_BYTES + 2 * (size_t)cap;
    comm->stg.base = calloc((size_t)n, sizeof *comm->stg.base);
    uint64_t *ids = calloc((size_t)n, sizeof *ids);
    if (!comm->stg.base || !ids) {
        free(ids);
        free(comm->stg.base);
        comm->stg.base = NULL;
        return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: out of memory for %d staging pointers", comm->rank, n);
    }
    /* Each rank allocates; a rank that cannot publishes id 0 and every rank then leaves the path off. The regions
     * are pre-faulted shared memory: every rank checks first that the host's ranks' regions fit both /dev/shm and
     * the memory the kernel can give without swapping (a large ZCCL_SHM_STAGED_MAX_BYTES would otherwise wake the
     * OOM killer). */
    char why[512] = "";
    void *mine = NULL;
    uint64_t myid = 0;
    const unsigned long long need = (unsigned long long)n * region;
    unsigned long long avail_mem = 0, shm_free = 0;
    struct statvfs sv;
    if (statvfs("/dev/shm", &sv) == 0) shm_free = (unsigned long long)sv.f_bavail * sv.f_frsize;
    FILE *mi = fopen("/proc/meminfo", "r");
    if (mi) {
        char line[256];
        unsigned long long kb = 0;
        while (fgets(line, sizeof line, mi))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail_mem = kb * 1024ull; break; }
        fclose(mi);
    }
    if (lo > cap) {
        snprintf(why, sizeof why, "ZCCL_SHM_STAGED_MIN_BYTES (%lld) is above ZCCL_SHM_STAGED_MAX_BYTES (%lld): no "
                 "vector can take it", (long long)lo, (long long)cap);
    } else if ((shm_free && need > shm_free) || (avail_mem && need > avail_mem / 2)) {
        snprintf(why, sizeof why, "the %d ranks' staging regions need %llu MiB (2 x ZCCL_SHM_STAGED_MAX_BYTES + 4 KiB "
                 "each) but /dev/shm has %llu MiB free and the host %llu MiB available (MemAvailable; at most half "
                 "is used): lower ZCCL_SHM_STAGED_MAX_BYTES", n, need >> 20, shm_free >> 20, avail_mem >> 20);
    } else if (zccl__mem_alloc(&mine, region) == ZCCL_SUCCESS) {
        pthread_mutex_lock(&mu);
        for (const region_t *g = regions; g; g = g->next)
            if (g->base == mine) myid = g->id;
        pthread_mutex_unlock(&mu);
    } else {
        snprintf(why, sizeof why, "%s", zccl__last_error());
    }
    zccl_result_t res = zccl_allgather(&myid, ids, 1, ZCCL_UINT64, comm, NULL);
    uint64_t ok = myid != 0, all_ok = 0;
    for (int r = 0; r < n && res == ZCCL_SUCCESS && ok; r++) {
        if (ids[r] == 0) ok = 0;
        else if (r == comm->rank) comm->stg.base[r] = mine;
        else {
            pthread_mutex_lock(&mu);
            const zccl_result_t m = peer_region(comm, r, ZCCL_MEM_HOST, ids[r], NULL, 0, region, &comm->stg.base[r]);
            pthread_mutex_unlock(&mu);
            if (m != ZCCL_SUCCESS) {
                snprintf(why, sizeof why, "%s", zccl__last_error());
                ok = 0;
            }
        }
    }
    free(ids);
    if (res == ZCCL_SUCCESS) res = zccl_allreduce(&ok, &all_ok, 1, ZCCL_UINT64, ZCCL_MIN, comm, NULL);
    if (res != ZCCL_SUCCESS || !all_ok) {
        if (mine) zccl__mem_free(mine);
        free(comm->stg.base);
        comm->stg.base = NULL;
        if (res == ZCCL_SUCCESS && why[0])
            ZCCL_WARN(ZCCL_LOG_INIT, "rank %d: staged one-pass path off: %s", comm->rank, why);
        else if (res == ZCCL_SUCCESS)
            ZCCL_INFO(ZCCL_LOG_INIT, "rank %d: staged one-pass path off: a peer could not set up its staging area",
                      comm->rank);
        return res;
    }
    /* Every peer has mapped this rank's region: its name can go, so a process that dies or exits without
     * destroying the communicator leaves nothing in /dev/shm (the mapping lives on until zccl__mem_free). */
    char name[64];
    region_name(name, sizeof name, myid, (int)getpid());
    shm_unlink(name);
    comm->stg.mine = mine;
    comm->stg.cap = (size_t)cap;
    comm->stg.min = (size_t)lo;
    comm->stg.ok = true;
    ZCCL_INFO(ZCCL_LOG_INIT, "rank %d: staged one-pass path for vectors of %lld..%lld bytes (2 x %lld bytes of "
              "staging per rank; %s)", comm->rank, (long long)lo, (long long)cap, (long long)cap,
              mode == 1 ? "ZCCL_SHM_STAGED=1" : "more ranks than cores");
    return ZCCL_SUCCESS;
}

void zccl__stg_free(struct zccl_comm *comm) {
    /* The peers' mappings are unmapped with the communicator's other peer maps (zccl__reg_comm_gone). */
    if (comm->stg.mine) zccl__mem_free(comm->stg.mine);
    free(comm->stg.base);
    memset(&comm->stg, 0, sizeof comm->stg);
}

static zccl_result_t stg_check_desc(struct zccl_comm *comm) {
    for (int r = 0; r < comm->nranks; r++) ZCCL_CHECK(call_mismatch(comm, r, &STG_HDR(comm, r)->desc));
    return ZCCL_SUCCESS;
}

zccl_result_t zccl__stg_try_run(struct zccl_comm *comm, const zccl_op_t *o, bool *done) {
    *done = false;
    const int n = comm->nranks, i = comm->rank;
    if (!comm->stg.ok || o->mem != ZCCL_MEM_HOST || o->vcounts || o->barrier || o->count == 0) return ZCCL_SUCCESS;
    if (o->coll != ZCCL_COLL_ALLREDUCE && o->coll != ZCCL_COLL_REDUCE_SCATTER && o->coll != ZCCL_COLL_ALLGATHER)
        return ZCCL_SUCCESS;
    const size_t es = zccl_type_size(o->dt);
    const bool ar = o->coll == ZCCL_COLL_ALLREDUCE;
    const size_t total = o->count * es * (ar ? 1 : (size_t)n);
    if (total < comm->stg.min || total > comm->stg.cap) return ZCCL_SUCCESS;

    const uint64_t k = ++comm->stg.seq, prev = k - 1;
    stg_hdr_t *me = STG_HDR(comm, i);
    /* My areas are free once every peer finished reading them in the previous staged call. */
    if (prev) ZCCL_CHECK(wait_all_in(comm, stg_area, offsetof(stg_hdr_t, fin), prev, "staging reads"));
    const uint8_t *in = o->sendbuf;
    uint8_t *out = o->recvbuf, *send = STG_SEND(comm, i);
    /* Blocks: all-reduce splits count into n blocks of `per` (the last ones shorter or empty); reduce-scatter's input
     * holds n blocks of count; all-gather's output n blocks of count. */
    const size_t per = ar ? (o->count + (size_t)n - 1) / (size_t)n : o->count;
#define BLK_OFF(b) ZCCL_MIN((size_t)(b) * per, ar ? o->count : (size_t)n * o->count)
#define BLK_LEN(b) (ZCCL_MIN(per, (ar ? o->count : (size_t)n * o->count) - BLK_OFF(b)))
    if (o->coll == ZCCL_COLL_ALLGATHER) {
        zccl_kernel_copy(send, in, o->count * es);
    } else {
        for (int b = 0; b < n; b++)
            if (b != i && BLK_LEN(b)) zccl_kernel_copy(send + BLK_OFF(b) * es, in + BLK_OFF(b) * es, BLK_LEN(b) * es);
    }
    me->desc = comm->desc_mine;
    __atomic_store_n(&me->in, k, __ATOMIC_RELEASE);
    ring_all(comm);
    *done = true; /* from here on the peers may depend on this rank: its failures are the call's */
    ZCCL_CHECK(wait_all_in(comm, stg_area, offsetof(stg_hdr_t, in), k, "staged inputs"));
    ZCCL_CHECK(stg_check_desc(comm));

    if (o->coll == ZCCL_COLL_ALLGATHER) {
        for (int r = 0; r < n; r++) {
            uint8_t *to = out + (size_t)r * o->count * es;
            const uint8_t *from = r == i ? in : STG_SEND(comm, r);
            if (to != from) memmove(to, from, o->count * es);
        }
    } else {
        uint8_t *src[64], **srcv = n <= 64 ? src : malloc((size_t)n * sizeof *srcv);
        if (!srcv) return zccl__error(ZCCL_SYSTEM_ERROR, "rank %d: out of memory for %d pointers", i, n);
        for (int r = 0; r < n; r++) srcv[r] = r == i ? (uint8_t *)in : STG_SEND(comm, r);
        /* Block i, a cache-sized piece at a time, reduced in rank order 0, 1, ..., n-1 — the order of the registered
         * path (reduce_blocks) and of the direct schedule (sched/sched_direct.c), so that the three give bitwise
         * the same sums and a buffer's registration never changes a result. The partial sums go to a bounce
         * buffer, since the output may be the own input (in place, at the same offsets), which the chain may still
         * have to read; the last addition writes the output itself: by then the own input was read, unless it is
         * that last operand, which the kernel may overwrite element by element (dst may equal b). An all-reduce
         * then copies the piece into the receive area while it is hot. */
        _Alignas(64) uint8_t tmp[32768];
        const size_t off = BLK_OFF(i), len = BLK_LEN(i), step = ZCCL_MAX((size_t)1, sizeof tmp / es);
        uint8_t *dst = out + (ar ? off * es : 0), *area = STG_RECV(comm, i) + off * es;
        const zccl_redop_t kop = o->op == ZCCL_AVG ? ZCCL_SUM : o->op;
        for (size_t c0 = 0; c0 < len; c0 += step) {
            const size_t c = ZCCL_MIN(step, len - c0), at = (off + c0) * es, to = c0 * es;
            if (n == 1 && dst + to != srcv[0] + at) memcpy(dst + to, srcv[0] + at, c * es);
            for (int r = 1; r < n; r++)
                zccl_kernel_reduce(r == n - 1 ? dst + to : tmp, r == 1 ? srcv[0] + at : tmp, srcv[r] + at, c, o->dt,
                                   kop, (r == n - 1 && o->op == ZCCL_AVG) ? (uint32_t)n : 1);
            if (ar) zccl_kernel_copy(area + to, dst + to, c * es);
        }
        if (srcv != src) free(srcv);
        if (ar) {
            __atomic_store_n(&me->red, k, __ATOMIC_RELEASE);
            ring_all(comm);
            ZCCL_CHECK(wait_all_in(comm, stg_area, offsetof(stg_hdr_t, red), k, "staged results"));
            for (int b = 0; b < n; b++)
                if (b != i && BLK_LEN(b)) zccl_kernel_copy(out + BLK_OFF(b) * es, STG_RECV(comm, b) + BLK_OFF(b) * es, BLK_LEN(b) * es);
        }
    }
#undef BLK_OFF
#undef BLK_LEN
    __atomic_store_n(&me->fin, k, __ATOMIC_RELEASE);
    ring_all(comm);
    __atomic_fetch_add(&staged_calls, 1, __ATOMIC_RELAXED);
    ZCCL_TRACE(ZCCL_LOG_COLL, "%s #%llu: staged one-pass path", comm->op_name, zccl__seq_shown(comm, comm->seq));
    return ZCCL_SUCCESS;
}

uint64_t zccl__stg_calls(void) { return __atomic_load_n(&staged_calls, __ATOMIC_RELAXED); }
