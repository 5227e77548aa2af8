/* The trainer under pipeline parallelism: one optimizer step's micro-batches
 * as this stage's schedule orders them (parallel.h), and the forward-only
 * chain evaluation and sampling use. Every stage reads the same
 * micro-batches (the first needs the tokens, the last the targets). */
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

hs_status hs_pp_trainer_init(hs_trainer *t, hs_error *e) {
    const hs_config *cfg = t->cfg;
    t->pp_size = t->topo->pp;
    if (t->pp_size < 2) return HS_OK;
    if (!hs_pp_schedule_parse(cfg->accelerator.pp_schedule, &t->pp_kind))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "accelerator.pp_schedule: unknown schedule '%s'; "
                            "use one of " HS_PP_SCHEDULE_CHOICES,
                            cfg->accelerator.pp_schedule);
    t->pp_group = hs_mesh_group(t->mesh, HS_DIM_PP);
    t->pp_stage = hs_mesh_coords(t->mesh).pp;
    /* Stage s runs the model's chunks s, s + pp, ... */
    hs_pp_stage_chunks(&cfg->accelerator, cfg->model.n_layers, t->pp_stage, &t->stage);
    int V = t->pp_virtual = t->stage.n_chunks;
    if (hs_pp_slots(t->pp_kind, t->pp_size, t->pp_stage, t->M, V, &t->act_slots, e) != HS_OK)
        return e->code;
    /* a schedule that could hang or run an action twice is a bug: refuse it
     * before the first step rather than find it in a hang */
    bool eager = hs_train_layout_invariant(&cfg->train) && hs_pp_schedule_splits(t->pp_kind);
    if ((eager ? hs_pp_schedule_check_eager : hs_pp_schedule_check)(t->pp_kind, t->pp_size, t->M, V,
                                                                    e) != HS_OK)
        return e->code;
    t->n_pp_actions = (int)hs_pp_schedule_length(t->pp_kind, t->M, V);
    t->pp_actions = calloc((size_t)t->n_pp_actions, sizeof *t->pp_actions);
    if (!t->pp_actions) return hs_error_oom(e, "trainer: cannot allocate the schedule");
    if (hs_pp_schedule(t->pp_kind, t->pp_size, t->pp_stage, t->M, V, t->pp_actions, e) != HS_OK)
        return e->code;
    /* layout: a micro-batch's weight pass before the next one's input pass */
    if (eager) hs_pp_weights_eager(t->pp_actions, t->n_pp_actions);
    int64_t numel, extra;
    hs_pp_message_numel(&cfg->model, cfg->train.micro_batch_size, cfg->train.seq_len, t->cp, &numel,
                        &extra);
    hs_status s = hs_pp_create(t->comm, t->dev, t->topo, hs_comm_rank(t->comm), numel, extra,
                               t->M * V, NULL, &t->pp, e);
    if (s == HS_OK) hs_pp_set_schedule(t->pp, t->pp_kind);
    return s;
}

void hs_pp_trainer_free(hs_trainer *t) {
    hs_pp_free(t->pp);
    free(t->pp_actions);
}

/* The step's micro-batches as the schedule asks for them. */
typedef struct step_ctx {
    hs_trainer *t;
    int64_t g;
} step_ctx;

static hs_batch micro_batch(void *ctx, int mb) {
    step_ctx *c = ctx;
    hs_trainer *t = c->t;
    hs_data_micro_batch(t->data, c->g, t->G, mb, t->mbs, t->dp_rank, t->dp_size, t->tokens,
                        t->targets);
    return hs_train_local_batch(t, t->tokens, t->targets, t->mbs);
}

/* spec 004 §2.3: the last micro-batch always syncs and reshards (per
 * chunk: each chunk's units finish with their own last backward). */
static void before_backward(void *ctx, int chunk, int mb, bool last) {
    (void)chunk, (void)mb;
    step_ctx *c = ctx;
    const hs_fsdp_config *fc = &c->t->cfg->fsdp;
    c->t->engine->begin_micro_batch(c->t->engine, fc->requires_grad_sync || last,
                                    fc->reshard_after_backward || last, last);
}

hs_status hs_pp_run_micro_batches(hs_trainer *t, int64_t g, float grad_scale, double sums[2],
                                  hs_error *e) {
    step_ctx c = {.t = t, .g = g};
    hs_pp_step_io io = {.ctx = &c,
                        .batch = micro_batch,
                        .before_backward = before_backward,
                        .trace = t->trace,
                        .schedule = t->cfg->accelerator.pp_schedule,
                        .split = hs_pp_schedule_splits(t->pp_kind),
                        .mb_loss = hs_canon_micro_batches(t) ? t->canon_mb_loss : NULL};
    for (int m = 0; io.mb_loss && m < t->M; m++) io.mb_loss[m] = 0.0;
    t->engine->begin_step(t->engine);
    double loss = 0.0, aux = 0.0, t0 = hs_now();
    hs_pp_reset_stats(t->pp);
    hs_status s = hs_pp_run_step(t->pp, t->engine->model, t->hooks, t->pp_actions, t->n_pp_actions,
                                 t->M, grad_scale, &io, &loss, &aux, e);
    t->pp_span_s = hs_now() - t0;
    t->pp_busy_s = hs_pp_busy_seconds(t->pp);
    sums[0] += loss;
    sums[1] += aux;
    /* The schedule's own drain after the stage's last backward; the root's
     * natural one already ran, and a second applies nothing (idempotent). */
    if (s == HS_OK) t->engine->drain(t->engine);
    return s;
}

/* The head's stage's loss sum and logits reach every stage (the last
 * stage, or the first under zbv's V). */
int hs_pp_head_stage(const hs_trainer *t) {
    int stage, v;
    int chunks = t->pp_size * t->pp_virtual;
    hs_pp_chunk_home(t->pp_kind, t->pp_size, chunks - 1, &stage, &v);
    return stage;
}

hs_status hs_pp_forward(hs_trainer *t, const hs_batch *b, double *loss_sum, float *logits,
                        hs_error *e) {
    double loss = 0.0;
    hs_status s = hs_pp_forward_only(t->pp, t->engine->model, t->hooks, b, loss_sum ? &loss : NULL,
                                     logits, e);
    /* Only the head's stage computed a loss: the sum over stages is its own. */
    if (s == HS_OK && loss_sum) s = hs_reduce_sum_f64(t->pp_group, &loss, 1, e);
    if (loss_sum) *loss_sum = loss;
    int64_t n = (int64_t)b->B * b->T * t->cfg->model.vocab_size;
    /* logits is the caller's host array: a host buffer, no stream */
    if (s == HS_OK && logits)
        s = hs_pg_broadcast(t->pp_group, NULL, logits, n, HS_DTYPE_F32, hs_pp_head_stage(t), e);
    return s;
}
