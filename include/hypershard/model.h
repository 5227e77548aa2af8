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
    HS_PARAM_BIAS,          /* [E] router correction bias: no
                             * gradient (frozen), zeros at init,
                             * moved by the trainer (moe_bias.c) */
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
    /* Set by the model: one weight acts on every attention head alike
     * (qwen3's q_norm, k_norm; latent attention's down-projections and
     * latent norms), so a TP rank holding some of the heads computes a
     * summand of its gradient even without sequence parallel. */
    bool per_head;
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
    /* data is memory the caller lent (hs_model_borrow_param), not freed
     * with the model */
    bool borrowed;
} hs_param;

/* The gradient's value where no write came (grad_unset): zeros. */
void hs_param_grad_settle(hs_device *d, hs_param *p);

typedef struct hs_unit_desc {
    char name[HS_FQN_MAX]; /* "" for the root, "model.layers.3", ... */
    int parent;            /* -1 for a root */
    bool is_expert;
    /* A chunk's root: unit 0 (the embedding, the final norm and the head
     * of a stage that holds them), and on a stage that holds the
     * embedding and the head in two chunks (zbv's V) also the head's own
     * root, "lm_head" (the final norm and the head), so that each chunk's
     * backward reduces its own root once a micro-batch. A root's hooks
     * bracket its chunk's forward and backward (hs_model_root_chunk). */
    bool root;
    /* The stage's local chunk whose forward and backward run the unit (a
     * block's chunk; a root's, the chunk that calls its hooks; -1 for a
     * root both of zbv's chunks call, the tied embedding's). A unit
     * prefetches within its chunk only; the pipeline names the next chunk
     * (hs_model_hooks.prefetch_chunk). */
    int chunk;
} hs_unit_desc;

typedef struct hs_model_hooks {
    void *ctx;
    void (*pre_forward)(void *ctx, int unit);
    void (*post_forward)(void *ctx, int unit);
    void (*pre_backward)(void *ctx, int unit);
    void (*post_backward)(void *ctx, int unit);
    void (*post_backward_final)(void *ctx);
    /* Split backward (hs_model_stage_backward_input): called just before
     * post_backward(unit) when some of the unit's weight gradients are not
     * yet computed; they follow in the weight pass
     * (hs_model_stage_backward_weight), which ends with
     * post_weight_grad(unit), once per deferred backward, in the same
     * micro-batch order. The gradient of a unit is whole after its last
     * post_weight_grad, not after post_backward. */
    void (*weight_grad_deferred)(void *ctx, int unit);
    void (*post_weight_grad)(void *ctx, int unit);
    /* Called by a pipeline stage before each action: the action after it
     * runs local chunk `chunk`'s forward (or its backward; chunk -1: none
     * runs). The last units of this action prefetch that chunk's first
     * ones in place of their own chunk's (FSDP: as far as the prefetch
     * depth reaches, hs_unit_desc.chunk). The schedule knows which chunk
     * comes next; the units do not. */
    void (*next_chunk)(void *ctx, int chunk, bool backward);
} hs_model_hooks;

/* ------------------------------------------------------ MoE experts
 *
 * The routed experts' weights, their gradients and rows grouped by expert,
 * with the math of the experts a rank holds: what the MoE layer runs on one
 * device and what the expert-parallel seam runs on the rows it received. */
typedef struct hs_moe_weights {
    const void *gate;    /* [E, C]    */
    const void *w1;      /* [EL, F, C] this rank's experts */
    const void *w3;      /* [EL, F, C] this rank's experts */
    const void *w2;      /* [EL, C, F] */
    const void *sh_gate; /* [FS, C]  NULL when FS == 0 */
    const void *sh_up;   /* [FS, C]  */
    const void *sh_down; /* [C, FS]  */
    const void *bias;    /* [E] e_score_correction_bias, NULL when none */
} hs_moe_weights;

/* train.reproducibility: layout: the layer's weight gradients summed one
 * sequence at a time and added as the model's tree over the sequences
 * (docs/numerics.md). fn: dw (gdt) += the tree of dy[rows of s]^T
 * x[rows of s] over the nseq sequences s, sequence s holding rows
 * [first[s], first[s + 1]) of dy [rows, OC] and x [rows, IC] (none: a zero
 * part). A forward's BT rows are nseq sequences of BT / nseq rows. */
typedef struct hs_moe_wgrad {
    void *ctx;
    int nseq;
    void *host; /* the layer's host scratch (hs_moe_wgrad_host_bytes) */
    void (*fn)(void *ctx, void *dw, hs_dtype gdt, const void *dy, hs_dtype ydt, const void *x,
               hs_dtype xdt, const int64_t *first, int IC, int OC);
} hs_moe_wgrad;

/* Same shapes as hs_moe_weights, in dtype `dt`. A NULL pointer skips that
 * gradient (e.g. a frozen parameter). wgrad: NULL, or how every weight
 * gradient is summed (layout mode). */
typedef struct hs_moe_grads {
    void *gate, *w1, *w3, *w2, *sh_gate, *sh_up, *sh_down;
    hs_dtype dt;
    const hs_moe_wgrad *wgrad;
} hs_moe_grads;

/* Rows grouped by expert for n experts of a weight set: expert e owns rows
 * [offset[e], offset[e+1]) of x, h1, h3 and y. seq_first: with the
 * gradients' wgrad, where each sequence's rows of expert e start, counted
 * from offset[e] (nseq + 1 entries from (nseq + 1) * e), else NULL. */
typedef struct hs_moe_rows {
    hs_device *dev;
    int n;
    const int32_t *offset;
    const void *x;
    void *h1, *h3, *y;
    const int64_t *seq_first;
} hs_moe_rows;

/* Each expert's SwiGLU over its rows (y in dt); a is dt scratch of
 * offset[n] * F elements. */
void hs_moe_experts_forward(const hs_moe_rows *r, const hs_moe_weights *w, void *a, hs_dtype dt,
                            int C, int F);
/* dy [offset[n], C] fp32 (d loss / d y) becomes d loss / d x in place;
 * expert weight gradients accumulate. a (dt), dh1, dh3 (fp32): offset[n]
 * * F elements of scratch. */
void hs_moe_experts_backward(const hs_moe_rows *r, float *dy, const hs_moe_grads *gr,
                             const hs_moe_weights *w, void *a, float *dh1, float *dh3, hs_dtype dt,
                             int C, int F);

/* One MoE layer's routed rows at the expert-parallel seam. Forward: xg
 * [R, C] (dt) holds this rank's (token, slot) rows sorted by global expert
 * and count [E] (device, int64) how many go to each expert; y [R, C] (dt)
 * receives the experts' outputs in the same order. Backward: dyg [R, C]
 * fp32 d loss / d y becomes d loss / d xg, and the weight gradients of
 * this rank's experts accumulate into gr. `state` is what the seam keeps of
 * the layer's forward for its backward (hs_model_par.moe_state_new). */
typedef struct hs_moe_exchange {
    hs_dtype dt;
    int E, C, F;
    const int64_t *count;
    const void *xg;
    void *y;
    float *dyg;
    const hs_moe_weights *w;
    const hs_moe_grads *gr;
    void *state;
} hs_moe_exchange;

/* What a seam sizes its buffers by and computes with (hs_model_par.bind):
 * the model's device, compute dtype and this rank's counts. */
typedef struct hs_model_dims {
    hs_device *dev;
    hs_dtype dt;
    int max_batch, seq_len; /* capacity; seq_len is the whole sequence */
    int C, HD, NH, KVH, V;  /* NH, KVH, V: this rank's heads and vocabulary rows */
    int Vg;                 /* the whole vocabulary */
    int64_t rows;           /* this rank's rows at capacity: max_batch * seq_len / cp */
    int64_t head_rows;      /* rows of the head per chunk */
    float norm_eps;
    const float *cos_t, *sin_t; /* the model's RoPE tables, [seq_len, rope_hd/2] fp32 */
    int rope_hd;                /* the dims RoPE rotates: HD, or latent attention's rope dims */
    int E, K, F_expert;         /* MoE: routed experts, top_k, expert_ffn_dim (0: dense) */
    int64_t moe_rows;           /* MoE: the (token, slot) rows of a layer at capacity */
    bool count_only;            /* the model only counts (the plan): size, do not run */
} hs_model_dims;

/* The model's allocator, which the seam's buffers come from, so the plan
 * counts them with the model's (hs_model_buffer_bytes): n elements of dt,
 * zeroed; NULL when the model only counts. */
typedef void *(*hs_model_alloc_fn)(void *actx, int64_t n, hs_dtype dt);

/* One attention call's tensors: this rank's B x T query rows (T local
 * positions per sequence, at the global positions the seam's layout
 * gives), its heads, the saved q/k/v after RoPE; forward writes out and
 * lse; backward reads dout and accumulates into dq, dk, dv (zeroed by the
 * model), with the model's attention workspace. */
typedef struct hs_attn_io {
    int B, T, NH, KVH, HD;
    hs_dtype dt;
    const void *q, *k, *v;
    void *out;  /* [B,T,NH*HD] dt */
    float *lse; /* [B,NH,T] */
    const float *dout;
    float *dq, *dk, *dv;
    float *scratch; /* hs_attention_scratch_floats(seq_len, HD, threads) */
    int threads;
    float *delta; /* [B,NH,T] */
    void *dout16; /* where dout may be rounded to dt once, or NULL */
    /* Document masking: [B, doc_ld] the global position where the document
     * of each position starts (hs_batch.doc_start on the device); NULL:
     * plain causal. doc_ld is the whole sequence's length (T x cp). */
    const int32_t *doc_lo;
    int64_t doc_ld;
} hs_attn_io;

/* The model-parallel seam (DESIGN.md §1): the layer-level calls the model
 * makes wherever a layer may be split over ranks — a norm entering a
 * region, a row-parallel linear leaving it, the vocabulary ends, attention,
 * the MoE statistics — and the layout they compute with. The model keeps
 * the one-device math and fills this table with it when created without
 * one (hs_model_options.par NULL); parallel/ fills it for TP, CP and EP
 * (hs_parallel) and owns those implementations and their buffers. Every
 * call goes through the table: the model has no branch on a parallel
 * dimension.
 *
 * Rows: a region works on all N = B*T rows. Under sequence parallelism the
 * residual stream and the norms hold only this rank's contiguous N /
 * row_split rows (row_rank's); otherwise every rank holds all N rows. */
typedef struct hs_model_par {
    void *ctx;
    /* The layout, decided by parallel/: placements (place), the row split
     * of the residual stream, the CP ranks of a sequence and the EP ranks
     * of the experts. */
    int row_split, row_rank; /* 1, 0 without sequence parallelism */
    int cp_size;             /* ranks a sequence is split over */
    int ep_size, ep_rank;    /* the experts: EP rank r computes [r*E/ep, (r+1)*E/ep) */
    /* Give parameter p (registered with its global shape) its placement
     * and local shape (hs_param_place_*); called once per parameter as the
     * model registers it. The model then computes with the local shapes it
     * finds: heads from q/k/v_proj, ffn columns from gate_proj, vocabulary
     * rows from the embedding. false with e set: a placement the layout
     * cannot give (it names the FQN). */
    bool (*place)(void *ctx, hs_param *p, hs_error *e);
    /* The seam's buffers, once, from the model's allocator; unbind frees
     * them. HS_ERR_OOM in e: host memory it could not get (device memory
     * the allocator refused is the model's to report). */
    hs_status (*bind)(void *ctx, const hs_model_dims *d, hs_model_alloc_fn alloc, void *actx,
                      hs_error *e);
    void (*unbind)(void *ctx);
    /* Layers are told their style by their parameter's placement (a
     * region's first linear, a row-parallel linear, the embedding, the
     * head), as Megatron's Column/RowParallelLinear are by their class.
     *
     * norm_enter: rmsnorm of this rank's rows of x (xdt) into `full`, the
     * input of the region whose first linear is `first`; rstd of the local
     * rows. Returns the rows the region computes on: all N (gathered under
     * sequence parallelism) when `first` is split over its output
     * features, else this rank's rows (a replicated region is token-wise:
     * it runs on the rows the rank holds). */
    int64_t (*norm_enter)(void *ctx, void *full, float *rstd, const void *x, hs_dtype xdt,
                          const void *w, const hs_param *first, int64_t N);
    /* The region's last linear and the residual: out (odt, local rows) =
     * resid (rdt) + x @ w^T, x [rows, IC] (the region's rows); a
     * row-parallel w (split over its input features) gives partial sums,
     * reduced over the ranks. */
    void (*rowwise_add)(void *ctx, void *out, hs_dtype odt, const void *resid, hs_dtype rdt,
                        const void *x, const hs_param *w, int64_t N, int IC, int OC);
    /* Backward of rowwise_add's exit: the gradient of the region's rows
     * from the local rows' dres (dres itself when they are the same). */
    const float *(*exit_grad)(void *ctx, const float *dres, const hs_param *w, int64_t N);
    /* Backward of norm_enter: dfull (the region's rows; partial sums when
     * split) reduced to the local rows' gradient (dfull itself when nothing
     * is to reduce). */
    const float *(*enter_grad)(void *ctx, float *dfull, const hs_param *first, int64_t N);
    /* The embedding of N tokens into out (local rows, dt) and its
     * backward from the local rows' gradient into w->grad. */
    void (*embedding_fwd)(void *ctx, void *out, const int32_t *tokens, const hs_param *w,
                          int64_t N);
    void (*embedding_bwd)(void *ctx, const float *dres, const int32_t *tokens, hs_param *w,
                          int64_t N);
    /* The head on `rows` rows of lnf (dt) into logits (fp32 [rows, this
     * rank's vocabulary], rounded to round_dt when that is 16-bit) and
     * their cross-entropy against targets (NULL: no loss, 0 returned) with
     * `scale`; with grad, logits becomes d loss / d logits in place. `full`
     * (NULL or host memory) gets the whole [rows, Vg] logits. */
    double (*head_chunk)(void *ctx, float *logits, const void *lnf, const hs_param *w,
                         const int32_t *targets, int64_t rows, float scale, bool grad, float *full,
                         hs_dtype round_dt);
    /* The RoPE tables of this rank's T_local positions of a sequence. */
    void (*rope_tables)(void *ctx, int T_local, const float **cos, const float **sin);
    void (*attention_fwd)(void *ctx, const hs_attn_io *io);
    void (*attention_bwd)(void *ctx, const hs_attn_io *io);
    /* MoE load balancing: SUM of n fp32 router statistics over the ranks
     * whose tokens make one micro-batch (and the row split); NULL: this
     * rank's tokens are the whole micro-batch. */
    void (*stats_sum)(void *ctx, float *buf, int64_t n);
    /* Per-sequence statistics: SUM of n fp32 values over the ranks that
     * hold rows of the same sequences (CP, and the row split); NULL: this
     * rank holds its sequences whole. */
    void (*seq_sum)(void *ctx, float *buf, int64_t n);
    /* Expert parallelism (ep_size > 1): the routed experts of a MoE layer
     * across ranks — dispatch of the grouped rows to their experts' ranks,
     * the local experts, combine back (dropless). moe_state_new makes what
     * one activation set keeps between a forward and its backward (from
     * the model's allocator; under count_only it counts the rows a
     * balanced routing brings). */
    void *(*moe_state_new)(void *ctx, hs_model_alloc_fn alloc, void *actx);
    void (*moe_state_free)(void *ctx, void *state);
    void (*moe_experts_fwd)(void *ctx, const hs_moe_exchange *x);
    void (*moe_experts_bwd)(void *ctx, const hs_moe_exchange *x);
    /* Generation with a KV cache (hs_model_forward_cached): io's B = 1
     * sequence of T new query rows at positions [pos, pos + T) against
     * io->k / io->v, this rank's heads' cache of cache_rows rows ([rows,
     * KVH*HD]), whose rows [0, pos + T) hold the keys (after RoPE) and
     * values of those positions; writes out and lse. NULL: the layout has
     * no cached decode (context parallelism: a sequence's rows are split
     * over ranks), and generation runs the full forward. */
    void (*attention_cached)(void *ctx, const hs_attn_io *io, int pos, int cache_rows);
} hs_model_par;

/* The one-device table: every layer whole, all rows. Its functions take an
 * hs_model_dims as ctx (the model gives its own); parallel/ calls them for
 * what its plan leaves whole. place, bind and unbind do nothing. */
const hs_model_par *hs_model_one_device_par(void);

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
    /* HS_AC_FULL: one activation set shared by every block, the block
     * forward re-run before its backward; HS_AC_SELECTIVE: each block keeps
     * its GEMM and attention outputs, and one set shared by every block
     * holds what its element-wise ops produce, re-run before its backward
     * (docs/model.md "Activation checkpointing"). */
    hs_ac_mode activation_checkpointing;
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
    /* The model-parallel seam (NULL: one device, the model's own). Must
     * outlive the model. */
    const hs_model_par *par;
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
    /* Zero-bubble pipelines: every slot also keeps what its blocks' dense
     * linears need for their weight gradients (each one's output gradient,
     * and its input under activation checkpointing), so a backward can
     * leave them to a later weight pass (hs_model_stage_backward_input /
     * _weight). */
    bool split_backward;
    /* Batches may carry document starts (hs_batch.doc_start): a device copy
     * of them is kept beside the tokens. */
    bool document_masking;
    /* The registry only (FQNs, shapes, units, boundary dtypes): no buffer
     * and no parameter storage, so the model cannot run. A pipeline stage
     * keeps one of the whole model to name every parameter (export). */
    bool describe_only;
    /* The registry, and the activation and scratch buffers sized but not
     * allocated (hs_model_buffer_bytes): what a run of these options would
     * take from `pool`, for the memory plan. The model cannot run. */
    bool count_buffers;
    /* Every parameter is set from a file before its first use (train
     * --init-from, a resumed checkpoint, generate and eval): the
     * initialisers draw no random init that would be overwritten:
     * hs_model_init_param_rows fills zeros (an FSDP shard's padding stays
     * defined), and the model's own parameters are neither zeroed when
     * allocated nor by hs_model_init_weights, the load writing every
     * element of each. */
    bool weights_from_file;
    /* No backward will run (generate, eval): no gradient buffers; every
     * hs_param's grad stays NULL. */
    bool no_grad;
    /* Threads attention splits its heads over (each with its own scratch:
     * hs_attention_forward); 0 means 1. */
    int threads;
    /* train.reproducibility: layout. Every sum over a micro-batch's tokens
     * (weight gradients, the norms' weight gradients, the embedding's
     * gradient, the loss) is a pairwise tree over its sequences, each
     * sequence's part computed alone (docs/numerics.md "Layout-invariant
     * training"). */
    bool canonical_sums;
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
    /* Document masking (data.document_masking): [B, T x cp] the global
     * position where each position's document starts, so attention is
     * causal inside each document of a packed sequence (hs_doc_starts);
     * NULL: causal over the whole sequence. Whole sequences, also under
     * context parallelism, where tokens and targets are the rank's rows. */
    const int32_t *doc_start;
    /* Sequences of the global batch this micro-batch belongs to (the
     * sequence-wise balance loss is their mean); 0: B. */
    int global_sequences;
} hs_batch;

/* The document starts of n sequences of T tokens packed with `eos` ending
 * each document: start[t] is the position after the last eos before t (0
 * for none), so an eos belongs to the document it ends. */
void hs_doc_starts(int32_t *start, const int32_t *tokens, int n, int T, int32_t eos);

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
/* Parameter i reads its values where `data` holds them (fp32, the whole
 * tensor, HS_ALIGN-aligned host memory the caller keeps, unchanged by
 * anyone else, until the model is freed) and its own buffer is released:
 * a run that only reads its weights (generate, eval) takes them where a
 * weights file maps them instead of copying them. false, nothing changed,
 * where it cannot: a device whose kernels take device memory only (cuda;
 * cpu under HS_DEVICE_GUARD),
 * a compute dtype other than fp32, a parameter the model does not hold
 * whole or did not allocate. */
bool hs_model_borrow_param(hs_model *m, int i, const float *data);
/* RoPE's HD/2 inverse frequencies for c (model.rope_theta, stretched by
 * model.rope_scaling as transformers stretches them) into inv, and the
 * factor cos and sin take into *scale (YaRN's attention factor; else 1). */
void hs_model_rope_freqs(const hs_model_config *c, int HD, float *inv, float *scale);
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
/* Zero-bubble schedules split a backward in two (Qi et al. 2024): the
 * input pass ("B") is hs_model_stage_backward but for the weight
 * gradients of the blocks' dense linears (q, k, v, o, gate, up, down),
 * whose output gradients it keeps in the slot; the weight pass ("W") of
 * the same (chunk, slot) computes them later, before the slot's next
 * forward. Norm, embedding, head and MoE expert gradients stay in the
 * input pass (they are small, or their inputs are not kept). The weight
 * pass ends with post_backward_final, as a backward does. Needs
 * hs_model_options.split_backward. The sum of both passes is the same
 * arithmetic as hs_model_stage_backward. */
hs_status hs_model_stage_backward_input(hs_model *m, int chunk, int slot, const hs_batch *b,
                                        float grad_scale, const hs_model_hooks *hooks,
                                        double *loss_sum, hs_error *e);
void hs_model_stage_backward_weight(hs_model *m, int chunk, int slot, const hs_model_hooks *hooks);
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

/* ------------------------------------------------------ generation
 *
 * A per-layer KV cache for generation (decode.c): each of this rank's
 * blocks keeps the keys (after RoPE) and values of the positions of one
 * sequence it has run, for its heads (this rank's under TP), so each new
 * token runs one row through the model instead of the whole window. The
 * cache's memory is the device pool's (hs_device_alloc), counted as the
 * model's buffers are; only generation creates one. */
typedef struct hs_kv_cache hs_kv_cache;

/* Whether this model's layout decodes with a cache: the seam has
 * attention_cached, the residual stream is not split over ranks
 * (sequence parallelism: one row does not split) and the experts are not
 * (expert parallelism). false with the reason in why (cap bytes). */
bool hs_model_kv_supported(const hs_model *m, char *why, size_t cap);
/* Bytes of a cache for this rank's blocks: blocks x 2 x seq_len x this
 * rank's kv heads x head_dim x the compute dtype's size; under latent
 * attention blocks x seq_len x (kv_lora_rank + qk_rope_head_dim) values,
 * plus one block's keys and values expanded (2 x seq_len x heads x
 * head_dim). Per position: what each position adds (the first term over
 * seq_len). */
int64_t hs_kv_cache_bytes(const hs_model *m);
int64_t hs_kv_cache_position_bytes(const hs_model *m);
/* An empty cache of seq_len positions for m's blocks; HS_ERR_OOM naming
 * the bytes when the device pool will not give them, HS_ERR_CONFIG when
 * the layout has none (hs_model_kv_supported's reason). */
hs_status hs_kv_cache_create(hs_model *m, hs_kv_cache **out, hs_error *e);
void hs_kv_cache_free(hs_kv_cache *c);
/* Positions the cache holds; reset empties it (the next forward starts at
 * position 0). */
int hs_kv_cache_len(const hs_kv_cache *c);
void hs_kv_cache_reset(hs_kv_cache *c);
/* Forward of chunk `chunk` on n new tokens of one sequence at positions
 * [len, len + n) of the cache c (created for this model), which then
 * holds len + n: each block stores their keys and values and attends over
 * the cache. A prompt's prefill is one call of its tokens, a decode step
 * one call of one token. The hand-over is that of hs_model_stage_forward
 * in slot 0 (hs_model_stage_input / _output, n rows); the head's chunk
 * writes the last row's logits (fp32 [vocab], NULL: none). Hooks as in
 * hs_model_stage_forward. The logits equal those of the full forward's
 * row len + n - 1 to fp32 rounding. */
hs_status hs_model_stage_forward_cached(hs_model *m, int chunk, hs_kv_cache *c,
                                        const int32_t *tokens, int n, const hs_model_hooks *hooks,
                                        float *logits, hs_error *e);
/* The whole model (one stage, one chunk): hs_model_stage_forward_cached
 * of chunk 0. */
hs_status hs_model_forward_cached(hs_model *m, hs_kv_cache *c, const int32_t *tokens, int n,
                                  const hs_model_hooks *hooks, float *logits, hs_error *e);

#endif
