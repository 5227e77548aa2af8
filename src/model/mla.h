/* model/mla.h — multi-head latent attention (arch deepseek_v3, Hugging
 * Face's DeepseekV3Attention) as the block runs it:
 *
 *   q   = q_b_proj(q_a_layernorm(q_a_proj(n1)))   (q_proj(n1) without q_lora_rank)
 *   kva = kv_a_proj_with_mqa(n1) = [latent | k_rope]
 *   [k_nope | v] per head = kv_b_proj(kv_a_layernorm(latent))
 *   each head's query [q_nope | rope(q_rope)], key [k_nope | rope(k_rope)]
 *   (the one rope key shared by every head), value v;
 *   attention with scale 1 / sqrt(nope + rope) (times YaRN's mscale^2,
 *   folded into q), then o_proj over the heads' v_head_dim values.
 *
 * The attention call is the model's GQA one with KVH = NH and HD = nope +
 * rope: each value head is laid out HD wide, its last HD - v_head_dim
 * values zero, so every backend and context-parallel method runs it as it
 * is; the output's zero columns are dropped before o_proj. */
#ifndef HS_MODEL_MLA_H
#define HS_MODEL_MLA_H

#include <stdbool.h>
#include <stdint.h>

#include "hypershard/model.h"

typedef struct hs_mla_shape {
    bool on;
    int QL, KL;      /* q_lora_rank (0: none), kv_lora_rank */
    int nope, R, Vd; /* qk_nope_head_dim, qk_rope_head_dim, v_head_dim */
    float q_scale;   /* YaRN's mscale^2, 1 without */
} hs_mla_shape;

/* What one block's forward keeps for its backward (compute dtype unless
 * marked). */
typedef struct hs_mla_acts {
    void *qa;       /* [N, QL] q_a_proj's output (QL > 0) */
    void *qan;      /* [N, QL] q_a_layernorm's, q_b_proj's input */
    float *rstd_qa; /* [N] */
    void *kvl;      /* [N, KL] the latent, kv_a_layernorm's input */
    void *kvn;      /* [N, KL] kv_b_proj's input */
    float *rstd_kv; /* [N] */
    void *attc;     /* [N, NH * Vd] o_proj's input (NULL when Vd = HD: the output itself) */
} hs_mla_acts;

/* Scratch shared by the blocks (fp32 unless marked). */
typedef struct hs_mla_bufs {
    void *kva;    /* [N, KL + R] compute dtype */
    void *kvb;    /* [N, NH * (nope + Vd)] compute dtype */
    void *pe;     /* [N, NH * R] compute dtype: the rope dims, contiguous */
    float *dpe;   /* [N, NH * R] */
    float *dkpe;  /* [N, R] */
    float *dkvb;  /* [N, NH * (nope + Vd)] */
    float *dkvn;  /* [N, KL] d(kv_a_layernorm's output) */
    float *dkvl;  /* [N, KL] d(the latent) */
    float *dkva;  /* [N, KL + R] */
    float *dqan;  /* [N, QL] d(q_a_layernorm's output) */
    float *dqa;   /* [N, QL] d(q_a_proj's output) */
    float *dattc; /* [N, NH * Vd] (NULL when Vd = HD) */
} hs_mla_bufs;

struct hs_block_params;
struct hs_block_acts;

/* The shape from the config (on: arch deepseek_v3). */
hs_mla_shape hs_mla_shape_of(const hs_model_config *c);
/* The widest row any MLA linear's output gradient has (the dout16 room). */
int64_t hs_mla_widest(const hs_model *m);
/* Every buffer above for BT rows, from alloc (the model's allocator). */
typedef void *(*hs_mla_alloc_fn)(hs_model *m, int64_t n, hs_dtype dt);
void hs_mla_acts_alloc(hs_model *m, hs_mla_acts *a, int64_t BT, hs_mla_alloc_fn alloc);
void hs_mla_acts_free(hs_model *m, hs_mla_acts *a);
void hs_mla_bufs_alloc(hs_model *m, int64_t BT, hs_mla_alloc_fn alloc);
void hs_mla_bufs_free(hs_model *m);

/* q, k and v (v's padding zero) of B sequences of T rows from the block's
 * ln1, into q and the given k, v (the block's, or a KV cache's rows). */
void hs_mla_forward(hs_model *m, const struct hs_block_params *bp, struct hs_block_acts *a, void *k,
                    void *v, int B, int T);
/* Generation's latent cache of one block (model/decode.c): per position
 * the normalised latent [KL] (lat) and the rotated rope key [R] (pe),
 * compute dtype; and where every head's key and value of the positions
 * so far are expanded for the attention call (k, v [rows, NH * HD], one
 * pair for all the blocks). */
typedef struct hs_mla_cache {
    void *lat, *pe;
    void *k, *v;
} hs_mla_cache;
/* The cache's bytes a position of one block: (KL + R) values. */
int64_t hs_mla_cache_position_bytes(const hs_model *m);
/* T new rows at positions [pos, pos + T) of one sequence: their latents
 * and rope keys into the cache's rows, q of the new rows, and k, v of
 * every position up to them. */
void hs_mla_forward_cached(hs_model *m, const struct hs_block_params *bp, struct hs_block_acts *a,
                           const hs_mla_cache *c, int pos, int T);
/* o_proj's input: the attention output's value columns. */
const void *hs_mla_o_input(hs_model *m, struct hs_block_acts *a, int64_t N);
/* The gradient of the attention output from o_proj's input gradient
 * (in place when Vd = HD), into m->datt. */
float *hs_mla_datt_room(hs_model *m);
void hs_mla_datt_expand(hs_model *m, int64_t N);
/* From attention's dq, dk, dv: every MLA weight's gradient and d(ln1)
 * stored over m->dln. */
void hs_mla_backward(hs_model *m, const struct hs_block_params *bp, struct hs_block_acts *a, int B,
                     int T);

#endif
