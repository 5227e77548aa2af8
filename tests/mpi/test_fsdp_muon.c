/* Muon under FSDP against the single-process Muon run on the same global
 * batch (fp32): the single-process run is the same model wrapped with every
 * group of size 1, so its Muon sees whole matrices. Checked per case: the
 * summed loss of 3 steps, every gradient after step 1, every Muon weight
 * after each step and every other weight after steps 2 and 3 (normwise
 * relative, 1e-5); HSDP replicas bitwise equal
 * after each step; and from the trace, exactly one all-gather per step of
 * each sharded hidden matrix's update on the shard group (none for whole
 * experts, none for AdamW params), zero-row shards included. Layouts: FSDP
 * over 2 ranks, FSDP over 3 ranks (40- and 32-row matrices: uneven), an MoE
 * model over 3 and 4 ranks (3 experts: whole experts per rank, a zero-row
 * expert shard at 4) and HSDP 2x2.
 * HS_MPI_RANKS: 2 3 4
 * HS_TEST_TIMEOUT: 240 */
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
#define PER_RANK 2
#define STEPS 3
#define LR 2e-3
#define TOL 1e-5
#define SEED 2468

typedef struct mcase {
    const char *name;
    int shard; /* dp_shard_size; the rest of the world replicates */
    bool moe;
} mcase;

typedef struct run {
    hs_comm *c;
    const mcase *mc;
    int world, rank;
    hs_device *dev;
    hs_trace *tr;
    hs_fsdp_dp_groups g;
    char shard_name[64], rep_name[64], flat_name[64];
    mt_side ref, dist;
    int32_t *tok, *tgt;
    int G;
    double worst;
} run;

static void config_for(hs_config *cfg, const mcase *mc) {
    hs_config_defaults(cfg, NULL);
    strcpy(cfg->model.arch, mc->moe ? "moe" : "llama");
    cfg->model.vocab_size = 37;
    cfg->model.dim = 32;
    cfg->model.n_layers = 2;
    cfg->model.n_heads = 4;
    cfg->model.n_kv_heads = 2;
    cfg->model.ffn_dim = 40; /* gate/up [40, 32]: tall, and uneven over 3 ranks */
    cfg->model.moe.num_experts = 3;
    cfg->model.moe.top_k = 2;
    cfg->model.moe.expert_ffn_dim = 24;
    cfg->model.moe.aux_loss_coef = 0.0; /* per-rank term: not separable over the batch */
    cfg->fsdp.dp_shard_size = mc->shard;
    cfg->fsdp.forward_prefetch_depth = 0;
    cfg->fsdp.backward_prefetch_depth = 0;
    strcpy(cfg->optimizer.target, "muon");
    cfg->optimizer.lr = LR;
    cfg->optimizer.weight_decay = 0.1;
    /* the AdamW params (embeddings, head, norms, router): as the fp32
     * parity test sets it, so their weights compare as well as the grads */
    cfg->optimizer.eps = 1e-6;
}

static void side_init(run *r, mt_side *s, const hs_fsdp_dp_groups *g, int max_batch) {
    config_for(&s->cfg, r->mc);
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = max_batch,
                           .seq_len = SEQ,
                           .allocate_params = false,
                           .dev = r->dev};
    mt_fsdp_build(r->c, &s->cfg, &mo, g, r->dev, SEED, &s->m, &s->f, &s->opt);
}

static void global_batch(run *r, int step) { mt_global_batch(r->tok, r->tgt, r->G * SEQ, step); }

static double side_step(run *r, mt_side *s, int first, int seqs) {
    double loss = 0.0, aux = 0.0;
    hs_error e;
    hs_error_clear(&e);
    hs_batch b = {
        .tokens = r->tok + first * SEQ, .targets = r->tgt + first * SEQ, .B = seqs, .T = SEQ};
    hs_fsdp_set_micro_batch(s->f, true, true, true);
    CHECK(r->c,
          hs_model_forward_backward(s->m, &b, 1.0f / (float)(r->G * SEQ), hs_fsdp_hooks(s->f),
                                    &loss, &aux, &e) == HS_OK,
          "%s", e.msg);
    return loss;
}

/* Gradients, or weights (all, or only the Muon ones when muon_only). */
static void check_against_ref(run *r, bool grads, bool muon_only, int step) {
    hs_fsdp_ctx *d = hs_fsdp_context(r->dist.f), *ref = hs_fsdp_context(r->ref.f);
    hs_optim_param *op;
    hs_fsdp_optim_params(r->dist.f, &op);
    for (int i = 0; i < d->n_params; i++) {
        hs_fsdp_param *fp = &d->params[i], *rp = &ref->params[i];
        int64_t n = fp->plan.actual_sharded_numel;
        if (n == 0 || (muon_only && !op[i].muon)) continue;
        int64_t off = fp->plan.layout.row_offset * fp->plan.row_numel;
        const float *want = (grads ? rp->sharded_grad : rp->sharded) + off;
        const float *got = grads ? fp->sharded_grad : fp->sharded;
        float floor = hs_max_abs_f32(want, n);
        double err = hs_max_rel_diff_f32(got, want, n, floor > 1e-30f ? floor : 1e-30f);
        if (err > r->worst) r->worst = err;
        CHECK(r->c, err <= TOL, "%s step %d: %s of %s differs by %.3g relative (tol %.3g)",
              r->mc->name, step, grads ? "gradient" : "weight", fp->p->fqn, err, TOL);
    }
}

/* The optimizer's collectives: one all-gather of the update per sharded
 * hidden matrix, padded shard sized, on the shard group; every param on
 * Muon's or AdamW's state as the model marks it, empty shards included. */
static void check_gathers(run *r, int64_t ags, int64_t ag_bytes) {
    hs_fsdp_ctx *d = hs_fsdp_context(r->dist.f);
    hs_optim_param *op;
    hs_fsdp_optim_params(r->dist.f, &op);
    int64_t want = 0, want_bytes = 0, empty = 0;
    for (int i = 0; i < d->n_params; i++) {
        hs_fsdp_param *fp = &d->params[i];
        bool expert = fp->p->kind == HS_PARAM_EXPERT;
        if (op[i].muon && !expert && fp->needs_all_gather) {
            want++;
            want_bytes += fp->plan.padded_unsharded_numel * 4;
        }
        empty += fp->plan.actual_sharded_numel == 0;
        const char *state = hs_optim_state_name(r->dist.opt, i, 0);
        CHECK(r->c, strcmp(state, op[i].muon ? "momentum_buffer" : "exp_avg") == 0,
              "%s: %s has optimizer state %s", r->mc->name, fp->p->fqn, state);
    }
    CHECK(r->c, want > 0, "%s: no sharded hidden matrix", r->mc->name);
    CHECK(r->c, ags == want && ag_bytes == want_bytes,
          "%s: optimizer step issued %lld all-gathers of %lld bytes on %s, want %lld of %lld",
          r->mc->name, (long long)ags, (long long)ag_bytes, r->shard_name, (long long)want,
          (long long)want_bytes);
    if (r->mc->moe && r->mc->shard == 4 && r->g.shard_rank == 3)
        CHECK(r->c, empty > 0, "%s: no zero-row shard on the last rank", r->mc->name);
}

static void run_steps(run *r) {
    int first = r->g.flat_rank * PER_RANK;
    for (int step = 1; step <= STEPS; step++) {
        global_batch(r, step);
        double ref_loss = side_step(r, &r->ref, 0, r->G);
        double loss = mt_flat_sum(r->c, r->g.flat, side_step(r, &r->dist, first, PER_RANK));
        double rel = fabs(loss - ref_loss) / fabs(ref_loss);
        if (rel > r->worst) r->worst = rel;
        CHECK(r->c, isfinite(loss) && rel <= TOL,
              "%s step %d: loss %.8g vs single-process %.8g (rel %.3g)", r->mc->name, step, loss,
              ref_loss, rel);
        if (step == 1) check_against_ref(r, true, false, step);
        mt_side_optim_step(r->c, &r->ref, LR);
        hs_trace_reset_counters(r->tr);
        mt_side_optim_step(r->c, &r->dist, LR);
        check_gathers(r, hs_trace_collectives(r->tr, "all_gather", r->shard_name),
                      hs_trace_collective_bytes(r->tr, "all_gather", r->shard_name));
        /* Adam's first step on the AdamW params is rounding-sensitive
         * (lr * g / (|g| + eps)): their weights compare from step 2, as in
         * the AdamW parity tests; Muon's from step 1. */
        check_against_ref(r, false, step == 1, step);
        mt_replicas_check_equal(r->c, r->dist.f, &r->g, false, r->mc->name, step);
        if (r->rank == 0)
            printf("  %s step %d: mean loss %.7f (single-process %.7f)\n", r->mc->name, step,
                   loss / (r->G * SEQ), ref_loss / (r->G * SEQ));
    }
}

static void run_case(hs_comm *c, const mcase *mc) {
    run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.mc = mc;
    r.world = hs_comm_size(c);
    r.rank = hs_comm_rank(c);
    r.tr = hs_comm_trace(c);
    r.dev = mt_device_cpu(c, r.tr);
    mt_dp_groups_make(r.c, r.mc->shard, "muon", r.mc->name, &r.g, r.shard_name, r.rep_name,
                      r.flat_name);
    r.G = PER_RANK * r.world;
    hs_fsdp_dp_groups one = {.shard_size = 1, .replicate_size = 1, .flat_size = 1};
    side_init(&r, &r.ref, &one, r.G);
    side_init(&r, &r.dist, &r.g, PER_RANK);
    r.tok = malloc(sizeof(int32_t) * (size_t)(r.G * SEQ));
    r.tgt = malloc(sizeof(int32_t) * (size_t)(r.G * SEQ));
    run_steps(&r);
    mt_side_free(&r.dist);
    mt_side_free(&r.ref);
    hs_device_free(r.dev);
    free(r.tok);
    free(r.tgt);
    float worst = mt_worst_over(c, hs_comm_world(c), r.world, r.worst);
    if (r.rank == 0)
        printf("ok %s: worst normwise relative error %.3g (tol %.3g)\n", mc->name, (double)worst,
               TOL);
}

int main(int argc, char **argv) {
    hs_comm_options opt = {.timeout_s = 120};
    hs_comm *c = mt_comm_init(&argc, &argv, &opt);
    int W = hs_comm_size(c);
    const mcase by_world[][2] = {
        [2] = {{.name = "fsdp2", .shard = 2}, {0}},
        [3] = {{.name = "fsdp3_uneven", .shard = 3},
               {.name = "moe_fsdp3", .shard = 3, .moe = true}},
        [4] = {{.name = "hsdp_2x2", .shard = 2}, {.name = "moe_fsdp4", .shard = 4, .moe = true}},
    };
    CHECK(c, W >= 2 && W <= 4, "run with 2, 3 or 4 ranks, not %d", W);
    for (int k = 0; k < 2; k++)
        if (by_world[W][k].name) run_case(c, &by_world[W][k]);
    hs_comm_finalize(c);
    return 0;
}
