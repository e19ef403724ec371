/* The functions of rdt.h's "Renamed names": each is exported under its old
 * name, so that programs built against an earlier rdt.h keep linking, and
 * does nothing but call its replacement (which checks the fork guard,
 * versioned options and handles). Errors therefore carry the replacement's
 * name in rdt_last_error(). */
#include "capi.h"

rdt_status rdt_fetch_start(rdt_runtime *rt, rdt_ref *const *refs,
                           size_t num_refs, const rdt_tensor *targets,
                           size_t num_targets, const rdt_get_options *opts,
                           rdt_pending **out) {
  return rdt_get_start(rt, refs, num_refs, targets, num_targets, opts, out);
}

rdt_status rdt_fetch_wait(rdt_pending *fetch, int64_t timeout_ms) {
  return rdt_pending_wait(fetch, timeout_ms);
}

rdt_status rdt_fetch_abort(rdt_pending *fetch) {
  return rdt_pending_abort(fetch);
}

rdt_status rdt_fetch_event_fd(rdt_pending *fetch, int *fd_out) {
  return rdt_pending_event_fd(fetch, fd_out);
}

rdt_status rdt_fetch_free(rdt_pending *fetch) { return rdt_pending_free(fetch); }

rdt_status rdt_fetch_prepare(rdt_runtime *rt, rdt_ref *const *refs,
                             size_t num_refs, const rdt_tensor *targets,
                             size_t num_targets, const rdt_get_options *opts,
                             rdt_prepared **out) {
  return rdt_prepare_get(rt, refs, num_refs, targets, num_targets, opts, out);
}

rdt_status rdt_write_prepare(rdt_runtime *rt, rdt_ref *const *refs,
                             size_t num_refs, const rdt_tensor *sources,
                             size_t num_sources, const rdt_write_options *opts,
                             rdt_prepared **out) {
  return rdt_prepare_write(rt, refs, num_refs, sources, num_sources, opts,
                           out);
}
