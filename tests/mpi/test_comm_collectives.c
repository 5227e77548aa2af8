/* comm/: every collective x dtype x reduce op against a plain reference
 * computed here, on 1, 2, 3, 4 and 8 ranks.
 * HS_MPI_RANKS: 1 2 3 4 8
 * HS_TEST_TIMEOUT: 120
 *
 * Inputs are random values already rounded to the dtype. The references
 * follow the documented order and rounding (docs/comm.md): chunk c is summed
 * starting at rank c+1 and ending at rank c, AVG dividing the last fp32 sum
 * by W. The ring path rounds to the dtype after every hop; the intra-node
 * path sums in fp32 and rounds once. MAX is the largest input, exactly, on
 * both paths; NaN, signed zeros and infinities are pinned separately. The
 * results must match bit for bit.
 *
 * The reductions run on three groups: the world and a reversed world (the
 * intra-node path, as every rank of a test runs on one node, unless the
 * kernel refuses cross-process reads here) and a world created under
 * HS_COMM_SHM=0 (the ring path).
 *
 * The stream forms (a cpu device's stream, hs_work_wait_stream) give the
 * bits of the NULL-stream forms, and issuing on a stream synchronizes it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "mpi_test_util.h"
#include "comm/mpi_group.h"
#include "hypershard/comm.h"

typedef struct ctx {
    hs_comm *comm;
    hs_pg *world;
    int rank, size;
    int failures;
    /* The group the reduction tests run on, its rank and size, and
     * whether it takes the ring path. */
    hs_pg *g;
    int grank, gsize;
    bool ring;
    const char *path;
} ctx;

static const hs_dtype dtypes[3] = {HS_DTYPE_F32, HS_DTYPE_BF16, HS_DTYPE_F16};
static const char *reduce_name[HS_REDUCE_OP_COUNT] = {"sum", "avg", "max"};
_Static_assert(HS_REDUCE_OP_COUNT == 3, "reduce_name follows hs_reduce_op");

/* Value i of rank r's input, already representable in dt: a full mantissa
 * times 2^-12 .. 2^12 (2^-8 .. 2^8 for f16), so that fp32 sums round and
 * the order of summation shows in the bits. */
static float input_value(int r, int64_t i, hs_dtype dt, uint64_t salt) {
    const int spread = dt == HS_DTYPE_F16 ? 8 : 12;
    float u = hs_rng_uniform(1234 + salt, (uint64_t)r, (uint64_t)i) * 2.0f - 1.0f;
    int ex =
        (int)(hs_rng_uniform(4321 + salt, (uint64_t)r, (uint64_t)i) * (float)(2 * spread + 1)) -
        spread;
    return hs_round_to(dt, ldexpf(u, ex));
}

static void *make_input(int r, int64_t n, hs_dtype dt, uint64_t salt) {
    float *f = malloc((size_t)(n ? n : 1) * sizeof(float));
    void *out = malloc((size_t)(n ? n : 1) * hs_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) f[i] = input_value(r, i, dt, salt);
    hs_convert(out, dt, f, HS_DTYPE_F32, n);
    free(f);
    return out;
}

static float load(const void *buf, hs_dtype dt, int64_t i) {
    float v;
    hs_convert(&v, HS_DTYPE_F32, (const char *)buf + (size_t)i * hs_dtype_size(dt), dt, 1);
    return v;
}

/* The documented reduction of element i of chunk c: the ring rounds after
 * every hop, the intra-node path once at the end; MAX never rounds. */
static float reference(const ctx *t, int c, int64_t i, hs_dtype dt, hs_reduce_op op,
                       uint64_t salt) {
    const int w = t->gsize;
    if (w == 1) return input_value(0, i, dt, salt);
    if (op == HS_REDUCE_MAX) {
        float m = input_value(0, i, dt, salt);
        for (int r = 1; r < w; r++) {
            float v = input_value(r, i, dt, salt);
            if (v > m) m = v;
        }
        return m;
    }
    float acc = input_value((c + 1) % w, i, dt, salt);
    for (int k = 2; k < w; k++) {
        acc += input_value((c + k) % w, i, dt, salt);
        if (t->ring) acc = hs_round_to(dt, acc);
    }
    float v = acc + input_value(c, i, dt, salt);
    if (op == HS_REDUCE_AVG) v = v / (float)w;
    return hs_round_to(dt, v);
}

static void test_all_gather_out_of_place_matches_concatenation(ctx *t) {
    const int64_t counts[] = {1, 777, 70001};
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++) {
            int64_t n = counts[k];
            hs_dtype dt = dtypes[d];
            void *in = make_input(t->grank, n, dt, 1);
            void *out = calloc((size_t)(n * t->gsize), hs_dtype_size(dt));
            hs_error e;
            CHECK_COUNT(t, hs_pg_all_gather(t->g, NULL, out, in, n, dt, &e) == HS_OK, "%s", e.msg);
            int bad = 0;
            for (int r = 0; r < t->gsize; r++)
                for (int64_t i = 0; i < n; i++)
                    bad += load(out, dt, r * n + i) != input_value(r, i, dt, 1);
            CHECK_COUNT(t, bad == 0, "%s all_gather %s count %lld: %d wrong elements", t->path,
                        hs_dtype_name(dt), (long long)n, bad);
            free(in);
            free(out);
        }
}

static void test_all_gather_in_place_when_in_is_own_block(ctx *t) {
    const int64_t n = 1001;
    for (int d = 0; d < 3; d++) {
        hs_dtype dt = dtypes[d];
        size_t es = hs_dtype_size(dt);
        char *out = calloc((size_t)(n * t->gsize), es);
        void *mine = make_input(t->grank, n, dt, 2);
        memcpy(out + (size_t)(t->grank * n) * es, mine, (size_t)n * es);
        hs_error e;
        CHECK_COUNT(t,
                    hs_pg_all_gather(t->g, NULL, out, out + (size_t)(t->grank * n) * es, n, dt,
                                     &e) == HS_OK,
                    "%s", e.msg);
        int bad = 0;
        for (int r = 0; r < t->gsize; r++)
            for (int64_t i = 0; i < n; i++)
                bad += load(out, dt, r * n + i) != input_value(r, i, dt, 2);
        CHECK_COUNT(t, bad == 0, "%s in-place all_gather %s: %d wrong elements", t->path,
                    hs_dtype_name(dt), bad);
        free(mine);
        free(out);
    }
}

/* Rank r's input is W chunks: value j of the whole buffer. In place, the
 * output is the rank's own chunk of the input. 70001 elements span two
 * reduction tiles of the intra-node path, the second one partial. */
static void check_reduce_scatter(ctx *t, hs_dtype dt, hs_reduce_op op, int64_t n, bool in_place) {
    const size_t es = hs_dtype_size(dt);
    char *in = make_input(t->grank, n * t->gsize, dt, 3);
    char *out = in_place ? in + (size_t)(t->grank * n) * es : calloc((size_t)n, es);
    hs_error e;
    CHECK_COUNT(t, hs_pg_reduce_scatter(t->g, NULL, out, in, n, dt, op, &e) == HS_OK, "%s", e.msg);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += load(out, dt, i) != reference(t, t->grank, t->grank * n + i, dt, op, 3);
    CHECK_COUNT(t, bad == 0, "%s %sreduce_scatter %s %s count %lld: %d wrong elements", t->path,
                in_place ? "in-place " : "", hs_dtype_name(dt), reduce_name[op], (long long)n, bad);
    if (!in_place) free(out);
    free(in);
}

static void test_reduce_scatter_matches_reference_bitwise(ctx *t) {
    const int64_t counts[] = {1, 513, 3000, 70001};
    for (int d = 0; d < 3; d++)
        for (int op = 0; op < HS_REDUCE_OP_COUNT; op++)
            for (int k = 0; k < 4; k++)
                check_reduce_scatter(t, dtypes[d], (hs_reduce_op)op, counts[k], false);
}

static void test_reduce_scatter_in_place_matches_reference_bitwise(ctx *t) {
    for (int d = 0; d < 3; d++)
        for (int op = 0; op < HS_REDUCE_OP_COUNT; op++)
            check_reduce_scatter(t, dtypes[d], (hs_reduce_op)op, 1027, true);
}

/* Chunk c of an all-reduce of n elements over w ranks (n/w, first n%w one more). */
static int chunk_of(int64_t n, int w, int64_t i) {
    int64_t base = n / w, rem = n % w;
    int64_t big = rem * (base + 1);
    return i < big ? (int)(i / (base + 1)) : (int)(rem + (i - big) / (base ? base : 1));
}

static void test_all_reduce_uneven_counts_match_reference_bitwise(ctx *t) {
    const int64_t counts[] = {1, 3, 10, 1027, 4099, 140003};
    for (int d = 0; d < 3; d++)
        for (int op = 0; op < HS_REDUCE_OP_COUNT; op++)
            for (int k = 0; k < 6; k++) {
                hs_dtype dt = dtypes[d];
                int64_t n = counts[k];
                void *buf = make_input(t->grank, n, dt, 4);
                hs_error e;
                CHECK_COUNT(t,
                            hs_pg_all_reduce(t->g, NULL, buf, n, dt, (hs_reduce_op)op, &e) == HS_OK,
                            "%s", e.msg);
                int bad = 0;
                for (int64_t i = 0; i < n; i++)
                    bad += load(buf, dt, i) !=
                           reference(t, chunk_of(n, t->gsize, i), i, dt, (hs_reduce_op)op, 4);
                CHECK_COUNT(t, bad == 0, "%s all_reduce %s %s count %lld: %d wrong elements",
                            t->path, hs_dtype_name(dt), reduce_name[op], (long long)n, bad);
                free(buf);
            }
}

/* Independent of the rounding model: small integers add exactly in bf16. */
static void test_all_reduce_bf16_integers_is_exact_sum(ctx *t) {
    const int64_t n = 999;
    uint16_t *buf = malloc(n * sizeof *buf);
    for (int64_t i = 0; i < n; i++) buf[i] = hs_f32_to_bf16((float)((i + t->grank) % 7));
    hs_error e;
    CHECK_COUNT(t, hs_pg_all_reduce(t->g, NULL, buf, n, HS_DTYPE_BF16, HS_REDUCE_SUM, &e) == HS_OK,
                "%s", e.msg);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int want = 0;
        for (int r = 0; r < t->gsize; r++) want += (int)((i + r) % 7);
        bad += hs_bf16_to_f32(buf[i]) != (float)want;
    }
    CHECK_COUNT(t, bad == 0, "%s bf16 integer all_reduce: %d wrong elements", t->path, bad);
    free(buf);
}

/* Element j of group rank r's input for the MAX edge cases: seven kinds of
 * element, and in each run of seven one "odd" rank that holds the special
 * value, so every rank (and so every position in the order of reduction)
 * holds it somewhere. */
static float max_edge_value(int64_t j, int r, int w) {
    const bool odd = r == (int)((j / 7) % w);
    switch (j % 7) {
    case 0: return odd ? nanf("") : 1.0f;
    case 1: return odd ? 0.0f : -0.0f;
    case 2: return -0.0f;
    case 3: return odd ? -3.5f : -INFINITY;
    case 4: return odd ? INFINITY : 65504.0f;
    case 5: return -(float)(r + 1);
    default: { /* a NaN on every rank, with its own sign and payload */
        uint32_t bits = 0x7FA00000u | ((uint32_t)r << 16) | (r % 2 ? 0x80000000u : 0u);
        float v;
        memcpy(&v, &bits, sizeof v);
        return v;
    }
    }
}

/* What MAX must give for element j: NaN as the default quiet NaN. */
static float max_edge_expected(int64_t j) {
    static const float want[7] = {NAN, 0.0f, -0.0f, -3.5f, INFINITY, -1.0f, NAN};
    return want[j % 7];
}

/* The values of elements first .. first+n-1 in dt, for rank r (r < 0: the
 * expectation). */
static void *max_edge_buffer(int64_t first, int64_t n, int r, int w, hs_dtype dt) {
    float *f = malloc((size_t)n * sizeof(float));
    void *out = malloc((size_t)n * hs_dtype_size(dt));
    for (int64_t i = 0; i < n; i++)
        f[i] = r < 0 ? max_edge_expected(first + i) : max_edge_value(first + i, r, w);
    hs_convert(out, dt, f, HS_DTYPE_F32, n);
    free(f);
    return out;
}

/* NaN wins with one canonical NaN, +0 beats -0, infinities compare: the
 * same bits whichever rank holds the special value and on both paths. */
static void test_max_edge_values_bitwise(ctx *t) {
    if (t->gsize < 2) return;
    const int64_t n = 7 * 11; /* whole vectors and a tail */
    for (int d = 0; d < 3; d++) {
        hs_dtype dt = dtypes[d];
        size_t es = hs_dtype_size(dt);
        hs_error e;
        void *buf = max_edge_buffer(0, n, t->grank, t->gsize, dt),
             *want = max_edge_buffer(0, n, -1, t->gsize, dt);
        CHECK_COUNT(t, hs_pg_all_reduce(t->g, NULL, buf, n, dt, HS_REDUCE_MAX, &e) == HS_OK, "%s",
                    e.msg);
        CHECK_COUNT(t, !memcmp(buf, want, (size_t)n * es),
                    "%s all_reduce max edge values %s differ", t->path, hs_dtype_name(dt));
        free(buf);
        free(want);
        void *in = max_edge_buffer(0, n * t->gsize, t->grank, t->gsize, dt),
             *out = malloc((size_t)n * es);
        want = max_edge_buffer((int64_t)t->grank * n, n, -1, t->gsize, dt);
        CHECK_COUNT(t, hs_pg_reduce_scatter(t->g, NULL, out, in, n, dt, HS_REDUCE_MAX, &e) == HS_OK,
                    "%s", e.msg);
        CHECK_COUNT(t, !memcmp(out, want, (size_t)n * es),
                    "%s reduce_scatter max edge values %s differ", t->path, hs_dtype_name(dt));
        free(in);
        free(out);
        free(want);
    }
}

/* The 16-bit rounding of the two paths differs by design: the intra-node
 * path rounds once, the ring after every hop (W >= 3 tells them apart). */
static void test_paths_differ_only_in_16bit_roundings(ctx *t) {
    if (t->gsize < 3) return;
    const int64_t n = 4096;
    int differ[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        hs_dtype dt = d ? HS_DTYPE_BF16 : HS_DTYPE_F32;
        for (int64_t i = 0; i < n; i++) {
            ctx ring = *t, shm = *t;
            ring.ring = true, shm.ring = false;
            differ[d] += reference(&ring, 0, i, dt, HS_REDUCE_SUM, 3) !=
                         reference(&shm, 0, i, dt, HS_REDUCE_SUM, 3);
        }
    }
    CHECK_COUNT(t, differ[0] == 0, "f32 references differ in %d elements", differ[0]);
    CHECK_COUNT(t, differ[1] > 0,
                "bf16 references agree everywhere: the test cannot tell the paths apart");
}

/* Element i of block j sent by rank r: encodes (r, j, i). */
static float a2a_value(int r, int j, int64_t i) {
    return (float)(r * 1000 + j * 10) + (float)(i % 10);
}

/* On the group under test (both paths, run_group_tests), in its ranks. */
static void test_all_to_all_transposes_blocks(ctx *t) {
    const int64_t n = 300;
    int me = t->grank, w = t->gsize;
    float *in = calloc(n * w, sizeof(float)), *out = calloc(n * w, sizeof(float));
    for (int j = 0; j < w; j++)
        for (int64_t i = 0; i < n; i++) in[j * n + i] = a2a_value(me, j, i);
    hs_error e;
    CHECK_COUNT(t, hs_pg_all_to_all(t->g, NULL, out, in, n, HS_DTYPE_F32, &e) == HS_OK, "%s",
                e.msg);
    int bad = 0;
    for (int r = 0; r < w; r++)
        for (int64_t i = 0; i < n; i++) bad += out[r * n + i] != a2a_value(r, me, i);
    CHECK_COUNT(t, bad == 0, "all_to_all on the %s: %d wrong elements", t->path, bad);
    free(in);
    free(out);
}

static void test_all_to_allv_uneven_counts_land_at_displacements(ctx *t) {
    const int w = t->gsize, me = t->grank;
    int64_t *sc = calloc(w, 8), *sd = calloc(w, 8), *rc = calloc(w, 8), *rd = calloc(w, 8);
    int64_t stot = 0, rtot = 0;
    for (int j = 0; j < w; j++) {
        sc[j] = me + 2 * j + 1; /* rank r sends r + 2j + 1 elements to j */
        rc[j] = j + 2 * me + 1;
        sd[j] = stot, stot += sc[j];
        rd[j] = rtot, rtot += rc[j];
    }
    uint16_t *in = calloc(stot + 1, 2), *out = calloc(rtot, 2);
    for (int j = 0; j < w; j++)
        for (int64_t i = 0; i < sc[j]; i++) in[sd[j] + i] = hs_f32_to_bf16(a2a_value(me, j, i));
    hs_work *wk = hs_pg_all_to_allv_async(t->g, NULL, out, rc, rd, in, sc, sd, HS_DTYPE_BF16);
    hs_error e;
    CHECK_COUNT(t, hs_work_wait(wk, &e) == HS_OK, "%s", e.msg);
    int bad = 0;
    for (int r = 0; r < w; r++)
        for (int64_t i = 0; i < rc[r]; i++)
            bad += hs_bf16_to_f32(out[rd[r] + i]) !=
                   hs_round_to(HS_DTYPE_BF16, a2a_value(r, me, i));
    CHECK_COUNT(t, bad == 0, "all_to_allv on the %s: %d wrong elements", t->path, bad);
    free(in), free(out), free(sc), free(sd), free(rc), free(rd);
}

/* Every reduction test, and the all-to-all(v), on one group. */
static void run_group_tests(ctx *t, hs_pg *g, bool ring, const char *path) {
    t->g = g;
    t->grank = hs_pg_rank(g);
    t->gsize = hs_pg_size(g);
    t->ring = ring;
    t->path = path;
    test_all_gather_out_of_place_matches_concatenation(t);
    test_all_gather_in_place_when_in_is_own_block(t);
    test_reduce_scatter_matches_reference_bitwise(t);
    test_reduce_scatter_in_place_matches_reference_bitwise(t);
    test_all_reduce_uneven_counts_match_reference_bitwise(t);
    test_all_reduce_bf16_integers_is_exact_sum(t);
    test_max_edge_values_bitwise(t);
    test_paths_differ_only_in_16bit_roundings(t);
    test_all_to_all_transposes_blocks(t);
    test_all_to_allv_uneven_counts_land_at_displacements(t);
}

/* Which path the backend chose for g. */
static bool takes_ring(const hs_pg *g) { return ((const hs_mpi_group *)g->ctx)->shm == NULL; }

/* The same tests on the intra-node path (world, and a world in reverse rank
 * order) and on the ring (a world created under HS_COMM_SHM=0). */
static void test_reductions_on_both_paths(ctx *t) {
    hs_pg *rev = NULL, *ring = NULL;
    hs_error e;
    CHECK_COUNT(t, hs_comm_split(t->comm, "reversed_world", 3, -t->rank, &rev, &e) == HS_OK, "%s",
                e.msg);
    setenv("HS_COMM_SHM", "0", 1);
    CHECK_COUNT(t, hs_comm_split(t->comm, "ring_world", 3, t->rank, &ring, &e) == HS_OK, "%s",
                e.msg);
    unsetenv("HS_COMM_SHM");
    if (!rev || !ring) return;
    CHECK_COUNT(t, takes_ring(ring), "a group created under HS_COMM_SHM=0 must take the ring path");
    CHECK_COUNT(t, takes_ring(rev) == takes_ring(t->world),
                "world and reversed world chose different paths");
    if (t->size > 1 && takes_ring(t->world) && t->rank == 0)
        printf(
            "note: cross-process reads are refused here; the intra-node tests run on the ring\n");
    run_group_tests(t, t->world, takes_ring(t->world), "world");
    run_group_tests(t, rev, takes_ring(rev), "reversed world");
    run_group_tests(t, ring, true, "ring world");
}

static void test_broadcast_from_last_rank_reaches_everyone(ctx *t) {
    const int64_t n = 5000;
    for (int d = 0; d < 3; d++) {
        hs_dtype dt = dtypes[d];
        int root = t->size - 1;
        void *buf = make_input(t->rank == root ? root : 1000 + t->rank, n, dt, 5);
        hs_error e;
        CHECK_COUNT(t, hs_pg_broadcast(t->world, NULL, buf, n, dt, root, &e) == HS_OK, "%s", e.msg);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) bad += load(buf, dt, i) != input_value(root, i, dt, 5);
        CHECK_COUNT(t, bad == 0, "broadcast %s from %d: %d wrong elements", hs_dtype_name(dt), root,
                    bad);
        free(buf);
    }
}

/* Rendezvous-sized messages around the ring; even ranks send first so the
 * blocking sends on the communication threads always meet a receive. */
static void test_send_recv_ring_pass(ctx *t) {
    if (t->size < 2) return;
    const int64_t n = 100000;
    int right = (t->rank + 1) % t->size, left = (t->rank + t->size - 1) % t->size;
    float *sb = malloc(n * sizeof(float)), *rb = calloc(n, sizeof(float));
    for (int64_t i = 0; i < n; i++) sb[i] = (float)(t->rank * 7 + i % 100);
    hs_work *w1, *w2;
    if (t->rank % 2 == 0) {
        w1 = hs_pg_send_async(t->world, NULL, sb, n, HS_DTYPE_F32, right, 5);
        w2 = hs_pg_recv_async(t->world, NULL, rb, n, HS_DTYPE_F32, left, 5);
    } else {
        w1 = hs_pg_recv_async(t->world, NULL, rb, n, HS_DTYPE_F32, left, 5);
        w2 = hs_pg_send_async(t->world, NULL, sb, n, HS_DTYPE_F32, right, 5);
    }
    hs_error e;
    CHECK_COUNT(t, hs_work_wait(w1, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, hs_work_wait(w2, &e) == HS_OK, "%s", e.msg);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += rb[i] != (float)(left * 7 + i % 100);
    CHECK_COUNT(t, bad == 0, "recv from %d: %d wrong elements", left, bad);
    free(sb);
    free(rb);
}

/* ------------------------------------------------- the stream forms
 * comm.h's stream argument on a cpu device's own stream: inputs copied in
 * on the stream, the collective issued on it and waited with
 * hs_work_wait_stream, results copied out on it. Each must give the bits
 * of its NULL-stream form on host buffers, and every issue on a stream
 * synchronizes that stream first (counted through the device's table). */
static int stream_syncs;
static void (*cpu_stream_synchronize)(hs_stream *s);

static void counting_stream_synchronize(hs_stream *s) {
    stream_syncs++;
    cpu_stream_synchronize(s);
}

static void *to_device(hs_stream *s, const void *host, size_t bytes) {
    void *p = hs_device_alloc(s->dev, bytes);
    hs_device_copy_async(s, p, host, bytes, HS_COPY_H2D);
    return p;
}

/* The device buffer's bytes equal ref's, read back on s. */
static void check_device_bits(ctx *t, hs_stream *s, const void *dev, const void *ref, size_t bytes,
                              const char *what) {
    void *got = malloc(bytes);
    hs_device_copy_async(s, got, dev, bytes, HS_COPY_D2H);
    hs_stream_synchronize(s);
    CHECK_COUNT(t, memcmp(got, ref, bytes) == 0, "%s on a stream differs from the NULL-stream form",
                what);
    free(got);
}

/* Issue w with `issue`; it must have synchronized s once, then wait on s. */
#define ISSUED_ON(t, s, issue, what)                                                               \
    do {                                                                                           \
        int before_ = stream_syncs;                                                                \
        hs_work *w_ = (issue);                                                                     \
        CHECK_COUNT(t, stream_syncs == before_ + 1, "%s: issue synchronized its stream %d times",  \
                    what, stream_syncs - before_);                                                 \
        hs_error we_;                                                                              \
        CHECK_COUNT(t, hs_work_wait_stream(w_, s, &we_) == HS_OK, "%s: %s", what, we_.msg);        \
    } while (0)

static void stream_ring_pass(ctx *t, hs_stream *s, void *rb, const void *sb, int64_t n) {
    int right = (t->rank + 1) % t->size, left = (t->rank + t->size - 1) % t->size;
    hs_error e;
    hs_work *w1, *w2;
    if (t->rank % 2 == 0) {
        w1 = hs_pg_send_async(t->world, s, sb, n, HS_DTYPE_F32, right, 6);
        w2 = hs_pg_recv_async(t->world, s, rb, n, HS_DTYPE_F32, left, 6);
    } else {
        w1 = hs_pg_recv_async(t->world, s, rb, n, HS_DTYPE_F32, left, 6);
        w2 = hs_pg_send_async(t->world, s, sb, n, HS_DTYPE_F32, right, 6);
    }
    CHECK_COUNT(t, hs_work_wait_stream(w1, s, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, hs_work_wait_stream(w2, s, &e) == HS_OK, "%s", e.msg);
}

static void test_stream_forms_match_null_stream_bitwise(ctx *t) {
    hs_device *d = NULL;
    hs_error e;
    CHECK_COUNT(t, hs_device_create(HS_DEVICE_CPU, NULL, &d, &e) == HS_OK, "%s", e.msg);
    if (!d) return;
    const hs_device_ops *cpu_ops = d->ops;
    hs_device_ops counting = *cpu_ops;
    cpu_stream_synchronize = cpu_ops->stream_synchronize;
    counting.stream_synchronize = counting_stream_synchronize;
    d->ops = &counting;
    hs_stream *s = NULL;
    CHECK_COUNT(t, hs_stream_create(d, &s, &e) == HS_OK, "%s", e.msg);
    const int64_t n = 1000, W = t->size;

    /* all-gather, fp32, async */
    void *in = make_input(t->rank, n, HS_DTYPE_F32, 81);
    void *ref = malloc((size_t)(W * n) * sizeof(float));
    CHECK_COUNT(t, hs_pg_all_gather(t->world, NULL, ref, in, n, HS_DTYPE_F32, &e) == HS_OK, "%s",
                e.msg);
    void *din = to_device(s, in, (size_t)n * sizeof(float));
    void *dout = hs_device_alloc(d, (size_t)(W * n) * sizeof(float));
    ISSUED_ON(t, s, hs_pg_all_gather_async(t->world, s, dout, din, n, HS_DTYPE_F32), "all_gather");
    check_device_bits(t, s, dout, ref, (size_t)(W * n) * sizeof(float), "all_gather");
    hs_device_free_mem(d, din), hs_device_free_mem(d, dout), free(in), free(ref);

    /* reduce-scatter, bf16 AVG (the rounding shows in the bits), blocking on s */
    size_t es = hs_dtype_size(HS_DTYPE_BF16);
    in = make_input(t->rank, W * n, HS_DTYPE_BF16, 82);
    ref = malloc((size_t)n * es);
    hs_work *w =
        hs_pg_reduce_scatter_async(t->world, NULL, ref, in, n, HS_DTYPE_BF16, HS_REDUCE_AVG);
    CHECK_COUNT(t, hs_work_wait_stream(w, NULL, &e) == HS_OK, "%s", e.msg);
    din = to_device(s, in, (size_t)(W * n) * es);
    dout = hs_device_alloc(d, (size_t)n * es);
    int before = stream_syncs;
    CHECK_COUNT(t,
                hs_pg_reduce_scatter(t->world, s, dout, din, n, HS_DTYPE_BF16, HS_REDUCE_AVG, &e) ==
                    HS_OK,
                "%s", e.msg);
    CHECK_COUNT(t, stream_syncs == before + 1, "reduce_scatter synchronized its stream %d times",
                stream_syncs - before);
    check_device_bits(t, s, dout, ref, (size_t)n * es, "reduce_scatter");
    hs_device_free_mem(d, din), hs_device_free_mem(d, dout), free(in), free(ref);

    /* all-reduce, f16 SUM, in place, async */
    es = hs_dtype_size(HS_DTYPE_F16);
    in = make_input(t->rank, n, HS_DTYPE_F16, 83);
    din = to_device(s, in, (size_t)n * es);
    CHECK_COUNT(t,
                hs_pg_all_reduce(t->world, NULL, in, n, HS_DTYPE_F16, HS_REDUCE_SUM, &e) == HS_OK,
                "%s", e.msg);
    ISSUED_ON(t, s, hs_pg_all_reduce_async(t->world, s, din, n, HS_DTYPE_F16, HS_REDUCE_SUM),
              "all_reduce");
    check_device_bits(t, s, din, in, (size_t)n * es, "all_reduce");
    hs_device_free_mem(d, din), free(in);

    /* send / recv around the ring */
    if (t->size >= 2) {
        in = make_input(t->rank, n, HS_DTYPE_F32, 84);
        ref = calloc((size_t)n, sizeof(float));
        stream_ring_pass(t, NULL, ref, in, n);
        din = to_device(s, in, (size_t)n * sizeof(float));
        dout = hs_device_alloc(d, (size_t)n * sizeof(float));
        before = stream_syncs;
        stream_ring_pass(t, s, dout, din, n);
        CHECK_COUNT(t, stream_syncs == before + 2, "send + recv synchronized their stream %d times",
                    stream_syncs - before);
        check_device_bits(t, s, dout, ref, (size_t)n * sizeof(float), "send/recv");
        hs_device_free_mem(d, din), hs_device_free_mem(d, dout), free(in), free(ref);
    }
    hs_stream_free(s);
    d->ops = cpu_ops;
    hs_device_free(d);
}

static void test_barrier_and_work_test_complete(ctx *t) {
    hs_work *w = hs_pg_barrier_async(t->world);
    while (!hs_work_test(w)) {
    }
    hs_error e;
    CHECK_COUNT(t, hs_work_wait(w, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, hs_pg_barrier(t->world, &e) == HS_OK, "%s", e.msg);
}

static void test_split_orders_by_key_and_caches_by_name(ctx *t) {
    hs_pg *rev = NULL, *again = NULL, *none = (hs_pg *)1, *none2 = (hs_pg *)1;
    hs_error e;
    /* One group, keyed in reverse: group rank = size-1-world rank. */
    CHECK_COUNT(t, hs_comm_split(t->comm, "reversed", 7, -t->rank, &rev, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, rev && hs_pg_size(rev) == t->size, "reversed group size");
    CHECK_COUNT(t, rev && hs_pg_rank(rev) == t->size - 1 - t->rank, "group rank %d",
                rev ? hs_pg_rank(rev) : -1);
    CHECK_COUNT(t, rev && hs_pg_world_rank(rev, 0) == t->size - 1, "world rank of group rank 0");
    CHECK_COUNT(t, !strcmp(hs_pg_name(rev), "reversed"), "name %s", hs_pg_name(rev));
    /* The same name again: the cached group, whatever the arguments. */
    CHECK_COUNT(t, hs_comm_split(t->comm, "reversed", 99, 0, &again, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, again == rev, "cached group differs");
    /* Colour < 0 on odd ranks: no group there, twice. */
    CHECK_COUNT(t,
                hs_comm_split(t->comm, "evens_only", t->rank % 2 ? -1 : 0, 0, &none, &e) == HS_OK,
                "%s", e.msg);
    CHECK_COUNT(t,
                hs_comm_split(t->comm, "evens_only", t->rank % 2 ? -1 : 0, 0, &none2, &e) == HS_OK,
                "%s", e.msg);
    CHECK_COUNT(t, (t->rank % 2 != 0) == (none == NULL) && none == none2,
                "colour < 0 must give NULL");
    CHECK_COUNT(t, hs_comm_world(t->comm) == t->world && !strcmp(hs_pg_name(t->world), "world"),
                "world");
    if (none) {
        float evens = 1.0f;
        CHECK_COUNT(
            t, hs_pg_all_reduce(none, NULL, &evens, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e) == HS_OK,
            "%s", e.msg);
        CHECK_COUNT(t, evens == (float)((t->size + 1) / 2), "even ranks counted %g", evens);
    }
}

/* Small integers: every order of summation gives the same float. */
static float interleave_value(int world_rank, int k, int64_t i) {
    return (float)(world_rank + k + i % 3);
}

/* Rounds alternate between the world, the parity groups and the ring-path
 * world, and between all-reduce, reduce-scatter and all-gather, all async;
 * waits in reverse order. */
static void test_groups_interleaved_async(ctx *t) {
    hs_pg *par = NULL, *ring = NULL;
    hs_error e;
    CHECK_COUNT(t, hs_comm_split(t->comm, "parity", t->rank % 2, t->rank, &par, &e) == HS_OK, "%s",
                e.msg);
    CHECK_COUNT(t, hs_comm_split(t->comm, "ring_world", 3, t->rank, &ring, &e) == HS_OK, "%s",
                e.msg);
    enum { ROUNDS = 9, N = 2000 };
    hs_pg *groups[3] = {t->world, par, ring};
    float *in[ROUNDS], *out[ROUNDS];
    hs_work *w[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
        hs_pg *g = groups[k % 3];
        int gw = hs_pg_size(g), gr = hs_pg_rank(g);
        in[k] = malloc(sizeof(float) * N * (size_t)gw);
        out[k] = calloc((size_t)N * (size_t)gw, sizeof(float));
        for (int64_t i = 0; i < N * gw; i++) in[k][i] = interleave_value(t->rank, k, i);
        if (k / 3 == 0)
            w[k] = hs_pg_all_reduce_async(g, NULL, in[k], N, HS_DTYPE_F32, HS_REDUCE_SUM);
        else if (k / 3 == 1)
            w[k] =
                hs_pg_reduce_scatter_async(g, NULL, out[k], in[k], N, HS_DTYPE_F32, HS_REDUCE_SUM);
        else
            w[k] = hs_pg_all_gather_async(g, NULL, out[k], in[k] + (size_t)gr * N, N, HS_DTYPE_F32);
    }
    for (int k = ROUNDS - 1; k >= 0; k--)
        CHECK_COUNT(t, hs_work_wait(w[k], &e) == HS_OK, "%s", e.msg);
    int bad = 0;
    for (int k = 0; k < ROUNDS; k++) {
        hs_pg *g = groups[k % 3];
        int gw = hs_pg_size(g), gr = hs_pg_rank(g);
        for (int64_t i = 0; i < N; i++) {
            float want = 0;
            if (k / 3 == 0) {
                for (int r = 0; r < gw; r++) want += interleave_value(hs_pg_world_rank(g, r), k, i);
                bad += in[k][i] != want;
            } else if (k / 3 == 1) {
                for (int r = 0; r < gw; r++)
                    want += interleave_value(hs_pg_world_rank(g, r), k, gr * N + i);
                bad += out[k][i] != want;
            } else {
                for (int r = 0; r < gw; r++)
                    bad += out[k][r * N + i] !=
                           interleave_value(hs_pg_world_rank(g, r), k, r * N + i);
            }
        }
        free(in[k]);
        free(out[k]);
    }
    CHECK_COUNT(t, bad == 0, "interleaved groups: %d wrong elements", bad);
}

static void test_every_collective_is_counted_in_the_trace(ctx *t) {
    hs_trace *tr = hs_comm_trace(t->comm);
    hs_trace_reset_counters(tr);
    float x[64] = {0}, y[64 * 8] = {0};
    hs_error e;
    hs_pg_all_reduce(t->world, NULL, x, 64, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    hs_pg_all_reduce(t->world, NULL, x, 32, HS_DTYPE_BF16, HS_REDUCE_AVG, &e);
    hs_pg_all_gather(t->world, NULL, y, x, 64 / t->size, HS_DTYPE_F32, &e);
    hs_pg_barrier(t->world, &e);
    CHECK_COUNT(t, hs_trace_collectives(tr, "all_reduce", "world") == 2, "all_reduce count %lld",
                (long long)hs_trace_collectives(tr, "all_reduce", "world"));
    CHECK_COUNT(t, hs_trace_collective_bytes(tr, "all_reduce", "world") == 64 * 4 + 32 * 2,
                "all_reduce bytes");
    CHECK_COUNT(
        t, hs_trace_collective_bytes(tr, "all_gather", "world") == (64 / t->size) * t->size * 4,
        "all_gather bytes");
    CHECK_COUNT(t, hs_trace_collectives(tr, "barrier", NULL) == 1, "barrier count");
    CHECK_COUNT(t, hs_trace_collectives(tr, NULL, NULL) == 4, "total count");
}

/* A second context in the same process (MPI is reused, not re-initialised)
 * with tracing on: the span of a collective carries group, bytes, dtype and
 * sequence number. */
static void test_second_context_traces_span_with_group_bytes_dtype_seq(ctx *t, int *argc,
                                                                       char ***argv) {
    hs_trace *tr = hs_trace_create(t->rank, true, NULL);
    hs_comm_options opt = {.timeout_s = 60, .trace = tr};
    hs_comm *c2 = NULL;
    hs_error e;
    CHECK_COUNT(t, hs_comm_init(&c2, argc, argv, &opt, &e) == HS_OK, "%s", e.msg);
    if (!c2) return;
    uint16_t x[48] = {0};
    CHECK_COUNT(
        t,
        hs_pg_all_reduce(hs_comm_world(c2), NULL, x, 48, HS_DTYPE_BF16, HS_REDUCE_AVG, &e) == HS_OK,
        "%s", e.msg);
    CHECK_COUNT(
        t,
        hs_pg_all_reduce(hs_comm_world(c2), NULL, x, 48, HS_DTYPE_BF16, HS_REDUCE_AVG, &e) == HS_OK,
        "%s", e.msg);
    char *body = NULL;
    size_t len = 0;
    CHECK_COUNT(t, hs_trace_serialize(tr, 0.0, &body, &len, &e) == HS_OK, "%s", e.msg);
    const char *want = "\"group\":\"world\",\"bytes\":96,\"dtype\":\"bfloat16\",\"seq\":2";
    CHECK_COUNT(t, body && strstr(body, want) && strstr(body, "all_reduce"),
                "trace lacks %s: %.300s", want, body ? body : "");
    free(body);
    hs_comm_finalize(c2);
    hs_trace_free(tr);
    /* The first context still works after the second is gone. */
    float one = 1.0f;
    CHECK_COUNT(t,
                hs_pg_all_reduce(t->world, NULL, &one, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e) == HS_OK,
                "%s", e.msg);
    CHECK_COUNT(t, one == (float)t->size, "all_reduce after second context: %g", one);
}

int main(int argc, char **argv) {
    ctx t = {0};
    hs_error e;
    hs_comm_options opt = {.timeout_s = 60};
    if (hs_comm_init(&t.comm, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hs_comm_init: %s\n", e.msg);
        return 1;
    }
    t.world = hs_comm_world(t.comm);
    t.rank = hs_comm_rank(t.comm);
    t.size = hs_comm_size(t.comm);
    test_reductions_on_both_paths(&t);
    test_broadcast_from_last_rank_reaches_everyone(&t);
    test_send_recv_ring_pass(&t);
    test_stream_forms_match_null_stream_bitwise(&t);
    test_barrier_and_work_test_complete(&t);
    test_split_orders_by_key_and_caches_by_name(&t);
    test_groups_interleaved_async(&t);
    test_every_collective_is_counted_in_the_trace(&t);
    test_second_context_traces_span_with_group_bytes_dtype_seq(&t, &argc, &argv);
    int rc = mt_verdict(t.failures, t.rank, t.size);
    hs_comm_finalize(t.comm);
    return rc;
}
