/* Hugging Face I/O: expert names split and stacked, config.json round trips
 * for both architectures, and weight save/load through a real model with
 * errors that name the parameter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/ckpt.h"
#include "test_util.h"

static char tmpdir[256];

static int setup(void **s) {
    (void)s;
    return tu_tmpdir_make(tmpdir, sizeof tmpdir, "hf");
}
static int teardown(void **s) {
    (void)s;
    return tu_tmpdir_remove(tmpdir);
}

static void test_stacked_experts_become_one_tensor_per_expert(void **state) {
    (void)state;
    hs_param p = {.fqn = "model.layers.2.block_sparse_moe.experts.w2.weight",
                  .kind = HS_PARAM_EXPERT,
                  .ndim = 3,
                  .shape = {4, 8, 16}};
    char name[HS_ST_NAME_MAX];
    assert_int_equal(hs_hf_tensor_count(&p), 4);
    hs_hf_tensor_name(&p, 3, name, sizeof name);
    assert_string_equal(name, "model.layers.2.block_sparse_moe.experts.3.w2.weight");
    hs_param q = {.fqn = "model.layers.0.mlp.up_proj.weight",
                  .kind = HS_PARAM_LINEAR,
                  .ndim = 2,
                  .shape = {8, 4}};
    assert_int_equal(hs_hf_tensor_count(&q), 1);
    hs_hf_tensor_name(&q, 0, name, sizeof name);
    assert_string_equal(name, q.fqn);
}

static hs_model_config tiny_config(const char *arch) {
    hs_config c;
    hs_config_defaults(&c, NULL);
    hs_model_config mc = c.model;
    hs_config_free(&c);
    snprintf(mc.arch, sizeof mc.arch, "%s", arch);
    mc.dim = 16, mc.n_layers = 2, mc.n_heads = 2, mc.n_kv_heads = 1, mc.ffn_dim = 24;
    mc.moe.num_experts = 3, mc.moe.top_k = 2, mc.moe.expert_ffn_dim = 20;
    mc.norm_eps = 1e-6, mc.rope_theta = 500000.0, mc.tie_embeddings = false;
    return mc;
}

/* qwen3 with a head size apart from dim / n_heads (16 / 2 = 8). */
static void test_config_json_round_trips_llama_mixtral_and_qwen3(void **state) {
    (void)state;
    const char *archs[] = {"llama", "moe", "qwen3"};
    for (int a = 0; a < 3; a++) {
        hs_model_config mc = tiny_config(archs[a]), back;
        mc.head_dim = a == 2 ? 12 : 0;
        memset(&back, 0, sizeof back);
        char path[300];
        snprintf(path, sizeof path, "%s/config_%s.json", tmpdir, archs[a]);
        hs_error e;
        assert_int_equal(hs_hf_config_write(&mc, 64, "float32", path, &e), HS_OK);
        int maxpos = 0;
        assert_int_equal(hs_hf_config_read(path, &back, &maxpos, &e), HS_OK);
        assert_int_equal(maxpos, 64);
        assert_string_equal(back.arch, archs[a]);
        assert_int_equal(back.dim, 16);
        assert_int_equal(back.n_kv_heads, 1);
        assert_true(back.norm_eps == 1e-6 && back.rope_theta == 500000.0);
        assert_int_equal(back.head_dim, mc.head_dim);
        if (a != 1) assert_int_equal(back.ffn_dim, 24);
        else {
            assert_int_equal(back.moe.num_experts, 3);
            assert_int_equal(back.moe.top_k, 2);
            assert_int_equal(back.moe.expert_ffn_dim, 20);
        }
    }
}

typedef struct held {
    hs_model *m;
} held;

static int64_t numel(const hs_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static hs_status get(void *ctx, int i, float *out, hs_error *e) {
    (void)e;
    const hs_param *p = hs_model_param(((held *)ctx)->m, i);
    memcpy(out, p->data, sizeof(float) * (size_t)numel(p));
    return HS_OK;
}

static hs_status set(void *ctx, int i, const float *full, hs_error *e) {
    (void)e;
    hs_param *p = hs_model_param(((held *)ctx)->m, i);
    memcpy(p->data, full, sizeof(float) * (size_t)numel(p));
    return HS_OK;
}

static void held_create(held *h, const hs_model_config *mc, uint64_t seed) {
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = 1,
                           .seq_len = 8,
                           .allocate_params = true};
    hs_error e;
    assert_int_equal(hs_model_create(mc, &mo, &h->m, &e), HS_OK);
    hs_model_init_weights(h->m, seed);
}

/* Saves a's weights in Hugging Face format (dtype dt, 8 rows per chunk)
 * under tmpdir/name, whose path comes back in dir. */
static void save_hf(held *a, hs_dtype dt, const char *name, char *dir, size_t cap) {
    snprintf(dir, cap, "%s/%s", tmpdir, name);
    hs_error e;
    assert_int_equal(hs_hf_save(a->m, get, a, dt, 8, dir, true, &e), HS_OK);
}

static void test_moe_weights_save_and_load_bitwise(void **state) {
    (void)state;
    hs_model_config mc = tiny_config("moe");
    held a, b;
    held_create(&a, &mc, 1);
    held_create(&b, &mc, 2);
    char dir[300];
    save_hf(&a, HS_DTYPE_F32, "moe", dir, sizeof dir);
    hs_error e;
    assert_int_equal(hs_hf_load(b.m, dir, set, &b, &e), HS_OK);
    for (int i = 0; i < hs_model_num_params(a.m); i++) {
        const hs_param *p = hs_model_param(a.m, i), *q = hs_model_param(b.m, i);
        assert_memory_equal(p->data, q->data, sizeof(float) * (size_t)numel(p));
    }
    hs_model_free(a.m);
    hs_model_free(b.m);
}

static void test_loading_into_another_shape_names_parameter_and_shapes(void **state) {
    (void)state;
    hs_model_config mc = tiny_config("llama"), other = mc;
    other.ffn_dim = 32;
    held a, b;
    held_create(&a, &mc, 1);
    held_create(&b, &other, 1);
    char dir[300];
    save_hf(&a, HS_DTYPE_BF16, "llama", dir, sizeof dir);
    hs_error e;
    hs_error_clear(&e);
    assert_int_not_equal(hs_hf_load(b.m, dir, set, &b, &e), HS_OK);
    assert_non_null(strstr(e.msg, "model.layers.1.mlp.down_proj.weight has shape [16, 24]"));
    assert_non_null(strstr(e.msg, "needs [16, 32]"));
    hs_model_free(a.m);
    hs_model_free(b.m);
}

/* a's weights saved in dt are refused by b's load with HS_ERR_FORMAT,
 * naming the file and "tensor <part of p> holds <what>". */
static void expect_load_refused(held *a, held *b, hs_dtype dt, const hs_param *p, int part,
                                const char *what) {
    char dir[300], name[HS_ST_NAME_MAX], want[HS_ST_NAME_MAX + 64];
    save_hf(a, dt, dt == HS_DTYPE_F32 ? "poisoned32" : "poisoned16", dir, sizeof dir);
    hs_hf_tensor_name(p, part, name, sizeof name);
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_hf_load(b->m, dir, set, b, &e), HS_ERR_FORMAT);
    snprintf(want, sizeof want, "tensor %s holds %s", name, what);
    if (!strstr(e.msg, want)) fail_msg("'%s' lacks '%s'", e.msg, want);
    assert_non_null(strstr(e.msg, dir));
}

/* An expert weight poisoned with NaN at element 5 (and +Inf later) is
 * refused by the load, naming the per-expert tensor and the first bad
 * element; nothing reaches the model. */
static void test_nan_in_imported_weights_is_refused_naming_tensor_and_index(void **state) {
    (void)state;
    hs_model_config mc = tiny_config("moe");
    held a, b;
    held_create(&a, &mc, 1);
    held_create(&b, &mc, 2);
    int victim = -1;
    for (int i = 0; i < hs_model_num_params(a.m) && victim < 0; i++)
        if (hs_model_param(a.m, i)->kind == HS_PARAM_EXPERT) victim = i;
    assert_true(victim >= 0);
    hs_param *p = hs_model_param(a.m, victim);
    int64_t per_expert = numel(p) / p->shape[0];
    float *w = p->data;
    w[per_expert + 5] = NAN; /* expert 1, element 5 */
    w[per_expert + 9] = INFINITY;
    expect_load_refused(&a, &b, HS_DTYPE_BF16, p, 1, "NaN at element 5");
    float *got = hs_model_param(b.m, victim)->data;
    assert_false(isnan(got[per_expert + 5]));
    hs_model_free(a.m);
    hs_model_free(b.m);
}

/* fp32 weights are checked where the file maps them (no copy): the largest
 * tensor poisoned past its first blocks of 1024 (-Inf at 3000, NaN after
 * it) is refused naming -Inf at 3000, and nothing reaches the model. */
static void test_inf_deep_in_fp32_weights_is_refused_at_its_index(void **state) {
    (void)state;
    hs_model_config mc = tiny_config("llama");
    held a, b;
    held_create(&a, &mc, 1);
    held_create(&b, &mc, 2);
    int victim = 0;
    for (int i = 1; i < hs_model_num_params(a.m); i++)
        if (numel(hs_model_param(a.m, i)) > numel(hs_model_param(a.m, victim))) victim = i;
    hs_param *p = hs_model_param(a.m, victim);
    assert_true(numel(p) > 4000);
    float *w = p->data;
    w[3000] = -INFINITY;
    w[3999] = NAN;
    expect_load_refused(&a, &b, HS_DTYPE_F32, p, 0, "-Inf at element 3000");
    assert_false(isinf(((float *)hs_model_param(b.m, victim)->data)[3000]));
    hs_model_free(a.m);
    hs_model_free(b.m);
}

static bool borrow(void *ctx, int i, const float *full) {
    return hs_model_borrow_param(((held *)ctx)->m, i, full);
}

/* Every parameter of b borrowed the file's tensor: its data is the
 * tensor's bytes in the open file, with a's values. */
static void expect_borrowed(held *a, held *b, const hs_st_file *f) {
    char name[HS_ST_NAME_MAX];
    for (int i = 0; i < hs_model_num_params(a->m); i++) {
        const hs_param *p = hs_model_param(a->m, i), *q = hs_model_param(b->m, i);
        hs_hf_tensor_name(q, 0, name, sizeof name);
        const hs_st_tensor *t = hs_safetensors_find(f, name);
        assert_non_null(t);
        assert_true(q->borrowed);
        assert_ptr_equal(q->data, t->data);
        assert_memory_equal(p->data, q->data, sizeof(float) * (size_t)numel(p));
    }
}

/* A load that may borrow (generate, eval): each fp32 tensor of a file we
 * wrote (aligned where it is mapped) is read there, the parameter's own
 * buffer released, and the file stays open for the caller to close after
 * freeing the model (ASan sees any wrong free). From bf16 the values are
 * converted copies and the file is closed; without a place to keep the
 * file nothing is borrowed. */
static void test_fp32_weights_are_read_where_the_file_maps_them(void **state) {
    (void)state;
    hs_model_config mc = tiny_config("llama");
    held a, b, c, d;
    held_create(&a, &mc, 1);
    held_create(&b, &mc, 2);
    held_create(&c, &mc, 3);
    held_create(&d, &mc, 4);
    char dir32[300], dir16[300];
    save_hf(&a, HS_DTYPE_F32, "borrow32", dir32, sizeof dir32);
    save_hf(&a, HS_DTYPE_BF16, "borrow16", dir16, sizeof dir16);
    hs_error e;
    hs_st_file *kept = NULL;
    assert_int_equal(hs_hf_load_borrowing(b.m, dir32, set, borrow, &b, &kept, &e), HS_OK);
    assert_non_null(kept);
    expect_borrowed(&a, &b, kept);
    hs_model_free(b.m);
    hs_safetensors_close(kept);
    assert_int_equal(hs_hf_load_borrowing(c.m, dir16, set, borrow, &c, &kept, &e), HS_OK);
    assert_null(kept);
    assert_int_equal(hs_hf_load_borrowing(d.m, dir32, set, borrow, &d, NULL, &e), HS_OK);
    for (int i = 0; i < hs_model_num_params(a.m); i++) {
        const hs_param *p = hs_model_param(a.m, i);
        assert_false(hs_model_param(c.m, i)->borrowed);
        assert_false(hs_model_param(d.m, i)->borrowed);
        assert_memory_equal(p->data, hs_model_param(d.m, i)->data,
                            sizeof(float) * (size_t)numel(p));
    }
    hs_model_free(a.m);
    hs_model_free(c.m);
    hs_model_free(d.m);
}

/* hs_model_borrow_param refuses, changing nothing: memory off HS_ALIGN, a
 * 16-bit compute dtype (its parameters are not fp32), a second borrow. */
static void test_a_parameter_borrows_only_aligned_fp32_host_memory(void **state) {
    (void)state;
    hs_model_config mc = tiny_config("llama");
    held a;
    held_create(&a, &mc, 1);
    const hs_param *p = hs_model_param(a.m, 0);
    size_t bytes = sizeof(float) * (size_t)numel(p);
    float *mem = aligned_alloc(HS_ALIGN, bytes + HS_ALIGN);
    assert_non_null(mem);
    void *own = p->data;
    assert_false(hs_model_borrow_param(a.m, 0, mem + 1));
    assert_ptr_equal(p->data, own);
    assert_true(hs_model_borrow_param(a.m, 0, mem));
    assert_ptr_equal(p->data, mem);
    assert_false(hs_model_borrow_param(a.m, 0, mem));
    hs_model_free(a.m); /* the borrowed memory stays the caller's */
    mem[0] = 1.0f;
    free(mem);
    hs_model_options mo = {.compute_dtype = HS_DTYPE_BF16,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = 1,
                           .seq_len = 8,
                           .allocate_params = true};
    hs_model *m16 = NULL;
    hs_error e;
    assert_int_equal(hs_model_create(&mc, &mo, &m16, &e), HS_OK);
    float *mem16 = aligned_alloc(HS_ALIGN, bytes + HS_ALIGN);
    assert_non_null(mem16);
    assert_false(hs_model_borrow_param(m16, 0, mem16));
    assert_false(hs_model_param(m16, 0)->borrowed);
    hs_model_free(m16);
    free(mem16);
}

/* config.json written by hand or by another tool: a value that does not
 * fit, a string where a number belongs, a repeated key and heads that do
 * not divide are refused naming the file and the key. */
static void expect_config_refused(const char *name, const char *json, const char *needle) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    tu_write_file(path, json, strlen(json));
    hs_model_config mc = tiny_config("llama");
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_hf_config_read(path, &mc, NULL, &e), HS_ERR_FORMAT);
    if (!strstr(e.msg, path) || !strstr(e.msg, needle))
        fail_msg("'%s' does not name %s and '%s'", e.msg, path, needle);
}

/* json written to tmpdir/name and read over *mc: HS_OK. */
static void read_config(const char *name, const char *json, hs_model_config *mc) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    tu_write_file(path, json, strlen(json));
    hs_error e;
    assert_int_equal(hs_hf_config_read(path, mc, NULL, &e), HS_OK);
}

#define LLAMA_JSON(extra)                                                                          \
    "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 16, "                       \
    "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2" extra "}"

static void test_hf_config_values_out_of_range_are_refused_naming_the_key(void **state) {
    (void)state;
    expect_config_refused("c1.json", LLAMA_JSON(", \"num_key_value_heads\": 4294967297"),
                          "\"num_key_value_heads\" is 4294967297");
    expect_config_refused("c2.json", LLAMA_JSON(", \"max_position_embeddings\": -8"),
                          "\"max_position_embeddings\" is -8");
    expect_config_refused("c3.json", LLAMA_JSON(", \"rms_norm_eps\": \"1e-6\""),
                          "\"rms_norm_eps\"");
    expect_config_refused("c4.json", LLAMA_JSON(", \"hidden_size\": 32"), "duplicate");
    expect_config_refused("c5.json", LLAMA_JSON(", \"num_key_value_heads\": 3"),
                          "\"num_key_value_heads\" 3");
}

/* Values transformers would build a different network from are refused
 * instead of ignored. */
static void test_hf_config_fields_hypershard_cannot_build_are_refused(void **state) {
    (void)state;
    expect_config_refused("d1.json", LLAMA_JSON(", \"head_dim\": 7"), "head size 7");
    expect_config_refused("d2.json", LLAMA_JSON(", \"hidden_act\": \"gelu\""), "\"hidden_act\"");
    expect_config_refused("d3.json", LLAMA_JSON(", \"attention_bias\": true"),
                          "\"attention_bias\" is true");
    expect_config_refused("d4.json", LLAMA_JSON(", \"tie_word_embeddings\": \"yes\""),
                          "\"tie_word_embeddings\" must be true or false");
    expect_config_refused("d5.json", LLAMA_JSON(", \"use_sliding_window\": true"),
                          "\"use_sliding_window\" is true");
    expect_config_refused("d6.json",
                          LLAMA_JSON(", \"rope_parameters\": {\"rope_type\": \"dynamic\", "
                                     "\"rope_theta\": 1e6, \"factor\": 2.0}"),
                          "\"rope_parameters\" is of type dynamic");
    expect_config_refused("d7.json",
                          LLAMA_JSON(", \"rope_scaling\": {\"rope_type\": \"yarn\", "
                                     "\"factor\": 4.0}"),
                          "\"original_max_position_embeddings\" is missing");
    expect_config_refused("d8.json",
                          LLAMA_JSON(", \"rope_scaling\": {\"rope_type\": \"llama3\", "
                                     "\"factor\": 8.0, \"low_freq_factor\": 4.0, "
                                     "\"high_freq_factor\": 1.0, "
                                     "\"original_max_position_embeddings\": 8192}"),
                          "high_freq_factor 1 must exceed low_freq_factor 4");
    expect_config_refused("d10.json",
                          "{\"model_type\": \"mistral\", \"vocab_size\": 256, \"hidden_size\": 16, "
                          "\"intermediate_size\": 24, \"num_hidden_layers\": 2, "
                          "\"num_attention_heads\": 2, \"sliding_window\": 4096}",
                          "\"sliding_window\" is set");
    expect_config_refused("d11.json",
                          "{\"model_type\": \"mixtral\", \"vocab_size\": 256, \"hidden_size\": 16, "
                          "\"intermediate_size\": 24, \"num_hidden_layers\": 2, "
                          "\"num_attention_heads\": 2, \"num_local_experts\": 4, "
                          "\"num_experts_per_tok\": 2, \"sliding_window\": 4096}",
                          "\"sliding_window\" is set");
    expect_config_refused("d9.json",
                          LLAMA_JSON(", \"rope_scaling\": {\"type\": \"llama3\", "
                                     "\"original_max_position_embeddings\": 8192}"),
                          "\"rope_scaling\".\"factor\" is missing");
}

/* Llama 3.1's rope_scaling (transformers 4's spelling) and DeepSeek's YaRN
 * in transformers 5's rope_parameters, its factor left to
 * max_position_embeddings / original_max_position_embeddings, read into
 * model.rope_scaling and written back so that they read the same. */
static void test_hf_config_reads_and_writes_llama3_and_yarn_rope(void **state) {
    (void)state;
    char path[300], written[300];
    snprintf(path, sizeof path, "%s/r3.json", tmpdir);
    snprintf(written, sizeof written, "%s/r3back.json", tmpdir);
    const char *llama =
        LLAMA_JSON(", \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0, "
                   "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}");
    tu_write_file(path, llama, strlen(llama));
    hs_model_config mc = tiny_config("llama"), again = tiny_config("qwen3");
    hs_error e;
    assert_int_equal(hs_hf_config_read(path, &mc, NULL, &e), HS_OK);
    assert_string_equal(mc.rope_scaling.type, "llama3");
    assert_true(mc.rope_scaling.factor == 8.0 && mc.rope_scaling.high_freq_factor == 4.0);
    assert_int_equal(mc.rope_scaling.original_max_position, 8192);
    assert_int_equal(hs_hf_config_write(&mc, 131072, "float32", written, &e), HS_OK);
    assert_int_equal(hs_hf_config_read(written, &again, NULL, &e), HS_OK);
    assert_memory_equal(&again.rope_scaling, &mc.rope_scaling, sizeof mc.rope_scaling);

    const char *yarn =
        LLAMA_JSON(", \"max_position_embeddings\": 163840, \"rope_parameters\": "
                   "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"beta_fast\": 32, "
                   "\"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
                   "\"original_max_position_embeddings\": 4096}");
    tu_write_file(path, yarn, strlen(yarn));
    mc = tiny_config("llama");
    int max_position = 0;
    assert_int_equal(hs_hf_config_read(path, &mc, &max_position, &e), HS_OK);
    assert_string_equal(mc.rope_scaling.type, "yarn");
    assert_true(mc.rope_scaling.factor == 40.0 && mc.rope_scaling.mscale == 1.0);
    assert_true(mc.rope_scaling.truncate && mc.rope_scaling.attention_factor == 0.0);
    assert_int_equal(hs_hf_config_write(&mc, max_position, "float32", written, &e), HS_OK);
    again = tiny_config("qwen3");
    assert_int_equal(hs_hf_config_read(written, &again, NULL, &e), HS_OK);
    assert_memory_equal(&again.rope_scaling, &mc.rope_scaling, sizeof mc.rope_scaling);
    assert_true(again.rope_theta == 10000.0);
}

/* Mistral without a sliding window reads as arch llama (its head size
 * kept); Qwen3's sliding_window counts only under use_sliding_window. */
static void test_hf_config_reads_mistral_as_llama(void **state) {
    (void)state;
    const char *json = "{\"model_type\": \"mistral\", \"architectures\": "
                       "[\"MistralForCausalLM\"], \"vocab_size\": 256, \"hidden_size\": 16, "
                       "\"intermediate_size\": 24, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4, "
                       "\"sliding_window\": null, \"rope_theta\": 1000000.0}";
    hs_model_config mc = tiny_config("qwen3");
    read_config("m.json", json, &mc);
    assert_string_equal(mc.arch, "llama");
    assert_int_equal(hs_model_head_dim(&mc), 4);
    assert_int_equal(mc.n_kv_heads, 1);
    const char *qwen = "{\"model_type\": \"qwen3\", \"vocab_size\": 256, \"hidden_size\": 16, "
                       "\"intermediate_size\": 24, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 2, \"head_dim\": 8, \"sliding_window\": 4096, "
                       "\"use_sliding_window\": false}";
    read_config("m.json", qwen, &mc);
    assert_string_equal(mc.arch, "qwen3");
}

/* transformers 5 writes RoPE's base into "rope_parameters"; Qwen3Config's
 * head size is 128 when the file leaves it out. */
static void test_hf_config_reads_rope_parameters_and_qwen3_defaults(void **state) {
    (void)state;
    const char *json = "{\"model_type\": \"qwen3\", \"vocab_size\": 256, \"hidden_size\": 16, "
                       "\"intermediate_size\": 24, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 2, \"rope_parameters\": {\"rope_type\": "
                       "\"default\", \"rope_theta\": 1000000.0}}";
    hs_model_config mc = tiny_config("llama");
    read_config("q.json", json, &mc);
    assert_string_equal(mc.arch, "qwen3");
    assert_true(mc.rope_theta == 1000000.0);
    assert_int_equal(mc.head_dim, 128);
    assert_int_equal(hs_model_head_dim(&mc), 128);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stacked_experts_become_one_tensor_per_expert),
        cmocka_unit_test(test_config_json_round_trips_llama_mixtral_and_qwen3),
        cmocka_unit_test(test_moe_weights_save_and_load_bitwise),
        cmocka_unit_test(test_loading_into_another_shape_names_parameter_and_shapes),
        cmocka_unit_test(test_nan_in_imported_weights_is_refused_naming_tensor_and_index),
        cmocka_unit_test(test_inf_deep_in_fp32_weights_is_refused_at_its_index),
        cmocka_unit_test(test_fp32_weights_are_read_where_the_file_maps_them),
        cmocka_unit_test(test_a_parameter_borrows_only_aligned_fp32_host_memory),
        cmocka_unit_test(test_hf_config_values_out_of_range_are_refused_naming_the_key),
        cmocka_unit_test(test_hf_config_fields_hypershard_cannot_build_are_refused),
        cmocka_unit_test(test_hf_config_reads_rope_parameters_and_qwen3_defaults),
        cmocka_unit_test(test_hf_config_reads_and_writes_llama3_and_yarn_rope),
        cmocka_unit_test(test_hf_config_reads_mistral_as_llama),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
