// The part of NIXL's C API (libnixl_capi.so, declared in NIXL's
// src/bindings/rust/wrapper.h) that this transport uses, resolved at run
// time with dlopen/dlsym so that rdt builds and runs without NIXL.
// Types, values and signatures follow that header; only what is used is
// declared.
#ifndef RDT_NIXL_SHIM_H
#define RDT_NIXL_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// nixl_capi_status_t
#define RDTNX_SUCCESS 0
#define RDTNX_IN_PROG 1

// nixl_capi_mem_type_t
#define RDTNX_MEM_DRAM 0
#define RDTNX_MEM_VRAM 1

// nixl_capi_xfer_op_t
#define RDTNX_XFER_READ 0
#define RDTNX_XFER_WRITE 1

// nixl_capi_thread_sync_t
#define RDTNX_THREAD_SYNC_STRICT 1

// nixl_capi_agent_config_t (layout as in wrapper.h).
typedef struct {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} rdtnx_agent_config;

// Loading (the Go side opens the library and resolves the symbols):
// rdtnx_symbol names the i-th function of the table, NULL past the end;
// rdtnx_install takes the addresses found, in that order, once.
const char *rdtnx_symbol(size_t i);
void rdtnx_install(void *const *fns);
// rdtnx_capi_version calls nixl_capi_get_version at fn (NIXL's reworked C
// API exports it; the one declared here does not).
void rdtnx_capi_version(void *fn, int *major, int *minor, int *patch);

// Composite calls. Each returns a nixl_capi_status_t and, on failure, sets
// *call to the name of the NIXL function that failed.

// rdtnx_agent_new creates an agent with a progress thread (which sleeps on
// the workers' events when idle) and strict thread synchronisation, and a
// UCX backend with its default parameters.
int rdtnx_agent_new(const char *name, void **agent, void **backend, const char **call);
int rdtnx_agent_free(void *agent, void *backend, const char **call);

// rdtnx_dlist_new makes a registration descriptor list of n regions of one
// memory type; rdtnx_dlist_free frees it.
int rdtnx_dlist_new(int mem, const uint64_t *addr, const uint64_t *len, const uint64_t *dev,
                    size_t n, void **dlist, const char **call);
void rdtnx_dlist_free(void *dlist);
int rdtnx_register(void *agent, void *dlist, const char **call);
int rdtnx_deregister(void *agent, void *dlist, const char **call);
// rdtnx_partial_md returns the agent's metadata for the regions in dlist
// (NULL: connection information only) in a malloc'd buffer.
int rdtnx_partial_md(void *agent, void *dlist, void **data, size_t *len, const char **call);
void rdtnx_free(void *p);
// rdtnx_load_md loads a peer's metadata blob.
int rdtnx_load_md(void *agent, const void *data, size_t len, char **name, const char **call);
int rdtnx_invalidate(void *agent, const char *name, const char **call);

// rdtnx_xfer makes and posts one request of n regions: op RDTNX_XFER_READ
// from the remote agent into local memory, RDTNX_XFER_WRITE from local
// memory into the remote agent's. On success *req is set (posting may
// already have completed the transfer: the return value is then
// RDTNX_SUCCESS).
int rdtnx_xfer(void *agent, int op, int local_mem, const uint64_t *laddr, const uint64_t *ldev,
               int remote_mem, const uint64_t *raddr, const uint64_t *rdev,
               const uint64_t *len, size_t n, const char *remote, void **req, const char **call);
int rdtnx_status(void *agent, void *req);
// rdtnx_release releases and frees a request; call it only once its status
// left RDTNX_IN_PROG.
int rdtnx_release(void *agent, void *req, const char **call);

#endif
