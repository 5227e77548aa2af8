/* Private to src/device/: the interface of hypershard-cudnn.so, the
 * module that runs attention on the tensor cores through cuDNN's fused
 * scaled-dot-product attention (src/device/cudnn_sdpa.cpp, over the
 * header-only cudnn-frontend). cuda_attention.c opens it on a device's
 * first attention call; without it, or where it cannot serve a call,
 * attention runs on the CUDA-core kernels of cuda_attention.cu.
 *
 * Plain C types only (a stream is its cudaStream_t as a pointer), so that
 * a build without CUDA compiles its test: the module is C++ and its one
 * exported symbol,
 * hs_cudnn_sdpa_api, returns this table. Every call returns 0 or, with the
 * reason in why (a line for the log), nonzero; none throws or aborts. */
#ifndef HS_DEVICE_CUDNN_SDPA_H
#define HS_DEVICE_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HS_CUDNN_SDPA_MODULE "hypershard-cudnn.so"

/* A device's cuDNN handle and its graphs, one per shape and direction,
 * built on first use and kept (a shape cuDNN refused is kept as refused,
 * with its reason). Its calls may come from several threads. */
typedef struct hs_cudnn_sdpa hs_cudnn_sdpa;

/* Causal self-attention over whole sequences: q, out and dout
 * [B, T, NH*HD], k and v [B, T, KVH*HD], row-major, 16-bit (dt: 1 bf16,
 * 2 fp16); stats [B, NH, T] fp32, each row's natural log-sum-exp of its
 * scaled scores (hs_att_rows' lse); scale 1/sqrt(HD). */
typedef struct hs_cudnn_sdpa_dims {
    int B, NH, KVH, T, HD;
    int dt;
} hs_cudnn_sdpa_dims;

/* The most workspace d's graph may take in one direction: plans that want
 * more are deselected, and a graph left without one is refused (attention
 * then runs on the CUDA-core kernels, said in the log). Two fp32 row
 * statistics (B*NH*T*8 bytes) and 16 MiB forward; backward also twice the
 * fp32 dQ accumulator a flash backward keeps (B*NH*T*HD*4). `hypershard
 * plan` counts it (scratch_bound.c). */
static inline int64_t hs_cudnn_sdpa_workspace_cap(const hs_cudnn_sdpa_dims *d, int bwd) {
    int64_t rows = (int64_t)d->B * d->NH * d->T;
    return rows * 8 + ((int64_t)16 << 20) + (bwd ? 2 * rows * d->HD * 4 : 0);
}

typedef struct hs_cudnn_sdpa_ops {
    /* cuDNN's handle on the current GPU; *out NULL and why set when cuDNN
     * cannot be used there (library too old, no GPU, ...). */
    int (*create)(hs_cudnn_sdpa **out, char *why, size_t why_n);
    void (*destroy)(hs_cudnn_sdpa *c);
    /* "cuDNN 9.10.2 (frontend 1.32.0)" */
    const char *(*version)(const hs_cudnn_sdpa *c);
    /* The workspace of d's graph in this direction (bwd: false forward,
     * true backward) in *bytes, building the graph on first use. */
    int (*workspace)(hs_cudnn_sdpa *c, const hs_cudnn_sdpa_dims *d, int bwd, int64_t *bytes,
                     char *why, size_t why_n);
    /* out and stats from q, k, v, enqueued on st. */
    int (*fwd)(hs_cudnn_sdpa *c, void *st, const hs_cudnn_sdpa_dims *d, void *out, float *stats,
               const void *q, const void *k, const void *v, void *workspace, char *why,
               size_t why_n);
    /* dq, dk, dv (written, 16-bit, dk and dv summed over each key head's
     * query heads) from the forward's q, k, v, out, stats and dout (16-bit),
     * by cuDNN's deterministic backward, enqueued on st. */
    int (*bwd)(hs_cudnn_sdpa *c, void *st, const hs_cudnn_sdpa_dims *d, void *dq, void *dk,
               void *dv, const void *q, const void *k, const void *v, const void *out,
               const void *dout, const float *stats, void *workspace, char *why, size_t why_n);
    /* The graph of d in one direction described and validated by the
     * frontend for compute capability sm (90: Hopper), without a GPU:
     * whether cuDNN's SDPA node takes these shapes, strides and options. */
    int (*check)(const hs_cudnn_sdpa_dims *d, int bwd, int sm, char *why, size_t why_n);
} hs_cudnn_sdpa_ops;

typedef const hs_cudnn_sdpa_ops *(*hs_cudnn_sdpa_api_fn)(void);
const hs_cudnn_sdpa_ops *hs_cudnn_sdpa_api(void);

#ifdef __cplusplus
}
#endif

#endif
