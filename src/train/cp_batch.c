/* This rank's rows of a batch: whole sequences, or under context
 * parallelism its CP rows of each (chunks r and 2*cp-1-r;
 * parallel.h hs_cp_take_local_ids), in buffers the trainer keeps. */
#include <stdlib.h>

#include "train/run.h"

hs_status hs_cp_batch_init(hs_trainer *t, hs_error *e) {
    t->cp = t->topo->cp;
    t->cp_rank = hs_mesh_coords(t->mesh).cp;
    t->cp_group = hs_mesh_group(t->mesh, HS_DIM_CP);
    if (t->cfg->data.document_masking) {
        t->doc_starts = malloc((size_t)t->mbs * (size_t)t->T * sizeof(int32_t));
        if (!t->doc_starts) return hs_error_oom(e, "trainer: the batch's document starts");
    }
    if (t->cp < 2) return HS_OK;
    size_t n = (size_t)t->mbs * (size_t)t->T, v = (size_t)t->T * (size_t)t->cfg->model.vocab_size;
    t->ltokens = malloc(n * sizeof(int32_t));
    t->ltargets = malloc(n * sizeof(int32_t));
    t->llogits = malloc(v / (size_t)t->cp * sizeof(float));
    t->cp_blocks = malloc(v * sizeof(float));
    if (!t->ltokens || !t->ltargets || !t->llogits || !t->cp_blocks)
        return hs_error_oom(e, "trainer: cannot allocate the context-parallel batch");
    return HS_OK;
}

void hs_cp_batch_free(hs_trainer *t) {
    free(t->doc_starts);
    free(t->ltokens);
    free(t->ltargets);
    free(t->llogits);
    free(t->cp_blocks);
}

/* Document masking: the starts of the whole sequences (before CP takes
 * its rows), which attention reads by global position. */
hs_batch hs_train_local_batch(hs_trainer *t, const int32_t *tokens, const int32_t *targets, int B) {
    const int32_t *docs = NULL;
    if (t->doc_starts) {
        HS_ASSERT(B <= t->mbs);
        hs_doc_starts(t->doc_starts, tokens, B, t->T, t->cfg->data.eos_id);
        docs = t->doc_starts;
    }
    if (t->cp < 2)
        return (hs_batch){.tokens = tokens,
                          .targets = targets,
                          .B = B,
                          .T = t->T,
                          .doc_start = docs,
                          .global_sequences = t->G};
    int Tl = t->T / t->cp;
    hs_cp_take_local_ids(t->ltokens, tokens, t->cp, t->cp_rank, B, Tl);
    hs_cp_take_local_ids(t->ltargets, targets, t->cp, t->cp_rank, B, Tl);
    return (hs_batch){.tokens = t->ltokens,
                      .targets = t->ltargets,
                      .B = B,
                      .T = Tl,
                      .doc_start = docs,
                      .global_sequences = t->G};
}
