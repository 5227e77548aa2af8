/* Compute spans per unit for the trace. The model calls these hooks around
 * each unit's forward and backward whatever engine runs it, so wrapping them
 * times exactly the block's compute plus the engine's own hook work. */
#include <stdlib.h>
#include <stdio.h>

#include "train/run.h"

static void span(hs_trace_hooks *th, const char *phase, int unit, double t0) {
    const hs_unit_desc *u = hs_model_unit(th->model, unit);
    char name[HS_FQN_MAX + 16];
    snprintf(name, sizeof name, "%s %s", phase, u->name[0] ? u->name : "root");
    hs_trace_span(th->trace, HS_LANE_COMPUTE, name, phase, t0, hs_now(), NULL);
    hs_trace_memory(th->trace, &th->dev->device_pool, &th->dev->host_pool);
}

static void th_pre_forward(void *ctx, int unit) {
    hs_trace_hooks *th = ctx;
    th->inner->pre_forward(th->inner->ctx, unit);
    th->fwd_t0[unit] = hs_now();
}

static void th_post_forward(void *ctx, int unit) {
    hs_trace_hooks *th = ctx;
    span(th, "forward", unit, th->fwd_t0[unit]);
    th->inner->post_forward(th->inner->ctx, unit);
}

static void th_pre_backward(void *ctx, int unit) {
    hs_trace_hooks *th = ctx;
    th->inner->pre_backward(th->inner->ctx, unit);
    th->bwd_t0[unit] = hs_now();
}

static void th_post_backward(void *ctx, int unit) {
    hs_trace_hooks *th = ctx;
    span(th, "backward", unit, th->bwd_t0[unit]);
    th->inner->post_backward(th->inner->ctx, unit);
}

static void th_post_backward_final(void *ctx) {
    hs_trace_hooks *th = ctx;
    double t0 = hs_now();
    th->inner->post_backward_final(th->inner->ctx);
    hs_trace_span(th->trace, HS_LANE_COMPUTE, "post_backward_final", "backward", t0, hs_now(),
                  NULL);
}

/* The split backward's calls pass through: the pipeline's W span times
 * the weight pass. */
static void th_weight_grad_deferred(void *ctx, int unit) {
    hs_trace_hooks *th = ctx;
    if (th->inner->weight_grad_deferred) th->inner->weight_grad_deferred(th->inner->ctx, unit);
}

static void th_post_weight_grad(void *ctx, int unit) {
    hs_trace_hooks *th = ctx;
    if (th->inner->post_weight_grad) th->inner->post_weight_grad(th->inner->ctx, unit);
}

static void th_next_chunk(void *ctx, int chunk, bool backward) {
    hs_trace_hooks *th = ctx;
    if (th->inner->next_chunk) th->inner->next_chunk(th->inner->ctx, chunk, backward);
}

const hs_model_hooks *hs_trace_hooks_init(hs_trace_hooks *th, const hs_model_hooks *inner,
                                          hs_trace *trace, hs_model *model, hs_device *dev) {
    *th = (hs_trace_hooks){.inner = inner, .trace = trace, .model = model, .dev = dev};
    if (!trace || !hs_trace_enabled(trace)) return inner;
    th->n_units = hs_model_num_units(model);
    th->fwd_t0 = calloc((size_t)th->n_units, sizeof(double));
    th->bwd_t0 = calloc((size_t)th->n_units, sizeof(double));
    if (!th->fwd_t0 || !th->bwd_t0) {
        hs_trace_hooks_free(th);
        return inner; /* tracing is best effort; training goes on untraced */
    }
    th->outer = (hs_model_hooks){th,
                                 th_pre_forward,
                                 th_post_forward,
                                 th_pre_backward,
                                 th_post_backward,
                                 th_post_backward_final,
                                 th_weight_grad_deferred,
                                 th_post_weight_grad,
                                 th_next_chunk};
    return &th->outer;
}

void hs_trace_hooks_free(hs_trace_hooks *th) {
    free(th->fwd_t0);
    free(th->bwd_t0);
    th->fwd_t0 = th->bwd_t0 = NULL;
}
