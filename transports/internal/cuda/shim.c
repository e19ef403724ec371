#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* CUDA driver API facts (cuda.h): values and signatures. */
typedef int CUdevice;
typedef void *CUcontext;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[RDT_CU_IPC_HANDLE_SIZE]; } CUipcMemHandle;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_NOT_READY = 600,
};
enum {
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
};
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2

static struct {
  rdt_cu_result (*Init)(unsigned);
  rdt_cu_result (*GetErrorName)(rdt_cu_result, const char **);
  rdt_cu_result (*GetErrorString)(rdt_cu_result, const char **);
  rdt_cu_result (*DeviceGet)(CUdevice *, int);
  rdt_cu_result (*DeviceGetCount)(int *);
  rdt_cu_result (*DeviceGetUuid)(CUuuid *, CUdevice);
  rdt_cu_result (*DeviceGetName)(char *, int, CUdevice);
  rdt_cu_result (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
  rdt_cu_result (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  rdt_cu_result (*CtxSetCurrent)(CUcontext);
  rdt_cu_result (*CtxGetCurrent)(CUcontext *);
  rdt_cu_result (*IpcGetMemHandle)(CUipcMemHandle *, rdt_cu_ptr);
  rdt_cu_result (*IpcOpenMemHandle)(rdt_cu_ptr *, CUipcMemHandle, unsigned);
  rdt_cu_result (*IpcCloseMemHandle)(rdt_cu_ptr);
  rdt_cu_result (*MemGetAddressRange)(rdt_cu_ptr *, size_t *, rdt_cu_ptr);
  rdt_cu_result (*PointerGetAttribute)(void *, int, rdt_cu_ptr);
  rdt_cu_result (*MemcpyAsync)(rdt_cu_ptr, rdt_cu_ptr, size_t, rdt_cu_stream);
  rdt_cu_result (*MemcpyDtoDAsync)(rdt_cu_ptr, rdt_cu_ptr, size_t, rdt_cu_stream);
  rdt_cu_result (*MemcpyPeerAsync)(rdt_cu_ptr, CUcontext, rdt_cu_ptr, CUcontext, size_t, rdt_cu_stream);
  rdt_cu_result (*Memcpy)(rdt_cu_ptr, rdt_cu_ptr, size_t);
  rdt_cu_result (*StreamCreate)(rdt_cu_stream *, unsigned);
  rdt_cu_result (*StreamDestroy)(rdt_cu_stream);
  rdt_cu_result (*StreamSynchronize)(rdt_cu_stream);
  rdt_cu_result (*EventCreate)(rdt_cu_event *, unsigned);
  rdt_cu_result (*EventRecord)(rdt_cu_event, rdt_cu_stream);
  rdt_cu_result (*EventQuery)(rdt_cu_event);
  rdt_cu_result (*EventDestroy)(rdt_cu_event);
  rdt_cu_result (*MemAlloc)(rdt_cu_ptr *, size_t);
  rdt_cu_result (*MemFree)(rdt_cu_ptr);
} cu, staged;

/* Symbol names: the driver exports versioned entry points (_v2) for calls
 * whose ABI changed; cuda.h maps the plain names onto them. */
static const struct { const char *name; void **slot; } symbols[] = {
  {"cuInit", (void **)&staged.Init},
  {"cuGetErrorName", (void **)&staged.GetErrorName},
  {"cuGetErrorString", (void **)&staged.GetErrorString},
  {"cuDeviceGet", (void **)&staged.DeviceGet},
  {"cuDeviceGetCount", (void **)&staged.DeviceGetCount},
  {"cuDeviceGetUuid", (void **)&staged.DeviceGetUuid},
  {"cuDeviceGetName", (void **)&staged.DeviceGetName},
  {"cuDeviceCanAccessPeer", (void **)&staged.DeviceCanAccessPeer},
  {"cuDevicePrimaryCtxRetain", (void **)&staged.DevicePrimaryCtxRetain},
  {"cuCtxSetCurrent", (void **)&staged.CtxSetCurrent},
  {"cuCtxGetCurrent", (void **)&staged.CtxGetCurrent},
  {"cuIpcGetMemHandle", (void **)&staged.IpcGetMemHandle},
  {"cuIpcOpenMemHandle_v2", (void **)&staged.IpcOpenMemHandle},
  {"cuIpcCloseMemHandle", (void **)&staged.IpcCloseMemHandle},
  {"cuMemGetAddressRange_v2", (void **)&staged.MemGetAddressRange},
  {"cuPointerGetAttribute", (void **)&staged.PointerGetAttribute},
  {"cuMemcpyAsync", (void **)&staged.MemcpyAsync},
  {"cuMemcpyDtoDAsync_v2", (void **)&staged.MemcpyDtoDAsync},
  {"cuMemcpyPeerAsync", (void **)&staged.MemcpyPeerAsync},
  {"cuMemcpy", (void **)&staged.Memcpy},
  {"cuStreamCreate", (void **)&staged.StreamCreate},
  {"cuStreamDestroy_v2", (void **)&staged.StreamDestroy},
  {"cuStreamSynchronize", (void **)&staged.StreamSynchronize},
  {"cuEventCreate", (void **)&staged.EventCreate},
  {"cuEventRecord", (void **)&staged.EventRecord},
  {"cuEventQuery", (void **)&staged.EventQuery},
  {"cuEventDestroy_v2", (void **)&staged.EventDestroy},
  {"cuMemAlloc_v2", (void **)&staged.MemAlloc},
  {"cuMemFree_v2", (void **)&staged.MemFree},
};

static int loaded;

int rdt_cu_load(const char *path, char *err, size_t errlen) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(err, errlen, "%s", e ? e : "dlopen failed");
    return -1;
  }
  for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
    dlerror();
    void *f = dlsym(h, symbols[i].name);
    if (!f) {
      snprintf(err, errlen, "%s has no symbol %s: it is not the CUDA driver library, or a driver older than CUDA 11",
               path, symbols[i].name);
      dlclose(h);
      return -1;
    }
    *symbols[i].slot = f;
  }
  /* Resolved into `staged` first so that a failed load never disturbs a
   * table already in use. The handle stays open for the life of the process. */
  cu = staged;
  loaded = 1;
  return 0;
}

rdt_cu_result rdt_cu_init(void) { return loaded ? cu.Init(0) : RDT_CU_NOT_LOADED; }

const char *rdt_cu_error_name(rdt_cu_result r) {
  const char *s = NULL;
  if (!loaded || cu.GetErrorName(r, &s) != CUDA_SUCCESS) return NULL;
  return s;
}

const char *rdt_cu_error_string(rdt_cu_result r) {
  const char *s = NULL;
  if (!loaded || cu.GetErrorString(r, &s) != CUDA_SUCCESS) return NULL;
  return s;
}

/* Primary contexts, retained once per device and kept for the life of the
 * process (the context the CUDA runtime and frameworks such as PyTorch use). */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctxs[RDT_CU_MAX_DEVICES];

static rdt_cu_result primary(int dev, CUcontext *out) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  if (dev < 0 || dev >= RDT_CU_MAX_DEVICES) return RDT_CU_BAD_DEVICE;
  pthread_mutex_lock(&ctx_mu);
  rdt_cu_result r = CUDA_SUCCESS;
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
static rdt_cu_result enter(int dev, CUcontext *saved) {
  CUcontext c;
  rdt_cu_result r = primary(dev, &c);
  if (r != CUDA_SUCCESS) return r;
  r = cu.CtxGetCurrent(saved);
  if (r != CUDA_SUCCESS) return r;
  if (*saved == c) return CUDA_SUCCESS;
  return cu.CtxSetCurrent(c);
}

static rdt_cu_result leave(CUcontext saved, rdt_cu_result r) {
  CUcontext now = NULL;
  if (cu.CtxGetCurrent(&now) == CUDA_SUCCESS && now != saved) {
    rdt_cu_result r2 = cu.CtxSetCurrent(saved);
    if (r == CUDA_SUCCESS) r = r2;
  }
  return r;
}

#define IN_CONTEXT(dev, expr)                               \
  do {                                                      \
    CUcontext saved_;                                       \
    rdt_cu_result r_ = enter((dev), &saved_);               \
    if (r_ != CUDA_SUCCESS) return r_;                      \
    return leave(saved_, (expr));                           \
  } while (0)

rdt_cu_result rdt_cu_device_count(int *n) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  return cu.DeviceGetCount(n);
}

rdt_cu_result rdt_cu_device_uuid(int dev, unsigned char uuid[16]) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  CUdevice d;
  rdt_cu_result r = cu.DeviceGet(&d, dev);
  if (r != CUDA_SUCCESS) return r;
  CUuuid u;
  r = cu.DeviceGetUuid(&u, d);
  if (r == CUDA_SUCCESS) memcpy(uuid, u.bytes, 16);
  return r;
}

rdt_cu_result rdt_cu_device_name(int dev, char *name, int len) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  CUdevice d;
  rdt_cu_result r = cu.DeviceGet(&d, dev);
  if (r != CUDA_SUCCESS) return r;
  return cu.DeviceGetName(name, len, d);
}

rdt_cu_result rdt_cu_can_access_peer(int dev, int peer, int *can) {
  if (!loaded) return RDT_CU_NOT_LOADED;
  CUdevice a, b;
  rdt_cu_result r = cu.DeviceGet(&a, dev);
  if (r == CUDA_SUCCESS) r = cu.DeviceGet(&b, peer);
  if (r == CUDA_SUCCESS) r = cu.DeviceCanAccessPeer(can, a, b);
  return r;
}

static rdt_cu_result pointer_info(rdt_cu_ptr p, rdt_cu_pointer_info *info) {
  unsigned int mt = 0;
  rdt_cu_result r = cu.PointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (r != CUDA_SUCCESS) return r;
  info->memory_type = (int)mt;
  int ord = -1;
  r = cu.PointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  if (r != CUDA_SUCCESS) return r;
  info->device = ord;
  unsigned long long id = 0;
  r = cu.PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
  if (r != CUDA_SUCCESS) return r;
  info->buffer_id = id;
  int ipc = 0;
  r = cu.PointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
  if (r != CUDA_SUCCESS) return r;
  info->legacy_ipc = ipc;
  return cu.MemGetAddressRange(&info->base, &info->size, p);
}

rdt_cu_result rdt_cu_pointer_info_get(int dev, rdt_cu_ptr p, rdt_cu_pointer_info *info) {
  memset(info, 0, sizeof *info);
  IN_CONTEXT(dev, pointer_info(p, info));
}

rdt_cu_result rdt_cu_ipc_get(int dev, rdt_cu_ptr base, unsigned char handle[RDT_CU_IPC_HANDLE_SIZE]) {
  CUipcMemHandle h;
  memset(&h, 0, sizeof h);
  CUcontext saved;
  rdt_cu_result r = enter(dev, &saved);
  if (r != CUDA_SUCCESS) return r;
  r = leave(saved, cu.IpcGetMemHandle(&h, base));
  if (r == CUDA_SUCCESS) memcpy(handle, h.reserved, RDT_CU_IPC_HANDLE_SIZE);
  return r;
}

rdt_cu_result rdt_cu_ipc_open(int dev, const unsigned char handle[RDT_CU_IPC_HANDLE_SIZE], rdt_cu_ptr *p) {
  CUipcMemHandle h;
  memcpy(h.reserved, handle, RDT_CU_IPC_HANDLE_SIZE);
  IN_CONTEXT(dev, cu.IpcOpenMemHandle(p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
}

rdt_cu_result rdt_cu_ipc_close(int dev, rdt_cu_ptr p) { IN_CONTEXT(dev, cu.IpcCloseMemHandle(p)); }

rdt_cu_result rdt_cu_stream_create(int dev, rdt_cu_stream *s) {
  IN_CONTEXT(dev, cu.StreamCreate(s, CU_STREAM_NON_BLOCKING));
}
rdt_cu_result rdt_cu_stream_destroy(int dev, rdt_cu_stream s) { IN_CONTEXT(dev, cu.StreamDestroy(s)); }
rdt_cu_result rdt_cu_stream_sync(int dev, rdt_cu_stream s) { IN_CONTEXT(dev, cu.StreamSynchronize(s)); }
rdt_cu_result rdt_cu_event_create(int dev, rdt_cu_event *e) {
  IN_CONTEXT(dev, cu.EventCreate(e, CU_EVENT_DISABLE_TIMING));
}
rdt_cu_result rdt_cu_event_destroy(int dev, rdt_cu_event e) { IN_CONTEXT(dev, cu.EventDestroy(e)); }
rdt_cu_result rdt_cu_event_query(int dev, rdt_cu_event e) { IN_CONTEXT(dev, cu.EventQuery(e)); }

static rdt_cu_result copies(int dst_dev, int src_dev, rdt_cu_stream s, const rdt_cu_copy *ops, size_t n,
                            rdt_cu_event e, size_t *done) {
  CUcontext dctx = NULL, sctx = NULL;
  rdt_cu_result r = CUDA_SUCCESS;
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

rdt_cu_result rdt_cu_copy_async(int dst_dev, int src_dev, rdt_cu_stream s, const rdt_cu_copy *ops, size_t n,
                                rdt_cu_event e, size_t *done) {
  *done = 0;
  IN_CONTEXT(dst_dev, copies(dst_dev, src_dev, s, ops, n, e, done));
}

rdt_cu_result rdt_cu_mem_alloc(int dev, size_t n, rdt_cu_ptr *p) { IN_CONTEXT(dev, cu.MemAlloc(p, n)); }
rdt_cu_result rdt_cu_mem_free(int dev, rdt_cu_ptr p) { IN_CONTEXT(dev, cu.MemFree(p)); }
rdt_cu_result rdt_cu_memcpy(int dev, rdt_cu_ptr dst, rdt_cu_ptr src, size_t n) {
  IN_CONTEXT(dev, cu.Memcpy(dst, src, n));
}
