/*
 * zccl-zero-plan — per-rank memory, gradient buckets and communication volume of data-parallel / ZeRO training of
 * a model, from its parameter shapes (the TSV files in ../shared/models: name<TAB>shape<TAB>numel, '#' comments).
 *
 *   zccl-zero-plan --model FILE --ranks N --stage S [--dtype bf16|fp16|fp32] [--optimizer adam|sgd]
 *                  [--first-bucket BYTES] [--bucket-cap BYTES] [--align ELEMS] [--list-buckets]
 *                  [--offload cpu [--pin-memory]] [--tp T] [--pp P]
 *
 * Memory follows the ZeRO paper's accounting (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
 * Trillion Parameter Models", SC 2020, section 3.1 and Figure 1): with psi parameters, B bytes per parameter and
 * per gradient in the training dtype and K bytes of optimizer state per parameter, a rank holds
 *   stage 0: (B + B + K) psi   stage 1: (B + B) psi + K psi/N   stage 2: B psi + (B + K) psi/N   stage 3: (B+B+K) psi/N.
 * K: mixed-precision Adam 12 (fp32 master parameters, momentum, variance); fp32 Adam 8 (momentum, variance);
 * momentum SGD 8 mixed (master parameters, momentum) or 4 in fp32.
 * Buckets are the ones zccl's bucket scheduler forms (zccl_bucket_layout_create in zccl_zero.h: reverse definition
 * order, a small first bucket then a cap, aligned and padded to nranks x alignment), so the plan and the scheduler
 * agree. Communication per step and rank uses the bandwidth-optimal volumes of ring collectives (Patarasuk & Yuan
 * 2009): all-reduce 2(N-1)/N x bytes, reduce-scatter and all-gather (N-1)/N x bytes; ZeRO-3 all-gathers the
 * parameters twice (forward and backward), 3(N-1)/N, 1.5x data parallelism (paper, section 7.2.2).
 * --offload cpu (stages 1 and 2, Adam; zccl_zero_offload_create in zccl_zero.h, DeepSpeed's offload_optimizer
 * {device: cpu}): the optimizer state — fp32 master shard, momentum, variance: 12 bytes per element of this rank's
 * shard, float32 whatever the training dtype — lives in host memory, plus the host staging buffers of the gradient
 * shard (device-to-host) and of the updated parameter shard (host-to-device), B bytes per shard element each; the
 * GPU keeps the parameters and the bucket scheduler's gradient buffers. --pin-memory: those host bytes are
 * page-locked (reported as pinned).
 * --tp T --pp P (3D parallelism, Megatron-LM: Shoeybi et al. 2019 for the tensor-parallel split of the weight
 * matrices, Narayanan et al. SC'21 for the pipeline split of the layers): world = N x T x P ranks, N the ZeRO
 * (data-parallel) group. The tensors are cut into P contiguous pipeline stages balancing their element counts,
 * each tensor of 2+ dimensions is split T ways along its first dimension (rounded up), 1-D tensors are replicated;
 * the plan above is then that of the most loaded (stage, TP rank)'s local tensors on N ranks (rule: main()).
 * The last line is machine-readable: "plan key=value ..."; with T = P = 1 the output is that of the tool
 * without these options.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zccl_zero.h>
#include "bytes.h"
#include "zccl_version.h"

#define NAME "zccl-zero-plan"

typedef struct {
    int ntensors;
    char **names;
    size_t *numel;
    unsigned long long *rows; /* first dimension of a tensor with two or more dimensions; 0 for a 1-D tensor */
    unsigned long long psi;
    char title[256];
} model_t;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: " NAME " --model FILE --ranks N --stage S [--tp T] [--pp P] [options]\n"
            "Per-rank memory (parameters, gradients, optimizer state), gradient buckets and communication per step\n"
            "of ZeRO stage S on N ranks, for the parameter shapes in FILE (TSV: name, shape, numel; '#' comments).\n"
            "\n"
            "  --model FILE          model shape file, e.g. examples/models/gpt2-124m.tsv\n"
            "  --ranks N             data-parallel ranks (the ZeRO group), 1..65536\n"
            "  --stage S             0 (data parallel), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters)\n"
            "  --dtype D             bf16 (default), fp16 or fp32: parameters and gradients\n"
            "  --optimizer O         adam (default) or sgd (with momentum)\n"
            "  --first-bucket BYTES  target size of the first gradient bucket (default: ZCCL_BUCKET_FIRST_BYTES, 1M)\n"
            "  --bucket-cap BYTES    target size of the other buckets (default: ZCCL_BUCKET_CAP_BYTES, 25M)\n"
            "  --align ELEMS         alignment of every gradient inside its bucket (default: 64 bytes' worth)\n"
            "  --list-buckets        print every bucket with its parameters\n"
            "  --offload cpu         optimizer state in host memory (stages 1, 2; adam): GPU and host bytes per rank\n"
            "  --pin-memory          with --offload cpu: the host bytes are page-locked (pinned)\n"
            "  --tp T                tensor-parallel degree, 1..65536 (default 1): every tensor of 2+ dimensions is\n"
            "                        split T ways along its first dimension (rounded up), 1-D tensors are replicated\n"
            "  --pp P                pipeline-parallel degree, 1..65536 (default 1), at most the tensor count: the\n"
            "                        tensors in definition order are cut into P contiguous stages of about psi/P\n"
            "                        elements; world = N x T x P, and memory, buckets and traffic are those of the\n"
            "                        most loaded (stage, TP rank) on its N ranks\n"
            "  --hosts H             the N ranks on H hosts of N/H ranks each (H divides N): adds the bytes that\n"
            "                        leave each host per step, full precision and with ZeRO++'s options\n"
            "  --wire W              with --hosts: the gradients' quantized format (qgZ; default int4): int8, int4,\n"
            "                        fp8e4m3, fp8e5m2\n"
            "  --weight-wire W       with --hosts, stage 3: the weights' format for qwZ (default int8)\n"
            "  --version             print the version and exit\n"
            "  -h, --help            this text\n"
            "Exit status: 0, 1 when the model file cannot be read or is malformed, 2 for bad options.\n");
}

static int bad_option(const char *fmt, const char *a)
{
    fprintf(stderr, NAME ": ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\nTry '" NAME " --help' for more information.\n");
    return 2;
}

/* Parses a non-negative integer with an optional K/M/G suffix (powers of 1024). */
/* A byte size in util/bytes.c's grammar (64K, 64KiB, 1.5M): the same as zccl-bench and the ZCCL_* settings. */
static int parse_size(const char *s, unsigned long long *out)
{
    uint64_t v;
    if (zccl__parse_bytes(s, &v) != 0) return -1;
    *out = v;
    return 0;
}

/* A plain decimal count (no unit). */
static int parse_count(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (!s || *s < '0' || *s > '9') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno) return -1;
    *out = v;
    return 0;
}

/* Product of a shape "AxBxC"; 0 when malformed. */
static unsigned long long shape_product(const char *s)
{
    unsigned long long p = 1;
    for (;;) {
        char *end;
        errno = 0;
        if (*s < '0' || *s > '9') return 0;
        unsigned long long d = strtoull(s, &end, 10);
        if (errno || d == 0 || p > UINT64_MAX / d) return 0;
        p *= d;
        if (*end == '\0') return p;
        if (*end != 'x') return 0;
        s = end + 1;
    }
}

static void model_free(model_t *m)
{
    for (int i = 0; i < m->ntensors; i++) free(m->names[i]);
    free(m->names);
    free(m->numel);
    free(m->rows);
    memset(m, 0, sizeof *m);
}

/* Reads the model file; on error prints the cause (file, line, field) and returns -1. */
static int model_load(const char *path, model_t *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, NAME ": --model %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int lineno = 0, cap = 0, header = 0;
    long long declared_tensors = -1;
    unsigned long long declared_elems = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] != '\n' && !feof(f)) {
            fprintf(stderr, NAME ": %s line %d: longer than %zu bytes\n", path, lineno, sizeof line - 2);
            goto fail;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        if (line[0] == '#') {
            if (!m->title[0]) snprintf(m->title, sizeof m->title, "%s", line + 1 + (line[1] == ' '));
            const char *p = strstr(line, "parameters:");
            if (p) sscanf(p, "parameters: %lld tensors, %llu elements", &declared_tensors, &declared_elems);
            continue;
        }
        char *name = line, *shape = strchr(name, '\t');
        char *count = shape ? strchr(shape + 1, '\t') : NULL;
        if (!shape || !count || strchr(count + 1, '\t')) {
            fprintf(stderr, NAME ": %s line %d: expected 3 tab-separated fields: name, shape, numel\n", path, lineno);
            goto fail;
        }
        *shape++ = '\0';
        *count++ = '\0';
        if (!header && !strcmp(name, "name") && !strcmp(shape, "shape") && !strcmp(count, "numel")) {
            header = 1;
            continue;
        }
        unsigned long long n;
        if (parse_count(count, &n) || n == 0) {
            fprintf(stderr, NAME ": %s line %d (%s): numel '%s' is not a positive integer\n", path, lineno, name,
                    count);
            goto fail;
        }
        if (shape_product(shape) != n) {
            fprintf(stderr, NAME ": %s line %d (%s): shape '%s' does not multiply to numel %llu\n", path, lineno, name,
                    shape, n);
            goto fail;
        }
        if (m->ntensors == cap) {
            cap = cap ? 2 * cap : 256;
            char **nn = realloc(m->names, (size_t)cap * sizeof *nn);
            if (nn) m->names = nn;
            size_t *ne = nn ? realloc(m->numel, (size_t)cap * sizeof *ne) : NULL;
            if (ne) m->numel = ne;
            unsigned long long *nr = ne ? realloc(m->rows, (size_t)cap * sizeof *nr) : NULL;
            if (nr) m->rows = nr;
            if (!nn || !ne || !nr) {
                fprintf(stderr, NAME ": out of memory reading %s\n", path);
                goto fail;
            }
        }
        m->names[m->ntensors] = strdup(name);
        m->numel[m->ntensors] = (size_t)n;
        m->rows[m->ntensors] = strchr(shape, 'x') ? strtoull(shape, NULL, 10) : 0; /* shape checked above */
        if (!m->names[m->ntensors]) {
            fprintf(stderr, NAME ": out of memory reading %s\n", path);
            goto fail;
        }
        m->ntensors++;
        m->psi += n;
    }
    if (ferror(f)) {
        fprintf(stderr, NAME ": reading %s: %s\n", path, strerror(errno));
        goto fail;
    }
    fclose(f);
    if (m->ntensors == 0) {
        fprintf(stderr, NAME ": %s: no parameter lines (name<TAB>shape<TAB>numel)\n", path);
        model_free(m);
        return -1;
    }
    if (declared_tensors >= 0 && (declared_tensors != m->ntensors || declared_elems != m->psi))
        fprintf(stderr, NAME ": warning: %s says %lld tensors, %llu elements; its lines sum to %d tensors, %llu\n",
                path, declared_tensors, declared_elems, m->ntensors, m->psi);
    return 0;
fail:
    fclose(f);
    model_free(m);
    return -1;
}

/* ceil(a * b / c) for the byte formulas; a * b stays below 2^64 for every model here (checked by the caller). */
static unsigned long long ceil_div(unsigned long long num, unsigned long long den)
{
    return num / den + (num % den != 0);
}

static const char *human(double b, char *buf, size_t len)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *dtype_name = "bf16", *opt_name = "adam";
    long long ranks = -1, stage = -1;
    unsigned long long T = 1, P = 1; /* tensor- and pipeline-parallel degrees */
    unsigned long long first = 0, cap = 0, align = 0;
    int list = 0, pin = 0;
    const char *offload = "none";
    unsigned long long hosts = 0; /* --hosts; 0: not given */
    zccl_wire_t gwire = ZCCL_WIRE_INT4, wwire = ZCCL_WIRE_INT8;
    bool wire_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("zccl-zero-plan (zccl) %s\n", ZCCL_VERSION_STRING);
            return 0;
        }
        if (!strcmp(a, "--list-buckets")) {
            list = 1;
            continue;
        }
        if (!strcmp(a, "--pin-memory")) {
            pin = 1;
            continue;
        }
        if (a[0] != '-') return bad_option("unexpected argument '%s' (every setting is an option: --model FILE ...)", a);
        static const char *const valued[] = {"--model", "--dtype", "--optimizer", "--ranks", "--stage",
                                             "--first-bucket", "--bucket-cap", "--align", "--offload",
                                             "--tp", "--pp", "--hosts", "--wire", "--weight-wire"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
        if (!known) return bad_option("unknown option '%s'", a);
        if (!v) return bad_option("option '%s' needs a value", a);
        unsigned long long u;
        i++;
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--dtype")) dtype_name = v;
        else if (!strcmp(a, "--optimizer")) opt_name = v;
        else if (!strcmp(a, "--wire") || !strcmp(a, "--weight-wire")) {
            zccl_wire_t w = ZCCL_WIRE_FULL;
            for (int k = 1; k < ZCCL_NUM_WIRES; k++)
                if (!strcmp(v, zccl_wire_name((zccl_wire_t)k))) w = (zccl_wire_t)k;
            if (w == ZCCL_WIRE_FULL)
                return bad_option(!strcmp(a, "--wire") ? "--wire '%s': need int8, int4, fp8e4m3 or fp8e5m2"
                                                       : "--weight-wire '%s': need int8, int4, fp8e4m3 or fp8e5m2", v);
            *(!strcmp(a, "--wire") ? &gwire : &wwire) = w;
            wire_given = true;
        } else if (!strcmp(a, "--hosts")) {
            if (parse_count(v, &u) || u < 1 || u > 65536)
                return bad_option("--hosts '%s': need an integer in [1, 65536]", v);
            hosts = u;
        }
        else if (!strcmp(a, "--offload")) {
            if (strcmp(v, "cpu") && strcmp(v, "none")) return bad_option("--offload '%s': need cpu or none", v);
            offload = v;
        }
        else if (!strcmp(a, "--ranks")) {
            if (parse_count(v, &u) || u < 1 || u > 65536)
                return bad_option("--ranks '%s': need an integer in [1, 65536]", v);
            ranks = (long long)u;
        } else if (!strcmp(a, "--tp") || !strcmp(a, "--pp")) {
            const bool is_tp = !strcmp(a, "--tp");
            if (parse_count(v, &u) || u < 1 || u > 65536)
                return bad_option(is_tp ? "--tp '%s': need an integer in [1, 65536]"
                                        : "--pp '%s': need an integer in [1, 65536]", v);
            *(is_tp ? &T : &P) = u;
        } else if (!strcmp(a, "--stage")) {
            if (parse_count(v, &u) || u > 3)
                return bad_option("--stage '%s': need 0, 1, 2 or 3", v);
            stage = (long long)u;
        } else if (!strcmp(a, "--first-bucket")) {
            if (parse_size(v, &first) || first == 0) return bad_option("--first-bucket '%s': need a whole number of bytes >= 1 (e.g. 1M, 1MiB, 1048576)", v);
        } else if (!strcmp(a, "--bucket-cap")) {
            if (parse_size(v, &cap) || cap == 0) return bad_option("--bucket-cap '%s': need a whole number of bytes >= 1 (e.g. 25M, 25MiB, 26214400)", v);
        } else if (!strcmp(a, "--align")) {
            if (parse_count(v, &align) || align == 0 || align > 4096)
                return bad_option("--align '%s': need elements in [1, 4096]", v);
        } else
            return bad_option("unknown option '%s'", a);
    }
    if (!model_path) return bad_option("%s", "--model FILE is required");
    if (ranks < 0) return bad_option("%s", "--ranks N is required");
    if (stage < 0) return bad_option("%s", "--stage S is required");
    const int off = !strcmp(offload, "cpu");
    if (wire_given && !hosts) return bad_option("%s", "--wire and --weight-wire need --hosts H (they change cross-host bytes)");
    if (hosts && ((unsigned long long)ranks % hosts || hosts > (unsigned long long)ranks)) {
        char why[160];
        snprintf(why, sizeof why, "--hosts %llu does not divide --ranks %lld into equal hosts", hosts, ranks);
        return bad_option("%s", why);
    }
    if (pin && !off) return bad_option("%s", "--pin-memory needs --offload cpu");
    if (off && stage != 1 && stage != 2)
        return bad_option("%s", "--offload cpu needs --stage 1 or 2 (zccl's CPU offload is ZeRO-1/2 optimizer offload)");
    if (off && strcmp(opt_name, "adam"))
        return bad_option("%s", "--offload cpu needs --optimizer adam (the offloaded optimizer is AdamW)");
    zccl_datatype_t dt;
    unsigned B;
    if (!strcmp(dtype_name, "bf16")) dt = ZCCL_BFLOAT16, B = 2;
    else if (!strcmp(dtype_name, "fp16")) dt = ZCCL_FLOAT16, B = 2;
    else if (!strcmp(dtype_name, "fp32")) dt = ZCCL_FLOAT32, B = 4;
    else return bad_option("--dtype '%s': need bf16, fp16 or fp32", dtype_name);
    unsigned K;
    const char *kwhat;
    if (!strcmp(opt_name, "adam")) {
        K = B == 2 ? 12 : 8;
        kwhat = B == 2 ? "fp32 master parameters + momentum + variance" : "momentum + variance";
    } else if (!strcmp(opt_name, "sgd")) {
        K = B == 2 ? 8 : 4;
        kwhat = B == 2 ? "fp32 master parameters + momentum" : "momentum";
    } else
        return bad_option("--optimizer '%s': need adam or sgd", opt_name);

    model_t m;
    if (model_load(model_path, &m)) return 1;
    unsigned long long N = (unsigned long long)ranks, psi = m.psi;
    if (psi > (1ULL << 40)) {
        fprintf(stderr, NAME ": %s: %llu parameters is more than this tool's 2^40 limit\n", model_path, psi);
        model_free(&m);
        return 1;
    }

    /* 3D parallelism. Pipeline: the tensors in definition order are cut into P contiguous stages; stage k (0-based,
     * k < P-1) ends at the first tensor i, from the stage's start on, whose running sum S_i of full element counts
     * reaches (k+1) psi / P (P S_i >= (k+1) psi, no rounding), but no later than tensor n-P+k so that every later
     * stage keeps at least one tensor; the last stage takes the rest. Tensor parallel: a tensor with two or more
     * dimensions keeps ceil(d0/T) of its first dimension d0 on every TP rank (rounded up: the shards of an
     * indivisible d0 are padded to equal size, as Megatron pads its vocabulary), a 1-D tensor is replicated. The
     * ZeRO plan below runs on the local list of the (stage, TP rank) holding the most elements (the first of equal
     * ones); every TP rank of a stage holds the same count, so that is the most loaded stage. */
    if (P > (unsigned long long)m.ntensors) {
        char why[1200];
        snprintf(why, sizeof why, "--pp '%llu': more pipeline stages than the %d tensors of %s (every stage needs one)",
                 P, m.ntensors, model_path);
        model_free(&m);
        return bad_option("%s", why);
    }
    size_t *lnumel = malloc((size_t)m.ntensors * sizeof *lnumel);
    int *stage_end = malloc((size_t)P * sizeof *stage_end); /* index one past the stage's last tensor */
    unsigned long long *stage_psi = calloc((size_t)P, sizeof *stage_psi); /* full element counts per stage */
    unsigned long long *stage_lpsi = calloc((size_t)P, sizeof *stage_lpsi); /* per TP rank */
    if (!lnumel || !stage_end || !stage_psi || !stage_lpsi) {
        fprintf(stderr, NAME ": out of memory for %d tensors and %llu stages\n", m.ntensors, P);
        return 1;
    }
    unsigned long long tp_split = 0, tp_pad = 0; /* tensors of 2+ dimensions; padding summed over the T ranks */
    for (int i = 0; i < m.ntensors; i++) {
        lnumel[i] = m.numel[i];
        if (m.rows[i]) {
            unsigned long long rest = m.numel[i] / m.rows[i];
            lnumel[i] = (size_t)(ceil_div(m.rows[i], T) * rest);
            tp_split++;
            tp_pad += T * lnumel[i] - m.numel[i];
        }
    }
    {
        unsigned long long run = 0;
        int i = 0;
        for (unsigned long long k = 0; k + 1 < P; k++) {
            int last = m.ntensors - (int)P + (int)k; /* the latest tensor stage k may end at */
            do run += m.numel[i++];
            while (i <= last && P * run < (k + 1) * psi);
            stage_end[k] = i;
        }
        stage_end[P - 1] = m.ntensors;
        for (unsigned long long k = 0, j = 0; k < P; k++)
            for (; j < (unsigned long long)stage_end[k]; j++) stage_psi[k] += m.numel[j], stage_lpsi[k] += lnumel[j];
    }
    unsigned long long pstage = 0;
    for (unsigned long long k = 1; k < P; k++)
        if (stage_lpsi[k] > stage_lpsi[pstage]) pstage = k;
    const int l0 = pstage ? stage_end[pstage - 1] : 0, ln = stage_end[pstage] - l0; /* the local tensor list */
    const unsigned long long lpsi = stage_lpsi[pstage], world = N * T * P;
    const int par = T * P > 1;

    /* Buckets as zccl's scheduler forms them: all-reduce mode for stages 0-1, reduce-scatter for 2-3. */
    zccl_bucket_options_t bo = {.first_bytes = first, .cap_bytes = cap, .align_elems = align,
                                .mode = stage >= 2 ? ZCCL_BUCKET_REDUCE_SCATTER : ZCCL_BUCKET_ALLREDUCE};
    zccl_bucket_plan_t plan;
    zccl_result_t r = zccl_bucket_layout_create((int)N, ln, lnumel + l0, dt, &bo, &plan);
    if (r != ZCCL_SUCCESS) {
        fprintf(stderr, NAME ": bucket layout: %s: %s\n", zccl_get_error_string(r), zccl_get_last_error(NULL));
        model_free(&m);
        return 2;
    }
    int nb = 0;
    zccl_bucket_count(plan, &nb);
    unsigned long long padded = 0, shard = 0, largest = 0, smallest = UINT64_MAX;
    zccl_bucket_info_t *bi = calloc((size_t)nb, sizeof *bi);
    if (!bi) {
        fprintf(stderr, NAME ": out of memory for %d buckets\n", nb);
        return 1;
    }
    for (int b = 0; b < nb; b++) {
        zccl_bucket_info(plan, b, &bi[b]);
        padded += bi[b].elems;
        shard += bi[b].shard_elems;
        if (bi[b].elems > largest) largest = bi[b].elems;
        if (bi[b].elems < smallest) smallest = bi[b].elems;
    }
    size_t full_bytes = 0, shard_bytes = 0;
    zccl_bucket_buffer_bytes(plan, &full_bytes, &shard_bytes);

    /* Memory per rank, paper formulas (exact psi, rounded up to whole bytes) and the padded shard layout. */
    unsigned long long pdiv = stage >= 3 ? N : 1, gdiv = stage >= 2 ? N : 1, odiv = stage >= 1 ? N : 1;
    unsigned long long pb = ceil_div(B * lpsi, pdiv), gb = ceil_div(B * lpsi, gdiv), ob = ceil_div(K * lpsi, odiv);
    unsigned long long lp = B * (stage >= 3 ? shard : padded), lg = B * (stage >= 2 ? shard : padded);
    unsigned long long lo = K * (stage >= 1 ? shard : padded);
    char h1[32], h2[32], h3[32];

    printf("model      %s: %s\n", model_path, m.title[0] ? m.title : "(no description)");
    printf("           %d tensors, psi = %llu parameters\n", m.ntensors, psi);
    printf("training   %llu ranks, ZeRO stage %lld, %s parameters and gradients (B = %u bytes), %s optimizer "
           "(K = %u bytes per parameter: %s)\n",
           N, stage, dtype_name, B, opt_name, K, kwhat);
    if (par) {
        printf("parallel   world %llu = %llu data-parallel (ZeRO) x %llu tensor-parallel x %llu pipeline-parallel "
               "ranks\n", world, N, T, P);
        printf("           tensor parallel: %llu tensors of 2+ dimensions split %llu ways along the first dimension "
               "(rounded up: %llu padding elements over the %llu TP ranks), %llu 1-D tensors replicated\n",
               tp_split, T, tp_pad, T, (unsigned long long)m.ntensors - tp_split);
        printf("           pipeline stages, parameters (per TP rank):");
        for (unsigned long long k = 0; k < P; k++) printf(" %llu (%llu)", stage_psi[k], stage_lpsi[k]);
        printf("\n");
        printf("           most loaded: stage %llu, tensors %d..%d (%s .. %s); below psi = its %llu parameters per TP "
               "rank (local_psi) and N = %llu\n",
               pstage, l0, l0 + ln - 1, m.names[l0], m.names[l0 + ln - 1], lpsi, N);
    }
    printf("\nmemory per rank (Rajbhandari et al. 2020)   formula          bytes            padded layout\n");
    printf("  parameters                                %-2u psi%-10s  %-15llu  %llu\n", B, pdiv > 1 ? " / N" : "",
           pb, lp);
    printf("  gradients                                 %-2u psi%-10s  %-15llu  %llu\n", B, gdiv > 1 ? " / N" : "",
           gb, lg);
    printf("  optimizer state                           %-2u psi%-10s  %-15llu  %llu\n", K, odiv > 1 ? " / N" : "",
           ob, lo);
    printf("  total                                                      %-15llu  %llu  (%s; stage 0: %s)\n",
           pb + gb + ob, lp + lg + lo, human((double)(pb + gb + ob), h1, sizeof h1),
           human((double)(2ULL * B + K) * lpsi, h2, sizeof h2));

    printf("\ngradient buckets (zccl_bucket_layout_create: reverse definition order, %s mode)\n",
           stage >= 2 ? "reduce-scatter" : "all-reduce");
    printf("  %d buckets, %s padded in all (%llu elements, padding %llu); smallest %s, largest %s; "
           "shard per rank %llu elements\n",
           nb, human((double)padded * B, h1, sizeof h1), padded, padded - lpsi, human((double)smallest * B, h2, sizeof h2),
           human((double)largest * B, h3, sizeof h3), shard);
    if (!list) {
        printf("  bucket bytes:");
        for (int b = 0; b < nb; b++) {
            if (nb > 12 && b == 6) { /* the rest repeats per layer: --list-buckets shows all */
                printf(" ... (%d more) ...", nb - 11);
                b = nb - 5;
            }
            printf(" %llu", (unsigned long long)bi[b].elems * B);
        }
        printf("\n");
    }
    printf("  scheduler gradient buffers per rank: %s full-size bucket buffers + %s shard accumulators\n",
           human((double)full_bytes, h1, sizeof h1), human((double)shard_bytes, h2, sizeof h2));
    if (list) {
        for (int b = 0; b < nb; b++) {
            printf("  bucket %d: %zu elements (%zu used, shard %zu), %d parameters:", b, bi[b].elems,
                   bi[b].used_elems, bi[b].shard_elems, bi[b].nparams);
            for (int k = 0; k < bi[b].nparams; k++) printf(" %s", m.names[l0 + bi[b].first_param - k]);
            printf("\n");
        }
    }

    /* CPU offload: optimizer state to the host (the library's own count), parameters and gradients stay. */
    size_t host_state = 0, host_staging = 0;
    unsigned long long gpu_bytes = 0, host_bytes = 0, pinned_bytes = 0;
    if (off) {
        zccl_zero_offload_host_bytes(plan, 1, &host_state, &host_staging);
        gpu_bytes = lp + full_bytes + shard_bytes;
        host_bytes = (unsigned long long)host_state + host_staging;
        pinned_bytes = pin ? host_bytes : 0;
        printf("\nCPU offload (--offload cpu%s; zccl_zero_offload): optimizer state on the host, per rank\n",
               pin ? " --pin-memory" : "");
        printf("  GPU   parameters %llu + gradient buffers %zu (bucket buffers %zu + shard accumulators %zu) "
               "= %llu (%s); optimizer state 0 (without offload it adds %llu here)\n",
               lp, full_bytes + shard_bytes, full_bytes, shard_bytes, gpu_bytes, human((double)gpu_bytes, h1, sizeof h1),
               lo);
        printf("  host  optimizer state 12 x %llu (fp32 master + momentum + variance) = %zu; staging 2 x %u x %llu "
               "(gradient shard, parameter shard) = %zu; total %llu (%s), %s\n",
               shard, host_state, B, shard, host_staging, host_bytes, human((double)host_bytes, h2, sizeof h2),
               pin ? "pinned (page-locked)" : "pageable");
    }

    /* Communication per optimizer step and rank: bandwidth-optimal ring volumes, psi exact. */
    unsigned long long ring = (N - 1) * B * lpsi; /* (N-1) B psi; divide by N */
    unsigned long long ar = ceil_div(2 * ring, N), rs = ceil_div(ring, N), ag = ceil_div(ring, N);
    unsigned long long comm, paper = stage == 3 ? ceil_div(3 * ring, N) : ceil_div(2 * ring, N);
    printf("\ncommunication per step and rank (ring volumes, Patarasuk & Yuan 2009)\n");
    if (stage == 0) {
        comm = ar;
        printf("  all-reduce gradients         2(N-1)/N x %u psi = %llu\n", B, ar);
    } else if (stage == 1) {
        comm = ar + ag;
        printf("  all-reduce gradients         2(N-1)/N x %u psi = %llu\n", B, ar);
        printf("  all-gather parameters         (N-1)/N x %u psi = %llu\n", B, ag);
        printf("  (zccl's ZeRO-1 all-reduces, then each rank updates its shard; the paper's reduce-scatter + "
               "all-gather needs %llu)\n", paper);
    } else if (stage == 2) {
        comm = rs + ag;
        printf("  reduce-scatter gradients      (N-1)/N x %u psi = %llu\n", B, rs);
        printf("  all-gather parameters         (N-1)/N x %u psi = %llu\n", B, ag);
    } else {
        comm = rs + 2 * ag;
        printf("  reduce-scatter gradients      (N-1)/N x %u psi = %llu\n", B, rs);
        printf("  all-gather parameters fwd     (N-1)/N x %u psi = %llu\n", B, ag);
        printf("  all-gather parameters bwd     (N-1)/N x %u psi = %llu\n", B, ag);
    }
    printf("  total %llu bytes (%s), %.2fx data parallelism's all-reduce\n", comm, human((double)comm, h1, sizeof h1),
           ar ? (double)comm / (double)ar : 0.0);

    /* Bytes that leave each host per step, for --hosts H (G = N/H ranks per host). Model: each collective runs
     * hierarchically (zccl_hier.h: inside the host, then between hosts on 1/G slices), so of a collective over V
     * bytes in all, (H-1)/H V leave each host; a quantized call moves its encoded shards (zccl_wire_bytes: header,
     * one float32 scale per ZCCL_QUANT_BLOCK elements, codes). ZeRO++ (Wang et al. 2023): qgZ quantizes the
     * gradient reduction, qwZ the weight all-gathers, hpZ keeps a secondary weight partition of psi/G per rank
     * on each host so the backward all-gather stays inside it. */
    unsigned long long xh_full = 0, xh_zpp = 0;
    if (hosts) {
        const unsigned long long H = hosts, G = N / H;
        /* Vg: one gradient reduction's bytes (the padded buckets), Vw: one gathering of the parameters */
        unsigned long long vg = B * padded, vg_q = 0, vw = 0, vw_q = 0;
        for (int b = 0; b < nb; b++) vg_q += N * zccl_wire_bytes(gwire, bi[b].shard_elems);
        for (int i = 0; i < ln; i++) { /* ZeRO-3 gathers a layer at a time; here a tensor is a layer */
            const unsigned long long per = ceil_div(lnumel[l0 + i], N);
            vw += B * per * N;
            vw_q += N * zccl_wire_bytes(wwire, per);
        }
        const unsigned long long vp = B * padded; /* stages 1-2: the updated shards all-gathered over the buckets */
        const char *gw = zccl_wire_name(gwire), *ww = zccl_wire_name(wwire);
        printf("\ncross-host bytes per step and host (--hosts %llu: %llu ranks per host; hierarchical collectives: "
               "(H-1)/H of each one's bytes leave a host)\n", H, G);
        printf("  %-40s %14s %14s %14s %14s %8s\n", "option", "gradients", stage == 3 ? "params fwd" : "params",
               stage == 3 ? "params bwd" : "-", "total", "vs full");
        struct row { char name[64]; unsigned long long g, f, b; } rows[4];
        int nrows = 0;
        if (stage == 3) {
            rows[nrows++] = (struct row){"full precision", vg, vw, vw};
            snprintf(rows[nrows].name, sizeof rows[0].name, "qwZ (weights %s)", ww);
            rows[nrows].g = vg, rows[nrows].f = vw_q, rows[nrows].b = vw_q, nrows++;
            snprintf(rows[nrows].name, sizeof rows[0].name, "qwZ + hpZ");
            rows[nrows].g = vg, rows[nrows].f = vw_q, rows[nrows].b = 0, nrows++;
            snprintf(rows[nrows].name, sizeof rows[0].name, "qwZ + hpZ + qgZ (gradients %s)", gw);
            rows[nrows].g = vg_q, rows[nrows].f = vw_q, rows[nrows].b = 0, nrows++;
        } else {
            const unsigned long long mult = stage <= 1 ? 2 : 1; /* an all-reduce is a reduce-scatter + all-gather */
            rows[nrows++] = (struct row){"full precision", mult * vg, stage ? vp : 0, 0};
            snprintf(rows[nrows].name, sizeof rows[0].name, "qgZ (gradients %s)", gw);
            rows[nrows].g = mult * vg_q, rows[nrows].f = stage ? vp : 0, rows[nrows].b = 0, nrows++;
        }
        for (int k = 0; k < nrows; k++) {
            const unsigned long long g = ceil_div(rows[k].g * (H - 1), H), f = ceil_div(rows[k].f * (H - 1), H);
            const unsigned long long bw = ceil_div(rows[k].b * (H - 1), H), t = g + f + bw;
            if (k == 0) xh_full = t;
            xh_zpp = t;
            printf("  %-40s %14llu %14llu %14llu %14llu %7.2fx\n", rows[k].name, g, f, bw, t,
                   t ? (double)xh_full / (double)t : 0.0);
        }
        if (stage == 3)
            printf("  hpZ's secondary partition: %u psi / G = %llu more parameter bytes per rank\n", B,
                   ceil_div(B * lpsi, G));
        if (H == 1) printf("  (one host: nothing crosses)\n");
    }

    printf("plan tensors=%d psi=%llu ranks=%llu stage=%lld dtype=%s optimizer=%s B=%u K=%u params_bytes=%llu "
           "grads_bytes=%llu optimizer_bytes=%llu total_bytes=%llu layout_params_bytes=%llu layout_grads_bytes=%llu "
           "layout_optimizer_bytes=%llu buckets=%d bucket_bytes=%llu comm_bytes=%llu paper_comm_bytes=%llu",
           m.ntensors, psi, N, stage, dtype_name, opt_name, B, K, pb, gb, ob, pb + gb + ob, lp, lg, lo, nb,
           padded * B, comm, paper);
    if (par) {
        printf(" tp=%llu pp=%llu world=%llu local_psi=%llu local_tensors=%d pp_stage=%llu tp_split_tensors=%llu "
               "tp_padding=%llu pp_psi=", T, P, world, lpsi, ln, pstage, tp_split, tp_pad);
        for (unsigned long long k = 0; k < P; k++) printf("%s%llu", k ? "," : "", stage_psi[k]);
        printf(" pp_local_psi=");
        for (unsigned long long k = 0; k < P; k++) printf("%s%llu", k ? "," : "", stage_lpsi[k]);
    }
    if (hosts)
        printf(" hosts=%llu wire=%s weight_wire=%s cross_host_full_bytes=%llu cross_host_zeropp_bytes=%llu", hosts,
               zccl_wire_name(gwire), zccl_wire_name(wwire), xh_full, xh_zpp);
    if (off)
        printf(" offload=cpu pin_memory=%d gpu_bytes=%llu host_bytes=%llu pinned_host_bytes=%llu host_state_bytes=%zu "
               "host_staging_bytes=%zu", pin, gpu_bytes, host_bytes, pinned_bytes, host_state, host_staging);
    printf("\n");
    free(bi);
    free(lnumel);
    free(stage_end);
    free(stage_psi);
    free(stage_lpsi);
    zccl_bucket_plan_destroy(plan);
    model_free(&m);
    return 0;
}
