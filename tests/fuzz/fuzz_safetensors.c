/* libFuzzer target for the safetensors reader (safetensors.c).
 *
 * Input: a whole .safetensors file. Every input must open or fail with a
 * message naming the file; one that opens must hand out tensors that lie
 * inside the data it holds (converted to fp32 in full, so ASan sees any
 * byte outside), findable by name, and sharing no bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/ckpt.h"

static void exercise(const hs_st_file *f, size_t size) {
    size_t total = 0;
    for (int i = 0; i < hs_safetensors_count(f); i++) {
        const hs_st_tensor *t = hs_safetensors_tensor(f, i);
        if (hs_safetensors_find(f, t->name) != t) {
            fprintf(stderr, "tensor %s is not found by its name\n", t->name);
            abort();
        }
        int64_t n = hs_st_numel(t);
        if (n < 0 || (size_t)n * hs_dtype_size(t->dtype) != t->bytes) abort();
        total += t->bytes;
        float *out = malloc(sizeof(float) * (size_t)(n ? n : 1));
        if (!out) abort();
        hs_st_to_f32(t, out);
        free(out);
    }
    if (total > size) {
        fprintf(stderr, "tensors of %zu bytes in a %zu-byte file: some share bytes\n", total, size);
        abort();
    }
    (void)hs_safetensors_meta(f, "format");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hs_st_file *f = NULL;
    hs_error e;
    if (hs_safetensors_open_mem("fuzz.safetensors", data, size, &f, &e) == HS_OK) {
        exercise(f, size);
    } else if (!strstr(e.msg, "fuzz.safetensors")) {
        fprintf(stderr, "the refusal does not name the file: %s\n", e.msg);
        abort();
    }
    hs_safetensors_close(f);
    return 0;
}
