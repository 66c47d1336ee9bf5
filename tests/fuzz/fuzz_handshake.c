/*
 * fuzz_handshake.c — libFuzzer target for everything zccl parses from the network before and right after a
 * connection proves the job's secret (util/socket.h "wire messages", lib/core/bootstrap.c header decoders), and for the
 * unique-id decoder (ids travel out of band, through files and environment variables).
 *
 * Input: byte 0 selects the decoder, the rest is its input. Besides "no crash, no sanitizer report", each case
 * checks properties of the decoder: what a decoder accepts satisfies every limit it promises (ranks in range,
 * strings terminated, addresses well-formed), and what an encoder produces the decoder accepts unchanged.
 * A violated property calls __builtin_trap(), which libFuzzer reports as a crash.
 *
 * Built by tests/fuzz/run.sh with clang -fsanitize=fuzzer,address,undefined. bootstrap.c is included (not linked)
 * so that its static decoders (root hello, peer info) are reachable; the other sources are linked.
 * With ZCCL_FUZZ_MAKE_SEEDS=DIR in the environment the binary writes a seed corpus (one valid input per decoder,
 * plus a few near misses) into DIR and exits.
 */
#include "../../lib/core/bootstrap.c"

#include <stdlib.h>
#include <sys/stat.h>

#define CHECK(cond)                                                                                            \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            fprintf(stderr, "fuzz_handshake: property violated at line %d: %s\n", __LINE__, #cond);            \
            __builtin_trap();                                                                                  \
        }                                                                                                      \
    } while (0)

enum { SEL_HELLO, SEL_CHAL, SEL_PROOF, SEL_ROOT_HELLO, SEL_CONN_HDR, SEL_UNIQUE_ID, SEL_SOCKADDR, SEL_COUNT };

/* Fixed protocol state for the MAC checks: fuzz inputs play the peer's message. */
static const uint8_t k_secret[ZCCL_SECRET_BYTES] = {0x5e, 0xc2, 0xe7, 0x01, 0x02, 0x03, 0x04, 0x05,
                                                    0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d};
static const uint8_t k_nonce_c[ZCCL_NONCE_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t k_nonce_s[ZCCL_NONCE_BYTES] = {0xf0, 0xe1, 0xd2, 0xc3, 0xb4, 0xa5, 0x96, 0x87,
                                                    0x78, 0x69, 0x5a, 0x4b, 0x3c, 0x2d, 0x1e, 0x0f};
#define K_COMM_ID 0x0123456789abcdefull
#define K_MY_RANK 1
#define K_NRANKS 4

static bool reason_ok(const char *why) { return why && why[0] && strlen(why) < 200; }

static void fuzz_hello(const uint8_t *d, size_t n) {
    uint8_t nonce[ZCCL_NONCE_BYTES];
    const char *why = NULL;
    if (zccl__hello_decode(d, n, nonce, &why) == ZCCL_SUCCESS) {
        uint8_t again[ZCCL_HELLO_BYTES];
        zccl__hello_encode(nonce, again);
        CHECK(n == ZCCL_HELLO_BYTES && memcmp(again, d, n) == 0); /* accepted == exactly what a client sends */
    } else {
        CHECK(reason_ok(why));
    }
}

static void fuzz_chal(const uint8_t *d, size_t n) {
    uint8_t nonce_s[ZCCL_NONCE_BYTES];
    const char *why = NULL;
    if (zccl__chal_check(k_secret, k_nonce_c, d, n, nonce_s, &why) == ZCCL_SUCCESS) {
        uint8_t expect[ZCCL_CHAL_BYTES];
        zccl__chal_encode(k_secret, k_nonce_c, nonce_s, expect);
        CHECK(n == ZCCL_CHAL_BYTES && memcmp(expect, d, n) == 0);
    } else {
        CHECK(reason_ok(why));
    }
}

static void fuzz_proof(const uint8_t *d, size_t n) {
    uint8_t expect[ZCCL_MAC_BYTES];
    zccl__proof_encode(k_secret, k_nonce_s, k_nonce_c, expect);
    bool ok = zccl__proof_check(k_secret, k_nonce_s, k_nonce_c, d, n);
    CHECK(ok == (n == ZCCL_MAC_BYTES && memcmp(expect, d, n) == 0));
    /* The same bytes never prove the secret for the other order of nonces (a replay across roles). */
    if (ok) CHECK(!zccl__proof_check(k_secret, k_nonce_c, k_nonce_s, d, n));
}

static void check_peer_info(const zccl_peer_info_t *p, int32_t rank) {
    CHECK(p->rank == rank && p->pid > 0);
    CHECK(p->listen.sa.ss_family == AF_INET || p->listen.sa.ss_family == AF_INET6);
    CHECK(p->listen.len == (p->listen.sa.ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                                              : sizeof(struct sockaddr_in6)));
    CHECK(memchr(p->shm_name, 0, sizeof p->shm_name) != NULL);
    CHECK(p->loc.npus >= 0 && p->loc.package >= -1 && p->loc.numa >= -1 && p->loc.core >= -1);
    char buf[80];
    zccl__sockaddr_str(&p->listen, buf, sizeof buf); /* what the library does next with an address: print it */
    CHECK(memchr(buf, 0, sizeof buf) != NULL);
}

static void fuzz_root_hello(const uint8_t *d, size_t n) {
    /* The first byte of the input picks the root's state: no rank admitted yet, or nranks known. */
    int known = -1;
    if (n > 0) {
        known = d[0] < 128 ? -1 : (d[0] & 7) + 1;
        d++, n--;
    }
    root_hello_t h;
    const char *why = NULL;
    int st = root_hello_decode(d, n, known, &h, &why);
    CHECK(st >= ROOT_OK && st <= ROOT_MALFORMED && st != ROOT_TAKEN);
    if (st == ROOT_OK) {
        CHECK(n == sizeof h);
        CHECK(h.nranks >= 1 && h.nranks <= ROOT_MAX_NRANKS && (known < 0 || h.nranks == known));
        CHECK(h.rank >= 0 && h.rank < h.nranks);
        check_peer_info(&h.info, h.rank);
    } else {
        CHECK(reason_ok(why));
    }
}

static void fuzz_conn_hdr(const uint8_t *d, size_t n) {
    int from = -7;
    const char *why = NULL;
    if (zccl__conn_hdr_decode(d, n, K_COMM_ID, K_MY_RANK, K_NRANKS, &from, &why) == ZCCL_SUCCESS) {
        CHECK(n == sizeof(zccl_conn_hdr_t));
        CHECK(from >= 0 && from < K_NRANKS && from != K_MY_RANK);
    } else {
        CHECK(from == -7 && reason_ok(why));
    }
}

static void fuzz_unique_id(const uint8_t *d, size_t n) {
    zccl_unique_id_t id;
    memset(&id, 0, sizeof id);
    memcpy(id.internal, d, n < sizeof id.internal ? n : sizeof id.internal);
    zccl_id_info_t info;
    if (zccl__id_decode(&id, &info) == ZCCL_SUCCESS) {
        CHECK(info.root.sa.ss_family == AF_INET || info.root.sa.ss_family == AF_INET6);
        CHECK(info.root.len == (info.root.sa.ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                                                  : sizeof(struct sockaddr_in6)));
        char host[64];
        int port = -1;
        CHECK(zccl__unique_id_address(&id, host, sizeof host, &port) == ZCCL_SUCCESS);
        CHECK(port >= 0 && port <= 65535 && memchr(host, 0, sizeof host) != NULL);
        /* Re-encoding what was decoded gives an id that decodes to the same root and secret. */
        zccl_unique_id_t id2;
        zccl__id_encode(&info.root, info.secret, &id2);
        zccl_id_info_t info2;
        CHECK(zccl__id_decode(&id2, &info2) == ZCCL_SUCCESS);
        CHECK(info2.root.len == info.root.len && memcmp(&info2.root.sa, &info.root.sa, info.root.len) == 0);
        CHECK(memcmp(info2.secret, info.secret, ZCCL_SECRET_BYTES) == 0);
    } else {
        CHECK(zccl__last_error()[0] != 0);
    }
}

static void fuzz_sockaddr(const uint8_t *d, size_t n) {
    zccl_sockaddr_t a;
    memset(&a, 0, sizeof a);
    memcpy(&a, d, n < sizeof a ? n : sizeof a);
    const char *why = NULL;
    if (zccl__sockaddr_check(&a, &why) == ZCCL_SUCCESS) {
        CHECK(a.len == sizeof(struct sockaddr_in) || a.len == sizeof(struct sockaddr_in6));
    } else {
        CHECK(reason_ok(why));
    }
    char buf[80];
    zccl__sockaddr_str(&a, buf, sizeof buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    switch (data[0] % SEL_COUNT) {
    case SEL_HELLO: fuzz_hello(d, n); break;
    case SEL_CHAL: fuzz_chal(d, n); break;
    case SEL_PROOF: fuzz_proof(d, n); break;
    case SEL_ROOT_HELLO: fuzz_root_hello(d, n); break;
    case SEL_CONN_HDR: fuzz_conn_hdr(d, n); break;
    case SEL_UNIQUE_ID: fuzz_unique_id(d, n); break;
    case SEL_SOCKADDR: fuzz_sockaddr(d, n); break;
    }
    return 0;
}

/* ---- seed corpus ------------------------------------------------------------------------------------------- */

static void write_seed(const char *dir, const char *name, int sel, const void *body, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    uint8_t s = (uint8_t)sel;
    fwrite(&s, 1, 1, f);
    if (n) fwrite(body, 1, n, f);
    fclose(f);
}

static zccl_sockaddr_t loopback(int port) {
    zccl_sockaddr_t a;
    memset(&a, 0, sizeof a);
    zccl__resolve("127.0.0.1", port, &a); /* numeric: cannot fail */
    return a;
}

static void make_seeds(const char *dir) {
    mkdir(dir, 0755);
    uint8_t hello[ZCCL_HELLO_BYTES];
    zccl__hello_encode(k_nonce_c, hello);
    write_seed(dir, "hello_valid", SEL_HELLO, hello, sizeof hello);
    write_seed(dir, "hello_truncated", SEL_HELLO, hello, 11);
    uint8_t chal[ZCCL_CHAL_BYTES];
    zccl__chal_encode(k_secret, k_nonce_c, k_nonce_s, chal);
    write_seed(dir, "chal_valid", SEL_CHAL, chal, sizeof chal);
    uint8_t proof[ZCCL_MAC_BYTES];
    zccl__proof_encode(k_secret, k_nonce_s, k_nonce_c, proof);
    write_seed(dir, "proof_valid", SEL_PROOF, proof, sizeof proof);

    uint8_t rh[1 + sizeof(root_hello_t)];
    root_hello_t h;
    memset(&h, 0, sizeof h);
    h.rank = 1;
    h.nranks = 2;
    h.info.rank = 1;
    h.info.pid = 4242;
    h.info.host_hash = 0x1234;
    h.info.listen = loopback(40000);
    h.info.loc.host = 0x1234;
    h.info.loc.package = h.info.loc.numa = h.info.loc.core = -1;
    rh[0] = 0; /* root state: no rank yet */
    memcpy(rh + 1, &h, sizeof h);
    write_seed(dir, "root_hello_first", SEL_ROOT_HELLO, rh, sizeof rh);
    rh[0] = 0x81; /* nranks known: 2 */
    write_seed(dir, "root_hello_known", SEL_ROOT_HELLO, rh, sizeof rh);
    strcpy(h.info.shm_name, "/zccl-0123-r1-p4242");
    memcpy(rh + 1, &h, sizeof h);
    write_seed(dir, "root_hello_shm", SEL_ROOT_HELLO, rh, sizeof rh);

    zccl_conn_hdr_t c = {K_COMM_ID, 2, ZCCL_CONN_DATA};
    write_seed(dir, "conn_hdr_valid", SEL_CONN_HDR, &c, sizeof c);

    zccl_unique_id_t id;
    zccl_sockaddr_t root = loopback(29500);
    zccl__id_encode(&root, k_secret, &id);
    write_seed(dir, "unique_id_valid", SEL_UNIQUE_ID, &id, sizeof id);
    write_seed(dir, "sockaddr_valid", SEL_SOCKADDR, &root, sizeof root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    unsetenv("ZCCL_DEBUG"); /* decoders of ids log through zccl__error: keep the fuzzer quiet */
    const char *seeds = getenv("ZCCL_FUZZ_MAKE_SEEDS");
    if (seeds && *seeds) {
        make_seeds(seeds);
        exit(0);
    }
    return 0;
}
