/*
 * fake_nccl.c: a test double of NCCL's C API (libnccl.so.2), used only by
 * rdt's tests. It is built into build/fakenccl/libnccl.so.2 and loaded in
 * place of NCCL with RDT_NCCL_LIBRARY, on top of the test double of the
 * CUDA driver (RDT_CUDA_LIBRARY), so that the nccl transport and rdt's
 * groups run on machines without GPUs. It exports exactly the calls rdt
 * resolves, with NCCL 2.x's signatures, ncclResult_t and ncclDataType_t
 * values and 128-byte ncclUniqueId, and reports itself as NCCL 2.21.5.
 *
 * What it models, after NCCL's documentation:
 *   - ncclGetUniqueId binds the rendezvous socket (an abstract Unix socket
 *     named after a random token that the id carries) in the calling
 *     process; rank 0 must call ncclCommInitRank in that process.
 *   - ncclCommInitRank is collective and blocking: rank 0 accepts the other
 *     ranks and every rank returns once all have joined.
 *     ncclCommInitRankConfig (NCCL 2.14 and later) reads ncclConfig_t as
 *     NCCL does (the first `size` bytes; magic 0xcafebeef or
 *     ncclInvalidArgument; fields newer than its `version` ignored):
 *     with blocking = 0 it returns ncclInProgress at once and the
 *     communicator forms on a thread of its own, ncclCommGetAsyncError
 *     saying ncclInProgress until it has (then ncclSuccess or the
 *     error); ncclCommAbort meanwhile stops it. A bad id, rank or
 *     world size is ncclInvalidArgument; a rank 0 that cannot be reached
 *     within 30 s is ncclSystemError; a rank 0 whose ranks never come
 *     waits, as NCCL does. It needs a current CUDA context, whose device
 *     becomes the communicator's; two ranks on one device (same UUID) are
 *     refused with ncclInvalidUsage ("Duplicate GPU"). Each pair of ranks
 *     then holds a data socket and a control socket.
 *   - ncclSend/ncclRecv check their buffer as NCCL does with
 *     NCCL_CHECK_POINTERS=1: device memory of the communicator's context
 *     (asked of the driver with cuPointerGetAttribute), the whole range
 *     inside its allocation. Between ncclGroupStart and ncclGroupEnd (per
 *     thread, nestable) operations are queued; an error while queueing is
 *     returned again by ncclGroupEnd, which then launches nothing.
 *   - Lazy connection: the first send from a rank to a peer (or receive)
 *     connects that direction, and the ncclGroupEnd that launches it blocks
 *     until the peer launches the matching receive (or send), the peer
 *     goes away, or the communicator is aborted.
 *   - Non-blocking communicators: ncclGroupEnd returns ncclInProgress and
 *     connects and launches on a thread of its own; until it has,
 *     ncclCommGetAsyncError says ncclInProgress and a send or receive on
 *     the communicator is ncclInvalidUsage (NCCL asks callers to wait for
 *     the communicator first). Blocking and non-blocking communicators in
 *     one group are ncclInvalidArgument.
 *   - At ncclGroupEnd (or at once outside a group) the operations of each
 *     communicator and stream are launched in stream order with the
 *     driver's cuLaunchHostFunc (taken from the driver library the process
 *     already loaded, never loading one); the host function moves the
 *     bytes over the data sockets, each peer and direction on its own
 *     thread, so that one group may send to and receive from one peer.
 *     Sends and receives between two ranks match in launch order; a receive
 *     of another size than its send is ncclInvalidUsage.
 *   - A failure in flight (a peer that exits or aborts closes its sockets)
 *     fails the operation and becomes ncclCommGetAsyncError's answer
 *     (ncclRemoteError); later operations on the communicator fail at once.
 *     ncclCommAbort stops every operation in flight (they poll the abort
 *     between chunks, as NCCL's kernels poll its abort flag), closes the
 *     sockets (peers see ncclRemoteError) and frees the communicator once
 *     its host functions have returned, without waiting for them.
 *     ncclCommDestroy first waits for the operations in flight, as NCCL's
 *     finalization does.
 *   - Teardown is collective on a host, as NCCL's proxy makes it: once a
 *     pair of ranks has connected, ncclCommDestroy and ncclCommAbort of
 *     one return only when the other has destroyed or aborted its
 *     communicator too, or its process has gone (each tells the other on
 *     the pair's control socket, then waits to hear the same).
 *   - ncclGetLastError gives the last error's text (process-wide, as in
 *     NCCL). A stale or freed communicator is ncclInvalidArgument rather
 *     than undefined behaviour.
 *
 * Knobs for tests, read once when the library is loaded:
 *   RDT_FAKENCCL_ABORT=silent  ncclCommAbort leaves the sockets open (they
 *       leak), so peers notice nothing, as with NCCL's shared-memory and
 *       P2P transports, where the other side waits until it aborts too.
 *   RDT_FAKENCCL_DELAY_MS=N  every send and receive waits N ms before it
 *       moves bytes (an abort cuts the wait short): transfers in flight.
 *       RDT_FAKENCCL_DELAY_MIN_BYTES=M limits that to operations of at
 *       least M bytes.
 *   RDT_FAKENCCL_DEBUG  print every error on stderr.
 *
 * What it cannot prove: anything about real NCCL (its ABI is written here
 * from nccl.h's documented values, not checked against the library), GPUs
 * (device memory is host memory in the CUDA double), kernels, CUDA graphs,
 * NVLink, InfiniBand or network transports, NCCL's buffering (here a send
 * completes before its receive is posted only up to a socket buffer), its
 * timeouts, or speed. Collectives, communicator splitting and
 * ncclCommFinalize are not modelled.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* ---- nccl.h: types and values --------------------------------------------- */

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct ncclComm *ncclComm_t;

/* ncclConfig_t's leading fields, which every version since 2.14 has; the
 * later ones (cgaClusterSize and on) are not modelled. */
#define NCCL_API_MAGIC 0xcafebeefu
#define NCCL_CONFIG_UNDEF_INT INT_MIN
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} ncclConfig_t;
typedef void *cudaStream_t; /* a CUstream */

#define FAKE_NCCL_VERSION 22105 /* NCCL_VERSION(2, 21, 5) */

static const size_t type_size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

/* ---- the CUDA driver calls used, from the driver already loaded ----------- */

typedef int CUresult;
typedef void *CUcontext;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct {
  char bytes[16];
} CUuuid;
typedef void (*CUhostFn)(void *userData);

enum {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
};

static struct {
  CUresult (*LaunchHostFunc)(void *, CUhostFn, void *);
  CUresult (*CtxGetCurrent)(CUcontext *);
  CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
  /* To find the device of the current context (optional). */
  CUresult (*CtxGetDevice)(CUdevice *);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
} cu;
static int cu_state; /* 0 not tried, 1 resolved, -1 failed */
static pthread_mutex_t cu_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- errors --------------------------------------------------------------- */

static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_error[512];

/* Per-thread state (NCCL's group state is per thread), in a pthread key
 * rather than __thread: LeakSanitizer crashes walking the dynamic TLS of
 * threads the Go runtime made. */
struct queued;
struct thread_state {
  int depth;         /* ncclGroupStart nesting */
  ncclResult_t err;  /* the first error while queueing */
  struct queued *q;  /* queued operations */
  size_t n, cap;
  char last_error[sizeof last_error]; /* what ncclGetLastError returned */
};
static pthread_key_t state_key;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;
static void free_state(void *p) {
  struct thread_state *t = p;
  free(t->q);
  free(t);
}
static void make_state_key(void) {
  if (pthread_key_create(&state_key, free_state) != 0) abort();
}
static struct thread_state *thread_state(void) {
  pthread_once(&state_once, make_state_key);
  struct thread_state *t = pthread_getspecific(state_key);
  if (!t) {
    t = calloc(1, sizeof *t);
    if (!t || pthread_setspecific(state_key, t) != 0) {
      fprintf(stderr, "fake NCCL: out of memory for thread state\n");
      abort();
    }
  }
  return t;
}
#define grp (*thread_state())
/* The environment, read once when the library is loaded (tests change it
 * from other threads later). */
static int debug;              /* RDT_FAKENCCL_DEBUG: print every error on stderr */
static int silent_abort;       /* RDT_FAKENCCL_ABORT=silent */
static int delay_ms;           /* RDT_FAKENCCL_DELAY_MS */
static size_t delay_min;       /* RDT_FAKENCCL_DELAY_MIN_BYTES */
static char cuda_library[4096]; /* RDT_CUDA_LIBRARY */

__attribute__((constructor)) static void read_env(void) {
  debug = getenv("RDT_FAKENCCL_DEBUG") != NULL;
  const char *s = getenv("RDT_FAKENCCL_ABORT");
  silent_abort = s && strcmp(s, "silent") == 0;
  s = getenv("RDT_FAKENCCL_DELAY_MS");
  delay_ms = s ? atoi(s) : 0;
  s = getenv("RDT_FAKENCCL_DELAY_MIN_BYTES");
  delay_min = s ? (size_t)strtoull(s, NULL, 10) : 0;
  s = getenv("RDT_CUDA_LIBRARY");
  if (s) snprintf(cuda_library, sizeof cuda_library, "%s", s);
}

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
  char buf[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&err_mu);
  memcpy(last_error, buf, sizeof buf);
  pthread_mutex_unlock(&err_mu);
  if (debug) fprintf(stderr, "fake NCCL: %s\n", buf);
  return r;
}

API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

/* NCCL ignores comm and gives the last error of the process. */
API const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  pthread_mutex_lock(&err_mu);
  char *copy = thread_state()->last_error;
  memcpy(copy, last_error, sizeof last_error);
  pthread_mutex_unlock(&err_mu);
  return copy;
}

API ncclResult_t ncclGetVersion(int *version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = FAKE_NCCL_VERSION;
  return ncclSuccess;
}

static ncclResult_t load_cuda(void) {
  pthread_mutex_lock(&cu_mu);
  if (cu_state == 0) {
    /* The driver the process already uses: its streams and contexts are
     * the ones rdt hands us. Never load a second one. */
    void *h = NULL;
    if (cuda_library[0]) h = dlopen(cuda_library, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h) {
      cu.LaunchHostFunc = (CUresult(*)(void *, CUhostFn, void *))dlsym(h, "cuLaunchHostFunc");
      cu.CtxGetCurrent = (CUresult(*)(CUcontext *))dlsym(h, "cuCtxGetCurrent");
      cu.PointerGetAttribute = (CUresult(*)(void *, int, CUdeviceptr))dlsym(h, "cuPointerGetAttribute");
      cu.CtxGetDevice = (CUresult(*)(CUdevice *))dlsym(h, "cuCtxGetDevice");
      cu.DeviceGetCount = (CUresult(*)(int *))dlsym(h, "cuDeviceGetCount");
      cu.DeviceGet = (CUresult(*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
      cu.DevicePrimaryCtxRetain = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
      cu.DeviceGetUuid = (CUresult(*)(CUuuid *, CUdevice))dlsym(h, "cuDeviceGetUuid");
    }
    cu_state = h && cu.LaunchHostFunc && cu.CtxGetCurrent && cu.PointerGetAttribute ? 1 : -1;
  }
  int ok = cu_state == 1;
  pthread_mutex_unlock(&cu_mu);
  if (!ok)
    return fail(ncclUnhandledCudaError,
                "no CUDA driver (libcuda.so.1 or RDT_CUDA_LIBRARY) with cuLaunchHostFunc, cuCtxGetCurrent and "
                "cuPointerGetAttribute is loaded in this process");
  return ncclSuccess;
}

/* The UUID of the current context's device; 0 if it cannot be told. */
static int current_uuid(CUcontext ctx, unsigned char uuid[16]) {
  CUdevice dev = -1;
  if (cu.CtxGetDevice) {
    if (cu.CtxGetDevice(&dev) != 0) dev = -1;
  } else if (cu.DeviceGetCount && cu.DeviceGet && cu.DevicePrimaryCtxRetain) {
    int n = 0;
    if (cu.DeviceGetCount(&n) != 0) n = 0;
    for (int i = 0; i < n && dev < 0; i++) {
      CUdevice d;
      CUcontext c = NULL;
      if (cu.DeviceGet(&d, i) == 0 && cu.DevicePrimaryCtxRetain(&c, d) == 0 && c == ctx) dev = d;
    }
  }
  CUuuid u;
  if (dev < 0 || !cu.DeviceGetUuid || cu.DeviceGetUuid(&u, dev) != 0) return 0;
  memcpy(uuid, u.bytes, 16);
  return 1;
}

/* ---- sockets -------------------------------------------------------------- */

#define ID_MAGIC "RDTFNCCL"
#define WIRE_MAGIC 0x314c43434e464452ull /* "RDFNCCL1" */
#define CONNECT_TIMEOUT_S 30

/* The id's layout inside ncclUniqueId's 128 bytes. */
struct id_layout {
  char magic[8];
  uint64_t token[2];
  int32_t pid; /* of the process that made it, for messages */
};
_Static_assert(sizeof(struct id_layout) <= NCCL_UNIQUE_ID_BYTES, "id too large");

static socklen_t sock_addr(const uint64_t token[2], int rank, struct sockaddr_un *a) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  /* abstract: sun_path[0] is 0 */
  int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "rdt-fakenccl-%016llx%016llx-%d",
                   (unsigned long long)token[0], (unsigned long long)token[1], rank);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int listen_on(const uint64_t token[2], int rank, int backlog) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a;
  socklen_t len = sock_addr(token, rank, &a);
  if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, backlog) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits until fd is readable, or until wake is (an abort: -1 with errno
 * ECANCELED). wake < 0: no abort can come (a blocking communicator). */
static int wait_in(int fd, int wake) {
  for (;;) {
    struct pollfd pf[2] = {{.fd = fd, .events = POLLIN}, {.fd = wake, .events = POLLIN}};
    int k = poll(pf, 2, -1);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    if (pf[1].revents & POLLIN) {
      errno = ECANCELED;
      return -1;
    }
    if (pf[0].revents) return 0;
  }
}

/* Connects to rank's listener, retrying while it is not there yet (or
 * until wake says the communicator was aborted). */
static int connect_to(const uint64_t token[2], int rank, int wake) {
  double deadline = now_s() + CONNECT_TIMEOUT_S;
  for (unsigned delay_us = 1000;; delay_us = delay_us < 100000 ? delay_us * 2 : 100000) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un a;
    socklen_t len = sock_addr(token, rank, &a);
    if (connect(fd, (struct sockaddr *)&a, len) == 0) return fd;
    int e = errno;
    close(fd);
    if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN) || now_s() > deadline) {
      errno = e;
      return -1;
    }
    struct pollfd pf = {.fd = wake, .events = POLLIN};
    if (poll(&pf, 1, (int)(delay_us / 1000)) > 0) {
      errno = ECANCELED;
      return -1;
    }
  }
}

/* Blocking I/O for the rendezvous: 0 on success, -1 with errno (0 at EOF). */
static int write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n > 0) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

static int read_all(int fd, void *p, size_t n, int wake) {
  char *b = p;
  while (n > 0) {
    if (wait_in(fd, wake) != 0) return -1;
    ssize_t k = recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) errno = 0;
    if (k <= 0) return -1;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* ---- unique ids ------------------------------------------------------------ */

/* Listeners made by ncclGetUniqueId, waiting for rank 0's ncclCommInitRank
 * in this process. */
struct pending_id {
  struct pending_id *next;
  uint64_t token[2];
  int fd;
};
static pthread_mutex_t ids_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending_id *pending_ids;

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  struct id_layout l;
  memset(&l, 0, sizeof l);
  memcpy(l.magic, ID_MAGIC, sizeof l.magic);
  if (getrandom(l.token, sizeof l.token, 0) != (ssize_t)sizeof l.token)
    return fail(ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
  l.pid = (int32_t)getpid();
  struct pending_id *p = calloc(1, sizeof *p);
  if (!p) return fail(ncclSystemError, "ncclGetUniqueId: out of memory");
  p->fd = listen_on(l.token, 0, SOMAXCONN);
  if (p->fd < 0) {
    int e = errno;
    free(p);
    return fail(ncclSystemError, "ncclGetUniqueId: cannot listen: %s", strerror(e));
  }
  memcpy(p->token, l.token, sizeof l.token);
  pthread_mutex_lock(&ids_mu);
  p->next = pending_ids;
  pending_ids = p;
  pthread_mutex_unlock(&ids_mu);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &l, sizeof l);
  return ncclSuccess;
}

static int take_listener(const uint64_t token[2]) {
  int fd = -1;
  pthread_mutex_lock(&ids_mu);
  for (struct pending_id **pp = &pending_ids; *pp; pp = &(*pp)->next)
    if (memcmp((*pp)->token, token, sizeof (*pp)->token) == 0) {
      struct pending_id *p = *pp;
      *pp = p->next;
      fd = p->fd;
      free(p);
      break;
    }
  pthread_mutex_unlock(&ids_mu);
  return fd;
}

/* ---- communicators ---------------------------------------------------------- */

#define COMM_MAGIC 0x4d4d4f43u /* "COMM" */

/* Messages on a pair's control socket: lazy connection setup, and
 * teardown (loud: the peer's own connect fails; silent: after a silent
 * abort, peers notice nothing). */
enum { CONNECT_SEND = 'S', CONNECT_RECV = 'R', TEARDOWN = 'T', TEARDOWN_SILENT = 't' };
enum { GONE_LOUD = 1, GONE_SILENT = 2 };

struct peer {
  int fd_send, fd_recv; /* the data socket (for oneself: the two ends of a pair); -1 for none */
  int fd_ctl;           /* the control socket: lazy connection setup */
  /* Lazy connection, per direction ([0] send, [1] recv): told the peer,
   * and heard from it that it wants the opposite direction. */
  int told[2], heard[2];
  int gone; /* GONE_*: it tore down its communicator (or its process went) */
  uint64_t issued[2], done[2]; /* tickets per direction */
};

struct ncclComm {
  uint32_t magic;
  struct ncclComm *next; /* registry of live communicators */
  int rank, nranks;
  CUcontext ctx;
  struct peer *peers;
  int wake; /* eventfd, readable once the communicator is aborted */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_mutex_t ctl_mu; /* one connection setup at a time */
  int refs;     /* the handle + every launch not yet finished */
  int inflight; /* launches not yet finished */
  int blocking; /* ncclConfig_t's blocking (1 for ncclCommInitRank) */
  int pending;  /* non-blocking work not yet done: forming, or a group's launch */
  int aborted;  /* also read without mu, by transfers in flight */
  int silent_abort; /* RDT_FAKENCCL_ABORT=silent */
  int delay_ms;     /* RDT_FAKENCCL_DELAY_MS */
  ncclResult_t async_err;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *comms;

static int is_aborted(struct ncclComm *c) { return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE); }

/* A live communicator with a reference held, or NULL. */
static struct ncclComm *get_comm(ncclComm_t h) {
  pthread_mutex_lock(&reg_mu);
  struct ncclComm *c = comms;
  while (c && c != h) c = c->next;
  if (c) {
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
  }
  pthread_mutex_unlock(&reg_mu);
  return c;
}

static void put_comm(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last) return;
  /* After a silent abort the sockets stay open, so peers never notice. */
  for (int i = 0; i < c->nranks && !(c->aborted && c->silent_abort); i++) {
    struct peer *p = &c->peers[i];
    if (p->fd_send >= 0) close(p->fd_send);
    if (p->fd_recv >= 0 && p->fd_recv != p->fd_send) close(p->fd_recv);
    if (p->fd_ctl >= 0) close(p->fd_ctl);
  }
  close(c->wake);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->ctl_mu);
  c->magic = 0;
  free(c->peers);
  free(c);
}

/* Takes the communicator out of the registry: its handle is then invalid. */
static int unregister(struct ncclComm *c) {
  pthread_mutex_lock(&reg_mu);
  int found = 0;
  for (struct ncclComm **pp = &comms; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      found = 1;
      break;
    }
  pthread_mutex_unlock(&reg_mu);
  return found;
}

/* Every pair of ranks has two connections: data and control. */
enum { KIND_DATA = 0, KIND_CTL = 1 };
#define FD(fds, rank, kind) (fds)[2 * (rank) + (kind)]

struct hello {
  char magic[8];
  uint64_t token[2];
  int32_t rank, nranks;
  int32_t kind;
  int32_t has_uuid;
  unsigned char uuid[16];
};

struct welcome {
  int32_t result;
  char msg[256];
};

static void close_all(int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* Rank 0: accept both connections of every other rank, check them, answer
 * them all on their data connections. */
static ncclResult_t init_root(int lfd, const struct id_layout *id, int nranks, const struct hello *self,
                              int *fds, int wake) {
  struct hello *hs = calloc((size_t)nranks, sizeof *hs);
  if (!hs) return fail(ncclSystemError, "ncclCommInitRank: out of memory");
  hs[0] = *self;
  for (int missing = 2 * (nranks - 1); missing > 0;) {
    int fd = wait_in(lfd, wake) == 0 ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      free(hs);
      if (errno == ECANCELED) return fail(ncclInvalidUsage, "ncclCommInitRank: rank 0: the communicator was aborted");
      return fail(ncclSystemError, "ncclCommInitRank: rank 0: accept: %s", strerror(errno));
    }
    struct hello h;
    struct welcome w = {.result = ncclSuccess};
    if (read_all(fd, &h, sizeof h, wake) != 0) { /* a rank that went away before it said hello */
      int e = errno;
      close(fd);
      if (e == ECANCELED) {
        free(hs);
        return fail(ncclInvalidUsage, "ncclCommInitRank: rank 0: the communicator was aborted");
      }
      continue;
    }
    if (memcmp(h.magic, ID_MAGIC, sizeof h.magic) != 0 || memcmp(h.token, id->token, sizeof h.token) != 0)
      w.result = ncclInvalidArgument, snprintf(w.msg, sizeof w.msg, "the unique id does not match rank 0's");
    else if (h.nranks != nranks)
      w.result = ncclInvalidArgument,
      snprintf(w.msg, sizeof w.msg, "rank %d says nranks %d, rank 0 says %d", h.rank, h.nranks, nranks);
    else if (h.rank <= 0 || h.rank >= nranks || (h.kind != KIND_DATA && h.kind != KIND_CTL) ||
             FD(fds, h.rank, h.kind) >= 0)
      w.result = ncclInvalidArgument, snprintf(w.msg, sizeof w.msg, "rank %d is out of range or taken", h.rank);
    if (w.result != ncclSuccess) {
      write_all(fd, &w, sizeof w);
      close(fd);
      continue;
    }
    FD(fds, h.rank, h.kind) = fd;
    if (h.kind == KIND_DATA) hs[h.rank] = h;
    missing--;
  }
  /* NCCL refuses two ranks on one GPU. */
  struct welcome w = {.result = ncclSuccess};
  for (int i = 0; i < nranks && w.result == ncclSuccess; i++)
    for (int j = i + 1; j < nranks && w.result == ncclSuccess; j++)
      if (hs[i].has_uuid && hs[j].has_uuid && memcmp(hs[i].uuid, hs[j].uuid, 16) == 0)
        w.result = ncclInvalidUsage,
        snprintf(w.msg, sizeof w.msg, "Duplicate GPU detected: rank %d and rank %d both use the same device", i, j);
  free(hs);
  int lost = -1;
  for (int i = 1; i < nranks; i++)
    if (write_all(FD(fds, i, KIND_DATA), &w, sizeof w) != 0 && lost < 0) lost = i;
  if (w.result != ncclSuccess) return fail((ncclResult_t)w.result, "ncclCommInitRank: %s", w.msg);
  if (lost > 0) return fail(ncclRemoteError, "ncclCommInitRank: rank %d went away while the communicator formed", lost);
  return ncclSuccess;
}

/* Opens both connections to rank `to`, saying who we are on each. */
static int connect_pair(const uint64_t token[2], int to, const struct hello *self, int *fds, int wake) {
  for (int kind = KIND_DATA; kind <= KIND_CTL; kind++) {
    struct hello h = *self;
    h.kind = kind;
    FD(fds, to, kind) = connect_to(token, to, wake);
    if (FD(fds, to, kind) < 0 || write_all(FD(fds, to, kind), &h, sizeof h) != 0) return -1;
  }
  return 0;
}

/* Rank r > 0: join rank 0, then connect to ranks 1..r-1 and accept the
 * ranks above r. */
static ncclResult_t init_rank(const struct id_layout *id, int nranks, int rank, const struct hello *self,
                              int *fds, int wake) {
  int lfd = -1;
  if (rank < nranks - 1) {
    lfd = listen_on(id->token, rank, 2 * nranks);
    if (lfd < 0)
      return fail(ncclSystemError, "ncclCommInitRank: rank %d cannot listen: %s (is the rank taken?)", rank,
                  strerror(errno));
  }
  ncclResult_t r = ncclSuccess;
  struct welcome w;
  if (connect_pair(id->token, 0, self, fds, wake) != 0) {
    r = errno == ECANCELED ? fail(ncclInvalidUsage, "ncclCommInitRank: rank %d: the communicator was aborted", rank) :
    fail(ncclSystemError, "ncclCommInitRank: rank %d cannot reach rank 0 (process %d): %s", rank, id->pid,
             strerror(errno));
    goto out;
  }
  if (read_all(FD(fds, 0, KIND_DATA), &w, sizeof w, wake) != 0) {
    r = errno == ECANCELED ? fail(ncclInvalidUsage, "ncclCommInitRank: rank %d: the communicator was aborted", rank) :
    fail(ncclRemoteError, "ncclCommInitRank: rank %d lost rank 0 while joining: %s", rank,
             errno ? strerror(errno) : "connection closed");
    goto out;
  }
  if (w.result != ncclSuccess) {
    w.msg[sizeof w.msg - 1] = 0;
    r = fail((ncclResult_t)w.result, "ncclCommInitRank: rank 0 refused rank %d: %s", rank, w.msg);
    goto out;
  }
  /* Every rank is listening now (each did before it joined rank 0). */
  for (int i = 1; i < rank; i++)
    if (connect_pair(id->token, i, self, fds, wake) != 0) {
      r = errno == ECANCELED ? fail(ncclInvalidUsage, "ncclCommInitRank: rank %d: the communicator was aborted", rank) :
      fail(ncclRemoteError, "ncclCommInitRank: rank %d cannot connect to rank %d: %s", rank, i, strerror(errno));
      goto out;
    }
  for (int missing = 2 * (nranks - 1 - rank); missing > 0;) {
    int fd = wait_in(lfd, wake) == 0 ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      r = errno == ECANCELED ? fail(ncclInvalidUsage, "ncclCommInitRank: rank %d: the communicator was aborted", rank)
                             : fail(ncclSystemError, "ncclCommInitRank: rank %d: accept: %s", rank, strerror(errno));
      goto out;
    }
    struct hello h;
    if (read_all(fd, &h, sizeof h, wake) != 0 || memcmp(h.token, id->token, sizeof h.token) != 0 || h.rank <= rank ||
        h.rank >= nranks || (h.kind != KIND_DATA && h.kind != KIND_CTL) || FD(fds, h.rank, h.kind) >= 0) {
      close(fd);
      continue;
    }
    FD(fds, h.rank, h.kind) = fd;
    missing--;
  }
out:
  if (lfd >= 0) close(lfd);
  return r;
}

static void set_nonblock(int fd) {
  if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* A communicator not yet formed: no sockets, one reference (the handle's). */
static struct ncclComm *new_comm(int nranks, int rank, CUcontext ctx, int blocking) {
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->peers = calloc((size_t)nranks, sizeof *c->peers);
  c->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!c->peers || c->wake < 0) {
    if (c->wake >= 0) close(c->wake);
    free(c->peers);
    free(c);
    return NULL;
  }
  for (int i = 0; i < nranks; i++) c->peers[i].fd_send = c->peers[i].fd_recv = c->peers[i].fd_ctl = -1;
  c->magic = COMM_MAGIC;
  c->rank = rank;
  c->nranks = nranks;
  c->ctx = ctx;
  c->refs = 1;
  c->blocking = blocking;
  c->silent_abort = silent_abort;
  c->delay_ms = delay_ms;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_mutex_init(&c->ctl_mu, NULL);
  return c;
}

static void register_comm(struct ncclComm *c) {
  pthread_mutex_lock(&reg_mu);
  c->next = comms;
  comms = c;
  pthread_mutex_unlock(&reg_mu);
}

/* The rendezvous of a communicator: its sockets to every rank. A blocking
 * one (wake -1) waits as long as NCCL does; a non-blocking one stops when
 * it is aborted. */
static ncclResult_t form(struct ncclComm *c, const struct id_layout *id, const struct hello *self, int wake) {
  int nranks = c->nranks, rank = c->rank;
  int *fds = malloc(2 * (size_t)nranks * sizeof *fds);
  if (!fds) return fail(ncclSystemError, "ncclCommInitRank: out of memory");
  for (int i = 0; i < 2 * nranks; i++) fds[i] = -1;
  ncclResult_t r;
  if (rank == 0) {
    int lfd = take_listener(id->token);
    if (lfd < 0) {
      free(fds);
      return fail(ncclInvalidArgument,
                  "ncclCommInitRank: rank 0 must join in the process that called ncclGetUniqueId (process %d), "
                  "once per id",
                  id->pid);
    }
    r = init_root(lfd, id, nranks, self, fds, wake);
    close(lfd);
  } else {
    r = init_rank(id, nranks, rank, self, fds, wake);
  }
  /* Sends to oneself go into one end of a socket pair and are received
   * from the other; they need no connection setup. */
  int self_pair[2] = {-1, -1};
  if (r == ncclSuccess && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, self_pair) != 0)
    r = fail(ncclSystemError, "ncclCommInitRank: socketpair: %s", strerror(errno));
  if (r != ncclSuccess) {
    close_all(fds, 2 * nranks);
    free(fds);
    return r;
  }
  /* The sockets are non-blocking: transfers and connection setup poll them
   * together with the abort eventfd. */
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < nranks; i++) {
    struct peer *p = &c->peers[i];
    p->fd_send = p->fd_recv = FD(fds, i, KIND_DATA);
    p->fd_ctl = FD(fds, i, KIND_CTL);
    set_nonblock(p->fd_send);
    set_nonblock(p->fd_ctl);
  }
  c->peers[rank].fd_send = self_pair[0];
  c->peers[rank].fd_recv = self_pair[1];
  set_nonblock(self_pair[0]);
  set_nonblock(self_pair[1]);
  for (int d = 0; d < 2; d++) c->peers[rank].told[d] = c->peers[rank].heard[d] = 1;
  pthread_mutex_unlock(&c->mu);
  free(fds);
  return ncclSuccess;
}

struct forming {
  struct ncclComm *c; /* a reference held */
  struct id_layout id;
  struct hello self;
};

static void *form_async(void *arg) {
  struct forming *f = arg;
  struct ncclComm *c = f->c;
  ncclResult_t r = form(c, &f->id, &f->self, c->wake);
  pthread_mutex_lock(&c->mu);
  if (r != ncclSuccess && !c->aborted && c->async_err == ncclSuccess) c->async_err = r;
  c->pending--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  put_comm(c);
  free(f);
  return NULL;
}

static ncclResult_t init(const char *op, ncclComm_t *out, int nranks, const ncclUniqueId *commId, int rank,
                         int blocking) {
  *out = NULL;
  if (nranks < 1) return fail(ncclInvalidArgument, "%s: nranks %d", op, nranks);
  if (rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "%s: rank %d is outside 0..%d", op, rank, nranks - 1);
  struct id_layout id;
  memcpy(&id, commId->internal, sizeof id);
  if (memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0)
    return fail(ncclInvalidArgument, "%s: not a unique id made by ncclGetUniqueId", op);
  ncclResult_t r = load_cuda();
  if (r != ncclSuccess) return r;
  CUcontext ctx = NULL;
  if (cu.CtxGetCurrent(&ctx) != 0 || !ctx)
    return fail(ncclUnhandledCudaError, "%s: the calling thread has no current CUDA context", op);

  struct hello self;
  memset(&self, 0, sizeof self);
  memcpy(self.magic, ID_MAGIC, sizeof self.magic);
  memcpy(self.token, id.token, sizeof self.token);
  self.rank = rank;
  self.nranks = nranks;
  self.has_uuid = current_uuid(ctx, self.uuid);

  struct ncclComm *c = new_comm(nranks, rank, ctx, blocking);
  if (!c) return fail(ncclSystemError, "%s: out of memory", op);
  if (blocking) {
    r = form(c, &id, &self, -1);
    if (r != ncclSuccess) {
      put_comm(c);
      return r;
    }
    register_comm(c);
    *out = c;
    return ncclSuccess;
  }
  /* Non-blocking: the handle is valid at once; the rendezvous runs on a
   * thread of its own, and ncclCommGetAsyncError tells when it is over. */
  struct forming *f = calloc(1, sizeof *f);
  pthread_t th;
  pthread_attr_t attr;
  c->pending = 1;
  c->refs = 2;
  if (f) {
    f->c = c;
    f->id = id;
    f->self = self;
  }
  int started = f && pthread_attr_init(&attr) == 0;
  if (started) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&th, &attr, form_async, f) == 0;
    pthread_attr_destroy(&attr);
  }
  if (!started) {
    free(f);
    put_comm(c);
    put_comm(c);
    return fail(ncclSystemError, "%s: cannot start a thread", op);
  }
  register_comm(c);
  *out = c;
  return ncclInProgress;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId commId, int rank) {
  if (!out) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  return init("ncclCommInitRank", out, nranks, &commId, rank, 1);
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId commId, int rank,
                                        ncclConfig_t *config) {
  if (!out) return fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
  int blocking = 1;
  if (config) {
    /* As NCCL reads it: at most `size` bytes, then by version. */
    ncclConfig_t cfg = {.blocking = NCCL_CONFIG_UNDEF_INT};
    size_t size;
    memcpy(&size, config, sizeof size);
    memcpy(&cfg, config, size < sizeof cfg ? size : sizeof cfg);
    if (cfg.magic != NCCL_API_MAGIC)
      return fail(ncclInvalidArgument, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    if (cfg.version < 21400 || size < offsetof(ncclConfig_t, blocking) + sizeof(int))
      cfg.blocking = NCCL_CONFIG_UNDEF_INT;
    if (cfg.blocking != NCCL_CONFIG_UNDEF_INT && cfg.blocking != 0 && cfg.blocking != 1)
      return fail(ncclInvalidArgument, "Invalid config blocking attribute value %d", cfg.blocking);
    if (cfg.blocking == 0) blocking = 0;
  }
  return init("ncclCommInitRankConfig", out, nranks, &commId, rank, blocking);
}

static int connected(const struct peer *p) { return p->told[0] || p->told[1] || p->heard[0] || p->heard[1]; }

/* Notes what came on a control socket outside a connection setup. */
static void heard_on_ctl(struct peer *p, char m) {
  if (m == CONNECT_SEND) p->heard[1] = 1;
  if (m == CONNECT_RECV) p->heard[0] = 1;
  if (m == TEARDOWN) p->gone = GONE_LOUD;
  if (m == TEARDOWN_SILENT && !p->gone) p->gone = GONE_SILENT;
}

/* NCCL's teardown is collective on a host: a rank's proxy keeps serving
 * the connections its peers hold, so ncclCommDestroy and ncclCommAbort
 * return only once every connected peer has torn down too (or exited).
 * Each side tells the others on the control sockets, then waits to hear
 * the same from every peer it connected to. */
static void teardown(struct ncclComm *c) {
  pthread_mutex_lock(&c->ctl_mu);
  char m = c->aborted && c->silent_abort ? TEARDOWN_SILENT : TEARDOWN;
  for (int i = 0; i < c->nranks; i++) {
    struct peer *p = &c->peers[i];
    if (i == c->rank || p->fd_ctl < 0) continue;
    for (;;) { /* what came already: a peer's connection request counts as a connection */
      char b;
      ssize_t k = recv(p->fd_ctl, &b, 1, MSG_DONTWAIT);
      if (k == 1) {
        heard_on_ctl(p, b);
        continue;
      }
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) p->gone = GONE_LOUD;
      if (k == 0 || (k < 0 && errno != EINTR)) break;
    }
    if (send(p->fd_ctl, &m, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1 && errno != EAGAIN) p->gone = GONE_LOUD;
  }
  for (int i = 0; i < c->nranks; i++) {
    struct peer *p = &c->peers[i];
    while (i != c->rank && p->fd_ctl >= 0 && connected(p) && !p->gone) {
      struct pollfd pf = {.fd = p->fd_ctl, .events = POLLIN};
      if (poll(&pf, 1, -1) < 0 && errno != EINTR) break;
      char b;
      ssize_t k = recv(p->fd_ctl, &b, 1, MSG_DONTWAIT);
      if (k == 1) heard_on_ctl(p, b);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) p->gone = GONE_LOUD;
    }
  }
  pthread_mutex_unlock(&c->ctl_mu);
}

/* Aborts every communicator's operations in flight: the abort eventfd and,
 * unless silent, the end of every data socket (peers see ncclRemoteError).
 * A communicator still forming stops forming. */
API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  struct ncclComm *c = get_comm(comm);
  if (!c || !unregister(c)) {
    if (c) put_comm(c);
    return fail(ncclInvalidArgument, "ncclCommAbort: invalid communicator %p (destroyed or aborted?)", (void *)comm);
  }
  pthread_mutex_lock(&c->mu);
  __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  uint64_t one = 1;
  ssize_t k = write(c->wake, &one, sizeof one);
  (void)k;
  /* As NCCL joins its init and group threads: they stop at the abort. */
  pthread_mutex_lock(&c->mu);
  while (c->pending > 0) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  if (!c->silent_abort)
    for (int i = 0; i < c->nranks; i++) {
      if (c->peers[i].fd_send >= 0) shutdown(c->peers[i].fd_send, SHUT_RDWR);
      if (c->peers[i].fd_recv >= 0) shutdown(c->peers[i].fd_recv, SHUT_RDWR);
    }
  teardown(c);
  put_comm(c); /* ours */
  put_comm(c); /* the handle's: freed once the last launch has returned */
  return ncclSuccess;
}

/* Waits for the operations in flight (NCCL finalizes a communicator before
 * it frees it) and for its peers' teardown, then frees the communicator. */
API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  struct ncclComm *c = get_comm(comm);
  if (!c || !unregister(c)) {
    if (c) put_comm(c);
    return fail(ncclInvalidArgument, "ncclCommDestroy: invalid communicator %p (destroyed or aborted?)",
                (void *)comm);
  }
  pthread_mutex_lock(&c->mu);
  while (c->inflight > 0 || c->pending > 0) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  teardown(c);
  put_comm(c);
  put_comm(c);
  return ncclSuccess;
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  struct ncclComm *c = get_comm(comm);
  if (!c)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: invalid communicator %p (destroyed or aborted?)",
                (void *)comm);
  pthread_mutex_lock(&c->mu);
  *asyncError = c->async_err != ncclSuccess ? c->async_err : c->pending > 0 ? ncclInProgress : ncclSuccess;
  pthread_mutex_unlock(&c->mu);
  put_comm(c);
  return ncclSuccess;
}

/* ---- transfers -------------------------------------------------------------- */

struct xfer {
  int send, peer;
  char *buf;
  size_t n;
  uint64_t ticket; /* place among the launches to or from peer in that direction */
};

struct wire_header {
  uint64_t magic, n;
};

enum { IO_OK = 0, IO_ERR = -1, IO_ABORTED = -2 };

/* Moves n bytes over a non-blocking socket, waiting with poll on it and on
 * the abort eventfd, and stopping at an abort between chunks (as NCCL's
 * kernels poll their abort flag). IO_ERR with errno set (0: the peer
 * closed it). */
static int io_all(struct ncclComm *c, int fd, int out, void *p, size_t n) {
  char *b = p;
  while (n > 0) {
    if (is_aborted(c)) return IO_ABORTED;
    size_t chunk = n < (1u << 20) ? n : (1u << 20);
    ssize_t k = out ? send(fd, b, chunk, MSG_NOSIGNAL) : recv(fd, b, chunk, 0);
    if (k > 0) {
      b += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) {
      errno = 0;
      return IO_ERR;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERR;
    struct pollfd pf[2] = {{.fd = fd, .events = out ? POLLOUT : POLLIN}, {.fd = c->wake, .events = POLLIN}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR) return IO_ERR;
    if (pf[1].revents & POLLIN) return IO_ABORTED;
  }
  return IO_OK;
}

static ncclResult_t io_fail(struct ncclComm *c, const struct xfer *x, const char *what) {
  int e = errno;
  const char *op = x->send ? "ncclSend" : "ncclRecv";
  if (e == 0 || e == EPIPE || e == ECONNRESET)
    return fail(ncclRemoteError, "%s: rank %d, %s peer rank %d: the connection was closed (the peer exited or aborted)",
                op, c->rank, what, x->peer);
  return fail(ncclSystemError, "%s: rank %d, %s peer rank %d: %s", op, c->rank, what, x->peer, strerror(e));
}

/* One send or receive, after the ones launched before it to the same peer
 * in the same direction. */
static void run_xfer(struct ncclComm *c, const struct xfer *x) {
  int dir = x->send ? 0 : 1;
  struct peer *p = &c->peers[x->peer];
  pthread_mutex_lock(&c->mu);
  while (!c->aborted && c->async_err == ncclSuccess && p->done[dir] != x->ticket) pthread_cond_wait(&c->cv, &c->mu);
  int go = !c->aborted && c->async_err == ncclSuccess;
  pthread_mutex_unlock(&c->mu);

  ncclResult_t r = ncclSuccess;
  int io = IO_OK;
  if (go && c->delay_ms > 0 && x->n >= delay_min) { /* a slow link: only an abort cuts it short */
    struct pollfd pf = {.fd = c->wake, .events = POLLIN};
    if (poll(&pf, 1, c->delay_ms) > 0) io = IO_ABORTED;
  }
  if (io != IO_OK) {
    /* aborted: not the communicator's error */
  } else if (go && x->send) {
    struct wire_header h = {WIRE_MAGIC, x->n};
    io = io_all(c, p->fd_send, 1, &h, sizeof h);
    if (io == IO_OK) io = io_all(c, p->fd_send, 1, x->buf, x->n);
    if (io == IO_ERR) r = io_fail(c, x, "sending to");
  } else if (go) {
    struct wire_header h;
    io = io_all(c, p->fd_recv, 0, &h, sizeof h);
    if (io == IO_ERR) {
      r = io_fail(c, x, "receiving from");
    } else if (io == IO_OK && h.magic != WIRE_MAGIC) {
      r = fail(ncclInternalError, "ncclRecv: rank %d: corrupt data from rank %d", c->rank, x->peer);
    } else if (io == IO_OK && h.n != x->n) {
      r = fail(ncclInvalidUsage, "ncclRecv: rank %d posted a receive of %zu bytes from rank %d, which sent %llu",
               c->rank, x->n, x->peer, (unsigned long long)h.n);
    } else if (io == IO_OK) {
      io = io_all(c, p->fd_recv, 0, x->buf, x->n);
      if (io == IO_ERR) r = io_fail(c, x, "receiving from");
    }
  }

  pthread_mutex_lock(&c->mu);
  if (r != ncclSuccess && !c->aborted && c->async_err == ncclSuccess) c->async_err = r;
  if (p->done[dir] <= x->ticket) p->done[dir] = x->ticket + 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* The operations of one communicator on one stream from one ncclGroupEnd. */
struct launch {
  struct ncclComm *c;
  size_t n;
  struct xfer x[];
};

struct lane {
  struct launch *l;
  int key; /* peer * 2 + direction */
  pthread_t thread;
  int started;
};

static int lane_key(const struct xfer *x) { return x->peer * 2 + (x->send ? 0 : 1); }

static void *run_lane(void *arg) {
  struct lane *ln = arg;
  for (size_t i = 0; i < ln->l->n; i++)
    if (lane_key(&ln->l->x[i]) == ln->key) run_xfer(ln->l->c, &ln->l->x[i]);
  return NULL;
}

/* The host function: every peer and direction on its own thread (the last
 * one on the stream's), in launch order within each. */
static void run_launch(void *arg) {
  struct launch *l = arg;
  struct ncclComm *c = l->c;
  struct lane *lanes = calloc(l->n, sizeof *lanes);
  size_t nl = 0;
  if (lanes) {
    for (size_t i = 0; i < l->n; i++) {
      int k = lane_key(&l->x[i]), seen = 0;
      for (size_t j = 0; j < nl; j++) seen |= lanes[j].key == k;
      if (!seen) lanes[nl++] = (struct lane){.l = l, .key = k};
    }
    for (size_t j = 0; j + 1 < nl; j++)
      lanes[j].started = pthread_create(&lanes[j].thread, NULL, run_lane, &lanes[j]) == 0;
    for (size_t j = 0; j < nl; j++)
      if (!lanes[j].started) run_lane(&lanes[j]);
    for (size_t j = 0; j + 1 < nl; j++)
      if (lanes[j].started) pthread_join(lanes[j].thread, NULL);
    free(lanes);
  } else {
    for (size_t i = 0; i < l->n; i++) run_xfer(c, &l->x[i]);
  }
  pthread_mutex_lock(&c->mu);
  c->inflight--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  put_comm(c);
  free(l);
}

/* ---- groups ------------------------------------------------------------------ */

struct queued {
  struct ncclComm *c; /* a reference held */
  void *stream;
  struct xfer x;
  int launched;
};


API ncclResult_t ncclGroupStart(void) {
  grp.depth++;
  return ncclSuccess;
}

/* NCCL connects a pair of ranks lazily, at the first send (or receive)
 * between them: the group end that launches it exchanges connection
 * details with the peer and blocks until the peer launches the matching
 * receive (or send), or the communicator is aborted. Called with ctl_mu
 * held; tell first for every operation of the launch, then wait, so that a
 * group may both send to and receive from a peer. */
static ncclResult_t connect_peer(struct ncclComm *c, int peer, int dir, int wait) {
  struct peer *p = &c->peers[peer];
  errno = 0;
  if (!p->told[dir]) {
    char m = dir == 0 ? CONNECT_SEND : CONNECT_RECV;
    if (io_all(c, p->fd_ctl, 1, &m, 1) == IO_OK) p->told[dir] = 1;
  }
  /* Our send pairs with the peer's receive, and the other way round. A
   * peer that tore down loudly fails the connection; after a silent abort
   * it waits on, as over NCCL's shared memory. */
  while (wait && p->told[dir] && !p->heard[dir] && p->gone != GONE_LOUD) {
    char m;
    if (io_all(c, p->fd_ctl, 0, &m, 1) != IO_OK) break;
    heard_on_ctl(p, m);
  }
  if (p->gone == GONE_LOUD && !is_aborted(c)) errno = 0;
  if (p->told[dir] && (!wait || p->heard[dir])) return ncclSuccess;
  if (is_aborted(c))
    return fail(ncclInvalidUsage, "ncclGroupEnd: rank %d: the communicator was aborted while connecting to rank %d",
                c->rank, peer);
  if (errno == 0 || errno == EPIPE || errno == ECONNRESET)
    return fail(ncclRemoteError, "ncclGroupEnd: rank %d: rank %d went away before it connected", c->rank, peer);
  return fail(ncclSystemError, "ncclGroupEnd: rank %d: connecting to rank %d: %s", c->rank, peer, strerror(errno));
}

static ncclResult_t launch_one(struct queued *qs, size_t nq, struct queued *first) {
  struct ncclComm *c = first->c;
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&c->ctl_mu);
  for (int wait = 0; wait <= 1 && r == ncclSuccess; wait++)
    for (struct queued *q = first; q < qs + nq && r == ncclSuccess; q++)
      if (!q->launched && q->c == c && q->stream == first->stream)
        r = connect_peer(c, q->x.peer, q->x.send ? 0 : 1, wait);
  pthread_mutex_unlock(&c->ctl_mu);
  if (r != ncclSuccess) return r;
  size_t n = 0;
  for (struct queued *q = first; q < qs + nq; q++) n += !q->launched && q->c == c && q->stream == first->stream;
  struct launch *l = malloc(sizeof *l + n * sizeof l->x[0]);
  if (!l) return fail(ncclSystemError, "ncclGroupEnd: out of memory");
  l->c = c;
  l->n = 0;
  for (struct queued *q = first; q < qs + nq; q++)
    if (!q->launched && q->c == c && q->stream == first->stream) {
      l->x[l->n++] = q->x;
      q->launched = 1;
    }
  pthread_mutex_lock(&c->mu);
  if (c->aborted) {
    r = fail(ncclInvalidArgument, "ncclGroupEnd: the communicator was aborted");
  } else if (c->async_err != ncclSuccess) {
    r = fail(c->async_err, "ncclGroupEnd: the communicator has failed: %s", ncclGetErrorString(c->async_err));
  } else {
    for (size_t i = 0; i < l->n; i++) l->x[i].ticket = c->peers[l->x[i].peer].issued[l->x[i].send ? 0 : 1]++;
    c->refs++;
    c->inflight++;
    CUresult cr = cu.LaunchHostFunc(first->stream, run_launch, l);
    if (cr != 0) {
      for (size_t i = l->n; i-- > 0;) c->peers[l->x[i].peer].issued[l->x[i].send ? 0 : 1]--;
      c->refs--;
      c->inflight--;
      r = fail(ncclUnhandledCudaError, "ncclGroupEnd: cuLaunchHostFunc failed: CUDA error %d", cr);
    } else {
      l = NULL; /* the host function owns it */
    }
  }
  pthread_mutex_unlock(&c->mu);
  free(l);
  return r;
}

/* The launch of a group of non-blocking communicators, on its own thread. */
struct group_job {
  size_t n;
  struct queued q[];
};

/* Whether q[i] is the first of the queue on its communicator. */
static int first_on_comm(const struct queued *q, size_t i) {
  for (size_t j = 0; j < i; j++)
    if (q[j].c == q[i].c) return 0;
  return 1;
}

static void *run_group_job(void *arg) {
  struct group_job *j = arg;
  ncclResult_t r = ncclSuccess;
  for (size_t i = 0; i < j->n && r == ncclSuccess; i++)
    if (!j->q[i].launched) r = launch_one(j->q, j->n, &j->q[i]);
  for (size_t i = 0; i < j->n; i++) {
    struct ncclComm *c = j->q[i].c;
    if (!first_on_comm(j->q, i)) continue;
    pthread_mutex_lock(&c->mu);
    if (r != ncclSuccess && !c->aborted && c->async_err == ncclSuccess) c->async_err = r;
    c->pending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
  }
  for (size_t i = 0; i < j->n; i++) put_comm(j->q[i].c);
  free(j);
  return NULL;
}

/* Hands the queue of non-blocking communicators to a thread: ncclInProgress,
 * and each communicator pending until the thread has launched. */
static ncclResult_t launch_async(void) {
  struct group_job *j = malloc(sizeof *j + grp.n * sizeof j->q[0]);
  if (!j) return fail(ncclSystemError, "ncclGroupEnd: out of memory");
  j->n = grp.n;
  memcpy(j->q, grp.q, grp.n * sizeof j->q[0]);
  for (size_t i = 0; i < j->n; i++)
    if (first_on_comm(j->q, i)) {
      pthread_mutex_lock(&j->q[i].c->mu);
      j->q[i].c->pending++;
      pthread_mutex_unlock(&j->q[i].c->mu);
    }
  pthread_t th;
  pthread_attr_t attr;
  int started = pthread_attr_init(&attr) == 0;
  if (started) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&th, &attr, run_group_job, j) == 0;
    pthread_attr_destroy(&attr);
  }
  if (!started) {
    for (size_t i = 0; i < j->n; i++)
      if (first_on_comm(j->q, i)) {
        pthread_mutex_lock(&j->q[i].c->mu);
        j->q[i].c->pending--;
        pthread_cond_broadcast(&j->q[i].c->cv);
        pthread_mutex_unlock(&j->q[i].c->mu);
      }
    free(j);
    return fail(ncclSystemError, "ncclGroupEnd: cannot start a thread");
  }
  return ncclInProgress; /* the thread owns the queue's references */
}

API ncclResult_t ncclGroupEnd(void) {
  if (grp.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart before it");
  if (--grp.depth > 0) return ncclSuccess;
  ncclResult_t r = grp.err;
  int nonblocking = -1;
  for (size_t i = 0; i < grp.n && r == ncclSuccess; i++) {
    int nb = !grp.q[i].c->blocking;
    if (nonblocking >= 0 && nb != nonblocking)
      r = fail(ncclInvalidArgument, "ncclGroupEnd: Blocking and nonblocking communicators are not allowed in the same group.");
    nonblocking = nb;
  }
  if (r == ncclSuccess && nonblocking == 1) {
    r = launch_async();
    if (r == ncclInProgress) {
      grp.n = 0;
      grp.err = ncclSuccess;
      return r;
    }
  }
  for (size_t i = 0; i < grp.n && r == ncclSuccess; i++)
    if (!grp.q[i].launched) r = launch_one(grp.q, grp.n, &grp.q[i]);
  for (size_t i = 0; i < grp.n; i++) put_comm(grp.q[i].c);
  grp.n = 0;
  grp.err = ncclSuccess;
  return r;
}

/* NCCL_CHECK_POINTERS=1: device memory of the communicator's context, and
 * the whole range inside one allocation. */
static ncclResult_t check_buffer(struct ncclComm *c, const char *op, const void *buf, size_t n) {
  if (n == 0) return ncclSuccess;
  if (!buf) return fail(ncclInvalidArgument, "%s: the buffer is NULL", op);
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)buf, base = 0;
  CUcontext pctx = NULL;
  size_t size = 0;
  if (cu.PointerGetAttribute(&pctx, CU_POINTER_ATTRIBUTE_CONTEXT, p) != 0)
    return fail(ncclInvalidArgument, "%s: buffer %p is not a valid device pointer", op, buf);
  if (pctx != c->ctx)
    return fail(ncclInvalidArgument, "%s: buffer %p is memory of another device than rank %d's communicator", op, buf,
                c->rank);
  if (cu.PointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) == 0 &&
      cu.PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) == 0 && (p - base > size || n > size - (p - base)))
    return fail(ncclInvalidArgument, "%s: %zu bytes at %p run past the end of their allocation", op, n, buf);
  return ncclSuccess;
}

static ncclResult_t enqueue(int send, void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                            cudaStream_t stream) {
  const char *op = send ? "ncclSend" : "ncclRecv";
  ncclResult_t r = ncclSuccess;
  struct ncclComm *c = get_comm(comm);
  if (!c) {
    r = fail(ncclInvalidArgument, "%s: invalid communicator %p (destroyed or aborted?)", op, (void *)comm);
  } else if ((int)type < 0 || type >= ncclNumTypes) {
    r = fail(ncclInvalidArgument, "%s: invalid data type %d", op, (int)type);
  } else if (peer < 0 || peer >= c->nranks) {
    r = fail(ncclInvalidArgument, "%s: peer %d is outside 0..%d", op, peer, c->nranks - 1);
  } else if (count > SIZE_MAX / type_size[type]) {
    r = fail(ncclInvalidArgument, "%s: count %zu is too large", op, count);
  } else {
    r = check_buffer(c, op, buf, count * type_size[type]);
  }
  if (r == ncclSuccess) {
    pthread_mutex_lock(&c->mu);
    if (c->async_err != ncclSuccess)
      r = fail(c->async_err, "%s: the communicator has failed: %s", op, ncclGetErrorString(c->async_err));
    else if (c->pending > 0)
      r = fail(ncclInvalidUsage, "%s: the communicator is not ready (ncclCommGetAsyncError says ncclInProgress: "
                                 "wait until it does not)", op);
    pthread_mutex_unlock(&c->mu);
  }
  if (r == ncclSuccess && grp.n == grp.cap) {
    size_t cap = grp.cap ? grp.cap * 2 : 16;
    struct queued *q = realloc(grp.q, cap * sizeof *q);
    if (!q) {
      r = fail(ncclSystemError, "%s: out of memory", op);
    } else {
      grp.q = q;
      grp.cap = cap;
    }
  }
  if (r != ncclSuccess) {
    if (c) put_comm(c);
    if (grp.depth > 0 && grp.err == ncclSuccess) grp.err = r;
    return r;
  }
  int implicit = grp.depth == 0;
  if (implicit) ncclGroupStart();
  grp.q[grp.n++] = (struct queued){
      .c = c, .stream = stream, .x = {.send = send, .peer = peer, .buf = buf, .n = count * type_size[type]}};
  return implicit ? ncclGroupEnd() : ncclSuccess;
}

API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                          cudaStream_t stream) {
  return enqueue(1, (void *)sendbuff, count, datatype, peer, comm, stream);
}

API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                          cudaStream_t stream) {
  return enqueue(0, recvbuff, count, datatype, peer, comm, stream);
}
