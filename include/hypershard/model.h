/* hypershard/model.h — Llama-family decoder and MoE decoder with hand-written
 * forward and backward, parameters registered by Hugging Face FQN.
 *
 * Contract of this layer:
 * - Semantics are Hugging Face LlamaForCausalLM (dense) and Mixtral
 *   (MixtralForCausalLM) for `arch: moe`; FQNs are theirs
 *   ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight", ...).
 * - The model never owns the policy of where parameters live. Each hs_param
 *   has `data` (the unsharded compute view, full logical shape, in
 *   `compute_dtype`) and `grad` (the unsharded gradient, `grad_dtype`). In a
 *   single-process run the model allocates both (hs_model_options.
 *   allocate_params); under FSDP the FSDP layer points them at its buffers
 *   from its pre_forward / pre_backward hooks.
 * - Backward ACCUMULATES (+=) into grad; the owner zeroes it. Gradients are
 *   of (sum of token losses) * grad_scale, plus aux loss terms (MoE), so the
 *   trainer passes grad_scale = 1 / (tokens in the global batch) and the
 *   gradient is that of the global-batch mean loss.
 * - Units: unit 0 is the root (embedding, final norm, lm_head); then, in
 *   declaration order, one unit per transformer block ("model.layers.i") and,
 *   for MoE, one nested unit per block's routed experts
 *   ("model.layers.i.block_sparse_moe.experts") right after its block.
 *   Every parameter belongs to its deepest unit.
 * - Hooks: forward calls pre_forward(u) before the first use of a unit's
 *   parameters and post_forward(u) after its last use in forward; backward
 *   likewise with pre_backward / post_backward; after everything,
 *   post_backward_final(). With activation checkpointing the block's
 *   forward is re-run inside its backward, calling pre_forward(u) and
 *   post_forward(u) again after pre_backward(u) (RFC §3.4/3.5).
 * - Layout: activations are [B, T, C] row-major; weights are stored as
 *   Hugging Face / PyTorch nn.Linear [out, in]; experts are [E, out, in]
 *   tensors per projection (w1, w2, w3 stacked per block).
 */
#ifndef HYPERSHARD_MODEL_H
#define HYPERSHARD_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "hypershard/base.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/tensor.h"

#define HS_FQN_MAX 128

typedef enum hs_param_kind {
    HS_PARAM_EMBEDDING = 0, /* [V, C]                         */
    HS_PARAM_NORM,          /* [C] RMSNorm weight (no decay)  */
    HS_PARAM_LINEAR,        /* [out, in] hidden matrix        */
    HS_PARAM_LM_HEAD,       /* [V, C]                         */
    HS_PARAM_ROUTER,        /* [E, C]                         */
    HS_PARAM_EXPERT,        /* [E, out, in] routed experts    */
    HS_PARAM_KIND_COUNT
} hs_param_kind;

const char *hs_param_kind_name(hs_param_kind k);

typedef struct hs_param {
    char fqn[HS_FQN_MAX];
    hs_param_kind kind;
    int ndim;
    int64_t shape[HS_TENSOR_MAX_DIMS]; /* logical global shape */
    /* Tensor-parallel source layout (set by parallel/ before FSDP wraps):
     * on_tp_mesh says the parameter lives on the "tp" mesh with placement
     * `tp`; local_shape / local_offset are this TP rank's torch.chunk slice
     * of the global tensor (the whole tensor when not on the tp mesh, or
     * Replicate). FSDP shards local_shape on dim 0. */
    bool on_tp_mesh;
    hs_placement tp;
    bool tp_grad_partial; /* each TP rank's gradient is a summand (sequence parallel) */
    /* Expert-parallel source layout: the routed experts of a block are
     * Shard(0) on the "ep" mesh (EP rank r holds experts [r*E/ep,
     * (r+1)*E/ep)); local_shape[0] / local_offset[0] are that slice. Such a
     * parameter is not on the tp mesh. */
    bool on_ep_mesh;
    int64_t local_shape[HS_TENSOR_MAX_DIMS];
    int64_t local_offset[HS_TENSOR_MAX_DIMS];
    int unit;   /* owning unit (0 = root) */
    void *data; /* unsharded compute view (local shape), compute_dtype */
    void *grad; /* unsharded gradient (local shape), grad_dtype */
    hs_dtype grad_dtype;
    float init_std; /* normal(0, init_std); norms are ones */
    /* train.freeze: backward computes no gradient for it (grad stays NULL;
     * the kernels skip the weight-gradient work) */
    bool frozen;
    /* grad_first_store (set by the model): the first write of every
     * backward covers the whole gradient (a dense linear's weight GEMM), so
     * the gradient's owner may hand out a buffer holding no value, with
     * grad_unset, instead of zeroing it; that first write then stores over
     * it (beta 0) and clears grad_unset. A buffer still unset when the
     * gradient is consumed is zeroed then (hs_param_grad_settle). */
    bool grad_first_store;
    bool grad_unset;
} hs_param;

/* The gradient's value where no write came (grad_unset): zeros. */
void hs_param_grad_settle(hs_device *d, hs_param *p);

typedef struct hs_unit_desc {
    char name[HS_FQN_MAX]; /* "" for the root, "model.layers.3", ... */
    int parent;            /* -1 for the root */
    bool is_expert;
} hs_unit_desc;

typedef struct hs_model_hooks {
    void *ctx;
    void (*pre_forward)(void *ctx, int unit);
    void (*post_forward)(void *ctx, int unit);
    void (*pre_backward)(void *ctx, int unit);
    void (*post_backward)(void *ctx, int unit);
    void (*post_backward_final)(void *ctx);
} hs_model_hooks;

/* The model-parallel seam (DESIGN.md §1): the calls a block makes at the
 * edges of its tensor-parallel regions, filled by parallel/ (tp_ops.c) over the
 * tp group. NULL ops: one device, today's path, nothing called. With ops,
 * q/k/v and gate/up are column-parallel (local heads / ffn columns),
 * o_proj and down_proj row-parallel, the embedding and lm_head split over
 * the vocabulary, as Megatron's ColumnParallelLinear / RowParallelLinear
 * and VocabParallelEmbedding.
 *
 * Rows: a region works on all N = B*T rows. Under sequence_parallel the
 * residual stream and the norms hold only this TP rank's contiguous
 * N / tp_size rows (rank r: rows [r*N/tp, (r+1)*N/tp)); otherwise every TP
 * rank holds all N rows. `numel` below counts the local rows' elements. */
typedef struct hs_model_ops {
    void *ctx;
    int tp_size, tp_rank;
    bool sequence_parallel;
    bool loss_parallel; /* vocab-sharded cross-entropy, logits never gathered */
    /* Sequence parallel only: entering a column-parallel region, the local
     * rows (compute dtype) are all-gathered into all N rows. */
    void (*sp_all_gather)(void *ctx, void *full, const void *local, int64_t numel, hs_dtype dt);
    /* Leaving a region with partial sums (fp32, all N rows): all-reduce in
     * place (local == full), or under sequence parallel reduce-scatter the
     * sums of this rank's rows into `local`. Used by the row-parallel exit
     * in forward and the column-parallel entry in backward. */
    void (*reduce_partial)(void *ctx, float *local, float *full, int64_t numel);
    /* Sequence parallel only: backward of the row-parallel exit, the local
     * rows' fp32 gradient all-gathered into all N rows. */
    void (*sp_all_gather_grad)(void *ctx, float *full, const float *local, int64_t numel);
    /* Vocab-parallel loss: elementwise MAX / SUM of n fp32 values over TP. */
    void (*all_reduce_max)(void *ctx, float *buf, int64_t n);
    void (*all_reduce_sum)(void *ctx, float *buf, int64_t n);
    /* loss_parallel off: every rank's [rows, V/tp] logits, out = tp blocks
     * in rank order (numel = rows * V/tp). */
    void (*gather_logits)(void *ctx, float *out, const float *in, int64_t numel);

    /* Context parallelism (cp_size > 1, over cp_ctx): each sequence of a
     * batch is this CP rank's chunks r and 2*cp-1-r of 2*cp equal chunks
     * along T (causal load balance; hs_cp_* below), so the model runs on
     * B x T/cp tokens at their global positions. Only attention crosses
     * CP ranks. allgather: K/V are all-gathered over cp for the local
     * queries, dK/dV reduce-scattered back; ring: K/V blocks travel the CP
     * ring one step at a time, dK/dV likewise. */
    void *cp_ctx;
    int cp_size, cp_rank;
    bool cp_ring;
    void (*cp_all_gather)(void *cp_ctx, void *out, const void *in, int64_t numel, hs_dtype dt);
    void (*cp_reduce_scatter)(void *cp_ctx, float *out, const float *in, int64_t numel);
    /* Ring step: start sending `send` to CP rank + 1 and receiving into
     * `recv` from CP rank - 1 (numel elements of dt each); the model
     * computes on the block in hand meanwhile and waits before it reads
     * `recv` or reuses `send`. */
    void *(*cp_ring_start)(void *cp_ctx, void *recv, const void *send, int64_t numel, hs_dtype dt);
    void (*cp_ring_wait)(void *cp_ctx, void *step);

    /* MoE load balancing over the global micro-batch (NULL: this rank's
     * tokens are the whole micro-batch): elementwise SUM of n fp32 values
     * over the ranks whose tokens together make one micro-batch (dp x cp;
     * TP ranks hold the same tokens and are not in it). */
    void *batch_ctx;
    void (*batch_all_reduce)(void *batch_ctx, float *buf, int64_t n);

    /* Expert parallelism (ep_size > 1, over ep_ctx): EP rank r computes the
     * routed experts [r*E/ep, (r+1)*E/ep) of every block. Each rank routes
     * its own tokens; the rows of each (token, slot) pair travel to their
     * expert's rank and the expert outputs back (dropless: every routed
     * row is computed), and the reverse in backward. */
    void *ep_ctx;
    int ep_size, ep_rank;
    /* Block r of `in` (per_rank fp32 values) goes to EP rank r; out block r
     * comes from rank r (the per-expert row counts). */
    void (*ep_all_to_all)(void *ep_ctx, float *out, const float *in, int64_t per_rank);
    /* in holds send_counts[r] elements for each rank r back to back; out
     * receives recv_counts[r] from each rank r likewise. */
    void (*ep_all_to_allv)(void *ep_ctx, void *out, const int64_t *recv_counts, const void *in,
                           const int64_t *send_counts, hs_dtype dt);
} hs_model_ops;

/* The CP sequence layout. Of 2*cp chunks of T/(2*cp) positions, CP rank r
 * holds chunk r then chunk 2*cp-1-r: local position t < T_local/2 is global
 * r*C + t, the others (2*cp-1-r)*C + t - C, with C = T_local / 2. */
int64_t hs_cp_global_position(int cp, int rank, int T_local, int t);
/* Rank `rank`'s local rows of a batch's token ids, [B, T_local] out of
 * [B, T] (T = cp * T_local); host memory, as hs_batch is. */
void hs_cp_take_local_ids(int32_t *local, const int32_t *whole, int cp, int rank, int B,
                          int T_local);
/* The whole [B, T, row] from every CP rank's local rows, blocks[r] being
 * rank r's [B, T_local, row] (what an all-gather over cp gives). */
void hs_cp_blocks_to_whole(hs_device *d, void *whole, const void *blocks, int cp, int B,
                           int T_local, int64_t row, size_t es);
/* The inverse: every rank's local rows of `whole`, in rank order. */
void hs_cp_whole_to_blocks(hs_device *d, void *blocks, const void *whole, int cp, int B,
                           int T_local, int64_t row, size_t es);

/* A pipeline rank's part of the model: chunks of consecutive blocks, chunk
 * k being blocks [first_layer[k], first_layer[k] + n_layers[k]), in model
 * order (one chunk per stage; several under interleaved schedules, each a
 * virtual stage). n_chunks 0: the whole model. */
#define HS_MODEL_MAX_CHUNKS 8
typedef struct hs_model_stage {
    int n_chunks;
    int first_layer[HS_MODEL_MAX_CHUNKS];
    int n_layers[HS_MODEL_MAX_CHUNKS];
} hs_model_stage;

typedef struct hs_model_options {
    hs_dtype compute_dtype; /* params and activations */
    hs_dtype grad_dtype;    /* unsharded gradients */
    int max_batch;          /* B: sequences per forward */
    int seq_len;            /* T */
    bool activation_checkpointing;
    bool allocate_params; /* single process: model owns data/grad */
    /* The device the model computes on: every kernel goes through its
     * table (dev->k) on its default stream, and the activations (and the
     * params if allocated) come from its device pool. NULL: a cpu device of
     * the model's own. Must outlive the model. */
    hs_device *dev;
    /* Unit boundaries (FSDP2 MixedPrecisionPolicy, docs/model.md "Unit
     * boundaries"). All zero: no cast anywhere, every activation in
     * compute_dtype. cast_unit_outputs: every unit's outputs are cast to
     * unit_output_dtype. keep_unit_inputs: a block computes from its input
     * in the dtype it arrives in (cast_forward_inputs: false, or no
     * param_dtype) instead of casting it to compute_dtype. */
    bool cast_unit_outputs;
    hs_dtype unit_output_dtype;
    bool keep_unit_inputs;
    /* Tensor parallelism (NULL: none). The model computes with its TP-local
     * heads, ffn columns and vocabulary rows; parallel/ sets each
     * parameter's placement to match (hs_model_check_tp_layout). Must
     * outlive the model. */
    const hs_model_ops *ops;
    /* Pipeline stage: the chunks of blocks this model holds. The chunk that
     * starts at block 0 holds the embedding, the one that ends at the last
     * block the final norm and lm_head; FQNs stay global
     * ("model.layers.<global index>...") and units are the stage's own:
     * unit 0 its root (whatever of embedding, norm, head it holds), then
     * its blocks in chunk order. */
    hs_model_stage stage;
    /* Activation sets per chunk, one per micro-batch whose forward has run
     * and whose backward has not yet (hs_model_stage_*); 0 means 1. */
    int act_slots;
    /* The registry only (FQNs, shapes, units, boundary dtypes): no buffer
     * and no parameter storage, so the model cannot run. A pipeline stage
     * keeps one of the whole model to name every parameter (export). */
    bool describe_only;
    /* The registry, and the activation and scratch buffers sized but not
     * allocated (hs_model_buffer_bytes): what a run of these options would
     * take from `pool`, for the memory plan. The model cannot run. */
    bool count_buffers;
    /* Threads attention splits its heads over (each with its own scratch:
     * hs_attention_forward); 0 means 1. */
    int threads;
} hs_model_options;

/* What one unit did at its boundaries in the last forward / backward. The
 * root's input is token ids (float_input false: nothing to cast); its
 * output is the logits. */
typedef struct hs_unit_boundary {
    bool float_input;
    hs_dtype input_stored;    /* dtype the unit's input tensor is held in */
    hs_dtype input_read;      /* dtype the unit computes from (after any input cast) */
    hs_dtype output_computed; /* dtype the unit produces its output in */
    hs_dtype output_stored;   /* dtype the output is handed on in (after any output cast) */
    int64_t forward_casts;    /* tensors cast at this unit's boundaries in forward */
    int64_t backward_casts;   /* gradients cast back through those casts */
} hs_unit_boundary;

typedef struct hs_model hs_model;

typedef struct hs_batch {
    const int32_t *tokens;  /* [B, T] */
    const int32_t *targets; /* [B, T]; < 0 ignored */
    int B, T;
} hs_batch;

hs_status hs_model_create(const hs_model_config *cfg, const hs_model_options *opt, hs_model **out,
                          hs_error *e);
void hs_model_free(hs_model *m);
const hs_model_config *hs_model_config_of(const hs_model *m);
/* The device the model computes on (its own cpu device when created
 * without one). */
hs_device *hs_model_device(const hs_model *m);
/* With count_buffers: the bytes the activation and scratch buffers would
 * take (the same calls as the allocation, nothing allocated); else 0. */
int64_t hs_model_buffer_bytes(const hs_model *m);

int hs_model_num_params(const hs_model *m);
hs_param *hs_model_param(hs_model *m, int i);
/* -1 if absent. */
int hs_model_find_param(const hs_model *m, const char *fqn);
int hs_model_num_units(const hs_model *m);
const hs_unit_desc *hs_model_unit(const hs_model *m, int u);
/* Boundary dtypes of unit u and the casts counted since creation. */
const hs_unit_boundary *hs_model_unit_boundary(const hs_model *m, int u);
int64_t hs_model_param_count(const hs_model *m); /* total elements */
/* MoE: the (token, slot) rows each routed expert of each layer received
 * from this rank's tokens in training forwards since the last reset,
 * [n_layers x num_experts], copied to host memory the model owns (valid
 * until the next call; NULL for a dense model). */
const int64_t *hs_model_expert_tokens(const hs_model *m, int *n_layers, int *n_experts);
void hs_model_expert_tokens_reset(hs_model *m);
/* Forward + backward FLOPs per token (for MFU): 6*N_active + attention. */
double hs_model_flops_per_token(const hs_model *m, int seq_len);

/* Deterministic init of rows [row_start, row_start+rows) of param p's
 * TP-local tensor (its whole logical tensor without TP) into dst (in dtype
 * dt): a value depends only on (seed, FQN, global element index), so a
 * shard equals the same slice of the full init. */
void hs_model_init_param_rows(const hs_model *m, const hs_param *p, uint64_t seed, void *dst,
                              hs_dtype dt, int64_t row_start, int64_t rows);
/* Fill every allocated param (allocate_params) from seed; zero grads. */
void hs_model_init_weights(hs_model *m, uint64_t seed);
/* Elements of p's TP-local tensor. */
int64_t hs_param_local_numel(const hs_param *p);
/* Elements of the whole (logical) tensor: the product of p->shape. */
int64_t hs_param_numel(const hs_param *p);
/* Give p placement `pl` on a tp mesh of `tp` ranks (this rank `rank`):
 * local_shape / local_offset become the torch.chunk slice. Replicate keeps
 * the whole tensor. Returns false if a Shard dim does not divide evenly. */
bool hs_param_place_tp(hs_param *p, hs_placement pl, int tp, int rank);
/* Put an expert parameter on an ep mesh of `ep` ranks (this rank `rank`):
 * Shard(0), local_shape[0] = E / ep, off the tp mesh. Returns false if ep
 * does not divide E. */
bool hs_param_place_ep(hs_param *p, int ep, int rank);
/* After parallel/ placed every parameter: each local shape must be the one
 * the model computes with for its ops (heads, ffn columns, vocabulary
 * rows split over tp, routed experts over ep). Errors name the FQN, both
 * shapes and the fix. */
hs_status hs_model_check_tp_layout(const hs_model *m, hs_error *e);
void hs_model_zero_grads(hs_model *m);
/* For the next backward: gradients whose first write stores over them
 * (grad_first_store) are left unset, the others zeroed. A reader after that
 * backward settles each one first (hs_param_grad_settle). */
void hs_model_unset_grads(hs_model *m);
/* Freeze parameter i (before any backward): it gets no gradient; a model
 * that allocated its gradient (allocate_params) releases it. */
void hs_model_freeze(hs_model *m, int i);

/* Forward + backward on one micro-batch. *loss_sum = sum of token
 * cross-entropy over valid targets (fp64); *aux_loss = the MoE aux term of
 * this micro-batch (0 for dense). Gradients of
 * (loss_sum + aux_loss * (valid tokens)) * grad_scale are accumulated. */
hs_status hs_model_forward_backward(hs_model *m, const hs_batch *b, float grad_scale,
                                    const hs_model_hooks *hooks, double *loss_sum, double *aux_loss,
                                    hs_error *e);
/* Forward only (eval). logits may be NULL; else [B, T, V] fp32. */
hs_status hs_model_forward(hs_model *m, const hs_batch *b, const hs_model_hooks *hooks,
                           double *loss_sum, float *logits, hs_error *e);

/* ------------------------------------------------------ pipeline stages
 *
 * A stage runs a chunk of its blocks on one micro-batch at a time, each in
 * the chunk's activation slot (hs_model_options.act_slots): forward of
 * (chunk, slot) leaves what its backward needs, so a schedule may run the
 * forwards of several micro-batches before their backwards (GPipe, 1F1B,
 * interleaved). The hook sequence of one (chunk, slot) is that of
 * hs_model_forward_backward restricted to the chunk's units (the root's
 * hooks only with the chunk that holds the root's parameters: the
 * embedding's, the head's, or chunk 0 of a stage with neither); forward
 * and backward of different slots and chunks interleave.
 *
 * Hand-over: a chunk without the embedding reads its input from
 * hs_model_stage_input (the residual stream entering its first block, this
 * rank's rows: hs_model_stage_numel elements of *dt), which the caller
 * fills before forward; a chunk without the head leaves its output in
 * hs_model_stage_output. In backward, a chunk without the head starts from
 * d output in hs_model_stage_grad (fp32, filled by the caller), and a chunk
 * without the embedding leaves d input there. */
bool hs_model_is_first_stage(const hs_model *m); /* holds the embedding */
bool hs_model_is_last_stage(const hs_model *m);  /* holds the norm and lm_head */
int hs_model_num_chunks(const hs_model *m);
/* Whether chunk k holds the embedding / the head. */
bool hs_model_chunk_has_embedding(const hs_model *m, int chunk);
bool hs_model_chunk_has_head(const hs_model *m, int chunk);
/* The model's index of this model's block `local` (chunk order). */
int hs_model_block_layer(const hs_model *m, int local);
int hs_model_num_slots(const hs_model *m); /* per chunk */
/* Elements of the hand-over tensor for batch b on this rank. */
int64_t hs_model_stage_numel(const hs_model *m, const hs_batch *b);
void *hs_model_stage_input(hs_model *m, int chunk, int slot, hs_dtype *dt);
const void *hs_model_stage_output(hs_model *m, int chunk, int slot, hs_dtype *dt);
float *hs_model_stage_grad(hs_model *m);
/* Forward of (chunk, slot). train: the backward follows (the head then
 * runs in backward; MoE: the head's chunk computes the aux term with
 * grad_scale, *aux_loss gets it); else the head's chunk computes the loss
 * sum and logits (either may be NULL) here, as hs_model_forward does. */
hs_status hs_model_stage_forward(hs_model *m, int chunk, int slot, const hs_batch *b,
                                 const hs_model_hooks *hooks, bool train, float grad_scale,
                                 double *loss_sum, float *logits, double *aux_loss, hs_error *e);
/* Backward of (chunk, slot) (its forward ran with train). On the head's
 * chunk *loss_sum gets the micro-batch's loss sum (else 0). */
hs_status hs_model_stage_backward(hs_model *m, int chunk, int slot, const hs_batch *b,
                                  float grad_scale, const hs_model_hooks *hooks, double *loss_sum,
                                  hs_error *e);
/* MoE: the load-balancing term pools the router statistics of every layer
 * of a micro-batch, so they travel with the hand-over (0 values for a dense
 * model). Forward: hs_model_stage_aux holds the earlier chunks' running
 * statistics (hs_model_stage_aux_numel fp32 values) before a training
 * forward of a chunk without the embedding, and the sum with this chunk's
 * after it on a chunk without the head. Backward: the head's chunk
 * computes the routers' aux gradient (hs_model_stage_aux_grad_numel values)
 * in its slot; the others receive it there before the slot's backward and
 * hand it on unchanged. */
int64_t hs_model_stage_aux_numel(const hs_model *m);
int64_t hs_model_stage_aux_grad_numel(const hs_model *m);
float *hs_model_stage_aux(hs_model *m);
float *hs_model_stage_aux_grad(hs_model *m, int chunk, int slot);

#endif
