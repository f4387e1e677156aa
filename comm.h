/*
comm.h: the process layout of a parallel run and the collectives the trainers use, over MPI between processes.

  mpirun -np N ./train_m2rnn_cpu -tp T ...    N processes; T of them (consecutive ranks) form a tensor-parallel group,
                                              N / T data-parallel replicas; rank r: tp_rank = r % T, dp_rank = r / T

Data parallelism (what this file serves today): each data-parallel rank reads its own rows of every global batch
(dataloader.h), the gradients are reduce-scattered (summed, then averaged) so that each rank holds the gradient of
its shard of the parameters, each rank updates its shard (ZeRO stage 1: the AdamW moments exist only for the shard),
and the updated shards are all-gathered. Sums of two ranks are order-free (a + b = b + a), so DP = 2 is repeatable
bit for bit; the MPI library fixes the order for more ranks.

Tensor parallelism (the executors place these; ref/lm.h and lm.cuh say where), Megatron's conjugate pairs and the
vocabulary ones, each an all-reduce over the TP group (comm_tp_allreduce_sum / _max):
  copy_to_tp          forward: identity                      backward: all-reduce the input gradient
                      (before every mixer and feed-forward: their input projections are column-parallel)
  reduce_from_tp      forward: all-reduce the output         backward: identity
                      (after them: their output projections are row-parallel, each rank a partial sum)
  vocabulary-parallel embedding: forward all-reduce of the ranks' rows (zeros for tokens outside them)
  vocabulary-parallel cross-entropy: forward the rows' max, then their sums of exp and target logits (the GPU: one
                      all-gather of each rank's (max, sum, target logit), combined in the same order on every rank);
                      backward the d(final norm output) partial sums (the LM head is column-parallel by vocabulary)
  RMSNormTP (inside M²RNN topology-independent, RNN, GRU): forward the rows' sums of squares, backward their Σ dy·w·x
  once a step: the gradients of tensors a rank holds whole but computes from its own heads (M²RNN's shared q/k, GDN's
                      norm weight) summed over the group; checkpoints all-gather the local buffers.

On GPUs (train_m2rnn built with MPI and NCCL: USE_NCCL), one process drives one GPU (the node-local rank picks it
unless M2RNN_DEVICE is set) and the gradients and weights move through one NCCL communicator per group, created from
an ncclUniqueId that the group's first rank broadcasts over MPI (one node or many); comm_nccl_init below. The host
collectives here then carry only scalars (losses, norms, flags) and checkpoint gathers.

Failures: fail_with_hint (and the CUDA/NCCL check macros) on any rank call MPI_Abort through m2rnn_exit's hook, so
the whole job stops with that rank's message instead of the others hanging in a collective. Built without MPI (no
mpicc), everything is one rank.
*/
#ifndef M2RNN_COMM_H
#define M2RNN_COMM_H

#include <stddef.h>
#include <stdlib.h>
#include "utils.h"
#ifdef USE_MPI
#include <mpi.h>
#endif
#ifdef USE_NCCL
#include <nccl.h>
#endif

typedef struct {
    int rank, world;    // this process among all
    int tp, dp;         // tensor-parallel group size, data-parallel replicas (world = tp · dp)
    int tp_rank, dp_rank;
    int local_rank;     // among the processes of this node (picks the GPU)
#ifdef USE_MPI
    MPI_Comm dp_comm, tp_comm;
#endif
#ifdef USE_NCCL
    ncclComm_t nccl_dp; // the data-parallel group on the GPUs (NULL until comm_nccl_init)
    ncclComm_t nccl_tp; // this replica's tensor-parallel group (NULL until comm_nccl_init, and with -tp 1)
#endif
} Comm;

// this process's rank among those of its node (comm_init sets it): a GPU executor's default device
static int comm_node_rank __attribute__((unused)) = 0;

#ifdef USE_MPI
static void comm_abort_hook(int status) { MPI_Abort(MPI_COMM_WORLD, status); }
static int comm_mpi_active = 0;
#endif

// MPI_Init (when built with MPI) and the world's size; groups come with comm_set_layout once -tp is known
static void comm_init(Comm *c, int *argc, char ***argv) {
    c->rank = 0; c->world = 1; c->tp = 1; c->dp = 1; c->tp_rank = 0; c->dp_rank = 0; c->local_rank = 0;
#ifdef USE_NCCL
    c->nccl_dp = NULL;
    c->nccl_tp = NULL;
#endif
#ifdef USE_MPI
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    comm_mpi_active = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    c->dp_comm = MPI_COMM_WORLD;
    c->tp_comm = MPI_COMM_SELF;
    if (c->world > 1) { m2rnn_exit_hook = comm_abort_hook; }
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_free(&node);
    comm_node_rank = c->local_rank;
#else
    (void)argc; (void)argv;
#endif
}

// tp processes a tensor-parallel group; refuses layouts the world cannot hold
static void comm_set_layout(Comm *c, int tp) {
    if (tp < 1 || c->world % tp != 0) {
        fail_with_hint("launch a multiple of -tp processes (mpirun -np N with N divisible by -tp)",
                       "-tp %d does not divide the %d processes", tp, c->world);
    }
    c->tp = tp;
    c->dp = c->world / tp;
    c->tp_rank = c->rank % tp;
    c->dp_rank = c->rank / tp;
#ifdef USE_MPI
    if (c->world > 1) {
        MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank, c->dp_rank, &c->dp_comm); // the replicas of one TP position
        MPI_Comm_split(MPI_COMM_WORLD, c->dp_rank, c->tp_rank, &c->tp_comm); // one replica's TP group
    }
#endif
}

#ifdef USE_NCCL
#define ncclCheck(call) nccl_check((call), __FILE__, __LINE__)
static void nccl_check(ncclResult_t r, const char *file, int line) {
    if (r != ncclSuccess) {
        fail_with_hint("check every rank sees its own GPU (one process per GPU) and NCCL_DEBUG=WARN's output",
                       "NCCL error at %s:%d: %s", file, line, ncclGetErrorString(r));
    }
}

// the NCCL communicators of this process's groups, on the current device: the data-parallel one, and the
// tensor-parallel one when -tp > 1. Each group's first rank makes its unique id and broadcasts it over MPI; every
// rank creates the DP communicator, then the TP one, so no group waits on a rank busy with the other. Collective.
static void comm_nccl_init(Comm *c) {
    if (c->nccl_dp != NULL) { return; }
    ncclUniqueId id;
    if (c->dp_rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
#ifdef USE_MPI
    if (c->dp > 1) { MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, c->dp_comm); }
#endif
    ncclCheck(ncclCommInitRank(&c->nccl_dp, c->dp, id, c->dp_rank));
    if (c->tp > 1) {
        if (c->tp_rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
#ifdef USE_MPI
        MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, c->tp_comm);
#endif
        ncclCheck(ncclCommInitRank(&c->nccl_tp, c->tp, id, c->tp_rank));
    }
}
#endif

static void comm_finalize(Comm *c) {
#ifdef USE_NCCL
    if (c->nccl_dp != NULL) { ncclCommDestroy(c->nccl_dp); c->nccl_dp = NULL; }
    if (c->nccl_tp != NULL) { ncclCommDestroy(c->nccl_tp); c->nccl_tp = NULL; }
#endif
#ifdef USE_MPI
    if (comm_mpi_active) {
        if (c->world > 1) {
            MPI_Comm_free(&c->dp_comm);
            MPI_Comm_free(&c->tp_comm);
        }
        m2rnn_exit_hook = NULL;
        MPI_Finalize();
        comm_mpi_active = 0;
    }
#else
    (void)c;
#endif
}

// the shard of n numbers that data-parallel rank r owns: [n·r/dp, n·(r+1)/dp)
static inline size_t comm_shard_begin(const Comm *c, size_t n, int r) { return n * (size_t)r / (size_t)c->dp; }
static inline size_t comm_shard_end(const Comm *c, size_t n, int r) { return n * (size_t)(r + 1) / (size_t)c->dp; }

// ----------------------------------------------------------------------------------------------------------------
// collectives over the data-parallel replicas (host memory; float or double by the element size)

#ifdef USE_MPI
static MPI_Datatype comm_type(size_t elem) { return elem == sizeof(double) ? MPI_DOUBLE : MPI_FLOAT; }
#endif

// the sum over the replicas of a scalar
static double comm_dp_sum(const Comm *c, double x) {
#ifdef USE_MPI
    if (c->dp > 1) {
        double out = 0.0;
        MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_SUM, c->dp_comm);
        return out;
    }
#endif
    (void)c;
    return x;
}

// the largest over the replicas of an int flag (a stop request, ...)
static int comm_dp_max_int(const Comm *c, int x) {
#ifdef USE_MPI
    if (c->dp > 1) {
        int out = 0;
        MPI_Allreduce(&x, &out, 1, MPI_INT, MPI_MAX, c->dp_comm);
        return out;
    }
#endif
    (void)c;
    return x;
}

// MPI counts are ints: every shard must hold fewer than 2^31 numbers
static void comm_check_counts(const Comm *c, size_t n) {
    if (c->dp > 1 && comm_shard_end(c, n, 0) - comm_shard_begin(c, n, 0) + 1 > (size_t)0x7fffffff) {
        fail_with_hint("use more data-parallel ranks (each shard must hold fewer than 2^31 numbers)",
                       "%zu parameters in %d shards exceed MPI's int counts", n, c->dp);
    }
}

// shard (this rank's comm_shard of n) = Σ over the replicas of full (n elements of elem bytes)
static void comm_dp_reduce_scatter(const Comm *c, void *shard, const void *full, size_t n, size_t elem) {
#ifdef USE_MPI
    if (c->dp > 1) {
        comm_check_counts(c, n);
        int *counts = (int *)mallocCheck((size_t)c->dp * sizeof(int));
        for (int r = 0; r < c->dp; r++) { counts[r] = (int)(comm_shard_end(c, n, r) - comm_shard_begin(c, n, r)); }
        MPI_Reduce_scatter(full, shard, counts, comm_type(elem), MPI_SUM, c->dp_comm);
        free(counts);
        return;
    }
#endif
    memcpy(shard, full, n * elem);
}

// full (n elements) = every replica's shard, in rank order
static void comm_dp_allgather(const Comm *c, void *full, const void *shard, size_t n, size_t elem) {
#ifdef USE_MPI
    if (c->dp > 1) {
        comm_check_counts(c, n);
        int *counts = (int *)mallocCheck((size_t)c->dp * 2 * sizeof(int)), *displs = counts + c->dp;
        for (int r = 0; r < c->dp; r++) {
            counts[r] = (int)(comm_shard_end(c, n, r) - comm_shard_begin(c, n, r));
            displs[r] = (int)comm_shard_begin(c, n, r);
        }
        MPI_Allgatherv(shard, counts[c->dp_rank], comm_type(elem), full, counts, displs, comm_type(elem), c->dp_comm);
        free(counts);
        return;
    }
#endif
    memcpy(full, shard, n * elem);
}

// ----------------------------------------------------------------------------------------------------------------
// collectives over the tensor-parallel group (host memory; float or double by the element size)

#ifdef USE_MPI
// x (n) = op over the group of every rank's x, in place
static void comm_tp_allreduce(const Comm *c, void *x, size_t n, size_t elem, MPI_Op op) {
    if (c->tp > 1) {
        if (n > (size_t)0x7fffffff) { fail_with_hint("use a smaller batch", "%zu numbers exceed MPI's int counts", n); }
        MPI_Allreduce(MPI_IN_PLACE, x, (int)n, comm_type(elem), op, c->tp_comm);
    }
}
#endif

// x (n) = the sum over the group of every rank's x
static void comm_tp_allreduce_sum(const Comm *c, void *x, size_t n, size_t elem) {
#ifdef USE_MPI
    comm_tp_allreduce(c, x, n, elem, MPI_SUM);
#endif
    (void)c; (void)x; (void)n; (void)elem;
}

// x (n) = the elementwise maximum over the group
static void comm_tp_allreduce_max(const Comm *c, void *x, size_t n, size_t elem) {
#ifdef USE_MPI
    comm_tp_allreduce(c, x, n, elem, MPI_MAX);
#endif
    (void)c; (void)x; (void)n; (void)elem;
}

// all (tp · n) = every rank's mine (n), in TP rank order
static void comm_tp_allgather(const Comm *c, void *all, const void *mine, size_t n, size_t elem) {
#ifdef USE_MPI
    if (c->tp > 1) {
        if (n > (size_t)0x7fffffff) { fail_with_hint("use more ranks", "%zu numbers exceed MPI's int counts", n); }
        MPI_Allgather(mine, (int)n, comm_type(elem), all, (int)n, comm_type(elem), c->tp_comm);
        return;
    }
#endif
    memcpy(all, mine, n * elem);
}

// the sum over every process of a scalar
static double comm_world_sum(const Comm *c, double x) {
#ifdef USE_MPI
    if (c->world > 1) {
        double out = 0.0;
        MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        return out;
    }
#endif
    (void)c;
    return x;
}

// every replica waits for the others (rank 0 writing a checkpoint the others will read)
static void comm_barrier(const Comm *c) {
#ifdef USE_MPI
    if (c->world > 1) { MPI_Barrier(MPI_COMM_WORLD); }
#endif
    (void)c;
}

#endif // M2RNN_COMM_H
