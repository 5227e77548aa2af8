/* train/run.h — the trainer's private state and the pieces of one run:
 * the step (step.c), metrics and logging (metrics.c), evaluation and the
 * greedy sample (evaluate.c), span-recording hooks (trace_hooks.c) and the
 * cross-rank reductions they share (reduce.c). */
#ifndef HS_TRAIN_RUN_H
#define HS_TRAIN_RUN_H

#include <stdio.h>

#include "hypershard/ckpt.h"
#include "hypershard/data.h"
#include "hypershard/train.h"
#include "train/engines.h"

/* Wraps the engine's hooks to record one compute span per unit per
 * forward / backward, and the memory counters, when tracing is on. */
typedef struct hs_trace_hooks {
    hs_model_hooks outer;
    const hs_model_hooks *inner;
    hs_trace *trace;
    hs_model *model;
    hs_device *dev;
    double *fwd_t0, *bwd_t0; /* per unit */
    int n_units;
} hs_trace_hooks;

/* inner is returned unchanged when tracing is off. */
const hs_model_hooks *hs_trace_hooks_init(hs_trace_hooks *th, const hs_model_hooks *inner,
                                          hs_trace *trace, hs_model *model, hs_device *dev);
void hs_trace_hooks_free(hs_trace_hooks *th);

typedef struct hs_trainer {
    const hs_config *cfg;
    const hs_topology *topo;
    const hs_train_options *opt;
    int64_t plan_ckpt_bytes;   /* hs_plan_build's estimate of one checkpoint */
    int64_t plan_ckpt_staging; /* its estimate of a rank's checkpoint.async staging */
    int64_t plan_params;       /* parameter values of the whole model */
    bool ckpt_failed;          /* a checkpoint save failed: the run still writes its weights */
    int last_step;             /* the last step trained and logged */
    /* rank 0's lock of checkpoint.dir (ckpt_lock.c) */
    char lock_path[HS_PATH_MAX + 16];
    bool lock_held, lock_made_dir;
    double *expert_tokens; /* [L x E] for MoE metrics, NULL for dense */
    /* train.reproducibility: layout over M > 1 micro-batches (canonical.c):
     * each micro-batch's loss sum on this rank */
    double *canon_mb_loss;
    hs_comm *comm;
    const hs_log *log;
    hs_trace *trace;
    hs_device *dev;
    hs_mesh *mesh;
    hs_pg *batch_group; /* ranks whose losses add up to the global batch (dp x cp) */
    hs_pg *world_group;
    hs_dataset *data;
    hs_engine *engine;
    /* the weights file whose tensors the engine's parameters read in place
     * (hs_hf_load_borrowing), or NULL */
    hs_st_file *weights_file;
    hs_optim *optim;
    hs_optim_param *oparams;
    int n_oparams;
    hs_trace_hooks th;
    const hs_model_hooks *hooks;
    int dp_rank, dp_size;      /* data-parallel coordinate of this rank */
    int G, mbs, M, T;          /* global batch, micro batch, micro-batches, seq_len */
    int32_t *tokens, *targets; /* [mbs, T] */
    float *logits;             /* [1, T, V] for the sample */
    /* context parallelism: this rank's rows of each sequence (cp_batch.c) */
    int cp, cp_rank;
    hs_pg *cp_group;
    int32_t *ltokens, *ltargets; /* [mbs, T/cp] */
    int32_t *doc_starts;         /* [mbs, T] document masking, else NULL */
    float *llogits, *cp_blocks;  /* [1, T/cp, V], [cp, 1, T/cp, V] */
    /* pipeline parallelism (pp_step.c); pp NULL without it */
    int pp_size, pp_stage;
    hs_pp *pp;
    hs_pg *pp_group;
    hs_pp_schedule_kind pp_kind;
    hs_pp_action *pp_actions;    /* this stage's actions of a step */
    int n_pp_actions;            /* passes x M x virtual stages */
    double pp_span_s, pp_busy_s; /* the last step's schedule: its time, this stage's in actions */
    hs_model_stage stage;        /* this rank's chunks of blocks (none without pp) */
    int act_slots, pp_virtual;   /* slots per chunk; chunks per rank */
    bool rank0;
    /* rank 0's metrics files; a file whose write failed is closed and
     * set to NULL (hs_metrics_lost) */
    FILE *metrics;
    char metrics_path[HS_PATH_MAX + 32];
    int64_t metrics_good; /* bytes of metrics.jsonl up to its last whole line */
    FILE *tb;             /* TensorBoard events (metrics.tensorboard), else NULL */
    char tb_path[HS_PATH_MAX + 160];
    int64_t tb_good;        /* bytes of the events file up to its last whole record */
    double peak_flops;      /* whole job: the MFU denominator (hs_cpu_rank_peak on CPUs) */
    double gemm_flops;      /* whole job: the GEMM rate measured at start-up */
    hs_dtype peak_dtype;    /* the GEMM dtype of both */
    char peak_what[192];    /* how peak_flops was taken, for the log */
    int device_note_serial; /* the device's note last logged (hs_device_note_read) */
    double flops_per_token; /* hs_model_flops_per_token */
    double t_start;
    int start_step; /* optimizer steps already done (a resumed checkpoint's step) */
    int ckpt_step;  /* step of the checkpoint this run has in checkpoint.dir, -1 none */
    hs_ckpt_writer *ckpt_writer; /* checkpoint.async: the background save, NULL before one */
    uint64_t data_seed;          /* of the data order: train.seed, or a resumed checkpoint's */
} hs_trainer;

typedef struct hs_step_result {
    int step;
    double loss, aux_loss, grad_norm, lr, step_time_s;
    /* This rank's exposed communication in the step, as plan --time
     * predicts it: the waits on FSDP's collectives, and the time in TP, CP
     * and EP collectives (all on the compute path), by hs_plan_comm; and
     * under a pipeline the share of the schedule's time its stage sat idle
     * (the bubble, with its hand-over waits). */
    double exposed_fsdp_s, exposed_s[HS_PLAN_COMM_COUNT], bubble;
    int64_t tokens;
    int64_t peak_device_bytes, peak_host_bytes;
    bool has_val;
    double val_loss;
    /* MoE: rows routed to each expert in this step's global batch,
     * [expert_layers x n_experts] (the trainer's buffer; NULL for dense) */
    const double *expert_tokens;
    int expert_layers, n_experts;
    int stop_signal; /* a signal asked any rank to stop: the largest number, else 0 */
} hs_step_result;

hs_status hs_train_step(hs_trainer *t, int step, hs_step_result *r, hs_error *e);
/* model.moe.bias_update_speed: every correction bias this rank holds
 * moved toward balance by the step's global loads [n_layers x E]
 * (moe_bias.c). */
hs_status hs_moe_bias_update(hs_trainer *t, const double *loads, hs_error *e);

/* trainer.c: build everything a run needs from t->cfg, t->topo, t->comm,
 * t->opt, t->log, t->trace (the mesh, data, engine and optimizer, the
 * checkpoint resume), writing nothing; close frees what open built (also
 * after a failed open). */
hs_status hs_trainer_open(hs_trainer *t, hs_error *e);
void hs_trainer_close(hs_trainer *t);

/* --dump (dump.c): NULL when off; the check rejects an engine that cannot
 * gather gradients before anything is written. */
const char *hs_dump_dir(const hs_trainer *t);
hs_status hs_dump_check(const hs_trainer *t, hs_error *e);
/* The dump directory as an output of the run (every rank writes there;
 * rank 0 the tensors, whose size it estimates); false without --dump. */
bool hs_dump_out_dir(const hs_trainer *t, hs_out_dir *d, char *what, size_t cap);
hs_status hs_dump_weights(hs_trainer *t, int step, hs_error *e);
/* units-rank<rank>.json: this rank's FSDP unit listing (no-op elsewhere). */
hs_status hs_dump_units(hs_trainer *t, int rank, hs_error *e);
hs_status hs_dump_grads(hs_trainer *t, int step, hs_error *e);
hs_status hs_dump_logits(hs_trainer *t, int step, hs_error *e);

/* Checkpoints (checkpoint.c). Resume (which first makes the checkpoint.async
 * writer and its staging memory) runs after the optimizer exists and
 * before anything is written: it sets start_step and the loaded state, or
 * leaves a fresh start. Save is collective over the world. */
hs_status hs_train_ckpt_resume(hs_trainer *t, hs_error *e);
/* checkpoint.dir as an output of the run, for the start-up check of every
 * output directory (trainer.c): every rank writes there, up to the
 * checkpoints the run holds at once before pruning to keep_last; false
 * when checkpoint.dir is null. */
bool hs_train_ckpt_out_dir(const hs_trainer *t, hs_out_dir *d, char *what, size_t cap);
/* Rank 0 locks checkpoint.dir for the run (ckpt_lock.c): a directory
 * another live run holds is a config error naming that run; a dead run's
 * lock is recovered. Unlock at exit (idempotent). */
hs_status hs_train_ckpt_lock(hs_trainer *t, hs_error *e);
void hs_train_ckpt_unlock(hs_trainer *t);
/* After each step: publish a background save whose writes have all ended
 * (checkpoint.async), then save when the step is due. Collective. */
hs_status hs_train_ckpt_after_step(hs_trainer *t, int step, hs_error *e);
/* Save this step (in the background under checkpoint.async; a save still
 * in flight is published first). Collective. */
hs_status hs_train_ckpt_save(hs_trainer *t, int step, hs_error *e);
/* Wait for the background save in flight, if any, and publish it. */
hs_status hs_train_ckpt_wait(hs_trainer *t, hs_error *e);
/* The end-of-run save, unless checkpoint.dir already holds this step;
 * returns once it is published. */
hs_status hs_train_ckpt_final(hs_trainer *t, hs_error *e);
/* At exit: a background write still in flight (the run failed) is waited
 * for and left unpublished; frees the staging memory. */
void hs_train_ckpt_close(hs_trainer *t);
/* Drop the lines of metrics.jsonl (rank 0) past `step`, before a resumed
 * run appends its own. A missing file is fine. */
hs_status hs_train_metrics_keep_until(const char *path, int step, hs_error *e);

/* The MFU reference in the dtype hs_peak_flops_dtype gives for the
 * step's compute dtype (fp32 unless the 16-bit matmul is native here). */
hs_dtype hs_peak_flops_dtype(hs_dtype compute);
hs_status hs_measure_peak_flops(hs_dtype dt, double *peak, hs_error *e);
/* This rank's MFU denominator on a CPU: its share of the node's nominal
 * peak (hs_cpu_nominal_peak for compute): min(its GEMM threads, the
 * node's physical cores / local_ranks) cores; where the GEMM rate it
 * measured is higher, the stated clock is below the one the cores run at
 * and the measured rate is the bound. what (cap bytes) says which. */
double hs_cpu_rank_peak(hs_dtype compute, int threads, int local_ranks, double measured, char *what,
                        size_t cap);
/* The same on a GPU (the cuda device), through its own
 * GEMM, in dt as given (16-bit matmuls are native there); before the
 * model is built, leaving the device pool's peak as it found it. */
hs_status hs_measure_device_peak_flops(hs_device *d, hs_dtype dt, double *peak, hs_error *e);
hs_status hs_metrics_open(hs_trainer *t, hs_error *e);
void hs_metrics_write(hs_trainer *t, const hs_step_result *r);
void hs_metrics_log(hs_trainer *t, const hs_step_result *r);
void hs_metrics_close(hs_trainer *t);
/* A metrics file (*f, at path) whose write of `step` failed with errno
 * err: said once, closed, set to NULL and cut back to its `good` bytes
 * of whole records; the run goes on, its checkpoints and weights written
 * as usual (docs/training.md). offset: where f stands (0 when unknown). */
void hs_metrics_lost(hs_trainer *t, FILE **f, const char *path, int64_t good, int err,
                     int64_t step);
int64_t hs_metrics_offset(FILE *f);

/* tensorboard.c: rank 0's events.out.tfevents.* in out_dir when
 * metrics.tensorboard is on (no-ops otherwise): the scalars of each step
 * that metrics.jsonl holds. */
hs_status hs_tb_open(hs_trainer *t, hs_error *e);
void hs_tb_step(hs_trainer *t, const hs_step_result *r, double tokens_per_s, double mfu);
void hs_tb_close(hs_trainer *t);

/* Mean loss over a fixed set of validation sequences (same on every rank). */
hs_status hs_evaluate(hs_trainer *t, double *val_loss, hs_error *e);

/* cp_batch.c: the model on B whole sequences [B, T] as this rank runs it —
 * under context parallelism on its CP rows of each (model.h hs_cp_*). The
 * forward's logits, when asked for, are the whole [B, T, V] on every rank
 * (B = 1). */
hs_status hs_cp_batch_init(hs_trainer *t, hs_error *e);
void hs_cp_batch_free(hs_trainer *t);
/* The rows of B whole sequences this rank runs (its CP rows under CP). */
hs_batch hs_train_local_batch(hs_trainer *t, const int32_t *tokens, const int32_t *targets, int B);
hs_status hs_train_forward_backward(hs_trainer *t, const int32_t *tokens, const int32_t *targets,
                                    int B, float grad_scale, double *loss_sum, double *aux,
                                    hs_error *e);
hs_status hs_train_forward(hs_trainer *t, const int32_t *tokens, const int32_t *targets, int B,
                           double *loss_sum, float *logits, hs_error *e);
/* pp_step.c: pipeline parallelism. init (after M is known, before the
 * engine): the stage, its schedule and the hand-over; nothing without pp.
 * run_micro_batches: one step's micro-batches in schedule order, loss sums
 * of the last stage into sums[0]. forward: the forward-only chain on a
 * local batch; every stage gets the loss sum and logits. */
hs_status hs_pp_trainer_init(hs_trainer *t, hs_error *e);
void hs_pp_trainer_free(hs_trainer *t);
hs_status hs_pp_run_micro_batches(hs_trainer *t, int64_t g, float grad_scale, double sums[2],
                                  hs_error *e);
hs_status hs_pp_forward(hs_trainer *t, const hs_batch *b, double *loss_sum, float *logits,
                        hs_error *e);
/* The stage that holds the head (the last, or the first under zbv's V):
 * its loss sums and logits are broadcast from there. */
int hs_pp_head_stage(const hs_trainer *t);

/* decoder.c: the next token's logits after a window of tokens, for
 * generate and the sample: through the model's KV cache where the layout
 * has one and use_cache (model.h "generation"), else the full forward of
 * the window. */
typedef struct hs_decoder {
    hs_trainer *t;
    hs_kv_cache *kv; /* NULL: the full forward */
    float *row;      /* [V] the cached path's logits */
    int32_t *win;    /* [T] the full forward's window, zeros after it */
} hs_decoder;
/* who: "generate" or "sample", for the log line saying which path runs. */
hs_status hs_decoder_open(hs_decoder *d, hs_trainer *t, const char *who, bool use_cache,
                          hs_error *e);
void hs_decoder_close(hs_decoder *d);
/* The logits (V fp32, valid until the next call) of the token after
 * seq[0, len), 1 <= len < T, on every rank. Between calls the window only
 * grows by the tokens appended to it, unless `slid`: it was re-based
 * (its first tokens dropped), and the cache runs it again from position
 * 0. */
hs_status hs_decoder_next(hs_decoder *d, const int32_t *seq, int len, bool slid,
                          const float **logits, hs_error *e);
/* Greedy continuation of a prompt from the validation split, printed by rank 0. */
hs_status hs_sample(hs_trainer *t, hs_error *e);

/* Sum of n doubles over the group, in rank order (exact and identical on
 * every rank). */
hs_status hs_reduce_sum_f64(hs_pg *g, double *vals, int n, hs_error *e);
/* Max of n int64 over the group. */
hs_status hs_reduce_max_i64(hs_pg *g, int64_t *vals, int n, hs_error *e);

/* canonical.c: train.reproducibility: layout across micro-batches. */
bool hs_canon_micro_batches(const hs_trainer *t);
hs_status hs_canon_step_begin(hs_trainer *t, hs_error *e);
/* Micro-batch m's loss sum on this rank (0 on a stage without the head). */
void hs_canon_micro_batch_done(hs_trainer *t, int m, double loss_sum);
/* The step's loss sum over the batch group: the ranks' per-micro-batch
 * sums as trees over the ranks, then a tree over the micro-batches. */
hs_status hs_canon_loss(hs_trainer *t, double *loss_sum, hs_error *e);
void hs_canon_free(hs_trainer *t);

#endif
