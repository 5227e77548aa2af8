/* Multi-head latent attention's projections around the model's attention
 * call (mla.h). Rows are this rank's N = B * T tokens; every step is a
 * linear, an RMSNorm, RoPE or a strided copy on the device. */
#include <math.h>
#include <string.h>

#include "model/internal.h"
#include "model/layers.h"

/* YaRN's mscale, 0.1 m ln(s) + 1 above s = 1 (transformers' yarn_get_mscale). */
static double yarn_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

hs_mla_shape hs_mla_shape_of(const hs_model_config *c) {
    hs_mla_shape s = {.on = hs_model_arch_mla(c), .q_scale = 1.0f};
    if (!s.on) return s;
    const hs_mla_config *a = &c->mla;
    s.QL = a->q_lora_rank, s.KL = a->kv_lora_rank;
    s.nope = a->qk_nope_head_dim, s.R = a->qk_rope_head_dim, s.Vd = a->v_head_dim;
    /* transformers' yarn_apply_mscale: the softmax scale times
     * mscale(factor, mscale_all_dim)^2 when mscale_all_dim is given */
    const hs_rope_scaling *r = &c->rope_scaling;
    if (!strcmp(r->type, "yarn") && r->mscale_all_dim > 0.0) {
        double ms = yarn_mscale(r->factor, r->mscale_all_dim);
        s.q_scale = (float)(ms * ms);
    }
    return s;
}

static int64_t kvb_width(const hs_model *m) { return (int64_t)m->NH * (m->mla.nope + m->mla.Vd); }

int64_t hs_mla_widest(const hs_model *m) {
    if (!m->mla.on) return 0;
    int64_t w = kvb_width(m), kva = m->mla.KL + m->mla.R;
    w = kva > w ? kva : w;
    return m->mla.QL > w ? m->mla.QL : w;
}

static bool padded(const hs_model *m) { return m->mla.Vd != m->HD; }

void hs_mla_acts_alloc(hs_model *m, hs_mla_acts *a, int64_t BT, hs_mla_alloc_fn alloc) {
    const hs_mla_shape *s = &m->mla;
    hs_dtype dt = m->dt;
    if (s->QL > 0) {
        a->qa = alloc(m, BT * s->QL, dt);
        a->qan = alloc(m, BT * s->QL, dt);
        a->rstd_qa = alloc(m, BT, HS_DTYPE_F32);
    }
    a->kvl = alloc(m, BT * s->KL, dt);
    a->kvn = alloc(m, BT * s->KL, dt);
    a->rstd_kv = alloc(m, BT, HS_DTYPE_F32);
    if (padded(m)) a->attc = alloc(m, BT * m->NH * s->Vd, dt);
}

void hs_mla_acts_free(hs_model *m, hs_mla_acts *a) {
    void *p[] = {a->qa, a->qan, a->rstd_qa, a->kvl, a->kvn, a->rstd_kv, a->attc};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) hs_device_free_mem(m->dev, p[i]);
    *a = (hs_mla_acts){0};
}

void hs_mla_bufs_alloc(hs_model *m, int64_t BT, hs_mla_alloc_fn alloc) {
    const hs_mla_shape *s = &m->mla;
    hs_mla_bufs *b = &m->mla_bufs;
    hs_dtype dt = m->dt, f = HS_DTYPE_F32;
    int64_t kva = s->KL + s->R, pe = (int64_t)m->NH * s->R;
    b->kva = alloc(m, BT * kva, dt);
    b->kvb = alloc(m, BT * kvb_width(m), dt);
    b->pe = alloc(m, BT * pe, dt);
    b->dpe = alloc(m, BT * pe, f);
    b->dkpe = alloc(m, BT * s->R, f);
    b->dkvb = alloc(m, BT * kvb_width(m), f);
    b->dkvn = alloc(m, BT * s->KL, f);
    b->dkvl = alloc(m, BT * s->KL, f);
    b->dkva = alloc(m, BT * kva, f);
    if (s->QL > 0) {
        b->dqan = alloc(m, BT * s->QL, f);
        b->dqa = alloc(m, BT * s->QL, f);
    }
    if (padded(m)) b->dattc = alloc(m, BT * m->NH * s->Vd, f);
}

void hs_mla_bufs_free(hs_model *m) {
    hs_mla_bufs *b = &m->mla_bufs;
    void *p[] = {b->kva,  b->kvb,  b->pe,   b->dpe,  b->dkpe, b->dkvb,
                 b->dkvn, b->dkvl, b->dkva, b->dqan, b->dqa,  b->dattc};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) hs_device_free_mem(m->dev, p[i]);
    *b = (hs_mla_bufs){0};
}

/* cols of each of `rows` rows from src (row stride ss) to dst (stride
 * ds), in elements of es bytes. */
static void copy_cols(hs_model *m, void *dst, int64_t ds, const void *src, int64_t ss, int64_t rows,
                      int64_t cols, size_t es) {
    hs_dev_copy_2d(m->dev, dst, (size_t)ds * es, src, (size_t)ss * es, (size_t)rows,
                   (size_t)cols * es);
}

static char *at(void *p, int64_t elems, size_t es) { return (char *)p + (size_t)elems * es; }

static void norm_forward(hs_model *m, void *out, float *rstd, const void *x, const hs_param *w,
                         int64_t N, int C) {
    m->k->rmsnorm_fwd(m->s, out, rstd, x, m->dt, w->data, m->dt, N, C, (float)m->cfg.norm_eps);
}

/* The query's projections into a->q (before RoPE). */
static void query_forward(hs_model *m, const hs_block_params *bp, hs_block_acts *a, int64_t N) {
    const hs_mla_shape *s = &m->mla;
    hs_mla_acts *x = &a->mla;
    hs_dtype dt = m->dt;
    int OC = m->NH * m->HD;
    if (s->QL > 0) {
        hs_linear_forward(m->dev, x->qa, a->ln1, bp->q_a->data, dt, N, m->C, s->QL, 0);
        norm_forward(m, x->qan, x->rstd_qa, x->qa, bp->q_a_norm, N, s->QL);
        hs_linear_forward(m->dev, a->q, x->qan, bp->wq->data, dt, N, s->QL, OC, 0);
    } else {
        hs_linear_forward(m->dev, a->q, a->ln1, bp->wq->data, dt, N, m->C, OC, 0);
    }
}

/* The normalised latent [N, KL] into kvn and the rotated rope key [N, R]
 * into pe, of B sequences of T rows. */
static void latent_forward(hs_model *m, const hs_block_params *bp, hs_block_acts *a, void *kvn,
                           void *pe, int B, int T) {
    const hs_mla_shape *s = &m->mla;
    hs_mla_bufs *b = &m->mla_bufs;
    hs_mla_acts *x = &a->mla;
    size_t es = hs_dtype_size(m->dt);
    int64_t N = (int64_t)B * T, kva = s->KL + s->R;
    hs_linear_forward(m->dev, b->kva, a->ln1, bp->kv_a->data, m->dt, N, m->C, (int)kva, 0);
    copy_cols(m, x->kvl, s->KL, b->kva, kva, N, s->KL, es);
    norm_forward(m, kvn, x->rstd_kv, x->kvl, bp->kv_a_norm, N, s->KL);
    copy_cols(m, pe, s->R, at(b->kva, s->KL, es), kva, N, s->R, es);
    m->k->rope_fwd(m->s, pe, m->dt, m->rope_cos, m->rope_sin, B, T, 1, s->R);
}

/* Every head's key and value of `rows` rows from their latents and rope
 * keys: [k_nope | pe] and [v | 0]. */
static void expand(hs_model *m, const hs_block_params *bp, void *k, void *v, const void *kvn,
                   const void *pe, int64_t rows) {
    const hs_mla_shape *s = &m->mla;
    hs_mla_bufs *b = &m->mla_bufs;
    size_t es = hs_dtype_size(m->dt);
    int64_t NH = m->NH, D = m->HD, kvw = s->nope + s->Vd;
    hs_linear_forward(m->dev, b->kvb, kvn, bp->kv_b->data, m->dt, rows, s->KL, (int)(NH * kvw), 0);
    copy_cols(m, k, D, b->kvb, kvw, rows * NH, s->nope, es);
    if (padded(m)) hs_dev_zero(m->dev, v, (size_t)(rows * NH * D) * es);
    copy_cols(m, v, D, at(b->kvb, s->nope, es), kvw, rows * NH, s->Vd, es);
    for (int64_t h = 0; h < NH; h++)
        copy_cols(m, at(k, h * D + s->nope, es), NH * D, pe, s->R, rows, s->R, es);
}

/* RoPE on the query's rope dims (through b->pe), then YaRN's factor. */
static void query_rope(hs_model *m, hs_block_acts *a, int B, int T) {
    const hs_mla_shape *s = &m->mla;
    hs_mla_bufs *b = &m->mla_bufs;
    size_t es = hs_dtype_size(m->dt);
    int64_t N = (int64_t)B * T, NH = m->NH, D = m->HD;
    copy_cols(m, b->pe, s->R, at(a->q, s->nope, es), D, N * NH, s->R, es);
    m->k->rope_fwd(m->s, b->pe, m->dt, m->rope_cos, m->rope_sin, B, T, (int)NH, s->R);
    copy_cols(m, at(a->q, s->nope, es), D, b->pe, s->R, N * NH, s->R, es);
    if (s->q_scale != 1.0f) m->k->scale_cast(m->s, a->q, m->dt, s->q_scale, N * NH * D);
}

void hs_mla_forward(hs_model *m, const hs_block_params *bp, hs_block_acts *a, void *k, void *v,
                    int B, int T) {
    int64_t N = (int64_t)B * T;
    query_forward(m, bp, a, N);
    latent_forward(m, bp, a, a->mla.kvn, m->mla_bufs.pe, B, T);
    expand(m, bp, k, v, a->mla.kvn, m->mla_bufs.pe, N);
    query_rope(m, a, B, T);
}

void hs_mla_forward_cached(hs_model *m, const hs_block_params *bp, hs_block_acts *a,
                           const hs_mla_cache *c, int pos, int T) {
    size_t es = hs_dtype_size(m->dt);
    query_forward(m, bp, a, T);
    latent_forward(m, bp, a, at(c->lat, (int64_t)pos * m->mla.KL, es),
                   at(c->pe, (int64_t)pos * m->mla.R, es), 1, T);
    expand(m, bp, c->k, c->v, c->lat, c->pe, (int64_t)pos + T);
    query_rope(m, a, 1, T);
}

int64_t hs_mla_cache_position_bytes(const hs_model *m) {
    return (int64_t)(m->mla.KL + m->mla.R) * (int64_t)hs_dtype_size(m->dt);
}

const void *hs_mla_o_input(hs_model *m, hs_block_acts *a, int64_t N) {
    if (!padded(m)) return a->atty;
    size_t es = hs_dtype_size(m->dt);
    copy_cols(m, a->mla.attc, m->mla.Vd, a->atty, m->HD, N * m->NH, m->mla.Vd, es);
    return a->mla.attc;
}

float *hs_mla_datt_room(hs_model *m) { return padded(m) ? m->mla_bufs.dattc : m->datt; }

void hs_mla_datt_expand(hs_model *m, int64_t N) {
    if (!padded(m)) return;
    int64_t rows = N * m->NH;
    hs_dev_zero(m->dev, m->datt, (size_t)(rows * m->HD) * sizeof(float));
    copy_cols(m, m->datt, m->HD, m->mla_bufs.dattc, m->mla.Vd, rows, m->mla.Vd, sizeof(float));
}

void hs_mla_backward(hs_model *m, const hs_block_params *bp, hs_block_acts *a, int B, int T) {
    const hs_mla_shape *s = &m->mla;
    hs_mla_bufs *b = &m->mla_bufs;
    hs_mla_acts *x = &a->mla;
    const size_t fs = sizeof(float);
    int64_t N = (int64_t)B * T, NH = m->NH, D = m->HD, kva = s->KL + s->R, kvw = s->nope + s->Vd;
    /* the query's rope dims back through RoPE (and the folded scale) */
    if (s->q_scale != 1.0f) hs_dev_scale(m->dev, m->dq, s->q_scale, N * NH * D);
    copy_cols(m, b->dpe, s->R, m->dq + s->nope, D, N * NH, s->R, fs);
    m->k->rope_bwd(m->s, b->dpe, m->rope_cos, m->rope_sin, B, T, (int)NH, s->R);
    copy_cols(m, m->dq + s->nope, D, b->dpe, s->R, N * NH, s->R, fs);
    /* the shared rope key: the sum of every head's, back through RoPE */
    hs_dev_zero(m->dev, b->dkpe, (size_t)(N * s->R) * fs);
    for (int64_t h = 0; h < NH; h++) {
        copy_cols(m, b->dpe, s->R, m->dk + h * D + s->nope, NH * D, N, s->R, fs);
        hs_dev_add(m->dev, b->dkpe, b->dpe, N * s->R);
    }
    m->k->rope_bwd(m->s, b->dkpe, m->rope_cos, m->rope_sin, B, T, 1, s->R);
    /* kv_b_proj's output gradient: each head's k_nope and value */
    copy_cols(m, b->dkvb, kvw, m->dk, D, N * NH, s->nope, fs);
    copy_cols(m, b->dkvb + s->nope, kvw, m->dv, D, N * NH, s->Vd, fs);
    hs_block_linear_backward(m, b->dkvn, true, bp->kv_b, b->dkvb, x->kvn, N, s->KL,
                             (int)(NH * kvw));
    hs_dev_zero(m->dev, b->dkvl, (size_t)(N * s->KL) * fs);
    hs_block_norm_backward(m, b->dkvl, bp->kv_a_norm, b->dkvn, x->kvl, m->dt, x->rstd_kv, N, s->KL);
    copy_cols(m, b->dkva, kva, b->dkvl, s->KL, N, s->KL, fs);
    copy_cols(m, b->dkva + s->KL, kva, b->dkpe, s->R, N, s->R, fs);
    /* the query's projections, then kv_a_proj_with_mqa, into d(ln1) */
    if (s->QL > 0) {
        hs_block_linear_backward(m, b->dqan, true, bp->wq, m->dq, x->qan, N, s->QL, (int)(NH * D));
        hs_dev_zero(m->dev, b->dqa, (size_t)(N * s->QL) * fs);
        hs_block_norm_backward(m, b->dqa, bp->q_a_norm, b->dqan, x->qa, m->dt, x->rstd_qa, N,
                               s->QL);
        hs_block_linear_backward(m, m->dln, true, bp->q_a, b->dqa, a->ln1, N, m->C, s->QL);
    } else {
        hs_block_linear_backward(m, m->dln, true, bp->wq, m->dq, a->ln1, N, m->C, (int)(NH * D));
    }
    hs_block_linear_backward(m, m->dln, false, bp->kv_a, b->dkva, a->ln1, N, m->C, (int)kva);
}
