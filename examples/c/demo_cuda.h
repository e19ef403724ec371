/* The few CUDA driver calls the demo needs to make and check device memory
 * for its GPU rows. They are not rdt's API: rdt only needs a device
 * pointer in an rdt_tensor. The driver is loaded at run time, as librdt
 * loads it, so the demo builds and runs without CUDA; RDT_CUDA_LIBRARY
 * names another driver library (the test double of tests/fakecuda). */
#ifndef RDT_DEMO_CUDA_H
#define RDT_DEMO_CUDA_H

#include <stddef.h>

/* Loads the driver and makes device 0's primary context current on this
 * thread. Returns NULL, or why there is no GPU to use. Call it first. */
const char *demo_cuda_open(void);

/* Device 0's name. */
const char *demo_cuda_device_name(void);

/* Device memory of n bytes; exits with a message when the driver refuses. */
void *demo_cuda_alloc(size_t n);
void demo_cuda_free(void *device);
void demo_cuda_upload(void *device, const void *host, size_t n);
void demo_cuda_download(void *host, const void *device, size_t n);

#endif
