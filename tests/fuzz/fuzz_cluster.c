/* libFuzzer target for cluster files (config/cluster.c, `plan --time
 * --cluster`).
 *
 * Input: cluster file text. Every input must read or fail with a message
 * naming the file; one that reads must hold what the time model divides
 * by and scales with: nodes, devices, the fp32 peak, memory and its
 * bandwidth above zero, efficiencies and shares in (0, 1], every link
 * bandwidth it gives above zero; and what hs_cluster_write makes of it
 * must read again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/config.h"

static void check(const hs_cluster *c) {
    bool ok = c->nodes >= 1 && c->devices_per_node >= 1 && c->peak[HS_DTYPE_F32] > 0 &&
              c->memory_bytes > 0 && c->memory_bandwidth > 0 && c->intra.bandwidth > 0 &&
              c->gemm_efficiency > 0 && c->gemm_efficiency <= 1 && c->attention_efficiency > 0 &&
              c->attention_efficiency <= 1 && c->elementwise_efficiency > 0 &&
              c->elementwise_efficiency <= 1 && c->lend >= 0 && c->lend <= 1 && c->overlap >= 0 &&
              c->overlap <= 1 && c->n_gemm <= HS_CLUSTER_TABLE_MAX &&
              (c->nodes == 1 || (c->inter.bandwidth > 0 && c->nics_per_node >= 1));
    for (int i = 0; ok && i < c->n_gemm; i++)
        ok = c->gemm[i].m > 0 && c->gemm[i].n > 0 && c->gemm[i].k > 0 && c->gemm[i].flops > 0;
    for (int i = 0; ok && i < c->intra.n_by_ranks; i++)
        ok = c->intra.by_ranks[i].ranks > 0 && c->intra.by_ranks[i].bandwidth > 0;
    if (!ok) {
        fprintf(stderr, "a cluster file read into an unusable cluster (nodes %d, devices %d)\n",
                c->nodes, c->devices_per_node);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hs_cluster c, again;
    hs_error e;
    if (hs_cluster_parse("fuzz.yaml", (const char *)data, size, &c, &e) != HS_OK) {
        if (!strstr(e.msg, "fuzz.yaml")) {
            fprintf(stderr, "the refusal does not name the file: %s\n", e.msg);
            abort();
        }
        return 0;
    }
    check(&c);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return 0;
    hs_cluster_write(&c, f);
    fclose(f);
    if (hs_cluster_parse("fuzz.yaml", text, len, &again, &e) != HS_OK) {
        fprintf(stderr, "what hs_cluster_write wrote does not read: %s\n%s\n", e.msg, text);
        abort();
    }
    check(&again);
    free(text);
    return 0;
}
