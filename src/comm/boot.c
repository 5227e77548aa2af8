/* Starting and ending MPI for a command that needs its rank and the world
 * size before it can build a context (comm.h, "process start"). */
#include "comm/group.h"

void hs_comm_boot(int *argc, char ***argv, int *rank, int *world) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
}

void hs_comm_boot_end(void) { MPI_Finalize(); }
