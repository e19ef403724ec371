#include "shim.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* NCCL API facts (nccl.h): values and signatures. */
typedef struct { char internal[RDT_NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
enum { ncclSuccess = 0 };

/* ncclConfig_t as NCCL 2.14 laid it out (size, magic, version, blocking),
 * with the next field, cgaClusterSize (2.17), filling what would be
 * padding. NCCL copies `size` bytes and ignores fields newer than
 * `version`, so later NCCLs read it as theirs with every other field at
 * its default. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
} ncclConfig_v21400;
#define NCCL_API_MAGIC 0xcafebeefu
#define NCCL_CONFIG_UNDEF_INT INT_MIN
enum { ncclUint8 = 1 }; /* ncclDataType_t */

static struct {
  rdt_nccl_result (*GetVersion)(int *);
  const char *(*GetErrorString)(rdt_nccl_result);
  const char *(*GetLastError)(rdt_nccl_comm); /* optional */
  rdt_nccl_result (*GetUniqueId)(ncclUniqueId *);
  rdt_nccl_result (*CommInitRankConfig)(rdt_nccl_comm *, int, ncclUniqueId, int, ncclConfig_v21400 *);
  rdt_nccl_result (*CommDestroy)(rdt_nccl_comm);
  rdt_nccl_result (*CommAbort)(rdt_nccl_comm);
  rdt_nccl_result (*CommGetAsyncError)(rdt_nccl_comm, rdt_nccl_result *);
  rdt_nccl_result (*Send)(const void *, size_t, int, int, rdt_nccl_comm, void *);
  rdt_nccl_result (*Recv)(void *, size_t, int, int, rdt_nccl_comm, void *);
  rdt_nccl_result (*GroupStart)(void);
  rdt_nccl_result (*GroupEnd)(void);
} nc;

static const struct {
  const char *name;
  void **slot;
  int optional;
} symbols[] = {
    {"ncclGetVersion", (void **)&nc.GetVersion, 0},
    {"ncclGetErrorString", (void **)&nc.GetErrorString, 0},
    {"ncclGetLastError", (void **)&nc.GetLastError, 1},
    {"ncclGetUniqueId", (void **)&nc.GetUniqueId, 0},
    {"ncclCommInitRankConfig", (void **)&nc.CommInitRankConfig, 0},
    {"ncclCommDestroy", (void **)&nc.CommDestroy, 0},
    {"ncclCommAbort", (void **)&nc.CommAbort, 0},
    {"ncclCommGetAsyncError", (void **)&nc.CommGetAsyncError, 0},
    {"ncclSend", (void **)&nc.Send, 0},
    {"ncclRecv", (void **)&nc.Recv, 0},
    {"ncclGroupStart", (void **)&nc.GroupStart, 0},
    {"ncclGroupEnd", (void **)&nc.GroupEnd, 0},
};

static int loaded;

const char *rdt_nccl_symbol(size_t i, int *optional) {
  if (i >= sizeof symbols / sizeof symbols[0]) return NULL;
  *optional = symbols[i].optional;
  return symbols[i].name;
}

void rdt_nccl_install(void *const *fns) {
  for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) *symbols[i].slot = fns[i];
  loaded = 1;
}

int rdt_nccl_loaded(void) { return loaded; }

rdt_nccl_result rdt_nccl_version(int *version) {
  return loaded ? nc.GetVersion(version) : RDT_NCCL_NOT_LOADED;
}

const char *rdt_nccl_error_string(rdt_nccl_result r) { return loaded ? nc.GetErrorString(r) : NULL; }

const char *rdt_nccl_last_error(rdt_nccl_comm comm) {
  return loaded && nc.GetLastError ? nc.GetLastError(comm) : NULL;
}

rdt_nccl_result rdt_nccl_unique_id(unsigned char id[RDT_NCCL_UNIQUE_ID_BYTES]) {
  if (!loaded) return RDT_NCCL_NOT_LOADED;
  ncclUniqueId u;
  rdt_nccl_result r = nc.GetUniqueId(&u);
  if (r == ncclSuccess) memcpy(id, u.internal, RDT_NCCL_UNIQUE_ID_BYTES);
  return r;
}

rdt_nccl_result rdt_nccl_comm_init_rank(rdt_nccl_comm *comm, int nranks,
                                        const unsigned char id[RDT_NCCL_UNIQUE_ID_BYTES], int rank) {
  if (!loaded) return RDT_NCCL_NOT_LOADED;
  ncclUniqueId u;
  memcpy(u.internal, id, RDT_NCCL_UNIQUE_ID_BYTES);
  ncclConfig_v21400 config = {sizeof config, NCCL_API_MAGIC, 21400 /* NCCL_VERSION(2, 14, 0) */, 0,
                              NCCL_CONFIG_UNDEF_INT};
  return nc.CommInitRankConfig(comm, nranks, u, rank, &config);
}

rdt_nccl_result rdt_nccl_comm_destroy(rdt_nccl_comm comm) {
  return loaded ? nc.CommDestroy(comm) : RDT_NCCL_NOT_LOADED;
}

rdt_nccl_result rdt_nccl_comm_abort(rdt_nccl_comm comm) {
  return loaded ? nc.CommAbort(comm) : RDT_NCCL_NOT_LOADED;
}

rdt_nccl_result rdt_nccl_comm_async_error(rdt_nccl_comm comm, rdt_nccl_result *async_err) {
  return loaded ? nc.CommGetAsyncError(comm, async_err) : RDT_NCCL_NOT_LOADED;
}

rdt_nccl_result rdt_nccl_p2p(rdt_nccl_comm comm, int send, int peer, const rdt_nccl_buffer *bufs, size_t n,
                             void *stream) {
  if (!loaded) return RDT_NCCL_NOT_LOADED;
  rdt_nccl_result r = nc.GroupStart();
  if (r != ncclSuccess) return r;
  rdt_nccl_result first = ncclSuccess;
  for (size_t i = 0; i < n && first == ncclSuccess; i++) {
    if (bufs[i].nbytes == 0) continue;
    if (send)
      first = nc.Send((const void *)bufs[i].buf, bufs[i].nbytes, ncclUint8, peer, comm, stream);
    else
      first = nc.Recv((void *)bufs[i].buf, bufs[i].nbytes, ncclUint8, peer, comm, stream);
  }
  /* The group is always closed, even after a failed enqueue. */
  r = nc.GroupEnd();
  return first != ncclSuccess ? first : r;
}

rdt_nccl_result rdt_nccl_connect(rdt_nccl_comm comm, int nranks, int rank, int up, uintptr_t sendbuf,
                                 uintptr_t recvbuf, void *stream) {
  if (!loaded) return RDT_NCCL_NOT_LOADED;
  rdt_nccl_result r = nc.GroupStart();
  if (r != ncclSuccess) return r;
  rdt_nccl_result first = ncclSuccess;
  for (int peer = 0; peer < nranks && first == ncclSuccess; peer++) {
    if (peer == rank) continue;
    if ((peer > rank) == (up != 0))
      first = nc.Send((const void *)sendbuf, 1, ncclUint8, peer, comm, stream);
    else
      first = nc.Recv((unsigned char *)recvbuf + peer, 1, ncclUint8, peer, comm, stream);
  }
  r = nc.GroupEnd();
  return first != ncclSuccess ? first : r;
}
