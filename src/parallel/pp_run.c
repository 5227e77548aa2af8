/* One optimizer step of a pipeline stage: its schedule's forwards and
 * backwards, each in its chunk's activation slot, with the hand-over
 * (parallel.h); and the forward-only chain through every chunk. */
#include <stdio.h>

#include "parallel/pp_internal.h"

/* Message keys: the receiving chunk's (local chunk, micro-batch).
 * Activations of model chunk c go to the home of chunk c + 1, gradients
 * to that of c - 1 (hs_pp_chunk_home: the next stage, round to stage 0's
 * next chunk when interleaved, back along the V for zbv). */
static int key_of(int chunk, int mb, int M) { return chunk * M + mb; }

/* The stage and local chunk of the model chunk `step` (+1 or -1) from
 * local chunk v; false past either end of the model. */
static bool neighbour(const hs_pp *p, const hs_model *m, int v, int step, int *stage, int *chunk) {
    hs_pp_schedule_kind kind = hs_pp_placement(p);
    int pp = hs_pp_size(p), c = hs_pp_model_chunk(kind, pp, hs_pp_stage(p), v) + step;
    if (c < 0 || c >= pp * hs_model_num_chunks(m)) return false;
    hs_pp_chunk_home(kind, pp, c, stage, chunk);
    return true;
}

static void span(const hs_pp_step_io *io, const hs_pp *p, const hs_model *m, hs_pp_action a,
                 double t0) {
    if (!io->trace || !hs_trace_enabled(io->trace)) return;
    char name[32], args[192];
    static const char kinds[] = {'F', 'B', 'W'};
    static const char *const cats[] = {"pp_forward", "pp_backward", "pp_weight"};
    char kind = kinds[a.kind];
    if (hs_model_num_chunks(m) > 1)
        snprintf(name, sizeof name, "%c%d.%d", kind, a.micro_batch, a.chunk);
    else snprintf(name, sizeof name, "%c%d", kind, a.micro_batch);
    snprintf(args, sizeof args, "\"stage\":%d,\"chunk\":%d,\"micro_batch\":%d,\"schedule\":\"%s\"",
             hs_pp_stage(p), a.chunk, a.micro_batch, io->schedule ? io->schedule : "");
    hs_trace_span(io->trace, HS_LANE_COMPUTE, name, cats[a.kind], t0, hs_now(), args);
}

static hs_status run_forward(hs_pp *p, hs_model *m, const hs_model_hooks *hooks, hs_pp_action a,
                             int M, float grad_scale, const hs_pp_step_io *io, double *aux,
                             hs_error *e) {
    int v = a.chunk, mb = a.micro_batch, slot = mb % hs_model_num_slots(m);
    hs_batch b = io->batch(io->ctx, mb);
    int64_t numel = hs_model_stage_numel(m, &b), xn = hs_model_stage_aux_numel(m);
    hs_status s = HS_OK;
    if (!hs_model_chunk_has_embedding(m, v)) {
        hs_dtype dt;
        void *in = hs_model_stage_input(m, v, slot, &dt);
        s = hs_pp_take_forward(p, key_of(v, mb, M), in, hs_model_stage_aux(m), e);
    }
    double t0 = hs_now();
    if (s == HS_OK)
        s = hs_model_stage_forward(m, v, slot, &b, hooks, true, grad_scale, NULL, NULL, aux, e);
    hs_pp_add_busy(p, a.kind, hs_now() - t0);
    span(io, p, m, a, t0);
    int to, dv;
    if (s == HS_OK && neighbour(p, m, v, +1, &to, &dv)) {
        hs_dtype dt;
        const void *out = hs_model_stage_output(m, v, slot, &dt);
        s = hs_pp_send_forward(p, key_of(dv, mb, M), to, out, numel, dt, hs_model_stage_aux(m), xn,
                               e);
    }
    return s;
}

static hs_status run_backward(hs_pp *p, hs_model *m, const hs_model_hooks *hooks, hs_pp_action a,
                              int M, float grad_scale, const hs_pp_step_io *io, double *loss,
                              hs_error *e) {
    int v = a.chunk, mb = a.micro_batch, slot = mb % hs_model_num_slots(m);
    hs_batch b = io->batch(io->ctx, mb);
    int64_t numel = hs_model_stage_numel(m, &b), xn = hs_model_stage_aux_grad_numel(m);
    float *aux_g = hs_model_stage_aux_grad(m, v, slot);
    hs_status s = HS_OK;
    if (!hs_model_chunk_has_head(m, v))
        s = hs_pp_take_backward(p, key_of(v, mb, M), hs_model_stage_grad(m), aux_g, e);
    io->before_backward(io->ctx, v, mb, mb == M - 1);
    double t0 = hs_now();
    if (s == HS_OK)
        s = io->split ? hs_model_stage_backward_input(m, v, slot, &b, grad_scale, hooks, loss, e)
                      : hs_model_stage_backward(m, v, slot, &b, grad_scale, hooks, loss, e);
    hs_pp_add_busy(p, a.kind, hs_now() - t0);
    span(io, p, m, a, t0);
    int to, dv;
    if (s == HS_OK && neighbour(p, m, v, -1, &to, &dv))
        s = hs_pp_send_backward(p, key_of(dv, mb, M), to, hs_model_stage_grad(m), numel, aux_g, xn,
                                e);
    return s;
}

/* The weight pass of (chunk, micro-batch): local work, no hand-over. */
static void run_weight(hs_pp *p, hs_model *m, const hs_model_hooks *hooks, hs_pp_action a,
                       const hs_pp_step_io *io) {
    double t0 = hs_now();
    hs_model_stage_backward_weight(m, a.chunk, a.micro_batch % hs_model_num_slots(m), hooks);
    hs_pp_add_busy(p, a.kind, hs_now() - t0);
    span(io, p, m, a, t0);
}

/* Every receive of the step, before anything runs. */
static void post_receives(hs_pp *p, hs_model *m, const hs_pp_action *actions, int n, int M,
                          int64_t numel) {
    for (int k = 0; k < n; k++) {
        hs_pp_action a = actions[k];
        int key = key_of(a.chunk, a.micro_batch, M), from, fv;
        if (a.kind == HS_PP_FORWARD && neighbour(p, m, a.chunk, -1, &from, &fv)) {
            hs_dtype dt;
            (void)hs_model_stage_input(m, a.chunk, 0, &dt);
            hs_pp_post_recv_forward(p, key, from, numel, dt, hs_model_stage_aux_numel(m));
        } else if (a.kind == HS_PP_BACKWARD && neighbour(p, m, a.chunk, +1, &from, &fv)) {
            hs_pp_post_recv_backward(p, key, from, numel, hs_model_stage_aux_grad_numel(m));
        }
    }
}

/* Tells the hooks which chunk runs after action k (weight passes run no
 * unit's hooks: the next forward or backward). */
static void next_chunk(const hs_model_hooks *hooks, const hs_pp_action *actions, int n, int k) {
    if (!hooks || !hooks->next_chunk) return;
    int j = k + 1;
    while (j < n && actions[j].kind == HS_PP_WEIGHT) j++;
    if (j < n) hooks->next_chunk(hooks->ctx, actions[j].chunk, actions[j].kind == HS_PP_BACKWARD);
    else hooks->next_chunk(hooks->ctx, -1, false);
}

hs_status hs_pp_run_step(hs_pp *p, hs_model *m, const hs_model_hooks *hooks,
                         const hs_pp_action *actions, int n_actions, int M, float grad_scale,
                         const hs_pp_step_io *io, double *loss_sum, double *aux_sum, hs_error *e) {
    hs_batch b0 = io->batch(io->ctx, 0);
    post_receives(p, m, actions, n_actions, M, hs_model_stage_numel(m, &b0));
    hs_status s = HS_OK;
    *loss_sum = *aux_sum = 0.0;
    for (int k = 0; s == HS_OK && k < n_actions; k++) {
        double loss = 0.0, aux = 0.0;
        next_chunk(hooks, actions, n_actions, k);
        if (actions[k].kind == HS_PP_FORWARD)
            s = run_forward(p, m, hooks, actions[k], M, grad_scale, io, &aux, e);
        else if (actions[k].kind == HS_PP_BACKWARD)
            s = run_backward(p, m, hooks, actions[k], M, grad_scale, io, &loss, e);
        else run_weight(p, m, hooks, actions[k], io);
        *loss_sum += loss;
        if (io->mb_loss && actions[k].kind == HS_PP_BACKWARD)
            io->mb_loss[actions[k].micro_batch] += loss;
        *aux_sum += aux;
    }
    return s == HS_OK ? hs_pp_flush(p, e) : s;
}

hs_status hs_pp_forward_only(hs_pp *p, hs_model *m, const hs_model_hooks *hooks, const hs_batch *b,
                             double *loss_sum, float *logits, hs_error *e) {
    int64_t numel = hs_model_stage_numel(m, b);
    hs_status s = HS_OK;
    if (loss_sum) *loss_sum = 0.0;
    /* every receive first: a local one (zbv's turn) is sent before taken */
    int from, to, dv;
    for (int v = 0; v < hs_model_num_chunks(m); v++) {
        hs_dtype dt;
        (void)hs_model_stage_input(m, v, 0, &dt);
        if (neighbour(p, m, v, -1, &from, &dv))
            hs_pp_post_recv_forward(p, key_of(v, 0, 1), from, numel, dt, 0);
    }
    for (int v = 0; s == HS_OK && v < hs_model_num_chunks(m); v++) {
        if (neighbour(p, m, v, -1, &from, &dv)) {
            hs_dtype dt;
            void *in = hs_model_stage_input(m, v, 0, &dt);
            s = hs_pp_take_forward(p, key_of(v, 0, 1), in, NULL, e);
        }
        bool head = hs_model_chunk_has_head(m, v);
        if (s == HS_OK)
            s = hs_model_stage_forward(m, v, 0, b, hooks, false, 0.0f, head ? loss_sum : NULL,
                                       head ? logits : NULL, NULL, e);
        if (s == HS_OK && neighbour(p, m, v, +1, &to, &dv)) {
            hs_dtype dt;
            const void *out = hs_model_stage_output(m, v, 0, &dt);
            s = hs_pp_send_forward(p, key_of(dv, 0, 1), to, out, numel, dt, NULL, 0, e);
        }
    }
    return s == HS_OK ? hs_pp_flush(p, e) : s;
}
