/* hs_model_create / hs_model_free: validate the architecture, build the
 * registry, and allocate every activation and scratch buffer once for the
 * capacity (max_batch, seq_len), so a step never allocates. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layers.h"
#include "model/internal.h"

#define HEAD_ROWS 256

static hs_status check_dims(const hs_model_config *c, const hs_model_options *o, hs_error *e) {
    hs_error_clear(e);
    if (strcmp(c->arch, "llama") != 0 && !hs_model_arch_moe(c) && !hs_model_arch_qk_norm(c))
        hs_error_append(e, HS_ERR_CONFIG,
                        "model.arch: '%s' is not an architecture; use llama, moe or qwen3",
                        c->arch);
    if (c->vocab_size < 1 || c->dim < 1 || c->n_layers < 1 || c->n_heads < 1)
        hs_error_append(e, HS_ERR_CONFIG,
                        "model: vocab_size=%d, dim=%d, n_layers=%d, n_heads=%d must all be >= 1",
                        c->vocab_size, c->dim, c->n_layers, c->n_heads);
    else if (hs_model_arch_mla(c)) {
        const hs_mla_config *a = &c->mla;
        if (a->kv_lora_rank < 1 || a->qk_nope_head_dim < 1 || a->qk_rope_head_dim < 2 ||
            a->qk_rope_head_dim % 2 || a->v_head_dim < 1 || a->q_lora_rank < 0 ||
            a->v_head_dim > a->qk_nope_head_dim + a->qk_rope_head_dim)
            hs_error_append(e, HS_ERR_CONFIG,
                            "model.mla: kv_lora_rank=%d, qk_nope_head_dim=%d, qk_rope_head_dim=%d, "
                            "v_head_dim=%d, q_lora_rank=%d: ranks and dims >= 1, the rope dims "
                            "even, v_head_dim at most qk_nope_head_dim + qk_rope_head_dim",
                            a->kv_lora_rank, a->qk_nope_head_dim, a->qk_rope_head_dim,
                            a->v_head_dim, a->q_lora_rank);
    } else if (c->head_dim > 0 ? c->head_dim % 2 != 0
                               : c->dim % c->n_heads != 0 || (c->dim / c->n_heads) % 2 != 0)
        hs_error_append(e, HS_ERR_CONFIG,
                        "model.dim=%d, n_heads=%d, head_dim=%d: the head dim (model.head_dim, or "
                        "model.dim / model.n_heads when null) must be an even integer (RoPE "
                        "rotates pairs); change model.head_dim, model.dim or model.n_heads",
                        c->dim, c->n_heads, c->head_dim);
    int kvh = c->n_kv_heads > 0 && !hs_model_arch_mla(c) ? c->n_kv_heads : c->n_heads;
    if (c->n_heads >= 1 && c->n_heads % kvh != 0)
        hs_error_append(
            e, HS_ERR_CONFIG,
            "model.n_kv_heads=%d must divide model.n_heads=%d (grouped-query attention)",
            c->n_kv_heads, c->n_heads);
    if (!hs_model_arch_moe(c) && c->ffn_dim < 1)
        hs_error_append(e, HS_ERR_CONFIG, "model.ffn_dim=%d must be >= 1", c->ffn_dim);
    if (hs_model_arch_moe(c) && (c->moe.num_experts < 1 || c->moe.top_k < 1 ||
                                 c->moe.top_k > c->moe.num_experts || c->moe.expert_ffn_dim < 1))
        hs_error_append(e, HS_ERR_CONFIG,
                        "model.moe: num_experts=%d, top_k=%d, expert_ffn_dim=%d; need "
                        "1 <= top_k <= num_experts and expert_ffn_dim >= 1",
                        c->moe.num_experts, c->moe.top_k, c->moe.expert_ffn_dim);
    if (!(c->norm_eps > 0.0) || !(c->rope_theta > 0.0) || !(c->init_std >= 0.0))
        hs_error_append(e, HS_ERR_CONFIG,
                        "model: norm_eps=%g and rope_theta=%g must be > 0, init_std=%g >= 0",
                        c->norm_eps, c->rope_theta, c->init_std);
    if (o->max_batch < 1 || o->seq_len < 1)
        hs_error_append(e, HS_ERR_CONFIG,
                        "model options: max_batch=%d and seq_len=%d must be >= 1 (set "
                        "train.micro_batch_size and train.seq_len)",
                        o->max_batch, o->seq_len);
    int cp = o->par ? o->par->cp_size : 1;
    if (cp > 1 && o->seq_len % (2 * cp))
        hs_error_append(e, HS_ERR_CONFIG,
                        "train.seq_len=%d must be a multiple of 2 x accelerator.cp_size = %d "
                        "(each CP rank holds two of 2 x cp_size equal chunks)",
                        o->seq_len, 2 * cp);
    int split = o->par ? o->par->row_split : 1;
    if (split > 1 && o->seq_len % split)
        hs_error_append(e, HS_ERR_CONFIG,
                        "train.seq_len=%d must be a multiple of tp_size=%d under "
                        "accelerator.sequence_parallel (each TP rank holds its share of the rows)",
                        o->seq_len, split);
    if (hs_model_arch_moe(c) && o->max_batch >= 1 && o->seq_len >= 1 &&
        (int64_t)o->max_batch * o->seq_len * (c->moe.top_k > 1 ? c->moe.top_k : 1) > INT_MAX)
        hs_error_append(e, HS_ERR_CONFIG,
                        "train.micro_batch_size x train.seq_len x model.moe.top_k = %d x %d x %d "
                        "routed rows exceed %d; lower train.micro_batch_size or train.seq_len",
                        o->max_batch, o->seq_len, c->moe.top_k, INT_MAX);
    const hs_model_stage *st = &o->stage;
    bool chunks_ok = st->n_chunks >= 0 && st->n_chunks <= HS_MODEL_MAX_CHUNKS && o->act_slots >= 0;
    for (int k = 0, end = 0; chunks_ok && k < st->n_chunks; k++) {
        chunks_ok = st->n_layers[k] >= 1 && st->first_layer[k] >= end;
        end = st->first_layer[k] + st->n_layers[k];
        chunks_ok &= c->n_layers < 1 || end <= c->n_layers;
    }
    if (!chunks_ok)
        hs_error_append(e, HS_ERR_CONFIG,
                        "model options: %d stage chunks (at most %d, each of >= 1 blocks, in "
                        "model order) with %d activation slots do not fit model.n_layers=%d",
                        st->n_chunks, HS_MODEL_MAX_CHUNKS, o->act_slots, c->n_layers);
    if (!hs_dtype_is_float(o->compute_dtype) || !hs_dtype_is_float(o->grad_dtype))
        hs_error_append(e, HS_ERR_CONFIG, "model options: compute_dtype=%d / grad_dtype=%d unknown",
                        (int)o->compute_dtype, (int)o->grad_dtype);
    return e->code;
}

/* An allocation the model could not make: the first is kept and
 * hs_model_create returns it (what was left NULL is never used). */
__attribute__((format(printf, 2, 3))) static void model_oom(hs_model *m, const char *fmt, ...) {
    if (m->failed) return;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    hs_error_oom(&m->fail, "%s", what);
    m->failed = true;
}

/* Any other failure during creation, kept the same way. */
static void model_fail(hs_model *m, const hs_error *e) {
    if (m->failed) return;
    m->fail = *e;
    m->failed = true;
}

/* Every buffer of the model comes from here. With count_buffers the bytes
 * are only added up (hs_model_buffer_bytes): the plan's memory model is the
 * allocation code itself. A count that would overflow sticks at INT64_MAX,
 * which the plan reports as an error instead of a wrapped figure. */
static void count(hs_model *m, int64_t bytes) {
    hs_checked ck = {0};
    m->counted_bytes = bytes < 0 ? INT64_MAX : hs_ck_add(&ck, m->counted_bytes, bytes);
}

static void *raw(hs_model *m, size_t bytes) {
    if (m->opt.count_buffers) {
        count(m, bytes > (size_t)INT64_MAX ? -1 : (int64_t)bytes);
        return NULL;
    }
    return hs_device_alloc(m->dev, bytes);
}

static void *zeroed(hs_model *m, size_t bytes) {
    void *p = raw(m, bytes);
    if (p) hs_dev_zero(m->dev, p, bytes);
    return p;
}

/* n elements of dt, zeroed or not: a buffer every element of which is
 * written before it is read (the parameters a weights file fills) is not. */
static void *sized(hs_model *m, int64_t n, hs_dtype dt, bool zero) {
    int64_t bytes;
    if (n >= 0 && hs_mul_i64(n, (int64_t)hs_dtype_size(dt), &bytes))
        return zero ? zeroed(m, (size_t)bytes) : raw(m, (size_t)bytes);
    if (!m->opt.count_buffers)
        model_oom(m, "model: a buffer of %lld elements of %s", (long long)n, hs_dtype_name(dt));
    count(m, -1);
    return NULL;
}

static void *buf(hs_model *m, int64_t n, hs_dtype dt) { return sized(m, n, dt, true); }

/* The model-parallel seam's buffers come from here too (hs_model_alloc_fn). */
static void *seam_alloc(void *actx, int64_t n, hs_dtype dt) { return buf(actx, n, dt); }

typedef struct acts_need {
    hs_dtype resid;
    bool cast_in, moe, dense; /* an input cast; an MoE block; a dense MLP */
} acts_need;

/* What an activation set for the local blocks [lo, hi) must hold: one
 * block's, or for a set all of them share the widest of all. */
static acts_need acts_needs(const hs_model *m, int lo, int hi) {
    acts_need n = {.resid = m->dt};
    for (int i = lo; i < hi; i++) {
        const hs_unit_boundary *b = &m->bnd[m->blocks[i].unit];
        if (b->output_computed != m->dt) n.resid = b->output_computed;
        n.cast_in |= b->input_read != b->input_stored;
        n.moe |= hs_block_moe(&m->blocks[i]);
        n.dense |= !hs_block_moe(&m->blocks[i]);
    }
    return n;
}

/* Which fields of hs_block_acts a set holds: those the backward reads as
 * the forward left them, those selective checkpointing recomputes before
 * the backward (hs_block_recompute), or both. */
enum { ACTS_KEPT = 1, ACTS_RECOMPUTED = 2, ACTS_ALL = ACTS_KEPT | ACTS_RECOMPUTED };

static void acts_alloc(hs_model *m, hs_block_acts *a, int lo, int hi, int64_t BT, int parts) {
    hs_dtype dt = m->dt;
    acts_need need = acts_needs(m, lo, hi);
    bool keep = parts & ACTS_KEPT, redo = parts & ACTS_RECOMPUTED;
    int64_t q = (int64_t)m->NH * m->HD, kv = (int64_t)m->KVH * m->HD;
    if (redo) {
        a->rstd1 = buf(m, BT, HS_DTYPE_F32);
        a->ln1 = buf(m, BT * m->C, dt);
        a->x_cast = need.cast_in ? buf(m, BT * m->C, dt) : NULL;
        a->rstd2 = buf(m, BT, HS_DTYPE_F32);
        a->ln2 = buf(m, BT * m->C, dt);
    }
    /* q and k after RoPE: kept, or (qwen3) recomputed from q_in, k_in */
    if (m->qk_norm ? redo : keep) {
        a->q = buf(m, BT * q, dt);
        a->k = buf(m, BT * kv, dt);
    }
    if (m->qk_norm && keep) {
        a->q_in = buf(m, BT * q, dt);
        a->k_in = buf(m, BT * kv, dt);
    }
    if (m->qk_norm && redo) {
        a->rstd_q = buf(m, BT * m->NH, HS_DTYPE_F32);
        a->rstd_k = buf(m, BT * m->KVH, HS_DTYPE_F32);
    }
    if (keep && m->mla.on) hs_mla_acts_alloc(m, &a->mla, BT, buf);
    if (keep) {
        a->v = buf(m, BT * kv, dt);
        a->lse = buf(m, BT * m->NH, HS_DTYPE_F32);
        a->atty = buf(m, BT * q, dt);
        a->x_mid = buf(m, BT * m->C, need.resid);
    }
    if (need.moe && redo) a->moe_out = buf(m, BT * m->C, dt);
    if (need.moe && keep) {
        a->moe_mem = raw(m, hs_moe_act_bytes(&m->moe_shapes, dt));
        if (a->moe_mem) hs_moe_act_bind(&a->moe, m->dev, &m->moe_shapes, dt, a->moe_mem);
        a->moe.offset_h = m->moe_offset_h;
        if (m->moe_shapes.seam_experts) {
            a->moe.par = m->par;
            a->moe.ep_state = m->par->moe_state_new(m->par->ctx, seam_alloc, m);
            if (!a->moe.ep_state) model_oom(m, "moe: an expert-parallel exchange state");
        }
        /* Every expert unit has the same boundary plan. */
        a->moe.out_dt = m->bnd[m->blocks[m->moe_head].expert_unit].output_stored;
    }
    if (need.dense && keep) {
        a->gate = buf(m, BT * m->F, dt);
        a->up = buf(m, BT * m->F, dt);
    }
    if (need.dense && redo) a->h = buf(m, BT * m->F, dt);
}

/* Point a's recomputed fields at r's (the shared set; an empty one to
 * let go of them). */
static void acts_share(const hs_model *m, hs_block_acts *a, const hs_block_acts *r) {
    a->rstd1 = r->rstd1, a->ln1 = r->ln1, a->x_cast = r->x_cast;
    a->rstd2 = r->rstd2, a->ln2 = r->ln2, a->h = r->h, a->moe_out = r->moe_out;
    if (!m->qk_norm) return;
    a->q = r->q, a->k = r->k, a->rstd_q = r->rstd_q, a->rstd_k = r->rstd_k;
}

static void acts_free(hs_model *m, hs_block_acts *a) {
    if (a->moe.ep_state) m->par->moe_state_free(m->par->ctx, a->moe.ep_state);
    void *ptrs[] = {a->rstd1,   a->ln1,     a->q,     a->k,    a->v,      a->lse,   a->atty,
                    a->x_cast,  a->x_mid,   a->rstd2, a->ln2,  a->gate,   a->up,    a->h,
                    a->moe_out, a->moe_mem, a->q_in,  a->k_in, a->rstd_q, a->rstd_k};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) hs_device_free_mem(m->dev, ptrs[i]);
    hs_mla_acts_free(m, &a->mla);
}

/* One scratch for a block output awaiting its output cast, in the widest
 * residual dtype of the blocks that cast. */
static void out_tmp_alloc(hs_model *m, int64_t BT) {
    bool any = false;
    hs_dtype dt = m->dt;
    for (int i = 0; i < m->L; i++) {
        const hs_unit_boundary *b = &m->bnd[m->blocks[i].unit];
        if (b->output_stored == b->output_computed) continue;
        any = true;
        if (b->output_computed != m->dt) dt = b->output_computed;
    }
    m->out_tmp = any ? buf(m, BT * m->C, dt) : NULL;
}

/* Whether a linear's input is recomputed by the next block's backward
 * before the split backward's weight pass reads it: every input under
 * full checkpointing; the norm outputs and SwiGLU's under selective. */
static bool input_recomputed(const hs_model *m, hs_wgrad_input in) {
    hs_ac_mode ac = m->opt.activation_checkpointing;
    return ac == HS_AC_FULL || (ac == HS_AC_SELECTIVE && in != HS_WX_ATTY);
}

/* The split backward's record of one block (internal.h hs_wgrad_block):
 * an output gradient per dense linear, and a copy of each input the next
 * block's recompute overwrites. */
static void wgrad_alloc(hs_model *m, hs_wgrad_block *w, int64_t BT, bool dense) {
    int64_t q = (int64_t)m->NH * m->HD, kv = (int64_t)m->KVH * m->HD, F = dense ? m->F : 0;
    const int64_t width[HS_WG_OPS] = {m->C, q, kv, kv, F, F, m->C};
    const int64_t in_width[HS_WX_INPUTS] = {m->C, q, m->C, F};
    for (int k = 0; k < HS_WG_OPS; k++)
        w->op[k].dy = width[k] > 0 ? buf(m, BT * width[k], m->wg_dt) : NULL;
    for (int k = 0; k < HS_WX_INPUTS; k++)
        w->xcopy[k] = input_recomputed(m, k) && in_width[k] > 0 ? buf(m, BT * in_width[k], m->dt)
                                                                : NULL;
}

static void wgrad_free(hs_model *m, hs_wgrad_block *w) {
    for (int k = 0; k < HS_WG_OPS; k++) hs_device_free_mem(m->dev, w->op[k].dy);
    for (int k = 0; k < HS_WX_INPUTS; k++) hs_device_free_mem(m->dev, w->xcopy[k]);
}

/* One micro-batch's residual stream, block activations and final norm of
 * one chunk. With full activation checkpointing the block activations are
 * recomputed in backward, so every slot shares the first one's (sized for
 * every block); with selective each block keeps its own kept fields and
 * shares m->recomp's recomputed ones. */
static void slot_alloc(hs_model *m, hs_act_slot *sl, int chunk, int64_t BT) {
    int len = m->chunk_len[chunk];
    sl->chunk = chunk, sl->len = len;
    sl->resid = calloc((size_t)len + 1, sizeof *sl->resid);
    if (!sl->resid) {
        model_oom(m, "model: %d residual pointers", len + 1);
        return;
    }
    for (int j = 0; j <= len; j++)
        sl->resid[j] = buf(m, BT * m->C, hs_model_chunk_stream_dtype(m, chunk, j));
    hs_ac_mode ac = m->opt.activation_checkpointing;
    bool shared = ac == HS_AC_FULL && sl != m->slots;
    int n = ac == HS_AC_FULL ? 1 : len;
    sl->acts = shared ? m->slots[0].acts : calloc((size_t)n, sizeof *sl->acts);
    if (!sl->acts) {
        model_oom(m, "model: %d activation sets", n);
        return;
    }
    for (int j = 0; !shared && j < n; j++) {
        int i = m->chunk_begin[chunk] + j;
        if (ac == HS_AC_FULL) acts_alloc(m, &sl->acts[j], 0, m->L, BT, ACTS_ALL);
        else if (ac == HS_AC_OFF) acts_alloc(m, &sl->acts[j], i, i + 1, BT, ACTS_ALL);
        else acts_alloc(m, &sl->acts[j], i, i + 1, BT, ACTS_KEPT);
        if (ac == HS_AC_SELECTIVE) acts_share(m, &sl->acts[j], &m->recomp);
    }
    bool head = hs_model_chunk_has_head(m, chunk);
    sl->rstdf = head ? buf(m, BT, HS_DTYPE_F32) : NULL;
    sl->lnf = head ? buf(m, BT * m->C, m->dt) : NULL;
    sl->aux_g = m->moe ? buf(m, m->moe_shapes.E, HS_DTYPE_F32) : NULL;
    if (m->seq_host) {
        sl->seq_coef =
            calloc((size_t)len * (size_t)m->opt.max_batch * (size_t)m->moe_shapes.E, sizeof(float));
        if (!sl->seq_coef) model_oom(m, "moe: %d blocks' sequence-wise balance terms", len);
    }
    if (!m->opt.split_backward) return;
    sl->wg = calloc((size_t)len + 1, sizeof *sl->wg);
    if (!sl->wg) {
        model_oom(m, "model: %d weight-gradient records", len);
        return;
    }
    for (int j = 0; j < len; j++)
        wgrad_alloc(m, &sl->wg[j], BT, !hs_block_moe(&m->blocks[m->chunk_begin[chunk] + j]));
}

static void slot_free(hs_model *m, hs_act_slot *sl) {
    if (sl->resid)
        for (int j = 0; j <= sl->len; j++) hs_device_free_mem(m->dev, sl->resid[j]);
    free(sl->resid);
    hs_ac_mode ac = m->opt.activation_checkpointing;
    bool shared = ac == HS_AC_FULL && sl != m->slots;
    int n = ac == HS_AC_FULL ? 1 : sl->len;
    for (int j = 0; !shared && sl->acts && j < n; j++) {
        if (ac == HS_AC_SELECTIVE) acts_share(m, &sl->acts[j], &(hs_block_acts){0});
        acts_free(m, &sl->acts[j]);
    }
    if (!shared) free(sl->acts);
    hs_device_free_mem(m->dev, sl->rstdf);
    hs_device_free_mem(m->dev, sl->lnf);
    hs_device_free_mem(m->dev, sl->aux_g);
    free(sl->seq_coef);
    for (int j = 0; sl->wg && j < sl->len; j++) wgrad_free(m, &sl->wg[j]);
    free(sl->wg);
}

void hs_model_use_slot(hs_model *m, int chunk, int slot) {
    HS_ASSERT(chunk >= 0 && chunk < m->n_chunks && slot >= 0 && slot < m->n_slots);
    hs_act_slot *sl = &m->slots[chunk * m->n_slots + slot];
    m->cur_chunk = chunk;
    m->resid = sl->resid;
    m->acts = sl->acts;
    m->rstdf = sl->rstdf;
    m->lnf = sl->lnf;
    m->aux_g = sl->aux_g;
    m->seq_coef = sl->seq_coef;
    m->wg_slot = sl->wg;
}

/* Whether every buffer size below is an int64 without overflow: each is at
 * most a few times the (max_batch x seq_len) rows by the widest row (or the
 * head's <= HEAD_ROWS rows by the vocabulary, which always fits). */
static bool buffer_sizes_fit(const hs_model *m, int64_t q, int64_t kv) {
    int64_t w = m->C > q ? m->C : q, out;
    w = kv > w ? kv : w;
    w = m->F > w ? m->F : w;
    return hs_prod_i64((const int64_t[]){m->opt.max_batch, m->opt.seq_len, w, 16}, 4, &out);
}

/* The seam's buffers come from the model's allocator, so the plan counts
 * them; the dims are what the seam computes with. */
static void seam_bind(hs_model *m, int64_t BT) {
    m->dims = (hs_model_dims){.dev = m->dev,
                              .dt = m->dt,
                              .max_batch = m->opt.max_batch,
                              .seq_len = m->opt.seq_len,
                              .C = m->C,
                              .HD = m->HD,
                              .NH = m->NH,
                              .KVH = m->KVH,
                              .V = m->V,
                              .Vg = m->Vg,
                              .rows = BT,
                              .head_rows = m->head_rows,
                              .norm_eps = (float)m->cfg.norm_eps,
                              .cos_t = m->cos_t,
                              .rope_hd = m->rope_hd,
                              .sin_t = m->sin_t,
                              .E = m->moe ? m->moe_shapes.E : 0,
                              .K = m->moe ? m->moe_shapes.K : 0,
                              .F_expert = m->moe ? m->moe_shapes.F : 0,
                              .moe_rows = m->moe ? (int64_t)m->moe_shapes.BT * m->moe_shapes.K : 0,
                              .count_only = m->opt.count_buffers};
    hs_error e;
    if (m->par->bind(m->par->ctx, &m->dims, seam_alloc, m, &e) != HS_OK && !m->failed) {
        m->fail = e;
        m->failed = true;
    }
    m->bound = true;
}

static void buffers_alloc(hs_model *m) {
    hs_dtype dt = m->dt;
    int T = m->opt.seq_len;
    /* Activations hold this rank's rows: under CP T/cp of each sequence. */
    int64_t BT = (int64_t)m->opt.max_batch * (T / m->cp), q = (int64_t)m->NH * m->HD;
    int64_t kv = (int64_t)m->KVH * m->HD, F = m->dense ? m->F : 0;
    if (!buffer_sizes_fit(m, q, kv)) {
        if (!m->opt.count_buffers)
            model_oom(m, "model: %d x %d tokens of rows up to %lld wide", m->opt.max_batch, T,
                      (long long)(q > m->F ? q : m->F));
        count(m, -1);
        return;
    }
    /* Enough rows for an efficient GEMM, few enough that the chunk stays small. */
    m->head_rows = BT < HEAD_ROWS ? BT : HEAD_ROWS;
    /* canonical sums: a chunk is one whole sequence */
    if (m->opt.canonical_sums && m->head_rows < T) m->head_rows = T;
    if (m->opt.canonical_sums && !m->opt.count_buffers) {
        m->canon_loss = calloc((size_t)m->opt.max_batch, sizeof(double));
        if (!m->canon_loss) model_oom(m, "model: the losses of %d sequences", m->opt.max_batch);
    }
    if (m->opt.canonical_sums) {
        hs_error me;
        hs_error_clear(&me);
        if (hs_canon_mutation_from_env(&m->canon_mutate, &me) != HS_OK) model_fail(m, &me);
        int64_t tree, tied;
        hs_canon_scratch_floats(m, &tree, &tied);
        m->canon_buf = raw(m, (size_t)tree * sizeof(float));
        m->canon_floats = m->canon_buf ? tree : 0;
        m->canon_tied = tied ? raw(m, (size_t)tied * sizeof(float)) : NULL;
        m->canon_tied_floats = m->canon_tied ? tied : 0;
        size_t moe = m->moe ? hs_moe_wgrad_host_bytes(&m->moe_shapes, m->opt.max_batch) : 0;
        if (moe && !m->opt.count_buffers && !(m->canon_moe = malloc(moe)))
            model_oom(m, "moe: %zu bytes of the sequences' rows", moe);
    }
    int half = m->rope_hd / 2;
    m->cos_t = buf(m, (int64_t)T * half, HS_DTYPE_F32);
    m->sin_t = buf(m, (int64_t)T * half, HS_DTYPE_F32);
    float *inv = m->cos_t ? malloc(sizeof(float) * (size_t)(half + 1)) : NULL, scale = 1.0f;
    if (m->cos_t && !inv) model_oom(m, "model: %d RoPE frequencies", half);
    if (inv) {
        hs_model_rope_freqs(&m->cfg, m->rope_hd, inv, &scale);
        m->k->rope_tables(m->s, m->cos_t, m->sin_t, T, m->rope_hd, inv, scale);
    }
    free(inv);
    m->rope_cos = m->cos_t, m->rope_sin = m->sin_t;
    seam_bind(m, BT); /* before the activation sets, whose MoE layers ask the seam */
    /* a linear's output gradient as its GEMMs read it (hs_linear_dout) */
    m->wg_dt = hs_device_gemm_native(m->dev, dt) ? dt : HS_DTYPE_F32;
    m->n_acts = m->opt.activation_checkpointing == HS_AC_FULL ? 1 : m->L;
    /* selective: what every block's backward recomputes, sized for all */
    if (m->opt.activation_checkpointing == HS_AC_SELECTIVE)
        acts_alloc(m, &m->recomp, 0, m->L, BT, ACTS_RECOMPUTED);
    m->n_slots = m->opt.act_slots > 0 ? m->opt.act_slots : 1;
    int total = m->n_chunks * m->n_slots;
    m->slots = calloc((size_t)total, sizeof *m->slots);
    if (!m->slots) {
        model_oom(m, "model: %d activation slots", total);
        return;
    }
    for (int k = 0; k < total; k++) slot_alloc(m, &m->slots[k], k / m->n_slots, BT);
    hs_model_use_slot(m, 0, 0);
    out_tmp_alloc(m, BT);
    if (m->head) m->logits = buf(m, m->head_rows * m->V, HS_DTYPE_F32);
    size_t batch_bytes = (size_t)m->opt.max_batch * (size_t)m->opt.seq_len * sizeof(int32_t);
    if (m->first_stage) m->batch_tokens = raw(m, batch_bytes);
    if (m->last_stage) m->batch_targets = raw(m, batch_bytes);
    if (m->opt.document_masking) m->batch_docs = raw(m, batch_bytes);
    m->dres = buf(m, BT * m->C, HS_DTYPE_F32);
    m->dln = buf(m, BT * m->C, HS_DTYPE_F32);
    m->dq = buf(m, BT * q, HS_DTYPE_F32);
    m->dk = buf(m, BT * kv, HS_DTYPE_F32);
    m->dv = buf(m, BT * kv, HS_DTYPE_F32);
    m->datt = buf(m, BT * q, HS_DTYPE_F32);
    if (m->mla.on) hs_mla_bufs_alloc(m, BT, buf);
    if (F > 0) {
        m->dg = buf(m, BT * F, HS_DTYPE_F32);
        m->du = buf(m, BT * F, HS_DTYPE_F32);
        m->dh = buf(m, BT * F, HS_DTYPE_F32);
    }
    m->att_threads = m->opt.threads > 1 ? m->opt.threads : 1;
    m->att_scratch = buf(m, hs_attention_scratch_floats(T, m->HD, m->att_threads), HS_DTYPE_F32);
    m->att_delta = buf(m, BT * m->NH, HS_DTYPE_F32);
    /* the block norms' rows of C, and qwen3's head norms' rows of HD */
    int64_t part = hs_rmsnorm_backward_scratch(BT, m->C);
    int64_t head_part = m->qk_norm ? hs_rmsnorm_backward_scratch(BT * m->NH, m->HD) : 0;
    for (int k = 0; m->mla.on && k < 2; k++) { /* MLA's latent norms */
        int64_t w = k ? m->mla.KL : m->mla.QL,
                p = w > 0 ? hs_rmsnorm_backward_scratch(BT, (int)w) : 0;
        head_part = p > head_part ? p : head_part;
    }
    m->norm_part = raw(m, (size_t)(part > head_part ? part : head_part) * sizeof(double));
    if (hs_device_gemm_native(m->dev, dt)) {
        int64_t w = m->C > q ? m->C : q, mla = hs_mla_widest(m);
        w = F > w ? F : w;
        w = mla > w ? mla : w;
        int64_t hv = m->head ? m->head_rows * m->V : 0;
        int64_t n = BT * w > hv ? BT * w : hv;
        m->dout16 = buf(m, n, dt);
    }
    if (m->moe) {
        m->moe_scratch = raw(m, hs_moe_scratch_bytes(&m->moe_shapes, dt));
        if (m->opt.count_buffers) count(m, (int64_t)hs_moe_aux_bytes(m->moe_shapes.E));
        else if (!hs_moe_aux_init(&m->aux, m->moe_shapes.E, m->moe_shapes.K, m->dev))
            model_oom(m, "moe aux: the host copies of %d experts' totals", m->moe_shapes.E);
        m->aux_buf = buf(m, 2 * (int64_t)m->moe_shapes.E + 2, HS_DTYPE_F32);
        m->aux_stage = buf(m, 2 * (int64_t)m->moe_shapes.E + 2, HS_DTYPE_F32);
        size_t tokens = (size_t)m->L * (size_t)m->moe_shapes.E;
        m->expert_tokens = zeroed(m, tokens * sizeof(int64_t));
        if (m->expert_tokens) {
            m->expert_tokens_host = calloc(tokens, sizeof(int64_t));
            if (!m->expert_tokens_host) model_oom(m, "model: %zu expert counts", tokens);
        }
    }
}

static void params_alloc(hs_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        hs_param *p = &m->params[i];
        int64_t n = hs_param_local_numel(p);
        /* weights from a file: the load writes every element (hs_model_init_weights) */
        p->data = sized(m, n, m->dt, !m->opt.weights_from_file);
        p->grad = m->opt.no_grad || p->frozen ? NULL : buf(m, n, p->grad_dtype);
    }
}

static void dims_set(hs_model *m) {
    const hs_model_config *c = &m->cfg;
    m->dt = m->opt.compute_dtype;
    m->C = c->dim;
    m->NH = c->n_heads;
    m->mla = hs_mla_shape_of(c);
    /* latent attention expands a key and a value for every query head */
    m->KVH = c->n_kv_heads > 0 && !m->mla.on ? c->n_kv_heads : c->n_heads;
    m->HD = hs_model_head_dim(c);
    m->rope_hd = m->mla.on ? m->mla.R : m->HD;
    m->F = c->ffn_dim;
    m->V = c->vocab_size;
    m->NHg = m->NH, m->KVHg = m->KVH, m->Fg = m->F, m->Vg = m->V;
    m->local_par = *hs_model_one_device_par();
    m->local_par.ctx = &m->dims;
    m->par = m->opt.par ? m->opt.par : &m->local_par;
    m->cp = m->par->cp_size;
    const hs_model_stage *st = &m->opt.stage;
    m->n_chunks = st->n_chunks > 0 ? st->n_chunks : 1;
    m->L = 0;
    for (int k = 0; k < m->n_chunks; k++) {
        m->chunk_l0[k] = st->n_chunks > 0 ? st->first_layer[k] : 0;
        m->chunk_len[k] = st->n_chunks > 0 ? st->n_layers[k] : c->n_layers;
        m->chunk_begin[k] = m->L;
        m->L += m->chunk_len[k];
    }
    m->first_stage = m->chunk_l0[0] == 0;
    int last = m->n_chunks - 1;
    m->last_stage = m->chunk_l0[last] + m->chunk_len[last] == c->n_layers;
    m->layer_of = calloc((size_t)(m->L > 0 ? m->L : 1), sizeof *m->layer_of);
    if (!m->layer_of) {
        model_oom(m, "model: %d block indices", m->L);
        return;
    }
    for (int k = 0; k < m->n_chunks; k++)
        for (int j = 0; j < m->chunk_len[k]; j++)
            m->layer_of[m->chunk_begin[k] + j] = m->chunk_l0[k] + j;
    m->moe = hs_model_arch_moe(c);
    m->qk_norm = hs_model_arch_qk_norm(c);
    if (m->moe) {
        m->moe_shapes = hs_moe_shapes_make(&c->moe, m->opt.max_batch * m->opt.seq_len, m->C);
        m->moe_shapes.router = hs_moe_router_of(c);
        m->moe_offset_h = malloc(((size_t)m->moe_shapes.E + 1) * sizeof *m->moe_offset_h);
        if (!m->moe_offset_h)
            model_oom(m, "moe: the host copy of %d experts' offsets", m->moe_shapes.E);
        size_t seq = hs_moe_seq_host_bytes(&m->moe_shapes, m->opt.max_batch);
        bool real = !m->opt.no_grad && !m->opt.count_buffers && !m->opt.describe_only;
        if (c->moe.seq_aux_loss_coef > 0 && real && !(m->seq_host = malloc(seq)))
            model_oom(m, "moe: %zu bytes of the sequence-wise balance loss's workspace", seq);
    }
}

/* The model, or nothing (freed) when e holds an error. */
static hs_status created(hs_model *m, hs_model **out, hs_error *e) {
    if (e->code == HS_OK) {
        *out = m;
        return HS_OK;
    }
    hs_model_free(m);
    return e->code;
}

hs_status hs_model_create(const hs_model_config *cfg, const hs_model_options *opt, hs_model **out,
                          hs_error *e) {
    *out = NULL;
    if (check_dims(cfg, opt, e) != HS_OK) return e->code;
    hs_model *m = calloc(1, sizeof *m);
    if (!m) return hs_error_oom(e, "model: the model struct");
    m->cfg = *cfg;
    m->opt = *opt;
    m->dev = opt->dev;
    if (!m->dev && hs_device_create(HS_DEVICE_CPU, NULL, &m->own_dev, e) != HS_OK) {
        free(m);
        return e->code;
    }
    if (!m->dev) m->dev = m->own_dev;
    m->k = m->dev->k, m->s = m->dev->stream;
    dims_set(m);
    if (m->failed) {
        *e = m->fail;
        return created(m, out, e);
    }
    if (hs_model_registry_build(m, e) != HS_OK || hs_model_layout_apply(m, e) != HS_OK ||
        hs_model_boundary_plan(m, e) != HS_OK)
        return created(m, out, e);
    if (opt->allocate_params && !opt->describe_only) params_alloc(m);
    if (!opt->describe_only) buffers_alloc(m);
    /* what could not be allocated: the model's own report, or the device's
     * record of a buffer it refused */
    if (m->failed) *e = m->fail;
    else if (!opt->describe_only && !opt->count_buffers) (void)hs_device_status(m->dev, e);
    return created(m, out, e);
}

static void params_free(hs_model *m) {
    if (!m->opt.allocate_params || m->opt.describe_only) return;
    for (int i = 0; i < m->n_params; i++) {
        if (!m->params[i].borrowed) hs_device_free_mem(m->dev, m->params[i].data);
        hs_device_free_mem(m->dev, m->params[i].grad);
    }
}

bool hs_model_borrow_param(hs_model *m, int i, const float *data) {
    hs_param *p = hs_model_param(m, i);
    /* host memory the kernels read as device memory: not on a GPU, nor
     * under the guard, which holds them to device memory as a GPU would */
    if (!m->dev->host_visible || m->dev->guard || m->dt != HS_DTYPE_F32 ||
        !m->opt.allocate_params || m->opt.describe_only || !p->data || p->borrowed ||
        hs_param_local_numel(p) != hs_param_numel(p) || !data || (uintptr_t)data % HS_ALIGN != 0)
        return false;
    hs_device_free_mem(m->dev, p->data);
    p->data = (float *)(uintptr_t)data; /* read only: nothing of a forward writes it */
    p->borrowed = true;
    return true;
}

static void buffers_free(hs_model *m) {
    for (int k = 0; m->slots && k < m->n_chunks * m->n_slots; k++) slot_free(m, &m->slots[k]);
    free(m->slots);
    acts_free(m, &m->recomp);
    if (m->bound) m->par->unbind(m->par->ctx);
    void *ptrs[] = {
        m->logits,  m->cos_t,        m->sin_t,         m->dres,        m->dln,       m->dq,
        m->dk,      m->dv,           m->datt,          m->dg,          m->du,        m->dh,
        m->dout16,  m->att_scratch,  m->norm_part,     m->moe_scratch, m->aux_stage, m->out_tmp,
        m->aux_buf, m->batch_tokens, m->batch_targets, m->att_delta,   m->batch_docs};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) hs_device_free_mem(m->dev, ptrs[i]);
    hs_mla_bufs_free(m);
    hs_device_free_mem(m->dev, m->expert_tokens);
    free(m->expert_tokens_host);
    if (m->moe && m->aux.dev) hs_moe_aux_free(&m->aux);
    free(m->moe_offset_h);
    free(m->seq_host);
    free(m->canon_moe);
}

void hs_model_free(hs_model *m) {
    if (!m) return;
    if (m->params) params_free(m);
    hs_device_free_mem(m->dev, m->canon_buf);
    hs_device_free_mem(m->dev, m->canon_tied);
    free(m->canon_loss);
    buffers_free(m);
    hs_model_registry_free(m);
    free(m->bnd);
    free(m->layer_of);
    hs_device_free(m->own_dev);
    free(m);
}

const hs_model_config *hs_model_config_of(const hs_model *m) { return &m->cfg; }

hs_device *hs_model_device(const hs_model *m) { return m->dev; }

int64_t hs_model_buffer_bytes(const hs_model *m) { return m->counted_bytes; }

const int64_t *hs_model_expert_tokens(const hs_model *m, int *n_layers, int *n_experts) {
    *n_layers = m->moe ? m->L : 0;
    *n_experts = m->moe ? m->moe_shapes.E : 0;
    if (!m->moe || !m->expert_tokens) return NULL;
    hs_device_copy(m->dev, m->expert_tokens_host, m->expert_tokens,
                   (size_t)m->L * (size_t)m->moe_shapes.E * sizeof(int64_t), HS_COPY_D2H);
    return m->expert_tokens_host;
}

void hs_model_expert_tokens_reset(hs_model *m) {
    if (m->moe)
        hs_dev_zero(m->dev, m->expert_tokens,
                    (size_t)m->L * (size_t)m->moe_shapes.E * sizeof(int64_t));
}

/* The stage's chunks: what each holds (model.h, "pipeline stages"). */
bool hs_model_is_first_stage(const hs_model *m) { return m->first_stage; }
bool hs_model_is_last_stage(const hs_model *m) { return m->last_stage; }
int hs_model_num_chunks(const hs_model *m) { return m->n_chunks; }
bool hs_model_chunk_has_embedding(const hs_model *m, int chunk) {
    return m->first_stage && chunk == 0;
}
bool hs_model_chunk_has_head(const hs_model *m, int chunk) {
    return m->last_stage && chunk == m->n_chunks - 1;
}
int hs_model_block_layer(const hs_model *m, int local) {
    HS_ASSERT(local >= 0 && local < m->L);
    return m->layer_of[local];
}
int hs_model_num_slots(const hs_model *m) { return m->n_slots; }

int64_t hs_model_local_rows(const hs_model *m, int64_t N) { return N / m->par->row_split; }

hs_block_acts *hs_model_acts_for(hs_model *m, int j) {
    return &m->acts[m->opt.activation_checkpointing == HS_AC_FULL ? 0 : j];
}
