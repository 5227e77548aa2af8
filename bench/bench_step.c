/* `hypershard bench step` — training throughput and MFU, on one process
 * or on W under mpiexec.
 *
 * Times whole optimizer steps exactly as the trainer runs them
 * (src/train/step.c): forward + backward of B sequences of T tokens per
 * rank, the global grad norm, clipping, AdamW, zeroed gradients, through
 * the local engine on one process and the FSDP engine over W ranks
 * (fsdp_config.dp_shard_size = W, a global batch of W x B sequences, each
 * rank its own). A step's time is the slowest rank's. Next to it, in the
 * same run and with the same BLAS threads, each rank's own fp32 GEMM speed
 * on a large square sgemm. MFU is
 *
 *   hs_model_flops_per_token x tokens/s per rank / mean sgemm FLOP/s
 *
 * so it says how close a training step comes to what this BLAS does on
 * an ideal matrix, on this machine, now. On a machine shared with other work
 * every measurement can only be slowed down, so the sgemm is measured before
 * and after the models and the best is the denominator, and MFU is given for
 * the best step as well as the median one. With --breakdown the device
 * is profiled (src/device/profile.c) and each model's timed steps are
 * followed by profiled ones, each right after a plain one, whose wall time
 * is split by op class (bench_breakdown.c); over W ranks the table is rank
 * 0's, its steps timed by its own clock, and "comm waits" is the time its
 * compute thread sat blocked on FSDP's collectives. docs/performance.md has
 * the figures. Rank 0 prints and writes the JSON. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "bench_breakdown.h"
#include "bench_engine.h"
#include "bench_util.h"
#include "cli/commands.h"
#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/mesh.h"
#include "hypershard/optim.h"
#include "hypershard/train.h"

#define MAX_OVERRIDES 16

typedef struct bench_model {
    const char *name;
    const char *overrides[MAX_OVERRIDES]; /* config keys; NULL-terminated */
    int B, T;
} bench_model;

typedef struct bench_opts {
    bool quick;
    int threads; /* BLAS threads; 0: leave as configured */
    int steps;   /* timed steps per model; 0: by mode */
    const char *only;
    bool breakdown;
    const char *json; /* NULL: no JSON file */
    const char *sets[MAX_OVERRIDES];
    int n_sets;
    int batch, seq; /* 0: the model's */
} bench_opts;

/* The default Llama of configs/demo.yaml, and a GPT-2-small-sized Llama
 * (124M parameters with the untied head). Quick mode keeps the GPT-2 width
 * and vocabulary but cuts depth, context and batch so a smoke run takes
 * seconds. */
static const bench_model MODELS[] = {
    {"demo",
     {"model.dim=128", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2",
      "model.ffn_dim=384", "model.vocab_size=256", NULL},
     8,
     64},
    {"gpt2-small",
     {"model.dim=768", "model.n_layers=12", "model.n_heads=12", "model.n_kv_heads=12",
      "model.ffn_dim=2048", "model.vocab_size=50304", NULL},
     4,
     512},
};
static const bench_model GPT2_QUICK = {"gpt2-small-quick",
                                       {"model.dim=768", "model.n_layers=2", "model.n_heads=12",
                                        "model.n_kv_heads=12", "model.ffn_dim=2048",
                                        "model.vocab_size=50304", NULL},
                                       1,
                                       128};

static int usage(FILE *f, const char *why) {
    if (why) fprintf(f, "hypershard bench step: %s\n", why);
    fprintf(f,
            "usage: [mpiexec -n W] hypershard bench step [--quick] [--threads N] [--steps N]\n"
            "                             [--model NAME]\n"
            "                             [--set KEY=VALUE]... [--batch B] [--seq T]\n"
            "                             [--breakdown] [--json FILE]\n"
            "  --quick      seconds, not minutes: the demo model and a 2-layer, 128-token\n"
            "               GPT-2-width model; a smaller sgemm\n"
            "  --threads N  GEMM threads for the sgemm and the steps (default: OMP_NUM_THREADS,\n"
            "               else every core)\n"
            "  --steps N    timed steps per model after one warm-up (default 5, quick 2;\n"
            "               the median of at most 64 counts)\n"
            "  --model M    demo or gpt2-small only\n"
            "  --set K=V    a config key for the model (model.*, fsdp_config.*; repeatable):\n"
            "               one model, named custom, on --model's base (default demo)\n"
            "  --batch B, --seq T  sequences per step and rank, and their length\n"
            "  --breakdown  after the timed steps, as many profiled ones, each right after a\n"
            "               plain one: the step's time by op class, share and GFLOP/s or GB/s\n"
            "               (rank 0's under mpiexec)\n"
            "  --json FILE  the results (and breakdowns) as JSON\n");
    return 2;
}

/* A count >= 1, or -1. */
static int parse_count(const char *s) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    return end != s && *end == '\0' && v >= 1 && v <= 1024 ? (int)v : -1;
}

static int parse(int argc, char **argv, bench_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(stdout, NULL), -1;
        if (!strcmp(s, "--quick")) o->quick = true;
        else if (!strcmp(s, "--threads") && i + 1 < argc) o->threads = parse_count(argv[++i]);
        else if (!strcmp(s, "--steps") && i + 1 < argc) o->steps = parse_count(argv[++i]);
        else if (!strcmp(s, "--model") && i + 1 < argc) o->only = argv[++i];
        else if (!strcmp(s, "--breakdown")) o->breakdown = true;
        else if (!strcmp(s, "--json") && i + 1 < argc) o->json = argv[++i];
        else if (!strcmp(s, "--batch") && i + 1 < argc) o->batch = parse_count(argv[++i]);
        else if (!strcmp(s, "--seq") && i + 1 < argc) o->seq = parse_count(argv[++i]);
        else if (!strcmp(s, "--set") && i + 1 < argc && o->n_sets < MAX_OVERRIDES - 4 &&
                 strchr(argv[i + 1], '='))
            o->sets[o->n_sets++] = argv[++i];
        else {
            fprintf(stderr, "hypershard bench step: unknown option or missing value: '%s'\n", s);
            return usage(stderr, NULL), 2;
        }
    }
    if (o->threads < 0 || o->steps < 0 || o->batch < 0 || o->seq < 0)
        return usage(stderr, "--threads, --steps, --batch and --seq take a whole number N >= 1"), 2;
    if (o->only && strcmp(o->only, "demo") && strcmp(o->only, "gpt2-small"))
        return usage(stderr, "--model is demo or gpt2-small"), 2;
    return 0;
}

/* ---------------------------------------------------------------- machine */

static void cpu_model(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        snprintf(buf, cap, "%s", colon + 2);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

static void print_load(const char *when) {
    double l[3] = {0, 0, 0};
    if (getloadavg(l, 3) == 3) printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

/* Square fp32 sgemm operands, allocated once. */
typedef struct sgemm_probe {
    float *a, *b, *c;
    int n;
} sgemm_probe;

static hs_status probe_init(sgemm_probe *p, int n, hs_error *e) {
    size_t nn = (size_t)n * (size_t)n;
    p->n = n;
    p->a = malloc(nn * sizeof(float));
    p->b = malloc(nn * sizeof(float));
    p->c = malloc(nn * sizeof(float));
    if (!p->a || !p->b || !p->c)
        return hs_error_oom(e, "the %dx%d sgemm operands: %zu bytes", n, n, 3 * nn * sizeof(float));
    hs_rng_fill_uniform(p->a, (int64_t)nn, 1, 1, 0, -1.0f, 1.0f);
    hs_rng_fill_uniform(p->b, (int64_t)nn, 1, 2, 0, -1.0f, 1.0f);
    return hs_sgemm(false, false, n, n, n, 1.0f, p->a, n, p->b, n, 0.0f, p->c, n, e); /* warm-up */
}

static void probe_free(sgemm_probe *p) { free(p->a), free(p->b), free(p->c); }

/* FLOP/s of back-to-back calls for at least `seconds` (at least one call). */
static hs_status probe_rate(const sgemm_probe *p, double seconds, double *rate, hs_error *e) {
    int n = p->n, calls = 0;
    double t0 = hs_now(), dt = 0.0;
    do {
        hs_status s = hs_sgemm(false, false, n, n, n, 1.0f, p->a, n, p->b, n, 0.0f, p->c, n, e);
        if (s != HS_OK) return s;
        calls++;
        dt = hs_now() - t0;
    } while (dt < seconds);
    *rate = 2.0 * n * (double)n * n * calls / dt;
    return HS_OK;
}

/* Best of single calls: what the machine does when nothing else runs. */
static hs_status probe_best(const sgemm_probe *p, int trials, double *best, hs_error *e) {
    *best = 0.0;
    for (int i = 0; i < trials; i++) {
        double f = 0.0;
        hs_status s = probe_rate(p, 0.0, &f, e);
        if (s != HS_OK) return s;
        if (f > *best) *best = f;
    }
    return HS_OK;
}

/* ------------------------------------------------------------------ steps */

/* Medians over the timed steps. Each step is paired with the sgemm rate
 * measured right before and right after it (`window` seconds each), so the
 * MFU of a step compares it with what the BLAS did in the same minute: on a
 * shared machine both are slowed by the same neighbours. */
typedef struct step_times {
    double step, fwd_bwd, optim; /* seconds */
    double sgemm;                /* FLOP/s around the steps */
    double mfu;                  /* median of the per-step ratios */
    double best;                 /* fastest step, seconds */
} step_times;

typedef struct bench_run {
    hs_comm *comm;
    int world, rank;
    hs_mesh *mesh;
    hs_config cfg;
    hs_topology topo;
    hs_device *dev;
    hs_engine *en;
    hs_optim *optim;
    hs_optim_param *params;
    int n_params;
    int32_t *tokens, *targets;
    hs_bench_labels labels; /* --breakdown */
} bench_run;

static hs_status run_open(bench_run *r, const bench_model *bm, const bench_opts *o, hs_error *e) {
    const char *ov[2 * MAX_OVERRIDES];
    int n = 0;
    while (bm->overrides[n]) ov[n] = bm->overrides[n], n++;
    for (int i = 0; i < o->n_sets; i++) ov[n++] = o->sets[i];
    char seq[32], mbs[48], gbs[48], shard[48];
    snprintf(seq, sizeof seq, "train.seq_len=%d", bm->T);
    snprintf(mbs, sizeof mbs, "train.micro_batch_size=%d", bm->B);
    snprintf(gbs, sizeof gbs, "train.global_batch_size=%lld", (long long)bm->B * r->world);
    snprintf(shard, sizeof shard, "fsdp_config.dp_shard_size=%d", r->world);
    ov[n++] = seq, ov[n++] = mbs, ov[n++] = gbs;
    if (r->world > 1) ov[n++] = shard;
    hs_status s = hs_config_load(&r->cfg, NULL, ov, n, e);
    if (s == HS_OK) s = hs_config_validate(&r->cfg, r->world, &r->topo, NULL, e);
    if (s == HS_OK) s = hs_mesh_create(r->comm, &r->topo, &r->mesh, e);
    if (s == HS_OK) s = hs_device_create(HS_DEVICE_CPU, NULL, &r->dev, e);
    /* before the model reads the device's table */
    if (s == HS_OK && o->breakdown) s = hs_device_profile_install(r->dev, e);
    if (s != HS_OK) return s;
    hs_engine_env env = {.cfg = &r->cfg,
                         .topo = &r->topo,
                         .comm = r->comm,
                         .mesh = r->mesh,
                         .dev = r->dev,
                         .max_batch = bm->B};
    s = hs_engine_create(&env, &r->en, e);
    if (s == HS_OK && o->breakdown)
        s = hs_bench_labels_set(&r->labels, r->dev, hs_engine_model(r->en), e);
    if (s != HS_OK) return s;
    r->n_params = hs_engine_optim_params(r->en, &r->params);
    s = hs_optim_create(&r->cfg.optimizer, r->params, r->n_params, r->dev, &r->dev->device_pool,
                        &r->optim, e);
    size_t bt = (size_t)bm->B * (size_t)bm->T;
    r->tokens = malloc(bt * sizeof(int32_t));
    r->targets = malloc(bt * sizeof(int32_t));
    if (s == HS_OK && (!r->tokens || !r->targets))
        s = hs_error_oom(e, "bench step %s: cannot allocate the batch", bm->name);
    if (s == HS_OK)
        hs_bench_random_batch(r->tokens, r->targets, bt, r->cfg.model.vocab_size,
                              12345 + (uint64_t)r->rank);
    return s;
}

static void run_close(bench_run *r) {
    hs_optim_free(r->optim);
    hs_engine_free(r->en);
    hs_mesh_free(r->mesh);
    hs_device_free(r->dev);
    hs_bench_labels_free(&r->labels);
    hs_config_free(&r->cfg);
    free(r->tokens);
    free(r->targets);
}

/* One step as src/train/step.c runs it with one micro-batch. */
static hs_status run_step(bench_run *r, const bench_model *bm, double *t_fb, double *t_opt,
                          hs_error *e) {
    hs_batch b = {.tokens = r->tokens, .targets = r->targets, .B = bm->B, .T = bm->T};
    double t0 = hs_now();
    hs_status s = hs_bench_engine_step(r->en, r->optim, r->params, r->n_params, &r->cfg.optimizer,
                                       &b, 1.0f / (float)(bm->B * bm->T), t_fb, e);
    *t_opt = hs_now() - t0 - *t_fb;
    return s;
}

enum { MAX_STEPS = 64 };

static hs_status time_model(const bench_model *bm, const bench_opts *o, int steps,
                            const sgemm_probe *probe, double window, bench_run *r, step_times *out,
                            hs_error *e) {
    double tstep[MAX_STEPS], tfb[MAX_STEPS], topt[MAX_STEPS], rate[MAX_STEPS], mfu[MAX_STEPS];
    if (steps > MAX_STEPS) steps = MAX_STEPS;
    hs_status s = run_open(r, bm, o, e);
    double fpt = s == HS_OK ? hs_model_flops_per_token(hs_engine_model(r->en), bm->T) : 0.0;
    double flops = fpt * bm->B * bm->T;
    for (int i = -1; s == HS_OK && i < steps; i++) { /* i = -1: warm-up */
        double fb = 0.0, op = 0.0, before = 0.0, after = 0.0;
        if (i >= 0) s = probe_rate(probe, window, &before, e);
        if (s == HS_OK) s = run_step(r, bm, &fb, &op, e);
        if (i < 0 || s != HS_OK) continue;
        hs_pg *w = hs_comm_world(r->comm);
        tstep[i] = hs_bench_max_over(w, fb + op);
        tfb[i] = hs_bench_max_over(w, fb), topt[i] = hs_bench_max_over(w, op);
        s = probe_rate(probe, window, &after, e);
        rate[i] = hs_bench_mean_over(w, 0.5 * (before + after));
        mfu[i] = flops / tstep[i] / rate[i];
    }
    if (s != HS_OK) return s;
    *out = (step_times){.step = hs_bench_median(tstep, steps),
                        .fwd_bwd = hs_bench_median(tfb, steps),
                        .optim = hs_bench_median(topt, steps),
                        .sgemm = hs_bench_median(rate, steps),
                        .mfu = hs_bench_median(mfu, steps)};
    out->best = tstep[0]; /* hs_bench_median() sorted it */
    return HS_OK;
}

/* --breakdown: `steps` pairs of a plain step and a profiled one, so that a
 * shared machine's load drifts hit both alike. */
static hs_status breakdown(bench_run *r, const bench_model *bm, int steps, hs_bench_breakdown *out,
                           hs_error *e) {
    *out = (hs_bench_breakdown){.steps = steps};
    hs_device_profile_reset(r->dev);
    hs_status s = HS_OK;
    for (int i = 0; s == HS_OK && i < steps; i++) {
        double fb, op;
        s = run_step(r, bm, &fb, &op, e);
        out->plain_s += fb + op;
        out->plain_best = i == 0 || fb + op < out->plain_best ? fb + op : out->plain_best;
        hs_device_profile_enable(r->dev, true);
        double t0 = hs_now();
        if (s == HS_OK) s = run_step(r, bm, &fb, &op, e);
        double t = hs_now() - t0;
        hs_device_profile_enable(r->dev, false);
        out->profiled_s += t;
        out->profiled_best = i == 0 || t < out->profiled_best ? t : out->profiled_best;
    }
    hs_device_profile_get(r->dev, &out->st);
    out->plain_s /= steps, out->profiled_s /= steps;
    return s;
}

typedef struct bench_result {
    const char *name;
    double flops_per_token;
    int64_t tokens; /* per step */
    int B, T;
    const char *dtype; /* the compute dtype */
    step_times t;
    bool has_breakdown;
    hs_bench_breakdown bd;
} bench_result;

static int bench_one(hs_comm *comm, const bench_model *bm, const bench_opts *o, int steps,
                     const sgemm_probe *probe, double window, bench_result *res) {
    bench_run r;
    memset(&r, 0, sizeof r);
    r.comm = comm;
    r.world = hs_comm_size(comm), r.rank = hs_comm_rank(comm);
    hs_error e;
    hs_error_clear(&e);
    hs_status s = time_model(bm, o, steps, probe, window, &r, &res->t, &e);
    res->has_breakdown = s == HS_OK && o->breakdown;
    if (res->has_breakdown)
        s = breakdown(&r, bm, steps > MAX_STEPS ? MAX_STEPS : steps, &res->bd, &e);
    if (s != HS_OK) {
        fprintf(stderr, "hypershard bench step: rank %d: %s: %s\n", r.rank, bm->name, e.msg);
        run_close(&r);
        return hs_status_exit_code(s);
    }
    const hs_model_config *mc = &r.cfg.model;
    const step_times *t = &res->t;
    int pdt = r.cfg.fsdp.mix_precision.param_dtype;
    res->name = bm->name;
    res->B = bm->B, res->T = bm->T;
    res->dtype = pdt == HS_MP_NULL ? "float32" : hs_dtype_name((hs_dtype)pdt);
    res->tokens = (int64_t)bm->B * bm->T;
    res->flops_per_token = hs_model_flops_per_token(hs_engine_model(r.en), bm->T);
    if (r.rank != 0) {
        run_close(&r);
        return 0;
    }
    printf("%-16s %6.1fM  dim %3d L %2d H %2d/%2d F %4d V %5d  B %d T %3d %s | step %7.3f s "
           "(fwd+bwd %.3f, optim %.3f; best %.3f)\n",
           bm->name, (double)hs_model_param_count(hs_engine_model(r.en)) / 1e6, mc->dim,
           mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->ffn_dim, mc->vocab_size, bm->B, bm->T,
           res->dtype, t->step, t->fwd_bwd, t->optim, t->best);
    if (res->has_breakdown) {
        char label[96];
        if (r.world > 1) snprintf(label, sizeof label, "%s, rank 0 of %d", bm->name, r.world);
        else snprintf(label, sizeof label, "%s", bm->name);
        hs_bench_breakdown_print(stdout, label, &res->bd);
    }
    fflush(stdout);
    run_close(&r);
    return 0;
}

static void print_summary(const bench_result *r) {
    const step_times *t = &r->t;
    double tps = (double)r->tokens / t->step;
    printf("%-16s %8.0f tok/s per rank | model %6.1f GFLOP/s | sgemm %6.1f GFLOP/s | MFU %5.1f%%\n",
           r->name, tps, r->flops_per_token * tps / 1e9, t->sgemm / 1e9, 100.0 * t->mfu);
}

/* --json: the machine and one object per model. */
static int write_json(const char *path, const char *cpu, int world, const bench_result *res,
                      int n) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "hypershard bench step: --json %s: cannot open it for writing\n", path);
        return 1;
    }
    double l[3] = {0, 0, 0};
    if (getloadavg(l, 3) != 3) l[0] = l[1] = l[2] = -1;
    fprintf(f,
            "{\"cpu\":\"%s\",\"threads\":%d,\"ranks\":%d,\"load_avg\":[%.2f,%.2f,%.2f],"
            "\"models\":[",
            cpu, hs_blas_get_threads(), world, l[0], l[1], l[2]);
    for (int i = 0; i < n; i++) {
        const bench_result *r = &res[i];
        fprintf(f,
                "%s{\"name\":\"%s\",\"B\":%d,\"T\":%d,\"dtype\":\"%s\",\"step_s\":%.6f,"
                "\"best_step_s\":%.6f,\"tok_s\":%.1f,\"mfu\":%.4f,\"breakdown\":",
                i ? "," : "", r->name, r->B, r->T, r->dtype, r->t.step, r->t.best,
                (double)r->tokens / r->t.step, r->t.mfu);
        if (r->has_breakdown) hs_bench_breakdown_json(f, &r->bd);
        else fprintf(f, "null");
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

/* The models this run times: --model's (both when none), or one model
 * named custom: --model's base (demo by default) with --set's keys; --batch
 * and --seq replace B and T. */
static int pick_models(const bench_opts *o, bench_model *out) {
    enum { N_MODELS = (int)(sizeof MODELS / sizeof MODELS[0]) };
    int n = 0;
    for (int i = 0; i < N_MODELS; i++) {
        const bench_model *bm = &MODELS[i];
        const char *want = o->only ? o->only : o->n_sets ? "demo" : NULL;
        if (want && strcmp(want, bm->name)) continue;
        if (o->quick && !strcmp(bm->name, "gpt2-small")) bm = &GPT2_QUICK;
        out[n] = *bm;
        if (o->n_sets) out[n].name = "custom";
        if (o->batch) out[n].B = o->batch;
        if (o->seq) out[n].T = o->seq;
        n++;
    }
    return n;
}

int hs_bench_step(int argc, char **argv) {
    bench_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.threads > 0) hs_blas_set_threads(o.threads);
    int steps = o.steps ? o.steps : o.quick ? 2 : 5;
    hs_error e;
    hs_error_clear(&e);
    hs_comm *comm = NULL;
    hs_comm_options copt = {.timeout_s = 600};
    hs_status s = hs_comm_init(&comm, &argc, &argv, &copt, &e);
    if (s != HS_OK) {
        fprintf(stderr, "hypershard bench step: %s\n", e.msg);
        return hs_status_exit_code(s);
    }
    int world = hs_comm_size(comm);
    bool lead = hs_comm_rank(comm) == 0;
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    if (lead) {
        printf("machine: %s, %ld online CPUs | oneDNN %s kernels, %d thread(s) per rank, "
               "%d rank(s)\n",
               cpu, sysconf(_SC_NPROCESSORS_ONLN), hs_gemm_isa(), hs_blas_get_threads(), world);
        print_load("before");
    }
    sgemm_probe probe = {0};
    int n = o.quick ? 1024 : 2048;
    double window = o.quick ? 0.25 : 1.5;
    double best = 0.0;
    s = probe_init(&probe, n, &e);
    if (s == HS_OK) s = probe_best(&probe, 5, &best, &e);
    if (s != HS_OK) {
        probe_free(&probe);
        hs_comm_finalize(comm);
        fprintf(stderr, "hypershard bench step: %s\n", e.msg);
        return hs_status_exit_code(s);
    }
    if (lead) {
        printf("sgemm %dx%dx%d fp32: best single call %.1f GFLOP/s (rank 0)\n", n, n, n,
               best / 1e9);
        printf("step = forward + backward + grad norm + clip + AdamW + zero grads; medians of "
               "%d steps after 1 warm-up, each step between two %.2f s sgemm windows%s\n",
               steps, window, world > 1 ? "; FSDP over every rank, the slowest rank's step" : "");
        for (int i = 0; i < o.n_sets; i++) printf("set %s\n", o.sets[i]);
    }
    enum { N_MODELS = (int)(sizeof MODELS / sizeof MODELS[0]) };
    bench_model models[N_MODELS];
    bench_result res[N_MODELS];
    int n_models = pick_models(&o, models), done = 0;
    for (int i = 0; rc == 0 && i < n_models; i++) {
        rc = bench_one(comm, &models[i], &o, steps, &probe, window, &res[done]);
        /* every rank stops at the first model any rank failed */
        rc = (int)hs_bench_max_over(hs_comm_world(comm), rc);
        if (rc == 0) done++;
    }
    probe_free(&probe);
    hs_comm_finalize(comm);
    if (!lead) return rc;
    printf("MFU = model FLOPs (hs_model_flops_per_token) per second / sgemm FLOP/s of the same "
           "minutes\n");
    for (int i = 0; i < done; i++) print_summary(&res[i]);
    print_load("after");
    if (rc == 0 && o.json) rc = write_json(o.json, cpu, world, res, done);
    return rc;
}
