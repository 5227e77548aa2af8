/* `hypershard bench fsdp` — what prefetch and communication fusion buy in
 * one FSDP training step, under mpiexec, all in one run.
 *
 * For W = 2 and W = 4 (those that fit the launched world; ranks past W wait
 * asleep), a Llama of 8 blocks is wrapped with FSDP over W ranks and trained
 * with every combination of prefetch depth 0/1/2 (forward and backward) and
 * fusion off / on with copy-in / on with zero-copy. Per combination:
 *
 *   step ms      median over the timed steps of the slowest rank's step
 *                (forward + backward + AdamW + after_step)
 *   exposed ms   the time the compute thread sat blocked in hs_work_wait on
 *                FSDP's all-gathers, reduce-scatters and all-reduces
 *                (hs_fsdp_get_exposed), summed over the step; the slowest rank,
 *                median over steps. Communication the comm thread finished
 *                while compute ran is not exposed.
 *   colls        all-gathers + reduce-scatters + all-reduces executed per
 *                step, from the trace counters, and the per-unit minimum
 *                (one all-gather per unshard, one reduce-scatter per unit)
 *   MB           all-gather + reduce-scatter payload bytes per step (the
 *                unsharded size, as the trace counts them) and the
 *                theoretical minimum: every unshard gathers each parameter's
 *                logical bytes once and every unit reduces them once
 *
 * Everything is fp32. The nine combinations of one W live side by side and
 * take their timed steps in turn, so outside load on a shared machine slows
 * them alike; the load average is printed before and after. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "bench_util.h"
#include "cli/commands.h"
#include "hypershard/comm.h"
#include "hypershard/fsdp.h"
#include "hypershard/optim.h"

#define MAX_STEPS 64

typedef struct fsdp_bench {
    hs_comm *comm;
    int world, rank;
    bool quick;
    int steps, layers, dim, seq, batch;
    double fastest_step_ms; /* the fastest combination's median step, any W */
} fsdp_bench;

typedef struct combo {
    int depth;
    bool fusion;
    int zero_copy; /* -1 null (zero-copy), 0 copy-in */
} combo;

typedef struct measure {
    double step_ms, exposed_ms, ag_ms, rs_ms, ar_ms;
    int64_t colls, min_colls, bytes, min_bytes;
} measure;

static int usage(FILE *f, const char *why) {
    if (why) fprintf(f, "hypershard bench fsdp: %s\n", why);
    fprintf(f, "usage: mpiexec -n 4 hypershard bench fsdp [--quick] [--steps N] [--layers L] "
               "[--dim D]\n"
               "  W = 2 and 4 (as far as the launched world allows); ranks beyond W sleep\n"
               "  --quick     a smaller model and 2 timed steps: a smoke run in seconds\n"
               "  --steps N   timed steps per combination after one warm-up (default 7)\n"
               "  --layers L  transformer blocks (default 8; at least 8 for the record)\n"
               "  --dim D     model width (default 256)\n");
    return 2;
}

static int parse(int argc, char **argv, fsdp_bench *b) {
    b->steps = 7;
    b->layers = 8;
    b->dim = 256;
    b->seq = 64;
    b->batch = 2;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(stdout, NULL), -1;
        if (!strcmp(s, "--quick")) {
            b->quick = true;
            b->steps = 2;
            b->dim = 64;
            b->seq = 32;
        } else if (!strcmp(s, "--steps") && i + 1 < argc) {
            b->steps = atoi(argv[++i]);
        } else if (!strcmp(s, "--layers") && i + 1 < argc) {
            b->layers = atoi(argv[++i]);
        } else if (!strcmp(s, "--dim") && i + 1 < argc) {
            b->dim = atoi(argv[++i]);
        } else {
            return usage(stderr, "unknown or incomplete option");
        }
    }
    if (b->steps < 1 || b->steps > MAX_STEPS) return usage(stderr, "--steps must be 1..64");
    if (b->layers < 1 || b->dim < 16 || b->dim % 8) return usage(stderr, "bad --layers or --dim");
    return 0;
}

static hs_status config_for(const fsdp_bench *b, const combo *k, hs_config *cfg, hs_error *e) {
    hs_status st = hs_config_defaults(cfg, e);
    if (st != HS_OK) return st;
    strcpy(cfg->model.arch, "llama");
    cfg->model.vocab_size = 512;
    cfg->model.dim = b->dim;
    cfg->model.n_layers = b->layers;
    cfg->model.n_heads = 8;
    cfg->model.n_kv_heads = 4;
    cfg->model.ffn_dim = b->dim * 8 / 3 / 8 * 8;
    cfg->fsdp.forward_prefetch_depth = k->depth;
    cfg->fsdp.backward_prefetch_depth = k->depth;
    cfg->fsdp.comm_fusion = k->fusion;
    cfg->fsdp.comm_fusion_zero_copy = k->zero_copy;
    strcpy(cfg->optimizer.target, "adamw");
    return HS_OK;
}

/* The per-unit minimum of collectives and of payload bytes per step. */
static void minimum_of(hs_fsdp *f, measure *m) {
    hs_fsdp_stats st;
    hs_fsdp_get_stats(f, &st);
    m->min_colls = m->min_bytes = 0;
    for (int u = 0; u < st.units; u++) {
        int64_t logical = hs_fsdp_unit_gathered_numel(f, u) * (int64_t)sizeof(float);
        if (logical == 0) continue;
        int unshards = u == 0 ? 1 : 2; /* the root stays unsharded through the step */
        m->min_colls += unshards + 1;
        m->min_bytes += (unshards + 1) * logical;
    }
}

typedef struct setup {
    hs_config cfg;
    hs_device *dev;
    hs_model *m;
    hs_fsdp *f;
    hs_optim *opt;
    int32_t *tok, *tgt;
} setup;

static hs_status setup_make(const fsdp_bench *b, const combo *k, hs_pg *pg, setup *s, hs_error *e) {
    memset(s, 0, sizeof *s);
    hs_status st = config_for(b, k, &s->cfg, e);
    if (st != HS_OK) return st;
    st = hs_device_create(HS_DEVICE_CPU, hs_comm_trace(b->comm), &s->dev, e);
    if (st != HS_OK) return st;
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = b->batch,
                           .seq_len = b->seq,
                           .allocate_params = false,
                           .dev = s->dev};
    st = hs_model_create(&s->cfg.model, &mo, &s->m, e);
    if (st == HS_OK)
        st = hs_fsdp_wrap_group(&s->cfg.fsdp, s->cfg.optimizer.fp32_main_params, pg, b->comm,
                                s->dev, s->m, 1234, NULL, &s->f, e);
    if (st != HS_OK) return st;
    hs_optim_param *op;
    int n = hs_fsdp_optim_params(s->f, &op);
    st = hs_optim_create(&s->cfg.optimizer, op, n, s->dev, &s->dev->device_pool, &s->opt, e);
    size_t ntok = (size_t)(b->batch * b->seq);
    s->tok = malloc(sizeof(int32_t) * ntok);
    s->tgt = malloc(sizeof(int32_t) * ntok);
    if (!s->tok || !s->tgt) return hs_error_oom(e, "bench fsdp: token buffers");
    for (size_t i = 0; i < ntok; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(b->rank * 40503u + 17u);
        s->tok[i] = (int32_t)(h % 512u);
        s->tgt[i] = (int32_t)((h >> 9) % 512u);
    }
    return st;
}

static void setup_free(setup *s) {
    hs_optim_free(s->opt);
    hs_fsdp_free(s->f);
    hs_model_free(s->m);
    hs_device_free(s->dev);
    hs_config_free(&s->cfg);
    free(s->tok);
    free(s->tgt);
}

static hs_status one_step(const fsdp_bench *b, setup *s, hs_error *e) {
    hs_batch batch = {.tokens = s->tok, .targets = s->tgt, .B = b->batch, .T = b->seq};
    double loss, aux;
    hs_fsdp_set_micro_batch(s->f, true, true, true);
    hs_status st = hs_model_forward_backward(s->m, &batch, 1.0f / (float)(b->batch * b->seq),
                                             hs_fsdp_hooks(s->f), &loss, &aux, e);
    if (st != HS_OK) return st;
    hs_optim_step(s->opt, s->cfg.optimizer.lr, NULL);
    st = hs_fsdp_after_optim_step(s->f, e);
    hs_fsdp_zero_grads(s->f);
    return st;
}

typedef struct samples {
    double step[MAX_STEPS], exposed[MAX_STEPS], ag[MAX_STEPS], rs[MAX_STEPS], ar[MAX_STEPS];
} samples;

/* One timed step of one combination, its collectives and exposed waits. */
static hs_status timed_step(const fsdp_bench *b, setup *s, hs_pg *pg, measure *out, samples *sm,
                            int i, hs_error *e) {
    hs_trace *tr = hs_comm_trace(b->comm);
    hs_status st = hs_pg_barrier(pg, e);
    if (st != HS_OK) return st;
    hs_trace_reset_counters(tr);
    hs_fsdp_reset_exposed(s->f);
    double t0 = hs_now();
    st = one_step(b, s, e);
    double t = hs_now() - t0;
    out->colls = hs_trace_collectives(tr, "all_gather", NULL) +
                 hs_trace_collectives(tr, "reduce_scatter", NULL) +
                 hs_trace_collectives(tr, "all_reduce", NULL);
    out->bytes = hs_trace_collective_bytes(tr, "all_gather", NULL) +
                 hs_trace_collective_bytes(tr, "reduce_scatter", NULL);
    hs_fsdp_exposed_stats x;
    hs_fsdp_get_exposed(s->f, &x);
    sm->step[i] = hs_bench_max_over(pg, t) * 1e3;
    sm->exposed[i] = hs_bench_max_over(pg, x.total) * 1e3;
    sm->ag[i] = hs_bench_max_over(pg, x.all_gather) * 1e3;
    sm->rs[i] = hs_bench_max_over(pg, x.reduce_scatter) * 1e3;
    sm->ar[i] = hs_bench_max_over(pg, x.all_reduce) * 1e3;
    return st;
}

/* All combinations live side by side and take their timed steps in turn
 * (round r: one step of each), so a burst of outside load on this shared
 * machine slows every combination alike instead of one of them. */
static hs_status measure_all(const fsdp_bench *b, const combo *ks, int n, hs_pg *pg, measure *ms,
                             hs_error *e) {
    setup *ss = calloc((size_t)n, sizeof *ss);
    samples *sm = calloc((size_t)n, sizeof *sm);
    if (!ss || !sm) {
        free(ss);
        free(sm);
        return hs_error_oom(e, "bench fsdp: %d set-ups", n);
    }
    hs_status st = HS_OK;
    int made = 0;
    for (; st == HS_OK && made < n; made++) {
        st = setup_make(b, &ks[made], pg, &ss[made], e);
        if (st == HS_OK) st = one_step(b, &ss[made], e); /* warm-up: first-touch pages */
    }
    for (int i = 0; st == HS_OK && i < b->steps; i++)
        for (int c = 0; st == HS_OK && c < n; c++)
            st = timed_step(b, &ss[c], pg, &ms[c], &sm[c], i, e);
    for (int c = 0; st == HS_OK && c < n; c++) {
        minimum_of(ss[c].f, &ms[c]);
        ms[c].step_ms = hs_bench_median(sm[c].step, b->steps);
        ms[c].exposed_ms = hs_bench_median(sm[c].exposed, b->steps);
        ms[c].ag_ms = hs_bench_median(sm[c].ag, b->steps);
        ms[c].rs_ms = hs_bench_median(sm[c].rs, b->steps);
        ms[c].ar_ms = hs_bench_median(sm[c].ar, b->steps);
    }
    for (int c = 0; c < made; c++) setup_free(&ss[c]);
    free(ss);
    free(sm);
    return st;
}

static const char *fusion_name(const combo *k) {
    return !k->fusion ? "off" : k->zero_copy ? "zero-copy" : "copy-in";
}

/* Ranks outside the W being measured wait here without spinning a core:
 * the measured ranks need both of this machine's few cores. */
static void world_sync_sleeping(void) {
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
}

static void print_load(const fsdp_bench *b, const char *when) {
    double l[3];
    if (b->rank == 0 && getloadavg(l, 3) == 3)
        printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

/* The acceptance targets of this benchmark, checked on the table itself. */
static void print_verdicts(int W, const combo *ks, const measure *ms, int n) {
    bool colls_ok = true, bytes_ok = true;
    for (int i = 0; i < n; i++) {
        if (ks[i].fusion) colls_ok &= ms[i].colls == ms[i].min_colls;
        bytes_ok &= ms[i].bytes == ms[i].min_bytes;
    }
    printf("W=%d: fusion collectives at the per-unit minimum: %s; bytes at the minimum: %s\n", W,
           colls_ok ? "yes" : "NO", bytes_ok ? "yes" : "NO (padding of uneven shards)");
    for (int f = 0; f < 3; f++) {
        const measure *p0 = &ms[f * 3], *p1 = &ms[f * 3 + 1];
        printf("W=%d fusion %-9s: exposed comm prefetch 1 / prefetch 0 = %.2f (%.2f / %.2f ms)\n",
               W, fusion_name(&ks[f * 3]), p0->exposed_ms > 0 ? p1->exposed_ms / p0->exposed_ms : 0,
               p1->exposed_ms, p0->exposed_ms);
    }
}

static hs_status bench_world_size(fsdp_bench *b, int W, hs_error *e) {
    char name[32];
    snprintf(name, sizeof name, "bench_fsdp_w%d", W);
    hs_pg *pg = NULL;
    hs_status st = hs_comm_split(b->comm, name, b->rank < W ? 0 : -1, b->rank, &pg, e);
    if (st != HS_OK) return st;
    if (!pg) {
        world_sync_sleeping();
        return HS_OK;
    }
    combo ks[9];
    measure ms[9];
    memset(ms, 0, sizeof ms);
    int n = 0;
    for (int f = 0; f < 3; f++)
        for (int d = 0; d <= 2; d++)
            ks[n++] = (combo){.depth = d, .fusion = f > 0, .zero_copy = f == 2 ? -1 : 0};
    if (b->rank == 0) {
        printf("\nW=%d  (%d blocks, dim %d, %d x %d tokens per rank, %d timed steps)\n", W,
               b->layers, b->dim, b->batch, b->seq, b->steps);
        printf("%-8s %-10s %9s %11s %26s %13s %19s\n", "prefetch", "fusion", "step ms",
               "exposed ms", "(all-gather/RS/AR ms)", "colls (min)", "MB/step (min)");
    }
    st = measure_all(b, ks, n, pg, ms, e);
    for (int i = 0; st == HS_OK && i < n; i++) {
        if (b->rank == 0) {
            printf("%-8d %-10s %9.1f %11.2f %10.2f /%6.2f /%6.2f %6lld (%4lld) %9.2f (%7.2f)\n",
                   ks[i].depth, fusion_name(&ks[i]), ms[i].step_ms, ms[i].exposed_ms, ms[i].ag_ms,
                   ms[i].rs_ms, ms[i].ar_ms, (long long)ms[i].colls, (long long)ms[i].min_colls,
                   (double)ms[i].bytes / 1e6, (double)ms[i].min_bytes / 1e6);
            fflush(stdout);
        }
    }
    for (int i = 0; st == HS_OK && i < n; i++)
        if (b->fastest_step_ms == 0 || ms[i].step_ms < b->fastest_step_ms)
            b->fastest_step_ms = ms[i].step_ms;
    if (st == HS_OK && b->rank == 0) print_verdicts(W, ks, ms, n);
    fflush(stdout);
    world_sync_sleeping();
    return st;
}

/* The collective fingerprints' comparison (hs_comm_check) as train runs it
 * every comm.check_every steps (default 100): its median over 9 calls on
 * every rank, against the fastest median step above. The hashing each
 * collective does as it is issued is always on, inside every timed step. */
static hs_status check_cost(const fsdp_bench *b, hs_error *e) {
    enum { N = 9, EVERY = 100 };
    double t[N];
    hs_status st = HS_OK;
    for (int i = 0; st == HS_OK && i < N; i++) {
        st = hs_pg_barrier(hs_comm_world(b->comm), e);
        double t0 = hs_now();
        if (st == HS_OK) st = hs_comm_check(b->comm, "bench", e);
        t[i] = hs_bench_max_over(hs_comm_world(b->comm), hs_now() - t0) * 1e3;
    }
    if (st != HS_OK || b->rank != 0) return st;
    double ms = hs_bench_median(t, N);
    printf("\ncollective fingerprint check (%d ranks): %.3f ms; every %d steps (comm.check_every's "
           "default) %.5f%% of the fastest step (%.1f ms)\n",
           b->world, ms, EVERY,
           b->fastest_step_ms > 0 ? 100.0 * ms / EVERY / b->fastest_step_ms : 0,
           b->fastest_step_ms);
    return st;
}

int hs_bench_fsdp(int argc, char **argv) {
    fsdp_bench b;
    memset(&b, 0, sizeof b);
    int rc = parse(argc, argv, &b);
    if (rc) return rc < 0 ? 0 : rc;
    hs_error e;
    hs_error_clear(&e);
    hs_comm_options opt = {.timeout_s = 600};
    if (hs_comm_init(&b.comm, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hypershard bench fsdp: %s\n", e.msg);
        return 1;
    }
    b.world = hs_comm_size(b.comm);
    b.rank = hs_comm_rank(b.comm);
    if (b.world < 2) {
        if (b.rank == 0) fprintf(stderr, "hypershard bench fsdp: run under mpiexec -n 2 or -n 4\n");
        hs_comm_finalize(b.comm);
        return 2;
    }
    print_load(&b, "before");
    hs_status st = HS_OK;
    for (int W = 2; st == HS_OK && W <= 4 && W <= b.world; W += 2) st = bench_world_size(&b, W, &e);
    if (st == HS_OK) st = check_cost(&b, &e);
    print_load(&b, "after");
    if (st != HS_OK) hs_comm_abort(b.comm, &e);
    hs_comm_finalize(b.comm);
    return 0;
}
