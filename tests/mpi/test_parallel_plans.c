/* The style table decides what the model computes: on 2 TP ranks, the
 * default plan and plans that keep the MLP (or the embedding and head)
 * whole give the single-process loss and gradients of the same batch, with
 * and without sequence parallelism. Each TP rank's local gradient is
 * compared with its slice of the one-process gradient: a split parameter's
 * slice directly, a replicated one after the partial sums of sequence
 * parallelism are added over TP.
 * HS_MPI_RANKS: 2
 * HS_TEST_TIMEOUT: 120 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/mesh.h"
#include "hypershard/parallel.h"
#include "mpi_test_util.h"

#define B 2
#define T 8
#define TOL 1e-5

static hs_config config_of(hs_comm *comm, bool sp) {
    hs_config cfg;
    hs_error e;
    CHECK(comm, hs_config_defaults(&cfg, &e) == HS_OK, "%s", e.msg);
    hs_model_config *c = &cfg.model;
    snprintf(c->arch, sizeof c->arch, "llama");
    c->vocab_size = 16;
    c->dim = 16;
    c->n_layers = 2;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->ffn_dim = 24;
    c->tie_embeddings = false;
    cfg.accelerator.sequence_parallel = sp;
    return cfg;
}

static hs_model *model_of(hs_comm *comm, const hs_config *cfg, const hs_model_par *par) {
    hs_model_options o;
    memset(&o, 0, sizeof o);
    o.compute_dtype = o.grad_dtype = HS_DTYPE_F32;
    o.max_batch = B;
    o.seq_len = T;
    o.allocate_params = true;
    o.par = par;
    hs_model *m = NULL;
    hs_error e;
    CHECK(comm, hs_model_create(&cfg->model, &o, &m, &e) == HS_OK, "%s", e.msg);
    hs_model_init_weights(m, 11);
    return m;
}

static void batch_of(int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7 + 3) % 16;
        tgt[i] = (i * 5 + 1) % 16;
    }
}

static float *host_copy(hs_model *m, const void *dev, int64_t n) {
    float *h = malloc((size_t)n * sizeof(float));
    hs_device_copy(hs_model_device(m), h, dev, (size_t)n * sizeof(float), HS_COPY_D2H);
    return h;
}

/* This rank's slice of the whole gradient g of p (its placement's
 * local_offset / local_shape; 2-D or 1-D). */
static float slice_at(const hs_param *p, const float *g, int64_t i) {
    int64_t cols = p->ndim > 1 ? p->local_shape[1] : 1, r = i / cols, c = i % cols;
    int64_t wcols = p->ndim > 1 ? p->shape[1] : 1;
    int64_t r0 = p->local_offset[0], c0 = p->ndim > 1 ? p->local_offset[1] : 0;
    return g[(r0 + r) * wcols + c0 + c];
}

static void run_case(hs_comm *comm, hs_mesh *mesh, const char *name, bool sp,
                     const hs_style_rule *rules, int n) {
    hs_config cfg = config_of(comm, sp);
    int32_t tok[B * T], tgt[B * T];
    batch_of(tok, tgt);
    hs_batch b = {tok, tgt, B, T, NULL, 0};
    hs_error e;
    /* one process */
    hs_model *one = model_of(comm, &cfg, NULL);
    double l1 = 0, a1 = 0;
    CHECK(comm, hs_model_forward_backward(one, &b, 1.0f / (B * T), NULL, &l1, &a1, &e) == HS_OK,
          "%s", e.msg);
    /* two TP ranks */
    hs_device *dev = hs_model_device(one);
    hs_parallel *par = NULL;
    CHECK(comm,
          hs_parallel_create(&cfg.model, &cfg.accelerator, mesh, comm, dev, rules, n, &par, &e) ==
              HS_OK,
          "%s", e.msg);
    hs_model *m = model_of(comm, &cfg, hs_parallel_seam(par));
    double l2 = 0, a2 = 0;
    CHECK(comm, hs_model_forward_backward(m, &b, 1.0f / (B * T), NULL, &l2, &a2, &e) == HS_OK, "%s",
          e.msg);
    CHECK(comm, fabs(l1 - l2) <= TOL * fabs(l1), "%s: loss %.9g vs one process %.9g", name, l2, l1);
    double worst = 0;
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        const hs_param *q = hs_model_param(one, i);
        int64_t nl = hs_param_local_numel(p), nw = hs_param_numel(q);
        float *g = host_copy(m, p->grad, nl), *w = host_copy(one, q->grad, nw);
        if (p->tp_grad_partial)
            CHECK(comm,
                  hs_pg_all_reduce(hs_mesh_group(mesh, HS_DIM_TP), NULL, g, nl, HS_DTYPE_F32,
                                   HS_REDUCE_SUM, &e) == HS_OK,
                  "%s", e.msg);
        for (int64_t k = 0; k < nl; k++) {
            double want = slice_at(p, w, k), err = fabs(g[k] - want) / (1e-3 + fabs(want));
            if (err > worst) worst = err;
            CHECK(comm, err <= TOL, "%s: %s[%lld] = %.9g, one process %.9g", name, p->fqn,
                  (long long)k, (double)g[k], want);
        }
        free(g);
        free(w);
    }
    if (hs_comm_rank(comm) == 0)
        printf("%s: loss %.9g (one process %.9g), worst gradient error %.2e\n", name, l2, l1,
               worst);
    hs_model_free(m);
    hs_parallel_free(par);
    hs_model_free(one);
}

/* The default plan with `suffixes` given `style`. */
static hs_style_rule *plan_with(const char *const *suffixes, int k, hs_style style, int *n) {
    const hs_style_rule *def = hs_style_default_plan(n);
    hs_style_rule *r = malloc(sizeof *r * (size_t)*n);
    memcpy(r, def, sizeof *r * (size_t)*n);
    for (int i = 0; i < *n; i++)
        for (int j = 0; j < k; j++)
            if (!strcmp(r[i].suffix, suffixes[j])) r[i].style = style;
    return r;
}

int main(int argc, char **argv) {
    hs_trace *trace = NULL;
    hs_comm *comm = mt_traced_init(&argc, &argv, 60.0, false, &trace);
    hs_topology t;
    hs_error e;
    CHECK(comm, hs_topology_derive(&t, 2, 2, 1, 1, 1, 1, 1, &e) == HS_OK, "%s", e.msg);
    hs_mesh *mesh = NULL;
    CHECK(comm, hs_mesh_create(comm, &t, &mesh, &e) == HS_OK, "%s", e.msg);
    const char *mlp[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
    const char *ends[] = {"model.embed_tokens.weight", "lm_head.weight"};
    int n;
    hs_style_rule *whole_mlp = plan_with(mlp, 3, HS_STYLE_REPLICATE, &n);
    hs_style_rule *whole_ends = plan_with(ends, 2, HS_STYLE_REPLICATE, &n);
    run_case(comm, mesh, "default plan", false, NULL, 0);
    run_case(comm, mesh, "default plan, sequence parallel", true, NULL, 0);
    run_case(comm, mesh, "whole MLP", false, whole_mlp, n);
    run_case(comm, mesh, "whole MLP, sequence parallel", true, whole_mlp, n);
    run_case(comm, mesh, "whole embedding and head", false, whole_ends, n);
    free(whole_mlp);
    free(whole_ends);
    hs_mesh_free(mesh);
    mt_traced_finalize(comm, trace);
    return 0;
}
