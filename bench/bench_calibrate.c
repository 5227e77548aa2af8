/* `hypershard bench calibrate --out FILE` — measures this machine and
 * writes the cluster file `plan --time` reads (docs/plan.md "Cluster
 * files"): the CPU's nominal peak per dtype (tensor.h hs_cpu_nominal_peak),
 * GEMM rates by shape and dtype, the attention kernels' rate, element-wise
 * bandwidth (the axpy kernel), and each group size's collective latency and
 * bandwidth, measured by the same binary under $MPIEXEC (mpiexec) with 2, 4,
 * ... ranks (`--collectives`, an all-gather of two sizes, fitted to the
 * ring's (g - 1) latency + (g - 1) / g bytes / bandwidth). A device is a
 * core, measured with all of them at work; the node's ranks divide them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli/commands.h"
#include "hypershard/config.h"
#include "hypershard/tensor.h"

static int usage(FILE *f, const char *why) {
    if (why) fprintf(f, "hypershard bench calibrate: %s\n", why);
    fprintf(f, "usage: hypershard bench calibrate --out FILE [--max-ranks N] [--quick]\n"
               "  --out FILE       the cluster file to write (configs/clusters/ has examples)\n"
               "  --max-ranks N    collectives measured for 2, 4, ... up to N ranks (default 8)\n"
               "  --quick          fewer GEMM shapes and repetitions\n");
    return 2;
}

/* Best seconds of a GEMM of m x k by k x n in dtype dt (fp32 C). */
static double gemm_best(hs_dtype dt, int64_t n, int reps, hs_error *e) {
    size_t es = hs_dtype_size(dt);
    void *a = calloc((size_t)(n * n), es), *b = calloc((size_t)(n * n), es);
    float *c = calloc((size_t)(n * n), sizeof *c);
    double best = 0;
    if (a && b && c) {
        best = 1e30;
        double start = hs_now();
        /* at least `reps` after the warm-up, and a quarter second in all */
        for (int r = 0; r <= reps || hs_now() - start < 0.25; r++) {
            double t0 = hs_now();
            if (hs_gemm_ex(false, false, n, n, n, 1.0f, a, dt, n, b, dt, n, 0.0f, c, HS_DTYPE_F32,
                           n, e) != HS_OK) {
                best = 0;
                break;
            }
            double t = hs_now() - t0;
            if (r > 0 && t < best) best = t; /* the first is the warm-up */
        }
    } else {
        hs_error_oom(e, "bench calibrate: GEMM operands of %lld x %lld", (long long)n,
                     (long long)n);
    }
    free(a), free(b), free(c);
    return best;
}

static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "this CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !v) continue;
        v += 1 + (v[1] == ' ');
        v[strcspn(v, "\n")] = '\0';
        snprintf(out, cap, "%s", v);
        break;
    }
    if (f) fclose(f);
}

/* Seconds of `reps` fp32 GEMMs of 256^3. */
static double gemm_loop(float *a, float *b, float *c, int reps, hs_error *e) {
    double t0 = hs_now();
    for (int r = 0; r < reps; r++)
        if (hs_gemm_ex(false, false, 256, 256, 256, 1.0f, a, HS_DTYPE_F32, 256, b, HS_DTYPE_F32,
                       256, 0.0f, c, HS_DTYPE_F32, 256, e) != HS_OK)
            return -1;
    return hs_now() - t0;
}

/* With more ranks than cores (threads 1 each): how much faster half of
 * the ranks compute while the other half wait in a receive, as pipeline
 * stages wait in their bubble. Rank 0 prints "lend ranks G value L": the
 * share of the waiting ranks' cores the busy ones got (0: none, 1: all). */
static void lending(hs_comm *comm, hs_pg *w, int g) {
    int cores = hs_cpu_nominal_peak(HS_DTYPE_F32).cores, rank = hs_comm_rank(comm);
    if (cores < 1 || g <= cores || g % 2) return;
    hs_blas_set_threads(1);
    hs_error e;
    float *a = calloc(3 * 65536, sizeof *a);
    if (!a) return;
    double t[2];
    for (int half = 0; half < 2; half++) {
        double mine = 0;
        if (hs_pg_barrier(w, &e) != HS_OK) hs_comm_abort(comm, &e);
        if (!half || rank % 2 == 0) mine = gemm_loop(a, a + 65536, a + 131072, 200, &e);
        if (mine < 0) hs_comm_abort(comm, &e);
        /* the waiting half waits as a pipeline stage does: in a receive */
        hs_status st = HS_OK;
        if (half && rank % 2 == 0) st = hs_pg_send(w, NULL, a, 1, HS_DTYPE_F32, rank + 1, 7, &e);
        if (half && rank % 2 == 1) st = hs_pg_recv(w, NULL, a, 1, HS_DTYPE_F32, rank - 1, 7, &e);
        if (st != HS_OK || hs_pg_barrier(w, &e) != HS_OK) hs_comm_abort(comm, &e);
        t[half] = hs_bench_max_over(w, mine);
    }
    free(a);
    double none = (double)cores / g,
           all = (double)cores / (g / 2) < 1 ? (double)cores / (g / 2) : 1;
    double lend = (t[0] / t[1] - 1) / (all / none - 1);
    lend = lend < 0 ? 0 : lend > 1 ? 1 : lend;
    if (rank == 0) printf("lend ranks %d value %.3f\n", g, lend);
}

/* The all-gather of 1 KiB and 1 MiB a rank over group g (every group of
 * the split at once), fitted: *lat and *bw. */
static void fit_group(hs_comm *comm, hs_pg *w, hs_pg *g, float *in, float *out, double *lat,
                      double *bw) {
    const int64_t sizes[2] = {256, 262144}; /* floats a rank */
    hs_error e;
    double t[2];
    int n = hs_pg_size(g);
    for (int s = 0; s < 2; s++) {
        double v[41];
        int iters = s ? 15 : 41;
        for (int i = -3; i < iters; i++) {
            if (hs_pg_barrier(w, &e) != HS_OK) hs_comm_abort(comm, &e);
            double t0 = hs_now();
            if (hs_pg_all_gather(g, NULL, out, in, sizes[s], HS_DTYPE_F32, &e) != HS_OK)
                hs_comm_abort(comm, &e);
            double dt = hs_bench_max_over(w, hs_now() - t0);
            if (i >= 0) v[i] = dt;
        }
        t[s] = hs_bench_median(v, iters);
    }
    double f = (double)(n - 1) / n, n0 = 4.0 * sizes[0] * n, n1 = 4.0 * sizes[1] * n;
    *bw = t[1] > t[0] ? f * (n1 - n0) / (t[1] - t[0]) : f * n1 / t[1];
    *lat = (t[0] - f * n0 / *bw) / (n - 1);
    if (*lat < 0) *lat = 0;
}

/* Under mpiexec with W ranks: for each group size 2, 4, ..., W, the world
 * split into groups of consecutive ranks, all measured at once (as a
 * layout's groups of one dim run); rank 0 prints "collective ranks G
 * node_ranks W latency L bandwidth B" for each, then the lending line. */
static int collectives(int argc, char **argv) {
    hs_comm *comm;
    hs_error e;
    if (hs_comm_init(&comm, &argc, &argv, NULL, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench calibrate: %s\n", e.msg);
        return hs_status_exit_code(e.code);
    }
    hs_pg *w = hs_comm_world(comm);
    int W = hs_comm_size(comm), rank = hs_comm_rank(comm);
    float *in = calloc(262144, sizeof *in), *out = calloc((size_t)262144 * W, sizeof *out);
    if (!in || !out) {
        hs_error_oom(&e, "bench calibrate: all-gather buffers of %d x 1 MiB", W);
        hs_comm_abort(comm, &e);
    }
    for (int g = 2; g <= W; g *= 2) {
        hs_pg *grp = w;
        char name[32];
        snprintf(name, sizeof name, "calibrate_%d", g);
        if (g < W && hs_comm_split(comm, name, rank / g, rank, &grp, &e) != HS_OK)
            hs_comm_abort(comm, &e);
        double lat, bw;
        fit_group(comm, w, grp, in, out, &lat, &bw);
        if (rank == 0)
            printf("collective ranks %d node_ranks %d latency %.4g bandwidth %.4g\n", g, W, lat,
                   bw);
    }
    lending(comm, w, W);
    free(in), free(out);
    hs_comm_finalize(comm);
    return 0;
}

/* --out's directory (into dir) can take the file and its .tmp, before any
 * work; it is made if missing when the file is written. */
static hs_status out_check(const char *out_path, char dir[1024], hs_error *e) {
    char name[256], tmp_name[264];
    const char *slash = strrchr(out_path, '/');
    snprintf(dir, 1024, "%.*s", slash ? (int)(slash - out_path) : 1, slash ? out_path : ".");
    if (slash == out_path) snprintf(dir, 1024, "/");
    snprintf(name, sizeof name, "%s", slash ? slash + 1 : out_path);
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp", name);
    if (!name[0])
        return hs_error_set(e, HS_ERR_USAGE, "--out %s: a file name is needed, not a directory",
                            out_path);
    const char *files[] = {name, tmp_name, NULL};
    hs_out_dir d = {.what = "--out", .path = dir, .files = files};
    return hs_out_dirs_check(&d, 1, e);
}

static int calibrate(const char *out_path, int max_ranks, bool quick) {
    hs_error e;
    hs_error_clear(&e);
    char dir[1024];
    if (out_check(out_path, dir, &e) != HS_OK || hs_cpu_isa_apply(&e) != HS_OK)
        return fprintf(stderr, "hypershard bench calibrate: %s\n", e.msg),
               hs_status_exit_code(e.code);
    hs_cluster c = {.nodes = 1, .shared = true, .overlap = 0.5, .lend = 1.0};
    hs_cpu_peak p32 = hs_cpu_nominal_peak(HS_DTYPE_F32), p16 = hs_cpu_nominal_peak(HS_DTYPE_BF16);
    char cpu[96];
    cpu_name(cpu, sizeof cpu);
    snprintf(c.name, sizeof c.name, "this machine (bench calibrate): %d cores", p32.cores);
    snprintf(c.device_name, sizeof c.device_name, "%s, %d cores, %s", cpu, p32.cores, p32.isa);
    /* a device is a core: the rates below are measured on all of them (one
     * thread each) and divided by their count */
    int cores = p32.cores > 0 ? p32.cores : 1;
    hs_blas_set_threads(cores);
    c.devices_per_node = cores;
    c.peak[HS_DTYPE_F32] = p32.flops_per_core;
    c.peak[HS_DTYPE_BF16] = p16.flops_per_core;
    c.peak[HS_DTYPE_F16] = hs_cpu_nominal_peak(HS_DTYPE_F16).flops_per_core;
    c.memory_bytes = (double)hs_memory_available() / cores;
    printf("calibrate: %s\n", c.device_name);
    static const int64_t cubes[] = {64, 128, 256, 512, 1024, 2048};
    int n_cubes = quick ? 4 : 6;
    double best_f32 = 0;
    for (int d = 0; d < 2; d++) {
        hs_dtype dt = d ? HS_DTYPE_BF16 : HS_DTYPE_F32;
        for (int i = 0; i < n_cubes; i++) {
            int64_t n = cubes[quick ? i + 1 : i];
            double s = gemm_best(dt, n, quick ? 2 : 4, &e);
            if (s <= 0) return fprintf(stderr, "hypershard bench calibrate: %s\n", e.msg), 1;
            double r = 2.0 * n * n * n / s / cores;
            c.gemm[c.n_gemm++] = (hs_cluster_gemm){.dtype = dt, .m = n, .n = n, .k = n, .flops = r};
            if (!d && r > best_f32) best_f32 = r;
            printf("  gemm %-8s %5lld^3  %8.1f GFLOP/s a core\n", hs_dtype_name(dt), (long long)n,
                   r / 1e9);
        }
    }
    /* the nominal clock can be below the turbo the GEMMs run at */
    c.gemm_efficiency = best_f32 < c.peak[HS_DTYPE_F32] ? best_f32 / c.peak[HS_DTYPE_F32] : 1.0;
    double af = hs_bench_ops_cpu_rate("attention fwd", &e);
    double ab = hs_bench_ops_cpu_rate("attention bwd", &e);
    double ax = hs_bench_ops_cpu_rate("axpy", &e);
    c.routing_bandwidth = hs_bench_ops_cpu_rate("moe route(+permute)", &e) / cores;
    if (af <= 0 || ab <= 0 || ax <= 0)
        return fprintf(stderr, "hypershard bench calibrate: the cpu kernels: %s\n", e.msg), 1;
    /* forward and backward (2.5 x the work) together */
    c.attention[HS_DTYPE_F32] = c.attention[HS_DTYPE_BF16] = 3.5 / (1 / af + 2.5 / ab) / cores;
    double ae = c.attention[HS_DTYPE_F32] / c.peak[HS_DTYPE_F32];
    c.attention_efficiency = ae < 1 ? ae : 1;
    c.memory_bandwidth = ax / cores;
    c.elementwise_efficiency = 1.0;
    printf("  attention %.1f GFLOP/s, element-wise %.1f GB/s a core\n", c.attention[0] / 1e9,
           c.memory_bandwidth / 1e9);
    /* the collectives, one mpiexec per group size */
    const char *mpiexec = getenv("MPIEXEC") ? getenv("MPIEXEC") : "mpiexec";
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return fprintf(stderr, "hypershard bench calibrate: cannot find its binary\n"), 1;
    self[n] = '\0';
    c.intra.bandwidth = 0;
    for (int g = 2; g <= max_ranks; g *= 2) {
        char cmd[2300], line[256];
        snprintf(cmd, sizeof cmd, "%s -n %d '%s' bench calibrate --collectives 2>&1", mpiexec, g,
                 self);
        FILE *pf = popen(cmd, "r");
        bool got = false;
        while (pf && fgets(line, sizeof line, pf)) {
            hs_cluster_group r = {0};
            double lend;
            if (sscanf(line, "lend ranks %*d value %lf", &lend) == 1) {
                c.lend = lend; /* the most ranks measured last */
                printf("  %d ranks: busy ranks get %.0f%% of waiting ones' cores\n", g, 100 * lend);
            }
            if (sscanf(line, "collective ranks %d node_ranks %d latency %lf bandwidth %lf",
                       &r.ranks, &r.node_ranks, &r.latency, &r.bandwidth) == 4) {
                if (c.intra.n_by_ranks < HS_CLUSTER_TABLE_MAX)
                    c.intra.by_ranks[c.intra.n_by_ranks++] = r;
                printf("  groups of %d among %d ranks: latency %.2f us, bandwidth %.2f GB/s\n",
                       r.ranks, g, r.latency * 1e6, r.bandwidth / 1e9);
                if (c.intra.bandwidth == 0)
                    c.intra.bandwidth = r.bandwidth, c.intra.latency = r.latency;
                got = true;
            }
        }
        int st = pf ? pclose(pf) : -1;
        if (!got || st != 0)
            return fprintf(stderr, "hypershard bench calibrate: %s: no measurement (exit %d)\n",
                           cmd, st),
                   1;
    }
    if (c.intra.bandwidth == 0) c.intra.bandwidth = c.memory_bandwidth / 4;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    FILE *f = hs_mkdirs(dir, &e) == HS_OK ? fopen(tmp, "w") : NULL;
    if (!f) return fprintf(stderr, "hypershard bench calibrate: cannot write %s\n", tmp), 1;
    fprintf(f, "# written by hypershard bench calibrate\n");
    hs_cluster_write(&c, f);
    if (hs_fclose_written(f, tmp, "a disk with room", &e) != HS_OK || rename(tmp, out_path) != 0) {
        remove(tmp);
        return fprintf(stderr, "hypershard bench calibrate: cannot write %s\n", out_path), 1;
    }
    printf("wrote %s\n", out_path);
    return 0;
}

int hs_bench_calibrate(int argc, char **argv) {
    const char *out = NULL;
    int max_ranks = 8;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout, NULL), 0;
        if (!strcmp(argv[i], "--collectives")) return collectives(argc, argv);
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--max-ranks") && i + 1 < argc) max_ranks = atoi(argv[++i]);
        else return usage(stderr, "unknown option or missing value");
    }
    if (!out) return usage(stderr, "--out FILE is needed");
    if (max_ranks < 1 || max_ranks > 1024) return usage(stderr, "--max-ranks takes 1..1024");
    return calibrate(out, max_ranks, quick);
}
