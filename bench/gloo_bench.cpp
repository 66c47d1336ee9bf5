// gloo_bench — Gloo (Debian's libgloo-dev) collectives over its TCP transport, timed over a size sweep and printed
// as the nccl-tests table that zccl-bench and mpi_bench print, so bench/compare can put Gloo next to zccl and MPI.
//
//   gloo_bench OP [-b SIZE] [-e SIZE] [-f F] [-n ITERS] [-w WARMUP] [-c 0|1] [--algo A] [-d float] [-o sum]
//
// OP: allreduce | reduce_scatter | allgather. A (allreduce only): ring, ring_chunked (default), halving_doubling,
// bcube. One process is one rank: run it under zcclrun (RANK, WORLD_SIZE; also across namespace hosts with
// zcclrun --hostfile) or any launcher that sets RANK/WORLD_SIZE or OMPI_COMM_WORLD_RANK/SIZE.
// Rendezvous: gloo::rendezvous::FileStore in GLOO_STORE_DIR (a directory every rank can see; required), under the
// key prefix GLOO_PREFIX (default: ZCCL_SECRET and MASTER_PORT, which zcclrun makes unique per job).
// Transport: gloo::transport::tcp bound to interface GLOO_IFACE (default: the first up, non-loopback interface with
// an IPv4 address, else lo).
//
// Units as nccl-tests: size = bytes of the largest buffer (count*4 for allreduce; count*nranks*4 for allgather and
// reduce_scatter, whose count is per rank: size/4/nranks rounded down to a multiple of 4 elements); time = mean µs per
// call over -n calls after -w warm-up calls and a barrier, maximum over ranks; algbw = size/time; busbw = algbw x
// 2(n-1)/n (allreduce) or (n-1)/n (allgather, reduce_scatter). Gloo's allreduce and reduce-scatter algorithms work in
// place on their buffer, so both column groups time the same call ("out-of-place" is the in-place call); allgather
// is out-of-place and times the same call twice. Each algorithm object is built once per size (buffers and pairs
// set up) and run repeatedly, as a training loop reusing its buckets would.
// -c 1: afterwards, once per size, inputs are refilled with small integers (exact in float32 in any summation order),
// the collective runs once and every output element is compared with the value computed here; #wrong is summed
// over ranks and the exit status is 1 if any was wrong.
#include <gloo/allgather.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

bool parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return false;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return false;
    *out = (size_t)v;
    return true;
}

int env_int(const char *a, const char *b, int dflt) {
    const char *v = getenv(a);
    if (!v || !*v) v = getenv(b);
    return v && *v ? atoi(v) : dflt;
}

std::string default_iface() {
    struct ifaddrs *ifa = nullptr;
    std::string name = "lo";
    if (getifaddrs(&ifa) != 0) return name;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
            !(i->ifa_flags & IFF_LOOPBACK)) {
            name = i->ifa_name;
            break;
        }
    }
    freeifaddrs(ifa);
    return name;
}

void usage(FILE *f) {
    fprintf(f, "usage: gloo_bench allreduce|reduce_scatter|allgather [-b SIZE] [-e SIZE] [-f F] [-n ITERS] [-w WARMUP]\n"
               "                  [-c 0|1] [--algo ring|ring_chunked|halving_doubling|bcube] [-d float] [-o sum]\n"
               "environment: RANK, WORLD_SIZE (or OMPI_COMM_WORLD_*), GLOO_STORE_DIR (required), GLOO_PREFIX,\n"
               "             GLOO_IFACE; see the comment at the top of bench/gloo_bench.cpp\n");
}

// One size of one collective: run() does the call on the buffers prepared for it.
struct Case {
    size_t bytes = 0;   // the "size" column
    size_t count = 0;   // the "count" column (per rank for allgather/reduce_scatter)
    std::vector<float> buf, out;
    std::function<void()> run;
};

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const std::string op = argv[1];
    if (op != "allreduce" && op != "reduce_scatter" && op != "allgather") {
        fprintf(stderr, "gloo_bench: unknown collective '%s'\n", op.c_str());
        usage(stderr);
        return 2;
    }
    size_t minb = 32u << 20, maxb = 32u << 20;
    long factor = 2, iters = 20, warmup = 5, check = 1;
    std::string algo = "ring_chunked";
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "gloo_bench: option %s needs a value\n", a.c_str());
            return 2;
        }
        const char *v = argv[++i];
        bool ok = true;
        if (a == "-b") ok = parse_size(v, &minb);
        else if (a == "-e") ok = parse_size(v, &maxb);
        else if (a == "-f") ok = (factor = atol(v)) >= 2;
        else if (a == "-n") ok = (iters = atol(v)) >= 1;
        else if (a == "-w") ok = (warmup = atol(v)) >= 0;
        else if (a == "-c") ok = (check = atol(v)) == 0 || check == 1;
        else if (a == "--algo") algo = v;
        else if (a == "-d") ok = !strcmp(v, "float") || !strcmp(v, "float32");
        else if (a == "-o") ok = !strcmp(v, "sum");
        else {
            fprintf(stderr, "gloo_bench: unknown option %s\n", a.c_str());
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "gloo_bench: bad value '%s' for %s (-d float and -o sum are the only type and op)\n", v,
                    a.c_str());
            return 2;
        }
    }
    if (algo != "ring" && algo != "ring_chunked" && algo != "halving_doubling" && algo != "bcube") {
        fprintf(stderr, "gloo_bench: --algo must be ring, ring_chunked, halving_doubling or bcube (got '%s')\n",
                algo.c_str());
        return 2;
    }
    if (minb < 1 || minb > maxb) {
        fprintf(stderr, "gloo_bench: need 1 <= -b <= -e\n");
        return 2;
    }
    const int rank = env_int("RANK", "OMPI_COMM_WORLD_RANK", 0);
    const int size = env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
    const char *dir = getenv("GLOO_STORE_DIR");
    if (!dir || !*dir) {
        fprintf(stderr, "gloo_bench: set GLOO_STORE_DIR to a directory all ranks share (the rendezvous FileStore)\n");
        return 2;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        fprintf(stderr, "gloo_bench: RANK %d / WORLD_SIZE %d out of range\n", rank, size);
        return 2;
    }
    std::string prefix;
    if (const char *p = getenv("GLOO_PREFIX")) prefix = p;
    else prefix = std::string(getenv("ZCCL_SECRET") ? getenv("ZCCL_SECRET") : "gloo") + "-" +
                  (getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "0");
    const char *ifenv = getenv("GLOO_IFACE");
    gloo::transport::tcp::attr attr;
    attr.iface = ifenv && *ifenv ? ifenv : default_iface();

    std::shared_ptr<gloo::rendezvous::Context> ctx;
    try {
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore fstore(dir);
        gloo::rendezvous::PrefixStore store(prefix, fstore);
        ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
        ctx->setTimeout(std::chrono::seconds(120));
        ctx->connectFullMesh(store, dev);
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_bench: rank %d: Gloo setup failed (interface %s, store %s): %s\n", rank,
                attr.iface.c_str(), dir, e.what());
        return 1;
    }
    std::shared_ptr<gloo::Context> gctx = ctx;
    gloo::BarrierAllToAll barrier(gctx);

    // max over ranks of one double (time), and sum over ranks of one count (#wrong)
    auto reduce_scalar = [&](double v, bool is_max) {
        std::vector<double> x(1, v);
        std::vector<double *> ptrs{x.data()};
        gloo::AllreduceRing<double> ar(gctx, ptrs, 1,
                                       is_max ? gloo::ReductionFunction<double>::max
                                              : gloo::ReductionFunction<double>::sum);
        ar.run();
        return x[0];
    };

    // Size every pair's socket send buffer before timing anything. Gloo's TCP pair sets SO_SNDBUF to the size of
    // the first message that goes through Pair::send (here a 52-byte notification), which also switches off the
    // kernel's send-buffer autotuning; only a later, larger message through the same call raises it again. The
    // unbound-buffer sends of gloo::allgather never do, so without this every allgather crawls through a 4.6 KB send
    // buffer and stalls on 40 ms delayed ACKs (strace: writev EAGAIN, then epoll_wait for 40 ms), 6 MB/s at 1 MiB.
    // One 1 MiB message each way on every pair (Gloo's own pinned-buffer send, as its ring all-reduces use) lifts
    // the buffer to the kernel's maximum (net.core.wmem_max, doubled) before the first timed call.
    try {
        const size_t prime_bytes = (size_t)1 << 20;
        std::vector<char> out(prime_bytes, 0);
        std::vector<std::vector<char>> in;
        std::vector<std::unique_ptr<gloo::transport::Buffer>> sends, recvs;
        const int slot = (int)gctx->nextSlot();
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            in.emplace_back(prime_bytes, 0);
            auto &pair = gctx->getPair(peer);
            recvs.push_back(pair->createRecvBuffer(slot, in.back().data(), prime_bytes));
            sends.push_back(pair->createSendBuffer(slot, out.data(), prime_bytes));
        }
        barrier.run(); // every rank's receive buffers exist before any send
        for (auto &b : sends) b->send();
        for (auto &b : recvs) b->waitRecv();
        for (auto &b : sends) b->waitSend();
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_bench: rank %d: sizing the send buffers failed: %s\n", rank, e.what());
        return 1;
    }

    const bool gather_like = op != "allreduce";
    if (rank == 0) {
        printf("# gloo_bench %s (Gloo TCP transport, interface %s, %d ranks%s%s)\n", op.c_str(), attr.iface.c_str(),
               size, op == "allreduce" ? ", algorithm " : "", op == "allreduce" ? algo.c_str() : "");
        printf("# %s\n", gather_like && op == "reduce_scatter" ? "reduce_scatter: gloo::ReduceScatterHalvingDoubling, in place"
                         : op == "allgather" ? "allgather: gloo::allgather (ring), out-of-place"
                                             : "allreduce works in place: both column groups time the same call");
        printf("#%11s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
               "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
        printf("#%11s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
               "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
        fflush(stdout);
    }
    long total_wrong = 0;
    int sweep_index = 0;
    for (size_t s = minb; s <= maxb; s *= (size_t)factor, sweep_index++) {
        Case c;
        std::unique_ptr<gloo::Algorithm> alg;
        if (!gather_like) {
            c.count = s / sizeof(float);
            c.bytes = c.count * sizeof(float);
        } else {
            c.count = s / sizeof(float) / (size_t)size / 4 * 4;
            c.bytes = c.count * (size_t)size * sizeof(float);
        }
        if (c.count == 0) continue;
        try {
            if (op == "allreduce") {
                c.buf.assign(c.count, 1.0f);
                std::vector<float *> ptrs{c.buf.data()};
                const int n = (int)c.count;
                if (algo == "ring") alg.reset(new gloo::AllreduceRing<float>(gctx, ptrs, n));
                else if (algo == "ring_chunked") alg.reset(new gloo::AllreduceRingChunked<float>(gctx, ptrs, n));
                else if (algo == "halving_doubling") alg.reset(new gloo::AllreduceHalvingDoubling<float>(gctx, ptrs, n));
                else alg.reset(new gloo::AllreduceBcube<float>(gctx, ptrs, n));
                gloo::Algorithm *a = alg.get();
                c.run = [a] { a->run(); };
            } else if (op == "reduce_scatter") {
                c.buf.assign(c.count * (size_t)size, 1.0f);
                std::vector<float *> ptrs{c.buf.data()};
                std::vector<int> recv((size_t)size, (int)c.count);
                alg.reset(new gloo::ReduceScatterHalvingDoubling<float>(gctx, ptrs, (int)(c.count * (size_t)size), recv));
                gloo::Algorithm *a = alg.get();
                c.run = [a] { a->run(); };
            } else {
                c.buf.assign(c.count, 1.0f);
                c.out.assign(c.count * (size_t)size, 0.0f);
                Case *cp = &c;
                std::shared_ptr<gloo::Context> g = gctx;
                const uint32_t tag = (uint32_t)sweep_index; // a tag per size: no mix-up with the previous size's calls
                c.run = [cp, g, tag] {
                    gloo::AllgatherOptions opts(g);
                    opts.setTag(tag);
                    opts.setInput(cp->buf.data(), cp->count);
                    opts.setOutput(cp->out.data(), cp->count * (size_t)g->size);
                    gloo::allgather(opts);
                };
            }
            for (long i = 0; i < warmup; i++) c.run();
            barrier.run();
            auto t0 = Clock::now();
            for (long i = 0; i < iters; i++) c.run();
            double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / (double)iters;
            us = reduce_scalar(us, true);

            long wrong = 0;
            if (check) {
                // input of rank r, element i: (r + 1) * (i % 13 + 1), small integers
                const size_t total = gather_like ? c.count * (size_t)size : c.count;
                for (size_t i = 0; i < total && !(op == "allgather" && i >= c.count); i++)
                    c.buf[i] = (float)((rank + 1) * (int)(i % 13 + 1));
                const float rsum = (float)size * (float)(size + 1) / 2.0f; // sum over r of (r + 1)
                c.run();
                if (op == "allreduce") {
                    for (size_t i = 0; i < c.count; i++) wrong += c.buf[i] != rsum * (float)(i % 13 + 1);
                } else if (op == "reduce_scatter") {
                    // this rank's block (elements rank*count ... of the input), reduced, lands at the start of the
                    // buffer (Gloo's distribution phase copies it to offset 0)
                    for (size_t j = 0; j < c.count; j++) {
                        size_t i = (size_t)rank * c.count + j;
                        wrong += c.buf[j] != rsum * (float)(i % 13 + 1);
                    }
                } else {
                    for (int r = 0; r < size; r++)
                        for (size_t i = 0; i < c.count; i++)
                            wrong += c.out[(size_t)r * c.count + i] != (float)((r + 1) * (int)(i % 13 + 1));
                }
                wrong = (long)reduce_scalar((double)wrong, false);
                total_wrong += wrong;
            }
            if (rank == 0) {
                const double algbw = (double)c.bytes / us / 1e3;
                const double f = gather_like ? (double)(size - 1) / size : 2.0 * (size - 1) / size;
                char w[32];
                if (check) snprintf(w, sizeof w, "%ld", wrong); else snprintf(w, sizeof w, "N/A");
                printf("%12zu %12zu %8s %6s %6d %9.1f %7.2f %7.2f %6s %9.1f %7.2f %7.2f %6s\n", c.bytes, c.count,
                       "float", "sum", -1, us, algbw, algbw * f, w, us, algbw, algbw * f, w);
                fflush(stdout);
            }
        } catch (const std::exception &e) {
            fprintf(stderr, "gloo_bench: rank %d: %s at %zu bytes failed: %s\n", rank, op.c_str(), c.bytes, e.what());
            return 1;
        }
    }
    if (rank == 0) printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    // A rank that finishes first would close its pairs while a peer may still be taking in the last message of
    // the last call ("Connection closed by peer" there): meet once more and give the last bytes time to land.
    try {
        barrier.run();
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_bench: rank %d: final barrier failed: %s\n", rank, e.what());
        return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return total_wrong ? 1 : 0;
}
