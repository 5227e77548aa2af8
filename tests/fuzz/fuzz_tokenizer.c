/* libFuzzer target for tokenizer.json (bpe.c).
 *
 * Input: tokenizer.json text, optionally followed by a NUL byte and a short
 * text to encode (a fixed sentence otherwise). Every input must load or fail
 * with a message; one that loads must encode the text without fault, give
 * ids inside its vocabulary, and decode every id it gave (and a few it did
 * not) into the buffer it was handed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

#define TEXT_MAX 64

static void exercise(const hs_bpe *b, const char *text) {
    int32_t *ids = NULL;
    int n = 0;
    hs_error e;
    int vocab = hs_bpe_vocab_size(b);
    if (hs_bpe_encode(b, text, &ids, &n, &e) == HS_OK) {
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= vocab) {
                fprintf(stderr, "encode gave id %d outside the vocabulary of %d\n", ids[i], vocab);
                abort();
            }
    }
    char out[16];
    for (int i = 0; i < n; i++) {
        int k = hs_bpe_decode(b, ids[i], out, (int)sizeof out);
        if (k < 0 || k > (int)sizeof out) abort();
    }
    const int32_t others[] = {-1, 0, vocab - 1, vocab, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        int k = hs_bpe_decode(b, others[i], out, 4);
        if (k < 0 || k > 4) abort();
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t json_len = strnlen((const char *)data, size);
    char text[TEXT_MAX + 1] = "the cat's 12345 ok\n  \xc3\xa9t\xc3\xa9!";
    if (json_len + 1 < size) {
        size_t n = size - json_len - 1 < TEXT_MAX ? size - json_len - 1 : TEXT_MAX;
        memcpy(text, data + json_len + 1, n);
        text[n] = '\0';
    }
    hs_bpe *b = NULL;
    hs_error e;
    if (hs_bpe_load_text("fuzz.json", (const char *)data, json_len, &b, &e) == HS_OK) {
        exercise(b, text);
    } else if (!strstr(e.msg, "fuzz.json")) {
        fprintf(stderr, "the refusal does not name the file: %s\n", e.msg);
        abort();
    }
    hs_bpe_free(b);
    return 0;
}
