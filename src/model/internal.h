/* model/internal.h — the hs_model struct and what its files share.
 *
 * Files: registry.c (parameters, units, FQNs, counts), init.c (weights),
 * model.c (create / free, buffers), boundary.c (the dtypes at unit
 * boundaries), block.c (one decoder block's forward and backward), step.c
 * (the whole forward / backward with its hooks), local.c (the
 * model-parallel seam for one device), decode.c (generation with a
 * per-layer KV cache).
 */
#ifndef HS_MODEL_INTERNAL_H
#define HS_MODEL_INTERNAL_H

#include <stdbool.h>

#include "hypershard/model.h"
#include "model/mla.h"
#include "model/moe_layer.h"

/* The parameters of one decoder block (pointers into hs_model.params). */
typedef struct hs_block_params {
    hs_param *ln1, *wq, *wk, *wv, *wo, *ln2;
    hs_param *q_norm, *k_norm; /* [HD] per-head RMSNorm (qwen3, else NULL) */
    /* multi-head latent attention (mla.c; wq is q_proj or q_b_proj, wk and
     * wv NULL): q_a_proj and q_a_layernorm (NULL without q_lora_rank),
     * kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj */
    hs_param *q_a, *q_a_norm, *kv_a, *kv_a_norm, *kv_b;
    hs_param *wg, *wu, *wd;              /* dense MLP (NULL for moe) */
    hs_param *router, *w1, *w2, *w3;     /* moe (NULL for llama) */
    hs_param *bias;                      /* e_score_correction_bias, or NULL */
    hs_param *sh_gate, *sh_up, *sh_down; /* optional shared expert */
    int unit;                            /* the block's unit */
    int expert_unit;                     /* its routed experts' unit, -1 dense */
} hs_block_params;

/* Whether the block has routed experts (else a dense MLP). */
static inline bool hs_block_moe(const hs_block_params *bp) { return bp->expert_unit >= 0; }

/* What one block's forward saves for its backward. Compute dtype unless
 * marked fp32. Shapes use the capacity B = max_batch, T = seq_len; a call
 * with smaller B, T uses the leading B*T rows.
 *
 * Under selective activation checkpointing the fields marked (R) point at
 * one set every block shares (hs_model.recomp): the outputs of element-wise
 * ops, which hs_block_recompute re-runs from the block's own fields before
 * its backward (moe_out the backward does not read); the rest, the GEMM and
 * attention outputs, are the block's own. */
typedef struct hs_block_acts {
    float *rstd1;     /* (R) [B,T] fp32 */
    void *ln1;        /* (R) [B,T,C] */
    void *q;          /* (R qwen3) [B,T,NH*HD] after RoPE */
    void *k;          /* (R qwen3) [B,T,KVH*HD] after RoPE */
    void *q_in;       /* [B,T,NH*HD] q_proj output, q_norm's input (qwen3, else NULL) */
    void *k_in;       /* [B,T,KVH*HD] k_proj output, k_norm's input (qwen3, else NULL) */
    float *rstd_q;    /* (R) [B,T,NH] fp32 (qwen3) */
    float *rstd_k;    /* (R) [B,T,KVH] fp32 (qwen3) */
    void *v;          /* [B,T,KVH*HD] */
    float *lse;       /* [B,NH,T] fp32 */
    void *atty;       /* [B,T,NH*HD] attention output before o_proj */
    void *x_cast;     /* (R) [B,T,C] the block input cast to the compute dtype; NULL
                    * when the block reads its input as it is stored */
    void *x_mid;      /* [B,T,C] residual after attention, in the block's
                    * residual dtype (hs_unit_boundary.output_computed) */
    float *rstd2;     /* (R) [B,T] fp32 */
    void *ln2;        /* (R) [B,T,C] */
    int64_t mlp_rows; /* the rows the MLP region ran on (hs_model_par.norm_enter) */
    void *gate;       /* [B,T,F] gate_proj output (dense) */
    void *up;         /* [B,T,F] up_proj output (dense) */
    void *h;          /* (R) [B,T,F] silu(gate) * up, down_proj's input (dense):
                    * kept, as autograd keeps it, unless checkpointing is selective */
    void *moe_out;    /* (R) [B,T,C] MoE layer output (moe) */
    hs_moe_act moe;
    void *moe_mem; /* the block hs_moe_act_bind lays moe out over */
    hs_mla_acts mla;
} hs_block_acts;

/* The split backward's record of a block's dense linears (model.h,
 * hs_model_stage_backward_input): per linear its output gradient, kept
 * in the slot in dy's dtype (hs_linear_dout) until the weight pass, and
 * the input its weight gradient multiplies it with: the slot's
 * activation, or where activation checkpointing recomputes it (every
 * input under full, ln1, ln2 and h under selective: the next block's
 * recompute overwrites them) a copy in the record. */
typedef enum hs_wgrad_kind {
    HS_WG_O = 0,
    HS_WG_Q,
    HS_WG_K,
    HS_WG_V,
    HS_WG_GATE,
    HS_WG_UP,
    HS_WG_DOWN,
    HS_WG_OPS
} hs_wgrad_kind;

/* The inputs the linears read: ln1 (q, k, v), atty (o), ln2 (gate, up),
 * h (down). */
typedef enum hs_wgrad_input {
    HS_WX_LN1 = 0,
    HS_WX_ATTY,
    HS_WX_LN2,
    HS_WX_H,
    HS_WX_INPUTS
} hs_wgrad_input;

typedef struct hs_wgrad_op {
    hs_param *w;   /* NULL: nothing pending */
    void *dy;      /* [rows, OC] in the model's wg_dt */
    const void *x; /* [rows, IC] in the compute dtype */
    int64_t rows;
    int IC, OC;
    int nseq; /* canonical sums: the sequences the rows hold (else 0) */
} hs_wgrad_op;

typedef struct hs_wgrad_block {
    hs_wgrad_op op[HS_WG_OPS];
    void *xcopy[HS_WX_INPUTS]; /* the recomputed inputs only, else NULL */
} hs_wgrad_block;

/* One micro-batch's activations of one chunk (hs_model_options.act_slots):
 * resid[j] is the input of the chunk's block j (resid[len] its output),
 * acts[j] what block j keeps for backward. The model's resid / acts /
 * rstdf / lnf / aux_g point at the slot in use. */
typedef struct hs_act_slot {
    int chunk, len; /* the chunk and its block count */
    void **resid;
    hs_block_acts *acts;
    float *rstdf;
    void *lnf;
    float *aux_g;       /* moe: [E] the router gradient of the aux term */
    float *seq_coef;    /* moe.seq_aux_loss_coef > 0: [len][max_batch][E] host,
                         * hs_moe_seq's coef of each block */
    hs_wgrad_block *wg; /* split backward: [len], else NULL */
} hs_act_slot;

/* A deliberate break of train.reproducibility: layout's one order, for the
 * test that shows the comparison catches it (HS_CANON_TEST_MUTATE). */
typedef enum hs_canon_mutation {
    HS_CANON_INTACT = 0,
    HS_CANON_SWAP_LEAVES,
    HS_CANON_WGRAD_K,
} hs_canon_mutation;

struct hs_model {
    hs_model_config cfg;
    hs_model_options opt;
    hs_device *own_dev; /* created when opt.dev is NULL */
    hs_device *dev;
    const hs_device_kernels *k; /* dev->k */
    hs_stream *s;               /* dev->stream */
    hs_dtype dt;
    /* NH, KVH, F, V are this rank's local counts, read off the placements
     * the seam gave (the global ones on one device); NHg, KVHg, Fg, Vg the
     * global ones the registry uses. */
    int C, NH, KVH, HD, F, V, L; /* F: dense ffn_dim; L: this stage's blocks */
    int rope_hd;                 /* the dims RoPE rotates: HD, or MLA's qk_rope_head_dim */
    hs_mla_shape mla;            /* mla.on: multi-head latent attention (mla.c) */
    hs_mla_bufs mla_bufs;
    /* pipeline chunks: chunk k is local blocks [chunk_begin[k], + chunk_len[k]),
     * model blocks from chunk_l0[k] on; layer_of[local] the model's index */
    int n_chunks, chunk_begin[HS_MODEL_MAX_CHUNKS], chunk_len[HS_MODEL_MAX_CHUNKS];
    int chunk_l0[HS_MODEL_MAX_CHUNKS];
    hs_dtype chunk_in_dt[HS_MODEL_MAX_CHUNKS]; /* the stream entering each chunk */
    int *layer_of;
    int cur_chunk;                /* the chunk of the slot in use */
    bool first_stage, last_stage; /* holds the embedding / the norm and lm_head */
    int NHg, KVHg, Fg, Vg;
    /* The model-parallel seam: opt.par, or local_par (one device, ctx
     * &dims); dims is what it was bound with. */
    const hs_model_par *par;
    hs_model_par local_par;
    hs_model_dims dims;
    bool bound;
    int cp;        /* ranks a sequence is split over (par->cp_size) */
    bool moe;      /* an MoE arch: the router statistics and aux loss */
    bool dense;    /* some block of this stage has a dense MLP (hs_block_moe) */
    int moe_head;  /* the stage's first MoE block, -1 none */
    int head_unit; /* the final norm's and head's unit: 0, or zbv's own (registry.c) */
    bool qk_norm;  /* each query and key head RMS-normalised before RoPE (qwen3) */
    hs_moe_shapes moe_shapes;

    hs_param *params;
    int n_params;
    hs_unit_desc *units;
    int n_units;
    hs_block_params *blocks;       /* [L] */
    hs_param *embed, *norm, *head; /* head == embed when tied */

    hs_unit_boundary *bnd; /* [n_units]: dtypes at each unit's boundaries */

    /* activations (capacity B = max_batch, T = seq_len) */
    void **resid;        /* chunk len+1 x [B,T,C]: input of the chunk's block j; resid[len]
                          * its output (the final norm's input on the head's chunk);
                          * resid[j] is in hs_model_chunk_stream_dtype(m, chunk, j) */
    void *out_tmp;       /* [B,T,C] a block's output before its output cast; NULL
                          * when no block casts its output */
    hs_block_acts *acts; /* L, or 1 shared set with full activation checkpointing */
    int n_acts;
    hs_block_acts recomp; /* selective checkpointing: the recomputed fields every
                           * block's set points at (hs_block_acts), else empty */
    hs_act_slot *slots;   /* n_chunks x n_slots; the fields above point at one */
    int n_slots;          /* per chunk */
    float *rstdf;         /* [B,T] fp32 */
    void *lnf;            /* [B,T,C] */
    float *logits;        /* [head_rows,V] fp32 chunk; becomes dlogits in place */
    /* [max_batch, seq_len] int32: the batch's tokens (first stage) and
     * targets (last stage), copied across from the caller's host arrays */
    int32_t *batch_tokens, *batch_targets;
    /* document masking: [max_batch, seq_len] the batch's document starts,
     * and what attention reads of them (NULL: plain causal), by global
     * position with row stride doc_ld */
    int32_t *batch_docs;
    const int32_t *doc_lo;
    int64_t doc_ld;
    int64_t head_rows;    /* rows of the head per chunk */
    float *cos_t, *sin_t; /* [T,HD/2] fp32 */

    /* backward scratch, fp32 unless marked */
    float *dres;         /* [B,T,C] gradient of the residual stream */
    float *dln;          /* [B,T,C] gradient of a norm output */
    float *dq;           /* [B,T,NH*HD] */
    float *dk, *dv;      /* [B,T,KVH*HD] */
    float *datt;         /* [B,T,NH*HD]; after attention's backward, the gradient of
                          * q_norm's and then k_norm's input (qwen3) */
    float *dg, *du, *dh; /* [B,T,F] */
    float *att_scratch;  /* hs_attention_scratch_floats(T, HD, att_threads) */
    float *att_delta;    /* [B,NH,T_local]: each query row's dO . O */
    double *norm_part;   /* hs_rmsnorm_backward_scratch(B*T, C): dw partial sums */
    int att_threads;     /* hs_model_options.threads, at least 1 */
    void *dout16;        /* [B,T,max(C,q,F) or head_rows,V] compute dtype: a linear's
                          * output gradient rounded once for its two GEMMs; NULL in
                          * fp32 or where the 16-bit GEMM is not native */

    const float *rope_cos, *rope_sin; /* the tables of this batch's positions */

    /* train.reproducibility: layout (hs_model_options.canonical_sums):
     * the micro-batch's sequences, and the trees' scratch (model/canonical.c) */
    int canon_nseq;
    double *canon_loss; /* [max_batch] each sequence's loss */
    float *canon_buf;
    int64_t canon_floats;
    float *canon_tied; /* tied embeddings: [canon_nseq][V*C] the head's parts */
    int64_t canon_tied_floats;
    hs_canon_mutation canon_mutate; /* read once at creation */

    /* split backward: the dtype output gradients are kept in, and the
     * record of the block whose input pass is running (NULL: the weight
     * gradients are computed at once) */
    hs_dtype wg_dt;
    hs_wgrad_block *wg_slot; /* the slot in use's records, [chunk len] */
    hs_wgrad_block *wg_cur;
    bool split; /* the input pass of a split backward is running */

    /* moe */
    void *moe_scratch; /* hs_moe_scratch_bytes */
    hs_moe_aux aux;
    float *aux_g;          /* [E] the slot in use's */
    float *aux_stage;      /* [2E + 2] pipeline stages: the running statistics handed on */
    float *aux_buf;        /* [2E + 2] the totals summed over a global micro-batch */
    int32_t *moe_offset_h; /* [E+1] host: a layer's grouped-row offsets, copied back */
    /* the sequence-wise balance loss (NULL / 0 without it): the slot in
     * use's coefficients, the blocks' shared host workspace, the global
     * batch's sequences and this forward's value */
    float *seq_coef;
    void *seq_host;
    void *canon_moe; /* layout mode: the MoE layers' hs_moe_wgrad.host */
    int seq_S;
    double seq_value;
    int64_t *expert_tokens;      /* [L x E] rows routed to each expert since the reset */
    int64_t *expert_tokens_host; /* [L x E] host memory: hs_model_expert_tokens' copy */
    int64_t counted_bytes;       /* count_buffers: what the buffers would take */
    /* The first allocation the model could not make while it was created
     * (hs_model_create returns it). */
    hs_error fail;
    bool failed;
};

/* registry.c */
hs_status hs_model_registry_build(hs_model *m, hs_error *e);
void hs_model_registry_free(hs_model *m);

/* layout.c: every parameter placed by the seam, the local counts read off
 * the placements and the regions checked. */
hs_status hs_model_layout_apply(hs_model *m, hs_error *e);

/* model.c */
/* What the current chunk's block j keeps (hs_model_use_slot). */
hs_block_acts *hs_model_acts_for(hs_model *m, int j);
/* Point resid / acts / rstdf / lnf / aux_g at (chunk, slot). */
void hs_model_use_slot(hs_model *m, int chunk, int slot);
/* Dtype of resid[j] of chunk k: its input for j = 0, else what the
 * chunk's block j-1 hands on. */
hs_dtype hs_model_chunk_stream_dtype(const hs_model *m, int chunk, int j);

/* boundary.c */
hs_status hs_model_boundary_plan(hs_model *m, hs_error *e);
/* The stream entering the model's block `layer` (the embedding output, in
 * the compute dtype, for layer 0). */
hs_dtype hs_model_stream_dtype_at(const hs_model *m, int layer);
/* Whether the root casts its output (the logits) to a 16-bit output_dtype. */
bool hs_model_root_casts(const hs_model *m);

/* block.c */
void hs_block_forward(hs_model *m, int layer, hs_block_acts *a, const void *x_in, void *x_out,
                      int B, int T, const hs_model_hooks *hooks, bool count_aux);
/* One block's rows of a KV cache (decode.c): k and v are [rows, KVH*HD]
 * in the compute dtype, k after RoPE; a cached forward's new rows start at
 * position pos. */
typedef struct hs_block_kv {
    void *k, *v;
    void *lat, *pe; /* latent attention's cache (mla.h hs_mla_cache), else NULL */
    int pos, rows;
} hs_block_kv;
/* Forward of T new rows of one sequence at positions [kv->pos, kv->pos +
 * T) (m->rope_cos / rope_sin the tables from position kv->pos on): their
 * keys and values stored into kv's rows there, attention over kv's rows
 * [0, kv->pos + T) through the seam's attention_cached. Nothing is kept
 * for a backward and no MoE statistics are counted. */
void hs_block_forward_cached(hs_model *m, int layer, hs_block_acts *a, const void *x_in,
                             void *x_out, int T, const hs_block_kv *kv,
                             const hs_model_hooks *hooks);
/* Selective activation checkpointing: the recomputed fields of a
 * (hs_block_acts "(R)") re-run from x_in and a's own fields, bit for bit
 * what the block's forward left there. */
void hs_block_recompute(hs_model *m, int layer, hs_block_acts *a, const void *x_in, int B, int T);
/* m->dres holds d(x_out) on entry and d(x_in) on return. */
void hs_block_backward(hs_model *m, int layer, hs_block_acts *a, const void *x_in, int B, int T,
                       const hs_model_hooks *hooks, const float *aux_g);
/* block_grad.c: a dense linear's backward from dy in ydt: dx [N, IC]
 * stored over or added to, and its weight gradient stored over while the
 * buffer holds no value yet (grad_unset), added to after. */
void hs_block_dense_backward_dy(hs_model *m, float *dx, bool overwrite_dx, hs_param *w,
                                const void *dy, hs_dtype ydt, const void *x, int64_t N, int IC,
                                int OC);
/* A linear's backward from the fp32 dout (rounded to the compute dtype
 * where the GEMMs multiply 16-bit operands), its weight gradient now,
 * never deferred to a split backward's weight pass: dx [N, IC] stored
 * over or added to. */
void hs_block_linear_backward(hs_model *m, float *dx, bool overwrite_dx, hs_param *w,
                              const float *dout, const void *x, int64_t N, int IC, int OC);
/* An RMSNorm's backward inside a block: dx += d(input), the weight's
 * gradient accumulated (a tree over sequences in layout mode). */
void hs_block_norm_backward(hs_model *m, float *dx, hs_param *w, const float *dout, const void *x,
                            hs_dtype xdt, const float *rstd, int64_t rows, int C);
/* The weight gradients block `layer`'s input pass left in wg (m->wg_cur
 * set during hs_block_backward), accumulated into the parameters'
 * gradients; wg is empty after. */
void hs_block_backward_weight(hs_model *m, hs_wgrad_block *wg);

/* step.c: whether the current chunk (hs_model_use_slot) calls the root's
 * hooks in its forward and backward. */
bool hs_model_root_chunk(const hs_model *m);
/* The root those hooks name: the head's own under zbv's V (registry.c),
 * else unit 0. */
int hs_model_root_unit(const hs_model *m);
/* The rows of the residual stream this rank holds of N. */
int64_t hs_model_local_rows(const hs_model *m, int64_t N);

/* hooks.c: hook calls that tolerate NULL hooks and NULL members. */
void hs_hook_pre_forward(const hs_model_hooks *h, int u);
void hs_hook_post_forward(const hs_model_hooks *h, int u);
void hs_hook_pre_backward(const hs_model_hooks *h, int u);
void hs_hook_post_backward(const hs_model_hooks *h, int u);
void hs_hook_post_backward_final(const hs_model_hooks *h);
void hs_hook_weight_grad_deferred(const hs_model_hooks *h, int u);
void hs_hook_post_weight_grad(const hs_model_hooks *h, int u);

/* model/canonical.c: token sums as pairwise trees over the micro-batch's
 * canon_nseq sequences (hs_model_options.canonical_sums). */
/* HS_CANON_TEST_MUTATE's value: unset none, "swap_leaves" (every tree of
 * 4 or more parts takes parts 1 and 2 in each other's place),
 * "wgrad_k" (each linear's weight-gradient part is two products over the
 * halves of its sequence, added); anything else is an error. */
hs_status hs_canon_mutation_from_env(hs_canon_mutation *out, hs_error *e);
/* Writes part s (sequence s's own sum) of a tree's len fp32 values over out. */
typedef void (*hs_canon_part_fn)(void *ctx, int s, float *out);
/* The trees' scratch at the model's capacity, allocated (or, counting,
 * counted) with the other buffers: log2(max_batch) + 2 slots of the
 * largest gradient a tree sums (*tree), and with tied embeddings each of
 * max_batch sequences' head part (*tied), in floats. */
void hs_canon_scratch_floats(const hs_model *m, int64_t *tree, int64_t *tied);
/* The tree of the canon_nseq parts, in the model's scratch. */
float *hs_canon_tree(hs_model *m, int64_t len, hs_canon_part_fn fn, void *ctx);
/* sum stored over w's gradient while unset, else added to it (NULL: none). */
void hs_canon_into_grad(hs_model *m, hs_param *w, const float *sum, int64_t len);
/* Tied embeddings: room for each sequence's head part, which the
 * embedding's tree adds to that sequence's own. */
float *hs_canon_tied_parts(hs_model *m, int64_t len);
/* The embedding's gradient from d(residual) of the micro-batch's N rows. */
void hs_canon_embedding_bwd(hs_model *m, const float *dres, const int32_t *tokens, int64_t N);
/* A dense linear's weight gradient dy^T x, each sequence's rows alone. */
void hs_canon_rows_wgrad(void *ctx, void *dw, hs_dtype gdt, const void *dy, hs_dtype ydt,
                         const void *x, hs_dtype xdt, const int64_t *first, int IC, int OC);
void hs_canon_linear_wgrad(hs_model *m, hs_param *w, const void *dy, hs_dtype ydt, const void *x,
                           int64_t N, int IC, int OC);
/* rmsnorm_bwd with the weight's gradient a tree over the sequences (rows:
 * every sequence's, in order; dx accumulates as the kernel's). */
void hs_canon_rmsnorm_bwd(hs_model *m, float *dx, hs_param *w, const float *dout, const void *x,
                          hs_dtype xdt, const float *rstd, int64_t rows, int C);

#endif
