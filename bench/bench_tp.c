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
#include <stdio.h>

#include "bench_layouts.h"
#include "bench_util.h"
#include "cli/commands.h"

static int layouts(int world, hs_bench_layout *ls) {
    ls[0] = (hs_bench_layout){.name = "FSDP W",
                              .prefix = "fsdp",
                              .mp_dim = "tp",
                              .tp = 1,
                              .cp = 1,
                              .shard = world,
                              .mbs = 2};
    ls[1] = (hs_bench_layout){.name = "TP 2 x FSDP W/2",
                              .prefix = "tp2",
                              .mp_dim = "tp",
                              .tp = 2,
                              .cp = 1,
                              .shard = world / 2,
                              .mbs = 4};
    ls[2] = (hs_bench_layout){.name = "TP 2 x FSDP W/2, SP + loss parallel",
                              .prefix = "tp2sp",
                              .mp_dim = "tp",
                              .tp = 2,
                              .cp = 1,
                              .shard = world / 2,
                              .mbs = 4,
                              .sp = true};
    return 3;
}

static void print_table(const hs_bench_opts *o, hs_bench_layout *ls, int n, int world) {
    const hs_config *c = &ls[0].cfg;
    printf("\n%d ranks, Llama dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, seq %d, global "
           "batch %d sequences, fp32 AdamW; medians of %d steps, slowest rank\n",
           world, o->m.dim, o->m.layers, c->model.n_heads, c->model.n_kv_heads, c->model.ffn_dim,
           o->m.vocab, o->m.seq, ls[0].global_batch, o->steps);
    printf("| layout | step ms | TP ms (exposed) | TP share | TP colls/step | TP MB/step | "
           "FSDP colls/step | FSDP MB/step | tokens/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < n; k++) {
        hs_bench_layout *l = &ls[k];
        double step = hs_bench_median(l->step, o->steps), tp = hs_bench_median(l->mp_s, o->steps);
        double s = o->steps;
        printf("| %s | %.1f | %.1f | %.0f%% | %.0f | %.1f | %.0f | %.1f | %.0f |\n", l->name,
               1e3 * step, 1e3 * tp, 100.0 * tp / step, l->mp_colls / s, l->mp_bytes / s / 1e6,
               l->dp_colls / s, l->dp_bytes / s / 1e6, (double)l->global_batch * o->m.seq / step);
    }
}

int hs_bench_tp(int argc, char **argv) {
    static const hs_bench_spec spec = {
        .name = "tp",
        .usage = "usage: mpiexec -n 4 hypershard bench tp [--quick] [--steps N] [--layers L] "
                 "[--dim D] [--seq T]\n"
                 "  FSDP W, TP 2 x FSDP W/2 and the same with sequence parallel, W = world\n"
                 "  --quick     2 layers, dim 128, seq 64, 2 timed steps: a smoke run in seconds\n"
                 "  --steps N   timed steps per layout after one warm-up (default 5)\n"
                 "  --layers L  transformer blocks (default 8)\n"
                 "  --dim D     model width (default 512; a multiple of 64)\n"
                 "  --seq T     sequence length (default 256)\n",
        .defaults = {5, {.layers = 8, .dim = 512, .seq = 256, .vocab = 4096}},
        .quick = {2, {.layers = 2, .dim = 128, .seq = 64, .vocab = 4096}},
        .seq_multiple = 2,
        .layouts = layouts,
        .print = print_table,
    };
    return hs_bench_layouts_run(&spec, argc, argv);
}
