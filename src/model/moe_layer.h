/* model/moe_layer.h — the sparse MoE feed-forward layer (Mixtral's
 * MixtralSparseMoeBlock) as a forward / backward pair, plus the
 * load-balancing aux loss across layers. Private to src/model/.
 *
 * What the block's MLP does when arch is moe:
 *
 *   forward (per block i, x = the post-attention RMSNorm output [BT, C]):
 *     hs_moe_forward(out, &act[i], x, &w, BT, scratch);
 *     hs_moe_aux_add(&aux, &act[i]);      (first forward only, see below)
 *   after the last block's forward:
 *     aux_value = hs_moe_aux_value(&aux); micro-batch aux term =
 *       moe.aux_loss_coef * aux_value (what hs_model_forward_backward
 *       reports in *aux_loss)
 *     hs_moe_aux_prob_grad(&aux, coef * valid_tokens * grad_scale, g);
 *       (g [E] fp32: the gradient the aux term sends to every router
 *       probability; the same vector serves every layer)
 *   backward (per block i, reversed):
 *     hs_moe_backward(dx, dout, &gr, &act[i], x, &w, g, scratch);
 *
 * Semantics (Hugging Face Mixtral, exactly; docs/moe.md has the detail):
 *   logits = x @ gate^T [BT, E], rounded to the compute dtype (nn.Linear's
 *   output dtype); probs = softmax(logits) in fp32; the top_k experts by
 *   probability, ties broken toward the LOWER expert index, in descending
 *   order; their weights renormalised to sum to 1, then rounded to the
 *   compute dtype; expert e computes w2_e(silu(w1_e x) * (w3_e x));
 *   out = sum_k weight_k * expert_{sel_k}(x) [+ shared(x)].
 *   The optional shared expert (FS = shared_expert_ffn_dim > 0) is a SwiGLU
 *   MLP applied to every token and added WITHOUT a gate.
 *
 * Parameters (the model registers them; pointers are the unsharded compute
 * views, all in the compute dtype):
 *   model.layers.{i}.block_sparse_moe.gate.weight                 [E, C]
 *   model.layers.{i}.block_sparse_moe.experts.w1.weight           [E, F, C]
 *   model.layers.{i}.block_sparse_moe.experts.w3.weight           [E, F, C]
 *   model.layers.{i}.block_sparse_moe.experts.w2.weight           [E, C, F]
 *   model.layers.{i}.block_sparse_moe.shared_expert.gate_proj.weight [FS, C]
 *   model.layers.{i}.block_sparse_moe.shared_expert.up_proj.weight   [FS, C]
 *   model.layers.{i}.block_sparse_moe.shared_expert.down_proj.weight [C, FS]
 *   The router and the shared expert belong to the block's unit; w1/w2/w3
 *   to the nested expert unit. hs_moe_forward reads all of them, so call
 *   the expert unit's pre_forward before it and post_forward after it (the
 *   same for backward).
 *
 * Buffers and precision:
 *   x, out, weights and saved activations are in the compute dtype (act.dt);
 *   router statistics (probs, aux) are fp32 (sums fp64); every GEMM
 *   accumulates in fp32. Activation gradients dx / dout are fp32 (as in
 *   layers.h); weight gradients are in gr.dt. Backward ACCUMULATES (+=)
 *   into dx and every weight gradient; callers zero what they own.
 *   `act` memory (hs_moe_act_bytes) must live from forward to backward;
 *   `scratch` (hs_moe_scratch_bytes) is only used during one call and may be
 *   shared by every layer.
 *
 * Activation checkpointing: re-running hs_moe_forward in backward rebuilds
 * the same act (routing is deterministic), but do NOT call hs_moe_aux_add
 * again for the re-run, or that layer's tokens count twice.
 */
#ifndef HS_MODEL_MOE_H
#define HS_MODEL_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "hypershard/base.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/model.h"
#include "hypershard/tensor.h"
#include "model/moe_expert.h"

/* Dimension letters: BT tokens (rows), C model dim, E routed experts, K
 * top_k, F expert_ffn_dim, FS shared_expert_ffn_dim (0: none); EL experts
 * are this rank's (E unless the placements split them). seam_experts: the
 * model-parallel seam runs the routed experts (hs_moe_exchange) and holds
 * their hidden rows. */
typedef struct hs_moe_shapes {
    int BT, C, E, K, F, FS;
    int EL;
    bool seam_experts;
    hs_moe_router router; /* scores, choice and weights (hs_moe_router_of) */
} hs_moe_shapes;

hs_moe_shapes hs_moe_shapes_make(const hs_moe_config *mc, int BT, int C);
/* The router model.arch and model.moe ask for. */
hs_moe_router hs_moe_router_of(const hs_model_config *m);

/* What forward saves for backward: pointers into one caller-owned block of
 * hs_moe_act_bytes(). "Grouped rows" are the BT*K (token, slot) pairs
 * sorted by expert, then token, then slot: expert e owns grouped rows
 * [offset[e], offset[e+1]).
 *
 * Under expert parallelism (ep_state != NULL) the grouped rows are sent, in
 * that order, to their experts' ranks through the seam (model.h
 * hs_moe_exchange), and y receives the outputs back in grouped order. */
typedef struct hs_moe_act {
    hs_moe_shapes cap; /* the shapes it was laid out for (BT = capacity) */
    hs_device *dev;    /* computes on this device's table */
    hs_dtype dt;       /* compute dtype */
    hs_dtype out_dt;   /* the expert unit's output dtype (dt unless
                        * output_dtype is set): y is cast to it in forward,
                        * its gradient back to dt in backward */
    int BT;            /* rows of the last forward, <= cap.BT */
    float *probs;      /* [BT, E] fp32 softmax of the router logits */
    int32_t *sel;      /* [BT, K] selected experts, descending probability */
    float *weight;     /* [BT, K] routing weights (cap.router's), rounded
                        * to dt */
    int32_t *offset;   /* [E+1] first grouped row of each expert */
    int32_t *offset_h; /* [E+1] host memory, the model's: offset as copied back */
    int32_t *row_pair; /* [BT*K] grouped row -> pair t*K + k */
    int32_t *pair_row; /* [BT*K] pair t*K + k -> grouped row */
    void *h1, *h3;     /* [BT*K, F] dt: w1 x, w3 x per grouped row */
    void *y;           /* [BT*K, C] dt: expert output per grouped row */
    void *sh1, *sh3;   /* [BT, FS] dt: shared gate_proj x, up_proj x */
    int64_t *count;    /* [E] top-k selections of each expert (this layer) */
    double *prob_sum;  /* [E] sum over tokens of probs (this layer) */
    float *bias32;     /* [E] the correction bias as the router reads it */
    /* expert parallelism (NULL: every expert is local): the seam and what
     * it keeps of this activation set's exchanges (moe_state_new) */
    const hs_model_par *par;
    void *ep_state;
} hs_moe_act;

/* One block's term of model.moe.seq_aux_loss_coef on one micro-batch
 * (moe_seq_aux.c): coef [B, E] (host) is what its forward leaves for its
 * backward; this rank's rows are rows [row0, row0 + BT) of the B
 * sequences of T_local rows each (row0 > 0 under the row split), each
 * sequence split over cp_size ranks. host: hs_moe_seq_host_bytes of
 * workspace, shared by the blocks. */
typedef struct hs_moe_seq {
    float *coef;
    void *host;
    int B, T_local, cp_size, max_batch;
    int64_t row0;
} hs_moe_seq;

size_t hs_moe_act_bytes(const hs_moe_shapes *s, hs_dtype dt);
/* Lay act out over `mem` (64-byte aligned, hs_moe_act_bytes(s, dt) long).
 * Set act->offset_h (host memory of E + 1 int32, may be shared by the
 * layers) and, with s->seam_experts, act->par and act->ep_state before the
 * first forward. */
void hs_moe_act_bind(hs_moe_act *act, hs_device *dev, const hs_moe_shapes *s, hs_dtype dt,
                     void *mem);
/* Bytes of scratch hs_moe_forward and hs_moe_backward need (the larger). */
size_t hs_moe_scratch_bytes(const hs_moe_shapes *s, hs_dtype dt);

/* out [BT, C] (dt, overwritten) = MoE(x [BT, C] dt). BT <= act->cap.BT. */
void hs_moe_forward(void *out, hs_moe_act *act, const void *x, const hs_moe_weights *w, int BT,
                    void *scratch);

/* dx [BT, C] fp32 += d out/d x . dout; grads += likewise. aux_grad [E]
 * (from hs_moe_aux_prob_grad) is added to d loss / d probs of every token;
 * NULL means no aux term. BT is that of the last forward on act. */
void hs_moe_backward(float *dx, const float *dout, const hs_moe_grads *gr, const hs_moe_act *act,
                     const void *x, const hs_moe_weights *w, const float *aux_grad,
                     const hs_moe_seq *seq, void *scratch);

/* -------------------------------------------------------------- aux loss */

/* Running totals over the layers of one forward: Hugging Face's
 * load_balancing_loss_func concatenates every layer's router logits and
 * computes the loss once over all of them, so the totals, not per-layer
 * losses, are what is kept. */
typedef struct hs_moe_aux {
    int E, K;
    int64_t rows;     /* tokens summed over layers */
    int64_t *count;   /* [E] */
    double *prob_sum; /* [E] */
    hs_device *dev;   /* count and prob_sum are its memory */
    /* Host memory (init's allocations): the totals as last copied across
     * and 2E + 2 floats of staging, for the arithmetic that finishes the
     * loss on the host (pack, unpack, value, prob_grad). */
    int64_t *host_count;
    double *host_prob_sum;
    float *host_buf;
} hs_moe_aux;

/* false: some of its memory could not be allocated (free it as usual). */
bool hs_moe_aux_init(hs_moe_aux *a, int E, int K, hs_device *dev);
/* What hs_moe_aux_init takes from dev's device memory. */
size_t hs_moe_aux_bytes(int E);
void hs_moe_aux_free(hs_moe_aux *a);
void hs_moe_aux_reset(hs_moe_aux *a);
/* The totals and the micro-batch's valid targets as 2E + 2 fp32 values
 * (counts and rows are exact below 2^24) into buf (device memory), for a
 * sum over the ranks of one global micro-batch; unpack sets the totals from
 * buf and returns the summed valid count. */
void hs_moe_aux_pack(const hs_moe_aux *a, int64_t valid, float *buf);
int64_t hs_moe_aux_unpack(hs_moe_aux *a, const float *buf);
void hs_moe_aux_add(hs_moe_aux *a, const hs_moe_act *act);
/* E * sum_e (count_e / rows) * (prob_sum_e / rows), without aux_loss_coef;
 * 0 before any layer was added. */
double hs_moe_aux_value(const hs_moe_aux *a);
/* g[e] (device memory) = scale * d value / d p_{t,e} = scale * E * count_e
 * / rows^2, the same for every token t of every layer. */
void hs_moe_aux_prob_grad(const hs_moe_aux *a, double scale, float *g);

/* ------------------------------------------ sequence-wise balance loss */

size_t hs_moe_seq_host_bytes(const hs_moe_shapes *s, int max_batch);
/* Host scratch of hs_moe_wgrad.host for up to max_sequences a forward. */
size_t hs_moe_wgrad_host_bytes(const hs_moe_shapes *s, int max_sequences);
/* After the block's first forward on act (not a recomputation): the
 * sequences' statistics (summed over par's seq_sum), coef, and the term's
 * value alpha * (1 / B) sum_b L_b (the mean over this micro-batch's
 * sequences; sequences: those of the global batch, whose mean the
 * objective takes). */
double hs_moe_seq_forward(const hs_moe_act *act, const hs_moe_seq *q, const hs_model_par *par,
                          double alpha, int sequences);
/* dp [BT, E] (d loss / d logits, device) += the term's; tmp: [BT, E]
 * fp32 device scratch. */
void hs_moe_seq_backward(const hs_moe_act *act, const hs_moe_seq *q, float *dp, float *tmp);

/* ------------------------------------------ building blocks (moe_*.c) */

/* Router: probs, sel, weight, count, prob_sum of act from x (the logits
 * pass through act->probs, so no scratch is needed). */
void hs_moe_route_forward(hs_moe_act *act, const void *x, const void *gate, const void *bias,
                          int BT);
/* From dw [BT, K] (d loss / d weight), aux_grad and seq (NULL: none):
 * dx += dlogits @ gate, gr->gate += dlogits^T @ x (through gr->wgrad over
 * the sequences' row blocks when it is set). dp and tmp are [BT, E] fp32
 * scratch. */
void hs_moe_route_backward(float *dx, const hs_moe_grads *gr, const float *dw,
                           const float *aux_grad, const hs_moe_seq *seq, const hs_moe_act *act,
                           const void *x, const void *gate, float *dp, float *tmp,
                           const int64_t *blocks);
/* Counting sort of the BT*K pairs by expert into offset/row_pair/pair_row
 * (the device's moe_dispatch). */
void hs_moe_dispatch_plan(hs_moe_act *act);
/* The experts' first grouped rows [E + 1], copied to the host (offset_h)
 * for the per-expert GEMMs' row ranges. */
const int32_t *hs_moe_dispatch_offsets(const hs_moe_act *act);
/* xg [BT*K, C] (dt) = x rows in grouped order. */
void hs_moe_dispatch_gather(void *xg, const void *x, const hs_moe_act *act);

#endif
