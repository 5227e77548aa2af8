/* Helpers the MPI tests share: a check that ends every rank with the failed
 * condition and its message, one that counts failures and goes on, and the
 * start and end of a test program that records a trace from the first event
 * on. Header-only so the test glob
 * (tests/mpi/test_*.c) never mistakes it for a test program. */
#ifndef TESTS_MPI_MPI_TEST_UTIL_H
#define TESTS_MPI_MPI_TEST_UTIL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "hypershard/comm.h"

/* A failed check on one rank must end all of them, or the others would
 * wait in their next collective until the timeout. */
#define CHECK(comm, cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            hs_error ce_;                                                                          \
            hs_error_set(&ce_, HS_ERR_INTERNAL, __VA_ARGS__);                                      \
            fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, ce_.msg);  \
            hs_comm_abort((comm), &ce_);                                                           \
        }                                                                                          \
    } while (0)

/* A check that counts its failure in (t)->failures and goes on, for tests
 * whose ranks all reach the end and agree there on the total; t is the
 * test's context, with `rank` and `failures`. */
#define CHECK_COUNT(t, cond, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed: ", (t)->rank, __FILE__, __LINE__,  \
                    #cond);                                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            (t)->failures++;                                                                       \
        }                                                                                          \
    } while (0)

/* hs_comm_init, or the error on stderr and exit status 1. */
static inline hs_comm *mt_comm_init(int *argc, char ***argv, const hs_comm_options *opt) {
    hs_comm *c = NULL;
    hs_error e;
    hs_error_clear(&e);
    if (hs_comm_init(&c, argc, argv, opt, &e) != HS_OK) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    return c;
}

/* A cpu device and a stream of it, or the error on stderr and exit 1. */
static inline void mt_cpu_device(hs_device **d, hs_stream **s) {
    hs_error e;
    hs_error_clear(&e);
    if (hs_device_create(HS_DEVICE_CPU, NULL, d, &e) != HS_OK ||
        hs_stream_create(*d, s, &e) != HS_OK) {
        fprintf(stderr, "device: %s\n", e.msg);
        exit(1);
    }
}

/* The failed checks of every rank summed, rank 0's verdict line ("OK: 0
 * failed checks on 2 ranks"), and the exit status: 1 when any failed. */
static inline int mt_verdict(int failures, int rank, int size) {
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failed checks on %d ranks\n", total ? "FAIL" : "OK", total, size);
    return total ? 1 : 0;
}

/* MPI comes up first so the trace knows its rank before hs_comm_init
 * records into it. */
static inline hs_comm *mt_traced_init(int *argc, char ***argv, double timeout_s, bool trace_on,
                                      hs_trace **trace) {
    int provided, rank;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    *trace = hs_trace_create(rank, trace_on, NULL);
    hs_comm_options opt = {.timeout_s = timeout_s, .trace = *trace};
    return mt_comm_init(argc, argv, &opt);
}

static inline void mt_traced_finalize(hs_comm *c, hs_trace *trace) {
    hs_comm_finalize(c);
    hs_trace_free(trace);
    MPI_Finalize();
}

#endif
