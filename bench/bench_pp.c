/* `hypershard bench pp` — the pipeline schedules on the same ranks, under
 * mpiexec, in one run: step time and the measured bubble next to the
 * theoretical one.
 *
 * On W ranks (4 for the record) one Llama (8 blocks by default) is trained
 * with PP 2 (x FSDP W/2) and PP 4 (when W allows), each with gpipe, 1f1b,
 * interleaved_1f1b, zb1p and zbv, on the same global batch: M micro-batches of 1 sequence per
 * data-parallel rank and step (--micro, default 8). Per layout, medians
 * over the timed steps:
 *   step ms    the slowest rank's step (schedule + grad norm + AdamW)
 *   busy       the mean over ranks of the time inside the stage's
 *              forwards and backwards, as a fraction of the step
 *   bubble     1 - busy: idle waits for the neighbours, the hand-over
 *              copies and the optimizer, measured
 *   schedule idle  the same within the schedule alone (its actions up to
 *              the drain, without grad norm and optimizer): what the
 *              schedule's theory predicts
 *   theory     the schedule's ideal idle fraction: its lists replayed with
 *              the measured F, B, W times and free hand-overs (theory());
 *              (p-1)/(V M+p-1) for gpipe, 1f1b (1f1b saves activation
 *              memory, not time) and interleaved (V = 2); less for zb1p
 *              and zbv, whose W's fill the waits
 *   F / B / W  mean time of one forward, backward (zb1p: its input pass)
 *              and weight pass, and W's share of the whole backward
 *   peak MiB   each stage's device peak (its largest rank's): gpipe keeps
 *              M micro-batches' activations, 1f1b at most p
 * The layouts live side by side and take their timed steps in turn, so
 * outside load slows them alike. fp32. On this 2-core machine W = 4
 * oversubscribes the cores, which inflates every bubble alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_util.h"
#include "cli/commands.h"
#include "hypershard/parallel.h"
#include "hypershard/train.h"

#define MAX_LAYOUTS 10
#define MAX_STEPS 64

typedef struct pp_layout {
    int pp;
    hs_pp_schedule_kind kind;
    const char *schedule;
    char prefix[32];
    hs_config cfg;
    hs_topology topo;
    hs_mesh *mesh;
    hs_device *dev;
    hs_engine *en;
    hs_optim *optim;
    hs_optim_param *params;
    int n_params, M, virtual_stages, n_actions;
    hs_pp *pp_ctx;
    hs_pp_action *actions;
    int32_t *tokens, *targets; /* M micro-batches of 1 sequence */
    int T;
    double step[MAX_STEPS], busy[MAX_STEPS], sched_busy[MAX_STEPS];
    double act_ms[3][MAX_STEPS]; /* mean per-action F, B, W time over ranks */
    int64_t peak, stage_peak[4]; /* the largest device peak, and each stage's */
} pp_layout;

typedef struct opts {
    int steps, layers, dim, seq, micro;
} opts;

static hs_status config_for(const opts *o, pp_layout *l, int world, hs_error *e) {
    hs_config *c = &l->cfg;
    hs_status st = hs_config_defaults(c, e);
    if (st != HS_OK) return st;
    c->model.vocab_size = 4096;
    c->model.dim = o->dim;
    c->model.n_layers = o->layers;
    c->model.n_heads = o->dim / 64;
    c->model.n_kv_heads = o->dim / 128 > 1 ? o->dim / 128 : 2;
    c->model.ffn_dim = o->dim * 11 / 4 / 64 * 64;
    c->accelerator.pp_size = l->pp;
    snprintf(c->accelerator.pp_schedule, sizeof c->accelerator.pp_schedule, "%s", l->schedule);
    c->accelerator.pp_virtual_stages = l->virtual_stages;
    c->fsdp.dp_shard_size = world / l->pp;
    c->train.seq_len = o->seq;
    c->train.micro_batch_size = 1;
    c->train.global_batch_size = o->micro * (world / l->pp);
    strcpy(c->optimizer.target, "adamw");
    return HS_OK;
}

static hs_status open_layout(hs_comm *c, const opts *o, pp_layout *l, hs_error *e) {
    int world = hs_comm_size(c), rank = hs_comm_rank(c);
    hs_status s = config_for(o, l, world, e);
    l->T = o->seq;
    if (s == HS_OK) s = hs_topology_derive(&l->topo, world, 1, 1, 1, l->pp, world / l->pp, 1, e);
    if (s == HS_OK) s = hs_mesh_create_named(c, &l->topo, l->prefix, &l->mesh, e);
    if (s == HS_OK) s = hs_device_create(HS_DEVICE_CPU, NULL, &l->dev, e);
    if (s != HS_OK) return s;
    l->M = hs_config_micro_batches(&l->cfg, &l->topo);
    int stage = hs_mesh_coords(l->mesh).pp;
    int V = l->virtual_stages, slots = 0;
    s = hs_pp_slots(l->kind, l->pp, stage, l->M, V, &slots, e);
    if (s != HS_OK) return s;
    hs_engine_env env = {.cfg = &l->cfg,
                         .topo = &l->topo,
                         .comm = c,
                         .mesh = l->mesh,
                         .dev = l->dev,
                         .max_batch = 1,
                         .act_slots = slots};
    hs_pp_stage_chunks(&l->cfg.accelerator, l->cfg.model.n_layers, stage, &env.stage);
    s = hs_engine_create(&env, &l->en, e);
    if (s != HS_OK) return s;
    l->n_params = hs_engine_optim_params(l->en, &l->params);
    s = hs_optim_create(&l->cfg.optimizer, l->params, l->n_params, l->dev, &l->dev->device_pool,
                        &l->optim, e);
    char prefix[48];
    snprintf(prefix, sizeof prefix, "%s.", l->prefix);
    if (s == HS_OK)
        s = hs_pp_create(c, l->dev, &l->topo, rank, (int64_t)o->seq * o->dim, 0, l->M * V, prefix,
                         &l->pp_ctx, e);
    size_t n = (size_t)l->M * (size_t)o->seq;
    l->tokens = malloc(n * sizeof(int32_t));
    l->targets = malloc(n * sizeof(int32_t));
    l->n_actions = (int)hs_pp_schedule_length(l->kind, l->M, V);
    l->actions = malloc(sizeof *l->actions * (size_t)l->n_actions);
    if (s == HS_OK && (!l->tokens || !l->targets || !l->actions))
        s = hs_error_oom(e, "bench pp: cannot allocate the batches");
    if (s != HS_OK) return s;
    /* the stages of one pipeline read the same micro-batches */
    hs_bench_random_batch(l->tokens, l->targets, n, l->cfg.model.vocab_size,
                          777 + (uint64_t)hs_mesh_coords(l->mesh).dp);
    hs_pp_set_schedule(l->pp_ctx, l->kind);
    return hs_pp_schedule(l->kind, l->pp, stage, l->M, V, l->actions, e);
}

static void close_layout(pp_layout *l) {
    hs_pp_free(l->pp_ctx);
    hs_optim_free(l->optim);
    hs_engine_free(l->en);
    hs_mesh_free(l->mesh);
    hs_device_free(l->dev);
    hs_config_free(&l->cfg);
    free(l->tokens);
    free(l->targets);
    free(l->actions);
}

static hs_batch batch_of(void *ctx, int mb) {
    pp_layout *l = ctx;
    size_t off = (size_t)mb * (size_t)l->T;
    return (hs_batch){.tokens = l->tokens + off, .targets = l->targets + off, .B = 1, .T = l->T};
}

static void before_backward(void *ctx, int chunk, int mb, bool last) {
    (void)chunk, (void)mb;
    pp_layout *l = ctx;
    hs_engine_begin_micro_batch(l->en, last, last, last);
}

static hs_status step_layout(hs_comm *c, pp_layout *l, int i, hs_error *e) {
    hs_pg *world = hs_comm_world(c);
    hs_status s = hs_pg_barrier(world, e);
    if (s != HS_OK) return s;
    hs_pool_reset_peak(&l->dev->device_pool);
    hs_pp_reset_stats(l->pp_ctx);
    hs_pp_step_io io = {.ctx = l,
                        .batch = batch_of,
                        .before_backward = before_backward,
                        .split = hs_pp_schedule_splits(l->kind)};
    float scale = 1.0f / (float)((int64_t)l->cfg.train.global_batch_size * l->T);
    double t0 = hs_now(), loss = 0.0, aux = 0.0, norm = 0.0;
    hs_engine_begin_step(l->en);
    s = hs_pp_run_step(l->pp_ctx, hs_engine_model(l->en), hs_engine_hooks(l->en), l->actions,
                       l->n_actions, l->M, scale, &io, &loss, &aux, e);
    if (s == HS_OK) hs_engine_drain(l->en);
    double sched = hs_now() - t0; /* the schedule alone, up to its drain */
    if (s == HS_OK) s = hs_engine_grad_norm(l->en, &norm, e);
    if (s != HS_OK) return s;
    hs_clip_grads(hs_model_device(hs_engine_model(l->en)), l->params, l->n_params, norm,
                  l->cfg.optimizer.clip_grad_norm);
    hs_optim_step(l->optim, l->cfg.optimizer.lr, NULL);
    s = hs_engine_after_step(l->en, e);
    hs_engine_zero_grads(l->en);
    double dt = hs_now() - t0;
    /* the busy fraction, and each action kind's mean time per action */
    int per = l->M * l->virtual_stages;
    double busy = hs_pp_busy_seconds(l->pp_ctx);
    float sum[5] = {(float)(busy / dt), 0, 0, 0, (float)(busy / sched)};
    for (int k = 0; k < 3; k++)
        sum[k + 1] = (float)(hs_pp_busy_seconds_of(l->pp_ctx, (hs_pp_kind)k) / per);
    if (s == HS_OK) s = hs_pg_all_reduce(world, NULL, sum, 5, HS_DTYPE_F32, HS_REDUCE_SUM, e);
    /* each stage's peak: its slot, the largest over its ranks */
    float peaks[4] = {0};
    peaks[hs_mesh_coords(l->mesh).pp] = (float)hs_pool_peak(&l->dev->device_pool);
    if (s == HS_OK) s = hs_pg_all_reduce(world, NULL, peaks, 4, HS_DTYPE_F32, HS_REDUCE_MAX, e);
    double slowest = hs_bench_max_over(world, dt);
    if (i < 0 || s != HS_OK) return s;
    int ranks = hs_comm_size(c);
    l->step[i] = slowest;
    l->busy[i] = (double)sum[0] / ranks;
    l->sched_busy[i] = (double)sum[4] / ranks;
    for (int k = 0; k < 3; k++) l->act_ms[k][i] = 1e3 * (double)sum[k + 1] / ranks;
    for (int st = 0; st < l->pp; st++) {
        if ((int64_t)peaks[st] > l->stage_peak[st]) l->stage_peak[st] = (int64_t)peaks[st];
        if ((int64_t)peaks[st] > l->peak) l->peak = (int64_t)peaks[st];
    }
    return s;
}

/* The schedule's ideal idle fraction: every stage's list replayed with
 * the measured mean F, B and W times and free hand-overs, each action
 * starting when its stage is free and its input is there; the idle share
 * of the longest stage. 1F1B and GPipe give (p-1)/(M+p-1), interleaving V
 * chunks (p-1)/(VM+p-1), the split schedules less where W fills the
 * waits. */
static double theory(const pp_layout *l, double f, double b, double w) {
    int pp = l->pp, V = l->virtual_stages, M = l->M;
    int n = (int)hs_pp_schedule_length(l->kind, M, V);
    double dur[3] = {f, b, w}, *fin = malloc(sizeof(double) * 3 * (size_t)(pp * V * M));
    double *free_at = calloc((size_t)pp, sizeof(double));
    int *next = calloc((size_t)pp, sizeof(int));
    hs_pp_action *a = malloc(sizeof *a * (size_t)(n * pp));
    double idle = -1.0;
    hs_error e;
    bool ok = fin && free_at && next && a;
    for (int s = 0; ok && s < pp; s++)
        ok = hs_pp_schedule(l->kind, pp, s, M, V, a + (size_t)s * n, &e) == HS_OK;
    for (int i = 0; ok && i < 3 * pp * V * M; i++) fin[i] = -1.0;
#define FIN(k, s, v, mb) fin[(((k)*pp + (s)) * V + (v)) * M + (mb)]
    for (bool moved = ok; moved;) {
        moved = false;
        for (int s = 0; s < pp; s++)
            while (next[s] < n) {
                hs_pp_action x = a[(size_t)s * n + next[s]];
                double ready = x.kind == HS_PP_FORWARD ? 0.0
                                                       : FIN(x.kind - 1, s, x.chunk, x.micro_batch);
                int c = hs_pp_model_chunk(l->kind, pp, s, x.chunk), from = -1, fs, fv;
                if (x.kind != HS_PP_WEIGHT) from = x.kind == HS_PP_FORWARD ? c - 1 : c + 1;
                if (from >= 0 && from < pp * V) {
                    hs_pp_chunk_home(l->kind, pp, from, &fs, &fv);
                    double in = FIN(x.kind, fs, fv, x.micro_batch);
                    ready = in < 0 || ready < 0 ? -1.0 : (in > ready ? in : ready);
                }
                if (ready < 0) break;
                double t0 = ready > free_at[s] ? ready : free_at[s];
                FIN(x.kind, s, x.chunk, x.micro_batch) = free_at[s] = t0 + dur[x.kind];
                next[s]++, moved = true;
            }
    }
#undef FIN
    if (ok) {
        double span = 0.0;
        for (int s = 0; s < pp; s++) span = free_at[s] > span ? free_at[s] : span;
        idle = span > 0 ? 1.0 - (double)M * V * (f + b + w) / span : 0.0;
    }
    free(fin), free(free_at), free(next), free(a);
    return idle;
}

static void print_table(const opts *o, pp_layout *ls, int n, int world) {
    printf("\n%d ranks, Llama dim %d, %d layers, seq %d, vocab %d, %d micro-batches of 1 "
           "sequence per data-parallel rank and step, fp32 AdamW; medians of %d steps\n",
           world, o->dim, o->layers, o->seq, ls[0].cfg.model.vocab_size, o->micro, o->steps);
    printf("| layout | schedule | M | step ms | busy | bubble | schedule idle | theory | "
           "F / B / W ms | W share of backward | peak MiB per stage |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < n; k++) {
        pp_layout *l = &ls[k];
        double step = hs_bench_median(l->step, o->steps), busy = hs_bench_median(l->busy, o->steps);
        double sb = hs_bench_median(l->sched_busy, o->steps);
        double f = hs_bench_median(l->act_ms[0], o->steps);
        double b = hs_bench_median(l->act_ms[1], o->steps);
        double w = hs_bench_median(l->act_ms[2], o->steps);
        char peaks[64];
        int used = 0;
        for (int st = 0; st < l->pp && used < (int)sizeof peaks; st++)
            used += snprintf(peaks + used, sizeof peaks - (size_t)used, "%s%.0f", st ? " / " : "",
                             (double)l->stage_peak[st] / (1 << 20));
        printf("| PP %d x FSDP %d | %s%s | %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.1f / %.1f / "
               "%.1f | %.2f | %s |\n",
               l->pp, world / l->pp, l->schedule,
               l->virtual_stages > 1 && !hs_pp_schedule_info_of(l->kind)->v_shape ? " V=2" : "",
               l->M, step * 1e3, busy, 1.0 - busy, 1.0 - sb, theory(l, f, b, w), f, b, w,
               w / (b + w), peaks);
    }
}

static int usage(FILE *f, const char *why) {
    if (why) fprintf(f, "hypershard bench pp: %s\n", why);
    fputs("usage: mpiexec -n 4 hypershard bench pp [--quick] [--steps N] [--layers L] [--dim D]\n"
          "           [--seq T] [--micro M]\n"
          "PP 2 and PP 4 (x FSDP over the rest of the ranks), gpipe, 1f1b, interleaved_1f1b,\n"
          "zb1p and zbv side by side: step time, measured bubble next to the schedule's ideal,\n"
          "F / B / W times, device peak.\n"
          "Defaults: 8 steps, 8 layers, dim 256, seq 128, 8 micro-batches; --quick: 2 steps,\n"
          "4 layers, dim 128, seq 32, 4 micro-batches.\n",
          f);
    return 2;
}

int hs_bench_pp(int argc, char **argv) {
    opts o = {.steps = 8, .layers = 8, .dim = 256, .seq = 128, .micro = 8};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(stdout, NULL), 0;
        if (!strcmp(s, "--quick"))
            o = (opts){.steps = 2, .layers = 4, .dim = 128, .seq = 32, .micro = 4};
        else if (!strcmp(s, "--steps") && i + 1 < argc) o.steps = atoi(argv[++i]);
        else if (!strcmp(s, "--layers") && i + 1 < argc) o.layers = atoi(argv[++i]);
        else if (!strcmp(s, "--dim") && i + 1 < argc) o.dim = atoi(argv[++i]);
        else if (!strcmp(s, "--seq") && i + 1 < argc) o.seq = atoi(argv[++i]);
        else if (!strcmp(s, "--micro") && i + 1 < argc) o.micro = atoi(argv[++i]);
        else return usage(stderr, "unknown option or missing value");
    }
    if (o.steps < 1 || o.steps > MAX_STEPS) return usage(stderr, "--steps must be 1..64");
    if (o.layers < 4 || o.dim < 128 || o.dim % 64 || o.seq < 2 || o.micro < 4)
        return usage(stderr, "need --layers >= 4, --dim >= 128 a multiple of 64, --seq >= 2, "
                             "--micro >= 4 (1f1b needs M >= pp)");
    hs_error e;
    hs_error_clear(&e);
    hs_comm *c = NULL;
    hs_comm_options copt = {.timeout_s = 600};
    if (hs_comm_init(&c, &argc, &argv, &copt, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench pp: %s\n", e.msg);
        return 1;
    }
    int world = hs_comm_size(c), rank = hs_comm_rank(c);
    if (world < 2 || world % 2) {
        if (rank == 0)
            fprintf(stderr, "hypershard bench pp: run under mpiexec -n 4 (an even world)\n");
        hs_comm_finalize(c);
        return 2;
    }
    hs_comm_balance_blas_threads(c);
    pp_layout ls[MAX_LAYOUTS];
    memset(ls, 0, sizeof ls);
    int n = 0;
    for (int pp = 2; pp <= 4 && n < MAX_LAYOUTS; pp *= 2) {
        if (world % pp || pp > o.layers) continue;
        for (int k = 0; k < HS_PP_N_SCHEDULES && n < MAX_LAYOUTS; k++) {
            const hs_pp_schedule_info *info = hs_pp_schedule_info_of((hs_pp_schedule_kind)k);
            int v = info->min_chunks;
            if (v * pp > o.layers) continue; /* every chunk needs a block */
            pp_layout *l = &ls[n++];
            l->pp = pp;
            l->kind = info->kind;
            l->schedule = info->name;
            l->virtual_stages = v;
            snprintf(l->prefix, sizeof l->prefix, "pp%d_%s", pp, l->schedule);
        }
    }
    hs_status s = HS_OK;
    for (int k = 0; s == HS_OK && k < n; k++) s = open_layout(c, &o, &ls[k], &e);
    for (int i = -1; s == HS_OK && i < o.steps; i++) /* i = -1: warm-up */
        for (int k = 0; s == HS_OK && k < n; k++) s = step_layout(c, &ls[k], i, &e);
    if (s == HS_OK && rank == 0) {
        print_table(&o, ls, n, world);
        hs_bench_print_load("after");
    }
    for (int k = 0; k < n; k++) close_layout(&ls[k]);
    if (s != HS_OK) hs_comm_abort(c, &e);
    hs_comm_finalize(c);
    return 0;
}
