/* `hypershard bench cp` — context parallelism on long sequences, under
 * mpiexec, in one run: one Llama at a sequence length where attention
 * matters, one sequence per data-parallel rank, in the layouts
 *
 *   FSDP W                 every rank a whole sequence
 *   CP c, FSDP over dp x cp c = 2 and 4 (as the world allows), each with
 *                          cp_rotate_method allgather and ring; every layout
 *                          shards the parameters over all W ranks
 *                          (dp_shard_size W), so the device peaks differ by
 *                          activations and CP buffers alone
 *
 * Per layout, medians over the timed steps of the slowest rank: step time,
 * the time the compute thread spent in CP collectives and ring waits (the
 * exposed CP communication: ring transfers overlap the attention of the
 * block in hand and show only where they outlast it), CP collectives and
 * MB per step, the device peak of the step (activations fall with the
 * rank's share of the sequence), and tokens/s. The layouts take their
 * timed steps in turn (bench_layouts.h). fp32. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_layouts.h"
#include "bench_util.h"
#include "cli/commands.h"

#define MAX_LAYOUTS 5

typedef struct cp_bench {
    int steps;
    hs_bench_model m;
} cp_bench;

static int usage(FILE *f, const char *why)
{
    if (why) fprintf(f, "hypershard bench cp: %s\n", why);
    fprintf(f, "usage: mpiexec -n 4 hypershard bench cp [--quick] [--steps N] [--layers L] "
               "[--dim D] [--seq T]\n"
               "  FSDP W and CP 2 / 4 x FSDP, allgather and ring, one sequence per DP rank\n"
               "  --quick     2 layers, dim 128, seq 256, 2 timed steps: a smoke run\n"
               "  --steps N   timed steps per layout after one warm-up (default 3)\n"
               "  --layers L  transformer blocks (default 4)\n"
               "  --dim D     model width (default 256; a multiple of 64)\n"
               "  --seq T     sequence length (default 2048; a multiple of 8)\n");
    return 2;
}

static int parse(int argc, char **argv, cp_bench *b)
{
    b->steps = 3, b->m = (hs_bench_model){.layers = 4, .dim = 256, .seq = 2048, .vocab = 4096};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(stdout, NULL), -1;
        if (!strcmp(s, "--quick")) b->steps = 2, b->m.layers = 2, b->m.dim = 128, b->m.seq = 256;
        else if (!strcmp(s, "--steps") && i + 1 < argc) b->steps = atoi(argv[++i]);
        else if (!strcmp(s, "--layers") && i + 1 < argc) b->m.layers = atoi(argv[++i]);
        else if (!strcmp(s, "--dim") && i + 1 < argc) b->m.dim = atoi(argv[++i]);
        else if (!strcmp(s, "--seq") && i + 1 < argc) b->m.seq = atoi(argv[++i]);
        else return usage(stderr, "unknown option or missing value");
    }
    if (b->steps < 1 || b->steps > HS_BENCH_MAX_STEPS) return usage(stderr, "--steps must be 1..64");
    if (b->m.layers < 1 || b->m.dim < 64 || b->m.dim % 64 || b->m.seq < 8 || b->m.seq % 8)
        return usage(stderr, "bad --layers, --dim or --seq");
    return 0;
}

/* FSDP W, then for cp = 2, 4 dividing the world: allgather and ring. */
static int layouts_for(int world, hs_bench_layout *ls)
{
    static const char *const names[] = {"CP 2 allgather", "CP 2 ring", "CP 4 allgather", "CP 4 ring"};
    static const char *const prefixes[] = {"cp2ag", "cp2ring", "cp4ag", "cp4ring"};
    int n = 0;
    ls[n++] = (hs_bench_layout){.name = "FSDP W", .prefix = "fsdp", .mp_dim = "cp", .tp = 1,
                                .cp = 1, .shard = world, .mbs = 1};
    for (int k = 0; k < 4; k++) {
        int cp = k < 2 ? 2 : 4;
        if (world % cp) continue;
        ls[n++] = (hs_bench_layout){.name = names[k], .prefix = prefixes[k], .mp_dim = "cp",
                                    .tp = 1, .cp = cp, .shard = world, .mbs = 1,
                                    .ring = k % 2 == 1};
    }
    return n;
}

static void print_table(const cp_bench *b, hs_bench_layout *ls, int n, int world)
{
    const hs_config *c = &ls[0].cfg;
    printf("\n%d ranks, Llama dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, seq %d, one "
           "sequence per data-parallel rank, fp32 AdamW; medians of %d steps, slowest rank\n",
           world, b->m.dim, b->m.layers, c->model.n_heads, c->model.n_kv_heads, c->model.ffn_dim,
           b->m.vocab, b->m.seq, b->steps);
    printf("| layout | sequences/step | step ms | CP ms (exposed) | CP share | CP colls/step | "
           "CP MB/step | device peak MiB/rank | tokens/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < n; k++) {
        hs_bench_layout *l = &ls[k];
        double step = hs_bench_median(l->step, b->steps), cp = hs_bench_median(l->mp_s, b->steps);
        double s = b->steps;
        printf("| %s | %d | %.1f | %.1f | %.0f%% | %.0f | %.1f | %.1f | %.0f |\n", l->name,
               l->global_batch, 1e3 * step, 1e3 * cp, 100.0 * cp / step, l->mp_colls / s,
               l->mp_bytes / s / 1e6, (double)l->peak_bytes / (1 << 20),
               (double)l->global_batch * b->m.seq / step);
    }
}

int hs_bench_cp(int argc, char **argv)
{
    cp_bench b;
    int rc = parse(argc, argv, &b);
    if (rc) return rc < 0 ? 0 : rc;
    hs_error e;
    hs_error_clear(&e);
    hs_comm *c = NULL;
    hs_comm_options opt = {.timeout_s = 600};
    if (hs_comm_init(&c, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench cp: %s\n", e.msg);
        return 1;
    }
    int world = hs_comm_size(c), rank = hs_comm_rank(c);
    if (world < 2 || world % 2) {
        if (rank == 0) fprintf(stderr, "hypershard bench cp: run under mpiexec -n 4 (an even world)\n");
        hs_comm_finalize(c);
        return 2;
    }
    hs_comm_balance_blas_threads(c);
    hs_bench_layout ls[MAX_LAYOUTS];
    int n = layouts_for(world, ls);
    hs_status s = HS_OK;
    for (int k = 0; s == HS_OK && k < n; k++) s = hs_bench_layout_open(c, &b.m, &ls[k], &e);
    for (int i = -1; s == HS_OK && i < b.steps; i++) /* i = -1: warm-up */
        for (int k = 0; s == HS_OK && k < n; k++) s = hs_bench_layout_step(c, &b.m, &ls[k], i, &e);
    if (s == HS_OK && rank == 0) {
        print_table(&b, ls, n, world);
        hs_bench_print_load("after");
    }
    for (int k = 0; k < n; k++) hs_bench_layout_close(&ls[k]);
    if (s != HS_OK) hs_comm_abort(c, &e);
    hs_comm_finalize(c);
    return 0;
}
