/*
 * fake_cuda.c: a test double of the CUDA driver API (libcuda.so.1), used
 * only by rdt's tests. It is built into build/fakecuda/libcuda.so.1 and
 * loaded in place of the driver with RDT_CUDA_LIBRARY, so that the code
 * around CUDA (transports/internal/cuda and the cuda_ipc transport) runs on
 * machines without a GPU.
 *
 * What it models, after the CUDA 12 driver API documentation:
 *   - cuInit first (CUDA_ERROR_NOT_INITIALIZED before it); devices counted
 *     by RDT_FAKECUDA_DEVICES (default 1; 0 makes cuInit fail with
 *     CUDA_ERROR_NO_DEVICE), chosen and renumbered by CUDA_VISIBLE_DEVICES
 *     (a list of indices, cut at the first invalid one), each with a stable
 *     UUID and the name "rdt fake CUDA device N" (N: the index before
 *     CUDA_VISIBLE_DEVICES). RDT_FAKECUDA_PEER_ACCESS=0 makes
 *     cuDeviceCanAccessPeer say no for every pair.
 *   - Primary contexts and a current context per thread: calls that need a
 *     context fail with CUDA_ERROR_INVALID_CONTEXT when the calling thread
 *     has none. cuDevicePrimaryCtxGetState says a primary context is
 *     active once retained (the double never releases one), so tests can
 *     tell on which devices a process made a context.
 *   - Device memory: each cuMemAlloc is its own memfd, mapped shared, kept
 *     in an allocation table (base, size, context, buffer id). The memfd is
 *     named "rdt-fakecuda-<pid>-<token>-<buffer id>"; tests count the
 *     mappings of another process's memory in /proc/self/maps by it. Pointer
 *     attributes and cuMemGetAddressRange answer from that table; any other
 *     address is host memory the driver does not know
 *     (CUDA_ERROR_INVALID_VALUE from cuPointerGetAttribute,
 *     CUDA_ERROR_NOT_FOUND from cuMemGetAddressRange).
 *   - Memory that legacy IPC cannot share, as the driver allocates it for
 *     PyTorch's cudaMallocAsync backend and its expandable segments:
 *     cuMemAllocAsync (the device's default pool; cuMemFreeAsync frees when
 *     the stream gets there, cuMemFree at once) and virtual memory
 *     management (cuMemCreate of pinned device memory in multiples of a
 *     2 MiB granularity, each its own memfd; cuMemAddressReserve, cuMemMap
 *     at offset 0 as the driver requires, cuMemSetAccess, cuMemUnmap,
 *     cuMemRelease, cuMemAddressFree, cuMemRetainAllocationHandle from any
 *     address of a mapping, cuMemGetAllocationPropertiesFromHandle).
 *     cuMemGetAddressRange of such memory gives the one cuMemMap that
 *     holds the address (what rdt assumes the driver does; unchecked on a
 *     GPU). Shareable handles: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
 *     (1) only. cuMemExportToShareableHandle returns a new descriptor (a
 *     dup of the memfd) for an allocation created with that type in
 *     prop.requestedHandleTypes, else CUDA_ERROR_INVALID_VALUE (a guess);
 *     cuMemImportFromShareableHandle takes such a descriptor from any
 *     process (received with pidfd_getfd, say), recognised by the memfd's
 *     name "rdt-fakecuda-vmm-<pid>-<token>-<id>-<device index>", and
 *     leaves it to the caller to close. A mapping is usable by the devices
 *     cuMemSetAccess named only: a copy in a context of any other device,
 *     or before cuMemSetAccess, fails with CUDA_ERROR_ILLEGAL_ADDRESS at
 *     once (the driver faults later, on the device, and the context is
 *     lost); giving a device other than the memory's own access needs
 *     peer access (else CUDA_ERROR_INVALID_DEVICE, a guess). Mappings next
 *     to each other are one range to copies, as on a GPU. Both pool and
 *     virtual memory are device memory to copies and pointer attributes,
 *     with CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 0
 *     (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE names the pool of the first),
 *     and cuIpcGetMemHandle refuses them with CUDA_ERROR_INVALID_VALUE, as
 *     drivers are reported to for pool memory (for cuMemCreate's, the same
 *     code is a guess). Pools cannot be exported (no
 *     cuMemPoolExportToShareableHandle).
 *   - Legacy IPC: a handle names a whole allocation (any address inside it
 *     gives the same handle, as the real driver does) by owner pid, memfd
 *     number, size, buffer id and the exporting device (its index before
 *     CUDA_VISIBLE_DEVICES, as a UUID would: numbering differs between
 *     processes). cuIpcOpenMemHandle maps /proc/<pid>/fd/<fd> in the
 *     current context, which may be of any device that is the exporting
 *     one or has peer access to it, whether this process sees the
 *     exporting device or not, as the driver allows; without peer access
 *     it is CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (the code the driver gives
 *     there is a guess). It refuses a handle of its own process
 *     (CUDA_ERROR_INVALID_CONTEXT, like the driver) and one whose owner or
 *     allocation is gone, or that is corrupt (CUDA_ERROR_INVALID_HANDLE).
 *     Opening a handle twice in one context counts references and returns
 *     the same address (in another context, another mapping);
 *     cuIpcCloseMemHandle unmaps at zero.
 *   - Streams: a worker thread per stream runs what is enqueued, in order
 *     (copies with memcpy, host functions, event records). cuEventQuery is
 *     CUDA_ERROR_NOT_READY until its stream reaches the record. Copies are
 *     checked as the driver checks them: a DtoD or peer copy needs device
 *     memory on both sides (of the contexts given, for a peer copy); a
 *     range that starts in an allocation and runs past it is an error.
 *     RDT_FAKECUDA_COPY_DELAY_US delays each enqueued copy, so that tests
 *     can catch work in flight.
 *   - Host memory is all pageable (rdt never pins or registers any), and
 *     the "Async" copies behave with it as the driver's API synchronization
 *     behavior documents: device to host returns only once the copy is
 *     done (the driver stages it through pinned memory inside the call, so
 *     a caller cannot interrupt it, nor poll an event meanwhile); host to
 *     device first waits for the stream's earlier work and returns once
 *     the bytes are staged (the caller may reuse its buffer); host to host
 *     is synchronous. Only device to device is asynchronous.
 *   - cuMemFree synchronizes the device: it returns once everything
 *     enqueued on any stream of the allocation's context has run (streams
 *     destroyed with work pending included), whether or not that work
 *     touches the memory freed; a host function that never returns makes
 *     it wait forever, as a kernel that never ends does on a GPU.
 *   - Stricter than the driver, to catch callers' bugs: cuIpcCloseMemHandle
 *     of a mapping that enqueued copies still use aborts the process with a
 *     message (the driver documents nothing for it).
 *
 * What it cannot prove: the real driver's ABI (struct layouts, symbol
 * versions, enum values are written here from cuda.h, not checked against
 * a driver), anything about DMA, the copy engines, peer mappings or speed,
 * the legacy default stream's implicit synchronization, or behaviour the
 * documentation leaves undefined (such as reading an IPC mapping after its
 * owner freed the memory: here the memfd simply stays alive).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* ---- cuda.h: types and values --------------------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;
typedef struct fake_stream *CUstream;
typedef struct fake_event *CUevent;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef void (*CUhostFn)(void *userData);
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct fake_pool *CUmemoryPool;
typedef struct {
  int type; /* CUmemLocationType */
  int id;
} CUmemLocation;
typedef struct {
  int type;                 /* CUmemAllocationType */
  int requestedHandleTypes; /* CUmemAllocationHandleType */
  CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;
typedef struct {
  CUmemLocation location;
  int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_MAP_FAILED = 205,
  CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
};

enum {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
  CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
  CU_POINTER_ATTRIBUTE_MAPPED = 13,
  CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,
};

#define CU_MEMORYTYPE_DEVICE 2u
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_MEM_HANDLE_TYPE_ALL 0xf /* POSIX_FILE_DESCRIPTOR | WIN32 | WIN32_KMT | FABRIC */
#define CU_MEM_ACCESS_FLAGS_PROT_READ 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define VMM_GRANULARITY ((size_t)2 << 20) /* what GPUs report for device memory */
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_FLAGS_ALL 0x7u /* BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* ---- errors --------------------------------------------------------------- */

static const struct {
  CUresult code;
  const char *name, *text;
} errors[] = {
  {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
  {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
  {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
  {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
   "peer access is not supported between these two devices"},
  {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
  {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
};

API CUresult cuGetErrorName(CUresult r, const char **s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == r) {
      *s = errors[i].name;
      return CUDA_SUCCESS;
    }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult r, const char **s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == r) {
      *s = errors[i].text;
      return CUDA_SUCCESS;
    }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

/* ---- state ---------------------------------------------------------------- */

#define MAX_DEVICES 64
#define CTX_MAGIC 0x43545846u    /* "FXTC" */
#define STREAM_MAGIC 0x53545246u /* "FRTS" */
#define EVENT_MAGIC 0x45565446u  /* "FTVE" */

/* One lock for every table and queue; stream workers drop it while they
 * copy or run a host function. `progress` is broadcast whenever an
 * enqueued operation completes. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER;

static int initialized; /* set once, under mu, after the rest: read with is_init() */
static int ndev;                 /* visible devices */
static int physical[MAX_DEVICES]; /* visible ordinal -> index in RDT_FAKECUDA_DEVICES */
static int peer_access = 1;
static unsigned copy_delay_us;
static uint64_t token;           /* random per process: names its memfds */
static unsigned long long next_buffer_id = 1;
static uint64_t next_ticket = 1; /* numbers every enqueued operation, in order */

static int is_init(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

struct fake_ctx {
  uint32_t magic;
  int dev;      /* ordinal */
  int retained; /* cuDevicePrimaryCtxRetain count */
  struct fake_stream *null_stream;
};
static struct fake_ctx ctxs[MAX_DEVICES];
/* The calling thread's current context, in a pthread key rather than
 * __thread: LeakSanitizer cannot walk the dynamic TLS of a dlopen'd
 * library in threads that the Go runtime made. */
static pthread_key_t current_key;
static pthread_once_t current_once = PTHREAD_ONCE_INIT;
static void make_current_key(void) { pthread_key_create(&current_key, NULL); }
static struct fake_ctx *get_current(void) {
  pthread_once(&current_once, make_current_key);
  return pthread_getspecific(current_key);
}
static void set_current(struct fake_ctx *c) {
  pthread_once(&current_once, make_current_key);
  pthread_setspecific(current_key, c);
}

/* The kinds of device memory: cuMemAlloc's (the only kind legacy IPC
 * exports), a handle opened with cuIpcOpenMemHandle, cuMemAllocAsync's
 * (from the device's default memory pool), and a cuMemMap of a cuMemCreate
 * allocation (virtual memory management). */
enum { ALLOC_DEVICE, ALLOC_IPC, ALLOC_POOL, ALLOC_VMM };

/* A cuMemCreate allocation (or one imported from a shareable handle): its
 * memfd, held by the handle until cuMemRelease and by each mapping until
 * cuMemUnmap. The memfd is named "rdt-fakecuda-vmm-<pid>-<token>-<id>-<P>"
 * (P: the device's index before CUDA_VISIBLE_DEVICES), so that an import
 * knows what it was given; an exported file descriptor is a dup of it. */
struct phys {
  struct phys *next;
  int fd;
  size_t size;
  int dev;     /* ordinal of the device it lives on (an import: see cuMemImportFromShareableHandle) */
  int pdev;    /* that device's index in RDT_FAKECUDA_DEVICES */
  int handles; /* CUmemAllocationProp.requestedHandleTypes */
  int hrefs;   /* the handle: cuMemCreate or import, and each cuMemRetainAllocationHandle */
  int refs;    /* hrefs, and one per mapping */
};
static struct phys *physs;

/* A cuMemAddressReserve range. */
struct reservation {
  struct reservation *next;
  uintptr_t base;
  size_t size;
};
static struct reservation *reservations;

/* Each device's default memory pool: only its address matters. */
struct fake_pool {
  int dev;
};
static struct fake_pool pools[MAX_DEVICES];

struct alloc {
  struct alloc *next;
  int kind;
  uintptr_t base;
  size_t size;
  struct fake_ctx *ctx;
  unsigned long long id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
  int busy;              /* enqueued copies that use it */
  int freeing;           /* ALLOC_POOL: cuMemFreeAsync enqueued */
  int fd;                /* ALLOC_DEVICE: the memfd */
  struct phys *phys;     /* ALLOC_VMM: what is mapped */
  uint64_t access;       /* ALLOC_VMM: devices (ordinal bits) cuMemSetAccess gave access */
  /* ALLOC_IPC: the exporting process's allocation, and open count */
  int32_t owner_pid;
  uint64_t owner_token;
  unsigned long long owner_id;
  int refs;
};
static struct alloc *allocs;

enum { OP_COPY, OP_HOST_FN, OP_RECORD, OP_FREE };

struct op {
  struct op *next;
  int kind;
  void *dst;
  const void *src;
  size_t n;
  struct alloc *pins[2];
  CUhostFn fn;
  void *data;
  struct fake_event *ev;
  uint64_t seq;
  struct alloc *freed; /* OP_FREE */
  uint64_t ticket; /* next_ticket when it was enqueued */
  void *staging;   /* freed once the operation ran */
};

struct fake_stream {
  uint32_t magic;
  struct fake_stream *next; /* registry of streams whose worker runs (destroyed ones until drained) */
  struct fake_ctx *ctx;
  struct op *head, *tail;
  uint64_t enqueued, done;
  int destroyed;
  pthread_cond_t wake;
};
static struct fake_stream *streams;

struct fake_event {
  uint32_t magic;
  struct fake_event *next; /* registry of live events */
  struct fake_ctx *ctx;
  uint64_t recorded, reached; /* last record's number; last one the stream reached */
  int pending;                /* records enqueued, not yet reached */
  int destroyed;
};
static struct fake_event *events;

/* The IPC handle's layout inside CUipcMemHandle's 64 bytes. */
#define HANDLE_MAGIC "RDTFAKE1"
struct ipc_handle {
  char magic[8];
  int32_t pid, fd;
  uint64_t token;
  uint64_t id;
  uint64_t size;
  int32_t device; /* index in RDT_FAKECUDA_DEVICES */
};
_Static_assert(sizeof(struct ipc_handle) <= sizeof(CUipcMemHandle), "handle too large");

/* ---- helpers (called with mu held) ---------------------------------------- */

static struct alloc *find(uintptr_t p) {
  for (struct alloc *a = allocs; a; a = a->next)
    if (p >= a->base && p - a->base < a->size) return a;
  return NULL;
}

static void unlink_alloc(struct alloc *a) {
  for (struct alloc **pp = &allocs; *pp; pp = &(*pp)->next)
    if (*pp == a) {
      *pp = a->next;
      return;
    }
}

/* Whether a copy in context c may use allocation a: a mapping of virtual
 * memory management only once cuMemSetAccess gave c's device access. The
 * driver would fault on the device (CUDA_ERROR_ILLEGAL_ADDRESS, later and
 * sticky); the double refuses the copy with that code at once. */
static CUresult check_access(uintptr_t p, size_t n, struct alloc *a, struct fake_ctx *c) {
  if (!a || a->kind != ALLOC_VMM) return CUDA_SUCCESS;
  for (uintptr_t q = p; q < p + n; q = a->base + a->size)
    if (!(a = find(q)) || !(a->access >> c->dev & 1)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  return CUDA_SUCCESS;
}

/* What [p, p+n) is: device memory (*a set), host memory (*a NULL), or a
 * range that starts in an allocation and runs past its end (error). */
static CUresult classify(uintptr_t p, size_t n, struct alloc **a) {
  *a = NULL;
  if (n == 0) return CUDA_SUCCESS; /* a copy of nothing touches no memory */
  *a = find(p);
  if (!*a) {
    if (p < 65536) return CUDA_ERROR_INVALID_VALUE; /* no host memory there either */
    return CUDA_SUCCESS;
  }
  if (n <= (*a)->size - (p - (*a)->base)) return CUDA_SUCCESS;
  /* Mappings of virtual memory management next to each other are one
   * range of addresses to copies. */
  for (struct alloc *x = *a; x && x->kind == ALLOC_VMM; x = find(x->base + x->size))
    if (p + n <= x->base + x->size) return CUDA_SUCCESS;
  return CUDA_ERROR_INVALID_VALUE;
}

static int valid_ctx(struct fake_ctx *c) {
  return c >= ctxs && c < ctxs + ndev && c->magic == CTX_MAGIC && c->retained > 0;
}

static CUresult need_ctx(void) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  struct fake_ctx *c = get_current();
  if (!c || !valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

static void *worker(void *arg);

static CUresult new_stream(struct fake_ctx *c, struct fake_stream **out) {
  struct fake_stream *s = calloc(1, sizeof *s);
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  s->magic = STREAM_MAGIC;
  s->ctx = c;
  pthread_cond_init(&s->wake, NULL);
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int err = pthread_create(&t, &attr, worker, s);
  pthread_attr_destroy(&attr);
  if (err) {
    pthread_cond_destroy(&s->wake);
    free(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  s->next = streams;
  streams = s;
  *out = s;
  return CUDA_SUCCESS;
}

/* A stream handle as the caller gave it: a live stream, or the NULL stream
 * (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) of the current context, which
 * is modelled as one more stream of that context. */
static CUresult resolve_stream(CUstream h, struct fake_stream **out) {
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS) return r;
    struct fake_ctx *c = get_current();
    if (!c->null_stream) {
      r = new_stream(c, &c->null_stream);
      if (r != CUDA_SUCCESS) return r;
    }
    *out = c->null_stream;
    return CUDA_SUCCESS;
  }
  for (struct fake_stream *s = streams; s; s = s->next)
    if (s == h && !s->destroyed) {
      *out = s;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_HANDLE;
}

static CUresult resolve_event(CUevent h, struct fake_event **out) {
  for (struct fake_event *e = events; e; e = e->next)
    if (e == h) {
      *out = e;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_HANDLE;
}

/* Queues operation *o (copied) on s, numbering it in o->ticket. */
static CUresult enqueue(struct fake_stream *s, struct op *o) {
  struct op *q = malloc(sizeof *q);
  if (!q) return CUDA_ERROR_OUT_OF_MEMORY;
  o->ticket = next_ticket++;
  *q = *o;
  q->next = NULL;
  for (int i = 0; i < 2; i++)
    if (q->pins[i]) q->pins[i]->busy++;
  if (s->tail)
    s->tail->next = q;
  else
    s->head = q;
  s->tail = q;
  s->enqueued++;
  pthread_cond_signal(&s->wake);
  return CUDA_SUCCESS;
}

/* Whether stream s has run every operation numbered up to t. s may be
 * gone already (destroyed and drained): then it has. */
static int stream_reached(struct fake_stream *s, uint64_t t) {
  for (struct fake_stream *x = streams; x; x = x->next)
    if (x == s) return !s->head || s->head->ticket > t;
  return 1;
}

static void wait_stream(struct fake_stream *s, uint64_t t) {
  while (!stream_reached(s, t)) pthread_cond_wait(&progress, &mu);
}

/* Whether every stream of context c (destroyed ones still draining
 * included) has run the operations enqueued before ticket t. */
static int ctx_reached(struct fake_ctx *c, uint64_t t) {
  for (struct fake_stream *s = streams; s; s = s->next)
    if (s->ctx == c && s->head && s->head->ticket < t) return 0;
  return 1;
}

static void free_event_if_done(struct fake_event *e) {
  if (e->destroyed && e->pending == 0) {
    e->magic = 0;
    free(e);
  }
}

static void *worker(void *arg) {
  struct fake_stream *s = arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!s->head && !s->destroyed) pthread_cond_wait(&s->wake, &mu);
    struct op *o = s->head;
    if (!o) break; /* destroyed, and everything enqueued has run */
    unsigned delay = copy_delay_us;
    pthread_mutex_unlock(&mu);
    if (o->kind == OP_COPY) {
      if (delay) usleep(delay);
      memcpy(o->dst, o->src, o->n);
    } else if (o->kind == OP_HOST_FN) {
      o->fn(o->data);
    }
    free(o->staging);
    pthread_mutex_lock(&mu);
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    for (int i = 0; i < 2; i++)
      if (o->pins[i]) o->pins[i]->busy--;
    if (o->kind == OP_RECORD) {
      if (o->seq > o->ev->reached) o->ev->reached = o->seq;
      o->ev->pending--;
      free_event_if_done(o->ev);
    } else if (o->kind == OP_FREE) {
      unlink_alloc(o->freed);
      munmap((void *)o->freed->base, o->freed->size);
      free(o->freed);
    }
    free(o);
    s->done++;
    pthread_cond_broadcast(&progress);
  }
  for (struct fake_stream **pp = &streams; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  pthread_cond_destroy(&s->wake);
  s->magic = 0;
  free(s);
  pthread_cond_broadcast(&progress);
  pthread_mutex_unlock(&mu);
  return NULL;
}

/* ---- initialization and devices ------------------------------------------- */

static CUresult init_locked(void) {
  if (is_init()) return CUDA_SUCCESS;
  int total = 1;
  const char *s = getenv("RDT_FAKECUDA_DEVICES");
  if (s && *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE;
    total = (int)v;
  }
  /* CUDA_VISIBLE_DEVICES: a comma-separated list of indices; the devices
   * before the first invalid (or repeated) entry are visible. */
  int n = 0;
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis) {
    const char *p = vis;
    while (*p && n < total) {
      char *end;
      long v = strtol(p, &end, 10);
      if (end == p || v < 0 || v >= total || (*end && *end != ',')) break;
      int dup = 0;
      for (int i = 0; i < n; i++) dup |= physical[i] == v;
      if (dup) break;
      physical[n++] = (int)v;
      p = *end ? end + 1 : end;
    }
  } else {
    for (n = 0; n < total; n++) physical[n] = n;
  }
  if (n == 0) return CUDA_ERROR_NO_DEVICE;
  const char *peer = getenv("RDT_FAKECUDA_PEER_ACCESS");
  peer_access = !(peer && strcmp(peer, "0") == 0);
  const char *delay = getenv("RDT_FAKECUDA_COPY_DELAY_US");
  copy_delay_us = delay ? (unsigned)strtoul(delay, NULL, 10) : 0;
  if (getrandom(&token, sizeof token, 0) != (ssize_t)sizeof token)
    token = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  for (int i = 0; i < n; i++) {
    ctxs[i].magic = CTX_MAGIC;
    ctxs[i].dev = i;
  }
  ndev = n;
  __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUresult r = init_locked();
  pthread_mutex_unlock(&mu);
  return r;
}

static CUresult check_device(CUdevice d) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  return d >= 0 && d < ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuDeviceGetCount(int *count) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = ndev;
  return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= ndev) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice d) {
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  static const char prefix[12] = {'r', 'd', 't', '-', 'f', 'a', 'k', 'e', '-', 'g', 'p', 'u'};
  memcpy(uuid->bytes, prefix, sizeof prefix);
  uint32_t idx = (uint32_t)physical[d];
  memcpy(uuid->bytes + 12, &idx, 4);
  return CUDA_SUCCESS;
}

/* cuda.h maps cuDeviceGetUuid to _v2 (same signature) since CUDA 11.4;
 * the driver exports both. */
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d) { return cuDeviceGetUuid(uuid, d); }

API CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  CUresult r = check_device(d);
  if (r != CUDA_SUCCESS) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "rdt fake CUDA device %d", physical[d]);
  return CUDA_SUCCESS;
}

API CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
  CUresult r = check_device(d);
  if (r == CUDA_SUCCESS) r = check_device(peer);
  if (r != CUDA_SUCCESS) return r;
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  *can = d != peer && peer_access; /* a device is not its own peer */
  return CUDA_SUCCESS;
}

/* ---- contexts ------------------------------------------------------------- */

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  pthread_mutex_lock(&mu);
  CUresult r = check_device(d);
  if (r == CUDA_SUCCESS && !c) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    ctxs[d].retained++;
    *c = &ctxs[d];
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* Active while retained (the double never releases a primary context). */
API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
  pthread_mutex_lock(&mu);
  CUresult r = check_device(d);
  if (r == CUDA_SUCCESS && (!flags || !active)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    *flags = 0;
    *active = ctxs[d].retained > 0;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuCtxGetDevice(CUdevice *d) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS && !d) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) *d = get_current()->dev;
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuCtxSetCurrent(CUcontext c) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_SUCCESS;
  if (c && !valid_ctx(c))
    r = CUDA_ERROR_INVALID_CONTEXT;
  else
    set_current(c);
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuCtxGetCurrent(CUcontext *c) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  *c = get_current();
  return CUDA_SUCCESS;
}

/* ---- memory --------------------------------------------------------------- */

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS && (!p || n == 0)) r = CUDA_ERROR_INVALID_VALUE;
  if (r != CUDA_SUCCESS) goto out;
  struct alloc *a = calloc(1, sizeof *a);
  if (!a) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto out;
  }
  a->kind = ALLOC_DEVICE;
  a->size = n;
  a->ctx = get_current();
  a->id = next_buffer_id++;
  char name[96];
  snprintf(name, sizeof name, "rdt-fakecuda-%d-%016llx-%llu", (int)getpid(), (unsigned long long)token, a->id);
  a->fd = memfd_create(name, MFD_CLOEXEC);
  void *m = MAP_FAILED;
  if (a->fd >= 0 && ftruncate(a->fd, (off_t)n) == 0)
    m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
  if (m == MAP_FAILED) {
    if (a->fd >= 0) close(a->fd);
    free(a);
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto out;
  }
  a->base = (uintptr_t)m;
  a->next = allocs;
  allocs = a;
  *p = (CUdeviceptr)a->base;
out:
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemFree_v2(CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  struct alloc *a = r == CUDA_SUCCESS ? find((uintptr_t)p) : NULL;
  /* cuMemAllocAsync's memory may be freed here too; a mapping is unmapped. */
  if (r == CUDA_SUCCESS && (!a || (a->kind != ALLOC_DEVICE && a->kind != ALLOC_POOL) || a->freeing ||
                            a->base != (uintptr_t)p))
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    /* cuMemFree synchronizes the device: it waits for everything enqueued
     * on any stream of its context, whatever memory that work uses (and
     * for synchronous copies of the allocation in other threads). */
    uint64_t t = next_ticket;
    while (!ctx_reached(a->ctx, t) || a->busy > 0) pthread_cond_wait(&progress, &mu);
    unlink_alloc(a);
    munmap((void *)a->base, a->size);
    if (a->fd >= 0) close(a->fd);
    free(a);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* ---- stream-ordered allocation (the device's default pool) ---------------- */

/* The memory is there at once (work enqueued later on any stream may use
 * it); CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE names the pool and it cannot be
 * exported with cuIpcGetMemHandle. */
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream h) {
  pthread_mutex_lock(&mu);
  struct fake_stream *s = NULL;
  CUresult r = is_init() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS) r = resolve_stream(h, &s);
  if (r == CUDA_SUCCESS && (!p || n == 0)) r = CUDA_ERROR_INVALID_VALUE;
  struct alloc *a = r == CUDA_SUCCESS ? calloc(1, sizeof *a) : NULL;
  void *m = a ? mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
  if (r == CUDA_SUCCESS && m == MAP_FAILED) {
    free(a);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    a->kind = ALLOC_POOL;
    a->base = (uintptr_t)m;
    a->size = n;
    a->ctx = s->ctx;
    a->id = next_buffer_id++;
    a->fd = -1;
    a->next = allocs;
    allocs = a;
    *p = (CUdeviceptr)a->base;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* Frees once the stream reaches it. */
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream h) {
  pthread_mutex_lock(&mu);
  struct fake_stream *s = NULL;
  CUresult r = is_init() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS) r = resolve_stream(h, &s);
  struct alloc *a = r == CUDA_SUCCESS ? find((uintptr_t)p) : NULL;
  if (r == CUDA_SUCCESS && (!a || a->kind != ALLOC_POOL || a->freeing || a->base != (uintptr_t)p))
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    struct op o = {.kind = OP_FREE, .freed = a};
    r = enqueue(s, &o);
    if (r == CUDA_SUCCESS) a->freeing = 1;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* ---- virtual memory management -------------------------------------------- */

static struct phys *find_phys(CUmemGenericAllocationHandle h) {
  for (struct phys *x = physs; x; x = x->next)
    if ((CUmemGenericAllocationHandle)(uintptr_t)x == h && x->hrefs > 0) return x;
  return NULL;
}

static void put_phys(struct phys *x) {
  if (--x->refs > 0) return;
  for (struct phys **pp = &physs; *pp; pp = &(*pp)->next)
    if (*pp == x) {
      *pp = x->next;
      break;
    }
  close(x->fd);
  free(x);
}

static struct reservation *find_reservation(uintptr_t p, size_t n) {
  for (struct reservation *v = reservations; v; v = v->next)
    if (p >= v->base && p - v->base <= v->size && n <= v->size - (p - v->base)) return v;
  return NULL;
}

/* Device memory, pinned, on a device this process sees. */
static CUresult check_prop(const CUmemAllocationProp *prop) {
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_ALL))
    return CUDA_ERROR_INVALID_VALUE;
  return prop->location.id >= 0 && prop->location.id < ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = check_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (!g || (option != 0 && option != 1)) return CUDA_ERROR_INVALID_VALUE; /* MINIMUM, RECOMMENDED */
  *g = VMM_GRANULARITY;
  return CUDA_SUCCESS;
}

/* A new physical allocation of n bytes on device dev (ordinal), in a memfd
 * of its own; called with mu held. */
static struct phys *new_phys(size_t n, int dev, int handles) {
  struct phys *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  char name[128];
  snprintf(name, sizeof name, "rdt-fakecuda-vmm-%d-%016llx-%llu-%d", (int)getpid(), (unsigned long long)token,
           next_buffer_id++, physical[dev]);
  x->fd = memfd_create(name, MFD_CLOEXEC);
  if (x->fd < 0 || ftruncate(x->fd, (off_t)n) != 0) {
    if (x->fd >= 0) close(x->fd);
    free(x);
    return NULL;
  }
  x->size = n;
  x->dev = dev;
  x->pdev = physical[dev];
  x->handles = handles;
  x->hrefs = x->refs = 1;
  x->next = physs;
  physs = x;
  return x;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = check_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (!h || n == 0 || n % VMM_GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct phys *x = new_phys(n, prop->location.id, prop->requestedHandleTypes);
  pthread_mutex_unlock(&mu);
  if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
  *h = (CUmemGenericAllocationHandle)(uintptr_t)x;
  return CUDA_SUCCESS;
}

/* The memory stays while a mapping (or another reference to the handle)
 * holds it. */
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  struct phys *x = find_phys(h);
  if (x) {
    x->hrefs--;
    put_phys(x);
  }
  pthread_mutex_unlock(&mu);
  return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The handle mapped at any address of a mapping: the same value that was
 * mapped, one more reference to release. */
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)addr);
  CUresult r = a && a->kind == ALLOC_VMM ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    a->phys->hrefs++;
    a->phys->refs++;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)a->phys;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* What cuMemCreate was given: pinned device memory, its location and the
 * handle types requested (of an import: those it was exported with). */
API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct phys *x = find_phys(h);
  if (x) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = x->dev;
    prop->requestedHandleTypes = x->handles;
  }
  pthread_mutex_unlock(&mu);
  return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A POSIX file descriptor (a new one each call, which the caller closes),
 * only for an allocation created with that handle type requested; any
 * other type, or an allocation without it, is CUDA_ERROR_INVALID_VALUE
 * (the code the driver gives there is a guess). */
API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                          unsigned long long flags) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!out || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct phys *x = find_phys(h);
  CUresult r = x && (x->handles & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    int fd = fcntl(x->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      r = CUDA_ERROR_OUT_OF_MEMORY;
    else
      *(int *)out = fd;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* A file descriptor another process (or this one) exported: the caller
 * keeps it (and closes it). Anything but a descriptor of the double's
 * memory is CUDA_ERROR_INVALID_VALUE. The allocation lives on the
 * exporting device: on its ordinal here when this process sees it, else
 * on the current context's device (the double has one address space for
 * every device; cuMemSetAccess decides which devices may use it). */
API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!h || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  int fd = (int)(intptr_t)os_handle;
  char path[64], got[192];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t k = readlink(path, got, sizeof got - 1);
  got[k > 0 ? k : 0] = 0;
  int pid = 0, pdev = -1;
  unsigned long long tok = 0, id = 0;
  struct stat st;
  if (sscanf(got, "/memfd:rdt-fakecuda-vmm-%d-%llx-%llu-%d", &pid, &tok, &id, &pdev) != 4 || pdev < 0 ||
      fstat(fd, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % VMM_GRANULARITY)
    return CUDA_ERROR_INVALID_VALUE;
  struct phys *x = calloc(1, sizeof *x);
  if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
  x->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (x->fd < 0) {
    free(x);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&mu);
  x->size = (size_t)st.st_size;
  x->pdev = pdev;
  x->dev = -1;
  for (int i = 0; i < ndev; i++)
    if (physical[i] == pdev) x->dev = i;
  if (x->dev < 0) x->dev = get_current() && valid_ctx(get_current()) ? get_current()->dev : 0;
  x->handles = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  x->hrefs = x->refs = 1;
  x->next = physs;
  physs = x;
  pthread_mutex_unlock(&mu);
  *h = (CUmemGenericAllocationHandle)(uintptr_t)x;
  return CUDA_SUCCESS;
}

/* Address space only: nothing there is accessible before cuMemMap and
 * cuMemSetAccess. Any requested address is taken as a hint. */
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
  (void)addr;
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!p || n == 0 || n % VMM_GRANULARITY || flags || (align & (align - 1))) return CUDA_ERROR_INVALID_VALUE;
  if (align < VMM_GRANULARITY) align = VMM_GRANULARITY;
  struct reservation *v = calloc(1, sizeof *v);
  void *m = v ? mmap(NULL, n + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) : MAP_FAILED;
  if (m == MAP_FAILED) {
    free(v);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  uintptr_t start = (uintptr_t)m, base = (start + align - 1) & ~(uintptr_t)(align - 1);
  if (base > start) munmap(m, base - start);
  if (start + n + align > base + n) munmap((void *)(base + n), start + n + align - (base + n));
  v->base = base;
  v->size = n;
  pthread_mutex_lock(&mu);
  v->next = reservations;
  reservations = v;
  pthread_mutex_unlock(&mu);
  *p = (CUdeviceptr)base;
  return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  for (struct reservation **pp = &reservations; *pp; pp = &(*pp)->next) {
    struct reservation *v = *pp;
    if (v->base != (uintptr_t)p || v->size != n) continue;
    int mapped = 0;
    for (struct alloc *a = allocs; a; a = a->next)
      mapped |= a->kind == ALLOC_VMM && a->base >= v->base && a->base - v->base < v->size;
    if (mapped) break; /* unmap first */
    *pp = v->next;
    munmap((void *)v->base, v->size);
    free(v);
    r = CUDA_SUCCESS;
    break;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* Maps [offset, offset+n) of an allocation at p, in a reserved range, with
 * no access yet: device memory of the allocation's device, with a buffer
 * id, but no legacy IPC. */
API CUresult cuMemMap(CUdeviceptr p, size_t n, size_t offset, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  struct phys *x = find_phys(h);
  CUresult r = CUDA_SUCCESS;
  if (!x || flags || n == 0 || (p | n | offset) % VMM_GRANULARITY || offset > x->size || n > x->size - offset ||
      !find_reservation((uintptr_t)p, n))
    r = CUDA_ERROR_INVALID_VALUE;
  for (struct alloc *a = allocs; r == CUDA_SUCCESS && a; a = a->next)
    if (a->base < (uintptr_t)p + n && (uintptr_t)p < a->base + a->size) r = CUDA_ERROR_INVALID_VALUE; /* mapped */
  struct alloc *a = r == CUDA_SUCCESS ? calloc(1, sizeof *a) : NULL;
  if (r == CUDA_SUCCESS && !a) r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS &&
      mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_SHARED | MAP_FIXED, x->fd, (off_t)offset) == MAP_FAILED) {
    free(a);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    a->kind = ALLOC_VMM;
    a->base = (uintptr_t)p;
    a->size = n;
    a->ctx = &ctxs[x->dev];
    a->id = next_buffer_id++;
    a->fd = -1;
    a->phys = x;
    x->refs++;
    a->next = allocs;
    allocs = a;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  CUresult r = CUDA_SUCCESS;
  if (!a || a->kind != ALLOC_VMM || a->base != (uintptr_t)p || a->size != n) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    while (a->busy > 0) pthread_cond_wait(&progress, &mu);
    unlink_alloc(a);
    /* Back to reserved address space. */
    mmap((void *)a->base, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    put_phys(a->phys);
    free(a);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* One address space serves every device here: read-write access for any
 * device makes the range read-write, read access read-only; each mapping
 * remembers which devices got access (copies in a context of another
 * device fail, see check_access). A device other than the memory's own
 * needs peer access to it (else CUDA_ERROR_INVALID_DEVICE: a guess). */
API CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *desc, size_t count) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!desc || count == 0 || n == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  uint64_t grant = 0, revoke = 0;
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      prot = PROT_READ | PROT_WRITE;
    else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
      prot = PROT_READ;
    else if (desc[i].flags != 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].flags != 0)
      grant |= 1ull << desc[i].location.id;
    else
      revoke |= 1ull << desc[i].location.id;
  }
  pthread_mutex_lock(&mu);
  /* The range must be mapped, end to end. */
  CUresult r = CUDA_SUCCESS;
  for (uintptr_t q = (uintptr_t)p; r == CUDA_SUCCESS && q < (uintptr_t)p + n;) {
    struct alloc *a = find(q);
    if (!a || a->kind != ALLOC_VMM) {
      r = CUDA_ERROR_INVALID_VALUE;
      break;
    }
    for (int d = 0; d < ndev; d++)
      if ((grant >> d & 1) && physical[d] != a->phys->pdev && !peer_access) r = CUDA_ERROR_INVALID_DEVICE;
    q = a->base + a->size;
  }
  if (r == CUDA_SUCCESS && mprotect((void *)(uintptr_t)p, n, prot) != 0) r = CUDA_ERROR_INVALID_VALUE;
  for (uintptr_t q = (uintptr_t)p; r == CUDA_SUCCESS && q < (uintptr_t)p + n;) {
    struct alloc *a = find(q);
    a->access = (a->access | grant) & ~revoke;
    q = a->base + a->size;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS) {
    struct alloc *a = find((uintptr_t)p);
    if (!a) {
      r = CUDA_ERROR_NOT_FOUND;
    } else {
      if (base) *base = (CUdeviceptr)a->base;
      if (size) *size = a->size;
    }
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_SUCCESS;
  struct alloc *a = find((uintptr_t)p);
  if (!a) {
    r = CUDA_ERROR_INVALID_VALUE; /* memory the driver does not know */
    goto out;
  }
  switch (attribute) {
  case CU_POINTER_ATTRIBUTE_CONTEXT:
    *(CUcontext *)data = a->ctx;
    break;
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
    break;
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    *(CUdeviceptr *)data = p;
    break;
  case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    *(unsigned long long *)data = a->id;
    break;
  case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    *(unsigned int *)data = 0;
    break;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    *(int *)data = a->ctx->dev;
    break;
  case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    /* cuMemAlloc's memory only: not a pool's or a cuMemMap's, and an
     * imported mapping is not exported again */
    *(int *)data = a->kind == ALLOC_DEVICE;
    break;
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    *(CUdeviceptr *)data = (CUdeviceptr)a->base;
    break;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    *(size_t *)data = a->size;
    break;
  case CU_POINTER_ATTRIBUTE_MAPPED:
    *(int *)data = 1;
    break;
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    *(CUmemoryPool *)data = a->kind == ALLOC_POOL ? &pools[a->ctx->dev] : NULL;
    break;
  default: /* HOST_POINTER of device memory, and what the double does not model */
    r = CUDA_ERROR_INVALID_VALUE;
  }
out:
  pthread_mutex_unlock(&mu);
  return r;
}

/* ---- IPC ------------------------------------------------------------------ */

API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  struct alloc *a = r == CUDA_SUCCESS ? find((uintptr_t)p) : NULL;
  if (r == CUDA_SUCCESS && (!h || !a || a->kind != ALLOC_DEVICE)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    /* The whole allocation, whichever address in it was given. */
    struct ipc_handle ih;
    memset(&ih, 0, sizeof ih);
    memcpy(ih.magic, HANDLE_MAGIC, sizeof ih.magic);
    ih.pid = (int32_t)getpid();
    ih.fd = a->fd;
    ih.token = token;
    ih.id = a->id;
    ih.size = a->size;
    ih.device = physical[a->ctx->dev];
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &ih, sizeof ih);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  struct ipc_handle ih;
  memcpy(&ih, h.reserved, sizeof ih);
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  if (r != CUDA_SUCCESS) goto out;
  if (!p || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) {
    r = CUDA_ERROR_INVALID_VALUE;
    goto out;
  }
  if (memcmp(ih.magic, HANDLE_MAGIC, sizeof ih.magic) != 0 || ih.pid <= 0 || ih.fd < 0 || ih.size == 0) {
    r = CUDA_ERROR_INVALID_HANDLE;
    goto out;
  }
  if (ih.pid == (int32_t)getpid() && ih.token == token) {
    r = CUDA_ERROR_INVALID_CONTEXT; /* the driver refuses a process's own handles */
    goto out;
  }
  /* In a context of the exporting device, or of a device with peer access
   * to it, whether or not this process sees the exporting device. */
  if (ih.device != physical[get_current()->dev] && !peer_access) {
    r = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    goto out;
  }
  for (struct alloc *a = allocs; a; a = a->next)
    if (a->kind == ALLOC_IPC && a->ctx == get_current() && a->owner_pid == ih.pid && a->owner_token == ih.token &&
        a->owner_id == ih.id) {
      a->refs++;
      *p = (CUdeviceptr)a->base;
      goto out;
    }
  char path[64], want[128], got[160];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)ih.pid, (int)ih.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    /* The owner is gone, or closed the descriptor (freed the memory). */
    r = errno == ENOENT || errno == ESRCH ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_MAP_FAILED;
    goto out;
  }
  /* The descriptor number may have been reused (or the pid): the memfd's
   * name says which allocation it is. */
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t k = readlink(path, got, sizeof got - 1);
  got[k > 0 ? k : 0] = 0;
  snprintf(want, sizeof want, "/memfd:rdt-fakecuda-%d-%016llx-%llu ", (int)ih.pid, (unsigned long long)ih.token,
           (unsigned long long)ih.id);
  struct stat st;
  if (strncmp(got, want, strlen(want)) != 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != ih.size) {
    close(fd);
    r = CUDA_ERROR_INVALID_HANDLE;
    goto out;
  }
  void *m = mmap(NULL, ih.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd); /* the mapping keeps the memory */
  struct alloc *a = m == MAP_FAILED ? NULL : calloc(1, sizeof *a);
  if (!a) {
    if (m != MAP_FAILED) munmap(m, ih.size);
    r = CUDA_ERROR_MAP_FAILED;
    goto out;
  }
  a->kind = ALLOC_IPC;
  a->base = (uintptr_t)m;
  a->size = ih.size;
  a->ctx = get_current();
  a->id = next_buffer_id++;
  a->fd = -1;
  a->owner_pid = ih.pid;
  a->owner_token = ih.token;
  a->owner_id = ih.id;
  a->refs = 1;
  a->next = allocs;
  allocs = a;
  *p = (CUdeviceptr)a->base;
out:
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  struct alloc *a = r == CUDA_SUCCESS ? find((uintptr_t)p) : NULL;
  if (r == CUDA_SUCCESS && (!a || a->kind != ALLOC_IPC || a->base != (uintptr_t)p)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS && --a->refs == 0) {
    if (a->busy > 0) {
      fprintf(stderr,
              "fake CUDA: cuIpcCloseMemHandle(%#llx) while %d enqueued copies still use the mapping; "
              "the caller must wait for them first\n",
              (unsigned long long)p, a->busy);
      abort();
    }
    unlink_alloc(a);
    munmap((void *)a->base, a->size);
    free(a);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* ---- streams and events --------------------------------------------------- */

API CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS && (!s || (flags & ~CU_STREAM_NON_BLOCKING))) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) r = new_stream(get_current(), s);
  pthread_mutex_unlock(&mu);
  return r;
}

/* Work already enqueued still runs; the stream is freed after it. */
API CUresult cuStreamDestroy_v2(CUstream h) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  struct fake_stream *s;
  CUresult r = resolve_stream(h, &s);
  if (r == CUDA_SUCCESS) {
    s->destroyed = 1; /* its worker leaves the registry once drained */
    pthread_cond_signal(&s->wake);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuStreamSynchronize(CUstream h) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  struct fake_stream *s;
  CUresult r = resolve_stream(h, &s);
  if (r == CUDA_SUCCESS) {
    uint64_t target = s->enqueued;
    while (s->done < target) pthread_cond_wait(&progress, &mu);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *data) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct fake_stream *s;
  CUresult r = resolve_stream(h, &s);
  if (r == CUDA_SUCCESS) {
    struct op o = {.kind = OP_HOST_FN, .fn = fn, .data = data};
    r = enqueue(s, &o);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  pthread_mutex_lock(&mu);
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS && (!e || (flags & ~CU_EVENT_FLAGS_ALL))) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    struct fake_event *ev = calloc(1, sizeof *ev);
    if (!ev) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      ev->magic = EVENT_MAGIC;
      ev->ctx = get_current();
      ev->next = events;
      events = ev;
      *e = ev;
    }
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuEventRecord(CUevent h, CUstream sh) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  struct fake_event *e;
  struct fake_stream *s;
  CUresult r = resolve_event(h, &e);
  if (r == CUDA_SUCCESS) r = resolve_stream(sh, &s);
  /* An event and the stream it is recorded on belong to one context. */
  if (r == CUDA_SUCCESS && e->ctx != s->ctx) r = CUDA_ERROR_INVALID_HANDLE;
  if (r == CUDA_SUCCESS) {
    struct op o = {.kind = OP_RECORD, .ev = e, .seq = e->recorded + 1};
    r = enqueue(s, &o);
    if (r == CUDA_SUCCESS) {
      e->recorded++;
      e->pending++;
    }
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* CUDA_SUCCESS once the stream has reached the last record (or when the
 * event was never recorded), CUDA_ERROR_NOT_READY before. */
API CUresult cuEventQuery(CUevent h) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  struct fake_event *e;
  CUresult r = resolve_event(h, &e);
  if (r == CUDA_SUCCESS && e->reached < e->recorded) r = CUDA_ERROR_NOT_READY;
  pthread_mutex_unlock(&mu);
  return r;
}

/* A recorded event still pending is freed once its stream reaches it. */
API CUresult cuEventDestroy_v2(CUevent h) {
  if (!is_init()) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  struct fake_event *e;
  CUresult r = resolve_event(h, &e);
  if (r == CUDA_SUCCESS) {
    for (struct fake_event **pp = &events; *pp; pp = &(*pp)->next)
      if (*pp == e) {
        *pp = e->next;
        break;
      }
    e->destroyed = 1;
    free_event_if_done(e);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* ---- copies --------------------------------------------------------------- */

/* Enqueues a copy of n bytes; da and sa are the allocations of the two
 * sides (NULL for host memory). */
/* Enqueues a copy of n bytes; da and sa are the allocations of the two
 * sides (NULL for host memory, which is all pageable here: the double has
 * no pinned memory). As the driver's "Async" copies do (API
 * synchronization behavior), a copy from host memory first waits for the
 * stream's earlier work, then stages the bytes before it returns (to the
 * device) or copies them itself (to host memory); a copy from the device
 * into host memory returns only once it is done. Device to device is
 * asynchronous. Called with mu held; it drops mu while it waits or copies. */
static CUresult enqueue_copy(CUstream h, CUdeviceptr dst, struct alloc *da, CUdeviceptr src, struct alloc *sa,
                             size_t n) {
  struct fake_stream *s;
  CUresult r = resolve_stream(h, &s);
  if (r != CUDA_SUCCESS || n == 0) return r;
  if (!sa) {
    wait_stream(s, next_ticket - 1);
    void *staging = NULL;
    if (da && !(staging = malloc(n))) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&mu);
    memcpy(da ? staging : (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    pthread_mutex_lock(&mu);
    if (!da) return CUDA_SUCCESS;
    r = resolve_stream(h, &s); /* it may have been destroyed meanwhile */
    struct op o = {.kind = OP_COPY, .dst = (void *)(uintptr_t)dst, .src = staging, .n = n, .pins = {da, NULL},
                   .staging = staging};
    if (r == CUDA_SUCCESS) r = enqueue(s, &o);
    if (r != CUDA_SUCCESS) free(staging);
    return r;
  }
  struct op o = {.kind = OP_COPY, .dst = (void *)(uintptr_t)dst, .src = (const void *)(uintptr_t)src, .n = n,
                 .pins = {da, sa}};
  r = enqueue(s, &o);
  if (r == CUDA_SUCCESS && !da) wait_stream(s, o.ticket);
  return r;
}

/* Unified addressing: either side may be host or device memory. */
API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  pthread_mutex_lock(&mu);
  struct alloc *da = NULL, *sa = NULL;
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)dst, n, &da);
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)src, n, &sa);
  if (r == CUDA_SUCCESS && n > 0 && (check_access((uintptr_t)dst, n, da, get_current()) || check_access((uintptr_t)src, n, sa, get_current())))
    r = CUDA_ERROR_ILLEGAL_ADDRESS;
  if (r == CUDA_SUCCESS) r = enqueue_copy(h, dst, da, src, sa, n);
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream h) {
  pthread_mutex_lock(&mu);
  struct alloc *da = NULL, *sa = NULL;
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)dst, n, &da);
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)src, n, &sa);
  if (r == CUDA_SUCCESS && n > 0 && (check_access((uintptr_t)dst, n, da, get_current()) || check_access((uintptr_t)src, n, sa, get_current())))
    r = CUDA_ERROR_ILLEGAL_ADDRESS;
  if (r == CUDA_SUCCESS && n > 0 && (da || !sa)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) r = enqueue_copy(h, (CUdeviceptr)(uintptr_t)dst, da, src, sa, n);
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
  pthread_mutex_lock(&mu);
  struct alloc *da = NULL, *sa = NULL;
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)dst, n, &da);
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)src, n, &sa);
  if (r == CUDA_SUCCESS && n > 0 && (check_access((uintptr_t)dst, n, da, get_current()) || check_access((uintptr_t)src, n, sa, get_current())))
    r = CUDA_ERROR_ILLEGAL_ADDRESS;
  if (r == CUDA_SUCCESS && n > 0 && (!da || sa)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) r = enqueue_copy(h, dst, da, (CUdeviceptr)(uintptr_t)src, sa, n);
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  pthread_mutex_lock(&mu);
  struct alloc *da = NULL, *sa = NULL;
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)dst, n, &da);
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)src, n, &sa);
  if (r == CUDA_SUCCESS && n > 0 && (check_access((uintptr_t)dst, n, da, get_current()) || check_access((uintptr_t)src, n, sa, get_current())))
    r = CUDA_ERROR_ILLEGAL_ADDRESS;
  if (r == CUDA_SUCCESS && n > 0 && (!da || !sa)) r = CUDA_ERROR_INVALID_VALUE; /* both must be device memory */
  if (r == CUDA_SUCCESS) r = enqueue_copy(h, dst, da, src, sa, n);
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n,
                               CUstream h) {
  pthread_mutex_lock(&mu);
  struct alloc *da = NULL, *sa = NULL;
  CUresult r = is_init() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && (!valid_ctx(dctx) || !valid_ctx(sctx))) r = CUDA_ERROR_INVALID_CONTEXT;
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)dst, n, &da);
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)src, n, &sa);
  if (r == CUDA_SUCCESS && n > 0 && da && sa && (check_access((uintptr_t)dst, n, da, dctx) || check_access((uintptr_t)src, n, sa, sctx)))
    r = CUDA_ERROR_ILLEGAL_ADDRESS;
  /* Device memory of the contexts named. */
  if (r == CUDA_SUCCESS && n > 0 && (!da || !sa || da->ctx != dctx || sa->ctx != sctx)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) r = enqueue_copy(h, dst, da, src, sa, n);
  pthread_mutex_unlock(&mu);
  return r;
}

/* A synchronous copy, not ordered with any stream (as with a non-blocking
 * stream). dst_dev/src_dev: 1 the side must be device memory, 0 host
 * memory, -1 either (unified addressing). */
static CUresult sync_copy(CUdeviceptr dst, int dst_dev, CUdeviceptr src, int src_dev, size_t n) {
  pthread_mutex_lock(&mu);
  struct alloc *da = NULL, *sa = NULL;
  CUresult r = need_ctx();
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)dst, n, &da);
  if (r == CUDA_SUCCESS) r = classify((uintptr_t)src, n, &sa);
  if (r == CUDA_SUCCESS && n > 0 && (check_access((uintptr_t)dst, n, da, get_current()) || check_access((uintptr_t)src, n, sa, get_current())))
    r = CUDA_ERROR_ILLEGAL_ADDRESS;
  if (r == CUDA_SUCCESS && n > 0 &&
      ((dst_dev >= 0 && !!da != dst_dev) || (src_dev >= 0 && !!sa != src_dev)))
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS && n > 0) {
    if (da) da->busy++;
    if (sa) sa->busy++;
    pthread_mutex_unlock(&mu);
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    pthread_mutex_lock(&mu);
    if (da) da->busy--;
    if (sa) sa->busy--;
    pthread_cond_broadcast(&progress);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return sync_copy(dst, -1, src, -1, n); }

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  return sync_copy(dst, 1, (CUdeviceptr)(uintptr_t)src, 0, n);
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  return sync_copy((CUdeviceptr)(uintptr_t)dst, 0, src, 1, n);
}
