/* bench/bench_layouts.h — one model in several parallel layouts on the
 * same ranks, stepped in turn (bench tp, bench cp, bench moe): each layout
 * has its own named mesh, engine and optimizer; a step is the trainer's
 * step of one micro-batch; per timed step it records the slowest rank's
 * step time, its time inside the model-parallel (TP, CP or EP) collectives,
 * its device peak, and the collectives and bytes of the layout's groups. */
#ifndef HS_BENCH_LAYOUTS_H
#define HS_BENCH_LAYOUTS_H

#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/mesh.h"
#include "hypershard/optim.h"
#include "hypershard/train.h"

#define HS_BENCH_MAX_STEPS 64

typedef struct hs_bench_model {
    int layers, dim, seq, vocab;
    int experts, top_k; /* experts > 0: a Mixtral-style MoE (expert ffn = dim * 2) */
} hs_bench_model;

typedef struct hs_bench_layout {
    /* set by the caller */
    const char *name, *prefix; /* table row; mesh group prefix */
    const char *mp_dim;        /* "tp", "cp" or "ep": whose collectives are counted */
    int tp, cp, shard, mbs;    /* degrees, dp_shard_size, sequences per DP rank */
    int ep, edp_shard;         /* expert parallel degree and edp_shard_size (0: 1) */
    bool sp;                   /* sequence + loss parallel */
    const char *cp_method;     /* accelerator.cp_rotate_method (NULL: allgather) */
    int cp_a2a;                /* accelerator.cp_a2a_size (alltoall_ring; 0: null) */
    /* built */
    hs_config cfg;
    hs_topology topo;
    hs_mesh *mesh;
    hs_device *dev;
    hs_engine *en;
    hs_optim *optim;
    hs_optim_param *params;
    int n_params, global_batch;
    int32_t *tokens, *targets;
    /* measured, per timed step */
    double step[HS_BENCH_MAX_STEPS], mp_s[HS_BENCH_MAX_STEPS];
    int64_t peak_bytes; /* the largest device peak of any rank and step */
    int64_t mp_colls, mp_bytes, dp_colls, dp_bytes; /* over the timed steps */
} hs_bench_layout;

hs_status hs_bench_layout_open(hs_comm *c, const hs_bench_model *bm, hs_bench_layout *l,
                               hs_error *e);
void hs_bench_layout_close(hs_bench_layout *l);
/* Step i of the timed steps (i < 0: a warm-up, not recorded). */
hs_status hs_bench_layout_step(hs_comm *c, const hs_bench_model *bm, hs_bench_layout *l, int i,
                               hs_error *e);

/* What a layout benchmark is: its name and usage text, its default and
 * --quick options (--steps, --layers, --dim, --seq override them), the
 * layouts for a world size, and its table. hs_bench_layouts_run parses,
 * starts MPI (an even world), opens every layout, takes one warm-up and
 * `steps` timed steps of each in turn, prints the table on rank 0 and
 * returns the exit code. */
typedef struct hs_bench_opts {
    int steps;
    hs_bench_model m;
} hs_bench_opts;

typedef struct hs_bench_spec {
    const char *name, *usage;
    hs_bench_opts defaults, quick;
    int seq_multiple;                                /* --seq must be a multiple of it */
    int (*layouts)(int world, hs_bench_layout *out); /* at most HS_BENCH_MAX_LAYOUTS */
    void (*print)(const hs_bench_opts *o, hs_bench_layout *ls, int n, int world);
} hs_bench_spec;

#define HS_BENCH_MAX_LAYOUTS 8

int hs_bench_layouts_run(const hs_bench_spec *spec, int argc, char **argv);

#endif
