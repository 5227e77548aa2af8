/* fsdp/layout.h — the chunk arithmetic every FSDP shape and offset comes
 * from (RFC 000 §7.1): torch.chunk on dim 0, C = ceil(D0/W),
 * actual(r) = max(min(D0 - r*C, C), 0). Balanced splits ("the first
 * remainder ranks get one more") are never used: 10 rows over 4 ranks are
 * 3/3/3/1, not 3/3/2/2. */
#ifndef HS_FSDP_LAYOUT_H
#define HS_FSDP_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

/* One rank's dim-0 view of a tensor sharded over `world` ranks. */
typedef struct hs_fsdp_layout {
    int world, rank;
    int64_t d0;          /* dim-0 length of the (TP-local) full tensor */
    int64_t chunk_rows;  /* C: rows of every padded shard              */
    int64_t actual_rows; /* rows this rank really owns (may be 0)      */
    int64_t row_offset;  /* dim-0 offset of those rows in the full one */
    int64_t padded_rows; /* C * W: rows of the padded unsharded buffer */
    bool even;           /* every rank owns exactly C rows: no padding */
} hs_fsdp_layout;

hs_fsdp_layout hs_fsdp_layout_make(int64_t d0, int world, int rank);

/* Global dim-0 offset of a shard when TP shards dim 0 first (torch.chunk over
 * tp ranks) and FSDP then shards the TP-local tensor on dim 0 again: the
 * strided-shard combination of RFC §7.7 example C. *rows gets the actual
 * rows of the (tp_rank, fsdp_rank) shard. */
int64_t hs_fsdp_strided_row_offset(int64_t global_d0, int tp, int tp_rank, int fsdp_world,
                                   int fsdp_rank, int64_t *rows);

#endif
