/* One Llama decoder block, forward and backward:
 *   x_mid = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),
 *           n1 = input_layernorm(x)
 *   (qwen3: rope(q_norm(q_proj(n1))) and rope(k_norm(k_proj(n1))), each
 *   norm an RMSNorm of every head's HD values with one [HD] weight)
 *   x_out = x_mid + mlp(post_attention_layernorm(x_mid)),
 *   mlp   = down_proj(silu(gate_proj(.)) * up_proj(.))  or the sparse MoE.
 * Parameter pointers are read at use, i.e. after the unit's hooks ran. */
#include <string.h>

#include "model/layers.h"
#include "model/internal.h"

static void zero_f32(hs_model *m, float *x, int64_t n) {
    hs_dev_zero(m->dev, x, (size_t)n * sizeof(float));
}

static hs_moe_weights moe_weights(const hs_block_params *bp) {
    hs_moe_weights w = {bp->router->data,
                        bp->w1->data,
                        bp->w3->data,
                        bp->w2->data,
                        bp->sh_gate ? bp->sh_gate->data : NULL,
                        bp->sh_up ? bp->sh_up->data : NULL,
                        bp->sh_down ? bp->sh_down->data : NULL,
                        bp->bias ? bp->bias->data : NULL};
    return w;
}

/* This block's attention tensors for the seam. */
static hs_attn_io attn_io(hs_model *m, hs_block_acts *a, int B, int T) {
    return (hs_attn_io){.B = B,
                        .T = T,
                        .NH = m->NH,
                        .KVH = m->KVH,
                        .HD = m->HD,
                        .dt = m->dt,
                        .q = a->q,
                        .k = a->k,
                        .v = a->v,
                        .out = a->atty,
                        .lse = a->lse,
                        .dout = m->datt,
                        .dq = m->dq,
                        .dk = m->dk,
                        .dv = m->dv,
                        .scratch = m->att_scratch,
                        .threads = m->att_threads,
                        .delta = m->att_delta,
                        .dout16 = m->dout16,
                        .doc_lo = m->doc_lo,
                        .doc_ld = m->doc_ld};
}

/* qwen3's q_norm / k_norm: an RMSNorm over each head's HD values, the
 * rows = tokens x heads of this rank (token-wise, so every layout runs it
 * on what it holds). */
static void head_norm_forward(hs_model *m, void *out, float *rstd, const void *x, const hs_param *w,
                              int64_t rows) {
    m->k->rmsnorm_fwd(m->s, out, rstd, x, m->dt, w->data, m->dt, rows, m->HD,
                      (float)m->cfg.norm_eps);
}

/* d(norm input) from d(norm output) `dout`, into m->datt (free once
 * attention's backward has read it); the weight gradient accumulates. */
static const float *head_norm_backward(hs_model *m, const float *dout, const void *x, hs_param *w,
                                       const float *rstd, int64_t rows) {
    zero_f32(m, m->datt, rows * m->HD);
    hs_block_norm_backward(m, m->datt, w, dout, x, m->dt, rstd, rows, m->HD);
    return m->datt;
}

/* The attention region's first column-parallel linear: its style decides
 * the region's rows (latent attention's down-projections before it are
 * whole on every TP rank and read the same rows). */
static const hs_param *attn_first(const hs_block_params *bp) { return bp->wq; }

/* o_proj's input width: the heads' values. */
static int o_width(const hs_model *m) { return m->NH * (m->mla.on ? m->mla.Vd : m->HD); }

/* q and k (the rows at k) as attention reads them from the projections:
 * qwen3's head norms of q_in and k_in, then RoPE in place. */
static void qk_rope(hs_model *m, const hs_block_params *bp, hs_block_acts *a, void *k, int B,
                    int T) {
    int64_t N = (int64_t)B * T;
    if (m->qk_norm) {
        head_norm_forward(m, a->q, a->rstd_q, a->q_in, bp->q_norm, N * m->NH);
        head_norm_forward(m, k, a->rstd_k, a->k_in, bp->k_norm, N * m->KVH);
    }
    m->k->rope_fwd(m->s, a->q, m->dt, m->rope_cos, m->rope_sin, B, T, m->NH, m->HD);
    m->k->rope_fwd(m->s, k, m->dt, m->rope_cos, m->rope_sin, B, T, m->KVH, m->HD);
}

/* x (in xdt) is the block input as the block reads it; x_mid is in rdt.
 * Attention needs every row of a sequence: its region is always all N.
 * With kv (generation, B = 1) the T rows are new positions [kv->pos,
 * kv->pos + T): their keys and values go into the cache's rows there and
 * attention reads the cache's rows up to them. */
static void attention_forward(hs_model *m, const hs_block_params *bp, hs_block_acts *a,
                              const void *x, hs_dtype xdt, hs_dtype rdt, int B, int T,
                              const hs_block_kv *kv) {
    const hs_model_par *par = m->par;
    hs_dtype dt = m->dt;
    int64_t N = (int64_t)B * T;
    int C = m->C, qd = m->NH * m->HD, kvd = m->KVH * m->HD;
    void *k = kv ? hs_at(kv->k, dt, (int64_t)kv->pos * kvd) : a->k;
    void *v = kv ? hs_at(kv->v, dt, (int64_t)kv->pos * kvd) : a->v;
    par->norm_enter(par->ctx, a->ln1, a->rstd1, x, xdt, bp->ln1->data, attn_first(bp), N);
    if (m->mla.on && kv) { /* the latent cache; k, v: every position's, expanded */
        hs_mla_cache c = {.lat = kv->lat, .pe = kv->pe, .k = kv->k, .v = kv->v};
        hs_mla_forward_cached(m, bp, a, &c, kv->pos, T);
    } else if (m->mla.on) {
        hs_mla_forward(m, bp, a, k, v, B, T);
    } else {
        void *q = m->qk_norm ? a->q_in : a->q, *kp = m->qk_norm ? a->k_in : k;
        hs_linear_forward(m->dev, q, a->ln1, bp->wq->data, dt, N, C, qd, 0);
        hs_linear_forward(m->dev, kp, a->ln1, bp->wk->data, dt, N, C, kvd, 0);
        hs_linear_forward(m->dev, v, a->ln1, bp->wv->data, dt, N, C, kvd, 0);
        qk_rope(m, bp, a, k, B, T); /* into the cache's rows, when there is one */
    }
    hs_attn_io io = attn_io(m, a, B, T);
    if (kv) {
        io.k = kv->k, io.v = kv->v;
        par->attention_cached(par->ctx, &io, kv->pos, kv->rows);
    } else {
        par->attention_fwd(par->ctx, &io);
    }
    const void *o_in = m->mla.on ? hs_mla_o_input(m, a, N) : a->atty;
    par->rowwise_add(par->ctx, a->x_mid, rdt, x, xdt, o_in, bp->wo, N, o_width(m), C);
}

/* Block bp's sequence-wise balance term on a micro-batch of B sequences of
 * T (local) rows, in q; NULL without the loss. */
static const hs_moe_seq *block_seq(const hs_model *m, const hs_block_params *bp, int B, int T,
                                   hs_moe_seq *q) {
    if (!m->seq_coef) return NULL;
    const int j = (int)(bp - m->blocks) - m->chunk_begin[m->cur_chunk];
    const int64_t rows = hs_model_local_rows(m, (int64_t)B * T);
    *q = (hs_moe_seq){.coef = m->seq_coef + (size_t)j * (size_t)m->opt.max_batch * m->moe_shapes.E,
                      .host = m->seq_host,
                      .B = B,
                      .T_local = T,
                      .cp_size = m->par->cp_size > 1 ? m->par->cp_size : 1,
                      .max_batch = m->opt.max_batch,
                      .row0 = (int64_t)m->par->row_rank * rows};
    return q;
}

/* x_out (in rdt, the block's residual dtype) = x_mid + mlp(ln2) on the
 * MLP region's `rows` (of B sequences of T rows). */
static void mlp_forward(hs_model *m, const hs_block_params *bp, hs_block_acts *a, void *x_out,
                        hs_dtype rdt, int64_t rows, int B, int T, const hs_model_hooks *hooks,
                        bool count_aux) {
    const hs_model_par *par = m->par;
    hs_dtype dt = m->dt;
    int C = m->C;
    if (!hs_block_moe(bp)) {
        hs_linear_forward(m->dev, a->gate, a->ln2, bp->wg->data, dt, rows, C, m->F, 0);
        hs_linear_forward(m->dev, a->up, a->ln2, bp->wu->data, dt, rows, C, m->F, 0);
        m->k->swiglu_fwd(m->s, a->h, a->gate, a->up, dt, rows * m->F);
        par->rowwise_add(par->ctx, x_out, rdt, a->x_mid, rdt, a->h, bp->wd, rows, m->F, C);
        return;
    }
    /* The MoE layer is token-wise (its region is replicated): each rank
     * routes the rows it holds. */
    hs_hook_pre_forward(hooks, bp->expert_unit);
    hs_moe_weights w = moe_weights(bp);
    hs_moe_forward(a->moe_out, &a->moe, a->ln2, &w, (int)rows, m->moe_scratch);
    hs_unit_boundary *eb = &m->bnd[bp->expert_unit];
    eb->forward_casts += eb->output_stored != eb->output_computed;
    hs_hook_post_forward(hooks, bp->expert_unit);
    hs_moe_seq q;
    const hs_moe_seq *seq = count_aux ? block_seq(m, bp, B, T, &q) : NULL;
    if (seq)
        m->seq_value +=
            hs_moe_seq_forward(&a->moe, seq, m->par, m->cfg.moe.seq_aux_loss_coef, m->seq_S);
    if (count_aux) {
        hs_moe_aux_add(&m->aux, &a->moe);
        int64_t *tok = m->expert_tokens + (int64_t)(bp - m->blocks) * m->moe_shapes.E;
        m->k->moe_stats_add(m->s, tok, NULL, a->moe.count, NULL, m->moe_shapes.E);
    }
    hs_dev_add_cast(m->dev, x_out, rdt, a->x_mid, rdt, a->moe_out, dt, rows * C);
}

/* The first parameter of the block's MLP region: its style decides the
 * region's rows. */
static const hs_param *mlp_first(const hs_block_params *bp) { return bp->wg ? bp->wg : bp->router; }

/* The block input as the block reads it: cast to the compute dtype into
 * a->x_cast (cast_forward_inputs), or as it is stored. */
static const void *block_input(hs_model *m, hs_block_acts *a, hs_unit_boundary *b, const void *x_in,
                               int64_t n) {
    if (b->input_read == b->input_stored) return x_in;
    hs_dev_convert(m->dev, a->x_cast, b->input_read, x_in, b->input_stored, n);
    b->forward_casts++;
    return a->x_cast;
}

static void block_forward(hs_model *m, int layer, hs_block_acts *a, const void *x_in, void *x_out,
                          int B, int T, const hs_block_kv *kv, const hs_model_hooks *hooks,
                          bool count_aux) {
    const hs_block_params *bp = &m->blocks[layer];
    hs_unit_boundary *b = &m->bnd[bp->unit];
    hs_dtype rdt = b->output_computed;
    int64_t N = (int64_t)B * T, Nl = hs_model_local_rows(m, N);
    attention_forward(m, bp, a, block_input(m, a, b, x_in, Nl * m->C), b->input_read, rdt, B, T,
                      kv);
    a->mlp_rows = m->par->norm_enter(m->par->ctx, a->ln2, a->rstd2, a->x_mid, rdt, bp->ln2->data,
                                     mlp_first(bp), N);
    bool cast_out = b->output_stored != rdt;
    mlp_forward(m, bp, a, cast_out ? m->out_tmp : x_out, rdt, a->mlp_rows, B, T, hooks, count_aux);
    if (!cast_out) return;
    hs_dev_convert(m->dev, x_out, b->output_stored, m->out_tmp, rdt, Nl * m->C);
    b->forward_casts++;
}

void hs_block_forward(hs_model *m, int layer, hs_block_acts *a, const void *x_in, void *x_out,
                      int B, int T, const hs_model_hooks *hooks, bool count_aux) {
    block_forward(m, layer, a, x_in, x_out, B, T, NULL, hooks, count_aux);
}

void hs_block_forward_cached(hs_model *m, int layer, hs_block_acts *a, const void *x_in,
                             void *x_out, int T, const hs_block_kv *kv,
                             const hs_model_hooks *hooks) {
    block_forward(m, layer, a, x_in, x_out, 1, T, kv, hooks, false);
}

/* The forward's element-wise ops again, on the same inputs: the input
 * cast, both norms (with their gathers under sequence parallelism),
 * qwen3's head norms and RoPE, and SwiGLU. The GEMM and attention outputs
 * they read or feed are the block's own (internal.h hs_block_acts). */
void hs_block_recompute(hs_model *m, int layer, hs_block_acts *a, const void *x_in, int B, int T) {
    const hs_block_params *bp = &m->blocks[layer];
    hs_unit_boundary *b = &m->bnd[bp->unit];
    const hs_model_par *par = m->par;
    int64_t N = (int64_t)B * T;
    const void *x = block_input(m, a, b, x_in, hs_model_local_rows(m, N) * m->C);
    par->norm_enter(par->ctx, a->ln1, a->rstd1, x, b->input_read, bp->ln1->data, attn_first(bp), N);
    if (m->qk_norm) qk_rope(m, bp, a, a->k, B, T);
    a->mlp_rows = par->norm_enter(par->ctx, a->ln2, a->rstd2, a->x_mid, b->output_computed,
                                  bp->ln2->data, mlp_first(bp), N);
    if (!hs_block_moe(bp)) m->k->swiglu_fwd(m->s, a->h, a->gate, a->up, m->dt, a->mlp_rows * m->F);
}

static hs_moe_grads moe_grads(const hs_block_params *bp) {
    hs_moe_grads g = {bp->router->grad,
                      bp->w1->grad,
                      bp->w3->grad,
                      bp->w2->grad,
                      bp->sh_gate ? bp->sh_gate->grad : NULL,
                      bp->sh_up ? bp->sh_up->grad : NULL,
                      bp->sh_down ? bp->sh_down->grad : NULL,
                      bp->w1->grad_dtype,
                      NULL};
    return g;
}

/* The first of the linears reading each input records it (the split
 * backward under activation checkpointing copies it once). */
static hs_wgrad_input input_of(hs_wgrad_kind k, bool *first) {
    static const hs_wgrad_input in[HS_WG_OPS] = {HS_WX_ATTY, HS_WX_LN1, HS_WX_LN1, HS_WX_LN1,
                                                 HS_WX_LN2,  HS_WX_LN2, HS_WX_H};
    *first = k == HS_WG_O || k == HS_WG_Q || k == HS_WG_GATE || k == HS_WG_DOWN;
    return in[k];
}

/* The split backward's input pass of a linear: dx now, and what its weight
 * gradient needs kept in the block's record for the weight pass. */
static void defer_weight_grad(hs_model *m, hs_wgrad_kind kind, float *dx, bool overwrite_dx,
                              hs_param *w, const float *dout, const void *x, int64_t N, int IC,
                              int OC) {
    hs_wgrad_block *rec = m->wg_cur;
    hs_wgrad_op *op = &rec->op[kind];
    hs_dtype ydt;
    /* The slot holds dy as the unsplit backward's GEMMs read it: rounded to
     * the compute dtype where the device multiplies 16-bit operands
     * natively, else in fp32 (no dout16 there: the mixed GEMM rounds it). */
    const void *dy = hs_linear_dout(m->dev, dout, op->dy, m->wg_dt, N * OC, &ydt);
    HS_ASSERT(ydt == m->wg_dt);
    if (dy != op->dy) hs_dev_copy(m->dev, op->dy, dy, (size_t)(N * OC) * hs_dtype_size(ydt));
    hs_linear_backward_dy(m->dev, dx, overwrite_dx, NULL, false, w->grad_dtype, op->dy, ydt, NULL,
                          w->data, m->dt, N, IC, OC);
    bool first;
    hs_wgrad_input in = input_of(kind, &first);
    void *copy = rec->xcopy[in];
    if (copy && first) hs_dev_copy(m->dev, copy, x, (size_t)(N * IC) * hs_dtype_size(m->dt));
    *op = (hs_wgrad_op){.w = w,
                        .dy = op->dy,
                        .x = copy ? copy : x,
                        .rows = N,
                        .IC = IC,
                        .OC = OC,
                        .nseq = m->canon_nseq};
}

/* The same from the fp32 dout, rounded into dout16 first where the GEMMs
 * multiply 16-bit operands; in the split backward's input pass, the weight
 * gradient kept for later. */
static void dense_backward(hs_model *m, hs_wgrad_kind kind, float *dx, bool overwrite_dx,
                           hs_param *w, const float *dout, const void *x, int64_t N, int IC,
                           int OC) {
    if (m->wg_cur && w->grad) {
        defer_weight_grad(m, kind, dx, overwrite_dx, w, dout, x, N, IC, OC);
        return;
    }
    hs_dtype ydt;
    const void *dy = hs_linear_dout(m->dev, dout, m->dout16, m->dt, N * OC, &ydt);
    hs_block_dense_backward_dy(m, dx, overwrite_dx, w, dy, ydt, x, N, IC, OC);
}

void hs_block_backward_weight(hs_model *m, hs_wgrad_block *wg) {
    for (int k = 0; k < HS_WG_OPS; k++) {
        hs_wgrad_op *op = &wg->op[k];
        hs_param *w = op->w;
        if (!w) continue;
        if (op->nseq) { /* each sequence's part alone, as the unsplit pass */
            int outer = m->canon_nseq;
            m->canon_nseq = op->nseq;
            hs_canon_linear_wgrad(m, w, op->dy, m->wg_dt, op->x, op->rows, op->IC, op->OC);
            m->canon_nseq = outer;
            op->w = NULL;
            continue;
        }
        bool store = w->grad_unset;
        hs_linear_backward_dy(m->dev, NULL, false, w->grad, store, w->grad_dtype, op->dy, m->wg_dt,
                              op->x, NULL, m->dt, op->rows, op->IC, op->OC);
        w->grad_unset = false;
        op->w = NULL;
    }
}

/* dres = d(x_out) in (local rows); returns d(ln2) of the local rows. The
 * region's rows are those its forward ran on. */
static const float *mlp_backward(hs_model *m, const hs_block_params *bp, hs_block_acts *a, int B,
                                 int T, const hs_model_hooks *hooks, const float *aux_g) {
    const int64_t N = (int64_t)B * T;
    const hs_model_par *par = m->par;
    hs_dtype dt = m->dt;
    int C = m->C, F = m->F;
    int64_t rows = a->mlp_rows;
    if (hs_block_moe(bp)) { /* token-wise: d(ln2) of the rows this rank routed */
        zero_f32(m, m->dln, rows * C);
        hs_hook_pre_backward(hooks, bp->expert_unit);
        hs_moe_weights w = moe_weights(bp);
        hs_moe_grads g = moe_grads(bp);
        /* layout mode: the weight gradients one sequence at a time */
        hs_moe_wgrad wg = {m, m->canon_nseq, m->canon_moe, hs_canon_rows_wgrad};
        if (m->canon_nseq) g.wgrad = &wg;
        hs_moe_seq q;
        hs_moe_backward(m->dln, m->dres, &g, &a->moe, a->ln2, &w, aux_g, block_seq(m, bp, B, T, &q),
                        m->moe_scratch);
        hs_unit_boundary *eb = &m->bnd[bp->expert_unit];
        eb->backward_casts += eb->output_stored != eb->output_computed;
        hs_hook_post_backward(hooks, bp->expert_unit);
        return m->dln;
    }
    const float *dout = par->exit_grad(par->ctx, m->dres, bp->wd, N);
    dense_backward(m, HS_WG_DOWN, m->dh, true, bp->wd, dout, a->h, rows, F, C);
    if (m->dout16 && !m->wg_cur) {
        /* 16-bit GEMMs: the gate and up gradients straight into dt, in the
         * fp32 buffers' memory (the bits of swiglu_bwd and a convert) */
        m->k->swiglu_bwd16(m->s, m->dg, m->du, m->dh, a->gate, a->up, dt, rows * F);
        hs_block_dense_backward_dy(m, m->dln, true, bp->wg, m->dg, dt, a->ln2, rows, C, F);
        hs_block_dense_backward_dy(m, m->dln, false, bp->wu, m->du, dt, a->ln2, rows, C, F);
    } else {
        m->k->swiglu_bwd(m->s, m->dg, m->du, true, m->dh, a->gate, a->up, dt, rows * F);
        dense_backward(m, HS_WG_GATE, m->dln, true, bp->wg, m->dg, a->ln2, rows, C, F);
        dense_backward(m, HS_WG_UP, m->dln, false, bp->wu, m->du, a->ln2, rows, C, F);
    }
    return par->enter_grad(par->ctx, m->dln, bp->wg, N);
}

/* Llama's (and qwen3's) q, k and v projections back from attention's
 * gradients, into m->dln. */
static void qkv_backward(hs_model *m, const hs_block_params *bp, hs_block_acts *a, int B, int T) {
    int64_t N = (int64_t)B * T;
    int C = m->C, qd = m->NH * m->HD, kvd = m->KVH * m->HD;
    m->k->rope_bwd(m->s, m->dq, m->rope_cos, m->rope_sin, B, T, m->NH, m->HD);
    m->k->rope_bwd(m->s, m->dk, m->rope_cos, m->rope_sin, B, T, m->KVH, m->HD);
    /* qwen3: each norm's input gradient lands in datt, which its linear's
     * backward has consumed before the next norm writes it */
    const float *dq = m->dq, *dk = m->dk;
    if (m->qk_norm) dq = head_norm_backward(m, m->dq, a->q_in, bp->q_norm, a->rstd_q, N * m->NH);
    dense_backward(m, HS_WG_Q, m->dln, true, bp->wq, dq, a->ln1, N, C, qd);
    if (m->qk_norm) dk = head_norm_backward(m, m->dk, a->k_in, bp->k_norm, a->rstd_k, N * m->KVH);
    dense_backward(m, HS_WG_K, m->dln, false, bp->wk, dk, a->ln1, N, C, kvd);
    dense_backward(m, HS_WG_V, m->dln, false, bp->wv, m->dv, a->ln1, N, C, kvd);
}

/* dres = d(x_mid) in; d(x) out, x the block input as read (in xdt). */
static void attention_backward(hs_model *m, const hs_block_params *bp, hs_block_acts *a,
                               const void *x, hs_dtype xdt, int B, int T) {
    const hs_model_par *par = m->par;
    int64_t N = (int64_t)B * T;
    int C = m->C, qd = m->NH * m->HD, kvd = m->KVH * m->HD;
    const float *dout = par->exit_grad(par->ctx, m->dres, bp->wo, N);
    if (m->mla.on) {
        const void *o_in = m->mla.Vd == m->HD ? a->atty : a->mla.attc;
        dense_backward(m, HS_WG_O, hs_mla_datt_room(m), true, bp->wo, dout, o_in, N, o_width(m), C);
        hs_mla_datt_expand(m, N);
    } else {
        dense_backward(m, HS_WG_O, m->datt, true, bp->wo, dout, a->atty, N, qd, C);
    }
    zero_f32(m, m->dq, N * qd);
    zero_f32(m, m->dk, N * kvd);
    zero_f32(m, m->dv, N * kvd);
    hs_attn_io io = attn_io(m, a, B, T);
    par->attention_bwd(par->ctx, &io);
    if (m->mla.on) hs_mla_backward(m, bp, a, B, T);
    else qkv_backward(m, bp, a, B, T);
    const float *dln = par->enter_grad(par->ctx, m->dln, attn_first(bp), N);
    hs_block_norm_backward(m, m->dres, bp->ln1, dln, x, xdt, a->rstd1, hs_model_local_rows(m, N),
                           C);
}

void hs_block_backward(hs_model *m, int layer, hs_block_acts *a, const void *x_in, int B, int T,
                       const hs_model_hooks *hooks, const float *aux_g) {
    const hs_block_params *bp = &m->blocks[layer];
    hs_unit_boundary *b = &m->bnd[bp->unit];
    int64_t N = (int64_t)B * T, Nl = hs_model_local_rows(m, N);
    /* The backward of a cast casts the gradient back to the cast's input
     * dtype; activation gradients are held in fp32 (layers.h), so that is
     * a rounding to it. */
    if (b->output_stored != b->output_computed) {
        hs_dev_round(m->dev, m->dres, b->output_computed, Nl * m->C);
        b->backward_casts++;
    }
    const float *dln = mlp_backward(m, bp, a, B, T, hooks, aux_g);
    /* The residual gradient passes through unchanged, so the norm's input
     * gradient accumulates straight into it. */
    hs_block_norm_backward(m, m->dres, bp->ln2, dln, a->x_mid, b->output_computed, a->rstd2, Nl,
                           m->C);
    bool cast_in = b->input_read != b->input_stored;
    attention_backward(m, bp, a, cast_in ? a->x_cast : x_in, b->input_read, B, T);
    if (!cast_in) return;
    hs_dev_round(m->dev, m->dres, b->input_stored, Nl * m->C);
    b->backward_casts++;
}
