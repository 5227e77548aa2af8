/* The hook state machine (RFC 000 §3.3–§3.5, §8.2) driven by the real
 * model and by hand, the root drain, gradients through the FSDP path, and
 * two wrapped models in one process. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "fsdp_fixture.h"

#define LOG_MAX 256

typedef struct rec {
    int n;
    char line[LOG_MAX][80];
} rec;

static void record(void *arg, int unit, const char *event, hs_fsdp_unit_state from,
                   hs_fsdp_unit_state to) {
    rec *r = arg;
    if (r->n < LOG_MAX)
        snprintf(r->line[r->n++], 80, "%d %s: %s -> %s", unit, event, hs_fsdp_unit_state_name(from),
                 hs_fsdp_unit_state_name(to));
}

/* The transitions of one unit, in order, joined by '|'. */
static void unit_story(const rec *r, int unit, char *out, size_t cap) {
    out[0] = '\0';
    char prefix[8];
    snprintf(prefix, sizeof prefix, "%d ", unit);
    for (int i = 0; i < r->n; i++) {
        if (strncmp(r->line[i], prefix, strlen(prefix)) != 0) continue;
        if (out[0]) strncat(out, "|", cap - strlen(out) - 1);
        strncat(out, r->line[i] + strlen(prefix), cap - strlen(out) - 1);
    }
}

typedef struct world {
    hs_config cfg;
    hs_device *dev;
    hs_model *m;
    hs_fsdp *f;
    hs_fsdp_ctx *ctx;
    rec r;
} world;

static void world_up(world *w, bool ckpt) {
    memset(w, 0, sizeof *w);
    fx_config(&w->cfg);
    w->dev = fx_device();
    w->m = fx_model(&w->cfg, w->dev, false, HS_DTYPE_F32, ckpt);
    w->f = fx_wrap(&w->cfg, w->dev, w->m, 11);
    w->ctx = hs_fsdp_context(w->f);
    w->ctx->on_transition = record;
    w->ctx->transition_arg = &w->r;
}

static void world_down(world *w) {
    hs_fsdp_free(w->f);
    hs_model_free(w->m);
    hs_device_free(w->dev);
    hs_config_free(&w->cfg);
}

/* A world whose model has two activation slots (two micro-batches in
 * flight), prefetching forward_depth units ahead. */
static void world_up_slots(world *w, int forward_depth) {
    memset(w, 0, sizeof *w);
    fx_config(&w->cfg);
    w->cfg.fsdp.forward_prefetch_depth = forward_depth;
    w->dev = fx_device();
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = FX_B,
                           .seq_len = FX_T,
                           .dev = w->dev,
                           .act_slots = 2};
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_model_create(&w->cfg.model, &mo, &w->m, &e), HS_OK);
    w->f = fx_wrap(&w->cfg, w->dev, w->m, 11);
    w->ctx = hs_fsdp_context(w->f);
    w->ctx->on_transition = record;
    w->ctx->transition_arg = &w->r;
}

static void step(world *w, int salt) {
    int32_t tok[FX_B * FX_T], tgt[FX_B * FX_T];
    fx_batch(tok, tgt, w->cfg.model.vocab_size, salt);
    hs_batch b = {.tokens = tok, .targets = tgt, .B = FX_B, .T = FX_T};
    double loss, aux;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_model_forward_backward(w->m, &b, 1.0f / (FX_B * FX_T), hs_fsdp_hooks(w->f),
                                               &loss, &aux, &e),
                     HS_OK);
}

/* From the second step on, every buffer FSDP asks the device for (each
 * unshard's parameters, each backward's gradients and reduce input) comes
 * back from the device's caching allocator: as many allocations as step 2
 * in step 3, none of them a raw allocation. */
static void test_steps_after_the_first_make_no_raw_device_allocation(void **s) {
    (void)s;
    world w;
    world_up(&w, false);
    step(&w, 0);
    hs_mem_cache_stats a = hs_device_mem_stats(w.dev);
    step(&w, 1);
    hs_mem_cache_stats b = hs_device_mem_stats(w.dev);
    step(&w, 2);
    hs_mem_cache_stats c = hs_device_mem_stats(w.dev);
    print_message("device allocations per step after the first: %lld (%lld raw)\n",
                  (long long)(c.hits + c.misses - b.hits - b.misses),
                  (long long)(c.misses - b.misses));
    assert_true(b.hits > a.hits);
    assert_int_equal(b.misses, a.misses);
    assert_int_equal(c.misses, b.misses);
    assert_int_equal(c.hits - b.hits, b.hits - a.hits);
    assert_int_equal(c.in_use, b.in_use);
    world_down(&w);
}

static void test_forward_backward_follows_rfc_3_3_for_blocks_and_root(void **s) {
    (void)s;
    world w;
    world_up(&w, false);
    step(&w, 0);
    char story[1024];
    unit_story(&w.r, 1, story, sizeof story);
    assert_string_equal(story, "forward_pre: None -> PRE_FORWARD|forward: PRE_FORWARD -> FORWARD|"
                               "backward_pre: FORWARD -> PRE_BACKWARD|"
                               "backward: PRE_BACKWARD -> BACKWARD");
    unit_story(&w.r, 0, story, sizeof story);
    assert_string_equal(story, "forward_pre: None -> PRE_FORWARD|forward: PRE_FORWARD -> FORWARD|"
                               "backward_pre: FORWARD -> PRE_BACKWARD|"
                               "backward: PRE_BACKWARD -> BACKWARD|"
                               "root_backward_enter: BACKWARD -> BACKWARD|"
                               "root_backward_exit: BACKWARD -> BACKWARD");
    assert_false(hs_fsdp_ctx_pending(w.ctx));
    /* a second step starts again from BACKWARD */
    w.r.n = 0;
    step(&w, 1);
    unit_story(&w.r, 2, story, sizeof story);
    assert_string_equal(story,
                        "forward_pre: BACKWARD -> PRE_FORWARD|forward: PRE_FORWARD -> FORWARD|"
                        "backward_pre: FORWARD -> PRE_BACKWARD|"
                        "backward: PRE_BACKWARD -> BACKWARD");
    world_down(&w);
}

static void test_checkpoint_recompute_reenters_pre_forward_as_a_no_op(void **s) {
    (void)s;
    world w;
    world_up(&w, true);
    step(&w, 0);
    char story[1024];
    unit_story(&w.r, 1, story, sizeof story);
    assert_string_equal(story, "forward_pre: None -> PRE_FORWARD|forward: PRE_FORWARD -> FORWARD|"
                               "backward_pre: FORWARD -> PRE_BACKWARD|"
                               "forward_pre: PRE_BACKWARD -> PRE_BACKWARD|"
                               "forward: PRE_BACKWARD -> PRE_BACKWARD|"
                               "backward: PRE_BACKWARD -> BACKWARD");
    world_down(&w);
}

static void test_reentrant_recompute_runs_forward_pre_and_post_again_from_forward(void **s) {
    (void)s;
    world w;
    world_up(&w, false);
    hs_fsdp_ctx *c = w.ctx;
    hs_fsdp_hook_pre_forward(c, 0);
    hs_fsdp_hook_pre_forward(c, 1);
    hs_fsdp_hook_post_forward(c, 1);
    assert_null(c->units[1].params[0]->p->data); /* resharded after forward */
    hs_fsdp_hook_pre_forward(c, 1);              /* recompute under backward */
    assert_true(hs_fsdp_unit_is_unsharded(&c->units[1]));
    hs_fsdp_hook_post_forward(c, 1);
    hs_fsdp_hook_pre_backward(c, 1);
    hs_fsdp_hook_post_backward(c, 1);
    char story[1024];
    unit_story(&w.r, 1, story, sizeof story);
    assert_string_equal(story, "forward_pre: None -> PRE_FORWARD|forward: PRE_FORWARD -> FORWARD|"
                               "forward_pre: FORWARD -> PRE_FORWARD|"
                               "forward: PRE_FORWARD -> FORWARD|"
                               "backward_pre: FORWARD -> PRE_BACKWARD|"
                               "backward: PRE_BACKWARD -> BACKWARD");
    hs_fsdp_hook_post_backward_final(c); /* root never entered backward: no-op drain */
    world_down(&w);
}

static void test_post_backward_missed_by_a_unit_runs_from_the_root_then_drains(void **s) {
    (void)s;
    world w;
    world_up(&w, false);
    hs_fsdp_ctx *c = w.ctx;
    hs_fsdp_hook_pre_forward(c, 0);
    for (int u = 1; u <= 2; u++) {
        hs_fsdp_hook_pre_forward(c, u);
        hs_fsdp_hook_post_forward(c, u);
    }
    hs_fsdp_hook_post_forward(c, 0);
    hs_fsdp_hook_pre_backward(c, 0);
    hs_fsdp_hook_pre_backward(c, 2);
    hs_fsdp_hook_post_backward(c, 2);
    hs_fsdp_hook_pre_backward(c, 1);
    /* unit 1 has no differentiable input: its post_backward never comes */
    hs_fsdp_hook_post_backward(c, 0);
    assert_int_equal(c->units[1].state, HS_FSDP_STATE_PRE_BACKWARD);
    assert_true(hs_fsdp_ctx_pending(c));
    w.r.n = 0;
    hs_fsdp_hook_post_backward_final(c);
    assert_int_equal(w.r.n, 3);
    assert_string_equal(w.r.line[0], "0 root_backward_enter: BACKWARD -> BACKWARD");
    assert_string_equal(w.r.line[1], "1 backward: PRE_BACKWARD -> BACKWARD");
    assert_string_equal(w.r.line[2], "0 root_backward_exit: BACKWARD -> BACKWARD");
    assert_false(hs_fsdp_ctx_pending(c));
    assert_false(hs_fsdp_unit_is_unsharded(&c->units[1]));
    /* the drain is idempotent and safe on an empty queue: a second root
     * callback applies nothing twice */
    hs_fsdp_param *fp = c->units[1].params[0];
    float before = fp->sharded_grad[0];
    ((float *)fp->reduce_slot)[0] = 1.0f; /* would show up if the slot were applied again */
    hs_fsdp_hook_post_backward_final(c);
    assert_false(hs_fsdp_ctx_pending(c));
    assert_true(fp->sharded_grad[0] == before);
    world_down(&w);
}

/* The same model allocated the single-process way, with the wrap's seed. */
static hs_model *world_reference(world *w) {
    hs_model *ref = fx_model(&w->cfg, w->dev, true, HS_DTYPE_F32, false);
    hs_model_init_weights(ref, 11);
    return ref;
}

/* One micro-batch (fx_batch with `salt`) through the reference and then
 * through the wrapped model; their losses come back in l_ref and l_fsdp. */
static void step_both(world *w, hs_model *ref, int salt, float scale, double *l_ref,
                      double *l_fsdp) {
    int32_t tok[FX_B * FX_T], tgt[FX_B * FX_T];
    fx_batch(tok, tgt, w->cfg.model.vocab_size, salt);
    hs_batch b = {.tokens = tok, .targets = tgt, .B = FX_B, .T = FX_T};
    double aux;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_model_forward_backward(ref, &b, scale, NULL, l_ref, &aux, &e), HS_OK);
    assert_int_equal(
        hs_model_forward_backward(w->m, &b, scale, hs_fsdp_hooks(w->f), l_fsdp, &aux, &e), HS_OK);
}

/* Every reduced gradient equals the reference's bit for bit, and the
 * unsharded gradient buffers are released after the reduction. */
static void assert_reduced_grads_match(world *w, hs_model *ref) {
    hs_optim_param *op;
    int n = hs_fsdp_optim_params(w->f, &op);
    for (int i = 0; i < n; i++) {
        hs_param *rp = hs_model_param(ref, i);
        assert_memory_equal(op[i].grad, rp->grad, sizeof(float) * (size_t)op[i].numel);
        assert_null(w->ctx->params[i].unsharded_grad);
    }
}

static void test_gradients_through_fsdp_equal_the_single_process_model(void **s) {
    (void)s;
    world w;
    world_up(&w, false);
    hs_model *ref = world_reference(&w);
    double l1, l2;
    step_both(&w, ref, 3, 1.0f / (FX_B * FX_T), &l1, &l2);
    assert_true(l1 == l2);
    hs_optim_param *op;
    int n = hs_fsdp_optim_params(w.f, &op);
    assert_int_equal(n, hs_model_num_params(ref));
    assert_reduced_grads_match(&w, ref);
    for (int i = 0; i < n; i++) {
        hs_param *rp = hs_model_param(ref, i);
        assert_int_equal(op[i].numel, w.ctx->params[i].plan.unpacked_numel);
        assert_memory_equal(op[i].data, rp->data, sizeof(float) * (size_t)op[i].numel);
        assert_null(w.ctx->params[i].p->grad);
    }
    hs_model_free(ref);
    world_down(&w);
}

/* After zero_grads the sharded gradients are unset, not zeroed: whatever
 * they hold (NaN here) is never read. The next reduction stores over them,
 * bit for bit what adding into zeros gives, and a reader before any
 * reduction (the norm) sees zeros. */
static void test_zeroed_sharded_grads_are_stored_over_and_read_as_zeros(void **s) {
    (void)s;
    world w;
    world_up(&w, false);
    hs_model *ref = world_reference(&w);
    double l_ref, l_fsdp, norm = -1.0;
    step_both(&w, ref, 3, 1.0f / (FX_B * FX_T), &l_ref, &l_fsdp);
    hs_model_zero_grads(ref);
    hs_fsdp_zero_grads(w.f);
    for (int i = 0; i < w.ctx->n_params; i++) {
        hs_fsdp_param *fp = &w.ctx->params[i];
        assert_true(fp->sharded_grad_unset);
        for (int64_t j = 0; j < fp->plan.actual_sharded_numel; j++) fp->sharded_grad[j] = NAN;
    }
    step_both(&w, ref, 4, 1.0f / (FX_B * FX_T), &l_ref, &l_fsdp);
    assert_reduced_grads_match(&w, ref);
    hs_fsdp_zero_grads(w.f);
    for (int i = 0; i < w.ctx->n_params; i++) w.ctx->params[i].sharded_grad[0] = NAN;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_grad_norm(w.f, &norm, &e), HS_OK);
    assert_true(norm == 0.0);
    hs_model_free(ref);
    world_down(&w);
}

static void test_no_sync_micro_batches_accumulate_then_the_last_reduces_once(void **s) {
    (void)s;
    world w;
    world_up(&w, false);
    hs_model *ref = world_reference(&w);
    for (int mb = 0; mb < 2; mb++) {
        double l_ref, l_fsdp;
        hs_fsdp_set_micro_batch(w.f, false, false, mb == 1);
        step_both(&w, ref, 5 + mb, 1.0f / (2 * FX_B * FX_T), &l_ref, &l_fsdp);
        if (mb == 0) {
            /* nothing reduced yet; the unsharded grads stay alive */
            for (int i = 0; i < w.ctx->n_params; i++) {
                assert_non_null(w.ctx->params[i].unsharded_grad);
                assert_true(hs_sumsq_f32(w.ctx->params[i].sharded_grad,
                                         w.ctx->params[i].plan.actual_sharded_numel) == 0.0);
            }
        }
    }
    assert_reduced_grads_match(&w, ref);
    hs_model_free(ref);
    world_down(&w);
}

/* A pipeline stage's order (RFC 000 §8.2): two micro-batches forward in
 * their activation slots before either backward (F0 F1 B0 B1), reduced
 * once after the last backward; the schedule's forced drains after the
 * root's natural one apply nothing again. */
static void test_micro_batches_in_flight_reduce_once_and_drain_idempotently(void **s) {
    (void)s;
    world w;
    world_up_slots(&w, 0);
    hs_error e;
    hs_error_clear(&e);
    hs_model *ref = world_reference(&w);
    int32_t tok[2][FX_B * FX_T], tgt[2][FX_B * FX_T];
    hs_batch b[2];
    float scale = 1.0f / (2 * FX_B * FX_T);
    for (int k = 0; k < 2; k++) {
        fx_batch(tok[k], tgt[k], w.cfg.model.vocab_size, 21 + k);
        b[k] = (hs_batch){.tokens = tok[k], .targets = tgt[k], .B = FX_B, .T = FX_T};
        double loss, aux;
        assert_int_equal(hs_model_forward_backward(ref, &b[k], scale, NULL, &loss, &aux, &e),
                         HS_OK);
    }
    const hs_model_hooks *h = hs_fsdp_hooks(w.f);
    hs_fsdp_begin_step(w.f);
    for (int k = 0; k < 2; k++)
        assert_int_equal(
            hs_model_stage_forward(w.m, 0, k, &b[k], h, true, scale, NULL, NULL, NULL, &e), HS_OK);
    for (int k = 0; k < 2; k++) {
        hs_fsdp_set_micro_batch(w.f, false, false, k == 1);
        double loss;
        assert_int_equal(hs_model_stage_backward(w.m, 0, k, &b[k], scale, h, &loss, &e), HS_OK);
        if (k == 0) assert_false(hs_fsdp_ctx_pending(w.ctx));
    }
    char story[1024];
    unit_story(&w.r, 1, story, sizeof story);
    assert_string_equal(story,
                        "forward_pre: None -> PRE_FORWARD|forward: PRE_FORWARD -> FORWARD|"
                        "forward_pre: FORWARD -> PRE_FORWARD|forward: PRE_FORWARD -> FORWARD|"
                        "backward_pre: FORWARD -> PRE_BACKWARD|"
                        "backward: PRE_BACKWARD -> BACKWARD|"
                        "backward_pre: BACKWARD -> PRE_BACKWARD|"
                        "backward: PRE_BACKWARD -> BACKWARD");
    assert_reduced_grads_match(&w, ref);
    hs_fsdp_drain(w.f);
    hs_fsdp_drain(w.f);
    assert_reduced_grads_match(&w, ref);
    hs_model_free(ref);
    world_down(&w);
}

/* A pipeline names its next action (hs_model_hooks.next_chunk): the last
 * unit of a forward, whose own chunk has nothing left to prefetch, gathers
 * the first block of the next one (the root, already held, not counted),
 * and that forward's own hook finds it gathered; without a next action the
 * block stays resharded, and each unit's transitions are the same. */
static void test_the_last_unit_prefetches_the_next_actions_first_block(void **s) {
    (void)s;
    char story[2][1024];
    for (int hint = 0; hint < 2; hint++) {
        world w;
        world_up_slots(&w, 1);
        hs_error e;
        hs_error_clear(&e);
        int32_t tok[FX_B * FX_T], tgt[FX_B * FX_T];
        fx_batch(tok, tgt, w.cfg.model.vocab_size, 5);
        hs_batch b = {.tokens = tok, .targets = tgt, .B = FX_B, .T = FX_T};
        const hs_model_hooks *h = hs_fsdp_hooks(w.f);
        hs_fsdp_begin_step(w.f);
        h->next_chunk(h->ctx, hint ? 0 : -1, false);
        assert_int_equal(hs_model_stage_forward(w.m, 0, 0, &b, h, true, 1.0f, NULL, NULL, NULL, &e),
                         HS_OK);
        hs_fsdp_unit *first = &w.ctx->units[1], *last = &w.ctx->units[2];
        assert_int_equal(first->for_next, hint == 1);
        assert_false(last->for_next);
        assert_int_equal(first->params[0]->state != HS_FSDP_SHARDED, hint == 1);
        h->next_chunk(h->ctx, -1, false);
        assert_int_equal(hs_model_stage_forward(w.m, 0, 1, &b, h, true, 1.0f, NULL, NULL, NULL, &e),
                         HS_OK);
        assert_false(first->for_next);
        unit_story(&w.r, 1, story[hint], sizeof story[hint]);
        world_down(&w);
    }
    assert_string_equal(story[0], story[1]);
}

static void test_two_wrapped_models_keep_their_queues_apart(void **s) {
    (void)s;
    world a, b;
    world_up(&a, false);
    world_up(&b, false);
    hs_fsdp_ctx *ca = a.ctx, *cb = b.ctx;
    /* interleave the two models' hooks */
    hs_fsdp_hook_pre_forward(ca, 0);
    hs_fsdp_hook_pre_forward(cb, 0);
    hs_fsdp_hook_pre_forward(ca, 1);
    hs_fsdp_hook_post_forward(ca, 1);
    hs_fsdp_hook_pre_forward(cb, 1);
    hs_fsdp_hook_post_forward(cb, 1);
    hs_fsdp_hook_post_forward(ca, 0);
    hs_fsdp_hook_post_forward(cb, 0);
    hs_fsdp_hook_pre_backward(ca, 0);
    hs_fsdp_hook_pre_backward(ca, 1);
    hs_fsdp_hook_post_backward(ca, 1);
    hs_fsdp_hook_pre_backward(cb, 0);
    hs_fsdp_hook_pre_backward(cb, 1);
    hs_fsdp_hook_post_backward(cb, 1);
    hs_fsdp_hook_post_backward(cb, 0);
    assert_int_equal(ca->prev_unit, 1);
    assert_int_equal(cb->prev_unit, 0);
    hs_fsdp_hook_post_backward_final(cb);
    /* B's drain leaves A's pending reduction alone */
    assert_false(hs_fsdp_ctx_pending(cb));
    assert_true(hs_fsdp_ctx_pending(ca));
    assert_int_equal(ca->n_reduced, 1);
    assert_int_equal(a.r.n, 7);
    hs_fsdp_hook_post_backward(ca, 0);
    hs_fsdp_hook_post_backward_final(ca);
    assert_false(hs_fsdp_ctx_pending(ca));
    world_down(&a);
    world_down(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_backward_follows_rfc_3_3_for_blocks_and_root),
        cmocka_unit_test(test_steps_after_the_first_make_no_raw_device_allocation),
        cmocka_unit_test(test_checkpoint_recompute_reenters_pre_forward_as_a_no_op),
        cmocka_unit_test(test_reentrant_recompute_runs_forward_pre_and_post_again_from_forward),
        cmocka_unit_test(test_post_backward_missed_by_a_unit_runs_from_the_root_then_drains),
        cmocka_unit_test(test_gradients_through_fsdp_equal_the_single_process_model),
        cmocka_unit_test(test_zeroed_sharded_grads_are_stored_over_and_read_as_zeros),
        cmocka_unit_test(test_no_sync_micro_batches_accumulate_then_the_last_reduces_once),
        cmocka_unit_test(test_micro_batches_in_flight_reduce_once_and_drain_idempotently),
        cmocka_unit_test(test_the_last_unit_prefetches_the_next_actions_first_block),
        cmocka_unit_test(test_two_wrapped_models_keep_their_queues_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
