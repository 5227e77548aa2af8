/* Validation: the 11 rules of spec 004 §4.1 (one failing and one passing
 * case each, the message naming the config path), the trainer's rules, and
 * the §4.2 warnings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "hypershard/config.h"

typedef struct checked {
    hs_status st;
    hs_error e;
    hs_topology topo;
    char warnings[8192];
} checked;

/* Defaults + overrides, validated for `world`; warnings captured from stderr. */
static checked *check(int world, const char *const *ov, int n) {
    checked *r = calloc(1, sizeof *r);
    hs_config c;
    assert_int_equal(hs_config_load(&c, NULL, ov, n, &r->e), HS_OK);
    hs_log log;
    hs_log_init(&log, 0, 1);
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    r->st = hs_config_validate(&c, world, &r->topo, &log, &r->e);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t got = fread(r->warnings, 1, sizeof r->warnings - 1, tmp);
    r->warnings[got] = '\0';
    fclose(tmp);
    hs_config_free(&c);
    return r;
}

/* A literal list of overrides and its length. */
#define OV(...)                                                                                    \
    (const char *const[]){__VA_ARGS__},                                                            \
        (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

static void expect_error(checked *r, const char *needle) {
    if (r->st != HS_ERR_CONFIG) fail_msg("expected a config error with '%s', got ok", needle);
    if (!strstr(r->e.msg, needle)) fail_msg("'%s' not in:\n%s", needle, r->e.msg);
    free(r);
}

/* The config breaks nothing but `line`, the one error reported. */
static void expect_only_error(checked *r, const char *line) {
    if (r->st != HS_ERR_CONFIG) fail_msg("expected the error '%s', got ok", line);
    if (r->e.lines != 1 || strcmp(r->e.msg, line))
        fail_msg("expected only:\n%s\ngot %d lines:\n%s", line, r->e.lines, r->e.msg);
    free(r);
}

static void expect_ok(checked *r) {
    if (r->st != HS_OK) fail_msg("expected ok, got:\n%s", r->e.msg);
    free(r);
}

static void expect_warning(checked *r, const char *needle) {
    if (r->st != HS_OK) fail_msg("expected ok, got:\n%s", r->e.msg);
    if (!strstr(r->warnings, needle)) fail_msg("'%s' not in warnings:\n%s", needle, r->warnings);
    free(r);
}

static void expect_no_warning(checked *r) {
    if (r->st != HS_OK) fail_msg("expected ok, got:\n%s", r->e.msg);
    if (r->warnings[0]) fail_msg("unexpected warnings:\n%s", r->warnings);
    free(r);
}

static void test_rule1_dp_shard_size_below_1_fails(void **state) {
    (void)state;
    expect_error(check(2, OV("fsdp_config.dp_shard_size=0")), "fsdp_config.dp_shard_size");
    expect_ok(check(2, OV("fsdp_config.dp_shard_size=2", "train.global_batch_size=16")));
}

static void test_rule2_edp_shard_size_below_1_fails(void **state) {
    (void)state;
    expect_error(check(1, OV("fsdp_config.edp_shard_size=0")), "fsdp_config.edp_shard_size");
    expect_ok(check(1, OV("fsdp_config.edp_shard_size=1")));
}

static void test_rule3_negative_prefetch_depth_fails(void **state) {
    (void)state;
    expect_error(check(1, OV("fsdp_config.forward_prefetch_depth=-1")),
                 "fsdp_config.forward_prefetch_depth = -1 must be >= 0");
    expect_error(check(1, OV("fsdp_config.backward_prefetch_depth=-2")),
                 "fsdp_config.backward_prefetch_depth = -2 must be >= 0");
    expect_ok(check(
        1, OV("fsdp_config.forward_prefetch_depth=0", "fsdp_config.backward_prefetch_depth=3")));
}

/* A derivation checked on its own, as spec 004 §2.1 has the topology rules. */
static hs_topology derive_ok(int world, int tp, int cp, int ep, int pp, int dp_shard,
                             int edp_shard) {
    hs_topology t;
    hs_error e;
    hs_error_clear(&e);
    if (hs_topology_derive(&t, world, tp, cp, ep, pp, dp_shard, edp_shard, &e) != HS_OK)
        fail_msg("topology of world %d should derive, got:\n%s", world, e.msg);
    return t;
}

static void test_rule4_world_not_divisible_by_tp_cp_pp_fails(void **state) {
    (void)state;
    expect_error(check(6, OV("accelerator.tp_size=4")), "accelerator.tp_size");
    expect_error(check(2, OV("accelerator.tp_size=4", "accelerator.pp_size=4")),
                 "accelerator.tp_size");
    expect_error(
        check(12, OV("accelerator.tp_size=2", "accelerator.pp_size=2", "accelerator.cp_size=2")),
        "world size 12 is not divisible by accelerator.tp_size × cp_size × pp_size = 8");
    expect_ok(check(8, OV("accelerator.tp_size=2", "train.global_batch_size=32")));
    /* Rule 4 holds for tp 2 x pp 2 on 8 ranks. */
    expect_ok(check(
        8, OV("accelerator.tp_size=2", "accelerator.pp_size=2", "train.global_batch_size=32")));
    hs_topology t = derive_ok(8, 2, 1, 1, 2, 1, 1);
    assert_int_equal(t.dp, 2);
}

static void test_rule5_dp_cp_domain_not_divisible_by_dp_shard_fails(void **state) {
    (void)state;
    expect_error(check(4, OV("fsdp_config.dp_shard_size=3")), "fsdp_config.dp_shard_size");
    expect_ok(check(4, OV("fsdp_config.dp_shard_size=4", "train.global_batch_size=32")));
}

static void test_rule6_expert_domain_not_divisible_by_ep_fails(void **state) {
    (void)state;
    expect_error(check(4, OV("accelerator.ep_size=3", "model.arch=moe")),
                 "accelerator.ep_size=3 does not divide the expert domain");
    expect_ok(
        check(4, OV("accelerator.ep_size=2", "model.arch=moe", "train.global_batch_size=32")));
    hs_topology t = derive_ok(4, 1, 1, 2, 1, 1, 1);
    assert_int_equal(t.expert_domain, 4);
    assert_int_equal(t.edp, 2);
}

static void test_rule7_edp_not_divisible_by_edp_shard_fails(void **state) {
    (void)state;
    expect_error(check(4, OV("accelerator.ep_size=2", "model.arch=moe",
                             "fsdp_config.edp_shard_size=3", "train.global_batch_size=32")),
                 "fsdp_config.edp_shard_size");
    expect_ok(check(4, OV("accelerator.ep_size=2", "model.arch=moe", "fsdp_config.edp_shard_size=2",
                          "train.global_batch_size=32")));
    hs_topology t = derive_ok(4, 1, 1, 2, 1, 1, 2);
    assert_int_equal(t.edp_replicate, 1);
}

static void test_rule8_fp32_main_grad_without_fp32_reduce_fails(void **state) {
    (void)state;
    expect_error(check(1, OV("fsdp_config.mix_precision.fp32_main_grad=true",
                             "optimizer.fp32_main_params=true")),
                 "fsdp_config.mix_precision.reduce_dtype = float32, got null");
    expect_error(check(1, OV("fsdp_config.mix_precision.fp32_main_grad=true",
                             "fsdp_config.mix_precision.reduce_dtype=bfloat16",
                             "optimizer.fp32_main_params=true")),
                 "got bfloat16");
    expect_ok(check(1, OV("fsdp_config.mix_precision.fp32_main_grad=true",
                          "fsdp_config.mix_precision.reduce_dtype=float32",
                          "optimizer.fp32_main_params=true")));
}

static void test_rule9_main_grad_and_main_params_must_match(void **state) {
    (void)state;
    expect_error(check(1, OV("fsdp_config.mix_precision.fp32_main_grad=true",
                             "fsdp_config.mix_precision.reduce_dtype=float32")),
                 "optimizer.fp32_main_params = false");
    expect_error(check(1, OV("optimizer.fp32_main_params=true")),
                 "fsdp_config.mix_precision.fp32_main_grad = false but optimizer.fp32_main_params "
                 "= true");
    expect_ok(check(1, OV("optimizer.fp32_main_params=false")));
}

static void test_rule10_fullgraph_with_fsdp_fails_and_without_warns(void **state) {
    (void)state;
    expect_error(check(2, OV("compile.fullgraph=true", "fsdp_config.dp_shard_size=2")),
                 "compile.fullgraph = true is not supported while FSDP is active");
    expect_warning(check(1, OV("compile.fullgraph=true")),
                   "compile.fullgraph = true has no effect");
}

static void test_rule11_unknown_replicate_param_names_the_nearest_fqn(void **state) {
    (void)state;
    hs_config c;
    hs_error e;
    const char *ov[] = {"fsdp_config.replicate_params=[model.norm.weight, lm_head.weigth]"};
    assert_int_equal(hs_config_load(&c, NULL, ov, 1, &e), HS_OK);
    const char *fqns[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
    hs_error_clear(&e);
    assert_int_equal(hs_config_check_fqns(&c.fsdp, fqns, 3, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "fsdp_config.replicate_params[1] = 'lm_head.weigth' is not a "
                                  "parameter of the model; did you mean 'lm_head.weight'?"));
    assert_int_equal(e.lines, 1);
    hs_error_clear(&e);
    const char *all[] = {"model.norm.weight", "lm_head.weigth"};
    assert_int_equal(hs_config_check_fqns(&c.fsdp, all, 2, &e), HS_OK);
    hs_config_free(&c);
}

static void test_global_batch_must_split_into_whole_micro_batches(void **state) {
    (void)state;
    expect_error(check(4, OV("train.global_batch_size=16", "train.micro_batch_size=8")),
                 "train.global_batch_size = 16 is not a multiple of train.micro_batch_size x "
                 "dp_size = 8 x 4 = 32");
    expect_error(check(2, OV("train.global_batch_size=10", "train.micro_batch_size=3")),
                 "set train.global_batch_size: 12, or train.micro_batch_size: 1");
    checked *r = check(2, OV("train.global_batch_size=48", "train.micro_batch_size=8"));
    assert_int_equal(r->st, HS_OK);
    hs_config c;
    hs_config_defaults(&c, NULL);
    c.train.global_batch_size = 48;
    assert_int_equal(hs_config_micro_batches(&c, &r->topo), 3);
    free(r);
}

static void test_model_shape_rules_name_both_values(void **state) {
    (void)state;
    expect_error(check(1, OV("model.n_heads=3")),
                 "model.dim = 128 is not divisible by model.n_heads = 3");
    expect_error(check(1, OV("model.n_kv_heads=3")),
                 "model.n_heads = 4 is not divisible by model.n_kv_heads = 3");
    expect_error(check(1, OV("model.dim=12", "model.n_heads=4", "model.n_kv_heads=1")),
                 "must be even for RoPE");
    expect_error(check(1, OV("model.arch=moe", "model.moe.top_k=5")),
                 "model.moe.top_k = 5 exceeds model.moe.num_experts = 4");
    expect_ok(check(1, OV("model.arch=moe", "model.moe.top_k=4", "model.n_kv_heads=4")));
    expect_error(
        check(1, OV("model.rope_scaling.type=llama3", "model.rope_scaling.low_freq_factor=4",
                    "model.rope_scaling.high_freq_factor=4")),
        "model.rope_scaling.high_freq_factor = 4 must exceed low_freq_factor = 4");
    expect_ok(check(1, OV("model.rope_scaling.type=yarn", "model.rope_scaling.low_freq_factor=4",
                          "model.rope_scaling.high_freq_factor=4")));
}

static void test_positive_sizes_are_required(void **state) {
    (void)state;
    expect_error(check(1, OV("train.steps=0")), "train.steps = 0 is out of range: it must be >= 1");
    expect_error(check(1, OV("train.seq_len=-4")), "train.seq_len = -4");
    expect_error(check(1, OV("model.dim=0")), "model.dim = 0");
    expect_error(check(1, OV("optimizer.lr=0")),
                 "optimizer.lr = 0.0 is out of range: it must be > 0");
    expect_error(check(1, OV("optimizer.betas=[0.9, 1.0]")), "optimizer.betas[1] = 1.0");
}

static void test_text_and_token_data_need_a_path(void **state) {
    (void)state;
    expect_error(check(1, OV("data.source=text")), "data.path is required when data.source = text");
    expect_ok(check(1, OV("data.source=tokens", "data.path=corpus.bin")));
}

static void test_vocab_below_256_with_byte_data_is_refused_as_train_would(void **state) {
    (void)state;
    expect_only_error(check(1, OV("model.vocab_size=100")),
                      "model.vocab_size: 100 is too small for data.source builtin, which uses "
                      "byte tokens; set model.vocab_size >= 256");
    expect_error(check(1, OV("model.vocab_size=255", "data.source=text", "data.path=a.txt")),
                 "model.vocab_size: 255 is too small for data.source text");
    expect_ok(check(1, OV("model.vocab_size=100", "data.source=tokens", "data.path=corpus.bin")));
    expect_ok(check(1, OV("model.vocab_size=256")));
}

/* ------------------------------------------------------------- size products */

static void test_dim_x_ffn_dim_x_layers_overflow_is_refused_naming_the_keys(void **state) {
    (void)state;
    checked *r = check(1, OV("model.dim=2097152", "model.n_heads=64", "model.ffn_dim=2000000000",
                             "model.n_layers=100000"));
    /* The attention product overflows too: each term is its own line. */
    assert_int_equal(r->e.lines, 2);
    expect_error(r, "the model's MLP parameters: model.dim x model.ffn_dim x model.n_layers = "
                    "2097152 x 2000000000 x 100000, times 192 bytes");
    expect_error(check(1, OV("model.arch=moe", "model.dim=65536", "model.n_heads=64",
                             "model.moe.num_experts=65536", "model.moe.expert_ffn_dim=65536",
                             "model.n_layers=100000")),
                 "model.moe.num_experts x model.moe.expert_ffn_dim x model.dim x model.n_layers "
                 "= 65536 x 65536 x 65536 x 100000");
    /* A model this large whose bytes still fit int64 passes (the memory
     * check refuses it later). */
    expect_ok(check(1, OV("model.dim=100000000")));
    /* The plan's step replay is bounded too (1 + n_layers units wrapped int). */
    expect_only_error(check(1, OV("model.n_layers=2147483647")),
                      "model.n_layers = 2147483647 is more than 1048576 blocks, the most the plan "
                      "(and train's memory check) replays a step over; lower model.n_layers");
    expect_ok(check(1, OV("model.n_layers=1048576")));
}

static void test_micro_batch_x_seq_len_overflow_is_refused_naming_the_keys(void **state) {
    (void)state;
    /* 2^30 x 2^30 tokens: every buffer wrapped to a multiple of 2^64, so
     * the plan's peak was 0 and passed the memory check. */
    expect_only_error(check(1, OV("train.micro_batch_size=1073741824", "train.seq_len=1073741824",
                                  "train.activation_checkpointing=true")),
                      "a micro-batch's activations: train.micro_batch_size x train.seq_len x "
                      "(model.n_layers + 2) x model.ffn_dim = 1073741824 x 1073741824 x 6 x 384, "
                      "times 256 bytes, overflows a 64-bit count (at most 9223372036854775807); "
                      "lower train.micro_batch_size or train.seq_len (or the model sizes)");
    expect_error(
        check(1, OV("model.arch=moe", "train.micro_batch_size=65536", "train.seq_len=65536")),
        "train.micro_batch_size x train.seq_len x model.moe.top_k = 65536 x 65536 x 2 "
        "exceed 2147483647");
    expect_error(check(2, OV("train.micro_batch_size=1", "train.global_batch_size=2000000000",
                             "model.vocab_size=2000000000")),
                 "a step's logits: train.micro_batch_size x train.seq_len x model.vocab_size x "
                 "micro-batches per step = 1 x 64 x 2000000000 x 1000000000");
}

static void test_pp_schedule_actions_are_bounded_naming_the_batch(void **state) {
    (void)state;
    /* 2 x M x V wrapped int: a schedule of -294967296 actions. */
    expect_only_error(check(2, OV("accelerator.pp_size=2", "train.micro_batch_size=1",
                                  "train.global_batch_size=2000000000")),
                      "the pipeline schedule has 2 x micro-batches per step x "
                      "accelerator.pp_virtual_stages = 2 x 2000000000 x 1 = 4000000000 actions "
                      "per stage, more than 1048576 (micro-batches = train.global_batch_size / "
                      "(train.micro_batch_size x dp_size) = 2000000000 / (1 x 1)); set "
                      "train.global_batch_size: 524288 or less");
    expect_error(check(4, OV("accelerator.pp_size=2", "accelerator.pp_schedule=interleaved_1f1b",
                             "accelerator.pp_virtual_stages=2", "train.micro_batch_size=1",
                             "train.global_batch_size=1000000")),
                 "2 x 500000 x 2 = 2000000 actions per stage, more than 1048576");
    expect_ok(check(2, OV("accelerator.pp_size=2", "train.micro_batch_size=1",
                          "train.global_batch_size=524288")));
}

static void test_eval_needs_validation_data(void **state) {
    (void)state;
    expect_error(check(1, OV("data.val_fraction=0")),
                 "train.eval_every = 50 needs validation data but data.val_fraction = 0");
    expect_ok(check(1, OV("data.val_fraction=0", "train.eval_every=0")));
}

static void test_resume_auto_needs_a_checkpoint_dir(void **state) {
    (void)state;
    expect_error(check(1, OV("checkpoint.resume=auto")),
                 "checkpoint.resume = auto looks for the latest checkpoint in checkpoint.dir");
    expect_ok(check(1, OV("checkpoint.resume=auto", "checkpoint.dir=ckpt")));
}

static void test_replicate_params_listed_twice_is_an_error(void **state) {
    (void)state;
    expect_error(check(1, OV("fsdp_config.replicate_params=[a.weight, b.weight, a.weight]")),
                 "fsdp_config.replicate_params[2] = 'a.weight' repeats item 0");
}

static void test_tp_must_divide_the_heads_naming_each_key(void **state) {
    (void)state;
    expect_only_error(
        check(4, OV("accelerator.tp_size=4", "model.n_kv_heads=2", "train.global_batch_size=8")),
        "model.n_kv_heads = 2 is not divisible by accelerator.tp_size = 4: each TP "
        "rank holds whole key/value heads; valid tp_size: 1, 2");
    checked *r = check(8, OV("accelerator.tp_size=4", "model.dim=96", "model.n_heads=6",
                             "model.n_kv_heads=2", "train.global_batch_size=16"));
    const char *lines[] = {
        "model.n_heads = 6 is not divisible by accelerator.tp_size = 4: each TP rank computes "
        "whole attention heads; valid tp_size: 1, 2",
        "model.n_kv_heads = 2 is not divisible by accelerator.tp_size = 4: each TP rank holds "
        "whole key/value heads; valid tp_size: 1, 2"};
    assert_int_equal(r->st, HS_ERR_CONFIG);
    assert_int_equal(r->e.lines, 2);
    for (size_t i = 0; i < 2; i++)
        if (!strstr(r->e.msg, lines[i])) fail_msg("'%s' not in:\n%s", lines[i], r->e.msg);
    free(r);
    expect_ok(check(4, OV("accelerator.tp_size=2", "train.global_batch_size=16")));
}

static void test_tp_must_divide_the_mlp_and_the_vocabulary(void **state) {
    (void)state;
    expect_only_error(check(2, OV("accelerator.tp_size=2", "model.ffn_dim=385")),
                      "model.ffn_dim = 385 is not divisible by accelerator.tp_size = 2: the MLP's "
                      "gate/up columns and down rows are split over the TP group; valid tp_size: "
                      "1 (or keep tp_size 2 with model.ffn_dim: 386)");
    expect_only_error(check(2, OV("accelerator.tp_size=2", "model.vocab_size=257")),
                      "model.vocab_size = 257 is not divisible by accelerator.tp_size = 2: the "
                      "token embedding and lm_head are split over the vocabulary; valid "
                      "tp_size: 1 (or keep tp_size 2 with model.vocab_size: 258)");
    /* The valid sizes also fit the world (rule 4) and every other split. */
    expect_error(check(8, OV("accelerator.tp_size=8", "model.n_heads=8", "model.n_kv_heads=8",
                             "model.ffn_dim=12", "train.global_batch_size=8")),
                 "model.ffn_dim = 12 is not divisible by accelerator.tp_size = 8: the MLP's "
                 "gate/up columns and down rows are split over the TP group; valid tp_size: 1, "
                 "2, 4 (or keep tp_size 8 with model.ffn_dim: 16)");
    expect_ok(check(2, OV("accelerator.tp_size=2", "model.ffn_dim=386", "model.vocab_size=258")));
}

static void test_tp_with_moe_keeps_the_moe_layer_whole(void **state) {
    (void)state;
    /* The MoE layer (router, routed and shared experts) stays replicated
     * over TP, and arch moe has no dense MLP: none of its sizes need to
     * divide; under sequence parallel it runs on each TP rank's rows. */
    expect_ok(check(2, OV("model.arch=moe", "accelerator.tp_size=2", "model.ffn_dim=385",
                          "model.moe.expert_ffn_dim=33", "model.moe.shared_expert_ffn_dim=33")));
    expect_ok(check(
        2, OV("model.arch=moe", "accelerator.tp_size=2", "accelerator.sequence_parallel=true")));
}

static void test_sequence_parallel_needs_seq_len_split_over_tp(void **state) {
    (void)state;
    expect_only_error(check(4, OV("accelerator.tp_size=4", "model.n_kv_heads=4",
                                  "accelerator.sequence_parallel=true", "train.seq_len=66",
                                  "train.global_batch_size=8")),
                      "train.seq_len = 66 is not divisible by accelerator.tp_size "
                      "(sequence_parallel) = 4; choose a multiple of 4, e.g. train.seq_len: 68");
    expect_ok(check(4, OV("accelerator.tp_size=2", "accelerator.sequence_parallel=true",
                          "accelerator.loss_parallel=true", "fsdp_config.dp_shard_size=2")));
}

/* Context parallelism holds two chunks of each sequence per rank; sequence
 * parallel then splits a CP rank's rows over TP; the rotate method is
 * allgather or ring. */
static void test_cp_needs_two_chunks_per_rank(void **state) {
    (void)state;
    expect_ok(check(2, OV("accelerator.cp_size=2", "train.global_batch_size=8")));
    expect_ok(check(4, OV("accelerator.cp_size=2", "fsdp_config.dp_shard_size=2",
                          "accelerator.cp_rotate_method=ring")));
    expect_only_error(
        check(2, OV("accelerator.cp_size=2", "train.seq_len=66", "train.global_batch_size=8")),
        "train.seq_len = 66 is not divisible by 2 x accelerator.cp_size (context "
        "parallelism holds two chunks of each sequence per rank) = 4; choose a "
        "multiple of 4, e.g. train.seq_len: 68");
    expect_only_error(check(4, OV("accelerator.cp_size=2", "accelerator.tp_size=2",
                                  "accelerator.sequence_parallel=true", "train.seq_len=36",
                                  "train.global_batch_size=8")),
                      "train.seq_len = 36 is not divisible by 2 x accelerator.cp_size x "
                      "accelerator.tp_size (context parallelism holds two chunks per rank, "
                      "sequence_parallel splits them over TP) = 8; choose a multiple of 8, e.g. "
                      "train.seq_len: 40");
    expect_only_error(check(2, OV("accelerator.cp_size=2", "accelerator.cp_rotate_method=rings",
                                  "train.global_batch_size=8")),
                      "accelerator.cp_rotate_method = rings is not a method; use allgather (the "
                      "default), ring, alltoall or alltoall_ring");
    /* CP never enlarges the shard degree (spec 004 §2.1): dp 2 x cp 2 with
     * dp_shard_size 2 leaves a replicate degree of 2. */
    hs_topology t = derive_ok(4, 1, 2, 1, 1, 2, 1);
    assert_int_equal(t.dp_shard, 2);
    assert_int_equal(t.fsdp_dp, 4);
    assert_int_equal(t.dp_replicate, 2);
}

static void test_ep_rules(void **state) {
    (void)state;
    expect_only_error(check(2, OV("accelerator.ep_size=2")),
                      "accelerator.ep_size = 2 needs routed experts, but model.arch = llama has "
                      "none; set accelerator.ep_size: 1, or model.arch: moe");
    expect_only_error(check(4, OV("accelerator.ep_size=2", "model.arch=moe",
                                  "accelerator.tp_size=2", "train.global_batch_size=16")),
                      "accelerator.ep_size = 2 with accelerator.tp_size = 2 and "
                      "accelerator.sequence_parallel = false: every TP rank holds the same "
                      "tokens, which would reach their experts tp_size times; set "
                      "accelerator.sequence_parallel: true (each TP rank routes its own rows)");
    expect_ok(check(4, OV("accelerator.ep_size=2", "model.arch=moe", "accelerator.tp_size=2",
                          "accelerator.sequence_parallel=true", "train.global_batch_size=16")));
}

static void test_parallel_rules_that_need_the_model(void **state) {
    (void)state;
    expect_error(check(3, OV("accelerator.cp_size=3", "train.global_batch_size=8")),
                 "train.seq_len = 64 is not divisible by 2 x accelerator.cp_size");
    expect_error(check(8, OV("accelerator.pp_size=8", "train.global_batch_size=64")),
                 "accelerator.pp_size = 8 exceeds model.n_layers = 4");
    expect_error(check(4, OV("model.arch=moe", "model.moe.num_experts=6", "accelerator.ep_size=4",
                             "train.global_batch_size=32")),
                 "model.moe.num_experts = 6 is not divisible by accelerator.ep_size = 4");
    /* CP never enlarges the shard degree (spec 004 §2.1): dp 2 x cp 2 with
     * dp_shard_size 2 leaves a replicate degree of 2. */
    hs_topology t = derive_ok(8, 2, 2, 1, 1, 2, 1);
    assert_int_equal(t.fsdp_dp, 4);
    assert_int_equal(t.dp_replicate, 2);
}

/* The stages of `c` (pp_size entries) as "[a, b, ...]" of block counts,
 * checking that first_layer is their running sum. */
static void expect_stages(const char *const *ov, int n, const char *want) {
    hs_config c;
    hs_error e;
    assert_int_equal(hs_config_load(&c, NULL, ov, n, &e), HS_OK);
    int first[HS_PP_MAX_STAGES], count[HS_PP_MAX_STAGES];
    hs_config_pp_stages(&c.accelerator, c.model.n_layers, first, count);
    char got[256] = "[";
    for (int s = 0, sum = 0; s < c.accelerator.pp_size; sum += count[s], s++) {
        assert_int_equal(first[s], sum);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", s ? ", " : "", count[s]);
    }
    strcat(got, "]");
    assert_string_equal(got, want);
    hs_config_free(&c);
}

static void test_pp_stages_split_evenly_with_extra_blocks_in_the_middle(void **state) {
    (void)state;
    expect_stages(OV("model.n_layers=10", "accelerator.pp_size=4"), "[2, 3, 3, 2]");
    expect_stages(OV("model.n_layers=5", "accelerator.pp_size=2"), "[3, 2]");
    expect_stages(OV("model.n_layers=7", "accelerator.pp_size=3"), "[2, 3, 2]");
    expect_stages(OV("model.n_layers=8", "accelerator.pp_size=4"), "[2, 2, 2, 2]");
    expect_stages(OV("model.n_layers=11", "accelerator.pp_size=4"), "[3, 3, 3, 2]");
    expect_stages(OV("model.n_layers=4", "accelerator.pp_size=1"), "[4]");
    expect_stages(OV("model.n_layers=4", "accelerator.pp_size=2", "accelerator.pp_layers=[3, 1]"),
                  "[3, 1]");
}

static void test_pp_layers_must_match_the_stages_and_the_model(void **state) {
    (void)state;
    const char *even = "set accelerator.pp_layers: [2, 2] (the even split of model.n_layers = "
                       "4), or [] for it";
    char line[512];
    snprintf(line, sizeof line,
             "accelerator.pp_layers = [2, 1, 1] has 3 entries but accelerator.pp_size = 2: it "
             "lists the blocks of each pipeline stage, one entry per stage; %s",
             even);
    expect_only_error(check(2, OV("accelerator.pp_size=2", "accelerator.pp_layers=[2, 1, 1]",
                                  "train.global_batch_size=16")),
                      line);
    snprintf(line, sizeof line,
             "accelerator.pp_layers[1] = 0 must be >= 1: every pipeline stage needs at least one "
             "block; %s",
             even);
    expect_only_error(check(2, OV("accelerator.pp_size=2", "accelerator.pp_layers=[4, 0]",
                                  "train.global_batch_size=16")),
                      line);
    snprintf(line, sizeof line,
             "accelerator.pp_layers = [3, 3] sums to 6 blocks but model.n_layers = 4: the stages "
             "must hold every block exactly once; %s",
             even);
    expect_only_error(check(2, OV("accelerator.pp_size=2", "accelerator.pp_layers=[3, 3]",
                                  "train.global_batch_size=16")),
                      line);
    expect_error(check(4, OV("model.n_layers=10", "accelerator.pp_size=4",
                             "accelerator.pp_layers=[1, 2, 3, 5]", "train.global_batch_size=32")),
                 "set accelerator.pp_layers: [2, 3, 3, 2] (the even split of model.n_layers = 10)");
    expect_ok(check(2, OV("accelerator.pp_size=2", "accelerator.pp_layers=[3, 1]",
                          "train.global_batch_size=16")));
    /* One stage: [] or all the blocks. */
    expect_only_error(check(1, OV("accelerator.pp_layers=[3, 1]")),
                      "accelerator.pp_layers = [3, 1] is set but accelerator.pp_size = 1: its one "
                      "stage holds all model.n_layers = 4 blocks; set accelerator.pp_layers: [] "
                      "(or [4]), or accelerator.pp_size: 2 to run these 2 stages");
    expect_error(check(1, OV("accelerator.pp_layers=[5]")),
                 "accelerator.pp_layers = [5] is set but accelerator.pp_size = 1");
    expect_ok(check(1, OV("accelerator.pp_layers=[4]")));
    expect_ok(check(1, OV("accelerator.pp_layers=[]")));
}

static void test_pp_1f1b_needs_a_micro_batch_per_stage(void **state) {
    (void)state;
    expect_only_error(check(4, OV("accelerator.pp_size=2", "train.global_batch_size=16")),
                      "accelerator.pp_schedule = 1f1b needs at least accelerator.pp_size = 2 "
                      "micro-batches per step, got 1 = train.global_batch_size / "
                      "(train.micro_batch_size x dp_size) = 16 / (8 x 2); set "
                      "train.global_batch_size: 32 (or null for that), or "
                      "accelerator.pp_schedule: gpipe");
    expect_only_error(check(8, OV("accelerator.pp_size=4", "train.global_batch_size=48",
                                  "train.micro_batch_size=8")),
                      "accelerator.pp_schedule = 1f1b needs at least accelerator.pp_size = 4 "
                      "micro-batches per step, got 3 = train.global_batch_size / "
                      "(train.micro_batch_size x dp_size) = 48 / (8 x 2); set "
                      "train.global_batch_size: 64 (or null for that), or "
                      "accelerator.pp_schedule: gpipe");
    /* null: one micro-batch per stage, so the minimal config runs */
    expect_ok(check(4, OV("accelerator.pp_size=2")));
    hs_config c;
    hs_config_defaults(&c, NULL);
    c.accelerator.pp_size = 4;
    hs_topology t = {.dp = 2};
    assert_int_equal(hs_config_global_batch(&c, &t), 8 * 2 * 4);
    assert_int_equal(hs_config_micro_batches(&c, &t), 4);
    hs_config_free(&c);
    expect_ok(check(4, OV("accelerator.pp_size=2", "train.global_batch_size=32")));
    /* GPipe runs any number of micro-batches. */
    expect_ok(check(4, OV("accelerator.pp_size=2", "accelerator.pp_schedule=gpipe")));
}

/* zbv runs exactly two chunks per stage; zb1p and zbv need a micro-batch
 * per stage as 1F1B does, and zb1p has one chunk per stage. */
static void test_pp_zero_bubble_schedules_check_their_chunks_and_batch(void **state) {
    (void)state;
    expect_ok(check(2, OV("accelerator.pp_size=2", "accelerator.pp_schedule=zb1p")));
    expect_ok(check(2, OV("accelerator.pp_size=2", "accelerator.pp_schedule=zbv",
                          "accelerator.pp_virtual_stages=2")));
    expect_only_error(check(2, OV("accelerator.pp_size=2", "accelerator.pp_schedule=zbv")),
                      "accelerator.pp_schedule = zbv runs two model chunks per stage in a V "
                      "(stage s holds chunks s and 2 x pp_size - 1 - s), so it needs "
                      "accelerator.pp_virtual_stages: 2, got 1; set it to 2");
    expect_error(check(2, OV("accelerator.pp_size=2", "accelerator.pp_schedule=zbv",
                             "accelerator.pp_virtual_stages=3", "model.n_layers=6")),
                 "accelerator.pp_virtual_stages: 2, got 3");
    expect_error(check(2, OV("accelerator.pp_size=2", "accelerator.pp_schedule=zb1p",
                             "accelerator.pp_virtual_stages=2")),
                 "accelerator.pp_virtual_stages = 2 needs accelerator.pp_schedule: "
                 "interleaved_1f1b or zbv");
    expect_error(check(4, OV("accelerator.pp_size=2", "accelerator.pp_schedule=zb1p",
                             "train.global_batch_size=16")),
                 "accelerator.pp_schedule = zb1p needs at least accelerator.pp_size = 2 "
                 "micro-batches per step");
    /* the chunks a layout holds, a stage's virtual stages over every stage,
     * are bounded before anything sizes an array by them */
    expect_ok(check(128, OV("accelerator.pp_size=16", "accelerator.pp_schedule=interleaved_1f1b",
                            "accelerator.pp_virtual_stages=8", "model.n_layers=128",
                            "train.global_batch_size=1024")));
    expect_error(check(512, OV("accelerator.pp_size=64", "accelerator.pp_schedule=interleaved_1f1b",
                               "accelerator.pp_virtual_stages=8", "model.n_layers=512",
                               "train.global_batch_size=512")),
                 "accelerator.pp_size x pp_virtual_stages = 64 x 8 = 512 model chunks: at most "
                 "256");
}

static void test_pp_refuses_what_stages_do_not_share(void **state) {
    (void)state;
    /* MoE runs: its statistics travel with the hand-over */
    expect_ok(check(2, OV("accelerator.pp_size=2", "model.arch=moe")));
    expect_only_error(check(2, OV("accelerator.pp_size=2", "model.tie_embeddings=true",
                                  "train.global_batch_size=16")),
                      "accelerator.pp_size = 2 with model.tie_embeddings = true: the token "
                      "embedding lives on the first pipeline stage and lm_head on the last, so "
                      "they cannot share one weight; set model.tie_embeddings: false, or "
                      "accelerator.pp_size: 1");
    expect_ok(check(1, OV("model.arch=moe", "model.tie_embeddings=true")));
    /* The topology rules are reported first, and the PP rules still run. */
    checked *r =
        check(3, OV("accelerator.cp_size=2", "accelerator.pp_size=2", "model.tie_embeddings=true"));
    assert_int_equal(r->st, HS_ERR_CONFIG);
    const char *rule4 = strstr(r->e.msg, "[rule 4]"), *tie = strstr(r->e.msg, "tie_embeddings");
    assert_non_null(rule4);
    assert_non_null(tie);
    assert_true(rule4 < tie);
    free(r);
}

static void test_all_violated_rules_are_reported_together(void **state) {
    (void)state;
    checked *r = check(4, OV("fsdp_config.dp_shard_size=3", "fsdp_config.forward_prefetch_depth=-1",
                             "fsdp_config.mix_precision.fp32_main_grad=true", "model.n_heads=3",
                             "train.steps=0"));
    assert_int_equal(r->st, HS_ERR_CONFIG);
    const char *paths[] = {"fsdp_config.dp_shard_size",
                           "fsdp_config.forward_prefetch_depth",
                           "[rule 8]",
                           "[rule 9]",
                           "model.n_heads",
                           "train.steps"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (!strstr(r->e.msg, paths[i])) fail_msg("'%s' not in:\n%s", paths[i], r->e.msg);
    assert_true(r->e.lines >= 6);
    free(r);
}

static void test_default_config_is_valid_and_silent_on_one_rank(void **state) {
    (void)state;
    expect_no_warning(check(1, NULL, 0));
}

static void test_warn_edp_shard_size_without_experts(void **state) {
    (void)state;
    expect_warning(check(2, OV("fsdp_config.edp_shard_size=2", "fsdp_config.dp_shard_size=2")),
                   "fsdp_config.edp_shard_size = 2 has no effect");
}

static void test_warn_cast_forward_inputs_without_param_dtype(void **state) {
    (void)state;
    expect_warning(check(1, OV("fsdp_config.mix_precision.cast_forward_inputs=false")),
                   "fsdp_config.mix_precision.cast_forward_inputs = false has no effect");
    expect_no_warning(check(1, OV("fsdp_config.mix_precision.cast_forward_inputs=false",
                                  "fsdp_config.mix_precision.param_dtype=bfloat16")));
}

static void test_warn_zero_copy_without_comm_fusion(void **state) {
    (void)state;
    expect_warning(check(1, OV("fsdp_config.comm_fusion_zero_copy=false")),
                   "fsdp_config.comm_fusion_zero_copy = false has no effect");
}

static void test_warn_micro_batch_knobs_with_one_micro_batch(void **state) {
    (void)state;
    expect_warning(
        check(2, OV("fsdp_config.dp_shard_size=2", "fsdp_config.requires_grad_sync=false")),
        "fsdp_config.requires_grad_sync = false has no effect: a step has one micro-batch");
    expect_warning(
        check(2, OV("fsdp_config.dp_shard_size=2", "fsdp_config.reshard_after_backward=false")),
        "fsdp_config.reshard_after_backward = false has no effect");
    expect_no_warning(
        check(2, OV("fsdp_config.dp_shard_size=2", "fsdp_config.requires_grad_sync=false",
                    "train.micro_batch_size=4", "train.global_batch_size=16")));
}

static void test_warn_tp_switches_without_tp(void **state) {
    (void)state;
    expect_warning(check(1, OV("accelerator.sequence_parallel=true")),
                   "accelerator.sequence_parallel = true has no effect: it needs "
                   "accelerator.tp_size > 1");
    expect_warning(check(2, OV("accelerator.loss_parallel=true", "fsdp_config.dp_shard_size=2")),
                   "accelerator.loss_parallel = true has no effect: it needs "
                   "accelerator.tp_size > 1");
}

/* The all-to-all methods split a TP rank's heads over the all-to-all
 * group (cp ranks, or cp_a2a_size of them): query heads evenly, kv heads
 * evenly or, when fewer, one replicated kv head per rank; cp_a2a_size
 * divides cp_size. Defaults: 4 heads, 2 kv heads. */
static void test_cp_alltoall_rules(void **state) {
    (void)state;
#define CP_A2A(cp, how) "accelerator.cp_size=" #cp, "accelerator.cp_rotate_method=" how
    expect_ok(check(2, OV(CP_A2A(2, "alltoall"), "train.global_batch_size=8")));
    /* 2 kv heads over 4 ranks: each kv head replicated to two */
    expect_ok(check(4, OV(CP_A2A(4, "alltoall"), "train.global_batch_size=8")));
    expect_ok(check(4, OV(CP_A2A(4, "alltoall_ring"), "accelerator.cp_a2a_size=2",
                          "train.global_batch_size=8")));
    expect_ok(check(4, OV(CP_A2A(2, "alltoall"), "accelerator.tp_size=2",
                          "accelerator.sequence_parallel=true", "train.global_batch_size=8")));
    expect_only_error(check(8, OV(CP_A2A(8, "alltoall"), "train.global_batch_size=8")),
                      "model.n_heads / accelerator.tp_size = 4 / 1 = 4 query heads per TP rank "
                      "are not divisible by accelerator.cp_size = 8 (cp_rotate_method "
                      "alltoall): the all-to-all gives each of its ranks an equal share of the "
                      "heads; valid cp_size for alltoall: 1, 2, 4; or cp_rotate_method "
                      "alltoall_ring with accelerator.cp_a2a_size: 1, 2, 4");
    expect_only_error(
        check(8, OV(CP_A2A(4, "alltoall"), "accelerator.tp_size=2", "train.global_batch_size=8")),
        "model.n_heads / accelerator.tp_size = 4 / 2 = 2 query heads per TP rank "
        "are not divisible by accelerator.cp_size = 4 (cp_rotate_method "
        "alltoall): the all-to-all gives each of its ranks an equal share of the "
        "heads; valid cp_size for alltoall: 1, 2; or cp_rotate_method "
        "alltoall_ring with accelerator.cp_a2a_size: 1, 2");
    expect_only_error(check(4, OV(CP_A2A(4, "alltoall_ring"), "train.global_batch_size=8")),
                      "accelerator.cp_rotate_method = alltoall_ring needs "
                      "accelerator.cp_a2a_size, the CP ranks of one all-to-all group, to divide "
                      "accelerator.cp_size = 4, but it is null; valid "
                      "accelerator.cp_a2a_size: 1, 2, 4 (cp_size: alltoall, 1: ring)");
    expect_only_error(check(4, OV(CP_A2A(4, "alltoall_ring"), "accelerator.cp_a2a_size=3",
                                  "train.global_batch_size=8")),
                      "accelerator.cp_rotate_method = alltoall_ring needs "
                      "accelerator.cp_a2a_size, the CP ranks of one all-to-all group, to divide "
                      "accelerator.cp_size = 4, but it is 3; valid "
                      "accelerator.cp_a2a_size: 1, 2, 4 (cp_size: alltoall, 1: ring)");
    /* 6 heads, 2 kv heads over 3 ranks: neither kv count divides the other */
    expect_only_error(check(3, OV(CP_A2A(3, "alltoall"), "model.dim=48", "model.n_heads=6",
                                  "train.seq_len=48", "train.global_batch_size=8")),
                      "model.n_kv_heads / accelerator.tp_size = 2 / 1 = 2 kv heads per TP rank "
                      "and accelerator.cp_size = 3 (cp_rotate_method alltoall) do not divide one "
                      "another: the all-to-all gives each rank an equal share of the kv heads, "
                      "or with fewer kv heads than ranks the one kv head its query heads read; "
                      "valid cp_size for alltoall: 1, 2, 6; or cp_rotate_method alltoall_ring "
                      "with accelerator.cp_a2a_size: 1");
#undef CP_A2A
}

static void test_warn_cp_a2a_size_without_alltoall_ring(void **state) {
    (void)state;
    expect_warning(check(2, OV("accelerator.cp_size=2", "accelerator.cp_a2a_size=2",
                               "train.global_batch_size=8")),
                   "accelerator.cp_a2a_size = 2 has no effect: it needs "
                   "accelerator.cp_rotate_method = alltoall_ring");
    expect_no_warning(
        check(4, OV("accelerator.cp_size=4", "accelerator.cp_rotate_method=alltoall_ring",
                    "accelerator.cp_a2a_size=2", "train.global_batch_size=8")));
}

static void test_warn_pp_schedule_without_pp(void **state) {
    (void)state;
    expect_warning(check(1, OV("accelerator.pp_schedule=gpipe")),
                   "accelerator.pp_schedule = gpipe has no effect: it needs accelerator.pp_size "
                   "> 1");
    expect_no_warning(check(1, OV("accelerator.pp_schedule=1f1b")));
}

static void test_warn_fsdp_unit_knobs_when_fsdp_is_skipped(void **state) {
    (void)state;
    expect_warning(check(1, OV("fsdp_config.enable_offload=true")),
                   "fsdp_config.enable_offload has no effect: FSDP2Manager is skipped");
}

static void test_warn_checkpoint_knobs_without_checkpoint_dir(void **state) {
    (void)state;
    expect_warning(check(1, OV("checkpoint.async=false")),
                   "checkpoint.async has no effect: checkpoint.dir is null (no checkpoints are "
                   "written)");
    expect_warning(check(1, OV("checkpoint.save_every=5", "checkpoint.keep_last=3")),
                   "checkpoint.save_every, checkpoint.keep_last have no effect: checkpoint.dir "
                   "is null");
    expect_no_warning(check(1, OV("checkpoint.async=false", "checkpoint.dir=/tmp/hs-unused")));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule1_dp_shard_size_below_1_fails),
        cmocka_unit_test(test_rule2_edp_shard_size_below_1_fails),
        cmocka_unit_test(test_rule3_negative_prefetch_depth_fails),
        cmocka_unit_test(test_rule4_world_not_divisible_by_tp_cp_pp_fails),
        cmocka_unit_test(test_rule5_dp_cp_domain_not_divisible_by_dp_shard_fails),
        cmocka_unit_test(test_rule6_expert_domain_not_divisible_by_ep_fails),
        cmocka_unit_test(test_rule7_edp_not_divisible_by_edp_shard_fails),
        cmocka_unit_test(test_rule8_fp32_main_grad_without_fp32_reduce_fails),
        cmocka_unit_test(test_rule9_main_grad_and_main_params_must_match),
        cmocka_unit_test(test_rule10_fullgraph_with_fsdp_fails_and_without_warns),
        cmocka_unit_test(test_rule11_unknown_replicate_param_names_the_nearest_fqn),
        cmocka_unit_test(test_global_batch_must_split_into_whole_micro_batches),
        cmocka_unit_test(test_model_shape_rules_name_both_values),
        cmocka_unit_test(test_positive_sizes_are_required),
        cmocka_unit_test(test_text_and_token_data_need_a_path),
        cmocka_unit_test(test_vocab_below_256_with_byte_data_is_refused_as_train_would),
        cmocka_unit_test(test_dim_x_ffn_dim_x_layers_overflow_is_refused_naming_the_keys),
        cmocka_unit_test(test_micro_batch_x_seq_len_overflow_is_refused_naming_the_keys),
        cmocka_unit_test(test_pp_schedule_actions_are_bounded_naming_the_batch),
        cmocka_unit_test(test_eval_needs_validation_data),
        cmocka_unit_test(test_resume_auto_needs_a_checkpoint_dir),
        cmocka_unit_test(test_replicate_params_listed_twice_is_an_error),
        cmocka_unit_test(test_tp_must_divide_the_heads_naming_each_key),
        cmocka_unit_test(test_tp_must_divide_the_mlp_and_the_vocabulary),
        cmocka_unit_test(test_tp_with_moe_keeps_the_moe_layer_whole),
        cmocka_unit_test(test_sequence_parallel_needs_seq_len_split_over_tp),
        cmocka_unit_test(test_cp_needs_two_chunks_per_rank),
        cmocka_unit_test(test_cp_alltoall_rules),
        cmocka_unit_test(test_ep_rules),
        cmocka_unit_test(test_parallel_rules_that_need_the_model),
        cmocka_unit_test(test_pp_stages_split_evenly_with_extra_blocks_in_the_middle),
        cmocka_unit_test(test_pp_layers_must_match_the_stages_and_the_model),
        cmocka_unit_test(test_pp_1f1b_needs_a_micro_batch_per_stage),
        cmocka_unit_test(test_pp_zero_bubble_schedules_check_their_chunks_and_batch),
        cmocka_unit_test(test_pp_refuses_what_stages_do_not_share),
        cmocka_unit_test(test_all_violated_rules_are_reported_together),
        cmocka_unit_test(test_default_config_is_valid_and_silent_on_one_rank),
        cmocka_unit_test(test_warn_edp_shard_size_without_experts),
        cmocka_unit_test(test_warn_cast_forward_inputs_without_param_dtype),
        cmocka_unit_test(test_warn_zero_copy_without_comm_fusion),
        cmocka_unit_test(test_warn_micro_batch_knobs_with_one_micro_batch),
        cmocka_unit_test(test_warn_tp_switches_without_tp),
        cmocka_unit_test(test_warn_pp_schedule_without_pp),
        cmocka_unit_test(test_warn_cp_a2a_size_without_alltoall_ring),
        cmocka_unit_test(test_warn_fsdp_unit_knobs_when_fsdp_is_skipped),
        cmocka_unit_test(test_warn_checkpoint_knobs_without_checkpoint_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
