/* Shared set-up of the prefetch and fusion MPI tests: a small Llama wrapped
 * with FSDP over this world's groups, trained a few AdamW steps on a fixed
 * global batch, with everything a bitwise comparison between two runs needs
 * (loss of every step, every sharded gradient after step 1, every sharded
 * weight after every step) and the collective counts of one step. */
#ifndef TESTS_MPI_FSDP_OVERLAP_HARNESS_H
#define TESTS_MPI_FSDP_OVERLAP_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fusion.h"
#include "fsdp/manager.h"
#include "hypershard/comm.h"
#include "hypershard/mesh.h"
#include "hypershard/optim.h"
#include "fsdp_mpi_fixture.h"

#define OV_SEQ 16
#define OV_PER_RANK 2
#define OV_STEPS 3
#define OV_MAX_PARAMS 256

typedef struct ov_opts {
    int shard; /* dp_shard_size; 0 = world */
    int layers, dim;
    int seq;      /* tokens per sequence; 0 = OV_SEQ */
    int fwd, bwd; /* prefetch depths */
    bool fusion;
    int zero_copy; /* -1 null, 0, 1 */
    const char *rep[4];
    int n_rep;
    bool ckpt;
} ov_opts;

typedef struct ov_result {
    double loss[OV_STEPS];
    float *grads;               /* every sharded gradient after step 1, concatenated */
    float *weights[OV_STEPS];   /* every sharded weight after each step        */
    int64_t n;                  /* floats in each of those                     */
    int64_t ag, rs, ar;         /* collectives of the last step                */
    int64_t ag_bytes, rs_bytes; /* their bytes                                 */
} ov_result;

typedef struct ov_run {
    hs_comm *c;
    ov_opts o;
    int world, rank;
    hs_config cfg;
    hs_device *dev;
    hs_fsdp_dp_groups g;
    char shard_name[64], rep_name[64], flat_name[64];
    hs_model *m;
    hs_fsdp *f;
    hs_optim *opt;
    int32_t *tok, *tgt;
    int G, T;
} ov_run;

static inline void ov_config(hs_config *cfg, const ov_opts *o) {
    hs_config_defaults(cfg, NULL);
    strcpy(cfg->model.arch, "llama");
    cfg->model.vocab_size = 37; /* odd: uneven shards on every W > 1 */
    cfg->model.dim = o->dim ? o->dim : 32;
    cfg->model.n_layers = o->layers ? o->layers : 4;
    cfg->model.n_heads = 4;
    cfg->model.n_kv_heads = 2;
    cfg->model.ffn_dim = 40;
    cfg->fsdp.dp_shard_size = o->shard;
    cfg->fsdp.forward_prefetch_depth = o->fwd;
    cfg->fsdp.backward_prefetch_depth = o->bwd;
    cfg->fsdp.comm_fusion = o->fusion;
    cfg->fsdp.comm_fusion_zero_copy = o->zero_copy;
    cfg->train.activation_checkpointing = o->ckpt;
    cfg->fsdp.n_replicate_params = o->n_rep;
    cfg->fsdp.replicate_params = o->n_rep ? malloc(sizeof(char *) * (size_t)o->n_rep) : NULL;
    for (int i = 0; i < o->n_rep; i++) cfg->fsdp.replicate_params[i] = strdup(o->rep[i]);
    strcpy(cfg->optimizer.target, "adamw");
    cfg->optimizer.lr = 1e-3;
    cfg->optimizer.weight_decay = 0.1;
}

static inline void ov_setup(ov_run *r, hs_comm *c, const ov_opts *o) {
    memset(r, 0, sizeof *r);
    r->c = c;
    r->o = *o;
    r->world = hs_comm_size(c);
    r->rank = hs_comm_rank(c);
    if (r->o.shard == 0) r->o.shard = r->world;
    r->T = o->seq ? o->seq : OV_SEQ;
    ov_config(&r->cfg, &r->o);
    r->dev = mt_device_cpu(c, hs_comm_trace(c));
    char layout[16];
    snprintf(layout, sizeof layout, "s%d", r->o.shard);
    mt_dp_groups_make(c, r->o.shard, "overlap", layout, &r->g, r->shard_name, r->rep_name,
                      r->flat_name);
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = OV_PER_RANK,
                           .seq_len = r->T,
                           .allocate_params = false,
                           .activation_checkpointing = o->ckpt,
                           .dev = r->dev};
    mt_fsdp_build(c, &r->cfg, &mo, &r->g, r->dev, 1234, &r->m, &r->f, &r->opt);
    r->G = OV_PER_RANK * r->g.flat_size;
    r->tok = malloc(sizeof(int32_t) * (size_t)(r->G * r->T));
    r->tgt = malloc(sizeof(int32_t) * (size_t)(r->G * r->T));
}

static inline void ov_teardown(ov_run *r) {
    hs_optim_free(r->opt);
    hs_fsdp_free(r->f);
    hs_model_free(r->m);
    hs_device_free(r->dev);
    hs_config_free(&r->cfg);
    free(r->tok);
    free(r->tgt);
}

/* This rank's micro-batch of the global batch of `step`. */
static inline hs_batch ov_batch(ov_run *r, int step) {
    mt_global_batch(r->tok, r->tgt, r->G * r->T, step);
    int off = r->g.flat_rank * OV_PER_RANK * r->T;
    return (hs_batch){.tokens = r->tok + off, .targets = r->tgt + off, .B = OV_PER_RANK, .T = r->T};
}

static inline float *ov_snapshot(ov_run *r, bool grads, int64_t *n) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(r->f);
    int64_t total = 0;
    for (int i = 0; i < ctx->n_params; i++) total += ctx->params[i].plan.actual_sharded_numel;
    float *out = malloc(sizeof(float) * (size_t)(total + 1)), *p = out;
    for (int i = 0; i < ctx->n_params; i++) {
        hs_fsdp_param *fp = &ctx->params[i];
        int64_t k = fp->plan.actual_sharded_numel;
        memcpy(p, grads ? fp->sharded_grad : fp->sharded, sizeof(float) * (size_t)k);
        p += k;
    }
    *n = total;
    return out;
}

/* One optimizer step per iteration; `hooks` NULL means FSDP's own. */
static inline void ov_train(ov_run *r, ov_result *res, const hs_model_hooks *hooks) {
    memset(res, 0, sizeof *res);
    hs_trace *tr = hs_comm_trace(r->c);
    hs_error e;
    hs_error_clear(&e);
    float scale = 1.0f / (float)(r->G * r->T);
    for (int s = 0; s < OV_STEPS; s++) {
        hs_batch b = ov_batch(r, s + 1);
        double loss, aux;
        hs_trace_reset_counters(tr);
        hs_fsdp_set_micro_batch(r->f, true, true, true);
        CHECK(r->c,
              hs_model_forward_backward(r->m, &b, scale, hooks ? hooks : hs_fsdp_hooks(r->f), &loss,
                                        &aux, &e) == HS_OK,
              "%s", e.msg);
        res->loss[s] = loss;
        res->ag = hs_trace_collectives(tr, "all_gather", NULL);
        res->rs = hs_trace_collectives(tr, "reduce_scatter", NULL);
        res->ar = hs_trace_collectives(tr, "all_reduce", NULL);
        res->ag_bytes = hs_trace_collective_bytes(tr, "all_gather", NULL);
        res->rs_bytes = hs_trace_collective_bytes(tr, "reduce_scatter", NULL);
        if (s == 0) res->grads = ov_snapshot(r, true, &res->n);
        hs_optim_step(r->opt, r->cfg.optimizer.lr, NULL);
        CHECK(r->c, hs_fsdp_after_optim_step(r->f, &e) == HS_OK, "%s", e.msg);
        hs_fsdp_zero_grads(r->f);
        res->weights[s] = ov_snapshot(r, false, &res->n);
    }
}

static inline void ov_result_free(ov_result *res) {
    free(res->grads);
    for (int s = 0; s < OV_STEPS; s++) free(res->weights[s]);
}

/* Bitwise: every loss, the step-1 gradients, the weights after every step. */
static inline void ov_expect_identical(hs_comm *c, const char *what, const ov_result *a,
                                       const ov_result *b) {
    CHECK(c, a->n == b->n, "%s: %lld vs %lld shard elements", what, (long long)a->n,
          (long long)b->n);
    for (int s = 0; s < OV_STEPS; s++)
        CHECK(c, memcmp(&a->loss[s], &b->loss[s], sizeof(double)) == 0,
              "%s: loss of step %d %.17g vs %.17g", what, s + 1, a->loss[s], b->loss[s]);
    CHECK(c, memcmp(a->grads, b->grads, sizeof(float) * (size_t)a->n) == 0,
          "%s: step-1 gradients differ", what);
    for (int s = 0; s < OV_STEPS; s++)
        CHECK(c, memcmp(a->weights[s], b->weights[s], sizeof(float) * (size_t)a->n) == 0,
              "%s: weights after step %d differ", what, s + 1);
}

#endif
