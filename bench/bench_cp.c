/* `hypershard bench cp` — context parallelism on long sequences, under
 * mpiexec, in one run: one Llama at a sequence length where attention
 * matters, one sequence per data-parallel rank, in the layouts
 *
 *   FSDP W                 every rank a whole sequence
 *   CP c, FSDP over dp x cp c = 2 and 4 (as the world allows), each with
 *                          cp_rotate_method allgather, ring and alltoall,
 *                          at c = 4 also alltoall_ring over pairs (a layout
 *                          whose heads do not split is skipped); every layout
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
#include <stdio.h>

#include "bench_layouts.h"
#include "bench_util.h"
#include "cli/commands.h"

/* FSDP W, then for cp = 2, 4 dividing the world: allgather, ring,
 * alltoall, and at cp 4 alltoall_ring over pairs (at cp 2 its sizes are
 * alltoall's and ring's). */
static int layouts_for(int world, hs_bench_layout *ls) {
    static const struct {
        const char *name, *prefix, *method;
        int cp, a2a;
    } cps[] = {
        {"CP 2 allgather", "cp2ag", "allgather", 2, 0},
        {"CP 2 ring", "cp2ring", "ring", 2, 0},
        {"CP 2 alltoall", "cp2a2a", "alltoall", 2, 0},
        {"CP 4 allgather", "cp4ag", "allgather", 4, 0},
        {"CP 4 ring", "cp4ring", "ring", 4, 0},
        {"CP 4 alltoall", "cp4a2a", "alltoall", 4, 0},
        {"CP 4 alltoall_ring (a2a 2)", "cp4hyb", "alltoall_ring", 4, 2},
    };
    int n = 0;
    ls[n++] = (hs_bench_layout){.name = "FSDP W",
                                .prefix = "fsdp",
                                .mp_dim = "cp",
                                .tp = 1,
                                .cp = 1,
                                .shard = world,
                                .mbs = 1};
    for (size_t k = 0; k < sizeof cps / sizeof cps[0]; k++) {
        if (world % cps[k].cp) continue;
        ls[n++] = (hs_bench_layout){.name = cps[k].name,
                                    .prefix = cps[k].prefix,
                                    .mp_dim = "cp",
                                    .tp = 1,
                                    .cp = cps[k].cp,
                                    .shard = world,
                                    .mbs = 1,
                                    .cp_method = cps[k].method,
                                    .cp_a2a = cps[k].a2a};
    }
    return n;
}

static void print_table(const hs_bench_opts *b, hs_bench_layout *ls, int n, int world) {
    const hs_config *c = &ls[0].cfg;
    printf("\n%d ranks, Llama dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, seq %d, one "
           "sequence per data-parallel rank, fp32 AdamW; medians of %d steps, slowest rank\n",
           world, b->m.dim, b->m.layers, c->model.n_heads, c->model.n_kv_heads, c->model.ffn_dim,
           b->m.vocab, b->m.seq, b->steps);
    printf(
        "| layout | sequences/step | step ms | CP ms (exposed) | CP share | CP colls/step | "
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

int hs_bench_cp(int argc, char **argv) {
    static const hs_bench_spec spec = {
        .name = "cp",
        .usage = "usage: mpiexec -n 4 hypershard bench cp [--quick] [--steps N] [--layers L] "
                 "[--dim D] [--seq T]\n"
                 "  FSDP W and CP 2 / 4, allgather, ring, alltoall (and alltoall_ring at CP 4),\n"
                 "  one sequence per DP rank\n"
                 "  --quick     2 layers, dim 128, seq 256, 2 timed steps: a smoke run\n"
                 "  --steps N   timed steps per layout after one warm-up (default 3)\n"
                 "  --layers L  transformer blocks (default 4)\n"
                 "  --dim D     model width (default 256; a multiple of 64)\n"
                 "  --seq T     sequence length (default 2048; a multiple of 8)\n",
        .defaults = {3, {.layers = 4, .dim = 256, .seq = 2048, .vocab = 4096}},
        .quick = {2, {.layers = 2, .dim = 128, .seq = 256, .vocab = 4096}},
        .seq_multiple = 8,
        .layouts = layouts_for,
        .print = print_table,
    };
    return hs_bench_layouts_run(&spec, argc, argv);
}
