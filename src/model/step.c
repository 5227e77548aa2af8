/* The whole model's forward and backward, with the unit hooks in the order
 * model.h documents:
 *
 *   pre_forward(0)  embed
 *   per block u:    pre_forward(u) block post_forward(u)
 *                   (moe: pre_forward(e) experts post_forward(e) inside it)
 *   final norm      post_forward(0)
 *   pre_backward(0)  per row chunk: lm_head, loss, lm_head backward;
 *                    final norm backward
 *   per block u, last first:
 *                   pre_backward(u) [full checkpointing: pre_forward(u)
 *                   block post_forward(u); selective: the block's
 *                   element-wise ops] block backward post_backward(u)
 *                   (moe: pre_backward(e) experts post_backward(e) inside it)
 *   embed   post_backward(0)   post_backward_final()
 *
 * The head runs after pre_backward(0), HEAD_ROWS rows at a time: each
 * chunk's fp32 logits become d loss / d logits in place (as llm.c does) and
 * are consumed at once, so the [B, T, V] logits never exist in full and the
 * head GEMM still runs once. Nothing happens between post_forward(0) and
 * pre_backward(0), and every root parameter is read after the latter, so
 * the hooks see the same sequence as a head computed before
 * post_forward(0). */
#include <string.h>

#include "model/layers.h"
#include "model/internal.h"

static hs_status check_ids(const int32_t *ids, int64_t N, int T, int V, bool allow_negative,
                           const char *what, hs_error *e) {
    for (int64_t n = 0; n < N; n++) {
        int32_t t = ids[n];
        if (t >= V || (t < 0 && !allow_negative))
            return hs_error_set(e, HS_ERR_FORMAT,
                                "%s[%lld] (sequence %lld, position %lld) = %d is outside the "
                                "vocabulary [0, %d); check that the data was tokenized for "
                                "model.vocab_size=%d",
                                what, (long long)n, (long long)(n / T), (long long)(n % T), t, V,
                                V);
    }
    return HS_OK;
}

static hs_status check_batch(const hs_model *m, const hs_batch *b, bool need_targets, hs_error *e) {
    hs_error_clear(e);
    if (b->B < 1 || b->B > m->opt.max_batch || b->T < 1 || b->T > m->opt.seq_len)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "batch of B=%d sequences of T=%d tokens does not fit the model "
                            "buffers (max_batch=%d, seq_len=%d); create the model with "
                            "max_batch >= the micro-batch size and seq_len >= train.seq_len",
                            b->B, b->T, m->opt.max_batch, m->opt.seq_len);
    int split = m->par->row_split;
    if (((int64_t)b->B * b->T) % split)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "batch of B=%d x T=%d rows cannot be split over tp_size=%d ranks "
                            "(sequence parallel); use a train.seq_len divisible by tp_size",
                            b->B, b->T, split);
    if (m->cp > 1 && (b->T % 2 || (int64_t)b->T * m->cp > m->opt.seq_len))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "batch of T=%d tokens per sequence is not a context-parallel local "
                            "batch: each of cp_size=%d ranks holds two equal chunks of a "
                            "sequence of at most seq_len=%d (pass hs_cp_take_local_ids's rows)",
                            b->T, m->cp, m->opt.seq_len);
    if (!b->tokens) return hs_error_set(e, HS_ERR_INTERNAL, "batch: tokens is NULL");
    if (b->doc_start && !m->opt.document_masking)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "batch: document starts for a model created without "
                            "document_masking");
    if (need_targets && !b->targets)
        return hs_error_set(e, HS_ERR_INTERNAL, "batch: targets is NULL but a loss is needed");
    int64_t N = (int64_t)b->B * b->T;
    if (check_ids(b->tokens, N, b->T, m->Vg, false, "tokens", e) != HS_OK) return e->code;
    if (b->targets && check_ids(b->targets, N, b->T, m->Vg, true, "targets", e) != HS_OK)
        return e->code;
    return HS_OK;
}

/* The batch as the kernels read it: its tokens (on the embedding's stage)
 * and targets (on the head's) copied across into the model's device
 * buffers. The caller's arrays stay host memory, read on the host by the
 * checks and the aux loss's valid count. */
static hs_batch on_device(hs_model *m, const hs_batch *b) {
    size_t bytes = (size_t)b->B * (size_t)b->T * sizeof(int32_t);
    hs_batch d = {.B = b->B, .T = b->T, .global_sequences = b->global_sequences};
    if (m->batch_tokens) {
        hs_device_copy(m->dev, m->batch_tokens, b->tokens, bytes, HS_COPY_H2D);
        d.tokens = m->batch_tokens;
    }
    if (m->batch_targets && b->targets) {
        hs_device_copy(m->dev, m->batch_targets, b->targets, bytes, HS_COPY_H2D);
        d.targets = m->batch_targets;
    }
    /* document starts cover whole sequences, also under CP */
    m->doc_lo = NULL, m->doc_ld = (int64_t)b->T * m->cp;
    if (b->doc_start) {
        hs_device_copy(m->dev, m->batch_docs, b->doc_start, bytes * (size_t)m->cp, HS_COPY_H2D);
        d.doc_start = m->doc_lo = m->batch_docs;
    }
    return d;
}

/* The current chunk (hs_model_use_slot) holds the embedding / the head. */
static bool has_embedding(const hs_model *m) { return m->first_stage && m->cur_chunk == 0; }
static bool has_head(const hs_model *m) { return m->last_stage && m->cur_chunk == m->n_chunks - 1; }

/* Whether the current chunk's forward and backward call the root's hooks:
 * it uses the root's parameters (the embedding, or the norm and head;
 * under zbv's V one stage holds both, in two chunks, and each calls
 * them), or the stage holds neither and it is chunk 0. */
bool hs_model_root_chunk(const hs_model *m) {
    if (has_embedding(m) || has_head(m)) return true;
    return !m->first_stage && !m->last_stage && m->cur_chunk == 0;
}

int hs_model_root_unit(const hs_model *m) { return has_head(m) ? m->head_unit : 0; }

/* Embedding (on its chunk) and the chunk's blocks; leaves the chunk's
 * output in resid[len]. */
static void trunk_forward(hs_model *m, const hs_batch *b, const hs_model_hooks *hooks,
                          bool count_aux) {
    int64_t N = (int64_t)b->B * b->T;
    /* else resid[0] holds what the previous chunk handed on */
    if (has_embedding(m)) m->par->embedding_fwd(m->par->ctx, m->resid[0], b->tokens, m->embed, N);
    if (m->moe) hs_moe_aux_reset(&m->aux);
    m->seq_value = 0.0;
    m->seq_S = b->global_sequences;
    /* The earlier chunks' statistics of this micro-batch, to add ours to. */
    if (m->moe && count_aux && !has_embedding(m)) (void)hs_moe_aux_unpack(&m->aux, m->aux_stage);
    int k = m->cur_chunk, i0 = m->chunk_begin[k];
    for (int j = 0; j < m->chunk_len[k]; j++) {
        int u = m->blocks[i0 + j].unit;
        hs_hook_pre_forward(hooks, u);
        hs_block_forward(m, i0 + j, hs_model_acts_for(m, j), m->resid[j], m->resid[j + 1], b->B,
                         b->T, hooks, count_aux);
        hs_hook_post_forward(hooks, u);
    }
}

/* The current chunk's output: resid[len], in the dtype its last block
 * hands on. */
static hs_dtype out_dtype(const hs_model *m) {
    return hs_model_chunk_stream_dtype(m, m->cur_chunk, m->chunk_len[m->cur_chunk]);
}

/* The last block hands the stream on in its output dtype; the root's norm
 * reads it as it is (it is not a forward input of the root). */
static void final_norm_forward(hs_model *m, int64_t N) {
    int len = m->chunk_len[m->cur_chunk];
    m->par->norm_enter(m->par->ctx, m->lnf, m->rstdf, m->resid[len], out_dtype(m), m->norm->data,
                       m->head, N);
}

/* The logits of rows [r0, r0 + rows) (m->logits: fp32, cast to the root's
 * output dtype) and their loss; with grad, m->logits becomes d loss /
 * d logits. */
static double head_chunk(hs_model *m, const int32_t *targets, int64_t r0, int64_t rows, float scale,
                         bool grad, float *full) {
    hs_dtype round_dt = hs_model_root_casts(m) ? m->bnd[0].output_stored : HS_DTYPE_F32;
    return m->par->head_chunk(m->par->ctx, m->logits, hs_cat(m->lnf, m->dt, r0 * m->C), m->head,
                              targets ? targets + r0 : NULL, rows, scale, grad, full, round_dt);
}

/* The backward of the logits cast casts their gradient back to fp32, the
 * dtype the cast started from: nothing to round, but it is a cast. */
static void count_root_casts(hs_model *m, bool backward) {
    if (!hs_model_root_casts(m)) return;
    if (backward) m->bnd[m->head_unit].backward_casts++;
    else m->bnd[m->head_unit].forward_casts++;
}

/* One sequence of the head under canonical sums: its loss into loss[s],
 * d lnf of its rows, its part of the head's weight gradient. */
typedef struct head_seq_ctx {
    hs_model *m;
    const int32_t *targets;
    int64_t T;
    float scale;
    double *loss;
} head_seq_ctx;

static void head_seq_part(void *vctx, int s, float *out) {
    const head_seq_ctx *c = vctx;
    hs_model *m = c->m;
    int64_t r0 = (int64_t)s * c->T;
    c->loss[s] = head_chunk(m, c->targets, r0, c->T, c->scale, true, NULL);
    hs_dtype ydt;
    const void *dy = hs_linear_dout(m->dev, m->logits, m->dout16, m->dt, c->T * m->V, &ydt);
    const void *x = hs_cat(m->lnf, m->dt, r0 * m->C);
    hs_linear_backward_dy(m->dev, m->dln + r0 * m->C, false, NULL, false, HS_DTYPE_F32, dy, ydt,
                          NULL, m->head->data, m->dt, c->T, m->C, m->V);
    hs_dev_gemm(m->dev, true, false, m->V, m->C, c->T, 1.0f, dy, ydt, m->V, x, m->dt, m->C, 0.0f,
                out, HS_DTYPE_F32, m->C);
}

/* The loss as a tree over the sequences' losses, the head's gradient as a
 * tree over theirs. */
static double head_canonical(hs_model *m, const int32_t *targets, int64_t N, float scale) {
    int n = m->canon_nseq;
    double *loss = m->canon_loss;
    for (int s = 0; s < n; s++) loss[s] = 0.0;
    head_seq_ctx c = {.m = m, .targets = targets, .T = N / n, .scale = scale, .loss = loss};
    int64_t len = (int64_t)m->V * m->C;
    if (m->head == m->embed && m->head->grad) {
        /* tied: each sequence's part waits for its embedding part */
        float *keep = hs_canon_tied_parts(m, len);
        for (int s = 0; s < n; s++) head_seq_part(&c, s, keep + (int64_t)s * len);
    } else if (m->head->grad) {
        hs_canon_into_grad(m, m->head, hs_canon_tree(m, len, head_seq_part, &c), len);
    }
    return hs_tree_f64(loss, n, 1);
}

/* Loss of all rows; *dlnf = d loss / d lnf of the local rows; head
 * gradient accumulated. */
static double head_forward_backward(hs_model *m, const int32_t *targets, int64_t N, float scale,
                                    const float **dlnf) {
    double loss = 0.0;
    hs_dev_zero(m->dev, m->dln, (size_t)(N * m->C) * sizeof(float));
    if (m->canon_nseq) {
        loss = head_canonical(m, targets, N, scale);
        *dlnf = m->par->enter_grad(m->par->ctx, m->dln, m->head, N);
        return loss;
    }
    for (int64_t r0 = 0; r0 < N; r0 += m->head_rows) {
        int64_t rows = N - r0 < m->head_rows ? N - r0 : m->head_rows;
        loss += head_chunk(m, targets, r0, rows, scale, true, NULL);
        hs_linear_backward_ex(
            m->dev, m->dln + r0 * m->C, false, m->head->grad, false, m->head->grad_dtype, m->logits,
            m->dout16, hs_cat(m->lnf, m->dt, r0 * m->C), m->head->data, m->dt, rows, m->C, m->V);
    }
    *dlnf = m->par->enter_grad(m->par->ctx, m->dln, m->head, N);
    return loss;
}

static int64_t count_valid(const int32_t *targets, int64_t N) {
    int64_t v = 0;
    for (int64_t n = 0; n < N; n++) v += targets[n] >= 0;
    return v;
}

/* Whether a block's input pass left weight gradients to its weight pass. */
static bool wgrad_pending(const hs_wgrad_block *wg) {
    for (int k = 0; k < HS_WG_OPS; k++)
        if (wg->op[k].w) return true;
    return false;
}

/* From d lnf (the head's chunk), or from d output already in m->dres. */
static void trunk_backward(hs_model *m, const hs_batch *b, const hs_model_hooks *hooks,
                           const float *dlnf) {
    int64_t N = (int64_t)b->B * b->T;
    int k = m->cur_chunk, i0 = m->chunk_begin[k], len = m->chunk_len[k];
    if (has_head(m)) {
        hs_dev_zero(m->dev, m->dres, (size_t)(N * m->C) * sizeof(float));
        if (m->canon_nseq)
            hs_canon_rmsnorm_bwd(m, m->dres, m->norm, dlnf, m->resid[len], out_dtype(m), m->rstdf,
                                 hs_model_local_rows(m, N), m->C);
        else
            m->k->rmsnorm_bwd(m->s, m->dres, m->norm->grad, m->norm->grad_dtype, dlnf,
                              m->resid[len], out_dtype(m), m->norm->data, m->rstdf, m->dt,
                              hs_model_local_rows(m, N), m->C, m->norm_part);
    }
    for (int j = len - 1; j >= 0; j--) {
        int i = i0 + j, u = m->blocks[i].unit;
        hs_block_acts *a = hs_model_acts_for(m, j);
        hs_hook_pre_backward(hooks, u);
        if (m->opt.activation_checkpointing == HS_AC_FULL) {
            hs_hook_pre_forward(hooks, u);
            hs_block_forward(m, i, a, m->resid[j], m->resid[j + 1], b->B, b->T, hooks, false);
            hs_hook_post_forward(hooks, u);
        } else if (m->opt.activation_checkpointing == HS_AC_SELECTIVE) {
            hs_block_recompute(m, i, a, m->resid[j], b->B, b->T);
        }
        m->wg_cur = m->split ? &m->wg_slot[j] : NULL;
        hs_block_backward(m, i, a, m->resid[j], b->B, b->T, hooks, m->moe ? m->aux_g : NULL);
        if (m->wg_cur && wgrad_pending(m->wg_cur)) hs_hook_weight_grad_deferred(hooks, u);
        m->wg_cur = NULL;
        hs_hook_post_backward(hooks, u);
    }
    if (!has_embedding(m)) return; /* m->dres holds d input for the previous chunk */
    if (m->canon_nseq && m->embed->grad) hs_canon_embedding_bwd(m, m->dres, b->tokens, N);
    else m->par->embedding_bwd(m->par->ctx, m->dres, b->tokens, m->embed, N);
}

/* The MoE load-balancing term of the micro-batch just forwarded: its
 * value, and the gradient every router receives in backward (m->aux_g). */
static double moe_aux(hs_model *m, const hs_batch *b, float grad_scale) {
    int64_t N = (int64_t)b->B * b->T, valid = count_valid(b->targets, N);
    double coef = m->cfg.moe.aux_loss_coef;
    int64_t mb_valid = valid;
    if (m->par->stats_sum) {
        /* Over the global micro-batch, as one device would see it: every
         * rank gets the same value and scales its tokens' gradient by
         * the micro-batch's valid targets (spec: layout-independent).
         * Under sequence parallelism the ranks of a row split routed
         * different rows of the same sequences: their statistics add up,
         * their targets (the same on each) count once. */
        float *buf = m->aux_buf;
        int64_t n = 2 * (int64_t)m->moe_shapes.E + 2;
        hs_moe_aux_pack(&m->aux, m->par->row_rank ? 0 : valid, buf);
        m->par->stats_sum(m->par->ctx, buf, n);
        mb_valid = hs_moe_aux_unpack(&m->aux, buf);
    }
    hs_moe_aux_prob_grad(&m->aux, coef * (double)mb_valid * grad_scale, m->aux_g);
    return coef * hs_moe_aux_value(&m->aux);
}

/* Forward-only head of the last stage: loss sum and logits from m->lnf. */
static double head_forward(hs_model *m, const hs_batch *b, bool want_loss, float *logits) {
    int64_t N = (int64_t)b->B * b->T;
    double loss = 0.0;
    /* canonical sums: a chunk per sequence, the losses added as a tree */
    int64_t step = m->opt.canonical_sums ? b->T : m->head_rows;
    double *seq = m->opt.canonical_sums ? m->canon_loss : NULL;
    for (int64_t r0 = 0; r0 < N; r0 += step) {
        int64_t rows = N - r0 < step ? N - r0 : step;
        double l = head_chunk(m, want_loss ? b->targets : NULL, r0, rows, 0.0f, false,
                              logits ? logits + r0 * m->Vg : NULL);
        if (seq) seq[r0 / step] = l;
        else loss += l;
    }
    if (seq) loss = hs_tree_f64(seq, b->B, 1);
    count_root_casts(m, false);
    return loss;
}

int64_t hs_model_stage_numel(const hs_model *m, const hs_batch *b) {
    return hs_model_local_rows(m, (int64_t)b->B * b->T) * m->C;
}

static hs_act_slot *slot_of(hs_model *m, int chunk, int slot) {
    HS_ASSERT(chunk >= 0 && chunk < m->n_chunks && slot >= 0 && slot < m->n_slots);
    return &m->slots[chunk * m->n_slots + slot];
}

void *hs_model_stage_input(hs_model *m, int chunk, int slot, hs_dtype *dt) {
    *dt = hs_model_chunk_stream_dtype(m, chunk, 0);
    return slot_of(m, chunk, slot)->resid[0];
}

const void *hs_model_stage_output(hs_model *m, int chunk, int slot, hs_dtype *dt) {
    hs_act_slot *sl = slot_of(m, chunk, slot);
    *dt = hs_model_chunk_stream_dtype(m, chunk, sl->len);
    return sl->resid[sl->len];
}

float *hs_model_stage_grad(hs_model *m) { return m->dres; }

int64_t hs_model_stage_aux_numel(const hs_model *m) {
    return m->moe ? 2 * (int64_t)m->moe_shapes.E + 2 : 0;
}

int64_t hs_model_stage_aux_grad_numel(const hs_model *m) { return m->moe ? m->moe_shapes.E : 0; }

float *hs_model_stage_aux(hs_model *m) { return m->aux_stage; }

float *hs_model_stage_aux_grad(hs_model *m, int chunk, int slot) {
    return slot_of(m, chunk, slot)->aux_g;
}

hs_status hs_model_stage_forward(hs_model *m, int chunk, int slot, const hs_batch *b,
                                 const hs_model_hooks *hooks, bool train, float grad_scale,
                                 double *loss_sum, float *logits, double *aux_loss, hs_error *e) {
    if (check_batch(m, b, train || loss_sum != NULL, e) != HS_OK) return e->code;
    hs_model_use_slot(m, chunk, slot);
    m->par->rope_tables(m->par->ctx, b->T, &m->rope_cos, &m->rope_sin);
    int64_t N = (int64_t)b->B * b->T;
    bool root = hs_model_root_chunk(m);
    int ru = hs_model_root_unit(m);
    hs_batch db = on_device(m, b);
    if (root) hs_hook_pre_forward(hooks, ru);
    trunk_forward(m, &db, hooks, train);
    double loss = 0.0, aux = 0.0;
    /* MoE: the head's chunk has every layer's statistics of its tokens; the
     * others hand theirs on. */
    if (m->moe && train && has_head(m)) aux = moe_aux(m, b, grad_scale);
    else if (m->moe && train) hs_moe_aux_pack(&m->aux, 0, m->aux_stage);
    if (train) aux += m->seq_value; /* this chunk's blocks' sequence-wise terms */
    if (has_head(m)) {
        final_norm_forward(m, N);
        if (!train) loss = head_forward(m, &db, loss_sum != NULL, logits);
    }
    if (root) hs_hook_post_forward(hooks, ru);
    if (loss_sum) *loss_sum = loss;
    if (aux_loss) *aux_loss = aux;
    return HS_OK;
}

/* Backward of the current chunk from the batch already on the device. */
static void backward_on_device(hs_model *m, const hs_batch *db, float grad_scale,
                               const hs_model_hooks *hooks, double *loss_sum) {
    int64_t N = (int64_t)db->B * db->T;
    bool root = hs_model_root_chunk(m);
    int ru = hs_model_root_unit(m);
    m->canon_nseq = m->opt.canonical_sums ? db->B : 0;
    if (root) hs_hook_pre_backward(hooks, ru);
    const float *dlnf = NULL;
    double loss = 0.0;
    if (has_head(m)) {
        loss = head_forward_backward(m, db->targets, N, grad_scale, &dlnf);
        count_root_casts(m, false);
        count_root_casts(m, true);
    }
    trunk_backward(m, db, hooks, dlnf);
    if (root) hs_hook_post_backward(hooks, ru);
    hs_hook_post_backward_final(hooks);
    m->canon_nseq = 0;
    if (loss_sum) *loss_sum = loss;
}

hs_status hs_model_stage_backward(hs_model *m, int chunk, int slot, const hs_batch *b,
                                  float grad_scale, const hs_model_hooks *hooks, double *loss_sum,
                                  hs_error *e) {
    if (check_batch(m, b, true, e) != HS_OK) return e->code;
    hs_model_use_slot(m, chunk, slot);
    m->par->rope_tables(m->par->ctx, b->T, &m->rope_cos, &m->rope_sin);
    hs_batch db = on_device(m, b);
    backward_on_device(m, &db, grad_scale, hooks, loss_sum);
    return HS_OK;
}

hs_status hs_model_stage_backward_input(hs_model *m, int chunk, int slot, const hs_batch *b,
                                        float grad_scale, const hs_model_hooks *hooks,
                                        double *loss_sum, hs_error *e) {
    HS_ASSERT(m->opt.split_backward);
    m->split = true;
    hs_status s = hs_model_stage_backward(m, chunk, slot, b, grad_scale, hooks, loss_sum, e);
    m->split = false;
    return s;
}

void hs_model_stage_backward_weight(hs_model *m, int chunk, int slot, const hs_model_hooks *hooks) {
    HS_ASSERT(m->opt.split_backward);
    hs_act_slot *sl = slot_of(m, chunk, slot);
    int i0 = m->chunk_begin[chunk];
    /* in the input pass's order: last block first */
    for (int j = sl->len - 1; j >= 0; j--) {
        if (!wgrad_pending(&sl->wg[j])) continue;
        hs_block_backward_weight(m, &sl->wg[j]);
        hs_hook_post_weight_grad(hooks, m->blocks[i0 + j].unit);
    }
    /* the weight pass ends a backward: what it reduced completes here */
    hs_hook_post_backward_final(hooks);
}

hs_status hs_model_forward_backward(hs_model *m, const hs_batch *b, float grad_scale,
                                    const hs_model_hooks *hooks, double *loss_sum, double *aux_loss,
                                    hs_error *e) {
    HS_ASSERT(m->first_stage && m->last_stage && m->n_chunks == 1);
    if (check_batch(m, b, true, e) != HS_OK) return e->code;
    hs_model_use_slot(m, 0, 0);
    int64_t N = (int64_t)b->B * b->T;
    m->par->rope_tables(m->par->ctx, b->T, &m->rope_cos, &m->rope_sin);
    hs_batch db = on_device(m, b);
    hs_hook_pre_forward(hooks, 0);
    trunk_forward(m, &db, hooks, true);
    double aux = m->moe ? moe_aux(m, b, grad_scale) + m->seq_value : 0.0;
    final_norm_forward(m, N);
    hs_hook_post_forward(hooks, 0);
    /* the batch crossed once: backward reads the same device copy */
    backward_on_device(m, &db, grad_scale, hooks, loss_sum);
    if (aux_loss) *aux_loss = aux;
    return HS_OK;
}

hs_status hs_model_forward(hs_model *m, const hs_batch *b, const hs_model_hooks *hooks,
                           double *loss_sum, float *logits, hs_error *e) {
    HS_ASSERT(m->first_stage && m->last_stage && m->n_chunks == 1);
    return hs_model_stage_forward(m, 0, 0, b, hooks, false, 0.0f, loss_sum, logits, NULL, e);
}
