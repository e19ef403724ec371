/* The few CUDA driver API types and calls rdt uses, declared here (no CUDA
 * headers are needed to build) and resolved at run time with dlopen. Every
 * call that needs a context takes a device ordinal: the shim makes that
 * device's primary context current, does the work and restores whatever
 * context the calling thread had, all inside one C call, because a CUDA
 * context is per OS thread and Go moves goroutines between threads. */
#ifndef RDT_CUDA_SHIM_H
#define RDT_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int rdt_cu_result;                 /* CUresult */
typedef unsigned long long rdt_cu_ptr;     /* CUdeviceptr */
typedef void *rdt_cu_stream;               /* CUstream */
typedef void *rdt_cu_event;                /* CUevent */

#define RDT_CU_IPC_HANDLE_SIZE 64
#define RDT_CU_MAX_DEVICES 64

/* Results the shim makes itself (outside CUresult's range). */
#define RDT_CU_NOT_LOADED (-1)
#define RDT_CU_BAD_DEVICE (-2)

typedef struct {
  int memory_type;        /* CU_MEMORYTYPE_*: 1 host, 2 device, 3 array, 4 unified */
  int device;             /* ordinal the memory lives on */
  int legacy_ipc;         /* 1 if cuIpcGetMemHandle works on it */
  unsigned long long buffer_id; /* process-wide unique id of the allocation */
  rdt_cu_ptr base;        /* allocation base (cuMemGetAddressRange) */
  size_t size;            /* allocation size */
} rdt_cu_pointer_info;

typedef struct {
  rdt_cu_ptr dst, src;
  size_t n;
} rdt_cu_copy;

/* Loading: 0 on success; on failure, a message in err. */
int rdt_cu_load(const char *path, char *err, size_t errlen);

rdt_cu_result rdt_cu_init(void);
const char *rdt_cu_error_name(rdt_cu_result r);   /* NULL if unknown */
const char *rdt_cu_error_string(rdt_cu_result r); /* NULL if unknown */

rdt_cu_result rdt_cu_device_count(int *n);
rdt_cu_result rdt_cu_device_uuid(int dev, unsigned char uuid[16]);
rdt_cu_result rdt_cu_device_name(int dev, char *name, int len);
rdt_cu_result rdt_cu_can_access_peer(int dev, int peer, int *can);

rdt_cu_result rdt_cu_pointer_info_get(int dev, rdt_cu_ptr p, rdt_cu_pointer_info *info);

rdt_cu_result rdt_cu_ipc_get(int dev, rdt_cu_ptr base, unsigned char handle[RDT_CU_IPC_HANDLE_SIZE]);
rdt_cu_result rdt_cu_ipc_open(int dev, const unsigned char handle[RDT_CU_IPC_HANDLE_SIZE], rdt_cu_ptr *p);
rdt_cu_result rdt_cu_ipc_close(int dev, rdt_cu_ptr p);

rdt_cu_result rdt_cu_stream_create(int dev, rdt_cu_stream *s);
rdt_cu_result rdt_cu_stream_destroy(int dev, rdt_cu_stream s);
rdt_cu_result rdt_cu_stream_sync(int dev, rdt_cu_stream s);
rdt_cu_result rdt_cu_event_create(int dev, rdt_cu_event *e);
rdt_cu_result rdt_cu_event_destroy(int dev, rdt_cu_event e);
rdt_cu_result rdt_cu_event_query(int dev, rdt_cu_event e);

/* Enqueues every copy on s and then records e on it (e may be NULL).
 * src_dev == dst_dev: cuMemcpyDtoDAsync; otherwise cuMemcpyPeerAsync
 * between the two primary contexts; src_dev < 0: cuMemcpyAsync (unified
 * addressing picks the direction). *done counts the copies enqueued. */
rdt_cu_result rdt_cu_copy_async(int dst_dev, int src_dev, rdt_cu_stream s,
                                const rdt_cu_copy *ops, size_t n, rdt_cu_event e, size_t *done);

/* For tests and benchmarks. */
rdt_cu_result rdt_cu_mem_alloc(int dev, size_t n, rdt_cu_ptr *p);
rdt_cu_result rdt_cu_mem_free(int dev, rdt_cu_ptr p);
rdt_cu_result rdt_cu_memcpy(int dev, rdt_cu_ptr dst, rdt_cu_ptr src, size_t n);

#endif
