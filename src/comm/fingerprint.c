/* comm/fingerprint.c — collective fingerprints: catching ranks whose
 * collectives on a group differ (one skipped, reordered, or of another
 * size) and naming the first difference on each side, instead of hanging
 * or computing with mismatched buffers.
 *
 * Each rank folds every collective it issues on a group (send / recv
 * excepted: they pair two ranks, not the group) into that group's running
 * hash, on the issuing thread, in issue order (hs_fp_issue, from work.c
 * under the queue's lock). hs_comm_check compares the hashes of every group
 * over its members with one small all-gather over the world: a group name
 * has an instance per set of members (a 'tp' group per pipeline stage and
 * data-parallel index), and each rank is compared only with the lead of
 * its own instance, its lowest world rank; only when
 * they differ does a second all-gather bring the last HS_FP_RING
 * collectives of the group that differs, to name the first difference.
 * With comm.check_every = 1 (fp_each) every collective's entry is also
 * compared over its group before it runs. The watchdog adds the same
 * comparison, from its own channel, to a timeout's report. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/group.h"

/* The bytes of the tables travel as 2-byte elements of a 16-bit dtype: the
 * collectives move them without looking at the values. */
#define CARRIER HS_DTYPE_BF16
#define I64_ELEMS 4 /* carrier elements per int64 */
#define END_WAIT_S 30.0
#define FIX_LINE                                                                                   \
    "  fix: every rank of a group must issue the same collectives in the same order with the "     \
    "same sizes (a branch taken on some ranks only, or a shape computed from rank-local data)"

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* What every member must pass alike: the op, the dtype (not for a
 * barrier) and the reduction or the broadcast root. */
static int64_t desc_of(const hs_coll_args *a) {
    int64_t extra = 0;
    if (a->op == HS_OP_ALL_REDUCE || a->op == HS_OP_REDUCE_SCATTER) extra = (int64_t)a->reduce + 1;
    else if (a->op == HS_OP_BROADCAST) extra = (int64_t)a->peer + 1;
    int64_t dt = a->op == HS_OP_BARRIER ? 0 : (int64_t)a->dt;
    return (int64_t)a->op | dt << 8 | extra << 16;
}

/* all_to_allv's counts are per peer and differ between ranks by design. */
static int64_t count_of(const hs_coll_args *a) {
    if (a->op == HS_OP_ALL_TO_ALLV) return -1;
    return a->op == HS_OP_BARRIER ? 0 : a->count;
}

void hs_fp_issue(hs_pg *g, const hs_coll_args *a, int64_t seq, hs_fp_entry *entry) {
    hs_fp_entry x = {.seq = seq, .desc = desc_of(a), .count = count_of(a)};
    uint64_t h = mix64((uint64_t)seq ^ (uint64_t)x.desc * 0x9e3779b97f4a7c15ULL ^
                       (uint64_t)x.count * 0xc2b2ae3d27d4eb4fULL);
    x.hash = (int64_t)mix64((uint64_t)g->fp.hash ^ h);
    g->fp.hash = x.hash;
    g->fp.ring[seq % HS_FP_RING] = x;
    *entry = x;
}

hs_fp_view hs_fp_view_of(const hs_pg *g, hs_fp_entry *out, int max) {
    HS_ASSERT(max >= 0 && max <= HS_FP_RING);
    hs_fp_view v = {.world_rank = g->comm->rank,
                    .count = g->next_seq,
                    .hash = g->fp.hash,
                    .agreed = g->fp.agreed,
                    .entries = out};
    v.n = v.count < max ? (int)v.count : max;
    for (int i = 0; i < v.n; i++) out[i] = g->fp.ring[(v.count - v.n + 1 + i) % HS_FP_RING];
    return v;
}

/* ------------------------------------------------------------ the message */

/* "all_reduce f32 x 1024 (sum)". */
static void entry_text(const hs_fp_entry *x, char *buf, size_t cap) {
    static const char *const reduce_names[HS_REDUCE_OP_COUNT] = {"sum", "avg", "max"};
    hs_comm_op op = (hs_comm_op)(x->desc & 0xff);
    int dt = (int)(x->desc >> 8 & 0xff);
    int64_t extra = x->desc >> 16;
    char tail[48] = "";
    if ((op == HS_OP_ALL_REDUCE || op == HS_OP_REDUCE_SCATTER) && extra >= 1 &&
        extra <= HS_REDUCE_OP_COUNT)
        snprintf(tail, sizeof tail, " (%s)", reduce_names[extra - 1]);
    else if (op == HS_OP_BROADCAST)
        snprintf(tail, sizeof tail, " (root %lld)", (long long)extra - 1);
    if (op == HS_OP_BARRIER) snprintf(buf, cap, "barrier");
    else if (x->count < 0)
        snprintf(buf, cap, "%s %s (per-rank counts)", hs_comm_op_name(op),
                 hs_dtype_name((hs_dtype)dt));
    else
        snprintf(buf, cap, "%s %s x %lld%s", hs_comm_op_name(op), hs_dtype_name((hs_dtype)dt),
                 (long long)x->count, tail);
}

/* The entry of collective seq in v, or NULL (not issued, or no longer kept). */
static const hs_fp_entry *entry_at(const hs_fp_view *v, int64_t seq) {
    int64_t first = v->count - v->n + 1;
    return seq >= first && seq <= v->count ? &v->entries[seq - first] : NULL;
}

/* "world rank 1 issued all_reduce f32 x 3 (sum)" or "... has issued only N". */
static void side_text(const hs_fp_view *v, int64_t seq, char *buf, size_t cap) {
    const hs_fp_entry *x = entry_at(v, seq);
    char what[128];
    if (x) {
        entry_text(x, what, sizeof what);
        snprintf(buf, cap, "world rank %d issued %s", v->world_rank, what);
    } else if (seq > v->count) {
        snprintf(buf, cap, "world rank %d has issued only %lld collective%s on it", v->world_rank,
                 (long long)v->count, v->count == 1 ? "" : "s");
    } else {
        snprintf(buf, cap, "world rank %d: no longer kept", v->world_rank);
    }
}

static bool same_call(const hs_fp_entry *x, const hs_fp_entry *y) {
    return x->desc == y->desc && x->count == y->count;
}

bool hs_fp_describe(const char *group, const hs_fp_view *a, const hs_fp_view *b, bool behind_ok,
                    char *buf, size_t cap) {
    if (a->count == b->count && a->hash == b->hash) return false;
    /* Both agreed at the last check up to `agreed`; the running hash of an
     * entry seen on both sides proves everything up to it alike. */
    int64_t lo = (a->agreed < b->agreed ? a->agreed : b->agreed) + 1;
    int64_t hi = a->count > b->count ? a->count : b->count;
    int64_t unseen = 0; /* first seq >= lo not compared yet (0: none) */
    char sa[192], sb[192];
    for (int64_t seq = lo; seq <= hi; seq++) {
        const hs_fp_entry *x = entry_at(a, seq), *y = entry_at(b, seq);
        bool gone = (!x && seq <= a->count) || (!y && seq <= b->count);
        if (gone) {
            if (!unseen) unseen = seq;
            continue;
        }
        if (x && y && x->hash == y->hash) {
            unseen = 0;
            continue;
        }
        if (behind_ok && !unseen && (!x || !y)) return false;
        side_text(a, seq, sa, sizeof sa);
        side_text(b, seq, sb, sizeof sb);
        if (unseen && (!x || !y || same_call(x, y)))
            snprintf(buf, cap,
                     "group '%s': the collectives differ between sequence %lld and %lld, "
                     "older than the last %d kept (at %lld: %s; %s); a smaller "
                     "comm.check_every narrows it",
                     group, (long long)unseen, (long long)seq - 1, HS_FP_RING, (long long)seq, sa,
                     sb);
        else snprintf(buf, cap, "group '%s', sequence %lld: %s; %s", group, (long long)seq, sa, sb);
        return true;
    }
    snprintf(buf, cap,
             "group '%s': the fingerprints differ (world rank %d: %lld collectives; world rank "
             "%d: %lld) before sequence %lld",
             group, a->world_rank, (long long)a->count, b->world_rank, (long long)b->count,
             (long long)lo);
    return true;
}

/* Every member found the same mismatch: world rank `reporter` ends the job
 * with the message; the others wait for its end (their watchdog exits
 * them) and end it themselves if it does not come. */
static _Noreturn void fp_end(hs_comm *c, int reporter, const hs_error *e) {
    if (c->rank != reporter) {
        double until = hs_now() + END_WAIT_S;
        struct timespec ts = {0, 20 * 1000 * 1000};
        while (hs_now() < until) nanosleep(&ts, NULL);
    }
    hs_comm_abort(c, e);
}

/* ----------------------------------------------------- per collective */

hs_status hs_fp_compare_each(hs_pg *g, const hs_fp_entry *mine, hs_error *e) {
    if (g->size < 2) return HS_OK;
    if (!g->fp_all) {
        g->fp_all = calloc((size_t)g->size * 4, sizeof *g->fp_all);
        if (!g->fp_all)
            return hs_error_oom(e, "comparing collective fingerprints on group '%s': %zu bytes",
                                g->name, (size_t)g->size * 4 * sizeof *g->fp_all);
    }
    int64_t me[4] = {mine->seq, mine->desc, mine->count, mine->hash};
    hs_coll_args a = {
        .op = HS_OP_ALL_GATHER, .dt = CARRIER, .out = g->fp_all, .in = me, .count = 4 * I64_ELEMS};
    hs_status st = g->backend->exec(g->ctx, &a, e);
    if (st != HS_OK) return st;
    const int64_t *ref = g->fp_all;
    for (int r = 1; r < g->size; r++) {
        const int64_t *o = g->fp_all + 4 * r;
        if (!memcmp(o, ref, sizeof me)) continue;
        hs_fp_entry x = {ref[0], ref[1], ref[2], ref[3]}, y = {o[0], o[1], o[2], o[3]};
        hs_fp_view va = {g->world_ranks[0], x.seq, x.hash, x.seq - 1, &x, 1};
        hs_fp_view vb = {g->world_ranks[r], y.seq, y.hash, y.seq - 1, &y, 1};
        char what[512];
        hs_fp_describe(g->name, &va, &vb, false, what, sizeof what);
        hs_error_set(e, HS_ERR_COMM,
                     "collective fingerprint mismatch (comm.check_every = 1 compares each "
                     "collective before it runs): %s",
                     what);
        hs_error_append(e, HS_ERR_COMM, FIX_LINE);
        fp_end(g->comm, g->world_ranks[0], e);
    }
    return HS_OK;
}

void hs_comm_set_check_each(hs_comm *c, bool on) { atomic_store(&c->fp_each, on); }

/* ------------------------------------------------------ the periodic check */

enum { T_COUNT, T_HASH, T_AGREED, T_LEAD, T_SIZE, T_LEN }; /* per slot, per rank */

/* The lowest world rank of g: every member of one instance of a group name
 * names it alike, and instances of one name are disjoint, so it tells the
 * instances apart. */
static int lead_of(const hs_pg *g) {
    int lead = g->world_ranks[0];
    for (int i = 1; i < g->size; i++)
        if (g->world_ranks[i] < lead) lead = g->world_ranks[i];
    return lead;
}

/* " (in the instance of 'tp' led by world rank 4, of 2 members)" for a
 * group that has several instances over the world; "" for one over all. */
static void instance_text(const char *name, int64_t lead, int64_t size, int world, char *buf,
                          size_t cap) {
    buf[0] = '\0';
    if (size < world)
        snprintf(buf, cap, " (in the instance of '%s' led by world rank %lld, of %lld members)",
                 name, (long long)lead, (long long)size);
}

/* The mismatch found in slot s between world ranks a and b: a second
 * all-gather brings every rank's last entries on s; the message names the
 * first difference. */
static hs_status report_mismatch(hs_comm *c, int s, int a, int b, const int64_t *lead_size,
                                 const char *when, hs_error *e) {
    const int row = 4 + 4 * HS_FP_RING;
    const size_t cells = (size_t)(c->size + 1) * (size_t)row; /* every rank's, then mine */
    int64_t *all = calloc(cells, sizeof *all);
    if (!all)
        return hs_error_oom(e, "reporting a collective fingerprint mismatch: %zu bytes",
                            cells * sizeof *all);
    int64_t *mine = all + (size_t)c->size * (size_t)row;
    hs_pg *g = c->groups[s].pg;
    mine[0] = -1;
    if (g) {
        hs_fp_entry ring[HS_FP_RING];
        pthread_mutex_lock(&g->queue->mu);
        hs_fp_view v = hs_fp_view_of(g, ring, HS_FP_RING);
        pthread_mutex_unlock(&g->queue->mu);
        int64_t head[4] = {v.count, v.hash, v.agreed, v.n};
        memcpy(mine, head, sizeof head);
        memcpy(mine + 4, ring, (size_t)v.n * sizeof *ring);
    }
    hs_status st =
        hs_pg_all_gather(c->world, NULL, all, mine, (int64_t)row * I64_ELEMS, CARRIER, e);
    if (st != HS_OK) {
        free(all);
        return st;
    }
    hs_fp_view v[2];
    for (int k = 0; k < 2; k++) {
        const int64_t *r = all + (size_t)(k ? b : a) * (size_t)row;
        v[k] = (hs_fp_view){k ? b : a, r[0], r[1], r[2], (const hs_fp_entry *)(r + 4), (int)r[3]};
    }
    char what[1024];
    if (!hs_fp_describe(c->groups[s].name, &v[0], &v[1], false, what, sizeof what))
        snprintf(what, sizeof what, "group '%s' (it changed during the check)", c->groups[s].name);
    char where[160];
    instance_text(c->groups[s].name, lead_size[0], lead_size[1], c->size, where, sizeof where);
    hs_error_set(e, HS_ERR_COMM, "collective fingerprint mismatch at the check %s%s: %s", when,
                 where, what);
    hs_error_append(e, HS_ERR_COMM, FIX_LINE);
    free(all);
    fp_end(c, 0, e);
}

/* The first slot where a member's (count, hash) differs from its
 * instance's lead's (the lowest world rank of its instance of the group),
 * and the two world ranks. */
static bool find_mismatch(const int64_t *all, int size, int nslots, int *slot, int *a, int *b) {
    for (int s = 0; s < nslots; s++) {
        for (int r = 0; r < size; r++) {
            const int64_t *t = all + ((size_t)r * (size_t)nslots + (size_t)s) * T_LEN;
            if (t[T_COUNT] < 0 || t[T_LEAD] == r || t[T_LEAD] < 0 || t[T_LEAD] >= size) continue;
            const int lead = (int)t[T_LEAD];
            const int64_t *u = all + ((size_t)lead * (size_t)nslots + (size_t)s) * T_LEN;
            if (u[T_COUNT] != t[T_COUNT] || u[T_HASH] != t[T_HASH] || u[T_LEAD] != t[T_LEAD]) {
                *slot = s, *a = lead, *b = r;
                return true;
            }
        }
    }
    return false;
}

hs_status hs_comm_check(hs_comm *c, const char *when, hs_error *e) {
    if (c->size < 2) return HS_OK;
    const int n = atomic_load(&c->nslots);
    size_t cells = (size_t)n * T_LEN;
    int64_t *all = calloc((size_t)(c->size + 1) * cells, sizeof *all);
    if (!all)
        return hs_error_oom(e, "checking collective fingerprints: %zu bytes",
                            (size_t)(c->size + 1) * cells * sizeof *all);
    int64_t *mine = all + (size_t)c->size * cells;
    for (int s = 0; s < n; s++) {
        hs_pg *g = c->groups[s].pg;
        int64_t *t = mine + (size_t)s * T_LEN;
        t[T_COUNT] = -1, t[T_HASH] = 0, t[T_AGREED] = 0, t[T_LEAD] = -1, t[T_SIZE] = 0;
        if (!g) continue;
        t[T_LEAD] = lead_of(g), t[T_SIZE] = g->size;
        pthread_mutex_lock(&g->queue->mu);
        t[T_COUNT] = g->next_seq, t[T_HASH] = g->fp.hash, t[T_AGREED] = g->fp.agreed;
        pthread_mutex_unlock(&g->queue->mu);
    }
    hs_status st =
        hs_pg_all_gather(c->world, NULL, all, mine, (int64_t)cells * I64_ELEMS, CARRIER, e);
    int slot = 0, a = 0, b = 0;
    bool bad = st == HS_OK && find_mismatch(all, c->size, n, &slot, &a, &b);
    int64_t lead_size[2] = {0, 0};
    if (bad) {
        const int64_t *t = all + ((size_t)b * (size_t)n + (size_t)slot) * T_LEN;
        lead_size[0] = t[T_LEAD], lead_size[1] = t[T_SIZE];
    }
    for (int s = 0; st == HS_OK && !bad && s < n; s++) {
        hs_pg *g = c->groups[s].pg;
        if (!g) continue;
        pthread_mutex_lock(&g->queue->mu);
        g->fp.agreed = mine[(size_t)s * T_LEN + T_COUNT];
        pthread_mutex_unlock(&g->queue->mu);
    }
    free(all);
    if (bad) return report_mismatch(c, slot, a, b, lead_size, when, e);
    return st;
}

/* ---------------------------------------------------------- the test hook */

hs_status hs_fp_fault_init(hs_comm *c, hs_error *e) {
    const char *v = getenv("HS_COMM_TEST_FAULT");
    if (!v || !v[0]) return HS_OK;
    hs_fp_fault *f = &c->fault;
    const char *p1 = strchr(v, ':'), *p2 = p1 ? strchr(p1 + 1, ':') : NULL;
    const char *p3 = strrchr(v, ':');
    char *end = NULL;
    bool ok = p1 && p2 && p3 > p2 && (size_t)(p3 - p2 - 1) < sizeof f->group;
    static const char *const kinds[] = {"skip:", "count:", "reduce:"};
    if (ok) {
        int kind = -1;
        for (int k = 0; k < 3; k++)
            if (!strncmp(v, kinds[k], strlen(kinds[k]))) kind = k;
        ok = kind >= 0;
        f->kind = (hs_fp_fault_kind)(ok ? kind : 0);
        f->rank = (int)strtol(p1 + 1, &end, 10);
        ok = ok && end == p2;
        f->seq = strtoll(p3 + 1, &end, 10);
        ok = ok && *end == '\0' && f->seq > 0;
    }
    if (!ok)
        return hs_error_set(
            e, HS_ERR_USAGE,
            "HS_COMM_TEST_FAULT = '%s': want skip|count|reduce:RANK:GROUP:SEQ, e.g. "
            "count:1:world:5",
            v);
    memcpy(f->group, p2 + 1, (size_t)(p3 - p2 - 1));
    f->group[p3 - p2 - 1] = '\0';
    f->armed = f->rank == c->rank;
    return HS_OK;
}

bool hs_fp_fault_apply(hs_pg *g, hs_coll_args *a) {
    hs_fp_fault *f = &g->comm->fault;
    if (!f->armed || hs_comm_op_is_p2p(a->op) || g->next_seq + 1 != f->seq ||
        strcmp(g->name, f->group))
        return false;
    f->armed = false;
    if (f->kind == HS_FP_FAULT_SKIP) return true;
    if (f->kind == HS_FP_FAULT_COUNT && a->count > 0) a->count--;
    if (f->kind == HS_FP_FAULT_REDUCE)
        a->reduce = a->reduce == HS_REDUCE_SUM ? HS_REDUCE_AVG : HS_REDUCE_SUM;
    return false;
}
