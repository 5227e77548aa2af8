/* The cuda backend's token embedding entries over the launchers of
 * cuda_embedding.cu: the gather, and the scatter-add with its sort's
 * scratch taken and given back on the entry's stream. */
#include "device/cuda.h"
#include "device/cuda_embedding_launch.h"

void hs_cuda_embedding_fwd(hs_stream *s, void *out, hs_dtype odt, const int32_t *tokens,
                           const void *wte, hs_dtype dt, int64_t N, int C, int64_t v0, int V) {
    hs_cuda_check(
        s, hs_cu_embedding_fwd(hs_cuda_stream(s), out, (int)odt, tokens, wte, (int)dt, N, C, v0, V),
        "embedding_fwd");
}

/* Without scratch nothing is written (the failure is on the device). A
 * token count past what the sort takes has no scratch size, and the
 * launcher refuses it. */
void hs_cuda_embedding_bwd(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                           const int32_t *tokens, int64_t N, int C, int64_t v0, int V) {
    if (dwte == NULL || N <= 0 || C <= 0 || V <= 0) return; /* frozen, or nothing to add */
    cudaStream_t st = hs_cuda_stream(s);
    size_t bytes = hs_cu_embedding_bwd_scratch(N, V);
    void *scratch = bytes ? hs_cuda_scratch(s, bytes, "embedding_bwd's sort by row") : NULL;
    if (bytes && scratch == NULL) return;
    hs_cuda_check(
        s, hs_cu_embedding_bwd(st, scratch, bytes, dwte, (int)gdt, dout, tokens, N, C, v0, V),
        "embedding_bwd");
    hs_cuda_scratch_free(s, scratch);
}
