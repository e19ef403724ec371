/* Tensors move between two runtimes through transports written in C:
 * one-sided (sync recv and async fetch/wait) and two-sided (send/recv),
 * with contents verified and the source freed exactly once. */
#include <stdint.h>
#include <unistd.h>

#include "test_util.h"

static int released_count;
static void on_release(void *ud) { (*(int *)ud)++; }

typedef struct object {
  float a[12];
  int64_t b[5];
  int64_t shape_a[2];
  int64_t shape_b[1];
  rdt_tensor tensors[2];
} object;

static void make_object(object *o, float seed) {
  for (int i = 0; i < 12; i++) o->a[i] = seed + (float)i;
  for (int i = 0; i < 5; i++) o->b[i] = (int64_t)(seed * 100) + i;
  o->shape_a[0] = 3;
  o->shape_a[1] = 4;
  o->shape_b[0] = 5;
  o->tensors[0] = f32_tensor(o->a, o->shape_a);
  o->tensors[0].ndim = 2;
  memset(&o->tensors[1], 0, sizeof o->tensors[1]);
  o->tensors[1].data = o->b;
  o->tensors[1].device.device_type = RDT_DEVICE_CPU;
  o->tensors[1].ndim = 1;
  o->tensors[1].dtype.code = RDT_DTYPE_INT;
  o->tensors[1].dtype.bits = 64;
  o->tensors[1].dtype.lanes = 1;
  o->tensors[1].shape = o->shape_b;
}

static void check_same(const object *want, const object *got) {
  CHECK(memcmp(want->a, got->a, sizeof want->a) == 0);
  CHECK(memcmp(want->b, got->b, sizeof want->b) == 0);
}

/* Puts an object in `src` under `transport`, passes the ref to `dst`,
 * fetches it there and checks everything on the way. */
static void round_trip(rdt_runtime *src, rdt_runtime *dst,
                       const char *transport, test_transport *src_t) {
  object in, out;
  make_object(&in, 7.0f);
  make_object(&out, 0.0f);
  memset(out.a, 0, sizeof out.a);
  memset(out.b, 0, sizeof out.b);
  int released = 0;

  rdt_ref *ref = NULL;
  CHECK_OK(rdt_put(src, in.tensors, 2, transport, on_release, &released, &ref));
  rdt_object_info info;
  rdt_object_info_init(&info);
  CHECK_OK(rdt_ref_info(ref, &info));
  CHECK(info.num_tensors == 2);
  CHECK(info.is_owner == 1);
  CHECK(info.nbytes == sizeof in.a + sizeof in.b);
  CHECK(strlen(info.object_id) == RDT_OBJECT_ID_LEN);

  rdt_ref *borrowed = pass_ref(ref, dst);
  CHECK_OK(rdt_ref_release(ref)); /* the borrow keeps the object alive */
  CHECK(released == 0);

  rdt_object_info binfo;
  rdt_object_info_init(&binfo);
  CHECK_OK(rdt_ref_info(borrowed, &binfo));
  CHECK(binfo.is_owner == 0);
  CHECK(strcmp(binfo.object_id, info.object_id) == 0);
  rdt_tensor_info ti;
  rdt_tensor_info_init(&ti);
  CHECK_OK(rdt_ref_tensor_info(borrowed, 0, &ti));
  CHECK(ti.ndim == 2 && ti.shape[0] == 3 && ti.shape[1] == 4);
  CHECK(ti.dtype.code == RDT_DTYPE_FLOAT && ti.dtype.bits == 32);
  CHECK(ti.nbytes == sizeof in.a);
  CHECK_OK(rdt_ref_tensor_info(borrowed, 1, &ti));
  CHECK(ti.dtype.code == RDT_DTYPE_INT && ti.shape[0] == 5);

  CHECK_OK(rdt_get(dst, &borrowed, 1, out.tensors, 2, NULL, 10000));
  check_same(&in, &out);

  /* A second get fetches again and sees the source's changes. */
  in.a[0] = 1234.0f;
  CHECK_OK(rdt_get(dst, &borrowed, 1, out.tensors, 2, NULL, 10000));
  CHECK(out.a[0] == 1234.0f);

  CHECK_OK(rdt_ref_release(borrowed));
  CHECK_OK(rdt_wait_tensor_freed(src, in.a, 10000));
  CHECK(released == 1);
  CHECK_OK(rdt_wait_tensor_freed(src, in.b, 0));
  pthread_mutex_lock(&src_t->mu);
  int gcs = src_t->gcs;
  pthread_mutex_unlock(&src_t->mu);
  CHECK(gcs >= 1);
}

static void test_one_sided_sync(void) {
  rdt_runtime *a = new_runtime("a"), *b = new_runtime("b");
  test_transport ta, tb;
  test_transport_init(&ta);
  test_transport_init(&tb);
  register_cpu(a, "memcopy", memcopy_vtable(&ta));
  register_cpu(b, "MemCopy", memcopy_vtable(&tb)); /* names ignore case */
  round_trip(a, b, "memcopy", &ta);
  CHECK(ta.extracts == 1 && ta.gcs == 1);
  CHECK(tb.recvs == 2 && tb.comms == 2);
  CHECK(ta.recvs == 0);
  rdt_stats s = stats_of(b);
  CHECK(s.transfers_completed == 2 && s.bytes_received == 2 * (48 + 40));
  CHECK(s.refs == 0 && s.fetches_active == 0 && s.borrowed_objects == 0);
  s = stats_of(a);
  CHECK(s.objects == 0 && s.objects_freed == 1 && s.borrows == 0);
  CHECK_OK(rdt_runtime_destroy(a));
  CHECK_OK(rdt_runtime_destroy(b));
  CHECK(ta.freed_user_data == 1 && tb.freed_user_data == 1);
}

static void test_two_sided(void) {
  rdt_runtime *a, *b;
  test_transport ta, tb;
  runtime_pair("a", "b", "mailbox", mailbox_vtable, &a, &b, &ta, &tb);
  round_trip(a, b, "mailbox", &ta);
  /* The source runtime sent, on its own thread; the destination received. */
  CHECK(ta.sends == 2 && tb.sends == 0);
  CHECK(tb.recvs == 2 && ta.recvs == 0);
  CHECK(!pthread_equal(ta.send_thread, pthread_self()));
  rdt_stats s = stats_of(a);
  CHECK(s.sends_completed == 2);
  destroy_pair(a, b);
}

static void test_async_fetch_all_before_wait(void) {
  rdt_runtime *a, *b;
  test_transport ta, tb;
  runtime_pair("a", "b", "async", async_vtable, &a, &b, &ta, &tb);
  enum { N = 6 };
  float src[N][256], dst[N][256];
  int64_t shape[1] = {256};
  rdt_ref *refs[N];
  rdt_tensor targets[N];
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < 256; j++) src[i][j] = (float)(i * 1000 + j);
    memset(dst[i], 0, sizeof dst[i]);
    rdt_tensor t = f32_tensor(src[i], shape);
    refs[i] = put_borrowed(a, &t, "async", b);
    targets[i] = f32_tensor(dst[i], shape);
  }
  rdt_pending *f = NULL;
  CHECK_OK(rdt_get_start(b, refs, N, targets, N, NULL, &f));
  /* The refs may be released while the fetch runs: it holds its own. */
  for (int i = 0; i < N; i++) CHECK_OK(rdt_ref_release(refs[i]));
  CHECK_OK(rdt_pending_wait(f, 10000));
  CHECK_OK(rdt_pending_wait(f, 0)); /* the result stays */
  CHECK_OK(rdt_pending_free(f));
  for (int i = 0; i < N; i++) CHECK(memcmp(src[i], dst[i], sizeof src[i]) == 0);
  CHECK(tb.fetches == N && tb.waits == N && tb.releases == N);
  for (int i = 0; i < N; i++) CHECK(tb.events[i] == 'f');
  for (int i = N; i < 2 * N; i++) CHECK(tb.events[i] == 'w');
  destroy_pair(a, b);
}

static void test_local_fetch_needs_no_transport(void) {
  rdt_runtime *a = new_runtime("a");
  test_transport ta;
  test_transport_init(&ta);
  register_cpu(a, "memcopy", memcopy_vtable(&ta));
  object in, out;
  make_object(&in, 3.0f);
  make_object(&out, 0.0f);
  memset(out.a, 0, sizeof out.a);
  rdt_ref *ref;
  CHECK_OK(rdt_put(a, in.tensors, 2, "memcopy", NULL, NULL, &ref));
  CHECK_OK(rdt_get(a, &ref, 1, out.tensors, 2, NULL, 5000));
  check_same(&in, &out);
  CHECK(ta.recvs == 0);
  CHECK(stats_of(a).local_copies == 1);
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_runtime_destroy(a));
}

static void test_clone_and_transport_list(void) {
  rdt_runtime *a = new_runtime("a");
  test_transport t1, t2;
  test_transport_init(&t1);
  test_transport_init(&t2);
  register_cpu(a, "zeta", memcopy_vtable(&t1));
  register_cpu(a, "alpha", mailbox_vtable(&t2));
  size_t count = 0;
  CHECK_OK(rdt_transport_list(a, NULL, 0, &count));
  CHECK(count == 2);
  rdt_transport_info infos[2];
  rdt_transport_info_init(&infos[0]);
  rdt_transport_info_init(&infos[1]);
  CHECK_OK(rdt_transport_list(a, infos, 2, &count));
  CHECK(strcmp(infos[0].name, "alpha") == 0 && strcmp(infos[1].name, "zeta") == 0);
  CHECK(infos[0].flags == RDT_TRANSPORT_CAN_ABORT);
  CHECK(infos[1].flags == RDT_TRANSPORT_ONE_SIDED);
  CHECK(infos[1].num_devices == 1 && infos[1].devices[0] == RDT_DEVICE_CPU);
  /* A capacity smaller than the count fills what fits. */
  rdt_transport_info one;
  rdt_transport_info_init(&one);
  CHECK_OK(rdt_transport_list(a, &one, 1, &count));
  CHECK(count == 2 && strcmp(one.name, "alpha") == 0);

  float data[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  rdt_tensor t = f32_tensor(data, shape);
  released_count = 0;
  rdt_ref *ref, *c1, *c2;
  CHECK_OK(rdt_put(a, &t, 1, NULL, on_release, &released_count, &ref));
  CHECK_OK(rdt_ref_clone(ref, &c1));
  CHECK_OK(rdt_ref_clone(c1, &c2));
  CHECK(stats_of(a).refs == 3);
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_ref_release(c2));
  CHECK_STATUS(rdt_wait_tensor_freed(a, data, 10), RDT_ERR_TIMEOUT);
  CHECK(released_count == 0);
  CHECK_OK(rdt_ref_release(c1));
  CHECK_OK(rdt_wait_tensor_freed(a, data, 10000));
  CHECK(released_count == 1);
  CHECK_OK(rdt_runtime_destroy(a));
}

/* An owner runtime "owner" (lease_ms 0: the default lease) and two
 * borrowers "b" and "c", each with memcopy on its own test transport. */
static void owner_and_two_borrowers(int64_t lease_ms, rdt_runtime **a,
                                    rdt_runtime **b, rdt_runtime **c,
                                    test_transport ts[3]) {
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.name = "owner";
  opts.flags = RDT_RUNTIME_IN_PROCESS;
  if (lease_ms != 0) opts.lease_ms = lease_ms;
  CHECK_OK(rdt_runtime_create(&opts, a));
  *b = new_runtime("b");
  *c = new_runtime("c");
  rdt_runtime *rts[3] = {*a, *b, *c};
  for (int i = 0; i < 3; i++) {
    test_transport_init(&ts[i]);
    register_cpu(rts[i], "memcopy", memcopy_vtable(&ts[i]));
  }
}

static void test_third_runtime_and_lease(void) {
  rdt_runtime *a, *b, *c;
  test_transport ts[3];
  owner_and_two_borrowers(50, &a, &b, &c, ts);
  float data[8] = {8, 7, 6, 5, 4, 3, 2, 1}, out[8] = {0};
  int64_t shape[1] = {8};
  rdt_tensor t = f32_tensor(data, shape), o = f32_tensor(out, shape);
  int released = 0;
  rdt_ref *ref;
  CHECK_OK(rdt_put(a, &t, 1, "memcopy", on_release, &released, &ref));
  rdt_ref *rb = pass_ref(ref, b);
  CHECK_OK(rdt_ref_release(ref));
  /* b re-serializes and hands the ref to c. */
  rdt_ref *rc = pass_ref(rb, c);
  CHECK_OK(rdt_ref_release(rb));
  CHECK_OK(rdt_get(c, &rc, 1, &o, 1, NULL, 5000));
  CHECK(memcmp(data, out, sizeof data) == 0);
  CHECK_OK(rdt_ref_release(rc));
  CHECK_OK(rdt_wait_tensor_freed(a, data, 5000));
  CHECK(released == 1);

  /* Bytes never deserialized hold the object only for the lease. */
  released = 0;
  CHECK_OK(rdt_put(a, &t, 1, "memcopy", on_release, &released, &ref));
  void *bytes;
  size_t size;
  CHECK_OK(rdt_ref_serialize(ref, &bytes, &size));
  CHECK_OK(rdt_ref_release(ref));
  CHECK(stats_of(a).refs_in_transit == 1);
  CHECK_OK(rdt_wait_tensor_freed(a, data, 5000));
  CHECK(released == 1);
  CHECK(stats_of(a).leases_expired == 1);
  /* Such bytes still make a ref (the owner's answer to the borrow is not
   * awaited), but its fetch says the object is gone and reads nothing. */
  rdt_ref *late;
  CHECK_OK(rdt_ref_deserialize(b, bytes, size, &late));
  rdt_bytes_free(bytes);
  float sink[8] = {0};
  rdt_tensor into = f32_tensor(sink, shape);
  CHECK_STATUS(rdt_get(b, &late, 1, &into, 1, NULL, 5000), RDT_ERR_NOT_FOUND);
  CHECK(strstr(rdt_last_error(), "freed") != NULL);
  CHECK(sink[0] == 0);
  CHECK_OK(rdt_ref_release(late));
  CHECK_OK(rdt_runtime_destroy(a));
  CHECK_OK(rdt_runtime_destroy(b));
  CHECK_OK(rdt_runtime_destroy(c));
}

/* rdt_ref_release_ex(RDT_RELEASE_REVOKE_LEASES): the owner frees the object
 * at once instead of after the lease (two minutes by default, far longer
 * than any wait here), while borrows already counted keep it. */
static void test_release_revoking_leases(void) {
  rdt_runtime *a, *b, *c;
  test_transport ts[3];
  owner_and_two_borrowers(0, &a, &b, &c, ts);
  float data[8] = {1, 2, 3, 4, 5, 6, 7, 8}, sink[8] = {0};
  int64_t shape[1] = {8};
  rdt_tensor t = f32_tensor(data, shape), into = f32_tensor(sink, shape);
  int released = 0;

  /* Three serialized refs nobody deserialized: freed by the release. */
  rdt_ref *ref;
  CHECK_OK(rdt_put(a, &t, 1, "memcopy", on_release, &released, &ref));
  void *bytes[3];
  size_t sizes[3];
  for (int i = 0; i < 3; i++) CHECK_OK(rdt_ref_serialize(ref, &bytes[i], &sizes[i]));
  CHECK(stats_of(a).refs_in_transit == 3);
  CHECK_STATUS(rdt_ref_release_ex(ref, 1u << 7), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("unknown flags");
  CHECK_OK(rdt_ref_release_ex(ref, RDT_RELEASE_REVOKE_LEASES));
  CHECK_OK(rdt_wait_tensor_freed(a, data, 5000));
  CHECK(released == 1);
  rdt_stats s = stats_of(a);
  CHECK(s.objects == 0 && s.refs_in_transit == 0 && s.refs == 0);
  CHECK(s.leases_expired == 0);
  CHECK_STATUS(rdt_ref_release_ex(ref, RDT_RELEASE_REVOKE_LEASES), RDT_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 3; i++) {
    rdt_ref *late;
    CHECK_OK(rdt_ref_deserialize(c, bytes[i], sizes[i], &late));
    CHECK_STATUS(rdt_get(c, &late, 1, &into, 1, NULL, 5000), RDT_ERR_NOT_FOUND);
    CHECK_MSG("already freed");
    CHECK(sink[0] == 0);
    CHECK_OK(rdt_ref_release(late));
    CHECK_STATUS(rdt_ref_deserialize(a, bytes[i], sizes[i], &late), RDT_ERR_NOT_FOUND);
    CHECK_MSG("already freed");
    rdt_bytes_free(bytes[i]);
  }
  CHECK(stats_of(c).borrowed_objects == 0);

  /* A counted borrow survives the revocation; the bytes nobody deserialized
   * no longer hold the object once it is gone. */
  released = 0;
  CHECK_OK(rdt_put(a, &t, 1, "memcopy", on_release, &released, &ref));
  rdt_ref *rb = pass_ref(ref, b);
  CHECK(stats_of(a).borrows == 1);
  void *unused;
  size_t unused_size;
  CHECK_OK(rdt_ref_serialize(ref, &unused, &unused_size));
  /* Only the owner revokes; the refused handle stays valid. */
  CHECK_STATUS(rdt_ref_release_ex(rb, RDT_RELEASE_REVOKE_LEASES), RDT_ERR_INVALID_ARGUMENT);
  CHECK_MSG("only its owner");
  rdt_ref *clone;
  CHECK_OK(rdt_ref_clone(rb, &clone));
  CHECK_OK(rdt_ref_release(clone));
  CHECK_OK(rdt_ref_release_ex(ref, RDT_RELEASE_REVOKE_LEASES));
  s = stats_of(a);
  CHECK(s.objects == 1 && s.borrows == 1 && s.refs_in_transit == 0);
  CHECK_OK(rdt_get(b, &rb, 1, &into, 1, NULL, 5000));
  CHECK(memcmp(data, sink, sizeof data) == 0);
  CHECK(released == 0);
  CHECK_OK(rdt_ref_release_ex(rb, 0));
  CHECK_OK(rdt_wait_tensor_freed(a, data, 5000));
  CHECK(released == 1);
  rdt_ref *late;
  CHECK_OK(rdt_ref_deserialize(c, unused, unused_size, &late));
  memset(sink, 0, sizeof sink);
  CHECK_STATUS(rdt_get(c, &late, 1, &into, 1, NULL, 5000), RDT_ERR_NOT_FOUND);
  CHECK_MSG("already freed");
  CHECK(sink[0] == 0);
  CHECK_OK(rdt_ref_release(late));
  rdt_bytes_free(unused);
  CHECK_OK(rdt_ref_release_ex(NULL, RDT_RELEASE_REVOKE_LEASES));
  CHECK_OK(rdt_runtime_destroy(a));
  CHECK_OK(rdt_runtime_destroy(b));
  CHECK_OK(rdt_runtime_destroy(c));
}

/* RDT_RUNTIME_QUEUE_RELEASES: no callback on rdt's threads; the user data of
 * freed objects is taken by the application, once each. */
static rdt_runtime *queue_runtime(const char *name) {
  rdt_runtime_options opts;
  rdt_runtime_options_init(&opts);
  opts.name = name;
  opts.flags = RDT_RUNTIME_IN_PROCESS | RDT_RUNTIME_NO_BUILTIN_TRANSPORTS |
               RDT_RUNTIME_QUEUE_RELEASES;
  rdt_runtime *rt = NULL;
  CHECK_OK(rdt_runtime_create(&opts, &rt));
  return rt;
}

static void *take_until_closed(void *arg) {
  void *got[4];
  size_t n = 99;
  rdt_status st = rdt_runtime_take_released((rdt_runtime *)arg, got, 4, &n, -1);
  return (void *)(intptr_t)(st == RDT_ERR_CLOSED && n == 0);
}

static void test_queued_releases(void) {
  rdt_runtime *a = queue_runtime("queued"), *b = new_runtime("plain");
  test_transport ta, tb;
  test_transport_init(&ta);
  test_transport_init(&tb);
  register_cpu(a, "memcopy", memcopy_vtable(&ta));
  register_cpu(b, "memcopy", memcopy_vtable(&tb));
  float data[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0};
  int64_t shape[1] = {8};
  rdt_tensor t = f32_tensor(data, shape), o = f32_tensor(out, shape);
  int key1 = 0, key2 = 0, unused = 0;
  rdt_ref *ref, *ref2, *none;
  void *got[4] = {0};
  size_t n = 99;

  /* A callback is refused: it would never be called. */
  CHECK_STATUS(rdt_put(a, &t, 1, NULL, on_release, &unused, &none), RDT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(rdt_last_error(), "rdt_runtime_take_released") != NULL);
  /* The queue is the runtime's own: a plain runtime has none. */
  CHECK_STATUS(rdt_runtime_take_released(b, got, 4, &n, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_runtime_take_released(a, NULL, 4, &n, 0), RDT_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(rdt_runtime_take_released(a, got, 0, &n, 0), RDT_ERR_INVALID_ARGUMENT);

  CHECK_OK(rdt_put(a, &t, 1, "memcopy", NULL, &key1, &ref));
  CHECK_OK(rdt_put(a, &t, 1, NULL, NULL, &key2, &ref2));
  CHECK_OK(rdt_runtime_take_released(a, got, 4, &n, 0));
  CHECK(n == 0); /* nothing freed yet */
  CHECK_OK(rdt_runtime_take_released(a, got, 4, &n, 20));
  CHECK(n == 0); /* the wait ran out: not an error */

  /* A borrower holds the first object past its owner's release. */
  rdt_ref *borrowed = pass_ref(ref, b);
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_get(b, &borrowed, 1, &o, 1, NULL, 5000));
  CHECK(memcmp(data, out, sizeof data) == 0);
  CHECK_OK(rdt_runtime_take_released(a, got, 4, &n, 0));
  CHECK(n == 0);
  CHECK_OK(rdt_ref_release(borrowed));
  CHECK_OK(rdt_runtime_take_released(a, got, 4, &n, 5000));
  CHECK(n == 1 && got[0] == &key1);
  CHECK(ta.gcs == 1); /* garbage_collect ran before the user data was queued */

  /* Reported once each, oldest first, a bounded number at a time. */
  CHECK_OK(rdt_ref_release(ref2));
  CHECK_OK(rdt_runtime_take_released(a, got, 1, &n, 5000));
  CHECK(n == 1 && got[0] == &key2);
  CHECK_OK(rdt_runtime_take_released(a, got, 4, &n, 0));
  CHECK(n == 0);

  /* A NULL user data is not queued. */
  CHECK_OK(rdt_put(a, &t, 1, NULL, NULL, NULL, &ref));
  CHECK_OK(rdt_ref_release(ref));
  CHECK_OK(rdt_wait_tensor_freed(a, data, 5000));
  CHECK_OK(rdt_runtime_take_released(a, got, 4, &n, 50));
  CHECK(n == 0);

  /* A waiting call returns CLOSED when the runtime is destroyed. */
  pthread_t waiter;
  CHECK(pthread_create(&waiter, NULL, take_until_closed, a) == 0);
  usleep(200 * 1000); /* let it start waiting */
  CHECK_OK(rdt_runtime_destroy(a));
  void *ok = NULL;
  CHECK(pthread_join(waiter, &ok) == 0);
  CHECK(ok == (void *)1);
  CHECK_OK(rdt_runtime_destroy(b));
}

int main(void) {
  CHECK(strcmp(rdt_version(), "0.1.0") == 0);
  CHECK(rdt_abi_version() == RDT_ABI_VERSION);
  test_one_sided_sync();
  test_two_sided();
  test_async_fetch_all_before_wait();
  test_local_fetch_needs_no_transport();
  test_clone_and_transport_list();
  test_third_runtime_and_lease();
  test_release_revoking_leases();
  test_queued_releases();
  printf("test_transfer: ok\n");
  return 0;
}
