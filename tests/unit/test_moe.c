/* model/moe: routing, dispatch, aux loss, forward against a per-token
 * reference, gradients against finite differences, 16-bit against fp32. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "hypershard/base.h"
#include "hypershard/tensor.h"
#include "model/moe_layer.h"

/* The cpu device the layers compute on, created once for the whole run. */
static hs_device *cpu_dev(void) {
    static hs_device *d;
    hs_error e;
    if (!d && hs_device_create(HS_DEVICE_CPU, NULL, &d, &e) != HS_OK) fail_msg("%s", e.msg);
    return d;
}

enum { P_GATE, P_W1, P_W3, P_W2, P_SG, P_SU, P_SD, P_X, P_COUNT };

/* One problem: fp32 master values of every input and parameter. */
typedef struct problem {
    hs_moe_shapes s;
    float *v[P_COUNT];
    int64_t n[P_COUNT];
} problem;

static void problem_init(problem *p, hs_moe_shapes s, uint64_t seed, float gate_std) {
    memset(p, 0, sizeof *p);
    p->s = s;
    int64_t E = s.E, C = s.C, F = s.F, FS = s.FS;
    p->n[P_GATE] = E * C;
    p->n[P_W1] = p->n[P_W3] = p->n[P_W2] = E * F * C;
    p->n[P_SG] = p->n[P_SU] = p->n[P_SD] = FS * C;
    p->n[P_X] = (int64_t)s.BT * C;
    for (int i = 0; i < P_COUNT; i++) {
        p->v[i] = calloc((size_t)(p->n[i] ? p->n[i] : 1), sizeof(float));
        float std = i == P_GATE ? gate_std : i == P_X ? 1.0f : 0.4f;
        hs_rng_fill_normal(p->v[i], p->n[i], seed, (uint64_t)i + 1, 0, 0.0f, std);
    }
}

static void problem_free(problem *p) {
    for (int i = 0; i < P_COUNT; i++) free(p->v[i]);
}

/* Everything one forward + backward in one dtype needs. */
typedef struct runner {
    hs_dtype dt;
    hs_pool pool;
    void *v[P_COUNT]; /* inputs in dt */
    hs_moe_weights w;
    hs_moe_act act;
    void *act_mem, *scratch, *out;
    float *dx, *g[P_X];
} runner;

static void runner_init(runner *r, const problem *p, hs_dtype dt) {
    memset(r, 0, sizeof *r);
    r->dt = dt;
    hs_pool_init(&r->pool, "test");
    for (int i = 0; i < P_COUNT; i++) {
        r->v[i] = hs_pool_calloc(&r->pool, (size_t)(p->n[i] + 1) * hs_dtype_size(dt));
        hs_convert(r->v[i], dt, p->v[i], HS_DTYPE_F32, p->n[i]);
        if (i < P_X) r->g[i] = hs_pool_calloc(&r->pool, (size_t)(p->n[i] + 1) * sizeof(float));
    }
    r->w = (hs_moe_weights){r->v[P_GATE],
                            r->v[P_W1],
                            r->v[P_W3],
                            r->v[P_W2],
                            p->s.FS ? r->v[P_SG] : NULL,
                            p->s.FS ? r->v[P_SU] : NULL,
                            p->s.FS ? r->v[P_SD] : NULL,
                            NULL};
    r->act_mem = hs_pool_calloc(&r->pool, hs_moe_act_bytes(&p->s, dt));
    hs_moe_act_bind(&r->act, cpu_dev(), &p->s, dt, r->act_mem);
    r->act.offset_h = hs_pool_calloc(&r->pool, ((size_t)p->s.E + 1) * sizeof(int32_t));
    r->scratch = hs_pool_calloc(&r->pool, hs_moe_scratch_bytes(&p->s, dt));
    r->out = hs_pool_calloc(&r->pool, (size_t)p->n[P_X] * hs_dtype_size(dt));
    r->dx = hs_pool_calloc(&r->pool, (size_t)p->n[P_X] * sizeof(float));
}

static void runner_free(runner *r) {
    for (int i = 0; i < P_COUNT; i++) hs_pool_free(&r->pool, r->v[i]);
    for (int i = 0; i < P_X; i++) hs_pool_free(&r->pool, r->g[i]);
    hs_pool_free(&r->pool, r->act_mem);
    hs_pool_free(&r->pool, r->act.offset_h);
    hs_pool_free(&r->pool, r->scratch);
    hs_pool_free(&r->pool, r->out);
    hs_pool_free(&r->pool, r->dx);
    assert_int_equal(hs_pool_current(&r->pool), 0);
}

static void runner_forward(runner *r) {
    hs_moe_forward(r->out, &r->act, r->v[P_X], &r->w, r->act.cap.BT, r->scratch);
}

static hs_moe_grads runner_grads(runner *r) {
    return (hs_moe_grads){r->g[P_GATE],
                          r->g[P_W1],
                          r->g[P_W3],
                          r->g[P_W2],
                          r->act.cap.FS ? r->g[P_SG] : NULL,
                          r->act.cap.FS ? r->g[P_SU] : NULL,
                          r->act.cap.FS ? r->g[P_SD] : NULL,
                          HS_DTYPE_F32,
                          NULL};
}

/* Loss of the tests on an fp32 run: sum(out * R) + lam * aux (one layer). */
static double test_loss(runner *r, const float *R, double lam) {
    HS_ASSERT(r->dt == HS_DTYPE_F32);
    const float *out = r->out;
    double L = 0.0;
    for (int64_t i = 0; i < (int64_t)r->act.cap.BT * r->act.cap.C; i++) L += (double)R[i] * out[i];
    hs_moe_aux aux;
    hs_moe_aux_init(&aux, r->act.cap.E, r->act.cap.K, cpu_dev());
    hs_moe_aux_add(&aux, &r->act);
    L += lam * hs_moe_aux_value(&aux);
    hs_moe_aux_free(&aux);
    return L;
}

/* Forward, then backward of test_loss into r->g / r->dx. */
static void runner_forward_backward(runner *r, const float *R, double lam) {
    runner_forward(r);
    hs_moe_aux aux;
    float *g = calloc((size_t)r->act.cap.E, sizeof(float));
    hs_moe_aux_init(&aux, r->act.cap.E, r->act.cap.K, cpu_dev());
    hs_moe_aux_add(&aux, &r->act);
    hs_moe_aux_prob_grad(&aux, lam, g);
    hs_moe_grads gr = runner_grads(r);
    hs_moe_backward(r->dx, R, &gr, &r->act, r->v[P_X], &r->w, g, NULL, r->scratch);
    hs_moe_aux_free(&aux);
    free(g);
}

static hs_moe_shapes shapes(int BT, int C, int E, int K, int F, int FS) {
    return (hs_moe_shapes){
        BT, C, E, K, F, FS, E, false, {.renorm = true, .n_group = 1, .topk_group = 1, .scale = 1}};
}

/* ---------------------------------------------------------------- routing */

/* C == E and gate == I make the logits equal to x, so a test can write the
 * router input directly. */
static void identity_gate(problem *p) {
    memset(p->v[P_GATE], 0, (size_t)p->n[P_GATE] * sizeof(float));
    for (int e = 0; e < p->s.E; e++) p->v[P_GATE][e * p->s.C + e] = 1.0f;
}

static void test_top2_of_probs_1_2_2_4_picks_3_then_tied_lower_1_weights_2_3_and_1_3(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(2, 4, 4, 2, 3, 0), 1, 1.0f);
    identity_gate(&p);
    const float l2 = logf(2.0f), l4 = logf(4.0f);
    const float x[8] = {0.0f, l2, l2, l4, /* all equal: */ 0.5f, 0.5f, 0.5f, 0.5f};
    memcpy(p.v[P_X], x, sizeof x);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    runner_forward(&r);
    assert_int_equal(r.act.sel[0], 3);
    assert_int_equal(r.act.sel[1], 1);
    assert_float_equal(r.act.probs[0], 1.0f / 9.0f, 1e-6);
    assert_float_equal(r.act.probs[3], 4.0f / 9.0f, 1e-6);
    assert_float_equal(r.act.weight[0], 2.0f / 3.0f, 1e-6);
    assert_float_equal(r.act.weight[1], 1.0f / 3.0f, 1e-6);
    assert_int_equal(r.act.sel[2], 0);
    assert_int_equal(r.act.sel[3], 1);
    assert_float_equal(r.act.weight[2], 0.5f, 1e-7);
    assert_float_equal(r.act.weight[3], 0.5f, 1e-7);
    assert_int_equal(r.act.count[0], 1);
    assert_int_equal(r.act.count[1], 2);
    assert_int_equal(r.act.count[2], 0);
    assert_int_equal(r.act.count[3], 1);
    runner_free(&r);
    problem_free(&p);
}

static void test_grouped_rows_are_sorted_by_expert_then_token(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(3, 3, 3, 2, 2, 0), 2, 1.0f);
    identity_gate(&p);
    /* token 0 -> (2, 0), token 1 -> (0, 1), token 2 -> (2, 1) */
    const float x[9] = {1.0f, -3.0f, 2.0f, 2.0f, 1.0f, -3.0f, -3.0f, 1.0f, 2.0f};
    memcpy(p.v[P_X], x, sizeof x);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    runner_forward(&r);
    const int32_t offset[4] = {0, 2, 4, 6};
    /* pairs t*K+k: expert 0 gets (0,1)=1 and (1,0)=2; expert 1 (1,1)=3 and
     * (2,1)=5; expert 2 (0,0)=0 and (2,0)=4. */
    const int32_t row_pair[6] = {1, 2, 3, 5, 0, 4};
    for (int e = 0; e < 4; e++) assert_int_equal(r.act.offset[e], offset[e]);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(r.act.row_pair[i], row_pair[i]);
        assert_int_equal(r.act.pair_row[row_pair[i]], i);
    }
    runner_free(&r);
    problem_free(&p);
}

/* ---------------------------------------------------------------- aux loss */

static void aux_case_layer(runner *r, const float *x) {
    memcpy(r->v[P_X], x, 4 * sizeof(float));
    runner_forward(r);
}

static void test_aux_loss_one_layer_is_1_25_two_layers_concatenated_is_1_0(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(2, 2, 2, 1, 2, 0), 3, 1.0f);
    identity_gate(&p);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    const float l3 = logf(3.0f);
    hs_moe_aux aux;
    hs_moe_aux_init(&aux, 2, 1, cpu_dev());
    /* Layer 1: probs (.5,.5) (tie -> expert 0) and (.75,.25): f = (1, 0),
     * P = (.625, .375), value = 2 * .625 = 1.25. */
    const float x1[4] = {0.0f, 0.0f, l3, 0.0f};
    aux_case_layer(&r, x1);
    hs_moe_aux_add(&aux, &r.act);
    assert_true(fabs(hs_moe_aux_value(&aux) - 1.25) < 1e-6);
    float g[2];
    hs_moe_aux_prob_grad(&aux, 0.5, g); /* 0.5 * E * count / R^2 = (0.5, 0) */
    assert_float_equal(g[0], 0.5f, 1e-7);
    assert_float_equal(g[1], 0.0f, 0.0f);
    /* Layer 2: probs (.25,.75) twice: alone it would score 2 * .75 = 1.5.
     * Concatenated: f = (2/4, 2/4), P = (1.75/4, 2.25/4), value = 1.0 —
     * neither the sum (2.75) nor the mean (1.375) of per-layer losses. */
    const float x2[4] = {0.0f, l3, 0.0f, l3};
    aux_case_layer(&r, x2);
    hs_moe_aux_add(&aux, &r.act);
    assert_int_equal(aux.rows, 4);
    assert_true(fabs(hs_moe_aux_value(&aux) - 1.0) < 1e-6);
    hs_moe_aux_prob_grad(&aux, 1.0, g); /* E * 2 / 16 */
    assert_float_equal(g[0], 0.25f, 1e-7);
    assert_float_equal(g[1], 0.25f, 1e-7);
    hs_moe_aux_reset(&aux);
    assert_true(hs_moe_aux_value(&aux) == 0.0);
    hs_moe_aux_free(&aux);
    runner_free(&r);
    problem_free(&p);
}

/* -------------------------------------------------------- forward values */

static double silu_d(double v) { return v / (1.0 + exp(-v)); }

/* y[C] += wt * w2_e(silu(w1_e x) * (w3_e x)) in fp64, one token. */
static void ref_expert(double *y, double wt, const float *x, const float *w1, const float *w3,
                       const float *w2, int C, int F) {
    for (int f = 0; f < F; f++) {
        double h1 = 0.0, h3 = 0.0;
        for (int c = 0; c < C; c++) {
            h1 += (double)w1[f * C + c] * x[c];
            h3 += (double)w3[f * C + c] * x[c];
        }
        double a = silu_d(h1) * h3;
        for (int c = 0; c < C; c++) y[c] += wt * a * w2[c * F + f];
    }
}

/* Mixtral, one token at a time, fp64, no grouping. */
static void ref_forward(double *out, const problem *p, const int32_t *sel) {
    const int C = p->s.C, E = p->s.E, K = p->s.K, F = p->s.F, FS = p->s.FS;
    double prob[64];
    for (int t = 0; t < p->s.BT; t++) {
        const float *x = p->v[P_X] + t * C;
        double mx = -INFINITY, z = 0.0, zk = 0.0;
        for (int e = 0; e < E; e++) {
            prob[e] = 0.0;
            for (int c = 0; c < C; c++) prob[e] += (double)p->v[P_GATE][e * C + c] * x[c];
            if (prob[e] > mx) mx = prob[e];
        }
        for (int e = 0; e < E; e++) z += (prob[e] = exp(prob[e] - mx));
        for (int e = 0; e < E; e++) prob[e] /= z;
        for (int k = 0; k < K; k++) zk += prob[sel[t * K + k]];
        double *y = out + t * C;
        memset(y, 0, (size_t)C * sizeof(double));
        for (int k = 0; k < K; k++) {
            int e = sel[t * K + k];
            ref_expert(y, prob[e] / zk, x, p->v[P_W1] + e * F * C, p->v[P_W3] + e * F * C,
                       p->v[P_W2] + e * C * F, C, F);
        }
        if (FS) ref_expert(y, 1.0, x, p->v[P_SG], p->v[P_SU], p->v[P_SD], C, FS);
    }
}

static void test_forward_matches_per_token_fp64_reference_with_shared_expert(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(9, 8, 5, 2, 6, 7), 4, 1.0f);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    runner_forward(&r);
    double *ref = calloc((size_t)p.n[P_X], sizeof(double));
    ref_forward(ref, &p, r.act.sel);
    const float *out = r.out;
    for (int64_t i = 0; i < p.n[P_X]; i++)
        assert_true(fabs(out[i] - ref[i]) < 1e-4 * (1 + fabs(ref[i])));
    /* The selection is the reference's too: descending probability. */
    for (int t = 0; t < p.s.BT; t++) {
        const float *pr = r.act.probs + t * p.s.E;
        int32_t a = r.act.sel[t * 2], b = r.act.sel[t * 2 + 1];
        assert_true(pr[a] >= pr[b]);
        for (int e = 0; e < p.s.E; e++)
            if (e != a && e != b) assert_true(pr[e] <= pr[b]);
    }
    free(ref);
    runner_free(&r);
    problem_free(&p);
}

/* -------------------------------------------------------------- gradients */

static bool same_routing(const runner *r, const int32_t *sel) {
    return memcmp(r->act.sel, sel, (size_t)r->act.cap.BT * r->act.cap.K * sizeof(int32_t)) == 0;
}

/* The loss a finite-difference check differentiates. */
typedef double (*loss_fn)(runner *r, const void *ctx);

/* Central difference of loss at element j of input or parameter v, in
 * *fd; false when either side changed the routing (a flipped choice is a
 * step, not a slope). */
static bool central_difference(runner *r, float *v, int64_t j, double eps, const int32_t *sel,
                               loss_fn loss, const void *ctx, double *fd) {
    float keep = v[j];
    v[j] = keep + (float)eps;
    runner_forward(r);
    bool ok = same_routing(r, sel);
    double lp = loss(r, ctx);
    v[j] = keep - (float)eps;
    runner_forward(r);
    ok = ok && same_routing(r, sel);
    double lm = loss(r, ctx);
    v[j] = keep;
    *fd = (lp - lm) / (2 * eps);
    return ok;
}

typedef struct test_loss_ctx {
    const float *R;
    double lam;
} test_loss_ctx;

static double test_loss_of(runner *r, const void *ctx) {
    const test_loss_ctx *c = ctx;
    return test_loss(r, c->R, c->lam);
}

/* Central differences of test_loss against the backward for every input
 * and parameter of p (bias: the router's correction bias, or NULL). */
static void check_finite_differences(problem *pp, double lam, const float *bias) {
    problem p = *pp;
    const double eps = 1e-2;
    float *R = malloc((size_t)p.n[P_X] * sizeof(float));
    hs_rng_fill_normal(R, p.n[P_X], 99, 1, 0, 0.0f, 1.0f);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    r.w.bias = bias;
    runner_forward_backward(&r, R, lam);
    int32_t *sel = malloc((size_t)p.s.BT * p.s.K * sizeof *sel);
    memcpy(sel, r.act.sel, (size_t)p.s.BT * p.s.K * sizeof *sel);
    int checked = 0, skipped = 0;
    const test_loss_ctx ctx = {R, lam};
    for (int i = 0; i < P_COUNT; i++) {
        float *v = r.v[i]; /* fp32: the runner's copy is what forward reads */
        const float *an = i == P_X ? r.dx : r.g[i];
        for (int64_t j = 0; j < p.n[i]; j++) {
            double fd;
            if (!central_difference(&r, v, j, eps, sel, test_loss_of, &ctx, &fd)) {
                skipped++;
                continue;
            }
            if (fabs(fd - an[j]) > 5e-3 + 2e-2 * fabs(fd))
                fail_msg("param %d elem %lld: backward %.6f, finite difference %.6f", i,
                         (long long)j, an[j], fd);
            checked++;
        }
    }
    assert_true(skipped * 20 < checked);
    free(R);
    free(sel);
    runner_free(&r);
}

static void test_finite_differences_match_backward_router_experts_shared_and_aux(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(6, 8, 4, 2, 5, 3), 5, 0.7f);
    check_finite_differences(&p, 0.3, NULL);
    problem_free(&p);
}

/* DeepSeek-V3's router: sigmoid scores, 4 groups of 2 with 2 kept, weights
 * renormalised then times 2.5, a correction bias steering the choice: the
 * gradient through the sigmoid, the renormalisation and the scale (none
 * through the choice or the bias). */
static void test_finite_differences_match_backward_sigmoid_groups_scale_bias(void **st) {
    (void)st;
    problem p;
    hs_moe_shapes s = shapes(8, 8, 8, 3, 5, 3);
    s.router = (hs_moe_router){
        .sigmoid = true, .renorm = true, .n_group = 4, .topk_group = 2, .scale = 2.5f};
    problem_init(&p, s, 6, 0.7f);
    const float bias[8] = {0.05f, -0.1f, 0.2f, 0.0f, -0.05f, 0.1f, 0.0f, -0.2f};
    check_finite_differences(&p, 0.0, bias);
    p.s.router.renorm = false; /* the scores as they are, times the scale */
    check_finite_differences(&p, 0.0, bias);
    problem_free(&p);
}

/* Identity gate, logits = x. Groups {0,1} {2,3}; token 0: expert 3 is the
 * best alone (0.9) but group {0,1} sums more (0.6 + 0.7 against 0.9 -
 * 2.0), so with one group kept both choices come from it, ordered 1, 0,
 * weighted by their sigmoids over their sum times 2. Token 1: a bias of
 * +1 on expert 2 chooses it over a higher-scored expert 0 (groups off),
 * and its weight is its unbiased score's. */
static void test_sigmoid_router_keeps_the_best_group_and_the_bias_steers_only(void **st) {
    (void)st;
    problem p;
    hs_moe_shapes s = shapes(1, 4, 4, 2, 3, 0);
    s.router = (hs_moe_router){
        .sigmoid = true, .renorm = true, .n_group = 2, .topk_group = 1, .scale = 2.0f};
    problem_init(&p, s, 7, 1.0f);
    identity_gate(&p);
    const float x[4] = {0.6f, 0.7f, -2.0f, 0.9f};
    memcpy(p.v[P_X], x, sizeof x);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    runner_forward(&r);
    double s0 = 1.0 / (1.0 + exp(-0.6)), s1 = 1.0 / (1.0 + exp(-0.7));
    assert_int_equal(r.act.sel[0], 1);
    assert_int_equal(r.act.sel[1], 0);
    assert_float_equal(r.act.probs[3], 1.0 / (1.0 + exp(-0.9)), 1e-6);
    assert_float_equal(r.act.weight[0], 2.0 * s1 / (s0 + s1), 1e-6);
    assert_float_equal(r.act.weight[1], 2.0 * s0 / (s0 + s1), 1e-6);
    runner_free(&r);
    p.s.router.n_group = p.s.router.topk_group = 1;
    const float bias[4] = {0.0f, 0.0f, 1.0f, 0.0f}, y[4] = {0.8f, -1.0f, 0.1f, 0.5f};
    memcpy(p.v[P_X], y, sizeof y);
    runner_init(&r, &p, HS_DTYPE_F32);
    r.w.bias = bias;
    runner_forward(&r);
    double b0 = 1.0 / (1.0 + exp(-0.8)), b2 = 1.0 / (1.0 + exp(-0.1));
    assert_int_equal(r.act.sel[0], 2); /* 0.525 + 1 beats 0.690 */
    assert_int_equal(r.act.sel[1], 0);
    assert_float_equal(r.act.weight[0], 2.0 * b2 / (b0 + b2), 1e-6);
    assert_float_equal(r.act.weight[1], 2.0 * b0 / (b0 + b2), 1e-6);
    runner_free(&r);
    problem_free(&p);
}

/* ------------------------------------------- sequence-wise balance loss */

/* The term's value by its definition, in fp64 from the layer's scores and
 * choices: alpha / B sum_b sum_e f_e P_e over B sequences of T rows. */
static double seq_value_ref(const runner *r, int B, double alpha) {
    const int E = r->act.cap.E, K = r->act.cap.K, T = r->act.BT / B;
    double v = 0.0;
    for (int b = 0; b < B; b++)
        for (int e = 0; e < E; e++) {
            double n = 0.0, P = 0.0;
            for (int t = b * T; t < (b + 1) * T; t++) {
                double z = 0.0;
                for (int j = 0; j < E; j++) z += r->act.probs[t * E + j];
                P += r->act.probs[t * E + e] / z;
                for (int k = 0; k < K; k++) n += r->act.sel[t * K + k] == e;
            }
            v += (double)E / ((double)K * T) * n * (P / T);
        }
    return alpha * v / B;
}

typedef struct seq_ctx {
    int B;
    double alpha;
} seq_ctx;

static double seq_value_of(runner *r, const void *ctx) {
    const seq_ctx *c = ctx;
    return seq_value_ref(r, c->B, c->alpha);
}

/* Two sequences of 4 tokens, alpha 0.7: the value is the definition's;
 * the gradient it alone sends to the router and the input (the output's
 * weight R = 0) matches central differences of the value, through the
 * sigmoid (and groups) or the softmax. */
static void check_seq_loss(hs_moe_router router) {
    problem p;
    hs_moe_shapes s = shapes(8, 8, 8, 2, 5, 0);
    s.router = router;
    problem_init(&p, s, 8, 0.7f);
    const int B = 2;
    const double alpha = 0.7, eps = 1e-2;
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    float coef[2 * 8];
    void *host = malloc(hs_moe_seq_host_bytes(&s, B));
    hs_moe_seq q = {coef, host, B, 4, 1, B, 0};
    float *R = calloc((size_t)p.n[P_X], sizeof(float));
    runner_forward(&r);
    double v = hs_moe_seq_forward(&r.act, &q, NULL, alpha, 0);
    assert_true(fabs(v - seq_value_ref(&r, B, alpha)) <= 1e-6 * fabs(v));
    assert_true(v > 0.0);
    hs_moe_grads gr = runner_grads(&r);
    hs_moe_backward(r.dx, R, &gr, &r.act, r.v[P_X], &r.w, NULL, &q, r.scratch);
    int32_t sel[16];
    memcpy(sel, r.act.sel, sizeof sel);
    int checked = 0;
    const seq_ctx sc = {B, alpha};
    const int which[2] = {P_GATE, P_X};
    for (int w = 0; w < 2; w++) {
        int i = which[w];
        float *x = r.v[i];
        const float *an = i == P_X ? r.dx : r.g[i];
        for (int64_t j = 0; j < p.n[i]; j++) {
            double fd;
            if (!central_difference(&r, x, j, eps, sel, seq_value_of, &sc, &fd)) continue;
            if (fabs(fd - an[j]) > 1e-4 + 2e-2 * fabs(fd))
                fail_msg("param %d elem %lld: backward %.6f, finite difference %.6f", i,
                         (long long)j, an[j], fd);
            checked++;
        }
    }
    assert_true(checked > 60);
    free(host);
    free(R);
    runner_free(&r);
    problem_free(&p);
}

static void test_sequence_balance_loss_value_and_gradient(void **st) {
    (void)st;
    check_seq_loss((hs_moe_router){
        .sigmoid = true, .renorm = true, .n_group = 4, .topk_group = 2, .scale = 2.5f});
    check_seq_loss((hs_moe_router){.renorm = true, .n_group = 1, .topk_group = 1, .scale = 1});
}

/* Two stacked layers (x -> l1 -> l2): loss = sum(out2 * R) + lam * aux over
 * both layers' concatenated statistics. */
static double two_layer_loss(runner *l1, runner *l2, const float *R, double lam, hs_moe_aux *aux) {
    runner_forward(l1);
    memcpy(l2->v[P_X], l1->out, (size_t)l1->act.cap.BT * l1->act.cap.C * sizeof(float));
    runner_forward(l2);
    hs_moe_aux_reset(aux);
    hs_moe_aux_add(aux, &l1->act);
    hs_moe_aux_add(aux, &l2->act);
    const float *out = l2->out;
    double L = lam * hs_moe_aux_value(aux);
    for (int64_t i = 0; i < (int64_t)l2->act.cap.BT * l2->act.cap.C; i++)
        L += (double)R[i] * out[i];
    return L;
}

static void test_two_layer_aux_gradient_matches_finite_differences(void **st) {
    (void)st;
    problem p1, p2;
    problem_init(&p1, shapes(8, 6, 4, 2, 4, 0), 10, 0.8f);
    problem_init(&p2, shapes(8, 6, 4, 2, 4, 0), 11, 0.8f);
    const double lam = 2.0, eps = 3e-3;
    float *R = malloc((size_t)p1.n[P_X] * sizeof(float));
    hs_rng_fill_normal(R, p1.n[P_X], 12, 1, 0, 0.0f, 0.1f); /* aux dominates */
    runner l1, l2;
    runner_init(&l1, &p1, HS_DTYPE_F32);
    runner_init(&l2, &p2, HS_DTYPE_F32);
    hs_moe_aux aux;
    hs_moe_aux_init(&aux, 4, 2, cpu_dev());
    two_layer_loss(&l1, &l2, R, lam, &aux);
    float g[4];
    hs_moe_aux_prob_grad(&aux, lam, g);
    hs_moe_grads g1 = runner_grads(&l1), g2 = runner_grads(&l2);
    hs_moe_backward(l2.dx, R, &g2, &l2.act, l2.v[P_X], &l2.w, g, NULL, l2.scratch);
    hs_moe_backward(l1.dx, l2.dx, &g1, &l1.act, l1.v[P_X], &l1.w, g, NULL, l1.scratch);
    int32_t sel1[16], sel2[16];
    memcpy(sel1, l1.act.sel, sizeof sel1);
    memcpy(sel2, l2.act.sel, sizeof sel2);
    struct {
        float *v, *an;
        int64_t n;
    } checks[3] = {{l1.v[P_GATE], l1.g[P_GATE], p1.n[P_GATE]},
                   {l2.v[P_GATE], l2.g[P_GATE], p2.n[P_GATE]},
                   {l1.v[P_X], l1.dx, p1.n[P_X]}};
    int checked = 0;
    for (int c = 0; c < 3; c++)
        for (int64_t j = 0; j < checks[c].n; j++) {
            float keep = checks[c].v[j];
            checks[c].v[j] = keep + (float)eps;
            double lp = two_layer_loss(&l1, &l2, R, lam, &aux);
            bool ok = same_routing(&l1, sel1) && same_routing(&l2, sel2);
            checks[c].v[j] = keep - (float)eps;
            double lm = two_layer_loss(&l1, &l2, R, lam, &aux);
            ok = ok && same_routing(&l1, sel1) && same_routing(&l2, sel2);
            checks[c].v[j] = keep;
            if (!ok) continue;
            double fd = (lp - lm) / (2 * eps);
            if (fabs(fd - checks[c].an[j]) > 2e-3 + 2e-2 * fabs(fd))
                fail_msg("check %d elem %lld: backward %.6f, finite difference %.6f", c,
                         (long long)j, checks[c].an[j], fd);
            checked++;
        }
    /* Some steps flip a top-k choice somewhere in two layers; most must not. */
    assert_true(checked * 10 > (int)(p1.n[P_GATE] * 2 + p1.n[P_X]) * 9);
    hs_moe_aux_free(&aux);
    free(R);
    runner_free(&l2);
    runner_free(&l1);
    problem_free(&p2);
    problem_free(&p1);
}

static void test_aux_only_gradient_reaches_router_not_experts(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(5, 6, 4, 2, 3, 0), 6, 1.0f);
    float *R = calloc((size_t)p.n[P_X], sizeof(float)); /* no task loss */
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    runner_forward_backward(&r, R, 1.0);
    assert_true(hs_max_abs_f32(r.g[P_GATE], p.n[P_GATE]) > 1e-4f);
    assert_true(hs_max_abs_f32(r.dx, p.n[P_X]) > 1e-4f);
    for (int i = P_W1; i <= P_W2; i++) assert_true(hs_max_abs_f32(r.g[i], p.n[i]) == 0.0f);
    free(R);
    runner_free(&r);
    problem_free(&p);
}

static void test_expert_with_no_tokens_has_zero_grad_and_no_effect_on_output(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(6, 4, 4, 1, 3, 0), 7, 1.0f);
    identity_gate(&p);
    /* Logits favour experts 0 and 1; 2 and 3 receive no token. */
    for (int t = 0; t < 6; t++) {
        p.v[P_X][t * 4 + 0] = t % 2 ? 0.5f : 2.0f;
        p.v[P_X][t * 4 + 1] = t % 2 ? 2.0f : 0.5f;
        p.v[P_X][t * 4 + 2] = -1.0f - 0.1f * t;
        p.v[P_X][t * 4 + 3] = -2.0f;
    }
    float *R = malloc((size_t)p.n[P_X] * sizeof(float));
    hs_rng_fill_normal(R, p.n[P_X], 7, 7, 0, 0.0f, 1.0f);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    runner_forward_backward(&r, R, 0.1);
    assert_int_equal(r.act.count[2] + r.act.count[3], 0);
    const int64_t per = (int64_t)p.s.F * p.s.C;
    for (int i = P_W1; i <= P_W2; i++) {
        assert_true(hs_max_abs_f32(r.g[i], 2 * per) > 0.0f);
        assert_true(hs_max_abs_f32(r.g[i] + 2 * per, 2 * per) == 0.0f);
    }
    /* Changing an unused expert changes neither the output nor dx. */
    float *out0 = malloc((size_t)p.n[P_X] * sizeof(float));
    float *dx0 = malloc((size_t)p.n[P_X] * sizeof(float));
    memcpy(out0, r.out, (size_t)p.n[P_X] * sizeof(float));
    memcpy(dx0, r.dx, (size_t)p.n[P_X] * sizeof(float));
    for (int i = P_W1; i <= P_W2; i++) ((float *)r.v[i])[2 * per + 1] += 5.0f;
    memset(r.dx, 0, (size_t)p.n[P_X] * sizeof(float));
    runner_forward_backward(&r, R, 0.1);
    assert_memory_equal(out0, r.out, (size_t)p.n[P_X] * sizeof(float));
    assert_memory_equal(dx0, r.dx, (size_t)p.n[P_X] * sizeof(float));
    free(out0);
    free(dx0);
    free(R);
    runner_free(&r);
    problem_free(&p);
}

static void test_backward_accumulates_into_dx_and_grads(void **st) {
    (void)st;
    problem p;
    problem_init(&p, shapes(4, 6, 3, 2, 4, 2), 8, 1.0f);
    float *R = malloc((size_t)p.n[P_X] * sizeof(float));
    hs_rng_fill_normal(R, p.n[P_X], 8, 8, 0, 0.0f, 1.0f);
    runner r;
    runner_init(&r, &p, HS_DTYPE_F32);
    runner_forward_backward(&r, R, 0.2);
    float *once[P_COUNT];
    for (int i = 0; i < P_COUNT; i++) {
        const float *src = i == P_X ? r.dx : r.g[i];
        once[i] = malloc((size_t)(p.n[i] + 1) * sizeof(float));
        memcpy(once[i], src, (size_t)p.n[i] * sizeof(float));
    }
    runner_forward_backward(&r, R, 0.2);
    for (int i = 0; i < P_COUNT; i++) {
        const float *twice = i == P_X ? r.dx : r.g[i];
        for (int64_t j = 0; j < p.n[i]; j++)
            assert_float_equal(twice[j], 2.0f * once[i][j], 1e-5 * (1 + fabs(once[i][j])));
        free(once[i]);
    }
    free(R);
    runner_free(&r);
    problem_free(&p);
}

/* ----------------------------------------------------------- 16-bit vs fp32 */

/* max |a - b| over max |b|: one number per tensor. */
static double rel_err(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(a[i] - b[i]) > d) d = fabs(a[i] - b[i]);
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return d / (m > 0 ? m : 1);
}

static void half_vs_fp32(hs_dtype dt, double tol) {
    problem p;
    problem_init(&p, shapes(16, 32, 4, 2, 24, 16), 9, 1.0f);
    /* Both runs see the same 16-bit-representable inputs. */
    for (int i = 0; i < P_COUNT; i++)
        for (int64_t j = 0; j < p.n[i]; j++) p.v[i][j] = hs_round_to(dt, p.v[i][j]);
    float *R = malloc((size_t)p.n[P_X] * sizeof(float));
    hs_rng_fill_normal(R, p.n[P_X], 9, 9, 0, 0.0f, 1.0f);
    runner r32, r16;
    runner_init(&r32, &p, HS_DTYPE_F32);
    runner_init(&r16, &p, dt);
    runner_forward_backward(&r32, R, 0.1);
    runner_forward_backward(&r16, R, 0.1);
    int pairs = p.s.BT * p.s.K, agree = 0;
    for (int i = 0; i < pairs; i++) agree += r32.act.sel[i] == r16.act.sel[i];
    assert_int_equal(agree, pairs);
    float *out16 = malloc((size_t)p.n[P_X] * sizeof(float));
    hs_convert(out16, HS_DTYPE_F32, r16.out, dt, p.n[P_X]);
    double e_out = rel_err(out16, r32.out, p.n[P_X]);
    double e_dx = rel_err(r16.dx, r32.dx, p.n[P_X]);
    print_message("%s vs fp32: out %.2e dx %.2e", hs_dtype_name(dt), e_out, e_dx);
    assert_true(e_out < tol && e_dx < tol);
    for (int i = 0; i < P_X; i++) {
        double e = rel_err(r16.g[i], r32.g[i], p.n[i]);
        print_message(" g%d %.2e", i, e);
        assert_true(e < tol);
    }
    print_message("\n");
    free(out16);
    free(R);
    runner_free(&r16);
    runner_free(&r32);
    problem_free(&p);
}

static void test_bf16_within_2_percent_of_fp32(void **st) {
    (void)st;
    half_vs_fp32(HS_DTYPE_BF16, 2e-2);
}

static void test_f16_within_half_percent_of_fp32(void **st) {
    (void)st;
    half_vs_fp32(HS_DTYPE_F16, 5e-3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top2_of_probs_1_2_2_4_picks_3_then_tied_lower_1_weights_2_3_and_1_3),
        cmocka_unit_test(test_grouped_rows_are_sorted_by_expert_then_token),
        cmocka_unit_test(test_aux_loss_one_layer_is_1_25_two_layers_concatenated_is_1_0),
        cmocka_unit_test(test_forward_matches_per_token_fp64_reference_with_shared_expert),
        cmocka_unit_test(test_finite_differences_match_backward_router_experts_shared_and_aux),
        cmocka_unit_test(test_finite_differences_match_backward_sigmoid_groups_scale_bias),
        cmocka_unit_test(test_sigmoid_router_keeps_the_best_group_and_the_bias_steers_only),
        cmocka_unit_test(test_sequence_balance_loss_value_and_gradient),
        cmocka_unit_test(test_two_layer_aux_gradient_matches_finite_differences),
        cmocka_unit_test(test_aux_only_gradient_reaches_router_not_experts),
        cmocka_unit_test(test_expert_with_no_tokens_has_zero_grad_and_no_effect_on_output),
        cmocka_unit_test(test_backward_accumulates_into_dx_and_grads),
        cmocka_unit_test(test_bf16_within_2_percent_of_fp32),
        cmocka_unit_test(test_f16_within_half_percent_of_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
