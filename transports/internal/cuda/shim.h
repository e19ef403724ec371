/* The few CUDA driver API types and calls rdt uses, declared here (no CUDA
 * headers are needed to build) and resolved at run time with dlopen. Every
 * call that needs a context takes a device ordinal: the shim makes that
 * device's primary context current, does the work and restores whatever
 * context the calling thread had, all inside one C call, because a CUDA
 * context is per OS thread and Go moves goroutines between threads. */
#ifndef RDT_CUDA_SHIM_H
#define RDT_CUDA_SHIM_H

/* Internal to librdt.so: never exported (only rdt.h's functions are). */
#pragma GCC visibility push(hidden)

#include <stddef.h>
#include <stdint.h>

typedef int rdtcu_result;                 /* CUresult */
typedef unsigned long long rdtcu_ptr;     /* CUdeviceptr */
typedef void *rdtcu_stream;               /* CUstream */
typedef void *rdtcu_event;                /* CUevent */

#define RDT_CU_IPC_HANDLE_SIZE 64
#define RDT_CU_MAX_DEVICES 64

/* Results the shim makes itself (outside CUresult's range). */
#define RDT_CU_NOT_LOADED (-1)
#define RDT_CU_BAD_DEVICE (-2)
#define RDT_CU_MISSING (-3) /* the driver lacks an optional call */
/* cuMemGetAddressRange's range of a virtual memory mapping is not one
 * cuMemMap of one allocation. */
#define RDT_CU_VMM_RANGE (-4)

typedef struct {
  int memory_type;        /* CU_MEMORYTYPE_*: 1 host, 2 device, 3 array, 4 unified */
  int device;             /* ordinal the memory lives on */
  int managed;            /* 1 for managed (unified) memory */
  int legacy_ipc;         /* 1 if cuIpcGetMemHandle works on it */
  int pool;               /* 1 if it comes from a memory pool (cuMemAllocAsync) */
  unsigned long long buffer_id; /* process-wide unique id of the allocation */
  rdtcu_ptr base;        /* allocation base (cuMemGetAddressRange) */
  size_t size;            /* allocation size */
  /* legacy_ipc, pool, buffer_id, base and size are filled for device
   * memory only (not host, not managed); buffer_id, base and size are
   * sure for memory legacy IPC shares only. */
} rdtcu_pointer_info;

typedef struct {
  rdtcu_ptr dst, src;
  size_t n;
} rdtcu_copy;

/* Loading (the Go side opens the library and resolves the symbols):
 * rdtcu_symbol names the i-th symbol of the table, in *older the older
 * name to try when it is missing (NULL for none) and in *optional whether
 * it may be missing; NULL past the end. rdtcu_install takes the addresses
 * found (NULL for a missing optional one), in that order, once. */
const char *rdtcu_symbol(size_t i, const char **older, int *optional);
void rdtcu_install(void *const *fns);

rdtcu_result rdtcu_init(void);
const char *rdtcu_error_name(rdtcu_result r);   /* NULL if unknown */
const char *rdtcu_error_string(rdtcu_result r); /* NULL if unknown */

rdtcu_result rdtcu_device_count(int *n);
rdtcu_result rdtcu_device_uuid(int dev, unsigned char uuid[16]);
rdtcu_result rdtcu_device_name(int dev, char *name, int len);
rdtcu_result rdtcu_can_access_peer(int dev, int peer, int *can);
/* Whether dev's primary context is active (retained by anyone in the
 * process), without retaining it. */
rdtcu_result rdtcu_primary_active(int dev, int *active);

rdtcu_result rdtcu_pointer_info_get(int dev, rdtcu_ptr p, rdtcu_pointer_info *info);

rdtcu_result rdtcu_ipc_get(int dev, rdtcu_ptr base, unsigned char handle[RDT_CU_IPC_HANDLE_SIZE]);
rdtcu_result rdtcu_ipc_open(int dev, const unsigned char handle[RDT_CU_IPC_HANDLE_SIZE], rdtcu_ptr *p);
rdtcu_result rdtcu_ipc_close(int dev, rdtcu_ptr p);

rdtcu_result rdtcu_stream_create(int dev, rdtcu_stream *s);
rdtcu_result rdtcu_stream_destroy(int dev, rdtcu_stream s);
rdtcu_result rdtcu_stream_sync(int dev, rdtcu_stream s);
rdtcu_result rdtcu_event_create(int dev, rdtcu_event *e);
rdtcu_result rdtcu_event_destroy(int dev, rdtcu_event e);
rdtcu_result rdtcu_event_query(int dev, rdtcu_event e);

/* Enqueues every copy on s and then records e on it (e may be NULL).
 * src_dev == dst_dev: cuMemcpyDtoDAsync; otherwise cuMemcpyPeerAsync
 * between the two primary contexts; src_dev < 0: cuMemcpyAsync (unified
 * addressing picks the direction). *done counts the copies enqueued. */
rdtcu_result rdtcu_copy_async(int dst_dev, int src_dev, rdtcu_stream s,
                                const rdtcu_copy *ops, size_t n, rdtcu_event e, size_t *done);

/* For tests and benchmarks. The _async and _vmm calls allocate the kinds
 * of memory legacy IPC cannot share: from the device's memory pool, and
 * cuMemCreate mapped with cuMemMap (*size: n rounded up to the
 * granularity); RDT_CU_MISSING without the driver calls. */
rdtcu_result rdtcu_mem_alloc(int dev, size_t n, rdtcu_ptr *p);
rdtcu_result rdtcu_mem_free(int dev, rdtcu_ptr p);
rdtcu_result rdtcu_mem_alloc_async(int dev, size_t n, rdtcu_ptr *p);
rdtcu_result rdtcu_mem_free_async(int dev, rdtcu_ptr p);
rdtcu_result rdtcu_mem_alloc_vmm(int dev, size_t n, size_t nchunks, int posix_fd, rdtcu_ptr *p, size_t *size);
rdtcu_result rdtcu_mem_free_vmm(int dev, rdtcu_ptr p, size_t size, size_t nchunks);
rdtcu_result rdtcu_memcpy(int dev, rdtcu_ptr dst, rdtcu_ptr src, size_t n);

/* Sharing virtual memory management's allocations through POSIX file
 * descriptors; RDT_CU_MISSING without the driver calls.
 * rdtcu_vmm_chunk: the mapping holding p (one cuMemMap of one allocation:
 * its base, size and handle value) and whether the allocation was created
 * exportable as a file descriptor. rdtcu_vmm_export: a new file descriptor
 * of the allocation mapped at p (the caller closes it).
 * rdtcu_vmm_import: maps the n allocations (fds, which the caller keeps,
 * of sizes[i] bytes each) one after the other into a new reserved range at
 * *p, read-write for dev. rdtcu_vmm_unmap undoes it. */
rdtcu_result rdtcu_vmm_chunk(int dev, rdtcu_ptr p, rdtcu_ptr *base, size_t *size, unsigned long long *handle,
                             int *posix_fd);
rdtcu_result rdtcu_vmm_export(int dev, rdtcu_ptr p, int *fd);
rdtcu_result rdtcu_vmm_import(int dev, const int *fds, const size_t *sizes, size_t n, rdtcu_ptr *p);
rdtcu_result rdtcu_vmm_unmap(int dev, rdtcu_ptr p, const size_t *sizes, size_t n);

/* For libraries that use the current context of the calling thread (NCCL):
 * make dev's primary context current and hand back the previous one, and
 * put it back. The caller keeps the OS thread between the two calls. */
rdtcu_result rdtcu_ctx_enter(int dev, void **saved);
rdtcu_result rdtcu_ctx_leave(void *saved);

#pragma GCC visibility pop

#endif
