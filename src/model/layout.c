/* The placements the model-parallel seam gives the parameters, read back:
 * the model asks the seam to place every parameter it registered (with its
 * global shape), then computes with what it finds — its local heads, ffn
 * columns, vocabulary rows and experts — after checking that each region's
 * linears are split in a way it can run:
 *
 *   a region (attention: q/k/v then o; MLP: gate/up then down) is either
 *   split, its first linears over their output features (Shard(0)) and its
 *   last over its input features (Shard(1)), or whole (no Shard);
 *   attention and the head need every row of a sequence, so they are split
 *   (or every rank holds every row) — a whole MLP, embedding or MoE layer is
 *   token-wise and runs on the rows the rank holds;
 *   every block splits alike (the buffers are sized once). */
#include <stdio.h>
#include <string.h>

#include "model/internal.h"

static bool is_shard(const hs_param *p, int dim) {
    return p->tp.kind == HS_PLACEMENT_SHARD && p->tp.dim == dim;
}

static bool is_whole(const hs_param *p) {
    for (int d = 0; d < p->ndim; d++)
        if (p->local_shape[d] != p->shape[d]) return false;
    return true;
}

/* cols: the region's first linears, last: its row-parallel end. */
static bool region_ok(hs_param *const *cols, int n, const hs_param *last, bool *split) {
    bool all_split = is_shard(last, 1), all_whole = is_whole(last);
    for (int k = 0; k < n; k++) {
        all_split &= is_shard(cols[k], 0);
        all_whole &= is_whole(cols[k]);
    }
    *split = all_split;
    return all_split || all_whole;
}

static void region_error(hs_error *e, const hs_param *first, const hs_param *last) {
    char a[32], b[32];
    hs_error_append(e, HS_ERR_CONFIG,
                    "%s (%s) and %s (%s): a region is split together — its first linears "
                    "column-parallel (Shard(0)) and its last row-parallel (Shard(1)) — or kept "
                    "whole (Replicate()); give the plan's rules for the region one of the two",
                    first->fqn, hs_placement_str(first->tp, a, sizeof a), last->fqn,
                    hs_placement_str(last->tp, b, sizeof b));
}

/* Local counts of one block, checked against the first block's (the MLP
 * width against the first dense block's). */
static void block_layout(hs_model *m, hs_block_params *bp, bool first, bool *first_dense,
                         hs_error *e) {
    bool split;
    int rows_split = m->par->row_split;
    /* latent attention: the heads' up-projections (its down-projections
     * and latent norms are whole, config rules keep tp_size 1) */
    hs_param *k_rows = bp->kv_b ? bp->wq : bp->wk, *v_rows = bp->kv_b ? bp->wq : bp->wv;
    if (!region_ok((hs_param *[]){bp->wq, bp->kv_b ? bp->kv_b : bp->wk, v_rows}, 3, bp->wo, &split))
        region_error(e, bp->wq, bp->wo);
    else if (!split && rows_split > 1)
        hs_error_append(e, HS_ERR_CONFIG,
                        "%s: attention kept whole under sequence parallelism would see only "
                        "this rank's rows of each sequence; split q/k/v (Shard(0)) and o_proj "
                        "(Shard(1)) or set accelerator.sequence_parallel: false",
                        bp->wq->fqn);
    int NH = (int)(bp->wq->local_shape[0] / m->HD), KVH = (int)(k_rows->local_shape[0] / m->HD);
    bool heads_ok = bp->wq->local_shape[0] % m->HD == 0 && k_rows->local_shape[0] % m->HD == 0 &&
                    v_rows->local_shape[0] == k_rows->local_shape[0] && KVH > 0 && NH % KVH == 0;
    if (!heads_ok)
        hs_error_append(e, HS_ERR_CONFIG,
                        "%s: a local slice of %lld rows is not whole heads of %d (k/v %lld "
                        "rows); split the projections by heads",
                        bp->wq->fqn, (long long)bp->wq->local_shape[0], m->HD,
                        (long long)k_rows->local_shape[0]);
    const hs_param *latent[] = {bp->q_a, bp->q_a_norm, bp->kv_a, bp->kv_a_norm};
    for (int k = 0; k < 4; k++)
        if (latent[k] && !is_whole(latent[k]))
            hs_error_append(e, HS_ERR_CONFIG,
                            "%s: latent attention's down-projections and latent norms feed "
                            "every head, so each rank needs them whole; give them the replicate "
                            "style",
                            latent[k]->fqn);
    for (int k = 0; k < 2 && bp->q_norm; k++) {
        const hs_param *hn = k ? bp->k_norm : bp->q_norm;
        if (!is_whole(hn))
            hs_error_append(e, HS_ERR_CONFIG,
                            "%s: the per-head norm acts on every head with one [%d] weight, so "
                            "each rank needs it whole; give it the replicate style",
                            hn->fqn, m->HD);
    }
    /* The dense MLPs' width: the first dense block's (MoE blocks have none). */
    int F = bp->wg ? (int)bp->wg->local_shape[0] : m->F;
    if (bp->wg && !region_ok((hs_param *[]){bp->wg, bp->wu}, 2, bp->wd, &split))
        region_error(e, bp->wg, bp->wd);
    if (bp->wg && *first_dense) m->F = F;
    if (first) {
        m->NH = NH, m->KVH = KVH;
    } else if (NH != m->NH || KVH != m->KVH || F != m->F) {
        hs_error_append(e, HS_ERR_CONFIG,
                        "%s: %d heads, %d kv heads and %d ffn columns on this rank, but the "
                        "first block has %d, %d and %d; every block must be split alike",
                        bp->wq->fqn, NH, KVH, F, m->NH, m->KVH, m->F);
    }
    if (bp->wg) *first_dense = false;
}

static void ends_layout(hs_model *m, hs_error *e) {
    if (m->embed && !is_shard(m->embed, 0) && !is_whole(m->embed))
        hs_error_append(e, HS_ERR_CONFIG,
                        "%s: the embedding is split over the vocabulary (Shard(0)) or whole",
                        m->embed->fqn);
    if (!m->head) return;
    if (!is_shard(m->head, 0) && !is_whole(m->head))
        hs_error_append(e, HS_ERR_CONFIG,
                        "%s: the head is split over the vocabulary (Shard(0)) or whole",
                        m->head->fqn);
    else if (is_whole(m->head) && m->par->row_split > 1)
        hs_error_append(e, HS_ERR_CONFIG,
                        "%s: a whole head under sequence parallelism would compute the loss of "
                        "this rank's rows only; split it over the vocabulary (Shard(0))",
                        m->head->fqn);
    m->V = (int)m->head->local_shape[0];
}

hs_status hs_model_layout_apply(hs_model *m, hs_error *e) {
    hs_error_clear(e);
    for (int i = 0; i < m->n_params; i++) {
        hs_error one;
        hs_error_clear(&one);
        if (!m->par->place(m->par->ctx, &m->params[i], &one))
            hs_error_append(e, one.code, "%s", one.msg);
    }
    if (e->code != HS_OK) return e->code;
    bool first_dense = true;
    for (int i = 0; i < m->L; i++) block_layout(m, &m->blocks[i], i == 0, &first_dense, e);
    ends_layout(m, e);
    if (m->moe_head >= 0) {
        const hs_param *w1 = m->blocks[m->moe_head].w1;
        /* experts split over ranks run at the seam, which exchanges their rows */
        m->moe_shapes.EL = (int)w1->local_shape[0];
        m->moe_shapes.seam_experts = m->moe_shapes.EL < m->moe_shapes.E;
    }
    return e->code;
}
