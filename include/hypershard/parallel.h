/* hypershard/parallel.h — model-parallel plans: tensor, context, expert
 * and pipeline parallelism.
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
#include "hypershard/config.h"
#include "hypershard/mesh.h"
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
 * `comm` is what a failing collective aborts; the collectives run on
 * dev's compute stream (dev->stream), where the model's buffers are
 * written and read. */
hs_status hs_tp_create(hs_comm *comm, hs_device *dev, hs_pg *group, bool sequence_parallel,
                       bool loss_parallel, hs_tp **out, hs_error *e);
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
/* The same placement for TP rank `rank` of `size`, without a group: what
 * hs_tp_apply_plan does, for a model that only describes a rank (the
 * memory plan). */
hs_status hs_tp_place(hs_model *m, const hs_tp_rule *rules, int n_rules, int size, int rank,
                      bool sequence_parallel, hs_error *e);

/* The whole fp32 tensor of p (numel of p->shape) from every TP rank's
 * local fp32 tensor (numel of p->local_shape), the pieces placed by d's
 * copies; both in d's memory. Collective over tp. */
hs_status hs_tp_gather_full(hs_device *d, hs_tp *t, const hs_param *p, const float *local,
                            float *full, hs_error *e);
/* This TP rank's local slice of the whole fp32 tensor of p (d's copies). */
void hs_tp_local_slice(hs_device *d, const hs_param *p, const float *full, float *local);

/* ---------------------------------------------------- context parallel
 *
 * hs_cp fills the context-parallel part of a model's ops table over the
 * cp group: all-gather of K/V and reduce-scatter of dK/dV (allgather), or
 * the ring's send/recv steps, issued on the comm thread so a transfer
 * overlaps the attention of the block in hand (ring). Failures end every
 * rank. The sequence layout itself is the model's (hs_cp_take_local_ids). */
typedef struct hs_cp hs_cp;

/* The collectives and ring steps run on dev's compute stream. */
hs_status hs_cp_create(hs_comm *comm, hs_device *dev, hs_pg *group, bool ring, hs_cp **out,
                       hs_error *e);
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

/* The exchanges run on dev's compute stream. */
hs_status hs_ep_create(hs_comm *comm, hs_device *dev, hs_pg *group, hs_ep **out, hs_error *e);
void hs_ep_free(hs_ep *p);
/* Set ops' ep_* members (the rest of the table is left as it is). */
void hs_ep_fill_ops(hs_ep *p, hs_model_ops *ops);
/* Place the routed experts of m (created with the filled ops) on ep, before
 * the TP plan (which leaves parameters on the ep mesh alone and checks the
 * whole layout); without TP, check it with hs_model_check_tp_layout. */
hs_status hs_ep_apply_plan(hs_ep *p, hs_model *m, hs_error *e);
/* The same placement for EP rank `rank` of `size`, without a group. */
hs_status hs_ep_place(hs_model *m, int size, int rank, hs_error *e);
/* The whole fp32 tensor of q from every EP rank's local one (a plain copy
 * when q is not on the ep mesh), both in d's memory. Collective over ep
 * when it is. */
hs_status hs_ep_gather_full(hs_device *d, hs_ep *p, const hs_param *q, const float *local,
                            float *full, hs_error *e);
/* This EP rank's slice of the whole fp32 tensor of q (d's copies). */
void hs_ep_local_slice(hs_device *d, const hs_param *q, const float *full, float *local);
hs_parallel_stats hs_ep_get_stats(const hs_ep *p);
void hs_ep_reset_stats(hs_ep *p);

/* --------------------------------------------------- pipeline parallel
 *
 * The model is cut into pp x V chunks of consecutive blocks
 * (hs_config_pp_stages; V = pp_virtual_stages, 1 unless interleaved):
 * chunk c runs on stage c % pp, so stage s holds chunks s, s + pp, ...
 * (its local chunks v = 0 .. V-1). The first chunk also holds the
 * embedding, the last the final norm and lm_head. Ranks are pp-major, so
 * the ranks of one stage are a contiguous block of the world and every
 * FSDP/TP/CP/EP group lies inside one stage.
 *
 * A schedule is the list of actions one stage runs in one optimizer step
 * over the step's M micro-batches: F(v, i), the forward of micro-batch i
 * through local chunk v, and B(v, i), its backward. gpipe: every forward,
 * then every backward. 1f1b: pp-1-s forwards to fill the pipe, then one
 * forward and one backward in turn, then the remaining backwards.
 * interleaved_1f1b (V >= 2, M a multiple of pp): rounds of pp micro-batches
 * go through the chunks in turn, 2 (pp-1-s) + (V-1) pp forwards fill the
 * pipe, then 1F1B. Every schedule runs each chunk's backwards in
 * micro-batch order. Micro-batch i of chunk v lives in activation slot
 * i % slots of that chunk.
 *
 * Hand-over: activations travel chunk c -> c+1 (stage s -> s+1, the last
 * stage's going round to stage 0) on the group "pp_forward", gradients back
 * on "pp_backward", on the pipeline queues, which start sends and receives
 * without blocking (comm.h). Every receive of a step is posted when the
 * step starts, into a staging buffer of its own, tagged by the receiving
 * (chunk, micro-batch); sends go from staging copies, so the model's
 * buffers are free at once and no wait depends on the order of messages. */
typedef enum hs_pp_kind { HS_PP_FORWARD = 0, HS_PP_BACKWARD } hs_pp_kind;

typedef struct hs_pp_action {
    hs_pp_kind kind;
    int chunk; /* local chunk v */
    int micro_batch;
} hs_pp_action;

typedef enum hs_pp_schedule_kind {
    HS_PP_GPIPE = 0,
    HS_PP_1F1B,
    HS_PP_INTERLEAVED
} hs_pp_schedule_kind;

/* "gpipe" / "1f1b" / "interleaved_1f1b"; false for anything else. */
bool hs_pp_schedule_parse(const char *name, hs_pp_schedule_kind *out);
/* The 2*M*V actions of stage `stage` of pp in order into out (V: local
 * chunks, 1 but for interleaved). */
void hs_pp_schedule(hs_pp_schedule_kind kind, int pp, int stage, int M, int V, hs_pp_action *out);
/* The chunks of stage `stage` (hs_config_pp_stages' chunks stage,
 * stage + pp, ...; pp_virtual_stages of them, 1 without), as the stage's
 * model holds them. */
void hs_pp_stage_chunks(const hs_config *cfg, int stage, hs_model_stage *out);
/* Micro-batches at most in flight in one chunk of `stage` (the activation
 * slots per chunk it needs). */
int hs_pp_slots(hs_pp_schedule_kind kind, int pp, int stage, int M, int V);

typedef struct hs_pp hs_pp;

/* Collective over the world: the two hand-over groups of this rank's pp
 * coordinate line (same dp, cp, tp; ordered by stage), named
 * "<prefix>pp_forward" / "<prefix>pp_backward" (prefix NULL: none), with
 * staging for `keys` messages per direction (keys >= M x V: one per
 * receiving chunk and micro-batch) of up to max_numel elements (fp32 or
 * narrower) and second messages of up to max_extra fp32 values. Messages
 * are copied into and out of the staging buffers by dev's copies; the
 * buffers are dev's memory (hs_pp_staging_bytes of them, which the memory
 * plan counts) and the sends and receives run on dev's compute stream. */
hs_status hs_pp_create(hs_comm *comm, hs_device *dev, const hs_topology *t, int world_rank,
                       int64_t max_numel, int64_t max_extra, int keys, const char *prefix,
                       hs_pp **out, hs_error *e);
/* The largest hand-over messages of cfg at context-parallel degree cp:
 * this rank's rows of a micro-batch (T / cp of each sequence, all of them;
 * sequence parallel only ever has fewer) and the MoE statistics (0
 * without MoE). */
void hs_pp_message_numel(const hs_config *cfg, int cp, int64_t *numel, int64_t *extra);
/* The device bytes of hs_pp_create's staging for those sizes (the memory
 * plan counts them); products checked into ck. */
int64_t hs_pp_staging_bytes(hs_checked *ck, int64_t max_numel, int64_t max_extra, int keys);
void hs_pp_free(hs_pp *p);
int hs_pp_stage(const hs_pp *p);
int hs_pp_size(const hs_pp *p);
/* Activations from the previous stage (stage - 1, or pp - 1 for stage 0):
 * post the receive of message `key` (numel elements of dt, and `extra`
 * fp32 values in a second message: the MoE statistics; 0 for none), then
 * take them into dst and extra_dst. */
void hs_pp_post_recv_forward(hs_pp *p, int key, int64_t numel, hs_dtype dt, int64_t extra);
hs_status hs_pp_take_forward(hs_pp *p, int key, void *dst, float *extra_dst, hs_error *e);
/* Activations (and extra_n fp32 values) to the next stage as its message
 * `key`, copied at once. */
hs_status hs_pp_send_forward(hs_pp *p, int key, const void *src, int64_t numel, hs_dtype dt,
                             const float *extra, int64_t extra_n, hs_error *e);
/* Gradients (fp32) from the next stage / to the previous one, likewise
 * (the extra values: the MoE routers' aux gradient). */
void hs_pp_post_recv_backward(hs_pp *p, int key, int64_t numel, int64_t extra);
hs_status hs_pp_take_backward(hs_pp *p, int key, float *dst, float *extra_dst, hs_error *e);
hs_status hs_pp_send_backward(hs_pp *p, int key, const float *src, int64_t numel,
                              const float *extra, int64_t extra_n, hs_error *e);
/* Wait for every send still in flight (end of a step); every posted
 * receive must have been taken. */
hs_status hs_pp_flush(hs_pp *p, hs_error *e);
/* Seconds inside the stage's forwards and backwards (hs_pp_run_step) since
 * creation or the last reset: a step's wall time minus this is the stage's
 * bubble and hand-over. */
double hs_pp_busy_seconds(const hs_pp *p);
void hs_pp_reset_stats(hs_pp *p);

/* What one step of a schedule asks its caller. */
typedef struct hs_pp_step_io {
    void *ctx;
    /* micro-batch mb's batch as this rank runs it (called before each of
     * its forwards and backwards) */
    hs_batch (*batch)(void *ctx, int mb);
    /* before the backward of (chunk, mb); last: the chunk's last backward of
     * the step (every schedule runs a chunk's backwards in micro-batch
     * order) */
    void (*before_backward)(void *ctx, int chunk, int mb, bool last);
    hs_trace *trace;      /* NULL or disabled: no spans */
    const char *schedule; /* for the spans' args */
} hs_pp_step_io;

/* One optimizer step's actions (hs_pp_schedule) on stage model m (its
 * chunks the stage's, created with hs_pp_slots slots per chunk): each
 * forward and backward in its slot, with the hand-over; a span "F<i>" /
 * "B<i>" (interleaved: "F<i>.<v>") per action on the compute lane.
 * *loss_sum / *aux_sum: the head's loss sums and MoE aux terms (0
 * elsewhere). Ends with every send gone out. */
hs_status hs_pp_run_step(hs_pp *p, hs_model *m, const hs_model_hooks *hooks,
                         const hs_pp_action *actions, int n_actions, int M, float grad_scale,
                         const hs_pp_step_io *io, double *loss_sum, double *aux_sum, hs_error *e);
/* Forward only through every chunk on batch b (slot 0 of each): the head's
 * loss sum and logits (either may be NULL) stay on the last stage. */
hs_status hs_pp_forward_only(hs_pp *p, hs_model *m, const hs_model_hooks *hooks, const hs_batch *b,
                             double *loss_sum, float *logits, hs_error *e);

#endif
