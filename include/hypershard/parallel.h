/* hypershard/parallel.h — model parallelism: the style table, tensor,
 * context and expert parallelism behind the model's seam, and pipeline
 * parallelism.
 *
 * Contract of this layer (DESIGN.md §1, spec 004 §3 steps 1-2, RFC 000 §4):
 * - One style table says how every parameter is parallelized, as
 *   torchtitan's parallelize plans and Megatron's layer classes do: each
 *   rule maps an FQN suffix to a style carrying both the placement and the
 *   region behaviour. colwise (Shard(0) on tp: output features split; the
 *   region it opens gathers its input rows under sequence parallelism),
 *   rowwise (Shard(1): input features split; the region's partial sums are
 *   all-reduced, or reduce-scattered under sequence parallelism), vocab
 *   (Shard(0) over the vocabulary: the embedding's partial rows reduced,
 *   the head's loss vocab-parallel), norm (Replicate; a sequence-parallel
 *   norm runs on the rank's rows and its gradient is a partial sum),
 *   replicate (whole on every rank; a replicated region is token-wise and
 *   runs on the rows the rank holds), expert (Shard(0) on ep: the routed
 *   experts). Context parallelism has no parameters: it is the style of
 *   every attention call when cp > 1.
 * - hs_parallel applies the table, TP -> CP -> EP in that order (spec 004
 *   §3), and is the model's seam (model.h hs_model_par): the model asks it
 *   to place each parameter as it registers it and computes with the local
 *   shapes it gets; the region code (tp_region.c, cp_attention.c) and its
 *   buffers live here. FSDP then shards each local tensor on dim 0.
 * - The table's errors name the parameter FQNs: no matching rule, tied
 *   parameters given different placements, a split that does not divide.
 *   A collective of a region runs on the compute path: a failure ends
 *   every rank (hs_comm_abort), a half-run region would leave the others
 *   hanging.
 */
#ifndef HYPERSHARD_PARALLEL_H
#define HYPERSHARD_PARALLEL_H

#include <stdbool.h>

#include "hypershard/base.h"
#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/mesh.h"
#include "hypershard/model.h"

typedef enum hs_style {
    HS_STYLE_COLWISE = 0,
    HS_STYLE_ROWWISE,
    HS_STYLE_VOCAB,
    HS_STYLE_NORM,
    HS_STYLE_REPLICATE,
    HS_STYLE_EXPERT,
    HS_STYLE_COUNT
} hs_style;

/* "colwise", "rowwise", "vocab", "norm", "replicate", "expert". */
const char *hs_style_name(hs_style s);
/* The placement a style gives a parameter on the tp mesh (expert:
 * Replicate there; its Shard(0) is on the ep mesh). */
hs_placement hs_style_placement(hs_style s);

typedef struct hs_style_rule {
    const char *suffix; /* matches an FQN that ends with ".<suffix>" or is <suffix> */
    hs_style style;
} hs_style_rule;

/* The plan of the Llama and MoE (Mixtral) models (Megatron's: attention
 * and MLP split, norms sequence-parallel, the MoE layer replicated over TP
 * and its experts over EP); *n gets its length. */
const hs_style_rule *hs_style_default_plan(int *n);

typedef struct hs_tp hs_tp;
typedef struct hs_cp hs_cp;
typedef struct hs_ep hs_ep;

/* Time the calling thread spent in a model-parallel context's collectives
 * (and, for CP, ring waits) — all of it exposed: they sit on the compute
 * path — with their count and payload bytes (as the trace counts them),
 * since creation or the last reset. */
typedef struct hs_parallel_stats {
    double seconds;
    int64_t calls, bytes;
} hs_parallel_stats;

/* What every TP / CP / EP collective ends with: a failure ends every rank
 * (it cannot be returned through the model), else it is added to `stats`. */
void hs_parallel_done(hs_comm *comm, hs_parallel_stats *stats, double t0, int64_t bytes,
                      hs_status st, const hs_error *e);

/* ----------------------------------------------------------- hs_parallel */

typedef struct hs_parallel hs_parallel;

/* How attention reaches the other CP ranks' keys
 * (accelerator.cp_rotate_method; "context parallel" below). */
typedef enum hs_cp_method {
    HS_CP_ALLGATHER = 0,
    HS_CP_RING,
    HS_CP_ALLTOALL,
    HS_CP_ALLTOALL_RING
} hs_cp_method;

/* The degrees and this rank's coordinates; sizes of 1 switch a dimension
 * off. cp_a2a: the all-to-all group of the alltoall methods (cp for
 * alltoall, accelerator.cp_a2a_size for alltoall_ring), 1 otherwise. */
typedef struct hs_parallel_layout {
    int tp, tp_rank;
    bool sequence_parallel, loss_parallel;
    int cp, cp_rank;
    hs_cp_method cp_method;
    int cp_a2a;
    int ep, ep_rank;
} hs_parallel_layout;

/* TP -> CP -> EP over the mesh's tp, cp and ep groups (and, for a MoE
 * model over several data ranks, the dp_cp group its router statistics are
 * summed over), with `rules` (NULL: the default plan). `model` is the
 * config's model section (its heads, experts and tied embeddings decide
 * which splits are possible); `accel` its accelerator section
 * (sequence_parallel, loss_parallel and the CP method; the degrees come
 * from the mesh). Collectives run on dev's compute stream; `comm` is what a
 * failing one aborts. */
hs_status hs_parallel_create(const hs_model_config *model, const hs_accel_config *accel,
                             const hs_mesh *mesh, hs_comm *comm, hs_device *dev,
                             const hs_style_rule *rules, int n_rules, hs_parallel **out,
                             hs_error *e);
/* The same placements and buffers for a layout without groups (the memory
 * plan, a test): a model created with it may be described and counted,
 * not run across ranks. `model` and `accel` as for hs_parallel_create; of
 * accel only cp_rotate_method is read, to name it in an error (the layout
 * carries the rest). */
hs_status hs_parallel_describe(const hs_model_config *model, const hs_accel_config *accel,
                               const hs_parallel_layout *l, const hs_style_rule *rules, int n_rules,
                               hs_parallel **out, hs_error *e);
void hs_parallel_free(hs_parallel *p);
/* The seam to create the model with (hs_model_options.par); one model per
 * hs_parallel. */
const hs_model_par *hs_parallel_seam(const hs_parallel *p);
const hs_parallel_layout *hs_parallel_layout_of(const hs_parallel *p);
/* The contexts of the dimensions in use (NULL where the degree is 1). */
hs_tp *hs_parallel_tp(const hs_parallel *p);
hs_cp *hs_parallel_cp(const hs_parallel *p);
hs_ep *hs_parallel_ep(const hs_parallel *p);

/* ------------------------------------------------------- tensor parallel */

hs_parallel_stats hs_tp_get_stats(const hs_tp *t);
void hs_tp_reset_stats(hs_tp *t);

/* The whole fp32 tensor of p (numel of p->shape) from every TP rank's
 * local fp32 tensor (numel of p->local_shape), the pieces placed by d's
 * copies; both in d's memory. Collective over tp. */
hs_status hs_tp_gather_full(hs_device *d, hs_tp *t, const hs_param *p, const float *local,
                            float *full, hs_error *e);
/* This TP rank's local slice of the whole fp32 tensor of p (d's copies). */
void hs_tp_local_slice(hs_device *d, const hs_param *p, const float *full, float *local);

/* ---------------------------------------------------- context parallel
 *
 * Each sequence of a batch is this CP rank's chunks r and 2*cp-1-r of
 * 2*cp equal chunks along T (causal load balance), so the model runs on
 * B x T/cp tokens at their global positions. Only attention crosses CP
 * ranks: allgather gathers K/V over cp for the local queries and
 * reduce-scatters dK/dV back; ring passes K/V blocks round the CP ring one
 * step at a time (issued on the comm thread, so a transfer overlaps the
 * attention of the block in hand), dK/dV likewise; alltoall (Ulysses)
 * trades every rank's rows of all heads for all rows of heads / cp of the
 * heads (q, k, v in, the output back; backward mirrors it) and attends
 * over the whole sequence; alltoall_ring does that inside groups of
 * cp_a2a consecutive CP ranks and runs the ring across the groups. */

/* The method accelerator.cp_rotate_method names for cp ranks, and in *a2a
 * its all-to-all size; alltoall_ring with cp_a2a_size = cp is alltoall,
 * with 1 ring (what runs, and what the plan counts). */
hs_cp_method hs_cp_method_of(const hs_accel_config *a, int cp, int *a2a);
/* A rank's share of a TP rank's H heads over an all-to-all group of a2a
 * ranks: H / a2a, or 1 when H < a2a (a kv head replicated to the ranks
 * whose query heads read it). */
int hs_cp_a2a_heads(int H, int a2a);

/* Of 2*cp chunks of T/(2*cp) positions, CP rank r holds chunk r then chunk
 * 2*cp-1-r: local position t < T_local/2 is global r*C + t, the others
 * (2*cp-1-r)*C + t - C, with C = T_local / 2. */
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
hs_parallel_stats hs_cp_get_stats(const hs_cp *c);
void hs_cp_reset_stats(hs_cp *c);

/* ----------------------------------------------------- expert parallel
 *
 * EP rank r holds the routed experts [r*E/ep, (r+1)*E/ep) of every block
 * (style expert); the MoE layer's exchanges — the per-expert row counts as
 * an all-to-all, then the rows as an all-to-all-v — run on the ep group.
 * FSDP then shards each EP-local expert tensor over the EDP mesh
 * (fsdp_moe_mesh). */

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
 * pipe, then 1F1B. zb1p (ZB-H1, Qi et al. 2024, "Zero Bubble Pipeline
 * Parallelism"): 1F1B's forwards and input backwards B (dI), each block's
 * weight gradients split off into a third action W(v, i) (dW,
 * hs_model_stage_backward_weight); stage s runs a micro-batch's W once s
 * further B's are done, so the W's of the later stages fill the bubbles
 * 1F1B leaves at the end of the step, and at most pp micro-batches are in
 * flight on any stage (1F1B's peak). Every schedule runs each chunk's
 * backwards (and W's) in micro-batch order. zbv (ZB-V, the same paper,
 * section 6): V = 2 chunks per stage in a V, stage s holding model chunks
 * s and 2 pp - 1 - s, so the first stage holds the embedding and the
 * head and the last stage hands its first chunk's output to its second
 * without a message; B and W split as in zb1p. Its lists come from
 * simulating every stage together (pp_zbv.c, with a cost model of the
 * three passes): a free stage runs a ready B (lowest micro-batch first),
 * else a ready F while it holds fewer than 2 pp chunk activations (1F1B's
 * peak, in chunks of half a stage), else the oldest ready W. Micro-batch
 * i of chunk v
 * lives in activation slot i % slots of that chunk, from its F to its B,
 * or to its W where the schedule splits the backward.
 *
 * Hand-over: activations travel chunk c -> c+1 (stage s -> s+1, the last
 * stage's going round to stage 0) on the group "pp_forward", gradients back
 * on "pp_backward", on the pipeline queues, which start sends and receives
 * without blocking (comm.h). Every receive of a step is posted when the
 * step starts, into a staging buffer of its own, tagged by the receiving
 * (chunk, micro-batch); sends go from staging copies, so the model's
 * buffers are free at once and no wait depends on the order of messages. */
/* HS_PP_BACKWARD is the whole backward, or its input pass (B) in a
 * schedule that splits it; HS_PP_WEIGHT the weight pass (W). */
typedef enum hs_pp_kind { HS_PP_FORWARD = 0, HS_PP_BACKWARD, HS_PP_WEIGHT } hs_pp_kind;

typedef struct hs_pp_action {
    hs_pp_kind kind;
    int chunk; /* local chunk v */
    int micro_batch;
} hs_pp_action;

/* The schedule named `name` (hs_pp_schedule_find: config.h's table of
 * schedules, which hs_pp_schedule_kind indexes); false for anything else. */
bool hs_pp_schedule_parse(const char *name, hs_pp_schedule_kind *out);
/* The model chunk stage `stage` runs as its local chunk v
 * (hs_config_pp_chunk), and back: the stage and local chunk of model
 * chunk c. */
int hs_pp_model_chunk(hs_pp_schedule_kind kind, int pp, int stage, int v);
void hs_pp_chunk_home(hs_pp_schedule_kind kind, int pp, int c, int *stage, int *v);
/* Whether the schedule splits each backward into B and W actions (the
 * stage's model then needs hs_model_options.split_backward): the table's
 * splits_backward. */
bool hs_pp_schedule_splits(hs_pp_schedule_kind kind);
/* Actions of one stage's step: hs_pp_schedule_passes x M x V (2*M*V, or
 * 3*M*V when the schedule splits the backward). */
int64_t hs_pp_schedule_length(hs_pp_schedule_kind kind, int M, int V);
/* The hs_pp_schedule_length actions of stage `stage` of pp in order into
 * out (V: local chunks, 1 but for interleaved and zbv); HS_ERR_OOM when
 * zbv's simulation cannot be laid out. */
hs_status hs_pp_schedule(hs_pp_schedule_kind kind, int pp, int stage, int M, int V,
                         hs_pp_action *out, hs_error *e);
/* Every stage's list, stage after stage (out holds pp x
 * hs_pp_schedule_length): zbv's simulation runs once for all of them. */
hs_status hs_pp_schedule_all(hs_pp_schedule_kind kind, int pp, int M, int V, hs_pp_action *out,
                             hs_error *e);
/* Checks a stage's action list as the pipeline will run it: every
 * (chunk, micro-batch) forwarded, backwarded (and weight-passed) exactly
 * once, each B after its F and each W after its B, each chunk's B's and
 * W's in micro-batch order; and, simulating every stage of pp together
 * with messages taking no time, that the hand-overs match (each F of a
 * chunk fed by an earlier stage comes after that F, each B after the B
 * of the chunk after it) so the step cannot hang. HS_ERR_INTERNAL naming
 * the first broken rule. */
hs_status hs_pp_schedule_check(hs_pp_schedule_kind kind, int pp, int M, int V, hs_error *e);
/* Moves each W of the n actions a to right after its B, keeping the order
 * of everything else: a splitting schedule whose weight passes run at once
 * (train.reproducibility: layout, where each micro-batch's gradients are
 * whole before the next input pass adds to them; the hand-overs keep
 * their order, so the lists still cannot hang). */
void hs_pp_weights_eager(hs_pp_action *a, int n);
/* hs_pp_schedule_check of the lists with hs_pp_weights_eager applied. */
hs_status hs_pp_schedule_check_eager(hs_pp_schedule_kind kind, int pp, int M, int V, hs_error *e);
/* The same check of given lists (lists[s]: lens[s] actions of stage s)
 * for a schedule of that kind's chunk placement and passes. */
hs_status hs_pp_actions_check(hs_pp_schedule_kind kind, int pp, int M, int V,
                              const hs_pp_action *const *lists, const int *lens, hs_error *e);
/* The chunks of stage `stage` (hs_config_pp_stages' chunks stage,
 * stage + pp, ...; pp_virtual_stages of them, 1 without), as the stage's
 * model holds them. `accel` is the config's accelerator section (pp_size,
 * pp_virtual_stages, pp_layers, pp_schedule) and `model_layers` its
 * model.n_layers. */
void hs_pp_stage_chunks(const hs_accel_config *accel, int model_layers, int stage,
                        hs_model_stage *out);
/* Micro-batches at most in flight in one chunk of `stage` (the activation
 * slots per chunk it needs) into *slots; HS_ERR_OOM when the schedule
 * cannot be laid out to count them. */
hs_status hs_pp_slots(hs_pp_schedule_kind kind, int pp, int stage, int M, int V, int *slots,
                      hs_error *e);
/* The same for every stage: slots[s], s < pp, from one hs_pp_schedule_all. */
hs_status hs_pp_slots_all(hs_pp_schedule_kind kind, int pp, int M, int V, int *slots, hs_error *e);

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
/* The largest hand-over messages at context-parallel degree cp of a
 * micro-batch of `micro_batch_size` sequences of `seq_len` tokens
 * (train.micro_batch_size, train.seq_len) through `model` (the config's
 * model section: dim, and the experts of an MoE arch): this rank's rows of
 * a micro-batch (T / cp of each sequence, all of them; sequence parallel
 * only ever has fewer) and the MoE statistics (0 without MoE). */
void hs_pp_message_numel(const hs_model_config *model, int micro_batch_size, int seq_len, int cp,
                         int64_t *numel, int64_t *extra);
/* The device bytes of hs_pp_create's staging for those sizes (the memory
 * plan counts them); products checked into ck. */
int64_t hs_pp_staging_bytes(hs_checked *ck, int64_t max_numel, int64_t max_extra, int keys);
void hs_pp_free(hs_pp *p);
int hs_pp_stage(const hs_pp *p);
int hs_pp_size(const hs_pp *p);
/* Where the chunks live (hs_pp_model_chunk, hs_pp_chunk_home): the
 * schedule's kind; 1F1B's placement until set. */
void hs_pp_set_schedule(hs_pp *p, hs_pp_schedule_kind kind);
hs_pp_schedule_kind hs_pp_placement(const hs_pp *p);
/* Activations from stage `from` (the stage of the model chunk before the
 * receiving one): post the receive of message `key` (numel elements of dt,
 * and `extra` fp32 values in a second message: the MoE statistics; 0 for
 * none), then take them into dst and extra_dst. A message from this stage
 * itself (zbv's turn) runs no transfer: the send copies it in. */
void hs_pp_post_recv_forward(hs_pp *p, int key, int from, int64_t numel, hs_dtype dt,
                             int64_t extra);
hs_status hs_pp_take_forward(hs_pp *p, int key, void *dst, float *extra_dst, hs_error *e);
/* Activations (and extra_n fp32 values) to stage `to` as its message
 * `key`, copied at once. */
hs_status hs_pp_send_forward(hs_pp *p, int key, int to, const void *src, int64_t numel, hs_dtype dt,
                             const float *extra, int64_t extra_n, hs_error *e);
/* Gradients (fp32) from the stage of the next model chunk / to that of the
 * previous one, likewise (the extra values: the MoE routers' aux
 * gradient). */
void hs_pp_post_recv_backward(hs_pp *p, int key, int from, int64_t numel, int64_t extra);
hs_status hs_pp_take_backward(hs_pp *p, int key, float *dst, float *extra_dst, hs_error *e);
hs_status hs_pp_send_backward(hs_pp *p, int key, int to, const float *src, int64_t numel,
                              const float *extra, int64_t extra_n, hs_error *e);
/* Wait for every send still in flight (end of a step); every posted
 * receive must have been taken. */
hs_status hs_pp_flush(hs_pp *p, hs_error *e);
/* Seconds inside the stage's forwards and backwards (hs_pp_run_step) since
 * creation or the last reset: a step's wall time minus this is the stage's
 * bubble and hand-over. */
double hs_pp_busy_seconds(const hs_pp *p);
/* The part of it inside actions of one kind (F, B or W). */
double hs_pp_busy_seconds_of(const hs_pp *p, hs_pp_kind kind);
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
    bool split;           /* the schedule splits the backward (B then W) */
    /* NULL, or [M] zeroed by the caller: each micro-batch's loss sum (the
     * head's chunk's; 0 on other stages) */
    double *mb_loss;
} hs_pp_step_io;

/* One optimizer step's actions (hs_pp_schedule) on stage model m (its
 * chunks the stage's, created with hs_pp_slots slots per chunk): each
 * forward and backward in its slot, with the hand-over; a span "F<i>" /
 * "B<i>" / "W<i>" (interleaved: "F<i>.<v>") per action on the compute
 * lane.
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
