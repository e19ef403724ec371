/* The NCCL calls rdt uses, declared here from NCCL's documented API (no NCCL
 * headers are needed to build) and resolved at run time with dlopen. Every
 * call that NCCL runs against the calling thread's current CUDA context is
 * made by the Go side on a locked OS thread with the device current. */
#ifndef RDT_NCCL_SHIM_H
#define RDT_NCCL_SHIM_H

/* Internal to librdt.so: never exported (only rdt.h's functions are). */
#pragma GCC visibility push(hidden)

#include <stddef.h>
#include <stdint.h>

typedef int rdt_nccl_result;  /* ncclResult_t */
typedef void *rdt_nccl_comm;  /* ncclComm_t */

#define RDT_NCCL_UNIQUE_ID_BYTES 128 /* sizeof(ncclUniqueId) */

/* Results the shim makes itself (outside ncclResult_t's range). */
#define RDT_NCCL_NOT_LOADED (-1)

/* Loading (the Go side opens the library and resolves the symbols):
 * rdt_nccl_symbol names the i-th symbol of the table and says whether it
 * is optional; NULL past the end. rdt_nccl_install takes the addresses
 * found (NULL for a missing optional one), in that order, once. */
const char *rdt_nccl_symbol(size_t i, int *optional);
void rdt_nccl_install(void *const *fns);
int rdt_nccl_loaded(void);

rdt_nccl_result rdt_nccl_version(int *version);
const char *rdt_nccl_error_string(rdt_nccl_result r); /* NULL if not loaded */
/* ncclGetLastError (NCCL 2.13 and later): NULL when unavailable. */
const char *rdt_nccl_last_error(rdt_nccl_comm comm);

rdt_nccl_result rdt_nccl_unique_id(unsigned char id[RDT_NCCL_UNIQUE_ID_BYTES]);
/* ncclCommInitRankConfig of a non-blocking communicator (blocking = 0):
 * ncclInProgress while it forms (poll rdt_nccl_comm_async_error until it
 * is not). Every later call on it may answer ncclInProgress the same way. */
rdt_nccl_result rdt_nccl_comm_init_rank(rdt_nccl_comm *comm, int nranks,
                                        const unsigned char id[RDT_NCCL_UNIQUE_ID_BYTES], int rank);
rdt_nccl_result rdt_nccl_comm_destroy(rdt_nccl_comm comm);
rdt_nccl_result rdt_nccl_comm_abort(rdt_nccl_comm comm);
rdt_nccl_result rdt_nccl_comm_async_error(rdt_nccl_comm comm, rdt_nccl_result *async_err);

/* Device addresses are integers here: Go passes them on, and must never
 * hold a value that is not a Go pointer as a pointer. */
typedef struct {
  uintptr_t buf; /* device address */
  size_t nbytes;
} rdt_nccl_buffer;

/* Enqueues one ncclSend (send != 0) or ncclRecv of each buffer to or from
 * `peer`, as bytes (ncclUint8), on `stream`, inside one ncclGroupStart /
 * ncclGroupEnd. Empty buffers are skipped. ncclInProgress: NCCL connects
 * and launches on its own thread; the work is on the stream once
 * rdt_nccl_comm_async_error says ncclSuccess. */
rdt_nccl_result rdt_nccl_p2p(rdt_nccl_comm comm, int send, int peer, const rdt_nccl_buffer *bufs, size_t n,
                             void *stream);

/* Connects `rank` of `nranks` with the peers of one direction: one group of
 * a one-byte ncclSend from `sendbuf` to every higher rank and a one-byte
 * ncclRecv into recvbuf[peer] from every lower rank (up != 0), or the
 * other way round (up == 0), on `stream`. Like rdt_nccl_p2p, it may
 * answer ncclInProgress: NCCL connects (once every peer called it too)
 * and enqueues on its own thread. */
rdt_nccl_result rdt_nccl_connect(rdt_nccl_comm comm, int nranks, int rank, int up, uintptr_t sendbuf,
                                 uintptr_t recvbuf, void *stream);

#pragma GCC visibility pop

#endif
