/* The cuda backend's token embedding: a row gather forward and a row
 * scatter-add backward over the vocabulary rows [v0, v0 + V) the table
 * holds.
 *
 * The backward is deterministic and gives the reference's bits: the tokens
 * are sorted by row with a stable radix sort (CUB), so each row's tokens
 * sit together in token order; the first position of each row then adds
 * them in that order, one rounding to the gradient's dtype per addition
 * (hs_acc's), as the reference and cpu backends do. Atomics would add in
 * an order that changes from run to run, and a 16-bit gradient cannot be
 * added to atomically with one rounding per addition anyway. A row's
 * additions are a serial chain per column: a token that repeats k times
 * costs k dependent adds. */
#include <cub/device/device_radix_sort.cuh>

#include "device/cuda_dtype.cuh"
#include "device/cuda_embedding_launch.h"

/* ---------------------------------------------------------------- forward */

/* One block per token row (grid-stride over rows), its threads over the
 * columns. A 16-bit row into the same dtype is copied as bits. */
template <int DT, int ODT>
static __global__ void gather_rows_kernel(void *out, const int32_t *tokens, const void *wte,
                                          int64_t N, int C, int64_t v0, int V) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        int64_t t = (int64_t)tokens[n] - v0;
        bool held = t >= 0 && t < V;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            int64_t o = n * C + c, w = t * C + c;
            if (!held) hs_cu_st<ODT>(out, o, 0.0f);
            else if (DT == ODT && DT != HS_CU_F32)
                ((uint16_t *)out)[o] = ((const uint16_t *)wte)[w];
            else hs_cu_st<ODT>(out, o, hs_cu_ld<DT>(wte, w));
        }
    }
}

static unsigned row_blocks(int64_t rows) {
    return (unsigned)(rows > HS_CU_MAX_BLOCKS ? HS_CU_MAX_BLOCKS : rows);
}

extern "C" cudaError_t hs_cu_embedding_fwd(cudaStream_t st, void *out, int odt,
                                           const int32_t *tokens, const void *wte, int dt,
                                           int64_t N, int C, int64_t v0, int V) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    return hs_cu_by_dtype(dt, [&](auto d) {
        return hs_cu_by_dtype(odt, [&](auto o) {
            gather_rows_kernel<decltype(d)::value, decltype(o)::value>
                <<<row_blocks(N), HS_CU_THREADS, 0, st>>>(out, tokens, wte, N, C, v0, V);
            return cudaGetLastError();
        });
    });
}

/* --------------------------------------------------------------- backward */

/* The scratch: keys (each token's row, V where the table does not hold it)
 * and positions (token indices), before and after the sort, then CUB's
 * own temporary storage. */
typedef struct sort_space {
    uint32_t *key_in, *key, *pos_in, *pos;
    void *temp;
    size_t temp_bytes;
} sort_space;

#define SCRATCH_ALIGN 256

static size_t aligned(size_t bytes) {
    return (bytes + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/* Bits that hold every key 0..V. */
static int key_bits(int V) {
    int bits = 1;
    while (bits < 32 && ((uint64_t)1 << bits) <= (uint64_t)V) bits++;
    return bits;
}

static cudaError_t sort_temp_bytes(int64_t N, int V, size_t *bytes) {
    *bytes = 0;
    return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, (const uint32_t *)nullptr,
                                           (uint32_t *)nullptr, (const uint32_t *)nullptr,
                                           (uint32_t *)nullptr, (int)N, 0, key_bits(V));
}

/* Carves `scratch` into the arrays; false when it is too small. */
static bool sort_space_of(void *scratch, size_t bytes, int64_t N, int V, sort_space *s) {
    size_t arr = aligned((size_t)N * sizeof(uint32_t));
    char *p = (char *)scratch;
    if (sort_temp_bytes(N, V, &s->temp_bytes) != cudaSuccess) return false;
    if (bytes < 4 * arr + s->temp_bytes) return false;
    s->key_in = (uint32_t *)p, s->key = (uint32_t *)(p + arr);
    s->pos_in = (uint32_t *)(p + 2 * arr), s->pos = (uint32_t *)(p + 3 * arr);
    s->temp = p + 4 * arr;
    return true;
}

extern "C" size_t hs_cu_embedding_bwd_scratch(int64_t N, int V) {
    size_t temp = 0;
    if (N <= 0 || N > INT32_MAX || sort_temp_bytes(N, V, &temp) != cudaSuccess) return 0;
    return 4 * aligned((size_t)N * sizeof(uint32_t)) + temp;
}

static __global__ void row_keys_kernel(uint32_t *key, uint32_t *pos, const int32_t *tokens,
                                       int64_t N, int64_t v0, int V) {
    for (int64_t i = hs_cu_first(); i < N; i += hs_cu_stride()) {
        int64_t t = (int64_t)tokens[i] - v0;
        key[i] = t >= 0 && t < V ? (uint32_t)t : (uint32_t)V;
        pos[i] = (uint32_t)i;
    }
}

/* One block per sorted position (grid-stride); the block at the first
 * position of a held row adds all of that row's tokens, in token order,
 * each column by one thread; the other blocks have nothing to do. */
template <int GDT>
static __global__ void scatter_rows_kernel(void *dwte, const float *dout, const uint32_t *key,
                                           const uint32_t *pos, int64_t N, int C, uint32_t V) {
    for (int64_t j = blockIdx.x; j < N; j += gridDim.x) {
        uint32_t row = key[j];
        if (row >= V || (j > 0 && key[j - 1] == row)) continue;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            int64_t at = (int64_t)row * C + c;
            float acc = hs_cu_ld<GDT>(dwte, at);
            for (int64_t k = j; k < N && key[k] == row; k++)
                acc = hs_cu_round<GDT>(__fadd_rn(acc, dout[(int64_t)pos[k] * C + c]));
            hs_cu_st<GDT>(dwte, at, acc);
        }
    }
}

extern "C" cudaError_t hs_cu_embedding_bwd(cudaStream_t st, void *scratch, size_t scratch_bytes,
                                           void *dwte, int gdt, const float *dout,
                                           const int32_t *tokens, int64_t N, int C, int64_t v0,
                                           int V) {
    if (N <= 0 || C <= 0 || V <= 0) return cudaSuccess;
    sort_space s;
    if (N > INT32_MAX || !sort_space_of(scratch, scratch_bytes, N, V, &s))
        return cudaErrorInvalidValue;
    row_keys_kernel<<<hs_cu_blocks(N), HS_CU_THREADS, 0, st>>>(s.key_in, s.pos_in, tokens, N, v0,
                                                               V);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    err = cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, s.key_in, s.key, s.pos_in, s.pos,
                                          (int)N, 0, key_bits(V), st);
    if (err != cudaSuccess) return err;
    return hs_cu_by_dtype(gdt, [&](auto g) {
        scatter_rows_kernel<decltype(g)::value>
            <<<row_blocks(N), HS_CU_THREADS, 0, st>>>(dwte, dout, s.key, s.pos, N, C, (uint32_t)V);
        return cudaGetLastError();
    });
}
