/* The model as the trainer calls it, on this rank's rows of a batch
 * (cp_batch.c): the model itself, or the pipeline's stages (pp_step.c).
 * The loss sums of the CP ranks add up to the sequences' (the trainer sums
 * over dp x cp); logits come back whole. */
#include <string.h>

#include "train/run.h"

hs_status hs_train_forward_backward(hs_trainer *t, const int32_t *tokens, const int32_t *targets,
                                    int B, float grad_scale, double *loss_sum, double *aux,
                                    hs_error *e) {
    hs_batch b = hs_train_local_batch(t, tokens, targets, B);
    hs_status s =
        hs_model_forward_backward(t->engine->model, &b, grad_scale, t->hooks, loss_sum, aux, e);
    return s == HS_OK ? hs_device_status(t->dev, e) : s;
}

/* One forward of the local rows: the model, or the pipeline's stages; a
 * kernel that could not run fails it here, before its results are used. */
static hs_status forward(hs_trainer *t, const hs_batch *b, double *loss_sum, float *logits,
                         hs_error *e) {
    hs_status s = t->pp ? hs_pp_forward(t, b, loss_sum, logits, e)
                        : hs_model_forward(t->engine->model, b, t->hooks, loss_sum, logits, e);
    return s == HS_OK ? hs_device_status(t->dev, e) : s;
}

hs_status hs_train_forward(hs_trainer *t, const int32_t *tokens, const int32_t *targets, int B,
                           double *loss_sum, float *logits, hs_error *e) {
    hs_batch b = hs_train_local_batch(t, tokens, targets, B);
    if (t->cp < 2) return forward(t, &b, loss_sum, logits, e);
    HS_ASSERT(!logits || B == 1);
    hs_status s = forward(t, &b, loss_sum, logits ? t->llogits : NULL, e);
    if (s != HS_OK || !logits) return s;
    int64_t V = t->cfg->model.vocab_size, n = (int64_t)b.T * V;
    /* host arrays: the model copied its logits across */
    s = hs_pg_all_gather(t->cp_group, NULL, t->cp_blocks, t->llogits, n, HS_DTYPE_F32, e);
    for (int r = 0; s == HS_OK && r < t->cp; r++)
        for (int i = 0; i < b.T; i++)
            memcpy(logits + hs_cp_global_position(t->cp, r, b.T, i) * V,
                   t->cp_blocks + ((int64_t)r * b.T + i) * V, (size_t)V * sizeof(float));
    return s;
}
