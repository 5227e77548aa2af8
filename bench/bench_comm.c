/* `hypershard bench comm` — bus bandwidth of hypershard's collectives next
 * to the MPI built-ins, measured in the same run, under mpiexec.
 *
 * Sizes are per rank: all-gather sends SIZE and receives W*SIZE,
 * reduce-scatter sends W*SIZE and keeps SIZE, all-reduce reduces SIZE.
 * Bus bandwidth as nccl-tests defines it: algbw = W*SIZE / t for AG and RS,
 * SIZE / t for AR; busbw = algbw * (W-1)/W for AG/RS and * 2(W-1)/W for AR.
 * t is the median over timed calls of the slowest rank's time for the call;
 * ours and MPI's calls alternate. All payloads are float32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "cli/commands.h"
#include "hypershard/comm.h"

#define KIB ((int64_t)1024)
#define MIB (1024 * KIB)

typedef enum bench_op { B_AG, B_RS, B_AR, B_OPS } bench_op;

typedef struct bench {
    hs_comm *comm;
    hs_pg *world;
    int rank, size;
    int iters;       /* timed calls per size, op and implementation; 0: by size */
    float *in, *out; /* W * largest size each */
} bench;

static int usage(FILE *f, const char *why) {
    if (why) fprintf(f, "hypershard bench comm: %s\n", why);
    fprintf(f, "usage: mpiexec -n W hypershard bench comm [--quick] [--iters N]\n"
               "  --quick    1 MiB and 4 MiB per rank only, few iterations\n"
               "  --iters N  timed calls per size, op and implementation; the median\n"
               "             counts (default: 9 to 41 by size, quick 7)\n");
    return 2;
}

/* One call of op, ours (mpi = false) or the MPI built-in. */
static void run_once(bench *b, bench_op op, bool mpi, int64_t n) {
    hs_error e;
    hs_status st = HS_OK;
    int cnt = (int)n;
    switch (op) {
    case B_AG:
        if (mpi) MPI_Allgather(b->in, cnt, MPI_FLOAT, b->out, cnt, MPI_FLOAT, MPI_COMM_WORLD);
        else st = hs_pg_all_gather(b->world, NULL, b->out, b->in, n, HS_DTYPE_F32, &e);
        break;
    case B_RS:
        if (mpi) MPI_Reduce_scatter_block(b->in, b->out, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else
            st = hs_pg_reduce_scatter(b->world, NULL, b->out, b->in, n, HS_DTYPE_F32, HS_REDUCE_SUM,
                                      &e);
        break;
    default:
        if (mpi) MPI_Allreduce(MPI_IN_PLACE, b->in, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else st = hs_pg_all_reduce(b->world, NULL, b->in, n, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    }
    if (st != HS_OK) hs_comm_abort(b->comm, &e);
}

/* Seconds of one call on the slowest rank, the ranks starting together. */
static double time_call(bench *b, bench_op op, bool mpi, int64_t n) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = hs_now();
    run_once(b, op, mpi, n);
    double t = hs_now() - t0, tmax = 0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return tmax;
}

static double bus_bandwidth(const bench *b, bench_op op, int64_t n, double t) {
    const double w = b->size, bytes = (double)n * sizeof(float);
    double algbw = (op == B_AR ? bytes : w * bytes) / t;
    double factor = op == B_AR ? 2.0 * (w - 1) / w : (w - 1) / w;
    return algbw * factor / 1e9;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Bus bandwidth in GB/s of op on n floats per rank, ours in bw[0] and MPI's
 * in bw[1], from the median call of `iters` each. Ours and MPI's calls
 * alternate, so load from other processes on the machine hits both alike,
 * and the median keeps a call that lost its core to another process from
 * counting. */
static void measure(bench *b, bench_op op, int64_t n, int iters, double bw[2]) {
    double *t[2] = {malloc(sizeof(double) * (size_t)iters), malloc(sizeof(double) * (size_t)iters)};
    if (!t[0] || !t[1]) hs_panic("out of memory for %d timings", iters);
    run_once(b, op, false, n); /* warm-up: staging buffers, MPI connections */
    run_once(b, op, true, n);
    for (int i = 0; i < iters; i++)
        for (int k = 0; k < 2; k++) t[k][i] = time_call(b, op, k == 1, n);
    for (int k = 0; k < 2; k++) {
        bw[k] = bus_bandwidth(b, op, n, median(t[k], iters));
        free(t[k]);
    }
}

static int iters_for(const bench *b, int64_t bytes) {
    if (b->iters > 0) return b->iters;
    int64_t n = 256 * MIB / (bytes * b->size);
    return n < 9 ? 9 : n > 41 ? 41 : (int)n;
}

static void print_row(int64_t bytes, double r[B_OPS][2]) {
    char size[32];
    if (bytes >= MIB) snprintf(size, sizeof size, "%lld MiB", (long long)(bytes / MIB));
    else snprintf(size, sizeof size, "%lld KiB", (long long)(bytes / KIB));
    printf("| %-8s |", size);
    for (int op = 0; op < B_OPS; op++)
        printf(" %6.2f | %6.2f | %5.2fx |", r[op][0], r[op][1],
               r[op][1] > 0 ? r[op][0] / r[op][1] : 0);
    printf("\n");
}

/* The targets of docs/performance.md, judged on the 4 MiB row. */
static void print_targets(double r[B_OPS][2]) {
    double rs_vs_mpi = r[B_RS][0] / r[B_RS][1], rs_vs_ag = r[B_RS][0] / r[B_AG][0];
    double ag_vs_mpi = r[B_AG][0] / r[B_AG][1];
    printf("\ntargets at 4 MiB per rank:\n");
    printf("  reduce-scatter >= 10x MPI_Reduce_scatter_block: %.2fx  %s\n", rs_vs_mpi,
           rs_vs_mpi >= 10 ? "met" : "NOT met");
    printf("  reduce-scatter >= 0.5x our all-gather:          %.2fx  %s\n", rs_vs_ag,
           rs_vs_ag >= 0.5 ? "met" : "NOT met");
    printf("  all-gather >= 0.9x MPI_Allgather:               %.2fx  %s\n", ag_vs_mpi,
           ag_vs_mpi >= 0.9 ? "met" : "NOT met");
}

static int run(bench *b, bool quick) {
    static const int64_t full[] = {256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB};
    static const int64_t fast[] = {1 * MIB, 4 * MIB};
    const int64_t *sizes = quick ? fast : full;
    int nsizes = quick ? 2 : 4;
    int64_t max_n = sizes[nsizes - 1] / (int64_t)sizeof(float);
    b->in = calloc((size_t)(max_n * b->size), sizeof(float));
    b->out = calloc((size_t)(max_n * b->size), sizeof(float));
    if (!b->in || !b->out) {
        fprintf(stderr, "hypershard bench comm: out of memory for %lld floats\n",
                (long long)max_n * b->size);
        return 1;
    }
    /* Real values on every page: untouched pages all map the kernel's zero
     * page, which makes cross-process reads of them behave unlike real data. */
    for (int64_t i = 0; i < max_n * b->size; i++) b->in[i] = b->out[i] = (float)(i % 7) * 0.25f;
    if (b->rank == 0) {
        printf("hypershard bench comm: %d ranks, float32, bus bandwidth in GB/s (nccl-tests "
               "definition) of the median call\n\n",
               b->size);
        printf("| size/rank | AG ours | MPI_Allgather | ratio | RS ours | MPI_Reduce_scatter_block "
               "| ratio | AR ours | MPI_Allreduce | ratio |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|\n");
    }
    double at4[B_OPS][2] = {{0}};
    for (int s = 0; s < nsizes; s++) {
        int64_t n = sizes[s] / (int64_t)sizeof(float);
        int iters = iters_for(b, sizes[s]);
        double r[B_OPS][2];
        for (int op = 0; op < B_OPS; op++) measure(b, (bench_op)op, n, iters, r[op]);
        if (b->rank == 0) print_row(sizes[s], r);
        if (sizes[s] == 4 * MIB) memcpy(at4, r, sizeof r);
    }
    if (b->rank == 0 && b->size > 1) print_targets(at4);
    free(b->in);
    free(b->out);
    return 0;
}

int hs_bench_comm(int argc, char **argv) {
    bench b = {0};
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 100000) {
                char why[128];
                snprintf(why, sizeof why, "--iters wants a whole number from 1 to 100000, got '%s'",
                         argv[i]);
                return usage(stderr, why);
            }
            b.iters = (int)v;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout, NULL);
            return 0;
        } else {
            char why[256];
            snprintf(why, sizeof why, "unknown argument '%s'", argv[i]);
            return usage(stderr, why);
        }
    }
    if (quick && b.iters == 0) b.iters = 7;
    hs_error e;
    if (hs_comm_init(&b.comm, &argc, &argv, NULL, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench comm: %s\n", e.msg);
        return hs_status_exit_code(e.code);
    }
    b.world = hs_comm_world(b.comm);
    b.rank = hs_comm_rank(b.comm);
    b.size = hs_comm_size(b.comm);
    int rc = run(&b, quick);
    hs_comm_finalize(b.comm);
    return rc;
}
