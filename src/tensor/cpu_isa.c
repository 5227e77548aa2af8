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
 * variable puts the whole process on one tier. hs_gemm16_native says which
 * engine multiplies 16-bit operands at that tier (HS_CPU_GEMM16). */
#include <cpuid.h>
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

/* HS_CPU_GEMM16: -1 unset or auto, 0 widened, 1 native, -2 anything else. */
static int gemm16_forced(void) {
    const char *v = getenv("HS_CPU_GEMM16");
    if (!v || !v[0] || !strcmp(v, "auto")) return -1;
    if (!strcmp(v, "widened")) return 0;
    if (!strcmp(v, "native")) return 1;
    return -2;
}

/* CPUID's vendor is AMD's. */
static bool cpu_is_amd(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "AuthenticAMD" */
}

bool hs_gemm16_native(hs_dtype dt) {
    if (dt == HS_DTYPE_F32) return false;
    int forced = gemm16_forced();
    if (forced == 0) return false;
    if (forced < 0 && dt == HS_DTYPE_BF16) {
        const dnnl_cpu_isa_t amx = dnnl_cpu_isa_avx512_core_amx,
                             bf16 = dnnl_cpu_isa_avx512_core_bf16;
        dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
        bool faster = (isa & amx) == amx || ((isa & bf16) == bf16 && cpu_is_amd());
        if (!faster) return false;
    }
    return hs_gemm_native(dt, HS_DTYPE_F32);
}

hs_status hs_cpu_isa_apply(hs_error *e) {
    if (gemm16_forced() == -2)
        return hs_error_set(e, HS_ERR_USAGE,
                            "HS_CPU_GEMM16 = '%s': want native (oneDNN's 16-bit matmul wherever it "
                            "has one), widened (16-bit operands widened to fp32, one sgemm) or "
                            "auto (the faster one on this CPU; also when unset)",
                            getenv("HS_CPU_GEMM16"));
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

bool hs_cpu_wide_vectors(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    const dnnl_cpu_isa_t want = dnnl_cpu_isa_avx512_core;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           (dnnl_get_effective_cpu_isa() & want) == want;
#else
    return false;
#endif
}

bool hs_cpu_isa_allows(hs_convert_path p) {
    if (p != HS_CONVERT_AVX512) return true;
    const dnnl_cpu_isa_t want = dnnl_cpu_isa_avx512_core_bf16;
    return (dnnl_get_effective_cpu_isa() & want) == want;
}
