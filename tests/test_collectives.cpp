/*
 * test_collectives.cpp — conformance suite for every collective of include/zccl.h.
 *
 * Matrix (CollectivesMatrix, one multi-process run per (transport, nranks), transport in {shm, tcp} through
 * ZCCL_TRANSPORT, nranks in {1, 2, 3, 4, 5, 8}); the body of each run loops over every combination and counts
 * failures, printing the first few:
 *   allreduce, reduce_scatter, reduce: 10 datatypes x 5 ops x counts {0, 1, 2, 7, 1023} x {out-of-place, in-place}
 *   allgather, broadcast:               10 datatypes x counts {0, 1, 2, 7, 1023} x {out-of-place, in-place}
 *   broadcast and reduce roots:         every root for counts {0, 1, 2, 7}; roots {nranks/2, nranks-1} for 1023
 *   send/recv:                          10 datatypes x counts {0, 1, 2, 7, 1023} x every shift k in [0, nranks)
 *                                       (rank r sends to r+k and receives from r-k; k = 0 is a send to self,
 *                                       queued with its receive on one stream)
 *   barrier:                            20 barriers checked with a counter in shared memory
 *   inexact float32/float64 sums:       tolerance (nranks-1)*eps*sum|x| and bitwise-identical results on all ranks
 * Count 1000003 (kLarge) runs a reduced subset by default (ZCCL_TEST_FULL=1 runs everything at 1000003 too):
 *   allreduce and reduce:  all 10 datatypes with SUM; float16, bfloat16, float32, int64 with PROD, MAX, MIN, AVG;
 *                          allreduce in-place and out-of-place; reduce once per (dtype, op), at a root alternating
 *                          between nranks/2 and nranks-1 and alternately in-place and out-of-place
 *   reduce_scatter (recvcount 1000003): uint8, float16, bfloat16, float32, int64 with SUM; float32 with PROD, MAX,
 *                          MIN, AVG; in-place and out-of-place
 *   allgather (sendcount 1000003) and broadcast (roots nranks/2 and nranks-1): int8, float16, float32, float64
 *   send/recv: int8 and float64, shifts 0 and 1
 * SmallChunks variants (nranks 2, 3, 5; count kLarge skipped): shm with 4 KiB chunks and FIFO slots, 2 slots,
 * no single copy and 64-byte reduce-scatter rounds; shm with every message by single copy (CMA threshold 0); tcp
 * with 4 KiB chunks and 1 KiB rounds — the small counts then cross many chunk/slot/round boundaries.
 * Every check: the output equals the reference the rank computes itself (data.h: exact for integers and, by the
 * choice of inputs, for every floating SUM/PROD/MAX/MIN; AVG within the per-type tolerance of zt::tolerance());
 * the 64 guard bytes before and after every buffer are untouched; the send buffer is unchanged in out-of-place
 * runs (and, in in-place reduce_scatter, the blocks outside recvbuf); receive buffers of non-roots that the
 * collective must not write (reduce) keep their content.
 *
 * Also here: operations queued on streams (query returns only IN_PROGRESS or SUCCESS, synchronize, results),
 * 100 back-to-back allreduces on one communicator (blocking and queued), zccl_comm_init_env with the torchrun,
 * Open MPI and PMI variable sets (and its errors for missing/malformed variables), and self-tests of the harness
 * (deadline, exit status and output reporting, shared barrier, guards) and of the reference arithmetic.
 *
 * Runtime (2-core machine, sequential, RelWithDebInfo): about 1.5 min for the whole file when the machine is
 * otherwise idle, about 3 min when it is busy; count kLarge dominates. Set ZCCL_TEST_VERBOSE=1 to see every rank's
 * output, ZCCL_TEST_FULL=1 to run every (collective, dtype, op) at count 1000003 as well.
 */
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "harness/data.h"
#include "harness/harness.h"
#include "kernels.h"
#include "zccl.h"

using namespace zt;

namespace {

const zccl_datatype_t kTypes[] = {ZCCL_INT8,    ZCCL_UINT8,   ZCCL_INT32,   ZCCL_UINT32,  ZCCL_INT64,
                                  ZCCL_UINT64,  ZCCL_FLOAT16, ZCCL_FLOAT32, ZCCL_FLOAT64, ZCCL_BFLOAT16};
const zccl_redop_t kOps[] = {ZCCL_SUM, ZCCL_PROD, ZCCL_MAX, ZCCL_MIN, ZCCL_AVG};
const size_t kCounts[] = {0, 1, 2, 7, 1023, 1000003};
constexpr size_t kLarge = 1000003;
constexpr size_t kSmallRootsMax = 7; /* counts <= this run every root */

bool full_matrix() {
    const char *v = getenv("ZCCL_TEST_FULL");
    return v && *v && strcmp(v, "0") != 0;
}

bool in(zccl_datatype_t dt, std::initializer_list<zccl_datatype_t> l) {
    return std::find(l.begin(), l.end(), dt) != l.end();
}

/* Subsets at kLarge (see the file comment). */
bool large_reduce_ok(zccl_datatype_t dt, zccl_redop_t op) {
    if (full_matrix() || op == ZCCL_SUM) return true;
    return in(dt, {ZCCL_FLOAT16, ZCCL_BFLOAT16, ZCCL_FLOAT32, ZCCL_INT64});
}
bool large_rs_ok(zccl_datatype_t dt, zccl_redop_t op) {
    if (full_matrix()) return true;
    if (op == ZCCL_SUM) return in(dt, {ZCCL_UINT8, ZCCL_FLOAT16, ZCCL_BFLOAT16, ZCCL_FLOAT32, ZCCL_INT64});
    return dt == ZCCL_FLOAT32;
}
bool large_copy_ok(zccl_datatype_t dt) {
    return full_matrix() || in(dt, {ZCCL_INT8, ZCCL_FLOAT16, ZCCL_FLOAT32, ZCCL_FLOAT64});
}
bool large_sendrecv_ok(zccl_datatype_t dt) { return full_matrix() || in(dt, {ZCCL_INT8, ZCCL_FLOAT64}); }

/* State shared between the ranks of one run and the parent (SharedMem, mapped before fork). */
struct Shared {
    static constexpr int kMaxRanks = 16;
    static constexpr int kSections = 10;
    double section_s[kSections];          /* written by rank 0 */
    long checks[kMaxRanks];
    long failures[kMaxRanks];
    uint64_t result_hash[2][kMaxRanks];   /* inexact allreduce results (float32, float64) */
    std::atomic<long> barrier_counter;
    ShmBarrier bar;                       /* test-side synchronisation for the shared references (not zccl's) */
    explicit Shared(int n) : bar(n) {}
};
const char *const kSectionNames[Shared::kSections] = {"reductions",  "allgather", "broadcast", "send/recv",
                                                      "barrier",     "inexact",   "large",     "total",
                                                      "large inputs+references", "large reductions"};

uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* The body of one matrix run (runs in each rank's process; no GoogleTest here).                                 */
/* ------------------------------------------------------------------------------------------------------------ */

struct Ctx {
    const char *coll;
    zccl_datatype_t dt;
    int op;    /* -1: none */
    size_t count;
    bool inplace;
    int root;  /* -1: none; for send/recv: the shift */
    std::string str() const {
        char b[200];
        snprintf(b, sizeof b, "%s %s%s%s count=%zu %s%s", coll, dtype_name(dt), op >= 0 ? " " : "",
                 op >= 0 ? op_name((zccl_redop_t)op) : "", count, inplace ? "in-place" : "out-of-place",
                 root >= 0 ? (std::string(strcmp(coll, "send/recv") == 0 ? " shift=" : " root=") +
                              std::to_string(root)).c_str()
                           : "");
        return b;
    }
};

class Matrix {
  public:
    /* shref: shared scratch of at least nranks*kLarge 64-bit words (references and expected data at kLarge are
     * computed cooperatively: each rank fills 1/nranks of them). */
    Matrix(zccl_comm_t comm, int rank, int n, Shared *sh, uint64_t *shref)
        : comm_(comm), rank_(rank), n_(n), sh_(sh), shref_(shref) {}

    int run() {
        double t_start = now_s();
        if (zccl_stream_create(&stream_) != ZCCL_SUCCESS) {
            child_log(rank_, "zccl_stream_create failed: %s", zccl_get_last_error(nullptr));
            return 2;
        }
        /* ZT_MATRIX_REGISTER=all: every rank's buffers live in zccl_mem_alloc memory registered with the
         * communicator (the direct path of lib/core/regmem.c); =rank0: only rank 0's (the others' are private, so
         * every call must take the normal path). */
        const char *regv = getenv("ZT_MATRIX_REGISTER");
        const bool reg = regv && (!strcmp(regv, "all") || (!strcmp(regv, "rank0") && rank_ == 0));
        const size_t skip_l = getenv("ZT_MATRIX_SKIP_LARGE") && strcmp(getenv("ZT_MATRIX_SKIP_LARGE"), "0") != 0;
        const size_t cap = std::max((size_t)n_ * (skip_l ? 1023 : kLarge), (size_t)100003 /* inexact() */) * 8 +
                           2 * GuardedBuf::kGuard;
        void *mem[2] = {nullptr, nullptr}, *handle[2] = {nullptr, nullptr};
        for (int k = 0; k < 2 && reg; k++) {
            if (zccl_mem_alloc(&mem[k], cap) != ZCCL_SUCCESS ||
                zccl_comm_register(comm_, mem[k], cap, &handle[k]) != ZCCL_SUCCESS) {
                child_log(rank_, "zccl_mem_alloc/zccl_comm_register of %zu bytes: %s", cap, zccl_get_last_error(comm_));
                return 2;
            }
            (k ? b_ : a_).use_memory((uint8_t *)mem[k], cap);
        }
        double t_large = 0;
        const char *skip = getenv("ZT_MATRIX_SKIP_LARGE");
        const bool skip_large = skip && *skip && strcmp(skip, "0") != 0;
        for (size_t c : kCounts) {
            if (c == kLarge && skip_large) continue;
            double t0 = now_s();
            for (zccl_datatype_t dt : kTypes)
                for (zccl_redop_t op : kOps)
                    if (!fatal_) reductions(c, dt, op);
            double t1 = now_s();
            for (zccl_datatype_t dt : kTypes)
                if (!fatal_) allgather(c, dt);
            double t2 = now_s();
            for (zccl_datatype_t dt : kTypes)
                if (!fatal_) broadcasts(c, dt);
            double t3 = now_s();
            for (zccl_datatype_t dt : kTypes)
                if (!fatal_) sendrecvs(c, dt);
            double t4 = now_s();
            if (c == kLarge) t_large += t4 - t0;
            else add_time(0, t1 - t0), add_time(1, t2 - t1), add_time(2, t3 - t2), add_time(3, t4 - t3);
        }
        double t5 = now_s();
        if (!fatal_) barriers();
        double t6 = now_s();
        if (!fatal_) inexact(ZCCL_FLOAT32, 0);
        if (!fatal_) inexact(ZCCL_FLOAT64, 1);
        double t7 = now_s();
        add_time(4, t6 - t5);
        add_time(5, t7 - t6);
        add_time(6, t_large);
        add_time(7, t7 - t_start);
        zccl_result_t res = zccl_stream_destroy(stream_);
        if (res != ZCCL_SUCCESS) fail("zccl_stream_destroy", zccl_get_last_error(nullptr));
        for (int k = 0; k < 2 && reg; k++) {
            if (zccl_comm_deregister(comm_, handle[k]) != ZCCL_SUCCESS) fail("zccl_comm_deregister", zccl_get_last_error(comm_));
            (k ? b_ : a_).use_memory(nullptr, 0);
            if (zccl_mem_free(mem[k]) != ZCCL_SUCCESS) fail("zccl_mem_free", zccl_get_last_error(nullptr));
        }
        sh_->checks[rank_] = checks_;
        sh_->failures[rank_] = failures_;
        if (failures_ || fatal_)
            child_log(rank_, "%ld failures in %ld checks%s", failures_, checks_,
                      fatal_ ? " (stopped at the first failing call)" : "");
        return fatal_ ? 3 : failures_ ? 1 : 0;
    }

  private:
    zccl_comm_t comm_;
    int rank_, n_;
    Shared *sh_;
    uint64_t *shref_;
    zccl_stream_t stream_ = nullptr;
    long checks_ = 0, failures_ = 0;
    bool fatal_ = false;
    bool self_rejected_ = false;
    GuardedBuf a_, b_;
    std::vector<uint8_t> own_, expect_, other_;
    Reference ref_head_, ref_blk_;

    void add_time(int s, double t) {
        if (rank_ == 0) sh_->section_s[s] += t;
    }

    void fail(const std::string &what, const std::string &detail) {
        if (failures_ < 12) child_log(rank_, "FAIL %s: %s", what.c_str(), detail.c_str());
        failures_++;
    }
    /* A failing call stops the run: the ranks' sequences of collectives no longer match. */
    bool call_ok(zccl_result_t res, const Ctx &ctx) {
        if (res == ZCCL_SUCCESS) return true;
        fail(ctx.str(), std::string("returned ") + zccl_get_error_string(res) + ": " + zccl_get_last_error(comm_));
        fatal_ = true;
        sh_->bar.abort(); /* the other ranks stop at their next shared-reference barrier instead of waiting */
        return false;
    }
    /* Test-side barrier around the shared references; false (and fatal) if another rank gave up. */
    bool sync(const char *where) {
        if (sh_->bar.wait(120.0)) return true;
        if (!fatal_) child_log(rank_, "stopping at %s: another rank failed (or 120 s passed)", where);
        fatal_ = true;
        failures_++;
        sh_->bar.abort();
        return false;
    }
    void check_guards(const GuardedBuf &b, const Ctx &ctx, const char *which) {
        checks_++;
        std::string why;
        if (!b.guards_ok(&why)) fail(ctx.str(), std::string(which) + ": " + why);
    }
    void check_ref(const uint8_t *p, const Reference &ref, size_t off, size_t n, const Ctx &ctx) {
        checks_++;
        std::string first;
        size_t bad = ref.check(p, off, n, &first);
        if (bad) fail(ctx.str(), std::to_string(bad) + " wrong elements; first: " + first);
    }
    void check_same(const uint8_t *got, const uint8_t *want, size_t n, const Ctx &ctx, const char *which) {
        checks_++;
        std::string first;
        size_t bad = compare_elems(got, want, ctx.dt, n, &first);
        if (bad) fail(ctx.str(), std::string(which) + ": " + std::to_string(bad) + " elements differ; first: " + first);
    }
    void check_poison(const GuardedBuf &b, const Ctx &ctx, const char *which) {
        checks_++;
        if (!b.all_bytes(0, b.bytes(), GuardedBuf::kPoison)) fail(ctx.str(), std::string(which) + " was written");
    }

    std::vector<int> roots_for(size_t c) const {
        std::vector<int> r;
        if (c <= kSmallRootsMax) {
            for (int i = 0; i < n_; i++) r.push_back(i);
        } else {
            r.push_back(n_ / 2);
            if (n_ - 1 != n_ / 2) r.push_back(n_ - 1);
        }
        return r;
    }

    /* ---- allreduce, reduce_scatter, reduce: one input and one reference per (count, dtype, op) ---- */
    void reductions(size_t c, zccl_datatype_t dt, zccl_redop_t op) {
        const bool large = c == kLarge;
        if (large && !large_reduce_ok(dt, op) && !large_rs_ok(dt, op)) return;
        const bool do_ar = !large || large_reduce_ok(dt, op);
        const bool do_rs = !large || large_rs_ok(dt, op);
        const size_t sz = dtype_bytes(dt);
        const uint64_t salt = 1000 + c;
        const Pattern pat = pattern_for(op);
        const size_t in_len = do_rs ? (size_t)n_ * c : c;
        const double t0 = now_s();
        own_.resize(in_len * sz + 1);
        gen_fill(own_.data(), dt, pat, salt, rank_, 0, in_len);
        if (large) {
            /* Cooperative reference of the whole reduced vector (length in_len): rank r computes slice r. */
            if (!sync("reference start")) return;
            const size_t lo = in_len * (size_t)rank_ / (size_t)n_, hi = in_len * (size_t)(rank_ + 1) / (size_t)n_;
            Reference::compute_range(shref_ + lo, dt, op, salt, n_, lo, hi - lo);
            if (!sync("reference done")) return;
            ref_head_.attach(shref_, dt, op, n_, 0, c);
            if (do_rs) ref_blk_.attach(shref_ + (size_t)rank_ * c, dt, op, n_, (size_t)rank_ * c, c);
        } else {
            if (do_ar) ref_head_.compute(dt, op, salt, n_, 0, c);
            if (do_rs) ref_blk_.compute(dt, op, salt, n_, (size_t)rank_ * c, c);
        }
        const double t1 = now_s();
        if (large) add_time(8, t1 - t0);
        struct AddOnExit {
            Matrix *m;
            double t1;
            bool large;
            ~AddOnExit() {
                if (large) m->add_time(9, now_s() - t1);
            }
        } add_on_exit{this, t1, large};

        for (int ip = 0; ip < 2 && do_ar && !fatal_; ip++) allreduce(c, dt, op, ip);
        for (int ip = 0; ip < 2 && do_rs && !fatal_; ip++) reduce_scatter(c, dt, op, ip);
        if (!do_ar) return;
        if (large) {
            /* one root and one mode per (dtype, op), alternating: both roots and both modes are covered */
            const int alt = ((int)dt + (int)op) % 2;
            if (!fatal_) reduce(c, dt, op, alt ? n_ - 1 : n_ / 2, ((int)dt / 2 + (int)op) % 2 == 1);
            return;
        }
        for (int root : roots_for(c))
            for (int ip = 0; ip < 2 && !fatal_; ip++) reduce(c, dt, op, root, ip);
    }

    void allreduce(size_t c, zccl_datatype_t dt, zccl_redop_t op, bool ip) {
        Ctx ctx{"allreduce", dt, op, c, ip, -1};
        const size_t bytes = c * dtype_bytes(dt);
        a_.reset(bytes);
        memcpy(a_.p(), own_.data(), bytes);
        if (ip) {
            if (!call_ok(zccl_allreduce(a_.p(), a_.p(), c, dt, op, comm_, nullptr), ctx)) return;
            check_ref(a_.p(), ref_head_, 0, c, ctx);
        } else {
            b_.reset(bytes);
            if (!call_ok(zccl_allreduce(c ? a_.p() : nullptr, c ? b_.p() : nullptr, c, dt, op, comm_, nullptr), ctx))
                return;
            check_ref(b_.p(), ref_head_, 0, c, ctx);
            check_same(a_.p(), own_.data(), c, ctx, "sendbuf changed");
            check_guards(b_, ctx, "recvbuf");
        }
        check_guards(a_, ctx, ip ? "buffer" : "sendbuf");
    }

    void reduce_scatter(size_t c, zccl_datatype_t dt, zccl_redop_t op, bool ip) {
        Ctx ctx{"reduce_scatter", dt, op, c, ip, -1};
        const size_t sz = dtype_bytes(dt);
        const size_t total = (size_t)n_ * c;
        a_.reset(total * sz);
        memcpy(a_.p(), own_.data(), total * sz);
        if (ip) {
            uint8_t *recv = a_.p() + (size_t)rank_ * c * sz;
            if (!call_ok(zccl_reduce_scatter(a_.p(), recv, c, dt, op, comm_, nullptr), ctx)) return;
            check_ref(recv, ref_blk_, 0, c, ctx);
            check_same(a_.p(), own_.data(), (size_t)rank_ * c, ctx, "sendbuf blocks before recvbuf changed");
            size_t after = (size_t)(rank_ + 1) * c;
            check_same(a_.p() + after * sz, own_.data() + after * sz, total - after, ctx,
                       "sendbuf blocks after recvbuf changed");
        } else {
            b_.reset(c * sz);
            if (!call_ok(zccl_reduce_scatter(c ? a_.p() : nullptr, c ? b_.p() : nullptr, c, dt, op, comm_, nullptr),
                         ctx))
                return;
            check_ref(b_.p(), ref_blk_, 0, c, ctx);
            check_same(a_.p(), own_.data(), total, ctx, "sendbuf changed");
            check_guards(b_, ctx, "recvbuf");
        }
        check_guards(a_, ctx, ip ? "buffer" : "sendbuf");
    }

    void reduce(size_t c, zccl_datatype_t dt, zccl_redop_t op, int root, bool ip) {
        Ctx ctx{"reduce", dt, op, c, ip, root};
        const size_t bytes = c * dtype_bytes(dt);
        const bool is_root = rank_ == root;
        a_.reset(bytes);
        memcpy(a_.p(), own_.data(), bytes);
        if (ip) {
            if (!call_ok(zccl_reduce(a_.p(), a_.p(), c, dt, op, root, comm_, nullptr), ctx)) return;
            if (is_root) check_ref(a_.p(), ref_head_, 0, c, ctx);
            else check_same(a_.p(), own_.data(), c, ctx, "non-root buffer changed");
        } else {
            /* Non-roots pass recvbuf NULL (allowed) on alternate calls, else a buffer that must stay untouched. */
            const bool null_recv = !is_root && (((size_t)root + c) % 2 == 0);
            b_.reset(bytes);
            void *recv = (c && !null_recv) ? b_.p() : nullptr;
            if (!call_ok(zccl_reduce(c ? a_.p() : nullptr, recv, c, dt, op, root, comm_, nullptr), ctx)) return;
            if (is_root) check_ref(b_.p(), ref_head_, 0, c, ctx);
            else check_poison(b_, ctx, "non-root recvbuf");
            check_same(a_.p(), own_.data(), c, ctx, "sendbuf changed");
            check_guards(b_, ctx, "recvbuf");
        }
        check_guards(a_, ctx, ip ? "buffer" : "sendbuf");
    }

    /* ---- allgather ---- */
    void allgather(size_t c, zccl_datatype_t dt) {
        if (c == kLarge && !large_copy_ok(dt)) return;
        const size_t sz = dtype_bytes(dt);
        const uint64_t salt = 2000 + c;
        const size_t total = (size_t)n_ * c;
        const uint8_t *expect;
        if (c == kLarge) {
            /* every rank writes its own block of the expected result into shared memory */
            if (!sync("allgather expectation start")) return;
            gen_fill((uint8_t *)shref_ + (size_t)rank_ * c * sz, dt, Pattern::Copy, salt, rank_, 0, c);
            if (!sync("allgather expectation done")) return;
            expect = (const uint8_t *)shref_;
        } else {
            expect_.resize(total * sz + 1);
            for (int r = 0; r < n_; r++)
                gen_fill(expect_.data() + (size_t)r * c * sz, dt, Pattern::Copy, salt, r, 0, c);
            expect = expect_.data();
        }
        const uint8_t *own = expect + (size_t)rank_ * c * sz;
        for (int ip = 0; ip < 2 && !fatal_; ip++) {
            Ctx ctx{"allgather", dt, -1, c, ip != 0, -1};
            b_.reset(total * sz);
            if (ip) {
                uint8_t *send = b_.p() + (size_t)rank_ * c * sz;
                memcpy(send, own, c * sz);
                if (!call_ok(zccl_allgather(send, b_.p(), c, dt, comm_, nullptr), ctx)) return;
            } else {
                a_.reset(c * sz);
                memcpy(a_.p(), own, c * sz);
                if (!call_ok(zccl_allgather(c ? a_.p() : nullptr, c ? b_.p() : nullptr, c, dt, comm_, nullptr), ctx))
                    return;
                check_same(a_.p(), own, c, ctx, "sendbuf changed");
                check_guards(a_, ctx, "sendbuf");
            }
            check_same(b_.p(), expect, total, ctx, "recvbuf");
            check_guards(b_, ctx, "recvbuf");
        }
    }

    /* ---- broadcast ---- */
    void broadcasts(size_t c, zccl_datatype_t dt) {
        const bool large = c == kLarge;
        if (large && !large_copy_ok(dt)) return;
        const size_t sz = dtype_bytes(dt);
        const size_t bytes = c * sz;
        const uint64_t salt = 3000 + c;
        own_.resize(bytes + 1);
        gen_fill(own_.data(), dt, Pattern::Copy, salt, rank_, 0, c);
        expect_.resize(bytes + 1);
        for (int root : roots_for(c)) {
            gen_fill(expect_.data(), dt, Pattern::Copy, salt, root, 0, c);
            const bool is_root = rank_ == root;
            for (int ip = 0; ip < 2 && !fatal_; ip++) {
                Ctx ctx{"broadcast", dt, -1, c, ip != 0, root};
                if (ip) {
                    a_.reset(bytes);
                    if (is_root) memcpy(a_.p(), expect_.data(), bytes);
                    if (!call_ok(zccl_broadcast(a_.p(), a_.p(), c, dt, root, comm_, nullptr), ctx)) return;
                    check_same(a_.p(), expect_.data(), c, ctx, "buffer");
                    check_guards(a_, ctx, "buffer");
                } else {
                    /* Non-roots pass sendbuf NULL (allowed) on alternate calls, else their own data (unused). */
                    const bool null_send = !is_root && (((size_t)root + c) % 2 == 0);
                    a_.reset(bytes);
                    memcpy(a_.p(), is_root ? expect_.data() : own_.data(), bytes);
                    b_.reset(bytes);
                    const void *send = (c && !null_send) ? a_.p() : nullptr;
                    if (!call_ok(zccl_broadcast(send, c ? b_.p() : nullptr, c, dt, root, comm_, nullptr), ctx)) return;
                    check_same(b_.p(), expect_.data(), c, ctx, "recvbuf");
                    check_same(a_.p(), is_root ? expect_.data() : own_.data(), c, ctx, "sendbuf changed");
                    check_guards(a_, ctx, "sendbuf");
                    check_guards(b_, ctx, "recvbuf");
                }
            }
        }
    }

    /* ---- send/recv: rank r sends to r+k and receives from r-k ---- */
    void sendrecvs(size_t c, zccl_datatype_t dt) {
        const bool large = c == kLarge;
        if (large && !large_sendrecv_ok(dt)) return;
        const size_t sz = dtype_bytes(dt);
        const size_t bytes = c * sz;
        for (int k = 0; k < n_ && !fatal_; k++) {
            if (large && k > 1) break;
            Ctx ctx{"send/recv", dt, -1, c, false, k};
            const uint64_t salt = 4000 + c * 64 + (uint64_t)k;
            const int dst = (rank_ + k) % n_, src = (rank_ - k + n_) % n_;
            own_.resize(bytes + 1);
            expect_.resize(bytes + 1);
            gen_fill(own_.data(), dt, Pattern::Copy, salt, rank_, 0, c);
            gen_fill(expect_.data(), dt, Pattern::Copy, salt, src, 0, c);
            a_.reset(bytes);
            memcpy(a_.p(), own_.data(), bytes);
            b_.reset(bytes);
            const void *s = c ? a_.p() : nullptr;
            void *r = c ? b_.p() : nullptr;
            if (k == 0) {
                /* zccl.h: outside a group, sending to or receiving from oneself is ZCCL_INVALID_ARGUMENT naming 'peer' (it
                 * is allowed inside a group: test_groups.cpp). count 0 is a no-op and is not checked here. */
                if (self_rejected_ || c == 0) continue;
                zccl_result_t sr = zccl_send(s, c, dt, rank_, comm_, stream_);
                zccl_result_t rr = zccl_recv(r, c, dt, rank_, comm_, stream_);
                if (sr != ZCCL_INVALID_ARGUMENT || rr != ZCCL_INVALID_ARGUMENT ||
                    !strstr(zccl_get_last_error(comm_), "peer"))
                    fail(ctx.str(), std::string("send/recv to self must be ZCCL_INVALID_ARGUMENT naming 'peer'; got ") +
                                        std::to_string(sr) + "/" + std::to_string(rr) + ": " + zccl_get_last_error(comm_));
                self_rejected_ = true; /* checked once per run */
                continue;
            } else {
                /* Position of this rank on its cycle of the permutation r -> r+k: even positions send first, odd
                 * ones receive first, so that blocking (rendezvous) sends cannot deadlock. */
                const int g = std::gcd(n_, k);
                int pos = 0;
                for (int x = rank_ % g; x != rank_; x = (x + k) % n_) pos++;
                if (pos % 2 == 0) {
                    if (!call_ok(zccl_send(s, c, dt, dst, comm_, nullptr), ctx)) return;
                    if (!call_ok(zccl_recv(r, c, dt, src, comm_, nullptr), ctx)) return;
                } else {
                    if (!call_ok(zccl_recv(r, c, dt, src, comm_, nullptr), ctx)) return;
                    if (!call_ok(zccl_send(s, c, dt, dst, comm_, nullptr), ctx)) return;
                }
            }
            check_same(b_.p(), expect_.data(), c, ctx, "recvbuf");
            check_same(a_.p(), own_.data(), c, ctx, "sendbuf changed");
            check_guards(a_, ctx, "sendbuf");
            check_guards(b_, ctx, "recvbuf");
        }
    }

    /* ---- barrier: after the i-th barrier every rank has incremented the counter i+1 times ---- */
    void barriers() {
        for (int it = 0; it < 20 && !fatal_; it++) {
            Ctx ctx{"barrier", ZCCL_INT8, -1, 0, false, -1};
            if (rank_ == it % n_) usleep(2000); /* a late rank: the others must wait for it */
            sh_->barrier_counter.fetch_add(1);
            if (!call_ok(zccl_barrier(comm_, nullptr), ctx)) return;
            long seen = sh_->barrier_counter.load();
            checks_++;
            if (seen < (long)n_ * (it + 1))
                fail(ctx.str(), "left barrier " + std::to_string(it) + " when only " + std::to_string(seen) +
                                    " of " + std::to_string((long)n_ * (it + 1)) + " arrivals had happened");
        }
    }

    /* ---- inexact sums: values whose sums need more bits than the type has; tolerance and bitwise identity ---- */
    void inexact(zccl_datatype_t dt, int slot) {
        const size_t c = 100003;
        const size_t sz = dtype_bytes(dt);
        const uint64_t salt = 5000 + (uint64_t)dt;
        Ctx ctx{"allreduce (inexact inputs)", dt, ZCCL_SUM, c, false, -1};
        other_.resize(c * sz);
        /* long double (64-bit significand on x86-64) holds these sums exactly: float64 inputs are k/65536 with
         * |k| < 2^52, and 8 of them need at most 55 significant bits. */
        std::vector<long double> sum(c, 0.0L);
        std::vector<double> abssum(c, 0.0);
        for (int r = 0; r < n_; r++) {
            gen_fill(other_.data(), dt, Pattern::Extremes, salt, r, 0, c);
            for (size_t i = 0; i < c; i++) {
                double v = elem_as_double(other_.data(), dt, i);
                sum[i] += v;
                abssum[i] += std::fabs(v);
            }
            if (r == rank_) {
                a_.reset(c * sz);
                memcpy(a_.p(), other_.data(), c * sz);
            }
        }
        b_.reset(c * sz);
        if (!call_ok(zccl_allreduce(a_.p(), b_.p(), c, dt, ZCCL_SUM, comm_, nullptr), ctx)) return;
        const double eps = dt == ZCCL_FLOAT32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
        size_t bad = 0;
        std::string first;
        for (size_t i = 0; i < c; i++) {
            double got = elem_as_double(b_.p(), dt, i);
            /* each of the nranks-1 additions rounds once: |error| <= (nranks-1) * u * sum|x| (u = unit roundoff) */
            double tol = (double)std::max(1, n_ - 1) * eps * abssum[i] * 1.0001;
            if (!(std::fabs((long double)got - sum[i]) <= (long double)tol)) {
                if (!bad) {
                    char m[200];
                    snprintf(m, sizeof m, "element %zu: got %.17g, exact sum %.17Lg, tolerance %.3g", i, got, sum[i],
                             tol);
                    first = m;
                }
                bad++;
            }
        }
        checks_++;
        if (bad) fail(ctx.str(), std::to_string(bad) + " elements outside (nranks-1)*eps*sum|x|; first: " + first);
        check_guards(b_, ctx, "recvbuf");
        sh_->result_hash[slot][rank_] = fnv1a(b_.p(), c * sz);
    }
};

/* Common environment for multi-process tests here: the transport, and a collective timeout so that a stuck peer
 * produces an error naming it well before the harness deadline. */
EnvList base_env(const std::string &transport) {
    return {{"ZCCL_TRANSPORT", transport}, {"ZCCL_TIMEOUT_MS", std::string("60000")},
            {"ZCCL_INIT_TIMEOUT_MS", std::string("60000")}};
}

/* Transport variants: "shm" and "tcp" with default settings; the "-tiny" and "-cma" variants shrink chunks, FIFO
 * slots and reduce-scatter rounds to (near) their minimums (or send every shm message by single copy) so that the small
 * counts already cross many chunk, slot and round boundaries; they skip count kLarge (ZT_MATRIX_SKIP_LARGE). */
EnvList variant_env(const std::string &variant, int n) {
    EnvList e = base_env(variant.substr(0, variant.find('-')));
    auto add = [&](const char *k, const char *v) { e.push_back({k, std::string(v)}); };
    if (variant == "shm-tiny") {
        add("ZCCL_CHUNK_BYTES", "4096");
        add("ZCCL_SHM_SLOT_BYTES", "4096");
        add("ZCCL_SHM_SLOTS", "2");
        add("ZCCL_SHM_CMA", "0");
        add("ZCCL_RS_ROUND_BYTES", "64");
        add("ZT_MATRIX_SKIP_LARGE", "1");
    } else if (variant == "shm-cma") {
        add("ZCCL_SHM_CMA", "1");
        add("ZCCL_CMA_THRESHOLD", "0");
        add("ZT_MATRIX_SKIP_LARGE", "1");
    } else if (variant == "shm-ring" || variant == "tcp-ring") {
        /* A ring order other than rank order (as the topology-aware ring may choose): odd ranks first, descending,
         * then even ranks ascending. Results must not change. */
        std::string ring;
        for (int r = n - 1; r >= 0; r--)
            if (r % 2) ring += (ring.empty() ? "" : ",") + std::to_string(r);
        for (int r = 0; r < n; r++)
            if (r % 2 == 0) ring += (ring.empty() ? "" : ",") + std::to_string(r);
        add("ZCCL_RING_ORDER", ring.c_str());
        add("ZT_MATRIX_SKIP_LARGE", "1");
    } else if (variant == "ib-qp2") { /* IB verbs: two QPs per connection, 4 KiB chunks (many grants in flight) */
        add("ZCCL_IB_QPS_PER_CONN", "2");
        add("ZCCL_CHUNK_BYTES", "4096");
        add("ZCCL_RS_ROUND_BYTES", "1024");
        add("ZT_MATRIX_SKIP_LARGE", "1");
    } else if (variant == "ib-zcopy") { /* IB verbs: user buffers registered through the cache, no staging */
        add("ZCCL_IB_ZCOPY_BYTES", "1");
    } else if (variant.compare(0, 8, "ib-rails") == 0) { /* IB verbs over two rails (rxe0 and rxe1 in the VM, every */
        add("ZCCL_CHUNK_BYTES", "4096");                 /* rank; the rank_env below): 4 KiB chunks so that */
        add("ZCCL_RS_ROUND_BYTES", "1024");              /* transfers of the small counts stripe over both */
        add("ZT_MATRIX_SKIP_LARGE", "1");
        if (variant == "ib-rails-zcopy") add("ZCCL_IB_ZCOPY_BYTES", "1"); /* a registration cache per rail's PD */
    } else if (variant == "shm-reg") { /* every rank's buffers registered: one pass out of the peers' buffers */
        add("ZT_MATRIX_REGISTER", "all");
        add("ZCCL_SHM_REG_MIN_BYTES", "1"); /* every size, so small counts test it too */
        add("ZCCL_CHUNK_BYTES", "4096");    /* 1023 elements cross several bounce-buffer steps */
    } else if (variant == "shm-reg-some") { /* only rank 0 registered: every call must fall back */
        add("ZT_MATRIX_REGISTER", "rank0");
        add("ZCCL_SHM_REG_MIN_BYTES", "1");
        add("ZT_MATRIX_SKIP_LARGE", "1");
    } else if (variant == "tcp-socks2" || variant == "tcp-socks3") {
        /* TCP striped over 2 or 3 sockets per direction of every pair (transport/rail.h) on loopback as the one rail:
         * every transfer of at least 0 / 1 KiB is cut into parts on 64-byte boundaries that arrive independently,
         * and reducing receives stage each part separately (4 KiB chunks). Results must not change. */
        add("ZCCL_SOCKET_IFNAME", "=lo");
        add("ZCCL_NSOCKS_PERTHREAD", variant == "tcp-socks2" ? "2" : "3");
        add("ZCCL_TCP_STRIPE_MIN_BYTES", variant == "tcp-socks2" ? "0" : "1K");
        add("ZCCL_CHUNK_BYTES", "4096");
        add("ZCCL_RS_ROUND_BYTES", "1024");
        add("ZT_MATRIX_SKIP_LARGE", "1");
    } else if (variant == "tcp-ch2" || variant == "tcp-ch3") {
        /* Channel counts forced (ZCCL_MIN_NCHANNELS / ZCCL_MAX_NCHANNELS) over 4 sockets per direction on loopback:
         * ch2 splits every transfer of at least 128 bytes into exactly 2 parts although the stripe threshold is
         * 1 MiB (the minimum raises it); ch3 splits every transfer into at most 3 of the 4 (the maximum caps it). */
        add("ZCCL_SOCKET_IFNAME", "=lo");
        add("ZCCL_NSOCKS_PERTHREAD", "4");
        add("ZCCL_TCP_STRIPE_MIN_BYTES", variant == "tcp-ch2" ? "1M" : "0");
        add(variant == "tcp-ch2" ? "ZCCL_MIN_NCHANNELS" : "ZCCL_MAX_NCHANNELS", variant == "tcp-ch2" ? "2" : "3");
        if (variant == "tcp-ch2") add("NCCL_MAX_NCHANNELS", "2"); /* NCCL's name is read too */
        add("ZCCL_CHUNK_BYTES", "4096");
        add("ZCCL_RS_ROUND_BYTES", "1024");
        add("ZT_MATRIX_SKIP_LARGE", "1");
    } else if (variant == "tcp-tiny") {
        add("ZCCL_CHUNK_BYTES", "4096");
        add("ZCCL_RS_ROUND_BYTES", "1024"); /* 64 would cost one TCP round trip per 64 bytes: slow, not better */
        add("ZT_MATRIX_SKIP_LARGE", "1");
    }
    return e;
}

class CollectivesMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CollectivesMatrix, EveryCollectiveTypeOpCount) {
    const std::string transport = std::get<0>(GetParam());
    const int n = std::get<1>(GetParam());
    SharedMem shm(sizeof(Shared));
    Shared *sh = shm.as<Shared>();
    new (sh) Shared(n);
    SharedMem shref((size_t)n * kLarge * sizeof(uint64_t)); /* pages are only materialised when touched */
    uint64_t *ref = shref.as<uint64_t>();
    if (transport.compare(0, 2, "ib") == 0 && access("/sys/class/infiniband", F_OK) != 0)
        GTEST_SKIP() << "no RDMA device: the IB variants run inside the soft-RoCE VM (tests/rdma/ib_conformance.sh)";
    Options o;
    o.deadline_s = 280;
    o.env = variant_env(transport, n);
    if (transport.compare(0, 2, "ib") == 0 && getenv("ZCCL_VM")) /* emulated machine: 1000003 elements take minutes */
        o.env.push_back({"ZT_MATRIX_SKIP_LARGE", std::string("1")});
    if (transport.compare(0, 8, "ib-rails") == 0 && getenv("ZCCL_VM_DEV1")) /* soft-RoCE VM: both devices as */
        o.rank_env = [transport](int r) {                                  /* rails; "mixed": odd ranks one */
            const std::string both = std::string("=") + getenv("ZCCL_VM_DEV0") + "," + getenv("ZCCL_VM_DEV1");
            const bool one = transport == "ib-rails-mixed" && r % 2;
            return EnvList{{"ZCCL_IB_HCA", one ? std::string("=") + getenv("ZCCL_VM_DEV1") : both}};
        };
    else if (transport.compare(0, 2, "ib") == 0 && getenv("ZCCL_VM_DEV1")) /* soft-RoCE VM: alternate rxe0 / rxe1 */
        o.rank_env = [](int r) {                                           /* so traffic crosses the veth pair too */
            return EnvList{{"ZCCL_IB_HCA", std::string("=") + getenv(r % 2 ? "ZCCL_VM_DEV1" : "ZCCL_VM_DEV0")}};
        };
    GroupResult res = run_ranks(n, [sh, ref](zccl_comm_t comm, int rank, int nranks) {
        return Matrix(comm, rank, nranks, sh, ref).run();
    }, o);
    long checks = 0, failures = 0;
    for (int r = 0; r < n; r++) checks += sh->checks[r], failures += sh->failures[r];
    std::string timing;
    for (int s = 0; s < Shared::kSections; s++) {
        char b[64];
        snprintf(b, sizeof b, "%s%s %.2fs", s ? ", " : "", kSectionNames[s], sh->section_s[s]);
        timing += b;
    }
    printf("[   INFO   ] %s nranks=%d: %ld checks, %ld failures, wall %.1fs (rank 0: %s)\n", transport.c_str(), n,
           checks, failures, res.elapsed_s, timing.c_str());
    EXPECT_EQ(failures, 0);
    if (res.all_ok()) {
        for (int slot = 0; slot < 2; slot++)
            for (int r = 1; r < n; r++)
                EXPECT_EQ(sh->result_hash[slot][r], sh->result_hash[slot][0])
                    << "allreduce results differ bitwise between rank 0 and rank " << r << " ("
                    << (slot ? "float64" : "float32") << ", inexact inputs)";
    }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, int>> &i) {
    std::string v = std::get<0>(i.param);
    std::replace(v.begin(), v.end(), '-', '_');
    return v + "_" + std::to_string(std::get<1>(i.param)) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(Transports, CollectivesMatrix,
                         ::testing::Combine(::testing::Values(std::string("shm"), std::string("tcp")),
                                            ::testing::Values(1, 2, 3, 4, 5, 8)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(IB, CollectivesMatrix,
                         ::testing::Combine(::testing::Values(std::string("ib"), std::string("ib-qp2"),
                                                              std::string("ib-zcopy")),
                                            ::testing::Values(2, 3, 4)),
                         param_name);
/* Two IB rails per rank (tests/rdma/vm_rails.sh): "ib-rails" every rank on both, "ib-rails-zcopy" with user buffers
 * registered on each rail's PD, "ib-rails-mixed" odd ranks on one rail (pairs fall back to the smaller count). */
INSTANTIATE_TEST_SUITE_P(IBRails, CollectivesMatrix,
                         ::testing::Combine(::testing::Values(std::string("ib-rails"), std::string("ib-rails-zcopy"),
                                                              std::string("ib-rails-mixed")),
                                            ::testing::Values(2, 3, 4)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(SmallChunks, CollectivesMatrix,
                         ::testing::Combine(::testing::Values(std::string("shm-tiny"), std::string("shm-cma"),
                                                              std::string("tcp-tiny")),
                                            ::testing::Values(2, 3, 5)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Striped, CollectivesMatrix,
                         ::testing::Combine(::testing::Values(std::string("tcp-socks2"), std::string("tcp-socks3"),
                                                              std::string("tcp-ch2"), std::string("tcp-ch3")),
                                            ::testing::Values(2, 3, 5)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Registered, CollectivesMatrix,
                         ::testing::Combine(::testing::Values(std::string("shm-reg"), std::string("shm-reg-some")),
                                            ::testing::Values(2, 3, 4)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(PermutedRing, CollectivesMatrix,
                         ::testing::Combine(::testing::Values(std::string("shm-ring"), std::string("tcp-ring")),
                                            ::testing::Values(4, 5)),
                         param_name);

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams and sequencing                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */

/* Body helpers: report a failure on stderr and count it. */
struct Fails {
    int rank;
    int n = 0;
    void operator()(const std::string &what) {
        if (n < 12) child_log(rank, "FAIL %s", what.c_str());
        n++;
    }
};

bool expect_ok(Fails &f, zccl_result_t res, const char *what) {
    if (res == ZCCL_SUCCESS) return true;
    f(std::string(what) + " returned " + zccl_get_error_string(res) + ": " + zccl_get_last_error(nullptr));
    return false;
}

/* Queues a mix of collectives on one stream, checks query's results while they run, synchronizes, checks data. */
int stream_body(zccl_comm_t comm, int rank, int n) {
    Fails f{rank};
    zccl_stream_t st = nullptr;
    if (!expect_ok(f, zccl_stream_create(&st), "zccl_stream_create")) return 1;
    for (int round = 0; round < 3 && f.n == 0; round++) {
        const uint64_t salt = 7000 + (uint64_t)round;
        const size_t c_ar = 100003, c_ag = 7, c_bc = 1000, c_rs = 1023, c_red = 77;
        const int bc_root = n - 1, red_root = round % n;
        /* inputs */
        std::vector<float> ar_in(c_ar), ar_out(c_ar, -1.0f);
        gen_fill(ar_in.data(), ZCCL_FLOAT32, Pattern::Additive, salt, rank, 0, c_ar);
        std::vector<int32_t> ag_in(c_ag), ag_out((size_t)n * c_ag, -1), ag_exp((size_t)n * c_ag);
        gen_fill(ag_in.data(), ZCCL_INT32, Pattern::Copy, salt, rank, 0, c_ag);
        for (int r = 0; r < n; r++) gen_fill(&ag_exp[(size_t)r * c_ag], ZCCL_INT32, Pattern::Copy, salt, r, 0, c_ag);
        std::vector<double> bc_buf(c_bc, -1.0), bc_exp(c_bc);
        gen_fill(bc_exp.data(), ZCCL_FLOAT64, Pattern::Copy, salt, bc_root, 0, c_bc);
        if (rank == bc_root) bc_buf = bc_exp;
        std::vector<uint16_t> rs_in((size_t)n * c_rs), rs_out(c_rs, 0xffff);
        gen_fill(rs_in.data(), ZCCL_BFLOAT16, Pattern::Additive, salt, rank, 0, (size_t)n * c_rs);
        std::vector<int64_t> red_in(c_red), red_out(c_red, -1);
        gen_fill(red_in.data(), ZCCL_INT64, Pattern::Extremes, salt, rank, 0, c_red);
        int32_t sr_out = -1, sr_in = 1000 * rank + round;

        if (!expect_ok(f, zccl_allreduce(ar_in.data(), ar_out.data(), c_ar, ZCCL_FLOAT32, ZCCL_SUM, comm, st),
                       "allreduce on stream"))
            break;
        expect_ok(f, zccl_allgather(ag_in.data(), ag_out.data(), c_ag, ZCCL_INT32, comm, st), "allgather on stream");
        expect_ok(f, zccl_broadcast(bc_buf.data(), bc_buf.data(), c_bc, ZCCL_FLOAT64, bc_root, comm, st),
                  "broadcast on stream");
        expect_ok(f, zccl_reduce_scatter(rs_in.data(), rs_out.data(), c_rs, ZCCL_BFLOAT16, ZCCL_SUM, comm, st),
                  "reduce_scatter on stream");
        expect_ok(f, zccl_reduce(red_in.data(), rank == red_root ? red_out.data() : nullptr, c_red, ZCCL_INT64,
                                 ZCCL_MAX, red_root, comm, st),
                  "reduce on stream");
        expect_ok(f, zccl_barrier(comm, st), "barrier on stream");
        /* ring shift by one, ordered so that rendezvous sends cannot deadlock */
        const int dst = (rank + 1) % n, src = (rank - 1 + n) % n;
        if (n == 1) {
            sr_out = sr_in; /* no peer: send/recv to oneself is rejected (checked in the matrix) */
        } else if (rank % 2 == 0) {
            expect_ok(f, zccl_send(&sr_in, 1, ZCCL_INT32, dst, comm, st), "send on stream");
            expect_ok(f, zccl_recv(&sr_out, 1, ZCCL_INT32, src, comm, st), "recv on stream");
        } else {
            expect_ok(f, zccl_recv(&sr_out, 1, ZCCL_INT32, src, comm, st), "recv on stream");
            expect_ok(f, zccl_send(&sr_in, 1, ZCCL_INT32, dst, comm, st), "send on stream");
        }
        if (f.n) break;
        /* query never blocks and only reports IN_PROGRESS or SUCCESS; poll it to completion on rounds 0 and 2 */
        if (round != 1) {
            double end = now_s() + 60;
            long polls = 0;
            for (;;) {
                zccl_result_t q = zccl_stream_query(st);
                polls++;
                if (q == ZCCL_SUCCESS) break;
                if (q != ZCCL_IN_PROGRESS) {
                    f(std::string("zccl_stream_query returned ") + zccl_get_error_string(q) + ": " +
                      zccl_get_last_error(nullptr));
                    break;
                }
                if (now_s() > end) {
                    f("zccl_stream_query still IN_PROGRESS after 60 s");
                    break;
                }
                sched_yield();
            }
        }
        if (!expect_ok(f, zccl_stream_synchronize(st), "zccl_stream_synchronize")) break;
        zccl_result_t q = zccl_stream_query(st);
        if (q != ZCCL_SUCCESS) f(std::string("zccl_stream_query after synchronize returned ") + zccl_get_error_string(q));

        /* results */
        Reference ref;
        ref.compute(ZCCL_FLOAT32, ZCCL_SUM, salt, n, 0, c_ar);
        std::string first;
        if (size_t bad = ref.check(ar_out.data(), 0, c_ar, &first))
            f("allreduce on stream: " + std::to_string(bad) + " wrong; " + first);
        if (compare_elems(ag_out.data(), ag_exp.data(), ZCCL_INT32, (size_t)n * c_ag, &first))
            f("allgather on stream: " + first);
        if (compare_elems(bc_buf.data(), bc_exp.data(), ZCCL_FLOAT64, c_bc, &first))
            f("broadcast on stream: " + first);
        ref.compute(ZCCL_BFLOAT16, ZCCL_SUM, salt, n, (size_t)rank * c_rs, c_rs);
        if (size_t bad = ref.check(rs_out.data(), 0, c_rs, &first))
            f("reduce_scatter on stream: " + std::to_string(bad) + " wrong; " + first);
        if (rank == red_root) {
            ref.compute(ZCCL_INT64, ZCCL_MAX, salt, n, 0, c_red);
            if (size_t bad = ref.check(red_out.data(), 0, c_red, &first))
                f("reduce on stream: " + std::to_string(bad) + " wrong; " + first);
        }
        if (sr_out != 1000 * src + round)
            f("send/recv on stream: got " + std::to_string(sr_out) + ", expected " + std::to_string(1000 * src + round));
    }
    /* 100 allreduces queued back to back into distinct buffers, one synchronize. */
    if (f.n == 0) {
        const int K = 100;
        std::vector<std::vector<int32_t>> in(K), out(K);
        for (int k = 0; k < K; k++) {
            size_t c = 1 + (size_t)(k * 37) % 300;
            in[k].resize(c);
            out[k].assign(c, -7);
            gen_fill(in[k].data(), ZCCL_INT32, Pattern::Additive, 8000 + (uint64_t)k, rank, 0, c);
            if (!expect_ok(f, zccl_allreduce(in[k].data(), out[k].data(), c, ZCCL_INT32, ZCCL_SUM, comm, st),
                           "queued allreduce"))
                break;
        }
        if (f.n == 0 && expect_ok(f, zccl_stream_synchronize(st), "zccl_stream_synchronize after 100 allreduces")) {
            Reference ref;
            for (int k = 0; k < K; k++) {
                ref.compute(ZCCL_INT32, ZCCL_SUM, 8000 + (uint64_t)k, n, 0, in[k].size());
                std::string first;
                if (ref.check(out[k].data(), 0, in[k].size(), &first))
                    f("queued allreduce #" + std::to_string(k) + ": " + first);
            }
        }
    }
    expect_ok(f, zccl_stream_destroy(st), "zccl_stream_destroy");
    return f.n ? 1 : 0;
}

/* 100 blocking allreduces back to back, with varying type, op, count and in-place-ness. */
int sequence_body(zccl_comm_t comm, int rank, int n) {
    Fails f{rank};
    GuardedBuf a, b;
    std::vector<uint8_t> own;
    Reference ref;
    for (int k = 0; k < 100; k++) {
        zccl_datatype_t dt = kTypes[k % 10];
        zccl_redop_t op = kOps[(k / 10) % 5];
        size_t c = 1 + (size_t)(k * 13) % 40;
        bool ip = (k / 3) % 2;
        uint64_t salt = 9000 + (uint64_t)k;
        size_t bytes = c * dtype_bytes(dt);
        own.resize(bytes);
        gen_fill(own.data(), dt, pattern_for(op), salt, rank, 0, c);
        ref.compute(dt, op, salt, n, 0, c);
        a.reset(bytes);
        memcpy(a.p(), own.data(), bytes);
        b.reset(bytes);
        uint8_t *out = ip ? a.p() : b.p();
        std::string what = "allreduce #" + std::to_string(k) + " " + dtype_name(dt) + " " + op_name(op) +
                           " count=" + std::to_string(c);
        if (!expect_ok(f, zccl_allreduce(a.p(), out, c, dt, op, comm, nullptr), what.c_str())) return 1;
        std::string first;
        if (ref.check(out, 0, c, &first)) f(what + ": " + first);
        if (!a.guards_ok() || !b.guards_ok()) f(what + ": guard bytes overwritten");
    }
    return f.n ? 1 : 0;
}

class StreamsAndSequencing : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(StreamsAndSequencing, QueuedOperationsOnStream) {
    Options o;
    o.deadline_s = 120;
    o.env = base_env(std::get<0>(GetParam()));
    run_ranks(std::get<1>(GetParam()), stream_body, o);
}

TEST_P(StreamsAndSequencing, HundredBackToBackAllreduces) {
    Options o;
    o.deadline_s = 120;
    o.env = base_env(std::get<0>(GetParam()));
    run_ranks(std::get<1>(GetParam()), sequence_body, o);
}

INSTANTIATE_TEST_SUITE_P(Transports, StreamsAndSequencing,
                         ::testing::Combine(::testing::Values(std::string("shm"), std::string("tcp")),
                                            ::testing::Values(1, 2, 3, 5)),
                         param_name);

/* ------------------------------------------------------------------------------------------------------------ */
/* zccl_comm_init_env                                                                                           */
/* ------------------------------------------------------------------------------------------------------------ */

const char *const kLauncherVars[] = {"RANK",         "WORLD_SIZE",   "LOCAL_RANK",           "MASTER_ADDR",
                                     "MASTER_PORT",  "ZCCL_SECRET",  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "PMI_RANK",     "PMI_SIZE",     "TORCHELASTIC_RUN_ID"};
const char kSecret[] = "0123456789abcdef0123456789ABCDEF";

EnvList clean_launcher_env() {
    EnvList e;
    for (const char *v : kLauncherVars) e.push_back({v, std::nullopt});
    e.push_back({"ZCCL_INIT_TIMEOUT_MS", std::string("30000")});
    e.push_back({"ZCCL_TIMEOUT_MS", std::string("30000")});
    return e;
}

/* Body for init_env ranks: creates the communicator itself, checks rank/size, runs an allreduce. */
int init_env_body(int expect_rank, int expect_n) {
    Fails f{expect_rank};
    zccl_comm_t comm = nullptr;
    if (!expect_ok(f, zccl_comm_init_env(&comm), "zccl_comm_init_env")) return 1;
    int r = -1, n = -1;
    expect_ok(f, zccl_comm_rank(comm, &r), "zccl_comm_rank");
    expect_ok(f, zccl_comm_count(comm, &n), "zccl_comm_count");
    if (r != expect_rank || n != expect_n)
        f("comm_rank/count gave " + std::to_string(r) + "/" + std::to_string(n) + ", expected " +
          std::to_string(expect_rank) + "/" + std::to_string(expect_n));
    std::vector<int64_t> in(1000), out(1000, -1);
    gen_fill(in.data(), ZCCL_INT64, Pattern::Additive, 77, expect_rank, 0, in.size());
    if (expect_ok(f, zccl_allreduce(in.data(), out.data(), in.size(), ZCCL_INT64, ZCCL_SUM, comm, nullptr),
                  "allreduce")) {
        Reference ref;
        ref.compute(ZCCL_INT64, ZCCL_SUM, 77, expect_n, 0, in.size());
        std::string first;
        if (ref.check(out.data(), 0, in.size(), &first)) f("allreduce result: " + first);
    }
    if (f.n) zccl_comm_abort(comm);
    else expect_ok(f, zccl_comm_destroy(comm), "zccl_comm_destroy");
    return f.n ? 1 : 0;
}

void run_init_env(int n, const char *rank_var, const char *size_var, bool with_secret) {
    int port = free_tcp_port();
    ASSERT_GT(port, 0);
    Options o;
    o.deadline_s = 90;
    o.init_comm = false;
    o.env = clean_launcher_env();
    o.rank_env = [=](int r) {
        EnvList e = {{rank_var, std::to_string(r)},
                     {size_var, std::to_string(n)},
                     {"MASTER_ADDR", std::string("127.0.0.1")},
                     {"MASTER_PORT", std::to_string(port)}};
        if (with_secret) e.push_back({"ZCCL_SECRET", std::string(kSecret)});
        return e;
    };
    run_ranks(n, [n](zccl_comm_t, int rank, int) { return init_env_body(rank, n); }, o);
}

TEST(InitEnv, TorchrunVariables) { run_init_env(3, "RANK", "WORLD_SIZE", true); }
TEST(InitEnv, OpenMpiVariables) { run_init_env(3, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", true); }
TEST(InitEnv, PmiVariables) { run_init_env(2, "PMI_RANK", "PMI_SIZE", true); }
TEST(InitEnv, DerivedSecretWithoutZcclSecret) { run_init_env(2, "RANK", "WORLD_SIZE", false); }

/* Missing or malformed variables: ZCCL_INVALID_ARGUMENT naming the variable, without waiting for a timeout. */
TEST(InitEnv, MissingOrMalformedVariablesAreNamed) {
    int port = free_tcp_port();
    struct Case {
        const char *name;
        EnvList env;
        const char *must_name;
    };
    const std::string p = std::to_string(port);
    std::vector<Case> cases = {
        {"no variables at all", {}, "RANK|WORLD_SIZE|SIZE|MASTER_ADDR|MASTER_PORT"},
        {"no MASTER_ADDR", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", p}, {"ZCCL_SECRET", kSecret}},
         "MASTER_ADDR"},
        {"no MASTER_PORT",
         {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"ZCCL_SECRET", kSecret}},
         "MASTER_PORT"},
        {"RANK not a number",
         {{"RANK", "zero"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", p},
          {"ZCCL_SECRET", kSecret}},
         "RANK"},
        {"RANK >= WORLD_SIZE",
         {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", p},
          {"ZCCL_SECRET", kSecret}},
         "RANK|WORLD_SIZE"},
        {"ZCCL_SECRET too short",
         {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", p},
          {"ZCCL_SECRET", "0123"}},
         "ZCCL_SECRET"},
        {"ZCCL_SECRET not hex",
         {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", p},
          {"ZCCL_SECRET", "0123456789abcdef0123456789abcdeg"}},
         "ZCCL_SECRET"},
    };
    ProcessGroup g(60);
    for (const Case &c : cases) {
        EnvList env = clean_launcher_env();
        env.insert(env.end(), c.env.begin(), c.env.end());
        std::string must = c.must_name, name = c.name;
        g.spawn(c.name, [must, name]() {
            zccl_comm_t comm = reinterpret_cast<zccl_comm_t>(0x1);
            zccl_result_t res = zccl_comm_init_env(&comm);
            const char *msg = zccl_get_last_error(nullptr);
            if (res != ZCCL_INVALID_ARGUMENT) {
                fprintf(stderr, "%s: zccl_comm_init_env returned %s (expected invalid argument): %s\n", name.c_str(),
                        zccl_get_error_string(res), msg);
                if (res == ZCCL_SUCCESS) zccl_comm_destroy(comm);
                return 1;
            }
            /* must: alternatives separated by '|' */
            bool named = false;
            for (size_t b = 0, e; b <= must.size(); b = e + 1) {
                e = must.find('|', b);
                if (e == std::string::npos) e = must.size();
                if (e > b && strstr(msg, must.substr(b, e - b).c_str())) named = true;
            }
            if (!named) {
                fprintf(stderr, "%s: message \"%s\" does not name %s\n", name.c_str(), msg, must.c_str());
                return 2;
            }
            if (comm != nullptr) {
                fprintf(stderr, "%s: *comm not set to NULL on failure\n", name.c_str());
                return 3;
            }
            return 0;
        }, env);
    }
    GroupResult r = g.wait_all();
    EXPECT_TRUE(r.all_ok()) << r.report();
}

}  // namespace

/* ------------------------------------------------------------------------------------------------------------ */
/* Self-tests of the harness and of the test's own reference arithmetic                                          */
/* ------------------------------------------------------------------------------------------------------------ */

namespace {

TEST(HarnessSelfTest, DeadlineKillsAndNamesRunningRanks) {
    Options o;
    o.deadline_s = 1.0;
    o.init_comm = false;
    o.expect_success = false;
    double t0 = now_s();
    GroupResult r = run_ranks(3, [](zccl_comm_t, int rank, int) {
        if (rank == 1) return 0;
        sleep(30);
        return 0;
    }, o);
    EXPECT_LT(now_s() - t0, 10.0);
    EXPECT_TRUE(r.deadline_exceeded);
    EXPECT_FALSE(r.all_ok());
    EXPECT_NE(r.report().find("deadline exceeded"), std::string::npos) << r.report();
    EXPECT_NE(r.report().find("ranks 0,2 still running"), std::string::npos) << r.report();
    EXPECT_TRUE(r.procs.at(1).ok());
    EXPECT_TRUE(r.procs.at(0).killed_at_deadline);
}

TEST(HarnessSelfTest, ExitCodesSignalsAndOutputAreReported) {
    Options o;
    o.deadline_s = 20;
    o.init_comm = false;
    o.expect_success = false;
    o.env = {{"ZT_SELFTEST_VAR", std::string("hello")}, {"ZT_SELFTEST_UNSET", std::nullopt}};
    setenv("ZT_SELFTEST_UNSET", "x", 1);
    GroupResult r = run_ranks(4, [](zccl_comm_t, int rank, int) -> int {
        const char *v = getenv("ZT_SELFTEST_VAR");
        if (!v || strcmp(v, "hello") != 0 || getenv("ZT_SELFTEST_UNSET")) return 9;
        child_log(rank, "output of rank %d", rank);
        if (rank == 1) return 3;
        if (rank == 2) raise(SIGSEGV);
        if (rank == 3) return 256; /* would wrap to 0: must still be a failure */
        return 0;
    }, o);
    unsetenv("ZT_SELFTEST_UNSET");
    ASSERT_EQ(r.procs.size(), 4u);
    EXPECT_TRUE(r.procs[0].ok()) << r.report();
    EXPECT_EQ(r.procs[1].exit_code, 3);
    EXPECT_EQ(r.procs[2].term_signal, SIGSEGV);
    EXPECT_FALSE(r.procs[3].ok());
    EXPECT_NE(r.procs[1].output.find("output of rank 1"), std::string::npos) << r.procs[1].output;
    std::string rep = r.report();
    EXPECT_NE(rep.find("rank 1 (pid"), std::string::npos) << rep;
    EXPECT_NE(rep.find("exited with code 3"), std::string::npos) << rep;
    EXPECT_NE(rep.find("killed by signal 11"), std::string::npos) << rep;
}

TEST(HarnessSelfTest, ShmBarrierSynchronisesAndAborts) {
    SharedMem m(sizeof(ShmBarrier) + sizeof(std::atomic<int>));
    ShmBarrier *bar = new (m.data()) ShmBarrier(3);
    std::atomic<int> *counter = new ((char *)m.data() + sizeof(ShmBarrier)) std::atomic<int>(0);
    Options o;
    o.init_comm = false;
    o.deadline_s = 30;
    run_ranks(3, [bar, counter](zccl_comm_t, int rank, int n) {
        for (int it = 0; it < 50; it++) {
            if (rank == it % n) usleep(1000);
            counter->fetch_add(1);
            if (!bar->wait(10)) return 1;
            if (counter->load() < n * (it + 1)) return 2;
        }
        return 0;
    }, o);
    ShmBarrier *bar2 = new (m.data()) ShmBarrier(2);
    o.expect_success = false;
    GroupResult r = run_ranks(2, [bar2](zccl_comm_t, int rank, int) {
        if (rank == 0) {
            bar2->abort();
            return 0;
        }
        usleep(100000);
        return bar2->wait(10) ? 1 : 0; /* aborted: returns false at once */
    }, o);
    EXPECT_TRUE(r.all_ok()) << r.report();
}

TEST(HarnessSelfTest, GuardedBufferDetectsOverruns) {
    GuardedBuf b;
    b.reset(10);
    EXPECT_TRUE(b.guards_ok());
    EXPECT_TRUE(b.all_bytes(0, 10, GuardedBuf::kPoison));
    b.p()[10] = 0;
    std::string why;
    EXPECT_FALSE(b.guards_ok(&why));
    EXPECT_NE(why.find("+0"), std::string::npos) << why;
    b.reset(10);
    b.p()[-1] = 0;
    EXPECT_FALSE(b.guards_ok(&why));
    b.reset(0);
    EXPECT_TRUE(b.guards_ok());
}

/* The test's own float16/bfloat16 conversions agree with the library's on every encoding (a disagreement means
 * one of the two is wrong). */
TEST(HarnessSelfTest, HalfConversionsAgreeWithLibrary) {
    for (uint32_t h = 0; h < 65536; h++) {
        float a = f16_to_f32((uint16_t)h), b = zccl_half_to_float((uint16_t)h);
        if (std::isnan(a)) EXPECT_TRUE(std::isnan(b)) << "half 0x" << std::hex << h;
        else ASSERT_EQ(a, b) << "half 0x" << std::hex << h;
        float c = bf16_to_f32((uint16_t)h), d = zccl_bf16_to_float((uint16_t)h);
        if (std::isnan(c)) EXPECT_TRUE(std::isnan(d)) << "bf16 0x" << std::hex << h;
        else ASSERT_EQ(c, d) << "bf16 0x" << std::hex << h;
    }
    uint32_t x = 12345;
    for (int i = 0; i < 200000; i++) {
        x = x * 1664525u + 1013904223u;
        float f;
        memcpy(&f, &x, 4);
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_f16(f), zccl_float_to_half(f)) << "float bits 0x" << std::hex << x;
        ASSERT_EQ(f32_to_bf16(f), zccl_float_to_bf16(f)) << "float bits 0x" << std::hex << x;
    }
}

/* The reference arithmetic on a case small enough to do by hand. */
TEST(HarnessSelfTest, ReferenceMatchesHandComputation) {
    const int n = 3;
    for (zccl_datatype_t dt : kTypes)
        for (zccl_redop_t op : kOps) {
            const size_t c = 5, sz = dtype_bytes(dt);
            std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(c * sz));
            for (int r = 0; r < n; r++) gen_fill(in[r].data(), dt, pattern_for(op), 42, r, 0, c);
            Reference ref;
            ref.compute(dt, op, 42, n, 0, c);
            for (size_t i = 0; i < c; i++) {
                if (dtype_is_float(dt)) {
                    double v[n], acc;
                    for (int r = 0; r < n; r++) v[r] = elem_as_double(in[r].data(), dt, i);
                    switch (op) {
                    case ZCCL_SUM: acc = v[0] + v[1] + v[2]; break;
                    case ZCCL_PROD: acc = v[0] * v[1] * v[2]; break;
                    case ZCCL_MAX: acc = std::max({v[0], v[1], v[2]}); break;
                    case ZCCL_MIN: acc = std::min({v[0], v[1], v[2]}); break;
                    default: acc = (v[0] + v[1] + v[2]) / 3; break;
                    }
                    double want;
                    memcpy(&want, &ref.vals[i], 8);
                    EXPECT_EQ(acc, want) << dtype_name(dt) << " " << op_name(op) << " element " << i;
                } else {
                    /* integers via __int128: wrap explicitly at the type's width */
                    const unsigned bits = (unsigned)(8 * sz);
                    const bool sgn = dt == ZCCL_INT8 || dt == ZCCL_INT32 || dt == ZCCL_INT64;
                    __int128 v[n];
                    for (int r = 0; r < n; r++) {
                        uint64_t u = elem_bits(in[r].data(), dt, i);
                        if (sgn && bits < 64 && (u >> (bits - 1)) & 1) v[r] = (__int128)u - ((__int128)1 << bits);
                        else if (sgn && bits == 64) v[r] = (int64_t)u;
                        else v[r] = u;
                    }
                    const __int128 mod = (__int128)1 << bits;
                    auto wrap = [&](__int128 a) {
                        a %= mod;
                        if (a < 0) a += mod;
                        return a; /* in [0, 2^bits) */
                    };
                    __int128 acc;
                    switch (op) {
                    case ZCCL_SUM: acc = wrap(v[0] + v[1] + v[2]); break;
                    case ZCCL_PROD: {
                        typedef unsigned __int128 u128;
                        const u128 m = (u128)mod;
                        u128 p = ((u128)wrap(v[0]) * (u128)wrap(v[1])) % m;
                        acc = (__int128)((p * (u128)wrap(v[2])) % m);
                        break;
                    }
                    case ZCCL_MAX: acc = wrap(std::max({v[0], v[1], v[2]})); break;
                    case ZCCL_MIN: acc = wrap(std::min({v[0], v[1], v[2]})); break;
                    default: {
                        __int128 s = wrap(v[0] + v[1] + v[2]);
                        if (sgn && s >= mod / 2) s -= mod; /* the wrapped sum, as the signed type */
                        acc = wrap(s / 3);                 /* C division truncates toward zero */
                        break;
                    }
                    }
                    EXPECT_EQ((uint64_t)acc, ref.vals[i]) << dtype_name(dt) << " " << op_name(op) << " element " << i;
                }
            }
        }
}

}  // namespace
