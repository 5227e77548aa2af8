/* hs_comm_write_merged_trace: one file holding every rank's events with
 * pid = rank, clocks aligned, and a failed write reported on every rank.
 * HS_MPI_RANKS: 1 2 4 */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/comm.h"
#include "mpi_test_util.h"

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* The "ts" of the first event containing `needle`, in microseconds. */
static double ts_of(const char *text, const char *needle) {
    const char *p = strstr(text, needle);
    if (!p) return -1.0;
    const char *ts = strstr(p, "\"ts\":");
    return ts ? strtod(ts + 5, NULL) : -1.0;
}

/* Every rank's metadata, its compute span, and a comm span per rank; the
 * pieces are joined by single commas; the spans all ranks recorded right
 * after one barrier land close together on the merged clock. */
static void check_file(hs_comm *c, const char *text, int world) {
    CHECK(c, !strncmp(text, "{\"traceEvents\":[{", 17), "bad start: %.40s", text);
    CHECK(c, strstr(text, "}],\"displayTimeUnit\":\"ms\"}\n") != NULL, "bad end");
    CHECK(c, !strstr(text, ",,") && !strstr(text, "[,") && !strstr(text, ",]"),
          "empty element between ranks");
    CHECK(c, count_of(text, "\"name\":\"process_name\"") == world, "process names: %d of %d",
          count_of(text, "\"name\":\"process_name\""), world);
    CHECK(c, count_of(text, "\"name\":\"all_reduce\"") == world, "comm spans: %d of %d",
          count_of(text, "\"name\":\"all_reduce\""), world);
    double first = 0;
    for (int r = 0; r < world; r++) {
        char want[96];
        snprintf(want, sizeof want, "\"args\":{\"name\":\"rank %d\"}", r);
        CHECK(c, strstr(text, want) != NULL, "no process name for rank %d", r);
        snprintf(want, sizeof want, "{\"name\":\"step.rank%d\",\"ph\":\"X\"", r);
        CHECK(c, strstr(text, want) != NULL, "no compute span of rank %d", r);
        double ts = ts_of(text, want);
        snprintf(want, sizeof want, "\"pid\":%d,\"tid\":0,\"cat\":\"compute\"", r);
        CHECK(c, strstr(text, want) != NULL, "compute span of rank %d has the wrong pid", r);
        if (r == 0) first = ts;
        /* Oversubscribed ranks leave a barrier up to a scheduler slice apart. */
        CHECK(c, ts > 0 && ts - first < 2e6 && first - ts < 2e6,
              "rank %d span at %.0f us, rank 0 at %.0f us: clocks not aligned", r, ts, first);
    }
}

static void run_merge(hs_comm *c, hs_trace *trace) {
    hs_error e;
    hs_error_clear(&e);
    hs_pg *world = hs_comm_world(c);
    CHECK(c, hs_pg_barrier(world, &e) == HS_OK, "%s", e.msg);
    double t0 = hs_now();
    char name[32];
    snprintf(name, sizeof name, "step.rank%d", hs_comm_rank(c));
    hs_trace_span(trace, HS_LANE_COMPUTE, name, "compute", t0, t0 + 1e-3, "\"step\":1");
    float v = 1.0f;
    CHECK(c, hs_pg_all_reduce(world, NULL, &v, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e) == HS_OK, "%s",
          e.msg);

    /* Rank 0 picks the file name; everyone needs it for the collective call. */
    char path[256] = {0};
    if (hs_comm_rank(c) == 0) {
        snprintf(path, sizeof path, "/tmp/hs_merged_trace_XXXXXX");
        int fd = mkstemp(path);
        CHECK(c, fd >= 0, "mkstemp failed");
        close(fd);
    }
    CHECK(c, hs_pg_broadcast(world, NULL, path, sizeof path / 4, HS_DTYPE_F32, 0, &e) == HS_OK,
          "%s", e.msg);
    CHECK(c, hs_comm_write_merged_trace(c, path, &e) == HS_OK, "%s", e.msg);
    if (hs_comm_rank(c) == 0) {
        char *text = NULL;
        CHECK(c, hs_read_file(path, &text, NULL, &e) == HS_OK, "%s", e.msg);
        check_file(c, text, hs_comm_size(c));
        free(text);
        remove(path);
    }
}

static void run_failed_write(hs_comm *c) {
    hs_error e;
    hs_error_clear(&e);
    hs_status s = hs_comm_write_merged_trace(c, "/nonexistent-hs-dir/merged.json", &e);
    CHECK(c, s == HS_ERR_IO, "rank %d: a failed write returned %s", hs_comm_rank(c),
          hs_status_name(s));
    if (hs_comm_rank(c) == 0)
        CHECK(c, strstr(e.msg, "/nonexistent-hs-dir/merged.json") != NULL, "%s", e.msg);
}

int main(int argc, char **argv) {
    hs_trace *trace = NULL;
    hs_comm *c = mt_traced_init(&argc, &argv, 60, true, &trace);
    int rank = hs_comm_rank(c);
    run_merge(c, trace);
    run_failed_write(c);
    if (rank == 0) printf("merged trace ok on %d ranks\n", hs_comm_size(c));
    mt_traced_finalize(c, trace);
    return 0;
}
