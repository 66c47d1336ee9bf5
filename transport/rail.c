/*
 * rail.c — TCP rails: which interfaces this rank stripes over, their listeners and accept threads, and each pair's
 * socket plan (rail.h has the rules both sides follow).
 *
 * Interfaces are enumerated as NCCL's socket transport does: with ZCCL_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) set, the
 * interfaces it selects (prefix list, '^' excludes, '=' exact); otherwise every up interface that is not loopback,
 * not a container bridge (docker*, virbr*) and has an IPv4 address. A rank with fewer than two rails (and one
 * socket per rail) publishes none and the TCP transport keeps its single connection per direction; so does every
 * pair whose two ranks share fewer than two sockets' worth of subnets (the plan logs that fallback by name).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rail.h"

#define ZCCL_CONN_RAIL 4 /* a striped data connection: rail_hdr_t after the handshake */

typedef struct {
    uint64_t comm_id;
    int32_t from_rank;
    int32_t kind; /* ZCCL_CONN_RAIL */
    int32_t sock; /* the socket index k of the pair's plan */
    int32_t flags; /* RAIL_RESUME: lane `sock` moved here from a rail that died */
} rail_hdr_t;
_Static_assert(sizeof(rail_hdr_t) == 24, "rail_hdr_t is a wire format");
#define RAIL_RESUME 1

static bool container_if(const char *name) {
    return !strncmp(name, "docker", 6) || !strncmp(name, "virbr", 5) || !strcmp(name, "lo");
}

/* addr/prefix's subnet as 4 bytes (IPv4 only). */
static uint32_t subnet_of(const zccl_rail_addr_t *a) {
    const struct sockaddr_in *s = (const struct sockaddr_in *)&a->addr.sa;
    const uint32_t ip = ntohl(s->sin_addr.s_addr);
    return a->prefix == 0 ? 0 : a->prefix >= 32 ? ip : ip & ~((1u << (32 - a->prefix)) - 1u);
}

static const char *subnet_str(const zccl_rail_addr_t *a, char *buf, size_t len) {
    struct in_addr in = {htonl(subnet_of(a))};
    char s[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &in, s, sizeof s);
    snprintf(buf, len, "%s/%u", s, a->prefix);
    return buf;
}

static int prefix_len(const struct sockaddr *mask) {
    if (!mask || mask->sa_family != AF_INET) return 32;
    return __builtin_popcount(((const struct sockaddr_in *)mask)->sin_addr.s_addr);
}

/* The usable interfaces (see the top of the file), at most max, into out; *tried lists every up IPv4 one seen. */
zccl_result_t zccl__tcp_rails_list(zccl_rail_addr_t *out, int max, int *n, char *tried, size_t tlen) {
    const char *spec = zccl__cfg_str(ZCCL_CFG_SOCKET_IFNAME);
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return zccl__syserror(errno, "getifaddrs failed while listing TCP rails");
    size_t tl = 0;
    *n = 0;
    tried[0] = 0;
    for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        if (tl + strlen(i->ifa_name) + 3 < tlen) tl += (size_t)snprintf(tried + tl, tlen - tl, "%s%s", tl ? ", " : "", i->ifa_name);
        if (*spec ? !zccl__ifname_match(spec, i->ifa_name) : ((i->ifa_flags & IFF_LOOPBACK) || container_if(i->ifa_name)))
            continue;
        bool seen = false; /* one address per interface: its first */
        for (int k = 0; k < *n; k++) seen |= !strncmp(out[k].ifname, i->ifa_name, sizeof out[k].ifname - 1);
        if (seen || *n >= max) continue;
        zccl_rail_addr_t *r = &out[(*n)++];
        memset(r, 0, sizeof *r);
        r->addr.len = sizeof(struct sockaddr_in);
        memcpy(&r->addr.sa, i->ifa_addr, sizeof(struct sockaddr_in));
        r->prefix = (uint8_t)prefix_len(i->ifa_netmask);
        snprintf(r->ifname, sizeof r->ifname, "%s", i->ifa_name);
    }
    freeifaddrs(ifs);
    if (*spec && *n == 0)
    {
        const char *var = zccl__cfg_source(ZCCL_CFG_SOCKET_IFNAME); /* the name the user set: ZCCL_* or NCCL_* */
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=%s matches no up interface with an IPv4 address (TCP rails); up "
                           "interfaces: %s", var ? var : "ZCCL_SOCKET_IFNAME", spec, tried[0] ? tried : "(none)");
    }
    return ZCCL_SUCCESS;
}

/* Accept thread: a striped data connection names its sender and socket index. */
static int rail_on_conn(void *ctx, int fd, const void *hdr, size_t len) {
    zccl_rails_t *r = ctx;
    zccl_tp_comm_t *tc = r->tc;
    rail_hdr_t h;
    const char *bad = NULL;
    if (len != sizeof h) bad = "header of the wrong length";
    else {
        memcpy(&h, hdr, sizeof h);
        if (h.comm_id != tc->comm_id) bad = "header of another communicator";
        else if (h.kind != ZCCL_CONN_RAIL) bad = "unknown connection kind";
        else if (h.from_rank < 0 || h.from_rank >= tc->nranks || h.from_rank == tc->rank) bad = "sender rank out of range";
        else if (h.sock < 0 || h.sock >= ZCCL_TCP_SOCKS_MAX) bad = "socket index out of range";
        else if (h.flags & ~RAIL_RESUME) bad = "unknown flags";
    }
    if (bad) {
        ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: refused a TCP rail connection: %s", tc->rank, bad);
        close(fd);
        return 0;
    }
    const size_t at = (size_t)h.from_rank * ZCCL_TCP_SOCKS_MAX + (size_t)h.sock;
    pthread_mutex_lock(&tc->in_mutex);
    bool ok;
    if (h.flags & RAIL_RESUME) { /* a newer move replaces one not taken yet */
        ok = r->resume_fd != NULL && !r->poisoned;
        if (ok && r->resume_fd[at] >= 0) close(r->resume_fd[at]);
        if (ok) r->resume_fd[at] = fd;
        if (ok) __atomic_add_fetch(&r->resume_pending[h.from_rank], 1, __ATOMIC_RELEASE);
    } else {
        int *slot = r->in_fd ? &r->in_fd[at] : NULL;
        ok = slot && *slot < 0;
        if (ok) *slot = fd;
    }
    pthread_mutex_unlock(&tc->in_mutex);
    if (!ok) {
        ZCCL_WARN(ZCCL_LOG_TCP, "rank %d: rank %d connected its TCP socket %d twice; second connection refused",
                  tc->rank, h.from_rank, h.sock);
        close(fd);
        return 0;
    }
    zccl__doorbell_ring(tc, tc->rank);
    return 0;
}

struct rail_thread_arg {
    zccl_rails_t *r;
    int fd;
};

/* One argument block per rail, allocated right after the rails (freed with them). */
static struct rail_thread_arg *thread_args(zccl_rails_t *r) { return (struct rail_thread_arg *)(r + 1); }

static void *rail_main(void *arg) {
    struct rail_thread_arg *a = arg;
    zccl__log_set_rank(a->r->tc->rank);
    zccl__accept_loop(a->fd, a->r->stop_pipe[0], a->r->tc->secret, sizeof(rail_hdr_t), rail_on_conn, a->r, 0, NULL);
    return NULL;
}

zccl_result_t zccl__tcp_rails_local_info(zccl_tp_comm_t *comm, zccl_tcp_peer_info_t *me) {
    memset(me, 0, sizeof *me);
    int64_t cap = -1, nsocks = 1, smin = 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_TCP_RAILS, &cap));
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_NSOCKS_PERTHREAD, &nsocks));
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_TCP_STRIPE_MIN_BYTES, &smin));
    int64_t minch = 0, maxch = 0;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_MIN_NCHANNELS, &minch));
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_MAX_NCHANNELS, &maxch));
    if (maxch > 0 && minch > maxch)
        return zccl__error(ZCCL_INVALID_ARGUMENT, "%s=%lld is above %s=%lld",
                           zccl__cfg_source(ZCCL_CFG_MIN_NCHANNELS), (long long)minch,
                           zccl__cfg_source(ZCCL_CFG_MAX_NCHANNELS), (long long)maxch);
    zccl_rail_addr_t found[ZCCL_RAIL_MAX];
    char tried[512];
    int n = 0;
    ZCCL_CHECK(zccl__tcp_rails_list(found, ZCCL_RAIL_MAX, &n, tried, sizeof tried));
    if (cap >= 0 && n > (cap ? cap : 1)) n = (int)(cap ? cap : 1);
    if (n * nsocks < 2) {
        ZCCL_INFO(ZCCL_LOG_TCP, "TCP rails: %d usable interface%s (up: %s), %lld socket%s per rail: one connection per "
                  "direction", n, n == 1 ? "" : "s", tried[0] ? tried : "none", (long long)nsocks, nsocks == 1 ? "" : "s");
        return ZCCL_SUCCESS;
    }
    zccl_rails_t **ref = zccl__tcp_rails_ref(comm);
    if (!ref) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for the TCP transport");
    zccl_rails_t *r = calloc(1, sizeof *r + ZCCL_RAIL_MAX * sizeof(struct rail_thread_arg));
    if (!r) return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for TCP rails");
    r->tc = comm;
    r->nsocks = (int)nsocks;
    r->stripe_min = (size_t)smin;
    r->min_ch = (int)minch;
    r->max_ch = (int)maxch;
    r->stop_pipe[0] = r->stop_pipe[1] = -1;
    for (int i = 0; i < ZCCL_RAIL_MAX; i++) r->listen_fd[i] = -1;
    r->nranks = comm->nranks;
    r->in_fd = malloc((size_t)comm->nranks * ZCCL_TCP_SOCKS_MAX * sizeof(int));
    r->resume_fd = malloc((size_t)comm->nranks * ZCCL_TCP_SOCKS_MAX * sizeof(int));
    r->resume_pending = calloc((size_t)comm->nranks, sizeof(uint32_t));
    r->ncommon = calloc((size_t)comm->nranks, sizeof(int));
    r->cmine = calloc((size_t)comm->nranks * ZCCL_RAIL_MAX, 1);
    r->ctheirs = calloc((size_t)comm->nranks * ZCCL_RAIL_MAX, 1);
    r->cdead = calloc((size_t)comm->nranks * ZCCL_RAIL_MAX, 1);
    r->nsock = calloc((size_t)comm->nranks, sizeof(int));
    r->send_rail = calloc((size_t)comm->nranks * ZCCL_TCP_SOCKS_MAX, 1);
    r->send_prail = calloc((size_t)comm->nranks * ZCCL_TCP_SOCKS_MAX, 1);
    *ref = r; /* freed by the transport's teardown from here on */
    if (!r->in_fd || !r->nsock || !r->send_rail || !r->send_prail || !r->resume_fd || !r->resume_pending ||
        !r->ncommon || !r->cmine || !r->ctheirs || !r->cdead)
        return zccl__error(ZCCL_SYSTEM_ERROR, "out of memory for TCP rails of %d ranks", comm->nranks);
    for (size_t i = 0; i < (size_t)comm->nranks * ZCCL_TCP_SOCKS_MAX; i++) r->in_fd[i] = r->resume_fd[i] = -1;
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_RAIL_TIMEOUT_MS, &r->rail_timeout_ms));
    ZCCL_CHECK(zccl__cfg_int(ZCCL_CFG_SOCKET_USER_TIMEOUT_MS, &r->keep_timeout_ms));
    if (pipe2(r->stop_pipe, O_CLOEXEC) != 0) return zccl__syserror(errno, "pipe for the TCP rail threads");
    for (int i = 0; i < n; i++) {
        zccl_rail_addr_t a = found[i];
        ((struct sockaddr_in *)&a.addr.sa)->sin_port = 0;
        ZCCL_CHECK(zccl__listen(&a.addr, &r->listen_fd[i]));
        r->mine[i] = a;
        r->n = i + 1;
        struct rail_thread_arg *ta = &thread_args(r)[i];
        ta->r = r;
        ta->fd = r->listen_fd[i];
        int rc = pthread_create(&r->thr[i], NULL, rail_main, ta);
        if (rc != 0) return zccl__syserror(rc, "cannot start the accept thread of TCP rail %s", a.ifname);
        r->nthr = i + 1;
    }
    me->n = r->n;
    me->nsocks = r->nsocks;
    memcpy(me->rail, r->mine, sizeof r->mine);
    char list[512] = "";
    size_t l = 0;
    for (int i = 0; i < r->n; i++) {
        char as[64], sn[40];
        l += (size_t)snprintf(list + l, sizeof list - ZCCL_MIN(l, sizeof list), "%s%s %s (%s)", i ? ", " : "",
                              r->mine[i].ifname, zccl__sockaddr_str(&r->mine[i].addr, as, sizeof as),
                              subnet_str(&r->mine[i], sn, sizeof sn));
        if (l >= sizeof list) break;
    }
    ZCCL_INFO(ZCCL_LOG_TCP, "TCP rails: %d (%s), %d socket%s per rail", r->n, list, r->nsocks, r->nsocks == 1 ? "" : "s");
    return ZCCL_SUCCESS;
}

typedef struct {
    uint32_t subnet;
    uint8_t prefix;
    int8_t mine, theirs;
} common_t;

static int common_cmp(const void *a, const void *b) {
    const common_t *x = a, *y = b;
    if (x->prefix != y->prefix) return x->prefix < y->prefix ? -1 : 1;
    return x->subnet < y->subnet ? -1 : x->subnet > y->subnet;
}

/* The subnets both records have, each once (its first rail on either side), sorted: the same list on both sides. */
static int common_rails(const zccl_tcp_peer_info_t *a, const zccl_tcp_peer_info_t *b, common_t *out) {
    int n = 0;
    for (int i = 0; i < a->n && i < ZCCL_RAIL_MAX; i++) {
        const uint32_t s = subnet_of(&a->rail[i]);
        bool dup = false;
        for (int k = 0; k < n; k++) dup |= out[k].subnet == s && out[k].prefix == a->rail[i].prefix;
        if (dup) continue;
        for (int j = 0; j < b->n && j < ZCCL_RAIL_MAX; j++)
            if (b->rail[j].prefix == a->rail[i].prefix && subnet_of(&b->rail[j]) == s) {
                out[n++] = (common_t){s, a->rail[i].prefix, (int8_t)i, (int8_t)j};
                break;
            }
    }
    qsort(out, (size_t)n, sizeof *out, common_cmp);
    return n;
}

static int local_index(const zccl_tp_comm_t *tc, int rank) {
    int li = 0;
    for (int q = 0; q < rank; q++) li += tc->peers[q].host_hash == tc->peers[rank].host_hash;
    return li;
}

zccl_result_t zccl__rails_plan(zccl_rails_t *r) {
    zccl_tp_comm_t *tc = r->tc;
    const zccl_tcp_peer_info_t *me = &tc->peers[tc->rank].tcp;
    for (int p = 0; p < tc->nranks; p++) {
        r->nsock[p] = 0;
        if (p == tc->rank) continue;
        const zccl_tcp_peer_info_t *pi = &tc->peers[p].tcp;
        if (pi->n < 0 || pi->n > ZCCL_RAIL_MAX || pi->nsocks < 1 || pi->nsocks > 8) {
            ZCCL_WARN(ZCCL_LOG_TCP, "rank %d published an invalid TCP rail record (%d rails, %d sockets): one "
                      "connection per direction with it", p, pi->n, pi->nsocks);
            continue;
        }
        bool valid = true;
        for (int j = 0; j < pi->n; j++) {
            const char *why = NULL;
            valid &= pi->rail[j].addr.sa.ss_family == AF_INET && zccl__sockaddr_check(&pi->rail[j].addr, &why) == ZCCL_SUCCESS &&
                     pi->rail[j].prefix <= 32;
        }
        if (!valid) {
            ZCCL_WARN(ZCCL_LOG_TCP, "rank %d published an invalid TCP rail address: one connection per direction with it", p);
            continue;
        }
        if (pi->n == 0) {
            ZCCL_INFO(ZCCL_LOG_TCP, "rank %d publishes no TCP rails: one connection per direction with it", p);
            continue;
        }
        common_t c[ZCCL_RAIL_MAX];
        const int nc = common_rails(me, pi, c);
        const int ns = ZCCL_MIN(me->nsocks, pi->nsocks);
        const int s = ZCCL_MIN(nc * ns, ZCCL_TCP_SOCKS_MAX);
        char names[256] = "";
        size_t l = 0;
        for (int k = 0; k < nc && l < sizeof names; k++) {
            char sn[40];
            l += (size_t)snprintf(names + l, sizeof names - l, "%s%s via %s", k ? ", " : "", subnet_str(&me->rail[c[k].mine], sn, sizeof sn),
                                  me->rail[c[k].mine].ifname);
        }
        if (s < 2) {
            ZCCL_INFO(ZCCL_LOG_TCP, "rank %d shares %d of this rank's %d TCP rail subnets (%s): one connection per "
                      "direction with it (fallback: the bootstrap interface)", p, nc, me->n, nc ? names : "none");
            continue;
        }
        if (nc < me->n || nc < pi->n)
            ZCCL_INFO(ZCCL_LOG_TCP, "rank %d has %d TCP rails and this rank %d; only the %d subnet%s both have are used "
                      "with it (%s)", p, pi->n, me->n, nc, nc == 1 ? "" : "s", names);
        r->nsock[p] = s;
        r->ncommon[p] = nc;
        for (int i = 0; i < nc; i++) {
            r->cmine[(size_t)p * ZCCL_RAIL_MAX + (size_t)i] = c[i].mine;
            r->ctheirs[(size_t)p * ZCCL_RAIL_MAX + (size_t)i] = c[i].theirs;
        }
        /* The first lane goes on the rail paired with this rank's GPU, else rank i of a host starts on rail i mod R. */
        int li = local_index(tc, tc->rank), paired = -1;
        for (int i = 0; i < nc && paired < 0; i++)
            if (zccl__gpu_nic_is(tc, me->rail[c[i].mine].ifname)) paired = i;
        if (paired >= 0) li = paired;
        for (int k = 0; k < s; k++) /* lane k's common rail; the sender moves it when that rail dies */
            r->send_rail[(size_t)p * ZCCL_TCP_SOCKS_MAX + (size_t)k] = (int8_t)((k + li) % nc);
        ZCCL_INFO(ZCCL_LOG_TCP, "rank %d: %d socket%s per direction over %d rail%s (%s); this rank's first on %s%s", p, s,
                  s == 1 ? "" : "s", nc, nc == 1 ? "" : "s", names, me->rail[c[li % nc].mine].ifname,
                  paired >= 0 ? " (paired with its GPU)" : "");
    }
    return zccl__lanes_init(r);
}

const char *zccl__rails_name(const zccl_rails_t *r, int peer, int c, char *buf, size_t len) {
    const zccl_tp_comm_t *tc = r->tc;
    const zccl_rail_addr_t *a = &tc->peers[tc->rank].tcp.rail[r->cmine[(size_t)peer * ZCCL_RAIL_MAX + (size_t)c]];
    char sn[40];
    snprintf(buf, len, "%s (%s)", a->ifname, subnet_str(a, sn, sizeof sn));
    return buf;
}

zccl_result_t zccl__rails_connect(zccl_rails_t *r, int peer, int k, int c, bool resume, uint64_t deadline_ns, int *fd_out) {
    zccl_tp_comm_t *tc = r->tc;
    const int pr = r->ctheirs[(size_t)peer * ZCCL_RAIL_MAX + (size_t)c];
    rail_hdr_t h = {tc->comm_id, tc->rank, ZCCL_CONN_RAIL, k, resume ? RAIL_RESUME : 0};
    return zccl__connect_auth(&tc->peers[peer].tcp.rail[pr].addr, tc->secret, &h, sizeof h, deadline_ns, fd_out);
}

int zccl__rails_take_resume(zccl_rails_t *r, int peer, int k) {
    zccl_tp_comm_t *tc = r->tc;
    pthread_mutex_lock(&tc->in_mutex);
    int *slot = &r->resume_fd[(size_t)peer * ZCCL_TCP_SOCKS_MAX + (size_t)k];
    const int fd = *slot;
    *slot = -1;
    pthread_mutex_unlock(&tc->in_mutex);
    return fd;
}

bool zccl__rail_healthy(const zccl_rail_addr_t *a, char *buf, size_t len) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return true; /* cannot tell */
    bool found = false, up = false, addr = false;
    const uint32_t want = ((const struct sockaddr_in *)&a->addr.sa)->sin_addr.s_addr;
    for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (strncmp(i->ifa_name, a->ifname, sizeof a->ifname - 1)) continue;
        found = true;
        up |= (i->ifa_flags & IFF_UP) && (i->ifa_flags & IFF_RUNNING);
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == want)
            addr = true;
    }
    freeifaddrs(ifs);
    char as[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &((const struct sockaddr_in *)&a->addr.sa)->sin_addr, as, sizeof as);
    if (!found) snprintf(buf, len, "interface %s is gone", a->ifname);
    else if (!up) snprintf(buf, len, "interface %s is down", a->ifname);
    else if (!addr) snprintf(buf, len, "address %s was removed from %s", as, a->ifname);
    return found && up && addr;
}

void zccl__rails_live(const zccl_rails_t *r, char *buf, size_t len) {
    size_t l = 0;
    if (len) buf[0] = 0;
    for (int p = 0; r->ncommon && p < r->nranks && l < len; p++) {
        bool lost = false;
        for (int c = 0; c < r->ncommon[p]; c++) lost |= r->cdead[(size_t)p * ZCCL_RAIL_MAX + (size_t)c] != 0;
        if (!lost) continue;
        l += (size_t)snprintf(buf + l, len - l, "%srank %d: live", l ? "; " : "", p);
        for (int c = 0; c < r->ncommon[p] && l < len; c++) {
            const zccl_rail_addr_t *a = &r->tc->peers[r->tc->rank].tcp.rail[r->cmine[(size_t)p * ZCCL_RAIL_MAX + (size_t)c]];
            if (!r->cdead[(size_t)p * ZCCL_RAIL_MAX + (size_t)c]) l += (size_t)snprintf(buf + l, len - l, " %s", a->ifname);
        }
        for (int c = 0; c < r->ncommon[p] && l < len; c++) {
            const zccl_rail_addr_t *a = &r->tc->peers[r->tc->rank].tcp.rail[r->cmine[(size_t)p * ZCCL_RAIL_MAX + (size_t)c]];
            if (r->cdead[(size_t)p * ZCCL_RAIL_MAX + (size_t)c]) l += (size_t)snprintf(buf + l, len - l, " (%s lost)", a->ifname);
        }
    }
}

int zccl__rails_take_in(zccl_rails_t *r, int peer, int k) {
    zccl_tp_comm_t *tc = r->tc;
    pthread_mutex_lock(&tc->in_mutex);
    int *slot = &r->in_fd[(size_t)peer * ZCCL_TCP_SOCKS_MAX + (size_t)k];
    const int fd = *slot;
    *slot = -1;
    pthread_mutex_unlock(&tc->in_mutex);
    return fd;
}

void zccl__rails_poison(zccl_rails_t *r) {
    if (!r || !r->in_fd) return;
    zccl__lanes_poison(r);
    pthread_mutex_lock(&r->tc->in_mutex);
    r->poisoned = true; /* lanes that move here from now on are refused */
    for (size_t i = 0; i < (size_t)r->nranks * ZCCL_TCP_SOCKS_MAX; i++) {
        if (r->in_fd[i] >= 0) shutdown(r->in_fd[i], SHUT_RDWR);
        if (r->resume_fd && r->resume_fd[i] >= 0) shutdown(r->resume_fd[i], SHUT_RDWR);
    }
    pthread_mutex_unlock(&r->tc->in_mutex);
}

void zccl__rails_free(zccl_rails_t *r) {
    if (!r) return;
    if (r->stop_pipe[1] >= 0 && write(r->stop_pipe[1], "x", 1) < 0) { /* the threads also stop when the pipe closes */ }
    for (int i = 0; i < r->nthr; i++) pthread_join(r->thr[i], NULL);
    for (int i = 0; i < ZCCL_RAIL_MAX; i++)
        if (r->listen_fd[i] >= 0) close(r->listen_fd[i]);
    if (r->stop_pipe[0] >= 0) close(r->stop_pipe[0]);
    if (r->stop_pipe[1] >= 0) close(r->stop_pipe[1]);
    zccl__lanes_free(r);
    for (size_t i = 0; i < (size_t)r->nranks * ZCCL_TCP_SOCKS_MAX; i++) {
        if (r->in_fd && r->in_fd[i] >= 0) close(r->in_fd[i]);
        if (r->resume_fd && r->resume_fd[i] >= 0) close(r->resume_fd[i]);
    }
    free(r->in_fd);
    free(r->resume_fd);
    free((void *)r->resume_pending);
    free(r->ncommon);
    free(r->cmine);
    free(r->ctheirs);
    free(r->cdead);
    free(r->nsock);
    free(r->send_rail);
    free(r->send_prail);
    free(r);
}

void zccl__tcp_rails_describe(const zccl_tp_comm_t *comm, char *buf, size_t len, int *nrails, int *max_socks) {
    const zccl_rails_t *r = zccl__tcp_rails(comm);
    int ms = 0;
    size_t l = 0;
    if (len) buf[0] = 0;
    if (!r || r->n == 0) {
        if (len) snprintf(buf, len, "one TCP connection per direction (no rails)");
        if (nrails) *nrails = r ? r->n : 0;
        if (max_socks) *max_socks = 1;
        return;
    }
    for (int i = 0; i < r->n && l < len; i++) {
        char sn[40];
        l += (size_t)snprintf(buf + l, len - l, "%s%s %s", i ? ", " : "", r->mine[i].ifname, subnet_str(&r->mine[i], sn, sizeof sn));
    }
    for (int p = 0; p < r->nranks; p++) ms = ZCCL_MAX(ms, r->nsock ? r->nsock[p] : 0);
    if (l < len) l += (size_t)snprintf(buf + l, len - l, "; up to %d socket%s per direction of a pair", ZCCL_MAX(ms, 1), ms > 1 ? "s" : "");
    if (l < len) {
        char live[256];
        zccl__rails_live(r, live, sizeof live);
        if (live[0]) snprintf(buf + l, len - l, "; %s", live);
    }
    if (nrails) *nrails = r->n;
    if (max_socks) *max_socks = ZCCL_MAX(ms, 1);
}
