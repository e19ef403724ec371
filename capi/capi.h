/* Internal declarations shared by the Go export layer and its C files.
 * Never installed: the public interface is include/rdt.h. */
#ifndef RDT_CAPI_INTERNAL_H
#define RDT_CAPI_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>

/* The library defines the renamed (deprecated) names of rdt.h, and the
 * transport adapter still spells the range type rdt_source_range: neither
 * is a use to warn about here. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
#include "rdt.h"

struct rdt_buffer {
  void *data;
  size_t size;
};

/* The C compiler the library was built with, e.g. "gcc 12.2.0". */
const char *rdtc_cc_version(void);

/* Thread-local last error, set by the Go layer before it returns. */
void rdtc_set_last_error(const char *msg, size_t len);

/* Opaque values the application gives rdt and gets back (put's user_data,
 * a transport's requests, tensor data addresses) cross into Go as
 * uintptr_t, never as pointers: they may be any bits, such as small integer
 * keys, and the Go runtime aborts ("invalid pointer found on stack") when it
 * finds such a value held as a pointer. The casts happen here, in C. */

/* Trampolines: Go cannot call C function pointers directly. Each clears the
 * callback error message, calls, and on failure hands the message to Go in
 * *err (malloc'd; Go frees it). */
void rdtc_call_release(rdt_release_fn fn, uintptr_t user_data);
void rdtc_call_free_user_data(const rdt_transport_vtable *vt);
rdt_status rdtc_cb_extract(const rdt_transport_vtable *vt, const char *oid,
                           const rdt_tensor *ts, size_t n,
                           struct rdt_buffer *out, char **err);
rdt_status rdtc_cb_comm(const rdt_transport_vtable *vt, const rdt_transfer *x,
                        struct rdt_buffer *out, char **err);
rdt_status rdtc_cb_send(const rdt_transport_vtable *vt, const rdt_transfer *x,
                        const rdt_tensor *ts, size_t n, const void *tm,
                        size_t tms, const void *cm, size_t cms, char **err);
rdt_status rdtc_cb_recv(const rdt_transport_vtable *vt, const rdt_transfer *x,
                        const rdt_tensor *ts, size_t n, const void *tm,
                        size_t tms, const void *cm, size_t cms, char **err);
rdt_status rdtc_cb_fetch(const rdt_transport_vtable *vt, const rdt_transfer *x,
                         const rdt_tensor *ts, size_t n, const void *tm,
                         size_t tms, const void *cm, size_t cms, uintptr_t *req,
                         char **err);
rdt_status rdtc_cb_wait(const rdt_transport_vtable *vt, uintptr_t req,
                        int64_t timeout_ms, char **err);
void rdtc_cb_release_request(const rdt_transport_vtable *vt, uintptr_t req);
void rdtc_cb_gc(const rdt_transport_vtable *vt, const char *oid,
                const rdt_tensor *ts, size_t n, const void *tm, size_t tms);
rdt_status rdtc_cb_write(const rdt_transport_vtable *vt, const rdt_transfer *x,
                         const rdt_tensor *ts, size_t n, const void *tm,
                         size_t tms, const void *cm, size_t cms, char **err);
rdt_status rdtc_cb_write_start(const rdt_transport_vtable *vt,
                               const rdt_transfer *x, const rdt_tensor *ts,
                               size_t n, const void *tm, size_t tms,
                               const void *cm, size_t cms, uintptr_t *req,
                               char **err);
rdt_status rdtc_cb_abort(const rdt_transport_vtable *vt, const rdt_transfer *x,
                         uintptr_t req, char **err);

#endif
