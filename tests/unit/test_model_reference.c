/* model/: the fast fp32 forward against a naive fp64 transcription of
 * Hugging Face LlamaForCausalLM (modeling_llama.py), written from the
 * definition with plain loops and no shared code: embedding, per block
 * RMSNorm -> q/k/v -> rotate_half RoPE -> repeat_kv causal softmax
 * attention -> o_proj -> residual -> RMSNorm -> SwiGLU -> residual, final
 * norm, lm_head.
 * HS_TEST_TIERS: avx2 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "hypershard/model.h"

enum { V = 13, C = 12, L = 2, NH = 3, KVH = 1, HD = C / NH, F = 20, T = 7 };

static const double *w_of(hs_model *m, const char *fqn, double *buf) {
    int i = hs_model_find_param(m, fqn);
    if (i < 0) fail_msg("no parameter %s", fqn);
    hs_param *p = hs_model_param(m, i);
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    for (int64_t j = 0; j < n; j++) buf[j] = ((float *)p->data)[j];
    return buf;
}

static const double *layer_w(hs_model *m, int l, const char *name, double *buf) {
    char fqn[HS_FQN_MAX];
    snprintf(fqn, sizeof fqn, "model.layers.%d.%s.weight", l, name);
    return w_of(m, fqn, buf);
}

static void rmsnorm(double *y, const double *x, const double *w, int n, double eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* y[out] = W[out, in] x[in] */
static void linear(double *y, const double *x, const double *W, int out, int in) {
    for (int o = 0; o < out; o++) {
        double s = 0.0;
        for (int i = 0; i < in; i++) s += W[o * in + i] * x[i];
        y[o] = s;
    }
}

/* q * cos + rotate_half(q) * sin, rotate_half(x) = cat(-x2, x1). */
static void rope(double *x, int pos, double theta) {
    double rot[HD];
    for (int i = 0; i < HD; i++) {
        int j = i % (HD / 2);
        double inv = 1.0 / pow(theta, 2.0 * j / HD), a = pos * inv;
        double rh = i < HD / 2 ? -x[i + HD / 2] : x[i - HD / 2];
        rot[i] = x[i] * cos(a) + rh * sin(a);
    }
    memcpy(x, rot, sizeof rot);
}

static void attention(double *out /* T,C */, const double *q /* T,NH*HD */,
                      const double *k /* T,KVH*HD */, const double *v) {
    for (int h = 0; h < NH; h++) {
        int kh = h / (NH / KVH);
        for (int t = 0; t < T; t++) {
            double s[T], mx = -INFINITY, sum = 0.0;
            for (int j = 0; j <= t; j++) {
                s[j] = 0.0;
                for (int d = 0; d < HD; d++)
                    s[j] += q[t * NH * HD + h * HD + d] * k[j * KVH * HD + kh * HD + d];
                s[j] /= sqrt((double)HD);
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j <= t; j++) sum += exp(s[j] - mx);
            for (int d = 0; d < HD; d++) {
                double o = 0.0;
                for (int j = 0; j <= t; j++)
                    o += exp(s[j] - mx) / sum * v[j * KVH * HD + kh * HD + d];
                out[t * C + h * HD + d] = o;
            }
        }
    }
}

static void block(hs_model *m, int l, double x[T][C], double eps, double theta) {
    static double wq[C * C], wk[C * C], wv[C * C], wo[C * C], n1[C], n2[C];
    static double wg[F * C], wu[F * C], wd[C * F];
    layer_w(m, l, "self_attn.q_proj", wq), layer_w(m, l, "self_attn.k_proj", wk);
    layer_w(m, l, "self_attn.v_proj", wv), layer_w(m, l, "self_attn.o_proj", wo);
    layer_w(m, l, "input_layernorm", n1), layer_w(m, l, "post_attention_layernorm", n2);
    layer_w(m, l, "mlp.gate_proj", wg), layer_w(m, l, "mlp.up_proj", wu);
    layer_w(m, l, "mlp.down_proj", wd);
    double q[T * C], k[T * KVH * HD], v[T * KVH * HD], a[T * C], h[C];
    for (int t = 0; t < T; t++) {
        rmsnorm(h, x[t], n1, C, eps);
        linear(q + t * C, h, wq, C, C);
        linear(k + t * KVH * HD, h, wk, KVH * HD, C);
        linear(v + t * KVH * HD, h, wv, KVH * HD, C);
        for (int hh = 0; hh < NH; hh++) rope(q + t * C + hh * HD, t, theta);
        for (int hh = 0; hh < KVH; hh++) rope(k + t * KVH * HD + hh * HD, t, theta);
    }
    attention(a, q, k, v);
    for (int t = 0; t < T; t++) {
        double o[C], g[F], u[F], d[C];
        linear(o, a + t * C, wo, C, C);
        for (int i = 0; i < C; i++) x[t][i] += o[i];
        rmsnorm(h, x[t], n2, C, eps);
        linear(g, h, wg, F, C);
        linear(u, h, wu, F, C);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        linear(d, g, wd, C, F);
        for (int i = 0; i < C; i++) x[t][i] += d[i];
    }
}

static void test_fp32_logits_match_naive_fp64_llama_to_1e_5(void **state) {
    (void)state;
    hs_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.arch, sizeof c.arch, "llama");
    c.vocab_size = V, c.dim = C, c.n_layers = L, c.n_heads = NH, c.n_kv_heads = KVH;
    c.ffn_dim = F, c.norm_eps = 1e-6, c.rope_theta = 500.0, c.init_std = 0.2;
    hs_model_options o = {.compute_dtype = HS_DTYPE_F32,
                          .grad_dtype = HS_DTYPE_F32,
                          .max_batch = 1,
                          .seq_len = T,
                          .allocate_params = true};
    hs_model *m = NULL;
    hs_error e;
    assert_int_equal(hs_model_create(&c, &o, &m, &e), HS_OK);
    hs_model_init_weights(m, 99);
    /* norms are ones after init; give them structure so a swapped weight shows */
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        if (p->kind == HS_PARAM_NORM)
            for (int j = 0; j < C; j++)
                ((float *)p->data)[j] = 0.5f + 0.1f * (float)((j * 7 + i) % 11);
    }
    const int32_t tokens[T] = {3, 12, 0, 7, 7, 1, 9};
    static double emb[V * C], head[V * C], nf[C];
    w_of(m, "model.embed_tokens.weight", emb);
    w_of(m, "lm_head.weight", head);
    w_of(m, "model.norm.weight", nf);
    double x[T][C];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C; i++) x[t][i] = emb[tokens[t] * C + i];
    for (int l = 0; l < L; l++) block(m, l, x, c.norm_eps, c.rope_theta);
    float logits[T * V];
    hs_batch b = {.tokens = tokens, .targets = NULL, .B = 1, .T = T};
    assert_int_equal(hs_model_forward(m, &b, NULL, NULL, logits, &e), HS_OK);
    double worst = 0.0, scale = 0.0;
    for (int t = 0; t < T; t++) {
        double h[C], want[V];
        rmsnorm(h, x[t], nf, C, c.norm_eps);
        linear(want, h, head, V, C);
        for (int i = 0; i < V; i++) {
            worst = fmax(worst, fabs(want[i] - logits[t * V + i]));
            scale = fmax(scale, fabs(want[i]));
        }
    }
    print_message("max |logit - reference| = %.3g (max |logit| %.3g)\n", worst, scale);
    assert_true(worst <= 1e-5 * scale);
    hs_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_logits_match_naive_fp64_llama_to_1e_5),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
