/* train/engines.h — where parameters live, as seen by the trainer.
 *
 * The trainer drives one optimizer step the same way whatever holds the
 * weights: it asks the engine for the model's hooks, announces each
 * micro-batch, takes the optimizer's parameter list, the global grad norm,
 * and calls after_step / zero_grads. `gather_full` / `set_full` move whole
 * fp32 tensors in and out (export, --init-from); under FSDP they are
 * collective over the data-parallel domain, so every rank calls them for the
 * same parameters in the same order.
 *
 * engine_local.c: one process; the model owns full params and grads.
 * An FSDP engine (built on fsdp.h) plugs in through hs_engine_create.
 */
#ifndef HS_TRAIN_ENGINES_H
#define HS_TRAIN_ENGINES_H

#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/fsdp.h"
#include "hypershard/mesh.h"
#include "hypershard/model.h"
#include "hypershard/optim.h"
#include "hypershard/parallel.h"
#include "hypershard/train.h"

/* hs_engine, hs_engine_env and the calls a step makes are public (train.h);
 * the vtable behind them is this. */

/* One parameter as a checkpoint sees it (train/checkpoint.c): this rank's
 * dim-0 chunk of the logical tensor, rows [row_offset, row_offset + rows),
 * held in the fp32 master the optimizer updates (hs_optim_param
 * param_index: same numel, same order as its optimizer state). Replicas
 * (HSDP, replicate_params, one process) describe the same chunk; the
 * checkpoint layer writes it once. */
typedef struct hs_engine_ckpt_param {
    int64_t row_offset, rows;
    float *master;
    int64_t storage_rows; /* rows of the buffer behind `master` (padded
                           * communication storage: its tail is zeroed on
                           * load); 0 = rows */
    void *model_copy;     /* NULL, or the model's own shard in model_dtype
                             * kept apart from the master (fp32 main params) */
    hs_dtype model_dtype;
} hs_engine_ckpt_param;

struct hs_engine {
    const char *name; /* "local", "fsdp" */
    void *ctx;
    hs_model *model; /* created and owned by the engine: what this rank runs */
    /* Every parameter of the whole model (a pipeline stage's model holds
     * its own only): the index space of gather_full / set_full /
     * gather_full_grad. NULL: the same as model. */
    hs_model *catalog;
    const hs_model_hooks *(*hooks)(hs_engine *en);
    /* sync: reduce gradients after this micro-batch; reshard: free unsharded
     * params after its backward; last: the step's last micro-batch. */
    void (*begin_micro_batch)(hs_engine *en, bool sync, bool reshard, bool last);
    int (*optim_params)(hs_engine *en, hs_optim_param **out);
    hs_status (*grad_norm)(hs_engine *en, double *norm, hs_error *e);
    /* train.reproducibility: layout (NULL otherwise): the exact sum of
     * every gradient's squares over the ranks that hold distinct pieces,
     * added to *sum; hs_engine_grad_norm takes its root instead of
     * grad_norm. */
    hs_status (*grad_sumsq_exact)(hs_engine *en, hs_xsum *sum, hs_error *e);
    /* The masters changed: stepped, by hs_optim_step over optim_params
     * (the model's 16-bit copies written with them); else by a load, which
     * leaves the copies to rebuild. */
    hs_status (*after_step)(hs_engine *en, bool stepped, hs_error *e);
    void (*zero_grads)(hs_engine *en);
    hs_status (*gather_full)(hs_engine *en, int param_index, float *out, hs_error *e);
    hs_status (*set_full)(hs_engine *en, int param_index, const float *full, hs_error *e);
    /* Optional: for a run that only reads its weights, take parameter
     * param_index's values where `full` holds them, in place of set_full's
     * copy (hs_model_borrow_param: the caller keeps `full` until the engine
     * is freed); false where the engine cannot, set_full then. */
    bool (*borrow_full)(hs_engine *en, int param_index, const float *full);
    /* Optional (NULL when the engine cannot): the full fp32 gradient of the
     * step so far, before clipping. Used by `train --dump`. */
    hs_status (*gather_full_grad)(hs_engine *en, int param_index, float *out, hs_error *e);
    /* This rank's chunk of parameter `param_index` for checkpoints. After a
     * load writes the masters, the trainer calls after_step (not stepped) so that
     * whatever derives from them (model copies, offload) is rebuilt. */
    void (*ckpt_param)(hs_engine *en, int param_index, hs_engine_ckpt_param *out);
    /* Optional: the model-parallel plan the model runs with (its TP, CP
     * and EP contexts; benchmarks read their stats). */
    hs_parallel *(*parallel)(hs_engine *en);
    /* Optional: this rank's unit listing as JSON (hs_fsdp_write_units). */
    void (*write_units)(hs_engine *en, FILE *out);
    /* Optional, for pipeline schedules (parallel.h): a training step
     * starts; and the forced, idempotent drain of the gradient reductions
     * after the stage's last backward (hs_fsdp_begin_step / hs_fsdp_drain). */
    void (*begin_step)(hs_engine *en);
    void (*drain)(hs_engine *en);
    /* Optional: the seconds the compute thread sat blocked on the engine's
     * own collectives (FSDP's all-gathers, reduce-scatters, all-reduces)
     * since the last call, which starts the count again. */
    double (*take_exposed)(hs_engine *en);
    void (*free)(hs_engine *en);
};

/* Whether the FSDP engine holds the parameters (an FSDP domain, model
 * parallelism, or one process with mixed precision / offload / fp32 main
 * params); else the local engine. */
bool hs_engine_uses_fsdp(const hs_config *cfg, const hs_topology *topo);
/* The options the chosen engine creates its model with, before its pool
 * and ops: the trainer's and the plan's (plan.c) one source. */
hs_model_options hs_engine_model_options(const hs_config *cfg, bool fsdp, int max_batch,
                                         hs_model_stage stage, int act_slots);

/* train.freeze (freeze.c). check: every pattern matches a parameter of the
 * whole model (catalog), none of the MoE layer, and comm_fusion is off;
 * else config errors naming the pattern. apply: freeze m's matching
 * parameters before FSDP wraps it (their count). */
hs_status hs_train_freeze_check(const hs_config *cfg, const hs_model *catalog, hs_error *e);
int hs_train_freeze_apply(const hs_config *cfg, hs_model *m);

/* The model whose parameters gather_full / set_full index. */
hs_model *hs_engine_catalog(const hs_engine *en);
/* Pipeline parallelism: wraps `inner` (which runs this rank's stage) so
 * that gather_full / set_full / gather_full_grad address the whole model
 * (the owning stage gathers, the pp group receives it by broadcast) and
 * grad_norm counts every stage; takes ownership of inner. */
/* The FSDP engine: the model without parameter storage, wrapped
 * (FSDP2Manager) by hs_parallelize: parameters are sharded over the mesh's
 * FSDP groups and initialised from train.seed so that every shard equals the
 * same rows of the one-process init. */
hs_status hs_engine_fsdp_create(const hs_engine_env *env, hs_engine **out, hs_error *e);
hs_status hs_engine_pp_create(const hs_engine_env *env, hs_engine *inner, hs_engine **out,
                              hs_error *e);

/* What hs_parallelize builds for one rank: the model-parallel plan (its
 * seam), the model of the rank's pipeline stage, and FSDP over it. */
typedef struct hs_parallelized {
    hs_parallel *par;
    hs_model *model;
    hs_fsdp *fsdp;
} hs_parallelized;

/* torchtitan's parallelize_llama for hypershard: TP -> CP -> EP
 * (hs_parallel_create: the style table places every parameter as the model
 * registers it), PP (the model holds env->stage's chunks), then FSDP
 * (hs_fsdp_wrap over the local tensors, after train.freeze). On failure
 * nothing is left allocated. */
hs_status hs_parallelize(const hs_engine_env *env, hs_parallelized *out, hs_error *e);
void hs_parallelized_free(hs_parallelized *pz);

/* Adapters for hs_hf_save / hs_hf_load (ctx = the engine). */
hs_status hs_engine_get_param(void *ctx, int param_index, float *out, hs_error *e);
hs_status hs_engine_set_param(void *ctx, int param_index, const float *full, hs_error *e);
/* hs_param_borrow_fn over the engine's borrow_full (false without one). */
bool hs_engine_borrow_param(void *ctx, int param_index, const float *full);

#endif
