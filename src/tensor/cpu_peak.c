/* tensor/cpu_peak.c — the nominal peak of this CPU's cores: clock x FLOPs
 * per cycle of the instruction set the GEMMs run at (the tier of
 * cpu_isa.c) and the dtype they multiply in, the MFU denominator.
 *
 * FLOPs per cycle and core, from the vendors' published widths (two FMA
 * pipes on every core named here; an FMA is 2 FLOPs):
 *   fp32, AVX2 (256-bit):                    2 x 8 x 2  = 32
 *   fp32, AVX-512 on Intel (two 512-bit):    2 x 16 x 2 = 64
 *   fp32, AVX-512 on AMD Zen 4 (512-bit ops on 256-bit pipes): 32
 *   fp32, AVX-512 on AMD Zen 5 and later:    64
 *   bf16, AVX512-BF16 (VDPBF16PS: 2 products per fp32 lane): twice fp32
 *   bf16, AMX (Sapphire Rapids and later):   1024
 * The clock is the highest the system states (cpufreq's maximum, the
 * model name's "@ x.xxGHz", the highest "cpu MHz"): a peak taken at a
 * lower clock than the cores reach would let MFU pass 100%. */
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/tensor.h"

typedef struct cpu_facts {
    char vendor[16];
    int family;
    double mhz;         /* highest clock stated */
    const char *source; /* where mhz came from */
    int logical, physical;
} cpu_facts;

static double cpufreq_max_mhz(void) {
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    if (!f) return 0.0;
    long long khz = 0;
    if (fscanf(f, "%lld", &khz) != 1) khz = 0;
    fclose(f);
    return (double)khz / 1000.0;
}

static void read_cpuinfo(cpu_facts *c) {
    c->mhz = cpufreq_max_mhz();
    c->source = "cpufreq's maximum";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    double named = 0.0, stated = 0.0;
    int siblings = 0, cores = 0;
    while (fgets(line, sizeof line, f)) {
        double v;
        int n;
        const char *at;
        if (sscanf(line, "vendor_id : %15s", c->vendor) == 1) continue;
        if (sscanf(line, "cpu family : %d", &n) == 1) c->family = n;
        else if (sscanf(line, "cpu MHz : %lf", &v) == 1 && v > stated) stated = v;
        else if (sscanf(line, "siblings : %d", &n) == 1 && !siblings) siblings = n;
        else if (sscanf(line, "cpu cores : %d", &n) == 1 && !cores) cores = n;
        else if (!strncmp(line, "model name", 10) && (at = strstr(line, "@ ")) &&
                 sscanf(at, "@ %lfGHz", &v) == 1 && v * 1000.0 > named)
            named = v * 1000.0;
    }
    fclose(f);
    if (c->mhz <= 0.0 && named > 0.0) c->mhz = named, c->source = "the model name";
    if (c->mhz <= 0.0 && stated > 0.0) c->mhz = stated, c->source = "/proc/cpuinfo's cpu MHz";
    /* SMT: logical CPUs share a core's FMA pipes */
    if (siblings > 0 && cores > 0 && siblings >= cores)
        c->physical = (int)((long long)c->logical * cores / siblings);
}

static int fp32_per_cycle(const cpu_facts *c, dnnl_cpu_isa_t isa) {
    const dnnl_cpu_isa_t avx512 = dnnl_cpu_isa_avx512_core;
    if ((isa & avx512) != avx512) return 32;
    if (!strcmp(c->vendor, "AuthenticAMD") && c->family <= 25) return 32; /* Zen 4 */
    return 64;
}

hs_cpu_peak hs_cpu_nominal_peak(hs_dtype dt) {
    cpu_facts c = {.logical = (int)sysconf(_SC_NPROCESSORS_ONLN)};
    c.physical = c.logical;
    read_cpuinfo(&c);
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const dnnl_cpu_isa_t bf16 = dnnl_cpu_isa_avx512_core_bf16, amx = dnnl_cpu_isa_avx512_core_amx;
    hs_cpu_peak p = {.ghz = c.mhz / 1000.0,
                     .cores = c.physical > 0 ? c.physical : 1,
                     .clock_source = c.source,
                     .isa = hs_gemm_isa(),
                     .dtype = HS_DTYPE_F32};
    p.flops_per_cycle = fp32_per_cycle(&c, isa);
    /* 16-bit products only where the GEMM multiplies them natively (else
     * it widens them and runs sgemm: the fp32 peak is the one it can reach) */
    if (dt == HS_DTYPE_BF16 && hs_gemm16_native(dt)) {
        p.dtype = dt;
        if ((isa & amx) == amx) p.flops_per_cycle = 1024;
        else if ((isa & bf16) == bf16) p.flops_per_cycle *= 2;
    } else if (dt == HS_DTYPE_F16 && hs_gemm16_native(dt)) {
        /* fp16 matmuls widen to fp32 FMAs on these tiers (AMX-FP16 aside) */
        p.dtype = dt;
    }
    p.flops_per_core = p.ghz * 1e9 * p.flops_per_cycle;
    return p;
}
