/* Document starts of packed sequences (model.h hs_doc_starts): what
 * document masking's attention reads to keep each token inside its own
 * document. */
#include "model/internal.h"

void hs_doc_starts(int32_t *start, const int32_t *tokens, int n, int T, int32_t eos) {
    for (int b = 0; b < n; b++) {
        const int32_t *tok = tokens + (int64_t)b * T;
        int32_t *st = start + (int64_t)b * T, cur = 0;
        for (int t = 0; t < T; t++) {
            st[t] = cur;
            if (tok[t] == eos) cur = t + 1;
        }
    }
}
