/* Muon: Newton-Schulz output against a plain double-precision loop and its
 * singular values; momentum and Nesterov; the sqrt(max(1, rows/cols))
 * scale; decoupled decay; AdamW for non-matrix params; per-expert
 * orthogonalisation of [E, rows, cols] tensors; row shards that gather
 * the whole matrix's direction. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/cpu_kernels.h"
#include "hypershard/optim.h"
#include "optim_fixture.h"

static void fill_gauss(float *x, int64_t n, uint64_t seed) {
    hs_rng_fill_normal(x, n, seed, 99, 0, 0.0f, 1.0f);
}

/* NS5 written independently: element loops in double on the matrix as
 * given, using X^T X (cols x cols) when tall; a poly in the small Gram
 * matrix applied from the matching side gives the same iterate. */
static void ns5_reference(double *x, const float *g, int r, int c, int steps) {
    double fro = 0;
    for (int i = 0; i < r * c; i++) fro += (double)g[i] * g[i];
    for (int i = 0; i < r * c; i++) x[i] = g[i] / (sqrt(fro) + 1e-7);
    bool tall = r > c;
    int n = tall ? c : r;
    double *A = calloc((size_t)(n * n), sizeof *A), *P = calloc((size_t)(n * n), sizeof *P);
    double *nx = calloc((size_t)(r * c), sizeof *nx);
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double acc = 0;
                for (int k = 0; k < (tall ? r : c); k++)
                    acc += tall ? x[k * c + i] * x[k * c + j] : x[i * c + k] * x[j * c + k];
                A[i * n + j] = acc;
            }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double aa = 0;
                for (int k = 0; k < n; k++) aa += A[i * n + k] * A[k * n + j];
                P[i * n + j] = -4.7750 * A[i * n + j] + 2.0315 * aa;
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) {
                double acc = 0;
                for (int k = 0; k < n; k++)
                    acc += tall ? x[i * c + k] * P[k * n + j] : P[i * n + k] * x[k * c + j];
                nx[i * c + j] = 3.4445 * x[i * c + j] + acc;
            }
        memcpy(x, nx, sizeof *x * (size_t)(r * c));
    }
    free(A), free(P), free(nx);
}

/* Eigenvalues of a symmetric n x n matrix (cyclic Jacobi), into w. */
static void jacobi_eigenvalues(double *a, int n, double *w) {
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) off += a[i * n + j] * a[i * n + j];
        if (off < 1e-22) break;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) {
                if (fabs(a[p * n + q]) < 1e-300) continue;
                double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
                double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1));
                double cs = 1 / sqrt(t * t + 1), sn = t * cs;
                for (int k = 0; k < n; k++) {
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = cs * akp - sn * akq;
                    a[k * n + q] = sn * akp + cs * akq;
                }
                for (int k = 0; k < n; k++) {
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = cs * apk - sn * aqk;
                    a[q * n + k] = sn * apk + cs * aqk;
                }
            }
    }
    for (int i = 0; i < n; i++) w[i] = a[i * n + i];
}

/* Singular values of a rows x cols fp32 matrix via the small Gram matrix. */
static void singular_range(const float *x, int r, int c, double *lo, double *hi) {
    int n = r < c ? r : c;
    double *gram = calloc((size_t)(n * n), sizeof *gram), *w = calloc((size_t)n, sizeof *w);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int k = 0; k < (r < c ? c : r); k++)
                acc += r < c ? (double)x[i * c + k] * x[j * c + k]
                             : (double)x[k * c + i] * x[k * c + j];
            gram[i * n + j] = acc;
        }
    jacobi_eigenvalues(gram, n, w);
    *lo = INFINITY, *hi = 0;
    for (int i = 0; i < n; i++) {
        double s = sqrt(fmax(w[i], 0));
        *lo = fmin(*lo, s), *hi = fmax(*hi, s);
    }
    free(gram), free(w);
}

static void test_ns5_matches_double_reference_wide_and_tall(void **state) {
    (void)state;
    const int shapes[][2] = {{5, 9}, {9, 5}, {6, 6}};
    for (int s = 0; s < 3; s++) {
        int r = shapes[s][0], c = shapes[s][1];
        float g[81], out[81];
        double ref[81];
        fill_gauss(g, r * c, 3 + s);
        hs_newton_schulz5(out, g, r, c, 5, NULL, NULL);
        ns5_reference(ref, g, r, c, 5);
        for (int i = 0; i < r * c; i++)
            if (fabs(out[i] - ref[i]) > 2e-4)
                fail_msg("%dx%d [%d]: %g vs reference %g", r, c, i, (double)out[i], ref[i]);
    }
}

static void test_ns5_singular_values_of_random_32x64_lie_in_0_6_to_1_2(void **state) {
    (void)state;
    enum { R = 32, C = 64 };
    float *g = malloc(R * C * sizeof *g), *o = malloc(R * C * sizeof *o);
    float *scratch = malloc((size_t)hs_newton_schulz5_scratch_floats(R, C) * sizeof *scratch);
    fill_gauss(g, R * C, 11);
    double glo, ghi, lo, hi;
    singular_range(g, R, C, &glo, &ghi);
    hs_newton_schulz5(o, g, R, C, 5, scratch, NULL);
    singular_range(o, R, C, &lo, &hi);
    if (!(lo > 0.6 && hi < 1.2))
        fail_msg("singular values of NS5(G) in [%g, %g], want within [0.6, 1.2] (G: [%g, %g])", lo,
                 hi, glo, ghi);
    /* The tall orientation takes the transposed path and must agree. */
    float *gt = malloc(R * C * sizeof *gt), *ot = malloc(R * C * sizeof *ot);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) gt[j * R + i] = g[i * C + j];
    hs_newton_schulz5(ot, gt, C, R, 5, scratch, NULL);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) assert_true(fabsf(ot[j * R + i] - o[i * C + j]) < 1e-5f);
    free(g), free(o), free(gt), free(ot), free(scratch);
}

static hs_optim_config muon_config(double wd, bool nesterov) {
    hs_optim_config c = of_config("muon", 0.02, 0.95, wd, "cosine");
    c.muon.nesterov = nesterov;
    return c;
}

static hs_optim_param matrix(const char *fqn, void *data, float *grad, int r, int c, bool decay) {
    hs_optim_param p = {.fqn = fqn,
                        .data = data,
                        .dtype = HS_DTYPE_F32,
                        .grad = grad,
                        .numel = (int64_t)r * c,
                        .rows = r,
                        .cols = c,
                        .decay = decay,
                        .muon = true};
    return p;
}

/* Two steps: m1 = g1, m2 = mu*g1 + g2; the second update is
 * -lr * scale * NS5(g2 + mu*m2) with Nesterov, -lr * scale * NS5(m2) without. */
static void check_momentum(bool nesterov) {
    enum { R = 8, C = 4 }; /* tall: scale sqrt(2) */
    float p[R * C], g1[R * C], g2[R * C], g[R * C], before[R * C], u[R * C];
    double ref[R * C];
    fill_gauss(p, R * C, 1), fill_gauss(g1, R * C, 2), fill_gauss(g2, R * C, 3);
    hs_optim_config cfg = muon_config(0.0, nesterov);
    hs_optim_param prm = matrix("w", p, g, R, C, true);
    hs_optim *o = of_create(&cfg, &prm, 1, NULL);
    assert_int_equal(hs_optim_state_count(o, 0), 1);
    assert_string_equal(hs_optim_state_name(o, 0, 0), "momentum_buffer");
    memcpy(g, g1, sizeof g);
    hs_optim_step(o, 0.02, NULL);
    memcpy(g, g2, sizeof g);
    memcpy(before, p, sizeof p);
    hs_optim_step(o, 0.02, NULL);
    const float *m = hs_optim_state_data(o, 0, 0);
    for (int i = 0; i < R * C; i++) {
        assert_true(fabsf(m[i] - (0.95f * g1[i] + g2[i])) < 1e-6f);
        u[i] = nesterov ? g2[i] + 0.95f * m[i] : m[i];
    }
    ns5_reference(ref, u, R, C, 5);
    for (int i = 0; i < R * C; i++) {
        double want = before[i] - 0.02 * sqrt(2.0) * ref[i];
        if (fabs(p[i] - want) > 1e-5)
            fail_msg("nesterov=%d [%d]: %g want %g", nesterov, i, (double)p[i], want);
    }
    hs_optim_free(o);
}

static void test_momentum_and_nesterov_directions(void **state) {
    (void)state;
    check_momentum(true);
    check_momentum(false);
}

/* A wide matrix gets scale 1, a tall one sqrt(rows/cols); decay multiplies
 * by 1 - lr*wd first. With one step, m = g and u = g(1 + mu): same NS5. */
static void test_scale_is_sqrt_max_1_rows_over_cols_and_decay_is_decoupled(void **state) {
    (void)state;
    float wide[2 * 8], tall[8 * 2], gw[16], gt[16], w0[16], t0[16], ow[16], ot[16];
    fill_gauss(wide, 16, 4), fill_gauss(tall, 16, 5), fill_gauss(gw, 16, 6);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 8; j++) gt[j * 2 + i] = gw[i * 8 + j];
    memcpy(w0, wide, sizeof w0), memcpy(t0, tall, sizeof t0);
    hs_optim_config cfg = muon_config(0.5, true);
    hs_optim_param ps[2] = {matrix("wide", wide, gw, 2, 8, true),
                            matrix("tall", tall, gt, 8, 2, true)};
    hs_optim *o = of_create(&cfg, ps, 2, NULL);
    hs_optim_step(o, 0.02, NULL);
    hs_newton_schulz5(ow, gw, 2, 8, 5, NULL, NULL);
    hs_newton_schulz5(ot, gt, 8, 2, 5, NULL, NULL);
    for (int i = 0; i < 16; i++) {
        assert_true(fabs(wide[i] - (w0[i] * (1 - 0.02 * 0.5) - 0.02 * 1.0 * ow[i])) < 1e-6);
        assert_true(fabs(tall[i] - (t0[i] * (1 - 0.02 * 0.5) - 0.02 * 2.0 * ot[i])) < 1e-6);
    }
    hs_optim_free(o);
}

/* In a Muon optimizer a norm weight (muon = false) follows AdamW with the
 * config's betas and eps, bit for bit what an AdamW optimizer does. */
static void test_non_matrix_params_use_adamw_with_config_betas(void **state) {
    (void)state;
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 4, 5, 6};
    float g[6] = {0.3f, -0.1f, 0.2f, 0.5f, -0.7f, 0.05f};
    hs_optim_config mc = muon_config(0.1, true), ac = mc;
    strcpy(ac.target, "adamw");
    hs_optim_param pa = {.fqn = "model.norm.weight",
                         .data = a,
                         .dtype = HS_DTYPE_F32,
                         .grad = g,
                         .numel = 6,
                         .rows = 6,
                         .cols = 1,
                         .decay = false,
                         .muon = false};
    hs_optim_param pb = pa;
    pb.data = b;
    hs_optim *om = of_create(&mc, &pa, 1, NULL);
    hs_optim *oa = of_create(&ac, &pb, 1, NULL);
    for (int s = 0; s < 3; s++) hs_optim_step(om, 0.02, NULL), hs_optim_step(oa, 0.02, NULL);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(hs_optim_state_count(om, 0), 2);
    assert_string_equal(hs_optim_state_name(om, 0, 1), "exp_avg_sq");
    hs_optim_free(om), hs_optim_free(oa);
}

/* An [E=3, 4, 6] expert tensor with rows=4, cols=6: each expert matrix is
 * orthogonalised on its own, as if it were a separate param. */
static void test_expert_tensor_orthogonalises_each_matrix_alone(void **state) {
    (void)state;
    enum { E = 3, R = 4, C = 6, M = R * C };
    float all[E * M], g[E * M], single[E][M];
    fill_gauss(all, E * M, 7), fill_gauss(g, E * M, 8);
    for (int x = 0; x < E; x++) memcpy(single[x], all + x * M, sizeof single[x]);
    hs_optim_config cfg = muon_config(0.0, true);
    hs_optim_param batched = matrix("experts", all, g, R, C, true);
    batched.numel = E * M;
    hs_optim_param alone[E];
    for (int x = 0; x < E; x++) alone[x] = matrix("expert", single[x], g + x * M, R, C, true);
    hs_optim *ob = of_create(&cfg, &batched, 1, NULL);
    hs_optim *oa = of_create(&cfg, alone, E, NULL);
    hs_optim_step(ob, 0.02, NULL), hs_optim_step(oa, 0.02, NULL);
    for (int x = 0; x < E; x++) assert_memory_equal(all + x * M, single[x], sizeof single[x]);
    hs_optim_free(ob), hs_optim_free(oa);
}

/* A bf16 matrix takes the same fp32 update as an fp32 copy and is rounded
 * once at the end. */
static void test_bf16_matrix_is_rounded_once_from_the_fp32_update(void **state) {
    (void)state;
    enum { R = 6, C = 10 };
    float p32[R * C], g[R * C];
    uint16_t p16[R * C];
    fill_gauss(p32, R * C, 21), fill_gauss(g, R * C, 22);
    for (int i = 0; i < R * C; i++) p32[i] = hs_round_to(HS_DTYPE_BF16, p32[i]);
    hs_convert(p16, HS_DTYPE_BF16, p32, HS_DTYPE_F32, R * C);
    hs_optim_config cfg = muon_config(0.1, true);
    hs_optim_param a = matrix("f32", p32, g, R, C, true), b = matrix("bf16", p16, g, R, C, true);
    b.dtype = HS_DTYPE_BF16;
    hs_optim *oa = of_create(&cfg, &a, 1, NULL);
    hs_optim *ob = of_create(&cfg, &b, 1, NULL);
    hs_optim_step(oa, 0.02, NULL), hs_optim_step(ob, 0.02, NULL);
    for (int i = 0; i < R * C; i++) assert_int_equal(p16[i], hs_f32_to_bf16(p32[i]));
    hs_optim_free(oa), hs_optim_free(ob);
}

static void test_muon_param_with_wrong_shape_is_rejected_naming_fqn(void **state) {
    (void)state;
    float d[10] = {0}, g[10] = {0};
    hs_optim_config cfg = muon_config(0.0, true);
    hs_optim_param p = matrix("model.layers.1.mlp.up_proj.weight", d, g, 3, 3, true);
    p.numel = 10;
    hs_optim *o = NULL;
    hs_error e;
    assert_int_not_equal(hs_optim_create(&cfg, &p, 1, NULL, NULL, &o, &e), HS_OK);
    assert_null(o);
    assert_non_null(strstr(e.msg, "model.layers.1.mlp.up_proj.weight"));
    assert_non_null(strstr(e.msg, "3 x 3"));
}

/* A stand-in for the FSDP all-gather: the other holders' rows come from
 * the whole direction the test computed; this holder's rows must be what it
 * passes in. */
typedef struct fake_gather {
    const float *whole_u; /* R x C */
    int64_t rows, cols, offset;
    int calls;
    bool local_matches;
} fake_gather;

static hs_status fake_all_gather_rows(void *ctx, const float *local, float *full, hs_error *e) {
    (void)e;
    fake_gather *g = ctx;
    g->calls++;
    int64_t c = g->cols;
    g->local_matches =
        memcmp(local, g->whole_u + g->offset * c, (size_t)(g->rows * c) * sizeof(float)) == 0;
    memcpy(full, g->whole_u, (size_t)(5 * c) * sizeof(float));
    memcpy(full + g->offset * c, local, (size_t)(g->rows * c) * sizeof(float));
    return HS_OK;
}

/* A tall 5 x 3 matrix in torch.chunk row shards over 4 holders (2/2/1/0):
 * each shard's step, with the whole matrix's direction gathered, equals
 * its rows of the whole-matrix step bit for bit (scale sqrt(5/3) from the
 * full shape, decay on the local rows); the empty shard still gathers and
 * keeps Muon's state. */
static void test_row_shards_with_gather_match_the_whole_matrix_bit_for_bit(void **state) {
    (void)state;
    enum { R = 5, C = 3, W = 4, CHUNK = 2 };
    float whole[R * C], g[R * C], u[R * C], shard[R * C];
    fill_gauss(whole, R * C, 31), fill_gauss(g, R * C, 32);
    memcpy(shard, whole, sizeof shard);
    hs_optim_config cfg = muon_config(0.1, true);
    /* first step: m = g, u = g + mu * m, in the optimizer's fp32 order */
    for (int i = 0; i < R * C; i++) u[i] = g[i] + (float)cfg.muon.momentum * g[i];
    hs_optim_param wp = matrix("w", whole, g, R, C, true);
    hs_optim *ow = of_create(&cfg, &wp, 1, NULL);
    hs_optim_step(ow, 0.02, NULL);
    for (int r = 0; r < W; r++) {
        int64_t off = r * CHUNK < R ? r * CHUNK : R, rows = R - off < CHUNK ? R - off : CHUNK;
        fake_gather fg = {.whole_u = u, .rows = rows, .cols = C, .offset = off};
        hs_optim_param sp = matrix("w", shard + off * C, g + off * C, (int)rows, C, true);
        sp.gather = (hs_optim_gather){.ctx = &fg,
                                      .full_rows = R,
                                      .row_offset = off,
                                      .buffer_rows = W * CHUNK,
                                      .all_gather_rows = fake_all_gather_rows};
        hs_optim *os = of_create(&cfg, &sp, 1, NULL);
        assert_string_equal(hs_optim_state_name(os, 0, 0), "momentum_buffer");
        hs_optim_step(os, 0.02, NULL);
        assert_int_equal(fg.calls, 1);
        assert_true(fg.local_matches);
        hs_optim_free(os);
    }
    assert_memory_equal(shard, whole, sizeof whole);
    hs_optim_free(ow);
}

static void test_row_shard_outside_its_matrix_is_rejected_naming_fqn(void **state) {
    (void)state;
    float d[6] = {0}, g[6] = {0};
    hs_optim_config cfg = muon_config(0.0, true);
    hs_optim_param p = matrix("model.layers.0.self_attn.q_proj.weight", d, g, 2, 3, true);
    p.gather = (hs_optim_gather){
        .full_rows = 5, .row_offset = 4, .buffer_rows = 6, .all_gather_rows = fake_all_gather_rows};
    hs_optim *o = NULL;
    hs_error e;
    assert_int_not_equal(hs_optim_create(&cfg, &p, 1, NULL, NULL, &o, &e), HS_OK);
    assert_null(o);
    assert_non_null(strstr(e.msg, "model.layers.0.self_attn.q_proj.weight"));
    assert_non_null(strstr(e.msg, "rows [4, +2) inside the 5 full rows"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ns5_matches_double_reference_wide_and_tall),
        cmocka_unit_test(test_ns5_singular_values_of_random_32x64_lie_in_0_6_to_1_2),
        cmocka_unit_test(test_momentum_and_nesterov_directions),
        cmocka_unit_test(test_scale_is_sqrt_max_1_rows_over_cols_and_decay_is_decoupled),
        cmocka_unit_test(test_non_matrix_params_use_adamw_with_config_betas),
        cmocka_unit_test(test_expert_tensor_orthogonalises_each_matrix_alone),
        cmocka_unit_test(test_bf16_matrix_is_rounded_once_from_the_fp32_update),
        cmocka_unit_test(test_muon_param_with_wrong_shape_is_rejected_naming_fqn),
        cmocka_unit_test(test_row_shards_with_gather_match_the_whole_matrix_bit_for_bit),
        cmocka_unit_test(test_row_shard_outside_its_matrix_is_rejected_naming_fqn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
