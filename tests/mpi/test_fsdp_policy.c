/* FSDP policies (spec 004 §2.2, §2.3, §5.7–§5.10) against a single-process
 * run with the same dtypes on the same global batch: the single-process run
 * is the same model wrapped with every group of size 1 (fp32 master, compute
 * copy in param_dtype, gradients cast to reduce_dtype, no collective) — what
 * `hypershard train` runs on one rank with a 16-bit param_dtype.
 *
 * Each case proves its policy from what the run shows, not from flags:
 * - param_dtype: the unsharded compute copy has param_dtype's size and the
 *   all-gather bytes in the trace are param_dtype's; the fp32 master is
 *   never overwritten by the copy (it only changes in the optimizer step);
 * - reduce_dtype: reduce-scatter and all-reduce bytes are reduce_dtype's;
 * - fp32 main params: the model's own shard is param_dtype and equals the
 *   rounded fp32 main param after every step, the optimizer sees fp32 data
 *   and grads, and the run is bitwise equal to the run without main params
 *   (same dtypes), which it runs next to in lockstep;
 * - offload: masters and sharded grads are in the host pool (nothing of
 *   FSDP left in the device pool between steps), H2D before each
 *   all-gather and D2H after each reduction in the trace counters, a lower
 *   device parameter peak than the twin run without offload, and bitwise
 *   equal weights to it;
 * - accumulation: requires_grad_sync false reduce-scatters only in the last
 *   micro-batch and all-reduces (HSDP) only there; true reduces in every
 *   micro-batch; reshard_after_backward false skips the next micro-batch's
 *   forward all-gathers; both strategies give the single-process result.
 * HS_MPI_RANKS: 2 4
 * HS_TEST_TIMEOUT: 300 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/manager.h"
#include "fsdp/policy.h"
#include "hypershard/comm.h"
#include "hypershard/mesh.h"
#include "hypershard/optim.h"
#include "fsdp_mpi_fixture.h"

#define SEQ 16
#define PER_RANK 2
#define STEPS 3
#define LR 1e-4
#define SEED 4321

typedef struct pcase {
    const char *name;
    int shard;
    int param_dt, reduce_dt; /* HS_MP_NULL or hs_dtype */
    bool main_params, offload, ckpt;
    int micro;          /* micro-batches per step */
    bool no_sync;       /* requires_grad_sync false */
    bool keep_backward; /* reshard_after_backward false */
    bool twin;          /* lockstep run without main params / offload */
    double tol;         /* normwise relative: loss, grads, weights */
} pcase;

typedef struct run {
    hs_comm *c;
    const pcase *pc;
    int world, rank;
    hs_device *dev;
    hs_trace *tr;
    hs_fsdp_dp_groups g;
    char shard_name[64], rep_name[64], flat_name[64];
    mt_side ref, dist, twin;
    int32_t *tok, *tgt;
    int G;
    double worst;
} run;

static void config_for(hs_config *cfg, const pcase *pc, bool policies) {
    hs_config_defaults(cfg, NULL);
    strcpy(cfg->model.arch, "llama");
    cfg->model.vocab_size = 37;
    cfg->model.dim = 32;
    cfg->model.n_layers = 2;
    cfg->model.n_heads = 4;
    cfg->model.n_kv_heads = 2;
    cfg->model.ffn_dim = 40;
    cfg->fsdp.dp_shard_size = pc->shard;
    cfg->fsdp.forward_prefetch_depth = 0;
    cfg->fsdp.backward_prefetch_depth = 0;
    cfg->fsdp.mix_precision.param_dtype = pc->param_dt;
    cfg->fsdp.mix_precision.reduce_dtype = pc->reduce_dt;
    cfg->fsdp.requires_grad_sync = !pc->no_sync;
    cfg->fsdp.reshard_after_backward = !pc->keep_backward;
    cfg->train.activation_checkpointing = pc->ckpt;
    bool main = policies && pc->main_params;
    cfg->fsdp.mix_precision.fp32_main_grad = main;
    cfg->optimizer.fp32_main_params = main;
    cfg->fsdp.enable_offload = policies && pc->offload;
    strcpy(cfg->optimizer.target, "adamw");
    cfg->optimizer.lr = LR;
    cfg->optimizer.weight_decay = 0.1;
    cfg->optimizer.eps = 1e-6;
}

static void side_init(run *r, mt_side *s, bool policies, const hs_fsdp_dp_groups *g,
                      int max_batch) {
    config_for(&s->cfg, r->pc, policies);
    hs_dtype compute = r->pc->param_dt == HS_MP_NULL ? HS_DTYPE_F32 : (hs_dtype)r->pc->param_dt;
    hs_model_options mo = {.compute_dtype = compute,
                           .grad_dtype = compute,
                           .max_batch = max_batch,
                           .seq_len = SEQ,
                           .allocate_params = false,
                           .activation_checkpointing = r->pc->ckpt,
                           .dev = r->dev};
    mt_fsdp_build(r->c, &s->cfg, &mo, g, r->dev, SEED, &s->m, &s->f, &s->opt);
    hs_optim_param *op;
    int n = hs_fsdp_optim_params(s->f, &op);
    for (int i = 0; i < n; i++)
        CHECK(r->c, op[i].dtype == HS_DTYPE_F32, "%s: optimizer param %s is not fp32", r->pc->name,
              op[i].fqn);
}

static void global_batch(run *r, int step) { mt_global_batch(r->tok, r->tgt, r->G * SEQ, step); }

/* The fp32 masters are only written by the optimizer: a checksum taken
 * before the forward/backward must hold after it. */
static uint32_t masters_crc(mt_side *s) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(s->f);
    uint32_t crc = 0;
    for (int i = 0; i < ctx->n_params; i++)
        crc = hs_crc32(crc, ctx->params[i].storage,
                       (size_t)ctx->params[i].storage_numel * sizeof(float));
    return crc;
}

/* Forward/backward of `seqs` sequences starting at `first`, in `micro`
 * micro-batches; returns the summed token loss. */
static double side_step(run *r, mt_side *s, int first, int seqs, hs_trace *tr) {
    double loss = 0.0, aux;
    hs_error e;
    hs_error_clear(&e);
    int per = seqs / r->pc->micro;
    uint32_t crc = masters_crc(s);
    for (int mb = 0; mb < r->pc->micro; mb++) {
        bool last = mb == r->pc->micro - 1;
        int off = (first + mb * per) * SEQ;
        hs_batch b = {.tokens = r->tok + off, .targets = r->tgt + off, .B = per, .T = SEQ};
        hs_fsdp_set_micro_batch(s->f, s->cfg.fsdp.requires_grad_sync,
                                s->cfg.fsdp.reshard_after_backward, last);
        double ls;
        CHECK(r->c,
              hs_model_forward_backward(s->m, &b, 1.0f / (float)(r->G * SEQ), hs_fsdp_hooks(s->f),
                                        &ls, &aux, &e) == HS_OK,
              "%s", e.msg);
        loss += ls;
        if (tr && !last && r->pc->no_sync)
            CHECK(r->c,
                  hs_trace_collectives(tr, "reduce_scatter", NULL) == 0 &&
                      hs_trace_collectives(tr, "all_reduce", NULL) == 0,
                  "%s: gradients reduced in a no-sync micro-batch", r->pc->name);
    }
    CHECK(r->c, masters_crc(s) == crc, "%s: a master changed outside the optimizer step",
          r->pc->name);
    return loss;
}

static double rel_err(run *r, const float *a, const float *b, int64_t n) {
    float floor = hs_max_abs_f32(b, n);
    double err = hs_max_rel_diff_f32(a, b, n, floor > 1e-30f ? floor : 1e-30f);
    if (err > r->worst) r->worst = err;
    return err;
}

static void check_against_ref(run *r, bool grads, int step) {
    hs_fsdp_ctx *d = hs_fsdp_context(r->dist.f), *ref = hs_fsdp_context(r->ref.f);
    for (int i = 0; i < d->n_params; i++) {
        hs_fsdp_param *fp = &d->params[i], *rp = &ref->params[i];
        int64_t off = fp->plan.layout.row_offset * fp->plan.row_numel;
        const float *want = (grads ? rp->sharded_grad : rp->sharded) + off;
        const float *got = grads ? fp->sharded_grad : fp->sharded;
        double err = rel_err(r, got, want, fp->plan.actual_sharded_numel);
        CHECK(r->c, err <= r->pc->tol, "%s step %d: %s of %s differs by %.3g relative (tol %.3g)",
              r->pc->name, step, grads ? "gradient" : "weight", fp->p->fqn, err, r->pc->tol);
    }
}

/* Bitwise: the twin differs only in where bytes live or which copy the
 * all-gather reads, never in arithmetic. */
static void check_twin(run *r, int step) {
    if (!r->twin.f) return;
    hs_fsdp_ctx *d = hs_fsdp_context(r->dist.f), *t = hs_fsdp_context(r->twin.f);
    for (int i = 0; i < d->n_params; i++)
        CHECK(r->c,
              memcmp(d->params[i].storage, t->params[i].storage,
                     (size_t)d->params[i].storage_numel * sizeof(float)) == 0,
              "%s step %d: %s differs from the run without main params / offload", r->pc->name,
              step, d->params[i].p->fqn);
}

static void check_main_params(run *r) {
    hs_fsdp_ctx *d = hs_fsdp_context(r->dist.f);
    for (int i = 0; i < d->n_params; i++) {
        hs_fsdp_param *fp = &d->params[i];
        bool want = r->pc->main_params && fp->compute_dtype != HS_DTYPE_F32;
        CHECK(r->c, (fp->lp_shard != NULL) == want, "%s: %s model shard present=%d, want %d",
              r->pc->name, fp->p->fqn, fp->lp_shard != NULL, want);
        if (!fp->lp_shard) continue;
        size_t es = hs_dtype_size(fp->compute_dtype);
        CHECK(r->c, fp->lp_shard_bytes == (size_t)fp->storage_numel * es,
              "%s: %s model shard has %zu bytes", r->pc->name, fp->p->fqn, fp->lp_shard_bytes);
        void *round = malloc((size_t)fp->storage_numel * es + 1);
        hs_convert(round, fp->compute_dtype, fp->storage, HS_DTYPE_F32, fp->storage_numel);
        CHECK(r->c, memcmp(round, fp->lp_shard, (size_t)fp->storage_numel * es) == 0,
              "%s: model shard of %s is not the rounded fp32 main param", r->pc->name, fp->p->fqn);
        free(round);
    }
}

/* Expected collectives of one step, from the unit layout and the policy. */
static void check_trace(run *r, hs_trace *tr) {
    const pcase *pc = r->pc;
    hs_fsdp_ctx *d = hs_fsdp_context(r->dist.f);
    int M = pc->micro;
    int sync_mbs = pc->no_sync ? 1 : M;
    int64_t ag = 0, ag_bytes = 0, rs = 0, rs_bytes = 0, ar = 0, ar_bytes = 0, h2d = 0, d2h = 0;
    for (int u = 0; u < d->n_units; u++) {
        hs_fsdp_unit *un = &d->units[u];
        /* a kept unit skips the next micro-batch's forward all-gather; the
         * root never reshards after forward */
        int per = u == 0 ? (pc->keep_backward ? 1 : M)
                         : (pc->keep_backward ? 2 * M - (M - 1) : 2 * M);
        for (int i = 0; i < un->n_params; i++) {
            hs_fsdp_param *fp = un->params[i];
            if (fp->needs_all_gather) {
                ag += per;
                ag_bytes += per * fp->plan.padded_unsharded_numel *
                            (int64_t)hs_dtype_size(fp->compute_dtype);
                rs += sync_mbs;
                rs_bytes += sync_mbs * fp->plan.padded_unsharded_numel *
                            (int64_t)hs_dtype_size(fp->reduce_dtype);
            }
            if (pc->offload) {
                h2d += per; /* one per unshard, all-gathered or not */
                d2h += 1;   /* one D2H per reduced shard, at the drain */
            }
        }
        for (int k = 0; k < un->n_groups; k++)
            if (un->groups[k].pg) {
                ar += sync_mbs;
                ar_bytes += sync_mbs * un->groups[k].numel *
                            (int64_t)hs_dtype_size(un->groups[k].dtype);
            }
    }
    if (pc->offload && !pc->no_sync) d2h *= M;
    const char *sn = r->shard_name, *rn = r->rep_name;
    int64_t got;
    got = hs_trace_collectives(tr, "all_gather", sn);
    CHECK(r->c, got == ag, "%s: %lld all-gathers, want %lld", pc->name, (long long)got,
          (long long)ag);
    got = hs_trace_collective_bytes(tr, "all_gather", sn);
    CHECK(r->c, got == ag_bytes, "%s: all-gather bytes %lld, want %lld (param_dtype size)",
          pc->name, (long long)got, (long long)ag_bytes);
    got = hs_trace_collectives(tr, "reduce_scatter", sn);
    CHECK(r->c, got == rs, "%s: %lld reduce-scatters, want %lld", pc->name, (long long)got,
          (long long)rs);
    got = hs_trace_collective_bytes(tr, "reduce_scatter", sn);
    CHECK(r->c, got == rs_bytes, "%s: reduce-scatter bytes %lld, want %lld (reduce_dtype size)",
          pc->name, (long long)got, (long long)rs_bytes);
    if (r->g.replicate) {
        got = hs_trace_collectives(tr, "all_reduce", rn);
        CHECK(r->c, got == ar, "%s: %lld all-reduces, want %lld", pc->name, (long long)got,
              (long long)ar);
        got = hs_trace_collective_bytes(tr, "all_reduce", rn);
        CHECK(r->c, got == ar_bytes, "%s: all-reduce bytes %lld, want %lld", pc->name,
              (long long)got, (long long)ar_bytes);
    }
    got = hs_trace_collectives(tr, "h2d", NULL);
    CHECK(r->c, got == h2d, "%s: %lld H2D copies, want %lld", pc->name, (long long)got,
          (long long)h2d);
    got = hs_trace_collectives(tr, "d2h", NULL);
    CHECK(r->c, got == d2h, "%s: %lld D2H copies, want %lld", pc->name, (long long)got,
          (long long)d2h);
}

/* Between steps nothing of FSDP but the reduce buffers stays on the device
 * under offload; the masters are all in the host pool. */
static void check_offload_memory(run *r, int64_t dist_peak, int64_t twin_peak) {
    hs_fsdp_ctx *d = hs_fsdp_context(r->dist.f);
    int64_t masters = 0;
    for (int i = 0; i < d->n_params; i++)
        masters += d->params[i].storage_numel * 4 + (int64_t)d->params[i].lp_shard_bytes;
    CHECK(r->c, d->mem.current[HS_FSDP_MEM_PARAM] == 0,
          "%s: %lld parameter bytes left on the device between steps", r->pc->name,
          (long long)d->mem.current[HS_FSDP_MEM_PARAM]);
    CHECK(r->c, d->mem.host_current[HS_FSDP_MEM_PARAM] == masters,
          "%s: host holds %lld parameter bytes, masters are %lld", r->pc->name,
          (long long)d->mem.host_current[HS_FSDP_MEM_PARAM], (long long)masters);
    CHECK(r->c, dist_peak < twin_peak,
          "%s: device parameter peak %lld not below %lld without offload", r->pc->name,
          (long long)dist_peak, (long long)twin_peak);
    if (r->rank == 0)
        printf("  %s: device parameter peak %lld B with offload, %lld B without; host %lld B\n",
               r->pc->name, (long long)dist_peak, (long long)twin_peak, (long long)masters);
}

static void run_case(hs_comm *c, const pcase *pc) {
    run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.pc = pc;
    r.world = hs_comm_size(c);
    r.rank = hs_comm_rank(c);
    r.tr = hs_comm_trace(c);
    r.dev = mt_device_cpu(c, r.tr);
    mt_dp_groups_make(r.c, r.pc->shard, "policy", r.pc->name, &r.g, r.shard_name, r.rep_name,
                      r.flat_name);
    r.G = PER_RANK * r.world;
    hs_fsdp_dp_groups one = {.shard_size = 1, .replicate_size = 1, .flat_size = 1};
    side_init(&r, &r.ref, false, &one, r.G / pc->micro);
    side_init(&r, &r.dist, true, &r.g, PER_RANK / pc->micro);
    if (pc->twin) side_init(&r, &r.twin, false, &r.g, PER_RANK / pc->micro);
    r.tok = malloc(sizeof(int32_t) * (size_t)(r.G * SEQ));
    r.tgt = malloc(sizeof(int32_t) * (size_t)(r.G * SEQ));
    int first = r.g.flat_rank * PER_RANK;
    for (int step = 1; step <= STEPS; step++) {
        global_batch(&r, step);
        double ref_loss = side_step(&r, &r.ref, 0, r.G, NULL);
        int64_t twin_peak = 0;
        if (r.twin.f) {
            hs_fsdp_reset_peak(r.twin.f);
            (void)side_step(&r, &r.twin, first, PER_RANK, NULL);
            twin_peak = hs_fsdp_context(r.twin.f)->mem.peak[HS_FSDP_MEM_PARAM];
        }
        hs_trace_reset_counters(r.tr);
        hs_fsdp_reset_peak(r.dist.f);
        double loss = mt_flat_sum(c, r.g.flat, side_step(&r, &r.dist, first, PER_RANK, r.tr));
        int64_t dist_peak = hs_fsdp_context(r.dist.f)->mem.peak[HS_FSDP_MEM_PARAM];
        check_trace(&r, r.tr);
        CHECK(c, isfinite(loss), "%s step %d: loss %g", pc->name, step, loss);
        double rel = fabs(loss - ref_loss) / fabs(ref_loss);
        if (rel > r.worst) r.worst = rel;
        CHECK(c, rel <= pc->tol, "%s step %d: loss %.8g vs single-process %.8g (rel %.3g)",
              pc->name, step, loss, ref_loss, rel);
        if (step == 1) check_against_ref(&r, true, step);
        mt_side_optim_step(c, &r.ref, LR);
        mt_side_optim_step(c, &r.dist, LR);
        if (r.twin.f) mt_side_optim_step(c, &r.twin, LR);
        /* Adam's first step is lr * g / (|g| + eps): elements whose
         * gradient is near eps move by a rounding-sensitive fraction of lr,
         * so weights are compared from step 2 on (as the fp32 parity test) */
        if (step >= 2) check_against_ref(&r, false, step);
        check_twin(&r, step);
        check_main_params(&r);
        if (pc->offload && step == STEPS) check_offload_memory(&r, dist_peak, twin_peak);
        if (r.rank == 0)
            printf("  %s step %d: mean loss %.7f (single-process %.7f)\n", pc->name, step,
                   loss / (r.G * SEQ), ref_loss / (r.G * SEQ));
    }
    mt_side_free(&r.twin);
    mt_side_free(&r.dist);
    mt_side_free(&r.ref);
    hs_device_free(r.dev);
    free(r.tok);
    free(r.tgt);
    float worst = mt_worst_over(c, r.g.flat, r.g.flat_size, r.worst);
    if (r.rank == 0)
        printf("ok %s: worst normwise relative error %.3g (tol %.3g)\n", pc->name, (double)worst,
               pc->tol);
}

int main(int argc, char **argv) {
    hs_comm_options opt = {.timeout_s = 120};
    hs_comm *c = mt_comm_init(&argc, &argv, &opt);
    int W = hs_comm_size(c);
    const int NUL = HS_MP_NULL, F32 = HS_DTYPE_F32, BF16 = HS_DTYPE_BF16, F16 = HS_DTYPE_F16;
    const pcase cases[] = {
        {.name = "fp32_null_dtypes",
         .shard = W,
         .param_dt = NUL,
         .reduce_dt = NUL,
         .micro = 1,
         .tol = 1e-5},
        {.name = "bf16_params_fp32_reduce",
         .shard = W,
         .param_dt = BF16,
         .reduce_dt = F32,
         .micro = 1,
         .tol = 1.5e-2},
        {.name = "bf16_params_bf16_reduce",
         .shard = W,
         .param_dt = BF16,
         .reduce_dt = NUL,
         .micro = 1,
         .tol = 2e-2},
        {.name = "f16_params_f16_reduce",
         .shard = W,
         .param_dt = F16,
         .reduce_dt = F16,
         .micro = 1,
         .tol = 5e-3},
        {.name = "fp32_params_bf16_reduce",
         .shard = W,
         .param_dt = F32,
         .reduce_dt = BF16,
         .micro = 1,
         .tol = 2e-2},
        {.name = "bf16_main_params",
         .shard = W,
         .param_dt = BF16,
         .reduce_dt = F32,
         .main_params = true,
         .micro = 1,
         .twin = true,
         .tol = 1.5e-2},
        {.name = "fp32_offload",
         .shard = W,
         .param_dt = NUL,
         .reduce_dt = NUL,
         .offload = true,
         .micro = 1,
         .twin = true,
         .tol = 1e-5},
        {.name = "fp32_sync_every_micro_batch",
         .shard = W,
         .param_dt = NUL,
         .reduce_dt = NUL,
         .micro = 2,
         .tol = 1e-5},
        {.name = "fp32_no_sync_keep_unsharded",
         .shard = W,
         .param_dt = NUL,
         .reduce_dt = NUL,
         .micro = 2,
         .no_sync = true,
         .keep_backward = true,
         .tol = 1e-5},
        {.name = "combo_bf16_main_offload_no_sync_ckpt",
         .shard = W,
         .param_dt = BF16,
         .reduce_dt = F32,
         .main_params = true,
         .offload = true,
         .ckpt = true,
         .micro = 2,
         .no_sync = true,
         .keep_backward = true,
         .twin = true,
         .tol = 1.5e-2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(c, &cases[i]);
    if (W == 4) {
        const pcase hsdp[] = {
            {.name = "hsdp_fp32_no_sync",
             .shard = 2,
             .param_dt = NUL,
             .reduce_dt = NUL,
             .micro = 2,
             .no_sync = true,
             .tol = 1e-5},
            {.name = "hsdp_fp32_sync",
             .shard = 2,
             .param_dt = NUL,
             .reduce_dt = NUL,
             .micro = 2,
             .tol = 1e-5},
            {.name = "hsdp_combo_bf16_main_offload_no_sync",
             .shard = 2,
             .param_dt = BF16,
             .reduce_dt = F32,
             .main_params = true,
             .offload = true,
             .micro = 2,
             .no_sync = true,
             .keep_backward = true,
             .twin = true,
             .tol = 1.5e-2},
            {.name = "hsdp_bf16_reduce",
             .shard = 2,
             .param_dt = BF16,
             .reduce_dt = BF16,
             .micro = 1,
             .tol = 2e-2},
        };
        for (size_t i = 0; i < sizeof hsdp / sizeof hsdp[0]; i++) run_case(c, &hsdp[i]);
    }
    hs_comm_finalize(c);
    return 0;
}
