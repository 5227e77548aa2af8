/* ckpt/inspect.c — the human-readable listing behind `hypershard ckpt
 * inspect`: trainer state, data files, and per tensor its dtype, shape,
 * bytes and chunk layout. Reads only the metadata. */
#include <string.h>
#include <time.h>

#include "ckpt/ckpt_internal.h"

static const char *human_bytes(int64_t b, char *buf, size_t cap) {
    if (b < 1024) snprintf(buf, cap, "%lld B", (long long)b);
    else if (b < ((int64_t)1 << 20)) snprintf(buf, cap, "%.1f KiB", (double)b / 1024.0);
    else if (b < ((int64_t)1 << 30)) snprintf(buf, cap, "%.2f MiB", (double)b / 1048576.0);
    else snprintf(buf, cap, "%.2f GiB", (double)b / 1073741824.0);
    return buf;
}

static void print_header(const hs_ckpt *c, const hs_ckpt_meta *m, FILE *f) {
    char when[64] = "unknown", hx[3][24];
    time_t t = (time_t)m->created_unix;
    struct tm tm;
    if (m->created_unix > 0 && gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    fprintf(f, "checkpoint %s\n", hs_ckpt_path(c));
    fprintf(f, "  format    %s version %d, saved by %d rank%s at %s\n", HS_CKPT_FORMAT, m->version,
            m->world_size, m->world_size == 1 ? "" : "s", when);
    hs_ckpt_hex64(m->state.rng_seed, hx[0], sizeof hx[0]);
    hs_ckpt_hex64(m->state.rng_counter, hx[1], sizeof hx[1]);
    hs_ckpt_hex64(m->state.config_hash, hx[2], sizeof hx[2]);
    fprintf(f, "  state     step %lld, data_position %lld, optim_step %lld\n",
            (long long)m->state.step, (long long)m->state.data_position,
            (long long)m->state.optim_step);
    fprintf(f, "            rng_seed %s, rng_counter %s, config_hash %s\n", hx[0], hx[1], hx[2]);
}

static void print_files(const hs_ckpt_meta *m, FILE *f) {
    int64_t total = 0;
    char b[32];
    for (int i = 0; i < m->n_files; i++) total += m->files[i].bytes;
    fprintf(f, "  files     %d, %s\n", m->n_files, human_bytes(total, b, sizeof b));
    for (int i = 0; i < m->n_files; i++)
        fprintf(f, "            %-16s %12lld bytes\n", m->files[i].name,
                (long long)m->files[i].bytes);
}

static int name_width(const hs_ckpt_meta *m) {
    int w = 6;
    for (int i = 0; i < m->n_tensors; i++) {
        int l = (int)strlen(m->tensors[i].name);
        w = l > w ? l : w;
    }
    return w > 64 ? 64 : w;
}

static void print_tensor(const hs_ckpt_meta *m, const hs_ckpt_entry *t, int w, FILE *f) {
    char shape[96], b[32], box[160];
    hs_shape_str(t->ndim, t->shape, shape, sizeof shape);
    int64_t bytes = hs_ckpt_entry_numel(t) * (int64_t)hs_dtype_size(t->dtype);
    fprintf(f, "  %-*s  %-8s  %-18s %12s  %d chunk%s\n", w, t->name, hs_dtype_name(t->dtype), shape,
            human_bytes(bytes, b, sizeof b), t->n_chunks, t->n_chunks == 1 ? "" : "s");
    for (int k = 0; k < t->n_chunks; k++) {
        const hs_ckpt_chunk *ch = &t->chunks[k];
        fprintf(f, "  %-*s    %-26s %-14s @%-10lld %10lld bytes  crc32 0x%08x\n", w, "",
                hs_ckpt_box_str(t->ndim, ch->offset, ch->size, box, sizeof box),
                m->files[ch->file].name, (long long)ch->byte_offset, (long long)ch->length,
                ch->crc32);
    }
}

void hs_ckpt_print(const hs_ckpt *c, FILE *f) {
    const hs_ckpt_meta *m = hs_ckpt_meta_of(c);
    print_header(c, m, f);
    print_files(m, f);
    int64_t total = 0;
    for (int i = 0; i < m->n_tensors; i++)
        total += hs_ckpt_entry_numel(&m->tensors[i]) * (int64_t)hs_dtype_size(m->tensors[i].dtype);
    char b[32];
    fprintf(f, "  tensors   %d, %s\n\n", m->n_tensors, human_bytes(total, b, sizeof b));
    int w = name_width(m);
    fprintf(f, "  %-*s  %-8s  %-18s %12s  %s\n", w, "tensor", "dtype", "shape", "size", "chunks");
    fprintf(f, "  %-*s    %-26s %-14s %-11s %16s\n", w, "", "[global start:end per dim]", "file",
            "@byte", "length");
    for (int i = 0; i < m->n_tensors; i++) print_tensor(m, &m->tensors[i], w, f);
}
