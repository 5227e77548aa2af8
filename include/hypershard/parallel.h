/* hypershard/parallel.h — model-parallel plans: tensor, context and
 * expert parallelism.
 *
 * Contract of this layer (DESIGN.md §1, spec 004 §3 steps 1-2, RFC 000 §4):
 * - A TP plan is a table of FQN suffix -> style, as torchtitan's
 *   parallelize plans: colwise (Shard(0): output features split, q/k/v,
 *   gate/up), rowwise (Shard(1): input features split, o_proj, down_proj),
 *   vocab (Shard(0) over the vocabulary: embedding and lm_head) and
 *   replicate (norm weights, the MoE router and experts). Applying it sets
 *   every parameter's placement on the "tp" mesh and its TP-local shape
 *   before FSDP wraps; FSDP then shards the TP-local tensor on dim 0.
 * - The plan's errors name the parameter FQNs: a parameter no rule matches,
 *   tied parameters given different placements, a local shape the model
 *   does not compute with (hs_model_check_tp_layout).
 * - hs_tp fills the model's ops table (model.h hs_model_ops) with the
 *   collectives of the TP regions on the tp group: all-reduce after
 *   row-parallel layers; with sequence_parallel all-gather before
 *   column-parallel and reduce-scatter after row-parallel layers; MAX and
 *   SUM for the vocab-parallel loss. A failed collective ends every rank
 *   (hs_comm_abort): a half-run region would leave the others hanging.
 * - Under sequence parallel a Replicate parameter's gradient on one TP rank
 *   covers only its rows: the plan marks it (hs_param.tp_grad_partial) and
 *   FSDP's root TP tail completes it.
 */
#ifndef HYPERSHARD_PARALLEL_H
#define HYPERSHARD_PARALLEL_H

#include <stdbool.h>

#include "hypershard/base.h"
#include "hypershard/comm.h"
#include "hypershard/model.h"

typedef enum hs_tp_style {
    HS_TP_COLWISE = 0,
    HS_TP_ROWWISE,
    HS_TP_VOCAB,
    HS_TP_REPLICATE,
    HS_TP_STYLE_COUNT
} hs_tp_style;

/* "colwise", "rowwise", "vocab", "replicate". */
const char *hs_tp_style_name(hs_tp_style s);
/* The placement a style gives a parameter. */
hs_placement hs_tp_style_placement(hs_tp_style s);

typedef struct hs_tp_rule {
    const char *suffix; /* matches an FQN that ends with ".<suffix>" or is <suffix> */
    hs_tp_style style;
} hs_tp_rule;

/* The plan of the Llama and MoE (Mixtral) models; *n gets its length. */
const hs_tp_rule *hs_tp_default_plan(int *n);

typedef struct hs_tp hs_tp;

/* Tensor parallelism over `group` (the "tp" dim of the mesh; size >= 2).
 * `comm` is what a failing collective aborts. */
hs_status hs_tp_create(hs_comm *comm, hs_pg *group, bool sequence_parallel, bool loss_parallel,
                       hs_tp **out, hs_error *e);
void hs_tp_free(hs_tp *t);
/* The ops table to create the model with (hs_model_options.ops). */
const hs_model_ops *hs_tp_ops(const hs_tp *t);

/* Time the calling thread spent in a model-parallel context's collectives
 * (and, for CP, ring waits) — all of it exposed: they sit on the compute
 * path — with their count and payload bytes (as the trace counts them),
 * since creation or the last reset. */
typedef struct hs_parallel_stats {
    double seconds;
    int64_t calls, bytes;
} hs_parallel_stats;

/* What every TP / CP collective ends with: a failure ends every rank (it
 * cannot be returned through the model), else it is added to `stats`. */
void hs_parallel_done(hs_comm *comm, hs_parallel_stats *stats, double t0, int64_t bytes,
                      hs_status st, const hs_error *e);
hs_parallel_stats hs_tp_get_stats(const hs_tp *t);
void hs_tp_reset_stats(hs_tp *t);

/* Apply `rules` (first match wins) to every parameter of m, which was
 * created with hs_tp_ops(t), except those the EP plan put on the ep mesh.
 * All errors are reported together. */
hs_status hs_tp_apply_plan(hs_tp *t, hs_model *m, const hs_tp_rule *rules, int n_rules,
                           hs_error *e);

/* The whole fp32 tensor of p (numel of p->shape) from every TP rank's
 * local fp32 tensor (numel of p->local_shape). Collective over tp. */
hs_status hs_tp_gather_full(hs_tp *t, const hs_param *p, const float *local, float *full,
                            hs_error *e);
/* This TP rank's local slice of the whole fp32 tensor of p. */
void hs_tp_local_slice(const hs_param *p, const float *full, float *local);

/* ---------------------------------------------------- context parallel
 *
 * hs_cp fills the context-parallel part of a model's ops table over the
 * cp group: all-gather of K/V and reduce-scatter of dK/dV (allgather), or
 * the ring's send/recv steps, issued on the comm thread so a transfer
 * overlaps the attention of the block in hand (ring). Failures end every
 * rank. The sequence layout itself is the model's (hs_cp_take_local). */
typedef struct hs_cp hs_cp;

hs_status hs_cp_create(hs_comm *comm, hs_pg *group, bool ring, hs_cp **out, hs_error *e);
void hs_cp_free(hs_cp *c);
/* Set ops' cp_* members (the rest of the table is left as it is). */
void hs_cp_fill_ops(hs_cp *c, hs_model_ops *ops);
/* Time the calling thread spent in CP collectives and waits, and counts. */
hs_parallel_stats hs_cp_get_stats(const hs_cp *c);
void hs_cp_reset_stats(hs_cp *c);

/* ----------------------------------------------------- expert parallel
 *
 * hs_ep places every routed expert tensor Shard(0) on the "ep" mesh (EP
 * rank r holds experts [r*E/ep, (r+1)*E/ep)) and fills the ep_* members of
 * the model's ops table: the per-expert row counts as an all-to-all, then
 * the rows as an all-to-all-v, on the ep group. FSDP then shards each
 * EP-local expert tensor over the EDP mesh (fsdp_moe_mesh). */
typedef struct hs_ep hs_ep;

hs_status hs_ep_create(hs_comm *comm, hs_pg *group, hs_ep **out, hs_error *e);
void hs_ep_free(hs_ep *p);
/* Set ops' ep_* members (the rest of the table is left as it is). */
void hs_ep_fill_ops(hs_ep *p, hs_model_ops *ops);
/* Place the routed experts of m (created with the filled ops) on ep, before
 * the TP plan (which leaves parameters on the ep mesh alone and checks the
 * whole layout); without TP, check it with hs_model_check_tp_layout. */
hs_status hs_ep_apply_plan(hs_ep *p, hs_model *m, hs_error *e);
/* The whole fp32 tensor of q from every EP rank's local one (a plain copy
 * when q is not on the ep mesh). Collective over ep when it is. */
hs_status hs_ep_gather_full(hs_ep *p, const hs_param *q, const float *local, float *full,
                            hs_error *e);
/* This EP rank's slice of the whole fp32 tensor of q. */
void hs_ep_local_slice(const hs_param *q, const float *full, float *local);
hs_parallel_stats hs_ep_get_stats(const hs_ep *p);
void hs_ep_reset_stats(hs_ep *p);

#endif
