/* TensorBoard event files: TFRecord framing (length, masked CRC32C of the
 * length, the record, its masked CRC32C) of Event protobufs encoded by
 * hand (docs/training.md, "TensorBoard"):
 *
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train/run.h"

/* CRC-32C (Castagnoli, reflected 0x82F63B78), bit by bit: the records are
 * a few hundred bytes per step. */
static uint32_t crc32c(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

/* Seconds since the epoch, as TensorBoard's wall_time. */
static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

typedef struct pb {
    uint8_t buf[4096];
    size_t n;
} pb;

static void put(pb *b, const void *p, size_t n) {
    HS_ASSERT(b->n + n <= sizeof b->buf);
    memcpy(b->buf + b->n, p, n);
    b->n += n;
}

static void varint(pb *b, uint64_t v) {
    uint8_t x[10];
    size_t n = 0;
    do {
        x[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) x[n] |= 0x80;
        n++;
    } while (v);
    put(b, x, n);
}

static void key(pb *b, int field, int wire) { varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void bytes_field(pb *b, int field, const void *p, size_t n) {
    key(b, field, 2);
    varint(b, n);
    put(b, p, n);
}

/* One TFRecord. */
static bool write_record(FILE *f, const pb *b) {
    uint8_t len[8];
    uint64_t n = b->n;
    memcpy(len, &n, 8);
    uint32_t lc = masked(crc32c(len, 8)), dc = masked(crc32c(b->buf, b->n));
    return fwrite(len, 1, 8, f) == 8 && fwrite(&lc, 4, 1, f) == 1 &&
           fwrite(b->buf, 1, b->n, f) == b->n && fwrite(&dc, 4, 1, f) == 1;
}

static void event_head(pb *e, double wall, int64_t step) {
    key(e, 1, 1);
    put(e, &wall, 8);
    key(e, 2, 0);
    varint(e, (uint64_t)step);
}

hs_status hs_tb_open(hs_trainer *t, hs_error *e) {
    if (!t->rank0 || !t->cfg->metrics.tensorboard) return HS_OK;
    char host[64] = "host", *path = t->tb_path;
    gethostname(host, sizeof host - 1);
    double wall = wall_time();
    snprintf(path, sizeof t->tb_path, "%s/events.out.tfevents.%lld.%s.%d.0", t->cfg->train.out_dir,
             (long long)wall, host, (int)getpid());
    t->tb = hs_fopen(path, "wb", "check that train.out_dir is writable", e);
    if (!t->tb) return e->code;
    pb ev = {.n = 0};
    event_head(&ev, wall, 0);
    bytes_field(&ev, 3, "brain.Event:2", 13);
    if (!write_record(t->tb, &ev) || fflush(t->tb) != 0)
        return hs_error_set(e, HS_ERR_IO, "cannot write %s: %s", path, hs_strerror_errno());
    t->tb_good = hs_metrics_offset(t->tb);
    return HS_OK;
}

typedef struct tb_value {
    const char *tag;
    double v;
} tb_value;

static void tb_write(hs_trainer *t, int64_t step, const tb_value *vals, int n) {
    pb sum = {.n = 0}, ev = {.n = 0};
    for (int i = 0; i < n; i++) {
        pb val = {.n = 0};
        bytes_field(&val, 1, vals[i].tag, strlen(vals[i].tag));
        float f = (float)vals[i].v;
        key(&val, 2, 5);
        put(&val, &f, 4);
        bytes_field(&sum, 1, val.buf, val.n);
    }
    event_head(&ev, wall_time(), step);
    bytes_field(&ev, 5, sum.buf, sum.n);
    if (!write_record(t->tb, &ev) || fflush(t->tb) != 0)
        hs_metrics_lost(t, &t->tb, t->tb_path, t->tb_good, errno, step);
    else t->tb_good = hs_metrics_offset(t->tb);
}

void hs_tb_step(hs_trainer *t, const hs_step_result *r, double tokens_per_s, double mfu) {
    if (!t->tb) return;
    tb_value v[9];
    int n = 0;
    v[n++] = (tb_value){"train/loss", r->loss};
    if (hs_model_arch_moe(&t->cfg->model)) v[n++] = (tb_value){"train/aux_loss", r->aux_loss};
    v[n++] = (tb_value){"train/grad_norm", r->grad_norm};
    v[n++] = (tb_value){"train/lr", r->lr};
    v[n++] = (tb_value){"perf/tokens_per_s", tokens_per_s};
    v[n++] = (tb_value){"perf/mfu", mfu};
    v[n++] = (tb_value){"memory/peak_device_bytes", (double)r->peak_device_bytes};
    v[n++] = (tb_value){"memory/peak_host_bytes", (double)r->peak_host_bytes};
    if (r->has_val) v[n++] = (tb_value){"val/loss", r->val_loss};
    tb_write(t, r->step, v, n);
}

void hs_tb_close(hs_trainer *t) {
    hs_error fe;
    if (t->tb && hs_fclose_written(t->tb, t->tb_path, NULL, &fe) != HS_OK)
        hs_log_warn(t->log, "%s", fe.msg);
    t->tb = NULL;
}
