/* The sizes a config implies, checked before anything is allocated: the
 * plan (train/plan.c) and the model's buffers (model/model.c) count bytes
 * in int64, the MoE layer counts a micro-batch's routed rows in int and a
 * pipeline stage holds its whole schedule, so a config whose products do
 * not fit is refused here, naming the keys whose product it is. Each bound
 * is the product times the most bytes (or copies) any figure keeps per
 * unit of it, so a config that passes never wraps a count downstream. */
#include <limits.h>

#include "config/checks.h"

/* Bytes the plan keeps per parameter element, all items together: fp32
 * master, gradient, two optimizer states, the param_dtype copy, reduce
 * slots, unsharded parameters and gradients, accumulators (each <= 4 B)
 * and the per-step collectives' multiples of them. */
#define PARAM_BYTES 64
/* Bytes per token, block and element of the widest row: one block's saved
 * activations and the step's scratch (ten-odd buffers of <= 4 B a row
 * element), the residual stream and the per-step TP / CP / EP / PP traffic. */
#define ACT_BYTES 256
/* Logit bytes per token and vocabulary entry a step moves (fp32 logits
 * gathered over TP, and their gradient). */
#define LOGIT_BYTES 8

typedef struct factor {
    const char *name;
    int64_t v;
} factor;

/* Whether the product of the n factors times `per` fits an int64; if not,
 * one report line: "<what>: a x b = 1 x 2 ... overflows ...; <fix>". */
static bool fits(hs_cfg_report *rep, const char *what, const factor *f, int n, int64_t per,
                 const char *unit, const char *fix) {
    int64_t v[8], out;
    HS_ASSERT(n >= 1 && n < 8);
    for (int i = 0; i < n; i++) v[i] = f[i].v;
    v[n] = per;
    if (hs_prod_i64(v, n + 1, &out)) return true;
    char names[256] = "", values[256] = "";
    size_t un = 0, uv = 0;
    for (int i = 0; i < n; i++) {
        const char *sep = i ? " x " : "";
        int a = snprintf(names + un, sizeof names - un, "%s%s", sep, f[i].name);
        int b = snprintf(values + uv, sizeof values - uv, "%s%lld", sep, (long long)f[i].v);
        if (a > 0 && (size_t)a < sizeof names - un) un += (size_t)a;
        if (b > 0 && (size_t)b < sizeof values - uv) uv += (size_t)b;
    }
    hs_cfg_report_add(rep,
                      "%s: %s = %s, times %lld %s, overflows a 64-bit count (at most %lld); "
                      "%s",
                      what, names, values, (long long)per, unit, (long long)INT64_MAX, fix);
    return false;
}

/* The queries' width, model.n_heads x the head size. */
static int64_t q_width(const hs_model_config *m) {
    return (int64_t)(m->n_heads >= 1 ? m->n_heads : 1) * hs_model_head_dim(m);
}

/* The widest row a block computes per token, as one or two factors: the
 * model dim or the queries, the dense MLP, or for MoE a token's top_k expert rows (of the
 * expert or model dim), the shared expert, the router. */
static int widest(const hs_model_config *m, factor w[2]) {
    int n = 1;
    w[0] = (factor){"model.dim", m->dim};
    if (q_width(m) > m->dim) w[0] = (factor){"model.n_heads x model.head_dim", q_width(m)};
    if (!hs_model_arch_moe(m)) {
        if (m->ffn_dim > m->dim) w[0] = (factor){"model.ffn_dim", m->ffn_dim};
        return n;
    }
    const hs_moe_config *e = &m->moe;
    factor row = w[0];
    if (e->expert_ffn_dim > m->dim) row = (factor){"model.moe.expert_ffn_dim", e->expert_ffn_dim};
    if (e->top_k > 1) w[0] = (factor){"model.moe.top_k", e->top_k}, w[1] = row, n = 2;
    else w[0] = row;
    int64_t most = n == 2 ? w[0].v * w[1].v : w[0].v;
    /* Qwen3-MoE's dense blocks (mlp_only_layers, decoder_sparse_step) */
    int dense = hs_model_dense_layers(m) > 0 ? m->ffn_dim : 0;
    factor one[] = {{"model.moe.shared_expert_ffn_dim", e->shared_expert_ffn_dim},
                    {"model.moe.num_experts", e->num_experts},
                    {"model.ffn_dim", dense}};
    for (int i = 0; i < 3; i++)
        if (one[i].v > most) most = one[i].v, w[0] = one[i], n = 1;
    return n;
}

/* The widest row of a block's parameter tensors ([E, F, C] experts: F x C),
 * which FSDP pads by up to dp_shard_size - 1 rows. */
static int64_t widest_param_row(const hs_model_config *m) {
    bool moe = hs_model_arch_moe(m);
    int64_t v[] = {m->dim,
                   q_width(m),
                   moe ? (int64_t)m->moe.expert_ffn_dim * m->dim : m->ffn_dim,
                   moe ? m->moe.shared_expert_ffn_dim : 0,
                   moe ? m->moe.num_experts : 0,
                   hs_model_dense_layers(m) > 0 ? m->ffn_dim : 0};
    int64_t most = 1;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) most = v[i] > most ? v[i] : most;
    return most;
}

/* The parameters, term by term, then all of them with FSDP's padding.
 * Returns false when a line was reported. */
static bool check_params(const hs_config *c, int shard, int64_t *params, hs_cfg_report *rep) {
    const hs_model_config *m = &c->model;
    const char *fix = "lower these sizes";
    bool moe = hs_model_arch_moe(m);
    int64_t L = m->n_layers, C = m->dim, V = m->vocab_size, E = m->moe.num_experts;
    int64_t heads = m->n_heads >= 1 ? m->n_heads : 1, hd = hs_model_head_dim(m), q = q_width(m);
    int64_t kv = (m->n_kv_heads >= 1 ? m->n_kv_heads : heads) * hd;
    factor emb[] = {{"model.vocab_size", V}, {"model.dim", C}};
    /* q and o are dim x (n_heads x head dim), k and v dim x (n_kv_heads x
     * head dim). */
    factor att[] = {{"model.dim", C},
                    {"2 x (model.n_heads + model.n_kv_heads) x model.head_dim", 2 * (q + kv)},
                    {"model.n_layers", L}};
    factor mlp[] = {{"model.dim", C}, {"model.ffn_dim", m->ffn_dim}, {"model.n_layers", L}};
    factor exp[] = {{"model.moe.num_experts", E},
                    {"model.moe.expert_ffn_dim", m->moe.expert_ffn_dim},
                    {"model.dim", C},
                    {"model.n_layers", L}};
    factor shr[] = {{"model.moe.shared_expert_ffn_dim", m->moe.shared_expert_ffn_dim},
                    {"model.dim", C},
                    {"model.n_layers", L}};
    /* The embedding and lm_head; q, k, v, o; the three SwiGLU matrices of
     * an MLP or expert. */
    const char *mats = "bytes (3 matrices, 64 B a parameter)";
    bool ok = fits(rep, "the model's embedding and lm_head", emb, 2, 2 * PARAM_BYTES,
                   "bytes (2 tables, 64 B a parameter)", fix);
    ok &= fits(rep, "the model's attention parameters", att, 3, PARAM_BYTES, "bytes a parameter",
               fix);
    if (!moe || hs_model_dense_layers(m) > 0)
        ok &= fits(rep, "the model's MLP parameters", mlp, 3, 3 * PARAM_BYTES, mats, fix);
    if (moe) {
        ok &= fits(rep, "the model's expert parameters", exp, 4, 3 * PARAM_BYTES, mats, fix);
        ok &= fits(rep, "the model's shared-expert parameters", shr, 3, 3 * PARAM_BYTES, mats, fix);
    }
    if (!ok) return false;
    /* Each term fits, so these sums and the products below are checked only
     * against each other: a block's weights and norms, each of its (at most
     * 16) tensors padded by < dp_shard_size rows, the embedding, lm_head
     * and final norm likewise. */
    hs_checked ck = {0};
    int64_t mlp_width = moe ? E * m->moe.expert_ffn_dim + m->moe.shared_expert_ffn_dim + E
                            : m->ffn_dim;
    if (moe && hs_model_dense_layers(m) > 0 && m->ffn_dim > mlp_width) mlp_width = m->ffn_dim;
    int64_t block = hs_ck_add(&ck, hs_ck_mul(&ck, C, 2 * (q + kv + 1) + 2 * hd),
                              hs_ck_mul(&ck, 3 * C, mlp_width));
    int64_t pad = hs_ck_prod(&ck, (const int64_t[]){16, shard, widest_param_row(m)}, 3);
    int64_t blocks = hs_ck_mul(&ck, hs_ck_add(&ck, block, pad), L);
    int64_t ends = hs_ck_prod(&ck, (const int64_t[]){4, V + shard, C}, 3);
    *params = hs_ck_add(&ck, blocks, ends);
    if (ck.overflow) {
        hs_cfg_report_add(rep,
                          "the model's parameters together (model.dim = %d, model.n_layers = %d, "
                          "model.vocab_size = %d, with their padding to fsdp_config.dp_shard_size "
                          "= %d) overflow a 64-bit count; lower these sizes",
                          m->dim, m->n_layers, m->vocab_size, shard);
        return false;
    }
    factor all[] = {{"the parameters with their padding", *params}};
    return fits(rep, "the model's parameters together", all, 1, PARAM_BYTES, "bytes a parameter",
                fix);
}

/* hs_moe_shapes counts a micro-batch's routed rows in int. */
static bool check_moe_rows(const hs_config *c, hs_cfg_report *rep) {
    const hs_train_config *t = &c->train;
    int64_t rows;
    if (!hs_model_arch_moe(&c->model) ||
        (hs_prod_i64((const int64_t[]){t->micro_batch_size, t->seq_len, c->model.moe.top_k}, 3,
                     &rows) &&
         rows <= INT_MAX))
        return true;
    hs_cfg_report_add(rep,
                      "a micro-batch's routed MoE rows: train.micro_batch_size x train.seq_len x "
                      "model.moe.top_k = %d x %d x %d exceed %d; lower train.micro_batch_size or "
                      "train.seq_len",
                      t->micro_batch_size, t->seq_len, c->model.moe.top_k, INT_MAX);
    return false;
}

/* A micro-batch's activations, then a step's: gpipe keeps every
 * micro-batch's, and a step's traffic is M times a micro-batch's. */
static void check_tokens(const hs_config *c, int M, int64_t params, hs_cfg_report *rep) {
    const hs_model_config *m = &c->model;
    factor w[2] = {{0}};
    int nw = widest(m, w), n = 0;
    factor f[6];
    f[n++] = (factor){"train.micro_batch_size", c->train.micro_batch_size};
    f[n++] = (factor){"train.seq_len", c->train.seq_len};
    f[n++] = (factor){"(model.n_layers + 2)", (int64_t)m->n_layers + 2};
    for (int i = 0; i < nw; i++) f[n++] = w[i];
    if (!check_moe_rows(c, rep) ||
        !fits(rep, "a micro-batch's activations", f, n, ACT_BYTES, "bytes",
              "lower train.micro_batch_size or train.seq_len (or the model sizes)") ||
        M < 1)
        return;
    factor steps = {"micro-batches per step", M};
    f[n++] = steps;
    const char *fix = "lower train.global_batch_size (or the sizes named)";
    if (!fits(rep, "a step's activations and traffic", f, n, ACT_BYTES, "bytes", fix)) return;
    factor lg[] = {f[0], f[1], {"model.vocab_size", m->vocab_size}, steps};
    if (!fits(rep, "a step's logits", lg, 4, LOGIT_BYTES, "bytes", fix)) return;
    factor ag[] = {{"the parameters with their padding", params}, steps};
    fits(rep, "a step's FSDP traffic", ag, 2, 4 * 4,
         "bytes (two all-gathers, a reduce-scatter and an all-reduce)", fix);
}

/* A stage holds its whole schedule, 2 x M x V actions (3 x for the
 * zero-bubble schedules, whose backwards come in two), and the plan
 * replays it: HS_PP_MAX_ACTIONS keeps both small. */
static void check_schedule(const hs_config *c, const hs_topology *t, int M, hs_cfg_report *rep) {
    const hs_accel_config *a = &c->accelerator;
    if (a->pp_size <= 1 || M < 1) return;
    const hs_pp_schedule_info *info = hs_pp_schedule_find(a->pp_schedule);
    if (!info) return; /* the schema refuses the name */
    int per = hs_pp_schedule_passes(info);
    int64_t V = a->pp_virtual_stages > 1 ? a->pp_virtual_stages : 1, n = per * (int64_t)M * V;
    if (n <= HS_PP_MAX_ACTIONS) return;
    int64_t most = HS_PP_MAX_ACTIONS / (per * V);
    hs_cfg_report_add(rep,
                      "the pipeline schedule has %d x micro-batches per step x "
                      "accelerator.pp_virtual_stages = %d x %d x %lld = %lld actions per stage, "
                      "more than %d (micro-batches = train.global_batch_size / "
                      "(train.micro_batch_size x dp_size) = %lld / (%d x %d)); set "
                      "train.global_batch_size: %lld or less",
                      per, per, M, (long long)V, (long long)n, HS_PP_MAX_ACTIONS,
                      hs_config_global_batch(c, t), c->train.micro_batch_size, t->dp,
                      (long long)most * c->train.micro_batch_size * t->dp);
}

void hs_cfg_check_sizes(const hs_config *c, const hs_topology *t, hs_cfg_report *rep) {
    const hs_model_config *m = &c->model;
    if (m->dim < 1 || m->n_layers < 1 || m->vocab_size < 1 || c->train.micro_batch_size < 1 ||
        c->train.seq_len < 1)
        return; /* reported by the bounds check */
    if (m->n_layers > HS_MODEL_MAX_LAYERS) {
        hs_cfg_report_add(rep,
                          "model.n_layers = %d is more than %d blocks, the most the plan (and "
                          "train's memory check) replays a step over; lower model.n_layers",
                          m->n_layers, HS_MODEL_MAX_LAYERS);
        return;
    }
    int shard = t && t->dp_shard > 0 ? t->dp_shard : 1;
    int64_t params = 0;
    if (!check_params(c, shard, &params, rep)) return;
    int M = t ? hs_config_micro_batches(c, t) : 0;
    check_tokens(c, M, params, rep);
    if (t) check_schedule(c, t, M, rep);
}
