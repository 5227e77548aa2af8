/* Communication fusion (spec 004 §2.4, §5.11; RFC 000 §8.3.2): with
 * comm_fusion each unit does one all-gather per unshard and one
 * reduce-scatter per backward (one all-reduce per group for HSDP and
 * replicate_params, as without fusion), moving exactly the bytes of the
 * unfused run; copy-in (zero_copy false) and zero-copy (null and true) train
 * bitwise identically to the unfused run (losses, step-1 gradients, weights
 * after every step), also with prefetch; zero-copy parameters are views at
 * the padded offsets of one flat buffer that is the optimizer's storage, and
 * no extra parameter memory stays allocated between steps.
 * HS_MPI_RANKS: 2 3 4
 * HS_TEST_TIMEOUT: 240 */
#include "fsdp_overlap_harness.h"

/* Units that all-gather, and their all-gathers in one forward+backward:
 * the root once (it stays unsharded), every block twice. */
static void fused_counts(hs_fsdp *f, int64_t *units_ag, int64_t *ag) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(f);
    *units_ag = *ag = 0;
    for (int u = 0; u < ctx->n_units; u++) {
        if (!ctx->units[u].fusion) continue;
        (*units_ag)++;
        *ag += u == 0 ? 1 : 2;
    }
}

/* Zero-copy: each fused parameter's shard is the slice of the unit's flat
 * buffer at its padded offset, and the optimizer updates exactly that. */
static void check_layout(ov_run *r, bool zero_copy) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(r->f);
    hs_optim_param *op;
    hs_fsdp_optim_params(r->f, &op);
    for (int u = 0; u < ctx->n_units; u++) {
        hs_fsdp_fusion *fu = ctx->units[u].fusion;
        if (!fu) continue;
        CHECK(r->c, fu->zero_copy == zero_copy, "unit %d: zero_copy %d, want %d", u, fu->zero_copy,
              zero_copy);
        CHECK(r->c, (fu->flat_src != NULL) == zero_copy, "unit %d: flat buffer %p", u,
              fu->flat_src);
        int64_t off = 0;
        for (int j = 0; j < fu->n_params; j++) {
            hs_fsdp_param *fp = fu->params[j];
            CHECK(r->c, fu->offset[j] == off, "%s: offset %lld, want padded %lld", fp->p->fqn,
                  (long long)fu->offset[j], (long long)off);
            off += fp->plan.padded_sharded_numel;
            float *slot = zero_copy ? (float *)fu->flat_src + fu->offset[j] : NULL;
            if (zero_copy)
                CHECK(r->c,
                      fp->storage == slot && fp->sharded == slot &&
                          (float *)op[fp->index].data == slot,
                      "%s: not a view of its unit's flat buffer", fp->p->fqn);
            else
                CHECK(r->c, fp->storage != NULL && (float *)op[fp->index].data == fp->sharded,
                      "%s: copy-in storage missing", fp->p->fqn);
        }
        CHECK(r->c, off == fu->numel, "unit %d: flat numel %lld, want %lld", u,
              (long long)fu->numel, (long long)off);
    }
}

static int64_t at_rest_param_bytes(ov_run *r) {
    hs_fsdp_stats st;
    hs_fsdp_get_stats(r->f, &st);
    return st.param_bytes;
}

static void run_layout(hs_comm *c, const char *name, const ov_opts *base_o) {
    ov_run r;
    ov_result base;
    ov_setup(&r, c, base_o);
    ov_train(&r, &base, NULL);
    int64_t base_rest = at_rest_param_bytes(&r);
    ov_teardown(&r);

    struct {
        const char *label;
        int zero_copy, fwd, bwd;
    } modes[] = {{"copy-in", 0, 0, 0},
                 {"zero-copy (null)", -1, 0, 0},
                 {"zero-copy (true)", 1, 0, 0},
                 {"zero-copy + prefetch 1", -1, 1, 1},
                 {"copy-in + prefetch 2", 0, 2, 2}};
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        ov_opts o = *base_o;
        o.fusion = true;
        o.zero_copy = modes[k].zero_copy;
        o.fwd = modes[k].fwd;
        o.bwd = modes[k].bwd;
        ov_result got;
        ov_setup(&r, c, &o);
        check_layout(&r, o.zero_copy != 0);
        ov_train(&r, &got, NULL);
        char what[128];
        snprintf(what, sizeof what, "%s, comm_fusion %s vs unfused", name, modes[k].label);
        ov_expect_identical(c, what, &base, &got);
        int64_t units_ag, ag;
        fused_counts(r.f, &units_ag, &ag);
        CHECK(c, got.ag == ag, "%s: %lld all-gathers per step, want %lld (one per unshard)", what,
              (long long)got.ag, (long long)ag);
        CHECK(c, got.rs == units_ag, "%s: %lld reduce-scatters per step, want one per unit (%lld)",
              what, (long long)got.rs, (long long)units_ag);
        CHECK(c, got.ar == base.ar, "%s: %lld all-reduces, unfused %lld", what, (long long)got.ar,
              (long long)base.ar);
        CHECK(c, got.ag < base.ag && got.rs < base.rs,
              "%s: fusion did not reduce the collectives (%lld/%lld vs %lld/%lld)", what,
              (long long)got.ag, (long long)got.rs, (long long)base.ag, (long long)base.rs);
        CHECK(c, got.ag_bytes == base.ag_bytes && got.rs_bytes == base.rs_bytes,
              "%s: moved %lld + %lld bytes, unfused %lld + %lld", what, (long long)got.ag_bytes,
              (long long)got.rs_bytes, (long long)base.ag_bytes, (long long)base.rs_bytes);
        CHECK(c, at_rest_param_bytes(&r) == base_rest,
              "%s: %lld parameter bytes between steps, unfused %lld", what,
              (long long)at_rest_param_bytes(&r), (long long)base_rest);
        check_layout(&r, o.zero_copy != 0); /* the views survive the steps */
        if (hs_comm_rank(c) == 0)
            printf("ok %s: bitwise identical; %lld all-gathers and %lld reduce-scatters per step "
                   "(unfused %lld and %lld), same bytes\n",
                   what, (long long)got.ag, (long long)got.rs, (long long)base.ag,
                   (long long)base.rs);
        ov_result_free(&got);
        ov_teardown(&r);
    }
    ov_result_free(&base);
}

int main(int argc, char **argv) {
    hs_comm_options opt = {.timeout_s = 120};
    hs_comm *c = mt_comm_init(&argc, &argv, &opt);
    int W = hs_comm_size(c);
    ov_opts fsdp = {.layers = 2, .zero_copy = -1};
    run_layout(c, "fsdp", &fsdp);
    if (W == 2 || W == 4) {
        ov_opts mixed = {.layers = 2,
                         .zero_copy = -1,
                         .rep = {"model.layers.0.input_layernorm.weight", "model.norm.weight",
                                 "model.layers.1.self_attn.q_proj.weight"},
                         .n_rep = 3};
        run_layout(c, "replicate_params mixed", &mixed);
    }
    if (W == 2 || W == 3) {
        ov_opts ckpt = {.layers = 2, .zero_copy = -1, .ckpt = true};
        run_layout(c, "activation checkpointing", &ckpt);
    }
    if (W == 4) {
        ov_opts hsdp = {.shard = 2, .layers = 2, .zero_copy = -1};
        run_layout(c, "hsdp 2x2", &hsdp);
        ov_opts hsdp_rep = {.shard = 2,
                            .layers = 2,
                            .zero_copy = -1,
                            .rep = {"model.layers.1.mlp.down_proj.weight"},
                            .n_rep = 1};
        run_layout(c, "hsdp 2x2 replicate_params", &hsdp_rep);
    }
    hs_comm_finalize(c);
    return 0;
}
