/*
 * socket.h — TCP helpers shared by the bootstrap and the TCP transport: address selection (ZCCL_SOCKET_IFNAME),
 * listening, and the authenticated connection handshake.
 *
 * Handshake (every connection, bootstrap and data; nothing else is parsed before it succeeds):
 *   client -> server  HELLO  = "ZCCLHELO" | u32 version | nonce_c[16]                          (28 bytes)
 *   server -> client  CHAL   = nonce_s[16] | HMAC-SHA256(secret, "S" | nonce_c | nonce_s)      (48 bytes)
 *   client -> server  PROOF  = HMAC-SHA256(secret, "C" | nonce_s | nonce_c) | header[hdr_bytes]
 * Both sides prove the secret with fresh nonces, so a recorded exchange cannot be replayed. The server checks the
 * proof before it looks at the header; a client that fails is closed and logged, never admitted.
 */
#ifndef ZCCL_SOCKET_H
#define ZCCL_SOCKET_H

#include <netinet/in.h>
#include <sys/socket.h>
#include "core.h"

#define ZCCL_SECRET_BYTES 16

typedef struct {
    struct sockaddr_storage sa;
    socklen_t len;
} zccl_sockaddr_t;

/** "host:port" text for logs. */
const char *zccl__sockaddr_str(const zccl_sockaddr_t *a, char *buf, size_t len);

/**
 * Picks the local address to listen on. With ZCCL_SOCKET_IFNAME set, the first interface matching it (NCCL
 * grammar: "eth,ib" prefixes; "^docker" excludes; "=eth0" exact). Otherwise, if `toward` is given, the source
 * address the kernel routes toward it; else the first up, non-loopback, non-docker interface, else loopback.
 * Errors name the interfaces that were tried.
 */
zccl_result_t zccl__pick_local_addr(const zccl_sockaddr_t *toward, zccl_sockaddr_t *out);

/** Whether interface `name` matches a ZCCL_SOCKET_IFNAME spec (NCCL's grammar: a comma-separated list of name
 *  prefixes; a leading '^' excludes the listed ones; '=' after it makes the names exact; an item's ":port" suffix is
 *  ignored). An empty spec matches nothing: callers treat "unset" themselves. */
bool zccl__ifname_match(const char *spec, const char *name);

/** Resolves host (name or numeric) and port into an address. */
zccl_result_t zccl__resolve(const char *host, int port, zccl_sockaddr_t *out);

/** Creates a listening socket bound to addr (port 0 = any port; addr updated with the bound port). */
zccl_result_t zccl__listen(zccl_sockaddr_t *addr, int *fd_out);
/** zccl__listen on a port that may be held for a moment by a connection about to go (a socket connected to itself on
 *  loopback, which zccl__connect_auth drops at once): EADDRINUSE is tried again every 50 ms for up to busy_ms. */
zccl_result_t zccl__listen_busy(zccl_sockaddr_t *addr, int *fd_out, int busy_ms);

/**
 * Connects to addr, retrying refused connections until deadline_ns (the peer may not listen yet), runs the
 * client side of the handshake and sends `hdr`. On success *fd_out is a connected, authenticated socket.
 * Errors: ZCCL_TIMEOUT (deadline), ZCCL_REMOTE_ERROR (the server failed to prove the secret or closed),
 * ZCCL_SYSTEM_ERROR.
 */
zccl_result_t zccl__connect_auth(const zccl_sockaddr_t *addr, const uint8_t secret[ZCCL_SECRET_BYTES],
                                 const void *hdr, size_t hdr_bytes, uint64_t deadline_ns, int *fd_out);
/** On this thread, zccl__connect_auth stops retrying a refused connection at until_ns (0: no such limit) if that
 *  comes before its deadline, returning ZCCL_TIMEOUT without a WARN line; a connection that is accepted still gets
 *  the whole deadline for its handshake. For callers that retry in slices and look around in between (bootstrap
 *  join). */
void zccl__connect_until(uint64_t until_ns);

/* ---- wire messages: pure encoders and validating decoders ------------------------------------------------------
 * No I/O, no logging, no global state: every input is a pointer and an explicit length, checked against the exact
 * size the protocol allows before anything is read. Decoders return ZCCL_SUCCESS, or ZCCL_INVALID_ARGUMENT with
 * *why (if why is not NULL) set to a static, human-readable reason. tests/fuzz/fuzz_handshake.c feeds them
 * random bytes. */
#define ZCCL_NONCE_BYTES 16
#define ZCCL_MAC_BYTES 32                                 /* HMAC-SHA256 */
#define ZCCL_HELLO_BYTES (8 + 4 + ZCCL_NONCE_BYTES)       /* 28 */
#define ZCCL_CHAL_BYTES (ZCCL_NONCE_BYTES + ZCCL_MAC_BYTES) /* 48 */
#define ZCCL_PROTO_VERSION 1u

/** Client: HELLO carrying nonce_c. */
void zccl__hello_encode(const uint8_t nonce_c[ZCCL_NONCE_BYTES], uint8_t out[ZCCL_HELLO_BYTES]);
/** Server: validates a HELLO (exactly ZCCL_HELLO_BYTES, magic "ZCCLHELO", version) and extracts nonce_c. */
zccl_result_t zccl__hello_decode(const uint8_t *buf, size_t len, uint8_t nonce_c[ZCCL_NONCE_BYTES], const char **why);
/** Server: CHAL = nonce_s | HMAC(secret, "S" | nonce_c | nonce_s). */
void zccl__chal_encode(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_c[ZCCL_NONCE_BYTES],
                       const uint8_t nonce_s[ZCCL_NONCE_BYTES], uint8_t out[ZCCL_CHAL_BYTES]);
/** Client: checks a CHAL (exactly ZCCL_CHAL_BYTES, MAC over our nonce_c, constant time); extracts nonce_s. */
zccl_result_t zccl__chal_check(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_c[ZCCL_NONCE_BYTES],
                               const uint8_t *chal, size_t len, uint8_t nonce_s[ZCCL_NONCE_BYTES], const char **why);
/** Client: PROOF = HMAC(secret, "C" | nonce_s | nonce_c). */
void zccl__proof_encode(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_s[ZCCL_NONCE_BYTES],
                        const uint8_t nonce_c[ZCCL_NONCE_BYTES], uint8_t out[ZCCL_MAC_BYTES]);
/** Server: true iff proof is exactly ZCCL_MAC_BYTES and equals the expected MAC (constant-time comparison). */
bool zccl__proof_check(const uint8_t secret[ZCCL_SECRET_BYTES], const uint8_t nonce_s[ZCCL_NONCE_BYTES],
                       const uint8_t nonce_c[ZCCL_NONCE_BYTES], const uint8_t *proof, size_t len);

/**
 * Validates a rank-to-rank header (zccl_conn_hdr_t of comm.h, the header after the PROOF on a data connection)
 * received by rank my_rank of an nranks communicator comm_id: exact length, communicator id, kind, sender rank in
 * [0, nranks) and not my_rank. On success *from_rank is the sender. Defined in bootstrap.c next to the root
 * hello's decoder, where the layouts of comm.h are known.
 */
zccl_result_t zccl__conn_hdr_decode(const void *buf, size_t len, uint64_t comm_id, int my_rank, int nranks,
                                    int *from_rank, const char **why);

/** Validates a socket address from the wire: family AF_INET or AF_INET6, length exactly that family's, port != 0. */
zccl_result_t zccl__sockaddr_check(const zccl_sockaddr_t *a, const char **why);

/**
 * Server side: runs a poll loop on listen_fd that accepts connections and runs every handshake concurrently
 * (a slow or hostile client cannot stall the others; each has ZCCL_HANDSHAKE_MS to finish). For each client
 * that proves the secret, calls on_conn(ctx, fd, hdr, hdr_bytes) with its header (not yet validated: on_conn
 * decodes it with one of the decoders above); on_conn takes ownership of fd and returns nonzero to stop the loop.
 * The loop also stops when stop_fd becomes readable (if >= 0) or at deadline_ns (if nonzero: ZCCL_TIMEOUT).
 * If `ready` is not NULL it is set (release) once the loop's own allocations are done, so that a caller that forks
 * right after starting the loop in a thread can wait for it (a child forked while another thread allocates can
 * inherit a held allocator lock, which gcc 12's AddressSanitizer does not guard against).
 */
typedef int (*zccl_on_conn_fn)(void *ctx, int fd, const void *hdr, size_t hdr_bytes);
zccl_result_t zccl__accept_loop(int listen_fd, int stop_fd, const uint8_t secret[ZCCL_SECRET_BYTES],
                                size_t hdr_bytes, zccl_on_conn_fn on_conn, void *ctx, uint64_t deadline_ns,
                                int *ready);
#define ZCCL_HANDSHAKE_MS 5000
#define ZCCL_MAX_HDR_BYTES 4096

/** Blocking full send/recv with a deadline (0 = none). ZCCL_REMOTE_ERROR on EOF/reset, naming `what`. */
zccl_result_t zccl__send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns, const char *what);
zccl_result_t zccl__recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *what);

void zccl__sock_tune(int fd); /* TCP_NODELAY, close-on-exec */

#endif
