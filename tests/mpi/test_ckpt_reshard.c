/* ckpt/: distributed save and load with resharding (RFC 000 §7.8, §8.4).
 * HS_MPI_RANKS: 1 2 4
 * HS_TEST_TIMEOUT: 120
 *
 * A fixed set of small tensors — uneven dim-0 shapes (10, 5, 3 and 2 rows,
 * so 4 ranks get zero-length shards), float32 / bfloat16 / float16, 1-D to
 * 3-D, a replicated one, and optimizer-state / fp32-main tensors named as
 * the trainer names them — is saved under one layout and loaded under
 * another; every loaded element must equal the saved one bit for bit and
 * the padded tail of the communication storage must be zero.
 *
 * Without arguments (as ctest runs it), on W ranks: FSDP save -> FSDP load;
 * the same checkpoint read as every rank of every world 1..5 would read it;
 * HSDP (2 x W/2) save writes replicas once and loads into FSDP; the data
 * files hold exactly the actual bytes; keep_last pruning, `latest`, saving a
 * step again; mismatched or incomplete tables fail on every rank naming the
 * tensor; a collective load of a missing tensor fails on every rank.
 *
 * With arguments it is the tool tests/cli/test_ckpt_*.sh drive across world
 * sizes:
 *   save DIR STEP LAYOUT    save the tensors for STEP (values depend on it)
 *   load DIR STEP LAYOUT    load DIR (a step dir or a checkpoint.dir) and
 *                           check the values of STEP and state.step == STEP
 *   model DIR REF_DIR       save a tiny Llama model's parameters, FSDP-sharded,
 *                           with its config; rank 0 also writes the same
 *                           weights with hs_hf_save into REF_DIR
 * LAYOUT is fsdp (W shards), hsdp (W/2 shards x 2 replicas) or full (every
 * rank holds whole tensors). Exit 0 and "OK" from rank 0 when all is well. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "mpi_test_util.h"
#include "ckpt/ckpt_internal.h"
#include "hypershard/ckpt.h"
#include "hypershard/fsdp.h"
#include "hypershard/train.h"

typedef struct ctx {
    hs_comm *comm;
    int rank, size;
    int failures;
    char root[128]; /* shared scratch directory */
} ctx;

/* ------------------------------------------------------------ the tensors */

typedef struct spec {
    const char *name;
    hs_dtype dt;
    int ndim;
    int64_t shape[4];
    bool replicated;
} spec;

static const spec specs[] = {
    {"model.embed_tokens.weight", HS_DTYPE_F32, 2, {10, 4}, false},
    {"model.layers.0.self_attn.q_proj.weight", HS_DTYPE_BF16, 2, {5, 3}, false},
    {"model.norm.weight", HS_DTYPE_F32, 1, {3}, false},
    {"model.tiny", HS_DTYPE_F32, 2, {2, 3}, false},
    {"lm_head.weight", HS_DTYPE_F16, 3, {7, 4, 2}, false},
    {"model.replicated.bias", HS_DTYPE_F32, 1, {6}, true},
    {"optim.model.embed_tokens.weight.exp_avg", HS_DTYPE_F32, 2, {10, 4}, false},
    {"optim.model.embed_tokens.weight.exp_avg_sq", HS_DTYPE_F32, 2, {10, 4}, false},
    {"main.model.layers.0.self_attn.q_proj.weight", HS_DTYPE_F32, 2, {5, 3}, false},
    {"optim.model.layers.0.self_attn.q_proj.weight.momentum_buffer",
     HS_DTYPE_F32,
     2,
     {5, 3},
     false},
};
#define N_SPECS ((int)(sizeof specs / sizeof specs[0]))

static int64_t spec_numel(const spec *s) { return hs_ckpt_box_numel(s->ndim, s->shape); }
static int64_t spec_row(const spec *s) { return hs_ckpt_box_numel(s->ndim - 1, s->shape + 1); }

static int64_t actual_bytes(void) {
    int64_t b = 0;
    for (int i = 0; i < N_SPECS; i++)
        b += spec_numel(&specs[i]) * (int64_t)hs_dtype_size(specs[i].dt);
    return b;
}

/* Element g of tensor s in the checkpoint of `step`, as stored bits. */
static void value(const spec *s, int64_t step, int64_t g, void *out) {
    float v = hs_rng_normal((uint64_t)step, hs_hash64(s->name), (uint64_t)g);
    hs_convert(out, s->dt, &v, HS_DTYPE_F32, 1);
}

/* Which dim-0 shard this rank holds under a layout. */
typedef struct layout {
    int w, r;
} layout;

static bool layout_of(const char *name, int rank, int world, layout *l) {
    if (!strcmp(name, "fsdp")) return *l = (layout){world, rank}, true;
    if (!strcmp(name, "full")) return *l = (layout){1, 0}, true;
    if (!strcmp(name, "hsdp") && world % 2 == 0)
        return *l = (layout){world / 2, rank % (world / 2)}, true;
    return false;
}

/* Buffers with the padded row count of the shard (chunk rows), as FSDP's
 * communication storage has; `save` fills the actual rows, a load buffer
 * starts as garbage. */
static void make_tensors(layout l, int64_t step, bool save, hs_ckpt_tensor *t, void **bufs) {
    for (int i = 0; i < N_SPECS; i++) {
        const spec *s = &specs[i];
        layout li = s->replicated ? (layout){1, 0} : l;
        int64_t cap_rows = hs_fsdp_chunk_rows(s->shape[0], li.w);
        size_t es = hs_dtype_size(s->dt);
        bufs[i] = malloc((size_t)(cap_rows * spec_row(s)) * es + 1);
        memset(bufs[i], 0xA5, (size_t)(cap_rows * spec_row(s)) * es + 1);
        hs_ckpt_tensor_dim0(&t[i], s->name, s->dt, s->ndim, s->shape, li.w, li.r, bufs[i]);
        t[i].storage_rows = cap_rows;
        int64_t n = hs_ckpt_tensor_numel(&t[i]), g0 = t[i].offset[0] * spec_row(s);
        for (int64_t k = 0; save && k < n; k++)
            value(s, step, g0 + k, (char *)bufs[i] + (size_t)k * es);
    }
}

static void free_bufs(void **bufs) {
    for (int i = 0; i < N_SPECS; i++) free(bufs[i]);
}

/* Loaded actual rows equal the saved values bitwise; the tail is zero. */
static int check_tensors(const hs_ckpt_tensor *t, int64_t step, const char *what, int rank) {
    int bad = 0;
    for (int i = 0; i < N_SPECS; i++) {
        const spec *s = &specs[i];
        size_t es = hs_dtype_size(s->dt);
        int64_t n = hs_ckpt_tensor_numel(&t[i]), g0 = t[i].offset[0] * spec_row(s);
        int64_t cap = t[i].storage_rows * spec_row(s);
        for (int64_t k = 0; k < cap && bad < 5; k++) {
            unsigned char want[4] = {0}, *got = (unsigned char *)t[i].data + (size_t)k * es;
            if (k < n) value(s, step, g0 + k, want);
            if (memcmp(want, got, es) != 0) {
                fprintf(stderr, "[rank %d] %s: %s element %lld (%s) differs\n", rank, what, s->name,
                        (long long)(g0 + k), k < n ? "loaded" : "padding tail");
                bad++;
            }
        }
    }
    return bad;
}

static hs_status save(ctx *c, const char *dir, int64_t step, layout l, int keep_last, hs_error *e) {
    hs_ckpt_tensor t[N_SPECS];
    void *bufs[N_SPECS];
    make_tensors(l, step, true, t, bufs);
    hs_ckpt_state st = {.step = step,
                        .data_position = step * 4,
                        .optim_step = step,
                        .rng_seed = 0x9e3779b97f4a7c15ull,
                        .rng_counter = (uint64_t)step * 1000,
                        .config_hash = 0xabcdef0123456789ull};
    hs_ckpt_save_options opt = {.dir = dir, .keep_last = keep_last};
    hs_status s = hs_ckpt_save(c->comm, &opt, t, N_SPECS, &st, NULL, 0, e);
    free_bufs(bufs);
    return s;
}

/* Collective load under layout l; returns mismatching elements (or -1). */
static int load_check(ctx *c, const char *path, int64_t step, layout l, const char *what) {
    hs_ckpt_tensor t[N_SPECS];
    void *bufs[N_SPECS];
    make_tensors(l, step, false, t, bufs);
    hs_ckpt_state st;
    hs_error e;
    int bad = -1;
    if (hs_ckpt_load(c->comm, path, t, N_SPECS, &st, &e) != HS_OK)
        fprintf(stderr, "[rank %d] %s: %s\n", c->rank, what, e.msg);
    else if (st.step != step || st.data_position != step * 4 ||
             st.rng_counter != (uint64_t)step * 1000 || st.rng_seed != 0x9e3779b97f4a7c15ull ||
             st.config_hash != 0xabcdef0123456789ull)
        fprintf(stderr, "[rank %d] %s: trainer state differs (step %lld)\n", c->rank, what,
                (long long)st.step);
    else bad = check_tensors(t, step, what, c->rank);
    free_bufs(bufs);
    return bad;
}

/* ------------------------------------------------------------ suite */

static int64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* Data files rank-0.bin .. rank-(n-1).bin exist, no other, and their sizes
 * add up to the actual bytes of all tensors: no padding, no duplicate. */
static void check_files(ctx *c, const char *step_dir, int n_files, const char *what) {
    if (c->rank != 0) return;
    int64_t total = 0;
    char path[300];
    for (int r = 0; r < c->size; r++) {
        snprintf(path, sizeof path, "%s/rank-%d.bin", step_dir, r);
        int64_t b = file_size(path);
        CHECK_COUNT(c, (r < n_files) == (b >= 0), "%s: %s %s", what, path,
                    b >= 0 ? "exists" : "is missing");
        if (b > 0) total += b;
    }
    CHECK_COUNT(c, total == actual_bytes(), "%s: data files hold %lld bytes, the tensors %lld",
                what, (long long)total, (long long)actual_bytes());
}

static void test_fsdp_save_then_fsdp_load_is_bitwise(ctx *c) {
    char dir[200], step[260];
    snprintf(dir, sizeof dir, "%s/fsdp", c->root);
    hs_error e;
    layout l = {c->size, c->rank};
    CHECK_COUNT(c, save(c, dir, 5, l, 2, &e) == HS_OK, "save: %s", e.msg);
    CHECK_COUNT(c, load_check(c, dir, 5, l, "fsdp->fsdp") == 0, "fsdp -> fsdp load differs");
    snprintf(step, sizeof step, "%s/step-5", dir);
    /* the 3-row and 2-row tensors leave ranks >= 3 and >= 2 without data */
    check_files(c, step, c->size, "fsdp files");
}

/* Every rank reads the checkpoint as each rank of worlds 1..5 would. */
static void test_every_rank_of_worlds_1_to_5_reads_its_overlap(ctx *c) {
    char dir[200];
    snprintf(dir, sizeof dir, "%s/fsdp", c->root);
    hs_ckpt *k = NULL;
    hs_error e;
    CHECK_COUNT(c, hs_ckpt_open(dir, &k, &e) == HS_OK, "open: %s", e.msg);
    if (!k) return;
    for (int w = 1; w <= 5; w++)
        for (int v = 0; v < w; v++) {
            hs_ckpt_tensor t[N_SPECS];
            void *bufs[N_SPECS];
            char what[64];
            snprintf(what, sizeof what, "W=%d -> W=%d rank %d", c->size, w, v);
            make_tensors((layout){w, v}, 5, false, t, bufs);
            hs_status s = hs_ckpt_read(k, t, N_SPECS, &e);
            CHECK_COUNT(c, s == HS_OK, "%s: %s", what, e.msg);
            if (s == HS_OK)
                CHECK_COUNT(c, check_tensors(t, 5, what, c->rank) == 0, "%s differs", what);
            free_bufs(bufs);
        }
    hs_ckpt_close(k);
}

static void test_hsdp_replicas_are_written_once_and_load_into_fsdp(ctx *c) {
    if (c->size % 2) return;
    char dir[200], step[260];
    snprintf(dir, sizeof dir, "%s/hsdp", c->root);
    hs_error e;
    layout hsdp;
    layout_of("hsdp", c->rank, c->size, &hsdp);
    CHECK_COUNT(c, save(c, dir, 3, hsdp, 0, &e) == HS_OK, "hsdp save: %s", e.msg);
    snprintf(step, sizeof step, "%s/step-3", dir);
    check_files(c, step, c->size / 2, "hsdp files");
    CHECK_COUNT(c, load_check(c, dir, 3, (layout){c->size, c->rank}, "hsdp->fsdp") == 0,
                "hsdp -> fsdp differs");
    CHECK_COUNT(c, load_check(c, dir, 3, hsdp, "hsdp->hsdp") == 0, "hsdp -> hsdp differs");
}

static bool exists(const char *dir, const char *name) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void test_keep_last_prunes_and_latest_names_the_newest(ctx *c) {
    char dir[200], latest[64];
    snprintf(dir, sizeof dir, "%s/keep", c->root);
    hs_error e;
    layout l = {c->size, c->rank};
    for (int s = 1; s <= 3; s++)
        CHECK_COUNT(c, save(c, dir, s, l, 2, &e) == HS_OK, "save %d: %s", s, e.msg);
    /* the same step again replaces it whole */
    CHECK_COUNT(c, save(c, dir, 3, l, 2, &e) == HS_OK, "save 3 again: %s", e.msg);
    if (c->rank == 0) {
        bool found = false;
        CHECK_COUNT(c,
                    hs_ckpt_latest_read(dir, latest, sizeof latest, &found, &e) == HS_OK && found,
                    "latest");
        CHECK_COUNT(c, !strcmp(latest, "step-3"), "latest is '%s'", latest);
        CHECK_COUNT(c, !exists(dir, "step-1") && exists(dir, "step-2") && exists(dir, "step-3"),
                    "keep_last 2 should leave step-2 and step-3 only");
        CHECK_COUNT(c, !exists(dir, ".tmp-step-3"), "a temporary directory was left behind");
    }
    CHECK_COUNT(c, load_check(c, dir, 3, l, "latest") == 0, "loading latest differs");
}

static void test_mismatched_tables_fail_on_every_rank_naming_the_tensor(ctx *c) {
    if (c->size < 2) return;
    char dir[200];
    snprintf(dir, sizeof dir, "%s/mismatch", c->root);
    float buf[8] = {0};
    hs_ckpt_tensor t;
    int64_t shape[1] = {c->rank == 1 ? 5 : 4};
    hs_ckpt_tensor_full(&t, "model.x", HS_DTYPE_F32, 1, shape, buf);
    hs_ckpt_state st = {.step = 1};
    hs_ckpt_save_options opt = {.dir = dir, .keep_last = 2};
    hs_error e;
    hs_error_clear(&e);
    CHECK_COUNT(c, hs_ckpt_save(c->comm, &opt, &t, 1, &st, NULL, 0, &e) != HS_OK, "mismatch saved");
    CHECK_COUNT(
        c, strstr(e.msg, "'model.x' is float32 [4] on rank 0 but float32 [5] on rank 1") != NULL,
        "message: %s", e.msg);
    /* every rank holds only rows of its own, but rank 1 leaves its rows out: a hole */
    hs_ckpt_tensor_dim0(&t, "model.y", HS_DTYPE_F32, 1, (int64_t[]){8}, c->size, c->rank, buf);
    if (c->rank == 1) t.size[0] = 0;
    hs_error_clear(&e);
    CHECK_COUNT(c, hs_ckpt_save(c->comm, &opt, &t, 1, &st, NULL, 0, &e) != HS_OK, "hole saved");
    CHECK_COUNT(c, strstr(e.msg, "'model.y' [8]: its chunks cover") != NULL, "message: %s", e.msg);
    if (c->rank == 0)
        CHECK_COUNT(c, !exists(dir, "step-1") && !exists(dir, "latest"),
                    "a failed save left files");
}

static void test_missing_tensor_fails_the_collective_load_on_every_rank(ctx *c) {
    char dir[200];
    snprintf(dir, sizeof dir, "%s/fsdp", c->root);
    float buf[4];
    hs_ckpt_tensor t;
    hs_ckpt_tensor_full(&t, c->rank == c->size - 1 ? "model.absent" : "model.norm.weight",
                        HS_DTYPE_F32, 1, (int64_t[]){3}, buf);
    hs_error e;
    hs_error_clear(&e);
    CHECK_COUNT(c, hs_ckpt_load(c->comm, dir, &t, 1, NULL, &e) != HS_OK,
                "load of a missing tensor passed");
    const char *want = c->rank == c->size - 1 ? "has no tensor 'model.absent'"
                                              : "checkpoint load failed on rank";
    CHECK_COUNT(c, strstr(e.msg, want) != NULL, "message: %s", e.msg);
}

/* A save that cannot publish (step-7 exists as a plain file) fails on every
 * rank, leaves `latest` alone and removes its temporary directory. */
static void test_failed_publish_leaves_latest_and_no_temporary_dir(ctx *c) {
    char dir[200], path[300], latest[64] = "";
    snprintf(dir, sizeof dir, "%s/keep", c->root);
    if (c->rank == 0) {
        snprintf(path, sizeof path, "%s/step-7", dir);
        FILE *f = fopen(path, "w");
        if (f) fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    hs_error e;
    hs_error_clear(&e);
    CHECK_COUNT(c, save(c, dir, 7, (layout){c->size, c->rank}, 2, &e) != HS_OK,
                "save over a file passed");
    const char *want = c->rank == 0 ? "cannot rename"
                                    : "checkpoint save: publishing failed on rank 0";
    CHECK_COUNT(c, strstr(e.msg, want) != NULL, "message: %s", e.msg);
    if (c->rank == 0) {
        bool found = false;
        hs_ckpt_latest_read(dir, latest, sizeof latest, &found, &e);
        CHECK_COUNT(c, found && !strcmp(latest, "step-3"), "latest is '%s'", latest);
        CHECK_COUNT(c, !exists(dir, ".tmp-step-7"), "the temporary directory was left behind");
        unlink(path);
    }
}

static void test_rank0_reports_progress_bytes_and_rate(ctx *c) {
    char dir[200];
    snprintf(dir, sizeof dir, "%s/progress", c->root);
    hs_ckpt_tensor t[N_SPECS];
    void *bufs[N_SPECS];
    make_tensors((layout){c->size, c->rank}, 9, true, t, bufs);
    hs_log log;
    hs_log_init(&log, c->rank, c->size);
    log.level = HS_LOG_INFO;
    log.out = tmpfile();
    hs_ckpt_state st = {.step = 9};
    hs_ckpt_save_options opt = {.dir = dir, .keep_last = 1, .log = &log, .progress_bytes = 1};
    hs_error e;
    char saved[300] = "";
    CHECK_COUNT(c, hs_ckpt_save(c->comm, &opt, t, N_SPECS, &st, saved, sizeof saved, &e) == HS_OK,
                "%s", e.msg);
    char text[4096] = "";
    rewind(log.out);
    size_t n = fread(text, 1, sizeof text - 1, log.out);
    text[n] = '\0';
    fclose(log.out);
    if (c->rank == 0) {
        CHECK_COUNT(c, strstr(text, "checkpoint: step-9 rank 0 wrote") && strstr(text, "MB/s"),
                    "log: %s", text);
        CHECK_COUNT(c, strstr(text, "checkpoint: saved ") && strstr(text, "10 tensors"), "log: %s",
                    text);
    }
    CHECK_COUNT(c, strstr(saved, "/progress/step-9") != NULL, "saved path '%s'", saved);
    free_bufs(bufs);
}

static int run_suite(ctx *c) {
    snprintf(c->root, sizeof c->root, "/tmp/hs_ckpt_mpi_XXXXXX");
    if (c->rank == 0 && !mkdtemp(c->root)) return 1;
    MPI_Bcast(c->root, sizeof c->root, MPI_CHAR, 0, MPI_COMM_WORLD);
    test_fsdp_save_then_fsdp_load_is_bitwise(c);
    test_every_rank_of_worlds_1_to_5_reads_its_overlap(c);
    test_hsdp_replicas_are_written_once_and_load_into_fsdp(c);
    test_keep_last_prunes_and_latest_names_the_newest(c);
    test_mismatched_tables_fail_on_every_rank_naming_the_tensor(c);
    test_missing_tensor_fails_the_collective_load_on_every_rank(c);
    test_failed_publish_leaves_latest_and_no_temporary_dir(c);
    test_rank0_reports_progress_bytes_and_rate(c);
    MPI_Barrier(MPI_COMM_WORLD);
    if (c->rank == 0) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf %s", c->root);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", c->root);
    }
    return c->failures;
}

/* ------------------------------------------------------------ tool modes */

static int run_tool(ctx *c, int argc, char **argv) {
    layout l;
    if (argc < 5 || !layout_of(argv[4], c->rank, c->size, &l)) {
        fprintf(stderr, "usage: %s save|load DIR STEP fsdp|hsdp|full (hsdp needs an even world)\n",
                argv[0]);
        return 2;
    }
    int64_t step = atoll(argv[3]);
    if (!strcmp(argv[1], "save")) {
        hs_error e;
        if (save(c, argv[2], step, l, 0, &e) == HS_OK) return 0;
        fprintf(stderr, "[rank %d] save: %s\n", c->rank, e.msg);
        return 1;
    }
    char what[64];
    snprintf(what, sizeof what, "load %s on %d ranks", argv[4], c->size);
    return load_check(c, argv[2], step, l, what) == 0 ? 0 : 1;
}

typedef struct full_params {
    hs_model *m;
    uint64_t seed;
} full_params;

static hs_status ref_get(void *ctx_, int i, float *out, hs_error *e) {
    full_params *f = ctx_;
    const hs_param *p = hs_model_param(f->m, i);
    hs_model_init_param_rows(f->m, p, f->seed, out, HS_DTYPE_F32, 0, p->shape[0]);
    return HS_OK;
}

static int run_model(ctx *c, const char *dir, const char *ref) {
    hs_config cfg;
    hs_config_defaults(&cfg, NULL);
    const char *ov[] = {"model.dim=32",       "model.n_layers=2", "model.n_heads=2",
                        "model.n_kv_heads=1", "model.ffn_dim=64", "train.seq_len=16"};
    hs_error e;
    hs_model *m = NULL;
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = 1,
                           .seq_len = 16,
                           .allocate_params = false};
    hs_status s = hs_config_load(&cfg, NULL, ov, 6, &e);
    if (s == HS_OK) s = hs_model_create(&cfg.model, &mo, &m, &e);
    int n = s == HS_OK ? hs_model_num_params(m) : 0;
    hs_ckpt_tensor *t = calloc((size_t)n + 1, sizeof *t);
    for (int i = 0; i < n; i++) {
        const hs_param *p = hs_model_param(m, i);
        int64_t rows = hs_fsdp_actual_rows(p->shape[0], c->size, c->rank);
        int64_t row = hs_ckpt_box_numel(p->ndim - 1, p->shape + 1);
        float *buf = malloc(sizeof(float) * (size_t)(rows * row + 1));
        hs_ckpt_tensor_dim0(&t[i], p->fqn, HS_DTYPE_F32, p->ndim, p->shape, c->size, c->rank, buf);
        hs_model_init_param_rows(m, p, 7, buf, HS_DTYPE_F32, t[i].offset[0], rows);
    }
    uint64_t hash = 0;
    if (s == HS_OK) s = hs_config_hash(&cfg, &hash, &e);
    hs_ckpt_state st = {.step = 4, .data_position = 4, .optim_step = 4, .config_hash = hash};
    hs_ckpt_save_options opt = {.dir = dir, .keep_last = 1, .config = &cfg};
    if (s == HS_OK) s = hs_ckpt_save(c->comm, &opt, t, n, &st, NULL, 0, &e);
    full_params fp = {m, 7};
    if (s == HS_OK)
        s = hs_hf_save(m, ref_get, &fp, HS_DTYPE_F32, cfg.train.seq_len, ref, c->rank == 0, &e);
    if (s != HS_OK) fprintf(stderr, "[rank %d] model: %s\n", c->rank, e.msg);
    for (int i = 0; i < n; i++) free(t[i].data);
    free(t);
    if (m) hs_model_free(m);
    hs_config_free(&cfg);
    return s == HS_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    ctx c = {0};
    hs_error e;
    hs_comm_options opt = {.timeout_s = 60};
    if (hs_comm_init(&c.comm, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hs_comm_init: %s\n", e.msg);
        return 1;
    }
    c.rank = hs_comm_rank(c.comm);
    c.size = hs_comm_size(c.comm);
    int rc;
    if (argc >= 2 && (!strcmp(argv[1], "save") || !strcmp(argv[1], "load")))
        rc = run_tool(&c, argc, argv);
    else if (argc >= 4 && !strcmp(argv[1], "model")) rc = run_model(&c, argv[2], argv[3]);
    else rc = run_suite(&c);
    int total = 0;
    MPI_Allreduce(&rc, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (c.rank == 0) printf("%s\n", total ? "FAIL" : "OK");
    hs_comm_finalize(c.comm);
    return total ? 1 : 0;
}
