/* hypershard/device.h — the compute seam: where tensor memory lives, how
 * bytes move, and the kernels that compute on it.
 *
 * Contract of this layer (as built; docs/device.md):
 * - A device is a backend, ggml-backend style: a table of memory members
 *   (hs_device_ops), a table of kernels (hs_device_kernels) and a `ctx`,
 *   with no #ifdef above this layer. Backends: `cpu` (oneDNN and the
 *   threaded, vectorised kernels: the numbers the trainer produces) and
 *   `reference` (plain C, one thread, fp64 accumulation: the oracle);
 *   `cuda` later. A backend is new files src/device/<name>*.c and one line
 *   in device.c's registry.
 * - Memory: two accounted pools, `device` (what compute reads) and `host`
 *   (pinned host memory on a GPU; the offload target). On cpu and reference
 *   both are RAM: the split is accounting only, and copies between them are
 *   real memmove's so the offload path is exercised and traced the way it
 *   will be on a GPU. hs_mem_cache is the caching allocator (size classes,
 *   reuse across frees) a GPU pool goes through; its `peak` is what
 *   hs_pool_peak means. Device memory (hs_device_alloc) goes through it;
 *   device_pool counts the bytes asked for.
 * - Streams and events: every copy, memset and kernel takes a stream. On
 *   cpu and reference each call has finished when it returns, so a stream
 *   is only a name, an event is complete once recorded, and waits and
 *   synchronizes return at once; callers still issue them where a GPU needs
 *   them.
 * - Kernels take raw pointers, dtypes and dimensions in llm.c order
 *   (stream, outputs, inputs, weights, dims). Storage dtypes are fp32, bf16
 *   and fp16; arithmetic is fp32, each stored output rounded once;
 *   activation gradients are fp32; every backward ACCUMULATES (+=) into
 *   its gradient outputs unless it says otherwise. An entry a backend does
 *   not have is NULL; tests/unit/test_device_conformance.c holds every
 *   non-NULL entry of every compiled backend to `reference`.
 * - Nothing above this layer reads or writes device memory on the host or
 *   hands host memory to a kernel: it calls the tables, and the host's
 *   arrays (batches, logits, weight files, checkpoints) cross by
 *   hs_device_copy. The build check tests/build/test_device_seam.cmake
 *   finds element loops and memcpy's in the source; HS_DEVICE_GUARD=1
 *   (guard.c) finds every host access at run time (docs/device.md).
 * - Failure (docs/errors.md): memory the device will not give is NULL from
 *   hs_device_alloc / hs_host_alloc, reported by the caller with
 *   hs_device_oom / hs_pool_oom; creating a device, stream or event returns
 *   a status. A kernel cannot return one (a GPU launch cannot either): when
 *   it cannot run (no memory for its own scratch) it writes nothing and
 *   records the failure on its device, which hs_device_status reports; the
 *   trainer checks it after every forward, backward and optimizer step.
 */
#ifndef HYPERSHARD_DEVICE_H
#define HYPERSHARD_DEVICE_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hypershard/base.h"
#include "hypershard/tensor.h"

typedef enum hs_device_kind {
    HS_DEVICE_CPU = 0,
    HS_DEVICE_CUDA,
    HS_DEVICE_REFERENCE,
    HS_DEVICE_KIND_COUNT
} hs_device_kind;

typedef enum hs_copy_kind {
    HS_COPY_H2D = 0,
    HS_COPY_D2H,
    HS_COPY_D2D,
    HS_COPY_KIND_COUNT
} hs_copy_kind;

typedef struct hs_device hs_device;
typedef struct hs_mem_cache hs_mem_cache;
typedef struct hs_device_guard hs_device_guard;
typedef struct hs_device_profile hs_device_profile;

/* An ordered queue of work on one device; `ctx` is the backend's. */
typedef struct hs_stream {
    hs_device *dev;
    void *ctx;
} hs_stream;

/* A point in a stream's work that another stream or the host can wait on. */
typedef struct hs_event {
    hs_device *dev;
    void *ctx;
} hs_event;

/* ------------------------------------------------------------------ memory */

typedef struct hs_device_ops {
    void *(*alloc)(hs_device *d, size_t bytes, hs_stream *s); /* device pool, for use on s */
    void (*free)(hs_device *d, void *p);
    void *(*host_alloc)(hs_device *d, size_t bytes); /* host pool   */
    void (*host_free)(hs_device *d, void *p);
    void (*memset)(hs_stream *s, void *p, int value, size_t bytes);
    void (*copy)(hs_stream *s, void *dst, const void *src, size_t bytes, hs_copy_kind kind);
    void *(*stream_create)(hs_device *d); /* returns the stream's ctx */
    void (*stream_destroy)(hs_device *d, void *ctx);
    void *(*event_create)(hs_device *d); /* returns the event's ctx */
    void (*event_destroy)(hs_device *d, void *ctx);
    void (*event_record)(hs_event *e, hs_stream *s);
    void (*stream_wait)(hs_stream *s, hs_event *e); /* s waits for e, the host does not */
    void (*event_synchronize)(hs_event *e);         /* the host waits for e */
    /* Whether e has completed; NULL where an event is complete once
     * recorded (cpu, reference). */
    bool (*event_query)(hs_event *e);
    void (*stream_synchronize)(hs_stream *s);
    void (*synchronize)(hs_device *d); /* every stream */
    /* Frees the backend's own state (ctx) once its memory is given back;
     * NULL: it has none. */
    void (*destroy)(hs_device *d);
} hs_device_ops;

/* ----------------------------------------------------------------- kernels */

/* How the MoE router turns logits into the chosen experts and their
 * weights (moe_route, moe_route_bwd). Mixtral's and Qwen3-MoE's: softmax,
 * one group, scale 1, no bias (hs_moe_router_plain). DeepSeek-V3's:
 * sigmoid scores; experts in n_group equal groups, each scored by the sum
 * of its two best choice scores, and only the topk_group best groups'
 * experts chosen from; the chosen weights (renormalised when renorm, over
 * their sum + 1e-20 for sigmoid) times scale. The choice scores are the
 * scores plus moe_route's bias [E] (fp32 device memory, or NULL): the bias
 * steers the choice only, never a weight. */
#define HS_MOE_MAX_GROUPS 64 /* n_group */
typedef struct hs_moe_router {
    bool sigmoid;
    bool renorm;
    int n_group, topk_group;
    float scale;
} hs_moe_router;

static inline bool hs_moe_router_plain(const hs_moe_router *r) {
    return !r->sigmoid && r->n_group <= 1 && r->scale == 1.0f;
}

/* The per-step AdamW scalars (torch.optim.AdamW, formed in double by the
 * optimizer and used in fp32). */
typedef struct hs_adamw_hparams {
    float beta1, beta2, one_minus_beta1, one_minus_beta2;
    float step_size;  /* lr / (1 - beta1^t) */
    float bias2_sqrt; /* sqrt(1 - beta2^t) */
    float eps;
    float decay_factor; /* 1 - lr * wd, or 1 when the param is excluded */
} hs_adamw_hparams;

/* One tensor of a multi-tensor AdamW step: adamw's arguments, its own
 * decay_factor (1 where weight decay does not apply), and optionally a
 * copy of p in another dtype that the step rewrites from the updated
 * values (FSDP's 16-bit model shard beside its fp32 main parameter): the
 * bits of a convert of p after the update, without reading p again. */
typedef struct hs_adamw_tensor {
    void *p;
    hs_dtype pdt;
    float *m, *v;
    const float *g;
    int64_t n;
    float decay_factor;
    void *copy; /* NULL: none */
    hs_dtype copy_dt;
} hs_adamw_tensor;

/* Attention on a row range, for context parallelism: query rows
 * [q0, q0+nq) of a [B, Tq, NH*HD] q, whose row q0 is at global position gq,
 * against key rows [k0, k0+nk) of a [B, Tk, KVH*HD] k/v, key row k0 at
 * global position gk; query at position p sees keys at positions <= p.
 * Document masking (block-causal attention in packed sequences): with lo,
 * the query at position p of sequence b sees only keys at positions >=
 * lo[b * lo_ld + p] (the start of its document) as well. */
typedef struct hs_att_rows {
    int Tq, Tk, q0, nq;
    int k0, nk;        /* key rows [k0, k0+nk) of k/v take part */
    int64_t gq, gk;    /* gk: global position of key row k0 */
    const int32_t *lo; /* NULL: plain causal */
    int64_t lo_ld;     /* lo's row stride: the whole sequence's length */
} hs_att_rows;

/* Workspace and hints an attention call may take from its caller (NULL, or
 * any member zero: the backend does without it or allocates its own), as a
 * GPU attention takes its workspace. scratch: hs_attention_scratch_floats
 * (Tq, HD, threads) floats; threads: split the heads over that many
 * threads; delta ([B, NH, Tq]): backward's per-row dO . O, computed into it
 * unless delta_ready (the keys of one query range come in several calls);
 * dout16: dout rounded to dt, for 16-bit products. */
typedef struct hs_att_work {
    float *scratch;
    int threads;
    float *delta;
    bool delta_ready;
    const void *dout16;
} hs_att_work;

/* Dimension letters: N rows, C model dim, F MLP dim, V vocabulary, B batch,
 * T time, H heads, NH/KVH query/key-value heads, HD head dim, E experts,
 * K experts per token. */
typedef struct hs_device_kernels {
    /* tensor level: C = alpha op(A) op(B) + beta C as hs_gemm_ex (fp32
     * accumulation, C rounded once; beta == 0 does not read C). With one
     * 16-bit and one fp32 operand a backend may round the fp32 one to the
     * other's dtype (cpu does where oneDNN has that matmul natively). */
    void (*gemm)(hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g);
    void (*convert)(hs_stream *s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                    int64_t n);
    /* dst = a * (float)src */
    void (*convert_scaled)(hs_stream *s, float *dst, const void *src, hs_dtype src_dt, float a,
                           int64_t n);
    void (*fill)(hs_stream *s, float *x, float v, int64_t n);
    /* x[i] = mean + std * the standard normal at counter offset + i of the
     * Philox stream (seed, stream) (hs_rng_normal): counter-based, so any
     * slice of a tensor is drawn alone (the initialisation). */
    void (*rng_normal)(hs_stream *s, float *x, int64_t n, uint64_t seed, uint64_t stream,
                       int64_t offset, float mean, float std);
    void (*axpy)(hs_stream *s, float *y, const float *x, float a, int64_t n); /* y += a x */
    void (*scale)(hs_stream *s, float *x, float a, int64_t n);                /* x *= a */
    void (*add)(hs_stream *s, float *y, const float *x, int64_t n);           /* y += x */
    /* y = 0 + x: a fresh fp32 accumulator takes the bits adding into zeros
     * gives (-0 becomes +0), which a copy does not. */
    void (*add_to_zero)(hs_stream *s, float *y, const float *x, int64_t n);
    void (*sumsq)(hs_stream *s, double *out, const float *x, int64_t n); /* fp64 */
    /* out[i] = sumsq of x[i] over n[i] values, for i < count, each the
     * bits sumsq gives (x: a host array of device pointers; out: host);
     * one wait for all of them (a GPU hands the count doubles back in one
     * copy): the gradient norm. */
    void (*sumsq_many)(hs_stream *s, double *out, const float *const *x, const int64_t *n,
                       int count);
    /* x[i] := (float)(dt)x[i] on n fp32 values, the value a cast to dt and
     * back gives (the backward of a cast; a cast on fp32-held data); a
     * no-op for fp32. */
    void (*round)(hs_stream *s, float *x, hs_dtype dt, int64_t n);
    /* out[i] = a[i] + b[i], each read in its own dtype, the fp32 sum stored
     * in odt (a residual add across dtypes; out may be a or b). */
    void (*add_cast)(hs_stream *s, void *out, hs_dtype odt, const void *a, hs_dtype adt,
                     const void *b, hs_dtype bdt, int64_t n);
    /* x[i] = (dt)(a * (float)x[i]) in place: one fp32 product, one
     * rounding to dt (a 16-bit gradient's scaling). */
    void (*scale_cast)(hs_stream *s, void *x, hs_dtype dt, float a, int64_t n);

    /* out = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps) per row, saved in
     * fp32; x in xdt, out and w in dt. Backward: dx += ..., dw (gdt; NULL
     * when frozen) += sum over rows; ws: hs_rmsnorm_backward_scratch(N, C)
     * doubles of workspace for dw's partial sums, or NULL. */
    void (*rmsnorm_fwd)(hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt,
                        const void *w, hs_dtype dt, int64_t N, int C, float eps);
    void (*rmsnorm_bwd)(hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout,
                        const void *x, hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt,
                        int64_t N, int C, double *ws);
    /* Hugging Face rotate_half layout; tables [T, HD/2] fp32: cos and sin
     * of float(t) * inv_freq[i] (HD/2 host values: hs_rope_inv_freq, or a
     * scaled RoPE's), times scale (1: plain RoPE); in place on x
     * [B,T,H*HD] (dt) and on the fp32 gradient (inverse rotation). */
    void (*rope_tables)(hs_stream *s, float *cos_t, float *sin_t, int T, int HD,
                        const float *inv_freq, float scale);
    void (*rope_fwd)(hs_stream *s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t,
                     int B, int T, int H, int HD);
    void (*rope_bwd)(hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B, int T,
                     int H, int HD);
    /* out = silu(gate) * up; backward stores over dgate/dup when overwrite;
     * dout may be dgate (each element is read before it is written) */
    void (*swiglu_fwd)(hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt,
                       int64_t n);
    void (*swiglu_bwd)(hs_stream *s, float *dgate, float *dup, bool overwrite, const float *dout,
                       const void *gate, const void *up, hs_dtype dt, int64_t n);
    /* The values swiglu_bwd stores (overwrite) rounded once to the 16-bit
     * dt into dgate16 and dup16: swiglu_bwd then convert, in one pass and
     * the same bits (the gate and up projections' 16-bit input gradients
     * where the GEMMs multiply 16-bit operands natively). */
    void (*swiglu_bwd16)(hs_stream *s, void *dgate16, void *dup16, const float *dout,
                         const void *gate, const void *up, hs_dtype dt, int64_t n);
    /* Causal GQA with scale 1/sqrt(HD) on the rows of r; lse [B, NH, Tq]
     * fp32; out in odt. Backward accumulates dq, dk, dv (fp32). w: NULL or
     * the caller's workspace (hs_att_work). */
    void (*attention_fwd)(hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q,
                          const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH, int HD,
                          const hs_att_rows *r, const hs_att_work *w);
    void (*attention_bwd)(hs_stream *s, float *dq, float *dk, float *dv, const float *dout,
                          const void *out, hs_dtype odt, const void *q, const void *k,
                          const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH,
                          int HD, const hs_att_rows *r, const hs_att_work *w);
    /* Ring attention's online softmax: on the query rows [r->q0, r->q0 +
     * r->nq) of r->Tq, the accumulated output out [B, Tq, NH * HD] and
     * log-sum-exp lse [B, NH, Tq] (fp32) take in a block's bout and blse:
     * l = max + log(e^(lse - max) + e^(blse - max)), out = out e^(lse - l) +
     * bout e^(blse - l), lse = l; a row whose blse is -inf (it saw no key)
     * is left as it is. */
    void (*attention_merge)(hs_stream *s, float *out, float *lse, const float *bout,
                            const float *blse, int B, int NH, int HD, const hs_att_rows *r);
    /* Softmax cross-entropy: *loss = sum over rows with target >= 0 of
     * logsumexp - logit[target] (fp64), *valid those rows; dlogits (may
     * alias logits; NULL: loss only) = (softmax - onehot) * scale, 0 on
     * ignored rows. */
    void (*xent)(hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits,
                 const int32_t *targets, int64_t N, int V, float scale);
    /* Vocab-parallel pieces over a shard of V columns starting at column v0:
     * each row's max; once the max is reduced (gmax), each row's sum of
     * exp(l - gmax) (accumulated in fp64, stored rounded to fp32: it travels
     * in an fp32 all-reduce) and its target logit (0 when the target is not
     * in the shard or is ignored); once the sums are reduced, the shard's
     * gradient in place of its logits: (softmax - onehot) * scale, 0 on
     * rows whose target is < 0. */
    void (*xent_shard_max)(hs_stream *s, float *row_max, const float *logits, int64_t N, int V);
    void (*xent_shard_sums)(hs_stream *s, float *row_sumexp, float *row_target, const float *logits,
                            const float *gmax, const int32_t *targets, int64_t N, int V,
                            int64_t v0);
    void (*xent_shard_grad)(hs_stream *s, float *logits, const float *gmax, const float *row_sumexp,
                            const int32_t *targets, int64_t N, int V, int64_t v0, float scale);
    /* The vocab-parallel loss once the sums are reduced: *loss = sum over
     * rows with target >= 0 of gmax + log(row_sumexp) - row_target, added
     * in row order in fp64 (a host scalar, as xent's). */
    void (*xent_shard_loss)(hs_stream *s, double *loss, const float *gmax, const float *row_sumexp,
                            const float *row_target, const int32_t *targets, int64_t N);
    /* Over the vocabulary rows [v0, v0 + V) that wte (V rows of C) holds:
     * out[n] = wte[tokens[n] - v0] stored as odt, zeros where tokens[n] is
     * outside the range; dwte[tokens[n] - v0] += dout[n] for the tokens
     * inside it (in row order), nothing for the others. One device passes
     * v0 = 0 and its whole vocabulary. */
    void (*embedding_fwd)(hs_stream *s, void *out, hs_dtype odt, const int32_t *tokens,
                          const void *wte, hs_dtype dt, int64_t N, int C, int64_t v0, int V);
    void (*embedding_bwd)(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                          const int32_t *tokens, int64_t N, int C, int64_t v0, int V);
    /* MoE: per row of probs (on entry the router's fp32 logits [N, E],
     * replaced by their fp32 scores, kept for backward: a softmax of the
     * logits rounded to dt, the gate's output dtype, or, with r.sigmoid,
     * each logit's sigmoid as it is, DeepSeek-V3's fp32 router) the top K
     * experts by score + bias (bias NULL: 0) within the r.topk_group best
     * groups, in descending order (ties to the lower expert and group), and
     * their weights as hs_moe_router says, rounded to dt.
     * Dispatch and combine go by (token, slot) pair p = t * K + k of N
     * tokens; row r of the grouped (expert) order holds pair row_pair[r],
     * and pair p sits at row pair_row[p]. moe_permute: xg[r] = x[row_pair[r]
     * / K] for the N * K rows of C values of dt. moe_unpermute (the
     * combine): out[t] = sum of weight[t * K + k] * y[pair_row[t * K + k]]
     * (y in dt, read as fp32) from 0, slots in order k = 0..K-1, into fp32;
     * ws: C floats of workspace. moe_combine_bwd, its backward from dout
     * [N, C]: dyg[pair_row[p]] = weight[p] * dout[t] and dw[p] = dout[t] .
     * y[pair_row[p]] (fp32, in column order). moe_route_bwd, the router's
     * from dw: per token, dp = aux_grad (or 0) plus d loss / d scores
     * through the scale and the renormalisation over the chosen (the
     * unrounded weights rebuilt from probs), then through the softmax or
     * the sigmoid: d loss / d logits. Neither the choice nor the bias has
     * a gradient. */
    void (*moe_route)(hs_stream *s, int32_t *expert, float *weight, float *probs, const float *bias,
                      int64_t N, int E, int K, hs_moe_router r, hs_dtype dt);
    void (*moe_permute)(hs_stream *s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt,
                        int64_t N, int K, int C);
    /* moe_permute's backward: dx[row_pair[r] / K] += dxg[r] (fp32 rows of
     * C), grouped rows r = 0..N*K-1 added in that order. */
    void (*moe_permute_bwd)(hs_stream *s, float *dx, const float *dxg, const int32_t *row_pair,
                            int64_t N, int K, int C);
    void (*moe_unpermute)(hs_stream *s, float *out, const void *y, hs_dtype dt,
                          const int32_t *pair_row, const float *weight, int64_t N, int K, int C,
                          float *ws);
    void (*moe_combine_bwd)(hs_stream *s, float *dyg, float *dw, const float *dout, const void *y,
                            hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N,
                            int K, int C, float *ws);
    void (*moe_route_bwd)(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                          const float *dw, const float *aux_grad, int64_t N, int E, int K,
                          hs_moe_router r);
    /* The router's statistics for the load-balancing loss, ACCUMULATED
     * (+=; the caller zeroes): count[e] (int64) += the selections of
     * expert e in expert [N, K]; and, unless prob_sum is NULL, prob_sum[e]
     * (fp64) += probs[t, e] (fp32 [N, E]), on cpu and reference token by
     * token in order t = 0..N-1 (the same bits on both; another backend
     * may sum in another order to fp32's precision of the result).
     * moe_stats_add: running totals of such statistics, count[e] +=
     * count_in[e] and (prob_sum non-NULL) prob_sum[e] += prob_sum_in[e],
     * for e < E. */
    void (*moe_stats)(hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert,
                      const float *probs, int64_t N, int E, int K);
    void (*moe_stats_add)(hs_stream *s, int64_t *count, double *prob_sum, const int64_t *count_in,
                          const double *prob_sum_in, int E);
    /* The grouped order of the N * K pairs of expert [N, K] (ids < E),
     * with count [E] their selections per expert (moe_stats's): a stable
     * sort by expert, so offset [E + 1] holds each expert's first grouped
     * row (offset[E] = N * K), row_pair [N * K] the pair at each grouped row
     * and pair_row [N * K] its inverse; an expert's pairs keep pair order.
     * The only right answer: every backend gives the same integers. */
    void (*moe_dispatch)(hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                         const int32_t *expert, const int64_t *count, int64_t N, int E, int K);
    /* AdamW on n values: m, v (fp32) and p (held in pdt) updated in place
     * from g, in fp32 arithmetic with p read as fp32 and its result
     * rounded once to pdt (fp32 states, 16-bit params, as a fused GPU
     * AdamW keeps them). */
    void (*adamw)(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                  const hs_adamw_hparams *h, int64_t n);
    /* adamw on each of count tensors (t: a host array), with h but each
     * tensor's decay_factor: the bits of one adamw call per tensor, in one
     * launch on a GPU (a step's ~200 parameters). */
    void (*adamw_many)(hs_stream *s, const hs_adamw_tensor *t, int count,
                       const hs_adamw_hparams *h);
    /* Muon: buf = mu buf + g; dir = g + mu buf (nesterov) or buf; then
     * out = NS5(g) of a [rows, cols] matrix: g / (|g|_F + 1e-7), then
     * `steps` times X <- aX + (bA + cA^2)X, A = XX^T on the wide
     * orientation, (a, b, c) = (3.4445, -4.7750, 2.0315); ws:
     * hs_newton_schulz5_scratch_floats(rows, cols) floats of workspace, or
     * NULL. */
    void (*muon_momentum)(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                          bool nesterov, int64_t n);
    void (*muon_newton_schulz)(hs_stream *s, float *out, const float *g, int64_t rows, int64_t cols,
                               int steps, float *ws);
    /* Muon's update: p = p * decay_factor - step * u in fp32 (torch's
     * mul_ then add_), p read in pdt and the result rounded once to it. */
    void (*muon_update)(hs_stream *s, void *p, hs_dtype pdt, const float *u, float decay_factor,
                        float step, int64_t n);
    /* FSDP shard pack/unpack: `rows` rows of row_bytes between strided
     * buffers (a 2-D copy; dst and src do not overlap). */
    void (*copy_2d)(hs_stream *s, void *dst, size_t dst_stride, const void *src, size_t src_stride,
                    int64_t rows, size_t row_bytes);
    /* FSDP's compressed all-gather (format in tensor.h): packed <- the n
     * values of src (a float dtype) in blocks of `block`; and dst (a float
     * dtype) <- values [first, first + count) of n packed ones, each the
     * bits of hs_quantize_blocks / hs_dequantize_range. */
    void (*quantize)(hs_stream *s, void *packed, const void *src, hs_dtype src_dt, int64_t n,
                     int64_t block, hs_quant_fmt f);
    void (*dequantize)(hs_stream *s, void *dst, hs_dtype dst_dt, const void *packed, int64_t n,
                       int64_t first, int64_t count, int64_t block, hs_quant_fmt f);
    /* dst (fp32) += the same values: hs_dequantize_add_f32's bits */
    void (*dequantize_add)(hs_stream *s, float *dst, const void *packed, int64_t n, int64_t first,
                           int64_t count, int64_t block, hs_quant_fmt f);
} hs_device_kernels;

struct hs_device {
    hs_device_kind kind;
    const char *name;
    const hs_device_ops *ops;
    const hs_device_kernels *k;
    void *ctx;
    /* The host may read and write device memory by address (cpu and
     * reference: it is RAM; the guard closes it between the device's own
     * calls and hs_device_host_access_begin opens it). False on a GPU:
     * collectives on its buffers go through NCCL or are staged through
     * host memory (comm/). */
    bool host_visible;
    /* The GPU it drives (a CUDA device ordinal); -1 on cpu and reference. */
    int ordinal;
    /* The GPU's name as its driver gives it ("NVIDIA H100 80GB HBM3"); ""
     * on cpu and reference. */
    char model[96];
    /* cpu and reference: whether bf16 / f16 products run oneDNN's 16-bit
     * matmul (hs_gemm16_native, decided when the device opens); false:
     * the operands are widened to fp32 and one sgemm runs. */
    bool native_bf16, native_f16;
    /* cpu and reference: every GEMM's rows split over the threads, each
     * block one single-threaded product (hs_gemm_shape.split_rows):
     * train.reproducibility: layout. */
    bool split_gemm_rows;
    hs_stream *stream; /* the default stream */
    hs_pool device_pool;
    hs_pool host_pool;
    hs_trace *trace; /* may be NULL; copies are recorded on HS_LANE_COPY */
    /* The caching allocator device memory (hs_device_alloc) goes through:
     * a buffer freed and asked for again (FSDP's all-gather and
     * reduce-scatter buffers, every unshard) is served from its free list
     * without a raw allocation. device_pool still counts the bytes asked
     * for, so hs_pool_peak means what it did. */
    hs_mem_cache *cache;
    /* HS_DEVICE_GUARD=1 at creation: device memory the host cannot touch
     * outside the device's members (src/device/guard.c); NULL otherwise. */
    hs_device_guard *guard;
    /* hs_device_profile_install: every kernel, memset and copy timed into
     * classes (src/device/profile.c); NULL otherwise, and nothing is timed. */
    hs_device_profile *profile;
    /* The first failure of work that cannot return a status (a kernel whose
     * own scratch could not be allocated): 0 none, 1 being written, 2 set. */
    atomic_int fault_state;
    hs_error fault;
    /* A line the backend has for the run's log (on cuda: which path
     * attention takes, and why), under note_lock; note_serial counts its
     * changes (hs_device_note_read). */
    atomic_int note_lock;
    atomic_int note_serial;
    char note[512];
};

const char *hs_device_kind_name(hs_device_kind k);
/* "cpu", "cuda" or "reference". */
bool hs_device_kind_parse(const char *s, hs_device_kind *out);
/* Whether this build has the backend (cpu and reference always). */
bool hs_device_kind_compiled(hs_device_kind k);
/* The kernel table of a compiled backend without creating a device (NULL
 * when the kind is not compiled): which entries it has, for the checks
 * that refuse a configuration needing one it lacks before anything is
 * allocated. */
const hs_device_kernels *hs_device_kind_kernels(hs_device_kind k);
/* A build with CUDA keeps its cuda backend and nccl group in the module
 * hypershard-cuda.so beside the executable, loaded on first use, so that a
 * process on the CPU maps none of CUDA's libraries: the address of the
 * module's function `name`, or NULL with HS_ERR_CONFIG in *e saying why
 * (no module there, or CUDA's libraries missing). Defined in cuda builds
 * only. */
void *hs_device_cuda_module_symbol(const char *name, hs_error *e);

/* Create the device. `cuda` returns HS_ERR_CONFIG with a clear message in a
 * build without CUDA; HS_ERR_OOM when its tables or default stream cannot
 * be allocated. */
hs_status hs_device_create(hs_device_kind kind, hs_trace *trace, hs_device **out, hs_error *e);
void hs_device_free(hs_device *d);

/* Device memory, uninitialised: NULL when the device (or device_pool's
 * limit) will not give it, and the caller returns hs_device_oom. The
 * refusal is also recorded on the device (hs_device_status), for callers
 * that cannot pass a status on yet (src/model/'s buffers): the trainer
 * checks the device after building the model and after every step, so a
 * NULL kept there is reported as what it is. */
void *hs_device_alloc(hs_device *d, size_t bytes);
/* The same for work on stream s (NULL: the default stream): freed, the
 * block serves s's next request (hs_mem_cache). FSDP's all-gather outputs
 * are the all-gather stream's. */
void *hs_device_alloc_on(hs_device *d, size_t bytes, hs_stream *s);
/* p (device memory) is used on s as well as on the stream it was
 * allocated on: its free waits for s's work issued until then (PyTorch's
 * record_stream). */
void hs_device_record_stream(hs_device *d, void *p, hs_stream *s);
static inline void hs_device_free_mem(hs_device *d, void *p) { d->ops->free(d, p); }
/* Host (pinned) memory: NULL as hs_device_alloc (and recorded alike);
 * report it with hs_pool_oom(&d->host_pool, ...). */
void *hs_host_alloc(hs_device *d, size_t bytes);
/* The report of a failed hs_device_alloc: HS_ERR_OOM naming the device,
 * `what` was allocated, the bytes asked for, and the device pool's bytes
 * in use, peak, cached and limit. */
hs_status hs_device_oom(hs_device *d, size_t bytes, const char *what, hs_error *e);
/* HS_OK, or the first failure on d that its caller may not have reported:
 * a kernel that could not allocate its own scratch (it wrote nothing), or
 * an allocation d refused; copied into e, as a GPU reports a failed launch
 * at the next check. It stays set; whoever drives the work (the trainer
 * after building the model, the train step, eval, generate) checks it
 * before using results. */
hs_status hs_device_status(hs_device *d, hs_error *e);
/* The backend's note for the log (hs_device.note) into buf, and its
 * serial: 0 while there is none; a caller that logs it whenever the
 * serial changes says each note once. */
int hs_device_note_read(hs_device *d, char *buf, size_t n);
/* Whether d's GEMM multiplies two dt operands natively (dt 16-bit): a GPU's
 * tensor cores always; on cpu and reference, whether oneDNN's matmul is
 * the engine for them on this CPU (hs_gemm16_native; also for d NULL, a
 * model only counted for the plan). The model keeps its 16-bit
 * activation gradients where it does. */
bool hs_device_gemm_native(const hs_device *d, hs_dtype dt);
/* A GEMM's shape as d's cpu GEMM runs it: widened (hs_gemm_shape.widen)
 * where a 16-bit operand's matmul is not d's engine. */
hs_gemm_shape hs_device_gemm_shape(const hs_device *d, const hs_gemm_shape *g);
/* The dense GEMM rate d's datasheet states for operands of dtype dt, in
 * FLOP/s (16-bit: the tensor cores' dense figure, half the sparse one;
 * fp32: the CUDA cores'), and in *which the product it took it for; 0
 * where d is no GPU the table knows (datasheet.c lists them). */
double hs_device_datasheet_flops(const hs_device *d, hs_dtype dt, const char **which);

/* The most kernel scratch the cuda backend holds at once in a training
 * step's backward (stream-ordered, charged to the device pool while live,
 * so peak_device_bytes counts it), for `hypershard plan`: attention's
 * backward through cuDNN (16-bit dq, dk, dv and dout, and its workspace
 * bound) or on the CUDA cores (fp32 row deltas), whichever is larger. B
 * sequences of T rows, NH query and KVH key heads of HD values, dt the
 * compute dtype. */
int64_t hs_cuda_backward_scratch_bound(int B, int T, int NH, int KVH, int HD, hs_dtype dt);
static inline void hs_host_free(hs_device *d, void *p) { d->ops->host_free(d, p); }
/* The host reads or writes d's device memory itself between these two
 * calls: only the mpi process group does, for the buffers of a collective
 * issued on a stream of d (host-staged MPI, which on a GPU needs CUDA-aware
 * MPI; NCCL takes device pointers). Nests; without the guard (guard.c) it
 * does nothing. */
void hs_device_host_access_begin(hs_device *d);
void hs_device_host_access_end(hs_device *d);
/* On stream s; records a span on the trace's copy lane with the byte count.
 * hs_device_copy is the same on the default stream, then waits for it. */
void hs_device_copy_async(hs_stream *s, void *dst, const void *src, size_t bytes,
                          hs_copy_kind kind);
void hs_device_copy(hs_device *d, void *dst, const void *src, size_t bytes, hs_copy_kind kind);
static inline void hs_device_memset(hs_stream *s, void *p, int value, size_t bytes) {
    s->dev->ops->memset(s, p, value, bytes);
}
static inline void hs_device_synchronize(hs_device *d) { d->ops->synchronize(d); }

/* The tensor-level entries of d's table on its default stream (GEMM also
 * on a given stream), in the argument order of tensor/'s calls, for the
 * layers above the seam. */
static inline void hs_stream_gemm(hs_stream *s, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                  float alpha, const void *A, hs_dtype a_dt, int64_t lda,
                                  const void *B, hs_dtype b_dt, int64_t ldb, float beta, void *C,
                                  hs_dtype c_dt, int64_t ldc) {
    hs_gemm_shape g = {.trans_a = ta,
                       .trans_b = tb,
                       .M = M,
                       .N = N,
                       .K = K,
                       .alpha = alpha,
                       .beta = beta,
                       .a_dt = a_dt,
                       .b_dt = b_dt,
                       .c_dt = c_dt,
                       .lda = lda,
                       .ldb = ldb,
                       .ldc = ldc};
    s->dev->k->gemm(s, C, A, B, &g);
}
static inline void hs_dev_gemm(hs_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                               float alpha, const void *A, hs_dtype a_dt, int64_t lda,
                               const void *B, hs_dtype b_dt, int64_t ldb, float beta, void *C,
                               hs_dtype c_dt, int64_t ldc) {
    hs_stream_gemm(d->stream, ta, tb, M, N, K, alpha, A, a_dt, lda, B, b_dt, ldb, beta, C, c_dt,
                   ldc);
}
static inline void hs_dev_convert(hs_device *d, void *dst, hs_dtype dst_dt, const void *src,
                                  hs_dtype src_dt, int64_t n) {
    d->k->convert(d->stream, dst, dst_dt, src, src_dt, n);
}
static inline void hs_dev_convert_scaled(hs_device *d, float *dst, const void *src, hs_dtype src_dt,
                                         float a, int64_t n) {
    d->k->convert_scaled(d->stream, dst, src, src_dt, a, n);
}
static inline void hs_dev_rng_normal(hs_device *d, float *x, int64_t n, uint64_t seed,
                                     uint64_t stream, int64_t offset, float mean, float std) {
    d->k->rng_normal(d->stream, x, n, seed, stream, offset, mean, std);
}
static inline void hs_dev_fill(hs_device *d, float *x, int64_t n, float v) {
    d->k->fill(d->stream, x, v, n);
}
static inline void hs_dev_axpy(hs_device *d, float *y, float a, const float *x, int64_t n) {
    d->k->axpy(d->stream, y, x, a, n);
}
static inline void hs_dev_scale(hs_device *d, float *x, float a, int64_t n) {
    d->k->scale(d->stream, x, a, n);
}
static inline void hs_dev_add(hs_device *d, float *y, const float *x, int64_t n) {
    d->k->add(d->stream, y, x, n);
}
static inline void hs_dev_add_to_zero(hs_device *d, float *y, const float *x, int64_t n) {
    d->k->add_to_zero(d->stream, y, x, n);
}
static inline void hs_dev_round(hs_device *d, float *x, hs_dtype dt, int64_t n) {
    d->k->round(d->stream, x, dt, n);
}
static inline void hs_dev_add_cast(hs_device *d, void *out, hs_dtype odt, const void *a,
                                   hs_dtype adt, const void *b, hs_dtype bdt, int64_t n) {
    d->k->add_cast(d->stream, out, odt, a, adt, b, bdt, n);
}
static inline double hs_dev_sumsq(hs_device *d, const float *x, int64_t n) {
    double s = 0.0;
    d->k->sumsq(d->stream, &s, x, n);
    return s;
}
static inline void hs_dev_sumsq_many(hs_device *d, double *out, const float *const *x,
                                     const int64_t *n, int count) {
    d->k->sumsq_many(d->stream, out, x, n, count);
}
/* dst <- src, `bytes` of device memory (no overlap): the table's copy_2d
 * of one row; and p <- 0 by the memory table's memset. */
static inline void hs_dev_copy(hs_device *d, void *dst, const void *src, size_t bytes) {
    d->k->copy_2d(d->stream, dst, bytes, src, bytes, 1, bytes);
}
static inline void hs_dev_copy_2d(hs_device *d, void *dst, size_t dst_stride, const void *src,
                                  size_t src_stride, int64_t rows, size_t row_bytes) {
    d->k->copy_2d(d->stream, dst, dst_stride, src, src_stride, rows, row_bytes);
}
static inline void hs_dev_quantize(hs_device *d, void *packed, const void *src, hs_dtype src_dt,
                                   int64_t n, int64_t block, hs_quant_fmt f) {
    d->k->quantize(d->stream, packed, src, src_dt, n, block, f);
}
static inline void hs_dev_dequantize(hs_device *d, void *dst, hs_dtype dst_dt, const void *packed,
                                     int64_t n, int64_t first, int64_t count, int64_t block,
                                     hs_quant_fmt f) {
    d->k->dequantize(d->stream, dst, dst_dt, packed, n, first, count, block, f);
}
static inline void hs_dev_dequantize_add(hs_device *d, float *dst, const void *packed, int64_t n,
                                         int64_t first, int64_t count, int64_t block,
                                         hs_quant_fmt f) {
    d->k->dequantize_add(d->stream, dst, packed, n, first, count, block, f);
}
static inline void hs_dev_zero(hs_device *d, void *p, size_t bytes) {
    d->ops->memset(d->stream, p, 0, bytes);
}
/* hs_xent_forward_backward through the table: the loss, *valid (may be
 * NULL) the rows used. */
static inline double hs_dev_xent(hs_device *d, float *dlogits, const float *logits,
                                 const int32_t *targets, int64_t N, int V, float scale,
                                 int64_t *valid) {
    double loss = 0.0;
    int64_t used = 0;
    d->k->xent(d->stream, &loss, &used, dlogits, logits, targets, N, V, scale);
    if (valid) *valid = used;
    return loss;
}

/* Streams and events; HS_ERR_OOM (and *out NULL) when the memory for one,
 * or the backend's own state, cannot be had. */
hs_status hs_stream_create(hs_device *d, hs_stream **out, hs_error *e);
void hs_stream_free(hs_stream *s);
hs_status hs_event_create(hs_device *d, hs_event **out, hs_error *e);
void hs_event_free(hs_event *e);
static inline void hs_event_record(hs_event *e, hs_stream *s) { s->dev->ops->event_record(e, s); }
static inline void hs_stream_wait(hs_stream *s, hs_event *e) { s->dev->ops->stream_wait(s, e); }
static inline void hs_event_synchronize(hs_event *e) { e->dev->ops->event_synchronize(e); }
static inline void hs_stream_synchronize(hs_stream *s) { s->dev->ops->stream_synchronize(s); }

/* ----------------------------------------------------------------- profile */

/* Where a step's time goes, by op class (`hypershard bench step
 * --breakdown`). Installed on a device right after it is created, before
 * any model reads its table, the profile stands in front of every kernel
 * and of the memset and copy members: each call made by the thread that
 * installed it, while the profile is enabled, is timed with the monotonic
 * clock and added to its class with its work (FLOPs for GEMMs and
 * attention, bytes read and written for the others). A call nested in
 * another, or made by another thread (a communication thread), is not
 * timed: its time lies inside, or beside, the compute thread's. Without
 * install, nothing is wrapped. */
typedef enum hs_prof_class {
    HS_PROF_GEMM_QKV = 0, /* q_proj, k_proj, v_proj: forward, dx and dW */
    HS_PROF_GEMM_O,
    HS_PROF_GEMM_GATE_UP,
    HS_PROF_GEMM_DOWN,
    HS_PROF_GEMM_HEAD,
    HS_PROF_GEMM_OTHER, /* a GEMM the labeller does not name (MoE, router) */
    HS_PROF_ATTENTION,  /* forward, backward, merge (its GEMMs inside)   */
    HS_PROF_NORM,
    HS_PROF_ROPE,
    HS_PROF_SWIGLU,
    HS_PROF_XENT,
    HS_PROF_EMBEDDING,
    HS_PROF_MOE, /* routing, permutes, statistics */
    HS_PROF_OPTIMIZER,
    HS_PROF_CAST,        /* convert, convert_scaled, round, scale_cast, (de)quantize */
    HS_PROF_COPY,        /* copy_2d and the copy member (FSDP packs, D2D) */
    HS_PROF_ELEMENTWISE, /* fill, axpy, scale, add, add_cast, sumsq, memset, rng */
    HS_PROF_COMM_WAIT,   /* hs_device_profile_add by a waiting caller    */
    HS_PROF_CLASS_COUNT
} hs_prof_class;

/* "gemm qkv", "attention", ... */
const char *hs_prof_class_name(hs_prof_class c);
/* Whether the class's work is FLOPs (GEMMs, attention) rather than bytes. */
bool hs_prof_class_flops(hs_prof_class c);

typedef struct hs_prof_entry {
    double seconds, flops, bytes;
    int64_t calls;
} hs_prof_entry;

typedef struct hs_prof_stats {
    hs_prof_entry c[HS_PROF_CLASS_COUNT];
    int64_t untimed_calls; /* from another thread */
} hs_prof_stats;

/* Names a GEMM's class from its operands, as the layer that knows which
 * weight is which sees them; HS_PROF_GEMM_OTHER when it does not know. */
typedef hs_prof_class (*hs_prof_gemm_labeller)(void *ctx, const void *C, const void *A,
                                               const void *B, const hs_gemm_shape *g);

/* Starts disabled; HS_ERR_OOM when its state cannot be allocated. Freed
 * with the device. */
hs_status hs_device_profile_install(hs_device *d, hs_error *e);
void hs_device_profile_enable(hs_device *d, bool on);
void hs_device_profile_set_labeller(hs_device *d, hs_prof_gemm_labeller fn, void *ctx);
/* phase >= 0: the elementwise calls (fills, scales, sums of squares,
 * memsets) count to that class: the optimizer step's grad norm, clipping
 * and zeroing are the optimizer's, its casts and copies stay theirs; -1:
 * by kernel. */
void hs_device_profile_set_phase(hs_device *d, int phase);
/* The totals since install or the last reset (zeros without a profile). */
void hs_device_profile_get(const hs_device *d, hs_prof_stats *out);
void hs_device_profile_reset(hs_device *d);
/* Time spent outside the table by the compute thread (a wait on a
 * collective) added to class c; nothing without an enabled profile. */
void hs_device_profile_add(hs_device *d, hs_prof_class c, double seconds, double bytes);

/* ------------------------------------------------------- caching allocator */

/* Blocks come from `raw_alloc` rounded up to a size class and go back to a
 * free list of their class when freed, for the next request of that class;
 * hs_mem_cache_trim hands the free lists back to `raw_free`. Thread safe.
 * Free lists are kept per stream, as PyTorch's CUDA caching allocator keeps
 * them: a block belongs to the stream it was allocated on (an opaque key;
 * NULL the default stream) and is handed out again only to requests on that
 * stream, whose work is ordered after all the block's earlier work there. A
 * block also used on another stream is recorded there
 * (hs_mem_cache_record, PyTorch's record_stream); when freed it is parked
 * with an event marked on each such stream and reaches its free list once
 * they have completed (looked at on each allocation; waited for before a
 * trim, so a failed raw allocation can still reclaim it).
 * When raw_alloc fails the free lists are handed back and it is tried once
 * more. Size classes: 512 bytes and below round to 512; above, four classes
 * per power of two (640, 768, 896, 1024, 1280, ...), so a block wastes
 * under a fifth of itself. */
typedef void *(*hs_raw_alloc_fn)(void *ctx, size_t bytes);
typedef void (*hs_raw_free_fn)(void *ctx, void *p);

typedef struct hs_mem_cache_stats {
    int64_t in_use;   /* bytes the callers asked for, live: hs_pool_current */
    int64_t peak;     /* the most in_use has been: hs_pool_peak */
    int64_t reserved; /* class bytes taken from raw_alloc and not trimmed */
    int64_t reserved_peak;
    int64_t hits, misses; /* requests served from a free list / by raw_alloc */
} hs_mem_cache_stats;

size_t hs_mem_cache_class(size_t bytes);
/* name: what it is ("device pool"). HS_ERR_OOM when its tables cannot be
 * allocated. */
hs_status hs_mem_cache_create(const char *name, hs_raw_alloc_fn raw_alloc, hs_raw_free_fn raw_free,
                              void *ctx, hs_mem_cache **out, hs_error *e);
/* Hands every cached block back and frees the cache; every block must have
 * been freed first. */
void hs_mem_cache_free_all(hs_mem_cache *c);
/* NULL when raw_alloc fails even after the free lists are handed back, or
 * the block table cannot grow: nothing is counted then. */
void *hs_mem_cache_alloc(hs_mem_cache *c, size_t bytes);
/* The same for use on `stream` (NULL: the default stream). At most 64
 * streams per cache at once (hs_mem_cache_stream_gone frees a slot). */
void *hs_mem_cache_alloc_on(hs_mem_cache *c, size_t bytes, const void *stream);
/* p, live, is used on `stream` too: its free waits for that stream's work
 * issued until then. */
void hs_mem_cache_record(hs_mem_cache *c, void *p, const void *stream);
/* How the cache marks a point in a stream's work: mark returns an event
 * recorded on `stream` now (NULL: nothing to wait for), done whether it has
 * completed, wait blocks the host until it has, release frees it. Without
 * them (RAM backends) a stream's work is complete once issued, and a
 * recorded block goes straight back to its free list. */
typedef struct hs_mem_cache_events {
    void *(*mark)(void *ctx, const void *stream);
    bool (*done)(void *ctx, void *ev);
    void (*wait)(void *ctx, void *ev);
    void (*release)(void *ctx, void *ev);
} hs_mem_cache_events;
void hs_mem_cache_set_events(hs_mem_cache *c, const hs_mem_cache_events *ev, void *ctx);
/* `stream` has been synchronized and is going away: its free lists and
 * blocks become the default stream's, and its slot is free. */
void hs_mem_cache_stream_gone(hs_mem_cache *c, const void *stream);
/* NULL is fine (returns 0); p must come from c. Returns the bytes p was
 * asked for. */
size_t hs_mem_cache_free(hs_mem_cache *c, void *p);
void hs_mem_cache_trim(hs_mem_cache *c);
hs_mem_cache_stats hs_mem_cache_stats_get(hs_mem_cache *c);
/* Peak := in use; for measuring one phase. */
void hs_mem_cache_reset_peak(hs_mem_cache *c);
/* The stats of d's device memory cache (hits and misses count the
 * allocations served from a free list and by a raw allocation). */
hs_mem_cache_stats hs_device_mem_stats(hs_device *d);

/* -------------------------------------------------- element access helpers */

/* The element helpers the layers above the seam share with the kernels
 * (the cpu backend's own kernels and helpers: src/device/cpu_kernels.h). */

/* e^x in fp32 that vectorises (no libm call): x = n ln2 + r with |r| <=
 * ln2/2, e^r by Cephes' degree-6 polynomial, 2^n put into the exponent.
 * Within 2 ulp of expf on [-87.3, 88.3] (tests/unit/test_layers.c sweeps
 * it); below, 0 (no subnormals); above, +Inf; NaN stays NaN. The element
 * kernels (SwiGLU, attention's softmax, cross-entropy) use it. */
/* RoPE's inverse frequencies as LlamaRotaryEmbedding forms them in fp32:
 * inv[i] = 1 / theta^(2i/HD), i < HD/2. */
static inline void hs_rope_inv_freq(float *inv, int HD, double theta) {
    for (int i = 0; i < HD / 2; i++) inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)HD);
}

static inline float hs_expf(float x) {
    const float lo = -87.3365447f, hi = 88.3762626f;
    float xc = x < lo ? lo : x > hi ? hi : x;
    /* round to nearest by the 1.5 * 2^23 shift: plain arithmetic, so the
     * loop vectorises (rintf does not without -fno-trapping-math) */
    float n = (xc * 1.44269504089f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    y = x < lo ? 0.0f : y;
    y = x > hi ? INFINITY : y;
    return x != x ? x : y;
}

static inline float hs_ld(const void *p, hs_dtype dt, int64_t i) {
    switch (dt) {
    case HS_DTYPE_BF16: return hs_bf16_to_f32(((const uint16_t *)p)[i]);
    case HS_DTYPE_F16: return hs_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline void hs_st(void *p, hs_dtype dt, int64_t i, float v) {
    switch (dt) {
    case HS_DTYPE_BF16: ((uint16_t *)p)[i] = hs_f32_to_bf16(v); break;
    case HS_DTYPE_F16: ((uint16_t *)p)[i] = hs_f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* Element offset into a buffer of dtype dt. */
static inline void *hs_at(void *p, hs_dtype dt, int64_t i) {
    return (char *)p + (size_t)i * (dt == HS_DTYPE_F32 ? 4u : 2u);
}
static inline const void *hs_cat(const void *p, hs_dtype dt, int64_t i) {
    return (const char *)p + (size_t)i * (dt == HS_DTYPE_F32 ? 4u : 2u);
}

/* ------------------------------------------------- kernel workspace sizes */

/* Doubles of scratch rmsnorm_bwd takes for dw's partial sums (its ws). */
int64_t hs_rmsnorm_backward_scratch(int64_t N, int C);
/* Floats of scratch the cpu attention takes (hs_att_work's scratch): one
 * tile and one query block per thread, bounded whatever T. */
int64_t hs_attention_scratch_floats(int T, int HD, int threads);
/* The rows of a whole sequence of T: every query row against every key
 * row, positions from 0. */
hs_att_rows hs_att_rows_all(int T);
/* Floats of scratch muon_newton_schulz takes (its ws; NULL: its own). */
int64_t hs_newton_schulz5_scratch_floats(int64_t rows, int64_t cols);

#endif
