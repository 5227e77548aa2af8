/* `hypershard bench tp` — what tensor parallelism costs and buys next to
 * FSDP alone on the same ranks, under mpiexec, in one run.
 *
 * On W ranks (W even; 4 for the record) one Llama is trained in three
 * layouts on the same global batch (2 sequences per rank):
 *
 *   FSDP W              dp_shard W
 *   TP 2 x FSDP W/2     tensor parallel pairs
 *   TP 2 x FSDP W/2 SP  the same with sequence_parallel and loss_parallel
 *
 * Per layout, medians over the timed steps of the slowest rank:
 *   step ms   forward + backward + grad norm + AdamW + after_step
 *   TP ms     time the compute thread spent inside TP collectives; they sit
 *             on the critical path, so all of it is exposed
 *   TP colls  TP collectives per step and their MB (trace counters of the
 *             layout's tp group), FSDP collectives per step likewise
 * The layouts live side by side and take their timed steps in turn
 * (bench_layouts.h), so outside load slows them alike. fp32. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_layouts.h"
#include "bench_util.h"
#include "cli/commands.h"

#define N_LAYOUTS 3

typedef struct tp_bench {
    int steps;
    hs_bench_model m;
} tp_bench;

static int usage(FILE *f, const char *why)
{
    if (why) fprintf(f, "hypershard bench tp: %s\n", why);
    fprintf(f, "usage: mpiexec -n 4 hypershard bench tp [--quick] [--steps N] [--layers L] "
               "[--dim D] [--seq T]\n"
               "  FSDP W, TP 2 x FSDP W/2 and the same with sequence parallel, W = world\n"
               "  --quick     2 layers, dim 128, 2 timed steps: a smoke run in seconds\n"
               "  --steps N   timed steps per layout after one warm-up (default 5)\n"
               "  --layers L  transformer blocks (default 8)\n"
               "  --dim D     model width (default 512; a multiple of 64)\n"
               "  --seq T     sequence length (default 256)\n");
    return 2;
}

static int parse(int argc, char **argv, tp_bench *b)
{
    b->steps = 5, b->m = (hs_bench_model){.layers = 8, .dim = 512, .seq = 256, .vocab = 4096};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(stdout, NULL), -1;
        if (!strcmp(s, "--quick")) b->steps = 2, b->m.layers = 2, b->m.dim = 128, b->m.seq = 64;
        else if (!strcmp(s, "--steps") && i + 1 < argc) b->steps = atoi(argv[++i]);
        else if (!strcmp(s, "--layers") && i + 1 < argc) b->m.layers = atoi(argv[++i]);
        else if (!strcmp(s, "--dim") && i + 1 < argc) b->m.dim = atoi(argv[++i]);
        else if (!strcmp(s, "--seq") && i + 1 < argc) b->m.seq = atoi(argv[++i]);
        else return usage(stderr, "unknown option or missing value");
    }
    if (b->steps < 1 || b->steps > HS_BENCH_MAX_STEPS) return usage(stderr, "--steps must be 1..64");
    if (b->m.layers < 1 || b->m.dim < 64 || b->m.dim % 64 || b->m.seq < 2 || b->m.seq % 2)
        return usage(stderr, "bad --layers, --dim or --seq");
    return 0;
}

static void print_table(const tp_bench *b, hs_bench_layout *ls, int world)
{
    const hs_config *c = &ls[0].cfg;
    printf("\n%d ranks, Llama dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, seq %d, global "
           "batch %d sequences, fp32 AdamW; medians of %d steps, slowest rank\n",
           world, b->m.dim, b->m.layers, c->model.n_heads, c->model.n_kv_heads, c->model.ffn_dim,
           b->m.vocab, b->m.seq, ls[0].global_batch, b->steps);
    printf("| layout | step ms | TP ms (exposed) | TP share | TP colls/step | TP MB/step | "
           "FSDP colls/step | FSDP MB/step | tokens/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < N_LAYOUTS; k++) {
        hs_bench_layout *l = &ls[k];
        double step = hs_bench_median(l->step, b->steps), tp = hs_bench_median(l->mp_s, b->steps);
        double n = b->steps;
        printf("| %s | %.1f | %.1f | %.0f%% | %.0f | %.1f | %.0f | %.1f | %.0f |\n", l->name,
               1e3 * step, 1e3 * tp, 100.0 * tp / step, l->mp_colls / n, l->mp_bytes / n / 1e6,
               l->dp_colls / n, l->dp_bytes / n / 1e6,
               (double)l->global_batch * b->m.seq / step);
    }
}

int hs_bench_tp(int argc, char **argv)
{
    tp_bench b;
    int rc = parse(argc, argv, &b);
    if (rc) return rc < 0 ? 0 : rc;
    hs_error e;
    hs_error_clear(&e);
    hs_comm *c = NULL;
    hs_comm_options opt = {.timeout_s = 600};
    if (hs_comm_init(&c, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench tp: %s\n", e.msg);
        return 1;
    }
    int world = hs_comm_size(c), rank = hs_comm_rank(c);
    if (world < 2 || world % 2) {
        if (rank == 0) fprintf(stderr, "hypershard bench tp: run under mpiexec -n 4 (an even world)\n");
        hs_comm_finalize(c);
        return 2;
    }
    hs_comm_balance_blas_threads(c);
    hs_bench_layout ls[N_LAYOUTS] = {
        {.name = "FSDP W", .prefix = "fsdp", .mp_dim = "tp", .tp = 1, .cp = 1, .shard = world,
         .mbs = 2},
        {.name = "TP 2 x FSDP W/2", .prefix = "tp2", .mp_dim = "tp", .tp = 2, .cp = 1,
         .shard = world / 2, .mbs = 4},
        {.name = "TP 2 x FSDP W/2, SP + loss parallel", .prefix = "tp2sp", .mp_dim = "tp",
         .tp = 2, .cp = 1, .shard = world / 2, .mbs = 4, .sp = true},
    };
    hs_status s = HS_OK;
    for (int k = 0; s == HS_OK && k < N_LAYOUTS; k++) s = hs_bench_layout_open(c, &b.m, &ls[k], &e);
    for (int i = -1; s == HS_OK && i < b.steps; i++) /* i = -1: warm-up */
        for (int k = 0; s == HS_OK && k < N_LAYOUTS; k++)
            s = hs_bench_layout_step(c, &b.m, &ls[k], i, &e);
    if (s == HS_OK && rank == 0) {
        print_table(&b, ls, world);
        hs_bench_print_load("after");
    }
    for (int k = 0; k < N_LAYOUTS; k++) hs_bench_layout_close(&ls[k]);
    if (s != HS_OK) hs_comm_abort(c, &e);
    hs_comm_finalize(c);
    return 0;
}
