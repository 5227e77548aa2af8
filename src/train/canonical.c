/* train.reproducibility: layout across micro-batches (docs/numerics.md
 * "Layout-invariant training"). Micro-batch m of the global batch holds an
 * aligned block of its sequences (docs/data.md "What each rank reads"), so
 * the step's loss is the pairwise tree of the micro-batches' losses, each
 * summed over the ranks first; their gradients are merged the same way in
 * FSDP's sharded gradients (fsdp/canonical.c). */
#include <stdlib.h>

#include "train/run.h"

bool hs_canon_micro_batches(const hs_trainer *t) {
    return hs_train_layout_invariant(&t->cfg->train) && t->M > 1;
}

hs_status hs_canon_step_begin(hs_trainer *t, hs_error *e) {
    if (!hs_canon_micro_batches(t) || t->canon_mb_loss) return HS_OK;
    t->canon_mb_loss = calloc((size_t)t->M, sizeof(double));
    if (!t->canon_mb_loss)
        return hs_error_oom(e, "train.reproducibility: layout: the losses of %d micro-batches",
                            t->M);
    return HS_OK;
}

void hs_canon_micro_batch_done(hs_trainer *t, int m, double loss_sum) {
    if (hs_canon_micro_batches(t)) t->canon_mb_loss[m] = loss_sum;
}

hs_status hs_canon_loss(hs_trainer *t, double *loss_sum, hs_error *e) {
    hs_status s = hs_reduce_sum_f64(t->batch_group, t->canon_mb_loss, t->M, e);
    if (s == HS_OK && t->pp) s = hs_reduce_sum_f64(t->pp_group, t->canon_mb_loss, t->M, e);
    if (s == HS_OK) *loss_sum = hs_tree_f64(t->canon_mb_loss, t->M, 1);
    return s;
}

void hs_canon_free(hs_trainer *t) { free(t->canon_mb_loss); }
