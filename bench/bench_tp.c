/* `hypershard bench tp` — what tensor parallelism costs and buys next to
 * FSDP alone on the same ranks, under mpiexec, in one run.
 *
 * On W ranks (W even; 4 for the record) one Llama is trained in three
 * layouts on the same global batch:
 *
 *   FSDP W              dp_shard W, micro-batch G/W per rank
 *   TP 2 x FSDP W/2     tensor parallel pairs, micro-batch G/(W/2)
 *   TP 2 x FSDP W/2 SP  the same with sequence_parallel and loss_parallel
 *
 * Per layout, medians over the timed steps of the slowest rank:
 *   step ms   forward + backward + grad norm + AdamW + after_step
 *   TP ms     time the compute thread spent inside TP collectives; they sit
 *             on the critical path, so all of it is exposed
 *   TP colls  TP collectives per step and their MB (trace counters of the
 *             layout's tp group), FSDP collectives per step likewise
 * The three layouts live side by side and take their timed steps in turn,
 * so outside load slows them alike. Everything is fp32. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_util.h"
#include "cli/commands.h"
#include "hypershard/comm.h"
#include "hypershard/mesh.h"
#include "train/engine.h"

#define MAX_STEPS 64
#define N_LAYOUTS 3

typedef struct tp_bench {
    hs_comm *comm;
    int world, rank, steps, layers, dim, seq, global_batch;
} tp_bench;

typedef struct layout {
    const char *name, *prefix;
    int tp, shard;
    bool sp;
    hs_config cfg;
    hs_topology topo;
    hs_mesh *mesh;
    hs_device *dev;
    hs_engine *en;
    hs_optim *optim;
    hs_optim_param *params;
    int n_params, mbs;
    int32_t *tokens, *targets;
    double step[MAX_STEPS], tp_s[MAX_STEPS];
    int64_t tp_colls, tp_bytes, dp_colls, dp_bytes; /* over the timed steps */
} layout;

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
    b->steps = 5, b->layers = 8, b->dim = 512, b->seq = 256;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(stdout, NULL), -1;
        if (!strcmp(s, "--quick")) b->steps = 2, b->layers = 2, b->dim = 128, b->seq = 64;
        else if (!strcmp(s, "--steps") && i + 1 < argc) b->steps = atoi(argv[++i]);
        else if (!strcmp(s, "--layers") && i + 1 < argc) b->layers = atoi(argv[++i]);
        else if (!strcmp(s, "--dim") && i + 1 < argc) b->dim = atoi(argv[++i]);
        else if (!strcmp(s, "--seq") && i + 1 < argc) b->seq = atoi(argv[++i]);
        else return usage(stderr, "unknown option or missing value");
    }
    if (b->steps < 1 || b->steps > MAX_STEPS) return usage(stderr, "--steps must be 1..64");
    if (b->layers < 1 || b->dim < 64 || b->dim % 64 || b->seq < 2 || b->seq % 2)
        return usage(stderr, "bad --layers, --dim or --seq");
    return 0;
}

static void config_for(const tp_bench *b, layout *l)
{
    hs_config *c = &l->cfg;
    hs_config_defaults(c);
    strcpy(c->model.arch, "llama");
    c->model.vocab_size = 4096;
    c->model.dim = b->dim;
    c->model.n_layers = b->layers;
    c->model.n_heads = b->dim / 64;
    c->model.n_kv_heads = b->dim / 128 > 1 ? b->dim / 128 : 2;
    c->model.ffn_dim = b->dim * 11 / 4 / 64 * 64;
    c->accelerator.tp_size = l->tp;
    c->accelerator.sequence_parallel = l->sp;
    c->accelerator.loss_parallel = l->sp;
    c->fsdp.dp_shard_size = l->shard;
    c->train.seq_len = b->seq;
    c->train.global_batch_size = b->global_batch;
    c->train.micro_batch_size = l->mbs = b->global_batch / l->shard;
    strcpy(c->optimizer.target, "adamw");
}

static hs_status layout_open(const tp_bench *b, layout *l, hs_error *e)
{
    config_for(b, l);
    hs_status s = hs_topology_derive(&l->topo, b->world, l->tp, 1, 1, 1, l->shard, 1, e);
    if (s == HS_OK) s = hs_mesh_create_named(b->comm, &l->topo, l->prefix, &l->mesh, e);
    if (s == HS_OK) s = hs_device_create(HS_DEVICE_CPU, NULL, &l->dev, e);
    if (s != HS_OK) return s;
    hs_engine_env env = {.cfg = &l->cfg, .topo = &l->topo, .comm = b->comm, .mesh = l->mesh,
                         .dev = l->dev, .max_batch = l->mbs};
    s = hs_engine_create(&env, &l->en, e);
    if (s != HS_OK) return s;
    l->n_params = l->en->optim_params(l->en, &l->params);
    s = hs_optim_create(&l->cfg.optimizer, l->params, l->n_params, &l->dev->device_pool,
                        &l->optim, e);
    size_t bt = (size_t)l->mbs * (size_t)b->seq;
    l->tokens = malloc(bt * sizeof(int32_t));
    l->targets = malloc(bt * sizeof(int32_t));
    if (s == HS_OK && (!l->tokens || !l->targets))
        s = hs_error_set(e, HS_ERR_OOM, "bench tp: cannot allocate the batch");
    /* the same batch on the ranks of a TP group: seeded by their dp rank */
    if (s == HS_OK)
        hs_bench_random_batch(l->tokens, l->targets, bt, 4096,
                              12345 + (uint64_t)hs_mesh_coords(l->mesh).dp);
    return s;
}

static void layout_close(layout *l)
{
    hs_optim_free(l->optim);
    hs_engine_free(l->en);
    hs_mesh_free(l->mesh);
    hs_device_free(l->dev);
    hs_config_free(&l->cfg);
    free(l->tokens);
    free(l->targets);
}

/* Collectives and bytes of the layout's groups so far. */
static void counts(hs_trace *t, const char *prefix, bool tp, int64_t *colls, int64_t *bytes)
{
    static const char *const ops[] = {"all_gather", "reduce_scatter", "all_reduce"};
    static const char *const dp_dims[] = {"fsdp_shard", "fsdp_replicate", "fsdp"};
    char g[64];
    *colls = *bytes = 0;
    for (int d = 0; d < (tp ? 1 : 3); d++) {
        snprintf(g, sizeof g, "%s.%s", prefix, tp ? "tp" : dp_dims[d]);
        for (int o = 0; o < 3; o++) {
            *colls += hs_trace_collectives(t, ops[o], g);
            *bytes += hs_trace_collective_bytes(t, ops[o], g);
        }
    }
}

/* One step as src/train/step.c runs it with one micro-batch. */
static hs_status layout_step(const tp_bench *b, layout *l, int i, hs_error *e)
{
    hs_trace *tr = hs_comm_trace(b->comm);
    hs_tp *tp = l->en->tp ? l->en->tp(l->en) : NULL;
    if (tp) hs_tp_reset_stats(tp);
    int64_t c0, b0, d0, db0, c1, b1, d1, db1;
    counts(tr, l->prefix, true, &c0, &b0);
    counts(tr, l->prefix, false, &d0, &db0);
    hs_batch batch = {.tokens = l->tokens, .targets = l->targets, .B = l->mbs, .T = b->seq};
    double t0 = hs_now();
    float scale = 1.0f / (float)((int64_t)b->global_batch * b->seq);
    hs_status s = hs_bench_engine_step(l->en, l->optim, l->params, l->n_params,
                                       &l->cfg.optimizer, &batch, scale, NULL, e);
    if (s != HS_OK) return s;
    double dt = hs_now() - t0, tps = tp ? hs_tp_get_stats(tp).seconds : 0.0;
    hs_pg *world = hs_comm_world(b->comm);
    dt = hs_bench_max_over(world, dt);
    tps = hs_bench_max_over(world, tps);
    if (i < 0) return s;
    counts(tr, l->prefix, true, &c1, &b1);
    counts(tr, l->prefix, false, &d1, &db1);
    l->step[i] = dt, l->tp_s[i] = tps;
    l->tp_colls += c1 - c0, l->tp_bytes += b1 - b0, l->dp_colls += d1 - d0, l->dp_bytes += db1 - db0;
    return s;
}

static void print_table(const tp_bench *b, layout *ls)
{
    if (b->rank) return;
    printf("\n%d ranks, Llama dim %d, %d layers, %d/%d heads, ffn %d, vocab 4096, seq %d, global "
           "batch %d sequences, fp32 AdamW; medians of %d steps, slowest rank\n",
           b->world, b->dim, b->layers, ls[0].cfg.model.n_heads, ls[0].cfg.model.n_kv_heads,
           ls[0].cfg.model.ffn_dim, b->seq, b->global_batch, b->steps);
    printf("| layout | step ms | TP ms (exposed) | TP share | TP colls/step | TP MB/step | "
           "FSDP colls/step | FSDP MB/step | tokens/s |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < N_LAYOUTS; k++) {
        layout *l = &ls[k];
        double step = hs_bench_median(l->step, b->steps), tp = hs_bench_median(l->tp_s, b->steps);
        double n = b->steps;
        printf("| %s | %.1f | %.1f | %.0f%% | %.0f | %.1f | %.0f | %.1f | %.0f |\n", l->name,
               1e3 * step, 1e3 * tp, 100.0 * tp / step, l->tp_colls / n, l->tp_bytes / n / 1e6,
               l->dp_colls / n, l->dp_bytes / n / 1e6,
               (double)b->global_batch * b->seq / step);
    }
    double l[3];
    if (getloadavg(l, 3) == 3) printf("load average after: %.2f %.2f %.2f\n", l[0], l[1], l[2]);
}

int hs_bench_tp(int argc, char **argv)
{
    tp_bench b;
    memset(&b, 0, sizeof b);
    int rc = parse(argc, argv, &b);
    if (rc) return rc < 0 ? 0 : rc;
    hs_error e;
    hs_error_clear(&e);
    hs_comm_options opt = {.timeout_s = 600};
    if (hs_comm_init(&b.comm, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench tp: %s\n", e.msg);
        return 1;
    }
    b.world = hs_comm_size(b.comm);
    b.rank = hs_comm_rank(b.comm);
    if (b.world < 2 || b.world % 2) {
        if (b.rank == 0) fprintf(stderr, "hypershard bench tp: run under mpiexec -n 4 (an even world)\n");
        hs_comm_finalize(b.comm);
        return 2;
    }
    b.global_batch = b.world * 2;
    hs_comm_balance_blas_threads(b.comm);
    layout ls[N_LAYOUTS] = {
        {.name = "FSDP W", .prefix = "fsdp", .tp = 1, .shard = b.world},
        {.name = "TP 2 x FSDP W/2", .prefix = "tp2", .tp = 2, .shard = b.world / 2},
        {.name = "TP 2 x FSDP W/2, SP + loss parallel", .prefix = "tp2sp", .tp = 2,
         .shard = b.world / 2, .sp = true},
    };
    hs_status s = HS_OK;
    for (int k = 0; s == HS_OK && k < N_LAYOUTS; k++) s = layout_open(&b, &ls[k], &e);
    for (int i = -1; s == HS_OK && i < b.steps; i++) /* i = -1: warm-up */
        for (int k = 0; s == HS_OK && k < N_LAYOUTS; k++) s = layout_step(&b, &ls[k], i, &e);
    if (s == HS_OK) print_table(&b, ls);
    for (int k = 0; k < N_LAYOUTS; k++) layout_close(&ls[k]);
    if (s != HS_OK) hs_comm_abort(b.comm, &e);
    hs_comm_finalize(b.comm);
    return 0;
}
