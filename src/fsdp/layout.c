/* torch.chunk shard arithmetic (RFC 000 §7.1, §7.7). */
#include "fsdp/layout.h"

#include "hypershard/base.h"
#include "hypershard/fsdp.h"

int64_t hs_fsdp_chunk_rows(int64_t d0, int w) {
    HS_ASSERT(d0 >= 0 && w >= 1);
    return (d0 + w - 1) / w;
}

int64_t hs_fsdp_actual_rows(int64_t d0, int w, int r) {
    HS_ASSERT(r >= 0 && r < w);
    int64_t c = hs_fsdp_chunk_rows(d0, w);
    int64_t left = d0 - (int64_t)r * c;
    if (left < 0) return 0;
    return left < c ? left : c;
}

int64_t hs_fsdp_row_offset(int64_t d0, int w, int r) {
    HS_ASSERT(r >= 0 && r < w);
    int64_t off = (int64_t)r * hs_fsdp_chunk_rows(d0, w);
    /* Empty shards sit at the end of the tensor, as torch's
     * _local_shard_size_and_offset puts them. */
    return off < d0 ? off : d0;
}

hs_fsdp_layout hs_fsdp_layout_make(int64_t d0, int world, int rank) {
    hs_fsdp_layout l;
    l.world = world;
    l.rank = rank;
    l.d0 = d0;
    l.chunk_rows = hs_fsdp_chunk_rows(d0, world);
    l.actual_rows = hs_fsdp_actual_rows(d0, world, rank);
    l.row_offset = hs_fsdp_row_offset(d0, world, rank);
    l.padded_rows = l.chunk_rows * world;
    l.even = l.padded_rows == d0;
    return l;
}

int64_t hs_fsdp_strided_row_offset(int64_t global_d0, int tp, int tp_rank, int fsdp_world,
                                   int fsdp_rank, int64_t *rows) {
    int64_t tp_rows = hs_fsdp_actual_rows(global_d0, tp, tp_rank);
    int64_t tp_off = hs_fsdp_row_offset(global_d0, tp, tp_rank);
    hs_fsdp_layout l = hs_fsdp_layout_make(tp_rows, fsdp_world, fsdp_rank);
    if (rows) *rows = l.actual_rows;
    return tp_off + l.row_offset;
}
