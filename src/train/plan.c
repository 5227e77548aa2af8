/* The plan (train.h): per-rank memory and per-step communication of a
 * config, computed without MPI and without allocating any of it.
 *
 * Each distinct rank role (every rank, or each pipeline stage) gets a
 * model that only describes it: the registry with the rank's TP / EP
 * placement, and its activation buffers sized by the allocation code
 * itself (count_buffers). FSDP's per-parameter sizes follow fsdp/param.c
 * for the role's largest shard (shard rank 0 holds the ceiling rows), and
 * one step's unshard / gradient / reduce events are replayed in the order
 * the hooks run them (fsdp/hooks.c, prefetch.c, context.c), so the peak is
 * the device pool's peak over a step, as metrics.jsonl's peak_device_bytes
 * measures it. Deep models are described with one block per chunk and the
 * blocks repeated, which keeps any depth a few milliseconds. Every figure is
 * summed with the sticky checked int64 arithmetic of base.h: a config whose
 * bytes overflow (hs_config_validate refuses those) is an error, never a
 * wrapped number. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/parallel.h"
#include "hypershard/train.h"
#include "train/engines.h"
#include "train/plan_events.h"

/* Roles whose chunks hold at most this many blocks are described exactly. */
#define EXACT_BLOCKS 64

static const char *const item_names[] = {
    "params",      "grads",     "model_copy",      "optimizer",    "reduce",
    "activations", "unsharded", "unsharded_grads", "ckpt_staging", "kernel_scratch"};
_Static_assert(sizeof item_names / sizeof item_names[0] == HS_PLAN_ITEM_COUNT,
               "plan item names follow the enum");
static const char *const comm_names[] = {
    "all_gather", "reduce_scatter", "all_reduce", "tp", "cp", "ep", "pp", "all_gather_secondary"};
_Static_assert(sizeof comm_names / sizeof comm_names[0] == HS_PLAN_COMM_COUNT,
               "plan comm names follow the enum");

const char *hs_plan_item_name(hs_plan_item k) {
    return (unsigned)k < HS_PLAN_ITEM_COUNT ? item_names[k] : "?";
}

const char *hs_plan_comm_name(hs_plan_comm k) {
    return (unsigned)k < HS_PLAN_COMM_COUNT ? comm_names[k] : "?";
}

/* One top-level unit (a block with its nested expert unit, or the root):
 * what it keeps, and what each of its events allocates and frees. */
typedef struct unit_sz {
    int64_t dev[HS_PLAN_ITEM_COUNT], host[HS_PLAN_ITEM_COUNT]; /* kept between steps */
    int64_t P;     /* unshard: all-gather outputs and cast copies           */
    int64_t I;     /* all-gather input copies, freed at the wait            */
    int64_t stage; /* offload staging, alive inside the unshard only        */
    int64_t G_ag;  /* unsharded grads released when their reduce-scatter ends */
    int64_t G_loc; /* unsharded grads of unsharded (degree-1) parameters     */
    int64_t R;     /* reduce inputs in reduce_dtype (G_ag's and G_loc's)     */
    int64_t R_loc;
    int64_t A; /* fp32 accumulators of no-sync micro-batches             */
    int64_t comm[HS_PLAN_COMM_COUNT], calls[HS_PLAN_COMM_COUNT];
    int64_t ag_fwd, ag_calls; /* one forward's all-gathers */
    /* hpZ (secondary_shard_size): the pieces kept from the forward to the
     * backward, the backward's gathers of them (calls), and what the
     * parameters gathering that way add to I and stage. */
    int64_t Sec, ag_sec_calls, hpz_I, hpz_stage;
    /* payloads by group kind (hs_plan_role.fsdp_payload): forward gathers,
     * the hpZ part of them, the backward's gathers of the pieces,
     * reduce-scatters, and the elements of the all-reduced buffer */
    int64_t k_ag[3], k_hpz[3], k_sec[3], k_rs[3], k_ar[3];
    /* replicate groups with an all-reduce: hsdp, flat, edp (zbv's head
     * root's shifted by 3) */
    unsigned ar_groups;
} unit_sz;

typedef struct plan_ctx {
    const hs_config *cfg;
    const hs_topology *topo;
    hs_dtype cdt, rdt;
    hs_quant_fmt gather, grad; /* fsdp_config.param_gather, grad_reduce */
    bool fsdp, offload, main, stashes;
    int M;
    int canon_levels; /* train.reproducibility: layout: log2(M) gradient subtrees */
    hs_parallel *par; /* described (rank 0 of each dim): the models never run */
    hs_checked *ck;   /* set once any figure overflows */
} plan_ctx;

/* The product of the arguments, and *to += it, on the plan's checked count. */
#define PROD(c, ...)                                                                               \
    hs_ck_prod((c)->ck, (const int64_t[]){__VA_ARGS__},                                            \
               (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define ACC(c, to, ...) add_to((c), (to), PROD((c), __VA_ARGS__))

static void add_to(const plan_ctx *c, int64_t *to, int64_t v) { *to = hs_ck_add(c->ck, *to, v); }

static int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* A unit's figure over the three group kinds. */
static int64_t sum3(const plan_ctx *c, const int64_t v[3]) {
    return hs_ck_add(c->ck, hs_ck_add(c->ck, v[0], v[1]), v[2]);
}

static int n_states(const plan_ctx *c, const hs_param *p) {
    if (p->frozen) return 0;
    bool muon = !strcmp(c->cfg->optimizer.target, "muon") &&
                ((p->kind == HS_PARAM_LINEAR && p->ndim == 2) || p->kind == HS_PARAM_EXPERT);
    return muon ? 1 : 2;
}

/* fsdp/param.c's sizes for shard rank 0 of a degree-S shard group.
 * own_unit: p is in zbv's head root, which u counts with the root. */
static void add_fsdp_param(const plan_ctx *c, const hs_param *p, unit_sz *u, int64_t *tally[5],
                           bool own_unit) {
    const hs_topology *t = c->topo;
    bool rep = false;
    for (int i = 0; i < c->cfg->fsdp.n_replicate_params && !rep; i++)
        rep = !strcmp(c->cfg->fsdp.replicate_params[i], p->fqn);
    int S = p->on_ep_mesh ? t->edp_shard : rep ? 1 : t->dp_shard;
    int R = p->on_ep_mesh ? t->edp_replicate : rep ? t->fsdp_dp : t->dp_replicate;
    int64_t numel = hs_param_local_numel(p), D0 = p->local_shape[0];
    int64_t row = D0 > 0 ? numel / D0 : 0, chunk = cdiv(D0, S);
    int64_t actual = PROD(c, chunk < D0 ? chunk : D0, row), padded_sh = PROD(c, chunk, row);
    int64_t padded_un = PROD(c, chunk, S, row), storage = D0 % S == 0 ? actual : padded_sh;
    bool ag = S > 1;
    int64_t cs = (int64_t)hs_dtype_size(c->cdt), rs = (int64_t)hs_dtype_size(c->rdt);
    int64_t *master = c->offload ? u->host : u->dev;
    ACC(c, &master[HS_PLAN_PARAMS], storage, 4);
    ACC(c, &master[HS_PLAN_GRADS], actual, 4);
    /* fsdp/canonical.c's stack of the micro-batches' subtrees */
    if (!p->frozen && actual > 0) ACC(c, &master[HS_PLAN_GRADS], c->canon_levels, actual, 4);
    if (c->main) ACC(c, &master[HS_PLAN_MODEL_COPY], storage, cs);
    ACC(c, &(c->offload ? u->host : u->dev)[HS_PLAN_OPTIM], n_states(c, p), actual, 4);
    bool direct = !c->offload && (c->main || c->cdt == HS_DTYPE_F32);
    ACC(c, &u->P, ag ? padded_un : direct ? 0 : numel, cs);
    /* Quantized (param_gather): the wire is each rank's packed shard, held
     * from the issue to the wait, and a fused unit's copy-in input besides
     * (fsdp/fusion.c); the shard is packed straight from its source. Else
     * only comm_fusion stages a cast input; a parameter's own all-gather
     * casts into its block of the output (fsdp/param.c). */
    bool quant = ag && c->gather != HS_QUANT_NONE;
    int64_t wire = quant ? PROD(c, S,
                                (int64_t)hs_quant_packed_bytes(
                                    padded_sh, c->cfg->fsdp.param_gather_block, c->gather))
                         : PROD(c, padded_un, cs);
    bool copy_in = c->cfg->fsdp.comm_fusion && (c->offload || !c->cfg->fsdp.comm_fusion_zero_copy);
    if (quant) add_to(c, &u->I, wire);
    if (quant ? copy_in : ag && !direct && c->cfg->fsdp.comm_fusion) ACC(c, &u->I, padded_sh, cs);
    int64_t src = c->main ? cs : 4;
    if (c->offload && src != cs) ACC(c, &u->stage, ag ? storage : numel, src);
    int kind = p->on_ep_mesh ? 1 : rep ? 2 : 0;
    if (ag) add_to(c, &u->ag_fwd, wire), u->ag_calls++, add_to(c, &u->k_ag[kind], wire);
    /* hpZ: kept pieces of padded_un / sec elements, gathered back among
     * sec ranks in place of the packed or cast input (fsdp/param.c) */
    int sec = c->cfg->fsdp.secondary_shard_size;
    if (ag && sec > 1 && S > sec && S % sec == 0) {
        ACC(c, &u->Sec, padded_un / sec, cs);
        ACC(c, &u->k_sec[kind], padded_un, cs), u->ag_sec_calls++;
        add_to(c, &u->k_hpz[kind], wire);
        add_to(c, tally[3], wire), ACC(c, tally[4], padded_un, cs);
        if (quant) add_to(c, &u->hpz_I, wire);
        if (quant && copy_in) ACC(c, &u->hpz_I, padded_sh, cs);
        if (c->offload && src != cs) ACC(c, &u->hpz_stage, storage, src);
    }
    if (ag) add_to(c, tally[0], wire);
    if (p->frozen) return;
    /* grad_reduce: one all-to-all of W packed chunks, both buffers held
     * from the issue to the wait like the reduce input (fsdp/param.c) */
    bool qgrad = ag && c->grad != HS_QUANT_NONE;
    int64_t rs_wire = qgrad
                          ? PROD(c, S,
                                 (int64_t)hs_quant_packed_bytes(
                                     padded_sh, hs_fsdp_config_grad_block(&c->cfg->fsdp), c->grad))
                          : PROD(c, padded_un, rs);
    if (qgrad) ACC(c, &u->R, rs_wire, 2);
    if (ag) add_to(c, tally[1], rs_wire);
    if (R > 1) ACC(c, tally[2], ag ? padded_sh : numel, rs);
    ACC(c, &u->dev[HS_PLAN_REDUCE], ag ? padded_sh : numel, rs);
    int64_t G = PROD(c, padded_un, cs);
    int64_t Rb = c->cdt != c->rdt && !(c->stashes && c->M > 1 && !c->cfg->fsdp.requires_grad_sync)
                     ? PROD(c, padded_un, rs)
                     : 0;
    add_to(c, ag ? &u->G_ag : &u->G_loc, G);
    add_to(c, ag ? &u->R : &u->R_loc, Rb);
    if (c->stashes) ACC(c, &u->A, padded_un, 4);
    if (ag) add_to(c, &u->comm[HS_PLAN_RS], rs_wire), u->calls[HS_PLAN_RS]++;
    if (ag) add_to(c, &u->k_rs[kind], rs_wire);
    if (R > 1) add_to(c, &u->k_ar[kind], ag ? padded_sh : numel);
    /* One all-reduce per unit and replicate group (context.c: a unit's
     * reduce slots of one group are one buffer). */
    unsigned group = (p->on_ep_mesh ? 4u : rep ? 2u : 1u) << (own_unit ? 3 : 0);
    if (R > 1 && !(u->ar_groups & group)) u->ar_groups |= group, u->calls[HS_PLAN_AR]++;
    if (R > 1) ACC(c, &u->comm[HS_PLAN_AR], ag ? padded_sh : numel, rs);
}

static void add_local_param(const plan_ctx *c, const hs_param *p, unit_sz *u) {
    int64_t n = hs_param_local_numel(p);
    ACC(c, &u->dev[HS_PLAN_PARAMS], n, 4);
    if (!p->frozen) ACC(c, &u->dev[HS_PLAN_GRADS], n, 4);
    ACC(c, &u->dev[HS_PLAN_OPTIM], n_states(c, p), n, 4);
}

/* The role's model: the registry placed for TP / EP rank 0 and its buffers
 * counted. `blocks_per_chunk` > 0 describes every chunk with that many
 * blocks instead of its real length. */
static hs_status role_model(const plan_ctx *c, int stage, const hs_model_stage *st, int slots,
                            int blocks_per_chunk, hs_ac_mode checkpointing, hs_model **out,
                            hs_error *e) {
    const hs_config *cfg = c->cfg;
    const hs_topology *t = c->topo;
    hs_model_config mc = cfg->model;
    hs_model_stage s = *st;
    if (blocks_per_chunk > 0 && s.n_chunks > 0) {
        /* Chunk k of the stage is the model's hs_config_pp_chunk: with all
         * chunks of one length the embedding and the head stay where they
         * were. */
        mc.n_layers = t->pp * s.n_chunks * blocks_per_chunk;
        for (int k = 0; k < s.n_chunks; k++) {
            s.first_layer[k] = hs_config_pp_chunk(&cfg->accelerator, stage, k) * blocks_per_chunk;
            s.n_layers[k] = blocks_per_chunk;
        }
    } else if (blocks_per_chunk > 0) {
        mc.n_layers = blocks_per_chunk;
    }
    hs_model_options mo =
        hs_engine_model_options(cfg, c->fsdp, cfg->train.micro_batch_size, s, slots);
    mo.activation_checkpointing = checkpointing;
    mo.allocate_params = false; /* parameters are counted by add_*_param */
    mo.par = hs_parallel_seam(c->par);
    mo.count_buffers = true;
    *out = NULL;
    hs_model *m = NULL;
    hs_status rc = hs_model_create(&mc, &mo, &m, e);
    if (rc != HS_OK) {
        hs_model_free(m);
        return rc;
    }
    hs_train_freeze_apply(cfg, m);
    *out = m;
    return HS_OK;
}

/* ------------------------------------------------------- one step's events */

typedef struct sim {
    const plan_ctx *c;
    unit_sz **u;
    int n;
    bool *unsharded, *in_flight, *acc, *sec; /* sec: holds its secondary pieces */
    int64_t *held; /* unsharded gradient bytes a unit holds until its release */
    int64_t peak, peak_p, peak_g, cur_p, cur_g;
    int prev; /* unit whose reduce-scatter is in flight */
} sim;

static void mark(sim *s, int64_t extra) {
    int64_t p = hs_ck_add(s->c->ck, s->cur_p, extra), now = hs_ck_add(s->c->ck, p, s->cur_g);
    if (now > s->peak) s->peak = now, s->peak_p = p, s->peak_g = s->cur_g;
}

static void hold(sim *s, int k, int64_t bytes) {
    add_to(s->c, &s->held[k], bytes);
    add_to(s->c, &s->cur_g, bytes);
    mark(s, 0);
}

/* The unshard's input copies: from kept secondary pieces, the parameters
 * that kept one need none. */
static int64_t unshard_input(const sim *s, int k) {
    return s->sec[k] ? s->u[k]->I - s->u[k]->hpz_I : s->u[k]->I;
}

static void issue(sim *s, int k) {
    if (s->unsharded[k]) return;
    unit_sz *u = s->u[k];
    add_to(s->c, &s->cur_p, unshard_input(s, k));
    mark(s, s->sec[k] ? u->stage - u->hpz_stage : u->stage);
    add_to(s->c, &s->cur_p, u->P);
    mark(s, 0);
    s->unsharded[k] = s->in_flight[k] = true;
}

static void wait_unshard(sim *s, int k) {
    if (!s->in_flight[k]) return;
    s->cur_p -= unshard_input(s, k);
    if (s->sec[k]) s->cur_p -= s->u[k]->Sec, s->sec[k] = false;
    s->in_flight[k] = false;
}

static void reshard(sim *s, int k) {
    if (!s->unsharded[k]) return;
    wait_unshard(s, k);
    s->cur_p -= s->u[k]->P;
    s->unsharded[k] = false;
}

/* After a forward: the pieces are copied out before the buffer goes. */
static void reshard_keep(sim *s, int k) {
    if (!s->unsharded[k] || s->u[k]->Sec == 0) {
        reshard(s, k);
        return;
    }
    wait_unshard(s, k);
    add_to(s->c, &s->cur_p, s->u[k]->Sec);
    mark(s, 0);
    s->cur_p -= s->u[k]->P;
    s->unsharded[k] = false;
    s->sec[k] = true;
}

static void release_grads(sim *s, int k) {
    if (k < 0) return;
    s->cur_g -= s->held[k];
    s->held[k] = 0;
    s->acc[k] = false;
}

/* context.c: wait the previous unit's reduce-scatters (releasing its
 * gradients), then issue this unit's; degree-1 parameters copy into their
 * slot and release at once. */
static void reduce(sim *s, int k) {
    unit_sz *u = s->u[k];
    release_grads(s, s->prev);
    hold(s, k, hs_ck_add(s->c->ck, u->R, u->R_loc));
    int64_t loc = hs_ck_add(s->c->ck, u->G_loc, u->R_loc);
    s->held[k] -= loc, s->cur_g -= loc;
    s->prev = k;
}

static void grad_begin(sim *s, int k) {
    if (s->held[k] == 0) hold(s, k, hs_ck_add(s->c->ck, s->u[k]->G_ag, s->u[k]->G_loc));
}

static void stash(sim *s, int k) {
    if (s->c->stashes && !s->acc[k]) hold(s, k, s->u[k]->A), s->acc[k] = true;
}

/* The memory replay's side of the hook order (plan_events.h). */
static void on_event(void *ctx, plan_ev ev, int k) {
    sim *s = ctx;
    switch (ev) {
    case PLAN_ISSUE: issue(s, k); break;
    case PLAN_WAIT: wait_unshard(s, k); break;
    case PLAN_RESHARD: reshard(s, k); break;
    case PLAN_RESHARD_KEEP: reshard_keep(s, k); break;
    case PLAN_GRAD: grad_begin(s, k); break;
    case PLAN_REDUCE: reduce(s, k); break;
    case PLAN_STASH: stash(s, k); break;
    case PLAN_DRAIN:
        for (int u = 0; u < s->n; u++) release_grads(s, u);
        s->prev = -1;
        break;
    case PLAN_COMPUTE:
    case PLAN_HEAD: break;
    }
}

static void micro_batch(sim *s, bool sync, bool reshard_bwd) {
    const hs_fsdp_config *f = &s->c->cfg->fsdp;
    plan_walk_forward(f, s->n, on_event, s);
    plan_walk_backward(f, s->n, sync, reshard_bwd, on_event, s);
}

/* What a micro-batch starts from: its flags, held bytes and counters. */
typedef struct sim_state {
    bool *flags;
    int64_t *held, cur[3];
} sim_state;

static void sim_save(const sim *s, sim_state *to) {
    memcpy(to->flags, s->unsharded, (size_t)s->n * 4 * sizeof(bool));
    memcpy(to->held, s->held, (size_t)s->n * sizeof(int64_t));
    to->cur[0] = s->cur_p, to->cur[1] = s->cur_g, to->cur[2] = s->prev;
}

static bool sim_same(const sim *s, const sim_state *st) {
    return st->cur[0] == s->cur_p && st->cur[1] == s->cur_g && st->cur[2] == s->prev &&
           !memcmp(st->flags, s->unsharded, (size_t)s->n * 4 * sizeof(bool)) &&
           !memcmp(st->held, s->held, (size_t)s->n * sizeof(int64_t));
}

/* The micro-batches but the last run alike: once one ends where it began,
 * the ones after it repeat it exactly (same state, same events, same peak)
 * and are skipped, so a step of any number of micro-batches replays in a
 * few. */
static hs_status simulate(const plan_ctx *c, unit_sz **u, int n, int64_t *peak_p, int64_t *peak_g,
                          hs_error *e) {
    sim s = {.c = c, .u = u, .n = n, .prev = -1};
    bool *flags = calloc((size_t)n * 8 + 8, sizeof(bool));
    s.held = calloc((size_t)n * 2 + 2, sizeof(int64_t));
    if (!flags || !s.held) {
        free(flags);
        free(s.held);
        return hs_error_oom(e, "plan: the step replay of %d units: %zu bytes", n,
                            ((size_t)n * 8 + 8) * sizeof(bool) +
                                ((size_t)n * 2 + 2) * sizeof(int64_t));
    }
    s.unsharded = flags, s.in_flight = flags + n, s.acc = flags + 2 * n, s.sec = flags + 3 * n;
    sim_state before = {.flags = flags + 4 * n, .held = s.held + n};
    const hs_fsdp_config *f = &c->cfg->fsdp;
    for (int mb = 0; mb < c->M - 1; mb++) {
        sim_save(&s, &before);
        micro_batch(&s, f->requires_grad_sync, f->reshard_after_backward);
        if (sim_same(&s, &before)) break;
    }
    micro_batch(&s, true, true);
    free(flags);
    free(s.held);
    *peak_p = s.peak_p;
    *peak_g = s.peak_g;
    return HS_OK;
}

/* ------------------------------------------------------------ one role */

/* The top-level unit of each of m's units: an expert unit counts with
 * its block, zbv's head root with the root (both stay unsharded between
 * forward and backward, each reduced once a micro-batch). */
static int top_of(const hs_model *m, int ui, const int *top_index) {
    if (hs_model_unit(m, ui)->root) return top_index[0];
    while (ui > 0 && hs_model_unit(m, ui)->is_expert) ui = hs_model_unit(m, ui)->parent;
    return top_index[ui];
}

/* Activation bytes of the role at its real depth, from `described` (its
 * model as role_model described it: exactly, or one block a chunk). */
static hs_status activation_bytes(const plan_ctx *c, int stage, const hs_model_stage *st, int slots,
                                  bool exact, hs_ac_mode checkpointing, int n_blocks,
                                  const hs_model *described, int64_t *out, hs_error *e) {
    hs_model *m = NULL;
    /* A count the model could not hold sticks at INT64_MAX. */
    int64_t one = hs_model_buffer_bytes(described);
    c->ck->overflow |= one == INT64_MAX;
    if (exact) return *out = one, HS_OK;
    hs_status rc = role_model(c, stage, st, slots, 2, checkpointing, &m, e);
    if (rc != HS_OK) return rc;
    int64_t two = hs_model_buffer_bytes(m);
    hs_model_free(m);
    c->ck->overflow |= two == INT64_MAX;
    int nch = st->n_chunks > 0 ? st->n_chunks : 1;
    *out = one;
    ACC(c, out, (two - one) / nch, n_blocks - nch);
    return HS_OK;
}

/* CP per block and micro-batch. allgather: K and V gathered in forward,
 * dK and dV reduced back; ring: the same volume in steps. The all-to-all
 * methods send each exchanged tensor once per rank (a replicated kv head
 * to each rank that reads it): q, k, v and the output in forward; q, k, v,
 * the output and dO, then dQ, dK, dV in backward (12 exchanges); the
 * hybrid rings its groups' K/V and fp32 dK/dV as the ring does. */
static void cp_comm(const plan_ctx *c, int n_blocks, int64_t BT, int64_t kv, hs_plan_role *r) {
    const hs_config *cfg = c->cfg;
    const hs_model_config *mc = &cfg->model;
    const hs_parallel_layout *l = hs_parallel_layout_of(c->par);
    int64_t B = cfg->train.micro_batch_size, T = cfg->train.seq_len, M = c->M;
    int64_t cs = (int64_t)hs_dtype_size(c->cdt), cp = c->topo->cp, a = l->cp_a2a;
    int64_t *bytes = &r->comm_bytes[HS_PLAN_CP], *calls = &r->comm_calls[HS_PLAN_CP];
    if (l->cp_method == HS_CP_ALLGATHER || l->cp_method == HS_CP_RING) {
        ACC(c, bytes, M, n_blocks, 2, B, T, kv, cs + 4);
        ACC(c, calls, M, n_blocks, l->cp_method == HS_CP_RING ? 4 * (cp - 1) : 4);
        return;
    }
    int64_t hd = mc->dim / mc->n_heads, q = mc->dim / c->topo->tp;
    int64_t kvx = a * hs_cp_a2a_heads((int)(kv / hd), (int)a) * hd; /* k sent per local row */
    ACC(c, bytes, M, n_blocks, BT, q + kvx, 4 * cs + 8);
    ACC(c, calls, M, n_blocks, 12);
    if (l->cp_method != HS_CP_ALLTOALL_RING) return;
    int64_t groups = cp / a;
    ACC(c, bytes, M, n_blocks, 2 * (groups - 1), BT, kvx, 2 * cs);
    ACC(c, bytes, M, n_blocks, 2 * groups, BT, kvx, 4);
    ACC(c, calls, M, n_blocks, 3 * groups - 2);
}

/* Whether model chunk `to`, the neighbour of stage `stage`'s model chunk,
 * lives on another stage: zbv's turn (its last stage's two chunks) is a
 * copy, not a send. */
static bool sends_to(hs_pp_schedule_kind kind, int pp, int stage, int to) {
    if (kind != HS_PP_ZBV) return true;
    int home, v;
    hs_pp_chunk_home(kind, pp, to, &home, &v);
    return home != stage;
}

static void mp_comm(const plan_ctx *c, int stage, const hs_model_stage *st, int n_blocks,
                    hs_plan_role *r) {
    const hs_config *cfg = c->cfg;
    const hs_topology *t = c->topo;
    const hs_model_config *mc = &cfg->model;
    int64_t B = cfg->train.micro_batch_size, T = cfg->train.seq_len, M = c->M;
    int64_t BT = PROD(c, B, T / t->cp), C = mc->dim, cs = (int64_t)hs_dtype_size(c->cdt);
    int64_t kv = (int64_t)(mc->n_kv_heads > 0 ? mc->n_kv_heads : mc->n_heads) *
                 (mc->dim / mc->n_heads) / t->tp;
    int64_t *bytes = r->comm_bytes, *calls = r->comm_calls;
    if (t->tp > 1) { /* two regions a block, each way: all-reduce (or SP's AG + RS) */
        ACC(c, &bytes[HS_PLAN_TP], M, n_blocks, 4, BT, C, 4);
        ACC(c, &calls[HS_PLAN_TP], M, n_blocks, 4);
        int last = st->n_chunks - 1;
        bool head = st->n_chunks == 0 || st->first_layer[last] + st->n_layers[last] == mc->n_layers;
        if (!cfg->accelerator.loss_parallel && head) /* the logits gathered over tp */
            ACC(c, &bytes[HS_PLAN_TP], M, BT, mc->vocab_size, 4), add_to(c, &calls[HS_PLAN_TP], M);
    }
    if (t->cp > 1) cp_comm(c, n_blocks, BT, kv, r);
    if (t->ep > 1 && hs_model_arch_moe(mc)) { /* dispatch and combine, each way */
        ACC(c, &bytes[HS_PLAN_EP], M, n_blocks, 4, BT, mc->moe.top_k, C, cs);
        ACC(c, &calls[HS_PLAN_EP], M, n_blocks, 6);
    }
    if (t->pp > 1) {
        /* a hand-over carries this rank's rows of the residual stream:
         * under sequence parallel its 1/tp of them */
        int64_t rows = cfg->accelerator.sequence_parallel && t->tp > 1 ? BT / t->tp : BT;
        int nch = st->n_chunks > 0 ? st->n_chunks : 1;
        /* MoE: each hand-over's second message, the router statistics
         * forward (2E + 2 fp32) and their gradient backward (E) */
        int64_t E = hs_model_arch_moe(mc) ? mc->moe.num_experts : 0;
        hs_pp_schedule_kind kind = HS_PP_GPIPE;
        (void)hs_pp_schedule_parse(cfg->accelerator.pp_schedule, &kind);
        for (int k = 0; k < nch; k++) {
            bool last = st->first_layer[k] + st->n_layers[k] == mc->n_layers;
            bool first = st->first_layer[k] == 0;
            int mchunk = hs_pp_model_chunk(kind, t->pp, stage, k);
            if (!last && sends_to(kind, t->pp, stage, mchunk + 1)) {
                ACC(c, &bytes[HS_PLAN_PP], M, rows, C, cs), add_to(c, &calls[HS_PLAN_PP], M);
                if (E)
                    ACC(c, &bytes[HS_PLAN_PP], M, 2 * E + 2, 4), add_to(c, &calls[HS_PLAN_PP], M);
            }
            if (!first && sends_to(kind, t->pp, stage, mchunk - 1)) {
                ACC(c, &bytes[HS_PLAN_PP], M, rows, C, 4), add_to(c, &calls[HS_PLAN_PP], M);
                if (E) ACC(c, &bytes[HS_PLAN_PP], M, E, 4), add_to(c, &calls[HS_PLAN_PP], M);
            }
        }
    }
}

/* Stage `stage`'s role (slots: its activation slots a chunk). */
/* One more all-reduce size of group kind g, `calls` times a step. */
static void ar_size(hs_plan_role *r, int g, int64_t numel, int64_t calls) {
    for (int i = 0; i < r->n_ar_sizes[g]; i++)
        if (r->ar_numel[g][i] == numel) {
            r->ar_calls[g][i] += calls;
            return;
        }
    if (r->n_ar_sizes[g] == HS_PLAN_AR_SIZES) {
        r->ar_more = true;
        return;
    }
    r->ar_numel[g][r->n_ar_sizes[g]] = numel;
    r->ar_calls[g][r->n_ar_sizes[g]++] = calls;
}

/* The reductions a step runs for the block units of each local chunk of
 * `stage` (syncs[v], V of them): one a micro-batch; where the schedule
 * defers weight passes, one each time the chunk's last pending W completes
 * (fsdp/hooks.c: a unit reduces when its pending weight passes reach
 * zero), which under train.reproducibility: layout is each W again
 * (hs_pp_weights_eager); 1 without requires_grad_sync. */
static hs_status chunk_syncs(const plan_ctx *c, int stage, int V, int64_t *syncs, hs_error *e) {
    const hs_config *cfg = c->cfg;
    for (int v = 0; v < V; v++) syncs[v] = cfg->fsdp.requires_grad_sync ? c->M : 1;
    hs_pp_schedule_kind kind;
    if (c->topo->pp < 2 || !cfg->fsdp.requires_grad_sync ||
        !hs_pp_schedule_parse(cfg->accelerator.pp_schedule, &kind) || !hs_pp_schedule_splits(kind))
        return HS_OK;
    int n = (int)hs_pp_schedule_length(kind, c->M, V);
    hs_pp_action *a = malloc(sizeof *a * (size_t)n);
    int *pending = calloc((size_t)V, sizeof *pending);
    hs_status rc = a && pending ? hs_pp_schedule(kind, c->topo->pp, stage, c->M, V, a, e)
                                : hs_error_oom(e, "plan: the schedule of %d actions", n);
    if (rc == HS_OK && hs_train_layout_invariant(&cfg->train)) hs_pp_weights_eager(a, n);
    for (int v = 0; rc == HS_OK && v < V; v++) syncs[v] = 0;
    for (int k = 0; rc == HS_OK && k < n; k++) {
        if (a[k].kind == HS_PP_BACKWARD) pending[a[k].chunk]++;
        else if (a[k].kind == HS_PP_WEIGHT && --pending[a[k].chunk] == 0) syncs[a[k].chunk]++;
    }
    free(a), free(pending);
    return rc;
}

static hs_status plan_role(plan_ctx *c, int stage, int slots, hs_plan_role *r,
                           int64_t *global_numel, hs_error *e) {
    const hs_config *cfg = c->cfg;
    const hs_topology *t = c->topo;
    hs_model_stage st = {0};
    if (t->pp > 1) hs_pp_stage_chunks(&cfg->accelerator, cfg->model.n_layers, stage, &st);
    int n_blocks = cfg->model.n_layers;
    if (st.n_chunks > 0) {
        n_blocks = 0;
        for (int k = 0; k < st.n_chunks; k++) n_blocks += st.n_layers[k];
    }
    r->n_blocks = n_blocks;
    bool exact = n_blocks <= EXACT_BLOCKS;
    /* the other value shown: recompute, or (under it) keeping everything */
    hs_ac_mode ac = cfg->train.activation_checkpointing,
               other_ac = ac == HS_AC_FULL ? HS_AC_OFF : HS_AC_FULL;
    hs_model *m = NULL, *other = NULL;
    hs_status rc = role_model(c, stage, &st, slots, exact ? 0 : 1, ac, &m, e);
    if (rc == HS_OK) rc = role_model(c, stage, &st, slots, exact ? 0 : 1, other_ac, &other, e);
    if (rc == HS_OK)
        rc = activation_bytes(c, stage, &st, slots, exact, ac, n_blocks, m,
                              &r->device[HS_PLAN_ACTIVATIONS], e);
    if (rc == HS_OK)
        rc = activation_bytes(c, stage, &st, slots, exact, other_ac, n_blocks, other,
                              &r->activations_other, e);
    hs_model_free(other);
    if (rc != HS_OK) {
        hs_model_free(m);
        return rc;
    }
    if (!strcmp(cfg->accelerator.device, "cuda")) { /* charged to the device pool while live */
        const hs_model_config *mc = &cfg->model;
        int kv = mc->n_kv_heads / t->tp;
        r->device[HS_PLAN_KERNEL_SCRATCH] = hs_cuda_backward_scratch_bound(
            cfg->train.micro_batch_size, cfg->train.seq_len / t->cp, mc->n_heads / t->tp,
            kv > 0 ? kv : 1, hs_model_head_dim(mc), c->cdt);
    }
    if (t->pp > 1) { /* the hand-over's staging buffers, device memory for the whole run */
        int64_t numel, extra;
        hs_pp_message_numel(&cfg->model, cfg->train.micro_batch_size, cfg->train.seq_len, t->cp,
                            &numel, &extra);
        int64_t staging = hs_pp_staging_bytes(c->ck, numel, extra, c->M * st.n_chunks);
        add_to(c, &r->device[HS_PLAN_ACTIVATIONS], staging);
        add_to(c, &r->activations_other, staging);
    }
    int nu = hs_model_num_units(m), n_top = 0;
    int *top_index = calloc((size_t)nu + 1, sizeof(int));
    unit_sz *tops = calloc((size_t)nu + 1, sizeof *tops);
    if (!top_index || !tops) {
        free(top_index), free(tops), hs_model_free(m);
        return hs_error_oom(e, "plan: cannot allocate %d unit sizes", nu);
    }
    for (int ui = 0; ui < nu; ui++)
        if (ui == 0 || !(hs_model_unit(m, ui)->is_expert || hs_model_unit(m, ui)->root))
            top_index[ui] = n_top++;
    int64_t block_numel = 0, root_numel = 0;
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        int k = top_of(m, p->unit, top_index), x = p->on_ep_mesh;
        int64_t *tally[5] = {&r->unit_gather[k > 0][x], &r->unit_reduce[k > 0][x],
                             &r->unit_all_reduce[k > 0][x], &r->unit_gather_hpz[k > 0][x],
                             &r->unit_gather_secondary[k > 0][x]};
        if (c->fsdp) add_fsdp_param(c, p, &tops[k], tally, k == 0 && p->unit != 0);
        else add_local_param(c, p, &tops[k]);
        int64_t g = hs_ck_prod(c->ck, p->shape, p->ndim);
        add_to(c, k == 0 ? &root_numel : &block_numel, g);
    }
    hs_model_free(m);
    for (int x = 0; x < 2; x++) { /* the blocks' tallies, one block's */
        int described = exact ? n_blocks : (st.n_chunks > 0 ? st.n_chunks : 1);
        described = described > 0 ? described : 1;
        r->unit_gather[1][x] /= described, r->unit_reduce[1][x] /= described;
        r->unit_gather_hpz[1][x] /= described, r->unit_gather_secondary[1][x] /= described;
        r->unit_all_reduce[1][x] /= described;
    }
    /* The step's units in order: the described ones, or the root and each
     * chunk's block repeated to the chunk's real length. */
    int n_seq = exact ? n_top : 1 + n_blocks;
    unit_sz **seq = calloc((size_t)n_seq + 1, sizeof *seq);
    if (!seq) {
        free(top_index), free(tops);
        return hs_error_oom(e, "plan: cannot allocate %d units", n_seq);
    }
    if (exact) {
        for (int k = 0; k < n_top; k++) seq[k] = &tops[k];
    } else {
        int nch = st.n_chunks > 0 ? st.n_chunks : 1, at = 0;
        seq[at++] = &tops[0];
        for (int k = 0; k < nch; k++)
            for (int j = 0; j < (st.n_chunks > 0 ? st.n_layers[k] : n_blocks); j++)
                seq[at++] = &tops[1 + k];
        block_numel = PROD(c, block_numel / nch, n_blocks);
    }
    add_to(c, global_numel, hs_ck_add(c->ck, root_numel, block_numel));
    int64_t root_syncs = cfg->fsdp.requires_grad_sync ? c->M : 1;
    int nch = st.n_chunks > 0 ? st.n_chunks : 1;
    int64_t chunk_sync[HS_MODEL_MAX_CHUNKS];
    HS_ASSERT(nch <= HS_MODEL_MAX_CHUNKS);
    hs_status cs = chunk_syncs(c, stage, nch, chunk_sync, e);
    if (cs != HS_OK) {
        free(seq), free(top_index), free(tops);
        return cs;
    }
    for (int k = 0, v = 0, left = st.n_chunks > 0 ? st.n_layers[0] : n_blocks; k < n_seq; k++) {
        unit_sz *u = seq[k];
        /* unit k > 0 is a block of local chunk v (the blocks in chunk order) */
        while (k > 0 && left == 0 && v + 1 < nch) left = st.n_layers[++v];
        if (k > 0) left--;
        int64_t syncs = k == 0 ? root_syncs : chunk_sync[v];
        for (int i = 0; i < HS_PLAN_ITEM_COUNT; i++)
            add_to(c, &r->device[i], u->dev[i]), add_to(c, &r->host[i], u->host[i]);
        /* each micro-batch's forward; its backward's again where the forward
         * resharded, the hpZ parameters' among their secondary group */
        int64_t M = c->M, bwd = k > 0 && cfg->fsdp.reshard_after_forward ? M : 0;
        ACC(c, &r->comm_bytes[HS_PLAN_AG], M, u->ag_fwd);
        ACC(c, &r->comm_calls[HS_PLAN_AG], M, u->ag_calls);
        ACC(c, &r->comm_bytes[HS_PLAN_AG], bwd, u->ag_fwd - sum3(c, u->k_hpz));
        ACC(c, &r->comm_calls[HS_PLAN_AG], bwd, u->ag_calls - u->ag_sec_calls);
        ACC(c, &r->comm_bytes[HS_PLAN_AG_SECONDARY], bwd, sum3(c, u->k_sec));
        ACC(c, &r->comm_calls[HS_PLAN_AG_SECONDARY], bwd, u->ag_sec_calls);
        for (int g = 0; g < 3; g++) {
            int64_t(*pay)[3] = r->fsdp_payload;
            ACC(c, &pay[HS_PLAN_AG][g], M, u->k_ag[g]);
            ACC(c, &pay[HS_PLAN_AG][g], bwd, u->k_ag[g] - u->k_hpz[g]);
            ACC(c, &pay[HS_PLAN_AG_SECONDARY][g], bwd, u->k_sec[g]);
            ACC(c, &pay[HS_PLAN_RS][g], syncs, u->k_rs[g]);
            ACC(c, &pay[HS_PLAN_AR][g], syncs, u->k_ar[g], (int64_t)hs_dtype_size(c->rdt));
            if (u->k_ar[g]) ar_size(r, g, u->k_ar[g], syncs);
        }
        for (int j = HS_PLAN_RS; j <= HS_PLAN_AR; j++)
            ACC(c, &r->comm_bytes[j], syncs, u->comm[j]),
                ACC(c, &r->comm_calls[j], syncs, u->calls[j]);
    }
    r->rs_all_to_all = c->grad != HS_QUANT_NONE;
    r->canonical_sums = hs_train_layout_invariant(&c->cfg->train) && c->rdt == HS_DTYPE_F32;
    if (c->fsdp) {
        int64_t pp_ = 0, pg = 0;
        hs_status s = simulate(c, seq, n_seq, &pp_, &pg, e);
        if (s != HS_OK) {
            free(seq), free(top_index), free(tops);
            return s;
        }
        r->device[HS_PLAN_UNSHARDED] = pp_;
        r->device[HS_PLAN_UNSHARDED_GRADS] = pg;
    }
    mp_comm(c, stage, &st, n_blocks, r);
    if (r->canonical_sums && t->dp_shard > 1) {
        /* the exact gradient norm: each rank's hs_xsum gathered over its
         * shard group, once a step (fsdp/access.c) */
        int64_t all = PROD(c, t->dp_shard, (int64_t)sizeof(hs_xsum));
        add_to(c, &r->comm_bytes[HS_PLAN_AG], all);
        add_to(c, &r->comm_calls[HS_PLAN_AG], 1);
        add_to(c, &r->fsdp_payload[HS_PLAN_AG][0], all);
    }
    free(seq), free(top_index), free(tops);
    for (int i = 0; i < HS_PLAN_ITEM_COUNT; i++)
        add_to(c, &r->peak_device_bytes, r->device[i]), add_to(c, &r->peak_host_bytes, r->host[i]);
    return HS_OK;
}

/* ------------------------------------------------------------- the plan */

/* hs_config_validate refuses the configs whose products overflow; one
 * that reaches here anyway gets an error naming the sizes, not a table of
 * wrapped numbers. */
static hs_status plan_overflow(const hs_config *cfg, const plan_ctx *c, hs_plan *out, hs_error *e) {
    const hs_model_config *m = &cfg->model;
    memset(out, 0, sizeof *out);
    return hs_error_set(e, HS_ERR_CONFIG,
                        "plan: a byte count overflows 64 bits with model.dim = %d, "
                        "model.ffn_dim = %d, model.n_layers = %d, model.vocab_size = %d, "
                        "train.micro_batch_size = %d, train.seq_len = %d and %d micro-batches "
                        "per step; lower these sizes (`hypershard config` names the product "
                        "that overflows)",
                        m->dim, m->ffn_dim, m->n_layers, m->vocab_size, cfg->train.micro_batch_size,
                        cfg->train.seq_len, c->M);
}

/* checkpoint.async keeps a host copy of what this rank's checkpoint file
 * holds: at most its masters, model copies and optimizer state (replicas
 * a lower rank writes take none), for the whole run from the first save. */
static void ckpt_staging(plan_ctx *c, hs_plan_role *r) {
    const hs_ckpt_config *ck = &c->cfg->checkpoint;
    if (!ck->dir[0] || !ck->async) return;
    int64_t *b = &r->host[HS_PLAN_CKPT_STAGING];
    static const hs_plan_item saved[] = {HS_PLAN_PARAMS, HS_PLAN_MODEL_COPY, HS_PLAN_OPTIM};
    for (size_t i = 0; i < sizeof saved / sizeof saved[0]; i++)
        add_to(c, b, r->device[saved[i]]), add_to(c, b, r->host[saved[i]]);
    add_to(c, &r->peak_host_bytes, *b);
}

/* The end-of-run sample's KV cache on a rank holding n_blocks blocks
 * (model/decode.c hs_kv_cache_bytes: blocks x {K, V} x seq_len x the
 * rank's kv heads x head_dim, in the compute dtype; latent attention's
 * latents and one block's expanded keys and values), or 0 where the layout
 * decodes without one (hs_model_kv_supported, train/decoder.c). */
static int64_t sample_kv(const plan_ctx *c, int n_blocks) {
    const hs_config *cfg = c->cfg;
    const hs_topology *t = c->topo;
    const hs_model_config *mc = &cfg->model;
    if (t->cp > 1 || t->ep > 1 || cfg->data.document_masking ||
        (t->tp > 1 && cfg->accelerator.sequence_parallel))
        return 0;
    int64_t kvh = (mc->n_kv_heads > 0 ? mc->n_kv_heads : mc->n_heads) / t->tp;
    int64_t es = (int64_t)hs_dtype_size(c->cdt), T = cfg->train.seq_len;
    if (hs_model_arch_mla(mc)) { /* the latents, and one block's keys and values */
        int64_t lat = mc->mla.kv_lora_rank + mc->mla.qk_rope_head_dim;
        return hs_ck_prod(c->ck, (const int64_t[]){n_blocks, T, lat, es}, 4) +
               hs_ck_prod(c->ck, (const int64_t[]){2, T, kvh, hs_model_head_dim(mc), es}, 5);
    }
    return hs_ck_prod(c->ck, (const int64_t[]){n_blocks, 2, T, kvh, hs_model_head_dim(mc), es}, 6);
}

/* Each pipeline stage's role, and the checkpoint's bytes. */
static hs_status plan_roles(plan_ctx *c, hs_plan *out, hs_error *e) {
    const hs_config *cfg = c->cfg;
    const hs_topology *topo = c->topo;
    out->topo = topo;
    out->world = topo->world;
    out->micro_batches = c->M;
    out->engine = c->fsdp ? "fsdp" : "local";
    int roles = topo->pp > 1 ? topo->pp : 1;
    if (roles > HS_PLAN_MAX_ROLES)
        return hs_error_set(e, HS_ERR_CONFIG, "plan: %d pipeline stages; at most %d are planned",
                            roles, HS_PLAN_MAX_ROLES);
    out->n_roles = roles;
    /* each stage's activation slots, from one simulation of the schedule */
    int slots[HS_PLAN_MAX_ROLES] = {1};
    if (topo->pp > 1) {
        hs_pp_schedule_kind kind = HS_PP_1F1B;
        (void)hs_pp_schedule_parse(cfg->accelerator.pp_schedule, &kind);
        hs_model_stage st;
        hs_pp_stage_chunks(&cfg->accelerator, cfg->model.n_layers, 0, &st);
        hs_status rc = hs_pp_slots_all(kind, topo->pp, c->M, st.n_chunks, slots, e);
        if (rc != HS_OK) return rc;
    }
    for (int s = 0; s < roles; s++) {
        hs_plan_role *r = &out->roles[s];
        if (roles == 1) snprintf(r->name, sizeof r->name, "every rank");
        else snprintf(r->name, sizeof r->name, "stage %d", s);
        r->n_ranks = topo->world / roles;
        r->first_rank = -1;
        for (int k = 0; k < topo->world && r->first_rank < 0; k++)
            if (hs_topology_coords(topo, k).pp == s) r->first_rank = k;
        hs_status rc = plan_role(c, s, slots[s], r, &out->total_params, e);
        if (rc != HS_OK) return rc;
        ckpt_staging(c, r);
        r->sample_kv_bytes = sample_kv(c, r->n_blocks);
        if (r->peak_device_bytes > out->max_peak_device_bytes)
            out->max_peak_device_bytes = r->peak_device_bytes;
        if (r->peak_host_bytes > out->max_peak_host_bytes)
            out->max_peak_host_bytes = r->peak_host_bytes;
    }
    /* fp32 weights and optimizer state once each, and the model copy. */
    int states = strcmp(cfg->optimizer.target, "muon") ? 2 : 1;
    ACC(c, &out->checkpoint_bytes, out->total_params, 4, 1 + states);
    if (c->main) ACC(c, &out->checkpoint_bytes, out->total_params, (int64_t)hs_dtype_size(c->cdt));
    return HS_OK;
}

hs_status hs_plan_build(const hs_config *cfg, const hs_topology *topo, hs_plan *out, hs_error *e) {
    memset(out, 0, sizeof *out);
    hs_error_clear(e);
    const hs_mix_precision *mp = &cfg->fsdp.mix_precision;
    hs_checked ck = {0};
    plan_ctx c = {.cfg = cfg, .topo = topo, .ck = &ck};
    c.cdt = mp->param_dtype == HS_MP_NULL ? HS_DTYPE_F32 : (hs_dtype)mp->param_dtype;
    c.rdt = mp->reduce_dtype == HS_MP_NULL ? c.cdt : (hs_dtype)mp->reduce_dtype;
    c.gather = hs_fsdp_config_param_gather(&cfg->fsdp);
    c.grad = hs_fsdp_config_grad_reduce(&cfg->fsdp);
    c.fsdp = hs_engine_uses_fsdp(cfg, topo);
    if (!c.fsdp) c.cdt = c.rdt = HS_DTYPE_F32;
    c.offload = c.fsdp && cfg->fsdp.enable_offload;
    c.main = c.fsdp && cfg->optimizer.fp32_main_params && c.cdt != HS_DTYPE_F32;
    c.stashes = c.fsdp && c.cdt != HS_DTYPE_F32 && c.rdt == HS_DTYPE_F32;
    c.M = hs_config_micro_batches(cfg, topo);
    while (c.fsdp && hs_train_layout_invariant(&cfg->train) && (1 << c.canon_levels) < c.M)
        c.canon_levels++;
    hs_parallel_layout pl = {.tp = topo->tp,
                             .sequence_parallel = cfg->accelerator.sequence_parallel,
                             .loss_parallel = cfg->accelerator.loss_parallel,
                             .cp = topo->cp,
                             .ep = topo->ep};
    pl.cp_method = hs_cp_method_of(&cfg->accelerator, topo->cp, &pl.cp_a2a);
    if (hs_parallel_describe(&cfg->model, &cfg->accelerator, &pl, NULL, 0, &c.par, e) != HS_OK)
        return e->code;
    hs_status rc = plan_roles(&c, out, e);
    hs_parallel_free(c.par);
    if (rc != HS_OK) return rc;
    if (ck.overflow) return plan_overflow(cfg, &c, out, e);
    return HS_OK;
}
