/* Helpers for the C ABI tests: checks that print where and why they
 * failed, and test transports written in C against rdt.h. */
#ifndef RDT_TEST_UTIL_H
#define RDT_TEST_UTIL_H

#include <rdt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,     \
              #cond);                                                      \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

#define CHECK_OK(expr)                                                     \
  do {                                                                     \
    rdt_status s_ = (expr);                                                \
    if (s_ != RDT_OK) {                                                    \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__,   \
              #expr, rdt_status_string(s_), rdt_last_error());             \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

/* The call fails with `want` and leaves a message. */
#define CHECK_STATUS(expr, want)                                           \
  do {                                                                     \
    rdt_status s_ = (expr);                                                \
    if (s_ != (want)) {                                                    \
      fprintf(stderr, "%s:%d: %s returned %s, want %s (%s)\n", __FILE__,   \
              __LINE__, #expr, rdt_status_string(s_),                      \
              rdt_status_string(want), rdt_last_error());                  \
      exit(1);                                                             \
    }                                                                      \
    if ((want) != RDT_OK && rdt_last_error()[0] == '\0') {                 \
      fprintf(stderr, "%s:%d: %s failed without a message\n", __FILE__,    \
              __LINE__, #expr);                                            \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

#define CHECK_MSG(substr)                                                  \
  do {                                                                     \
    if (strstr(rdt_last_error(), (substr)) == NULL) {                      \
      fprintf(stderr, "%s:%d: last error \"%s\" lacks \"%s\"\n", __FILE__, \
              __LINE__, rdt_last_error(), (substr));                       \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

/* A float32 vector tensor over `data`. `shape` must outlive the tensor. */
static inline rdt_tensor f32_tensor(float *data, int64_t *shape) {
  rdt_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = RDT_DEVICE_CPU;
  t.ndim = 1;
  t.dtype.code = RDT_DTYPE_FLOAT;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* A uint8 vector tensor over `data`. `shape` must outlive the tensor. */
static inline rdt_tensor u8_tensor(uint8_t *data, int64_t *shape) {
  rdt_tensor t = f32_tensor(NULL, shape);
  t.data = data;
  t.dtype.code = RDT_DTYPE_UINT;
  t.dtype.bits = 8;
  return t;
}

/* A runtime with the socket control plane and the built-in transports. */
static inline rdt_runtime *socket_runtime(const char *name) {
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.name = name;
  rdt_runtime *rt = NULL;
  CHECK_OK(rdt_runtime_create(&opts, &rt));
  return rt;
}

static inline rdt_runtime *new_runtime(const char *name) {
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.name = name;
  /* The C tests drive their own transports; built-ins have test_builtin.c. */
  opts.flags = RDT_RUNTIME_IN_PROCESS | RDT_RUNTIME_NO_BUILTIN_TRANSPORTS;
  rdt_runtime *rt = NULL;
  CHECK_OK(rdt_runtime_create(&opts, &rt));
  return rt;
}

/* Counters and knobs shared by a test transport's callbacks. */
typedef struct test_transport {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  int extracts, gcs, recvs, sends, fetches, waits, releases, aborts, comms;
  int writes;
  int freed_user_data;
  /* Fail the Nth recv/wait or the Nth write (1-based) with this status and
   * message. */
  int fail_at;
  rdt_status fail_status;
  const char *fail_message;
  /* When set, transfers block until `open` or an abort. */
  int gated, open;
  /* Set by the writing transport's abort; wakes a gated write. */
  int write_aborted;
  /* Event log: 'f' fetch, 'w' wait, 'W' a write at the gate, for ordering
   * checks. */
  char events[256];
  int nevents;
  /* Thread that ran the last send. */
  pthread_t send_thread;
} test_transport;

void test_transport_init(test_transport *t);
void test_transport_open(test_transport *t);

/* One-sided, synchronous recv copying from the source's address (the
 * runtimes share the process). */
rdt_transport_vtable memcopy_vtable(test_transport *t);
/* memcopy that also writes into exposed objects (RDT_TRANSPORT_WRITES) and
 * serves ranges: a synchronous write callback copies the sources to the
 * addresses the owner's extract_metadata published. Abortable: abort wakes
 * a gated write, which then fails with RDT_ERR_ABORTED. */
rdt_transport_vtable memcopy_write_vtable(test_transport *t);
/* One-sided, asynchronous fetch/wait/release_request, abortable. */
rdt_transport_vtable async_vtable(test_transport *t);
/* Two-sided: send posts the bytes to a process-wide mailbox keyed by the
 * transfer id; recv takes them. Abortable. */
rdt_transport_vtable mailbox_vtable(test_transport *t);

/* Registers `vt` under `name` for CPU tensors. */
static inline void register_cpu(rdt_runtime *rt, const char *name,
                                rdt_transport_vtable vt) {
  int32_t dev = RDT_DEVICE_CPU;
  CHECK_OK(rdt_register_transport(rt, name, &dev, 1, &vt));
}

/* Runtimes `na` and `nb` (new_runtime), each with its own test transport
 * (ta, tb) registered under `transport` through `vtable`. */
static inline void runtime_pair(const char *na, const char *nb,
                                const char *transport,
                                rdt_transport_vtable (*vtable)(test_transport *),
                                rdt_runtime **a, rdt_runtime **b,
                                test_transport *ta, test_transport *tb) {
  *a = new_runtime(na);
  *b = new_runtime(nb);
  test_transport_init(ta);
  test_transport_init(tb);
  register_cpu(*a, transport, vtable(ta));
  register_cpu(*b, transport, vtable(tb));
}

/* Destroys the runtimes runtime_pair made, a first. */
static inline void destroy_pair(rdt_runtime *a, rdt_runtime *b) {
  CHECK_OK(rdt_runtime_destroy(a));
  CHECK_OK(rdt_runtime_destroy(b));
}

/* Serializes `ref` in its runtime and deserializes it in `rt`. */
static inline rdt_ref *pass_ref(const rdt_ref *ref, rdt_runtime *rt) {
  void *bytes = NULL;
  size_t size = 0;
  CHECK_OK(rdt_ref_serialize(ref, &bytes, &size));
  rdt_ref *out = NULL;
  CHECK_OK(rdt_ref_deserialize(rt, bytes, size, &out));
  rdt_bytes_free(bytes);
  return out;
}

/* Puts the tensor t on `from` over transport and returns a ref to it
 * deserialized in `to` (the owner's own ref is released). */
static inline rdt_ref *put_borrowed(rdt_runtime *from, const rdt_tensor *t, const char *transport,
                                    rdt_runtime *to) {
  rdt_ref *r = NULL;
  CHECK_OK(rdt_put(from, t, 1, transport, NULL, NULL, &r));
  rdt_ref *borrowed = pass_ref(r, to);
  CHECK_OK(rdt_ref_release(r));
  return borrowed;
}

/* Exposes the tensor t on owner over transport (the owner's ref goes to
 * *exposed) and returns a ref to it deserialized in writer. */
static inline rdt_ref *expose_to(rdt_runtime *owner, const rdt_tensor *t, const char *transport,
                                 rdt_runtime *writer, rdt_ref **exposed) {
  CHECK_OK(rdt_expose(owner, t, 1, transport, NULL, NULL, exposed));
  return pass_ref(*exposed, writer);
}

/* The next write notice of `exposed`, waited for up to 30 s. */
static inline rdt_write_notice take_notice(rdt_ref *exposed) {
  rdt_write_notice n;
  rdt_write_notice_init(&n);
  CHECK_OK(rdt_write_notice_wait(exposed, 30000, &n));
  return n;
}

static inline rdt_stats stats_of(rdt_runtime *rt) {
  rdt_stats s;
  rdt_stats_init(&s);
  CHECK_OK(rdt_runtime_stats(rt, &s));
  return s;
}

/* Fills infos (MAX_LISTED entries) from rdt_transport_list; returns how
 * many transports the runtime lists (the first MAX_LISTED are filled). */
enum { MAX_LISTED = 16 };
static inline size_t list_transports(rdt_runtime *rt, rdt_transport_info *infos) {
  for (int i = 0; i < MAX_LISTED; i++) rdt_transport_info_init(&infos[i]);
  size_t n = 0;
  CHECK_OK(rdt_transport_list(rt, infos, MAX_LISTED, &n));
  return n;
}

/* Whether the runtime lists transport `name`; its entry goes to *out
 * (unless out is NULL). */
static inline int find_transport(rdt_runtime *rt, const char *name, rdt_transport_info *out) {
  rdt_transport_info infos[MAX_LISTED];
  size_t n = list_transports(rt, infos);
  for (size_t i = 0; i < n && i < MAX_LISTED; i++) {
    if (strcmp(infos[i].name, name) == 0) {
      if (out) *out = infos[i];
      return 1;
    }
  }
  return 0;
}

/* Waits (up to 10 s) until the transport's fetch was called n times: a
 * fetch's transfers start in the background, after rdt_get_start. */
static inline void wait_fetches(test_transport *t, int n) {
  for (int i = 0; i < 10000; i++) {
    pthread_mutex_lock(&t->mu);
    int got = t->fetches;
    pthread_mutex_unlock(&t->mu);
    if (got >= n) return;
    usleep(1000);
  }
  CHECK(!"the transfer started");
}

#endif
