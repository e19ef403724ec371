/* The public entry points. Each one checks that the process was not forked
 * since the library was loaded (the Go runtime would hang in the child),
 * adapts versioned structs to the library's own layout, and calls the Go
 * export that does the work. Handles, and opaque values such as user data
 * and data addresses that Go only passes on, cross into Go as integers
 * (see capi.h). */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "_cgo_export.h"
#include "capi.h"

static volatile int forked_child;

static void on_fork_child(void) { forked_child = 1; }

__attribute__((constructor)) static void rdtc_install_fork_guard(void) {
  pthread_atfork(NULL, NULL, on_fork_child);
}

static rdt_status fail(rdt_status st, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
  rdtc_set_last_error(msg, (size_t)n);
  return st;
}

#define FORK_GUARD(fn)                                                       \
  do {                                                                       \
    if (forked_child)                                                        \
      return fail(RDT_ERR_FORKED,                                            \
                  "%s: this process was forked after librdt was loaded, and "  \
                  "the Go runtime inside it does not survive fork(); start "   \
                  "processes with fork+exec or posix_spawn (Python: the "      \
                  "'spawn' or 'forkserver' start method)",                    \
                  fn);                                                       \
  } while (0)

/* Whether struct_size is one a version of rdt.h gave `type`: every
 * version's size is a multiple of the struct's alignment (a struct is
 * padded to it), so any other size ends inside a field, half a pointer
 * say, which copied would be a wild value; it is refused instead. */
#define STRUCT_SIZE_WHOLE(type, size) ((size) % _Alignof(type) == 0)

#define REFUSE_PARTIAL_FIELD(fn, type, size)                                 \
  do {                                                                       \
    if (!STRUCT_SIZE_WHOLE(type, size))                                      \
      return fail(RDT_ERR_INVALID_ARGUMENT,                                   \
                  "%s: " #type " struct_size %u ends inside a field (no "    \
                  "version of rdt.h has that size); initialize it with its " \
                  "_init function",                                          \
                  fn, (unsigned)(size));                                     \
  } while (0)

/* Copies a caller's versioned struct into a zeroed, library-sized one. */
#define VERSIONED_IN(fn, type, dst, src, first_field)                        \
  do {                                                                       \
    if ((src)->struct_size < offsetof(type, first_field))                    \
      return fail(RDT_ERR_INVALID_ARGUMENT,                                   \
                  "%s: " #type " struct_size %u is too small; initialize it " \
                  "with its _init function",                                 \
                  fn, (unsigned)(src)->struct_size);                         \
    REFUSE_PARTIAL_FIELD(fn, type, (src)->struct_size);                      \
    size_t n_ = (src)->struct_size < sizeof(type) ? (src)->struct_size        \
                                                 : sizeof(type);             \
    memcpy(&(dst), (src), n_);                                               \
    (dst).struct_size = sizeof(type);                                        \
  } while (0)

/* Copies the library's filled struct back up to the caller's struct_size. */
#define VERSIONED_OUT(type, dst, src)                                        \
  do {                                                                       \
    uint32_t keep_ = (dst)->struct_size;                                     \
    size_t n_ = keep_ < sizeof(type) ? keep_ : sizeof(type);                 \
    memcpy((dst), &(src), n_);                                               \
    (dst)->struct_size = keep_;                                              \
  } while (0)

#define CHECK_OUT_STRUCT(fn, type, p, first_field)                           \
  do {                                                                       \
    if ((p) == NULL)                                                         \
      return fail(RDT_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);          \
    if ((p)->struct_size < offsetof(type, first_field))                      \
      return fail(RDT_ERR_INVALID_ARGUMENT,                                   \
                  "%s: " #type " struct_size %u is too small; initialize it " \
                  "with its _init function",                                 \
                  fn, (unsigned)(p)->struct_size);                           \
    REFUSE_PARTIAL_FIELD(fn, type, (p)->struct_size);                        \
  } while (0)

/* ---- runtimes ------------------------------------------------------- */

rdt_status rdt_runtime_create(const rdt_runtime_options *opts,
                              rdt_runtime **out) {
  FORK_GUARD("rdt_runtime_create");
  rdt_runtime_options full;
  rdt_runtime_options_init(&full);
  if (opts != NULL) {
    VERSIONED_IN("rdt_runtime_create", rdt_runtime_options, full, opts, name);
    if (opts->abi_version != RDT_ABI_VERSION)
      return fail(RDT_ERR_ABI_MISMATCH,
                  "rdt_runtime_create: options were built against rdt ABI "
                  "version %u, but the library implements version %u; "
                  "rebuild against this library's rdt.h",
                  (unsigned)opts->abi_version, (unsigned)RDT_ABI_VERSION);
  }
  uintptr_t h = 0;
  rdt_status st = (rdt_status)rdtgo_runtime_create(&full, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_runtime *)h;
  return st;
}

rdt_status rdt_runtime_destroy(rdt_runtime *rt) {
  FORK_GUARD("rdt_runtime_destroy");
  if (rt == NULL) return RDT_OK;
  return (rdt_status)rdtgo_runtime_destroy((uintptr_t)rt);
}

rdt_status rdt_runtime_address(const rdt_runtime *rt, const char **out) {
  FORK_GUARD("rdt_runtime_address");
  return (rdt_status)rdtgo_runtime_address((uintptr_t)rt, (char **)out);
}

rdt_status rdt_runtime_take_released(rdt_runtime *rt, void **user_data,
                                     size_t capacity, size_t *count,
                                     int64_t timeout_ms) {
  FORK_GUARD("rdt_runtime_take_released");
  if (count != NULL) *count = 0;
  return (rdt_status)rdtgo_runtime_take_released(
      (uintptr_t)rt, (uintptr_t *)user_data, capacity, count, timeout_ms);
}

rdt_status rdt_runtime_stats(rdt_runtime *rt, rdt_stats *out) {
  FORK_GUARD("rdt_runtime_stats");
  CHECK_OUT_STRUCT("rdt_runtime_stats", rdt_stats, out, reserved);
  rdt_stats full;
  rdt_stats_init(&full);
  rdt_status st = (rdt_status)rdtgo_runtime_stats((uintptr_t)rt, &full);
  if (st == RDT_OK) VERSIONED_OUT(rdt_stats, out, full);
  return st;
}

/* Copies n library-sized structs (`size` bytes each) from `full` into the
 * caller's array `out`, whose elements are `stride` bytes apart (the
 * struct_size of its first element, checked by the caller): each element
 * gets the fields both sizes hold and keeps the caller's struct_size, the
 * first field of every versioned struct. */
static void copy_out_array(void *out, size_t stride, const void *full, size_t size,
                           size_t n) {
  uint32_t keep = (uint32_t)stride;
  for (size_t i = 0; i < n; i++) {
    char *dst = (char *)out + i * stride;
    memcpy(dst, (const char *)full + i * size, stride < size ? stride : size);
    memcpy(dst, &keep, sizeof keep);
  }
}

/* A Go export that lists into an array of library-sized structs. */
typedef int (*go_lister)(uintptr_t h, void *staging, size_t capacity, size_t *count);

/* Lists through a Go export into the caller's array of versioned structs.
 * The staging array holds what there is, not the caller's capacity (which
 * may be any size): sized by a first count, and again if entries appeared
 * meanwhile. The caller checked count, out and its struct_size. */
static rdt_status list_out(const char *fn, uintptr_t h, go_lister list, void *out,
                           size_t capacity, size_t *count, size_t size) {
  size_t stride = 0;
  if (capacity > 0) {
    uint32_t first_size;
    memcpy(&first_size, out, sizeof first_size);
    stride = first_size;
  }
  void *full = NULL;
  size_t staged = 0;
  rdt_status st = (rdt_status)list(h, NULL, 0, count);
  while (st == RDT_OK && staged < capacity && staged < *count) {
    staged = *count < capacity ? *count : capacity;
    free(full);
    full = calloc(staged, size);
    if (full == NULL) return fail(RDT_ERR_NO_MEMORY, "%s: out of memory", fn);
    st = (rdt_status)list(h, full, staged, count);
  }
  if (st == RDT_OK) copy_out_array(out, stride, full, size, *count < staged ? *count : staged);
  free(full);
  return st;
}

static int list_histograms(uintptr_t h, void *p, size_t c, size_t *n) {
  return rdtgo_runtime_fetch_histograms(h, p, c, n, 0);
}
/* For an array too old to hold rdt_fetch_histogram.direction: its caller
 * would read a write's entry as a get's. */
static int list_get_histograms(uintptr_t h, void *p, size_t c, size_t *n) {
  return rdtgo_runtime_fetch_histograms(h, p, c, n, 1);
}
static int list_transports(uintptr_t h, void *p, size_t c, size_t *n) {
  return rdtgo_transport_list(h, p, c, n);
}
static int list_unavailable(uintptr_t h, void *p, size_t c, size_t *n) {
  return rdtgo_transport_list_unavailable(h, p, c, n);
}

rdt_status rdt_runtime_fetch_histograms(rdt_runtime *rt, rdt_fetch_histogram *out,
                                        size_t capacity, size_t *count) {
  FORK_GUARD("rdt_runtime_fetch_histograms");
  if (count == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT, "rdt_runtime_fetch_histograms: count is NULL");
  if (capacity > 0 && out == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT,
                "rdt_runtime_fetch_histograms: out is NULL but capacity is %zu", capacity);
  go_lister list = list_histograms;
  if (capacity > 0) {
    CHECK_OUT_STRUCT("rdt_runtime_fetch_histograms", rdt_fetch_histogram, out, size_class);
    if (out->struct_size < offsetof(rdt_fetch_histogram, direction) + sizeof out->direction)
      list = list_get_histograms;
  }
  return list_out("rdt_runtime_fetch_histograms", (uintptr_t)rt, list, out, capacity, count,
                  sizeof(rdt_fetch_histogram));
}

/* ---- objects and refs ----------------------------------------------- */

rdt_status rdt_put(rdt_runtime *rt, const rdt_tensor *tensors,
                   size_t num_tensors, const char *transport,
                   rdt_release_fn release, void *user_data, rdt_ref **out) {
  FORK_GUARD("rdt_put");
  uintptr_t h = 0;
  rdt_status st = (rdt_status)rdtgo_put(
      (uintptr_t)rt, (rdt_tensor *)tensors, num_tensors, (char *)transport,
      release, (uintptr_t)user_data, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_ref *)h;
  return st;
}

rdt_status rdt_ref_clone(const rdt_ref *ref, rdt_ref **out) {
  FORK_GUARD("rdt_ref_clone");
  uintptr_t h = 0;
  rdt_status st = (rdt_status)rdtgo_ref_clone((uintptr_t)ref, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_ref *)h;
  return st;
}

rdt_status rdt_ref_release(rdt_ref *ref) {
  FORK_GUARD("rdt_ref_release");
  if (ref == NULL) return RDT_OK;
  return (rdt_status)rdtgo_ref_release((uintptr_t)ref);
}

rdt_status rdt_ref_release_ex(rdt_ref *ref, uint32_t flags) {
  FORK_GUARD("rdt_ref_release_ex");
  if (ref == NULL) return RDT_OK;
  return (rdt_status)rdtgo_ref_release_ex((uintptr_t)ref, flags);
}

rdt_status rdt_ref_serialize(const rdt_ref *ref, void **out_bytes,
                             size_t *out_size) {
  FORK_GUARD("rdt_ref_serialize");
  return (rdt_status)rdtgo_ref_serialize((uintptr_t)ref, out_bytes, out_size);
}

rdt_status rdt_ref_deserialize(rdt_runtime *rt, const void *bytes, size_t size,
                               rdt_ref **out) {
  FORK_GUARD("rdt_ref_deserialize");
  uintptr_t h = 0;
  rdt_status st = (rdt_status)rdtgo_ref_deserialize(
      (uintptr_t)rt, (void *)bytes, size, 0, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_ref *)h;
  return st;
}

rdt_status rdt_ref_deserialize_ex(rdt_runtime *rt, const void *bytes,
                                  size_t size,
                                  const rdt_deserialize_options *opts,
                                  rdt_ref **out) {
  FORK_GUARD("rdt_ref_deserialize_ex");
  rdt_deserialize_options full;
  rdt_deserialize_options_init(&full);
  if (opts != NULL)
    VERSIONED_IN("rdt_ref_deserialize_ex", rdt_deserialize_options, full, opts,
                 timeout_ms);
  uintptr_t h = 0;
  rdt_status st = (rdt_status)rdtgo_ref_deserialize(
      (uintptr_t)rt, (void *)bytes, size, full.timeout_ms, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_ref *)h;
  return st;
}

rdt_status rdt_ref_info(const rdt_ref *ref, rdt_object_info *out) {
  FORK_GUARD("rdt_ref_info");
  CHECK_OUT_STRUCT("rdt_ref_info", rdt_object_info, out, num_tensors);
  rdt_object_info full;
  rdt_object_info_init(&full);
  rdt_status st = (rdt_status)rdtgo_ref_info((uintptr_t)ref, &full);
  if (st == RDT_OK) VERSIONED_OUT(rdt_object_info, out, full);
  return st;
}

rdt_status rdt_ref_tensor_info(const rdt_ref *ref, uint32_t index,
                               rdt_tensor_info *out) {
  FORK_GUARD("rdt_ref_tensor_info");
  CHECK_OUT_STRUCT("rdt_ref_tensor_info", rdt_tensor_info, out, ndim);
  rdt_tensor_info full;
  rdt_tensor_info_init(&full);
  rdt_status st =
      (rdt_status)rdtgo_ref_tensor_info((uintptr_t)ref, index, &full);
  if (st == RDT_OK) VERSIONED_OUT(rdt_tensor_info, out, full);
  return st;
}

/* ---- gets and pending operations ------------------------------------ */

/* Defines name(fn, opts, full, use), which takes possibly-NULL,
 * possibly-older options of `type` (whose first versioned field is
 * `reserved`) as the library's own: *full is set, and *use is full or
 * NULL. */
#define OPTIONS_IN(name, type)                                               \
  static rdt_status name(const char *fn, const type *opts, type *full,       \
                         type **use) {                                       \
    *use = NULL;                                                             \
    if (opts == NULL) return RDT_OK;                                         \
    type##_init(full);                                                       \
    VERSIONED_IN(fn, type, *full, opts, reserved);                           \
    *use = full;                                                             \
    return RDT_OK;                                                           \
  }

OPTIONS_IN(get_options, rdt_get_options)
OPTIONS_IN(write_options, rdt_write_options)

rdt_status rdt_get_start(rdt_runtime *rt, rdt_ref *const *refs,
                         size_t num_refs, const rdt_tensor *targets,
                         size_t num_targets, const rdt_get_options *opts,
                         rdt_pending **out) {
  FORK_GUARD("rdt_get_start");
  rdt_get_options full, *use;
  rdt_status st = get_options("rdt_get_start", opts, &full, &use);
  if (st != RDT_OK) return st;
  uintptr_t h = 0;
  st = (rdt_status)rdtgo_get_start((uintptr_t)rt, (uintptr_t *)refs,
                                   num_refs, (rdt_tensor *)targets,
                                   num_targets, use, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_pending *)h;
  return st;
}

rdt_status rdt_pending_wait(rdt_pending *pending, int64_t timeout_ms) {
  FORK_GUARD("rdt_pending_wait");
  return (rdt_status)rdtgo_pending_wait((uintptr_t)pending, timeout_ms);
}

rdt_status rdt_pending_abort(rdt_pending *pending) {
  FORK_GUARD("rdt_pending_abort");
  return (rdt_status)rdtgo_pending_abort((uintptr_t)pending);
}

rdt_status rdt_pending_event_fd(rdt_pending *pending, int *fd_out) {
  FORK_GUARD("rdt_pending_event_fd");
  return (rdt_status)rdtgo_pending_event_fd((uintptr_t)pending, fd_out);
}

rdt_status rdt_pending_free(rdt_pending *pending) {
  FORK_GUARD("rdt_pending_free");
  if (pending == NULL) return RDT_OK;
  return (rdt_status)rdtgo_pending_free((uintptr_t)pending);
}

rdt_status rdt_get(rdt_runtime *rt, rdt_ref *const *refs, size_t num_refs,
                   const rdt_tensor *targets, size_t num_targets,
                   const rdt_get_options *opts, int64_t timeout_ms) {
  FORK_GUARD("rdt_get");
  rdt_get_options full, *use;
  rdt_status st = get_options("rdt_get", opts, &full, &use);
  if (st != RDT_OK) return st;
  return (rdt_status)rdtgo_get((uintptr_t)rt, (uintptr_t *)refs, num_refs,
                               (rdt_tensor *)targets, num_targets, use,
                               timeout_ms);
}

/* ---- views -------------------------------------------------------------- */

rdt_status rdt_view_open(rdt_runtime *rt, const rdt_ref *ref,
                         const rdt_view_options *opts, int64_t timeout_ms,
                         rdt_view **out) {
  FORK_GUARD("rdt_view_open");
  rdt_view_options full, *use = NULL;
  if (opts != NULL) {
    rdt_view_options_init(&full);
    VERSIONED_IN("rdt_view_open", rdt_view_options, full, opts, flags);
    use = &full;
  }
  uintptr_t h = 0;
  rdt_status st = (rdt_status)rdtgo_view_open((uintptr_t)rt, (uintptr_t)ref,
                                              use, timeout_ms,
                                              out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_view *)h;
  return st;
}

_Static_assert(sizeof(void *) == sizeof(uintptr_t), "rdt_view_data fills void* slots as uintptr_t");

rdt_status rdt_view_data(const rdt_view *view, void **data_out, size_t count,
                         int *out_mapped) {
  FORK_GUARD("rdt_view_data");
  /* void* and uintptr_t have one size and representation here: Go fills
   * the array as integers (see capi.h). */
  return (rdt_status)rdtgo_view_data((uintptr_t)view, (uintptr_t *)data_out,
                                     count, out_mapped);
}

rdt_status rdt_view_sizes(const rdt_view *view, uint64_t *nbytes_out,
                          size_t count) {
  FORK_GUARD("rdt_view_sizes");
  return (rdt_status)rdtgo_view_sizes((uintptr_t)view, nbytes_out, count);
}

rdt_status rdt_view_release(rdt_view *view) {
  FORK_GUARD("rdt_view_release");
  if (view == NULL) return RDT_OK;
  return (rdt_status)rdtgo_view_release((uintptr_t)view);
}

/* ---- prepared transfers ---------------------------------------------- */

rdt_status rdt_prepare_get(rdt_runtime *rt, rdt_ref *const *refs,
                           size_t num_refs, const rdt_tensor *targets,
                           size_t num_targets, const rdt_get_options *opts,
                           rdt_prepared **out) {
  FORK_GUARD("rdt_prepare_get");
  rdt_get_options full, *use;
  rdt_status st = get_options("rdt_prepare_get", opts, &full, &use);
  if (st != RDT_OK) return st;
  uintptr_t h = 0;
  st = (rdt_status)rdtgo_prepare_get((uintptr_t)rt, (uintptr_t *)refs,
                                     num_refs, (rdt_tensor *)targets,
                                     num_targets, use, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_prepared *)h;
  return st;
}

rdt_status rdt_prepared_run(rdt_prepared *prepared, uint64_t tag,
                            int64_t timeout_ms) {
  FORK_GUARD("rdt_prepared_run");
  return (rdt_status)rdtgo_prepared_run((uintptr_t)prepared, tag, timeout_ms);
}

rdt_status rdt_prepared_free(rdt_prepared *prepared) {
  FORK_GUARD("rdt_prepared_free");
  if (prepared == NULL) return RDT_OK;
  return (rdt_status)rdtgo_prepared_free((uintptr_t)prepared);
}

/* ---- writing into exposed objects ----------------------------------- */

rdt_status rdt_expose(rdt_runtime *rt, const rdt_tensor *tensors,
                      size_t num_tensors, const char *transport,
                      rdt_release_fn release, void *user_data, rdt_ref **out) {
  FORK_GUARD("rdt_expose");
  uintptr_t h = 0;
  rdt_status st = (rdt_status)rdtgo_expose(
      (uintptr_t)rt, (rdt_tensor *)tensors, num_tensors, (char *)transport,
      release, (uintptr_t)user_data, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_ref *)h;
  return st;
}

rdt_status rdt_write_start(rdt_runtime *rt, rdt_ref *const *refs,
                           size_t num_refs, const rdt_tensor *sources,
                           size_t num_sources, const rdt_write_options *opts,
                           rdt_pending **out) {
  FORK_GUARD("rdt_write_start");
  rdt_write_options full, *use;
  rdt_status st = write_options("rdt_write_start", opts, &full, &use);
  if (st != RDT_OK) return st;
  uintptr_t h = 0;
  st = (rdt_status)rdtgo_write_start((uintptr_t)rt, (uintptr_t *)refs,
                                     num_refs, (rdt_tensor *)sources,
                                     num_sources, use, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_pending *)h;
  return st;
}

rdt_status rdt_write(rdt_runtime *rt, rdt_ref *const *refs, size_t num_refs,
                     const rdt_tensor *sources, size_t num_sources,
                     const rdt_write_options *opts, int64_t timeout_ms) {
  FORK_GUARD("rdt_write");
  rdt_write_options full, *use;
  rdt_status st = write_options("rdt_write", opts, &full, &use);
  if (st != RDT_OK) return st;
  return (rdt_status)rdtgo_write((uintptr_t)rt, (uintptr_t *)refs, num_refs,
                                 (rdt_tensor *)sources, num_sources, use,
                                 timeout_ms);
}

rdt_status rdt_prepare_write(rdt_runtime *rt, rdt_ref *const *refs,
                             size_t num_refs, const rdt_tensor *sources,
                             size_t num_sources, const rdt_write_options *opts,
                             rdt_prepared **out) {
  FORK_GUARD("rdt_prepare_write");
  rdt_write_options full, *use;
  rdt_status st = write_options("rdt_prepare_write", opts, &full, &use);
  if (st != RDT_OK) return st;
  uintptr_t h = 0;
  st = (rdt_status)rdtgo_prepare_write((uintptr_t)rt, (uintptr_t *)refs,
                                       num_refs, (rdt_tensor *)sources,
                                       num_sources, use, out ? &h : NULL);
  if (st == RDT_OK) *out = (rdt_prepared *)h;
  return st;
}

rdt_status rdt_write_notice_wait(rdt_ref *exposed, int64_t timeout_ms,
                                 rdt_write_notice *out) {
  FORK_GUARD("rdt_write_notice_wait");
  CHECK_OUT_STRUCT("rdt_write_notice_wait", rdt_write_notice, out, status);
  rdt_write_notice full;
  rdt_write_notice_init(&full);
  rdt_status st = (rdt_status)rdtgo_write_notice_wait((uintptr_t)exposed,
                                                      timeout_ms, &full);
  if (st == RDT_OK) VERSIONED_OUT(rdt_write_notice, out, full);
  return st;
}

rdt_status rdt_write_notice_event_fd(rdt_ref *exposed, int *fd_out) {
  FORK_GUARD("rdt_write_notice_event_fd");
  return (rdt_status)rdtgo_write_notice_event_fd((uintptr_t)exposed, fd_out);
}

rdt_status rdt_ref_revoke_writes(rdt_ref *exposed, int64_t timeout_ms) {
  FORK_GUARD("rdt_ref_revoke_writes");
  return (rdt_status)rdtgo_ref_revoke_writes((uintptr_t)exposed, timeout_ms);
}

rdt_status rdt_wait_tensor_freed(rdt_runtime *rt, const void *data,
                                 int64_t timeout_ms) {
  FORK_GUARD("rdt_wait_tensor_freed");
  return (rdt_status)rdtgo_wait_tensor_freed((uintptr_t)rt, (uintptr_t)data,
                                             timeout_ms);
}

/* ---- transports ----------------------------------------------------- */

/* Whether a caller's vtable is large enough to hold free_user_data. */
static int holds_free_user_data(const rdt_transport_vtable *vtable) {
  return vtable->struct_size >= offsetof(rdt_transport_vtable, free_user_data) +
                                    sizeof vtable->free_user_data;
}

static rdt_status register_transport(rdt_runtime *rt, const char *name,
                                     const int32_t *devices, size_t num_devices,
                                     const rdt_transport_vtable *vtable) {
  FORK_GUARD("rdt_register_transport");
  if (vtable == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT, "rdt_register_transport: vtable is NULL");
  if (!holds_free_user_data(vtable))
    return fail(RDT_ERR_INVALID_ARGUMENT,
                "rdt_register_transport: vtable struct_size %u is too small; "
                "initialize it with rdt_transport_vtable_init()",
                (unsigned)vtable->struct_size);
  /* A size ending inside a callback would copy half a pointer: a transport
   * that registers and crashes at the first call of it. */
  REFUSE_PARTIAL_FIELD("rdt_register_transport", rdt_transport_vtable, vtable->struct_size);
  /* The runtime keeps its own copy for as long as the transport lives. */
  rdt_transport_vtable *copy = malloc(sizeof *copy);
  if (copy == NULL)
    return fail(RDT_ERR_NO_MEMORY, "rdt_register_transport: out of memory");
  rdt_transport_vtable_init(copy);
  memcpy(copy, vtable, vtable->struct_size < sizeof *copy ? vtable->struct_size
                                                          : sizeof *copy);
  copy->struct_size = sizeof *copy;
  /* On success the runtime owns `copy` and frees it with the user data
   * when the transport closes; on failure Go has kept neither. */
  rdt_status st = (rdt_status)rdtgo_register_transport(
      (uintptr_t)rt, (char *)name, (int32_t *)devices, num_devices, copy);
  if (st != RDT_OK) free(copy);
  return st;
}

/* The one place a refused registration hands the user data back, as rdt.h
 * promises: on every failure, unless the vtable is NULL or too small to
 * hold free_user_data. */
rdt_status rdt_register_transport(rdt_runtime *rt, const char *name,
                                  const int32_t *devices, size_t num_devices,
                                  const rdt_transport_vtable *vtable) {
  rdt_status st = register_transport(rt, name, devices, num_devices, vtable);
  if (st != RDT_OK && vtable != NULL && holds_free_user_data(vtable) &&
      vtable->free_user_data != NULL)
    vtable->free_user_data(vtable->user_data);
  return st;
}

rdt_status rdt_transport_list(rdt_runtime *rt, rdt_transport_info *infos,
                              size_t capacity, size_t *count) {
  FORK_GUARD("rdt_transport_list");
  if (count == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT, "rdt_transport_list: count is NULL");
  if (capacity > 0 && infos == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT,
                "rdt_transport_list: infos is NULL but capacity is %zu", capacity);
  if (capacity > 0) CHECK_OUT_STRUCT("rdt_transport_list", rdt_transport_info, infos, flags);
  return list_out("rdt_transport_list", (uintptr_t)rt, list_transports, infos, capacity, count,
                  sizeof(rdt_transport_info));
}

rdt_status rdt_transport_list_unavailable(rdt_runtime *rt,
                                          rdt_unavailable_transport *infos,
                                          size_t capacity, size_t *count) {
  FORK_GUARD("rdt_transport_list_unavailable");
  if (count == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT, "rdt_transport_list_unavailable: count is NULL");
  if (capacity > 0 && infos == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT,
                "rdt_transport_list_unavailable: infos is NULL but capacity is %zu", capacity);
  if (capacity > 0)
    CHECK_OUT_STRUCT("rdt_transport_list_unavailable", rdt_unavailable_transport, infos, name);
  return list_out("rdt_transport_list_unavailable", (uintptr_t)rt, list_unavailable, infos,
                  capacity, count, sizeof(rdt_unavailable_transport));
}

/* Made once by Go and kept for the life of the process. A child forked
 * after the library was loaded gets the text made before the fork, or a
 * note: it must not call into Go. */
static const char *build_info;
static pthread_once_t build_info_once = PTHREAD_ONCE_INIT;

static void make_build_info(void) { build_info = rdtgo_build_info(); }

const char *rdt_build_info(void) {
  if (forked_child)
    return build_info ? build_info
                      : "error=unknown: this process was forked after librdt was loaded";
  pthread_once(&build_info_once, make_build_info);
  return build_info ? build_info : "";
}

/* ---- groups --------------------------------------------------------- */

rdt_status rdt_group_create(rdt_runtime *rt, const char *name,
                            int32_t world_size, int32_t rank,
                            const char *rank0_address, int32_t device,
                            const rdt_group_options *opts,
                            int64_t timeout_ms) {
  FORK_GUARD("rdt_group_create");
  rdt_group_options full;
  rdt_group_options_init(&full);
  if (opts != NULL) VERSIONED_IN("rdt_group_create", rdt_group_options, full, opts, reserved);
  return (rdt_status)rdtgo_group_create((uintptr_t)rt, (char *)name, world_size, rank,
                                        (char *)rank0_address, device,
                                        (char *)full.backend, timeout_ms);
}

rdt_status rdt_group_destroy(rdt_runtime *rt, const char *name) {
  FORK_GUARD("rdt_group_destroy");
  return (rdt_status)rdtgo_group_destroy((uintptr_t)rt, (char *)name);
}

/* ---- log capture ------------------------------------------------------ */

rdt_status rdt_log_capture(int enable) {
  FORK_GUARD("rdt_log_capture");
  return (rdt_status)rdtgo_log_capture(enable);
}

rdt_status rdt_log_set_level(int32_t level) {
  FORK_GUARD("rdt_log_set_level");
  return (rdt_status)rdtgo_log_set_level(level);
}

rdt_status rdt_log_take(rdt_log_record *records, size_t capacity,
                        size_t *count, int64_t timeout_ms) {
  FORK_GUARD("rdt_log_take");
  if (count == NULL)
    return fail(RDT_ERR_INVALID_ARGUMENT, "rdt_log_take: count is NULL");
  *count = 0;
  if (capacity == 0)
    return fail(RDT_ERR_INVALID_ARGUMENT, "rdt_log_take: capacity is 0");
  CHECK_OUT_STRUCT("rdt_log_take", rdt_log_record, records, level);
  size_t stride = records->struct_size;
  if (capacity > RDT_LOG_QUEUE_MAX) capacity = RDT_LOG_QUEUE_MAX;
  rdt_log_record *full = calloc(capacity, sizeof *full);
  if (full == NULL) return fail(RDT_ERR_NO_MEMORY, "rdt_log_take: out of memory");
  rdt_status st = (rdt_status)rdtgo_log_take(full, capacity, count, timeout_ms);
  if (st == RDT_OK) copy_out_array(records, stride, full, sizeof *full, *count);
  free(full);
  return st;
}

/* The C compiler that built this file (and the rest of the library's C). */
const char *rdtc_cc_version(void) {
#if defined(__clang__) || !defined(__GNUC__)
  return __VERSION__;
#else
  return "gcc " __VERSION__;
#endif
}
