/* device/scratch_bound.c — the cuda backend's kernel scratch at its most
 * in a step's backward, for `hypershard plan` (device.h). Plain C: the
 * executables compute it without loading the cuda module. */
#include "device/cudnn_sdpa.h"
#include "hypershard/device.h"

int64_t hs_cuda_backward_scratch_bound(int B, int T, int NH, int KVH, int HD, hs_dtype dt) {
    int64_t rows = (int64_t)B * T, e = (int64_t)hs_dtype_size(dt);
    int64_t q = rows * NH * HD * e, k = rows * KVH * HD * e;
    /* cuda_attention.c's sdpa_bwd: one piece for dq, dk, dv, the workspace
     * and, where the model gives no 16-bit dout, its own */
    hs_cudnn_sdpa_dims d = {.B = B, .NH = NH, .KVH = KVH, .T = T, .HD = HD, .dt = (int)dt};
    int64_t cudnn = dt == HS_DTYPE_F32 ? 0 : 2 * q + 2 * k + hs_cudnn_sdpa_workspace_cap(&d, 1);
    /* the CUDA-core backward's deltas, where the model gives none */
    int64_t cores = (int64_t)B * NH * T * 4;
    return cudnn > cores ? cudnn : cores;
}
