/* Starting and ending MPI for a command that needs its rank and the world
 * size before it can build a context (comm.h, "process start"). */
#include <stdlib.h>

#include "comm/group.h"

/* A process no launcher started (no launcher's rank variable) is a world of
 * one that talks to nobody: Open MPI would still start a helper daemon for
 * it and probe every network transport (libfabric, PSM, UCX), a third of a
 * second before the first line. Tell it not to, unless the user's own
 * environment says otherwise (setenv does not overwrite). Launched ranks
 * keep the MPI's full selection, which a cluster's network needs; other
 * MPI implementations ignore OMPI_ variables. */
void hs_comm_singleton_env(void) {
    static const char *const launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                           "PMI_SIZE", NULL};
    for (int i = 0; launched[i]; i++)
        if (getenv(launched[i])) return;
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
}

void hs_comm_boot(int *argc, char ***argv, int *rank, int *world) {
    int provided = 0;
    hs_comm_singleton_env();
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
}

void hs_comm_boot_end(void) { MPI_Finalize(); }
