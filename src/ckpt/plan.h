/* ckpt/plan.h — the save plan: every rank's tensor table is all-gathered,
 * and every rank derives from the same tables the same metadata (tensor
 * order, which rank writes each distinct chunk, byte offsets in each data
 * file). No rank decides alone, so all ranks agree without a second round. */
#ifndef HS_CKPT_PLAN_H
#define HS_CKPT_PLAN_H

#include "ckpt/ckpt_internal.h"

/* Rows are (rank, local tensor) pairs, rank-major: rank r's tensors are
 * rows rank_base[r] .. rank_base[r+1]. A row that writes names its chunk in
 * the metadata (entry, chunk); one that does not (an empty chunk, or a
 * replica a lower rank writes) has row_entry = -1. */
typedef struct hs_ckpt_plan {
    hs_ckpt_meta meta; /* crc32 fields are filled after the writes */
    int world, rank;
    int *rank_base; /* [world + 1] */
    int *row_entry, *row_chunk;
    int *rank_file;   /* [world]: index into meta.files, -1 when rank writes nothing */
    int *rank_chunks; /* [world]: chunks rank r writes */
    int64_t total_bytes;
} hs_ckpt_plan;

/* Checks this rank's tensors alone (names, dims, boxes, data pointers). */
hs_status hs_ckpt_check_local(const hs_ckpt_tensor *t, int n, hs_error *e);

/* Collective over `world`: exchange tables, build the plan. Every rank
 * returns the same status (the message names the rank and tensor). */
hs_status hs_ckpt_plan_build(hs_pg *world, const hs_ckpt_tensor *t, int n, hs_ckpt_plan *p,
                             hs_error *e);
void hs_ckpt_plan_free(hs_ckpt_plan *p);

/* Collective: all-gather a variable-length byte string from every rank.
 * *all holds world slots of *stride bytes; lens[r] is rank r's length. */
hs_status hs_ckpt_all_gather_bytes(hs_pg *world, const void *mine, int64_t len, char **all,
                                   int64_t *stride, int64_t *lens, hs_error *e);

#endif
