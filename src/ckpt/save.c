/* ckpt/save.c — the collective save protocol (docs/checkpoint.md §Save):
 *
 *   1. plan: all-gather the tensor tables; every rank derives the metadata
 *   2. rank 0 creates <dir>/.tmp-step-N (removing a stale one)
 *   3. each rank writes, fsyncs and closes <tmp>/rank-<r>.bin, computing the
 *      CRC32 of every chunk as it goes; the CRCs are all-gathered
 *   4. rank 0 writes metadata.json (and config.yaml), fsyncs them and the
 *      directory, renames it to step-N (swapping atomically with an old
 *      step-N), fsyncs <dir>, replaces `latest`, prunes old checkpoints
 *
 * A step fails on every rank together (hs_pg_agree after each phase).
 * Until the rename in step 4 nothing a reader looks at has changed, so a
 * process killed earlier leaves the previous checkpoint and `latest` as
 * they were. The phases are also the background writer's (save.h,
 * writer.c): step 3's writing and step 4 touch no communication and may
 * run on threads of their own, while the agreements between them stay on
 * the caller's thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/save.h"

#define PIECE ((size_t)4 << 20)
#define DEFAULT_PROGRESS_BYTES ((int64_t)64 << 20)

typedef hs_ckpt_saver saver;

/* The test hooks of docs/checkpoint.md, read at each save. */
static void test_hooks_init(saver *sv, int rank) {
    const char *after = getenv("HS_CKPT_TEST_KILL_AFTER_BYTES");
    const char *who = getenv("HS_CKPT_TEST_KILL_RANK");
    const char *step = getenv("HS_CKPT_TEST_KILL_STEP");
    const char *delay = getenv("HS_CKPT_TEST_WRITE_DELAY_MS");
    const char *phase = getenv("HS_CKPT_TEST_KILL_PHASE");
    bool mine = rank == (who ? atoi(who) : 1) && (!step || atoll(step) == sv->state.step);
    sv->kill_after = -1;
    if (after && mine) sv->kill_after = atoll(after);
    if (phase && mine) snprintf(sv->kill_phase, sizeof sv->kill_phase, "%s", phase);
    sv->delay_ms = delay ? atoi(delay) : 0;
}

void hs_ckpt_saver_test_kill(const hs_ckpt_saver *sv, const char *phase) {
    if (!sv->kill_phase[0] || strcmp(sv->kill_phase, phase) != 0) return;
    fprintf(stderr, "HS_CKPT_TEST_KILL_PHASE: exiting after the %s phase of %s\n", phase,
            sv->step_name);
    _exit(9);
}

static void progress(saver *sv, bool last) {
    if (!sv->report) return;
    double now = hs_now();
    if (!last && now - sv->last_report < 1.0) return;
    sv->last_report = now;
    double dt = now - sv->t0 > 1e-9 ? now - sv->t0 : 1e-9;
    hs_log_info(sv->opt.log, "checkpoint: %s rank 0 wrote %.1f of %.1f MiB (%.0f%%), %.1f MB/s",
                sv->step_name, (double)sv->written / 1048576.0, (double)sv->my_bytes / 1048576.0,
                sv->my_bytes ? 100.0 * (double)sv->written / (double)sv->my_bytes : 100.0,
                (double)sv->written / dt / 1e6);
}

/* One chunk to the open file, in pieces (progress, the kill hook). A
 * chunk in device memory crosses piece by piece into sv->stage, and the
 * CRC and the write take the host copy. */
static hs_status write_chunk(saver *sv, int fd, const char *path, const hs_ckpt_tensor *t, size_t n,
                             uint32_t *crc, hs_error *e) {
    const char *data = t->data;
    *crc = 0;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < sv->piece ? n - done : sv->piece;
        const char *p = data + done;
        if (t->dev) {
            hs_device_copy(t->dev, sv->stage, p, k, HS_COPY_D2H);
            p = sv->stage;
        }
        if (sv->kill_after >= 0 && sv->written + (int64_t)k > sv->kill_after) {
            size_t part = (size_t)(sv->kill_after - sv->written);
            if (hs_ckpt_write_all(fd, p, part, path, e) == HS_OK) fsync(fd);
            fprintf(stderr, "HS_CKPT_TEST_KILL_AFTER_BYTES: exiting after %lld bytes of %s\n",
                    (long long)sv->kill_after, path);
            _exit(9);
        }
        if (hs_ckpt_write_all(fd, p, k, path, e) != HS_OK) return e->code;
        *crc = hs_crc32(*crc, p, k);
        done += k;
        sv->written += (int64_t)k;
        progress(sv, false);
    }
    return HS_OK;
}

/* sv->stage for the device chunks this rank writes. */
static hs_status stage_alloc(saver *sv, const hs_ckpt_tensor *t, int n, const char *path,
                             hs_error *e) {
    hs_ckpt_plan *p = &sv->plan;
    size_t need = 0;
    for (int i = 0; i < n; i++) {
        if (!t[i].dev || p->row_entry[p->rank_base[p->rank] + i] < 0) continue;
        size_t bytes = (size_t)hs_ckpt_tensor_numel(&t[i]) * hs_dtype_size(t[i].dtype);
        if (bytes > need) need = bytes;
    }
    if (need == 0) return HS_OK;
    sv->piece = need < PIECE ? need : PIECE;
    sv->stage = malloc(sv->piece);
    if (!sv->stage)
        return hs_error_oom(e,
                            "the %zu-byte host buffer to write "
                            "device tensors to %s",
                            sv->piece, path);
    return HS_OK;
}

/* Phase 3 on this rank: its data file, and the CRC of each chunk in the
 * order of its tensors. */
static hs_status write_data(saver *sv, const hs_ckpt_tensor *t, int n, uint32_t *crcs,
                            hs_error *e) {
    hs_ckpt_plan *p = &sv->plan;
    if (p->rank_file[p->rank] < 0) return HS_OK;
    char path[HS_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", sv->tmp, p->meta.files[p->rank_file[p->rank]].name);
    if (stage_alloc(sv, t, n, path, e) != HS_OK) return e->code;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return hs_error_set(e, HS_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    hs_status s = HS_OK;
    int k = 0;
    for (int i = 0; i < n && s == HS_OK; i++) {
        if (p->row_entry[p->rank_base[p->rank] + i] < 0) continue;
        size_t bytes = (size_t)hs_ckpt_tensor_numel(&t[i]) * hs_dtype_size(t[i].dtype);
        s = write_chunk(sv, fd, path, &t[i], bytes, &crcs[k++], e);
    }
    if (s == HS_OK) hs_ckpt_saver_test_kill(sv, "write"); /* written, not yet synced */
    if (s == HS_OK && fsync(fd) != 0)
        s = hs_error_set(e, HS_ERR_IO, "cannot sync %s to disk: %s", path, strerror(errno));
    if (close(fd) != 0 && s == HS_OK)
        s = hs_error_set(e, HS_ERR_IO, "cannot close %s: %s", path, strerror(errno));
    progress(sv, true);
    if (s == HS_OK) hs_ckpt_saver_test_kill(sv, "fsync"); /* on disk, not yet agreed */
    return s;
}

/* Gather every rank's CRCs and put them into the metadata. */
static hs_status gather_crcs(saver *sv, hs_pg *world, const uint32_t *mine, hs_error *e) {
    hs_ckpt_plan *p = &sv->plan;
    char *all = NULL;
    int64_t stride = 0, *lens = calloc((size_t)p->world, sizeof(int64_t));
    if (!lens) return hs_error_oom(e, "checkpoint save: the CRC table sizes of %d ranks", p->world);
    hs_status s = hs_ckpt_all_gather_bytes(
        world, mine, (int64_t)sizeof(uint32_t) * p->rank_chunks[p->rank], &all, &stride, lens, e);
    for (int r = 0; s == HS_OK && r < p->world; r++) {
        const uint32_t *crc = (const uint32_t *)(all + r * stride);
        for (int row = p->rank_base[r]; row < p->rank_base[r + 1]; row++)
            if (p->row_entry[row] >= 0)
                p->meta.tensors[p->row_entry[row]].chunks[p->row_chunk[row]].crc32 = *crc++;
    }
    free(all);
    free(lens);
    return s;
}

/* ------------------------------------------------------------ rank 0 */

static hs_status prepare_tmp(saver *sv, hs_error *e) {
    if (hs_mkdirs(sv->opt.dir, e) != HS_OK) return e->code;
    if (hs_ckpt_remove_dir(sv->tmp, e) != HS_OK) return e->code;
    if (mkdir(sv->tmp, 0755) != 0)
        return hs_error_set(e, HS_ERR_IO, "cannot create %s: %s", sv->tmp, strerror(errno));
    return HS_OK;
}

static hs_status write_text_file(const char *path, void (*fill)(FILE *, const void *),
                                 const void *arg, hs_error *e) {
    FILE *f = hs_fopen(path, "wb", "check checkpoint.dir", e);
    if (!f) return e->code;
    fill(f, arg);
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    if (fclose(f) != 0) bad = 1;
    if (bad) return hs_error_set(e, HS_ERR_IO, "cannot write %s: %s", path, hs_strerror_errno());
    return HS_OK;
}

static void fill_meta(FILE *f, const void *m) {
    hs_error ignored;
    hs_ckpt_meta_write(m, f, "", &ignored); /* ferror is checked by the caller */
}

/* Without a topology the dump allocates nothing: it cannot fail. */
static void fill_config(FILE *f, const void *cfg) { hs_config_dump(cfg, NULL, f, NULL); }

/* Rename tmp to final. An existing final (the same step saved again) is
 * swapped out atomically and deleted afterwards. */
static hs_status publish(saver *sv, hs_error *e) {
    if (!hs_ckpt_is_dir(sv->final)) {
        if (rename(sv->tmp, sv->final) != 0)
            return hs_error_set(e, HS_ERR_IO, "cannot rename %s to %s: %s", sv->tmp, sv->final,
                                strerror(errno));
        return HS_OK;
    }
    if (renameat2(AT_FDCWD, sv->tmp, AT_FDCWD, sv->final, RENAME_EXCHANGE) != 0)
        return hs_error_set(e, HS_ERR_IO,
                            "cannot replace the existing %s with %s: %s; delete "
                            "it or choose another checkpoint.dir",
                            sv->final, sv->tmp, strerror(errno));
    return hs_ckpt_remove_dir(sv->tmp, e);
}

static hs_status finish_rank0(saver *sv, hs_error *e) {
    char path[HS_PATH_MAX + 128], latest[64];
    sv->plan.meta.created_unix = hs_wall_now();
    snprintf(path, sizeof path, "%s/%s", sv->tmp, HS_CKPT_METADATA);
    hs_status s = write_text_file(path, fill_meta, &sv->plan.meta, e);
    if (s == HS_OK && sv->opt.config) {
        snprintf(path, sizeof path, "%s/config.yaml", sv->tmp);
        s = write_text_file(path, fill_config, sv->opt.config, e);
    }
    if (s == HS_OK) s = hs_ckpt_fsync_path(sv->tmp, true, e);
    if (s == HS_OK) hs_ckpt_saver_test_kill(sv, "metadata");
    if (s == HS_OK) s = publish(sv, e);
    if (s == HS_OK) s = hs_ckpt_fsync_path(sv->opt.dir, true, e);
    if (s == HS_OK) hs_ckpt_saver_test_kill(sv, "publish"); /* step-N is there; `latest` is not */
    snprintf(latest, sizeof latest, "%s\n", sv->step_name);
    if (s == HS_OK) s = hs_ckpt_write_atomic(sv->opt.dir, HS_CKPT_LATEST, latest, e);
    if (s == HS_OK) hs_ckpt_saver_test_kill(sv, "latest");
    if (s == HS_OK)
        s = hs_ckpt_prune(sv->opt.dir, sv->opt.keep_last, sv->step_name, sv->opt.log, e);
    return s;
}

/* ------------------------------------------------------------ phases */

static hs_status begin_phases(saver *sv, hs_pg *world, const hs_ckpt_tensor *t, int n,
                              hs_error *e) {
    hs_ckpt_plan *p = &sv->plan;
    hs_status s = hs_ckpt_plan_build(world, t, n, p, e);
    if (s != HS_OK) return s;
    p->meta.state = sv->state;
    s = hs_pg_agree(world, p->rank == 0 ? prepare_tmp(sv, e) : HS_OK, "checkpoint save", e);
    if (s != HS_OK) return s;
    sv->report = p->rank == 0 && sv->opt.log &&
                 p->total_bytes >=
                     (sv->opt.progress_bytes > 0 ? sv->opt.progress_bytes : DEFAULT_PROGRESS_BYTES);
    sv->my_bytes = hs_ckpt_saver_rank_bytes(sv);
    sv->crcs = calloc((size_t)p->rank_chunks[p->rank] + 1, sizeof(uint32_t));
    s = sv->crcs
            ? HS_OK
            : hs_error_oom(e, "checkpoint save: the CRCs of %d chunks", p->rank_chunks[p->rank]);
    s = hs_pg_agree(world, s, "checkpoint save", e);
    if (s != HS_OK) hs_ckpt_saver_abort(sv);
    return s;
}

hs_status hs_ckpt_saver_begin(hs_ckpt_saver *sv, hs_pg *world, const hs_ckpt_save_options *opt,
                              const hs_ckpt_tensor *t, int n, const hs_ckpt_state *state,
                              hs_error *e) {
    *sv = (saver){.opt = *opt, .state = *state, .t0 = hs_now(), .piece = PIECE};
    if (!opt->dir || !opt->dir[0] || strlen(opt->dir) >= HS_PATH_MAX)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "checkpoint.dir is empty or too long; set it to a "
                            "directory all ranks can write");
    sv->last_report = sv->t0; /* the first progress line after a second */
    snprintf(sv->step_name, sizeof sv->step_name, "step-%lld", (long long)state->step);
    snprintf(sv->tmp, sizeof sv->tmp, "%s/.tmp-%s", opt->dir, sv->step_name);
    snprintf(sv->final, sizeof sv->final, "%s/%s", opt->dir, sv->step_name);
    test_hooks_init(sv, hs_pg_rank(world));
    hs_status s = hs_pg_agree(world, hs_ckpt_check_local(t, n, e), "checkpoint save", e);
    return s == HS_OK ? begin_phases(sv, world, t, n, e) : s;
}

int64_t hs_ckpt_saver_rank_bytes(const hs_ckpt_saver *sv) {
    const hs_ckpt_plan *p = &sv->plan;
    return p->rank_file[p->rank] >= 0 ? p->meta.files[p->rank_file[p->rank]].bytes : 0;
}

bool hs_ckpt_saver_writes(const hs_ckpt_saver *sv, int i) {
    const hs_ckpt_plan *p = &sv->plan;
    return p->row_entry[p->rank_base[p->rank] + i] >= 0;
}

hs_status hs_ckpt_saver_write(hs_ckpt_saver *sv, const hs_ckpt_tensor *t, int n, hs_error *e) {
    if (sv->delay_ms > 0) {
        struct timespec ts = {sv->delay_ms / 1000, (long)(sv->delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    return write_data(sv, t, n, sv->crcs, e);
}

hs_status hs_ckpt_saver_collect(hs_ckpt_saver *sv, hs_pg *world, hs_status written, hs_error *e) {
    hs_status s = hs_pg_agree(world, written, "checkpoint save: writing data", e);
    if (s == HS_OK) s = gather_crcs(sv, world, sv->crcs, e);
    /* Every rank has stopped writing (the agreement came after its
     * writes); leave no partial directory behind. */
    if (s != HS_OK) hs_ckpt_saver_abort(sv);
    return s;
}

hs_status hs_ckpt_saver_publish(hs_ckpt_saver *sv, hs_error *e) {
    return sv->plan.rank == 0 ? finish_rank0(sv, e) : HS_OK;
}

hs_status hs_ckpt_saver_settle(hs_ckpt_saver *sv, hs_pg *world, hs_status published, hs_error *e) {
    hs_ckpt_plan *p = &sv->plan;
    hs_status s = hs_pg_agree(world, published, "checkpoint save: publishing", e);
    if (s != HS_OK) hs_ckpt_saver_abort(sv);
    double dt = hs_now() - sv->t0;
    if (s == HS_OK && sv->opt.log)
        hs_log_info(sv->opt.log,
                    "checkpoint: saved %s (%d tensors, %.2f MiB in %d files) in %.2f s, "
                    "%.1f MB/s",
                    sv->final, p->meta.n_tensors, (double)p->total_bytes / 1048576.0,
                    p->meta.n_files, dt, (double)p->total_bytes / (dt > 1e-9 ? dt : 1e-9) / 1e6);
    return s;
}

hs_status hs_ckpt_saver_end(hs_ckpt_saver *sv, hs_pg *world, hs_status written, hs_error *e) {
    hs_status s = hs_ckpt_saver_collect(sv, world, written, e);
    return s == HS_OK ? hs_ckpt_saver_settle(sv, world, hs_ckpt_saver_publish(sv, e), e) : s;
}

void hs_ckpt_saver_abort(hs_ckpt_saver *sv) {
    hs_error ignored;
    if (sv->plan.rank == 0) hs_ckpt_remove_dir(sv->tmp, &ignored);
}

void hs_ckpt_saver_free(hs_ckpt_saver *sv) {
    hs_ckpt_plan_free(&sv->plan);
    free(sv->stage);
    free(sv->crcs);
    sv->stage = NULL;
    sv->crcs = NULL;
}

/* ------------------------------------------------------------ driver */

hs_status hs_ckpt_save(hs_comm *comm, const hs_ckpt_save_options *opt,
                       const hs_ckpt_tensor *tensors, int n, const hs_ckpt_state *state,
                       char *saved_path, size_t cap, hs_error *e) {
    hs_pg *world = hs_comm_world(comm);
    saver sv;
    hs_status s = hs_ckpt_saver_begin(&sv, world, opt, tensors, n, state, e);
    if (s == HS_OK) s = hs_ckpt_saver_end(&sv, world, hs_ckpt_saver_write(&sv, tensors, n, e), e);
    if (s == HS_OK && saved_path) snprintf(saved_path, cap, "%s", sv.final);
    hs_ckpt_saver_free(&sv);
    return s;
}
