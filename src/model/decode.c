/* Generation with a per-layer KV cache (model.h "generation"): each of the
 * rank's blocks keeps the keys (after RoPE) and values of the positions it
 * has run, so a prompt runs once (prefill) and each new token then runs
 * one row through the blocks, attending over the cache. The blocks are
 * block.c's forward with the cache's rows in place of the activations'
 * k and v; the head runs on the last row only. Latent attention keeps
 * each position's normalised latent and rope key instead (kv_lora_rank +
 * qk_rope_head_dim values, mla.h hs_mla_cache) and expands every head's
 * keys and values from them into one pair of [seq_len, NH x HD] buffers,
 * block by block, as transformers' DeepSeek-V3 does. */
#include <stdio.h>
#include <stdlib.h>

#include "model/internal.h"

struct hs_kv_cache {
    hs_model *m;
    void *mem;                    /* L x {K, V} x [rows, KVH*HD], compute dtype (latent
                                   * attention: L x [rows, KL + R], then one K, V) */
    int rows;                     /* positions: the model's seq_len */
    int64_t kvd;                  /* KVH*HD of this rank */
    int len[HS_MODEL_MAX_CHUNKS]; /* positions each chunk has run */
};

bool hs_model_kv_supported(const hs_model *m, char *why, size_t cap) {
    const hs_model_par *p = m->par;
    const char *no = NULL;
    if (!p->attention_cached)
        no = "context parallelism splits a sequence's rows over ranks and one new row does not "
             "split (accelerator.cp_size > 1)";
    else if (p->row_split > 1)
        no = "sequence parallelism splits the rows over the TP ranks and one new row does not "
             "split (accelerator.sequence_parallel with tp_size > 1)";
    else if (p->ep_size > 1)
        no = "expert parallelism's exchange is not run with a cache (accelerator.ep_size > 1)";
    else if (m->opt.count_buffers || m->opt.describe_only)
        no = "the model was created to count or describe, not to run";
    if (no && why && cap) snprintf(why, cap, "%s", no);
    return no == NULL;
}

int64_t hs_kv_cache_position_bytes(const hs_model *m) {
    if (m->mla.on) return (int64_t)m->L * hs_mla_cache_position_bytes(m);
    return (int64_t)m->L * 2 * m->KVH * m->HD * (int64_t)hs_dtype_size(m->dt);
}

int64_t hs_kv_cache_bytes(const hs_model *m) {
    int64_t T = m->opt.seq_len, expanded = 0;
    if (m->mla.on) expanded = 2 * T * m->KVH * m->HD * (int64_t)hs_dtype_size(m->dt);
    return T * hs_kv_cache_position_bytes(m) + expanded;
}

hs_status hs_kv_cache_create(hs_model *m, hs_kv_cache **out, hs_error *e) {
    *out = NULL;
    hs_error_clear(e);
    char why[256];
    if (!hs_model_kv_supported(m, why, sizeof why))
        return hs_error_set(e, HS_ERR_CONFIG, "KV cache: this layout has none: %s", why);
    hs_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return hs_error_oom(e, "KV cache: its descriptor");
    int64_t bytes = hs_kv_cache_bytes(m);
    c->m = m;
    c->rows = m->opt.seq_len;
    c->kvd = (int64_t)m->KVH * m->HD;
    c->mem = bytes > 0 ? hs_device_alloc(m->dev, (size_t)bytes) : NULL;
    if (bytes > 0 && !c->mem) {
        free(c);
        return hs_device_oom(m->dev, (size_t)bytes,
                             m->mla.on
                                 ? "the latent KV cache (blocks x seq_len x (kv_lora_rank + "
                                   "qk_rope_head_dim), and one block's keys and values)"
                                 : "the KV cache (blocks x 2 x seq_len x kv heads x head_dim)",
                             e);
    }
    *out = c;
    return HS_OK;
}

void hs_kv_cache_free(hs_kv_cache *c) {
    if (!c) return;
    if (c->mem) hs_device_free_mem(c->m->dev, c->mem);
    free(c);
}

int hs_kv_cache_len(const hs_kv_cache *c) { return c->len[0]; }

void hs_kv_cache_reset(hs_kv_cache *c) {
    for (int k = 0; k < HS_MODEL_MAX_CHUNKS; k++) c->len[k] = 0;
}

/* The cache rows of the stage's block `local`, new rows from pos on. */
static hs_block_kv kv_of(const hs_kv_cache *c, int local, int pos) {
    hs_dtype dt = c->m->dt;
    const hs_mla_shape *s = &c->m->mla;
    if (s->on) {
        int64_t per = (int64_t)c->rows * (s->KL + s->R);
        void *lat = hs_at(c->mem, dt, (int64_t)local * per);
        void *k = hs_at(c->mem, dt, (int64_t)c->m->L * per);
        return (hs_block_kv){.k = k,
                             .v = hs_at(k, dt, (int64_t)c->rows * c->kvd),
                             .lat = lat,
                             .pe = hs_at(lat, dt, (int64_t)c->rows * s->KL),
                             .pos = pos,
                             .rows = c->rows};
    }
    int64_t per = (int64_t)c->rows * c->kvd;
    void *k = hs_at(c->mem, dt, 2 * (int64_t)local * per);
    return (hs_block_kv){.k = k, .v = hs_at(k, dt, per), .pos = pos, .rows = c->rows};
}

static hs_status check_tokens(const hs_model *m, const int32_t *tokens, int n, int pos,
                              hs_error *e) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->Vg)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "generate: token %d (position %d) is outside the vocabulary "
                                "[0, %d); check that the prompt was encoded for "
                                "model.vocab_size=%d",
                                tokens[i], pos + i, m->Vg, m->Vg);
    return HS_OK;
}

/* The final norm and the head on the chunk's last row, into logits. */
static void head_last_row(hs_model *m, int chunk, int n, float *logits) {
    int len = m->chunk_len[chunk];
    hs_dtype dt = hs_model_chunk_stream_dtype(m, chunk, len);
    const void *last = hs_cat(m->resid[len], dt, (int64_t)(n - 1) * m->C);
    m->par->norm_enter(m->par->ctx, m->lnf, m->rstdf, last, dt, m->norm->data, m->head, 1);
    hs_dtype round_dt = hs_model_root_casts(m) ? m->bnd[0].output_stored : HS_DTYPE_F32;
    m->par->head_chunk(m->par->ctx, m->logits, m->lnf, m->head, NULL, 1, 0.0f, false, logits,
                       round_dt);
}

hs_status hs_model_stage_forward_cached(hs_model *m, int chunk, hs_kv_cache *c,
                                        const int32_t *tokens, int n, const hs_model_hooks *hooks,
                                        float *logits, hs_error *e) {
    hs_error_clear(e);
    HS_ASSERT(c && c->m == m && chunk >= 0 && chunk < m->n_chunks);
    int pos = c->len[chunk];
    if (n < 1 || n > c->rows - pos)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "KV cache: %d new tokens at position %d do not fit its %d positions "
                            "(train.seq_len); reset the cache and run the window again",
                            n, pos, c->rows);
    bool emb = hs_model_chunk_has_embedding(m, chunk), head = hs_model_chunk_has_head(m, chunk);
    if (emb && check_tokens(m, tokens, n, pos, e) != HS_OK) return e->code;
    hs_model_use_slot(m, chunk, 0);
    const float *cos, *sin;
    m->par->rope_tables(m->par->ctx, c->rows, &cos, &sin);
    m->rope_cos = cos + (int64_t)pos * (m->rope_hd / 2);
    m->rope_sin = sin + (int64_t)pos * (m->rope_hd / 2);
    bool root = hs_model_root_chunk(m);
    int ru = hs_model_root_unit(m);
    if (root) hs_hook_pre_forward(hooks, ru);
    if (emb) {
        hs_device_copy(m->dev, m->batch_tokens, tokens, (size_t)n * sizeof(int32_t), HS_COPY_H2D);
        m->par->embedding_fwd(m->par->ctx, m->resid[0], m->batch_tokens, m->embed, n);
    }
    int i0 = m->chunk_begin[chunk];
    for (int j = 0; j < m->chunk_len[chunk]; j++) {
        int u = m->blocks[i0 + j].unit;
        hs_block_kv kv = kv_of(c, i0 + j, pos);
        hs_hook_pre_forward(hooks, u);
        hs_block_forward_cached(m, i0 + j, hs_model_acts_for(m, j), m->resid[j], m->resid[j + 1], n,
                                &kv, hooks);
        hs_hook_post_forward(hooks, u);
    }
    if (head && logits) head_last_row(m, chunk, n, logits);
    if (root) hs_hook_post_forward(hooks, ru);
    c->len[chunk] = pos + n;
    return HS_OK;
}

hs_status hs_model_forward_cached(hs_model *m, hs_kv_cache *c, const int32_t *tokens, int n,
                                  const hs_model_hooks *hooks, float *logits, hs_error *e) {
    HS_ASSERT(m->first_stage && m->last_stage && m->n_chunks == 1);
    return hs_model_stage_forward_cached(m, 0, c, tokens, n, hooks, logits, e);
}
