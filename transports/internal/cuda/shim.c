#include "shim.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* CUDA driver API facts (cuda.h): values and signatures. */
typedef int CUdevice;
typedef void *CUcontext;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[RDT_CU_IPC_HANDLE_SIZE]; } CUipcMemHandle;
typedef unsigned long long CUmemGenericAllocationHandle;
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
  CUDA_ERROR_NOT_READY = 600,
};
enum {
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
  CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,
};
#define CU_MEMORYTYPE_DEVICE 2
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1

static struct {
  rdtcu_result (*Init)(unsigned);
  rdtcu_result (*GetErrorName)(rdtcu_result, const char **);
  rdtcu_result (*GetErrorString)(rdtcu_result, const char **);
  rdtcu_result (*DeviceGet)(CUdevice *, int);
  rdtcu_result (*DeviceGetCount)(int *);
  rdtcu_result (*DeviceGetUuid)(CUuuid *, CUdevice);
  rdtcu_result (*DeviceGetName)(char *, int, CUdevice);
  rdtcu_result (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
  rdtcu_result (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  rdtcu_result (*CtxSetCurrent)(CUcontext);
  rdtcu_result (*CtxGetCurrent)(CUcontext *);
  rdtcu_result (*IpcGetMemHandle)(CUipcMemHandle *, rdtcu_ptr);
  rdtcu_result (*IpcOpenMemHandle)(rdtcu_ptr *, CUipcMemHandle, unsigned);
  rdtcu_result (*IpcCloseMemHandle)(rdtcu_ptr);
  rdtcu_result (*MemGetAddressRange)(rdtcu_ptr *, size_t *, rdtcu_ptr);
  rdtcu_result (*PointerGetAttribute)(void *, int, rdtcu_ptr);
  rdtcu_result (*MemcpyAsync)(rdtcu_ptr, rdtcu_ptr, size_t, rdtcu_stream);
  rdtcu_result (*MemcpyDtoDAsync)(rdtcu_ptr, rdtcu_ptr, size_t, rdtcu_stream);
  rdtcu_result (*MemcpyPeerAsync)(rdtcu_ptr, CUcontext, rdtcu_ptr, CUcontext, size_t, rdtcu_stream);
  rdtcu_result (*Memcpy)(rdtcu_ptr, rdtcu_ptr, size_t);
  rdtcu_result (*StreamCreate)(rdtcu_stream *, unsigned);
  rdtcu_result (*StreamDestroy)(rdtcu_stream);
  rdtcu_result (*StreamSynchronize)(rdtcu_stream);
  rdtcu_result (*EventCreate)(rdtcu_event *, unsigned);
  rdtcu_result (*EventRecord)(rdtcu_event, rdtcu_stream);
  rdtcu_result (*EventQuery)(rdtcu_event);
  rdtcu_result (*EventDestroy)(rdtcu_event);
  rdtcu_result (*MemAlloc)(rdtcu_ptr *, size_t);
  rdtcu_result (*MemFree)(rdtcu_ptr);
  rdtcu_result (*DevicePrimaryCtxGetState)(CUdevice, unsigned *, int *);
  /* Optional (NULL when the driver lacks them): for tests. */
  rdtcu_result (*MemAllocAsync)(rdtcu_ptr *, size_t, rdtcu_stream);
  rdtcu_result (*MemFreeAsync)(rdtcu_ptr, rdtcu_stream);
  rdtcu_result (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
  rdtcu_result (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  rdtcu_result (*MemRelease)(CUmemGenericAllocationHandle);
  rdtcu_result (*MemAddressReserve)(rdtcu_ptr *, size_t, size_t, rdtcu_ptr, unsigned long long);
  rdtcu_result (*MemAddressFree)(rdtcu_ptr, size_t);
  rdtcu_result (*MemMap)(rdtcu_ptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  rdtcu_result (*MemUnmap)(rdtcu_ptr, size_t);
  rdtcu_result (*MemSetAccess)(rdtcu_ptr, size_t, const CUmemAccessDesc *, size_t);
  /* Optional: sharing virtual memory management's allocations. */
  rdtcu_result (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
  rdtcu_result (*MemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
  rdtcu_result (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
  rdtcu_result (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
} cu;

/* Symbol names: the driver exports versioned entry points (_v2) for calls
 * whose ABI changed; cuda.h maps the plain names onto them. */
static const struct { const char *name; void **slot; } symbols[] = {
  {"cuInit", (void **)&cu.Init},
  {"cuGetErrorName", (void **)&cu.GetErrorName},
  {"cuGetErrorString", (void **)&cu.GetErrorString},
  {"cuDeviceGet", (void **)&cu.DeviceGet},
  {"cuDeviceGetCount", (void **)&cu.DeviceGetCount},
  {"cuDeviceGetUuid_v2", (void **)&cu.DeviceGetUuid},
  {"cuDeviceGetName", (void **)&cu.DeviceGetName},
  {"cuDeviceCanAccessPeer", (void **)&cu.DeviceCanAccessPeer},
  {"cuDevicePrimaryCtxRetain", (void **)&cu.DevicePrimaryCtxRetain},
  {"cuCtxSetCurrent", (void **)&cu.CtxSetCurrent},
  {"cuCtxGetCurrent", (void **)&cu.CtxGetCurrent},
  {"cuIpcGetMemHandle", (void **)&cu.IpcGetMemHandle},
  {"cuIpcOpenMemHandle_v2", (void **)&cu.IpcOpenMemHandle},
  {"cuIpcCloseMemHandle", (void **)&cu.IpcCloseMemHandle},
  {"cuMemGetAddressRange_v2", (void **)&cu.MemGetAddressRange},
  {"cuPointerGetAttribute", (void **)&cu.PointerGetAttribute},
  {"cuMemcpyAsync", (void **)&cu.MemcpyAsync},
  {"cuMemcpyDtoDAsync_v2", (void **)&cu.MemcpyDtoDAsync},
  {"cuMemcpyPeerAsync", (void **)&cu.MemcpyPeerAsync},
  {"cuMemcpy", (void **)&cu.Memcpy},
  {"cuStreamCreate", (void **)&cu.StreamCreate},
  {"cuStreamDestroy_v2", (void **)&cu.StreamDestroy},
  {"cuStreamSynchronize", (void **)&cu.StreamSynchronize},
  {"cuEventCreate", (void **)&cu.EventCreate},
  {"cuEventRecord", (void **)&cu.EventRecord},
  {"cuEventQuery", (void **)&cu.EventQuery},
  {"cuEventDestroy_v2", (void **)&cu.EventDestroy},
  {"cuMemAlloc_v2", (void **)&cu.MemAlloc},
  {"cuMemFree_v2", (void **)&cu.MemFree},
  {"cuDevicePrimaryCtxGetState", (void **)&cu.DevicePrimaryCtxGetState},
  {"cuMemAllocAsync", (void **)&cu.MemAllocAsync},
  {"cuMemFreeAsync", (void **)&cu.MemFreeAsync},
  {"cuMemGetAllocationGranularity", (void **)&cu.MemGetAllocationGranularity},
  {"cuMemCreate", (void **)&cu.MemCreate},
  {"cuMemRelease", (void **)&cu.MemRelease},
  {"cuMemAddressReserve", (void **)&cu.MemAddressReserve},
  {"cuMemAddressFree", (void **)&cu.MemAddressFree},
  {"cuMemMap", (void **)&cu.MemMap},
  {"cuMemUnmap", (void **)&cu.MemUnmap},
  {"cuMemSetAccess", (void **)&cu.MemSetAccess},
  {"cuMemRetainAllocationHandle", (void **)&cu.MemRetainAllocationHandle},
  {"cuMemGetAllocationPropertiesFromHandle", (void **)&cu.MemGetAllocationPropertiesFromHandle},
  {"cuMemExportToShareableHandle", (void **)&cu.MemExportToShareableHandle},
  {"cuMemImportFromShareableHandle", (void **)&cu.MemImportFromShareableHandle},
};

/* Older entry points, tried when the name in `symbols` is missing.
 * cuDeviceGetUuid_v2 (CUDA 11.4 and later; the cuDeviceGetUuid of CUDA 13's
 * cuda.h) gives a device in MIG mode the UUID of its MIG compute instance;
 * the first version does not, so processes on two MIG instances of one GPU
 * would look like they share a device. */
static const struct { const char *name, *older; } fallbacks[] = {
  {"cuDeviceGetUuid_v2", "cuDeviceGetUuid"},
};

/* Calls a driver may lack (the stream-ordered allocator is CUDA 11.2's,
 * virtual memory management 10.2's): rdt uses them in tests and to share
 * virtual memory management's allocations, and says so when they are
 * missing. */
static const char *const optionals[] = {
  "cuMemAllocAsync", "cuMemFreeAsync", "cuMemGetAllocationGranularity", "cuMemCreate", "cuMemRelease",
  "cuMemAddressReserve", "cuMemAddressFree", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
  "cuMemRetainAllocationHandle", "cuMemGetAllocationPropertiesFromHandle", "cuMemExportToShareableHandle",
  "cuMemImportFromShareableHandle",
};

static int loaded;

const char *rdtcu_symbol(size_t i, const char **older, int *optional) {
  if (i >= sizeof symbols / sizeof symbols[0]) return NULL;
  *older = NULL;
  *optional = 0;
  for (size_t j = 0; j < sizeof optionals / sizeof optionals[0]; j++)
    if (strcmp(optionals[j], symbols[i].name) == 0) *optional = 1;
  for (size_t j = 0; j < sizeof fallbacks / sizeof fallbacks[0]; j++)
    if (strcmp(fallbacks[j].name, symbols[i].name) == 0) *older = fallbacks[j].older;
  return symbols[i].name;
}

void rdtcu_install(void *const *fns) {
  for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) *symbols[i].slot = fns[i];
  loaded = 1;
}

rdtcu_result rdtcu_init(void) { return loaded ? cu.Init(0) : RDT_CU_NOT_LOADED; }

const char *rdtcu_error_name(rdtcu_result r) {
  const char *s = NULL;
  if (!loaded || cu.GetErrorName(r, &s) != CUDA_SUCCESS) return NULL;
  return s;
}

const char *rdtcu_error_string(rdtcu_result r) {
  const char *s = NULL;
  if (!loaded || cu.GetErrorString(r, &s) != CUDA_SUCCESS) return NULL;
  return s;
}

/* Primary contexts, retained once per device and kept for the life of the
 * process (the context the CUDA runtime and frameworks such as PyTorch use). */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctxs[RDT_CU_MAX_DEVICES];

static rdtcu_result primary(int dev, CUcontext *out) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  if (dev < 0 || dev >= RDT_CU_MAX_DEVICES) return RDT_CU_BAD_DEVICE;
  pthread_mutex_lock(&ctx_mu);
  rdtcu_result r = CUDA_SUCCESS;
  if (!ctxs[dev]) {
    CUdevice d;
    r = cu.DeviceGet(&d, dev);
    if (r == CUDA_SUCCESS) r = cu.DevicePrimaryCtxRetain(&ctxs[dev], d);
    if (r != CUDA_SUCCESS) ctxs[dev] = NULL;
  }
  *out = ctxs[dev];
  pthread_mutex_unlock(&ctx_mu);
  return r;
}

/* enter makes dev's primary context current on this thread and remembers
 * the one it replaces; leave puts that one back. */
static rdtcu_result enter(int dev, CUcontext *saved) {
  CUcontext c;
  rdtcu_result r = primary(dev, &c);
  if (r != CUDA_SUCCESS) return r;
  r = cu.CtxGetCurrent(saved);
  if (r != CUDA_SUCCESS) return r;
  if (*saved == c) return CUDA_SUCCESS;
  return cu.CtxSetCurrent(c);
}

static rdtcu_result leave(CUcontext saved, rdtcu_result r) {
  CUcontext now = NULL;
  if (cu.CtxGetCurrent(&now) == CUDA_SUCCESS && now != saved) {
    rdtcu_result r2 = cu.CtxSetCurrent(saved);
    if (r == CUDA_SUCCESS) r = r2;
  }
  return r;
}

#define IN_CONTEXT(dev, expr)                               \
  do {                                                      \
    CUcontext saved_;                                       \
    rdtcu_result r_ = enter((dev), &saved_);               \
    if (r_ != CUDA_SUCCESS) return r_;                      \
    return leave(saved_, (expr));                           \
  } while (0)

rdtcu_result rdtcu_device_count(int *n) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  return cu.DeviceGetCount(n);
}

rdtcu_result rdtcu_device_uuid(int dev, unsigned char uuid[16]) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  CUdevice d;
  rdtcu_result r = cu.DeviceGet(&d, dev);
  if (r != CUDA_SUCCESS) return r;
  CUuuid u;
  r = cu.DeviceGetUuid(&u, d);
  if (r == CUDA_SUCCESS) memcpy(uuid, u.bytes, 16);
  return r;
}

rdtcu_result rdtcu_device_name(int dev, char *name, int len) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  CUdevice d;
  rdtcu_result r = cu.DeviceGet(&d, dev);
  if (r != CUDA_SUCCESS) return r;
  return cu.DeviceGetName(name, len, d);
}

rdtcu_result rdtcu_can_access_peer(int dev, int peer, int *can) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  CUdevice a, b;
  rdtcu_result r = cu.DeviceGet(&a, dev);
  if (r == CUDA_SUCCESS) r = cu.DeviceGet(&b, peer);
  if (r == CUDA_SUCCESS) r = cu.DeviceCanAccessPeer(can, a, b);
  return r;
}

static rdtcu_result pointer_info(rdtcu_ptr p, rdtcu_pointer_info *info) {
  unsigned int mt = 0;
  rdtcu_result r = cu.PointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (r != CUDA_SUCCESS) return r;
  info->memory_type = (int)mt;
  int ord = -1;
  r = cu.PointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  if (r != CUDA_SUCCESS) return r;
  info->device = ord;
  /* Managed memory may report the device memory type; it is told apart
   * here. A driver that cannot say is taken to mean "not managed". */
  unsigned int managed = 0;
  if (cu.PointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS)
    info->managed = managed != 0;
  /* Pinned or registered host memory, and managed memory, have no address
   * range or IPC handle to ask about: the caller refuses them by type. */
  if (mt != CU_MEMORYTYPE_DEVICE || info->managed) return CUDA_SUCCESS;
  int ipc = 0;
  r = cu.PointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
  if (r != CUDA_SUCCESS) return r;
  info->legacy_ipc = ipc;
  /* A driver older than CUDA 11.3 has no pools to tell. */
  void *pool = NULL;
  if (cu.PointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == CUDA_SUCCESS)
    info->pool = pool != NULL;
  /* The rest matters for memory legacy IPC shares; of the other kinds
   * (pools, cuMemMap), what the driver answers is kept. */
  unsigned long long id = 0;
  r = cu.PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
  if (r == CUDA_SUCCESS) info->buffer_id = id;
  if (r == CUDA_SUCCESS) r = cu.MemGetAddressRange(&info->base, &info->size, p);
  return ipc ? r : CUDA_SUCCESS;
}

rdtcu_result rdtcu_pointer_info_get(int dev, rdtcu_ptr p, rdtcu_pointer_info *info) {
  memset(info, 0, sizeof *info);
  IN_CONTEXT(dev, pointer_info(p, info));
}

rdtcu_result rdtcu_ipc_get(int dev, rdtcu_ptr base, unsigned char handle[RDT_CU_IPC_HANDLE_SIZE]) {
  CUipcMemHandle h;
  memset(&h, 0, sizeof h);
  CUcontext saved;
  rdtcu_result r = enter(dev, &saved);
  if (r != CUDA_SUCCESS) return r;
  r = leave(saved, cu.IpcGetMemHandle(&h, base));
  if (r == CUDA_SUCCESS) memcpy(handle, h.reserved, RDT_CU_IPC_HANDLE_SIZE);
  return r;
}

rdtcu_result rdtcu_ipc_open(int dev, const unsigned char handle[RDT_CU_IPC_HANDLE_SIZE], rdtcu_ptr *p) {
  CUipcMemHandle h;
  memcpy(h.reserved, handle, RDT_CU_IPC_HANDLE_SIZE);
  IN_CONTEXT(dev, cu.IpcOpenMemHandle(p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
}

rdtcu_result rdtcu_ipc_close(int dev, rdtcu_ptr p) { IN_CONTEXT(dev, cu.IpcCloseMemHandle(p)); }

rdtcu_result rdtcu_stream_create(int dev, rdtcu_stream *s) {
  IN_CONTEXT(dev, cu.StreamCreate(s, CU_STREAM_NON_BLOCKING));
}
rdtcu_result rdtcu_stream_destroy(int dev, rdtcu_stream s) { IN_CONTEXT(dev, cu.StreamDestroy(s)); }
rdtcu_result rdtcu_stream_sync(int dev, rdtcu_stream s) { IN_CONTEXT(dev, cu.StreamSynchronize(s)); }
rdtcu_result rdtcu_event_create(int dev, rdtcu_event *e) {
  IN_CONTEXT(dev, cu.EventCreate(e, CU_EVENT_DISABLE_TIMING));
}
rdtcu_result rdtcu_event_destroy(int dev, rdtcu_event e) { IN_CONTEXT(dev, cu.EventDestroy(e)); }
rdtcu_result rdtcu_event_query(int dev, rdtcu_event e) { IN_CONTEXT(dev, cu.EventQuery(e)); }

static rdtcu_result copies(int dst_dev, int src_dev, rdtcu_stream s, const rdtcu_copy *ops, size_t n,
                            rdtcu_event e, size_t *done) {
  CUcontext dctx = NULL, sctx = NULL;
  rdtcu_result r = CUDA_SUCCESS;
  if (src_dev >= 0 && src_dev != dst_dev) {
    r = primary(dst_dev, &dctx);
    if (r == CUDA_SUCCESS) r = primary(src_dev, &sctx);
    if (r != CUDA_SUCCESS) return r;
  }
  for (size_t i = 0; i < n; i++) {
    if (ops[i].n == 0) {
      *done = i + 1;
      continue;
    }
    if (src_dev < 0)
      r = cu.MemcpyAsync(ops[i].dst, ops[i].src, ops[i].n, s);
    else if (src_dev == dst_dev)
      r = cu.MemcpyDtoDAsync(ops[i].dst, ops[i].src, ops[i].n, s);
    else
      r = cu.MemcpyPeerAsync(ops[i].dst, dctx, ops[i].src, sctx, ops[i].n, s);
    if (r != CUDA_SUCCESS) return r;
    *done = i + 1;
  }
  if (e) r = cu.EventRecord(e, s);
  return r;
}

rdtcu_result rdtcu_copy_async(int dst_dev, int src_dev, rdtcu_stream s, const rdtcu_copy *ops, size_t n,
                                rdtcu_event e, size_t *done) {
  *done = 0;
  IN_CONTEXT(dst_dev, copies(dst_dev, src_dev, s, ops, n, e, done));
}

rdtcu_result rdtcu_primary_active(int dev, int *active) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  CUdevice d;
  rdtcu_result r = cu.DeviceGet(&d, dev);
  unsigned flags = 0;
  if (r == CUDA_SUCCESS) r = cu.DevicePrimaryCtxGetState(d, &flags, active);
  return r;
}

rdtcu_result rdtcu_mem_alloc(int dev, size_t n, rdtcu_ptr *p) { IN_CONTEXT(dev, cu.MemAlloc(p, n)); }

/* From the device's current pool, on the legacy default stream, waited
 * for; freed the same way. */
static rdtcu_result alloc_async(rdtcu_ptr *p, size_t n) {
  if (!cu.MemAllocAsync) return RDT_CU_MISSING;
  rdtcu_result r = cu.MemAllocAsync(p, n, NULL);
  return r == CUDA_SUCCESS ? cu.StreamSynchronize(NULL) : r;
}
static rdtcu_result free_async(rdtcu_ptr p) {
  if (!cu.MemFreeAsync) return RDT_CU_MISSING;
  rdtcu_result r = cu.MemFreeAsync(p, NULL);
  return r == CUDA_SUCCESS ? cu.StreamSynchronize(NULL) : r;
}
rdtcu_result rdtcu_mem_alloc_async(int dev, size_t n, rdtcu_ptr *p) { IN_CONTEXT(dev, alloc_async(p, n)); }
rdtcu_result rdtcu_mem_free_async(int dev, rdtcu_ptr p) { IN_CONTEXT(dev, free_async(p)); }

/* n bytes (rounded up to the granularity) in nchunks allocations of
 * cuMemCreate, mapped one after the other into one reserved range, as
 * PyTorch's expandable segments grow; handles: requestedHandleTypes. */
static rdtcu_result alloc_vmm(int dev, size_t n, size_t nchunks, int handles, rdtcu_ptr *p, size_t *size) {
  if (!cu.MemCreate || !cu.MemGetAllocationGranularity || !cu.MemRelease || !cu.MemAddressReserve ||
      !cu.MemAddressFree || !cu.MemMap || !cu.MemUnmap || !cu.MemSetAccess)
    return RDT_CU_MISSING;
  if (nchunks == 0) return CUDA_ERROR_INVALID_VALUE;
  CUdevice d;
  rdtcu_result r = cu.DeviceGet(&d, dev);
  if (r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = d;
  prop.requestedHandleTypes = handles;
  size_t g = 0;
  r = cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) return r;
  size_t chunk = ((n + nchunks - 1) / nchunks + g - 1) / g * g;
  n = chunk * nchunks;
  r = cu.MemAddressReserve(p, n, 0, 0, 0);
  if (r != CUDA_SUCCESS) return r;
  size_t mapped = 0;
  for (; mapped < nchunks && r == CUDA_SUCCESS; mapped++) {
    CUmemGenericAllocationHandle h;
    r = cu.MemCreate(&h, chunk, &prop, 0);
    if (r != CUDA_SUCCESS) break;
    r = cu.MemMap(*p + mapped * chunk, chunk, 0, h, 0);
    cu.MemRelease(h); /* the mapping holds the memory */
    if (r != CUDA_SUCCESS) break;
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = cu.MemSetAccess(*p, n, &access, 1);
  }
  if (r != CUDA_SUCCESS) {
    for (size_t i = 0; i < mapped; i++) cu.MemUnmap(*p + i * chunk, chunk);
    cu.MemAddressFree(*p, n);
    return r;
  }
  *size = n;
  return CUDA_SUCCESS;
}

static rdtcu_result free_vmm(rdtcu_ptr p, size_t size, size_t nchunks) {
  if (!cu.MemUnmap || !cu.MemAddressFree) return RDT_CU_MISSING;
  if (nchunks == 0 || size % nchunks) return CUDA_ERROR_INVALID_VALUE;
  rdtcu_result r = CUDA_SUCCESS;
  for (size_t i = 0; i < nchunks && r == CUDA_SUCCESS; i++) r = cu.MemUnmap(p + i * (size / nchunks), size / nchunks);
  return r == CUDA_SUCCESS ? cu.MemAddressFree(p, size) : r;
}
rdtcu_result rdtcu_mem_alloc_vmm(int dev, size_t n, size_t nchunks, int posix_fd, rdtcu_ptr *p, size_t *size) {
  IN_CONTEXT(dev, alloc_vmm(dev, n, nchunks, posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0, p, size));
}
rdtcu_result rdtcu_mem_free_vmm(int dev, rdtcu_ptr p, size_t size, size_t nchunks) {
  IN_CONTEXT(dev, free_vmm(p, size, nchunks));
}

/* ---- sharing virtual memory management's allocations ---- */

static int have_vmm_sharing(void) {
  return cu.MemRetainAllocationHandle && cu.MemGetAllocationPropertiesFromHandle && cu.MemExportToShareableHandle &&
         cu.MemImportFromShareableHandle && cu.MemRelease && cu.MemAddressReserve && cu.MemAddressFree && cu.MemMap &&
         cu.MemUnmap && cu.MemSetAccess;
}

/* The mapping that holds p: cuMemGetAddressRange's range, checked to be
 * one cuMemMap of one allocation (the same handle at both ends), that
 * handle's value and whether it was created exportable as a POSIX file
 * descriptor. */
static rdtcu_result vmm_chunk(rdtcu_ptr p, rdtcu_ptr *base, size_t *size, unsigned long long *handle, int *posix_fd) {
  if (!have_vmm_sharing()) return RDT_CU_MISSING;
  rdtcu_result r = cu.MemGetAddressRange(base, size, p);
  if (r != CUDA_SUCCESS) return r;
  if (*size == 0 || p < *base || p - *base >= *size) return RDT_CU_VMM_RANGE;
  CUmemGenericAllocationHandle h, first, last;
  r = cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)p);
  if (r != CUDA_SUCCESS) return r;
  r = cu.MemRetainAllocationHandle(&first, (void *)(uintptr_t)*base);
  if (r == CUDA_SUCCESS) {
    r = cu.MemRetainAllocationHandle(&last, (void *)(uintptr_t)(*base + *size - 1));
    if (r == CUDA_SUCCESS) {
      if (first != h || last != h) r = RDT_CU_VMM_RANGE;
      cu.MemRelease(last);
    }
    cu.MemRelease(first);
  }
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  if (r == CUDA_SUCCESS) r = cu.MemGetAllocationPropertiesFromHandle(&prop, h);
  cu.MemRelease(h);
  if (r != CUDA_SUCCESS) return r;
  *handle = h;
  *posix_fd = (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  return CUDA_SUCCESS;
}

rdtcu_result rdtcu_vmm_chunk(int dev, rdtcu_ptr p, rdtcu_ptr *base, size_t *size, unsigned long long *handle,
                             int *posix_fd) {
  IN_CONTEXT(dev, vmm_chunk(p, base, size, handle, posix_fd));
}

static rdtcu_result vmm_export(rdtcu_ptr p, int *fd) {
  if (!have_vmm_sharing()) return RDT_CU_MISSING;
  CUmemGenericAllocationHandle h;
  rdtcu_result r = cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)p);
  if (r != CUDA_SUCCESS) return r;
  r = cu.MemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  cu.MemRelease(h);
  return r;
}

rdtcu_result rdtcu_vmm_export(int dev, rdtcu_ptr p, int *fd) { IN_CONTEXT(dev, vmm_export(p, fd)); }

static rdtcu_result vmm_import(int dev, const int *fds, const size_t *sizes, size_t n, rdtcu_ptr *p) {
  if (!have_vmm_sharing()) return RDT_CU_MISSING;
  CUdevice d;
  rdtcu_result r = cu.DeviceGet(&d, dev);
  if (r != CUDA_SUCCESS) return r;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += sizes[i];
  if (n == 0 || total == 0) return CUDA_ERROR_INVALID_VALUE;
  r = cu.MemAddressReserve(p, total, 0, 0, 0);
  if (r != CUDA_SUCCESS) return r;
  size_t mapped = 0, off = 0;
  for (; mapped < n; mapped++) {
    CUmemGenericAllocationHandle h;
    r = cu.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fds[mapped], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) break;
    r = cu.MemMap(*p + off, sizes[mapped], 0, h, 0);
    cu.MemRelease(h); /* the mapping holds the memory */
    if (r != CUDA_SUCCESS) break;
    off += sizes[mapped];
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = d;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cu.MemSetAccess(*p, total, &access, 1);
  }
  if (r != CUDA_SUCCESS) {
    off = 0;
    for (size_t i = 0; i < mapped; i++) {
      cu.MemUnmap(*p + off, sizes[i]);
      off += sizes[i];
    }
    cu.MemAddressFree(*p, total);
  }
  return r;
}

rdtcu_result rdtcu_vmm_import(int dev, const int *fds, const size_t *sizes, size_t n, rdtcu_ptr *p) {
  IN_CONTEXT(dev, vmm_import(dev, fds, sizes, n, p));
}

static rdtcu_result vmm_unmap(rdtcu_ptr p, const size_t *sizes, size_t n) {
  if (!have_vmm_sharing()) return RDT_CU_MISSING;
  rdtcu_result r = CUDA_SUCCESS;
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    rdtcu_result r2 = cu.MemUnmap(p + off, sizes[i]);
    if (r == CUDA_SUCCESS) r = r2;
    off += sizes[i];
  }
  rdtcu_result r2 = cu.MemAddressFree(p, off);
  return r == CUDA_SUCCESS ? r2 : r;
}

rdtcu_result rdtcu_vmm_unmap(int dev, rdtcu_ptr p, const size_t *sizes, size_t n) {
  IN_CONTEXT(dev, vmm_unmap(p, sizes, n));
}

rdtcu_result rdtcu_mem_free(int dev, rdtcu_ptr p) { IN_CONTEXT(dev, cu.MemFree(p)); }
rdtcu_result rdtcu_memcpy(int dev, rdtcu_ptr dst, rdtcu_ptr src, size_t n) {
  IN_CONTEXT(dev, cu.Memcpy(dst, src, n));
}

rdtcu_result rdtcu_ctx_enter(int dev, void **saved) {
  CUcontext c = NULL;
  rdtcu_result r = enter(dev, &c);
  *saved = c;
  return r;
}

rdtcu_result rdtcu_ctx_leave(void *saved) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  return leave((CUcontext)saved, CUDA_SUCCESS);
}
