/* comm/: the watchdog and hs_comm_abort.
 * HS_MPI_RANKS: 2 3
 * HS_TEST_TIMEOUT: 60
 *
 * Without arguments (as ctest runs it) this pins the quiet side: a 2.5 s
 * watchdog never fires on collectives that finish in time, even when one
 * rank arrives 0.6 s late to each of them, on the world and on a subgroup.
 *
 * With arguments it is the faulty program that tests/cli/test_comm_faults.sh
 * runs under mpiexec and expects to end every rank:
 *   hang RANK SECONDS GROUP   RANK sleeps before an all_reduce on GROUP
 *                             ("world" or "pair": ranks {0,1}) with a 2 s
 *                             timeout
 *   abort RANK                RANK calls hs_comm_abort with a config error
 *                             while the others wait in a barrier */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "hypershard/comm.h"

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int fail(const char *what, const hs_error *e) {
    fprintf(stderr, "%s: %s\n", what, e->msg);
    return 1;
}

static int run_quiet(hs_comm *c) {
    hs_error e;
    hs_pg *pair = NULL;
    int rank = hs_comm_rank(c);
    if (hs_comm_split(c, "pair", rank < 2 ? 0 : -1, 0, &pair, &e) != HS_OK) return fail("split", &e);
    hs_comm_set_timeout(c, 2.5);
    float x[16];
    for (int k = 0; k < 3; k++) {
        if (rank == k % hs_comm_size(c)) sleep_s(0.6);
        for (int i = 0; i < 16; i++) x[i] = 1.0f;
        if (hs_pg_all_reduce(hs_comm_world(c), x, 16, HS_DTYPE_F32, HS_REDUCE_SUM, &e) != HS_OK)
            return fail("all_reduce", &e);
        if (x[0] != (float)hs_comm_size(c)) {
            fprintf(stderr, "all_reduce gave %g\n", x[0]);
            return 1;
        }
        if (pair && hs_pg_barrier(pair, &e) != HS_OK) return fail("barrier", &e);
    }
    return 0;
}

static void run_hang(hs_comm *c, int who, double seconds, const char *group) {
    hs_error e;
    hs_pg *g = hs_comm_world(c);
    int rank = hs_comm_rank(c);
    if (!strcmp(group, "pair") && hs_comm_split(c, "pair", rank < 2 ? 0 : -1, 0, &g, &e) != HS_OK)
        hs_comm_abort(c, &e);
    hs_comm_set_timeout(c, 2.0);
    float x[1024] = {0};
    /* Two good collectives first, so the hang is at sequence 3. */
    for (int k = 0; k < 2 && g; k++)
        if (hs_pg_all_reduce(g, x, 1024, HS_DTYPE_F32, HS_REDUCE_SUM, &e) != HS_OK) hs_comm_abort(c, &e);
    if (rank == who) sleep_s(seconds);
    if (g && hs_pg_all_reduce(g, x, 1024, HS_DTYPE_F32, HS_REDUCE_SUM, &e) != HS_OK) hs_comm_abort(c, &e);
    /* Ranks outside the group wait where the watchdog cannot see them. */
    if (!g) sleep_s(seconds);
}

static void run_abort(hs_comm *c, int who) {
    hs_error e;
    if (hs_comm_rank(c) == who) {
        hs_error_set(&e, HS_ERR_CONFIG, "train.steps = -1 must be >= 1 (injected failure on rank %d)", who);
        hs_comm_abort(c, &e);
    }
    hs_pg_barrier(hs_comm_world(c), &e);
}

int main(int argc, char **argv) {
    hs_comm *c = NULL;
    hs_error e;
    hs_comm_options opt = {.timeout_s = 30};
    if (hs_comm_init(&c, &argc, &argv, &opt, &e) != HS_OK) return fail("hs_comm_init", &e);
    int rc = 0;
    if (argc >= 5 && !strcmp(argv[1], "hang"))
        run_hang(c, atoi(argv[2]), atof(argv[3]), argv[4]);
    else if (argc >= 3 && !strcmp(argv[1], "abort"))
        run_abort(c, atoi(argv[2]));
    else
        rc = run_quiet(c);
    int total = 0;
    MPI_Allreduce(&rc, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (hs_comm_rank(c) == 0) printf("%s\n", total ? "FAIL" : "OK");
    hs_comm_finalize(c);
    return total ? 1 : 0;
}
