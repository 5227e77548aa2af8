/* The trainer's own configuration rules (beyond spec 004 §4.1): the model
 * shape, the batch split over data-parallel ranks, the parallel degrees
 * against the model, the pipeline stages and their schedule, and the data /
 * eval / checkpoint settings. */
#include <stdio.h>
#include <string.h>

#include "config/checks.h"
#include "hypershard/device.h"

/* model.moe.mlp_only_layers / decoder_sparse_step: Qwen3-MoE's dense
 * blocks among the MoE ones, inside the model, at least one MoE block
 * left, and model.ffn_dim for the dense ones. */
static void check_dense_layers(const hs_model_config *m, hs_cfg_report *rep) {
    const hs_moe_config *e = &m->moe;
    if (e->first_k_dense_replace > 0 && !hs_model_arch_mla(m))
        hs_cfg_report_add(
            rep,
            "model.moe.first_k_dense_replace = %d with model.arch = %s: DeepSeek-V3's "
            "leading dense blocks; set model.arch: deepseek_v3, or use "
            "mlp_only_layers with arch qwen3_moe",
            e->first_k_dense_replace, m->arch);
    else if (e->first_k_dense_replace >= m->n_layers && m->n_layers >= 1)
        hs_cfg_report_add(rep,
                          "model.moe.first_k_dense_replace = %d leaves no block of the %d with "
                          "experts; set it below model.n_layers",
                          e->first_k_dense_replace, m->n_layers);
    else if (e->first_k_dense_replace > 0 && m->ffn_dim < 1)
        hs_cfg_report_add(rep,
                          "model.ffn_dim = %d: the dense blocks of model.moe.first_k_dense_replace "
                          "need their MLP width; set model.ffn_dim >= 1",
                          m->ffn_dim);
    bool mixed = e->n_mlp_only_layers > 0 || e->decoder_sparse_step != 1;
    if (!mixed) return;
    if (strcmp(m->arch, "qwen3_moe") != 0) {
        hs_cfg_report_add(rep,
                          "model.moe.mlp_only_layers (%d entries) / model.moe.decoder_sparse_step "
                          "= %d with model.arch = %s: dense blocks among the MoE ones are "
                          "Qwen3-MoE's; set model.arch: qwen3_moe, or mlp_only_layers: [] and "
                          "decoder_sparse_step: 1",
                          e->n_mlp_only_layers, e->decoder_sparse_step, m->arch);
        return;
    }
    for (int i = 0; i < e->n_mlp_only_layers; i++)
        if (e->mlp_only_layers[i] >= m->n_layers)
            hs_cfg_report_add(rep,
                              "model.moe.mlp_only_layers[%d] = %d is not a block of the model "
                              "(model.n_layers = %d: blocks 0 to %d); remove it",
                              i, e->mlp_only_layers[i], m->n_layers, m->n_layers - 1);
    if (m->n_layers >= 1 && hs_model_dense_layers(m) == m->n_layers)
        hs_cfg_report_add(rep,
                          "model.moe.mlp_only_layers and model.moe.decoder_sparse_step = %d leave "
                          "no block of the %d with experts; keep at least one, or use "
                          "model.arch: qwen3 for a dense model",
                          e->decoder_sparse_step, m->n_layers);
    if (m->ffn_dim < 1)
        hs_cfg_report_add(rep,
                          "model.ffn_dim = %d: the dense blocks of model.moe.mlp_only_layers / "
                          "decoder_sparse_step need their MLP width; set model.ffn_dim >= 1",
                          m->ffn_dim);
}

/* DeepSeekMoE's router options (hs_moe_config): the groups divide the
 * experts, hold two each to score a group, and leave top_k to choose
 * from; Mixtral's aux loss is a softmax's. */
static void check_router(const hs_moe_config *x, hs_cfg_report *rep) {
    int E = x->num_experts, G = x->n_group;
    if (!strcmp(x->score_func, "sigmoid") && x->aux_loss_coef > 0)
        hs_cfg_report_add(rep,
                          "model.moe.aux_loss_coef = %g with model.moe.score_func = sigmoid: the "
                          "load-balancing loss is defined over softmax probabilities; set "
                          "aux_loss_coef: 0 and balance with model.moe.bias_update_speed (e.g. "
                          "0.001), or score_func: softmax",
                          x->aux_loss_coef);
    if (G < 1 || E < 1) return;
    if (G > HS_MOE_MAX_GROUPS)
        hs_cfg_report_add(rep, "model.moe.n_group = %d exceeds the %d groups a router supports", G,
                          HS_MOE_MAX_GROUPS);
    else if (E % G)
        hs_cfg_report_add(rep,
                          "model.moe.num_experts = %d is not divisible by model.moe.n_group = %d; "
                          "groups hold equal numbers of experts",
                          E, G);
    else if (G > 1 && E / G < 2)
        hs_cfg_report_add(rep,
                          "model.moe.n_group = %d leaves %d expert a group of model.moe."
                          "num_experts = %d; a group is scored by its two best experts, so set "
                          "n_group <= %d",
                          G, E / G, E, E / 2);
    if (x->topk_group > G)
        hs_cfg_report_add(rep,
                          "model.moe.topk_group = %d exceeds model.moe.n_group = %d; set "
                          "topk_group <= n_group",
                          x->topk_group, G);
    else if (E % G == 0 && x->top_k > x->topk_group * (E / G))
        hs_cfg_report_add(rep,
                          "model.moe.top_k = %d exceeds the %d experts of model.moe.topk_group = "
                          "%d groups of %d; raise topk_group or lower top_k",
                          x->top_k, x->topk_group * (E / G), x->topk_group, E / G);
}

/* Multi-head latent attention's shapes and DeepSeek-V3's router. */
static void check_mla(const hs_config *c, hs_cfg_report *rep) {
    const hs_model_config *m = &c->model;
    const hs_mla_config *a = &m->mla;
    int qk = a->qk_nope_head_dim + a->qk_rope_head_dim;
    if (a->qk_rope_head_dim % 2)
        hs_cfg_report_add(rep,
                          "model.mla.qk_rope_head_dim = %d must be even for RoPE (it rotates "
                          "pairs)",
                          a->qk_rope_head_dim);
    if (a->v_head_dim > qk)
        hs_cfg_report_add(rep,
                          "model.mla.v_head_dim = %d exceeds qk_nope_head_dim + qk_rope_head_dim "
                          "= %d: attention runs the values in the query head's width; lower "
                          "v_head_dim",
                          a->v_head_dim, qk);
    if (m->head_dim > 0 && m->head_dim != qk)
        hs_cfg_report_add(rep,
                          "model.head_dim = %d with model.arch = deepseek_v3: the head is "
                          "model.mla.qk_nope_head_dim + qk_rope_head_dim = %d; set head_dim: null",
                          m->head_dim, qk);
    if (m->n_kv_heads != m->n_heads)
        hs_cfg_report_add(rep,
                          "model.n_kv_heads = %d with model.arch = deepseek_v3: latent attention "
                          "expands a key and a value for every query head; set n_kv_heads: %d "
                          "(= model.n_heads)",
                          m->n_kv_heads, m->n_heads);
    const hs_moe_config *e = &m->moe;
    if (strcmp(e->score_func, "sigmoid") != 0)
        hs_cfg_report_add(rep,
                          "model.moe.score_func = %s with model.arch = deepseek_v3: DeepSeek-V3 "
                          "routes by sigmoid scores; set score_func: sigmoid (and aux_loss_coef: "
                          "0)",
                          e->score_func);
    if (e->expert_ffn_dim >= 1 && e->shared_expert_ffn_dim % e->expert_ffn_dim)
        hs_cfg_report_add(rep,
                          "model.moe.shared_expert_ffn_dim = %d with model.arch = deepseek_v3: the "
                          "shared experts are n_shared_experts of expert_ffn_dim = %d; set a "
                          "multiple of it",
                          e->shared_expert_ffn_dim, e->expert_ffn_dim);
}

void hs_cfg_check_model(const hs_config *c, hs_cfg_report *rep) {
    const hs_model_config *m = &c->model;
    if (hs_model_arch_mla(m)) check_mla(c, rep);
    if (m->head_dim > 0 && !hs_model_arch_mla(m)) {
        if (m->head_dim % 2)
            hs_cfg_report_add(rep,
                              "model.head_dim = %d must be even for RoPE (it rotates pairs); "
                              "change model.head_dim",
                              m->head_dim);
    } else if (hs_model_arch_mla(m)) {
        /* the head is model.mla's (check_mla) */
    } else if (m->n_heads >= 1 && m->dim >= 1 && m->dim % m->n_heads)
        hs_cfg_report_add(rep,
                          "model.dim = %d is not divisible by model.n_heads = %d; choose n_heads "
                          "that divides dim, or set model.head_dim",
                          m->dim, m->n_heads);
    else if (m->n_heads >= 1 && m->dim >= 1 && (m->dim / m->n_heads) % 2)
        hs_cfg_report_add(rep,
                          "model.dim / model.n_heads = %d / %d = %d is the head dim, which must "
                          "be even for RoPE; change model.dim or model.n_heads, or set "
                          "model.head_dim",
                          m->dim, m->n_heads, m->dim / m->n_heads);
    const hs_rope_scaling *rs = &m->rope_scaling;
    if (!strcmp(rs->type, "llama3") && !(rs->high_freq_factor > rs->low_freq_factor))
        hs_cfg_report_add(rep,
                          "model.rope_scaling.high_freq_factor = %g must exceed low_freq_factor = "
                          "%g (llama3 blends the wavelengths between their two bounds)",
                          rs->high_freq_factor, rs->low_freq_factor);
    if (m->n_kv_heads >= 1 && m->n_heads >= 1 && m->n_heads % m->n_kv_heads)
        hs_cfg_report_add(rep,
                          "model.n_heads = %d is not divisible by model.n_kv_heads = %d; each "
                          "key/value head serves a whole group of query heads",
                          m->n_heads, m->n_kv_heads);
    if (hs_model_arch_moe(m) && m->moe.top_k > m->moe.num_experts)
        hs_cfg_report_add(rep,
                          "model.moe.top_k = %d exceeds model.moe.num_experts = %d; set top_k <= "
                          "num_experts",
                          m->moe.top_k, m->moe.num_experts);
    if (!strcmp(m->arch, "moe") && !m->moe.norm_topk_prob)
        hs_cfg_report_add(rep,
                          "model.moe.norm_topk_prob = false with model.arch = moe: Mixtral always "
                          "renormalises the top-k routing weights; set norm_topk_prob: true or "
                          "model.arch: qwen3_moe");
    if (!strcmp(m->arch, "qwen3_moe") && m->moe.shared_expert_ffn_dim > 0)
        hs_cfg_report_add(rep,
                          "model.moe.shared_expert_ffn_dim = %d with model.arch = qwen3_moe: "
                          "Qwen3-MoE has no shared expert; set shared_expert_ffn_dim: 0 or "
                          "model.arch: moe",
                          m->moe.shared_expert_ffn_dim);
    check_dense_layers(m, rep);
    if (hs_model_arch_moe(m)) check_router(&m->moe, rep);
}

/* data.blend: indexed datasets only, instead of data.path, weights that
 * are shares (>= 0, not all 0); data.eos_id inside the vocabulary, and
 * set for document masking, whose documents it ends. */
static void check_blend(const hs_config *c, hs_cfg_report *rep) {
    const hs_data_config *d = &c->data;
    if (d->document_masking && d->eos_id < 0)
        hs_cfg_report_add(rep,
                          "data.document_masking = true needs data.eos_id, the token that ends "
                          "each document (the tokenizer's end-of-text id); set data.eos_id, or "
                          "data.document_masking: false");
    if (d->eos_id >= 0 && c->model.vocab_size >= 1 && d->eos_id >= c->model.vocab_size)
        hs_cfg_report_add(rep,
                          "data.eos_id = %d is not below model.vocab_size = %d; use the "
                          "tokenizer's end-of-text id (or null)",
                          d->eos_id, c->model.vocab_size);
    if (d->n_blend == 0) return;
    if (strcmp(d->source, "indexed"))
        hs_cfg_report_add(rep,
                          "data.blend is set but data.source = %s; a blend mixes indexed "
                          "datasets: set data.source: indexed (or data.blend: [])",
                          d->source);
    if (d->path[0])
        hs_cfg_report_add(rep,
                          "data.path = %s and data.blend are both set; with a blend every "
                          "dataset is a blend entry: set data.path: null (or add it to the blend)",
                          d->path);
    double sum = 0;
    for (int i = 0; i < d->n_blend; i++) {
        double w = d->blend[i].weight;
        if (!(w >= 0) || w > 1e300)
            hs_cfg_report_add(rep,
                              "data.blend[%d].weight = %g (path %s) must be a number from 0 to "
                              "1e300; weights are relative shares",
                              i, w, d->blend[i].path);
        else sum += w;
    }
    if (!(sum > 0))
        hs_cfg_report_add(rep,
                          "data.blend: the weights of its %d datasets sum to %g; give at least "
                          "one a weight > 0",
                          d->n_blend, sum);
}

void hs_cfg_check_run(const hs_config *c, hs_cfg_report *rep) {
    check_blend(c, rep);
    if (strcmp(c->data.source, "builtin") && !c->data.path[0] && c->data.n_blend == 0)
        hs_cfg_report_add(rep,
                          "data.path is required when data.source = %s; set data.path to the "
                          "input file (for indexed: the PREFIX of PREFIX.bin/.idx, or "
                          "data.blend) or data.source: builtin",
                          c->data.source);
    /* The same words as hs_data_open's, which `train` would reach later. */
    bool bytes = !strcmp(c->data.source, "builtin") || !strcmp(c->data.source, "text");
    if (bytes && c->model.vocab_size >= 1 && c->model.vocab_size < 256)
        hs_cfg_report_add(rep,
                          "model.vocab_size: %d is too small for data.source %s, which uses byte "
                          "tokens; set model.vocab_size >= 256",
                          c->model.vocab_size, c->data.source);
    if (c->train.eval_every > 0 && c->data.val_fraction <= 0)
        hs_cfg_report_add(rep,
                          "train.eval_every = %d needs validation data but data.val_fraction = 0; "
                          "set data.val_fraction > 0 (e.g. 0.05) or train.eval_every: 0",
                          c->train.eval_every);
    if (!c->checkpoint.resume[0])
        hs_cfg_report_add(rep, "checkpoint.resume is empty; use none, auto or a checkpoint path");
    else if (!strcmp(c->checkpoint.resume, "auto") && !c->checkpoint.dir[0])
        hs_cfg_report_add(rep, "checkpoint.resume = auto looks for the latest checkpoint in "
                               "checkpoint.dir, which is null; set checkpoint.dir (or "
                               "checkpoint.resume: none)");
}

/* global = micro x dp x M with M >= 1 whole micro-batches per step. */
static void check_batch(const hs_config *c, const hs_topology *t, hs_cfg_report *rep) {
    long long g = hs_config_global_batch(c, t), mb = c->train.micro_batch_size, dp = t->dp;
    if (g < 1 || mb < 1 || dp < 1) return; /* reported by the bounds check */
    long long denom = mb * dp;
    if (g % denom == 0) return;
    long long up = (g / denom + 1) * denom, best_mb = 0;
    for (long long m = mb - 1; m >= 1 && !best_mb; m--)
        if (g % (m * dp) == 0) best_mb = m;
    char alt[96] = "";
    if (best_mb) snprintf(alt, sizeof alt, ", or train.micro_batch_size: %lld", best_mb);
    hs_cfg_report_add(rep,
                      "train.global_batch_size = %lld is not a multiple of "
                      "train.micro_batch_size x dp_size = %lld x %lld = %lld, so micro-batches per "
                      "step (global / (micro x dp)) is not a whole number >= 1; set "
                      "train.global_batch_size: %lld%s",
                      g, mb, dp, denom, up, alt);
}

/* The even split of `total` blocks over `pp` stages. The first stage also
 * embeds and the last runs the norm and lm_head, so the middle stages take
 * the extra blocks first, then stage 0. */
static void even_split(int total, int pp, int *count) {
    int base = total / pp, extra = total % pp;
    for (int s = 0; s < pp; s++) count[s] = base;
    for (int s = 1; s <= pp - 2 && extra > 0; s++, extra--) count[s]++;
    if (extra > 0) count[0]++;
}

/* Chunks of the pipeline: pp_size x pp_virtual_stages. */
static int pp_chunks(const hs_accel_config *a) {
    int v = a->pp_virtual_stages > 1 ? a->pp_virtual_stages : 1;
    return a->pp_size * v;
}

void hs_config_pp_stages(const hs_accel_config *accel, int model_layers, int *first_layer,
                         int *n_layers) {
    int pp = pp_chunks(accel);
    if (pp < 1) return;
    if (accel->n_pp_layers == pp) memcpy(n_layers, accel->pp_layers, sizeof(int) * (size_t)pp);
    else even_split(model_layers, pp, n_layers);
    for (int s = 0, sum = 0; s < pp; sum += n_layers[s], s++) first_layer[s] = sum;
}

int hs_config_pp_chunk(const hs_accel_config *accel, int stage, int v) {
    return hs_pp_schedule_chunk(hs_pp_schedule_find(accel->pp_schedule), accel->pp_size, stage, v);
}

/* "[3, 1]" of `n` counts. */
static void int_list_text(const int *v, int n, char *out, size_t cap) {
    size_t used = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%d", i ? ", " : "", v[i]);
    if (used < cap) snprintf(out + used, cap - used, "]");
}

/* The fix that always works: "accelerator.pp_layers: [2, 2] (the even split
 * of model.n_layers = 4), or [] for it"; when no even split exists, the sizes
 * to change. */
static void even_split_fix(const hs_config *c, char *out, size_t cap) {
    int pp = pp_chunks(&c->accelerator), total = c->model.n_layers;
    if (pp > total || pp > HS_PP_MAX_STAGES) {
        snprintf(out, cap, "accelerator.pp_layers: [] with accelerator.pp_size%s <= %d",
                 c->accelerator.pp_virtual_stages > 1 ? " x pp_virtual_stages" : "",
                 total < HS_PP_MAX_STAGES ? total : HS_PP_MAX_STAGES);
        return;
    }
    int count[HS_PP_MAX_STAGES];
    even_split(total, pp, count);
    char list[HS_PP_MAX_STAGES * 12 + 4];
    int_list_text(count, pp, list, sizeof list);
    snprintf(out, cap,
             "accelerator.pp_layers: %s (the even split of model.n_layers = %d), or [] for it",
             list, total);
}

/* accelerator.pp_layers: one count >= 1 per stage, all blocks exactly once. */
static void check_pp_layers(const hs_config *c, hs_cfg_report *rep) {
    const hs_accel_config *a = &c->accelerator;
    int pp = pp_chunks(a), n = a->n_pp_layers, total = c->model.n_layers;
    if (n == 0 || pp < 1 || total < 1) return; /* bad sizes are reported by their bounds */
    char list[HS_PP_MAX_STAGES * 12 + 4], fix[HS_PP_MAX_STAGES * 12 + 96];
    int_list_text(a->pp_layers, n, list, sizeof list);
    long long sum = 0;
    int below = 0;
    for (int i = 0; i < n; i++) {
        sum += a->pp_layers[i];
        below += a->pp_layers[i] < 1;
    }
    if (pp == 1) {
        if (n == 1 && a->pp_layers[0] == total) return;
        char more[96] = "";
        if (n > 1 && !below && sum == total)
            snprintf(more, sizeof more, ", or accelerator.pp_size: %d to run these %d stages", n,
                     n);
        hs_cfg_report_add(rep,
                          "accelerator.pp_layers = %s is set but accelerator.pp_size = 1: its one "
                          "stage holds all model.n_layers = %d blocks; set accelerator.pp_layers: "
                          "[] (or [%d])%s",
                          list, total, total, more);
        return;
    }
    even_split_fix(c, fix, sizeof fix);
    if (n != pp && a->pp_virtual_stages > 1) {
        hs_cfg_report_add(rep,
                          "accelerator.pp_layers = %s has %d entries but accelerator.pp_size x "
                          "pp_virtual_stages = %d x %d = %d: it lists the blocks of each virtual "
                          "stage in model order, one entry each; set %s",
                          list, n, a->pp_size, a->pp_virtual_stages, pp, fix);
        return;
    }
    if (n != pp) {
        hs_cfg_report_add(rep,
                          "accelerator.pp_layers = %s has %d entries but accelerator.pp_size = "
                          "%d: it lists the blocks of each pipeline stage, one entry per stage; "
                          "set %s",
                          list, n, pp, fix);
        return;
    }
    for (int i = 0; i < n; i++)
        if (a->pp_layers[i] < 1)
            hs_cfg_report_add(rep,
                              "accelerator.pp_layers[%d] = %d must be >= 1: every pipeline stage "
                              "needs at least one block; set %s",
                              i, a->pp_layers[i], fix);
    if (!below && sum != total)
        hs_cfg_report_add(rep,
                          "accelerator.pp_layers = %s sums to %lld blocks but model.n_layers = "
                          "%d: the stages must hold every block exactly once; set %s",
                          list, sum, total, fix);
}

/* A schedule's chunks per stage (the table's min_chunks .. max_chunks):
 * interleaved 1F1B and its virtual stages come together, a V runs exactly
 * two chunks per stage, the others one. */
static void check_pp_virtual(const hs_config *c, hs_cfg_report *rep) {
    const hs_accel_config *a = &c->accelerator;
    const hs_pp_schedule_info *info = hs_pp_schedule_find(a->pp_schedule);
    if (!info) return; /* the schema refuses the name */
    bool inter = info->max_chunks > 1;
    int v = a->pp_virtual_stages, total = c->model.n_layers;
    if (info->v_shape && v != 2)
        hs_cfg_report_add(rep,
                          "accelerator.pp_schedule = %s runs two model chunks per stage in a V "
                          "(stage s holds chunks s and 2 x pp_size - 1 - s), so it needs "
                          "accelerator.pp_virtual_stages: 2, got %d; set it to 2",
                          info->name, v);
    if (info->v_shape && v != 2) return;
    if (inter && v < info->min_chunks)
        hs_cfg_report_add(rep,
                          "accelerator.pp_schedule = %s needs "
                          "accelerator.pp_virtual_stages >= %d model chunks per stage, got %d; set "
                          "accelerator.pp_virtual_stages: %d, or accelerator.pp_schedule: 1f1b",
                          info->name, info->min_chunks, v, info->min_chunks);
    if (!inter && v > 1) {
        char multi[128] = "";
        for (int k = 0, n = 0; k < HS_PP_N_SCHEDULES; k++) {
            const hs_pp_schedule_info *o = hs_pp_schedule_info_of((hs_pp_schedule_kind)k);
            if (o->max_chunks < 2) continue;
            size_t used = strlen(multi);
            snprintf(multi + used, sizeof multi - used, "%s%s", n++ ? " or " : "", o->name);
        }
        hs_cfg_report_add(rep,
                          "accelerator.pp_virtual_stages = %d needs accelerator.pp_schedule: "
                          "%s (%s runs one chunk per stage); set it, or "
                          "accelerator.pp_virtual_stages: 1",
                          v, multi, a->pp_schedule);
    }
    int most = inter ? info->max_chunks : HS_PP_MAX_VIRTUAL;
    if (v > most)
        hs_cfg_report_add(rep,
                          "accelerator.pp_virtual_stages = %d: at most %d chunks per stage; set "
                          "accelerator.pp_virtual_stages: %d or fewer",
                          v, most, most);
    if (a->pp_size >= 1 && v >= 1 && (long long)a->pp_size * v > HS_PP_MAX_STAGES)
        hs_cfg_report_add(rep,
                          "accelerator.pp_size x pp_virtual_stages = %d x %d = %lld model chunks: "
                          "at most %d; lower accelerator.pp_virtual_stages (or pp_size)",
                          a->pp_size, v, (long long)a->pp_size * v, HS_PP_MAX_STAGES);
    if (inter && v >= 2 && a->pp_size >= 1 && total >= 1 && (long long)a->pp_size * v > total)
        hs_cfg_report_add(rep,
                          "accelerator.pp_size x pp_virtual_stages = %d x %d = %lld chunks exceed "
                          "model.n_layers = %d: every chunk needs at least one block; lower "
                          "accelerator.pp_virtual_stages to %d",
                          a->pp_size, v, (long long)a->pp_size * v, total,
                          total / a->pp_size > 1 ? total / a->pp_size : 1);
}

void hs_cfg_check_pp(const hs_config *c, hs_cfg_report *rep) {
    const hs_accel_config *a = &c->accelerator;
    check_pp_layers(c, rep);
    check_pp_virtual(c, rep);
    if (a->pp_size <= 1) return;
    if (c->model.tie_embeddings)
        hs_cfg_report_add(rep,
                          "accelerator.pp_size = %d with model.tie_embeddings = true: the token "
                          "embedding lives on the first pipeline stage and lm_head on the last, "
                          "so they cannot share one weight; set model.tie_embeddings: false, or "
                          "accelerator.pp_size: 1",
                          a->pp_size);
}

/* 1F1B runs one forward and one backward per micro-batch in steady state,
 * which needs at least one micro-batch in flight per stage (a null
 * global_batch_size gives exactly that). */
static void check_pp_schedule(const hs_config *c, const hs_topology *t, hs_cfg_report *rep) {
    const hs_accel_config *a = &c->accelerator;
    const hs_pp_schedule_info *info = hs_pp_schedule_find(a->pp_schedule);
    long long g = hs_config_global_batch(c, t), mb = c->train.micro_batch_size, dp = t->dp;
    if (a->pp_size <= 1 || !info || !info->fills_pipe || g < 1 || mb < 1 || dp < 1) return;
    int m = hs_config_micro_batches(c, t);
    if (info->rounds_of_pp && m >= a->pp_size && m % a->pp_size) {
        long long up = ((long long)m + a->pp_size - 1) / a->pp_size * a->pp_size;
        hs_cfg_report_add(rep,
                          "accelerator.pp_schedule = %s needs the micro-batches "
                          "per step to be a multiple of accelerator.pp_size = %d (each round "
                          "runs one per stage through every chunk), got %d = "
                          "train.global_batch_size / (train.micro_batch_size x dp_size) = %lld / "
                          "(%lld x %lld); set train.global_batch_size: %lld",
                          info->name, a->pp_size, m, g, mb, dp, up * mb * dp);
        return;
    }
    if (m >= a->pp_size) return;
    hs_cfg_report_add(rep,
                      "accelerator.pp_schedule = %s needs at least accelerator.pp_size = %d "
                      "micro-batches per step, got %d = train.global_batch_size / "
                      "(train.micro_batch_size x dp_size) = %lld / (%lld x %lld); set "
                      "train.global_batch_size: %lld (or null for that), or "
                      "accelerator.pp_schedule: gpipe",
                      a->pp_schedule, a->pp_size, m, g, mb, dp, (long long)a->pp_size * mb * dp);
}

/* A model size that tensor parallelism splits into tp equal slices. */
typedef struct tp_split {
    const char *path;
    int size;
    const char *why;
    bool resizable; /* free to round up to a multiple of tp (no other rule uses it) */
} tp_split;

/* The sizes TP splits: whole query and key/value heads, the dense MLP, and
 * the vocabulary of the embedding and lm_head. For arch moe the MoE layer
 * (router, routed and shared experts) stays replicated over TP. */
static int tp_splits(const hs_model_config *m, tp_split out[4]) {
    int n = 0;
    out[n++] = (tp_split){"model.n_heads", m->n_heads,
                          "each TP rank computes whole attention heads", false};
    out[n++] = (tp_split){"model.n_kv_heads", m->n_kv_heads,
                          "each TP rank holds whole key/value heads", false};
    if (!hs_model_arch_moe(m))
        out[n++] = (tp_split){"model.ffn_dim", m->ffn_dim,
                              "the MLP's gate/up columns and down rows are split over the TP "
                              "group",
                              true};
    out[n++] = (tp_split){"model.vocab_size", m->vocab_size,
                          "the token embedding and lm_head are split over the vocabulary", true};
    return n;
}

/* Whether tp ranks per group would satisfy every TP rule and rule 4 with the
 * other sizes as they are. */
static bool tp_fits(const hs_config *c, const hs_topology *t, const tp_split *s, int n, int tp) {
    const hs_accel_config *a = &c->accelerator;
    if (t->world % ((long long)tp * a->cp_size * a->pp_size)) return false;
    for (int i = 0; i < n; i++)
        if (s[i].size >= 1 && s[i].size % tp) return false;
    long long seq_split = (long long)a->cp_size * tp;
    return !(a->sequence_parallel && c->train.seq_len >= 1 && c->train.seq_len % seq_split);
}

/* "1, 2, 4": the tp sizes that fit (1 always does). */
static void tp_choices(const hs_config *c, const hs_topology *t, const tp_split *s, int n,
                       char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (int tp = 1; tp <= t->world && used < cap; tp++)
        if (tp_fits(c, t, s, n, tp))
            used += (size_t)snprintf(out + used, cap - used, "%s%d", used ? ", " : "", tp);
}

static void check_tp(const hs_config *c, const hs_topology *t, hs_cfg_report *rep) {
    int tp = c->accelerator.tp_size;
    if (tp <= 1) return;
    tp_split s[4];
    int n = tp_splits(&c->model, s);
    char choices[128] = "";
    for (int i = 0; i < n; i++) {
        if (s[i].size < 1 || s[i].size % tp == 0) continue;
        if (!choices[0]) tp_choices(c, t, s, n, choices, sizeof choices);
        char resize[96] = "";
        if (s[i].resizable)
            snprintf(resize, sizeof resize, " (or keep tp_size %d with %s: %lld)", tp, s[i].path,
                     ((long long)s[i].size / tp + 1) * tp);
        hs_cfg_report_add(rep,
                          "%s = %d is not divisible by accelerator.tp_size = %d: %s; valid "
                          "tp_size: %s%s",
                          s[i].path, s[i].size, tp, s[i].why, choices, resize);
    }
}

/* The all-to-all CP methods trade a rank's rows of every head for all the
 * group's rows of a share of the heads: a TP rank's query heads split
 * evenly over the a2a ranks, its kv heads too, or (fewer kv heads than
 * a2a ranks, a multiple of them) each goes whole to the ranks whose query
 * heads read it (docs/cp.md). */
static bool a2a_fits(int nh, int kvh, int a2a) {
    return nh % a2a == 0 && (kvh % a2a == 0 || a2a % kvh == 0);
}

/* "1, 2, 4": the divisors of n that fit the heads as a2a sizes. */
static void a2a_choices(int n, int nh, int kvh, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (int a = 1; a <= n && used < cap; a++)
        if (n % a == 0 && a2a_fits(nh, kvh, a))
            used += (size_t)snprintf(out + used, cap - used, "%s%d", used ? ", " : "", a);
}

static void check_cp_a2a(const hs_config *c, hs_cfg_report *rep) {
    const hs_model_config *m = &c->model;
    const hs_accel_config *a = &c->accelerator;
    bool all = !strcmp(a->cp_rotate_method, "alltoall");
    bool hybrid = !strcmp(a->cp_rotate_method, "alltoall_ring");
    int cp = a->cp_size, tp = a->tp_size > 0 ? a->tp_size : 1;
    int kv = m->n_kv_heads > 0 ? m->n_kv_heads : m->n_heads;
    if (cp <= 1 || (!all && !hybrid) || m->n_heads < 1 || m->n_heads % tp || kv % tp) return;
    int nh = m->n_heads / tp, kvh = kv / tp, size = all ? cp : a->cp_a2a_size;
    char sizes[128];
    a2a_choices(cp, nh, kvh, sizes, sizeof sizes);
    if (hybrid && (size < 1 || cp % size)) {
        char what[32] = "null";
        if (size >= 1) snprintf(what, sizeof what, "%d", size);
        hs_cfg_report_add(rep,
                          "accelerator.cp_rotate_method = alltoall_ring needs "
                          "accelerator.cp_a2a_size, the CP ranks of one all-to-all group, to "
                          "divide accelerator.cp_size = %d, but it is %s; valid "
                          "accelerator.cp_a2a_size: %s (cp_size: alltoall, 1: ring)",
                          cp, what, sizes);
        return;
    }
    if (a2a_fits(nh, kvh, size)) return;
    char key[96], fix[384];
    if (all) {
        char cps[128];
        a2a_choices(nh, nh, kvh, cps, sizeof cps);
        snprintf(key, sizeof key, "accelerator.cp_size = %d (cp_rotate_method alltoall)", cp);
        snprintf(fix, sizeof fix,
                 "valid cp_size for alltoall: %s; or cp_rotate_method alltoall_ring with "
                 "accelerator.cp_a2a_size: %s",
                 cps, sizes);
    } else {
        snprintf(key, sizeof key, "accelerator.cp_a2a_size = %d (alltoall_ring)", size);
        snprintf(fix, sizeof fix, "valid accelerator.cp_a2a_size: %s", sizes);
    }
    if (nh % size)
        hs_cfg_report_add(rep,
                          "model.n_heads / accelerator.tp_size = %d / %d = %d query heads per TP "
                          "rank are not divisible by %s: the all-to-all gives each of its ranks "
                          "an equal share of the heads; %s",
                          m->n_heads, tp, nh, key, fix);
    else
        hs_cfg_report_add(rep,
                          "model.n_kv_heads / accelerator.tp_size = %d / %d = %d kv heads per TP "
                          "rank and %s do not divide one another: the all-to-all gives each "
                          "rank an equal share of the kv heads, or with fewer kv heads than "
                          "ranks the one kv head its query heads read; %s",
                          kv, tp, kvh, key, fix);
}

static bool pow2(long long v) { return v >= 1 && (v & (v - 1)) == 0; }

/* train.reproducibility: layout covers the data-parallel layouts of dense
 * models on the host's devices (docs/numerics.md "Layout-invariant
 * training"); the rest is refused by name. */
static void check_layout_invariant(const hs_config *c, const hs_topology *t, hs_cfg_report *rep) {
    if (!hs_train_layout_invariant(&c->train)) return;
    const hs_accel_config *a = &c->accelerator;
    const hs_mix_precision *mp = &c->fsdp.mix_precision;
    static const char *scope = "train.reproducibility = layout covers FSDP, HSDP, pipelines and "
                               "micro-batches on cpu or reference today";
    if (a->tp_size > 1 || a->cp_size > 1 || a->ep_size > 1)
        hs_cfg_report_add(rep,
                          "accelerator.tp_size = %d, cp_size = %d, ep_size = %d: %s; set them to "
                          "1, or train.reproducibility: run",
                          a->tp_size, a->cp_size, a->ep_size, scope);
    if (hs_model_arch_moe(&c->model) && c->model.moe.aux_loss_coef > 0)
        hs_cfg_report_add(rep,
                          "model.moe.aux_loss_coef = %g with train.reproducibility = layout: the "
                          "load-balancing loss is taken over each micro-batch, so its gradient "
                          "depends on how the global batch is split; set aux_loss_coef: 0 and "
                          "balance with model.moe.bias_update_speed or seq_aux_loss_coef, which "
                          "do not, or train.reproducibility: run",
                          c->model.moe.aux_loss_coef);
    if (strcmp(a->device, "cpu") && strcmp(a->device, "reference"))
        hs_cfg_report_add(rep,
                          "accelerator.device = %s: %s; use cpu, or train.reproducibility: run",
                          a->device, scope);
    if (c->fsdp.param_gather[0] || c->fsdp.grad_reduce[0])
        hs_cfg_report_add(rep,
                          "fsdp_config.param_gather = %s, grad_reduce = %s: compressed "
                          "communication rounds by blocks the layout decides; set both to null "
                          "with train.reproducibility: layout",
                          c->fsdp.param_gather[0] ? c->fsdp.param_gather : "null",
                          c->fsdp.grad_reduce[0] ? c->fsdp.grad_reduce : "null");
    int reduce = mp->reduce_dtype != HS_MP_NULL ? mp->reduce_dtype : mp->param_dtype;
    if (reduce != HS_MP_NULL && reduce != HS_DTYPE_F32)
        hs_cfg_report_add(rep,
                          "fsdp_config.mix_precision reduces gradients in %s (reduce_dtype, else "
                          "param_dtype): a 16-bit reduction rounds where the layout splits it; "
                          "set fsdp_config.mix_precision.reduce_dtype: float32",
                          hs_dtype_name((hs_dtype)reduce));
    if (!c->fsdp.requires_grad_sync)
        hs_cfg_report_add(rep, "fsdp_config.requires_grad_sync = false: the micro-batches' "
                               "gradients would be summed before the ranks'; set it to true with "
                               "train.reproducibility: layout");
    long long mb = c->train.micro_batch_size, dp = t->dp, steps = hs_config_micro_batches(c, t);
    if (!pow2(mb) || !pow2(dp) || !pow2(steps))
        hs_cfg_report_add(rep,
                          "train.micro_batch_size = %lld, dp_size = %lld and micro-batches per "
                          "step = %lld: train.reproducibility = layout adds sequences, ranks and "
                          "micro-batches as binary trees, so each must be a power of two",
                          mb, dp, steps);
}

void hs_cfg_check_parallel(const hs_config *c, const hs_topology *t, hs_cfg_report *rep) {
    const hs_model_config *m = &c->model;
    const hs_accel_config *a = &c->accelerator;
    check_batch(c, t, rep);
    check_layout_invariant(c, t, rep);
    check_tp(c, t, rep);
    /* CP: two chunks per rank (causal load balance); SP then splits a CP
     * rank's rows over TP. */
    long long cp_split = a->cp_size > 1 ? 2LL * a->cp_size : 1;
    long long seq_split = cp_split * (a->sequence_parallel ? a->tp_size : 1);
    if (c->train.seq_len >= 1 && c->train.seq_len % seq_split)
        hs_cfg_report_add(rep,
                          "train.seq_len = %d is not divisible by %s = %lld; choose a multiple "
                          "of %lld, e.g. train.seq_len: %lld",
                          c->train.seq_len,
                          a->sequence_parallel && a->cp_size > 1
                              ? "2 x accelerator.cp_size x accelerator.tp_size (context "
                                "parallelism holds two chunks per rank, sequence_parallel splits "
                                "them over TP)"
                          : a->sequence_parallel ? "accelerator.tp_size (sequence_parallel)"
                                                 : "2 x accelerator.cp_size (context parallelism "
                                                   "holds two chunks of each sequence per rank)",
                          seq_split, seq_split, (c->train.seq_len / seq_split + 1) * seq_split);
    const char *how = a->cp_rotate_method;
    if (how[0] && strcmp(how, "allgather") && strcmp(how, "ring") && strcmp(how, "alltoall") &&
        strcmp(how, "alltoall_ring"))
        hs_cfg_report_add(rep,
                          "accelerator.cp_rotate_method = %s is not a method; use allgather "
                          "(the default), ring, alltoall or alltoall_ring",
                          how);
    check_cp_a2a(c, rep);
    if (a->pp_size > m->n_layers && m->n_layers >= 1)
        hs_cfg_report_add(rep,
                          "accelerator.pp_size = %d exceeds model.n_layers = %d; every pipeline "
                          "stage needs at least one block",
                          a->pp_size, m->n_layers);
    check_pp_schedule(c, t, rep);
    if (!hs_model_arch_moe(m) && a->ep_size > 1)
        hs_cfg_report_add(rep,
                          "accelerator.ep_size = %d needs routed experts, but model.arch = %s "
                          "has none; set accelerator.ep_size: 1, or model.arch: moe",
                          a->ep_size, m->arch);
    if (hs_model_arch_moe(m) && a->ep_size > 1 && a->tp_size > 1 && !a->sequence_parallel)
        hs_cfg_report_add(rep,
                          "accelerator.ep_size = %d with accelerator.tp_size = %d and "
                          "accelerator.sequence_parallel = false: every TP rank holds the same "
                          "tokens, which would reach their experts tp_size times; set "
                          "accelerator.sequence_parallel: true (each TP rank routes its own "
                          "rows)",
                          a->ep_size, a->tp_size);
    if (hs_model_arch_moe(m) && a->ep_size > 1 && m->moe.num_experts % a->ep_size)
        hs_cfg_report_add(rep,
                          "model.moe.num_experts = %d is not divisible by accelerator.ep_size = "
                          "%d; each expert-parallel rank holds the same number of experts",
                          m->moe.num_experts, a->ep_size);
}
