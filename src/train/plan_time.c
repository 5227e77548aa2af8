/* The time of a step (train.h hs_plan_time_build): one training step
 * simulated on a cluster description, from the plan's per-unit collectives
 * and the pipeline schedule's own action lists.
 *
 * - Compute: each GEMM of a block (q, k, v, o, gate, up, down, the routed
 *   and shared experts, the head) at the device's rate for its shape
 *   (device.gemm, interpolated in log m n k, or the nominal peak times
 *   gemm_efficiency), causal attention at its rate (with its scores'
 *   bytes where the kernel materialises them), the element-wise passes at
 *   memory bandwidth; backward twice the GEMMs and 2.5 times the
 *   attention, full recompute adds a forward, selective the
 *   element-wise part. On a shared node (CPU cores) the ranks divide it.
 * - Collectives: ring time (g - 1) latency + (g - 1) / g bytes / bandwidth
 *   (all-reduce twice, or a tree where that is faster), on the link of the
 *   group's span: inside a node (by_ranks rows by group size and ranks on
 *   the node) or across (the node's NICs divided among the groups that
 *   cross at once).
 * - FSDP: two queues per pass, compute and comm; unit k's all-gather and
 *   the next forward_prefetch_depth (backward_prefetch_depth) are issued
 *   as k starts, k waits its own, a reduce-scatter and all-reduce follow
 *   each backward; (1 - overlap) of every collective also holds the
 *   compute queue. TP, CP and EP collectives sit on the compute queue.
 * - PP: every stage runs hs_pp_schedule's actions in order; an action
 *   starts when its stage is free and its input has arrived (the hand-over
 *   a point-to-point message); an action's last units prefetch the first
 *   blocks of the stage's next forward or backward.
 * - Then the gradient norm's all-reduce and the optimizer's memory pass. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/parallel.h"
#include "hypershard/train.h"
#include "train/engines.h"
#include "train/plan_events.h"

typedef struct tctx {
    const hs_config *cfg;
    const hs_topology *t;
    const hs_cluster *cl;
    const hs_plan *plan;
    hs_dtype cdt;
    int rpn;      /* ranks per node */
    double share; /* of a device one rank computes with (1 but on shared nodes) */
    bool gather;  /* FSDP shards: units all-gather and reduce-scatter */
} tctx;

/* ------------------------------------------------------------ compute */

/* The nominal peak of dtype dt, or fp32's where the file gives none. */
static double peak_of(const hs_cluster *cl, hs_dtype dt) {
    return cl->peak[dt] > 0 ? cl->peak[dt] : cl->peak[HS_DTYPE_F32];
}

static double gemm_rate(const tctx *c, hs_dtype dt, double m, double n, double k) {
    const hs_cluster *cl = c->cl;
    double w = log(m * n * k), lo_w = -1, hi_w = -1, lo_r = 0, hi_r = 0;
    for (int i = 0; i < cl->n_gemm; i++) {
        const hs_cluster_gemm *g = &cl->gemm[i];
        if (g->dtype != dt) continue;
        double gw = log((double)g->m * (double)g->n * (double)g->k);
        if (gw <= w && (lo_w < 0 || gw > lo_w)) lo_w = gw, lo_r = g->flops;
        if (gw >= w && (hi_w < 0 || gw < hi_w)) hi_w = gw, hi_r = g->flops;
    }
    double r;
    if (lo_w < 0 && hi_w < 0) {
        r = peak_of(cl, dt) * cl->gemm_efficiency;
    } else if (lo_w < 0 || hi_w == lo_w) {
        r = lo_w < 0 ? hi_r : lo_r;
    } else if (hi_w < 0) {
        r = lo_r;
    } else {
        r = lo_r + (hi_r - lo_r) * (w - lo_w) / (hi_w - lo_w);
    }
    return r * c->share;
}

static double gemm_s(const tctx *c, double m, double n, double k) {
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    return 2 * m * n * k / gemm_rate(c, c->cdt, m, n, k);
}

static double attention_rate(const tctx *c) {
    const hs_cluster *cl = c->cl;
    double r = cl->attention[c->cdt];
    return (r > 0 ? r : peak_of(cl, c->cdt) * cl->attention_efficiency) * c->share;
}

static double bytes_s(const tctx *c, double bytes) {
    return bytes / (c->cl->memory_bandwidth * c->cl->elementwise_efficiency * c->share);
}

/* One block's forward on one rank, for a micro-batch: GEMMs, attention and
 * element-wise parts, seconds. */
typedef struct block_time {
    double gemm, attn, attn_back, elem;
} block_time;

static block_time block_forward(const tctx *c, bool moe) {
    const hs_model_config *m = &c->cfg->model;
    const hs_topology *t = c->t;
    double tok = (double)c->cfg->train.micro_batch_size * c->cfg->train.seq_len / t->cp;
    double C = m->dim, hd = hs_model_head_dim(m), H = (double)m->n_heads / t->tp;
    double Hkv = (double)(m->n_kv_heads > 0 ? m->n_kv_heads : m->n_heads) / t->tp;
    if (Hkv < 1) Hkv = 1;
    double s = hs_dtype_size(c->cdt), F = (double)m->ffn_dim / t->tp;
    block_time b = {0};
    b.gemm = gemm_s(c, tok, H * hd, C) + 2 * gemm_s(c, tok, Hkv * hd, C) +
             gemm_s(c, tok, C, H * hd);
    if (hs_model_arch_mla(m)) { /* latent attention's projections (model/mla.h) */
        const hs_mla_config *a = &m->mla;
        double QL = a->q_lora_rank, KL = a->kv_lora_rank, R = a->qk_rope_head_dim;
        b.gemm = (QL > 0 ? gemm_s(c, tok, QL, C) + gemm_s(c, tok, H * hd, QL)
                         : gemm_s(c, tok, H * hd, C)) +
                 gemm_s(c, tok, KL + R, C) +
                 gemm_s(c, tok, H * (a->qk_nope_head_dim + a->v_head_dim), KL) +
                 gemm_s(c, tok, C, H * a->v_head_dim);
    }
    double ffn_elems = 0;
    if (moe) {
        const hs_moe_config *e = &m->moe;
        double rows = tok * e->top_k, local = (double)e->num_experts / t->ep;
        double per = rows / (local > 0 ? local : 1); /* balanced routing */
        b.gemm += gemm_s(c, tok, e->num_experts, C);
        b.gemm += local *
                  (2 * gemm_s(c, per, e->expert_ffn_dim, C) + gemm_s(c, per, C, e->expert_ffn_dim));
        if (e->shared_expert_ffn_dim > 0)
            b.gemm += 2 * gemm_s(c, tok, e->shared_expert_ffn_dim, C) +
                      gemm_s(c, tok, C, e->shared_expert_ffn_dim);
        ffn_elems = rows * e->expert_ffn_dim + tok * e->shared_expert_ffn_dim;
        /* the rows permuted to their experts and combined back, each a
         * read and a write */
        const hs_cluster *cl = c->cl;
        double bw = cl->routing_bandwidth > 0 ? cl->routing_bandwidth
                                              : cl->memory_bandwidth * cl->elementwise_efficiency;
        b.elem += 2 * 2 * rows * C * s / (bw * c->share);
    } else {
        b.gemm += 2 * gemm_s(c, tok, F, C) + gemm_s(c, tok, C, F);
        ffn_elems = tok * F;
    }
    /* causal: each local query row meets on average half of the sequence
     * (a fused kernel skips the masked half); the backward 2.5 times the
     * forward's FLOPs. A kernel that materialises the scores computes the
     * masked half too and moves each score through memory. */
    double T = c->cfg->train.seq_len, scores = tok * T * H;
    const double *sb = c->cl->score_bytes;
    bool materialised = sb[0] > 0 || sb[1] > 0;
    b.attn = (materialised ? 4 : 2) * tok * T * hd * H / attention_rate(c);
    b.attn_back = 2.5 * b.attn + bytes_s(c, scores * sb[1]);
    b.attn += bytes_s(c, scores * sb[0]);
    /* norms, RoPE, residual adds, SwiGLU: about 16 C and 6 F values a token
     * read or written */
    b.elem += bytes_s(c, (16 * tok * C + 6 * ffn_elems + 4 * tok * (H + 2 * Hkv) * hd) * s);
    return b;
}

/* ------------------------------------------------------- collectives */

typedef enum coll { C_AG, C_RS, C_AR, C_A2A, C_P2P } coll;

/* Members of a group of g ranks at world-rank stride `stride` that share
 * a node (ranks_per_node consecutive world ranks). */
static int on_one_node(const tctx *c, int g, int stride) {
    return stride >= c->rpn ? 1 : (c->rpn / stride < g ? c->rpn / stride : g);
}

/* The link a group of g ranks at world-rank stride `stride` uses:
 * latency and per-rank bandwidth. */
static void link_of(const tctx *c, int g, int stride, double *lat, double *bw) {
    const hs_cluster *cl = c->cl;
    int span = g * stride, rpn = c->rpn, local = on_one_node(c, g, stride);
    if (span <= rpn || local >= g) { /* inside a node */
        const hs_cluster_link *l = &cl->intra;
        *lat = l->latency, *bw = l->bandwidth;
        /* the row nearest in group size and, as close, in ranks on the node */
        double best = -1;
        for (int i = 0; i < l->n_by_ranks; i++) {
            const hs_cluster_group *r = &l->by_ranks[i];
            double d = fabs(log((double)r->ranks / g));
            if (r->node_ranks > 0) d += 0.5 * fabs(log((double)r->node_ranks / rpn));
            if (best < 0 || d < best) best = d, *lat = r->latency, *bw = r->bandwidth;
        }
        return;
    }
    /* across nodes: the groups crossing at once share the node's NICs */
    int crossing = rpn / local;
    double nic = cl->inter.bandwidth * (cl->nics_per_node > 0 ? cl->nics_per_node : 1);
    *bw = nic / (crossing > 0 ? crossing : 1);
    if (*bw > cl->intra.bandwidth) *bw = cl->intra.bandwidth;
    *lat = cl->inter.latency;
}

/* Seconds of one collective of `bytes` (AG: the output; RS: the input; AR
 * and A2A: a rank's buffer; P2P: the message) over g ranks at `stride`. */
static double coll_s(const tctx *c, coll k, double bytes, int g, int stride) {
    if (k != C_P2P && g <= 1) return 0;
    double lat, bw;
    link_of(c, k == C_P2P ? 2 : g, stride, &lat, &bw);
    double f = (double)(g - 1) / g;
    switch (k) {
    case C_AG:
    case C_RS:
    case C_A2A: return (g - 1) * lat + f * bytes / bw;
    case C_AR: {
        double ring = 2 * (g - 1) * lat + 2 * f * bytes / bw;
        double tree = 2 * ceil(log2(g)) * lat + 2 * bytes / bw;
        return ring < tree ? ring : tree;
    }
    case C_P2P: return lat + bytes / bw;
    }
    return 0;
}

/* Seconds of a unit's gradient reduce-scatter of `bytes` (a rank's
 * input) over g ranks at `stride`: one collective, or, where it is
 * grad_reduce's all-to-all (a2a) over a group spanning N > 1 nodes of
 * L > 1 of its ranks each, the two levels fsdp/node_groups.c runs: an
 * all-to-all of all the bytes among the node's L ranks, then one of 1/L
 * of them among the N ranks with the same place on each node (the bytes
 * hs_plan_links counts as sent inside and across). */
static double reduce_s(const tctx *c, double bytes, int g, int stride, bool a2a) {
    int local = on_one_node(c, g, stride);
    if (!a2a || local < 2 || g % local || g / local < 2) return coll_s(c, C_RS, bytes, g, stride);
    return coll_s(c, C_A2A, bytes, local, stride) +
           coll_s(c, C_A2A, bytes / local, g / local, stride * local);
}

/* Strides of the mesh dims in world ranks (mesh.h's order: tp fastest,
 * then cp, dp, pp; FSDP's shard fastest over dp x cp; EP over the expert
 * domain). */
static int stride_of(const tctx *c, hs_plan_comm dim, bool expert) {
    const hs_topology *t = c->t;
    switch (dim) {
    case HS_PLAN_TP: return 1;
    case HS_PLAN_CP: return t->tp;
    case HS_PLAN_EP: return 1;
    case HS_PLAN_PP: return t->dp * t->cp * t->tp;
    case HS_PLAN_AG:
    case HS_PLAN_RS: return expert ? t->ep : t->tp;
    case HS_PLAN_AR: return expert ? t->ep * t->edp_shard : t->tp * t->dp_shard;
    default: return 1;
    }
}

/* ------------------------------------------- the hook order, timed */

/* A unit sequence (the root, then blocks) on its two queues: this pass's
 * costs, which units are unsharded, when each all-gather lands. */
typedef struct tq {
    int n;
    bool reduce;
    bool *unsharded;
    double *done;
    double ct, cq, busy, hold;
    double ag[2], rs[2];      /* [root, block] */
    double root, block, head; /* this pass's compute: the root, a block, forward's head */
} tq;

static void queue_comm(tq *q, double d) {
    if (d <= 0) return;
    double st = q->cq > q->ct ? q->cq : q->ct;
    q->cq = st + d;
    q->ct += q->hold * d; /* the part that does not hide behind compute */
}

/* The time replay's side of the hook order (plan_events.h). */
static void on_time(void *ctx, plan_ev ev, int k) {
    tq *q = ctx;
    switch (ev) {
    case PLAN_ISSUE:
        if (q->unsharded[k]) return;
        q->unsharded[k] = true;
        q->done[k] = 0;
        if (q->ag[k > 0] > 0) queue_comm(q, q->ag[k > 0]), q->done[k] = q->cq;
        break;
    case PLAN_WAIT:
        if (q->done[k] > q->ct) q->ct = q->done[k];
        q->done[k] = 0;
        break;
    case PLAN_COMPUTE: {
        double d = k ? q->block : q->root;
        q->ct += d, q->busy += d;
        break;
    }
    case PLAN_HEAD: q->ct += q->head, q->busy += q->head; break;
    case PLAN_RESHARD:
    case PLAN_RESHARD_KEEP: q->unsharded[k] = false; break;
    case PLAN_REDUCE:
        if (q->reduce) queue_comm(q, q->rs[k > 0]);
        break;
    case PLAN_GRAD:
    case PLAN_STASH:
    case PLAN_DRAIN: break;
    }
}

static hs_status tq_init(tq *q, int n, double hold, hs_error *e) {
    *q = (tq){.n = n, .hold = hold, .reduce = true};
    q->unsharded = calloc((size_t)n, sizeof *q->unsharded);
    q->done = calloc((size_t)n, sizeof *q->done);
    if (q->unsharded && q->done) return HS_OK;
    free(q->unsharded), free(q->done);
    return hs_error_oom(e, "plan --time: the replay of %d units", n);
}

static void tq_free(tq *q) { free(q->unsharded), free(q->done); }

/* ------------------------------------------------------------ a role */

typedef struct pass_costs {
    double fwd, bwd_in, bwd_w; /* one block, compute + its TP/CP/EP collectives */
    double fwd_moe, bwd_in_moe, bwd_w_moe;
    double head_f, head_b;         /* the head and loss */
    double ag[2], rs[2];           /* [root, block]: the unit's FSDP collectives */
    double ag_bwd[2];              /* its backward's gathers (hpZ: some among fewer ranks) */
    double mp[HS_PLAN_COMM_COUNT]; /* one block's model-parallel seconds, forward + backward */
} pass_costs;

static void role_costs(const tctx *c, const hs_plan_role *r, pass_costs *pc) {
    const hs_config *cfg = c->cfg;
    const hs_topology *t = c->t;
    const hs_model_config *m = &cfg->model;
    memset(pc, 0, sizeof *pc);
    hs_ac_mode ac = cfg->train.activation_checkpointing;
    int M = c->plan->micro_batches;
    double per = (double)M * (r->n_blocks > 0 ? r->n_blocks : 1);
    /* model-parallel collectives of one block and micro-batch (plan's bytes) */
    for (int d = HS_PLAN_TP; d <= HS_PLAN_EP; d++) {
        if (!r->comm_calls[d]) continue;
        double calls = r->comm_calls[d] / per, bytes = r->comm_bytes[d] / per;
        int g = d == HS_PLAN_TP ? t->tp : d == HS_PLAN_CP ? t->cp : t->ep;
        coll k = d == HS_PLAN_EP                                          ? C_A2A
                 : d == HS_PLAN_TP && !cfg->accelerator.sequence_parallel ? C_AR
                                                                          : C_AG;
        pc->mp[d] = calls * coll_s(c, k, bytes / calls, g, stride_of(c, d, false)) *
                    (k == C_AR ? 0.5 : 1); /* the plan counts an all-reduce's bytes twice */
    }
    for (int x = 0; x < 2; x++) {
        block_time b = block_forward(c, x == 1);
        double mp = pc->mp[HS_PLAN_TP] + pc->mp[HS_PLAN_CP] + pc->mp[HS_PLAN_EP];
        double f = b.gemm + b.attn + b.elem + mp / 2;
        double re = ac == HS_AC_FULL ? f : ac == HS_AC_SELECTIVE ? b.elem : 0;
        double bin = b.gemm + b.attn_back + 2 * b.elem + mp / 2 + re, bw = b.gemm;
        if (x == 0) pc->fwd = f, pc->bwd_in = bin, pc->bwd_w = bw;
        else pc->fwd_moe = f, pc->bwd_in_moe = bin, pc->bwd_w_moe = bw;
    }
    double tok = (double)cfg->train.micro_batch_size * cfg->train.seq_len / t->cp;
    double V = (double)m->vocab_size / t->tp;
    pc->head_f = gemm_s(c, tok, V, m->dim) + bytes_s(c, 3 * tok * V * 4);
    pc->head_b = 2 * gemm_s(c, tok, V, m->dim) + bytes_s(c, 2 * tok * V * 4);
    for (int u = 0; u < 2; u++)
        for (int x = 0; x < 2; x++) {
            int S = x ? t->edp_shard : t->dp_shard, R = x ? t->edp_replicate : t->dp_replicate;
            pc->ag[u] +=
                coll_s(c, C_AG, (double)r->unit_gather[u][x], S, stride_of(c, HS_PLAN_AG, x));
            int sec = cfg->fsdp.secondary_shard_size;
            pc->ag_bwd[u] += coll_s(c, C_AG,
                                    (double)(r->unit_gather[u][x] - r->unit_gather_hpz[u][x]), S,
                                    stride_of(c, HS_PLAN_AG, x)) +
                             (r->unit_gather_secondary[u][x]
                                  ? coll_s(c, C_AG, (double)r->unit_gather_secondary[u][x], sec,
                                           stride_of(c, HS_PLAN_AG, x))
                                  : 0);
            pc->rs[u] +=
                reduce_s(c, (double)r->unit_reduce[u][x], S, stride_of(c, HS_PLAN_RS, x),
                         r->rs_all_to_all) +
                coll_s(c, C_AR, (double)r->unit_all_reduce[u][x], R, stride_of(c, HS_PLAN_AR, x));
        }
}

/* Blocks [first, first + n) of the model: how many are MoE. */
static int moe_blocks(const hs_model_config *m, int first, int n) {
    int k = 0;
    if (!hs_model_arch_moe(m)) return 0;
    for (int i = first; i < first + n; i++) k += hs_model_layer_moe(m, i);
    return k;
}

/* The pass costs of a chunk: blocks [first, first + n) of the model, the
 * root's parts where the chunk holds them (embed: the first chunk, head:
 * the last). kind: forward, backward (B alone when split) or W. */
static void set_pass(tq *q, const tctx *c, const pass_costs *pc, hs_pp_kind kind, bool split,
                     int first, int n, bool embed, bool head) {
    int nm = moe_blocks(&c->cfg->model, first, n);
    double share = n > 0 ? (double)nm / n : 0;
    double fwd = pc->fwd + share * (pc->fwd_moe - pc->fwd);
    double bin = pc->bwd_in + share * (pc->bwd_in_moe - pc->bwd_in);
    double bw = pc->bwd_w + share * (pc->bwd_w_moe - pc->bwd_w);
    bool root = embed || head;
    /* without sharding the units hold their parameters: nothing to gather */
    const double *ag = kind == HS_PP_FORWARD ? pc->ag : pc->ag_bwd;
    q->ag[0] = root && c->gather ? ag[0] : 0, q->ag[1] = c->gather ? ag[1] : 0;
    q->rs[0] = root ? pc->rs[0] : 0, q->rs[1] = pc->rs[1];
    q->head = kind == HS_PP_FORWARD && head ? pc->head_f : 0;
    q->root = kind == HS_PP_FORWARD || !head ? 0 : split ? pc->head_b / 2 : pc->head_b;
    q->block = kind == HS_PP_FORWARD ? fwd : kind == HS_PP_WEIGHT ? bw : split ? bin : bin + bw;
    q->reduce = !split;
}

/* A split backward's W: each block's weight gradients, then its
 * reductions (and the root's) when the micro-batch reduces. */
static void weight_pass(tq *q, bool sync) {
    for (int k = q->n - 1; k >= 1; k--) {
        q->ct += q->block, q->busy += q->block;
        if (sync) queue_comm(q, q->rs[1]);
    }
    q->ct += q->root, q->busy += q->root;
    if (sync) queue_comm(q, q->rs[0]);
}

/* ---------------------------------------------------------- pipeline */

/* An action's last units prefetch the first blocks of the stage's next
 * forward or backward (fsdp/prefetch.h, hs_fsdp_prefetch_next), not their
 * own chunk's: `count` blocks of `to` from block `from` on (1 the first,
 * q->n - 1 the last; `step` +1 or -1), issued at `at` on the stage's comm
 * queue `cq` where not already unsharded. */
static void prefetch_next(const tctx *c, const pass_costs *pc, tq *to, int from, int step,
                          int count, double at, double *cq) {
    for (int j = 0, k = from; j < count && k >= 1 && k < to->n; j++, k += step) {
        if (to->unsharded[k]) continue;
        to->unsharded[k] = true;
        to->done[k] = 0;
        double ag = step > 0 ? pc->ag[1] : pc->ag_bwd[1]; /* forward, or backward */
        if (!c->gather || ag <= 0) continue;
        *cq = (*cq > at ? *cq : at) + ag;
        to->done[k] = *cq;
    }
}

typedef struct pp_stage {
    hs_pp_action *a;
    int n, next;
    double free, cq, busy, wait; /* wait: the actions' own FSDP waits */
} pp_stage;

/* Action a of chunk ch on stage p from `start`: its units replayed in hook
 * order on the chunk's state (what stays unsharded from one action to the
 * next) and the stage's comm queue; the stage's clock moves on. */
static void run_action(const tctx *c, const pass_costs *pc, pp_stage *p, tq *q, hs_pp_action a,
                       bool split, int first, int n, bool embed, bool head, int M, double start) {
    const hs_fsdp_config *f = &c->cfg->fsdp;
    bool last = a.micro_batch == M - 1, sync = f->requires_grad_sync || last;
    set_pass(q, c, pc, a.kind, split, first, n, embed, head);
    q->ct = start, q->cq = p->cq, q->busy = 0;
    if (a.kind == HS_PP_FORWARD) plan_walk_forward(f, q->n, on_time, q);
    else if (a.kind == HS_PP_BACKWARD)
        plan_walk_backward(f, q->n, sync, f->reshard_after_backward || last, on_time, q);
    else weight_pass(q, sync);
    p->busy += q->ct - start, p->wait += q->ct - start - q->busy;
    p->free = q->ct, p->cq = q->cq;
}

/* The step's schedule on every stage: its makespan, bubble, the busiest
 * stage's FSDP waits and the hand-overs' seconds. */
static hs_status pipeline(const tctx *c, const pass_costs *pc, double *makespan, double *bubble,
                          double *exposed, double *handover, hs_error *e) {
    const hs_config *cfg = c->cfg;
    const hs_topology *t = c->t;
    int pp = t->pp, M = c->plan->micro_batches;
    hs_pp_schedule_kind kind = HS_PP_1F1B;
    (void)hs_pp_schedule_parse(cfg->accelerator.pp_schedule, &kind);
    hs_model_stage chunks;
    hs_pp_stage_chunks(&cfg->accelerator, cfg->model.n_layers, 0, &chunks);
    int V = chunks.n_chunks > 0 ? chunks.n_chunks : 1;
    bool split = hs_pp_schedule_splits(kind);
    int nc = pp * V, n = (int)hs_pp_schedule_length(kind, M, V);
    int first[HS_PP_MAX_STAGES], len[HS_PP_MAX_STAGES];
    hs_config_pp_stages(&cfg->accelerator, cfg->model.n_layers, first, len);
    /* the prefetch depths into the next action's chunk: forward, backward */
    int depth[2] = {cfg->fsdp.forward_prefetch_depth, cfg->fsdp.backward_prefetch_depth};
    pp_stage *st = calloc((size_t)pp, sizeof *st);
    double *fin = calloc((size_t)3 * nc * M, sizeof *fin); /* [kind][chunk][mb] end, -1 not yet */
    tq *q = calloc((size_t)nc, sizeof *q);                 /* each chunk's units */
    hs_pp_action *lists = malloc(sizeof *lists * (size_t)n * (size_t)pp);
    hs_status rc = st && fin && q && lists
                       ? HS_OK
                       : hs_error_oom(e, "plan --time: the pipeline of %d stages", pp);
    for (int ch = 0; rc == HS_OK && ch < nc; ch++)
        rc = tq_init(&q[ch], 1 + len[ch], 1 - c->cl->overlap, e);
    if (rc == HS_OK) rc = hs_pp_schedule_all(kind, pp, M, V, lists, e);
    for (int s = 0; rc == HS_OK && s < pp; s++) st[s].a = lists + (size_t)s * n, st[s].n = n;
    for (int i = 0; rc == HS_OK && i < 3 * nc * M; i++) fin[i] = -1;
    const hs_plan_role *r0 = &c->plan->roles[0];
    double bytes = r0->comm_calls[HS_PLAN_PP]
                       ? (double)r0->comm_bytes[HS_PLAN_PP] / (double)r0->comm_calls[HS_PLAN_PP]
                       : 0;
    double msg = coll_s(c, C_P2P, bytes, 2, stride_of(c, HS_PLAN_PP, false));
    *handover = msg * (double)r0->comm_calls[HS_PLAN_PP];
    /* each stage runs its next action once its input has arrived */
    for (bool moved = true; rc == HS_OK && moved;) {
        moved = false;
        for (int s = 0; s < pp; s++) {
            pp_stage *p = &st[s];
            while (p->next < p->n) {
                hs_pp_action a = p->a[p->next];
                int ch = hs_pp_model_chunk(kind, pp, s, a.chunk);
                double ready = 0;
                if (a.kind == HS_PP_FORWARD && ch > 0) {
                    double f = fin[(0 * nc + ch - 1) * M + a.micro_batch];
                    if (f < 0) break;
                    ready = f + msg;
                } else if (a.kind == HS_PP_BACKWARD && ch < nc - 1) {
                    double f = fin[(1 * nc + ch + 1) * M + a.micro_batch];
                    if (f < 0) break;
                    ready = f + msg;
                }
                double start = p->free > ready ? p->free : ready;
                run_action(c, pc, p, &q[ch], a, split, first[ch], len[ch], ch == 0, ch == nc - 1, M,
                           start);
                /* the next forward's or backward's first blocks, issued as
                 * this action's last units begin (a weight pass runs no
                 * unit's hooks) */
                int j = p->next + 1;
                while (j < p->n && p->a[j].kind == HS_PP_WEIGHT) j++;
                int d = a.kind == HS_PP_FORWARD    ? depth[0]
                        : a.kind == HS_PP_BACKWARD ? depth[1]
                                                   : 0;
                if (j < p->n && d > 0) {
                    int dir = p->a[j].kind == HS_PP_FORWARD ? 1 : -1;
                    tq *to = &q[hs_pp_model_chunk(kind, pp, s, p->a[j].chunk)];
                    double at = p->free - d * q[ch].block;
                    prefetch_next(c, pc, to, dir > 0 ? 1 : to->n - 1, dir, d,
                                  at > start ? at : start, &p->cq);
                }
                fin[((int)a.kind * nc + ch) * M + a.micro_batch] = p->free;
                p->next++;
                moved = true;
            }
        }
    }
    double end = 0, busy = 0, most = 0;
    for (int s = 0; rc == HS_OK && s < pp; s++) {
        if (st[s].next < st[s].n)
            rc = hs_error_set(e, HS_ERR_INTERNAL, "plan --time: stage %d's schedule stops", s);
        double done = st[s].free > st[s].cq ? st[s].free : st[s].cq;
        if (done > end) end = done;
        busy += st[s].busy;
        if (st[s].wait > most) most = st[s].wait;
    }
    *makespan = end;
    *bubble = end > 0 ? 1 - busy / (pp * end) : 0;
    *exposed = most;
    for (int ch = 0; q && ch < nc; ch++) tq_free(&q[ch]);
    free(lists), free(st), free(fin), free(q);
    return rc;
}

/* ------------------------------------------------------------- a step */

static double model_flops_per_token(const hs_config *cfg) {
    const hs_model_config *m = &cfg->model;
    double C = m->dim, hd = hs_model_head_dim(m), H = m->n_heads;
    double Hkv = m->n_kv_heads > 0 ? m->n_kv_heads : m->n_heads;
    double attn = 2 * C * H * hd + 2 * C * Hkv * hd, f = 0;
    if (hs_model_arch_mla(m)) {
        const hs_mla_config *a = &m->mla;
        double QL = a->q_lora_rank, KL = a->kv_lora_rank;
        attn = (QL > 0 ? C * QL + QL * H * hd : C * H * hd) + C * (KL + a->qk_rope_head_dim) +
               KL * H * (a->qk_nope_head_dim + a->v_head_dim) + H * a->v_head_dim * C;
    }
    for (int l = 0; l < m->n_layers; l++) {
        double mlp = 3 * C * m->ffn_dim;
        if (hs_model_arch_moe(m) && hs_model_layer_moe(m, l))
            mlp = C * m->moe.num_experts + 3 * C * m->moe.expert_ffn_dim * m->moe.top_k +
                  3 * C * m->moe.shared_expert_ffn_dim;
        f += 6 * (attn + mlp);
    }
    f += 6.0 * m->vocab_size * C;
    return f + 6.0 * m->n_layers * (double)cfg->train.seq_len * H * hd;
}

hs_status hs_plan_time_build(const hs_config *cfg, const hs_topology *t, const hs_plan *plan,
                             const hs_cluster *cl, hs_plan_time *out, hs_error *e) {
    memset(out, 0, sizeof *out);
    hs_error_clear(e);
    const hs_mix_precision *mp = &cfg->fsdp.mix_precision;
    tctx c = {
        .cfg = cfg, .t = t, .cl = cl, .plan = plan, .gather = t->dp_shard > 1 || t->edp_shard > 1};
    c.cdt = mp->param_dtype == HS_MP_NULL || !hs_engine_uses_fsdp(cfg, t)
                ? HS_DTYPE_F32
                : (hs_dtype)mp->param_dtype;
    int capacity = cl->nodes * (cl->shared ? 1 << 20 : cl->devices_per_node);
    if (t->world > capacity)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "plan --time: %d ranks do not fit the cluster's %d nodes of %d "
                            "devices; lower --world or describe more nodes",
                            t->world, cl->nodes, cl->devices_per_node);
    int nodes = cl->shared ? cl->nodes
                           : (t->world + cl->devices_per_node - 1) / cl->devices_per_node;
    c.rpn = (t->world + nodes - 1) / nodes;
    /* a rank computes with its threads (train.threads, else
     * OMP_NUM_THREADS, else the node's cores over its ranks), at most its
     * part of the node */
    int threads = cfg->train.threads;
    const char *omp = getenv("OMP_NUM_THREADS");
    if (threads <= 0 && omp && atoi(omp) > 0) threads = atoi(omp);
    if (threads <= 0) threads = cl->devices_per_node / c.rpn > 1 ? cl->devices_per_node / c.rpn : 1;
    c.share = cl->shared ? (double)cl->devices_per_node / c.rpn : 1.0;
    if (cl->shared && c.share > threads) c.share = threads;
    out->ranks_per_node = c.rpn;
    int M = plan->micro_batches;
    int64_t tokens = hs_config_global_batch(cfg, t) * (int64_t)cfg->train.seq_len;
    double step = 0, compute = 0;
    if (t->pp > 1) {
        pass_costs pc;
        /* On a shared node the stages idle in the bubble leave node.lend
         * of their cores to the busy ones (each up to its thread count):
         * the step is simulated again with the busy ranks' share. */
        double share_all = c.share;
        for (int pass = 0; pass < (cl->shared ? 2 : 1); pass++) {
            if (pass) {
                double busy = c.rpn * (1 - out->bubble);
                double lent = cl->devices_per_node / (busy > 1 ? busy : 1);
                if (lent > threads) lent = threads;
                if (lent < share_all) lent = share_all;
                c.share = share_all + cl->lend * (lent - share_all);
            }
            role_costs(&c, &plan->roles[0], &pc);
            hs_status rc = pipeline(&c, &pc, &step, &out->bubble, &out->exposed_fsdp_s,
                                    &out->exposed_s[HS_PLAN_PP], e);
            if (rc != HS_OK) return rc;
        }
        c.share = share_all;
        for (int d = HS_PLAN_TP; d <= HS_PLAN_EP; d++)
            out->exposed_s[d] = pc.mp[d] * M * plan->roles[0].n_blocks;
        compute = step * (1 - out->bubble) - out->exposed_fsdp_s;
    } else {
        const hs_plan_role *r = &plan->roles[0];
        pass_costs pc;
        role_costs(&c, r, &pc);
        const hs_fsdp_config *f = &cfg->fsdp;
        int L = cfg->model.n_layers;
        tq q;
        hs_status rc = tq_init(&q, 1 + L, 1 - cl->overlap, e);
        if (rc != HS_OK) return rc;
        /* Every micro-batch but the last runs alike once the first has set
         * the state: three replayed, the rest moved on by the third's
         * time, then the last (which reduces and reshards). */
        double t_mb[3] = {0}, b_mb[3] = {0};
        for (int mb = 0; mb < M; mb++) {
            bool last = mb == M - 1;
            if (!last && mb == 3) {
                double skip = (double)(M - 1 - 3);
                q.ct += skip * (t_mb[2] - t_mb[1]), q.cq += skip * (t_mb[2] - t_mb[1]);
                q.busy += skip * (b_mb[2] - b_mb[1]);
                mb = M - 2;
                continue;
            }
            set_pass(&q, &c, &pc, HS_PP_FORWARD, false, 0, L, true, true);
            plan_walk_forward(f, q.n, on_time, &q);
            set_pass(&q, &c, &pc, HS_PP_BACKWARD, false, 0, L, true, true);
            plan_walk_backward(f, q.n, last || f->requires_grad_sync,
                               last || f->reshard_after_backward, on_time, &q);
            if (mb < 3) t_mb[mb] = q.ct, b_mb[mb] = q.busy;
        }
        step = q.ct > q.cq ? q.ct : q.cq;
        compute = q.busy;
        tq_free(&q);
        for (int d = HS_PLAN_TP; d <= HS_PLAN_EP; d++) out->exposed_s[d] = pc.mp[d] * M * L;
    }
    double mp_s = out->exposed_s[HS_PLAN_TP] + out->exposed_s[HS_PLAN_CP] +
                  out->exposed_s[HS_PLAN_EP];
    if (t->pp == 1) out->exposed_fsdp_s = step - compute > 0 ? step - compute : 0;
    /* the gradient norm's all-reduce over the world, then the optimizer's
     * pass over this rank's shard: AdamW reads p, g, m, v and writes p, m,
     * v; the norm reads g; a main-params model copy is written */
    const hs_plan_role *r = &plan->roles[0];
    double numel = (double)(r->device[HS_PLAN_PARAMS] + r->host[HS_PLAN_PARAMS]) / 4;
    double per = 32 + (cfg->optimizer.fp32_main_params ? 2 : 0);
    out->optimizer_s = bytes_s(&c, numel * per) + coll_s(&c, C_AR, 8, t->world, 1);
    step += out->optimizer_s;
    out->compute_s = compute - mp_s;
    out->step_s = step;
    out->tokens_per_step = tokens;
    out->tokens_per_s = tokens / step;
    out->peak_flops = peak_of(cl, c.cdt);
    double devices = cl->shared ? (double)nodes * cl->devices_per_node : t->world;
    out->model_flops = model_flops_per_token(cfg) * (double)tokens;
    out->mfu = out->model_flops / (step * devices * out->peak_flops);
    double mem = cl->memory_bytes * c.share;
    out->memory_per_rank = mem;
    out->fits = (double)plan->max_peak_device_bytes <= mem;
    return HS_OK;
}
