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

/** Resolves host (name or numeric) and port into an address. */
zccl_result_t zccl__resolve(const char *host, int port, zccl_sockaddr_t *out);

/** Creates a listening socket bound to addr (port 0 = any port; addr updated with the bound port). */
zccl_result_t zccl__listen(zccl_sockaddr_t *addr, int *fd_out);

/**
 * Connects to addr, retrying refused connections until deadline_ns (the peer may not listen yet), runs the
 * client side of the handshake and sends `hdr`. On success *fd_out is a connected, authenticated socket.
 * Errors: ZCCL_TIMEOUT (deadline), ZCCL_REMOTE_ERROR (the server failed to prove the secret or closed),
 * ZCCL_SYSTEM_ERROR.
 */
zccl_result_t zccl__connect_auth(const zccl_sockaddr_t *addr, const uint8_t secret[ZCCL_SECRET_BYTES],
                                 const void *hdr, size_t hdr_bytes, uint64_t deadline_ns, int *fd_out);

/**
 * Server side: runs a poll loop on listen_fd that accepts connections and runs every handshake concurrently
 * (a slow or hostile client cannot stall the others; each has ZCCL_HANDSHAKE_MS to finish). For each client
 * that proves the secret, calls on_conn(ctx, fd, hdr) with its hdr_bytes header; on_conn takes ownership of fd
 * and returns nonzero to stop the loop. The loop also stops when stop_fd becomes readable (if >= 0) or at
 * deadline_ns (if nonzero: ZCCL_TIMEOUT).
 */
typedef int (*zccl_on_conn_fn)(void *ctx, int fd, const void *hdr);
zccl_result_t zccl__accept_loop(int listen_fd, int stop_fd, const uint8_t secret[ZCCL_SECRET_BYTES],
                                size_t hdr_bytes, zccl_on_conn_fn on_conn, void *ctx, uint64_t deadline_ns);
#define ZCCL_HANDSHAKE_MS 5000
#define ZCCL_MAX_HDR_BYTES 4096

/** Blocking full send/recv with a deadline (0 = none). ZCCL_REMOTE_ERROR on EOF/reset, naming `what`. */
zccl_result_t zccl__send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns, const char *what);
zccl_result_t zccl__recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *what);

void zccl__sock_tune(int fd); /* TCP_NODELAY, close-on-exec */

#endif
