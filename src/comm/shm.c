/* comm/shm.c — set-up of the intra-node path, its barrier and its
 * cross-process reads (see shm.h). */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "comm/shm.h"

_Static_assert(sizeof(hs_shm_slot) == 128, "one slot per cache-line pair");

/* A peer that is only a little behind is met by a short spin; past
 * SPIN_NS the waiter sleeps in the kernel on the peer's futex word until
 * the peer raises it (or WAIT_NS passes, to look again), so a rank waiting
 * for a peer still computing takes none of the core that peer may share
 * with it (ranks share cores on small nodes) and costs no wake-ups. */
#define SPIN_NS 5000LL
#define WAIT_NS 100000000L

/* The user switch: HS_COMM_SHM=0 (or off/no/false) keeps every group on the ring. */
static bool shm_wanted(void) {
    const char *v = getenv("HS_COMM_SHM");
    if (!v) return true;
    return strcmp(v, "0") && strcmp(v, "off") && strcmp(v, "no") && strcmp(v, "false");
}

static bool all_agree(MPI_Comm coll, bool mine) {
    int v = mine ? 1 : 0, all = 0;
    if (MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, coll) != MPI_SUCCESS) return false;
    return all == 1;
}

static bool on_one_node(MPI_Comm coll, int size) {
    MPI_Comm node;
    if (MPI_Comm_split_type(coll, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return false;
    int n = 0;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n == size;
}

hs_status hs_shm_read(hs_shm *s, int peer, void *dst, uintptr_t remote, size_t bytes,
                      const char *op, hs_error *e) {
    char *d = dst;
    pid_t pid = (pid_t)s->slots[peer]->pid;
    while (bytes > 0) {
        struct iovec local = {d, bytes}, far = {(void *)remote, bytes};
        ssize_t got = process_vm_readv(pid, &local, 1, &far, 1, 0);
        if (got <= 0) {
            int err = got < 0 ? errno : EIO;
            return hs_error_set(e, HS_ERR_COMM,
                                "%s on group '%s' (rank %d of %d): reading %zu bytes from group "
                                "rank %d (pid %d) failed: %s; set HS_COMM_SHM=0 to use the ring "
                                "path instead",
                                op, s->name, s->rank, s->size, bytes, peer, (int)pid,
                                strerror(err));
        }
        d += got;
        remote += (uintptr_t)got;
        bytes -= (size_t)got;
    }
    return HS_OK;
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The segment is a shared mapping: process-shared futex operations. */
static void futex_wait(atomic_int *word, int seen) {
    struct timespec ts = {0, WAIT_NS};
    syscall(SYS_futex, (int *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake_all(atomic_int *word) {
    syscall(SYS_futex, (int *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Until peer q has entered barrier `epoch`. */
static void wait_for(hs_shm_slot *q, long long epoch) {
    long long since = 0;
    for (unsigned spins = 0; atomic_load_explicit(&q->arrived, memory_order_acquire) < epoch;) {
        if (++spins % 64) continue; /* the clock every 64 looks */
        long long t = now_ns();
        if (since == 0) since = t;
        if (t - since < SPIN_NS) continue;
        /* The word is read before the check: a raise after it makes the
         * kernel's compare fail, so no wake is missed. */
        int seen = atomic_load_explicit(&q->wake, memory_order_acquire);
        if (atomic_load_explicit(&q->arrived, memory_order_acquire) >= epoch) break;
        atomic_fetch_add_explicit(&q->sleepers, 1, memory_order_seq_cst);
        futex_wait(&q->wake, seen);
        atomic_fetch_sub_explicit(&q->sleepers, 1, memory_order_seq_cst);
    }
}

void hs_shm_publish(hs_shm *s, const void *addr) { s->slots[s->rank]->addr = (uintptr_t)addr; }

void hs_shm_barrier(hs_shm *s) {
    hs_shm_slot *me = s->slots[s->rank];
    long long epoch = ++s->epoch;
    /* Release: a peer that sees the epoch also sees the published address,
     * and this rank's reads of the previous phase are complete. */
    atomic_store_explicit(&me->arrived, epoch, memory_order_release);
    atomic_fetch_add_explicit(&me->wake, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&me->sleepers, memory_order_seq_cst) > 0) futex_wake_all(&me->wake);
    for (int q = 0; q < s->size; q++)
        if (q != s->rank) wait_for(s->slots[q], epoch);
}

/* Every rank reads a word from its right neighbour's memory: proof that
 * the kernel allows cross-process reads between these processes. */
static bool probe_reads(hs_shm *s, MPI_Comm coll) {
    long long word = 0x5eedLL + s->rank, got = -1;
    s->slots[s->rank]->addr = (uintptr_t)&word;
    MPI_Barrier(coll);
    int right = (s->rank + 1) % s->size;
    hs_error e;
    bool ok = hs_shm_read(s, right, &got, s->slots[right]->addr, sizeof got, "probe", &e) ==
                  HS_OK &&
              got == 0x5eedLL + right;
    MPI_Barrier(coll); /* `word` leaves scope only after every read */
    return all_agree(coll, ok);
}

static void shm_release(hs_shm *s) {
    MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
    free(s->slots);
    free(s);
}

/* Without the segment the group would take the ring, whose rounding
 * differs: no memory for it on any rank is an error on every rank. */
static hs_status shm_alloc(MPI_Comm coll, int size, const char *name, hs_shm **out, hs_error *e) {
    hs_shm *s = *out = calloc(1, sizeof *s);
    if (s && !(s->slots = calloc((size_t)size, sizeof *s->slots))) free(s), s = *out = NULL;
    if (all_agree(coll, s != NULL)) return HS_OK;
    if (s) {
        free(s->slots);
        free(s);
        *out = NULL;
        return hs_error_oom(e,
                            "the shared segment of group '%s': another rank of the group had "
                            "no memory for its own",
                            name);
    }
    return hs_error_oom(e, "the shared segment of group '%s': %zu bytes", name,
                        sizeof *s + (size_t)size * sizeof *s->slots);
}

hs_status hs_shm_create(MPI_Comm coll, hs_pool *pool, const char *name, hs_shm **out, hs_error *e) {
    int rank = 0, size = 0;
    *out = NULL;
    MPI_Comm_rank(coll, &rank);
    MPI_Comm_size(coll, &size);
    if (size < 2) return HS_OK;
    if (!all_agree(coll, shm_wanted() && on_one_node(coll, size))) return HS_OK;
    hs_shm *s = NULL;
    hs_status st = shm_alloc(coll, size, name, &s, e);
    if (st != HS_OK) return st;
    s->name = name;
    s->pool = pool;
    s->rank = rank;
    s->size = size;
    hs_shm_slot *mine = NULL;
    int rc = MPI_Win_allocate_shared((MPI_Aint)sizeof(hs_shm_slot), 1, MPI_INFO_NULL, coll, &mine,
                                     &s->win);
    if (!all_agree(coll, rc == MPI_SUCCESS)) {
        if (rc == MPI_SUCCESS) MPI_Win_free(&s->win);
        free(s->slots);
        free(s);
        return HS_OK;
    }
    /* A passive epoch for the segment's lifetime: plain loads and stores
     * (ordered by the atomics) are then allowed on it. */
    MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win);
    for (int q = 0; q < size; q++) {
        MPI_Aint bytes = 0;
        int unit = 0;
        MPI_Win_shared_query(s->win, q, &bytes, &unit, &s->slots[q]);
    }
    memset(mine, 0, sizeof *mine);
    atomic_init(&mine->arrived, 0);
    atomic_init(&mine->wake, 0);
    atomic_init(&mine->sleepers, 0);
    mine->pid = (long long)getpid();
    if (!probe_reads(s, coll)) {
        shm_release(s);
        return HS_OK;
    }
    *out = s;
    return HS_OK;
}

void hs_shm_free(hs_shm *s) {
    if (!s) return;
    hs_pool_free(s->pool, s->raw);
    hs_pool_free(s->pool, s->tmp);
    hs_pool_free(s->pool, s->acc);
    shm_release(s);
}
