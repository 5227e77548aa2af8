/* One optimizer step: M micro-batches with gradient accumulation, the
 * global-batch mean loss, global grad-norm clipping, the scheduled LR, the
 * optimizer update and zeroed gradients (DESIGN.md §3). */
#include <math.h>

#include "train/run.h"

/* Valid targets in the whole global batch g. Every rank can count them
 * because every rank reads the same data, which spares a collective; the
 * scale must be identical on all ranks for FSDP's sum to be the mean. */
static int64_t count_valid_targets(hs_trainer *t, int64_t g) {
    int64_t n = 0;
    for (int k = 0; k < t->G; k++) {
        hs_data_sequence(t->data, hs_data_batch_sequence(t->data, g, t->G, k), t->tokens,
                         t->targets);
        for (int i = 0; i < t->T; i++) n += t->targets[i] >= 0;
    }
    return n;
}

static hs_status run_micro_batches(hs_trainer *t, int64_t g, float grad_scale, double sums[2],
                                   hs_error *e) {
    hs_status cs = hs_canon_step_begin(t, e);
    if (cs != HS_OK) return cs;
    if (t->pp) return hs_pp_run_micro_batches(t, g, grad_scale, sums, e);
    const hs_fsdp_config *fc = &t->cfg->fsdp;
    for (int m = 0; m < t->M; m++) {
        bool last = m == t->M - 1;
        hs_data_micro_batch(t->data, g, t->G, m, t->mbs, t->dp_rank, t->dp_size, t->tokens,
                            t->targets);
        /* spec 004 §2.3: the last micro-batch always syncs and reshards. */
        t->engine->begin_micro_batch(t->engine, fc->requires_grad_sync || last,
                                     fc->reshard_after_backward || last, last);
        double loss_sum = 0.0, aux = 0.0;
        hs_status s = hs_train_forward_backward(t, t->tokens, t->targets, t->mbs, grad_scale,
                                                &loss_sum, &aux, e);
        if (s != HS_OK) return s;
        hs_canon_micro_batch_done(t, m, loss_sum);
        sums[0] += loss_sum;
        sums[1] += aux;
    }
    return HS_OK;
}

/* The optimizer's step and, with aux-loss-free balancing, the correction
 * biases' (r->expert_tokens: the step's global loads), before the engine
 * takes the new values. */
static hs_status optimizer_update(hs_trainer *t, int step, hs_step_result *r, hs_error *e) {
    hs_status s = hs_engine_grad_norm(t->engine, &r->grad_norm, e);
    if (s != HS_OK) return s;
    double t0 = hs_now();
    hs_clip_grads(t->dev, t->oparams, t->n_oparams, r->grad_norm, t->cfg->optimizer.clip_grad_norm);
    r->lr = hs_lr_at(&t->cfg->optimizer, step, t->cfg->train.steps);
    s = hs_optim_step(t->optim, r->lr, e);
    if (s == HS_OK && hs_model_moe_bias(&t->cfg->model) && r->expert_tokens)
        s = hs_moe_bias_update(t, r->expert_tokens, e);
    if (s == HS_OK) s = t->engine->after_step(t->engine, true, e);
    t->engine->zero_grads(t->engine);
    hs_trace_span(t->trace, HS_LANE_COMPUTE, "optimizer", "optimizer", t0, hs_now(), NULL);
    return s;
}

/* The rows each expert of each layer received in this step, summed over
 * the ranks whose tokens make the global batch (a pipeline stage counts
 * its own layers; the stages' rows add up over pp). */
static hs_status expert_tokens(hs_trainer *t, hs_step_result *r, hs_error *e) {
    int Ls = 0, E = 0, L = t->cfg->model.n_layers;
    const int64_t *c = hs_model_expert_tokens(t->engine->model, &Ls, &E);
    if (!c || !t->expert_tokens) return HS_OK;
    for (int i = 0; i < L * E; i++) t->expert_tokens[i] = 0.0;
    for (int j = 0; j < Ls; j++) {
        int64_t off = (int64_t)hs_model_block_layer(t->engine->model, j) * E;
        for (int x = 0; x < E; x++) t->expert_tokens[off + x] = (double)c[(int64_t)j * E + x];
    }
    *r = (hs_step_result){.expert_tokens = t->expert_tokens, .expert_layers = L, .n_experts = E};
    hs_status s = hs_reduce_sum_f64(t->batch_group, t->expert_tokens, L * E, e);
    if (s == HS_OK && t->pp) s = hs_reduce_sum_f64(t->pp_group, t->expert_tokens, L * E, e);
    /* Under sequence parallel each TP rank routed its own rows. */
    const hs_accel_config *a = &t->cfg->accelerator;
    if (s == HS_OK && a->tp_size > 1 && a->sequence_parallel)
        s = hs_reduce_sum_f64(hs_mesh_group(t->mesh, HS_DIM_TP), t->expert_tokens, L * E, e);
    return s;
}

/* The step's exposed communication on this rank (hs_step_result), each
 * count started again for the next step. */
static void exposed(hs_trainer *t, hs_step_result *r) {
    r->exposed_fsdp_s = hs_engine_take_exposed(t->engine);
    hs_parallel *p = hs_engine_parallel(t->engine);
    hs_tp *tp = p ? hs_parallel_tp(p) : NULL;
    hs_cp *cp = p ? hs_parallel_cp(p) : NULL;
    hs_ep *ep = p ? hs_parallel_ep(p) : NULL;
    if (tp) r->exposed_s[HS_PLAN_TP] = hs_tp_get_stats(tp).seconds, hs_tp_reset_stats(tp);
    if (cp) r->exposed_s[HS_PLAN_CP] = hs_cp_get_stats(cp).seconds, hs_cp_reset_stats(cp);
    if (ep) r->exposed_s[HS_PLAN_EP] = hs_ep_get_stats(ep).seconds, hs_ep_reset_stats(ep);
    if (t->pp && t->pp_span_s > 0) r->bubble = 1 - t->pp_busy_s / t->pp_span_s;
}

hs_status hs_train_step(hs_trainer *t, int step, hs_step_result *r, hs_error *e) {
    *r = (hs_step_result){.step = step};
    int64_t g = step - 1;
    hs_model_expert_tokens_reset(t->engine->model);
    hs_step_result between = {0}; /* what evaluation or a checkpoint waited since the last step */
    exposed(t, &between);
    hs_pool_reset_peak(&t->dev->device_pool);
    hs_pool_reset_peak(&t->dev->host_pool);
    double t0 = hs_now();
    r->tokens = count_valid_targets(t, g);
    float grad_scale = r->tokens > 0 ? 1.0f / (float)r->tokens : 0.0f;
    double sums[2] = {0.0, 0.0}; /* CE sum, aux terms */
    bool dump = hs_dump_dir(t) != NULL;
    hs_status s = dump ? hs_dump_logits(t, step, e) : HS_OK;
    if (s == HS_OK) s = run_micro_batches(t, g, grad_scale, sums, e);
    if (s == HS_OK && dump) s = hs_dump_grads(t, step, e);
    hs_step_result ex = {0};
    if (s == HS_OK) s = expert_tokens(t, &ex, e);
    r->expert_tokens = ex.expert_tokens;
    r->expert_layers = ex.expert_layers;
    r->n_experts = ex.n_experts;
    if (s == HS_OK) s = optimizer_update(t, step, r, e);
    /* A kernel that could not run (pipeline stages, the optimizer's) fails
     * the step before its loss or weights are used. On a GPU the step's
     * work is waited for first: a failed launch shows at the wait, and the
     * step's time is the work's, not its enqueueing's. */
    if (s == HS_OK) hs_device_synchronize(t->dev);
    if (s == HS_OK) s = hs_device_status(t->dev, e);
    if (s == HS_OK && dump) s = hs_dump_weights(t, step, e);
    /* layout-invariant over micro-batches: the loss as their tree */
    bool canon = hs_canon_micro_batches(t);
    if (s == HS_OK && canon) s = hs_canon_loss(t, &sums[0], e);
    if (s == HS_OK) s = hs_reduce_sum_f64(t->batch_group, sums + canon, 2 - canon, e);
    /* Only the last pipeline stage has losses: the others add zeros. */
    if (s == HS_OK && t->pp) s = hs_reduce_sum_f64(t->pp_group, sums + canon, 2 - canon, e);
    r->step_time_s = hs_now() - t0;
    exposed(t, r);
    hs_trace_span(t->trace, HS_LANE_COMPUTE, "step", "step", t0, hs_now(), NULL);
    if (s != HS_OK) return s;
    r->loss = r->tokens > 0 ? sums[0] / (double)r->tokens : 0.0;
    /* Each micro-batch on each rank reports its aux term, the same on every
     * rank of the micro-batch (computed over all of its tokens); the mean is
     * the value of one micro-batch-sized batch. */
    r->aux_loss = sums[1] / ((double)t->M * (double)hs_pg_size(t->batch_group));
    /* The stop request (a signal on any rank) rides the same MAX, so every
     * rank stops after the same step. */
    int64_t peaks[3] = {hs_pool_peak(&t->dev->device_pool), hs_pool_peak(&t->dev->host_pool),
                        t->opt ? hs_stop_signal(t->opt->stop) : 0};
    s = hs_reduce_max_i64(t->world_group, peaks, 3, e);
    r->peak_device_bytes = peaks[0];
    r->peak_host_bytes = peaks[1];
    r->stop_signal = (int)peaks[2];
    double clip = t->cfg->optimizer.clip_grad_norm;
    if (!isfinite(r->loss) && s == HS_OK)
        s = hs_error_set(e, HS_ERR_INTERNAL, "step %d: the loss is %g; lower optimizer.lr%s", step,
                         r->loss,
                         clip > 0 ? " (gradients are already clipped to optimizer.clip_grad_norm)"
                                  : " or enable optimizer.clip_grad_norm");
    return s;
}
