/* Generation with a KV cache (model.h "generation", src/model/decode.c):
 * a prefill of a prompt and then one row per token give the logits of the
 * full forward's last row to 1e-5 in fp32, step after step, for a dense
 * grouped-query model (across the attention kernel's 256-key tile and
 * with activation checkpointing's shared activations) and a MoE one; the
 * hooks bracket every parameter use as FSDP needs; a cache that is full
 * refuses more rows until it is reset; a layout without one (CP) is
 * refused with the reason. */
#include <math.h>
#include <stdlib.h>

#include "model_fixture.h"

#define SEQ 300

static hs_model *decode_model(const char *arch, bool ckpt, uint64_t seed) {
    hs_model_config c = mf_config(arch, 1); /* 2 query heads share one kv head */
    c.vocab_size = 37;
    c.dim = 16;
    if (!strcmp(arch, "moe")) {
        c.moe.num_experts = 4;
        c.moe.top_k = 2;
        c.moe.expert_ffn_dim = 6;
        c.moe.aux_loss_coef = 0.1;
    }
    hs_model_options o = mf_options(HS_DTYPE_F32, ckpt);
    o.max_batch = 1;
    o.seq_len = SEQ;
    return mf_make(&c, &o, seed);
}

/* A deterministic token sequence over the vocabulary. */
static void fill_tokens(int32_t *t, int n, int V) {
    uint32_t x = 12345u;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        t[i] = (int32_t)((x >> 16) % (uint32_t)V);
    }
}

/* The full forward's logits of row len - 1 of tokens[0, len). */
static void full_last_row(hs_model *m, const int32_t *tokens, int len, float *all, float *out,
                          int V) {
    hs_batch b = {.tokens = tokens, .B = 1, .T = len};
    hs_error e;
    if (hs_model_forward(m, &b, NULL, NULL, all, &e) != HS_OK) fail_msg("forward: %s", e.msg);
    memcpy(out, all + (size_t)(len - 1) * V, sizeof(float) * (size_t)V);
}

static void assert_close(const float *got, const float *want, int V, int step) {
    for (int i = 0; i < V; i++)
        if (fabsf(got[i] - want[i]) > 1e-5f * (1.0f + fabsf(want[i])))
            fail_msg("step %d logit %d: cached %.9g, full forward %.9g", step, i, got[i], want[i]);
}

/* Prefill `prompt` tokens, then `steps` single rows, each checked against
 * the full forward over the same prefix. */
static void check_decode(hs_model *m, int prompt, int steps, const hs_model_hooks *hooks) {
    int V = hs_model_config_of(m)->vocab_size;
    int32_t tokens[SEQ];
    fill_tokens(tokens, SEQ, V);
    float *all = malloc(sizeof(float) * (size_t)SEQ * V);
    float *got = malloc(sizeof(float) * (size_t)V), *want = malloc(sizeof(float) * (size_t)V);
    assert_non_null(all);
    hs_kv_cache *c = NULL;
    hs_error e;
    assert_int_equal(hs_kv_cache_create(m, &c, &e), HS_OK);
    assert_int_equal(hs_model_forward_cached(m, c, tokens, prompt, hooks, got, &e), HS_OK);
    full_last_row(m, tokens, prompt, all, want, V);
    assert_close(got, want, V, 0);
    for (int s = 1; s <= steps; s++) {
        int len = prompt + s;
        assert_int_equal(hs_model_forward_cached(m, c, tokens + len - 1, 1, hooks, got, &e), HS_OK);
        assert_int_equal(hs_kv_cache_len(c), len);
        full_last_row(m, tokens, len, all, want, V);
        assert_close(got, want, V, s);
    }
    hs_kv_cache_free(c);
    free(all);
    free(got);
    free(want);
}

static void test_cached_decode_equals_the_full_forward(void **state) {
    (void)state;
    hs_model *m = decode_model("llama", false, 7);
    check_decode(m, 5, 12, NULL);
    check_decode(m, 240, 30, NULL); /* across the 256-key tile */
    hs_model_free(m);
}

static void test_cached_decode_with_activation_checkpointing(void **state) {
    (void)state;
    hs_model *m = decode_model("llama", true, 8);
    check_decode(m, 9, 10, NULL);
    hs_model_free(m);
}

static void test_cached_decode_of_a_moe_model(void **state) {
    (void)state;
    hs_model *m = decode_model("moe", false, 9);
    check_decode(m, 7, 10, NULL);
    hs_model_free(m);
}

/* A model without parameters of its own, bound only inside its units'
 * hooks (as FSDP unshards them): a read outside them would crash. */
static void test_cached_decode_reads_parameters_inside_the_hooks(void **state) {
    (void)state;
    mf_recorder r;
    memset(&r, 0, sizeof r);
    r.shadow = decode_model("llama", false, 11);
    hs_model_config c = *hs_model_config_of(r.shadow);
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    o.max_batch = 1;
    o.seq_len = SEQ;
    o.allocate_params = false;
    hs_error e;
    assert_int_equal(hs_model_create(&c, &o, &r.m, &e), HS_OK);
    hs_model_hooks hooks = {.ctx = &r, .pre_forward = mf_pre_fwd, .post_forward = mf_post_fwd};
    int32_t tokens[4] = {1, 2, 3, 4};
    float got[37], want[37], all[4 * 37];
    hs_kv_cache *kv = NULL;
    assert_int_equal(hs_kv_cache_create(r.m, &kv, &e), HS_OK);
    assert_int_equal(hs_model_forward_cached(r.m, kv, tokens, 3, &hooks, got, &e), HS_OK);
    assert_string_equal(r.log, "F0 F1 f1 F2 f2 f0 ");
    assert_int_equal(hs_model_forward_cached(r.m, kv, tokens + 3, 1, &hooks, got, &e), HS_OK);
    full_last_row(r.shadow, tokens, 4, all, want, 37);
    assert_close(got, want, 37, 1);
    hs_kv_cache_free(kv);
    hs_model_free(r.m);
    hs_model_free(r.shadow);
}

static void test_a_full_cache_refuses_more_rows_until_reset(void **state) {
    (void)state;
    hs_model *m = decode_model("llama", false, 12);
    int32_t tokens[SEQ];
    fill_tokens(tokens, SEQ, 37);
    float got[37], first[37];
    hs_kv_cache *c = NULL;
    hs_error e;
    assert_int_equal(hs_kv_cache_create(m, &c, &e), HS_OK);
    assert_int_equal(hs_kv_cache_bytes(m), 2LL * 2 * SEQ * 1 * 8 * 4);
    assert_int_equal(hs_model_forward_cached(m, c, tokens, 3, NULL, first, &e), HS_OK);
    assert_int_equal(hs_model_forward_cached(m, c, tokens + 3, SEQ - 3, NULL, got, &e), HS_OK);
    assert_int_equal(hs_model_forward_cached(m, c, tokens, 1, NULL, got, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "do not fit its 300 positions"));
    hs_kv_cache_reset(c);
    assert_int_equal(hs_kv_cache_len(c), 0);
    assert_int_equal(hs_model_forward_cached(m, c, tokens, 3, NULL, got, &e), HS_OK);
    assert_memory_equal(got, first, sizeof got);
    int32_t bad = 37;
    assert_int_equal(hs_model_forward_cached(m, c, &bad, 1, NULL, got, &e), HS_ERR_FORMAT);
    hs_kv_cache_free(c);
    hs_model_free(m);
}

/* A layout whose seam has no cached attention (CP) has no cache: the
 * refusal says why. */
static void test_a_layout_without_a_cache_is_refused_with_the_reason(void **state) {
    (void)state;
    hs_model_config c = mf_config("llama", 1);
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model_par cp = *hs_model_one_device_par();
    cp.attention_cached = NULL;
    o.par = &cp;
    hs_model *m = NULL;
    hs_error e;
    if (hs_model_create(&c, &o, &m, &e) != HS_OK) fail_msg("hs_model_create: %s", e.msg);
    char reason[256] = "";
    assert_false(hs_model_kv_supported(m, reason, sizeof reason));
    assert_non_null(strstr(reason, "context parallelism"));
    hs_kv_cache *kv = NULL;
    assert_int_equal(hs_kv_cache_create(m, &kv, &e), HS_ERR_CONFIG);
    assert_null(kv);
    assert_non_null(strstr(e.msg, "KV cache: this layout has none: context parallelism"));
    hs_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_decode_equals_the_full_forward),
        cmocka_unit_test(test_cached_decode_with_activation_checkpointing),
        cmocka_unit_test(test_cached_decode_of_a_moe_model),
        cmocka_unit_test(test_cached_decode_reads_parameters_inside_the_hooks),
        cmocka_unit_test(test_a_full_cache_refuses_more_rows_until_reset),
        cmocka_unit_test(test_a_layout_without_a_cache_is_refused_with_the_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
