/* Shared pieces of the single-process model tests (dense and MoE): model
 * creation that fails the test with the library's message, the two-sequence
 * batch, bitwise gradient comparison, and an FSDP-like hook recorder that
 * binds a unit's parameters only between its pre and post hooks. */
#ifndef TESTS_UNIT_MODEL_FIXTURE_H
#define TESTS_UNIT_MODEL_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "hypershard/model.h"

/* Two sequences of 5; one ignored target to exercise target < 0. */
static const int32_t TOKENS[10] = {1, 5, 2, 9, 3, 0, 10, 4, 4, 7};
static const int32_t TARGETS[10] = {5, 2, 9, 3, 6, 10, 4, -1, 7, 8};

/* The tiny decoder every model test starts from: V=11, C=8, L=2, 2 heads. */
static inline hs_model_config mf_config(const char *arch, int n_kv_heads) {
    hs_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.arch, sizeof c.arch, "%s", arch);
    c.vocab_size = 11;
    c.dim = 8;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_heads = n_kv_heads;
    c.ffn_dim = 12;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.init_std = 0.3;
    return c;
}

/* Room for the TOKENS/TARGETS batch (B=2, T=5), parameters allocated. */
static inline hs_model_options mf_options(hs_dtype dt, bool ckpt) {
    hs_model_options o;
    memset(&o, 0, sizeof o);
    o.compute_dtype = dt;
    o.grad_dtype = dt;
    o.max_batch = 2;
    o.seq_len = 5;
    o.activation_checkpointing = ckpt;
    o.allocate_params = true;
    return o;
}

static inline hs_model *mf_make(const hs_model_config *c, const hs_model_options *o,
                                uint64_t seed) {
    hs_model *m = NULL;
    hs_error e;
    if (hs_model_create(c, o, &m, &e) != HS_OK) fail_msg("hs_model_create: %s", e.msg);
    hs_model_init_weights(m, seed);
    return m;
}

static inline int64_t mf_numel(const hs_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

/* One forward+backward of the TOKENS/TARGETS batch; fails the test on error. */
static inline void mf_step(hs_model *m, float scale, const hs_model_hooks *hooks, double *loss,
                           double *aux) {
    hs_batch b = {.tokens = TOKENS, .targets = TARGETS, .B = 2, .T = 5};
    hs_error e;
    *loss = 0.0;
    *aux = 0.0;
    if (hs_model_forward_backward(m, &b, scale, hooks, loss, aux, &e) != HS_OK)
        fail_msg("forward_backward: %s", e.msg);
}

/* Every fp32 gradient of a and b, bit for bit. */
static inline void mf_assert_grads_equal(hs_model *a, hs_model *b) {
    for (int i = 0; i < hs_model_num_params(a); i++)
        assert_memory_equal(hs_model_param(a, i)->grad, hs_model_param(b, i)->grad,
                            (size_t)mf_numel(hs_model_param(a, i)) * sizeof(float));
}

/* ------------------------------------------------------------------ hooks */

typedef struct mf_recorder {
    char log[1024];
    bool in_backward[8];
    hs_model *m;
    hs_model *shadow; /* owns the real buffers; params are NULL outside hooks */
} mf_recorder;

static inline void mf_rec(mf_recorder *r, const char *what, int u) {
    char buf[16];
    snprintf(buf, sizeof buf, u < 0 ? "%s " : "%s%d ", what, u);
    strncat(r->log, buf, sizeof r->log - strlen(r->log) - 1);
}

/* Point (or unpoint) a unit's params at the shadow model's buffers, as FSDP
 * does: the model must read pointers only after the unit's hook. */
static inline void mf_bind(mf_recorder *r, int u, bool on) {
    for (int i = 0; i < hs_model_num_params(r->m); i++) {
        hs_param *p = hs_model_param(r->m, i), *s = hs_model_param(r->shadow, i);
        if (p->unit != u) continue;
        p->data = on ? s->data : NULL;
        p->grad = on ? s->grad : NULL;
    }
}

/* Like FSDP, the forward hooks re-entered by recompute inside a unit's
 * backward keep its parameters in place. */
static inline void mf_pre_fwd(void *ctx, int u) {
    mf_rec(ctx, "F", u);
    mf_bind(ctx, u, true);
}

static inline void mf_post_fwd(void *ctx, int u) {
    mf_recorder *r = ctx;
    mf_rec(r, "f", u);
    if (!r->in_backward[u]) mf_bind(r, u, false);
}

static inline void mf_pre_bwd(void *ctx, int u) {
    mf_recorder *r = ctx;
    mf_rec(r, "B", u);
    mf_bind(r, u, true);
    r->in_backward[u] = true;
}

static inline void mf_post_bwd(void *ctx, int u) {
    mf_recorder *r = ctx;
    mf_rec(r, "b", u);
    mf_bind(r, u, false);
    r->in_backward[u] = false;
}

static inline void mf_final(void *ctx) { mf_rec(ctx, "END", -1); }

/* Runs one step through the recorder's hooks on a model created without
 * parameters, and one plain step on a reference with the same seed: the
 * hook log must read `want`, and loss, aux loss and every gradient must
 * equal the reference's bit for bit. */
static inline void mf_check_hooks(const hs_model_config *c, hs_model_options o, uint64_t seed,
                                  float scale, const char *want) {
    hs_model *ref = mf_make(c, &o, seed);
    mf_recorder r;
    memset(&r, 0, sizeof r);
    r.shadow = mf_make(c, &o, seed);
    o.allocate_params = false;
    hs_error e;
    assert_int_equal(hs_model_create(c, &o, &r.m, &e), HS_OK);
    hs_model_hooks hooks = {.ctx = &r,
                            .pre_forward = mf_pre_fwd,
                            .post_forward = mf_post_fwd,
                            .pre_backward = mf_pre_bwd,
                            .post_backward = mf_post_bwd,
                            .post_backward_final = mf_final};
    double want_loss, want_aux, got_loss, got_aux;
    mf_step(ref, scale, NULL, &want_loss, &want_aux);
    mf_step(r.m, scale, &hooks, &got_loss, &got_aux);
    assert_string_equal(r.log, want);
    assert_memory_equal(&want_loss, &got_loss, sizeof want_loss);
    assert_memory_equal(&want_aux, &got_aux, sizeof want_aux);
    mf_assert_grads_equal(ref, r.shadow);
    hs_model_free(ref);
    hs_model_free(r.shadow);
    hs_model_free(r.m);
}

#endif
