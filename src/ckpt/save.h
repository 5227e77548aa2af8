/* ckpt/save.h — the phases of the save protocol (save.c), which the
 * synchronous hs_ckpt_save runs back to back and the background writer
 * (writer.c) splits between two threads:
 *
 *   begin    collective, on the caller's thread: plan, the temporary
 *            directory
 *   write    this rank's data file alone (write, CRC, fsync): no
 *            communication, so it may run on a thread of its own
 *   collect  collective, on the caller's thread: agree on every rank's
 *            write, gather the CRCs
 *   publish  rank 0 alone: metadata, fsyncs, rename, `latest`, prune. No
 *            communication, so it may run on a thread of its own too; it
 *            starts only after collect, i.e. once every rank's data file
 *            is on disk, which is what keeps the rename atomic
 *   settle   collective, on the caller's thread: agree that rank 0 published
 *   end      collect + publish + settle, back to back (docs/checkpoint.md)
 *
 * A saver holds copies of the options and the state, so the caller's may
 * go once begin returns; the strings and objects the options point to
 * (dir, config, log) must live until end. */
#ifndef HS_CKPT_SAVE_H
#define HS_CKPT_SAVE_H

#include "ckpt/plan.h"

typedef struct hs_ckpt_saver {
    hs_ckpt_save_options opt;
    hs_ckpt_state state;
    hs_ckpt_plan plan;
    char step_name[40];
    char tmp[HS_PATH_MAX + 64], final[HS_PATH_MAX + 64];
    double t0;
    /* test hooks (docs/checkpoint.md): this rank _exit(9)s after kill_after
     * bytes, or at the end of phase kill_phase ("" none); the write sleeps
     * delay_ms before its first byte */
    int64_t kill_after;
    char kill_phase[16];
    int delay_ms;
    /* progress (rank 0) */
    int64_t written, my_bytes;
    double last_report;
    bool report;
    /* The host bounce buffer device chunks cross into: one, reused for
     * every piece, of PIECE bytes or the largest device chunk when that is
     * smaller. A fixed size, not the largest tensor's, keeps the host
     * memory of a save flat however large the model (the write goes in
     * PIECE pieces anyway); NULL when this rank writes no device chunk. */
    char *stage;
    size_t piece;
    uint32_t *crcs; /* [plan.rank_chunks[rank]]: filled by write */
} hs_ckpt_saver;

/* Collective: checks, plans and creates <dir>/.tmp-step-N. On failure
 * (the same on every rank) nothing is left to end; free the saver. */
hs_status hs_ckpt_saver_begin(hs_ckpt_saver *sv, hs_pg *world, const hs_ckpt_save_options *opt,
                              const hs_ckpt_tensor *t, int n, const hs_ckpt_state *state,
                              hs_error *e);
/* The bytes of this rank's data file (0: it writes none). */
int64_t hs_ckpt_saver_rank_bytes(const hs_ckpt_saver *sv);
/* Whether this rank writes tensor i of the list begin was given. */
bool hs_ckpt_saver_writes(const hs_ckpt_saver *sv, int i);
/* This rank's data file from t (the list begin was given, or host copies
 * of it); this rank's status, not agreed. */
hs_status hs_ckpt_saver_write(hs_ckpt_saver *sv, const hs_ckpt_tensor *t, int n, hs_error *e);
/* Collective: every rank passes its write's status (and message in e).
 * Agrees and gathers the CRCs; on failure rank 0 removes the temporary
 * directory and nothing is left to publish. */
hs_status hs_ckpt_saver_collect(hs_ckpt_saver *sv, hs_pg *world, hs_status written, hs_error *e);
/* After collect succeeded: rank 0 writes the metadata and publishes
 * (metadata.json, config.yaml, fsyncs, rename to step-N, `latest`, prune);
 * HS_OK at once on the other ranks. No communication: any thread. Its
 * status is this rank's, not agreed. */
hs_status hs_ckpt_saver_publish(hs_ckpt_saver *sv, hs_error *e);
/* Collective: every rank passes publish's status. Agrees; on failure rank 0
 * removes the temporary directory. Logs the saved line. */
hs_status hs_ckpt_saver_settle(hs_ckpt_saver *sv, hs_pg *world, hs_status published, hs_error *e);
/* collect, publish and settle back to back (the synchronous save). */
hs_status hs_ckpt_saver_end(hs_ckpt_saver *sv, hs_pg *world, hs_status written, hs_error *e);
/* The kill test hook (docs/checkpoint.md, HS_CKPT_TEST_KILL_PHASE): this
 * rank _exit(9)s here when the hook names `phase` for this save. */
void hs_ckpt_saver_test_kill(const hs_ckpt_saver *sv, const char *phase);
/* After a failure all ranks agreed on between begin and end: rank 0
 * removes the temporary directory. No communication. */
void hs_ckpt_saver_abort(hs_ckpt_saver *sv);
void hs_ckpt_saver_free(hs_ckpt_saver *sv);

#endif
