/* Several parallel layouts of one model side by side (bench_layouts.h). */
#include "bench_layouts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"
#include "bench_util.h"
#include "hypershard/train.h"

/* The model's heads: 64 wide, half as many kv heads (at least 2). */
static void bench_heads(const hs_bench_model *bm, int *heads, int *kv_heads) {
    *heads = bm->dim / 64;
    *kv_heads = bm->dim / 128 > 1 ? bm->dim / 128 : 2;
}

/* Whether the layout's CP method splits the model's heads (the all-to-all
 * methods need heads / tp over the all-to-all group: docs/cp.md). */
static bool layout_fits(const hs_bench_model *bm, const hs_bench_layout *l) {
    hs_accel_config a = {.cp_a2a_size = l->cp_a2a};
    snprintf(a.cp_rotate_method, sizeof a.cp_rotate_method, "%s", l->cp_method ? l->cp_method : "");
    int a2a, nh, kv;
    hs_cp_method_of(&a, l->cp, &a2a);
    bench_heads(bm, &nh, &kv);
    nh /= l->tp, kv /= l->tp;
    return a2a == 1 || (nh % a2a == 0 && (kv % a2a == 0 || a2a % kv == 0));
}

static hs_status config_for(const hs_bench_model *bm, hs_bench_layout *l, int world, hs_error *e) {
    hs_config *c = &l->cfg;
    hs_status st = hs_config_defaults(c, e);
    if (st != HS_OK) return st;
    strcpy(c->model.arch, bm->experts > 0 ? "moe" : "llama");
    if (bm->experts > 0) {
        c->model.moe.num_experts = bm->experts;
        c->model.moe.top_k = bm->top_k;
        c->model.moe.expert_ffn_dim = bm->dim * 2;
    }
    c->accelerator.ep_size = l->ep > 1 ? l->ep : 1;
    c->fsdp.edp_shard_size = l->edp_shard > 1 ? l->edp_shard : 1;
    c->model.vocab_size = bm->vocab;
    c->model.dim = bm->dim;
    c->model.n_layers = bm->layers;
    bench_heads(bm, &c->model.n_heads, &c->model.n_kv_heads);
    c->model.ffn_dim = bm->dim * 11 / 4 / 64 * 64;
    c->accelerator.tp_size = l->tp;
    c->accelerator.cp_size = l->cp;
    c->accelerator.sequence_parallel = l->sp;
    c->accelerator.loss_parallel = l->sp;
    snprintf(c->accelerator.cp_rotate_method, sizeof c->accelerator.cp_rotate_method, "%s",
             l->cp_method ? l->cp_method : "allgather");
    c->accelerator.cp_a2a_size = l->cp_a2a;
    c->fsdp.dp_shard_size = l->shard;
    c->train.seq_len = bm->seq;
    l->global_batch = l->mbs * (world / (l->tp * l->cp));
    c->train.global_batch_size = l->global_batch;
    c->train.micro_batch_size = l->mbs;
    strcpy(c->optimizer.target, "adamw");
    return HS_OK;
}

hs_status hs_bench_layout_open(hs_comm *c, const hs_bench_model *bm, hs_bench_layout *l,
                               hs_error *e) {
    int world = hs_comm_size(c);
    hs_status s = config_for(bm, l, world, e);
    if (s == HS_OK)
        s = hs_topology_derive(&l->topo, world, l->tp, l->cp, l->cfg.accelerator.ep_size, 1,
                               l->shard, l->cfg.fsdp.edp_shard_size, e);
    if (s == HS_OK) s = hs_mesh_create_named(c, &l->topo, l->prefix, &l->mesh, e);
    if (s == HS_OK) s = hs_device_create(HS_DEVICE_CPU, NULL, &l->dev, e);
    if (s != HS_OK) return s;
    hs_engine_env env = {.cfg = &l->cfg,
                         .topo = &l->topo,
                         .comm = c,
                         .mesh = l->mesh,
                         .dev = l->dev,
                         .max_batch = l->mbs};
    s = hs_engine_create(&env, &l->en, e);
    if (s != HS_OK) return s;
    l->n_params = hs_engine_optim_params(l->en, &l->params);
    s = hs_optim_create(&l->cfg.optimizer, l->params, l->n_params, l->dev, &l->dev->device_pool,
                        &l->optim, e);
    size_t bt = (size_t)l->mbs * (size_t)bm->seq;
    l->tokens = malloc(bt * sizeof(int32_t));
    l->targets = malloc(bt * sizeof(int32_t));
    if (s == HS_OK && (!l->tokens || !l->targets))
        s = hs_error_oom(e, "bench: cannot allocate the batch");
    /* the same sequences on the ranks of a TP / CP group: seeded by their dp rank */
    if (s == HS_OK)
        hs_bench_random_batch(l->tokens, l->targets, bt, bm->vocab,
                              12345 + (uint64_t)hs_mesh_coords(l->mesh).dp);
    if (s == HS_OK && l->cp > 1) { /* the engine runs this rank's CP rows */
        int Tl = bm->seq / l->cp, r = hs_mesh_coords(l->mesh).cp;
        int32_t *tok = malloc(bt / (size_t)l->cp * sizeof(int32_t));
        int32_t *tgt = malloc(bt / (size_t)l->cp * sizeof(int32_t));
        if (!tok || !tgt) s = hs_error_oom(e, "bench: cannot allocate the CP batch");
        if (s == HS_OK) {
            hs_cp_take_local_ids(tok, l->tokens, l->cp, r, l->mbs, Tl);
            hs_cp_take_local_ids(tgt, l->targets, l->cp, r, l->mbs, Tl);
        }
        free(l->tokens);
        free(l->targets);
        l->tokens = tok, l->targets = tgt;
    }
    return s;
}

void hs_bench_layout_close(hs_bench_layout *l) {
    hs_optim_free(l->optim);
    hs_engine_free(l->en);
    hs_mesh_free(l->mesh);
    hs_device_free(l->dev);
    hs_config_free(&l->cfg);
    free(l->tokens);
    free(l->targets);
}

/* Collectives and bytes so far of the layout's model-parallel group (mp)
 * or of its FSDP groups. */
static void counts(hs_trace *t, const hs_bench_layout *l, bool mp, int64_t *colls, int64_t *bytes) {
    static const char *const ops[] = {"all_gather", "reduce_scatter", "all_reduce",
                                      "send",       "all_to_all",     "all_to_allv"};
    static const char *const dp_dims[] = {"fsdp_shard", "fsdp_replicate", "fsdp", "edp_shard",
                                          "edp_replicate"};
    char g[64];
    *colls = *bytes = 0;
    /* alltoall_ring's all-to-alls run on its a2a group inside cp */
    bool a2a = mp && l->cp_a2a > 1 && l->cp_a2a < l->cp;
    for (int d = 0; d < (mp ? 1 + a2a : 5); d++) {
        if (!mp) snprintf(g, sizeof g, "%s.%s", l->prefix, dp_dims[d]);
        else if (d == 0) snprintf(g, sizeof g, "%s.%s", l->prefix, l->mp_dim);
        else snprintf(g, sizeof g, "%s.cp.a2a%d", l->prefix, l->cp_a2a);
        for (int o = 0; o < 6; o++) {
            *colls += hs_trace_collectives(t, ops[o], g);
            *bytes += hs_trace_collective_bytes(t, ops[o], g);
        }
    }
}

/* Seconds inside the model-parallel collectives since the last call. */
static double mp_seconds(hs_bench_layout *l) {
    hs_parallel *p = hs_engine_parallel(l->en);
    hs_tp *tp = p ? hs_parallel_tp(p) : NULL;
    hs_cp *cp = p ? hs_parallel_cp(p) : NULL;
    hs_ep *ep = p ? hs_parallel_ep(p) : NULL;
    double s = 0.0;
    if (ep && !strcmp(l->mp_dim, "ep")) s = hs_ep_get_stats(ep).seconds, hs_ep_reset_stats(ep);
    if (tp && !strcmp(l->mp_dim, "tp")) s = hs_tp_get_stats(tp).seconds, hs_tp_reset_stats(tp);
    if (cp && !strcmp(l->mp_dim, "cp")) s = hs_cp_get_stats(cp).seconds, hs_cp_reset_stats(cp);
    return s;
}

hs_status hs_bench_layout_step(hs_comm *c, const hs_bench_model *bm, hs_bench_layout *l, int i,
                               hs_error *e) {
    hs_trace *tr = hs_comm_trace(c);
    int64_t c0, b0, d0, db0, c1, b1, d1, db1;
    mp_seconds(l);
    counts(tr, l, true, &c0, &b0);
    counts(tr, l, false, &d0, &db0);
    hs_pool_reset_peak(&l->dev->device_pool);
    hs_batch batch = {
        .tokens = l->tokens, .targets = l->targets, .B = l->mbs, .T = bm->seq / l->cp};
    double t0 = hs_now();
    float scale = 1.0f / (float)((int64_t)l->global_batch * bm->seq);
    hs_status s = hs_bench_engine_step(l->en, l->optim, l->params, l->n_params, &l->cfg.optimizer,
                                       &batch, scale, NULL, e);
    if (s != HS_OK) return s;
    hs_pg *world = hs_comm_world(c);
    double dt = hs_bench_max_over(world, hs_now() - t0),
           mps = hs_bench_max_over(world, mp_seconds(l));
    double peak = hs_bench_max_over(world, (double)hs_pool_peak(&l->dev->device_pool));
    if (i < 0) return s;
    counts(tr, l, true, &c1, &b1);
    counts(tr, l, false, &d1, &db1);
    l->step[i] = dt, l->mp_s[i] = mps;
    if ((int64_t)peak > l->peak_bytes) l->peak_bytes = (int64_t)peak;
    l->mp_colls += c1 - c0, l->mp_bytes += b1 - b0, l->dp_colls += d1 - d0,
        l->dp_bytes += db1 - db0;
    return s;
}

static int usage(const hs_bench_spec *sp, FILE *f, const char *why) {
    if (why) fprintf(f, "hypershard bench %s: %s\n", sp->name, why);
    fputs(sp->usage, f);
    return 2;
}

static int parse(const hs_bench_spec *sp, int argc, char **argv, hs_bench_opts *o) {
    *o = sp->defaults;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(sp, stdout, NULL), -1;
        if (!strcmp(s, "--quick")) *o = sp->quick;
        else if (!strcmp(s, "--steps") && i + 1 < argc) o->steps = atoi(argv[++i]);
        else if (!strcmp(s, "--layers") && i + 1 < argc) o->m.layers = atoi(argv[++i]);
        else if (!strcmp(s, "--dim") && i + 1 < argc) o->m.dim = atoi(argv[++i]);
        else if (!strcmp(s, "--seq") && i + 1 < argc) o->m.seq = atoi(argv[++i]);
        else return usage(sp, stderr, "unknown option or missing value");
    }
    if (o->steps < 1 || o->steps > HS_BENCH_MAX_STEPS)
        return usage(sp, stderr, "--steps must be 1..64");
    if (o->m.layers < 1 || o->m.dim < 64 || o->m.dim % 64 || o->m.seq < sp->seq_multiple ||
        o->m.seq % sp->seq_multiple)
        return usage(sp, stderr, "bad --layers, --dim or --seq");
    return 0;
}

int hs_bench_layouts_run(const hs_bench_spec *sp, int argc, char **argv) {
    hs_bench_opts o;
    int rc = parse(sp, argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    hs_error e;
    hs_error_clear(&e);
    hs_comm *c = NULL;
    hs_comm_options opt = {.timeout_s = 600};
    if (hs_comm_init(&c, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench %s: %s\n", sp->name, e.msg);
        return 1;
    }
    int world = hs_comm_size(c), rank = hs_comm_rank(c);
    if (world < 2 || world % 2) {
        if (rank == 0)
            fprintf(stderr, "hypershard bench %s: run under mpiexec -n 4 (an even world)\n",
                    sp->name);
        hs_comm_finalize(c);
        return 2;
    }
    hs_comm_balance_blas_threads(c);
    hs_bench_layout ls[HS_BENCH_MAX_LAYOUTS];
    memset(ls, 0, sizeof ls);
    int n = sp->layouts(world, ls), kept = 0;
    for (int k = 0; k < n; k++) { /* drop a CP method the model's heads do not split for */
        if (layout_fits(&o.m, &ls[k])) ls[kept++] = ls[k];
        else if (rank == 0)
            printf("%s: skipped, the heads do not split over its all-to-all\n", ls[k].name);
    }
    n = kept;
    hs_status s = HS_OK;
    for (int k = 0; s == HS_OK && k < n; k++) s = hs_bench_layout_open(c, &o.m, &ls[k], &e);
    for (int i = -1; s == HS_OK && i < o.steps; i++) /* i = -1: warm-up */
        for (int k = 0; s == HS_OK && k < n; k++) s = hs_bench_layout_step(c, &o.m, &ls[k], i, &e);
    if (s == HS_OK && rank == 0) {
        sp->print(&o, ls, n, world);
        hs_bench_print_load("after");
    }
    for (int k = 0; k < n; k++) hs_bench_layout_close(&ls[k]);
    if (s != HS_OK) hs_comm_abort(c, &e);
    hs_comm_finalize(c);
    return 0;
}
