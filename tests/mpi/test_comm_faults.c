/* comm/: the watchdog and hs_comm_abort.
 * HS_MPI_RANKS: 2 3
 * HS_TEST_TIMEOUT: 60
 *
 * Without arguments (as ctest runs it) this pins the quiet side: a 2.5 s
 * watchdog never fires on collectives that finish in time, even when one
 * rank arrives 0.6 s late to each of them, on the world and on a subgroup,
 * nor on pipeline-queue receives in flight 0.6 s each (4 s in all).
 *
 * With arguments it is the faulty program that tests/cli/test_comm_faults.sh
 * runs under mpiexec and expects to end every rank:
 *   hang RANK SECONDS GROUP   RANK sleeps before an all_reduce on GROUP
 *                             ("world" or "pair": ranks {0,1}) with a 2 s
 *                             timeout; SECONDS "stop": RANK stops itself
 *                             (SIGSTOP) instead, so its watchdog is silent;
 *                             GROUP "ep": an all_to_allv on every rank, on
 *                             the critical queue (as the mesh puts ep)
 *   p2p RANK SECONDS OP       on a pipeline-queue group of ranks {0,1}, the
 *                             other rank starts OP ("send": 4 MiB, more than
 *                             goes out eagerly; "recv") with RANK, which
 *                             sleeps instead of posting its match; 2 s
 *                             timeout
 * The waiting side prints "hang-start T" (T: seconds since the epoch) just
 * before the operation that hangs, so the script can time the watchdog.
 *   abort RANK                RANK calls hs_comm_abort with a config error
 *                             while the others wait in a barrier */
#include <signal.h>
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
    if (hs_comm_split(c, "pair", rank < 2 ? 0 : -1, 0, &pair, &e) != HS_OK)
        return fail("split", &e);
    hs_comm_set_timeout(c, 2.5);
    float x[16];
    for (int k = 0; k < 3; k++) {
        if (rank == k % hs_comm_size(c)) sleep_s(0.6);
        for (int i = 0; i < 16; i++) x[i] = 1.0f;
        if (hs_pg_all_reduce(hs_comm_world(c), NULL, x, 16, HS_DTYPE_F32, HS_REDUCE_SUM, &e) !=
            HS_OK)
            return fail("all_reduce", &e);
        if (x[0] != (float)hs_comm_size(c)) {
            fprintf(stderr, "all_reduce gave %g\n", x[0]);
            return 1;
        }
        if (pair && hs_pg_barrier(pair, &e) != HS_OK) return fail("barrier", &e);
    }
    hs_pg *pp = NULL;
    if (hs_comm_split_queue(c, "pp", rank < 2 ? 0 : -1, 0, HS_COMM_QUEUE_PP_FORWARD, &pp, &e) !=
        HS_OK)
        return fail("split pp", &e);
    for (int k = 0; pp && k < 6; k++) {
        x[0] = (float)k;
        hs_work *w = rank == 0 ? hs_pg_recv_async(pp, NULL, x, 16, HS_DTYPE_F32, 1, k) : NULL;
        if (rank == 1) {
            sleep_s(0.6);
            w = hs_pg_send_async(pp, NULL, x, 16, HS_DTYPE_F32, 0, k);
        }
        if (hs_work_wait(w, &e) != HS_OK) return fail("send/recv", &e);
    }
    return 0;
}

static void print_hang_start(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    printf("hang-start %lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
    fflush(stdout);
}

/* seconds < 0: stop the whole process, as a debugger or a frozen node would. */
static void stall(double seconds) {
    if (seconds < 0) raise(SIGSTOP);
    else sleep_s(seconds);
}

/* One collective of the hang's kind on g: all_reduce, or all_to_allv (one
 * element to and from each rank) when ep. */
static void collective(hs_comm *c, hs_pg *g, bool ep, float *x) {
    hs_error e;
    int64_t counts[64], displs[64];
    int w = hs_pg_size(g);
    if (w > 64) abort();
    for (int i = 0; i < w; i++) counts[i] = 1, displs[i] = i;
    hs_status s = ep ? hs_work_wait(hs_pg_all_to_allv_async(g, NULL, x + 64, counts, displs, x,
                                                            counts, displs, HS_DTYPE_F32),
                                    &e)
                     : hs_pg_all_reduce(g, NULL, x, 1024, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    if (s != HS_OK) hs_comm_abort(c, &e);
}

static void run_hang(hs_comm *c, int who, double seconds, const char *group) {
    hs_error e;
    hs_pg *g = hs_comm_world(c);
    int rank = hs_comm_rank(c);
    bool ep = !strcmp(group, "ep");
    if (!strcmp(group, "pair") && hs_comm_split(c, "pair", rank < 2 ? 0 : -1, 0, &g, &e) != HS_OK)
        hs_comm_abort(c, &e);
    if (ep && hs_comm_split_queue(c, "ep", 0, rank, HS_COMM_QUEUE_CRITICAL, &g, &e) != HS_OK)
        hs_comm_abort(c, &e);
    hs_comm_set_timeout(c, 2.0);
    float x[1024] = {0};
    /* Two good collectives first, so the hang is at sequence 3. */
    for (int k = 0; k < 2 && g; k++) collective(c, g, ep, x);
    if (rank == who) stall(seconds);
    if (g && rank == (who == 0 ? 1 : 0)) print_hang_start();
    if (g) collective(c, g, ep, x);
    /* Ranks outside the group wait where the watchdog cannot see them. */
    if (!g) sleep_s(seconds < 0 ? 30 : seconds);
}

static void run_p2p(hs_comm *c, int who, double seconds, const char *op) {
    hs_error e;
    hs_pg *g = NULL;
    int rank = hs_comm_rank(c);
    if (hs_comm_split_queue(c, "pp", rank < 2 ? 0 : -1, 0, HS_COMM_QUEUE_PP_FORWARD, &g, &e) !=
        HS_OK)
        hs_comm_abort(c, &e);
    hs_comm_set_timeout(c, 2.0);
    const int64_t n = 1 << 20; /* 4 MiB of F32 */
    float *x = calloc((size_t)n, sizeof *x);
    if (!x) abort();
    if (g) {
        /* One good hand-over first, so the hang is at send/recv number 2. */
        int other = 1 - hs_pg_rank(g);
        hs_work *w = rank == 0 ? hs_pg_send_async(g, NULL, x, 16, HS_DTYPE_F32, other, 7)
                               : hs_pg_recv_async(g, NULL, x, 16, HS_DTYPE_F32, other, 7);
        if (hs_work_wait(w, &e) != HS_OK) hs_comm_abort(c, &e);
        if (rank == who) {
            sleep_s(seconds);
        } else {
            bool send = !strcmp(op, "send");
            print_hang_start();
            w = send ? hs_pg_send_async(g, NULL, x, n, HS_DTYPE_F32, other, 8)
                     : hs_pg_recv_async(g, NULL, x, n, HS_DTYPE_F32, other, 8);
            if (hs_work_wait(w, &e) != HS_OK) hs_comm_abort(c, &e);
        }
    } else {
        sleep_s(seconds); /* outside the pair: waits where the watchdog cannot see it */
    }
    free(x);
}

static void run_abort(hs_comm *c, int who) {
    hs_error e;
    if (hs_comm_rank(c) == who) {
        hs_error_set(&e, HS_ERR_CONFIG,
                     "train.steps = -1 must be >= 1 (injected failure on rank %d)", who);
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
        run_hang(c, atoi(argv[2]), strcmp(argv[3], "stop") ? atof(argv[3]) : -1.0, argv[4]);
    else if (argc >= 5 && !strcmp(argv[1], "p2p"))
        run_p2p(c, atoi(argv[2]), atof(argv[3]), argv[4]);
    else if (argc >= 3 && !strcmp(argv[1], "abort")) run_abort(c, atoi(argv[2]));
    else rc = run_quiet(c);
    int total = 0;
    MPI_Allreduce(&rc, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (hs_comm_rank(c) == 0) printf("%s\n", total ? "FAIL" : "OK");
    hs_comm_finalize(c);
    return total ? 1 : 0;
}
