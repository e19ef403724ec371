/* See demo_cuda.h. */
#include "demo_cuda.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef unsigned long long cu_ptr; /* CUdeviceptr */

static struct {
  int (*Init)(unsigned);
  int (*DeviceGetCount)(int *);
  int (*DeviceGet)(int *, int);
  int (*DevicePrimaryCtxRetain)(void **, int);
  int (*CtxSetCurrent)(void *);
  int (*DeviceGetName)(char *, int, int);
  int (*MemAlloc)(cu_ptr *, size_t);
  int (*MemFree)(cu_ptr);
  int (*MemcpyHtoD)(cu_ptr, const void *, size_t);
  int (*MemcpyDtoH)(void *, cu_ptr, size_t);
} cu;

static void cu_check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "demo: %s failed: CUresult %d\n", what, rc);
    exit(1);
  }
}

const char *demo_cuda_open(void) {
  static char why[512];
  static int done;
  if (done) return why[0] ? why : NULL;
  done = 1;
  const char *path = getenv("RDT_CUDA_LIBRARY");
  if (!path || !*path) path = "libcuda.so.1";
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(why, sizeof why, "the CUDA driver (%s) is not installed", path);
    return why;
  }
  struct {
    const char *name;
    void **fn;
  } syms[] = {
      {"cuInit", (void **)&cu.Init},
      {"cuDeviceGetCount", (void **)&cu.DeviceGetCount},
      {"cuDeviceGet", (void **)&cu.DeviceGet},
      {"cuDevicePrimaryCtxRetain", (void **)&cu.DevicePrimaryCtxRetain},
      {"cuCtxSetCurrent", (void **)&cu.CtxSetCurrent},
      {"cuDeviceGetName", (void **)&cu.DeviceGetName},
      {"cuMemAlloc_v2", (void **)&cu.MemAlloc},
      {"cuMemFree_v2", (void **)&cu.MemFree},
      {"cuMemcpyHtoD_v2", (void **)&cu.MemcpyHtoD},
      {"cuMemcpyDtoH_v2", (void **)&cu.MemcpyDtoH},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    if (!(*syms[i].fn = dlsym(h, syms[i].name))) {
      snprintf(why, sizeof why, "%s lacks %s", path, syms[i].name);
      return why;
    }
  }
  int n = 0, dev, rc;
  void *ctx;
  if ((rc = cu.Init(0)) != 0 || (rc = cu.DeviceGetCount(&n)) != 0 || n == 0) {
    snprintf(why, sizeof why, "the CUDA driver finds no device (CUresult %d)", rc);
    return why;
  }
  if ((rc = cu.DeviceGet(&dev, 0)) != 0 || (rc = cu.DevicePrimaryCtxRetain(&ctx, dev)) != 0 ||
      (rc = cu.CtxSetCurrent(ctx)) != 0) {
    snprintf(why, sizeof why, "device 0's context cannot be made current (CUresult %d)", rc);
    return why;
  }
  return NULL;
}

const char *demo_cuda_device_name(void) {
  static char name[256];
  if (cu.DeviceGetName(name, sizeof name, 0) != 0) snprintf(name, sizeof name, "?");
  return name;
}

void *demo_cuda_alloc(size_t n) {
  cu_ptr d;
  cu_check(cu.MemAlloc(&d, n ? n : 1), "cuMemAlloc");
  return (void *)(uintptr_t)d;
}

void demo_cuda_free(void *device) { cu_check(cu.MemFree((cu_ptr)(uintptr_t)device), "cuMemFree"); }

void demo_cuda_upload(void *device, const void *host, size_t n) {
  cu_check(cu.MemcpyHtoD((cu_ptr)(uintptr_t)device, host, n), "cuMemcpyHtoD");
}

void demo_cuda_download(void *host, const void *device, size_t n) {
  cu_check(cu.MemcpyDtoH(host, (cu_ptr)(uintptr_t)device, n), "cuMemcpyDtoH");
}
