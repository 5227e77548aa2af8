/* Metrics: one JSON object per optimizer step in <out_dir>/metrics.jsonl,
 * one human log line per train.log_every steps, and the MFU reference. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

/* The GEMM rate: what this process's GEMM achieves on a square
 * matrix of model-like size in the step's compute dtype (the 16-bit matmul
 * with fp32 accumulation when param_dtype is bf16/fp16 and the CPU has it
 * natively, else fp32 sgemm), measured once at start-up by every rank at
 * the same time (docs/training.md). The best of three 15 ms trials, since
 * other processes on a shared machine only ever make a trial slower; it
 * is reported beside MFU, not its denominator (the nominal peak is), so a
 * short probe is enough: six 30 ms trials were 40% of a tiny test run. */
static hs_status gemm_trial(const void *a, const void *b, float *c, hs_dtype dt, int n,
                            double *flops, hs_error *e) {
    int reps = 0;
    double t0 = hs_now(), dt_s = 0.0;
    while (dt_s < 0.015) {
        hs_status s = hs_gemm_ex(false, false, n, n, n, 1.0f, a, dt, n, b, dt, n, 0.0f, c,
                                 HS_DTYPE_F32, n, e);
        if (s != HS_OK) return s;
        reps++;
        dt_s = hs_now() - t0;
    }
    *flops = 2.0 * n * n * (double)n * reps / dt_s;
    return HS_OK;
}

hs_dtype hs_peak_flops_dtype(hs_dtype compute) {
    return compute != HS_DTYPE_F32 && hs_gemm16_native(compute) ? compute : HS_DTYPE_F32;
}

hs_status hs_measure_peak_flops(hs_dtype dt, double *peak, hs_error *e) {
    enum { N = 384, TRIALS = 3 };
    size_t es = hs_dtype_size(dt);
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N),
          *c = malloc(sizeof(float) * N * N);
    void *a16 = malloc(es * N * N), *b16 = malloc(es * N * N);
    double best = 0.0, f = 0.0;
    hs_status s = HS_OK;
    if (a && b && c && a16 && b16) {
        hs_rng_fill_uniform(a, N * N, 1, 1, 0, -1.0f, 1.0f);
        hs_rng_fill_uniform(b, N * N, 1, 2, 0, -1.0f, 1.0f);
        hs_convert(a16, dt, a, HS_DTYPE_F32, N * N);
        hs_convert(b16, dt, b, HS_DTYPE_F32, N * N);
        s = gemm_trial(a16, b16, c, dt, N / 4, &f, e); /* warm-up */
        for (int i = 0; i < TRIALS && s == HS_OK; i++) {
            s = gemm_trial(a16, b16, c, dt, N, &f, e);
            if (f > best) best = f;
        }
    } else {
        s = hs_error_oom(e, "measuring the GEMM peak: %zu bytes of %dx%d matrices",
                         (3 * sizeof(float) + 2 * es) * N * N, N, N);
    }
    free(a), free(b), free(c), free(a16), free(b16);
    *peak = best;
    return s;
}

double hs_cpu_rank_peak(hs_dtype compute, int threads, int local_ranks, double measured, char *what,
                        size_t cap) {
    hs_cpu_peak p = hs_cpu_nominal_peak(compute);
    if (p.flops_per_core <= 0.0) { /* no clock stated anywhere: nothing nominal to divide by */
        snprintf(what, cap, "the measured GEMM (the system states no clock)");
        return measured;
    }
    double share = (double)p.cores / (local_ranks > 0 ? local_ranks : 1);
    double cores = threads < share ? threads : share;
    /* The rate its threads reach with a core each at the stated clock: a
     * GEMM measured faster ran at a higher clock, which then scales it. */
    double ceiling = threads * p.flops_per_core, scale = 1.0;
    if (ceiling > 0 && measured > ceiling) scale = measured / ceiling;
    snprintf(what, cap, "nominal: %.3g core(s) x %.2f GHz x %d %s FLOP/cycle (%s; clock from %s)",
             cores, p.ghz * scale, p.flops_per_cycle, hs_dtype_name(p.dtype), p.isa,
             scale > 1.0 ? "the measured GEMM, above the stated clock" : p.clock_source);
    return cores * p.flops_per_core * scale;
}

/* On a GPU (the cuda device): its own GEMM
 * (the table's entry) on square matrices in dt with fp32 accumulation,
 * timed between stream synchronizes, the best of a few trials. The
 * buffers go back to the device's cache and its peak is reset, so the
 * measurement leaves no trace in peak_device_bytes; called before the
 * model is built. */
hs_status hs_measure_device_peak_flops(hs_device *d, hs_dtype dt, double *peak, hs_error *e) {
    enum { N = 4096, TRIALS = 3, REPS = 8 };
    const int64_t nn = (int64_t)N * N;
    size_t es = hs_dtype_size(dt);
    float *tmp = hs_device_alloc(d, (size_t)nn * sizeof(float));
    void *a = hs_device_alloc(d, (size_t)nn * es), *b = hs_device_alloc(d, (size_t)nn * es),
         *c = hs_device_alloc(d, (size_t)nn * es);
    double best = 0.0;
    hs_status s = HS_OK;
    if (tmp && a && b && c) {
        hs_stream *st = d->stream;
        d->k->rng_normal(st, tmp, nn, 1, 1, 0, 0.0f, 1.0f);
        d->k->convert(st, a, dt, tmp, HS_DTYPE_F32, nn);
        d->k->rng_normal(st, tmp, nn, 1, 2, 0, 0.0f, 1.0f);
        d->k->convert(st, b, dt, tmp, HS_DTYPE_F32, nn);
        /* the first product builds the plan */
        hs_stream_gemm(st, false, false, N, N, N, 1.0f, a, dt, N, b, dt, N, 0.0f, c, dt, N);
        hs_stream_synchronize(st);
        for (int i = 0; i < TRIALS; i++) {
            double t0 = hs_now();
            for (int r = 0; r < REPS; r++)
                hs_stream_gemm(st, false, false, N, N, N, 1.0f, a, dt, N, b, dt, N, 0.0f, c, dt, N);
            hs_stream_synchronize(st);
            double f = 2.0 * (double)nn * N * REPS / (hs_now() - t0);
            if (f > best) best = f;
        }
        s = hs_device_status(d, e);
    } else {
        s = hs_device_oom(d, (size_t)nn * (sizeof(float) + 3 * es), "measuring the GEMM peak", e);
    }
    hs_device_free_mem(d, tmp), hs_device_free_mem(d, a), hs_device_free_mem(d, b),
        hs_device_free_mem(d, c);
    hs_pool_reset_peak(&d->device_pool);
    *peak = best;
    return s;
}

hs_status hs_metrics_open(hs_trainer *t, hs_error *e) {
    if (!t->rank0) return HS_OK;
    const char *dir = t->cfg->train.out_dir;
    hs_status s = hs_mkdirs(dir, e);
    if (s != HS_OK) return s;
    char path[HS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    FILE *f = hs_fopen(path, "w", "check that train.out_dir is writable", e);
    if (!f) return e->code;
    s = hs_config_dump(t->cfg, t->topo, f, e);
    if (s != HS_OK) {
        fclose(f);
        return s;
    }
    s = hs_fclose_written(f, path, "check the free space of train.out_dir", e);
    if (s != HS_OK) return s;
    char *mp = t->metrics_path;
    snprintf(mp, sizeof t->metrics_path, "%s/metrics.jsonl", dir);
    /* A resumed run continues the curve of the run it resumes. */
    if (t->start_step > 0) s = hs_train_metrics_keep_until(mp, t->start_step, e);
    if (s != HS_OK) return s;
    t->metrics =
        hs_fopen(mp, t->start_step > 0 ? "a" : "w", "check that train.out_dir is writable", e);
    if (!t->metrics) return e->code;
    t->metrics_good = fseeko(t->metrics, 0, SEEK_END) == 0 ? hs_metrics_offset(t->metrics) : 0;
    return hs_tb_open(t, e);
}

/* A step that ran faster than the peak proves the clock the peak was
 * taken at too low (cores boosting past the clock the system states, with
 * the start-up GEMM slowed by a busy machine): the peak becomes the rate
 * seen, said in the log, so MFU stays a fraction of a rate the cores
 * reach. */
static double step_mfu(hs_trainer *t, const hs_step_result *r) {
    if (t->peak_flops <= 0 || r->step_time_s <= 0) return 0.0;
    double rate = t->flops_per_token * (double)r->tokens / r->step_time_s;
    if (rate > t->peak_flops) {
        hs_log_info(t->log,
                    "step %d ran at %.1f GFLOP/s, above the peak of %.1f GFLOP/s (%s): the "
                    "cores run faster than the clock it was taken at; mfu is against %.1f "
                    "GFLOP/s from here on",
                    r->step, rate / 1e9, t->peak_flops / 1e9, t->peak_what, rate / 1e9);
        t->peak_flops = rate;
        snprintf(t->peak_what, sizeof t->peak_what, "the rate of step %d", r->step);
    }
    return rate / t->peak_flops;
}

/* One step's line of metrics.jsonl; a failed write closes the file
 * (hs_metrics_lost). */
static void write_line(hs_trainer *t, const hs_step_result *r) {
    hs_json j;
    hs_json_init(&j, t->metrics);
    hs_json_begin_object(&j);
    hs_json_kv_int(&j, "step", r->step);
    /* layout-invariant runs are compared bit for bit: every digit */
    int digits = hs_train_layout_invariant(&t->cfg->train) ? 17 : 9;
    hs_json_kv_double(&j, "loss", r->loss, digits);
    if (hs_model_arch_moe(&t->cfg->model)) hs_json_kv_double(&j, "aux_loss", r->aux_loss, 9);
    hs_json_kv_double(&j, "grad_norm", r->grad_norm, digits);
    hs_json_kv_double(&j, "lr", r->lr, 9);
    hs_json_kv_int(&j, "tokens", r->tokens);
    hs_json_kv_double(&j, "step_time_s", r->step_time_s, 6);
    hs_json_kv_double(&j, "tokens_per_s", r->step_time_s > 0 ? r->tokens / r->step_time_s : 0, 6);
    hs_json_kv_double(&j, "mfu", step_mfu(t, r), 6);
    hs_json_kv_double(&j, "exposed_fsdp_s", r->exposed_fsdp_s, 6);
    hs_json_key(&j, "exposed_s");
    hs_json_begin_object(&j);
    for (int k = HS_PLAN_TP; k <= HS_PLAN_EP; k++)
        hs_json_kv_double(&j, hs_plan_comm_name((hs_plan_comm)k), r->exposed_s[k], 6);
    hs_json_end_object(&j);
    if (t->pp) hs_json_kv_double(&j, "bubble", r->bubble, 4);
    hs_json_kv_int(&j, "peak_device_bytes", r->peak_device_bytes);
    hs_json_kv_int(&j, "peak_host_bytes", r->peak_host_bytes);
    if (r->has_val) hs_json_kv_double(&j, "val_loss", r->val_loss, 9);
    if (r->expert_tokens) { /* [layer][expert]: the load balance, to plot */
        hs_json_key(&j, "expert_tokens");
        hs_json_begin_array(&j);
        for (int l = 0; l < r->expert_layers; l++) {
            hs_json_begin_array(&j);
            for (int x = 0; x < r->n_experts; x++)
                hs_json_int(&j, (int64_t)r->expert_tokens[l * r->n_experts + x]);
            hs_json_end_array(&j);
        }
        hs_json_end_array(&j);
    }
    hs_json_end_object(&j);
    fputc('\n', t->metrics);
    /* Every write of the line lands in the stream's error flag; the flush
     * makes the line reach the file now. */
    if (fflush(t->metrics) != 0 || ferror(t->metrics))
        hs_metrics_lost(t, &t->metrics, t->metrics_path, t->metrics_good, errno, r->step);
    else t->metrics_good = hs_metrics_offset(t->metrics);
}

/* The step to metrics.jsonl and the events file, each on its own: one
 * that stopped taking writes leaves the other going. */
void hs_metrics_write(hs_trainer *t, const hs_step_result *r) {
    if (t->metrics) write_line(t, r);
    hs_tb_step(t, r, r->step_time_s > 0 ? r->tokens / r->step_time_s : 0, step_mfu(t, r));
}

static void format_eta(double s, char *buf, size_t cap) {
    long v = s > 0 ? (long)(s + 0.5) : 0;
    if (v >= 3600) snprintf(buf, cap, "%ldh%02ldm", v / 3600, v / 60 % 60);
    else snprintf(buf, cap, "%ldm%02lds", v / 60, v % 60);
}

void hs_metrics_log(hs_trainer *t, const hs_step_result *r) {
    int steps = t->cfg->train.steps;
    bool due = r->step % t->cfg->train.log_every == 0 || r->step == 1 || r->step == steps;
    if (!due && !r->has_val) return;
    double elapsed = hs_now() - t->t_start;
    char eta[32], val[48] = "";
    format_eta(elapsed / (r->step - t->start_step) * (steps - r->step), eta, sizeof eta);
    if (r->has_val) snprintf(val, sizeof val, " | val %.4f", r->val_loss);
    hs_log_info(t->log,
                "step %*d/%d | loss %.4f%s | grad %.3f | lr %.2e | %.1fk tok/s | mfu %.1f%% | "
                "mem %.1f MiB | eta %s",
                (int)snprintf(NULL, 0, "%d", steps), r->step, steps, r->loss, val, r->grad_norm,
                r->lr, r->tokens / r->step_time_s / 1e3, 100.0 * step_mfu(t, r),
                (double)r->peak_device_bytes / (1 << 20), eta);
}

void hs_metrics_close(hs_trainer *t) {
    hs_error fe;
    if (t->metrics && hs_fclose_written(t->metrics, t->metrics_path, NULL, &fe) != HS_OK)
        hs_log_warn(t->log, "%s", fe.msg);
    t->metrics = NULL;
    hs_tb_close(t);
}
