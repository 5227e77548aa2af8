/* The reference backend: host RAM memory (ram.c) and plain one-thread
 * kernels (reference_*.c), the oracle the conformance suite holds every
 * other backend to. */
#include "device/device_backend.h"
#include "device/reference.h"

static const hs_device_kernels reference_kernels = {
    .gemm = hs_ref_gemm,
    .convert = hs_ref_convert,
    .convert_scaled = hs_ref_convert_scaled,
    .fill = hs_ref_fill,
    .rng_normal = hs_ref_rng_normal,
    .axpy = hs_ref_axpy,
    .scale = hs_ref_scale,
    .add = hs_ref_add,
    .add_to_zero = hs_ref_add_to_zero,
    .sumsq = hs_ref_sumsq,
    .sumsq_many = hs_ref_sumsq_many,
    .round = hs_ref_round,
    .add_cast = hs_ref_add_cast,
    .scale_cast = hs_ref_scale_cast,
    .rmsnorm_fwd = hs_ref_rmsnorm_fwd,
    .rmsnorm_bwd = hs_ref_rmsnorm_bwd,
    .rope_tables = hs_ref_rope_tables,
    .rope_fwd = hs_ref_rope_fwd,
    .rope_bwd = hs_ref_rope_bwd,
    .swiglu_fwd = hs_ref_swiglu_fwd,
    .swiglu_bwd = hs_ref_swiglu_bwd,
    .attention_fwd = hs_ref_attention_fwd,
    .attention_bwd = hs_ref_attention_bwd,
    .attention_merge = hs_ref_attention_merge,
    .xent = hs_ref_xent,
    .xent_shard_max = hs_ref_xent_shard_max,
    .xent_shard_sums = hs_ref_xent_shard_sums,
    .xent_shard_grad = hs_ref_xent_shard_grad,
    .xent_shard_loss = hs_ref_xent_shard_loss,
    .embedding_fwd = hs_ref_embedding_fwd,
    .embedding_bwd = hs_ref_embedding_bwd,
    .moe_route = hs_ref_moe_route,
    .moe_permute = hs_ref_moe_permute,
    .moe_permute_bwd = hs_ref_moe_permute_bwd,
    .moe_unpermute = hs_ref_moe_unpermute,
    .moe_combine_bwd = hs_ref_moe_combine_bwd,
    .moe_route_bwd = hs_ref_moe_route_bwd,
    .moe_stats = hs_ref_moe_stats,
    .moe_stats_add = hs_ref_moe_stats_add,
    .moe_dispatch = hs_ref_moe_dispatch,
    .adamw = hs_ref_adamw,
    .muon_momentum = hs_ref_muon_momentum,
    .muon_newton_schulz = hs_ref_muon_newton_schulz,
    .muon_update = hs_ref_muon_update,
    .copy_2d = hs_ref_copy_2d,
};

const hs_device_kernels *hs_device_reference_kernels(void) { return &reference_kernels; }

hs_status hs_device_reference_init(hs_device *d, hs_error *e) {
    d->kind = HS_DEVICE_REFERENCE;
    d->name = "reference";
    d->ops = &hs_ram_ops;
    d->k = &reference_kernels;
    d->ctx = NULL;
    return hs_ram_memory_init(d, e);
}
