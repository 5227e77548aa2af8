/* `hypershard bench moe` — what expert parallelism costs and buys next to
 * experts sharded by FSDP alone, on the same ranks, under mpiexec, in one
 * run.
 *
 * On W ranks (4 for the record) one Mixtral-style MoE (8 experts, top 2,
 * expert ffn 2 x dim) is trained in three layouts on the same global batch
 * (2 sequences per rank), dense parameters always FSDP W:
 *
 *   EP 1   every rank runs every expert; experts sharded over FSDP W
 *   EP 2   each rank runs 4 experts; experts sharded over edp_shard W/2
 *   EP 4   each rank runs 2 experts; experts sharded over edp_shard W/4
 *
 * Per layout, medians over the timed steps of the slowest rank:
 *   step ms     forward + backward + grad norm + AdamW + after_step
 *   A2A ms      time the compute thread spent inside the EP exchanges
 *               (counts all_to_all + rows all_to_allv); they sit on the
 *               critical path, so all of it is exposed
 *   A2A calls   EP collectives per step and their MB (trace counters of the
 *               layout's ep group), FSDP collectives per step likewise
 * The layouts live side by side and take their timed steps in turn
 * (bench_layouts.h), so outside load slows them alike. fp32. */
#include <stdio.h>

#include "bench_layouts.h"
#include "bench_util.h"
#include "cli/commands.h"

static int layouts(int world, hs_bench_layout *ls) {
    static const char *const names[] = {"EP 1 (FSDP W experts)", "EP 2 x EDP shard W/2",
                                        "EP 4 x EDP shard W/4"};
    static const char *const prefixes[] = {"moe_ep1", "moe_ep2", "moe_ep4"};
    int n = 0;
    for (int k = 0, ep = 1; k < 3; k++, ep *= 2) {
        if (world % ep) continue;
        ls[n++] = (hs_bench_layout){.name = names[k],
                                    .prefix = prefixes[k],
                                    .mp_dim = "ep",
                                    .tp = 1,
                                    .cp = 1,
                                    .shard = world,
                                    .mbs = 2,
                                    .ep = ep,
                                    .edp_shard = world / ep};
    }
    return n;
}

static void print_table(const hs_bench_opts *o, hs_bench_layout *ls, int n, int world) {
    const hs_config *c = &ls[0].cfg;
    printf("\n%d ranks, MoE dim %d, %d layers, %d/%d heads, %d experts top %d, expert ffn %d, "
           "vocab %d, seq %d, global batch %d sequences, fp32 AdamW; medians of %d steps, "
           "slowest rank\n",
           world, o->m.dim, o->m.layers, c->model.n_heads, c->model.n_kv_heads, o->m.experts,
           o->m.top_k, c->model.moe.expert_ffn_dim, o->m.vocab, o->m.seq, ls[0].global_batch,
           o->steps);
    printf("| layout | step ms | A2A ms (exposed) | A2A share | A2A calls/step | A2A MB/step | "
           "FSDP colls/step | FSDP MB/step | peak MiB | tokens/s |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < n; k++) {
        hs_bench_layout *l = &ls[k];
        double step = hs_bench_median(l->step, o->steps), a2a = hs_bench_median(l->mp_s, o->steps);
        double s = o->steps;
        printf("| %s | %.1f | %.1f | %.0f%% | %.0f | %.1f | %.0f | %.1f | %.0f | %.0f |\n", l->name,
               1e3 * step, 1e3 * a2a, 100.0 * a2a / step, l->mp_colls / s, l->mp_bytes / s / 1e6,
               l->dp_colls / s, l->dp_bytes / s / 1e6, (double)l->peak_bytes / (1 << 20),
               (double)l->global_batch * o->m.seq / step);
    }
}

int hs_bench_moe(int argc, char **argv) {
    static const hs_bench_spec spec = {
        .name = "moe",
        .usage = "usage: mpiexec -n 4 hypershard bench moe [--quick] [--steps N] [--layers L] "
                 "[--dim D] [--seq T]\n"
                 "  8 experts, top 2: EP 1, 2 and 4 (those dividing W), dense FSDP W\n"
                 "  --quick     2 layers, dim 128, seq 64, 2 timed steps: a smoke run in seconds\n"
                 "  --steps N   timed steps per layout after one warm-up (default 5)\n"
                 "  --layers L  transformer blocks (default 4)\n"
                 "  --dim D     model width (default 512; a multiple of 64)\n"
                 "  --seq T     sequence length (default 256)\n",
        .defaults =
            {5, {.layers = 4, .dim = 512, .seq = 256, .vocab = 4096, .experts = 8, .top_k = 2}},
        .quick = {2, {.layers = 2, .dim = 128, .seq = 64, .vocab = 4096, .experts = 8, .top_k = 2}},
        .seq_multiple = 2,
        .layouts = layouts,
        .print = print_table,
    };
    return hs_bench_layouts_run(&spec, argc, argv);
}
