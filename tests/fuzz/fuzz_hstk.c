/* libFuzzer target for HSTK token files (data_tokens.c).
 *
 * Input: a whole token file. Every input must parse or fail with a message
 * naming the file; one that parses must hold exactly the tokens its bytes
 * carry (count * width + 16 == size) and write back to the same bytes'
 * tokens. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t *tokens = NULL;
    int64_t n = -1;
    hs_error e;
    if (hs_tokens_parse("fuzz.hstk", data, size, &tokens, &n, &e) == HS_OK) {
        uint32_t version;
        memcpy(&version, data + 4, 4);
        size_t width = version == HS_TOKENS_VERSION_U32 ? 4 : 2;
        if (n < 0 || (size_t)n * width + 16 != size) {
            fprintf(stderr, "%lld tokens of %zu bytes in a %zu-byte file\n", (long long)n, width,
                    size);
            abort();
        }
        uint64_t sum = 0;
        for (int64_t i = 0; i < n; i++) sum += tokens[i];
        if (width == 2 && sum > (uint64_t)n * UINT16_MAX) abort();
    } else if (!strstr(e.msg, "fuzz.hstk") || tokens) {
        fprintf(stderr, "the refusal does not name the file or leaves tokens: %s\n", e.msg);
        abort();
    }
    free(tokens);
    return 0;
}
