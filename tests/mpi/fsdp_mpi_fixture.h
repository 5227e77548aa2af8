/* Set-up the FSDP MPI tests share: the data-parallel groups of a world
 * laid out as dp_shard_size x replicate, each split under a name the test
 * can look up in the trace counters; the fixed global batch every rank
 * derives on its own so no rank needs another's data; a model wrapped with
 * FSDP and its optimizer, stepped as the trainer steps it; and the checks
 * every comparison ends with (HSDP replicas bitwise equal, the worst error
 * over the ranks). Header-only so the test glob (tests/mpi/test_*.c) never
 * mistakes it for a test program. */
#ifndef TESTS_MPI_FSDP_MPI_FIXTURE_H
#define TESTS_MPI_FSDP_MPI_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/manager.h"
#include "hypershard/comm.h"
#include "hypershard/mesh.h"
#include "hypershard/optim.h"
#include "mpi_test_util.h"

#define MT_GROUP_NAME_CAP 64

/* Every rank takes part in the split, also for groups of one, because the
 * split is collective over the world; only groups of more than one rank
 * are handed to FSDP (a NULL group means "no collective"). */
static inline hs_pg *mt_group_split(hs_comm *c, const hs_topology *t, hs_mesh_dim d,
                                    const char *test, const char *layout, char *name, int *size,
                                    int *grank) {
    int rank = hs_comm_rank(c);
    int members[64];
    int n = hs_topology_group_ranks(t, d, rank, members);
    const char *dim = hs_mesh_dim_name(d);
    int len = snprintf(name, MT_GROUP_NAME_CAP, "%s_%s_%s", test, layout, dim);
    CHECK(c, len < MT_GROUP_NAME_CAP,
          "group name %s_%s_%s: %d characters, at most %d: shorten the layout name", test, layout,
          dim, len, MT_GROUP_NAME_CAP - 1);
    hs_pg *pg = NULL;
    hs_error e;
    hs_error_clear(&e);
    CHECK(c,
          hs_comm_split(c, name, members[0], hs_topology_group_rank(t, d, rank), &pg, &e) == HS_OK,
          "%s", e.msg);
    *size = n;
    *grank = hs_pg_rank(pg);
    return n > 1 ? pg : NULL;
}

/* The shard, replicate and flat groups of dp_shard_size `shard` over the
 * whole world, named "<test>_<layout>_<dim>" into the three 64-byte
 * buffers. */
static inline void mt_dp_groups_make(hs_comm *c, int shard, const char *test, const char *layout,
                                     hs_fsdp_dp_groups *g, char *shard_name, char *rep_name,
                                     char *flat_name) {
    hs_topology t;
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_topology_derive(&t, hs_comm_size(c), 1, 1, 1, 1, shard, 1, &e) == HS_OK, "%s",
          e.msg);
    g->shard = mt_group_split(c, &t, HS_DIM_FSDP_SHARD, test, layout, shard_name, &g->shard_size,
                              &g->shard_rank);
    g->replicate = mt_group_split(c, &t, HS_DIM_FSDP_REPLICATE, test, layout, rep_name,
                                  &g->replicate_size, &g->replicate_rank);
    g->flat =
        mt_group_split(c, &t, HS_DIM_FSDP, test, layout, flat_name, &g->flat_size, &g->flat_rank);
}

/* The n tokens and targets of the global batch of `step`: a hash of the
 * position and the step, so every step sees new data and every run the
 * same data, over a vocabulary of 37. */
static inline void mt_global_batch(int32_t *tok, int32_t *tgt, int n, int step) {
    for (int i = 0; i < n; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(step * 40503u + 17u);
        tok[i] = (int32_t)(h % 37u);
        tgt[i] = (int32_t)((h >> 8) % 37u);
    }
}

/* A CPU device whose copies and spans go to `trace`. */
static inline hs_device *mt_device_cpu(hs_comm *c, hs_trace *trace) {
    hs_device *dev = NULL;
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_device_create(HS_DEVICE_CPU, trace, &dev, &e) == HS_OK, "%s", e.msg);
    return dev;
}

/* The model of cfg built with mo, wrapped with FSDP over g from `seed`
 * (every rank and every run start from the same weights), and the
 * optimizer over its sharded params. */
static inline void mt_fsdp_build(hs_comm *c, const hs_config *cfg, const hs_model_options *mo,
                                 const hs_fsdp_dp_groups *g, hs_device *dev, uint64_t seed,
                                 hs_model **m, hs_fsdp **f, hs_optim **opt) {
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_model_create(&cfg->model, mo, m, &e) == HS_OK, "%s", e.msg);
    CHECK(c,
          hs_fsdp_wrap_groups(&cfg->fsdp, cfg->optimizer.fp32_main_params, g, c, dev, *m, seed,
                              NULL, f, &e) == HS_OK,
          "%s", e.msg);
    hs_optim_param *op;
    int n = hs_fsdp_optim_params(*f, &op);
    CHECK(c, hs_optim_create(&cfg->optimizer, op, n, dev, &dev->device_pool, opt, &e) == HS_OK,
          "%s", e.msg);
}

/* One side of a comparison: a model wrapped with FSDP over some groups and
 * the optimizer over its sharded params. */
typedef struct mt_side {
    hs_config cfg;
    hs_model *m;
    hs_fsdp *f;
    hs_optim *opt;
} mt_side;

static inline void mt_side_free(mt_side *s) {
    hs_optim_free(s->opt);
    hs_fsdp_free(s->f);
    hs_model_free(s->m);
    hs_config_free(&s->cfg);
}

/* The summed loss over the flat data-parallel group (NULL: this rank's
 * own), in fp32 as the trainer reduces it. */
static inline double mt_flat_sum(hs_comm *c, hs_pg *flat, double local) {
    float l = (float)local;
    hs_error e;
    hs_error_clear(&e);
    if (flat)
        CHECK(c, hs_pg_all_reduce(flat, NULL, &l, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e) == HS_OK,
              "%s", e.msg);
    return l;
}

/* The optimizer step as the trainer takes it: update the shards, let FSDP
 * refresh what it derives from them, clear the gradients. */
static inline void mt_side_optim_step(hs_comm *c, mt_side *s, double lr) {
    hs_error e;
    hs_error_clear(&e);
    hs_optim_step(s->opt, lr, NULL);
    CHECK(c, hs_fsdp_after_optim_step(s->f, &e) == HS_OK, "%s", e.msg);
    hs_fsdp_zero_grads(s->f);
}

/* HSDP replicas hold bitwise equal masters: every (sharded, or with
 * skip_replicated every not replicate_params) master of `f` against
 * replica 0's over the replicate group, when there is one. */
static inline void mt_replicas_check_equal(hs_comm *c, hs_fsdp *f, const hs_fsdp_dp_groups *g,
                                           bool skip_replicated, const char *what, int step) {
    if (!g->replicate) return;
    hs_fsdp_ctx *ctx = hs_fsdp_context(f);
    int R = g->replicate_size;
    for (int i = 0; i < ctx->n_params; i++) {
        hs_fsdp_param *fp = &ctx->params[i];
        if (skip_replicated && fp->replicate) continue;
        int64_t n = fp->storage_numel;
        float *all = malloc(sizeof(float) * (size_t)(n * R + 1));
        hs_error e;
        hs_error_clear(&e);
        CHECK(c,
              hs_pg_all_gather(g->replicate, NULL, all, fp->storage, n, HS_DTYPE_F32, &e) == HS_OK,
              "%s", e.msg);
        for (int k = 1; k < R; k++)
            CHECK(c, memcmp(all, all + k * n, sizeof(float) * (size_t)n) == 0,
                  "%s step %d: replica %d of %s differs from replica 0", what, step, k, fp->p->fqn);
        free(all);
    }
}

/* The largest of every rank's `worst` over `pg` of `size` ranks (NULL:
 * this rank's own), for the one line rank 0 prints per case. */
static inline float mt_worst_over(hs_comm *c, hs_pg *pg, int size, double worst) {
    float w = (float)worst, all[64];
    hs_error e;
    hs_error_clear(&e);
    if (pg)
        CHECK(c, hs_pg_all_gather(pg, NULL, all, &w, 1, HS_DTYPE_F32, &e) == HS_OK, "%s", e.msg);
    for (int k = 0; pg && k < size; k++) w = all[k] > w ? all[k] : w;
    return w;
}

#endif
