/* Document masking on one device: the document starts of packed
 * sequences (hs_doc_starts), and a packed sequence's logits with masking
 * equal, row for row, those of each of its documents run alone (RoPE
 * depends on relative positions only, so a document's absolute offset
 * does not matter); its loss and gradients equal the sums over the
 * documents run alone. Without masking the later documents' logits
 * differ, so the comparison can fail. */
#include "model_fixture.h"

#include <math.h>
#include <stdlib.h>

#define SEQ 16
#define EOS 10
#define V 11

/* Sequence 0: documents of 5, 7 and 4 tokens (the last one unfinished);
 * sequence 1: one document of 16 tokens. */
static const int32_t DOC_LEN[2][3] = {{5, 7, 4}, {16, 0, 0}};

static void packed(int32_t *tok, int32_t *tgt) {
    for (int b = 0; b < 2; b++) {
        int t = 0;
        for (int d = 0; d < 3 && DOC_LEN[b][d]; d++) {
            int n = DOC_LEN[b][d];
            for (int i = 0; i < n; i++, t++) {
                int32_t x = (int32_t)((t * 7 + b * 3 + d) % EOS); /* never EOS */
                tok[b * SEQ + t] = i == n - 1 && d < 2 && DOC_LEN[b][d + 1] ? EOS : x;
                tgt[b * SEQ + t] = (int32_t)((t * 5 + b) % V);
            }
        }
    }
}

static void test_doc_starts(void **state) {
    (void)state;
    int32_t tok[2 * SEQ], tgt[2 * SEQ], st[2 * SEQ];
    packed(tok, tgt);
    hs_doc_starts(st, tok, 2, SEQ, EOS);
    const int32_t want0[SEQ] = {0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 5, 5, 12, 12, 12, 12};
    assert_memory_equal(st, want0, sizeof want0);
    for (int t = 0; t < SEQ; t++) assert_int_equal(st[SEQ + t], 0);
}

static hs_model *model(void) {
    hs_model_config c = mf_config("llama", 1);
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    o.seq_len = SEQ;
    o.document_masking = true;
    return mf_make(&c, &o, 7);
}

static float max_abs(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

static void test_logits_equal_each_document_alone(void **state) {
    (void)state;
    hs_model *m = model();
    int32_t tok[2 * SEQ], tgt[2 * SEQ], st[2 * SEQ];
    packed(tok, tgt);
    hs_doc_starts(st, tok, 2, SEQ, EOS);
    float *got = malloc(sizeof(float) * 2 * SEQ * V), *plain = malloc(sizeof(float) * 2 * SEQ * V);
    float *alone = malloc(sizeof(float) * SEQ * V);
    hs_error e;
    hs_batch b = {.tokens = tok, .targets = tgt, .B = 2, .T = SEQ, .doc_start = st};
    assert_int_equal(hs_model_forward(m, &b, NULL, NULL, got, &e), HS_OK);
    hs_batch nb = {.tokens = tok, .targets = tgt, .B = 2, .T = SEQ};
    assert_int_equal(hs_model_forward(m, &nb, NULL, NULL, plain, &e), HS_OK);
    float scale = max_abs(got, 2 * SEQ * V), worst = 0.0f, apart = 0.0f;
    for (int s = 0; s < 2; s++)
        for (int d = 0, p0 = 0; d < 3 && DOC_LEN[s][d]; p0 += DOC_LEN[s][d], d++) {
            int n = DOC_LEN[s][d];
            hs_batch one = {
                .tokens = tok + s * SEQ + p0, .targets = tgt + s * SEQ + p0, .B = 1, .T = n};
            assert_int_equal(hs_model_forward(m, &one, NULL, NULL, alone, &e), HS_OK);
            for (int64_t i = 0; i < (int64_t)n * V; i++) {
                int64_t at = ((int64_t)s * SEQ + p0) * V + i;
                float err = fabsf(got[at] - alone[i]), diff = fabsf(plain[at] - alone[i]);
                worst = err > worst ? err : worst;
                if (p0 > 0) apart = diff > apart ? diff : apart;
            }
        }
    if (worst > 1e-5f * scale)
        fail_msg("masked logits differ from alone by %g (scale %g)", worst, scale);
    if (apart < 1e-3f * scale)
        fail_msg("unmasked logits equal alone (%g): the check cannot fail", apart);
    free(got), free(plain), free(alone);
    hs_model_free(m);
}

/* Copies of every gradient of m. */
static float **grads_of(hs_model *m) {
    int n = hs_model_num_params(m);
    float **g = calloc((size_t)n, sizeof *g);
    for (int i = 0; i < n; i++) {
        const hs_param *p = hs_model_param(m, i);
        size_t bytes = (size_t)mf_numel(p) * sizeof(float);
        g[i] = malloc(bytes);
        memcpy(g[i], p->grad, bytes);
    }
    return g;
}

static void test_loss_and_grads_are_the_documents_sums(void **state) {
    (void)state;
    hs_model *m = model();
    int32_t tok[2 * SEQ], tgt[2 * SEQ], st[2 * SEQ];
    packed(tok, tgt);
    hs_doc_starts(st, tok, 2, SEQ, EOS);
    hs_error e;
    double loss, aux, sum = 0.0, l;
    hs_batch b = {.tokens = tok, .targets = tgt, .B = 2, .T = SEQ, .doc_start = st};
    hs_model_zero_grads(m);
    assert_int_equal(hs_model_forward_backward(m, &b, 0.01f, NULL, &loss, &aux, &e), HS_OK);
    float **want = grads_of(m);
    hs_model_zero_grads(m);
    for (int s = 0; s < 2; s++)
        for (int d = 0, p0 = 0; d < 3 && DOC_LEN[s][d]; p0 += DOC_LEN[s][d], d++) {
            hs_batch one = {.tokens = tok + s * SEQ + p0,
                            .targets = tgt + s * SEQ + p0,
                            .B = 1,
                            .T = DOC_LEN[s][d]};
            assert_int_equal(hs_model_forward_backward(m, &one, 0.01f, NULL, &l, &aux, &e), HS_OK);
            sum += l;
        }
    assert_true(fabs(loss - sum) <= 1e-5 * fabs(sum));
    for (int i = 0; i < hs_model_num_params(m); i++) {
        const hs_param *p = hs_model_param(m, i);
        int64_t n = mf_numel(p);
        float scale = max_abs(want[i], n), worst = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float err = fabsf(((const float *)p->grad)[j] - want[i][j]);
            worst = err > worst ? err : worst;
        }
        if (worst > 1e-5f * (scale > 1e-6f ? scale : 1e-6f))
            fail_msg("%s: gradient differs by %g (scale %g)", p->fqn, worst, scale);
        free(want[i]);
    }
    free(want);
    hs_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_starts),
        cmocka_unit_test(test_logits_equal_each_document_alone),
        cmocka_unit_test(test_loss_and_grads_are_the_documents_sums),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
