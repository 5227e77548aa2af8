/* hypershard/config.h — the YAML contract (spec 004 §2, §4, §5.1).
 *
 * Contract of this layer:
 * - One schema table (src/config/schema.c) drives loading, defaults, type
 *   checks, overrides, the resolved dump and the docs: path, type, default,
 *   allowed values, one doc line. Nothing else lists the keys.
 * - Parsing uses libyaml. YAML syntax errors give file:line:column. Unknown
 *   keys fail with the nearest valid key; removed keys fail naming what
 *   replaced them. Overrides `a.b.c=value` are typed by the schema and beat
 *   the file; the last override of a path wins.
 * - Validation reports every violated rule of a file together, each naming
 *   the config path(s), the values and the fix. Exit code 2.
 * - Nullable dtypes are HS_MP_NULL (-1) or an hs_dtype value; the tri-state
 *   comm_fusion_zero_copy is -1 (null), 0 or 1.
 */
#ifndef HYPERSHARD_CONFIG_H
#define HYPERSHARD_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "hypershard/base.h"
#include "hypershard/mesh.h"
#include "hypershard/tensor.h"

#define HS_MP_NULL (-1)
#define HS_PATH_MAX 1024
#define HS_NAME_MAX 64
#define HS_PP_MAX_STAGES 256 /* pp_size x pp_virtual_stages */
#define HS_PP_MAX_VIRTUAL 8  /* pp_virtual_stages */
/* Actions of one stage's schedule, passes x micro-batches x virtual stages: the
 * stage holds them all and the plan replays them. */
#define HS_PP_MAX_ACTIONS (1 << 20)
/* model.n_layers: the plan replays a step unit by unit. */
#define HS_MODEL_MAX_LAYERS (1 << 20)
#define HS_MOE_MAX_MLP_ONLY 256 /* model.moe.mlp_only_layers entries */

typedef struct hs_moe_config {
    int num_experts;
    int top_k;
    int expert_ffn_dim;
    int shared_expert_ffn_dim; /* 0: no shared expert */
    double aux_loss_coef;
    /* renormalise the top-k routing weights to sum to 1 (Mixtral, and
     * Qwen3-MoE's norm_topk_prob); false: the softmax probabilities as
     * they are */
    bool norm_topk_prob;
    /* Qwen3-MoE's dense layers (Hugging Face's rule): block i has experts
     * when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step
     * is 0, else a dense MLP of model.ffn_dim (hs_model_layer_moe) */
    int mlp_only_layers[HS_MOE_MAX_MLP_ONLY];
    int n_mlp_only_layers;
    int decoder_sparse_step;
    /* DeepSeekMoE's router (hs_model_moe_scored): sigmoid scores instead of
     * the softmax; experts in n_group groups of which each token keeps the
     * topk_group best (a group scores the sum of its two best); the chosen
     * weights times routed_scaling_factor; and the aux-loss-free balancing
     * bias (e_score_correction_bias, hs_model_moe_bias) that steers the
     * choice only, moved after each step by bias_update_speed toward the
     * mean of the global loads */
    char score_func[HS_NAME_MAX]; /* "softmax" | "sigmoid" */
    int n_group, topk_group;
    double routed_scaling_factor;
    double bias_update_speed;
    /* DeepSeek-V3's complementary sequence-wise balance loss, alpha: per
     * block and sequence, sum over experts of f_e P_e (f_e = E / (K T)
     * times the sequence's choices of e, P_e = the mean over its T tokens
     * of the scores normalised to sum 1), averaged over the global batch's
     * sequences and summed over blocks; 0: none */
    double seq_aux_loss_coef;
    /* DeepSeek-V3's dense blocks: blocks 0 .. first_k_dense_replace - 1
     * have a dense MLP of model.ffn_dim (arch deepseek_v3) */
    int first_k_dense_replace;
} hs_moe_config;

/* Multi-head latent attention (arch deepseek_v3, Hugging Face's
 * DeepseekV3Attention): q = q_b_proj(q_a_layernorm(q_a_proj(x))) (or
 * q_proj(x) when q_lora_rank is 0), kv_a_proj_with_mqa(x) = [latent |
 * k_rope], k_nope and v from kv_b_proj(kv_a_layernorm(latent)); each
 * head's query and key are [nope | rope] with RoPE on the rope dims only
 * (the rope key shared by the heads), the value v_head_dim wide. */
typedef struct hs_mla_config {
    int q_lora_rank; /* 0: q_proj without compression */
    int kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* Hugging Face checkpoints rotate (x0, x1), (x2, x3), ... pairs: their
     * rope rows are reordered to rotate_half's halves on import, back on
     * export */
    bool rope_interleave;
} hs_mla_config;

/* RoPE's frequencies stretched for a context longer than the one a model
 * was pretrained at (model.rope_scaling; Hugging Face's "rope_scaling" /
 * "rope_parameters"), as transformers computes them: llama3 (Llama 3.1's
 * wavelength bands) or yarn (YaRN: a ramp between interpolated and
 * original frequencies, cos and sin times an attention factor). */
typedef struct hs_rope_scaling {
    char type[HS_NAME_MAX]; /* "none" | "llama3" | "yarn" */
    double factor;
    double low_freq_factor, high_freq_factor; /* llama3 */
    int original_max_position;                /* original_max_position_embeddings */
    double beta_fast, beta_slow;              /* yarn */
    double mscale, mscale_all_dim;            /* yarn; 0: not given */
    double attention_factor;                  /* yarn; 0: derived from factor (and mscale) */
    bool truncate;                            /* yarn: the ramp's ends rounded outwards */
} hs_rope_scaling;

typedef struct hs_model_config {
    char arch[HS_NAME_MAX]; /* "llama" | "moe" | "qwen3" | "qwen3_moe" | "deepseek_v3" */
    int vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_dim;
    int head_dim; /* 0 (null): dim / n_heads; use hs_model_head_dim */
    double norm_eps, rope_theta, init_std;
    hs_rope_scaling rope_scaling;
    bool tie_embeddings;
    hs_moe_config moe;
    hs_mla_config mla;
} hs_model_config;

/* What model.arch builds: routed experts in the blocks (moe, qwen3_moe);
 * RMSNorm of each query and key head before RoPE (qwen3, qwen3_moe:
 * Hugging Face Qwen3's q_norm and k_norm). */
bool hs_model_arch_moe(const hs_model_config *m);
bool hs_model_arch_qk_norm(const hs_model_config *m);
/* The Hugging Face names of an MoE block's parameters: the block's module
 * ("block_sparse_moe" for Mixtral, "mlp" for Qwen3-MoE) and each routed
 * expert's SwiGLU projections w1 (gate), w2 (down), w3 (up). */
typedef struct hs_moe_names {
    const char *block, *w1, *w2, *w3;
    const char *shared; /* the shared expert's module in the block's */
} hs_moe_names;
const hs_moe_names *hs_model_arch_moe_names(const hs_model_config *m);
/* Whether the router renormalises the top-k weights: always for moe
 * (Mixtral), model.moe.norm_topk_prob for qwen3_moe. */
bool hs_model_arch_moe_renorm(const hs_model_config *m);
/* Whether each MoE block has DeepSeek-V3's e_score_correction_bias (a
 * sigmoid router always has it, as DeepseekV3TopkRouter does; a softmax
 * one when model.moe.bias_update_speed > 0), and whether the router is
 * other than Mixtral's softmax (sigmoid scores, groups, a scale or that
 * bias). */
bool hs_model_moe_bias(const hs_model_config *m);
bool hs_model_moe_scored(const hs_model_config *m);
/* Whether block `layer` (0-based, of the whole model) has experts: an MoE
 * arch, and Qwen3-MoE's mlp_only_layers / decoder_sparse_step rule
 * (hs_moe_config); the others have a dense MLP of model.ffn_dim. */
bool hs_model_layer_moe(const hs_model_config *m, int layer);
/* The blocks with a dense MLP: all of them for llama and qwen3. */
int hs_model_dense_layers(const hs_model_config *m);
/* The attention head size: model.head_dim, or dim / n_heads when null;
 * under MLA the query / key head, qk_nope_head_dim + qk_rope_head_dim. */
int hs_model_head_dim(const hs_model_config *m);
/* Multi-head latent attention (arch deepseek_v3, hs_mla_config). */
bool hs_model_arch_mla(const hs_model_config *m);

typedef struct hs_accel_config {
    char device[HS_NAME_MAX]; /* "cpu" | "cuda" */
    int tp_size, cp_size, ep_size, pp_size;
    bool sequence_parallel, loss_parallel;
    /* "" (null: allgather) | "allgather" | "ring" | "alltoall" | "alltoall_ring" */
    char cp_rotate_method[HS_NAME_MAX];
    int cp_a2a_size;                 /* alltoall_ring's all-to-all group; 0: null */
    char pp_schedule[HS_NAME_MAX];   /* "gpipe" | "1f1b" | "interleaved_1f1b" */
    int pp_virtual_stages;           /* chunks per stage (interleaved_1f1b) */
    int pp_layers[HS_PP_MAX_STAGES]; /* blocks of each stage; n_pp_layers 0: even split */
    int n_pp_layers;
} hs_accel_config;

typedef struct hs_mix_precision {
    int param_dtype;  /* HS_MP_NULL or hs_dtype */
    int reduce_dtype; /* HS_MP_NULL or hs_dtype */
    int output_dtype; /* HS_MP_NULL or hs_dtype */
    bool cast_forward_inputs;
    bool fp32_main_grad;
} hs_mix_precision;

typedef struct hs_fsdp_config {
    int dp_shard_size;
    int edp_shard_size;
    char **replicate_params; /* owned; n_replicate_params entries */
    int n_replicate_params;
    hs_mix_precision mix_precision;
    bool enable_offload;
    bool reshard_after_forward;
    bool reshard_after_backward;
    bool requires_grad_sync;
    int forward_prefetch_depth;
    int backward_prefetch_depth;
    bool comm_fusion;
    int comm_fusion_zero_copy;      /* -1 null, 0 false, 1 true */
    char param_gather[HS_NAME_MAX]; /* "" (null), "int8", "fp8_e4m3" */
    int param_gather_block;
    char grad_reduce[HS_NAME_MAX]; /* "" (null), "int8", "int4" */
    int grad_reduce_block;         /* 0: null, the format's own (hs_fsdp_config_grad_block) */
    /* hpZ: after the forward each parameter stays sharded over this many
     * consecutive shard ranks (one node's), so the backward all-gathers
     * inside them; 0: null (the backward gathers over the whole group) */
    int secondary_shard_size;
} hs_fsdp_config;

/* The wire formats of fsdp_config.param_gather and grad_reduce
 * (HS_QUANT_NONE for null). */
hs_quant_fmt hs_fsdp_config_param_gather(const hs_fsdp_config *f);
hs_quant_fmt hs_fsdp_config_grad_reduce(const hs_fsdp_config *f);
/* fsdp_config.grad_reduce_block, or where it is null the format's own:
 * 256 values for int8, 32 for int4 (its 7 steps a sign need the finer
 * scales to keep the loss curve; docs/fsdp-compression.md). */
int hs_fsdp_config_grad_block(const hs_fsdp_config *f);

typedef struct hs_schedule_config {
    int warmup_steps;
    char decay[HS_NAME_MAX]; /* "constant" | "linear" | "cosine" */
    double min_lr_ratio;
} hs_schedule_config;

typedef struct hs_muon_config {
    double momentum;
    bool nesterov;
    int ns_steps;
} hs_muon_config;

typedef struct hs_optim_config {
    char target[HS_NAME_MAX]; /* "adamw" | "muon" */
    double lr;
    double betas[2];
    double eps;
    double weight_decay;
    bool fp32_main_params;
    double clip_grad_norm; /* <= 0: no clipping */
    hs_muon_config muon;
    hs_schedule_config schedule;
} hs_optim_config;

/* train.activation_checkpointing: what a block keeps for its backward. */
typedef enum hs_ac_mode {
    HS_AC_OFF = 0,       /* false: every activation of every block */
    HS_AC_FULL = 1,      /* true: each block's input; its forward re-runs in backward */
    HS_AC_SELECTIVE = 2, /* selective: the GEMM and attention outputs; the
                          * element-wise ops (norms, RoPE, SwiGLU) re-run */
} hs_ac_mode;

/* The value's name as the config writes it. */
static inline const char *hs_ac_mode_name(hs_ac_mode m) {
    return m == HS_AC_SELECTIVE ? "selective" : m == HS_AC_FULL ? "true" : "false";
}

typedef struct hs_train_config {
    int steps;
    int global_batch_size; /* sequences per optimizer step                       */
    int micro_batch_size;  /* sequences per data-parallel rank per micro-batch   */
    int seq_len;
    long long seed;
    hs_ac_mode activation_checkpointing;
    int threads; /* 0 (null): OMP_NUM_THREADS, else cores / ranks on the node */
    int log_every;
    int eval_every; /* 0: no periodic eval */
    char out_dir[HS_PATH_MAX];
    char **freeze; /* owned: FQN glob patterns of parameters without gradient */
    int n_freeze;
    char reproducibility[HS_NAME_MAX]; /* "none" | "run" | "layout" */
} hs_train_config;
/* train.reproducibility is layout: every layout of the same global batch
 * gives the same bits (docs/numerics.md "Layout-invariant training"). */
bool hs_train_layout_invariant(const hs_train_config *t);

/* One dataset of data.blend: the prefix of PREFIX.bin / PREFIX.idx and
 * its relative weight. */
typedef struct hs_blend_entry {
    char *path; /* owned */
    double weight;
} hs_blend_entry;

typedef struct hs_data_config {
    char source[HS_NAME_MAX]; /* "builtin" | "text" | "tokens" | "indexed" */
    char path[HS_PATH_MAX];   /* "" when null */
    double val_fraction;
    int eos_id;            /* -1 when null: documents packed with nothing between */
    bool document_masking; /* attention stays inside each document (ended by eos_id) */
    hs_blend_entry *blend; /* owned; NULL when n_blend is 0 */
    int n_blend;
} hs_data_config;

typedef struct hs_ckpt_config {
    char dir[HS_PATH_MAX];    /* "" when null: no checkpoints */
    int save_every;           /* 0: only at the end (if dir set) */
    char resume[HS_PATH_MAX]; /* "none" | "auto" | a path */
    int keep_last;
    bool async; /* snapshot, then write in a background thread */
} hs_ckpt_config;

typedef struct hs_trace_config {
    bool enabled;
    char dir[HS_PATH_MAX]; /* "" when null: <out_dir>/trace */
} hs_trace_config;

typedef struct hs_metrics_config {
    bool tensorboard; /* also write TensorBoard event files to train.out_dir */
} hs_metrics_config;

typedef struct hs_comm_config {
    double timeout_s;
    int check_every; /* steps between collective fingerprint checks; 0: off; 1: debug mode */
} hs_comm_config;

typedef struct hs_compile_config {
    bool fullgraph;
} hs_compile_config;

typedef struct hs_config {
    hs_model_config model;
    hs_accel_config accelerator;
    hs_fsdp_config fsdp;
    hs_optim_config optimizer;
    hs_train_config train;
    hs_data_config data;
    hs_ckpt_config checkpoint;
    hs_trace_config trace;
    hs_metrics_config metrics;
    hs_comm_config comm;
    hs_compile_config compile;
    char source_path[HS_PATH_MAX]; /* the YAML file, "" for the built-in default */
} hs_config;

/* The built-in default (every key at its schema default). HS_ERR_OOM when
 * a list default cannot be copied; c can be freed (hs_config_free) either
 * way. */
hs_status hs_config_defaults(hs_config *c, hs_error *e);
/* Load `path` (NULL: the built-in default), then apply overrides
 * ("a.b.c=value"), in order. Does not validate the topology. */
hs_status hs_config_load(hs_config *c, const char *path, const char *const *overrides,
                         int n_overrides, hs_error *e);
/* Apply one override. */
hs_status hs_config_override(hs_config *c, const char *assignment, hs_error *e);
/* Validate everything that needs only the config and the world size (spec
 * §4.1 rules 1–10 and the trainer's own rules); warnings for §4.2 go to log
 * (may be NULL). On success fills *topo. */
hs_status hs_config_validate(const hs_config *c, int world, hs_topology *topo, const hs_log *log,
                             hs_error *e);
/* Rule 11: every name in replicate_params (and source metadata) must be one
 * of the model's FQNs. `fsdp` is the config's fsdp_config (the only part the
 * rule reads, so fsdp/ can check its own slice); `fqns` are the model's
 * parameter FQNs. Appends one line per unknown name with the nearest FQN. */
hs_status hs_config_check_fqns(const hs_fsdp_config *fsdp, const char *const *fqns, int n_fqns,
                               hs_error *e);
/* Resolved config as YAML, every key present; then, with a topology, the
 * `derived:` block. Only the derived block allocates (its rank lists):
 * HS_ERR_OOM, the block cut short, when it cannot. */
hs_status hs_config_dump(const hs_config *c, const hs_topology *topo, FILE *f, hs_error *e);
/* One top-level section of the resolved config ("model"), every key of it,
 * as hs_config_dump writes it: YAML that loads back. */
void hs_config_dump_section(const hs_config *c, const char *section, FILE *f);
/* Sequences per optimizer step: train.global_batch_size, or when it is null
 * micro_batch_size x dp (one micro-batch per step, torchtitan's default),
 * times pp_size under pipeline parallelism (one micro-batch per stage). */
long long hs_config_global_batch(const hs_config *c, const hs_topology *topo);
/* Micro-batches per optimizer step: global / (micro * dp). */
int hs_config_micro_batches(const hs_config *c, const hs_topology *topo);
/* The pipeline's virtual stages, in model order: pp_size x
 * pp_virtual_stages chunks of consecutive blocks, chunk c running on stage
 * c % pp_size (so stage s holds chunks s, s + pp, s + 2 pp, ...); for each
 * its first block (first_layer[c], the running sum) and its block count
 * (n_layers[c]). `accel` is the config's accelerator section (pp_size,
 * pp_virtual_stages, pp_layers) and `model_layers` its model.n_layers.
 * With accelerator.pp_layers given (one entry per chunk) those counts;
 * otherwise the even split: model_layers / chunks each, and the
 * remainder's extra blocks go to the middle chunks 1 .. n-2 first, then to
 * chunk 0, never to the last, which also holds the norm and lm_head
 * (n_layers 10, 4 chunks: [2, 3, 3, 2]; 5, 2: [3, 2]). Both arrays hold
 * pp_size x pp_virtual_stages entries. Meant for a validated config. */
void hs_config_pp_stages(const hs_accel_config *accel, int model_layers, int *first_layer,
                         int *n_layers);
/* The model chunk (an index into hs_config_pp_stages' arrays) that stage
 * `stage` runs as its local chunk v, from the accelerator section's
 * pp_schedule and pp_size: stage + v x pp_size (one chunk per stage, or
 * interleaved), or for zbv's V shape stage for v = 0 and
 * 2 pp_size - 1 - stage for v = 1 (the first stage holds the first and
 * the last chunk, the last stage the two middle ones). */
int hs_config_pp_chunk(const hs_accel_config *accel, int stage, int v);

/* The pipeline schedules accelerator.pp_schedule names, one row each. The
 * config's checks, the action lists and chunk placement (parallel.h), the
 * plan's replay and its search all read their facts from this table. */
typedef enum hs_pp_schedule_kind {
    HS_PP_GPIPE = 0,
    HS_PP_1F1B,
    HS_PP_INTERLEAVED,
    HS_PP_ZB1P,
    HS_PP_ZBV,
    HS_PP_N_SCHEDULES
} hs_pp_schedule_kind;

/* The schema's choices for accelerator.pp_schedule: the table's names in
 * its order (a unit test holds the two together). */
#define HS_PP_SCHEDULE_CHOICES "gpipe|1f1b|interleaved_1f1b|zb1p|zbv"

typedef struct hs_pp_schedule_info {
    hs_pp_schedule_kind kind;
    const char *name;
    /* accelerator.pp_virtual_stages it runs: chunks per stage */
    int min_chunks, max_chunks;
    /* chunk placement: stage s holds chunks s and 2 pp - 1 - s (a V), or
     * s, s + pp, ... (round robin) */
    bool v_shape;
    /* each backward split into an input pass B and a weight pass W: three
     * actions per micro-batch and chunk, else two */
    bool splits_backward;
    /* needs at least pp micro-batches per step to fill the pipe */
    bool fills_pipe;
    /* runs rounds of pp micro-batches: M a multiple of pp once M >= pp */
    bool rounds_of_pp;
    /* plan --search tries it (gpipe is 1f1b's bubble with more memory) */
    bool searched;
} hs_pp_schedule_info;

/* The row of `kind` (kind < HS_PP_N_SCHEDULES). */
const hs_pp_schedule_info *hs_pp_schedule_info_of(hs_pp_schedule_kind kind);
/* The row named `name`, or NULL for a name the table does not hold. */
const hs_pp_schedule_info *hs_pp_schedule_find(const char *name);
/* Actions one stage runs per micro-batch and local chunk: 3 where the
 * backward splits, else 2. */
int hs_pp_schedule_passes(const hs_pp_schedule_info *info);
/* The model chunk stage `stage` of pp runs as its local chunk v under the
 * schedule's placement (hs_config_pp_chunk; NULL info: round robin). */
int hs_pp_schedule_chunk(const hs_pp_schedule_info *info, int pp, int stage, int v);

/* Deep copy (replicate_params, freeze); HS_ERR_OOM, and dst empty of
 * lists, when they cannot be copied. */
hs_status hs_config_copy(hs_config *dst, const hs_config *src, hs_error *e);
void hs_config_free(hs_config *c);
/* FNV-1a hash of the resolved dump (checkpoint compatibility). */
hs_status hs_config_hash(const hs_config *c, uint64_t *hash, hs_error *e);
/* The docs table: one markdown row per key (`hypershard config --schema-markdown`). */
hs_status hs_config_schema_markdown(FILE *f, hs_error *e);

/* ---------------------------------------------------- the cluster file */

/* A cluster description (`--cluster FILE`, docs/plan.md "Cluster files"):
 * what `hypershard plan --time` simulates a step on. Rates in FLOP/s and
 * bytes/s, times in seconds, sizes in bytes. */
#define HS_CLUSTER_TABLE_MAX 64

typedef struct hs_cluster_gemm { /* device.gemm: a measured GEMM rate */
    hs_dtype dtype;
    int64_t m, n, k;
    double flops;
} hs_cluster_gemm;

typedef struct hs_cluster_group { /* a link's by_ranks row: one group size */
    int ranks;
    int node_ranks; /* measured with this many ranks on the node; 0: any */
    double bandwidth, latency;
} hs_cluster_group;

typedef struct hs_cluster_link {
    double bandwidth, latency; /* per rank (inter_node: per NIC) */
    hs_cluster_group by_ranks[HS_CLUSTER_TABLE_MAX];
    int n_by_ranks;
} hs_cluster_link;

typedef struct hs_cluster {
    char name[160], device_name[160];
    int nodes, devices_per_node, nics_per_node;
    bool shared;    /* node.shared: the node's ranks divide its devices (CPU cores) */
    double lend;    /* node.lend: the share of a waiting rank's cores busy ranks get */
    double peak[3]; /* device.flops.{f32,bf16,f16}: nominal dense, per device */
    double gemm_efficiency, attention_efficiency, elementwise_efficiency;
    double attention[3]; /* device.attention.{f32,...}: measured FLOP/s, 0 if not */
    /* device.attention_scores.{forward,backward}: the bytes each attention
     * score moves through device memory in a forward and in a backward
     * where the kernel materialises the scores; 0: a fused kernel keeps
     * them on chip */
    double score_bytes[2];
    double memory_bytes, memory_bandwidth;
    double routing_bandwidth; /* device.routing_bandwidth: MoE permute bytes/s, 0 if not */
    hs_cluster_gemm gemm[HS_CLUSTER_TABLE_MAX];
    int n_gemm;
    hs_cluster_link intra, inter;
    double overlap; /* the share of a collective that hides behind compute */
} hs_cluster;

/* Reads and checks a cluster file: HS_ERR_CONFIG naming the file, the key
 * (with its line) and the fix for an unknown key, a missing or non-positive
 * value; HS_ERR_IO when it cannot be read. */
hs_status hs_cluster_load(const char *path, hs_cluster *out, hs_error *e);
/* The same for a file's text; `name` names it in the messages. */
hs_status hs_cluster_parse(const char *name, const char *text, size_t len, hs_cluster *out,
                           hs_error *e);
/* The cluster as YAML a load reads back (calibrate writes it). */
void hs_cluster_write(const hs_cluster *c, FILE *f);

#endif
