/* tensor/cpu_isa.c — the CPU tier a process runs at.
 *
 * The binary targets x86-64-v3 (AVX2, FMA, F16C) and takes faster code at
 * run time where the CPU has it: oneDNN's kernels (AVX-512, AVX512-BF16,
 * AMX) and hs_convert's AVX512-BF16 loops. HS_CPU_ISA caps both at a named
 * tier, so one machine runs the code paths of a lower one (the tests run
 * the parity-critical cases at the AVX2 tier on AVX-512 machines too).
 * hs_cpu_isa_apply hands the cap to oneDNN before its first kernel
 * (dnnl_set_max_cpu_isa, the cap oneDNN's own ONEDNN_MAX_CPU_ISA sets),
 * and hypershard's own dispatch follows oneDNN's effective ISA, so either
 * variable puts the whole process on one tier. */
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/convert_kernels.h"

typedef struct tier {
    const char *name;
    dnnl_cpu_isa_t isa;
} tier;

static const tier tiers[] = {
    {"avx2", dnnl_cpu_isa_avx2},
    {"avx512", dnnl_cpu_isa_avx512_core},
    {"avx512_bf16", dnnl_cpu_isa_avx512_core_bf16},
    {"amx", dnnl_cpu_isa_avx512_core_amx},
    {"native", dnnl_cpu_isa_all},
};

#define NTIERS ((int)(sizeof tiers / sizeof tiers[0]))

hs_status hs_cpu_isa_apply(hs_error *e) {
    const char *v = getenv("HS_CPU_ISA");
    if (!v || !v[0]) return HS_OK;
    for (int i = 0; i < NTIERS; i++) {
        if (strcmp(v, tiers[i].name)) continue;
        if (tiers[i].isa == dnnl_cpu_isa_all) return HS_OK;
        /* A cap below what oneDNN already chose would leave two tiers in
         * one process: refused (it is applied first thing in main). */
        if (dnnl_set_max_cpu_isa(tiers[i].isa) != dnnl_success)
            return hs_error_set(e, HS_ERR_USAGE,
                                "HS_CPU_ISA = '%s' could not be applied: oneDNN has already chosen "
                                "its kernels (ISA %s)",
                                v, hs_gemm_isa());
        return HS_OK;
    }
    return hs_error_set(e, HS_ERR_USAGE,
                        "HS_CPU_ISA = '%s': want avx2, avx512, avx512_bf16, amx or native (the "
                        "highest tier the code may use; unset is native)",
                        v);
}

bool hs_cpu_isa_allows(hs_convert_path p) {
    if (p != HS_CONVERT_AVX512) return true;
    const dnnl_cpu_isa_t want = dnnl_cpu_isa_avx512_core_bf16;
    return (dnnl_get_effective_cpu_isa() & want) == want;
}
