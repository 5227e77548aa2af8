/* The configuration schema: one row per key (see schema.h). The order of the
 * rows is the order of the resolved dump and of the docs table; the keys of a
 * section must be contiguous. */
#include "config/schema.h"

#include <stddef.h>
#include <string.h>

#define FIELD(m) .offset = offsetof(hs_config, m), .size = sizeof(((hs_config *)0)->m)

#define KINT(p, m, d, b, lo, doc_)                                                                 \
    { .path = p, .type = HS_CFG_INT, .def = d, .bounds = b, .min = lo, FIELD(m), .doc = doc_ }
#define KINT_NULL(p, m, lo, doc_)                                                                  \
    {                                                                                              \
        .path = p, .type = HS_CFG_INT, .def = "null", .nullable = true, .bounds = GE, .min = lo,   \
        FIELD(m), .doc = doc_                                                                      \
    }
#define KFLOAT(p, m, d, b, lo, hi, doc_)                                                           \
    {                                                                                              \
        .path = p, .type = HS_CFG_FLOAT, .def = d, .bounds = b, .min = lo, .max = hi, FIELD(m),    \
        .doc = doc_                                                                                \
    }
#define KBOOL(p, m, d, doc_)                                                                       \
    { .path = p, .type = HS_CFG_BOOL, .def = d, FIELD(m), .doc = doc_ }
#define KENUM(p, m, d, ch, doc_)                                                                   \
    { .path = p, .type = HS_CFG_ENUM, .def = d, .choices = ch, FIELD(m), .doc = doc_ }
#define KBOOL_OR(p, m, d, ch, doc_)                                                                \
    { .path = p, .type = HS_CFG_BOOL_OR, .def = d, .choices = ch, FIELD(m), .doc = doc_ }
_Static_assert(sizeof(hs_ac_mode) == sizeof(int), "HS_CFG_BOOL_OR fields are ints");
#define KSTR(p, m, d, null_, allowed_, doc_)                                                       \
    {                                                                                              \
        .path = p, .type = HS_CFG_STRING, .def = d, .nullable = null_, FIELD(m),                   \
        .allowed = allowed_, .doc = doc_                                                           \
    }
#define KDTYPE(p, m, doc_)                                                                         \
    {                                                                                              \
        .path = p, .type = HS_CFG_DTYPE, .def = "null", .choices = "float16|bfloat16|float32",     \
        FIELD(m), .doc = doc_                                                                      \
    }

enum { GE = HS_CFG_MIN, GT = HS_CFG_MIN | HS_CFG_MIN_OPEN, RULE = HS_CFG_BY_RULE };
#define UNIT_OPEN (HS_CFG_MIN | HS_CFG_MAX | HS_CFG_MAX_OPEN) /* [0, 1) */
#define UNIT (HS_CFG_MIN | HS_CFG_MAX)                        /* [0, 1] */

static const hs_cfg_key keys[] = {
    /* model */
    KENUM("model.arch", model.arch, "llama", "llama|moe|qwen3|qwen3_moe|deepseek_v3",
          "decoder family: llama (dense SwiGLU blocks), moe (routed experts in every block), "
          "qwen3 (llama with an RMSNorm of each query and key head before RoPE), qwen3_moe "
          "(qwen3's attention with routed experts in every block) or deepseek_v3 (multi-head "
          "latent attention, model.mla, and routed experts after model.moe."
          "first_k_dense_replace dense blocks)"),
    KINT("model.vocab_size", model.vocab_size, "256", GE, 2, "vocabulary size (tokens)"),
    KINT("model.dim", model.dim, "128", GE, 1, "hidden size"),
    KINT("model.n_layers", model.n_layers, "4", GE, 1, "number of transformer blocks"),
    KINT("model.n_heads", model.n_heads, "4", GE, 1,
         "attention heads; must divide model.dim unless model.head_dim is set"),
    KINT("model.n_kv_heads", model.n_kv_heads, "2", GE, 1,
         "key/value heads (grouped-query attention); must divide model.n_heads"),
    KINT_NULL("model.head_dim", model.head_dim, 1,
              "size of each attention head (even, for RoPE); q_proj is [n_heads x head_dim, dim]; "
              "null: model.dim / model.n_heads"),
    KINT("model.ffn_dim", model.ffn_dim, "384", GE, 1, "SwiGLU hidden size of the dense MLP"),
    KFLOAT("model.norm_eps", model.norm_eps, "1e-05", GT, 0, 0, "RMSNorm epsilon"),
    KFLOAT("model.rope_theta", model.rope_theta, "10000.0", GT, 0, 0, "RoPE base frequency"),
    KENUM("model.rope_scaling.type", model.rope_scaling.type, "none", "none|llama3|yarn",
          "RoPE frequencies stretched for a longer context, as transformers computes them: "
          "none, llama3 (Llama 3.1's) or yarn (YaRN)"),
    KFLOAT("model.rope_scaling.factor", model.rope_scaling.factor, "8.0", GT, 0, 0,
           "llama3, yarn: how many times the original context the frequencies stretch to"),
    KFLOAT("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor, "1.0", GT, 0,
           0,
           "llama3: wavelengths above original_max_position_embeddings / this are divided "
           "by factor"),
    KFLOAT("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor, "4.0", GT, 0,
           0,
           "llama3: wavelengths below original_max_position_embeddings / this are kept; in "
           "between they blend"),
    KINT("model.rope_scaling.original_max_position_embeddings",
         model.rope_scaling.original_max_position, "8192", GE, 1,
         "llama3, yarn: the context length the model was pretrained at"),
    KFLOAT("model.rope_scaling.beta_fast", model.rope_scaling.beta_fast, "32.0", GT, 0, 0,
           "yarn: rotations that bound the ramp at the high-frequency end"),
    KFLOAT("model.rope_scaling.beta_slow", model.rope_scaling.beta_slow, "1.0", GT, 0, 0,
           "yarn: rotations that bound the ramp at the low-frequency end"),
    KFLOAT("model.rope_scaling.mscale", model.rope_scaling.mscale, "0.0", GE, 0, 0,
           "yarn: with mscale_all_dim, the attention factor's numerator 0.1 mscale ln(factor) + 1 "
           "(0: not given)"),
    KFLOAT("model.rope_scaling.mscale_all_dim", model.rope_scaling.mscale_all_dim, "0.0", GE, 0, 0,
           "yarn: the attention factor's denominator, as mscale (0: not given)"),
    KFLOAT("model.rope_scaling.attention_factor", model.rope_scaling.attention_factor, "0.0", GE, 0,
           0,
           "yarn: cos and sin times this (0: 0.1 ln(factor) + 1, or the mscale ratio when both "
           "are given)"),
    KBOOL("model.rope_scaling.truncate", model.rope_scaling.truncate, "true",
          "yarn: the ramp's ends rounded outwards to whole dimensions"),
    KBOOL("model.tie_embeddings", model.tie_embeddings, "false",
          "share the token embedding with the output head"),
    KFLOAT("model.init_std", model.init_std, "0.02", GT, 0, 0,
           "standard deviation of the normal weight init"),
    KINT("model.moe.num_experts", model.moe.num_experts, "4", GE, 1,
         "routed experts per MoE block (arch moe, qwen3_moe)"),
    KINT("model.moe.top_k", model.moe.top_k, "2", GE, 1,
         "experts each token is routed to; at most num_experts"),
    KINT("model.moe.expert_ffn_dim", model.moe.expert_ffn_dim, "128", GE, 1,
         "SwiGLU hidden size of each routed expert"),
    KINT("model.moe.shared_expert_ffn_dim", model.moe.shared_expert_ffn_dim, "0", GE, 0,
         "hidden size of the always-on shared expert; 0: no shared expert"),
    KFLOAT("model.moe.aux_loss_coef", model.moe.aux_loss_coef, "0.01", GE, 0, 0,
           "weight of the router load-balancing loss"),
    KBOOL("model.moe.norm_topk_prob", model.moe.norm_topk_prob, "true",
          "renormalise each token's top_k routing weights to sum to 1 (Mixtral always does; "
          "false, arch qwen3_moe only: the softmax probabilities as they are)"),
    {.path = "model.moe.mlp_only_layers",
     .type = HS_CFG_INTLIST,
     .def = "[]",
     .bounds = GE,
     .min = 0,
     FIELD(model.moe.mlp_only_layers),
     .count_offset = offsetof(hs_config, model.moe.n_mlp_only_layers),
     .doc = "blocks (0-based) with a dense MLP of model.ffn_dim instead of experts (arch "
            "qwen3_moe, Hugging Face's mlp_only_layers); []: none"},
    KENUM("model.moe.score_func", model.moe.score_func, "softmax", "softmax|sigmoid",
          "router scores: softmax over the experts (Mixtral, Qwen3-MoE) or each expert's "
          "sigmoid (DeepSeek-V3)"),
    KINT("model.moe.n_group", model.moe.n_group, "1", GE, 1,
         "group-limited routing: the experts in this many equal groups, a group scored by the "
         "sum of its two best scores (DeepSeek-V3's n_group); 1: no groups"),
    KINT("model.moe.topk_group", model.moe.topk_group, "1", GE, 1,
         "groups each token may choose its top_k experts from (DeepSeek-V3's topk_group); at "
         "most n_group"),
    KFLOAT("model.moe.routed_scaling_factor", model.moe.routed_scaling_factor, "1.0", GT, 0, 0,
           "the routed experts' weights times this (DeepSeek-V3's routed_scaling_factor)"),
    KFLOAT("model.moe.seq_aux_loss_coef", model.moe.seq_aux_loss_coef, "0.0", GE, 0, 0,
           "DeepSeek-V3's sequence-wise balance loss weight (alpha): per MoE block and sequence "
           "sum_e f_e P_e, f_e = E / (top_k T) x the sequence's choices of e, P_e = the mean of "
           "e's normalised score over its T tokens; averaged over sequences, summed over blocks; "
           "0: none"),
    KFLOAT("model.moe.bias_update_speed", model.moe.bias_update_speed, "0.0", GE, 0, 0,
           "aux-loss-free balancing: each MoE block's e_score_correction_bias [num_experts], "
           "added to the scores to choose experts only, moves after each step by this much "
           "toward balance (sign of mean load - load, global loads); 0: it stays as initialised "
           "(zeros) or loaded. A sigmoid router always has the bias, a softmax one only when "
           "this is > 0"),
    KINT("model.moe.first_k_dense_replace", model.moe.first_k_dense_replace, "0", GE, 0,
         "the first this many blocks have a dense MLP of model.ffn_dim, the rest experts (arch "
         "deepseek_v3, Hugging Face's first_k_dense_replace); 0: none"),
    KINT("model.moe.decoder_sparse_step", model.moe.decoder_sparse_step, "1", GE, 1,
         "every this many blocks has experts, the others a dense MLP of model.ffn_dim: block i "
         "has experts when (i + 1) % decoder_sparse_step is 0 (arch qwen3_moe, Hugging Face's "
         "decoder_sparse_step); 1: every block"),

    KINT("model.mla.q_lora_rank", model.mla.q_lora_rank, "0", GE, 0,
         "arch deepseek_v3: the query's low-rank width (q_a_proj, q_a_layernorm, q_b_proj); 0 "
         "(Hugging Face's null): one q_proj"),
    KINT("model.mla.kv_lora_rank", model.mla.kv_lora_rank, "32", GE, 1,
         "arch deepseek_v3: the compressed key-value latent's width (kv_a_proj_with_mqa, "
         "kv_a_layernorm, kv_b_proj)"),
    KINT("model.mla.qk_nope_head_dim", model.mla.qk_nope_head_dim, "32", GE, 1,
         "arch deepseek_v3: each query and key head's dims without RoPE"),
    KINT("model.mla.qk_rope_head_dim", model.mla.qk_rope_head_dim, "16", GE, 2,
         "arch deepseek_v3: each query and key head's RoPE dims (even; the key's are one "
         "head's, shared by all)"),
    KINT("model.mla.v_head_dim", model.mla.v_head_dim, "32", GE, 1,
         "arch deepseek_v3: each value head's width; at most qk_nope_head_dim + "
         "qk_rope_head_dim"),
    KBOOL("model.mla.rope_interleave", model.mla.rope_interleave, "true",
          "arch deepseek_v3: Hugging Face files rotate interleaved pairs of the rope dims "
          "(DeepSeek's layout): import and export reorder those weight rows; training is the "
          "same either way"),

    /* accelerator */
    KENUM("accelerator.device", accelerator.device, "cpu", "cpu|cuda|reference",
          "where compute runs: cpu (MPI), cuda (NCCL, bootstrapped by MPI) or reference (plain "
          "C kernels in fp64 on one thread: the oracle the cpu kernels are held to; slow)"),
    KINT("accelerator.tp_size", accelerator.tp_size, "1", GE | RULE, 1,
         "tensor-parallel degree (fastest-varying rank dim); must divide the heads, kv heads, "
         "dense MLP and vocabulary"),
    KINT("accelerator.cp_size", accelerator.cp_size, "1", GE | RULE, 1,
         "context-parallel degree (splits each sequence in 2 x cp_size chunks, two per rank; "
         "never enlarges the FSDP shard degree)"),
    KINT("accelerator.ep_size", accelerator.ep_size, "1", GE | RULE, 1,
         "expert-parallel degree over the expert domain dp x cp x tp: each EP rank holds "
         "num_experts / ep_size routed experts (with tp_size > 1 needs sequence_parallel)"),
    KINT("accelerator.pp_size", accelerator.pp_size, "1", GE | RULE, 1,
         "pipeline-parallel stages (slowest-varying rank dim): each holds a contiguous run of "
         "blocks, the first also the embedding, the last the norm and lm_head"),
    KENUM("accelerator.pp_schedule", accelerator.pp_schedule, "1f1b", HS_PP_SCHEDULE_CHOICES,
          "pipeline schedule: gpipe (every forward, then every backward), 1f1b (one forward, "
          "one backward in steady state; needs micro-batches per step >= pp_size), "
          "interleaved_1f1b (1f1b over pp_virtual_stages chunks per stage; needs micro-batches "
          "per step a multiple of pp_size) or zb1p (zero bubble ZB-H1: 1f1b with each backward "
          "split into its input and weight gradients, the weight halves filling the bubbles; "
          "1f1b's peak activations plus the kept output gradients) or zbv (zero bubble ZB-V: "
          "two chunks per stage in a V, pp_virtual_stages: 2, the first stage holding the "
          "embedding and the head; needs micro-batches per step >= pp_size)"),
    KINT("accelerator.pp_virtual_stages", accelerator.pp_virtual_stages, "1", GE | RULE, 1,
         "model chunks per pipeline stage (interleaved_1f1b: >= 2, at most 8; stage s holds "
         "chunks s, s + pp_size, ...; zbv: exactly 2, stage s holds chunks s and "
         "2 pp_size - 1 - s)"),
    {.path = "accelerator.pp_layers",
     .type = HS_CFG_INTLIST,
     .def = "[]",
     .bounds = GE | RULE,
     .min = 1,
     FIELD(accelerator.pp_layers),
     .count_offset = offsetof(hs_config, accelerator.n_pp_layers),
     .doc = "transformer blocks of each pipeline stage (of each virtual stage in model order "
            "under interleaved_1f1b), one entry each, summing to model.n_layers; []: the even "
            "split (extra blocks go to the middle stages)"},
    KSTR("accelerator.cp_rotate_method", accelerator.cp_rotate_method, "null", true,
         "allgather | ring | alltoall | alltoall_ring | null",
         "how attention sees the other CP ranks' keys: allgather (null: the default), ring, "
         "alltoall (Ulysses: heads / cp of the heads over the whole sequence per rank; needs "
         "heads / tp divisible by cp_size) or alltoall_ring (alltoall inside groups of "
         "cp_a2a_size consecutive CP ranks, ring across the groups)"),
    KINT_NULL("accelerator.cp_a2a_size", accelerator.cp_a2a_size, 1,
              "alltoall_ring: CP ranks per all-to-all group, a divisor of cp_size that divides "
              "heads / tp (cp_size: alltoall, 1: ring); null: unset (alltoall_ring needs it)"),
    KBOOL("accelerator.sequence_parallel", accelerator.sequence_parallel, "false",
          "shard norm/dropout activations over the sequence on the TP group (needs tp_size > 1)"),
    KBOOL("accelerator.loss_parallel", accelerator.loss_parallel, "false",
          "compute the loss on vocab-sharded logits without gathering them (needs tp_size > 1)"),

    /* fsdp_config */
    KINT("fsdp_config.dp_shard_size", fsdp.dp_shard_size, "1", GE | RULE, 1,
         "FSDP shard degree of dense parameters; the rest of the dp x cp domain replicates (HSDP)"),
    KINT("fsdp_config.edp_shard_size", fsdp.edp_shard_size, "1", GE | RULE, 1,
         "shard degree of routed-expert parameters inside the EDP domain (needs ep_size > 1)"),
    {.path = "fsdp_config.replicate_params",
     .type = HS_CFG_STRLIST,
     .def = "[]",
     .offset = offsetof(hs_config, fsdp.replicate_params),
     .size = sizeof(((hs_config *)0)->fsdp.replicate_params),
     .count_offset = offsetof(hs_config, fsdp.n_replicate_params),
     .allowed = "list of the model's parameter FQNs",
     .doc = "parameters kept whole (not sharded); their gradients are still all-reduced over the "
            "FSDP domain"},
    KDTYPE("fsdp_config.mix_precision.param_dtype", fsdp.mix_precision.param_dtype,
           "dtype of unsharded parameters in forward/backward; null: keep the stored dtype"),
    KDTYPE("fsdp_config.mix_precision.reduce_dtype", fsdp.mix_precision.reduce_dtype,
           "dtype of gradient reduce-scatter/all-reduce; null: the gradient's own dtype"),
    KDTYPE("fsdp_config.mix_precision.output_dtype", fsdp.mix_precision.output_dtype,
           "dtype FSDP unit outputs are cast to; null: no cast"),
    KBOOL("fsdp_config.mix_precision.cast_forward_inputs", fsdp.mix_precision.cast_forward_inputs,
          "true", "cast floating forward inputs to param_dtype (needs param_dtype)"),
    KBOOL("fsdp_config.mix_precision.fp32_main_grad", fsdp.mix_precision.fp32_main_grad, "false",
          "write reduced gradients to an fp32 main_grad (needs reduce_dtype float32 and "
          "optimizer.fp32_main_params true)"),
    KBOOL("fsdp_config.enable_offload", fsdp.enable_offload, "false",
          "keep sharded parameters and gradients in host memory outside compute "
          "(H2D/D2H around it)"),
    KBOOL("fsdp_config.reshard_after_forward", fsdp.reshard_after_forward, "true",
          "free child units' unsharded parameters after forward (the root unit never does)"),
    KBOOL("fsdp_config.reshard_after_backward", fsdp.reshard_after_backward, "true",
          "reshard after each micro-batch's backward; false keeps them until the last micro-batch"),
    KBOOL("fsdp_config.requires_grad_sync", fsdp.requires_grad_sync, "true",
          "reduce gradients every micro-batch; false reduces only on the last micro-batch"),
    KINT("fsdp_config.forward_prefetch_depth", fsdp.forward_prefetch_depth, "1", GE | RULE, 0,
         "units whose all-gather is issued ahead in forward; 0: no forward prefetch"),
    KINT("fsdp_config.backward_prefetch_depth", fsdp.backward_prefetch_depth, "1", GE | RULE, 0,
         "units whose all-gather is issued ahead in backward; 0: no backward prefetch"),
    KBOOL("fsdp_config.comm_fusion", fsdp.comm_fusion, "false",
          "one all-gather and one reduce-scatter per unit over a fused buffer"),
    {.path = "fsdp_config.comm_fusion_zero_copy",
     .type = HS_CFG_TRIBOOL,
     .def = "null",
     FIELD(fsdp.comm_fusion_zero_copy),
     .doc = "parameters as views into the fused buffer; null: on when comm_fusion is true, "
            "false: copy-in path (needs comm_fusion)"},
    KSTR("fsdp_config.param_gather", fsdp.param_gather, "null", true, "int8 | fp8_e4m3 | null",
         "wire format of the parameter all-gathers: each rank's shard quantized in blocks "
         "(a fp32 scale each) and read back in param_dtype; the fp32 masters, the optimizer "
         "and replicate_params stay exact; null: param_dtype itself"),
    KINT("fsdp_config.param_gather_block", fsdp.param_gather_block, "256", GE, 1,
         "values per quantization block of fsdp_config.param_gather"),
    KSTR("fsdp_config.grad_reduce", fsdp.grad_reduce, "null", true, "int8 | int4 | null",
         "wire format of the gradient reduce-scatters: each rank's chunk for each other rank "
         "quantized in blocks, exchanged by all-to-all and summed in fp32 by its owner (in "
         "two levels, inside each node then across, where the shard group spans nodes "
         "evenly); the replicate all-reduce stays in reduce_dtype; null: reduce_dtype "
         "itself"),
    KINT_NULL("fsdp_config.grad_reduce_block", fsdp.grad_reduce_block, 1,
              "values per quantization block of fsdp_config.grad_reduce (even for int4); null: "
              "256 for int8, 32 for int4 (int4's coarse steps need the finer scales to hold the "
              "loss curve)"),
    KINT_NULL("fsdp_config.secondary_shard_size", fsdp.secondary_shard_size, 1,
              "after the forward, keep each parameter sharded over this many consecutive shard "
              "ranks (those of one node) so the backward's all-gather stays among them; a "
              "divisor of the shard degree strictly between 1 and it (needs "
              "reshard_after_forward true); null: off"),

    /* optimizer */
    KENUM("optimizer._target_", optimizer.target, "adamw", "adamw|muon", "optimizer"),
    KFLOAT("optimizer.lr", optimizer.lr, "0.003", GT, 0, 0, "peak learning rate"),
    {.path = "optimizer.betas",
     .type = HS_CFG_FLOAT_PAIR,
     .def = "[0.9, 0.95]",
     .bounds = UNIT_OPEN,
     .min = 0,
     .max = 1,
     FIELD(optimizer.betas),
     .doc = "AdamW moment decay rates (also used by Muon for 1-D parameters)"},
    KFLOAT("optimizer.eps", optimizer.eps, "1e-08", GT, 0, 0, "AdamW epsilon"),
    KFLOAT("optimizer.weight_decay", optimizer.weight_decay, "0.1", GE, 0, 0,
           "decoupled weight decay (matrices only; norms and biases are not decayed)"),
    KBOOL("optimizer.fp32_main_params", optimizer.fp32_main_params, "false",
          "keep fp32 main parameters and update them from fp32 main_grad (must match "
          "fsdp_config.mix_precision.fp32_main_grad)"),
    KFLOAT("optimizer.clip_grad_norm", optimizer.clip_grad_norm, "1.0", 0, 0, 0,
           "clip the global gradient norm to this value; <= 0: no clipping"),
    {.path = "optimizer.muon.momentum",
     .type = HS_CFG_FLOAT,
     .def = "0.95",
     .bounds = UNIT_OPEN,
     .min = 0,
     .max = 1,
     FIELD(optimizer.muon.momentum),
     .doc = "Muon momentum"},
    KBOOL("optimizer.muon.nesterov", optimizer.muon.nesterov, "true", "Nesterov momentum in Muon"),
    KINT("optimizer.muon.ns_steps", optimizer.muon.ns_steps, "5", GE, 1,
         "Newton-Schulz orthogonalisation iterations"),
    KINT("optimizer.schedule.warmup_steps", optimizer.schedule.warmup_steps, "10", GE, 0,
         "linear warm-up steps from 0 to lr"),
    KENUM("optimizer.schedule.decay", optimizer.schedule.decay, "cosine", "constant|linear|cosine",
          "decay after warm-up, down to min_lr_ratio x lr at the last step"),
    {.path = "optimizer.schedule.min_lr_ratio",
     .type = HS_CFG_FLOAT,
     .def = "0.1",
     .bounds = UNIT,
     .min = 0,
     .max = 1,
     FIELD(optimizer.schedule.min_lr_ratio),
     .doc = "final learning rate as a fraction of lr"},

    /* train */
    KINT("train.steps", train.steps, "200", GE, 1, "optimizer steps"),
    KINT_NULL("train.global_batch_size", train.global_batch_size, 1,
              "sequences per optimizer step over all data-parallel ranks; null: "
              "micro_batch_size x dp_size (one micro-batch per step; with pp_size > 1, "
              "x pp_size: one per stage)"),
    KINT("train.micro_batch_size", train.micro_batch_size, "8", GE, 1,
         "sequences per data-parallel rank per micro-batch"),
    KINT("train.seq_len", train.seq_len, "64", GE, 1, "tokens per sequence"),
    {.path = "train.seed",
     .type = HS_CFG_INT64,
     .def = "1234",
     FIELD(train.seed),
     .doc = "seed of parameter init and data order"},
    KINT_NULL("train.threads", train.threads, 1,
              "compute threads per rank (GEMM and the threaded kernels); null: OMP_NUM_THREADS "
              "when set, else the cores available to the rank / the ranks on its node"),
    KBOOL_OR("train.activation_checkpointing", train.activation_checkpointing, "false",
             "false|true|selective",
             "true: recompute each block's forward in backward instead of keeping its "
             "activations; selective: keep the GEMM and attention outputs and recompute only "
             "the norms, RoPE and SwiGLU"),
    KENUM("train.reproducibility", train.reproducibility, "none", "none|run|layout",
          "none and run: bitwise equal from run to run on one layout (the default already "
          "is); layout: also across FSDP / HSDP degrees, pipelines and micro-batches of the "
          "same global batch, every token sum a tree over the sequences (docs/numerics.md)"),
    {.path = "train.freeze",
     .type = HS_CFG_STRLIST,
     .def = "[]",
     .offset = offsetof(hs_config, train.freeze),
     .size = sizeof(((hs_config *)0)->train.freeze),
     .count_offset = offsetof(hs_config, train.n_freeze),
     .allowed = "list of FQN glob patterns",
     .doc = "parameters trained without gradient (fine-tuning), e.g. [model.embed_tokens.*]: no "
            "gradient, no reduce-scatter or all-reduce, no optimizer state, no update"},
    KINT("train.log_every", train.log_every, "10", GE, 1, "steps between metric log lines"),
    KINT("train.eval_every", train.eval_every, "50", GE, 0,
         "steps between validation-loss evaluations; 0: no periodic eval"),
    KSTR("train.out_dir", train.out_dir, "runs/default", false, NULL,
         "run directory: metrics, logs, trace and final weights"),

    /* data */
    KENUM("data.source", data.source, "builtin", "builtin|text|tokens|indexed",
          "builtin: generated corpus; text: a UTF-8 file (byte tokens); "
          "tokens: an HSTK token file; indexed: a Megatron-LM PREFIX.bin/.idx dataset"),
    KSTR("data.path", data.path, "null", true, NULL,
         "input file (text, tokens) or PREFIX of PREFIX.bin/.idx (indexed; null with data.blend)"),
    KINT_NULL("data.eos_id", data.eos_id, 0,
              "token put between two documents of an indexed dataset (the tokenizer's "
              "end-of-text id); null: documents follow each other directly"),
    KBOOL("data.document_masking", data.document_masking, "false",
          "block-causal attention in packed sequences: a token attends only to earlier tokens "
          "of its own document, each ended by data.eos_id (any source; needs data.eos_id)"),
    {.path = "data.blend",
     .type = HS_CFG_BLEND,
     .def = "[]",
     .offset = offsetof(hs_config, data.blend),
     .size = sizeof(((hs_config *)0)->data.blend),
     .count_offset = offsetof(hs_config, data.n_blend),
     .allowed = "list of {path: PREFIX, weight: w >= 0}",
     .doc = "indexed datasets blended by weight (data.source indexed, data.path null): each "
            "one's share of the samples is its weight over the sum (docs/data.md)"},
    {.path = "data.val_fraction",
     .type = HS_CFG_FLOAT,
     .def = "0.05",
     .bounds = UNIT_OPEN,
     .min = 0,
     .max = 1,
     FIELD(data.val_fraction),
     .doc = "fraction of the data held out for validation"},

    /* checkpoint */
    KSTR("checkpoint.dir", checkpoint.dir, "null", true, NULL,
         "distributed checkpoint directory; null: no checkpoints"),
    KINT("checkpoint.save_every", checkpoint.save_every, "0", GE, 0,
         "steps between checkpoints; 0: only at the end (when dir is set)"),
    KSTR("checkpoint.resume", checkpoint.resume, "none", false, "none | auto | a checkpoint path",
         "none: start fresh; auto: latest checkpoint in dir if any; a path: that checkpoint"),
    KINT("checkpoint.keep_last", checkpoint.keep_last, "2", GE, 1,
         "checkpoints kept in dir (older ones are deleted)"),
    KBOOL("checkpoint.async", checkpoint.async, "true",
          "snapshot to host memory; write and publish on background threads (docs/checkpoint.md)"),

    /* trace */
    KBOOL("trace.enabled", trace.enabled, "false",
          "write a per-rank Chrome trace (compute, collectives, copies, memory)"),
    KSTR("trace.dir", trace.dir, "null", true, NULL,
         "trace directory; null: <train.out_dir>/trace"),

    /* metrics */
    KBOOL("metrics.tensorboard", metrics.tensorboard, "false",
          "also write TensorBoard events (events.out.tfevents.*) to train.out_dir: loss, val "
          "loss, lr, grad norm, tokens/s, MFU and memory per step"),

    /* comm */
    KFLOAT("comm.timeout_s", comm.timeout_s, "600", GT, 0, 0,
           "seconds a collective may take before the run fails with a timeout"),
    KINT("comm.check_every", comm.check_every, "100", GE, 0,
         "steps between collective fingerprint checks (the ranks compare what collectives they "
         "issued; a mismatch ends the run naming both sides); 0: off; 1: every step and every "
         "collective before it runs (debug mode, slower)"),

    /* compile */
    KBOOL("compile.fullgraph", compile.fullgraph, "false",
          "whole-graph compilation; not supported together with FSDP (spec rule 10)"),
};

static const hs_cfg_removed removed[] = {
    {"fsdp_config.enabled",
     "was removed: there is no FSDP switch; FSDP follows the topology (FSDP2Manager is created "
     "when the world has more than one rank and the dp x cp domain, or the expert domain, spans "
     "more than one). Delete the key"},
    {"fsdp_config.dp_replicate_size",
     "was removed: it is derived as (dp_size x cp_size) / fsdp_config.dp_shard_size. Delete the "
     "key and set fsdp_config.dp_shard_size"},
    {"fsdp_config.wrap_policy",
     "was removed: the manager wraps every transformer block (and routed-expert group), then the "
     "root. Delete the key"},
    {"fsdp_config.auto_wrap_policy",
     "was removed: the manager wraps every transformer block (and routed-expert group), then the "
     "root. Delete the key"},
    {"fsdp_config.mixed_precision", "was renamed to fsdp_config.mix_precision"},
    {"fsdp_config.cpu_offload", "was replaced by fsdp_config.enable_offload (true or false)"},
    {"fsdp_config.forward_prefetch",
     "was replaced by fsdp_config.forward_prefetch_depth (units prefetched ahead; 0: off)"},
    {"fsdp_config.backward_prefetch",
     "was replaced by fsdp_config.backward_prefetch_depth (units prefetched ahead; 0: off)"},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

const hs_cfg_key *hs_cfg_keys(int *n) {
    *n = COUNT(keys);
    return keys;
}

const hs_cfg_key *hs_cfg_key_find(const char *path) {
    for (int i = 0; i < COUNT(keys); i++)
        if (!strcmp(keys[i].path, path)) return &keys[i];
    return NULL;
}

bool hs_cfg_is_section(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < COUNT(keys); i++)
        if (!strncmp(keys[i].path, path, n) && keys[i].path[n] == '.') return true;
    return false;
}

const hs_cfg_removed *hs_cfg_removed_keys(int *n) {
    *n = COUNT(removed);
    return removed;
}

const char *hs_cfg_type_name(hs_cfg_type t) {
    static const char *const names[] = {
        [HS_CFG_INT] = "an integer",
        [HS_CFG_INT64] = "an integer",
        [HS_CFG_FLOAT] = "a number",
        [HS_CFG_BOOL] = "true or false",
        [HS_CFG_STRING] = "a string",
        [HS_CFG_ENUM] = "one of the listed names",
        [HS_CFG_DTYPE] = "a dtype (float16, bfloat16, float32) or null",
        [HS_CFG_TRIBOOL] = "true, false or null",
        [HS_CFG_STRLIST] = "a list of strings like [a, b]",
        [HS_CFG_FLOAT_PAIR] = "a pair of numbers like [0.9, 0.95]",
        [HS_CFG_INTLIST] = "a list of integers like [3, 5]",
        [HS_CFG_BLEND] = "a list of {path: P, weight: w} mappings",
        [HS_CFG_BOOL_OR] = "true, false or one of the listed names",
    };
    _Static_assert(sizeof(names) / sizeof(names[0]) == HS_CFG_TYPE_COUNT,
                   "names must follow hs_cfg_type");
    return (unsigned)t < HS_CFG_TYPE_COUNT ? names[t] : "?";
}
