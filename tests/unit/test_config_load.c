/* Loading the YAML contract: defaults (spec 004 §5.1), overrides, removed and
 * unknown keys, syntax and type errors, and the resolved dump round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/schema.h"
#include "hypershard/config.h"

typedef struct loaded {
    hs_config c;
    hs_error e;
    hs_status st;
    char path[64];
} loaded;

/* Write `yaml` to a temp file and load it with `overrides`. */
/* The config's hash, which must be computable. */
static uint64_t hash_of(const hs_config *c) {
    uint64_t h = 0;
    assert_int_equal(hs_config_hash(c, &h, NULL), HS_OK);
    return h;
}

static loaded *load_yaml(const char *yaml, const char *const *ov, int n_ov) {
    loaded *l = calloc(1, sizeof *l);
    strcpy(l->path, "/tmp/hs_cfg_XXXXXX");
    int fd = mkstemp(l->path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    l->st = hs_config_load(&l->c, l->path, ov, n_ov, &l->e);
    return l;
}

static void loaded_free(loaded *l) {
    unlink(l->path);
    hs_config_free(&l->c);
    free(l);
}

static void assert_ok(const loaded *l) {
    if (l->st != HS_OK) fail_msg("load failed: %s", l->e.msg);
}

static void assert_error_has(const loaded *l, const char *needle) {
    assert_int_equal(l->st, HS_ERR_CONFIG);
    if (!strstr(l->e.msg, needle)) fail_msg("'%s' not in error:\n%s", needle, l->e.msg);
}

/* Spec §5.1: a minimal YAML resolves to the complete FSDP2Config defaults. */
static void test_minimal_yaml_resolves_every_spec_default(void **state) {
    (void)state;
    loaded *l = load_yaml("fsdp_config:\n  dp_shard_size: 1\n", NULL, 0);
    assert_ok(l);
    const hs_fsdp_config *f = &l->c.fsdp;
    assert_int_equal(f->dp_shard_size, 1);
    assert_int_equal(f->edp_shard_size, 1);
    assert_int_equal(f->n_replicate_params, 0);
    assert_int_equal(f->mix_precision.param_dtype, HS_MP_NULL);
    assert_int_equal(f->mix_precision.reduce_dtype, HS_MP_NULL);
    assert_int_equal(f->mix_precision.output_dtype, HS_MP_NULL);
    assert_true(f->mix_precision.cast_forward_inputs);
    assert_false(f->mix_precision.fp32_main_grad);
    assert_false(f->enable_offload);
    assert_true(f->reshard_after_forward);
    assert_true(f->reshard_after_backward);
    assert_true(f->requires_grad_sync);
    assert_int_equal(f->forward_prefetch_depth, 1);
    assert_int_equal(f->backward_prefetch_depth, 1);
    assert_false(f->comm_fusion);
    assert_int_equal(f->comm_fusion_zero_copy, -1);
    const hs_accel_config *a = &l->c.accelerator;
    assert_int_equal(a->tp_size, 1);
    assert_int_equal(a->cp_size, 1);
    assert_int_equal(a->ep_size, 1);
    assert_int_equal(a->pp_size, 1);
    assert_string_equal(a->pp_schedule, "1f1b");
    assert_int_equal(a->n_pp_layers, 0);
    assert_false(a->sequence_parallel);
    assert_false(a->loss_parallel);
    assert_string_equal(a->device, "cpu");
    assert_string_equal(l->c.optimizer.target, "adamw");
    assert_false(l->c.optimizer.fp32_main_params);
    assert_false(l->c.compile.fullgraph);
    assert_string_equal(l->c.source_path, l->path);
    loaded_free(l);
}

static void test_minimal_yaml_resolves_every_trainer_default(void **state) {
    (void)state;
    loaded *l = load_yaml("# nothing set\n", NULL, 0);
    assert_ok(l);
    const hs_config *c = &l->c;
    assert_string_equal(c->model.arch, "llama");
    assert_int_equal(c->model.vocab_size, 256);
    assert_int_equal(c->model.dim, 128);
    assert_int_equal(c->model.n_layers, 4);
    assert_int_equal(c->model.n_heads, 4);
    assert_int_equal(c->model.n_kv_heads, 2);
    assert_int_equal(c->model.ffn_dim, 384);
    assert_true(c->model.norm_eps == 1e-5);
    assert_true(c->model.rope_theta == 10000.0);
    assert_false(c->model.tie_embeddings);
    assert_true(c->model.init_std == 0.02);
    assert_int_equal(c->model.moe.num_experts, 4);
    assert_int_equal(c->model.moe.top_k, 2);
    assert_int_equal(c->model.moe.expert_ffn_dim, 128);
    assert_int_equal(c->model.moe.shared_expert_ffn_dim, 0);
    assert_true(c->model.moe.aux_loss_coef == 0.01);
    assert_true(c->optimizer.lr == 0.003);
    assert_true(c->optimizer.betas[0] == 0.9 && c->optimizer.betas[1] == 0.95);
    assert_true(c->optimizer.eps == 1e-8);
    assert_true(c->optimizer.weight_decay == 0.1);
    assert_true(c->optimizer.clip_grad_norm == 1.0);
    assert_true(c->optimizer.muon.momentum == 0.95);
    assert_true(c->optimizer.muon.nesterov);
    assert_int_equal(c->optimizer.muon.ns_steps, 5);
    assert_int_equal(c->optimizer.schedule.warmup_steps, 10);
    assert_string_equal(c->optimizer.schedule.decay, "cosine");
    assert_true(c->optimizer.schedule.min_lr_ratio == 0.1);
    assert_int_equal(c->train.steps, 200);
    assert_int_equal(c->train.global_batch_size, 0); /* null: micro_batch_size x dp_size */
    assert_int_equal(c->train.micro_batch_size, 8);
    assert_int_equal(c->train.seq_len, 64);
    assert_int_equal(c->train.seed, 1234);
    assert_false(c->train.activation_checkpointing);
    assert_int_equal(c->train.log_every, 10);
    assert_int_equal(c->train.eval_every, 50);
    assert_string_equal(c->train.out_dir, "runs/default");
    assert_string_equal(c->data.source, "builtin");
    assert_string_equal(c->data.path, "");
    assert_true(c->data.val_fraction == 0.05);
    assert_string_equal(c->checkpoint.dir, "");
    assert_int_equal(c->checkpoint.save_every, 0);
    assert_string_equal(c->checkpoint.resume, "none");
    assert_int_equal(c->checkpoint.keep_last, 2);
    assert_false(c->trace.enabled);
    assert_string_equal(c->trace.dir, "");
    assert_true(c->comm.timeout_s == 600);
    loaded_free(l);
}

static void test_no_path_loads_the_builtin_default_with_overrides(void **state) {
    (void)state;
    hs_config c;
    hs_error e;
    const char *ov[] = {"model.dim=64"};
    assert_int_equal(hs_config_load(&c, NULL, ov, 1, &e), HS_OK);
    assert_int_equal(c.model.dim, 64);
    assert_string_equal(c.source_path, "");
    hs_config_free(&c);
}

static void test_nested_file_values_are_read_with_their_types(void **state) {
    (void)state;
    loaded *l =
        load_yaml("model:\n  arch: moe\n  norm_eps: 1.0e-6\n  moe:\n    top_k: 1\n"
                  "fsdp_config:\n  dp_shard_size: 4\n  replicate_params: [model.norm.weight]\n"
                  "  mix_precision:\n    param_dtype: bfloat16\n    reduce_dtype: float32\n"
                  "  comm_fusion_zero_copy: false\n"
                  "optimizer:\n  _target_: muon\n  betas: [0.8, 0.99]\n"
                  "train:\n  seed: 123456789012\n  out_dir: 'runs/x y'\n"
                  "data:\n  path: ~\n",
                  NULL, 0);
    assert_ok(l);
    assert_string_equal(l->c.model.arch, "moe");
    assert_true(l->c.model.norm_eps == 1e-6);
    assert_int_equal(l->c.model.moe.top_k, 1);
    assert_int_equal(l->c.fsdp.dp_shard_size, 4);
    assert_int_equal(l->c.fsdp.n_replicate_params, 1);
    assert_string_equal(l->c.fsdp.replicate_params[0], "model.norm.weight");
    assert_int_equal(l->c.fsdp.mix_precision.param_dtype, HS_DTYPE_BF16);
    assert_int_equal(l->c.fsdp.mix_precision.reduce_dtype, HS_DTYPE_F32);
    assert_int_equal(l->c.fsdp.comm_fusion_zero_copy, 0);
    assert_string_equal(l->c.optimizer.target, "muon");
    assert_true(l->c.optimizer.betas[0] == 0.8 && l->c.optimizer.betas[1] == 0.99);
    assert_true(l->c.train.seed == 123456789012LL);
    assert_string_equal(l->c.train.out_dir, "runs/x y");
    assert_string_equal(l->c.data.path, "");
    loaded_free(l);
}

static void test_override_beats_the_file(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.dp_shard_size=8", "train.out_dir=runs/over # not a comment"};
    loaded *l =
        load_yaml("fsdp_config:\n  dp_shard_size: 2\ntrain:\n  out_dir: runs/file\n", ov, 2);
    assert_ok(l);
    assert_int_equal(l->c.fsdp.dp_shard_size, 8);
    assert_string_equal(l->c.train.out_dir, "runs/over # not a comment");
    loaded_free(l);
}

static void test_last_override_of_a_path_wins(void **state) {
    (void)state;
    const char *ov[] = {"train.steps=5", "model.dim=32", "train.steps=7"};
    loaded *l = load_yaml("train:\n  steps: 3\n", ov, 3);
    assert_ok(l);
    assert_int_equal(l->c.train.steps, 7);
    assert_int_equal(l->c.model.dim, 32);
    loaded_free(l);
}

static void test_list_override_replaces_replicate_params(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.replicate_params=[model.norm.weight,lm_head.weight]"};
    loaded *l = load_yaml("fsdp_config:\n  replicate_params: [a.b]\n", ov, 1);
    assert_ok(l);
    assert_int_equal(l->c.fsdp.n_replicate_params, 2);
    assert_string_equal(l->c.fsdp.replicate_params[0], "model.norm.weight");
    assert_string_equal(l->c.fsdp.replicate_params[1], "lm_head.weight");
    assert_int_equal(hs_config_override(&l->c, "fsdp_config.replicate_params=[]", &l->e), HS_OK);
    assert_int_equal(l->c.fsdp.n_replicate_params, 0);
    loaded_free(l);
}

/* accelerator.pp_layers: a flow or block sequence in a file, an override,
 * null for empty; every item an int32, at most HS_PP_MAX_STAGES of them. */
static void test_pp_layers_is_a_list_of_integers(void **state) {
    (void)state;
    loaded *l = load_yaml("accelerator:\n  pp_layers: [3, 1]\n", NULL, 0);
    assert_ok(l);
    assert_int_equal(l->c.accelerator.n_pp_layers, 2);
    assert_int_equal(l->c.accelerator.pp_layers[0], 3);
    assert_int_equal(l->c.accelerator.pp_layers[1], 1);
    loaded_free(l);
    l = load_yaml("accelerator:\n  pp_layers:\n    - 2\n    - 5\n    - 1\n", NULL, 0);
    assert_ok(l);
    assert_int_equal(l->c.accelerator.n_pp_layers, 3);
    assert_int_equal(l->c.accelerator.pp_layers[1], 5);
    assert_int_equal(hs_config_override(&l->c, "accelerator.pp_layers=[4]", &l->e), HS_OK);
    assert_int_equal(l->c.accelerator.n_pp_layers, 1);
    assert_int_equal(l->c.accelerator.pp_layers[0], 4);
    assert_int_equal(l->c.accelerator.pp_layers[1], 0); /* slots past the count are cleared */
    assert_int_equal(hs_config_override(&l->c, "accelerator.pp_layers=null", &l->e), HS_OK);
    assert_int_equal(l->c.accelerator.n_pp_layers, 0);
    loaded_free(l);
    const char *ov[] = {"accelerator.pp_layers=[3,1]"};
    l = load_yaml("", ov, 1);
    assert_ok(l);
    assert_int_equal(l->c.accelerator.n_pp_layers, 2);
    assert_int_equal(l->c.accelerator.pp_layers[0], 3);
    loaded_free(l);

    hs_config c;
    hs_error e;
    hs_config_defaults(&c, NULL);
    assert_int_equal(hs_config_override(&c, "accelerator.pp_layers=[1, 99999999999]", &e),
                     HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "accelerator.pp_layers: item 1: 99999999999 is beyond the "
                                  "integer range [-2147483648, 2147483647]"));
    assert_int_equal(hs_config_override(&c, "accelerator.pp_layers=[2, x]", &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "accelerator.pp_layers: item 1: expected an integer, got 'x'"));
    assert_int_equal(hs_config_override(&c, "accelerator.pp_layers=[2, \"3\"]", &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "item 1: expected an integer, got the quoted string \"3\""));
    assert_int_equal(hs_config_override(&c, "accelerator.pp_layers=3", &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "accelerator.pp_layers: expected a list of integers like "
                                  "[3, 5], got '3'"));
    assert_int_equal(hs_config_override(&c, "accelerator.pp_layers=[[1], 2]", &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "list items must be plain values, got a list"));
    char many[HS_PP_MAX_STAGES * 3 + 64] = "accelerator.pp_layers=[", want[96];
    for (int i = 0; i <= HS_PP_MAX_STAGES; i++) strcat(many, i ? ", 1" : "1");
    strcat(many, "]");
    assert_int_equal(hs_config_override(&c, many, &e), HS_ERR_CONFIG);
    snprintf(want, sizeof want, "accelerator.pp_layers: at most %d items are allowed, got %d",
             HS_PP_MAX_STAGES, HS_PP_MAX_STAGES + 1);
    assert_non_null(strstr(e.msg, want));
    assert_int_equal(c.accelerator.n_pp_layers, 0); /* every failure left the value */
    hs_config_free(&c);
}

static void test_pp_schedule_is_one_of_the_schedules(void **state) {
    (void)state;
    const char *ov[] = {"accelerator.pp_schedule=gpipe"};
    loaded *l = load_yaml("", ov, 1);
    assert_ok(l);
    assert_string_equal(l->c.accelerator.pp_schedule, "gpipe");
    loaded_free(l);
    l = load_yaml("accelerator:\n  pp_schedule: 1f1c\n", NULL, 0);
    assert_error_has(l, "accelerator.pp_schedule: expected one of gpipe | 1f1b | "
                        "interleaved_1f1b | zb1p | zbv, got '1f1c'; did you mean 1f1b?");
    loaded_free(l);
    l = load_yaml("accelerator:\n  pp_schedule: interleaved_1f1b\n  pp_virtual_stages: 2\n", NULL,
                  0);
    assert_ok(l);
    assert_string_equal(l->c.accelerator.pp_schedule, "interleaved_1f1b");
    assert_int_equal(l->c.accelerator.pp_virtual_stages, 2);
    loaded_free(l);
}

static void test_null_override_clears_a_nullable_key(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.mix_precision.param_dtype=null",
                        "fsdp_config.comm_fusion_zero_copy=null", "checkpoint.dir=null"};
    loaded *l = load_yaml("fsdp_config:\n  mix_precision:\n    param_dtype: float16\n"
                          "  comm_fusion_zero_copy: true\ncheckpoint:\n  dir: ck\n",
                          ov, 3);
    assert_ok(l);
    assert_int_equal(l->c.fsdp.mix_precision.param_dtype, HS_MP_NULL);
    assert_int_equal(l->c.fsdp.comm_fusion_zero_copy, -1);
    assert_string_equal(l->c.checkpoint.dir, "");
    loaded_free(l);
}

static void test_null_for_a_non_nullable_key_is_an_error(void **state) {
    (void)state;
    const char *ov[] = {"model.dim=null"};
    loaded *l = load_yaml("", ov, 1);
    assert_error_has(l, "model.dim");
    assert_error_has(l, "expected an integer");
    loaded_free(l);
}

static void test_global_batch_size_is_a_nullable_integer(void **state) {
    (void)state;
    const char *ov[] = {"train.global_batch_size=null"};
    loaded *l = load_yaml("train:\n  global_batch_size: 32\n", ov, 1);
    assert_ok(l);
    assert_int_equal(l->c.train.global_batch_size, 0);
    hs_topology t = {.dp = 8};
    assert_int_equal(hs_config_global_batch(&l->c, &t), 8 * 8);
    assert_int_equal(hs_config_micro_batches(&l->c, &t), 1);
    assert_int_equal(hs_config_override(&l->c, "train.global_batch_size=128", &l->e), HS_OK);
    assert_int_equal(hs_config_global_batch(&l->c, &t), 128);
    assert_int_equal(hs_config_micro_batches(&l->c, &t), 2);
    loaded_free(l);
    /* 0 is not a way to write null */
    loaded *z = load_yaml("train:\n  global_batch_size: 0\n", NULL, 0);
    assert_error_has(z, "train.global_batch_size: 0 is out of range: it must be >= 1, or null");
    loaded_free(z);
}

static void test_integer_beyond_int32_names_the_range(void **state) {
    (void)state;
    const char *ov[] = {"train.micro_batch_size=99999999999"};
    loaded *l = load_yaml("", ov, 1);
    assert_error_has(l, "train.micro_batch_size: 99999999999 is beyond the integer range "
                        "[-2147483648, 2147483647]");
    loaded_free(l);
}

static void test_deep_flow_nesting_is_refused_before_parsing(void **state) {
    (void)state;
    char yaml[512] = "train:\n  steps: ";
    size_t n = strlen(yaml);
    for (int i = 0; i < 100; i++) yaml[n++] = '[';
    for (int i = 0; i < 100; i++) yaml[n++] = ']';
    yaml[n++] = '\n';
    yaml[n] = '\0';
    loaded *l = load_yaml(yaml, NULL, 0);
    assert_error_has(l, ":2:74: flow collections ([...] and {...}) nest more than 64 deep");
    loaded_free(l);
    /* brackets inside quotes or comments are text */
    char quoted[512] = "checkpoint:\n  dir: \"";
    n = strlen(quoted);
    for (int i = 0; i < 100; i++) quoted[n++] = '[';
    strcpy(quoted + n,
           "\"   # {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{\n");
    loaded *q = load_yaml(quoted, NULL, 0);
    assert_ok(q);
    assert_int_equal(strlen(q->c.checkpoint.dir), 100);
    loaded_free(q);
}

static void test_float_pair_override_sets_both_betas(void **state) {
    (void)state;
    hs_config c;
    hs_error e;
    hs_config_defaults(&c, NULL);
    assert_int_equal(hs_config_override(&c, "optimizer.betas=[0.5, 0.75]", &e), HS_OK);
    assert_true(c.optimizer.betas[0] == 0.5 && c.optimizer.betas[1] == 0.75);
    assert_int_equal(hs_config_override(&c, "optimizer.betas=[0.5]", &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "optimizer.betas"));
    assert_true(c.optimizer.betas[0] == 0.5 && c.optimizer.betas[1] == 0.75);
    hs_config_free(&c);
}

static void test_unknown_key_suggests_the_nearest_path(void **state) {
    (void)state;
    loaded *l = load_yaml("fsdp_config:\n  dp_shard_sise: 2\n", NULL, 0);
    assert_error_has(l, "unknown key fsdp_config.dp_shard_sise; did you mean "
                        "fsdp_config.dp_shard_size?");
    assert_error_has(l, ":2:3:");
    loaded_free(l);
}

static void test_key_in_the_wrong_section_suggests_its_full_path(void **state) {
    (void)state;
    loaded *l = load_yaml("fsdp_config:\n  param_dtype: bfloat16\n", NULL, 0);
    assert_error_has(l, "did you mean fsdp_config.mix_precision.param_dtype?");
    loaded_free(l);
}

static void test_unknown_key_far_from_all_lists_the_valid_keys(void **state) {
    (void)state;
    loaded *l = load_yaml("comm:\n  zzzzzzzzzz: 1\n", NULL, 0);
    assert_error_has(l, "unknown key comm.zzzzzzzzzz; valid keys under comm: timeout_s");
    loaded_free(l);
}

static void test_unknown_override_path_is_an_error_like_an_unknown_key(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.dp_shard_sise=2"};
    loaded *l = load_yaml("", ov, 1);
    assert_error_has(l, "override: unknown key fsdp_config.dp_shard_sise; did you mean "
                        "fsdp_config.dp_shard_size?");
    loaded_free(l);
}

static void test_override_without_equals_or_of_a_section_is_an_error(void **state) {
    (void)state;
    hs_config c;
    hs_error e;
    hs_config_defaults(&c, NULL);
    assert_int_equal(hs_config_override(&c, "model.dim", &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "expected KEY=VALUE"));
    assert_int_equal(hs_config_override(&c, "model=3", &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "model is a section"));
    hs_config_free(&c);
}

static const char *const removed[][2] = {
    {"enabled", "there is no FSDP switch"},
    {"dp_replicate_size", "derived as (dp_size x cp_size) / fsdp_config.dp_shard_size"},
    {"wrap_policy", "wraps every transformer block"},
    {"auto_wrap_policy", "wraps every transformer block"},
    {"mixed_precision", "renamed to fsdp_config.mix_precision"},
    {"cpu_offload", "replaced by fsdp_config.enable_offload"},
    {"forward_prefetch", "replaced by fsdp_config.forward_prefetch_depth"},
    {"backward_prefetch", "replaced by fsdp_config.backward_prefetch_depth"},
};

static void test_each_removed_key_fails_naming_its_replacement(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++) {
        char yaml[256], ov[256];
        snprintf(yaml, sizeof yaml, "fsdp_config:\n  %s: true\n", removed[i][0]);
        loaded *l = load_yaml(yaml, NULL, 0);
        assert_error_has(l, removed[i][1]);
        char path[128];
        snprintf(path, sizeof path, "fsdp_config.%s", removed[i][0]);
        assert_error_has(l, path);
        loaded_free(l);
        snprintf(ov, sizeof ov, "fsdp_config.%s=true", removed[i][0]);
        const char *ovs[] = {ov};
        l = load_yaml("", ovs, 1);
        assert_error_has(l, removed[i][1]);
        loaded_free(l);
    }
}

static void test_removed_section_with_children_names_the_new_section(void **state) {
    (void)state;
    loaded *l = load_yaml("fsdp_config:\n  mixed_precision:\n    param_dtype: bfloat16\n", NULL, 0);
    assert_error_has(l, "fsdp_config.mixed_precision was renamed to fsdp_config.mix_precision");
    assert_int_equal(l->e.lines, 1);
    loaded_free(l);
}

static void test_yaml_syntax_error_reports_file_line_and_column(void **state) {
    (void)state;
    loaded *l = load_yaml("model:\n  dim: 64\n  n_layers: [1, 2\ntrain:\n  steps: 3\n", NULL, 0);
    assert_int_equal(l->st, HS_ERR_CONFIG);
    char where[128];
    snprintf(where, sizeof where, "%s:4:", l->path);
    assert_error_has(l, where);
    assert_error_has(l, "YAML syntax error");
    loaded_free(l);
}

static void test_wrong_type_names_path_value_and_expected_type(void **state) {
    (void)state;
    loaded *l = load_yaml("fsdp_config:\n  dp_shard_size: four\n", NULL, 0);
    assert_error_has(l, ":2:18: fsdp_config.dp_shard_size: expected an integer, got 'four'");
    loaded_free(l);
}

static void test_quoted_number_is_not_an_integer(void **state) {
    (void)state;
    loaded *l = load_yaml("train:\n  steps: \"10\"\n", NULL, 0);
    assert_error_has(l, "train.steps: expected an integer, got the quoted string \"10\"");
    loaded_free(l);
}

static void test_bad_enum_value_lists_choices_and_suggests(void **state) {
    (void)state;
    loaded *l = load_yaml("model:\n  arch: lama\n", NULL, 0);
    assert_error_has(
        l,
        "model.arch: expected one of llama | moe | qwen3 | qwen3_moe | deepseek_v3, got 'lama'; did you mean llama?");
    loaded_free(l);
}

static void test_bad_dtype_names_the_allowed_dtypes(void **state) {
    (void)state;
    loaded *l = load_yaml("fsdp_config:\n  mix_precision:\n    reduce_dtype: float64\n", NULL, 0);
    assert_error_has(l, "fsdp_config.mix_precision.reduce_dtype: expected a dtype (float16, "
                        "bfloat16, float32) or null, got 'float64'");
    loaded_free(l);
}

static void test_a_list_where_a_number_belongs_is_a_type_error(void **state) {
    (void)state;
    loaded *l = load_yaml("model:\n  dim: [1, 2]\n  n_layers: {a: 1}\n", NULL, 0);
    assert_error_has(l, "model.dim: expected an integer, got a list");
    assert_error_has(l, "model.n_layers: expected an integer, got a mapping");
    loaded_free(l);
}

static void test_several_errors_of_a_file_are_reported_together(void **state) {
    (void)state;
    const char *ov[] = {"train.steps=many"};
    loaded *l = load_yaml("model:\n  dim: x\n  arch: gpt\nfsdp_config:\n  cpu_offload: true\n"
                          "bogus: 1\n",
                          ov, 1);
    assert_int_equal(l->e.lines, 5);
    assert_error_has(l, "model.dim");
    assert_error_has(l, "model.arch");
    assert_error_has(l, "fsdp_config.cpu_offload");
    assert_error_has(l, "bogus");
    assert_error_has(l, "train.steps");
    loaded_free(l);
}

/* Found by fuzzing: a C1 control character written as an escape used to be
 * accepted, and the dump then held a raw byte no YAML reader accepts. */
static void test_control_character_escapes_are_rejected_in_values(void **state) {
    (void)state;
    loaded *l = load_yaml("data:\n  path: \"a\\x82b\"\n", NULL, 0);
    assert_error_has(l, "data.path: the value is not valid UTF-8 or holds a control character");
    loaded_free(l);
    l = load_yaml("data:\n  path: \"a\\x01b\"\n", NULL, 0);
    assert_error_has(l, "data.path: control character 0x01");
    loaded_free(l);
    l = load_yaml("train:\n  steps: !!int \"12\\0x\"\n", NULL, 0);
    assert_error_has(l, "train.steps: the value holds a NUL byte");
    loaded_free(l);
}

static void test_duplicate_key_is_an_error(void **state) {
    (void)state;
    loaded *l = load_yaml("train:\n  steps: 1\n  steps: 2\n", NULL, 0);
    assert_error_has(l, "duplicate key train.steps (first given at line 2)");
    loaded_free(l);
}

static void test_aliases_are_refused(void **state) {
    (void)state;
    loaded *l = load_yaml("train:\n  steps: &n 4\n  log_every: *n\n", NULL, 0);
    assert_error_has(l, "train.log_every: aliases (*name) are not supported");
    loaded_free(l);
}

static void test_top_level_must_be_a_mapping(void **state) {
    (void)state;
    loaded *l = load_yaml("- a\n- b\n", NULL, 0);
    assert_error_has(l, "the top level must be a mapping");
    loaded_free(l);
}

static void test_failed_load_leaves_the_builtin_default(void **state) {
    (void)state;
    loaded *l = load_yaml("model:\n  dim: 64\n  n_heads: x\n", NULL, 0);
    assert_int_equal(l->st, HS_ERR_CONFIG);
    assert_int_equal(l->c.model.dim, 128);
    loaded_free(l);
}

static void test_missing_file_is_a_usage_error_naming_the_file(void **state) {
    (void)state;
    hs_config c;
    hs_error e;
    assert_int_equal(hs_config_load(&c, "/nonexistent/x.yaml", NULL, 0, &e), HS_ERR_USAGE);
    assert_int_equal(hs_status_exit_code(e.code), 2);
    assert_non_null(strstr(e.msg, "/nonexistent/x.yaml"));
    hs_config_free(&c);
}

static char *dump_to_string(const hs_config *c, const hs_topology *t) {
    FILE *f = tmpfile();
    assert_non_null(f);
    hs_config_dump(c, t, f, NULL);
    long n = ftell(f);
    rewind(f);
    char *text = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return text;
}

/* dump -> load -> dump is identical, for values of every type (including
 * the derived block, which loading ignores). */
static void test_dump_loads_back_to_the_same_config(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.replicate_params=[model.norm.weight, \"lm_head.weight\"]",
                        "train.out_dir=runs/a \"quoted\" \\ dir\twith tab",
                        "fsdp_config.mix_precision.param_dtype=bf16",
                        "fsdp_config.comm_fusion_zero_copy=true",
                        "optimizer.lr=0.00031415926535897",
                        "model.norm_eps=1e-7",
                        "train.seed=-9223372036854775807",
                        "checkpoint.resume=auto",
                        "data.path=data/ünïcode.txt",
                        "accelerator.pp_layers=[3, 1]"};
    loaded *l = load_yaml("model:\n  arch: moe\n", ov, 10);
    assert_ok(l);
    hs_topology t = {.world = 4,
                     .tp = 1,
                     .cp = 1,
                     .ep = 1,
                     .pp = 1,
                     .dp_shard = 2,
                     .edp_shard = 1,
                     .dp = 4,
                     .fsdp_dp = 4,
                     .dp_replicate = 2,
                     .expert_domain = 4,
                     .edp = 4,
                     .edp_replicate = 4};
    char *first = dump_to_string(&l->c, &t);
    assert_non_null(strstr(first, "derived:\n"));
    assert_non_null(strstr(first, "  dp_replicate_size: 2\n"));
    loaded *again = load_yaml(first, NULL, 0);
    assert_ok(again);
    char *second = dump_to_string(&again->c, &t);
    assert_string_equal(first, second);
    assert_true(hash_of(&l->c) == hash_of(&again->c));
    assert_string_equal(again->c.train.out_dir, "runs/a \"quoted\" \\ dir\twith tab");
    assert_non_null(strstr(first, "  pp_layers: [3, 1]\n"));
    assert_int_equal(again->c.accelerator.n_pp_layers, 2);
    free(first);
    free(second);
    loaded_free(again);
    loaded_free(l);
}

/* With pp > 1 the derived block lists the schedule, each stage's blocks and
 * ranks, and the pp groups, and still loads back. */
static void test_dump_derives_the_pipeline_stages(void **state) {
    (void)state;
    const char *ov[] = {"accelerator.pp_size=2", "accelerator.tp_size=2", "model.n_layers=5",
                        "train.global_batch_size=32"};
    loaded *l = load_yaml("", ov, 4);
    assert_ok(l);
    hs_topology t;
    assert_int_equal(hs_config_validate(&l->c, 8, &t, NULL, &l->e), HS_OK);
    char *first = dump_to_string(&l->c, &t);
    const char *want = "  pp_schedule: 1f1b\n"
                       "  pp_stages:\n"
                       "    - {stage: 0, layers: \"[0, 3)\", ranks: [0, 1, 2, 3]}\n"
                       "    - {stage: 1, layers: \"[3, 5)\", ranks: [4, 5, 6, 7]}\n"
                       "  pp_groups: [[0, 4], [1, 5], [2, 6], [3, 7]]\n";
    if (!strstr(first, want)) fail_msg("'%s' not in:\n%s", want, first);
    loaded *again = load_yaml(first, NULL, 0);
    assert_ok(again);
    char *second = dump_to_string(&again->c, &t);
    assert_string_equal(first, second);
    free(first);
    free(second);
    loaded_free(again);
    loaded_free(l);
}

static void test_dump_lists_every_key_in_schema_sections(void **state) {
    (void)state;
    hs_config c;
    hs_config_defaults(&c, NULL);
    char *text = dump_to_string(&c, NULL);
    assert_non_null(strstr(text, "fsdp_config:\n  dp_shard_size: 1\n"));
    assert_non_null(strstr(text, "  mix_precision:\n    param_dtype: null\n"));
    assert_non_null(strstr(text, "  comm_fusion_zero_copy: null\n"));
    assert_non_null(strstr(text, "  betas: [0.9, 0.95]\n"));
    assert_non_null(strstr(text, "  replicate_params: []\n"));
    assert_non_null(strstr(text, "  pp_schedule: 1f1b\n  pp_virtual_stages: 1\n  pp_layers: []\n"));
    assert_non_null(strstr(text, "compile:\n  fullgraph: false\n"));
    assert_null(strstr(text, "derived:"));
    /* Each section opens exactly once. */
    const char *first = strstr(text, "\nmodel:\n");
    assert_true(text == strstr(text, "model:\n"));
    assert_null(first);
    assert_null(strstr(strstr(text, "  moe:\n") + 1, "  moe:\n"));
    free(text);
    hs_config_free(&c);
}

static bool in_section(const char *path, const char *section, size_t len) {
    return !strncmp(path, section, len) && path[len] == '.';
}

/* The dump opens each section once, so a section's keys must be contiguous
 * in the schema; every key must also have a doc line and a default. */
static void test_schema_sections_are_contiguous_and_documented(void **state) {
    (void)state;
    int n;
    const hs_cfg_key *keys = hs_cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        assert_non_null(keys[i].doc);
        assert_non_null(keys[i].def);
        for (int j = 0; j < i; j++)
            if (!strcmp(keys[i].path, keys[j].path)) fail_msg("key %s twice", keys[i].path);
        const char *p = keys[i].path;
        for (size_t cut = 1; p[cut]; cut++) {
            if (p[cut] != '.') continue;
            int first = -1, last = -1;
            for (int j = 0; j < n; j++)
                if (in_section(keys[j].path, p, cut)) last = j, first = first < 0 ? j : first;
            for (int j = first; j <= last; j++)
                if (!in_section(keys[j].path, p, cut))
                    fail_msg("section %.*s is split by %s", (int)cut, p, keys[j].path);
        }
    }
}

static void test_hash_changes_with_any_value(void **state) {
    (void)state;
    hs_config a, b;
    hs_error e;
    hs_config_defaults(&a, NULL);
    hs_config_copy(&b, &a, NULL);
    assert_true(hash_of(&a) == hash_of(&b));
    assert_int_equal(hs_config_override(&b, "fsdp_config.replicate_params=[x]", &e), HS_OK);
    assert_true(hash_of(&a) != hash_of(&b));
    hs_config_free(&b);
    hs_config_copy(&b, &a, NULL);
    assert_int_equal(hs_config_override(&b, "accelerator.pp_layers=[2, 2]", &e), HS_OK);
    uint64_t h22 = hash_of(&b);
    assert_true(hash_of(&a) != h22);
    assert_int_equal(hs_config_override(&b, "accelerator.pp_layers=[3, 1]", &e), HS_OK);
    assert_true(hash_of(&b) != h22);
    hs_config_free(&a);
    hs_config_free(&b);
}

static void test_copy_is_deep(void **state) {
    (void)state;
    hs_config a, b;
    hs_error e;
    hs_config_defaults(&a, NULL);
    assert_int_equal(hs_config_override(&a, "fsdp_config.replicate_params=[x, y]", &e), HS_OK);
    hs_config_copy(&b, &a, NULL);
    hs_config_free(&a);
    assert_int_equal(b.fsdp.n_replicate_params, 2);
    assert_string_equal(b.fsdp.replicate_params[1], "y");
    hs_config_free(&b);
    hs_config_defaults(&a, NULL);
    assert_int_equal(hs_config_override(&a, "accelerator.pp_layers=[3, 1]", &e), HS_OK);
    hs_config_copy(&b, &a, NULL);
    a.accelerator.pp_layers[0] = 9;
    assert_int_equal(b.accelerator.n_pp_layers, 2);
    assert_int_equal(b.accelerator.pp_layers[0], 3);
    hs_config_free(&a);
    hs_config_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_yaml_resolves_every_spec_default),
        cmocka_unit_test(test_minimal_yaml_resolves_every_trainer_default),
        cmocka_unit_test(test_no_path_loads_the_builtin_default_with_overrides),
        cmocka_unit_test(test_nested_file_values_are_read_with_their_types),
        cmocka_unit_test(test_override_beats_the_file),
        cmocka_unit_test(test_last_override_of_a_path_wins),
        cmocka_unit_test(test_list_override_replaces_replicate_params),
        cmocka_unit_test(test_pp_layers_is_a_list_of_integers),
        cmocka_unit_test(test_pp_schedule_is_one_of_the_schedules),
        cmocka_unit_test(test_null_override_clears_a_nullable_key),
        cmocka_unit_test(test_null_for_a_non_nullable_key_is_an_error),
        cmocka_unit_test(test_global_batch_size_is_a_nullable_integer),
        cmocka_unit_test(test_integer_beyond_int32_names_the_range),
        cmocka_unit_test(test_deep_flow_nesting_is_refused_before_parsing),
        cmocka_unit_test(test_float_pair_override_sets_both_betas),
        cmocka_unit_test(test_unknown_key_suggests_the_nearest_path),
        cmocka_unit_test(test_key_in_the_wrong_section_suggests_its_full_path),
        cmocka_unit_test(test_unknown_key_far_from_all_lists_the_valid_keys),
        cmocka_unit_test(test_unknown_override_path_is_an_error_like_an_unknown_key),
        cmocka_unit_test(test_override_without_equals_or_of_a_section_is_an_error),
        cmocka_unit_test(test_each_removed_key_fails_naming_its_replacement),
        cmocka_unit_test(test_removed_section_with_children_names_the_new_section),
        cmocka_unit_test(test_yaml_syntax_error_reports_file_line_and_column),
        cmocka_unit_test(test_wrong_type_names_path_value_and_expected_type),
        cmocka_unit_test(test_quoted_number_is_not_an_integer),
        cmocka_unit_test(test_bad_enum_value_lists_choices_and_suggests),
        cmocka_unit_test(test_bad_dtype_names_the_allowed_dtypes),
        cmocka_unit_test(test_a_list_where_a_number_belongs_is_a_type_error),
        cmocka_unit_test(test_several_errors_of_a_file_are_reported_together),
        cmocka_unit_test(test_control_character_escapes_are_rejected_in_values),
        cmocka_unit_test(test_duplicate_key_is_an_error),
        cmocka_unit_test(test_aliases_are_refused),
        cmocka_unit_test(test_top_level_must_be_a_mapping),
        cmocka_unit_test(test_failed_load_leaves_the_builtin_default),
        cmocka_unit_test(test_missing_file_is_a_usage_error_naming_the_file),
        cmocka_unit_test(test_dump_loads_back_to_the_same_config),
        cmocka_unit_test(test_dump_derives_the_pipeline_stages),
        cmocka_unit_test(test_dump_lists_every_key_in_schema_sections),
        cmocka_unit_test(test_schema_sections_are_contiguous_and_documented),
        cmocka_unit_test(test_hash_changes_with_any_value),
        cmocka_unit_test(test_copy_is_deep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
