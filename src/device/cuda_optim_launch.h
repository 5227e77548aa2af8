/* Private to src/device/: the launchers of cuda_optim.cu (AdamW's and
 * Muon's element updates), with plain C types for cuda_optim.c: the
 * parameter's dtype as hs_dtype's integer (0 fp32, 1 bf16, 2 fp16), element
 * counts int64_t. Each enqueues its work on `st` and returns the launch's
 * error (cudaGetLastError after it). */
#ifndef HS_DEVICE_CUDA_OPTIM_LAUNCH_H
#define HS_DEVICE_CUDA_OPTIM_LAUNCH_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* hs_adamw_hparams's scalars, copied by value into the kernel's arguments. */
typedef struct hs_cu_adamw_scalars {
    float beta1, beta2, one_minus_beta1, one_minus_beta2;
    float step_size, bias2_sqrt, eps, decay_factor;
} hs_cu_adamw_scalars;

/* m, v (fp32) and p (pdt) updated in place from g, as hs_adamw_update_f32. */
cudaError_t hs_cu_adamw(cudaStream_t st, void *p, int pdt, float *m, float *v, const float *g,
                        hs_cu_adamw_scalars h, int64_t n);
/* One tensor of adamw_many, and its blocks' place in the grid. */
typedef struct hs_cu_adamw_item {
    void *p;
    float *m, *v;
    const float *g;
    void *copy; /* NULL: none; else the updated p, rounded to copy_dt */
    int64_t n;
    float decay_factor;
    int pdt, copy_dt;
    int first_block, blocks;
} hs_cu_adamw_item;
/* hs_cu_adamw over count tensors in one launch, each with its own
 * decay_factor (h's is not used): items (device memory, count of them)
 * hold the tensors, host the same array filled in here and copied there
 * on st (kept untouched until st has passed it). The same bits per
 * element as hs_cu_adamw. */
cudaError_t hs_cu_adamw_many(cudaStream_t st, hs_cu_adamw_item *items, hs_cu_adamw_item *host,
                             int count, hs_cu_adamw_scalars h);
/* buf = mu buf + g; dir = g + mu buf (nesterov) or buf. */
cudaError_t hs_cu_muon_momentum(cudaStream_t st, float *dir, float *buf, const float *g, float mu,
                                bool nesterov, int64_t n);
/* p = p * decay_factor - step * u, p in pdt rounded once. */
cudaError_t hs_cu_muon_update(cudaStream_t st, void *p, int pdt, const float *u, float decay_factor,
                              float step, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
