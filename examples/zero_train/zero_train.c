/*
 * zero_train — data-parallel / ZeRO training of a small MLP on real handwritten digits, with zccl.
 *
 *   zcclrun -n 4 build/examples/zero_train --stage 0|1|2|3 --epochs E --accum K --clip C --seed S
 *
 * Model 64-256-256-10 (ReLU), softmax cross-entropy, AdamW with decoupled weight decay, global-norm gradient
 * clipping, gradient accumulation over K micro-steps, learning rate scaled linearly with the global batch
 * (Goyal et al., "Accurate, large minibatch SGD", 2017). Weights are drawn from --seed on rank 0 and broadcast.
 * The global batch (--batch) is fixed, so the micro-batch per rank is batch / (ranks * accum): runs on 1 and on N
 * ranks see the same samples per optimizer step and follow the same loss curve. Output (rank 0): per-epoch loss
 * and held-out accuracy, per-rank memory beside the ZeRO formulas, bytes communicated, and a last line
 *   final loss=L accuracy=A bytes_sent=B
 * Data: --data PATH; without it, the first of ../shared/data/digits.csv.gz beside the source tree and the cache file
 * ${XDG_CACHE_HOME:-~/.cache}/zccl/digits.csv.gz that exists; when neither does, rank 0 runs
 * examples/zero_train/fetch_digits.sh, which takes the set from Debian's python3-sklearn package into that cache.
 */
#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zccl.h>

#include "bytes.h"
#include "digits.h"
#include "mlp.h"
#include "shard.h"

#ifndef ZT_SHARED_DATA /* set by examples/CMakeLists.txt: the source tree's ../shared/data/digits.csv.gz */
#define ZT_SHARED_DATA "../shared/data/digits.csv.gz"
#endif
#ifndef ZT_FETCH_SCRIPT /* set by examples/CMakeLists.txt: the source tree's examples/zero_train/fetch_digits.sh */
#define ZT_FETCH_SCRIPT "examples/zero_train/fetch_digits.sh"
#endif

#define NLAYERS 3
static const int dims[NLAYERS + 1] = {ZT_PIXELS, 256, 256, ZT_CLASSES};

typedef struct {
    int stage, epochs, accum, batch;
    double clip, lr_per32, wd;
    unsigned long long seed;
    const char *data;
    size_t first_bytes, cap_bytes;
    int in_flight;
    size_t max_live;
    int heldout_percent;
    int offload, pin; /* --offload cpu, --pin-memory */
    zccl_wire_t grad_wire, weight_wire; /* --wire, --weight-wire (ZeRO++ qgZ, qwZ) */
    int hpz;                            /* --hpz (ZeRO++ hpZ) */
    int error_feedback;                 /* --error-feedback (with a quantized --wire) */
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: zero_train [--stage 0|1|2|3] [--epochs E] [--accum K] [--batch B] [--clip C] [--seed S]\n"
            "                  [--lr LR] [--weight-decay WD] [--data PATH] [--first-bucket BYTES]\n"
            "                  [--bucket-cap BYTES] [--in-flight K] [--max-live BYTES] [--offload cpu [--pin-memory]]\n"
            "                  [--wire FORMAT [--error-feedback]] [--weight-wire FORMAT] [--hpz]\n"
            "  --stage S          ZeRO stage (default 0): 0 data parallel, 1 optimizer state sharded, 2 + gradients,\n"
            "                     3 + parameters\n"
            "  --epochs E         passes over the training part (default 12)\n"
            "  --accum K          micro-steps accumulated per optimizer step (default 1)\n"
            "  --batch B          global batch in samples, a multiple of ranks*K (default 64)\n"
            "  --clip C           clip the global gradient norm to C (0: no clipping; default 1)\n"
            "  --seed S           weight initialisation and sample order (default 1)\n"
            "  --lr LR            AdamW learning rate per 32 samples of global batch, scaled linearly (default 5e-4)\n"
            "  --weight-decay WD  decoupled weight decay of the weight matrices (default 1e-4)\n"
            "  --data PATH        digits.csv.gz (default: " ZT_SHARED_DATA " if present, else\n"
            "                     ${XDG_CACHE_HOME:-~/.cache}/zccl/digits.csv.gz, fetched there by rank 0 with\n"
            "                     " ZT_FETCH_SCRIPT " when absent)\n"
            "  --first-bucket N   bytes of the first gradient bucket (default 16K)\n"
            "  --bucket-cap N     bytes of the other gradient buckets (default 256K)\n"
            "  --in-flight K      most buckets communicating at once (0 or absent: ZCCL_BUCKETS_IN_FLIGHT, default 2)\n"
            "  --max-live BYTES   stage 3: bound on gathered layer bytes (default: ZCCL_ZERO3_MAX_LIVE_BYTES, 1G)\n"
            "  --offload cpu      stages 1, 2: AdamW state (master shard, moments) in host memory, the update on the\n"
            "                     CPU (zccl_zero_offload); same results bit for bit\n"
            "  --pin-memory       with --offload cpu: page-locked host memory when a CUDA driver is present\n"
            "  --wire FORMAT      the gradient buckets' wire format (ZeRO++ qgZ): full (default), int8, int4, fp8e4m3,\n"
            "                     fp8e5m2 (block-quantized, error bounds in include/zccl.h; docs/zero.md)\n"
            "  --error-feedback   with a quantized --wire: each rank carries its gradient quantization residual to the\n"
            "                     bucket's next launch (zccl_bucket_options_t.error_feedback; EF-SGD)\n"
            "  --weight-wire FMT  stage 3: the layer gathers' wire format (ZeRO++ qwZ; int8 is ZeRO++'s), default full\n"
            "  --hpz              stage 3: hierarchical partitioning (ZeRO++ hpZ): a layer's backward gather stays\n"
            "                     inside the host, from a per-host copy of its forward gather (hosts: ZCCL_HOST_ID or\n"
            "                     the real host, as zccl_hier.h)\n"
            "Sizes take K, M, G suffixes (binary: 256K = 262144 bytes). Under a launcher, only rank 0 reports a\n"
            "bad option.\n"
            "Layer l's weights and bias form one flat parameter (one bucket-plan parameter, one ZeRO-3 layer);\n"
            "stage 3 uses one bucket per layer so that gradient and parameter shards coincide.\n");
}

/* Every rank parses the same command line: under a launcher (RANK set) only rank 0 says what is wrong with it. */
static int opts_loud(void)
{
    const char *r = getenv("RANK");
    return !r || !strcmp(r, "0");
}

static int parse_num(const char *opt, const char *s, double lo, double hi, int integer, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s ? s : "", &end);
    if (!s || end == s || *end || errno || !(v >= lo && v <= hi) || (integer && v != floor(v))) {
        if (opts_loud())
            fprintf(stderr, "zero_train: %s needs %s in [%g, %g], got '%s'\n", opt,
                    integer ? "an integer" : "a number", lo, hi, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_size(const char *opt, const char *s, uint64_t lo, size_t *out)
{
    uint64_t v;
    if (zccl__parse_bytes(s, &v) != 0 || v < lo || v > SIZE_MAX) {
        if (opts_loud())
            fprintf(stderr, "zero_train: %s needs a byte size of at least %llu (e.g. 4096, 256K, 25M), got '%s'\n",
                    opt, (unsigned long long)lo, s ? s : "");
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.stage = 0, .epochs = 12, .accum = 1, .batch = 64, .clip = 1.0, .lr_per32 = 5e-4, .wd = 1e-4,
                  .seed = 1, .data = NULL, .first_bytes = 16384, .cap_bytes = 262144,
                  .heldout_percent = 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
#define NUM(name, lo, hi, integer, dst)                                                                                       \
    if (!strcmp(a, name)) {                                                                                           \
        if (parse_num(name, v, lo, hi, integer, &d)) return -1;                                                                \
        dst;                                                                                                          \
        i++;                                                                                                          \
        continue;                                                                                                     \
    }
        NUM("--stage", 0, 3, 1, o->stage = (int)d)
        NUM("--epochs", 1, 100000, 1, o->epochs = (int)d)
        NUM("--accum", 1, 4096, 1, o->accum = (int)d)
        NUM("--batch", 1, 1 << 20, 1, o->batch = (int)d)
        NUM("--clip", 0, 1e30, 0, o->clip = d)
        NUM("--seed", 0, 9007199254740992.0, 1, o->seed = (unsigned long long)d)
        NUM("--lr", 0, 10, 0, o->lr_per32 = d)
        NUM("--weight-decay", 0, 10, 0, o->wd = d)
        NUM("--in-flight", 0, 64, 1, o->in_flight = (int)d)
#undef NUM
#define SIZE(name, lo, dst)                                                                                           \
    if (!strcmp(a, name)) {                                                                                           \
        if (parse_size(name, v, lo, &dst)) return -1;                                                                 \
        i++;                                                                                                          \
        continue;                                                                                                     \
    }
        SIZE("--first-bucket", 8, o->first_bytes)
        SIZE("--bucket-cap", 8, o->cap_bytes)
        SIZE("--max-live", 0, o->max_live)
#undef SIZE
        if (!strcmp(a, "--offload")) {
            if (!v || (strcmp(v, "cpu") && strcmp(v, "none"))) {
                if (opts_loud()) fprintf(stderr, "zero_train: --offload needs cpu or none, got '%s'\n", v ? v : "");
                return -1;
            }
            o->offload = !strcmp(v, "cpu");
            i++;
            continue;
        }
        if (!strcmp(a, "--wire") || !strcmp(a, "--weight-wire")) {
            zccl_wire_t w = ZCCL_NUM_WIRES;
            for (int k = 0; k < ZCCL_NUM_WIRES && v; k++)
                if (!strcmp(v, zccl_wire_name((zccl_wire_t)k))) w = (zccl_wire_t)k;
            if (w == ZCCL_NUM_WIRES) {
                if (opts_loud())
                    fprintf(stderr, "zero_train: %s needs full, int8, int4, fp8e4m3 or fp8e5m2, got '%s'\n", a,
                            v ? v : "");
                return -1;
            }
            *(!strcmp(a, "--wire") ? &o->grad_wire : &o->weight_wire) = w;
            i++;
            continue;
        }
        if (!strcmp(a, "--pin-memory")) {
            o->pin = 1;
            continue;
        }
        if (!strcmp(a, "--hpz")) {
            o->hpz = 1;
            continue;
        }
        if (!strcmp(a, "--error-feedback")) {
            o->error_feedback = 1;
            continue;
        }
        if (!strcmp(a, "--data") && v) {
            o->data = v;
            i++;
            continue;
        }
        if (opts_loud()) {
            fprintf(stderr, "zero_train: unknown or incomplete option '%s'\n", a);
            usage(stderr);
        }
        return -1;
    }
    return 0;
}

#define CHECK(call)                                                                                                   \
    do {                                                                                                              \
        zccl_result_t r_ = (call);                                                                                    \
        if (r_ != ZCCL_SUCCESS) {                                                                                     \
            fprintf(stderr, "zero_train rank %d: %.*s failed: %s: %s\n", rank, (int)strcspn(#call, "("), #call,  \
                    zccl_get_error_string(r_), zccl_get_last_error(comm));                                            \
            zccl_comm_abort(comm);                                                                                    \
            return 1;                                                                                                 \
        }                                                                                                             \
    } while (0)

/* Activations of one micro-batch of up to cap samples. */
typedef struct {
    double *in, *z[NLAYERS], *h[NLAYERS], *dz, *dh;
    int *y;
} acts_t;

static int acts_alloc(acts_t *a, size_t cap)
{
    a->in = malloc(cap * ZT_PIXELS * sizeof(double));
    a->y = malloc(cap * sizeof(int));
    a->dz = malloc(cap * 256 * sizeof(double));
    a->dh = malloc(cap * 256 * sizeof(double));
    int ok = a->in && a->y && a->dz && a->dh;
    for (int l = 0; l < NLAYERS; l++) {
        a->z[l] = malloc(cap * dims[l + 1] * sizeof(double));
        a->h[l] = malloc(cap * dims[l + 1] * sizeof(double));
        ok = ok && a->z[l] && a->h[l];
    }
    return ok ? 0 : -1;
}

static void acts_free(acts_t *a)
{
    free(a->in);
    free(a->y);
    free(a->dz);
    free(a->dh);
    for (int l = 0; l < NLAYERS; l++) {
        free(a->z[l]);
        free(a->h[l]);
    }
}

/* Forward through every layer; stage 3 gathers each layer's parameters just before it runs (eval: by hand). */
static zccl_result_t forward(zt_zero_t *z, acts_t *a, size_t m, int eval)
{
    const double *in = a->in;
    for (int l = 0; l < NLAYERS; l++) {
        const double *W;
        zccl_result_t r = eval ? zt_zero_eval_fetch(z, l, &W) : zt_zero_fetch(z, l, &W);
        if (r != ZCCL_SUCCESS) return r;
        zt_linear_forward(in, m, dims[l], dims[l + 1], W, W + (size_t)dims[l] * dims[l + 1], a->z[l]);
        if (!eval && (r = zt_zero_release(z, l)) != ZCCL_SUCCESS) return r;
        if (l < NLAYERS - 1) zt_relu(a->z[l], a->h[l], m * dims[l + 1]);
        in = a->h[l];
    }
    return ZCCL_SUCCESS;
}

/* Backward, last layer first; each layer's gradient goes to the bucket scheduler as soon as it is complete. */
static zccl_result_t backward(zt_zero_t *z, acts_t *a, size_t m)
{
    /* a->dz holds dLoss/dz of the last layer */
    double *dz = a->dz, *dh = a->dh;
    for (int l = NLAYERS - 1; l >= 0; l--) {
        const double *in = l ? a->h[l - 1] : a->in;
        const double *W = NULL;
        double *g;
        zccl_result_t r = ZCCL_SUCCESS;
        if (l > 0) r = zt_zero_fetch(z, l, &W); /* the first layer needs no input gradient, so no weights */
        if (r == ZCCL_SUCCESS) r = zt_zero_grad(z, l, &g);
        if (r != ZCCL_SUCCESS) return r;
        zt_linear_backward(in, dz, m, dims[l], dims[l + 1], W, g, g + (size_t)dims[l] * dims[l + 1], l ? dh : NULL);
        if (l > 0 && (r = zt_zero_release(z, l)) != ZCCL_SUCCESS) return r;
        if ((r = zt_zero_grad_ready(z, l)) != ZCCL_SUCCESS) return r;
        if (l > 0) {
            zt_relu_backward(dh, a->z[l - 1], m * dims[l]);
            double *t = dz;
            dz = dh;
            dh = t;
        }
    }
    return ZCCL_SUCCESS;
}

/* The cache file: ${XDG_CACHE_HOME:-$HOME/.cache}/zccl/digits.csv.gz (empty when neither variable is set). */
static void cache_path(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(buf, len, "%s/zccl/digits.csv.gz", xdg);
    else if (home && *home) snprintf(buf, len, "%s/.cache/zccl/digits.csv.gz", home);
    else buf[0] = '\0';
}

static int readable(const char *path)
{
    FILE *f = path[0] ? fopen(path, "rb") : NULL;
    if (f) fclose(f);
    return f != NULL;
}

/* The data file when --data is absent: ../shared's copy, else the cache file. When neither exists and fetch is set
 * (rank 0), fetch_digits.sh fills the cache first, telling the user where the file goes. Returns 0 with the path in
 * buf, or -1 with the reason in err. */
static int find_data(char *buf, size_t len, int fetch, char *err, size_t errlen)
{
    if (readable(ZT_SHARED_DATA)) {
        snprintf(buf, len, "%s", ZT_SHARED_DATA);
        return 0;
    }
    cache_path(buf, len);
    if (!buf[0]) {
        snprintf(err, errlen, "no --data given, %s is absent and neither XDG_CACHE_HOME nor HOME is set",
                 ZT_SHARED_DATA);
        return -1;
    }
    if (readable(buf)) return 0;
    if (fetch) {
        char cmd[2 * 4096 + 64];
        fprintf(stderr, "zero_train: %s is absent; fetching the digits set into %s\n", ZT_SHARED_DATA, buf);
        snprintf(cmd, sizeof cmd, "'%s' '%s' >&2", ZT_FETCH_SCRIPT, buf); /* build-time paths, no quotes in them */
        if (strchr(buf, '\'') || system(cmd) != 0 || !readable(buf)) {
            snprintf(err, errlen, "%s could not fetch the digits set into %s (give it with --data PATH)",
                     ZT_FETCH_SCRIPT, buf);
            return -1;
        }
        return 0;
    }
    snprintf(err, errlen, "%s is absent (fetch it with %s, or give --data PATH)", buf, ZT_FETCH_SCRIPT);
    return -1;
}

static void fmt_bytes(char *buf, size_t len, double b)
{
    snprintf(buf, len, "%.0f", b);
}

int main(int argc, char **argv)
{
    opts_t o;
    const int bad_opts = parse_opts(argc, argv, &o) != 0;
    if (bad_opts && !getenv("RANK")) return 2; /* not under a launcher: the message is out */
    zccl_comm_t comm;
    zccl_result_t res = zccl_comm_init_env(&comm);
    if (res != ZCCL_SUCCESS) {
        fprintf(stderr, "zero_train: zccl_comm_init_env: %s: %s\n", zccl_get_error_string(res),
                zccl_get_last_error(NULL));
        return bad_opts ? 2 : 1;
    }
    int rank, n;
    zccl_comm_rank(comm, &rank);
    zccl_comm_count(comm, &n);
    /* Errors only rank 0 reports end with a barrier: a rank that exited first would make the launcher stop rank 0
     * before its message is out. */
    if (bad_opts) {
        zccl_barrier(comm, NULL);
        zccl_comm_destroy(comm);
        return 2;
    }
    if (o.batch % (n * o.accum)) {
        if (rank == 0)
            fprintf(stderr, "zero_train: --batch %d is not a multiple of ranks (%d) x --accum (%d)\n", o.batch, n,
                    o.accum);
        zccl_barrier(comm, NULL);
        zccl_comm_destroy(comm);
        return 2;
    }
    if ((o.offload && o.stage != 1 && o.stage != 2) || (o.pin && !o.offload) ||
        (o.weight_wire != ZCCL_WIRE_FULL && o.stage != 3) || (o.hpz && o.stage != 3) ||
        (o.error_feedback && o.grad_wire == ZCCL_WIRE_FULL)) {
        if (rank == 0)
            fprintf(stderr, "zero_train: %s\n",
                    o.pin && !o.offload                           ? "--pin-memory needs --offload cpu"
                    : o.offload && o.stage != 1 && o.stage != 2 ? "--offload cpu needs --stage 1 or 2"
                    : o.hpz && o.stage != 3                     ? "--hpz needs --stage 3 (ZeRO-3 gathers layers)"
                    : o.error_feedback && o.grad_wire == ZCCL_WIRE_FULL
                        ? "--error-feedback needs a quantized --wire (int8, int4, fp8e4m3, fp8e5m2)"
                                                                : "--weight-wire needs --stage 3 (ZeRO-3 gathers layers)");
        zccl_barrier(comm, NULL);
        zccl_comm_destroy(comm);
        return 2;
    }
    size_t micro = (size_t)(o.batch / (n * o.accum));

    /* Every rank reads the file (small); a failure on any rank stops all of them together. */
    zt_digits_t all, train, held;
    char err[8192 + 512] = "", found[4096];
    double bad = 0;
    if (!o.data) {
        /* Rank 0 fetches when needed while the others wait in the all-reduce; then every rank looks (a rank on
         * another host without the file fetches it there too). */
        if (rank == 0 && find_data(found, sizeof found, 1, err, sizeof err)) {
            fprintf(stderr, "zero_train rank 0: %s\n", err);
            bad = 1;
        }
        CHECK(zccl_allreduce(&bad, &bad, 1, ZCCL_FLOAT64, ZCCL_SUM, comm, NULL));
        if (bad > 0) {
            zccl_comm_destroy(comm);
            return 3;
        }
        if (rank != 0 && find_data(found, sizeof found, 1, err, sizeof err)) {
            fprintf(stderr, "zero_train rank %d: %s\n", rank, err);
            bad = 1;
        }
        o.data = found;
    }
    if (!bad && zt_digits_load(o.data, &all, err, sizeof err)) {
        fprintf(stderr, "zero_train rank %d: %s (without --data, zero_train finds or fetches the set itself)\n", rank,
                err);
        bad = 1;
    }
    CHECK(zccl_allreduce(&bad, &bad, 1, ZCCL_FLOAT64, ZCCL_SUM, comm, NULL));
    if (bad > 0) {
        zccl_comm_destroy(comm);
        return 3;
    }
    zt_digits_split(&all, o.heldout_percent, &train, &held);
    size_t steps = train.n / (size_t)o.batch;
    if (steps == 0) {
        if (rank == 0) fprintf(stderr, "zero_train: --batch %d exceeds the %zu training samples\n", o.batch, train.n);
        zccl_barrier(comm, NULL);
        zccl_comm_destroy(comm);
        return 2;
    }
    double lr = o.lr_per32 * o.batch / 32.0;

    size_t numel[NLAYERS], nweights[NLAYERS];
    for (int l = 0; l < NLAYERS; l++) {
        nweights[l] = (size_t)dims[l] * dims[l + 1];
        numel[l] = nweights[l] + (size_t)dims[l + 1]; /* [W | b] */
    }
    zt_zero_t z;
    CHECK(zt_zero_init(&z, comm, o.stage, NLAYERS, numel, nweights, o.first_bytes, o.cap_bytes, o.in_flight,
                       o.max_live, o.grad_wire, o.weight_wire, o.hpz, o.error_feedback));

    /* He-uniform weights (He et al., ICCV 2015), zero biases, drawn from --seed on rank 0 and broadcast. */
    double *init[NLAYERS] = {NULL};
    for (int l = 0; rank == 0 && l < NLAYERS; l++) {
        if (!(init[l] = calloc(numel[l], sizeof(double)))) {
            fprintf(stderr, "zero_train: out of memory\n");
            zccl_comm_abort(comm);
            return 1;
        }
    }
    unsigned long long init_state = o.seed;
    for (int l = 0; rank == 0 && l < NLAYERS; l++) {
        double lim = sqrt(6.0 / dims[l]);
        for (size_t i = 0; i < nweights[l]; i++) init[l][i] = (2.0 * zt_rand_uniform(&init_state) - 1.0) * lim;
    }
    CHECK(zt_zero_set_params(&z, init));
    if (o.offload) CHECK(zt_zero_offload(&z, o.pin));
    for (int l = 0; l < NLAYERS; l++) free(init[l]);

    size_t eval_cap = (held.n + n - 1) / n;
    acts_t a;
    if (acts_alloc(&a, micro > eval_cap ? micro : eval_cap)) {
        fprintf(stderr, "zero_train rank %d: out of memory for activations\n", rank);
        zccl_comm_abort(comm);
        return 1;
    }
    size_t *order = malloc(train.n * sizeof *order);
    if (!order) {
        zccl_comm_abort(comm);
        return 1;
    }

    if (rank == 0) {
        if (o.offload) printf("zero_train: CPU offload of the optimizer (zccl_zero_offload)%s\n",
                              o.pin ? ", pinned host memory" : "");
        printf("zero_train: stage %d, %d ranks, global batch %d = %zu samples x %d micro-steps x %d ranks, "
               "lr %g (%g per 32 samples), clip %g, weight decay %g, seed %llu\n",
               o.stage, n, o.batch, micro, o.accum, n, lr, o.lr_per32, o.clip, o.wd, o.seed);
        printf("zero_train: data %s: %zu samples, %zu train, %zu held out; %zu steps per epoch\n", o.data, all.n,
               train.n, held.n, steps);
        printf("zero_train: model 64-256-256-10, psi = %zu parameters in %d layers; %d buckets (zccl bucket plan, "
               "reverse definition order):", z.psi, NLAYERS, z.nbuckets);
        for (int b = 0; b < z.nbuckets; b++) printf(" %zu", z.info[b].elems * sizeof(double));
        printf(" bytes\n");
    }

    double last_loss = 0, last_acc = 0;
    double train_s = 0; /* wall time of the optimizer steps (forward, backward, communication, update), no evaluation */
    unsigned long long order_state = o.seed ^ 0xD1B54A32D192ED03ULL;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        for (size_t i = 0; i < train.n; i++) order[i] = i;
        zt_shuffle(order, train.n, &order_state);
        double sums[2] = {0, 0}; /* loss, correct */
        double norm_max = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (size_t s = 0; s < steps; s++) {
            for (int k = 0; k < o.accum; k++) {
                CHECK(zt_zero_begin_micro(&z, k == o.accum - 1));
                size_t base = s * (size_t)o.batch + (size_t)k * n * micro + (size_t)rank * micro;
                for (size_t j = 0; j < micro; j++) {
                    size_t id = order[base + j];
                    memcpy(a.in + j * ZT_PIXELS, train.x + id * ZT_PIXELS, ZT_PIXELS * sizeof(double));
                    a.y[j] = train.y[id];
                }
                CHECK(forward(&z, &a, micro, 0));
                zt_softmax_xent(a.z[NLAYERS - 1], a.y, micro, ZT_CLASSES, a.dz, &sums[0], &sums[1]);
                CHECK(backward(&z, &a, micro));
                CHECK(zt_zero_end_micro(&z));
            }
            double norm;
            CHECK(zt_zero_step(&z, lr, 0.9, 0.999, 1e-8, o.wd, o.clip, (double)o.batch, &norm));
            if (norm > norm_max) norm_max = norm;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        train_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CHECK(zt_zero_sum(&z, sums, 2));
        last_loss = sums[0] / (double)(steps * (size_t)o.batch);

        /* held-out evaluation: rank r takes samples r, r+n, ...; counts summed over ranks */
        size_t m = 0;
        for (size_t i = (size_t)rank; i < held.n; i += (size_t)n, m++) {
            memcpy(a.in + m * ZT_PIXELS, held.x + i * ZT_PIXELS, ZT_PIXELS * sizeof(double));
            a.y[m] = held.y[i];
        }
        CHECK(forward(&z, &a, m, 1));
        double ev[2] = {0, 0};
        zt_softmax_xent(a.z[NLAYERS - 1], a.y, m, ZT_CLASSES, NULL, &ev[0], &ev[1]);
        CHECK(zt_zero_sum(&z, ev, 2));
        last_acc = ev[1] / (double)held.n;
        if (rank == 0)
            printf("epoch %d loss=%.15e train_accuracy=%.4f heldout_loss=%.6f accuracy=%.4f max_grad_norm=%.4f\n",
                   epoch, last_loss, sums[1] / (double)(steps * (size_t)o.batch), ev[0] / (double)held.n, last_acc,
                   norm_max);
    }

    /* Memory per rank next to the ZeRO accounting. This example keeps everything in float64: 8 bytes per parameter
     * and per gradient, AdamW m and v 16 bytes (K = 16); the paper's mixed-precision Adam is 2 + 2 + K=12. */
    double psi = (double)z.psi;
    size_t mp, mg, mo, mw;
    zt_zero_memory(&z, &mp, &mg, &mo, &mw);
    double pb = (double)mp, gb = (double)mg, ob = (double)mo;
    double fp = 8 * psi / (o.stage == 3 ? n : 1), fg = 8 * psi / (o.stage >= 2 ? n : 1);
    double fo = 16 * psi / (o.stage >= 1 ? n : 1);
    double sent = z.sent_grads + z.sent_params + z.sent_other;
    double total_steps = (double)steps * o.epochs;
    if (rank == 0) {
        char b1[32], b2[32];
        printf("memory per rank (bytes; fp64 params and grads, AdamW m+v: K=16; formulas with psi=%zu, N=%d):\n",
               z.psi, n);
        fmt_bytes(b1, sizeof b1, pb), fmt_bytes(b2, sizeof b2, fp);
        printf("  parameters %12s   formula %s = %s\n", b1, o.stage == 3 ? "8 psi/N" : "8 psi  ", b2);
        fmt_bytes(b1, sizeof b1, gb), fmt_bytes(b2, sizeof b2, fg);
        printf("  gradients  %12s   formula %s = %s\n", b1, o.stage >= 2 ? "8 psi/N" : "8 psi  ", b2);
        fmt_bytes(b1, sizeof b1, ob), fmt_bytes(b2, sizeof b2, fo);
        printf("  optimizer  %12s   formula %s = %s\n", b1, o.stage >= 1 ? "16psi/N" : "16psi  ", b2);
        printf("  working buffers %zu bytes (reduce-scatter bucket buffers; stage 3: + peak gathered layers)\n", mw);
        if (z.hpz_g)
            printf("  hpZ secondary partition %zu bytes (8 psi/G for G = %d ranks per host, padded)\n", z.hpz_bytes,
                   z.hpz_g);
        if (o.error_feedback) {
            size_t res = 0, big = 0;
            for (int b = 0; b < z.nbuckets; b++) {
                res += z.info[b].elems;
                if (z.info[b].elems > big) big = z.info[b].elems;
            }
            printf("  error feedback residuals %zu bytes (float32 per bucket element: 4 psi, padded) + one bucket's "
                   "scratch %zu bytes\n", res * 4, big * 4);
        }
        printf("  paper, mixed-precision Adam (2+2+12)psi: stage %d = %.0f bytes per rank\n", o.stage,
               2 * psi / (o.stage == 3 ? n : 1) + 2 * psi / (o.stage >= 2 ? n : 1) + 12 * psi / (o.stage >= 1 ? n : 1));
        printf("bytes sent per rank: gradients %.0f, parameters %.0f, other %.0f (loss, norm, evaluation, "
               "initial broadcast); per optimizer step: gradients %.0f, parameters %.0f\n",
               z.sent_grads, z.sent_params, z.sent_other, z.sent_grads / total_steps,
               z.sent_params / total_steps);
        zt_zero_report(&z, stdout);
        printf("step time: %.3f ms per optimizer step on rank 0 (%.0f steps, training only, evaluation excluded)\n",
               1e3 * train_s / total_steps, total_steps);
        printf("final loss=%.15e accuracy=%.4f bytes_sent=%.0f stage=%d ranks=%d params_bytes=%.0f grads_bytes=%.0f "
               "optimizer_bytes=%.0f psi=%zu grad_wire=%s weight_wire=%s grads_sent_per_step=%.0f "
               "params_sent_per_step=%.0f hpz=%d params_in_host_per_step=%.0f hpz_bytes=%zu error_feedback=%d\n",
               last_loss, last_acc, sent, o.stage, n, pb, gb, ob, z.psi, zccl_wire_name(o.grad_wire),
               zccl_wire_name(o.weight_wire), z.sent_grads / total_steps, z.sent_params / total_steps, o.hpz,
               z.sent_params_host / total_steps, z.hpz_bytes, o.error_feedback);
    }
    fflush(stdout);
    zt_zero_free(&z);
    acts_free(&a);
    zt_digits_free(&all);
    zt_digits_free(&train);
    zt_digits_free(&held);
    free(order);
    zccl_comm_destroy(comm);
    return 0;
}
