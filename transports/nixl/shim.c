#define _GNU_SOURCE
#include "shim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Opaque NIXL handles are plain pointers here.
typedef void *h;

static struct {
	int (*create_configured_agent)(const char *, const rdtnx_agent_config *, h *);
	int (*destroy_agent)(h);
	int (*get_plugin_params)(h, const char *, h *, h *);
	int (*destroy_mem_list)(h);
	int (*destroy_params)(h);
	int (*create_backend)(h, const char *, h, h *);
	int (*destroy_backend)(h);
	int (*create_reg_dlist)(int, h *);
	int (*destroy_reg_dlist)(h);
	int (*reg_dlist_add_desc)(h, uintptr_t, size_t, uint64_t, const void *, size_t);
	int (*register_mem)(h, h, h);
	int (*deregister_mem)(h, h, h);
	int (*get_local_partial_md)(h, h, void **, size_t *, h);
	int (*load_remote_md)(h, const void *, size_t, char **);
	int (*invalidate_remote_md)(h, const char *);
	int (*create_xfer_dlist)(int, h *);
	int (*destroy_xfer_dlist)(h);
	int (*xfer_dlist_add_desc)(h, uintptr_t, size_t, uint64_t);
	int (*create_xfer_req)(h, int, h, h, const char *, h *, h);
	int (*post_xfer_req)(h, h, h);
	int (*get_xfer_status)(h, h);
	int (*release_xfer_req)(h, h);
	int (*destroy_xfer_req)(h);
} api;

static const struct {
	const char *name;
	size_t offset;
} symbols[] = {
#define SYM(n) {"nixl_capi_" #n, offsetof(__typeof__(api), n)}
	SYM(create_configured_agent), SYM(destroy_agent), SYM(get_plugin_params),
	SYM(destroy_mem_list), SYM(destroy_params), SYM(create_backend),
	SYM(destroy_backend), SYM(create_reg_dlist), SYM(destroy_reg_dlist),
	SYM(reg_dlist_add_desc), SYM(register_mem), SYM(deregister_mem),
	SYM(get_local_partial_md), SYM(load_remote_md), SYM(invalidate_remote_md),
	SYM(create_xfer_dlist), SYM(destroy_xfer_dlist), SYM(xfer_dlist_add_desc),
	SYM(create_xfer_req), SYM(post_xfer_req), SYM(get_xfer_status),
	SYM(release_xfer_req), SYM(destroy_xfer_req),
#undef SYM
};

const char *rdtnx_symbol(size_t i) {
	return i < sizeof symbols / sizeof symbols[0] ? symbols[i].name : NULL;
}

void rdtnx_install(void *const *fns) {
	for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++)
		memcpy((char *)&api + symbols[i].offset, &fns[i], sizeof fns[i]);
}

void rdtnx_capi_version(void *fn, int *major, int *minor, int *patch) {
	void (*version)(int *, int *, int *);
	memcpy(&version, &fn, sizeof fn);
	*major = *minor = *patch = -1;
	version(major, minor, patch);
}

#define CHECK(expr, name)             \
	do {                              \
		int rc_ = (expr);             \
		if (rc_ != RDTNX_SUCCESS) {   \
			*call = "nixl_capi_" name; \
			st = rc_;                 \
			goto out;                 \
		}                             \
	} while (0)

int rdtnx_agent_new(const char *name, void **agent, void **backend, const char **call) {
	int st = RDTNX_SUCCESS;
	h a = NULL, mems = NULL, params = NULL, b = NULL;
	rdtnx_agent_config cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.enable_prog_thread = true;
	cfg.enable_listen_thread = false;
	cfg.thread_sync = RDTNX_THREAD_SYNC_STRICT;
	cfg.lthr_delay_us = 100000;
	// The progress thread waits on the workers' event descriptors, waking at
	// least this often; at 0 it never waits and takes a whole core from the
	// moment the agent exists, which on a small machine is the core the
	// copies need.
	cfg.pthr_delay_us = 1000;
	CHECK(api.create_configured_agent(name, &cfg, &a), "create_configured_agent");
	CHECK(api.get_plugin_params(a, "UCX", &mems, &params), "get_plugin_params");
	CHECK(api.create_backend(a, "UCX", params, &b), "create_backend");
out:
	if (mems) api.destroy_mem_list(mems);
	if (params) api.destroy_params(params);
	if (st != RDTNX_SUCCESS && a) {
		if (b) api.destroy_backend(b);
		api.destroy_agent(a);
		a = b = NULL;
	}
	*agent = a;
	*backend = b;
	return st;
}

int rdtnx_agent_free(void *agent, void *backend, const char **call) {
	int st = RDTNX_SUCCESS;
	// The backend handle only wraps a pointer the agent owns.
	if (backend) api.destroy_backend(backend);
	CHECK(api.destroy_agent(agent), "destroy_agent");
out:
	return st;
}

int rdtnx_dlist_new(int mem, const uint64_t *addr, const uint64_t *len, const uint64_t *dev,
                    size_t n, void **dlist, const char **call) {
	int st = RDTNX_SUCCESS;
	h d = NULL;
	CHECK(api.create_reg_dlist(mem, &d), "create_reg_dlist");
	for (size_t i = 0; i < n; i++)
		CHECK(api.reg_dlist_add_desc(d, (uintptr_t)addr[i], (size_t)len[i], dev[i], NULL, 0), "reg_dlist_add_desc");
out:
	if (st != RDTNX_SUCCESS && d) {
		api.destroy_reg_dlist(d);
		d = NULL;
	}
	*dlist = d;
	return st;
}

void rdtnx_dlist_free(void *dlist) {
	if (dlist) api.destroy_reg_dlist(dlist);
}

int rdtnx_register(void *agent, void *dlist, const char **call) {
	int st = RDTNX_SUCCESS;
	CHECK(api.register_mem(agent, dlist, NULL), "register_mem");
out:
	return st;
}

int rdtnx_deregister(void *agent, void *dlist, const char **call) {
	int st = RDTNX_SUCCESS;
	CHECK(api.deregister_mem(agent, dlist, NULL), "deregister_mem");
out:
	return st;
}

int rdtnx_partial_md(void *agent, void *dlist, void **data, size_t *len, const char **call) {
	int st = RDTNX_SUCCESS;
	h empty = NULL;
	*data = NULL;
	*len = 0;
	if (!dlist) {
		CHECK(api.create_reg_dlist(RDTNX_MEM_DRAM, &empty), "create_reg_dlist");
		dlist = empty;
	}
	CHECK(api.get_local_partial_md(agent, dlist, data, len, NULL), "get_local_partial_md");
out:
	if (empty) api.destroy_reg_dlist(empty);
	return st;
}

void rdtnx_free(void *p) { free(p); }

int rdtnx_load_md(void *agent, const void *data, size_t len, char **name, const char **call) {
	int st = RDTNX_SUCCESS;
	*name = NULL;
	CHECK(api.load_remote_md(agent, data, len, name), "load_remote_md");
out:
	return st;
}

int rdtnx_invalidate(void *agent, const char *name, const char **call) {
	int st = RDTNX_SUCCESS;
	CHECK(api.invalidate_remote_md(agent, name), "invalidate_remote_md");
out:
	return st;
}

int rdtnx_xfer(void *agent, int op, int local_mem, const uint64_t *laddr, const uint64_t *ldev,
               int remote_mem, const uint64_t *raddr, const uint64_t *rdev,
               const uint64_t *len, size_t n, const char *remote, void **req, const char **call) {
	int st = RDTNX_SUCCESS;
	h l = NULL, r = NULL, q = NULL;
	*req = NULL;
	CHECK(api.create_xfer_dlist(local_mem, &l), "create_xfer_dlist");
	CHECK(api.create_xfer_dlist(remote_mem, &r), "create_xfer_dlist");
	for (size_t i = 0; i < n; i++) {
		CHECK(api.xfer_dlist_add_desc(l, (uintptr_t)laddr[i], (size_t)len[i], ldev[i]), "xfer_dlist_add_desc");
		CHECK(api.xfer_dlist_add_desc(r, (uintptr_t)raddr[i], (size_t)len[i], rdev[i]), "xfer_dlist_add_desc");
	}
	CHECK(api.create_xfer_req(agent, op, l, r, remote, &q, NULL), "create_xfer_req");
	st = api.post_xfer_req(agent, q, NULL);
	if (st != RDTNX_SUCCESS && st != RDTNX_IN_PROG) {
		*call = "nixl_capi_post_xfer_req";
		// A failed post leaves nothing in flight: the request can go.
		api.release_xfer_req(agent, q);
		api.destroy_xfer_req(q);
		q = NULL;
	}
out:
	if (l) api.destroy_xfer_dlist(l);
	if (r) api.destroy_xfer_dlist(r);
	*req = q;
	return st;
}

int rdtnx_status(void *agent, void *req) { return api.get_xfer_status(agent, req); }

int rdtnx_release(void *agent, void *req, const char **call) {
	int st = RDTNX_SUCCESS;
	CHECK(api.release_xfer_req(agent, req), "release_xfer_req");
	CHECK(api.destroy_xfer_req(req), "destroy_xfer_req");
out:
	return st;
}
