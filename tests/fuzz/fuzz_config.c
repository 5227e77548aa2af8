/* libFuzzer target for the configuration layer.
 *
 * Input: YAML text, optionally followed by a NUL byte and override lines
 * ("a.b.c=value", one per line). Every input must load or fail cleanly, with
 * no crash, leak or sanitizer report. A config that loads is also validated
 * (world size taken from the input length), checked against a fixed list of
 * parameter FQNs, and must survive the round trip dump -> load -> dump
 * unchanged; a difference aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "hypershard/config.h"

#define MAX_OVERRIDES 16

static char *dump_text(const hs_config *c, const hs_topology *t, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) abort();
    hs_config_dump(c, t, f, NULL);
    fclose(f);
    return buf;
}

static void round_trip(const hs_config *c) {
    size_t n1, n2;
    char *first = dump_text(c, NULL, &n1);
    hs_config again;
    hs_error e;
    if (hs_config_load_text(&again, first, n1, "dump", NULL, 0, &e) != HS_OK) {
        fprintf(stderr, "resolved dump does not load back:\n%s\n---\n%s\n", e.msg, first);
        abort();
    }
    char *second = dump_text(&again, NULL, &n2);
    if (n1 != n2 || memcmp(first, second, n1)) {
        fprintf(stderr, "dump -> load -> dump differs:\n%s\n---\n%s\n", first, second);
        abort();
    }
    free(first);
    free(second);
    hs_config_free(&again);
}

static void validate(const hs_config *c, size_t size) {
    hs_log log;
    hs_log_init(&log, 0, 1);
    log.level = HS_LOG_ERROR; /* warnings are built but not printed */
    hs_topology topo;
    hs_error e;
    if (hs_config_validate(c, 1 + (int)(size % 8), &topo, &log, &e) == HS_OK) {
        size_t n;
        free(dump_text(c, &topo, &n));
    }
    static const char *const fqns[] = {"model.embed_tokens.weight", "model.norm.weight",
                                       "lm_head.weight", "model.layers.0.mlp.down_proj.weight"};
    hs_error_clear(&e);
    hs_config_check_fqns(&c->fsdp, fqns, 4, &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    size_t yaml_len = strnlen(text, size);
    const char *ov[MAX_OVERRIDES];
    int n_ov = 0;
    if (yaml_len < size) {
        for (char *line = text + yaml_len + 1; line < text + size && n_ov < MAX_OVERRIDES;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            ov[n_ov++] = line;
            if (!nl) break;
            line = nl + 1;
        }
    }
    hs_config c;
    hs_error e;
    if (hs_config_load_text(&c, text, yaml_len, "fuzz.yaml", ov, n_ov, &e) == HS_OK) {
        round_trip(&c);
        validate(&c, size);
    }
    hs_config_free(&c);
    free(text);
    return 0;
}
