/* `hypershard bench step --breakdown`: which layer each GEMM belongs to,
 * and the per-class table of a step. The device profile times every call
 * into the device (src/device/profile.c); this file names the GEMMs by the
 * parameter they read (forward and input gradient: B is the weight) or
 * write (weight gradient: C is its gradient), and prints the classes'
 * time per step, their share of the profiled step, their rate, and
 * "other": the step's wall time outside every timed call (the host's own
 * work between calls: the model's bookkeeping, the optimizer's loop over
 * parameters, the hooks). */
#include <stdlib.h>
#include <string.h>

#include "bench_breakdown.h"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static hs_prof_class param_class(const hs_param *p) {
    static const struct {
        const char *suffix;
        hs_prof_class c;
    } names[] = {
        {"q_proj.weight", HS_PROF_GEMM_QKV},        {"k_proj.weight", HS_PROF_GEMM_QKV},
        {"v_proj.weight", HS_PROF_GEMM_QKV},        {"o_proj.weight", HS_PROF_GEMM_O},
        {"gate_proj.weight", HS_PROF_GEMM_GATE_UP}, {"up_proj.weight", HS_PROF_GEMM_GATE_UP},
        {"down_proj.weight", HS_PROF_GEMM_DOWN}};
    if (p->kind == HS_PARAM_LM_HEAD || p->kind == HS_PARAM_EMBEDDING) return HS_PROF_GEMM_HEAD;
    if (p->kind != HS_PARAM_LINEAR) return HS_PROF_GEMM_OTHER;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (ends_with(p->fqn, names[i].suffix)) return names[i].c;
    return HS_PROF_GEMM_OTHER;
}

/* The pointers are read at each call: FSDP moves a parameter's unsharded
 * data and gradient between steps. */
static hs_prof_class label_gemm(void *ctx, const void *C, const void *A, const void *B,
                                const hs_gemm_shape *g) {
    const hs_bench_labels *l = ctx;
    (void)A, (void)g;
    for (int i = 0; i < l->n; i++) {
        const hs_param *p = hs_model_param(l->m, i);
        if ((p->data && B == p->data) || (p->grad && C == p->grad)) return l->cls[i];
    }
    return HS_PROF_GEMM_OTHER;
}

hs_status hs_bench_labels_set(hs_bench_labels *l, hs_device *d, hs_model *m, hs_error *e) {
    l->m = m;
    l->n = hs_model_num_params(m);
    l->cls = malloc((size_t)(l->n + 1) * sizeof *l->cls);
    if (!l->cls) return hs_error_oom(e, "bench step: the GEMM labels of %d parameters", l->n);
    for (int i = 0; i < l->n; i++) l->cls[i] = param_class(hs_model_param(m, i));
    hs_device_profile_set_labeller(d, label_gemm, l);
    return HS_OK;
}

void hs_bench_labels_free(hs_bench_labels *l) {
    free(l->cls);
    l->cls = NULL;
}

static double classes_seconds(const hs_prof_stats *st) {
    double s = 0.0;
    for (int c = 0; c < HS_PROF_CLASS_COUNT; c++) s += st->c[c].seconds;
    return s;
}

double hs_bench_breakdown_other(const hs_bench_breakdown *b) {
    return b->profiled_s - classes_seconds(&b->st) / b->steps;
}

/* Shown: every class that ran, and comm waits always (zero on one process). */
static bool shown(const hs_prof_entry *x, int c) { return x->calls > 0 || c == HS_PROF_COMM_WAIT; }

/* GFLOP/s for the GEMMs and attention, GB/s for the others; 0 unknown. */
static double rate(const hs_prof_entry *x, int c, bool *flops) {
    *flops = hs_prof_class_flops((hs_prof_class)c);
    double work = *flops ? x->flops : x->bytes;
    return x->seconds > 0 ? work / x->seconds / 1e9 : 0.0;
}

void hs_bench_breakdown_print(FILE *f, const char *name, const hs_bench_breakdown *b) {
    double n = b->steps, step = b->profiled_s, other = hs_bench_breakdown_other(b);
    fprintf(f,
            "breakdown %s: means of %d profiled steps, each right after a plain one\n"
            "  %-14s %9s %7s %8s %s\n",
            name, b->steps, "class", "ms/step", "share", "calls", "rate");
    double sum = 0.0;
    for (int c = 0; c < HS_PROF_CLASS_COUNT; c++) {
        const hs_prof_entry *x = &b->st.c[c];
        if (!shown(x, c)) continue;
        bool flops;
        double r = rate(x, c, &flops), ms = 1e3 * x->seconds / n;
        sum += ms;
        fprintf(f, "  %-14s %9.3f %6.1f%% %8.0f ", hs_prof_class_name((hs_prof_class)c), ms,
                100.0 * x->seconds / n / step, (double)x->calls / n);
        if (x->calls == 0 || c == HS_PROF_COMM_WAIT) fprintf(f, "-\n"); /* waits move no bytes */
        else fprintf(f, "%.1f %s\n", r, flops ? "GFLOP/s" : "GB/s");
    }
    fprintf(f, "  %-14s %9.3f %6.1f%%          host time between the device's calls\n", "other",
            1e3 * other, 100.0 * other / step);
    fprintf(f, "  %-14s %9.3f %6.1f%%          classes %.3f ms + other\n", "profiled step",
            1e3 * step, 100.0 * (sum / 1e3 + other) / step, sum);
    fprintf(f, "  %-14s %9.3f %+6.1f%%          the profiled step against it\n", "plain step",
            1e3 * b->plain_s, 100.0 * (step / b->plain_s - 1.0));
    fprintf(f, "  fastest steps: profiled %.3f ms, plain %.3f ms (%+.1f%%)\n",
            1e3 * b->profiled_best, 1e3 * b->plain_best,
            100.0 * (b->profiled_best / b->plain_best - 1.0));
    if (b->st.untimed_calls)
        fprintf(f, "  %lld calls from other threads were not timed (they overlap the step)\n",
                (long long)b->st.untimed_calls);
}

void hs_bench_breakdown_json(FILE *f, const hs_bench_breakdown *b) {
    double n = b->steps;
    fprintf(f,
            "{\"steps\":%d,\"plain_step_ms\":%.6f,\"profiled_step_ms\":%.6f,"
            "\"plain_best_ms\":%.6f,\"profiled_best_ms\":%.6f,\"other_ms\":%.6f,"
            "\"untimed_calls\":%lld,\"classes\":[",
            b->steps, 1e3 * b->plain_s, 1e3 * b->profiled_s, 1e3 * b->plain_best,
            1e3 * b->profiled_best, 1e3 * hs_bench_breakdown_other(b),
            (long long)b->st.untimed_calls);
    bool first = true;
    for (int c = 0; c < HS_PROF_CLASS_COUNT; c++) {
        const hs_prof_entry *x = &b->st.c[c];
        if (!shown(x, c)) continue;
        bool flops;
        double r = rate(x, c, &flops);
        fprintf(f, "%s{\"class\":\"%s\",\"ms\":%.6f,\"share\":%.6f,\"calls\":%.1f,\"%s\":%.3f}",
                first ? "" : ",", hs_prof_class_name((hs_prof_class)c), 1e3 * x->seconds / n,
                x->seconds / n / b->profiled_s, (double)x->calls / n, flops ? "gflop_s" : "gb_s",
                r);
        first = false;
    }
    fprintf(f, "]}");
}
