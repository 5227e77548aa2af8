/* FSDP / HSDP parity against the single-process model on the same global
 * batch (fp32): loss for 3 steps, every gradient after step 1, every weight
 * after steps 2 and 3; HSDP replicas bitwise equal after each step; the
 * dense shard degree; all-gathers per unit and hook, reduce-scatters and
 * all-reduces per step from the trace counters; the per-rank parameter
 * memory bound; gather_full / set_full. Each world size runs the layouts
 * that fit it: pure FSDP over every rank, HSDP, replicate only
 * (dp_shard_size 1), replicate_params mixed with sharded parameters in one
 * unit, an MoE model whose expert tensors have fewer rows than ranks,
 * reshard_after_forward false with activation checkpointing, and no-sync
 * gradient accumulation.
 * HS_MPI_RANKS: 1 2 3 4 8
 * HS_TEST_TIMEOUT: 300 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/manager.h"
#include "hypershard/comm.h"
#include "hypershard/mesh.h"
#include "hypershard/optim.h"
#include "fsdp_mpi_fixture.h"

#define SEQ 16
#define PER_RANK 2 /* sequences per data-parallel rank */
#define STEPS 3
#define TOL 1e-5
#define LR 1e-4

typedef struct tcase {
    const char *name;
    int shard; /* dp_shard_size */
    bool moe;
    const char *rep[4]; /* replicate_params */
    int n_rep;
    bool keep_after_forward; /* reshard_after_forward = false */
    bool ckpt;               /* activation checkpointing (recompute in backward) */
    bool accumulate;         /* 2 micro-batches, requires_grad_sync = false */
} tcase;

typedef struct run {
    hs_comm *c;
    const tcase *tc;
    int world, rank;
    hs_config cfg;
    hs_device *dev;
    hs_fsdp_dp_groups g;
    char shard_name[64], rep_name[64], flat_name[64];
    hs_model *ref, *m;
    hs_fsdp *f;
    hs_optim *ref_opt, *opt;
    hs_optim_param ref_params[256];
    int32_t *tok, *tgt;
    int G;
    double worst_err; /* largest rel_err seen in this case, for the summary line */
} run;

static void config_for(hs_config *cfg, const tcase *tc) {
    hs_config_defaults(cfg, NULL);
    strcpy(cfg->model.arch, tc->moe ? "moe" : "llama");
    cfg->model.vocab_size = 37; /* odd: uneven on every W > 1 */
    cfg->model.dim = 32;
    cfg->model.n_layers = 2;
    cfg->model.n_heads = 4;
    cfg->model.n_kv_heads = 2;
    cfg->model.ffn_dim = 40;
    cfg->model.moe.num_experts = 3; /* expert tensors [3, ...]: D0 < W at W >= 4 */
    cfg->model.moe.top_k = 2;
    cfg->model.moe.expert_ffn_dim = 24;
    /* The load-balancing term is computed per data-parallel rank over its
     * own tokens, so it is not separable over the batch; without it the
     * model is, and parity with one process is exact up to rounding. */
    cfg->model.moe.aux_loss_coef = 0.0;
    cfg->fsdp.dp_shard_size = tc->shard;
    cfg->fsdp.reshard_after_forward = !tc->keep_after_forward;
    cfg->fsdp.requires_grad_sync = !tc->accumulate;
    cfg->fsdp.reshard_after_backward = !tc->accumulate;
    cfg->train.activation_checkpointing = tc->ckpt;
    cfg->fsdp.forward_prefetch_depth = 0;
    cfg->fsdp.backward_prefetch_depth = 0;
    cfg->fsdp.n_replicate_params = tc->n_rep;
    cfg->fsdp.replicate_params = tc->n_rep ? malloc(sizeof(char *) * (size_t)tc->n_rep) : NULL;
    for (int i = 0; i < tc->n_rep; i++) cfg->fsdp.replicate_params[i] = strdup(tc->rep[i]);
    strcpy(cfg->optimizer.target, "adamw");
    cfg->optimizer.lr = LR;
    cfg->optimizer.weight_decay = 0.1;
    /* Adam divides by sqrt(v) + eps: with eps = 1e-8 an element whose
     * gradient is ~1e-7 of the tensor's largest moves by a full lr step
     * whatever its rounding, so a 1e-6 relative gradient difference (two
     * summation orders) becomes a 1e-5 weight difference. eps = 1e-6 keeps
     * the weight comparison as well conditioned as the gradient one. */
    cfg->optimizer.eps = 1e-6;
}

static hs_model_options model_options(run *r, bool allocate, int max_batch) {
    return (hs_model_options){.compute_dtype = HS_DTYPE_F32,
                              .grad_dtype = HS_DTYPE_F32,
                              .max_batch = max_batch,
                              .seq_len = SEQ,
                              .allocate_params = allocate,
                              .activation_checkpointing = r->cfg.train.activation_checkpointing,
                              .dev = r->dev};
}

static hs_model *model(run *r, bool allocate, int max_batch) {
    hs_model_options mo = model_options(r, allocate, max_batch);
    hs_model *m = NULL;
    hs_error e;
    hs_error_clear(&e);
    CHECK(r->c, hs_model_create(&r->cfg.model, &mo, &m, &e) == HS_OK, "%s", e.msg);
    return m;
}

static int64_t numel_of(const hs_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static void ref_optim(run *r) {
    int n = hs_model_num_params(r->ref);
    CHECK(r->c, n <= 256, "too many params");
    for (int i = 0; i < n; i++) {
        hs_param *p = hs_model_param(r->ref, i);
        hs_optim_param *o = &r->ref_params[i];
        o->fqn = p->fqn;
        o->data = p->data;
        o->dtype = HS_DTYPE_F32;
        o->grad = p->grad;
        o->numel = numel_of(p);
        o->rows = p->shape[0];
        o->cols = o->numel / o->rows;
        o->decay = p->kind != HS_PARAM_NORM;
        o->muon = false;
    }
    hs_error e;
    hs_error_clear(&e);
    CHECK(r->c,
          hs_optim_create(&r->cfg.optimizer, r->ref_params, n, r->dev, &r->dev->device_pool,
                          &r->ref_opt, &e) == HS_OK,
          "%s", e.msg);
}

static void setup(run *r, const tcase *tc) {
    r->tc = tc;
    config_for(&r->cfg, tc);
    r->dev = mt_device_cpu(r->c, hs_comm_trace(r->c));
    mt_dp_groups_make(r->c, tc->shard, "parity", tc->name, &r->g, r->shard_name, r->rep_name,
                      r->flat_name);
    r->G = PER_RANK * r->world;
    r->ref = model(r, true, r->G);
    hs_model_init_weights(r->ref, 1234);
    ref_optim(r);
    hs_model_options mo = model_options(r, false, PER_RANK);
    mt_fsdp_build(r->c, &r->cfg, &mo, &r->g, r->dev, 1234, &r->m, &r->f, &r->opt);
    r->tok = malloc(sizeof(int32_t) * (size_t)(r->G * SEQ));
    r->tgt = malloc(sizeof(int32_t) * (size_t)(r->G * SEQ));
}

static void teardown(run *r) {
    hs_optim_free(r->opt);
    hs_optim_free(r->ref_opt);
    hs_fsdp_free(r->f);
    hs_model_free(r->m);
    hs_model_free(r->ref);
    hs_device_free(r->dev);
    hs_config_free(&r->cfg);
    free(r->tok);
    free(r->tgt);
}

static void global_batch(run *r, int step) { mt_global_batch(r->tok, r->tgt, r->G * SEQ, step); }

/* Normwise relative error of a tensor, max|a - b| / max|b|: a sum over
 * ranks and a sum in one GEMM round differently, so elements that cancel to
 * ~0 are compared at the tensor's scale, not digit by digit. */
static double rel_err(run *r, const float *a, const float *b, int64_t n) {
    float floor = hs_max_abs_f32(b, n);
    double err = hs_max_rel_diff_f32(a, b, n, floor > 1e-30f ? floor : 1e-30f);
    if (err > r->worst_err) r->worst_err = err;
    return err;
}

static void check_shards(run *r, bool grads, int step) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(r->f);
    for (int i = 0; i < ctx->n_params; i++) {
        hs_fsdp_param *fp = &ctx->params[i];
        hs_param *rp = hs_model_param(r->ref, i);
        const float *want = (const float *)(grads ? rp->grad : rp->data) +
                            fp->plan.layout.row_offset * fp->plan.row_numel;
        const float *got = grads ? fp->sharded_grad : fp->sharded;
        double err = rel_err(r, got, want, fp->plan.actual_sharded_numel);
        if (err >= r->worst_err && getenv("HS_PARITY_VERBOSE"))
            fprintf(stderr, "rank %d %s step %d %s %s err %.3g\n", r->rank, r->tc->name, step,
                    grads ? "grad" : "weight", fp->p->fqn, err);
        CHECK(r->c, err <= TOL, "%s step %d: %s of %s differs by %.3g relative (rank %d)",
              r->tc->name, step, grads ? "gradient" : "weight", fp->p->fqn, err, r->rank);
    }
}

static void check_shard_degree(run *r) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(r->f);
    int padded = 0, empty = 0;
    for (int i = 0; i < ctx->n_params; i++) {
        padded += ctx->params[i].plan.kind == HS_FSDP_PACK_DIM0_PADDED;
        empty += ctx->params[i].plan.layout.actual_rows == 0;
    }
    /* the shapes must keep exercising the uneven path */
    if (r->tc->shard > 1) CHECK(r->c, padded > 0, "%s: no uneven parameter", r->tc->name);
    if (r->tc->moe && r->tc->shard >= 4 && r->g.shard_rank == r->tc->shard - 1)
        CHECK(r->c, empty > 0, "%s: no zero-row shard on the last rank", r->tc->name);
    for (int i = 0; i < ctx->n_params; i++) {
        hs_fsdp_param *fp = &ctx->params[i];
        int want = fp->replicate ? 1 : r->tc->shard;
        CHECK(r->c, fp->mi.shard_size == want, "%s: %s shard size %d, want %d", r->tc->name,
              fp->p->fqn, fp->mi.shard_size, want);
        /* the shards of one group tile the tensor exactly */
        float rows = (float)fp->plan.layout.actual_rows;
        hs_error e;
        hs_error_clear(&e);
        if (r->g.shard && !fp->replicate)
            CHECK(r->c,
                  hs_pg_all_reduce(r->g.shard, NULL, &rows, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e) ==
                      HS_OK,
                  "%s", e.msg);
        CHECK(r->c, (int64_t)rows == fp->p->shape[0], "%s: %s shards hold %g rows of %lld",
              r->tc->name, fp->p->fqn, rows, (long long)fp->p->shape[0]);
        CHECK(r->c,
              fp->plan.actual_sharded_numel <=
                  (fp->p->shape[0] + want - 1) / want * fp->plan.row_numel,
              "%s: %s shard larger than ceil(D0/S) rows", r->tc->name, fp->p->fqn);
    }
}

/* Per-unit all-gather counts: the FSDP hooks wrapped so that each pre hook
 * is measured alone (its all-gathers are waited inside it, so the trace
 * counters are final when it returns). */
typedef struct unit_probe {
    hs_model_hooks outer;
    const hs_model_hooks *inner;
    run *r;
    hs_trace *tr;
    bool bad;
    char why[256];
} unit_probe;

static int64_t needs_ag(const run *r, int u) {
    hs_fsdp_unit *un = &hs_fsdp_context(r->f)->units[u];
    int64_t n = 0;
    for (int i = 0; i < un->n_params; i++) n += un->params[i]->needs_all_gather;
    return n;
}

static void probe_expect(unit_probe *p, int u, const char *hook, int64_t got, int64_t want) {
    if (got == want || p->bad) return;
    p->bad = true;
    snprintf(p->why, sizeof p->why, "unit %d %s issued %lld all-gathers, want %lld", u, hook,
             (long long)got, (long long)want);
}

static void probe_pre_forward(void *ctx, int u) {
    unit_probe *p = ctx;
    hs_fsdp_unit_state st = hs_fsdp_context(p->r->f)->units[u].state;
    int64_t before = hs_trace_collectives(p->tr, "all_gather", NULL);
    p->inner->pre_forward(p->inner->ctx, u);
    int64_t want = st == HS_FSDP_STATE_PRE_BACKWARD ? 0 : needs_ag(p->r, u);
    probe_expect(p, u, "pre_forward", hs_trace_collectives(p->tr, "all_gather", NULL) - before,
                 want);
}

static void probe_pre_backward(void *ctx, int u) {
    unit_probe *p = ctx;
    int64_t before = hs_trace_collectives(p->tr, "all_gather", NULL);
    p->inner->pre_backward(p->inner->ctx, u);
    /* the root and units kept after forward are still unsharded */
    bool kept = u == 0 || p->r->tc->keep_after_forward;
    probe_expect(p, u, "pre_backward", hs_trace_collectives(p->tr, "all_gather", NULL) - before,
                 kept ? 0 : needs_ag(p->r, u));
}

static void probe_post_forward(void *ctx, int u) {
    unit_probe *p = ctx;
    p->inner->post_forward(p->inner->ctx, u);
}

static void probe_post_backward(void *ctx, int u) {
    unit_probe *p = ctx;
    p->inner->post_backward(p->inner->ctx, u);
}

static void probe_final(void *ctx) {
    unit_probe *p = ctx;
    int64_t before = hs_trace_collectives(p->tr, "all_gather", NULL);
    p->inner->post_backward_final(p->inner->ctx);
    probe_expect(p, 0, "post_backward_final",
                 hs_trace_collectives(p->tr, "all_gather", NULL) - before, 0);
}

static const hs_model_hooks *probe_init(unit_probe *p, run *r, hs_trace *tr) {
    memset(p, 0, sizeof *p);
    p->inner = hs_fsdp_hooks(r->f);
    p->r = r;
    p->tr = tr;
    p->outer = (hs_model_hooks){.ctx = p,
                                .pre_forward = probe_pre_forward,
                                .post_forward = probe_post_forward,
                                .pre_backward = probe_pre_backward,
                                .post_backward = probe_post_backward,
                                .post_backward_final = probe_final};
    return &p->outer;
}

/* One forward/backward: all-gathers only for needs_all_gather params (block
 * units twice, forward and backward; the root once, it stays unsharded), one
 * reduce-scatter per sharded param, all-reduces only on the HSDP replicate
 * group (one per unit holding such params) and the flat DP group (one per
 * unit holding replicate_params). */
static void check_counts(run *r, hs_trace *tr) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(r->f);
    int64_t ag = 0, rs = 0, ar_rep = 0, ar_flat = 0;
    for (int u = 0; u < ctx->n_units; u++) {
        hs_fsdp_unit *un = &ctx->units[u];
        for (int i = 0; i < un->n_params; i++)
            if (un->params[i]->needs_all_gather) {
                ag += u == 0 || r->tc->keep_after_forward ? 1 : 2;
                rs++;
            }
        for (int k = 0; k < un->n_groups; k++) {
            if (un->groups[k].pg && un->groups[k].pg == r->g.replicate) ar_rep++;
            if (un->groups[k].pg && un->groups[k].pg == r->g.flat) ar_flat++;
        }
    }
    const char *sn = r->shard_name, *rn = r->rep_name, *fn = r->flat_name;
    CHECK(r->c, hs_trace_collectives(tr, "all_gather", sn) == ag, "%s: %lld all-gathers, want %lld",
          r->tc->name, (long long)hs_trace_collectives(tr, "all_gather", sn), (long long)ag);
    CHECK(r->c, hs_trace_collectives(tr, "all_gather", NULL) == ag,
          "%s: all-gathers off the shard group", r->tc->name);
    CHECK(r->c, hs_trace_collectives(tr, "reduce_scatter", sn) == rs,
          "%s: %lld reduce-scatters, want %lld", r->tc->name,
          (long long)hs_trace_collectives(tr, "reduce_scatter", sn), (long long)rs);
    CHECK(r->c, hs_trace_collectives(tr, "all_reduce", rn) == (r->g.replicate ? ar_rep : 0),
          "%s: %lld replicate all-reduces, want %lld", r->tc->name,
          (long long)hs_trace_collectives(tr, "all_reduce", rn), (long long)ar_rep);
    CHECK(r->c, hs_trace_collectives(tr, "all_reduce", fn) == (r->g.flat ? ar_flat : 0),
          "%s: %lld flat all-reduces, want %lld", r->tc->name,
          (long long)hs_trace_collectives(tr, "all_reduce", fn), (long long)ar_flat);
    if (!r->g.replicate && ar_flat == 0)
        CHECK(r->c, hs_trace_collectives(tr, "all_reduce", NULL) == 0, "%s: unexpected all-reduce",
              r->tc->name);
}

/* Parameter bytes: total/S sharded plus at most two units unsharded (the
 * root stays unsharded through the step, one block at a time besides). */
static void check_memory(run *r) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(r->f);
    hs_fsdp_stats st;
    hs_fsdp_get_stats(r->f, &st);
    int64_t sharded = 0, big1 = 0, big2 = 0;
    for (int u = 0; u < ctx->n_units; u++) {
        int64_t b = 0;
        for (int i = 0; i < ctx->units[u].n_params; i++) {
            hs_fsdp_param *fp = ctx->units[u].params[i];
            if (fp->needs_all_gather) b += fp->plan.padded_unsharded_numel * 4;
        }
        if (b > big1) {
            big2 = big1;
            big1 = b;
        } else if (b > big2) {
            big2 = b;
        }
    }
    for (int i = 0; i < ctx->n_params; i++) sharded += ctx->params[i].plan.unpacked_numel * 4;
    int S = r->tc->shard;
    double bound = (double)sharded / S + (double)(big1 + big2);
    /* replicate_params are whole on every rank */
    for (int i = 0; i < ctx->n_params; i++)
        if (ctx->params[i].replicate)
            bound += (double)ctx->params[i].plan.unpacked_numel * 4 * (1.0 - 1.0 / S);
    /* no all-gather, no cast: the compute views alias the shards, nothing
     * beyond the model itself is ever allocated */
    if (S == 1)
        CHECK(r->c, st.param_peak_bytes == st.total_param_bytes,
              "%s: shard size 1 peaked at %lld parameter bytes for a %lld-byte model", r->tc->name,
              (long long)st.param_peak_bytes, (long long)st.total_param_bytes);
    CHECK(r->c, (double)st.param_peak_bytes <= 1.05 * bound,
          "%s: peak parameter bytes %lld above total/S + two largest units = %.0f (rank %d)",
          r->tc->name, (long long)st.param_peak_bytes, bound, r->rank);
    if (r->rank == 0)
        printf("  %s: peak parameter bytes %lld, bound %.0f (total %lld, S %d)\n", r->tc->name,
               (long long)st.param_peak_bytes, bound, (long long)st.total_param_bytes, S);
}

static void run_case(hs_comm *c, const tcase *tc) {
    run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.world = hs_comm_size(c);
    r.rank = hs_comm_rank(c);
    setup(&r, tc);
    check_shard_degree(&r);
    hs_trace *tr = hs_comm_trace(c);
    hs_error e;
    hs_error_clear(&e);
    float scale = 1.0f / (float)(r.G * SEQ);
    int f = r.g.flat_rank;
    for (int step = 1; step <= STEPS; step++) {
        global_batch(&r, step);
        hs_batch gb = {.tokens = r.tok, .targets = r.tgt, .B = r.G, .T = SEQ};
        hs_batch lb = {.tokens = r.tok + f * PER_RANK * SEQ,
                       .targets = r.tgt + f * PER_RANK * SEQ,
                       .B = PER_RANK,
                       .T = SEQ};
        double ref_loss, loss, aux;
        CHECK(c, hs_model_forward_backward(r.ref, &gb, scale, NULL, &ref_loss, &aux, &e) == HS_OK,
              "%s", e.msg);
        hs_trace_reset_counters(tr);
        hs_fsdp_reset_peak(r.f);
        loss = 0.0;
        int micro = tc->accumulate ? 2 : 1;
        unit_probe probe;
        const hs_model_hooks *hooks = probe_init(&probe, &r, tr);
        for (int mb = 0; mb < micro; mb++) {
            bool last = mb == micro - 1;
            int per = PER_RANK / micro;
            hs_batch mbb = {.tokens = lb.tokens + mb * per * SEQ,
                            .targets = lb.targets + mb * per * SEQ,
                            .B = per,
                            .T = SEQ};
            double ls;
            hs_fsdp_set_micro_batch(r.f, r.cfg.fsdp.requires_grad_sync,
                                    r.cfg.fsdp.reshard_after_backward, last);
            CHECK(c, hs_model_forward_backward(r.m, &mbb, scale, hooks, &ls, &aux, &e) == HS_OK,
                  "%s", e.msg);
            loss += ls;
            /* without sync nothing is reduced before the last micro-batch */
            if (!last)
                CHECK(c,
                      hs_trace_collectives(tr, "reduce_scatter", NULL) == 0 &&
                          hs_trace_collectives(tr, "all_reduce", NULL) == 0,
                      "%s: gradients reduced in a no-sync micro-batch", tc->name);
        }
        if (!tc->accumulate) {
            check_counts(&r, tr);
            CHECK(c, !probe.bad, "%s step %d: %s", tc->name, step, probe.why);
        }
        /* the bound assumes blocks reshard after forward */
        if (!tc->accumulate && !tc->keep_after_forward) check_memory(&r);
        float l = (float)loss;
        if (r.g.flat)
            CHECK(c,
                  hs_pg_all_reduce(r.g.flat, NULL, &l, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e) == HS_OK,
                  "%s", e.msg);
        double rel = fabs((double)l - ref_loss) / fabs(ref_loss);
        CHECK(c, rel <= TOL, "%s step %d: loss %.8g vs single-process %.8g (rel %.3g)", tc->name,
              step, (double)l, ref_loss, rel);
        if (step == 1) check_shards(&r, true, step);
        double norm,
            ref_norm = sqrt(hs_grad_sumsq(r.dev, r.ref_params, hs_model_num_params(r.ref)));
        CHECK(c, hs_fsdp_grad_norm(r.f, &norm, &e) == HS_OK, "%s", e.msg);
        CHECK(c, fabs(norm - ref_norm) <= 1e-5 * ref_norm, "%s: grad norm %.8g vs %.8g", tc->name,
              norm, ref_norm);
        hs_optim_step(r.ref_opt, LR, NULL);
        hs_optim_step(r.opt, LR, NULL);
        CHECK(c, hs_fsdp_after_optim_step(r.f, &e) == HS_OK, "%s", e.msg);
        hs_model_zero_grads(r.ref);
        hs_fsdp_zero_grads(r.f);
        if (step >= 2) check_shards(&r, false, step);
        mt_replicas_check_equal(r.c, r.f, &r.g, true, r.tc->name, step);
        if (r.rank == 0)
            printf("  %s step %d: mean loss %.7f (single-process %.7f)\n", tc->name, step,
                   (double)l / (r.G * SEQ), ref_loss / (r.G * SEQ));
    }
    /* the export path rebuilds each full tensor on every rank */
    for (int i = 0; i < hs_model_num_params(r.ref); i++) {
        hs_param *rp = hs_model_param(r.ref, i);
        float *full = malloc(sizeof(float) * (size_t)numel_of(rp));
        CHECK(c, hs_fsdp_gather_full(r.f, i, full, &e) == HS_OK, "%s", e.msg);
        CHECK(c, rel_err(&r, full, rp->data, numel_of(rp)) <= TOL, "%s: gathered %s differs",
              tc->name, rp->fqn);
        /* and the import path keeps exactly this rank's rows, padding zero */
        for (int64_t k = 0; k < numel_of(rp); k++) full[k] = (float)k + 0.5f;
        CHECK(c, hs_fsdp_set_full(r.f, i, full, &e) == HS_OK, "%s", e.msg);
        hs_fsdp_param *fp = &hs_fsdp_context(r.f)->params[i];
        int64_t off = fp->plan.layout.row_offset * fp->plan.row_numel;
        CHECK(c,
              memcmp(fp->sharded, full + off,
                     sizeof(float) * (size_t)fp->plan.actual_sharded_numel) == 0,
              "%s: set_full of %s kept the wrong rows", tc->name, rp->fqn);
        for (int64_t k = fp->plan.actual_sharded_numel; k < fp->storage_numel; k++)
            CHECK(c, fp->storage[k] == 0.0f, "%s: padding of %s is not zero", tc->name, rp->fqn);
        free(full);
    }
    teardown(&r);
    float worst = mt_worst_over(c, r.g.flat, r.g.flat_size, r.worst_err);
    if (r.rank == 0)
        printf("ok %s: worst normwise relative error over ranks %.3g\n", tc->name, (double)worst);
}

int main(int argc, char **argv) {
    hs_comm_options opt = {.timeout_s = 120};
    hs_comm *c = mt_comm_init(&argc, &argv, &opt);
    int W = hs_comm_size(c);
    const tcase fsdp = {.name = "fsdp", .shard = W};
    run_case(c, &fsdp);
    if (W == 2 || W == 4) {
        const tcase rep_only = {.name = "replicate_only", .shard = 1};
        const tcase mixed = {.name = "replicate_params_mixed",
                             .shard = W,
                             .rep = {"model.layers.0.self_attn.q_proj.weight",
                                     "model.layers.0.input_layernorm.weight", "model.norm.weight"},
                             .n_rep = 3};
        run_case(c, &rep_only);
        run_case(c, &mixed);
    }
    if (W == 2 || W == 3) {
        const tcase keep = {.name = "keep_after_forward_ckpt",
                            .shard = W,
                            .keep_after_forward = true,
                            .ckpt = true};
        const tcase accum = {.name = "no_sync_accumulation", .shard = W, .accumulate = true};
        run_case(c, &keep);
        run_case(c, &accum);
    }
    if (W == 4) {
        const tcase hsdp = {.name = "hsdp_2x2", .shard = 2};
        const tcase moe = {.name = "moe_fsdp", .shard = 4, .moe = true};
        const tcase hsdp_rep = {.name = "hsdp_2x2_replicate_params",
                                .shard = 2,
                                .rep = {"model.layers.1.mlp.down_proj.weight"},
                                .n_rep = 1};
        const tcase hsdp_ckpt = {
            .name = "hsdp_2x2_ckpt_no_sync", .shard = 2, .ckpt = true, .accumulate = true};
        run_case(c, &hsdp);
        run_case(c, &moe);
        run_case(c, &hsdp_rep);
        run_case(c, &hsdp_ckpt);
    }
    if (W == 8) {
        const tcase hsdp = {.name = "hsdp_2x4", .shard = 4};
        run_case(c, &hsdp);
    }
    hs_comm_finalize(c);
    return 0;
}
