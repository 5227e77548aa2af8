/* libFuzzer target for Megatron-LM indexed datasets (indexed.c).
 *
 * Input: a uint32 length L (little-endian), then L bytes of PREFIX.idx,
 * then the bytes of PREFIX.bin (L is cut to what there is). Each part is
 * copied into its own allocation, so a read past either is seen. Every
 * input must parse or fail with a message naming the prefix; one that
 * parses must read its whole packed stream, from any start, as ids below
 * the vocabulary (an EOS between documents included). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

#define VOCAB 1000
#define EOS 7

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    uint32_t L;
    memcpy(&L, data, 4);
    size_t idx_len = L < size - 4 ? L : size - 4, bin_len = size - 4 - idx_len;
    uint8_t *idx = malloc(idx_len ? idx_len : 1), *bin = malloc(bin_len ? bin_len : 1);
    if (!idx || !bin) abort();
    memcpy(idx, data + 4, idx_len);
    memcpy(bin, data + 4 + idx_len, bin_len);
    hs_indexed *ix = NULL;
    hs_error e;
    if (hs_indexed_parse("fuzz", idx, idx_len, bin, bin_len, VOCAB, EOS, &ix, &e) == HS_OK) {
        int64_t n = hs_indexed_num_tokens(ix);
        int32_t buf[64];
        for (int64_t pos = 0; pos < n; pos += 61) {
            int64_t k = n - pos < 64 ? n - pos : 64;
            hs_indexed_read(ix, pos, k, buf);
            for (int64_t i = 0; i < k; i++)
                if (buf[i] < 0 || buf[i] >= VOCAB) {
                    fprintf(stderr, "token %d at %lld is outside [0, %d)\n", buf[i],
                            (long long)(pos + i), VOCAB);
                    abort();
                }
        }
        hs_indexed_free(ix);
    } else if (!strstr(e.msg, "fuzz") || ix) {
        fprintf(stderr, "the refusal does not name the dataset or leaves a reader: %s\n", e.msg);
        abort();
    }
    free(idx);
    free(bin);
    return 0;
}
