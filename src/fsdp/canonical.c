/* train.reproducibility: layout across micro-batches (docs/numerics.md
 * "Layout-invariant training"). Micro-batch m of the global batch holds an
 * aligned block of its sequences (docs/data.md), so a parameter's step
 * gradient is the pairwise tree of its micro-batches' reduced gradients,
 * not their running sum. Each reduced gradient goes onto a stack of
 * subtrees and merges with the equal-sized one before it (left + right);
 * the bottom of the stack is sharded_grad itself, where the whole tree
 * ends after the step's last micro-batch (a power of two of them). Every
 * schedule hands a parameter its micro-batches in ascending order, one
 * reduction each. */
#include "fsdp/manager.h"
#include "fsdp/param.h"
#include "fsdp/policy.h"

/* Stack slot i: sharded_grad, then the extra subtrees. */
static float *slot(hs_fsdp_param *fp, int i) {
    return i == 0 ? fp->sharded_grad
                  : fp->canon_slots + (int64_t)(i - 1) * fp->plan.actual_sharded_numel;
}

hs_status hs_fsdp_canon_micro_batches(hs_fsdp *f, int micro_batches, hs_error *e) {
    int levels = 0;
    while ((1 << levels) < micro_batches) levels++;
    if (levels == 0) return HS_OK; /* one micro-batch: its gradient is the tree */
    for (int i = 0; i < f->ctx.n_params; i++) {
        hs_fsdp_param *fp = &f->ctx.params[i];
        if (fp->p->frozen || fp->plan.actual_sharded_numel == 0) continue;
        size_t bytes = (size_t)levels * (size_t)fp->plan.actual_sharded_numel * sizeof(float);
        fp->canon_slots = hs_fsdp_mem_master_alloc(
            fp->mem, HS_FSDP_MEM_GRAD, bytes, "the micro-batches' gradient tree", fp->p->fqn, e);
        if (!fp->canon_slots) return HS_ERR_OOM;
        fp->canon_bytes = bytes;
    }
    return HS_OK;
}

void hs_fsdp_canon_push(hs_fsdp_param *fp, const void *src, hs_dtype dt) {
    int64_t n = fp->plan.actual_sharded_numel;
    hs_device *d = fp->mem->dev;
    int s = fp->canon_tree.top;
    hs_fsdp_mp_add_to_f32(d, slot(fp, s), src, dt, n, true);
    int merges = hs_tree_stack_push(&fp->canon_tree);
    for (int k = 0; k < merges; k++) hs_dev_add(d, slot(fp, s - k - 1), slot(fp, s - k), n);
}

void hs_fsdp_canon_free(hs_fsdp_param *fp) {
    if (fp->canon_slots)
        hs_fsdp_mem_master_free(fp->mem, HS_FSDP_MEM_GRAD, fp->canon_slots, fp->canon_bytes);
    fp->canon_slots = NULL;
}
