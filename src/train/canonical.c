/* train.reproducibility: layout across micro-batches (docs/numerics.md
 * "Layout-invariant training"). Micro-batch m of the global batch holds an
 * aligned block of its sequences (docs/data.md "What each rank reads"), so
 * the step's gradient and loss are the pairwise tree of the micro-batches'
 * own: each micro-batch's gradient is taken out of the optimizer's
 * gradient buffers after its reductions and merged with the equal-sized
 * subtree before it, and the last one's merges happen in those buffers
 * (addition commutes, so left + right and right + left are the same
 * bits). The loss likewise: each micro-batch's sum goes over the ranks
 * first, then the micro-batches' sums form the tree. */
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

/* Floats of every trained parameter's gradient on this rank. */
static int64_t grad_floats(const hs_trainer *t) {
    int64_t n = 0;
    for (int i = 0; i < t->n_oparams; i++)
        if (!t->oparams[i].frozen) n += t->oparams[i].numel;
    return n;
}

/* The gradient buffers copied into a flat slot, or the slot added to them. */
typedef enum { SLOT_STORE, SLOT_ADD_TO_GRADS } slot_op;

static void slot_apply(hs_trainer *t, float *slot, slot_op op) {
    int64_t off = 0;
    for (int i = 0; i < t->n_oparams; i++) {
        const hs_optim_param *p = &t->oparams[i];
        if (p->frozen || p->numel == 0) continue;
        float *g = (float *)p->grad;
        if (op == SLOT_STORE) hs_dev_copy(t->dev, slot + off, g, (size_t)p->numel * sizeof(float));
        else hs_dev_add(t->dev, g, slot + off, p->numel);
        off += p->numel;
    }
}

bool hs_canon_micro_batches(const hs_trainer *t) {
    return hs_train_layout_invariant(&t->cfg->train) && t->M > 1;
}

hs_status hs_canon_step_begin(hs_trainer *t, hs_error *e) {
    t->canon_top = 0;
    if (!hs_canon_micro_batches(t) || t->canon_slots) return HS_OK;
    int levels = 0;
    while ((1 << levels) < t->M) levels++;
    t->canon_floats = grad_floats(t);
    size_t bytes = (size_t)levels * (size_t)t->canon_floats * sizeof(float);
    t->canon_slots = hs_device_alloc(t->dev, bytes + 1);
    t->canon_mb_loss = calloc((size_t)t->M, sizeof(double));
    if (!t->canon_slots || !t->canon_mb_loss)
        return hs_error_oom(e,
                            "train.reproducibility: layout: %zu bytes for the tree of %d "
                            "micro-batches' gradients",
                            bytes, t->M);
    return HS_OK;
}

void hs_canon_micro_batch_done(hs_trainer *t, int m, double loss_sum) {
    if (!hs_canon_micro_batches(t)) return;
    t->canon_mb_loss[m] = loss_sum;
    /* the micro-batch's reductions complete; unwritten gradients read 0 */
    if (t->engine->drain) t->engine->drain(t->engine);
    bool last = m == t->M - 1;
    int level = 0;
    if (!last) {
        float *slot = t->canon_slots + (int64_t)t->canon_top * t->canon_floats;
        slot_apply(t, slot, SLOT_STORE);
        while (t->canon_top > 0 && t->canon_level[t->canon_top - 1] == level) {
            float *left = t->canon_slots + (int64_t)(t->canon_top - 1) * t->canon_floats;
            hs_dev_add(t->dev, left, slot, t->canon_floats);
            slot = left;
            t->canon_top--;
            level++;
        }
        t->canon_level[t->canon_top++] = level;
        t->engine->zero_grads(t->engine);
        return;
    }
    /* the last micro-batch's gradient stays in place and takes the merges */
    while (t->canon_top > 0) {
        t->canon_top--;
        slot_apply(t, t->canon_slots + (int64_t)t->canon_top * t->canon_floats, SLOT_ADD_TO_GRADS);
    }
}

hs_status hs_canon_loss(hs_trainer *t, double *loss_sum, hs_error *e) {
    hs_status s = hs_reduce_sum_f64(t->batch_group, t->canon_mb_loss, t->M, e);
    if (s == HS_OK) *loss_sum = hs_tree_f64(t->canon_mb_loss, t->M);
    return s;
}

void hs_canon_free(hs_trainer *t) {
    if (t->canon_slots) hs_device_free_mem(t->dev, t->canon_slots);
    free(t->canon_mb_loss);
}
