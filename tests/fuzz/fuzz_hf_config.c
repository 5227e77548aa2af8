/* libFuzzer target for Hugging Face config.json (hf_config.c).
 *
 * Input: config.json text. Every input must read or fail with a message
 * naming the file; one that reads must give a model config whose sizes are
 * positive, whose heads divide and whose head size is even, as the model
 * builder expects. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/ckpt.h"

/* Latent attention's shapes (arch deepseek_v3): positive, the rope dims
 * even, the value head within the query head. */
static bool mla_ok(const hs_model_config *mc) {
    const hs_mla_config *a = &mc->mla;
    return a->q_lora_rank >= 0 && a->kv_lora_rank > 0 && a->qk_nope_head_dim > 0 &&
           a->qk_rope_head_dim > 0 && a->qk_rope_head_dim % 2 == 0 && a->v_head_dim > 0 &&
           a->v_head_dim <= a->qk_nope_head_dim + a->qk_rope_head_dim &&
           mc->n_kv_heads == mc->n_heads && mc->moe.first_k_dense_replace < mc->n_layers;
}

static void check(const hs_model_config *mc, int max_position) {
    bool moe = hs_model_arch_moe(mc), mla = hs_model_arch_mla(mc);
    /* the head size: head_dim when the file gives one (any width of the
     * queries), else dim / n_heads, which must divide; even for RoPE
     * (latent attention's: mla_ok) */
    bool heads = mc->n_heads > 0 && (mla || mc->head_dim > 0 || mc->dim % mc->n_heads == 0);
    int hd = heads ? hs_model_head_dim(mc) : 0;
    bool ok =
        mc->vocab_size > 0 && mc->dim > 0 && mc->n_layers > 0 && heads && hd > 0 &&
        (mla ? mla_ok(mc) : hd % 2 == 0) && mc->n_kv_heads > 0 &&
        mc->n_heads % mc->n_kv_heads == 0 && max_position >= 0 &&
        (!moe || (mc->moe.num_experts > 0 && mc->moe.top_k > 0 &&
                  mc->moe.top_k <= mc->moe.num_experts && mc->moe.shared_expert_ffn_dim >= 0));
    if (!ok) {
        fprintf(stderr, "config.json read into an unusable model config (dim %d, heads %d/%d)\n",
                mc->dim, mc->n_heads, mc->n_kv_heads);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hs_config defaults;
    hs_config_defaults(&defaults, NULL);
    hs_model_config mc = defaults.model;
    int max_position = 0;
    hs_error e;
    if (hs_hf_config_parse("fuzz.json", (const char *)data, size, &mc, &max_position, &e) == HS_OK)
        check(&mc, max_position);
    else if (!strstr(e.msg, "fuzz.json")) {
        fprintf(stderr, "the refusal does not name the file: %s\n", e.msg);
        abort();
    }
    hs_config_free(&defaults);
    return 0;
}
