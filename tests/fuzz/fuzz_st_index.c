/* libFuzzer target for sharded weights' model.safetensors.index.json
 * (st_shards.c).
 *
 * Input: the index's text, in a directory that holds two shards, a (x, y)
 * and b (z). Every input must open or fail with a message naming the
 * index; one that opens must hold every tensor of the shards its weight_map
 * names, each once and findable by name, and no other. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/ckpt.h"

static char dir[64];

static void shard(const char *name, const char *const *tensors, int n) {
    static const float values[4] = {1, 2, 3, 4};
    hs_st_tensor t[2];
    memset(t, 0, sizeof t);
    for (int i = 0; i < n; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%s", tensors[i]);
        t[i].dtype = HS_DTYPE_F32;
        t[i].ndim = 1;
        t[i].shape[0] = 4;
        t[i].data = values;
        t[i].bytes = sizeof values;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    hs_error e;
    if (hs_safetensors_write(path, t, n, NULL, 0, &e) != HS_OK) abort();
}

static void setup(void) {
    if (dir[0]) return;
    snprintf(dir, sizeof dir, "/tmp/hs_fuzz_index_XXXXXX");
    if (!mkdtemp(dir)) abort();
    shard("a.safetensors", (const char *const[]){"x", "y"}, 2);
    shard("b.safetensors", (const char *const[]){"z"}, 1);
}

static void check(const hs_st_file *f) {
    int n = hs_safetensors_count(f);
    if (n < 1 || n > 3) abort();
    for (int i = 0; i < n; i++) {
        const hs_st_tensor *t = hs_safetensors_tensor(f, i);
        bool known = !strcmp(t->name, "x") || !strcmp(t->name, "y") || !strcmp(t->name, "z");
        if (!known || hs_safetensors_find(f, t->name) != t || t->bytes != 4 * sizeof(float)) {
            fprintf(stderr, "tensor %d (%s) is not one of the shards'\n", i, t->name);
            abort();
        }
        float out[4];
        hs_st_to_f32(t, out);
        if (out[3] != 4.0f) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, size, fp) != size || fclose(fp) != 0) abort();
    hs_st_file *f = NULL;
    hs_error e;
    if (hs_safetensors_open_dir(dir, &f, &e) == HS_OK) {
        check(f);
        hs_safetensors_close(f);
    } else if (!strstr(e.msg, dir)) {
        fprintf(stderr, "the refusal does not name the directory: %s\n", e.msg);
        abort();
    }
    unlink(path);
    return 0;
}
