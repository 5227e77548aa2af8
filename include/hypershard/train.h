/* hypershard/train.h — the trainer loop, evaluation, generation and the
 * plan.
 *
 * Contract of this layer:
 * - The trainer runs on every rank of an initialised hs_comm; rank 0 alone
 *   writes files and prints. Where parameters live (one process, FSDP
 *   shards, a pipeline stage) is an opaque engine: what a step needs of it
 *   is public (a benchmark runs the trainer's step with it), the rest is
 *   private (src/train/engine.h).
 * - It reads its data through data.h and writes and reads weights
 *   (checkpoints, safetensors, Hugging Face directories) through ckpt.h.
 */
#ifndef HYPERSHARD_TRAIN_H
#define HYPERSHARD_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hypershard/base.h"
#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/mesh.h"
#include "hypershard/model.h"
#include "hypershard/optim.h"
#include "hypershard/parallel.h"
#include "hypershard/tensor.h"

/* --------------------------------------------------------------- trainer */

/* Graceful stop on SIGTERM / SIGINT (Slurm preemption, Ctrl-C). Start it
 * before any other thread exists (before MPI_Init): it blocks both signals
 * in the process and waits for them on a thread of its own. The first one
 * requests a stop: the trainer finishes its step, saves a checkpoint when
 * checkpoint.dir is set and returns HS_STOPPED (exit 3); any rank's request
 * stops every rank after the same step. A second signal ends the process
 * at once (exit 128 + the signal's number). */
typedef struct hs_stop hs_stop;

hs_stop *hs_stop_start(void);
/* The signal that requested the stop, or 0. Thread-safe. */
int hs_stop_signal(const hs_stop *s);

typedef struct hs_train_options {
    const char *init_from; /* NULL or a safetensors dir (model.safetensors) */
    const char *dump_dir;  /* NULL, or where --dump writes per-step fp32 weights,
                            * gradients and logits (docs/training.md) */
    const hs_stop *stop;   /* NULL: signals keep their default action */
    /* generate and eval: the trainer runs forward only, so it builds no
     * optimizer (nor its states), no gradient buffers where the engine can
     * leave them out, and no checkpoint writer. */
    bool inference;
    /* generate: nothing reads the data, so none is opened (the built-in
     * corpus is not generated). */
    bool no_data;
} hs_train_options;

/* Train cfg (already validated for this world, topology topo) on every rank
 * of comm. Writes <out_dir>/{config.yaml,metrics.jsonl,model.safetensors,
 * config.json} from rank 0. */
hs_status hs_train_run(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                       const hs_train_options *opt, const hs_log *log, hs_error *e);

/* A checkpoint's config.yaml is a copy for people and for `--ckpt`
 * commands; the metadata's config_hash is what its tensors were saved with.
 * HS_ERR_FORMAT naming the file and both hashes when config.yaml cannot be
 * read or no longer hashes to `saved_hash` (it was edited after the save);
 * a checkpoint saved without one (the ckpt library alone) passes. */
hs_status hs_train_ckpt_config_check(const char *step_dir, uint64_t saved_hash, hs_error *e);

/* Inference on trained weights (generate.c), on every rank of comm in the
 * layout cfg gives: the weights come from opt->init_from (a run's or an
 * export's model.safetensors) or from cfg->checkpoint.resume (a checkpoint
 * of any layout, resharded on load). Nothing is written. */
typedef struct hs_generate_options {
    const int32_t *prompt; /* tokens (bytes for byte-level data) */
    int prompt_len;        /* >= 1 */
    int max_new_tokens;
    double temperature; /* 0: greedy */
    int top_k;          /* 0: the whole vocabulary */
    uint64_t seed;      /* of the sampling */
    /* rank 0, each token as it is produced (may be NULL) */
    void (*emit)(void *ctx, int32_t token);
    void *emit_ctx;
    /* the full forward of the window for every token instead of the
     * model's KV cache (the same text; docs/generate.md "KV cache") */
    bool no_kv_cache;
} hs_generate_options;

/* The continuation, max_new_tokens of it, into out (on every rank). A
 * prompt longer than train.seq_len keeps its last seq_len - 1 tokens; the
 * context window slides as the text grows. */
hs_status hs_train_generate(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                            const hs_train_options *opt, const hs_log *log,
                            const hs_generate_options *g, int32_t *out, hs_error *e);
/* Mean loss per token over the validation sequences the trainer evaluates
 * on (data.* of cfg), the same value as a run's val loss. */
hs_status hs_train_eval(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                        const hs_train_options *opt, const hs_log *log, double *val_loss,
                        hs_error *e);

/* --------------------------------------------------------------- engines */

/* Where this rank's parameters live and how one step runs on them: one
 * process (the local engine), FSDP shards with the model parallel contexts,
 * or a pipeline stage. The trainer drives it; the rest of it (checkpoint
 * views, whole-tensor gather and set) is private to this layer
 * (src/train/engine.h). One optimizer step of one micro-batch, as
 * src/train/step.c runs it:
 *
 *   hs_engine_begin_micro_batch(en, true, true, true);
 *   hs_model_forward_backward(hs_engine_model(en), batch, scale, hs_engine_hooks(en), ...);
 *   hs_engine_grad_norm(en, &norm, e);
 *   hs_clip_grads(...) and hs_optim_step(...) over hs_engine_optim_params(en, ...);
 *   hs_engine_after_step(en, e);
 *   hs_engine_zero_grads(en);
 */
typedef struct hs_engine hs_engine;

/* What an engine needs to build the model and place its parameters. */
typedef struct hs_engine_env {
    const hs_config *cfg;
    const hs_topology *topo;
    hs_comm *comm;
    hs_mesh *mesh;
    hs_device *dev;
    const hs_log *log;
    int max_batch; /* sequences per forward (train.micro_batch_size) */
    /* Pipeline stage of this rank (its chunks of blocks; none: the whole
     * model) and the activation slots per chunk its schedule needs (0: 1). */
    hs_model_stage stage;
    int act_slots;
    /* Every parameter is set from a file before the first step (the
     * model's weights_from_file): no random init is drawn. */
    bool weights_from_file;
    /* Forward only (generate, eval): no gradient buffers where the engine
     * can leave them out (the model's no_grad). */
    bool inference;
} hs_engine_env;

/* The one place the engine is chosen. */
hs_status hs_engine_create(const hs_engine_env *env, hs_engine **out, hs_error *e);
/* The local engine whatever the config asks (one process; comm and mesh
 * unused): the model owns full parameters and gradients. */
hs_status hs_engine_local_create(const hs_engine_env *env, hs_engine **out, hs_error *e);
void hs_engine_free(hs_engine *en);

/* The model this rank runs (a pipeline stage's holds its own blocks) and
 * the hooks to run it with. */
hs_model *hs_engine_model(hs_engine *en);
const hs_model_hooks *hs_engine_hooks(hs_engine *en);
/* The parameters the optimizer updates (*out owned by the engine), their count. */
int hs_engine_optim_params(hs_engine *en, hs_optim_param **out);
/* sync: reduce gradients after this micro-batch; reshard: free unsharded
 * params after its backward; last: the step's last micro-batch. */
void hs_engine_begin_micro_batch(hs_engine *en, bool sync, bool reshard, bool last);
hs_status hs_engine_grad_norm(hs_engine *en, double *norm, hs_error *e);
/* After hs_optim_step over hs_engine_optim_params (which also wrote the
 * model's 16-bit copies of fp32 main params): rebuild what derives from
 * the masters. */
hs_status hs_engine_after_step(hs_engine *en, hs_error *e);
void hs_engine_zero_grads(hs_engine *en);
/* For pipeline schedules (hs_pp_run_step): a training step starts; and the
 * forced drain of the gradient reductions after the stage's last backward.
 * Nothing for an engine that has neither. */
void hs_engine_begin_step(hs_engine *en);
void hs_engine_drain(hs_engine *en);
/* The model-parallel plan the model runs with (hs_parallel_tp / _cp / _ep
 * give its contexts), NULL for the local engine. */
hs_parallel *hs_engine_parallel(hs_engine *en);
/* Seconds this rank's compute thread sat blocked on the engine's FSDP
 * collectives since the last call (0 for the local engine); the count
 * starts again. */
double hs_engine_take_exposed(hs_engine *en);

/* ------------------------------------------------------------- the plan */

/* What one rank of a role holds, in bytes (plan.c). The memory model is
 * the code's: the model sizes its buffers with the allocation code
 * (hs_model_options.count_buffers), FSDP's per-parameter sizes follow
 * fsdp/param.c and the unshard / reduce events of one step are replayed in
 * hook order (prefetch, reshard, reduce-scatter waits), as metrics.jsonl's
 * peak_device_bytes counts them: the device pool's peak over a step. */
typedef enum hs_plan_item {
    HS_PLAN_PARAMS = 0,      /* sharded fp32 masters (whole parameters in one process) */
    HS_PLAN_GRADS,           /* sharded fp32 gradients                                  */
    HS_PLAN_MODEL_COPY,      /* fp32 main params: the param_dtype shard the model reads */
    HS_PLAN_OPTIM,           /* optimizer state                                         */
    HS_PLAN_REDUCE,          /* reduce-scatter / all-reduce output slots                */
    HS_PLAN_ACTIVATIONS,     /* activations and scratch at the micro-batch              */
    HS_PLAN_UNSHARDED,       /* all-gathered parameters alive at the peak               */
    HS_PLAN_UNSHARDED_GRADS, /* unsharded gradients and reduce inputs at the peak     */
    HS_PLAN_CKPT_STAGING,    /* checkpoint.async: the snapshot's host staging buffer    */
    HS_PLAN_KERNEL_SCRATCH,  /* cuda: kernels' scratch in the backward, at most         */
    HS_PLAN_ITEM_COUNT
} hs_plan_item;

const char *hs_plan_item_name(hs_plan_item k); /* "params", "grads", ... */

/* Per-step communication of one rank, summed over the step's calls. */
typedef enum hs_plan_comm {
    HS_PLAN_AG = 0,       /* FSDP all-gather (fsdp_shard / edp_shard)     */
    HS_PLAN_RS,           /* FSDP reduce-scatter                          */
    HS_PLAN_AR,           /* HSDP / DDP all-reduce (fsdp_replicate, flat) */
    HS_PLAN_TP,           /* tensor-parallel activations                  */
    HS_PLAN_CP,           /* context-parallel K/V                         */
    HS_PLAN_EP,           /* expert-parallel all-to-all                   */
    HS_PLAN_PP,           /* pipeline hand-over                           */
    HS_PLAN_AG_SECONDARY, /* the backward's all-gathers among a secondary
                           * shard group (fsdp_shard_secondary, hpZ) */
    HS_PLAN_COMM_COUNT
} hs_plan_comm;

const char *hs_plan_comm_name(hs_plan_comm k);

#define HS_PLAN_MAX_ROLES 64
#define HS_PLAN_AR_SIZES 16

typedef struct hs_plan_role {
    char name[48]; /* "every rank", "stage 2" */
    int n_ranks, first_rank;
    int n_blocks; /* blocks this role's model holds */
    int64_t device[HS_PLAN_ITEM_COUNT];
    int64_t host[HS_PLAN_ITEM_COUNT]; /* enable_offload: masters, grads, state */
    /* activations had activation_checkpointing been true (false when it
     * is true) */
    int64_t activations_other;
    /* the end-of-run sample's KV cache (docs/generate.md "KV cache"),
     * allocated after the last step beside everything above; 0 where the
     * layout decodes by full forwards (CP, sequence parallel, EP, document
     * masking) */
    int64_t sample_kv_bytes;
    int64_t peak_device_bytes, peak_host_bytes;
    int64_t comm_bytes[HS_PLAN_COMM_COUNT];
    int64_t comm_calls[HS_PLAN_COMM_COUNT];
    /* One FSDP unit's collectives, as the time model replays them
     * (plan_time.c): [0] the root, [1] a block (the role's average);
     * [..][0] on fsdp_shard / fsdp_replicate, [..][1] the experts on
     * edp_shard / edp_replicate. Bytes of one all-gather output, of one
     * reduce-scatter input and of one all-reduce. */
    int64_t unit_gather[2][2], unit_reduce[2][2], unit_all_reduce[2][2];
    /* Of unit_gather, what the backward gathers among a secondary group
     * instead (secondary_shard_size), and its bytes there (param dtype). */
    int64_t unit_gather_hpz[2][2], unit_gather_secondary[2][2];
    /* FSDP's per-step payload of one rank by group kind, for the link
     * classes (hs_plan_links): [k][0] on fsdp_shard (its secondary groups,
     * fsdp_replicate), [k][1] on edp_shard (edp_replicate), [k][2] on the
     * flat fsdp group (replicate_params' all-reduce); k one of AG, RS, AR,
     * AG_SECONDARY. rs_all_to_all: the reduce-scatters are grad_reduce's
     * all-to-alls. canonical_sums (train.reproducibility: layout): the
     * reduce-scatters are all-to-alls of the ranks' blocks, the
     * all-reduces all-gathers of the whole buffer. The all-reduces' element counts, each with its calls a
     * step (their chunks decide the ring's bytes), up to HS_PLAN_AR_SIZES
     * distinct ones a kind (ar_more: more, the rest counted as even). */
    int64_t fsdp_payload[HS_PLAN_COMM_COUNT][3];
    bool rs_all_to_all, canonical_sums;
    int n_ar_sizes[3];
    int64_t ar_numel[3][HS_PLAN_AR_SIZES], ar_calls[3][HS_PLAN_AR_SIZES];
    bool ar_more;
    /* hs_plan_links: the bytes the role's ranks together send in a step,
     * [k][0] to ranks of their node, [k][1] to other nodes (comm.h, "Link
     * classes"), for k = AG, RS, AR, AG_SECONDARY */
    int64_t sent[HS_PLAN_COMM_COUNT][2];
} hs_plan_role;

typedef struct hs_plan {
    const hs_topology *topo; /* the one it was built for */
    int world, micro_batches;
    const char *engine; /* "local" or "fsdp" (with the model parallel degrees) */
    int n_roles;
    hs_plan_role roles[HS_PLAN_MAX_ROLES];
    int64_t max_peak_device_bytes, max_peak_host_bytes;
    int64_t total_params;     /* of the whole model */
    int64_t checkpoint_bytes; /* one checkpoint of the whole job, estimated */
    int ranks_per_node;       /* of hs_plan_links; 0: the link classes are not planned */
} hs_plan;

/* The plan of cfg (validated for topo->world) without MPI and without
 * allocating any of it; fast for any world size and depth. */
hs_status hs_plan_build(const hs_config *cfg, const hs_topology *topo, hs_plan *out, hs_error *e);
/* The link classes of FSDP's collectives (plan_links.c): with world ranks
 * placed ranks_per_node to a node in order (what mpiexec does by slot),
 * the bytes every role's ranks send inside their nodes and across, as the
 * trace counts them (roles' `sent`); secondary_shard_size as the config's.
 * HS_ERR_OOM without memory for the groups (then nothing is set). */
hs_status hs_plan_links(hs_plan *p, int secondary_shard_size, int ranks_per_node, hs_error *e);
/* The table a person reads (plan_print.c) and the same as one JSON object. */
void hs_plan_print(const hs_plan *p, const hs_config *cfg, FILE *f);
void hs_plan_json(const hs_plan *p, FILE *f);
/* Exit-2 check before any allocation: the peak of the ranks one node runs
 * (ranks_per_node of the busiest role) must fit `avail_bytes` of host
 * memory; else an HS_ERR_CONFIG naming the biggest items and the keys that
 * make it fit. On cpu and reference the device's bytes are host memory
 * and count; on cuda they are the GPU's and only the host bytes do (the
 * GPU's memory refuses what does not fit at allocation, hs_device_oom). */
hs_status hs_plan_check_fit(const hs_plan *p, const hs_config *cfg, int ranks_per_node,
                            int64_t avail_bytes, hs_error *e);

/* One step's time on a cluster (plan_time.c; docs/plan.md "Time"): the
 * busiest rank's step, its parts, and the model FLOPs utilisation against
 * the devices' nominal peak. */
typedef struct hs_plan_time {
    double step_s, tokens_per_s, mfu;
    double model_flops;                   /* per step: 6 N per token (active) + attention */
    double peak_flops;                    /* one device's nominal, in the compute dtype */
    double compute_s;                     /* the step's compute without collectives */
    double exposed_fsdp_s;                /* all-gather / reduce-scatter / all-reduce not hidden */
    double exposed_s[HS_PLAN_COMM_COUNT]; /* tp, cp, ep (critical path), pp (hand-overs) */
    double bubble;                        /* share of the stages' time idle */
    double optimizer_s;                   /* the norm's all-reduce and the update */
    int ranks_per_node;
    double memory_per_rank; /* device memory one rank has */
    bool fits;              /* the plan's largest peak within it */
    int64_t tokens_per_step;
} hs_plan_time;

hs_status hs_plan_time_build(const hs_config *cfg, const hs_topology *topo, const hs_plan *plan,
                             const hs_cluster *cluster, hs_plan_time *out, hs_error *e);
void hs_plan_time_print(const hs_plan_time *t, FILE *f);

/* One layout the search ranks: the overrides that run it, its time and
 * its largest peak. */
typedef struct hs_plan_choice {
    char overrides[768];
    hs_plan_time time;
    int64_t peak_device_bytes;
} hs_plan_choice;

typedef struct hs_plan_search_counts {
    int tried, valid, fit;
    long long global_batch; /* sequences a step, the same for every layout */
} hs_plan_search_counts;

/* The layouts of `world` ranks for the config at `path` (NULL: the
 * built-in default) with `overrides`, keeping its model and global batch
 * (plan_search.c lists what varies); the `top` fastest that fit into
 * best[] (by step time, *n_best of them). HS_ERR_CONFIG when none fits or
 * the config does not load. */
hs_status hs_plan_search(const char *path, const char *const *overrides, int n_overrides, int world,
                         const hs_cluster *cl, int top, hs_plan_choice *best, int *n_best,
                         hs_plan_search_counts *counts, hs_error *e);
void hs_plan_time_json(const hs_plan_time *t, FILE *f);

#endif
