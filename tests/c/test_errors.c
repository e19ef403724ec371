/* Every bad input returns a status and a message, never a crash; a failing
 * transport's error reaches the caller and leaks nothing. */
#include <unistd.h>

#include "test_util.h"

static rdt_runtime *a, *b;
static test_transport ta, tb;
static float data[16];
static int64_t shape16[1] = {16};

static rdt_ref *put16(const char *transport) {
  rdt_tensor t = f32_tensor(data, shape16);
  rdt_ref *ref = NULL;
  CHECK_OK(rdt_put(a, &t, 1, transport, NULL, NULL, &ref));
  return ref;
}

static void test_status_strings(void) {
  CHECK(strcmp(rdt_status_string(RDT_OK), "RDT_OK") == 0);
  CHECK(strcmp(rdt_status_string(RDT_ERR_TIMEOUT), "RDT_ERR_TIMEOUT") == 0);
  CHECK(strcmp(rdt_status_string(RDT_ERR_PEER_UNAVAILABLE), "RDT_ERR_PEER_UNAVAILABLE") == 0);
  CHECK(strcmp(rdt_status_string((rdt_status)-1234), "RDT_ERR_USER") == 0);
  CHECK(strcmp(rdt_status_string((rdt_status)-77), "RDT_ERR_UNKNOWN") == 0);
  CHECK(strcmp(rdt_status_string((rdt_status)5), "RDT_ERR_UNKNOWN") == 0);
}

static void test_runtime_options(void) {
  rdt_runtime *rt = NULL;
  CHECK_STATUS(rdt_runtime_create(NULL, NULL), RDT_ERR_INVALID_ARGUMENT);
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.struct_size = 4;
  CHECK_STATUS(rdt_runtime_create(&opts, &rt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("struct_size");
  rdt_runtime_options_init(&opts);
  opts.abi_version = RDT_ABI_VERSION + 1;
  CHECK_STATUS(rdt_runtime_create(&opts, &rt), RDT_ERR_ABI_MISMATCH);
  rdt_runtime_options_init(&opts);
  opts.log_level = 42;
  CHECK_STATUS(rdt_runtime_create(&opts, &rt), RDT_ERR_INVALID_ARGUMENT);
  rdt_runtime_options_init(&opts);
  opts.flags = 1u << 30;
  CHECK_STATUS(rdt_runtime_create(&opts, &rt), RDT_ERR_INVALID_ARGUMENT);
  rdt_runtime_options_init(&opts);
  opts.lease_ms = -5;
  CHECK_STATUS(rdt_runtime_create(&opts, &rt), RDT_ERR_INVALID_ARGUMENT);
  CHECK(rt == NULL);
  /* NULL options mean defaults. */
  CHECK_OK(rdt_runtime_create(NULL, &rt));
  const char *addr = NULL;
  CHECK_OK(rdt_runtime_address(rt, &addr));
  CHECK(addr != NULL && strlen(addr) > 0);
  CHECK_STATUS(rdt_runtime_address(rt, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_runtime_destroy(rt));
  /* Destroyed: the handle is gone. */
  CHECK_STATUS(rdt_runtime_destroy(rt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_runtime_address(rt, &addr), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_runtime_destroy(NULL));
}

static void test_bad_handles(void) {
  rdt_ref *ref = put16(NULL), *out = NULL;
  rdt_runtime *bogus_rt = (rdt_runtime *)(uintptr_t)0xdeadbeef;
  rdt_ref *bogus_ref = (rdt_ref *)(uintptr_t)0x7777777;
  CHECK_STATUS(rdt_ref_clone(bogus_ref, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("not a valid handle");
  CHECK_STATUS(rdt_ref_clone(NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_ref_clone(ref, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_put(bogus_rt, NULL, 0, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  /* A ref handle is not a runtime handle, and the reverse. */
  CHECK_STATUS(rdt_put((rdt_runtime *)ref, NULL, 0, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("another kind");
  CHECK_STATUS(rdt_ref_release((rdt_ref *)a), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_pending_wait((rdt_pending *)ref, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_pending_abort(NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_pending_free(NULL));
  /* Double release. */
  CHECK_OK(rdt_ref_release(ref));
  CHECK_STATUS(rdt_ref_release(ref), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_ref_release(NULL));
  /* A released ref in every call that takes one. */
  void *bytes;
  size_t size;
  CHECK_STATUS(rdt_ref_serialize(ref, &bytes, &size), RDT_ERR_INVALID_ARGUMENT);
  rdt_object_info info;
  rdt_object_info_init(&info);
  CHECK_STATUS(rdt_ref_info(ref, &info), RDT_ERR_INVALID_ARGUMENT);
  float out_data[16];
  rdt_tensor target = f32_tensor(out_data, shape16);
  CHECK_STATUS(rdt_get(a, &ref, 1, &target, 1, NULL, 100), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("refs[0]");
  CHECK_STATUS(rdt_wait_tensor_freed(NULL, data, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_runtime_stats(a, NULL), RDT_ERR_INVALID_ARGUMENT);
  rdt_stats st;
  rdt_stats_init(&st);
  st.struct_size = 2;
  CHECK_STATUS(rdt_runtime_stats(a, &st), RDT_ERR_INVALID_ARGUMENT);
}

static void test_bad_tensors(void) {
  rdt_ref *out = NULL;
  rdt_tensor t = f32_tensor(data, shape16);
  CHECK_STATUS(rdt_put(a, NULL, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_put(a, &t, 1, NULL, NULL, NULL, NULL), RDT_ERR_INVALID_ARGUMENT);

  rdt_tensor bad = t;
  bad.ndim = -1;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("ndim");
  bad = t;
  bad.ndim = RDT_MAX_NDIM + 1;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  bad = t;
  bad.shape = NULL;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("shape is NULL");
  int64_t negative[1] = {-3};
  bad = t;
  bad.shape = negative;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("negative");
  int64_t huge[2] = {INT64_MAX / 2, 16};
  bad = t;
  bad.ndim = 2;
  bad.shape = huge;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("too large");
  bad = t;
  bad.data = NULL;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("data is NULL");
  bad = t;
  bad.dtype.bits = 0;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  bad = t;
  bad.device.device_type = 0;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  /* Non-contiguous: a transposed 4x4 view. */
  int64_t shape2[2] = {4, 4}, transposed[2] = {1, 4}, compact[2] = {4, 1};
  bad = t;
  bad.ndim = 2;
  bad.shape = shape2;
  bad.strides = transposed;
  CHECK_STATUS(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("contiguous");
  bad.strides = compact; /* explicit compact strides are fine */
  CHECK_OK(rdt_put(a, &bad, 1, NULL, NULL, NULL, &out));
  CHECK_OK(rdt_ref_release(out));
  /* Unknown transport; a transport that does not move CPU memory. */
  CHECK_STATUS(rdt_put(a, &t, 1, "no_such", NULL, NULL, &out), RDT_ERR_NOT_FOUND);
  CHECK_MSG("no_such");
  CHECK_STATUS(rdt_put(a, &t, 1, "bad name!", NULL, NULL, &out), RDT_ERR_INVALID_ARGUMENT);
  static test_transport tg; /* outlives the function: registered until a is destroyed */
  test_transport_init(&tg);
  rdt_transport_vtable vt = memcopy_vtable(&tg);
  int32_t cuda = RDT_DEVICE_CUDA;
  CHECK_OK(rdt_register_transport(a, "gpu_only", &cuda, 1, &vt));
  CHECK_STATUS(rdt_put(a, &t, 1, "gpu_only", NULL, NULL, &out), RDT_ERR_UNSUPPORTED);
  CHECK(stats_of(a).objects == 0);
}

static void test_bad_targets(void) {
  rdt_ref *ref = put16("memcopy");
  rdt_ref *borrowed = pass_ref(ref, b);
  float out[16];
  int64_t wrong_shape[1] = {15}, shape2[2] = {4, 4}, strided[2] = {1, 4};
  rdt_tensor target = f32_tensor(out, shape16), bad;
  rdt_pending *f = NULL;

  CHECK_STATUS(rdt_get_start(b, &borrowed, 1, &target, 1, NULL, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_get_start(b, &borrowed, 1, &target, 2, NULL, &f), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_get_start(b, &borrowed, 1, &target, 0, NULL, &f), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("0 targets");
  CHECK_STATUS(rdt_get_start(b, NULL, 1, &target, 1, NULL, &f), RDT_ERR_INVALID_ARGUMENT);
  bad = target;
  bad.shape = wrong_shape;
  CHECK_STATUS(rdt_get(b, &borrowed, 1, &bad, 1, NULL, 100), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("shape");
  bad = target;
  bad.dtype.code = RDT_DTYPE_INT;
  CHECK_STATUS(rdt_get(b, &borrowed, 1, &bad, 1, NULL, 100), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("dtype");
  bad = target;
  bad.device.device_type = RDT_DEVICE_ROCM; /* receives cross only host and CUDA memory */
  CHECK_STATUS(rdt_get(b, &borrowed, 1, &bad, 1, NULL, 100), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("device");
  bad = target;
  bad.ndim = 2;
  bad.shape = shape2;
  bad.strides = strided;
  CHECK_STATUS(rdt_get(b, &borrowed, 1, &bad, 1, NULL, 100), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("contiguous");
  rdt_get_options fo;
  rdt_get_options_init(&fo);
  fo.transport = "nope";
  CHECK_STATUS(rdt_get(b, &borrowed, 1, &target, 1, &fo, 100), RDT_ERR_NOT_FOUND);
  fo.struct_size = 1;
  CHECK_STATUS(rdt_get(b, &borrowed, 1, &target, 1, &fo, 100), RDT_ERR_INVALID_ARGUMENT);
  /* A ref of runtime a cannot be fetched by runtime b's handle set. */
  CHECK_STATUS(rdt_get(b, &ref, 1, &target, 1, NULL, 100), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("belongs to runtime");
  CHECK(tb.recvs == 0);
  /* Info of a bad index. */
  rdt_tensor_info ti;
  rdt_tensor_info_init(&ti);
  CHECK_STATUS(rdt_ref_tensor_info(borrowed, 1, &ti), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_ref_tensor_info(borrowed, 0, NULL), RDT_ERR_INVALID_ARGUMENT);
  CHECK_OK(rdt_ref_release(borrowed));
  CHECK_OK(rdt_ref_release(ref));
}

static void test_bad_bytes(void) {
  rdt_ref *ref = put16("memcopy");
  void *bytes;
  size_t size;
  CHECK_OK(rdt_ref_serialize(ref, &bytes, &size));
  CHECK_STATUS(rdt_ref_serialize(ref, NULL, &size), RDT_ERR_INVALID_ARGUMENT);
  rdt_ref *out = NULL;
  unsigned char *copy = malloc(size);
  /* Every truncation. */
  for (size_t n = 0; n < size; n++) {
    CHECK_STATUS(rdt_ref_deserialize(b, bytes, n, &out), RDT_ERR_CORRUPT);
  }
  /* Every corrupted byte. */
  for (size_t i = 0; i < size; i++) {
    memcpy(copy, bytes, size);
    copy[i] ^= 0x5a;
    CHECK_STATUS(rdt_ref_deserialize(b, copy, size, &out), RDT_ERR_CORRUPT);
  }
  CHECK_STATUS(rdt_ref_deserialize(b, NULL, 10, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_ref_deserialize(b, bytes, size, NULL), RDT_ERR_INVALID_ARGUMENT);
  /* Oversized: refused without reading. */
  CHECK_STATUS(rdt_ref_deserialize(b, bytes, (size_t)1 << 40, &out), RDT_ERR_CORRUPT);
  CHECK_STATUS(rdt_ref_deserialize(b, "not a ref at all", 16, &out), RDT_ERR_CORRUPT);
  CHECK_MSG("magic");
  /* The good bytes still work after all that. */
  CHECK_OK(rdt_ref_deserialize(b, bytes, size, &out));
  CHECK_OK(rdt_ref_release(out));
  /* With options: NULL, the default (0), a bound, none; an older, smaller
   * struct is read up to its size; a struct_size below the header is
   * refused by name. */
  rdt_deserialize_options dopts;
  rdt_deserialize_options_init(&dopts);
  CHECK(dopts.timeout_ms == 0);
  CHECK_OK(rdt_ref_deserialize_ex(b, bytes, size, NULL, &out));
  CHECK_OK(rdt_ref_release(out));
  int64_t timeouts[] = {0, 5000, -1};
  for (size_t i = 0; i < sizeof timeouts / sizeof timeouts[0]; i++) {
    dopts.timeout_ms = timeouts[i];
    CHECK_OK(rdt_ref_deserialize_ex(b, bytes, size, &dopts, &out));
    CHECK_OK(rdt_ref_release(out));
  }
  dopts.struct_size = (uint32_t)offsetof(rdt_deserialize_options, timeout_ms);
  CHECK_OK(rdt_ref_deserialize_ex(b, bytes, size, &dopts, &out));
  CHECK_OK(rdt_ref_release(out));
  dopts.struct_size = 4;
  CHECK_STATUS(rdt_ref_deserialize_ex(b, bytes, size, &dopts, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("struct_size");
  /* A size no header gave it, ending inside timeout_ms: refused, not half
   * read. */
  dopts.struct_size = (uint32_t)(offsetof(rdt_deserialize_options, timeout_ms) + 4);
  CHECK_STATUS(rdt_ref_deserialize_ex(b, bytes, size, &dopts, &out), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("ends inside a field");
  rdt_deserialize_options_init(&dopts);
  CHECK_STATUS(rdt_ref_deserialize_ex(b, bytes, 3, &dopts, &out), RDT_ERR_CORRUPT);
  CHECK_STATUS(rdt_ref_deserialize_ex(b, bytes, size, &dopts, NULL), RDT_ERR_INVALID_ARGUMENT);
  free(copy);
  rdt_bytes_free(bytes);
  rdt_bytes_free(NULL);
  CHECK_OK(rdt_ref_release(ref));
}

/* Each refused registration frees the user data exactly once, whichever
 * check refused it (rdt.h), and a registration that succeeds frees it only
 * when the runtime is destroyed. */
#define CHECK_REFUSED(expr, want)                                          \
  do {                                                                     \
    int before_ = t.freed_user_data;                                       \
    CHECK_STATUS(expr, want);                                              \
    CHECK(t.freed_user_data == before_ + 1);                               \
  } while (0)

static void test_bad_registration(void) {
  test_transport t;
  test_transport_init(&t);
  rdt_transport_vtable vt = memcopy_vtable(&t);
  int32_t cpu = RDT_DEVICE_CPU, zero = 0, many[RDT_MAX_DEVICES + 1];
  for (int i = 0; i <= RDT_MAX_DEVICES; i++) many[i] = RDT_DEVICE_CPU;
  CHECK_REFUSED(rdt_register_transport(a, NULL, &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_REFUSED(rdt_register_transport(a, "has space", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_REFUSED(rdt_register_transport(a, "ok", NULL, 0, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_REFUSED(rdt_register_transport(a, "ok", &cpu, 0, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_REFUSED(rdt_register_transport(a, "ok", &zero, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_REFUSED(rdt_register_transport(a, "ok", many, RDT_MAX_DEVICES + 1, &vt),
                RDT_ERR_INVALID_ARGUMENT);
  CHECK_REFUSED(rdt_register_transport(a, "MEMCOPY", &cpu, 1, &vt), RDT_ERR_ALREADY_EXISTS);
  CHECK_MSG("memcopy");
  CHECK_REFUSED(rdt_register_transport(NULL, "ok", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);
  CHECK_REFUSED(rdt_register_transport((rdt_runtime *)&t, "ok", &cpu, 1, &vt),
                RDT_ERR_INVALID_ARGUMENT); /* not a runtime handle */
  rdt_transport_vtable unknown_flags = vt;
  unknown_flags.flags |= 1u << 30;
  CHECK_REFUSED(rdt_register_transport(a, "ok", &cpu, 1, &unknown_flags), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("flags");
  rdt_transport_vtable no_recv = vt;
  no_recv.recv = NULL;
  CHECK_REFUSED(rdt_register_transport(a, "ok", &cpu, 1, &no_recv), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("neither recv");
  rdt_transport_vtable two_sided = vt;
  two_sided.flags = 0;
  CHECK_REFUSED(rdt_register_transport(a, "ok", &cpu, 1, &two_sided), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("no send");
  rdt_transport_vtable abortable = vt;
  abortable.flags |= RDT_TRANSPORT_CAN_ABORT;
  CHECK_REFUSED(rdt_register_transport(a, "ok", &cpu, 1, &abortable), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("no abort");
  rdt_transport_vtable partial = async_vtable(&t);
  partial.wait = NULL;
  CHECK_REFUSED(rdt_register_transport(a, "ok", &cpu, 1, &partial), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("together");
  /* Just large enough to hold free_user_data: refused (no recv), freed. */
  rdt_transport_vtable header_only = vt;
  header_only.struct_size = (uint32_t)offsetof(rdt_transport_vtable, extract_metadata);
  CHECK_REFUSED(rdt_register_transport(a, "ok", &cpu, 1, &header_only), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("neither recv");
  /* A runtime destroyed while its handle is still known refuses too. */
  rdt_runtime *gone = new_runtime("gone");
  CHECK_OK(rdt_runtime_destroy(gone));
  CHECK_REFUSED(rdt_register_transport(gone, "ok", &cpu, 1, &vt), RDT_ERR_INVALID_ARGUMENT);

  /* Nothing to call: a NULL vtable, or one too small to hold the field. */
  int before = t.freed_user_data;
  CHECK_STATUS(rdt_register_transport(a, "ok", &cpu, 1, NULL), RDT_ERR_INVALID_ARGUMENT);
  rdt_transport_vtable small = vt;
  small.struct_size = (uint32_t)offsetof(rdt_transport_vtable, free_user_data);
  CHECK_STATUS(rdt_register_transport(a, "ok", &cpu, 1, &small), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("struct_size");
  CHECK(t.freed_user_data == before);

  /* Success: owned by the runtime, freed once at its destroy. */
  rdt_runtime *owner = new_runtime("owner");
  CHECK_OK(rdt_register_transport(owner, "ok", &cpu, 1, &vt));
  CHECK(t.freed_user_data == before);
  CHECK_OK(rdt_runtime_destroy(owner));
  CHECK(t.freed_user_data == before + 1);
}

/* Three refs; the second transfer fails with a message; the others block
 * until aborted. The error reaches rdt_get and nothing leaks. */
static void test_failing_transport(void) {
  rdt_runtime *src, *dst;
  test_transport ts, td;
  runtime_pair("src", "dst", "async", async_vtable, &src, &dst, &ts, &td);
  td.gated = 1;
  td.fail_at = 2;
  td.fail_status = RDT_ERR_TRANSPORT;
  td.fail_message = "disk on fire";
  float in[3][16], out[3][16];
  rdt_ref *refs[3];
  rdt_tensor targets[3];
  for (int i = 0; i < 3; i++) {
    rdt_tensor t = f32_tensor(in[i], shape16);
    refs[i] = put_borrowed(src, &t, "async", dst);
    targets[i] = f32_tensor(out[i], shape16);
  }
  CHECK_STATUS(rdt_get(dst, refs, 3, targets, 3, NULL, 10000), RDT_ERR_TRANSPORT);
  CHECK_MSG("disk on fire");
  CHECK_MSG("async");
  CHECK(td.fetches == 3 && td.releases == 3);
  CHECK(td.aborts == 2);
  rdt_stats s = stats_of(dst);
  CHECK(s.fetches_active == 0 && s.transfers_failed == 3);
  CHECK(s.refs == 3); /* only the fetch's own handles went */
  CHECK(stats_of(src).borrows == 3);

  /* A callback's own code (below RDT_ERR_USER) passes through. */
  td.gated = 0;
  td.fail_at = td.waits + 1;
  td.fail_status = (rdt_status)-1234;
  td.fail_message = "custom failure";
  CHECK_STATUS(rdt_get(dst, refs, 1, targets, 1, NULL, 10000), (rdt_status)-1234);
  CHECK_MSG("custom failure");
  /* A positive code is not a status: reported as RDT_ERR_USER. */
  td.fail_at = td.waits + 1;
  td.fail_status = (rdt_status)3;
  CHECK_STATUS(rdt_get(dst, refs, 1, targets, 1, NULL, 10000), RDT_ERR_USER);
  /* No message given: the error says so. */
  td.fail_at = td.waits + 1;
  td.fail_status = RDT_ERR_TRANSPORT;
  td.fail_message = NULL;
  CHECK_STATUS(rdt_get(dst, refs, 1, targets, 1, NULL, 10000), RDT_ERR_TRANSPORT);
  CHECK_MSG("rdt_set_error");
  td.fail_at = 0;
  CHECK_OK(rdt_get(dst, refs, 3, targets, 3, NULL, 10000));
  for (int i = 0; i < 3; i++) CHECK_OK(rdt_ref_release(refs[i]));
  destroy_pair(src, dst);
}

/* A deadline leaves the fetch valid; abort then ends it. */
static void test_timeout_and_abort(void) {
  rdt_runtime *src, *dst;
  test_transport ts, td;
  runtime_pair("src", "dst", "async", async_vtable, &src, &dst, &ts, &td);
  td.gated = 1;
  float in[16] = {1}, out[16];
  rdt_tensor t = f32_tensor(in, shape16), target = f32_tensor(out, shape16);
  rdt_ref *borrowed = put_borrowed(src, &t, "async", dst);

  rdt_pending *f;
  CHECK_OK(rdt_get_start(dst, &borrowed, 1, &target, 1, NULL, &f));
  CHECK_STATUS(rdt_pending_wait(f, 0), RDT_ERR_TIMEOUT);
  CHECK_STATUS(rdt_pending_wait(f, 30), RDT_ERR_TIMEOUT);
  wait_fetches(&td, 1);
  CHECK(stats_of(dst).fetches_active == 1);
  CHECK_OK(rdt_pending_abort(f));
  CHECK_STATUS(rdt_pending_wait(f, 10000), RDT_ERR_ABORTED);
  CHECK(td.releases == 1);
  CHECK_OK(rdt_pending_free(f));
  CHECK_STATUS(rdt_pending_wait(f, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_pending_free(f), RDT_ERR_INVALID_ARGUMENT);

  /* rdt_get's timeout aborts before returning. */
  CHECK_STATUS(rdt_get(dst, &borrowed, 1, &target, 1, NULL, 30), RDT_ERR_TIMEOUT);
  CHECK(td.releases == 2 && td.aborts == 2);
  CHECK(stats_of(dst).fetches_active == 0);

  /* A freed fetch that was still running is aborted and drained. */
  CHECK_OK(rdt_get_start(dst, &borrowed, 1, &target, 1, NULL, &f));
  wait_fetches(&td, 3);
  CHECK_OK(rdt_pending_free(f));
  CHECK(td.releases == 3);

  /* The owner goes away: fetches fail promptly, new borrows too. */
  CHECK_OK(rdt_get_start(dst, &borrowed, 1, &target, 1, NULL, &f));
  void *bytes;
  size_t size;
  CHECK_OK(rdt_ref_serialize(borrowed, &bytes, &size));
  CHECK_OK(rdt_runtime_destroy(src));
  CHECK_STATUS(rdt_pending_wait(f, 10000), RDT_ERR_PEER_UNAVAILABLE);
  CHECK_OK(rdt_pending_free(f));
  rdt_ref *late;
  CHECK_STATUS(rdt_ref_deserialize(dst, bytes, size, &late), RDT_ERR_PEER_UNAVAILABLE);
  rdt_bytes_free(bytes);
  CHECK_STATUS(rdt_ref_serialize(borrowed, &bytes, &size), RDT_ERR_PEER_UNAVAILABLE);
  CHECK_OK(rdt_ref_release(borrowed));

  /* A destroyed runtime's handles fail with RDT_ERR_CLOSED. */
  rdt_tensor t2 = f32_tensor(in, shape16);
  rdt_ref *r;
  CHECK_OK(rdt_put(dst, &t2, 1, NULL, NULL, NULL, &r));
  rdt_runtime_stats(dst, NULL);
  CHECK_OK(rdt_runtime_destroy(dst));
  rdt_ref *c;
  CHECK_STATUS(rdt_ref_clone(r, &c), RDT_ERR_CLOSED);
  CHECK_OK(rdt_ref_release(r));
}

int main(void) {
  runtime_pair("a", "b", "memcopy", memcopy_vtable, &a, &b, &ta, &tb);
  test_status_strings();
  test_runtime_options();
  test_bad_handles();
  test_bad_tensors();
  test_bad_targets();
  test_bad_bytes();
  test_bad_registration();
  test_failing_transport();
  test_timeout_and_abort();
  CHECK(stats_of(a).objects == 0);
  destroy_pair(a, b);
  printf("test_errors: ok\n");
  return 0;
}
